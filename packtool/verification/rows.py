"""The checks that need only the pack: the manifest's arithmetic, the files it names, every
row of every shard (shape, positions, padding, segment ids, ends), and over the whole
dataset the coverage of every document's chunks and the counts the manifest records.

Rows are checked vectorised with NumPy, a block of rows at a time (about
``BLOCK_TOKENS`` token slots)."""

from __future__ import annotations

import contextlib
import functools
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import FormatError, PacktoolError
from ..format import (
    IGNORE_INDEX,
    MANIFEST_FILE,
    Manifest,
    PackedReader,
    ShardEntry,
    layout_problems,
    packed_schema,
    read_lost_chunks,
    seq_lengths,
    trainer_cache_files,
)
from ..fs import AnyPath, StorePath, sha256_of
from ..pretokenized import IdsTokenizer
from .digest import Digests, digest_terms, group_sums
from .report import Problems, VerifyProgress, VerifyReport, int_or_none

__all__ = [
    "BLOCK_TOKENS",
    "Rules",
    "Segments",
    "check_coverage",
    "check_files",
    "check_manifest",
    "check_shards",
]

BLOCK_TOKENS = 1 << 22  # rows are checked in blocks of about this many token slots


def _show(values: np.ndarray, limit: int = 12) -> str:
    items = [str(int(v)) for v in values[:limit]]
    if values.size > limit:
        items.append(f"... ({values.size} values)")
    return "[" + ", ".join(items) + "]"


def _message(error: PacktoolError, path: Path) -> str:
    """A format error's message without the leading ``path: `` (the problem names it), nor
    its advice to run ``packtool verify`` (this is it)."""
    text = str(error)
    prefix = f"{path}: "
    text = text[len(prefix) :] if text.startswith(prefix) else text
    text = text.removeprefix("cannot read shard: ")  # (the problem says "cannot be read")
    return re.sub(r"(; it is a shard of .*)? \(run `packtool verify`\)$", "", text)


# -- the manifest and the files it names ----------------------------------------------------


def check_manifest(reader: PackedReader, problems: Problems) -> None:
    """The manifest's own arithmetic (its counts must agree with each other) and its
    columns (those of the format's schema)."""
    manifest = reader.manifest
    for problem in manifest.problems():
        problems.add("manifest", f"{MANIFEST_FILE}: {problem}")
    expected_columns = packed_schema(
        reader.max_len,
        reader.has_labels,
        reader.has_seq_lengths,
        reader.aligned,
        sources=reader.has_sources,
    ).names
    if manifest.columns != expected_columns:
        problems.add("manifest", f"columns are {manifest.columns}, expected {expected_columns}")
    multiple = manifest.pad_to_multiple_of
    if reader.aligned != (multiple > 1) or reader.max_len % multiple:
        problems.add(
            "manifest",
            f"options.pad_to_multiple_of is {multiple} for rows "
            + ("with" if reader.aligned else "without")
            + f" cu_seqlens_unpadded and max_len {reader.max_len}",
        )


def check_files(
    path: AnyPath, manifest: Manifest, problems: Problems, report: VerifyReport
) -> None:
    """The tokenizer copy, state.json, and files that should not be there."""
    for problem in layout_problems(path, manifest):
        problems.add("files", problem)
    cache = trainer_cache_files(path, manifest)
    if cache:
        report.warnings.append(
            f"{', '.join(cache)}: a trainer's cache (`datasets` maps a dataset loaded from "
            "this directory and writes its results beside it), not part of the pack; "
            "load_dataset('arrow', data_files='out/*.arrow') would read it too: remove it, "
            "and see docs/training.md for recipes that write nothing here"
        )
    for entry in manifest.repack_files:
        _check_repack_file(path, entry, manifest, problems)
    if manifest.tokenizer.file is None and manifest.tokenizer.name != IdsTokenizer.name:
        # (pre-tokenized data packed without a tokenizer has none to copy)
        report.notes.append(
            "no tokenizer copy in the output (packed with a tokenizer object): "
            "--against needs the tokenizer given explicitly"
        )


