"""The repack record of a labelled pack with split documents: what its rows cannot hold.

A labelled pack cut with ``--overflow split`` stores the first token of each chunk with no
label (a pack learns none at a segment start) and leaves out the chunks with nothing to
learn. To rebuild such a document whole, as it was read (the repack of
:mod:`packtool.repack`), the pack keeps both in ``repack.arrows`` beside its shards: an Arrow
IPC stream of one row per chunk of a split document that lost a learned first label, or that
the rows do not hold::

    doc_id     int64               the document, numbered as the rows number it
    chunk_id   int32               the chunk (0, 1, ...)
    label      int32               its first token's label as read (-100: none)
    input_ids  large_list<int32>   its tokens if the rows do not hold it (labels: -100 but
                                   the first, ``label``), else empty

sorted by (``doc_id``, ``chunk_id``). The manifest lists it under ``repack_files`` like a
shard (``file``, ``rows``, ``bytes``, ``sha256``; a merge lists each unit's with the
``doc_offset`` added to its ``doc_id``), ``verify`` checks its bytes and ``verify --against``
its contents. Every labelled pack cut with ``--overflow split`` writes it, with no rows when it
split nothing (so that its repack is known exact: a pack without it was made before it);
every other pack writes none and keeps its bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..errors import FormatError
from ..fs import AnyPath
from .records import ShardEntry

__all__ = ["REPACK_FILE", "REPACK_SCHEMA", "LostChunks", "read_lost_chunks"]

REPACK_FILE = "repack.arrows"
"""The repack record's file name in an output directory (not ``*.arrow``: no shard)."""

REPACK_SCHEMA = pa.schema(
    [
        ("doc_id", pa.int64()),
        ("chunk_id", pa.int32()),
        ("label", pa.int32()),
        ("input_ids", pa.large_list(pa.int32())),
    ]
)


@dataclass(frozen=True)
class LostChunks:
    """The rows of a repack record: chunk ``k`` is (``doc_id[k]``, ``chunk_id[k]``), its
    first label ``label[k]``, its tokens ``tokens[offsets[k]:offsets[k + 1]]`` (none: the
    pack's rows hold them)."""

    doc_id: np.ndarray  # int64
    chunk_id: np.ndarray  # int32
    label: np.ndarray  # int32
    offsets: np.ndarray  # int64, one more than the rows
    tokens: np.ndarray  # int32

    @classmethod
    def empty(cls) -> LostChunks:
        return cls(
            np.zeros(0, np.int64),
            np.zeros(0, np.int32),
            np.zeros(0, np.int32),
            np.zeros(1, np.int64),
            np.zeros(0, np.int32),
        )

    @property
    def size(self) -> int:
        return int(self.doc_id.size)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets).astype(np.int32)

    def sorted(self) -> LostChunks:
        """The rows by (``doc_id``, ``chunk_id``)."""
        order = np.lexsort((self.chunk_id, self.doc_id))
        lengths = self.lengths[order]
        starts = self.offsets[:-1][order]
        at = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
        tokens = self.tokens[at + np.arange(int(lengths.sum()), dtype=np.int64)]
        offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        return LostChunks(
            self.doc_id[order], self.chunk_id[order], self.label[order], offsets, tokens
        )

    def to_bytes(self) -> bytes:
        """The record file's bytes (an Arrow IPC stream of :data:`REPACK_SCHEMA`)."""
        ids = pa.LargeListArray.from_arrays(
            pa.array(self.offsets.astype(np.int64)), pa.array(self.tokens.astype(np.int32))
        )
        table = pa.table(
            [
                pa.array(self.doc_id.astype(np.int64)),
                pa.array(self.chunk_id.astype(np.int32)),
                pa.array(self.label.astype(np.int32)),
                ids,
            ],
            schema=REPACK_SCHEMA,
        )
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, REPACK_SCHEMA) as writer:
            writer.write_table(table)
        return bytes(sink.getvalue().to_pybytes())

    def entry(self, data: bytes, file: str = REPACK_FILE) -> ShardEntry:
        """The manifest's entry of the file holding ``data`` (:meth:`to_bytes`)."""
        return ShardEntry(file, self.size, len(data), hashlib.sha256(data).hexdigest())


def _read_one(path: AnyPath, entry: ShardEntry) -> LostChunks:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise FormatError(
            f"{path}: cannot read the repack record ({e.strerror or 'missing'}) that the "
            "manifest lists (run `packtool verify`)"
        ) from e
    if entry.bytes is not None and len(data) != entry.bytes:
        raise FormatError(
            f"{path}: {len(data)} bytes, the manifest records {entry.bytes}: the repack "
            "record was altered (run `packtool verify`)"
        )
    if entry.sha256 and hashlib.sha256(data).hexdigest() != entry.sha256:
        raise FormatError(
            f"{path}: its sha256 is not the one the manifest records: the repack record was "
            "altered (run `packtool verify`)"
        )
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise FormatError(f"{path}: not a repack record ({e})") from e
    if not table.schema.equals(REPACK_SCHEMA):
        raise FormatError(f"{path}: not a repack record (columns {table.schema.names})")
    table = table.combine_chunks()
    column = table.column("input_ids")
    ids = column.chunk(0) if column.num_chunks else pa.array([], pa.large_list(pa.int32()))
    offsets = np.asarray(ids.offsets.to_numpy(), np.int64)
    tokens = np.asarray(ids.values.to_numpy(zero_copy_only=False), np.int32)
    return LostChunks(
        np.asarray(table.column("doc_id").to_numpy(), np.int64) + entry.doc_offset,
        np.asarray(table.column("chunk_id").to_numpy(), np.int32),
        np.asarray(table.column("label").to_numpy(), np.int32),
        offsets - offsets[0],
        tokens[int(offsets[0]) : int(offsets[-1])],
    )


def read_lost_chunks(directory: AnyPath, entries: Sequence[ShardEntry]) -> LostChunks:
    """The repack records ``entries`` (a manifest's ``repack_files``) of the output at
    ``directory``, as one, sorted by (``doc_id``, ``chunk_id``)."""
    parts = [_read_one(directory / e.file, e) for e in entries]
    if not parts:
        return LostChunks.empty()
    if len(parts) == 1:
        return parts[0].sorted()
    lengths = np.concatenate([p.lengths for p in parts])
    joined = LostChunks(
        np.concatenate([p.doc_id for p in parts]),
        np.concatenate([p.chunk_id for p in parts]),
        np.concatenate([p.label for p in parts]),
        np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]),
        np.concatenate([p.tokens for p in parts]),
    )
    return joined.sorted()
