"""``verify``: check that a packed dataset is whole and right, row by row.

What is checked (docs/verify.md says the same for people):

- the manifest: its counts add up (``documents.read`` is the sum of the outcomes, rows and
  tokens agree with ``lower_bound_rows`` and the shards, the inputs' ``first_doc`` follow
  each other), and the files it names are there: every shard with the recorded ``bytes`` and
  ``sha256``, the tokenizer copy with its ``sha256``, ``state.json`` listing the same shards;
  no stray ``*.arrow`` file that ``load_dataset("arrow", data_files="out/*.arrow")`` would
  pick up;
- every row of every shard, vectorised with NumPy over blocks of rows::

      input_ids    b b b b b b b b b c c c c c c c a a a a a P P P
      position_ids 0 1 2 3 4 5 6 7 8 0 1 2 3 4 5 6 0 1 2 3 4 0 1 2   restart at every cu
      cu_seqlens   [0, 9, 16, 21, 24]    0 first, rising strictly, max_len last
      num_tokens   21                    == cu_seqlens[len(doc_ids)]; padding after it
      doc_ids      [1, 2, 0]             one per document segment (+1 cu for the padding)

  plus: padding holds ``pad_id`` (labels -100), token ids are inside the vocabulary, a
  document segment shorter than ``max_len`` ends with EOS (when EOS was added), a first
  chunk starts with BOS (under ``--bos``);
- over the whole dataset: every ``(doc_id, chunk_id)`` exactly once, the chunks of a split
  document numbered ``0..k-1`` and all but the last exactly ``max_len`` long, and the
  numbers of rows, segments, tokens and documents (whole, split, truncated) equal the
  manifest's;
- with ``against``: the inputs re-read and re-tokenized with the recorded options and the
  copy of the tokenizer; every document's tokens (after the overflow policy) are in the rows
  exactly once and in order, compared through a 128-bit digest per document, and the counts
  of read, dropped, truncated, empty and skipped documents match the manifest.

``verify`` returns a :class:`VerifyReport`; it raises only when there is nothing to verify
(no manifest, an unknown format version: :class:`~packtool.errors.FormatError`) or the
arguments are wrong. Everything else, a missing or damaged shard included, is a
:class:`Problem` in the report.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .errors import ChatTemplateError, FormatError, OptionError, PacktoolError
from .format import (
    CHAT_TEMPLATE_FILE,
    IGNORE_INDEX,
    MANIFEST_FILE,
    ChatTemplateRecord,
    DocumentCounts,
    Manifest,
    PackedReader,
    layout_problems,
    open_packed,
    packed_schema,
)
from .fs import AnyPath, StorePath, as_path, is_url, sha256_of
from .instruct import InputPlan, InstructEncoder, plan_input
from .options import PackOptions
from .packing import Overflow, segment_labelled_items
from .pretokenized import IdsEncoder, IdsTokenizer
from .readers import resolve_inputs
from .tokenize import DocumentEncoder, Tokenizer, load_tokenizer

__all__ = ["AgainstReport", "Problem", "VerifyReport", "verify"]

VerifyProgress = Callable[[str, int, "int | None"], None]
"""Called as ``progress(stage, completed, total)``; stages: ``hash`` (bytes of shards),
``rows`` (rows checked), ``against`` (bytes of inputs re-read)."""

_BLOCK_TOKENS = 1 << 22  # rows are checked in blocks of about this many token slots


@dataclass(frozen=True)
class Problem:
    """One thing wrong: where (shard file, global row; ``None`` when not about one) and what.

    ``check`` names the kind of check that failed (``sha256``, ``position_ids``,
    ``coverage``, ``against``...), so that problems can be counted by kind.
    """

    shard: str | None
    row: int | None
    what: str
    check: str = ""

    def __str__(self) -> str:
        where = ", ".join(
            part for part in (self.shard, None if self.row is None else f"row {self.row}") if part
        )
        return f"{where}: {self.what}" if where else self.what


@dataclass
class AgainstReport:
    """What ``verify(..., against=...)`` re-read: inputs, documents, and their outcomes."""

    inputs: list[str]
    documents: dict[str, int]  # read, packed, split, truncated, dropped, empty, bad_records_skipped
    tokens: dict[str, int]  # packed, truncated_away, dropped
    documents_compared: int  # documents whose digests were compared with the rows'
    seconds: float = 0.0


@dataclass
class VerifyReport:
    """The outcome of :func:`verify`. ``ok`` when no problem was found."""

    path: AnyPath
    shards_checked: int = 0
    rows_checked: int = 0
    segments: int = 0
    documents: int | None = None  # distinct documents in the rows (None: not counted)
    tokens: int = 0  # real tokens in the rows
    bytes_hashed: int = 0
    problems: list[Problem] = field(default_factory=list)  # the first max_problems
    problems_total: int = 0
    problem_counts: dict[str, int] = field(default_factory=dict)  # by check
    notes: list[str] = field(default_factory=list)  # what could not be checked, and why
    against: AgainstReport | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.problems_total == 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (the CLI's ``--json``)."""
        return {
            "path": str(self.path),
            "ok": self.ok,
            "shards_checked": self.shards_checked,
            "rows_checked": self.rows_checked,
            "segments": self.segments,
            "documents": self.documents,
            "tokens": self.tokens,
            "bytes_hashed": self.bytes_hashed,
            "problems_total": self.problems_total,
            "problem_counts": self.problem_counts,
            "problems": [
                {"shard": p.shard, "row": p.row, "check": p.check, "what": p.what}
                for p in self.problems
            ],
            "notes": self.notes,
            "against": None
            if self.against is None
            else {
                "inputs": self.against.inputs,
                "documents": self.against.documents,
                "tokens": self.against.tokens,
                "documents_compared": self.against.documents_compared,
                "seconds": round(self.against.seconds, 3),
            },
            "seconds": round(self.seconds, 3),
        }


class _Problems:
    """Collects problems: all are counted, the first ``limit`` are kept."""

    def __init__(self, report: VerifyReport, limit: int) -> None:
        self.report = report
        self.limit = limit
        self.counts: Counter[str] = Counter()
        self.shard_of: Callable[[int], str | None] = lambda row: None

    def add(self, check: str, what: str, shard: str | None = None, row: int | None = None):
        self.count(check, 1)
        self.keep(check, what, shard, row)

    def keep(self, check: str, what: str, shard: str | None, row: int | None) -> None:
        """Keep (not count) a problem; a row-located one gets its shard's name."""
        if len(self.report.problems) < self.limit:
            if shard is None and row is not None:
                shard = self.shard_of(row)
            self.report.problems.append(Problem(shard, row, what, check))

    def count(self, check: str, n: int) -> None:
        self.counts[check] += n
        self.report.problems_total += n

    def room(self) -> int:
        return max(0, self.limit - len(self.report.problems))

    def rows(
        self,
        check: str,
        bad: np.ndarray,
        shard: str,
        row0: int,
        describe: Callable[[int], str],
    ) -> None:
        """Count the rows flagged in ``bad`` (a block's boolean mask) and name the first."""
        n = int(np.count_nonzero(bad))
        if not n:
            return
        self.count(check, n)
        for i in np.flatnonzero(bad)[: self.room()]:
            i = int(i)
            self.report.problems.append(Problem(shard, row0 + i, describe(i), check))


# -- the token digest -----------------------------------------------------------------------
#
# A document's digest is the sum (mod 2^64, two lanes) of splitmix64 of (position << 32 |
# token) over its tokens, position counted from the document's start. Sums do not depend on
# the order of the terms, so the chunks of a split document can be added as they come, from
# any rows, in any order; the position inside each term makes a token moved, swapped,
# missing, duplicated or changed change the digest (except with probability ~2^-64 per lane).

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_LANE_SEEDS = (np.uint64(0x243F6A8885A308D3), np.uint64(0x13198A2E03707344))


def _splitmix64(z: np.ndarray) -> np.ndarray:
    z = z + _GOLDEN
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return z