def _check_repack_file(
    path: AnyPath, entry: ShardEntry, manifest: Manifest, problems: Problems
) -> None:
    """A repack record the manifest lists (``repack_files``): there, of its bytes and sha256,
    readable, and about documents and chunks the pack can hold."""
    name, file = entry.file, path / entry.file
    if not file.is_file():
        problems.add("files", "the repack record the manifest lists is missing", name)
        return
    size = file.stat().st_size
    if size != entry.bytes:
        problems.add("bytes", f"{size} bytes, the manifest records {entry.bytes}", name)
        return
    if sha256_of(file) != entry.sha256:
        problems.add("sha256", "sha256 differs from the manifest's: the record was altered", name)
        return
    try:
        lost = read_lost_chunks(path, [entry])
    except FormatError as e:
        problems.add("repack", f"cannot be read: {_message(e, file)}", name)
        return
    read = manifest.counts.documents.read
    stride = manifest.mixture.doc_id_stride if manifest.mixture else None
    if lost.size != entry.rows:
        problems.add("repack", f"{lost.size} rows, the manifest records {entry.rows}", name)
    elif lost.size and (lost.doc_id.min() < 0 or int(lost.doc_id.max()) >= (stride or read)):
        problems.add("repack", "a doc_id outside the documents the pack read", name)
    elif lost.size and (lost.chunk_id < 0).any():
        problems.add("repack", "a negative chunk_id", name)


# -- rows -----------------------------------------------------------------------------------


@dataclass
class Rules:
    """What every row must satisfy, from the manifest."""

    max_len: int
    pad_id: int | None
    vocab_size: int | None
    documents_read: int | None
    eos_id: int | None  # set when every document got an EOS
    bos_id: int | None  # set when every document got a BOS (--bos)
    has_labels: bool
    dropped_chunks: int = 0  # chunks with nothing to learn, dropped (labels only)
    align: int = 1  # --pad-to-multiple-of (1: none)

    @classmethod
    def of(cls, reader: PackedReader, report: VerifyReport) -> Rules:
        """The rules of the pack at ``reader``; what the manifest does not record, and so
        cannot be checked, is said in ``report.notes``."""
        manifest = reader.manifest
        options, special = manifest.recorded_options, manifest.tokenizer.special
        pad_id = options.pad_id
        if pad_id is None:
            report.notes.append("no options.pad_id in the manifest: padding ids not checked")
        vocab = manifest.tokenizer.vocab_size
        if vocab is None:
            report.notes.append("no tokenizer.vocab_size in the manifest: token ids not checked")
        return cls(
            max_len=reader.max_len,
            pad_id=pad_id,
            vocab_size=vocab,
            documents_read=_id_limit(manifest),
            eos_id=special.eos_id if options.add_eos else None,
            bos_id=special.bos_id if options.bos else None,
            has_labels=reader.has_labels,
            dropped_chunks=manifest.dropped_label_chunks,
            align=manifest.pad_to_multiple_of if reader.aligned else 1,
        )


def _id_limit(manifest: Manifest) -> int | None:
    """The doc ids are below this: the documents read; in a mixture, times the copies of a
    document (copy ``c`` of document ``d`` is ``d + c * doc_id_stride``)."""
    read = manifest.documents.read if manifest.documents else None
    mixture = manifest.mixture
    if read is None or mixture is None:
        return read
    return read * max(1, mixture.copies)


