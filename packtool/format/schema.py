"""The columns of a packed row: one table, from which the Arrow schema, the Hugging Face
features, the shard-size estimate and the schema check are derived.

One row, ``max_len`` 24, documents of 5, 9 and 7 tokens, then 3 pad tokens (``P``)::

    input_ids    a a a a a b b b b b b b b b c c c c c c c P P P
    position_ids 0 1 2 3 4 0 1 2 3 4 5 6 7 8 0 1 2 3 4 5 6 0 1 2
    cu_seqlens   [0, 5, 14, 21, 24]
    num_tokens   21
    doc_ids      [d_a, d_b, d_c]       (one per document segment; none for the padding)
    chunk_ids    [0, 0, 0]
    seq_lengths  [5, 9, 7, 1, 1, 1]    (the documents' lengths, then each pad on its own)

The padding tail is a segment of its own (the last one), so the segments cover every position
and ``position_ids[cu[i]:cu[i+1]] == arange(cu[i+1] - cu[i])`` holds for every segment.

Packed with ``--pad-to-multiple-of 4`` (the same documents, ``max_len`` 32)::

    input_ids           a a a a a P P P  b b b b b b b b b P P P  c c c c c c c P  P P P P
    position_ids        0 1 2 3 4 5 6 7  0 1 2 3 4 5 6 7 8 9 ...  0 1 2 3 4 5 6 7  0 1 2 3
    cu_seqlens          [0, 8, 20, 28, 32]    the padded boundaries, all multiples of 4
    cu_seqlens_unpadded [0, 5, 14, 21, 21]    the running sums of the real lengths
    num_tokens          21
    seq_lengths         [5, 1, 1, 1, 9, 1, 1, 1, 7, 1, 1, 1, 1, 1]

A document's alignment pad belongs to its segment (its positions continue), and
``cu_seqlens_unpadded`` is Megatron's ``cu_seqlens_q`` where ``cu_seqlens`` is its
``cu_seqlens_q_padded``; the column is there only in an aligned pack.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = [
    "COLUMNS",
    "IGNORE_INDEX",
    "Column",
    "Per",
    "column_names",
    "columns",
    "hf_features",
    "int_array",
    "packed_schema",
    "row_bytes",
    "schema_problem",
    "seq_lengths",
]

IGNORE_INDEX = -100
"""The label of a token that is not learned (padding, prompt): PyTorch's cross-entropy default."""

_ROW_OVERHEAD_BYTES = 64  # the ragged columns and Arrow's offsets, about, per row


class Per(Enum):
    """How many values a column holds in one row."""

    TOKEN = "token"  # max_len values: fixed_size_list<value>[max_len]
    BOUNDARY = "boundary"  # one per segment boundary: list<value>
    SEGMENT = "segment"  # one per document segment (not the padding): list<value>
    SPAN = "span"  # one per segment, the padding tail included: list<value>
    ROW = "row"  # one value


@dataclass(frozen=True)
class Column:
    """One column of a packed row, as docs/format.md's table describes it."""

    name: str
    per: Per
    value: pa.DataType
    description: str
    labels_only: bool = False  # present only in instruction data (a labelled pack)
    added: bool = False  # added to format 1 later: packs written before it lack it
    aligned_only: bool = False  # present only in a pack with --pad-to-multiple-of

    def arrow_type(self, max_len: int) -> pa.DataType:
        if self.per is Per.TOKEN:
            return pa.list_(self.value, max_len)
        if self.per is Per.ROW:
            return self.value
        return pa.list_(self.value)

    def field(self, max_len: int) -> pa.Field:
        return pa.field(self.name, self.arrow_type(max_len), nullable=False)