def _digest_terms(tokens: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two lanes of each token's term (uint64 arrays like ``tokens``)."""
    key = (positions.astype(np.uint64) << np.uint64(32)) | tokens.astype(np.uint32).astype(
        np.uint64
    )
    return _splitmix64(key ^ _LANE_SEEDS[0]), _splitmix64(key ^ _LANE_SEEDS[1])


def _group_sums(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sums (wrapping uint64) of ``values`` over the groups starting at ``starts`` (non-empty,
    increasing)."""
    if starts.size == 0:
        return np.zeros(0, np.uint64)
    return np.add.reduceat(values, starts)


# -- helpers --------------------------------------------------------------------------------


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _show(values: np.ndarray, limit: int = 12) -> str:
    items = [str(int(v)) for v in values[:limit]]
    if values.size > limit:
        items.append(f"... ({values.size} values)")
    return "[" + ", ".join(items) + "]"


def _message(error: PacktoolError, path: Path) -> str:
    """A format error's message without the leading ``path: `` (the problem names it)."""
    text = str(error)
    prefix = f"{path}: "
    return text[len(prefix) :] if text.startswith(prefix) else text


# -- the manifest and the files it names ----------------------------------------------------


def _check_manifest(manifest: Manifest, problems: _Problems) -> None:
    """The manifest's own arithmetic: its counts must agree with each other."""
    for problem in manifest.problems():
        problems.add("manifest", f"{MANIFEST_FILE}: {problem}")


def _check_files(
    path: AnyPath, manifest: Manifest, problems: _Problems, report: VerifyReport
) -> None:
    """The tokenizer copy, state.json, and files that should not be there."""
    for problem in layout_problems(path, manifest):
        problems.add("files", problem)
    if not manifest.tokenizer_copied and manifest.tokenizer_name != IdsTokenizer.name:
        # (pre-tokenized data packed without a tokenizer has none to copy)
        report.notes.append(
            "no tokenizer copy in the output (packed with a tokenizer object): "
            "--against needs the tokenizer given explicitly"
        )


# -- rows -----------------------------------------------------------------------------------


@dataclass
class _Rules:
    """What every row must satisfy, from the manifest."""

    max_len: int
    pad_id: int | None
    vocab_size: int | None
    documents_read: int | None
    eos_id: int | None  # set when every document got an EOS
    bos_id: int | None  # set when every document got a BOS (--bos)
    has_labels: bool
    dropped_chunks: int = 0  # chunks with nothing to learn, dropped (labels only)


@dataclass
class _Segments:
    """Document segments seen in the rows, in row order (for the dataset-wide checks)."""

    doc: list[np.ndarray] = field(default_factory=list)
    chunk: list[np.ndarray] = field(default_factory=list)
    length: list[np.ndarray] = field(default_factory=list)  # -1 where the row is malformed
    row: list[np.ndarray] = field(default_factory=list)
    last: list[np.ndarray] = field(default_factory=list)  # last token, -1 if malformed

    def arrays(self) -> tuple[np.ndarray, ...]:
        """(doc, chunk, length, row, last token), concatenated."""

        def cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

        return (
            cat(self.doc, np.int64),
            cat(self.chunk, np.int64),
            cat(self.length, np.int64),
            cat(self.row, np.int64),
            cat(self.last, np.int64),
        )


@dataclass
class _Digests:
    """Per-document digests and token counts computed from the rows (``against`` only)."""

    lane0: np.ndarray
    lane1: np.ndarray
    length: np.ndarray
    label0: np.ndarray | None = None  # the labels' digests (labelled pre-tokenized data)
    label1: np.ndarray | None = None


def _ragged(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets from 0, values) of a list column slice."""
    offsets = column.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    values = column.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
    return offsets - offsets[0], values.astype(np.int64)


def _fixed(column: pa.Array, n: int, max_len: int) -> np.ndarray:
    return column.flatten().to_numpy(zero_copy_only=False).reshape(n, max_len)


@dataclass
class _Block:
    """One record batch of rows, decoded to NumPy, with where it is (for the problems)."""

    shard: str
    row0: int  # global index of its first row
    ids: np.ndarray  # (n, max_len)
    pos: np.ndarray
    labels: np.ndarray | None
    cu_off: np.ndarray  # offsets of each row's cu_seqlens in cu
    cu: np.ndarray
    doc_off: np.ndarray
    docs: np.ndarray
    chunk_off: np.ndarray
    chunks: np.ndarray
    nt: np.ndarray  # num_tokens

    @property
    def n(self) -> int:
        return int(self.nt.size)

    @property
    def max_len(self) -> int:
        return int(self.ids.shape[1])

    @functools.cached_property
    def ncu(self) -> np.ndarray:
        return np.diff(self.cu_off)

    @functools.cached_property
    def ndoc(self) -> np.ndarray:
        return np.diff(self.doc_off)

    @functools.cached_property
    def cu_row(self) -> np.ndarray:
        return np.repeat(np.arange(self.n), self.ncu)


@dataclass
class _Shape:
    """Which rows are well formed, as found by :func:`_check_shape`."""

    lists_bad: np.ndarray  # doc_ids and chunk_ids disagree in length
    nt_bad: np.ndarray  # num_tokens out of range
    ok: np.ndarray  # cu_seqlens, segment count and num_tokens all agree


@dataclass
class _SegmentIds:
    """The document segments of a block (one entry per doc_ids entry)."""

    row: np.ndarray  # the row of each segment, in the block
    paired: np.ndarray  # its doc and chunk ids can be paired
    chunk: np.ndarray  # -1 where not paired
    wrong_doc: np.ndarray
    wrong_chunk: np.ndarray
    ok: np.ndarray  # its row is well formed
    entry: np.ndarray  # index in cu of the segment's start
    length: np.ndarray  # -1 where its row is malformed
    last: np.ndarray  # last token, -1 where its row is malformed


def _decode_block(
    batch: pa.RecordBatch, max_len: int, has_labels: bool, shard: str, row0: int
) -> _Block | str:
    """The block's arrays, or what stops it from being checked (nulls)."""
    for name in batch.schema.names:
        column = batch.column(name)
        nulls = column.null_count + (column.values.null_count if hasattr(column, "values") else 0)
        if nulls:
            return f"column {name!r} holds nulls: rows of this block not checked"
    n = batch.num_rows
    cu_off, cu = _ragged(batch.column("cu_seqlens"))
    doc_off, docs = _ragged(batch.column("doc_ids"))
    chunk_off, chunks = _ragged(batch.column("chunk_ids"))
    return _Block(
        shard=shard,
        row0=row0,
        ids=_fixed(batch.column("input_ids"), n, max_len),
        pos=_fixed(batch.column("position_ids"), n, max_len),
        labels=_fixed(batch.column("labels"), n, max_len) if has_labels else None,
        cu_off=cu_off,
        cu=cu,
        doc_off=doc_off,
        docs=docs,
        chunk_off=chunk_off,
        chunks=chunks,
        nt=batch.column("num_tokens").to_numpy(zero_copy_only=False).astype(np.int64),
    )


def _check_block(
    batch: pa.RecordBatch,
    rules: _Rules,
    shard: str,
    row0: int,
    problems: _Problems,
    segments: _Segments,
    digests: _Digests | None,
) -> int:
    """Check the rows of one record batch (global rows from ``row0``); returns real tokens."""
    b = _decode_block(batch, rules.max_len, rules.has_labels, shard, row0)
    if isinstance(b, str):
        problems.add("nulls", b, shard)
        return 0

    def report(check: str, bad: np.ndarray, describe: Callable[[int], str]) -> None:
        problems.rows(check, bad, shard, row0, describe)

    shape = _check_shape(b, report)
    _check_positions(b, shape.ok, report)
    _check_padding(b, rules, shape.nt_bad, report)
    seg = _check_segment_ids(b, rules, shape, report)
    _check_ends(b, rules, seg, report)
    segments.doc.append(b.docs[seg.paired])
    segments.chunk.append(seg.chunk[seg.paired])
    segments.length.append(seg.length[seg.paired])
    segments.row.append(seg.row[seg.paired] + row0)
    segments.last.append(seg.last[seg.paired])
    if digests is not None:
        _add_row_digests(b, shape.ok, seg, digests)
    return int(b.nt[~shape.nt_bad].sum())


_Report = Callable[[str, np.ndarray, Callable[[int], str]], None]


def _check_shape(b: _Block, report: _Report) -> _Shape:
    """The lists of a row agree; cu_seqlens starts at 0, rises strictly, ends at max_len and
    has one segment per document plus the padding tail; num_tokens ends the documents."""
    L, nt, cu, cu_off, ncu, ndoc = b.max_len, b.nt, b.cu, b.cu_off, b.ncu, b.ndoc
    chunk_counts = np.diff(b.chunk_off)
    lists_bad = chunk_counts != ndoc
    report(
        "doc_ids",
        lists_bad,
        lambda i: f"doc_ids has {ndoc[i]} entries but chunk_ids {chunk_counts[i]}",
    )
    nt_bad = (nt < 0) | (nt > L)
    report("num_tokens", nt_bad, lambda i: f"num_tokens is {nt[i]}, outside 0..{L}")

    cu_bad = ncu < 2
    has = ~cu_bad
    first = np.zeros(b.n, np.int64)
    last = np.zeros(b.n, np.int64)
    first[has] = cu[cu_off[:-1][has]]
    last[has] = cu[cu_off[1:][has] - 1]
    cu_bad |= has & ((first != 0) | (last != L))
    if cu.size > 1:
        cu_row = b.cu_row
        step_bad = np.diff(cu) <= 0
        same_row = cu_row[1:] == cu_row[:-1]
        cu_bad[cu_row[1:][step_bad & same_row]] = True
    report(
        "cu_seqlens",
        cu_bad,
        lambda i: (
            f"cu_seqlens {_show(cu[cu_off[i] : cu_off[i + 1]])} must start at 0, "
            f"rise strictly and end at max_len {L}"
        ),
    )
    padded = nt < L
    count_bad = ~cu_bad & ~nt_bad & (ncu - 1 != ndoc + padded)
    report(
        "cu_seqlens",
        count_bad,
        lambda i: (
            f"cu_seqlens has {ncu[i] - 1} segments for {ndoc[i]} documents and "
            f"num_tokens {nt[i]} (expected {ndoc[i] + int(padded[i])})"
        ),
    )
    shape_ok = ~(cu_bad | count_bad | nt_bad | lists_bad)
    boundary = np.zeros(b.n, np.int64)
    boundary[shape_ok] = cu[cu_off[:-1][shape_ok] + ndoc[shape_ok]]
    end_bad = shape_ok & (boundary != nt)
    report(
        "num_tokens",
        end_bad,
        lambda i: (
            f"num_tokens is {nt[i]}, but the document segments end at "
            f"cu_seqlens[{ndoc[i]}] = {boundary[i]}"
        ),
    )
    return _Shape(lists_bad, nt_bad, shape_ok & ~end_bad)


def _check_positions(b: _Block, ok: np.ndarray, report: _Report) -> None:
    """position_ids restart at every boundary and count up (well-formed rows)."""
    n, L, cu = b.n, b.max_len, b.cu
    cu_row = b.cu_row
    is_last = np.zeros(cu.size, bool)
    if cu.size:
        is_last[b.cu_off[1:][b.ncu > 0] - 1] = True
    start_entry = ~is_last & ok[cu_row]
    mark = np.zeros(n * L, np.int32)  # int32 halves the memory traffic of the big arrays
    mark[cu_row[start_entry] * L + cu[start_entry]] = cu[start_entry]
    seg_start = np.maximum.accumulate(mark.reshape(n, L), axis=1)
    expected_pos = np.arange(L, dtype=np.int32)[None, :] - seg_start
    wrong_pos = b.pos != expected_pos

    def describe_pos(i: int) -> str:
        j = int(np.argmax(wrong_pos[i]))
        return (
            f"position_ids[{j}] is {b.pos[i, j]}, expected {expected_pos[i, j]} "
            f"(the segment starting at {seg_start[i, j]})"
        )

    report("position_ids", ok & wrong_pos.any(axis=1), describe_pos)


def _check_padding(b: _Block, rules: _Rules, nt_bad: np.ndarray, report: _Report) -> None:
    """Padding holds pad_id and no label; every id is in the vocabulary."""
    L, ids, nt, labels = b.max_len, b.ids, b.nt, b.labels
    cols = np.arange(L, dtype=np.int32)
    in_pad = cols[None, :] >= np.where(nt_bad, L, nt).astype(np.int32)[:, None]
    if rules.pad_id is not None:
        wrong_pad = in_pad & (ids != rules.pad_id)

        def describe_pad(i: int) -> str:
            j = int(np.argmax(wrong_pad[i]))
            return (
                f"input_ids[{j}] is {ids[i, j]} in the padding (num_tokens {nt[i]}), "
                f"expected pad_id {rules.pad_id}"
            )

        report("padding", wrong_pad.any(axis=1), describe_pad)
    if labels is not None:
        wrong_label = in_pad & (labels != IGNORE_INDEX)
        report(
            "labels",
            wrong_label.any(axis=1),
            lambda i: (
                f"labels[{int(np.argmax(wrong_label[i]))}] is "
                f"{labels[i, int(np.argmax(wrong_label[i]))]} in the padding, expected "
                f"{IGNORE_INDEX}"
            ),
        )
    if rules.vocab_size is not None:
        vocab = rules.vocab_size
        wrong_id = (ids < 0) | (ids >= vocab)
        report(
            "input_ids",
            wrong_id.any(axis=1),
            lambda i: (
                f"input_ids[{int(np.argmax(wrong_id[i]))}] is "
                f"{ids[i, int(np.argmax(wrong_id[i]))]}, outside the tokenizer's vocabulary "
                f"(0..{vocab - 1})"
            ),
        )


def _check_segment_ids(b: _Block, rules: _Rules, shape: _Shape, report: _Report) -> _SegmentIds:
    """Document and chunk ids in range; each segment's length and last token."""
    docs, chunks, doc_off, chunk_off, ndoc = b.docs, b.chunks, b.doc_off, b.chunk_off, b.ndoc
    seg_row = np.repeat(np.arange(b.n), ndoc)
    local = np.arange(docs.size) - np.repeat(doc_off[:-1], ndoc)
    paired = ~shape.lists_bad[seg_row]
    seg_chunk = np.full(docs.size, -1, np.int64)
    seg_chunk[paired] = chunks[(np.repeat(chunk_off[:-1], ndoc) + local)[paired]]
    limit = rules.documents_read
    wrong_doc = (docs < 0) | ((docs >= limit) if limit is not None else False)
    wrong_chunk = paired & (seg_chunk < 0)
    id_bad = np.zeros(b.n, bool)
    id_bad[seg_row[wrong_doc | wrong_chunk]] = True

    def describe_ids(i: int) -> str:
        d = docs[doc_off[i] : doc_off[i + 1]]
        return (
            f"doc_ids {_show(d)} / chunk_ids "
            f"{_show(chunks[chunk_off[i] : chunk_off[i + 1]])} out of range (documents "
            f"number 0..{'?' if limit is None else limit - 1}, chunks from 0)"
        )

    report("doc_ids", id_bad, describe_ids)
    seg_ok = shape.ok[seg_row]
    entry = np.repeat(b.cu_off[:-1], ndoc) + local
    seg_len = np.full(docs.size, -1, np.int64)
    seg_len[seg_ok] = b.cu[entry[seg_ok] + 1] - b.cu[entry[seg_ok]]
    last_tok = np.full(docs.size, -1, np.int64)
    last_tok[seg_ok] = b.ids[seg_row[seg_ok], b.cu[entry[seg_ok] + 1] - 1]
    return _SegmentIds(
        seg_row, paired, seg_chunk, wrong_doc, wrong_chunk, seg_ok, entry, seg_len, last_tok
    )


def _check_ends(b: _Block, rules: _Rules, seg: _SegmentIds, report: _Report) -> None:
    """EOS ends a document's last (short) segment; BOS starts its first chunk."""
    docs, L = b.docs, b.max_len
    if rules.eos_id is not None:
        eos_id = rules.eos_id
        eos_bad_seg = seg.ok & (seg.length < L) & (seg.last != eos_id)
        eos_bad = np.zeros(b.n, bool)
        eos_bad[seg.row[eos_bad_seg]] = True

        def describe_eos(i: int) -> str:
            k = int(np.flatnonzero(eos_bad_seg & (seg.row == i))[0])
            return (
                f"document {docs[k]} chunk {seg.chunk[k]} ({seg.length[k]} tokens, its last) "
                f"ends with {seg.last[k]}, not EOS {eos_id}"
            )

        report("eos", eos_bad, describe_eos)
    if rules.bos_id is not None:
        bos_id = rules.bos_id
        opening = seg.ok & (seg.chunk == 0)
        first_tok = np.full(docs.size, bos_id, np.int64)
        first_tok[opening] = b.ids[seg.row[opening], b.cu[seg.entry[opening]]]
        bos_bad_seg = opening & (first_tok != bos_id)
        bos_bad = np.zeros(b.n, bool)
        bos_bad[seg.row[bos_bad_seg]] = True

        def describe_bos(i: int) -> str:
            k = int(np.flatnonzero(bos_bad_seg & (seg.row == i))[0])
            return f"document {docs[k]} starts with {first_tok[k]}, not BOS {bos_id}"

        report("bos", bos_bad, describe_bos)


def _add_row_digests(b: _Block, ok: np.ndarray, seg: _SegmentIds, digests: _Digests) -> None:
    """Add each document segment's tokens to its document's digest (well-formed rows only).

    Each segment start is marked with the segment's index; a running maximum along the row
    gives every token slot its segment (segments of a row are in increasing index order).
    """
    ids, nt, cu, entry, seg_row, seg_ok = b.ids, b.nt, b.cu, seg.entry, seg.row, seg.ok
    usable = seg.ok & seg.paired & ~seg.wrong_doc & ~seg.wrong_chunk
    n, L = ids.shape
    marked = np.flatnonzero(seg_ok)
    if marked.size == 0:
        return
    flat = seg_row[marked] * L + cu[entry[marked]]
    mark = np.zeros(n * L, np.int64)
    starts = np.zeros(n * L, np.int64)
    mark[flat] = marked + 1
    starts[flat] = cu[entry[marked]]
    seg_at = np.maximum.accumulate(mark.reshape(n, L), axis=1) - 1
    offset_in_seg = np.arange(L)[None, :] - np.maximum.accumulate(starts.reshape(n, L), axis=1)
    real = (np.arange(L)[None, :] < nt[:, None]) & ok[:, None]
    seg_of = seg_at[real]  # the segment of every real token of a well-formed row
    keep = usable[seg_of]
    seg_of = seg_of[keep]
    if seg_of.size == 0:
        return
    position = seg.chunk[seg_of] * L + offset_in_seg[real][keep]
    lane0, lane1 = _digest_terms(ids[real][keep], position)
    group = np.flatnonzero(np.concatenate([[True], seg_of[1:] != seg_of[:-1]]))
    owner = b.docs[seg_of[group]]
    np.add.at(digests.lane0, owner, _group_sums(lane0, group))
    np.add.at(digests.lane1, owner, _group_sums(lane1, group))
    np.add.at(digests.length, owner, np.diff(np.append(group, seg_of.size)))
    if digests.label0 is not None and digests.label1 is not None and b.labels is not None:
        label0, label1 = _digest_terms(b.labels[real][keep], position)
        np.add.at(digests.label0, owner, _group_sums(label0, group))
        np.add.at(digests.label1, owner, _group_sums(label1, group))


def _check_shards(
    reader: PackedReader,
    rules: _Rules,
    problems: _Problems,
    report: VerifyReport,
    digests: _Digests | None,
    progress: VerifyProgress | None,
) -> tuple[_Segments, bool]:
    """Bytes, sha256, then every row of every shard. Returns (segments, all shards read).

    On a store each shard is downloaded once, into a scratch directory, and hashed on the
    way; its rows are then read from that copy (not downloaded a second time)."""
    segments = _Segments()
    with contextlib.ExitStack() as stack:
        scratch = None
        if isinstance(reader.path, StorePath):
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="packtool-")))
        all_read = _check_each_shard(
            reader, rules, problems, report, digests, progress, scratch, segments
        )
    return segments, all_read