def _check_mixture(
    manifest: Manifest,
    doc: np.ndarray,
    length: np.ndarray,
    source: np.ndarray | None,
    problems: Problems,
) -> int | None:
    """A mixture's rows against its record: each source's documents (the doc ids, less the
    copies, within the source's range) hold the tokens it took, in as many documents. The
    documents the mixture took (copies counted), or None for a pack of no mixture."""
    mixture = manifest.mixture
    if mixture is None:
        return None
    read_doc = doc % mixture.doc_id_stride
    for src in mixture.sources:
        mine = src.holds(read_doc)
        if source is not None:
            wrong = mine & (source != src.index)
            if wrong.any():
                problems.add(
                    "source_ids",
                    f"{int(np.count_nonzero(wrong))} segments of source {src.index}'s "
                    f"documents ({src.path}) have another source id (the first: "
                    f"{int(source[wrong][0])})",
                )
        tokens = int(length[mine & (length >= 0)].sum())
        documents = int(np.unique(doc[mine]).size)
        if tokens != src.tokens_taken or documents != src.documents_taken:
            problems.add(
                "mixture",
                f"source {src.index} ({src.path}): the rows hold {tokens} tokens of "
                f"{documents} documents, the manifest says {src.tokens_taken} of "
                f"{src.documents_taken}",
            )
    return mixture.documents_taken


@dataclass
class Segments:
    """Document segments seen in the rows, in row order (for the dataset-wide checks)."""

    doc: list[np.ndarray] = field(default_factory=list)
    chunk: list[np.ndarray] = field(default_factory=list)
    length: list[np.ndarray] = field(default_factory=list)  # -1 where the row is malformed
    row: list[np.ndarray] = field(default_factory=list)
    last: list[np.ndarray] = field(default_factory=list)  # last token, -1 if malformed
    source: list[np.ndarray] = field(default_factory=list)  # a mixture's; -1 if malformed

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
    span_off: np.ndarray | None = None  # seq_lengths (None: a pack written before it)
    spans: np.ndarray | None = None
    source_off: np.ndarray | None = None  # source_ids (a mixture only)
    sources: np.ndarray | None = None
    ucu: np.ndarray | None = None  # cu_seqlens_unpadded (an aligned pack), at cu_off

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

    @functools.cached_property
    def is_last(self) -> np.ndarray:
        """Each cu entry: whether it is its row's last (no segment starts there)."""
        is_last = np.zeros(self.cu.size, bool)
        if self.cu.size:
            is_last[self.cu_off[1:][self.ncu > 0] - 1] = True
        return is_last

    def real(self, ok: np.ndarray) -> np.ndarray:
        """``[n, max_len]``: the positions of the rows ``ok`` that hold a document's token
        (not padding; in an aligned pack, not a document's alignment pad either)."""
        cols = np.arange(self.max_len, dtype=np.int32)[None, :]
        if self.ucu is None:
            return (cols < self.nt.astype(np.int32)[:, None]) & ok[:, None]
        n, L, cu = self.n, self.max_len, self.cu
        start = ~self.is_last & ok[self.cu_row]
        real_len = np.zeros(cu.size, np.int64)
        real_len[:-1] = np.diff(self.ucu)
        mark = np.full(n * L, -1, np.int64)
        mark[self.cu_row[start] * L + cu[start]] = np.flatnonzero(start)
        entry = np.maximum.accumulate(mark.reshape(n, L), axis=1)
        real = (cols - cu[entry]) < real_len[entry]
        real[~ok] = False
        return real


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
    span_off, spans = (
        _ragged(batch.column("seq_lengths"))
        if "seq_lengths" in batch.schema.names
        else (None, None)
    )
    ucu = None
    if "cu_seqlens_unpadded" in batch.schema.names:
        ucu_off, ucu = _ragged(batch.column("cu_seqlens_unpadded"))
        if not np.array_equal(ucu_off, cu_off):
            return "cu_seqlens_unpadded and cu_seqlens differ in length: rows not checked"
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
        span_off=span_off,
        spans=spans,
        **_sources_of(batch),
        ucu=ucu,
    )