COLUMNS: tuple[Column, ...] = (
    Column("input_ids", Per.TOKEN, pa.int32(), "the token ids; pad_id after num_tokens"),
    Column(
        "position_ids",
        Per.TOKEN,
        pa.int32(),
        "restart at 0 at every segment boundary, also in the padding segment",
    ),
    Column(
        "cu_seqlens",
        Per.BOUNDARY,
        pa.int32(),
        "segment boundaries: [0, len1, len1+len2, ..., max_len]",
    ),
    Column(
        "cu_seqlens_unpadded",
        Per.BOUNDARY,
        pa.int32(),
        "the running sums of the segments' real lengths (their alignment pad left out): "
        "Megatron's cu_seqlens_q beside cu_seqlens as its cu_seqlens_q_padded "
        "(--pad-to-multiple-of only)",
        aligned_only=True,
    ),
    Column("num_tokens", Per.ROW, pa.int32(), "real (non-padding) tokens in the row"),
    Column("doc_ids", Per.SEGMENT, pa.int64(), "each document segment's source document"),
    Column(
        "chunk_ids",
        Per.SEGMENT,
        pa.int32(),
        "each document segment's chunk number (0 unless the document was split)",
    ),
    Column(
        "seq_lengths",
        Per.SPAN,
        pa.int32(),
        "each segment's length, the padding tail's too: diff(cu_seqlens) "
        "(what TRL's padding-free collator reads)",
        added=True,
    ),
    Column(
        "labels",
        Per.TOKEN,
        pa.int32(),
        f"the token to learn, or {IGNORE_INDEX} (instruction data only)",
        labels_only=True,
    ),
)
"""Every column a packed row can hold, in the order a shard stores them."""


def columns(
    with_labels: bool = False, *per: Per, added: bool = True, aligned: bool = False
) -> tuple[Column, ...]:
    """The columns of a pack (``with_labels``: instruction data), in stored order; only
    those of the kinds ``per``, if any are given. ``added=False``: a pack written before the
    columns added to format 1 later (``seq_lengths``), which lacks them. ``aligned``: a pack
    with ``--pad-to-multiple-of`` (``cu_seqlens_unpadded``)."""
    return tuple(
        c
        for c in COLUMNS
        if (with_labels or not c.labels_only)
        and (added or not c.added)
        and (aligned or not c.aligned_only)
        and (not per or c.per in per)
    )


def column_names(
    with_labels: bool = False, *per: Per, added: bool = True, aligned: bool = False
) -> list[str]:
    """The names of :func:`columns`."""
    return [c.name for c in columns(with_labels, *per, added=added, aligned=aligned)]