def _check_each_shard(
    reader: PackedReader,
    rules: _Rules,
    problems: _Problems,
    report: VerifyReport,
    digests: _Digests | None,
    progress: VerifyProgress | None,
    scratch: Path | None,
    segments: _Segments,
) -> bool:
    """:func:`_check_shards`' loop over the shards; whether every shard could be read."""
    total_bytes = sum(_int(s.bytes) or 0 for s in reader.manifest.shards)
    hashed = [0]

    def on_bytes(n: int) -> None:
        hashed[0] += n
        if progress:
            progress("hash", hashed[0], total_bytes)

    block_rows = max(1, _BLOCK_TOKENS // rules.max_len)
    manifest = reader.manifest
    all_read = True
    row0 = 0
    for index, entry in enumerate(manifest.shards):
        name, path = entry.file, reader.shard_paths[index]
        report.shards_checked += 1
        if not path.is_file():
            problems.add("files", "the shard file is missing", name)
            all_read = False
            row0 += entry.rows
            continue
        size = path.stat().st_size
        if _int(entry.bytes) is None or not isinstance(entry.sha256, str):
            problems.add("manifest", "the manifest records no bytes/sha256 for this shard", name)
        elif size != entry.bytes:
            problems.add(
                "bytes",
                f"{size} bytes, the manifest records {entry.bytes} "
                f"({'truncated' if size < entry.bytes else 'grown'})",
                name,
            )
        copy = None if scratch is None else scratch / f"shard-{index}.arrow"
        if isinstance(entry.sha256, str):
            digest = sha256_of(path, copy_to=copy, on_bytes=on_bytes)
            report.bytes_hashed += size
            if digest != entry.sha256:
                problems.add(
                    "sha256", "sha256 differs from the manifest's: the shard was altered", name
                )
        try:
            table = reader.shard_table(index, copy if copy is not None and copy.exists() else None)
        except FormatError as e:
            problems.add("shard", f"cannot be read: {_message(e, path)}", name)
            all_read = False
            row0 += entry.rows
            if copy is not None:
                copy.unlink(missing_ok=True)
            continue
        for batch in table.to_batches():
            for start in range(0, batch.num_rows, block_rows):
                block = batch.slice(start, block_rows)
                report.tokens += _check_block(block, rules, name, row0, problems, segments, digests)
                row0 += block.num_rows
                report.rows_checked += block.num_rows
                if progress:
                    progress("rows", report.rows_checked, reader.num_rows)
        reader.release(index)  # one shard mapped at a time
        del table
        if copy is not None:
            copy.unlink(missing_ok=True)
    return all_read


# -- over the whole dataset -----------------------------------------------------------------


def _check_coverage(
    segments: _Segments,
    manifest: Manifest,
    rules: _Rules,
    problems: _Problems,
    report: VerifyReport,
) -> None:
    """Every (doc, chunk) once; chunks 0..k-1; counts equal to the manifest's."""
    doc, chunk, length, row, last = segments.arrays()
    L = rules.max_len
    report.segments = int(doc.size)
    order = np.lexsort((chunk, doc))
    doc, chunk, length, row, last = (a[order] for a in (doc, chunk, length, row, last))
    same_doc = doc[1:] == doc[:-1]
    new_doc = np.concatenate([[True], ~same_doc])[: doc.size]
    last_of_doc = np.concatenate([~same_doc, [True]])[: doc.size]

    def name(check: str, mask: np.ndarray, describe: Callable[[int], str]) -> None:
        hits = np.flatnonzero(mask)
        if hits.size:
            problems.count(check, int(hits.size))
            for i in hits[: problems.room()]:
                i = int(i)
                problems.keep(check, describe(i), None, int(row[i]))

    dup = np.concatenate([[False], same_doc & (chunk[1:] == chunk[:-1])])[: doc.size]
    name(
        "coverage",
        dup,
        lambda i: (
            f"document {doc[i]} chunk {chunk[i]} appears twice (rows {row[i - 1]} and {row[i]})"
        ),
    )

    def describe_gap(i: int) -> str:
        since = 0 if new_doc[i] else int(chunk[i - 1]) + 1
        span = f"chunk {since}" if chunk[i] - 1 == since else f"chunks {since}..{chunk[i] - 1}"
        return f"document {doc[i]}: {span} missing (the next present is {chunk[i]})"

    gap = (new_doc & (chunk != 0)) | (
        np.concatenate([[False], same_doc & (chunk[1:] > chunk[:-1] + 1)])[: doc.size]
    )
    # Missing chunks: each gap's chunks (chunk 0 counts when a document starts later).
    before = np.where(new_doc, -1, np.concatenate([[0], chunk[:-1]])[: doc.size])
    missing = np.where(gap, chunk - before - 1, 0)
    dropped = rules.dropped_chunks
    if not dropped:
        name("coverage", gap, describe_gap)
    short = ~last_of_doc & (length >= 0) & (length != L)
    name(
        "coverage",
        short,
        lambda i: (
            f"document {doc[i]} chunk {chunk[i]} has {length[i]} tokens, but only the "
            f"last chunk of a split document may be shorter than max_len {L}"
        ),
    )
    split_end = np.zeros(doc.size, bool)
    if rules.eos_id is not None:
        # The last chunk of a split document ends with the document's EOS, also when it
        # is max_len long; a lost last chunk shows as a chunk that does not.
        no_eos = last_of_doc & (last >= 0) & (last != rules.eos_id)
        # With chunks dropped, a split document may keep one (full) chunk, not its last.
        split_end = no_eos & (length == L) if dropped else no_eos & ~new_doc
    if dropped:
        # Chunks with nothing to learn were dropped (and counted): gaps, and split documents
        # whose last chunks are gone, up to that count.
        lost = int(missing.sum()) + int(np.count_nonzero(split_end))
        if lost > dropped:
            problems.add(
                "coverage",
                f"{lost} chunks are missing from the rows, the manifest says {dropped} chunks "
                "without labels were dropped",
            )
    elif rules.eos_id is not None:
        name(
            "coverage",
            split_end,
            lambda i: (
                f"document {doc[i]}: its last chunk {chunk[i]} does not end with EOS "
                f"{rules.eos_id} (a later chunk is missing?)"
            ),
        )

    n_docs = int(np.count_nonzero(new_doc))
    report.documents = n_docs
    chunks_per_doc = np.diff(np.append(np.flatnonzero(new_doc), doc.size))
    _check_lengths(manifest, length, problems)
    _check_counts(
        manifest,
        report,
        problems,
        segments=int(doc.size),
        documents=n_docs,
        split=int(np.count_nonzero(chunks_per_doc > 1)),
        dropped_chunks=rules.dropped_chunks,
        single_full=int(np.count_nonzero((chunks_per_doc == 1) & (length[new_doc] == L))),
    )


def _check_lengths(manifest: Manifest, length: np.ndarray, problems: _Problems) -> None:
    """The manifest's segment-length histogram (what a merge of units counts the global FFD
    rows from) against the segments in the rows."""
    recorded = manifest.segment_lengths
    if manifest.has_segment_lengths and recorded is None:
        problems.add("manifest", "segment_lengths does not add up to the segments recorded")
    elif (
        recorded is not None
        and not (length < 0).any()  # malformed rows are reported on their own
        and (recorded.size != length.size or (recorded != np.sort(length)).any())
    ):
        problems.add(
            "counts", "the segment lengths in the rows differ from the manifest's segment_lengths"
        )


def _check_counts(
    manifest: Manifest,
    report: VerifyReport,
    problems: _Problems,
    *,
    segments: int,
    documents: int,
    split: int,
    single_full: int,
    dropped_chunks: int = 0,
) -> None:
    """The manifest's counts against the rows: rows, segments, tokens, documents."""

    def mismatch(what: str) -> None:
        problems.add("counts", what)

    rows = manifest.rows_recorded
    if rows is not None and report.rows_checked != rows:
        mismatch(f"the shards hold {report.rows_checked} rows, the manifest says {rows}")
    if manifest.segments is not None and segments != manifest.segments:
        mismatch(
            f"the rows hold {segments} document segments, the manifest says {manifest.segments}"
        )
    packed_tokens = manifest.packed_tokens_recorded
    if packed_tokens is not None and report.tokens != packed_tokens:
        mismatch(f"the rows hold {report.tokens} tokens, the manifest says {packed_tokens}")
    counts = manifest.document_counts_recorded
    recorded = {k: _int(counts.get(k)) for k in ("packed", "split", "truncated")}
    if all(v is not None for v in recorded.values()):
        in_rows = recorded["packed"] + recorded["split"] + recorded["truncated"]
        if documents != in_rows:
            mismatch(
                f"the rows hold {documents} documents, the manifest's packed + split + "
                f"truncated is {in_rows}"
            )
        # A split document whose other chunks had nothing to learn holds one chunk in the rows.
        if not split <= recorded["split"] <= split + dropped_chunks:
            mismatch(
                f"{split} documents are split into several chunks in the rows, the manifest "
                f"says {recorded['split']} were split"
            )
        if recorded["truncated"] > single_full:
            mismatch(
                f"the manifest says {recorded['truncated']} documents were truncated, but "
                f"only {single_full} documents fill exactly max_len"
            )


# -- against the inputs ---------------------------------------------------------------------


def _rows_tokens(
    reader: PackedReader, rows_of: np.ndarray, doc: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """The tokens (and labels) of document ``doc`` read back from ``rows_of`` (its rows),
    chunks joined."""
    pieces: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
    for r in sorted(set(rows_of.tolist())):
        row = reader.row(int(r))
        for seg in row.segments:
            if seg.doc_id == doc and seg.chunk_id is not None:
                labels = None if row.labels is None else row.labels[seg.start : seg.end]
                pieces[seg.chunk_id] = (row.input_ids[seg.start : seg.end], labels)
    if not pieces:
        return np.zeros(0, np.int32), None
    ids = np.concatenate([pieces[c][0] for c in sorted(pieces)])
    if any(p[1] is None for p in pieces.values()):
        return ids, None
    return ids, np.concatenate([pieces[c][1] for c in sorted(pieces)])  # type: ignore[misc]


def _resolve_tokenizer(
    reader: PackedReader, tokenizer: Tokenizer | str | os.PathLike[str] | None
) -> Tokenizer:
    from .tokenize import SpecialTokens

    manifest = reader.manifest
    if tokenizer is None:
        try:
            return reader.load_tokenizer()
        except FormatError as e:
            raise OptionError(f"{e}: pass the tokenizer it was packed with (--tokenizer)") from None
    if isinstance(tokenizer, (str, os.PathLike)):
        tok = load_tokenizer(tokenizer)
        if manifest.special_tokens:
            own_pad = manifest.pad_from == "tokenizer"  # else the padding's
            tok.special = SpecialTokens(
                eos_id=manifest.eos_id,
                bos_id=manifest.bos_id,
                pad_id=manifest.pad_id if own_pad else tok.special.pad_id,
            )
        return tok
    return tokenizer


@dataclass
class _Expected:
    """One batch of re-tokenized documents after the overflow policy."""

    first: int  # document index of the batch's first record
    lane0: np.ndarray  # digest per record (0 for a record with nothing to pack)
    lane1: np.ndarray
    length: np.ndarray  # tokens packed per record
    tokens: Callable[[int], tuple[np.ndarray, np.ndarray | None]]  # packed ids, labels of i
    label0: np.ndarray | None = None  # digest of the labels per record (labelled ids)
    label1: np.ndarray | None = None


@dataclass
class _AgainstPlan:
    """What re-tokenizing needs, found before any row is read (so mistakes fail fast)."""

    files: list[Any]
    options: PackOptions  # as recorded in the manifest
    overflow: Overflow
    encoder: DocumentEncoder | IdsEncoder | InputPlan  # the plan itself for instruction data
    read: Callable[..., Iterator[Any]]  # the plan's reader: texts, records or ids, as pack read
    labelled: bool = False  # labels (instruction data, pre-tokenized labels) compared too


def _recorded_options(
    reader: PackedReader, parse_special: bool | None, chat_template: AnyPath | None
) -> PackOptions:
    """The options ``pack`` recorded in the manifest, as a :class:`PackOptions`: what
    re-tokenizing needs (``parse_special``, when given, overrides the record). A chat
    template is ``chat_template``, else the file the manifest names if it is still there,
    else the tokenizer's own (checked against the recorded sha256 once loaded)."""
    where = reader.path / MANIFEST_FILE
    recorded = reader.manifest.options
    needed = ("text_field", "overflow", "add_eos", "bos", "skip_bad_records", "split", "txt_unit")
    if any(k not in recorded for k in needed):
        raise FormatError(f"{where}: 'options' does not record how the data was packed")
    values = {k: v for k, v in recorded.items() if k != "chat_template"}  # a record, not a path
    if values.get("input_shape") == "chat":
        values["chat_template"] = chat_template or _recorded_template_file(
            reader.manifest.chat_template, reader.manifest.tokenizer_name, reader.path
        )
    if values.get("loss_on") == "labels":  # pre-tokenized labels: read from a field
        values.pop("loss_on")
    values.setdefault("parse_special", True)  # packed before the option existed: parsed
    if parse_special is not None:
        values["parse_special"] = parse_special
    values["tokenizer_backend"] = "hf"  # the check stays independent of the fast path
    try:
        options = PackOptions.from_mapping(values)
    except OptionError as e:
        raise FormatError(f"{where}: 'options' are not options of pack: {e}") from None
    if options.overflow is None:
        raise FormatError(f"{where}: 'options' does not record the overflow policy")
    return options


def _recorded_template_file(
    record: ChatTemplateRecord | None,
    tokenizer_name: str | None = None,
    out: AnyPath | None = None,
) -> str | None:
    """The chat template file the manifest names, if it was a file and is still there; for
    a template that came with the tokenizer (its ``tokenizer_config.json`` or
    ``chat_template.jinja``), that file of the tokenizer pack was given, if it is still
    there; else ``None``: the tokenizer's own, of which the output keeps a copy beside its
    ``tokenizer.json`` (its sha256 is checked once loaded)."""
    if record is None:
        return None
    source = record.source
    if source == "file":
        name = record.name
        if isinstance(name, str) and (is_url(name) or Path(name).is_file()):
            return name
    elif source in ("tokenizer_config.json", "chat_template.jinja") and tokenizer_name:
        where = Path(tokenizer_name).expanduser()
        candidate = (where if where.is_dir() else where.parent) / str(source)
        if not is_url(tokenizer_name) and candidate.is_file():
            return str(candidate)
    if source != "tokenizer_config.json" and out is not None:  # the output's copy of it
        copy = out / CHAT_TEMPLATE_FILE
        if copy.is_file():
            return str(copy)
    return None


def _check_template(plan: InputPlan, record: ChatTemplateRecord | None) -> None:
    """Refuse a chat template other than the one the data was packed with: every label
    would differ."""
    if plan.template is None or record is None:
        return
    packed_with = record.sha256
    if packed_with and plan.template.sha256 != packed_with:
        raise OptionError(
            f"--against: the chat template {plan.template.name} (sha256 "
            f"{plan.template.sha256[:12]}...) is not the one the data was packed with "
            f"({record.name}, sha256 {str(packed_with)[:12]}...): pass that one "
            "with --chat-template"
        )


def _prepare_against(
    reader: PackedReader,
    inputs: Sequence[str | os.PathLike[str]],
    tokenizer: Tokenizer | str | os.PathLike[str] | None,
    problems: _Problems,
    parse_special: bool | None = None,
    chat_template: AnyPath | None = None,
) -> _AgainstPlan:
    manifest = reader.manifest
    options = _recorded_options(reader, parse_special, chat_template)
    overflow = Overflow(options.overflow)
    if not inputs:
        inputs = manifest.input_paths
        if not inputs:
            raise OptionError("--against: no inputs given and none recorded in the manifest")
    files = resolve_inputs(inputs)
    if (
        options.ids_field is not None
        and tokenizer is None
        and manifest.tokenizer_name == IdsTokenizer.name
    ):
        eos, bos = manifest.eos_id, manifest.bos_id
        tok: Tokenizer = IdsTokenizer(  # type: ignore[assignment]
            eos_token=None if eos is None else str(eos),
            bos_token=None if bos is None else str(bos),
            vocab_size=options.vocab_size,
        )
    else:
        tok = _resolve_tokenizer(reader, tokenizer)
    _check_tokenizer(tok, manifest, problems)
    try:
        input_plan = plan_input(files, tok, options)  # as pack built it
    except ChatTemplateError as e:
        if options.chat_template is not None or manifest.chat_template is None:
            raise
        raise ChatTemplateError(
            f"--against: {reader.path} was packed with the chat template "
            f"{manifest.chat_template.name}, "
            "which is not found from here (nor a copy in the output): pass it with "
            "--chat-template FILE (a .jinja, or the tokenizer's tokenizer_config.json)"
        ) from e
    _check_template(input_plan, manifest.chat_template)
    instruct = isinstance(input_plan.encoder, InstructEncoder)
    encoder = input_plan if instruct else input_plan.encoder
    assert isinstance(encoder, (DocumentEncoder, IdsEncoder, InputPlan))
    recorded = manifest.input_sizes
    if len(files) != len(recorded):
        problems.add(
            "against", f"{len(files)} inputs given, the data was packed from {len(recorded)}"
        )
    for i, (inp, (rec_path, rec_size)) in enumerate(zip(files, recorded, strict=False)):
        if rec_size not in (None, inp.size_bytes):
            problems.add(
                "against",
                f"input {i} ({inp.path}) has {inp.size_bytes} bytes; the manifest recorded "
                f"{rec_size} bytes for {rec_path}: not the same file",
            )
    labelled = (options.ids_field is not None or instruct) and input_plan.labelled
    labelled = labelled and reader.has_labels
    return _AgainstPlan(files, options, overflow, encoder, input_plan.read, labelled)


def _check_against(
    reader: PackedReader,
    plan: _AgainstPlan,
    digests: _Digests,
    segments: _Segments,
    problems: _Problems,
    progress: VerifyProgress | None,
) -> AgainstReport:
    """Re-read and re-tokenize the inputs as ``pack`` did; compare digests and counts."""
    started = time.perf_counter()
    files, options = plan.files, plan.options
    doc_seg, _, _, seg_rows, _ = segments.arrays()
    by_doc = np.argsort(doc_seg, kind="stable")
    where = _DocumentRows(doc_seg[by_doc], seg_rows[by_doc])
    counts = asdict(DocumentCounts())  # read, packed, split, ... all 0
    tokens = {"packed": 0, "truncated_away": 0, "dropped": 0}
    label_counts = dict.fromkeys(_LABEL_COUNT_KEYS, 0) if digests.label0 is not None else None
    compared = 0
    total_bytes = sum(f.size_bytes for f in files)
    bytes_before = 0
    for inp in files:
        for batch in plan.read(
            inp,
            skip_bad_records=options.skip_bad_records,
            split=options.split,
            txt_unit=options.txt_unit,
        ):
            expected = _expect_batch(
                batch,
                counts,
                tokens,
                plan.encoder,
                plan.overflow,
                reader.max_len,
                label_counts,
                options.skip_bad_records,
            )
            compared += _compare_batch(reader, plan, digests, expected, len(batch.records),
                                       where, problems)  # fmt: skip
            if progress:
                progress("against", bytes_before + batch.bytes_done, total_bytes)
        bytes_before += inp.size_bytes
    _compare_counts(reader.manifest, digests, counts, tokens, label_counts, problems)
    return AgainstReport(
        inputs=[str(f.path) for f in files],
        documents=counts,
        tokens=tokens,
        documents_compared=compared,
        seconds=time.perf_counter() - started,
    )


@dataclass(frozen=True)
class _DocumentRows:
    """The rows of each document: segment document ids (sorted) and the row of each."""

    doc_sorted: np.ndarray
    rows: np.ndarray

    def of(self, doc: int) -> np.ndarray:
        lo = np.searchsorted(self.doc_sorted, doc)
        return self.rows[lo : np.searchsorted(self.doc_sorted, doc, side="right")]


def _compare_batch(
    reader: PackedReader,
    plan: _AgainstPlan,
    digests: _Digests,
    expected: Any,
    n_records: int,
    where: _DocumentRows,
    problems: _Problems,
) -> int:
    """Compare one batch of re-read documents with the rows' digests; returns how many
    documents were compared (those with tokens on either side)."""
    known = digests.length.size  # documents.read of the manifest
    lo, hi = expected.first, min(expected.first + n_records, known)
    if hi <= lo:
        return 0
    w = hi - lo
    wrong = (
        (digests.length[lo:hi] != expected.length[:w])
        | (digests.lane0[lo:hi] != expected.lane0[:w])
        | (digests.lane1[lo:hi] != expected.lane1[:w])
    )
    if digests.label0 is not None and expected.label0 is not None:
        wrong |= digests.label0[lo:hi] != expected.label0[:w]
        wrong |= digests.label1[lo:hi] != expected.label1[:w]  # type: ignore[index]
    bad = np.flatnonzero(wrong)
    problems.count("against", int(bad.size))
    for i in bad[: problems.room()]:
        d = lo + int(i)
        rows_of = where.of(d)
        problems.keep(
            "against",
            _describe_mismatch(reader, d, rows_of, expected.tokens(int(i)), plan.overflow),
            None,
            int(rows_of.min()) if rows_of.size else None,
        )
    return int(np.count_nonzero((expected.length[:w] > 0) | (digests.length[lo:hi] > 0)))


def _compare_counts(
    manifest: Manifest,
    digests: _Digests,
    counts: dict[str, int],
    tokens: dict[str, int],
    label_counts: dict[str, int] | None,
    problems: _Problems,
) -> None:
    """The inputs' document, token and label counts against the manifest's; documents in the
    rows beyond the end of the inputs."""
    beyond = np.flatnonzero(digests.length[counts["read"] :] > 0) + counts["read"]
    problems.count("against", int(beyond.size))
    for d in beyond[: problems.room()]:
        problems.keep(
            "against",
            f"document {d} ({manifest.locate_document(int(d))}) is in the rows, but "
            f"the inputs end after {counts['read']} documents",
            None,
            None,
        )
    documents = manifest.document_counts_recorded
    if documents:
        for key, value in counts.items():
            if documents.get(key) != value:
                problems.add(
                    "against",
                    f"the inputs give {value} documents "
                    f"{'read' if key == 'read' else key.replace('_', ' ')}, the manifest "
                    f"says {documents.get(key)}",
                )
    if label_counts is not None:
        tokens["learned"] = label_counts.pop("learned")
        for key, value in label_counts.items():
            if manifest.labels.get(key) not in (None, value):
                problems.add(
                    "against",
                    f"the inputs give {value} {key.replace('_', ' ')}, the manifest says "
                    f"{manifest.labels.get(key)}",
                )
    for key, value in tokens.items():
        if manifest.tokens_recorded.get(key) not in (None, value):
            problems.add(
                "against",
                f"re-reading the inputs gives {value} tokens {key.replace('_', ' ')}, the "
                f"manifest says {manifest.tokens_recorded.get(key)}",
            )


def _check_tokenizer(tok: Tokenizer, manifest: Manifest, problems: _Problems) -> None:
    if manifest.tokenizer_sha256 not in (None, tok.sha256):
        problems.add(
            "against",
            f"the tokenizer {tok.name} (sha256 {tok.sha256[:12]}...) is not the one the data "
            f"was packed with (sha256 {str(manifest.tokenizer_sha256)[:12]}...)",
        )
    special = manifest.special_tokens
    if special:
        for key, value in (("eos_id", tok.special.eos_id), ("bos_id", tok.special.bos_id)):
            if special.get(key) != value:
                problems.add(
                    "against",
                    f"the tokenizer's {key} is {value}, the data was packed with "
                    f"{special.get(key)}",
                )


def _expect_batch(
    batch: Any,
    counts: dict[str, int],
    tokens: dict[str, int],
    encoder: DocumentEncoder | IdsEncoder | InputPlan,
    overflow: Overflow,
    max_len: int,
    label_counts: dict[str, int] | None = None,
    skip_bad_records: bool = False,
) -> _Expected:
    """Encode one batch as ``pack`` does, count outcomes, and digest what would be packed."""
    first = counts["read"]
    n = len(batch.records)
    counts["read"] += n
    if isinstance(encoder, (IdsEncoder, InputPlan)):
        if isinstance(encoder, InputPlan):  # instruction records: rendered, tokenized
            encoded = encoder.finish(encoder.tokenize(batch, skip_bad_records))
            good = np.array([i for i, r in enumerate(batch.records) if r is not None], np.int64)
        else:  # pre-tokenized: the ids as read, compared directly
            encoded, good = encoder.finish(batch), batch.good
        counts["bad_records_skipped"] += len(batch.bad)  # with the records a template failed
        if encoded.labels is not None and label_counts is not None:
            return _expect_labelled(
                encoded, good, first, n, counts, tokens, label_counts, overflow, max_len
            )
    else:
        counts["bad_records_skipped"] += len(batch.bad)
        good = np.array([i for i, t in enumerate(batch.texts) if t is not None], np.int64)
        encoded = encoder.encode([batch.texts[i] for i in good])
    lengths, empty = encoded.lengths, encoded.empty
    long = ~empty & (lengths > max_len)
    counts["empty"] += int(np.count_nonzero(empty))
    counts["packed"] += int(np.count_nonzero(~empty & ~long))
    if overflow is Overflow.SPLIT:
        counts["split"] += int(np.count_nonzero(long))
        kept = lengths.copy()
    elif overflow is Overflow.TRUNCATE:
        counts["truncated"] += int(np.count_nonzero(long))
        tokens["truncated_away"] += int((lengths[long] - max_len).sum())
        kept = np.minimum(lengths, max_len)
    else:
        counts["dropped"] += int(np.count_nonzero(long))
        tokens["dropped"] += int(lengths[long].sum())
        kept = np.where(long, 0, lengths)
    kept[empty] = 0
    tokens["packed"] += int(kept.sum())
    offsets = encoded.offsets
    position = np.arange(encoded.ids.size) - np.repeat(offsets, lengths)
    take = position < np.repeat(kept, lengths)
    lane0, lane1 = _digest_terms(encoded.ids[take], position[take])
    has = kept > 0
    group = np.concatenate([[0], np.cumsum(kept[has])[:-1]]).astype(np.int64)[: int(has.sum())]
    out = _Expected(
        first, np.zeros(n, np.uint64), np.zeros(n, np.uint64), np.zeros(n, np.int64), None
    )  # type: ignore[arg-type]
    out.lane0[good[has]] = _group_sums(lane0, group)
    out.lane1[good[has]] = _group_sums(lane1, group)
    out.length[good] = kept
    encoded_index = np.full(n, -1, np.int64)
    encoded_index[good] = np.arange(good.size)

    def packed_tokens(i: int) -> tuple[np.ndarray, np.ndarray | None]:
        e = int(encoded_index[i])
        if e < 0:
            return np.zeros(0, np.int32), None
        return encoded.ids[offsets[e] : offsets[e] + kept[e]], None

    out.tokens = packed_tokens
    return out


_LABEL_COUNT_KEYS = (
    "learned",
    "documents_without_labels",
    "chunks_without_labels_dropped",
    "tokens_in_chunks_without_labels",
)


def _expect_labelled(
    encoded: Any,
    good: np.ndarray,
    first: int,
    n: int,
    counts: dict[str, int],
    tokens: dict[str, int],
    label_counts: dict[str, int],
    overflow: Overflow,
    max_len: int,
) -> _Expected:
    """:func:`_expect_batch` for pre-tokenized documents with labels: the items ``pack``
    stores (the pipeline's own cut: each segment's first label -100, chunks with nothing
    learned dropped), their ids and labels digested by position in the document."""
    doc, chunk, item_len, c, labels = segment_labelled_items(
        encoded.lengths, encoded.empty, encoded.labels, max_len, overflow, ignore=IGNORE_INDEX
    )
    for key in ("packed", "split", "truncated", "dropped", "empty"):
        counts[key] += c[key]
    tokens["truncated_away"] += c["tokens_truncated"]
    tokens["dropped"] += c["tokens_dropped"]
    tokens["packed"] += int(item_len.sum())
    for key in label_counts:
        label_counts[key] += c[key]
    offsets = encoded.offsets
    inner = np.arange(int(item_len.sum())) - np.repeat(np.cumsum(item_len) - item_len, item_len)
    position = np.repeat(chunk.astype(np.int64) * max_len, item_len) + inner
    at = np.repeat(offsets[doc], item_len) + position
    lane0, lane1 = _digest_terms(encoded.ids[at], position)
    label0, label1 = _digest_terms(labels[at], position)
    out = _Expected(
        first, np.zeros(n, np.uint64), np.zeros(n, np.uint64), np.zeros(n, np.int64),
        lambda i: (np.zeros(0, np.int32), None), np.zeros(n, np.uint64), np.zeros(n, np.uint64),
    )  # fmt: skip
    if doc.size:
        starts = np.cumsum(item_len) - item_len
        group = starts[np.concatenate([[True], doc[1:] != doc[:-1]])]
        owner = good[doc[np.concatenate([[True], doc[1:] != doc[:-1]])]]
        for target, terms in zip(
            (out.lane0, out.lane1, out.label0, out.label1),
            (lane0, lane1, label0, label1),
            strict=True,
        ):
            target[owner] = _group_sums(terms, group)  # type: ignore[index]
        out.length[good] = np.bincount(doc, weights=item_len, minlength=good.size).astype(np.int64)
    where = np.full(n, -1, np.int64)
    where[good] = np.arange(good.size)

    def packed(i: int) -> tuple[np.ndarray, np.ndarray | None]:
        take = np.flatnonzero(doc == where[i]) if where[i] >= 0 else np.zeros(0, np.int64)
        if not take.size:
            return np.zeros(0, np.int32), None
        idx = np.concatenate(
            [offsets[doc[k]] + chunk[k] * max_len + np.arange(item_len[k]) for k in take]
        )
        return encoded.ids[idx], labels[idx]

    out.tokens = packed
    return out


def _describe_mismatch(
    reader: PackedReader,
    doc: int,
    rows_of: np.ndarray,
    wanted: tuple[np.ndarray, np.ndarray | None],
    overflow: Overflow,
) -> str:
    where = f"document {doc} ({reader.manifest.locate_document(doc)})"
    expected, expected_labels = wanted
    if expected.size == 0:
        return f"{where} is in the rows, but re-reading the inputs gives nothing to pack for it"
    if rows_of.size == 0:
        return f"{where} is missing from the rows ({expected.size} tokens expected)"
    try:
        actual, actual_labels = _rows_tokens(reader, rows_of, doc)
    except FormatError:
        return f"{where}: its tokens differ from the re-tokenized input"
    if actual.size != expected.size:
        return (
            f"{where} has {actual.size} tokens in the rows, {expected.size} after "
            f"re-tokenizing the input (overflow {overflow.value})"
        )
    diff = np.flatnonzero(actual != expected)
    if diff.size:
        j = int(diff[0])
        return (
            f"{where}: token {j} is {actual[j]} in the rows, {expected[j]} after "
            f"re-tokenizing ({diff.size} of {expected.size} tokens differ)"
        )
    if expected_labels is not None and actual_labels is not None:
        diff = np.flatnonzero(actual_labels != expected_labels)
        if diff.size:
            j = int(diff[0])
            return (
                f"{where}: label {j} is {actual_labels[j]} in the rows, {expected_labels[j]} "
                f"from the input ({diff.size} of {expected.size} labels differ)"
            )
    return f"{where}: its chunks are numbered or placed differently from a split of the input"


# -- the entry point -----------------------------------------------------------------------


def _against_digests(reader: PackedReader, read: int | None, labelled: bool) -> _Digests:
    """Empty digests of the ``read`` documents, filled from the rows, then compared."""
    if read is None:
        raise FormatError(
            f"{reader.path / MANIFEST_FILE}: no documents.read count: cannot compare with the "
            "inputs"
        )
    digests = _Digests(
        np.zeros(read, np.uint64), np.zeros(read, np.uint64), np.zeros(read, np.int64)
    )
    if labelled:
        digests.label0, digests.label1 = np.zeros(read, np.uint64), np.zeros(read, np.uint64)
    return digests


def verify(
    path: str | os.PathLike[str],
    against: Sequence[str | os.PathLike[str]] | None = None,
    *,
    tokenizer: Tokenizer | str | os.PathLike[str] | None = None,
    max_problems: int = 20,
    progress: VerifyProgress | None = None,
    parse_special: bool | None = None,
    chat_template: str | os.PathLike[str] | None = None,
) -> VerifyReport:
    """Check the packed dataset at ``path``; with ``against``, also against its inputs.

    >>> report = verify("out/")
    >>> report.ok, report.rows_checked, report.problems[:1]
    (False, 1200, [Problem(shard='data-00001-of-00003.arrow', row=417,
                           what='position_ids[12] is 5, expected 0 ...', check='position_ids')])

    ``against`` lists the inputs given to ``pack`` (files, directories, globs), re-read with
    the options recorded in the manifest and re-tokenized with the copy of the tokenizer in
    the output (or ``tokenizer``: an object, or a path or name as for ``pack``). At most
    ``max_problems`` problems are kept; all are counted (``problems_total``,
    ``problem_counts``). Raises :class:`~packtool.errors.FormatError` when ``path`` is not a
    packtool output (no manifest, an unknown format version).

    Special-token strings in the inputs are re-tokenized as the manifest records
    (``options.parse_special``; a manifest from before that option parsed them); a
    ``parse_special`` given here overrides it.

    Chat records are rendered with ``chat_template``, else the template file the manifest
    names (if it is still there), else the tokenizer's; one whose sha256 is not the recorded
    one is refused. Their labels are compared with the rows', as are prompt/completion ones.
    """
    if max_problems < 0:
        raise OptionError(f"--max-problems must be >= 0, got {max_problems}")
    started = time.perf_counter()
    reader = open_packed(path)
    manifest = reader.manifest
    report = VerifyReport(path=as_path(path))
    problems = _Problems(report, max_problems)

    def shard_of(row: int) -> str | None:
        try:
            return manifest.shards[reader.locate(row)[0]].file
        except IndexError:
            return None

    problems.shard_of = shard_of
    _check_manifest(manifest, problems)
    _check_files(reader.path, manifest, problems, report)
    max_len = reader.max_len
    expected_columns = packed_schema(max_len, reader.has_labels).names
    if manifest.columns != expected_columns:
        problems.add("manifest", f"columns are {manifest.columns}, expected {expected_columns}")
    pad_id = manifest.pad_id_option
    if pad_id is None:
        report.notes.append("no options.pad_id in the manifest: padding ids not checked")
    vocab = manifest.vocab_size
    if vocab is None:
        report.notes.append("no tokenizer.vocab_size in the manifest: token ids not checked")
    read = manifest.documents_read_recorded
    rules = _Rules(
        max_len=max_len,
        pad_id=pad_id,
        vocab_size=vocab,
        documents_read=read,
        eos_id=manifest.eos_id if manifest.add_eos else None,
        bos_id=manifest.bos_id if manifest.add_bos else None,
        has_labels=reader.has_labels,
        dropped_chunks=manifest.dropped_label_chunks,
    )
    plan, digests = None, None
    if against is not None:
        plan = _prepare_against(reader, against, tokenizer, problems, parse_special,
                                chat_template)  # fmt: skip
        digests = _against_digests(reader, read, plan.labelled)
    segments, all_read = _check_shards(reader, rules, problems, report, digests, progress)
    if all_read:
        _check_coverage(segments, manifest, rules, problems, report)
    else:
        report.segments = sum(a.size for a in segments.doc)
        report.notes.append(
            "dataset-wide checks (coverage, totals) skipped: some shards could not be read"
        )
    if plan is not None and digests is not None:
        if all_read:
            report.against = _check_against(reader, plan, digests, segments, problems, progress)
        else:
            report.notes.append("--against skipped: some shards could not be read")
    report.problem_counts = dict(problems.counts)
    report.seconds = time.perf_counter() - started
    return report