def _sources_of(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    """A mixture's ``source_ids`` (values and offsets), when the rows hold them."""
    if "source_ids" not in batch.schema.names:
        return {}
    source_off, sources = _ragged(batch.column("source_ids"))
    return {"source_off": source_off, "sources": sources}


def _check_block(batch: pa.RecordBatch, state: _ShardPass, shard: str, row0: int) -> int:
    """Check the rows of one record batch (global rows from ``row0``); returns real tokens."""
    rules, problems, segments, digests = state.rules, state.problems, state.segments, state.digests
    b = _decode_block(batch, rules.max_len, rules.has_labels, shard, row0)
    if isinstance(b, str):
        problems.add("nulls", b, shard)
        return 0

    def report(check: str, bad: np.ndarray, describe: Callable[[int], str]) -> None:
        problems.rows(check, bad, shard, row0, describe)

    shape = _check_shape(b, report)
    if b.ucu is not None:
        shape = _check_alignment(b, rules, shape, report)
    _check_positions(b, shape.ok, report)
    _check_seq_lengths(b, shape.ok, report)
    _check_padding(b, rules, shape, report)
    seg = _check_segment_ids(b, rules, shape, report)
    _check_ends(b, rules, seg, report)
    if b.labels is not None:
        _check_labels(b, shape, seg, report)
    segments.doc.append(b.docs[seg.paired])
    segments.chunk.append(seg.chunk[seg.paired])
    segments.length.append(seg.length[seg.paired])
    segments.row.append(seg.row[seg.paired] + row0)
    segments.last.append(seg.last[seg.paired])
    if b.sources is not None:
        segments.source.append(_check_source_ids(b, report)[seg.paired])
    if digests is not None:
        _add_row_digests(b, shape.ok, seg, digests)
    return int(b.nt[~shape.nt_bad].sum())


_Report = Callable[[str, np.ndarray, Callable[[int], str]], None]


def _check_source_ids(b: _Block, report: _Report) -> np.ndarray:
    """One source id per document segment (as many as doc_ids); the ids per doc_ids entry,
    -1 in a row whose counts differ."""
    assert b.source_off is not None and b.sources is not None
    ndoc, nsrc = np.diff(b.doc_off), np.diff(b.source_off)
    bad = ndoc != nsrc
    report(
        "source_ids",
        bad,
        lambda i: f"source_ids has {nsrc[i]} entries but doc_ids {ndoc[i]}",
    )
    out = np.full(b.docs.size, -1, np.int64)
    good = np.repeat(~bad, ndoc)
    out[good] = b.sources[np.repeat(~bad, nsrc)]
    return out


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
    if b.ucu is None:
        padded = nt < L
    else:  # the documents end at cu_seqlens[len(doc_ids)], past their alignment pad
        reach = ~cu_bad & (ncu - 1 >= ndoc)
        used = np.full(b.n, L, np.int64)
        used[reach] = cu[cu_off[:-1][reach] + ndoc[reach]]
        padded = used < L
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
    boundary[shape_ok] = (cu if b.ucu is None else b.ucu)[cu_off[:-1][shape_ok] + ndoc[shape_ok]]
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


def _check_alignment(b: _Block, rules: Rules, shape: _Shape, report: _Report) -> _Shape:
    """An aligned pack's rows: cu_seqlens_unpadded starts at 0 and ends at num_tokens; each
    document segment holds 1 or more real tokens and takes the least multiple of the
    alignment that holds them; the padding tail holds none and is a multiple of it too."""
    assert b.ucu is not None
    cu, ucu, n_align = b.cu, b.ucu, rules.align
    ok = shape.ok
    if cu.size == 0:
        return shape
    entry_ok = ok[b.cu_row] & ~b.is_last
    real = np.zeros(cu.size, np.int64)
    span = np.zeros(cu.size, np.int64)
    real[:-1], span[:-1] = np.diff(ucu), np.diff(cu)
    doc_entry = np.zeros(cu.size, bool)  # the entries where a document segment starts
    ndoc = b.ndoc
    local = np.arange(b.docs.size) - np.repeat(b.doc_off[:-1], ndoc)
    starts = np.repeat(b.cu_off[:-1], ndoc) + local
    doc_entry[starts[ok[np.repeat(np.arange(b.n), ndoc)]]] = True  # rows of the right shape
    tail = entry_ok & ~doc_entry
    want = -(-real // n_align) * n_align
    wrong = (doc_entry & ((real < 1) | (span != want))) | (
        tail & ((real != 0) | (span % n_align != 0))
    )
    bad = np.zeros(b.n, bool)
    bad[b.cu_row[wrong]] = True
    first_bad = ok & (ucu[b.cu_off[:-1].clip(max=cu.size - 1)] != 0)
    bad |= first_bad

    def describe(i: int) -> str:
        a, z = b.cu_off[i], b.cu_off[i + 1]
        return (
            f"cu_seqlens_unpadded {_show(ucu[a:z])} does not fit cu_seqlens {_show(cu[a:z])} "
            f"padded to multiples of {n_align} (each document's real length, then its least "
            "multiple)"
        )

    report("cu_seqlens_unpadded", bad, describe)
    return _Shape(shape.lists_bad, shape.nt_bad, ok & ~bad)


def _check_seq_lengths(b: _Block, ok: np.ndarray, report: _Report) -> None:
    """seq_lengths is the documents' lengths then one per pad, in every row (well-formed rows)."""
    if b.spans is None or b.span_off is None:
        return
    expected, expected_off = seq_lengths(b.cu, b.cu_off, b.nt, b.ucu)
    spans, span_off = b.spans, b.span_off
    counts_bad = np.diff(span_off) != np.diff(expected_off)
    diff_row = np.repeat(np.arange(b.n), np.diff(expected_off))
    wrong = np.zeros(b.n, bool)
    if not counts_bad.any():
        np.logical_or.at(wrong, diff_row, spans.astype(np.int64) != expected)
    bad = (counts_bad | wrong) & ok

    def describe(i: int) -> str:
        got = spans[span_off[i] : span_off[i + 1]]
        want = expected[expected_off[i] : expected_off[i + 1]]
        return (
            f"seq_lengths {_show(got)} is not {_show(want)} (the documents' lengths by "
            "cu_seqlens, then one per pad)"
        )

    report("seq_lengths", bad, describe)


def _check_positions(b: _Block, ok: np.ndarray, report: _Report) -> None:
    """position_ids restart at every boundary and count up (well-formed rows)."""
    n, L, cu = b.n, b.max_len, b.cu
    cu_row = b.cu_row
    start_entry = ~b.is_last & ok[cu_row]
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


def _check_padding(b: _Block, rules: Rules, shape: _Shape, report: _Report) -> None:
    """Padding (and alignment pad) holds pad_id and no label; every id is in the vocabulary."""
    L, ids, nt, labels = b.max_len, b.ids, b.nt, b.labels
    if b.ucu is None:
        cols = np.arange(L, dtype=np.int32)
        in_pad = cols[None, :] >= np.where(shape.nt_bad, L, nt).astype(np.int32)[:, None]
    else:
        in_pad = ~b.real(shape.ok) & shape.ok[:, None]
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


def _check_labels(b: _Block, shape: _Shape, seg: _SegmentIds, report: _Report) -> None:
    """Each real token's label is -100 or its own id, the first token of every document
    segment is not learned (nothing in its segment precedes it), and every document segment
    learns something."""
    labels, ids = b.labels, b.ids
    assert labels is not None
    real = b.real(shape.ok)
    wrong = real & (labels != IGNORE_INDEX) & (labels != ids)

    def describe(i: int) -> str:
        j = int(np.argmax(wrong[i]))
        return (
            f"labels[{j}] is {labels[i, j]}, neither {IGNORE_INDEX} nor its token "
            f"input_ids[{j}] {ids[i, j]}"
        )

    report("labels", wrong.any(axis=1), describe)
    at = np.flatnonzero(seg.ok)
    start = b.cu[seg.entry[at]]
    learned = labels[seg.row[at], start] != IGNORE_INDEX
    first_bad = np.zeros(b.n, bool)
    first_bad[seg.row[at[learned]]] = True

    def describe_first(i: int) -> str:
        k = int(np.flatnonzero(learned & (seg.row[at] == i))[0])
        return (
            f"labels[{int(start[k])}] is {labels[i, int(start[k])]} at the start of document "
            f"{b.docs[at[k]]} chunk {seg.chunk[at[k]]}, expected {IGNORE_INDEX} (nothing in "
            "its segment precedes it)"
        )

    report("labels", first_bad, describe_first)
    flat = np.concatenate([[0], np.cumsum((labels != IGNORE_INDEX).ravel(), dtype=np.int64)])
    begin = seg.row[at].astype(np.int64) * b.max_len + start
    count = flat[begin + seg.length[at]] - flat[begin]
    none = count == 0
    none_bad = np.zeros(b.n, bool)
    none_bad[seg.row[at[none]]] = True

    def describe_none(i: int) -> str:
        k = int(np.flatnonzero(none & (seg.row[at] == i))[0])
        return (
            f"document {b.docs[at[k]]} chunk {seg.chunk[at[k]]} learns nothing (every label "
            f"-100): a pack leaves such a segment out"
        )

    report("labels", none_bad, describe_none)


def _check_segment_ids(b: _Block, rules: Rules, shape: _Shape, report: _Report) -> _SegmentIds:
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
    bounds = b.cu if b.ucu is None else b.ucu  # an aligned pack: the real lengths
    seg_len[seg_ok] = bounds[entry[seg_ok] + 1] - bounds[entry[seg_ok]]
    last_tok = np.full(docs.size, -1, np.int64)
    last_tok[seg_ok] = b.ids[seg_row[seg_ok], b.cu[entry[seg_ok]] + seg_len[seg_ok] - 1]
    return _SegmentIds(
        seg_row, paired, seg_chunk, wrong_doc, wrong_chunk, seg_ok, entry, seg_len, last_tok
    )


def _check_ends(b: _Block, rules: Rules, seg: _SegmentIds, report: _Report) -> None:
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


def _add_row_digests(b: _Block, ok: np.ndarray, seg: _SegmentIds, digests: Digests) -> None:
    """Add each document segment's tokens to its document's digest (well-formed rows only).

    Each segment start is marked with the segment's index; a running maximum along the row
    gives every token slot its segment (segments of a row are in increasing index order).
    """
    ids, cu, entry, seg_row, seg_ok = b.ids, b.cu, seg.entry, seg.row, seg.ok
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
    real = b.real(ok)
    seg_of = seg_at[real]  # the segment of every real token of a well-formed row
    keep = usable[seg_of]
    seg_of = seg_of[keep]
    if seg_of.size == 0:
        return
    position = seg.chunk[seg_of] * L + offset_in_seg[real][keep]
    lane0, lane1 = digest_terms(ids[real][keep], position)
    group = np.flatnonzero(np.concatenate([[True], seg_of[1:] != seg_of[:-1]]))
    owner = b.docs[seg_of[group]]
    np.add.at(digests.lane0, owner, group_sums(lane0, group))
    np.add.at(digests.lane1, owner, group_sums(lane1, group))
    np.add.at(digests.length, owner, np.diff(np.append(group, seg_of.size)))
    if digests.label0 is not None and digests.label1 is not None and b.labels is not None:
        label0, label1 = digest_terms(b.labels[real][keep], position)
        np.add.at(digests.label0, owner, group_sums(label0, group))
        np.add.at(digests.label1, owner, group_sums(label1, group))


@dataclass
class _ShardPass:
    """What the pass over the shards shares: the pack, its rules, where problems and figures
    go, the digests to fill (``against``), and the segments seen so far."""

    reader: PackedReader
    rules: Rules
    problems: Problems
    report: VerifyReport
    digests: Digests | None
    progress: VerifyProgress | None
    scratch: Path | None = None  # where a store's shards are copied to as they are hashed
    segments: Segments = field(default_factory=Segments)
    hashed: int = 0  # bytes hashed so far (progress)
    sizes: list[int | None] = field(default_factory=list)  # each shard's (None: missing)

    @functools.cached_property
    def total_bytes(self) -> int:
        return sum(int_or_none(s.bytes) or 0 for s in self.reader.manifest.shards)

    def on_bytes(self, n: int) -> None:
        self.hashed += n
        if self.progress:
            self.progress("hash", self.hashed, self.total_bytes)


def check_shards(
    reader: PackedReader,
    rules: Rules,
    problems: Problems,
    report: VerifyReport,
    digests: Digests | None,
    progress: VerifyProgress | None,
) -> tuple[Segments, bool]:
    """Bytes, sha256, then every row of every shard. Returns (segments, all shards read).

    On a store each shard is downloaded once, into a scratch directory, and hashed on the
    way; its rows are then read from that copy (not downloaded a second time)."""
    state = _ShardPass(reader, rules, problems, report, digests, progress)
    state.sizes = _check_sizes(reader, problems)
    with contextlib.ExitStack() as stack:
        if isinstance(reader.path, StorePath):
            state.scratch = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="packtool-"))
            )
        all_read, row0 = True, 0
        for index in range(len(reader.manifest.shards)):
            read, rows = _check_shard(state, index, row0)
            all_read &= read
            row0 += rows
    return state.segments, all_read