def seq_lengths(
    cu_values: np.ndarray,
    cu_offsets: np.ndarray,
    num_tokens: np.ndarray,
    unpadded: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``seq_lengths`` (values, offsets) of rows whose ``cu_seqlens`` are ``cu_values``
    split at ``cu_offsets`` and whose real tokens are ``num_tokens``: each row's document
    segments' lengths (``diff(cu_seqlens)``), then its padding tail as segments of one token
    each, so that a trainer that learns no label at a sequence start (TRL's padding-free
    collator) learns no padding, and each pad attends only to itself.

    ``unpadded``: the rows' ``cu_seqlens_unpadded`` (same offsets) of an aligned pack; each
    document's real length then comes with its alignment pad as segments of one token each,
    like the tail's, so that TRL learns no alignment pad either."""
    if unpadded is not None:
        return _aligned_seq_lengths(cu_values, cu_offsets, unpadded)
    cu_values = np.asarray(cu_values, dtype=np.int64)
    cu_offsets = np.asarray(cu_offsets, dtype=np.int64)
    num_tokens = np.asarray(num_tokens, dtype=np.int64)
    counts = np.diff(cu_offsets)
    lengths = np.diff(cu_values)
    # a row's last boundary to the next row's first is no segment
    ends = cu_offsets[1:][counts > 0] - 1
    lengths = np.delete(lengths, ends[ends < lengths.size])
    per_row = np.maximum(counts - 1, 0)
    seg_off = np.concatenate([[0], np.cumsum(per_row)])
    # the padding tail: the last segment of a row whose last boundary is past its real tokens
    has = per_row > 0
    last = np.zeros(counts.size, np.int64)
    last[has] = cu_values[cu_offsets[1:][has] - 1]
    where = np.flatnonzero(has & (last > num_tokens))
    seg = seg_off[where + 1] - 1
    pads = np.minimum(last[where] - num_tokens[where], lengths[seg]).clip(min=1)
    reps = np.ones(lengths.size, np.int64)
    reps[seg] = pads
    values = lengths.copy()
    values[seg] = 1
    per_row[where] += pads - 1
    return np.repeat(values, reps), np.concatenate([[0], np.cumsum(per_row)])


def _aligned_seq_lengths(
    cu_values: np.ndarray, cu_offsets: np.ndarray, unpadded: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`seq_lengths` of an aligned pack: per segment, its real length (if any), then
    one 1 per pad (its alignment pad, or the whole padding tail, whose real length is 0)."""
    cu_values = np.asarray(cu_values, dtype=np.int64)
    cu_offsets = np.asarray(cu_offsets, dtype=np.int64)
    unpadded = np.asarray(unpadded, dtype=np.int64)
    keep = np.ones(cu_values.size, bool)
    keep[cu_offsets[1:][np.diff(cu_offsets) > 0] - 1] = False  # a row's last boundary
    padded = np.diff(cu_values)[keep[:-1]] if cu_values.size else cu_values
    real = np.diff(unpadded)[keep[:-1]] if unpadded.size else unpadded
    per_segment = (real > 0) + padded - real  # values each segment gives
    out = np.ones(int(per_segment.sum()), np.int64)
    starts = np.cumsum(per_segment) - per_segment
    out[starts[real > 0]] = real[real > 0]
    segs_per_row = np.maximum(np.diff(cu_offsets) - 1, 0)
    row_of_segment = np.repeat(np.arange(segs_per_row.size), segs_per_row)
    per_row = np.bincount(row_of_segment, weights=per_segment, minlength=segs_per_row.size)
    return out, np.concatenate([[0], np.cumsum(per_row.astype(np.int64))])


def row_bytes(max_len: int, with_labels: bool = False) -> int:
    """About the bytes of one row in a shard (its per-token columns of ``max_len``, and a
    little for the others): what ``--shard-size`` is divided by to get the rows per shard."""
    per_token = sum(c.value.bit_width // 8 for c in columns(with_labels, Per.TOKEN))
    return per_token * max_len + _ROW_OVERHEAD_BYTES


def packed_schema(
    max_len: int, with_labels: bool = False, added: bool = True, aligned: bool = False
) -> pa.Schema:
    """The Arrow schema of a packed dataset's rows (``added=False``: of a pack written before
    the columns added to format 1 later; ``aligned``: of a pack with ``--pad-to-multiple-of``)."""
    return pa.schema([c.field(max_len) for c in columns(with_labels, added=added, aligned=aligned)])


def schema_problem(
    schema: pa.Schema, max_len: int, with_labels: bool, added: bool = True, aligned: bool = False
) -> str | None:
    """What is wrong with a shard's ``schema`` (a missing column, a wrong type), or None.

    Columns this version does not know are allowed (readers ignore them).
    """
    for expected in packed_schema(max_len, with_labels, added, aligned):
        index = schema.get_field_index(expected.name)
        if index < 0:
            return f"the shard has no column {expected.name!r}"
        if schema.field(index).type != expected.type:
            return (
                f"column {expected.name!r} is {schema.field(index).type}, expected {expected.type}"
            )
    return None


def _hf_feature(kind: pa.DataType) -> dict[str, Any]:
    if pa.types.is_fixed_size_list(kind):
        return {"feature": _hf_feature(kind.value_type), "length": kind.list_size, "_type": "List"}
    if pa.types.is_list(kind):
        return {"feature": _hf_feature(kind.value_type), "_type": "List"}
    return {"dtype": str(kind), "_type": "Value"}


def hf_features(schema: pa.Schema) -> dict[str, Any]:
    """The Hugging Face `datasets` (>= 4) features dict of ``schema``.

    Written by hand rather than with `datasets.Features` to keep the slow `datasets` import out
    of ``pack``; a test checks it against `datasets`' own conversion.
    """
    return {f.name: _hf_feature(f.type) for f in schema}


def int_array(a: np.ndarray, dtype: type[np.integer]) -> pa.Array:
    """A NumPy integer array as an Arrow array of ``dtype``, without a copy when it already
    is one (``pa.array`` would also import pandas, ~0.2 s, on its first call)."""
    a = np.ascontiguousarray(a, dtype=dtype)
    return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), a.size, [None, pa.py_buffer(a)])
