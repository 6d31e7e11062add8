"""``verify --against`` of a labelled split pack's repack record (``repack.arrows``,
:mod:`packtool.format.chunks`): what the record must hold, re-derived batch by batch from
the re-read inputs (:func:`packtool.packing.split_losses` over the pipeline's own cut, as
``pack`` derived it), against what it holds, chunk by chunk: the same chunks, each with the
same first label and the same left-out tokens. The record's bytes and sha256 are the files
check's (:mod:`.rows`); this is what a record re-hashed in the manifest cannot hide."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..format import LostChunks, Manifest, ShardEntry
from .report import Problems, first_difference

__all__ = ["RecordCheck"]

_SHIFT = np.int64(1 << 32)  # key of (doc, chunk): doc << 32 | chunk


def _keys(lost: LostChunks) -> np.ndarray:
    return lost.doc_id.astype(np.int64) * _SHIFT + lost.chunk_id.astype(np.int64)


def _slice(lost: LostChunks, a: int, b: int) -> LostChunks:
    lo, hi = int(lost.offsets[a]), int(lost.offsets[b])
    return LostChunks(
        lost.doc_id[a:b],
        lost.chunk_id[a:b],
        lost.label[a:b],
        lost.offsets[a : b + 1] - lo,
        lost.tokens[lo:hi],
    )


def _tokens_at(lost: LostChunks, rows: np.ndarray) -> np.ndarray:
    """The tokens of chunks ``rows`` of ``lost``, joined."""
    lengths = lost.lengths[rows].astype(np.int64)
    starts = lost.offsets[:-1][rows] - (np.cumsum(lengths) - lengths)
    return lost.tokens[np.repeat(starts, lengths) + np.arange(int(lengths.sum()))]


def _differing(
    expected: LostChunks, w: np.ndarray, held: LostChunks, h: np.ndarray
) -> list[tuple[int, int]]:
    """The pairs (``w[k]``, ``h[k]``), a chunk as re-derived and as the record holds it,
    whose first label, length or tokens differ (compared all at once)."""
    bad = (expected.label[w] != held.label[h]) | (expected.lengths[w] != held.lengths[h])
    same = np.flatnonzero(~bad)
    if same.size:
        lengths = expected.lengths[w[same]].astype(np.int64)
        differ = _tokens_at(expected, w[same]) != _tokens_at(held, h[same])
        owner = np.repeat(np.arange(same.size), lengths)
        bad[same[np.unique(owner[differ])]] = True
    k = np.flatnonzero(bad)
    return list(zip(w[k].tolist(), h[k].tolist(), strict=True))


class RecordCheck:
    """The repack record ``record`` (the manifest's ``repack_files`` ``entries``, read as
    one), compared with the chunks each re-read batch gives (:meth:`compare`, in document
    order), then its rows past the documents read (:meth:`finish`). A mismatch is one
    ``against`` problem naming the record file, the document (where it was read) and the
    chunk."""

    def __init__(self, manifest: Manifest, record: LostChunks, entries: Sequence[ShardEntry]):
        self.manifest = manifest
        self.record = record
        self.keys = _keys(record)
        by_offset = sorted(entries, key=lambda e: e.doc_offset)
        self.offsets = np.array([e.doc_offset for e in by_offset], np.int64)
        self.files = [e.file for e in by_offset]
        self.compared = 0  # chunks compared (in both)

    def _file(self, doc: int) -> str:
        """The record file that holds (or would hold) document ``doc``'s chunks."""
        at = int(np.searchsorted(self.offsets, doc, side="right")) - 1
        return self.files[max(0, at)]

    def _say(self, problems: Problems, found: list[tuple[int, int, str]]) -> None:
        problems.count("against", len(found))
        for doc, chunk, what in found[: problems.room()]:
            where = self.manifest.locate_document(doc)
            problems.keep(
                "against",
                f"document {doc} ({where}) chunk {chunk}: {what}",
                self._file(doc),
                None,
            )

    def compare(self, expected: LostChunks, lo: int, hi: int, problems: Problems) -> None:
        """The record's rows of documents ``lo..hi-1`` against ``expected`` (those the
        re-read batch of these documents gives, sorted by document and chunk)."""
        a = int(np.searchsorted(self.record.doc_id, lo, side="left"))
        b = int(np.searchsorted(self.record.doc_id, hi, side="left"))
        if a == b and not expected.size:
            return
        held = _slice(self.record, a, b)
        want_keys, held_keys = _keys(expected), self.keys[a:b]
        found: list[tuple[int, int, str]] = []
        for k in np.flatnonzero(~np.isin(want_keys, held_keys)).tolist():
            n = int(expected.lengths[k])
            why = (
                f"the rows do not hold its {n} tokens"
                if n
                else f"it loses the learned first label {int(expected.label[k])}"
            )
            found.append(
                (int(expected.doc_id[k]), int(expected.chunk_id[k]),
                 f"missing from the repack record (re-reading the inputs, {why})")
            )  # fmt: skip
        for k in np.flatnonzero(~np.isin(held_keys, want_keys)).tolist():
            found.append(
                (int(held.doc_id[k]), int(held.chunk_id[k]),
                 "in the repack record, but re-reading the inputs gives no such chunk to keep "
                 "there (it neither loses a learned first label nor is left out of the rows)")
            )  # fmt: skip
        both, w, h = np.intersect1d(want_keys, held_keys, return_indices=True)
        self.compared += int(both.size)
        for i, j in _differing(expected, w, held, h):
            what = self._differs(expected, i, held, j)
            if what:
                found.append((int(expected.doc_id[i]), int(expected.chunk_id[i]), what))
        found.sort()
        self._say(problems, found)

    @staticmethod
    def _differs(expected: LostChunks, i: int, held: LostChunks, j: int) -> str | None:
        """What differs between chunk ``i`` as re-derived and chunk ``j`` of the record."""
        want_label, held_label = int(expected.label[i]), int(held.label[j])
        if want_label != held_label:
            return (
                f"its first label is {held_label} in the repack record, {want_label} from the input"
            )
        want = expected.tokens[expected.offsets[i] : expected.offsets[i + 1]]
        have = held.tokens[held.offsets[j] : held.offsets[j + 1]]
        if want.size != have.size:
            return (
                f"{have.size} tokens in the repack record, {want.size} after re-tokenizing "
                "the input (0: the rows hold the chunk)"
            )
        return first_difference(
            "token", have, "the repack record", want, "after re-tokenizing the input"
        )

    def finish(self, read: int, problems: Problems) -> None:
        """The record's rows of documents past the ``read`` ones the inputs gave."""
        beyond = np.flatnonzero(self.record.doc_id >= read).tolist()
        what = f"in the repack record, but the inputs end after {read} documents"
        found = [(int(self.record.doc_id[k]), int(self.record.chunk_id[k]), what) for k in beyond]
        self._say(problems, found)