def _check_sizes(reader: PackedReader, problems: Problems) -> list[int | None]:
    """Every shard's size against the manifest's, before any is hashed (a shard grown to
    10 GB, sparse, was named only after all of it was hashed): the sizes (``None``: the
    file is missing, named by :func:`_check_shard`)."""
    sizes: list[int | None] = []
    for entry, path in zip(reader.manifest.shards, reader.shard_paths, strict=True):
        size = path.stat().st_size if path.is_file() else None
        sizes.append(size)
        expected = int_or_none(entry.bytes)
        if size is not None and expected is not None and size != expected:
            problems.add(
                "bytes",
                f"{size} bytes, the manifest records {expected} "
                f"({'truncated' if size < expected else 'grown'})",
                entry.file,
            )
    return sizes


def _check_shard(state: _ShardPass, index: int, row0: int) -> tuple[bool, int]:
    """One shard (its first row is global row ``row0``): its bytes and sha256, then its rows.
    Returns whether it could be read, and the rows it holds (the manifest's, if not read)."""
    reader, problems, report = state.reader, state.problems, state.report
    entry = reader.manifest.shards[index]
    name, path = entry.file, reader.shard_paths[index]
    report.shards_checked += 1
    size = state.sizes[index]
    if size is None:
        problems.add("files", "the shard file is missing", name)
        return False, entry.rows
    if int_or_none(entry.bytes) is None or not isinstance(entry.sha256, str):
        problems.add("manifest", "the manifest records no bytes/sha256 for this shard", name)
    copy = None if state.scratch is None else state.scratch / f"shard-{index}.arrow"
    expected = int_or_none(entry.bytes)
    if isinstance(entry.sha256, str) and expected is not None and size != expected:
        # (named by its size already: its bytes cannot be the recorded ones, not hashed)
        problems.add("sha256", "sha256 not computed: the size shows the shard was altered", name)
    elif isinstance(entry.sha256, str):
        digest = sha256_of(path, copy_to=copy, on_bytes=state.on_bytes)
        report.bytes_hashed += size
        if digest != entry.sha256:
            problems.add(
                "sha256", "sha256 differs from the manifest's: the shard was altered", name
            )
    try:
        try:
            table = reader.shard_table(index, copy if copy is not None and copy.exists() else None)
        except FormatError as e:
            problems.add("shard", f"cannot be read: {_message(e, path)}", name)
            return False, entry.rows
        rows = _check_rows(state, table, name, row0)
        reader.release(index)  # one shard mapped at a time
        del table
    finally:
        if copy is not None:
            copy.unlink(missing_ok=True)
    return True, rows


def _check_rows(state: _ShardPass, table: pa.Table, name: str, row0: int) -> int:
    """Every row of one shard's ``table``, a block at a time; returns the rows checked."""
    report, progress = state.report, state.progress
    first = row0
    block_rows = max(1, BLOCK_TOKENS // state.rules.max_len)
    for batch in table.to_batches():
        for start in range(0, batch.num_rows, block_rows):
            block = batch.slice(start, block_rows)
            report.tokens += _check_block(block, state, name, row0)
            row0 += block.num_rows
            report.rows_checked += block.num_rows
            if progress:
                progress("rows", report.rows_checked, state.reader.num_rows)
    return row0 - first


# -- over the whole dataset -----------------------------------------------------------------


def check_coverage(
    segments: Segments,
    manifest: Manifest,
    rules: Rules,
    problems: Problems,
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

    _check_totals(segments, manifest, rules, problems, report, (order, doc, length, new_doc))


def _check_totals(
    segments: Segments,
    manifest: Manifest,
    rules: Rules,
    problems: Problems,
    report: VerifyReport,
    sorted_by_doc: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """The documents' lengths, the mixture's sources and the counts, against the manifest;
    ``sorted_by_doc``: the segments' order by (doc, chunk), and their doc ids, lengths and
    whether each starts a document, in that order."""
    order, doc, length, new_doc = sorted_by_doc
    L = rules.max_len
    n_docs = int(np.count_nonzero(new_doc))
    report.documents = n_docs
    chunks_per_doc = np.diff(np.append(np.flatnonzero(new_doc), doc.size))
    _check_lengths(manifest, length, problems)
    source = (
        np.concatenate(segments.source)[order] if len(segments.source) else None
    )  # in the order of doc (sorted)
    taken = _check_mixture(manifest, doc, length, source, problems)
    _check_counts(
        manifest,
        report,
        problems,
        segments=int(doc.size),
        documents=n_docs,
        taken=taken,
        split=int(np.count_nonzero(chunks_per_doc > 1)),
        dropped_chunks=rules.dropped_chunks,
        single_full=int(np.count_nonzero((chunks_per_doc == 1) & (length[new_doc] == L))),
    )


def _check_lengths(manifest: Manifest, length: np.ndarray, problems: Problems) -> None:
    """The manifest's segment-length histogram (what a merge of units counts the global FFD
    rows from) against the segments in the rows."""
    recorded = manifest.segment_lengths
    if manifest.histogram is not None and recorded is None:
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
    problems: Problems,
    *,
    segments: int,
    documents: int,
    split: int,
    single_full: int,
    dropped_chunks: int = 0,
    taken: int | None = None,
) -> None:
    """The manifest's counts against the rows: rows, segments, tokens, documents."""

    def mismatch(what: str) -> None:
        problems.add("counts", what)

    rows = manifest.rows
    if rows is not None and report.rows_checked != rows:
        mismatch(f"the shards hold {report.rows_checked} rows, the manifest says {rows}")
    if manifest.segments is not None and segments != manifest.segments:
        mismatch(
            f"the rows hold {segments} document segments, the manifest says {manifest.segments}"
        )
    packed_tokens = manifest.tokens.packed if manifest.tokens else None
    if packed_tokens is not None and report.tokens != packed_tokens:
        mismatch(f"the rows hold {report.tokens} tokens, the manifest says {packed_tokens}")
    recorded = manifest.documents
    if taken is not None:  # a mixture: its documents taken, copies counted
        if documents != taken:
            mismatch(f"the rows hold {documents} documents, the mixture took {taken}")
    elif recorded is not None:
        in_rows = recorded.packed + recorded.split + recorded.truncated
        if documents != in_rows:
            mismatch(
                f"the rows hold {documents} documents, the manifest's packed + split + "
                f"truncated is {in_rows}"
            )
        # A split document whose other chunks had nothing to learn holds one chunk in the rows.
        if not split <= recorded.split <= split + dropped_chunks:
            mismatch(
                f"{split} documents are split into several chunks in the rows, the manifest "
                f"says {recorded.split} were split"
            )
        if recorded.truncated > single_full:
            mismatch(
                f"the manifest says {recorded.truncated} documents were truncated, but "
                f"only {single_full} documents fill exactly max_len"
            )
