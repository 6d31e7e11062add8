"""Export a pack as the packed-SFT files NeMo and Megatron-Bridge train on.

``DIR/training_{L}.idx.parquet`` (and, with ``npy=True``, the older ``DIR/training_{L}.npy``)
holds one entry per packed row, ``L`` being the pack's ``max_len`` (their
``packed_sequence_size``), and ``DIR/{L}_metadata.jsonl`` the packing metadata beside it.
Every entry is a row without its padding (their collate pads)::

    row          a0 a1 a2 b0 b1 P  P  P         max_len 8, num_tokens 5, cu_seqlens [0, 3, 5, 8]
    labels       -  a1 a2 -  b1 -  -  -         packtool's: the token learned at each position
    input_ids    a0 a1 a2 b0 b1                 the row's num_tokens tokens
    seq_start_id [0, 3]                         the document starts (cu_seqlens without padding)
    loss_mask    1  1  0  1  0                  loss_mask[t] = labels[t + 1] is learned

Their packed dataset reads each sequence ``[s, e)`` of ``seq_start_id + [len(input_ids)]`` as
inputs ``input_ids[s:e-1]``, targets ``input_ids[s+1:e]`` and mask ``loss_mask[s:e-1]``: the
mask is aligned with the inputs, one position before the token it trains (their writer rolls
each example's mask by one). So ``loss_mask[t]`` is 1 exactly when packtool's ``labels[t+1]``
is learned: the same targets as :func:`packtool.torch.collate`, document starts never learned
from the previous document. Without a ``labels`` column (text), every token but a document's
first is learned.

The metadata file is a JSON list with one object, in their units (a sequence of ``n`` tokens
counts ``n - 1``, the length after the shift): ``pack_size``, ``dataset_max_seqlen``,
``max_samples_per_bin``, ``min_packed_seqlen``, ``packing_factor`` (sequences per pack) and
``packing_efficiency`` (percent).

An aligned pack (``--pad-to-multiple-of N``) is written as their own packing writes sequences
for ``pad_seq_to_mult`` = N (``packed_sequence.py``'s ``pre_pad_dataset``): each sequence
padded with EOS to ``ceil(n / N) * N + 1`` tokens, so that its inputs after the shift are the
row's padded span, a multiple of N; their collate finds the real length by the trailing EOS
(``cu_seqlens_unpadded``) and the padded one by ``seq_start_id`` (``cu_seqlens``)::

    row          a0 a1 a2 E  P  P  b0 E  P        max_len 9, N 3, cu_seqlens [0, 6, 9]
    input_ids    a0 a1 a2 E  E  E  E  b0 E  E  E     a: 4 real + 3 EOS; b: 2 real + 2 EOS
    seq_start_id [0, 7]
    loss_mask    1  1  1  0  0  0  0  1  0  0  0     (a text pack: every next token)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import FormatError
from ..format import IGNORE_INDEX, PackedReader, Per, column_names, sha256_file
from .common import (
    HashingWriter,
    SegmentIndex,
    pack_fingerprint,
    segment_index,
    write_export_manifest,
)

__all__ = ["bridge_loss_mask", "bridge_metadata", "bridge_names", "export_bridge"]

ROW_GROUP_ROWS = 500

BRIDGE_SCHEMA = pa.schema(
    [
        pa.field("input_ids", pa.list_(pa.int32())),
        pa.field("loss_mask", pa.list_(pa.int8())),
        pa.field("seq_start_id", pa.list_(pa.int32())),
    ]
)
SOURCES_FIELD = pa.field("source_ids", pa.list_(pa.int32()))
"""A mixture's export (``pack --mix``): each sequence's source, one per ``seq_start_id``."""


def bridge_schema(sources: bool) -> pa.Schema:
    """The entries' columns: :data:`BRIDGE_SCHEMA`, and ``source_ids`` for a mixture (their
    readers read the three columns by name, so a fourth is left alone)."""
    return BRIDGE_SCHEMA.append(SOURCES_FIELD) if sources else BRIDGE_SCHEMA


def bridge_names(max_len: int) -> dict[str, str]:
    """The file names Megatron-Bridge's GPT SFT dataset builder looks for."""
    return {
        "parquet": f"training_{max_len}.idx.parquet",
        "npy": f"training_{max_len}.npy",
        "metadata": f"{max_len}_metadata.jsonl",
    }


def bridge_loss_mask(learned: np.ndarray) -> np.ndarray:
    """``[rows, L]`` int8: ``mask[:, t] = learned[:, t + 1]``, 0 in the last column.

    ``learned`` marks the tokens that are trained (labels not -100, never a segment's first).
    """
    mask = np.zeros(learned.shape, dtype=np.int8)
    mask[:, :-1] = learned[:, 1:]
    return mask


def _fixed(batch: pa.RecordBatch, name: str, max_len: int) -> np.ndarray:
    return batch.column(name).flatten().to_numpy().reshape(-1, max_len)


def _learned(batch: pa.RecordBatch, max_len: int, has_labels: bool) -> np.ndarray:
    if has_labels:
        return _fixed(batch, "labels", max_len) != IGNORE_INDEX
    positions = _fixed(batch, "position_ids", max_len)
    real = np.arange(max_len) < batch.column("num_tokens").to_numpy()[:, None]
    return real & (positions != 0)


def _alignment_pad(reader: PackedReader) -> int:
    """The id an aligned pack's sequences are padded with in the export: EOS, which their
    collate strips to find the real lengths (and masks out of the loss)."""
    eos = reader.manifest.tokenizer.special.eos_id
    if eos is None:
        raise FormatError(
            f"{reader.path}: exporting an aligned pack to megatron-bridge pads its sequences "
            "with EOS (their collate finds the real lengths by it), but the pack records no "
            "EOS id"
        )
    return int(eos)


def _list_array(values: np.ndarray, offsets: np.ndarray, kind: pa.DataType) -> pa.Array:
    return pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32), pa.int32()), pa.array(values, kind)
    )


def _aligned_entries(
    batch: pa.RecordBatch, reader: PackedReader, index: SegmentIndex, seg: slice, eos: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ids, loss mask, token offsets per row, seq_start_id) of an aligned pack's rows:
    each sequence its real tokens, then EOS up to its span plus one."""
    L = reader.max_len
    rows = batch.num_rows
    ids = _fixed(batch, "input_ids", L).reshape(-1)
    if reader.has_labels:
        learned = (_fixed(batch, "labels", L) != IGNORE_INDEX).reshape(-1)
    else:  # read at a document's real tokens only (below), where position 0 is its start
        learned = (_fixed(batch, "position_ids", L) != 0).reshape(-1)
    n, span = index.length[seg], index.span[seg]
    local_row = index.row[seg] - (index.row[seg.start] if n.size else 0)
    stored = span + 1  # their inputs are the stored tokens but the last: the span
    piece = np.cumsum(stored) - stored
    out_ids = np.full(int(stored.sum()), eos, np.int32)
    out_mask = np.zeros(out_ids.size, np.int8)
    intra = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    src = np.repeat(local_row * L + index.start[seg], n) + intra
    dst = np.repeat(piece, n) + intra
    out_ids[dst] = ids[src]
    inside = intra < np.repeat(n - 1, n)  # mask[t] = learned[t + 1] within the document
    out_mask[dst[inside]] = learned[src[inside] + 1]
    per_row = np.bincount(local_row, weights=stored, minlength=rows).astype(np.int64)
    token_offsets = np.concatenate([[0], np.cumsum(per_row)])
    starts = piece - token_offsets[local_row]
    return out_ids, out_mask, token_offsets, starts


def bridge_tables(reader: PackedReader, index: SegmentIndex) -> Iterator[pa.Table]:
    """The export's rows in stored order, :data:`ROW_GROUP_ROWS` at a time, as Arrow tables
    of :func:`bridge_schema` (read from the memory-mapped shards a batch at a time)."""
    first_seg = np.concatenate([[0], np.cumsum(index.per_row)])
    row0 = 0
    aligned = reader.aligned
    eos = _alignment_pad(reader) if aligned else 0
    columns = column_names(reader.has_labels, Per.TOKEN, Per.ROW)  # not the segments'
    sources = reader.has_sources
    schema = bridge_schema(sources)
    for table in reader.iter_tables([*columns, *(["source_ids"] if sources else [])]):
        for batch in table.to_batches(max_chunksize=ROW_GROUP_ROWS):
            rows = batch.num_rows
            seg = slice(int(first_seg[row0]), int(first_seg[row0 + rows]))
            seg_offsets = first_seg[row0 : row0 + rows + 1] - first_seg[row0]
            # a mixture's: each row's source ids, one per document segment (per seq_start_id)
            extra = [batch.column("source_ids").cast(SOURCES_FIELD.type)] if sources else []
            if aligned:
                ids, mask, token_offsets, starts = _aligned_entries(batch, reader, index, seg, eos)
                yield pa.Table.from_arrays(
                    [
                        _list_array(ids, token_offsets, pa.int32()),
                        _list_array(mask, token_offsets, pa.int8()),
                        _list_array(starts.astype(np.int32), seg_offsets, pa.int32()),
                        *extra,
                    ],
                    schema=schema,
                )
                row0 += rows
                continue
            n = batch.column("num_tokens").to_numpy().astype(np.int64)
            real = np.arange(reader.max_len) < n[:, None]
            token_offsets = np.concatenate([[0], np.cumsum(n)])
            ids = _fixed(batch, "input_ids", reader.max_len)[real]
            mask = bridge_loss_mask(_learned(batch, reader.max_len, reader.has_labels))[real]
            yield pa.Table.from_arrays(
                [
                    _list_array(ids, token_offsets, pa.int32()),
                    _list_array(mask, token_offsets, pa.int8()),
                    _list_array(index.start[seg].astype(np.int32), seg_offsets, pa.int32()),
                    *extra,
                ],
                schema=schema,
            )
            row0 += rows


def bridge_metadata(reader: PackedReader, index: SegmentIndex) -> dict[str, Any]:
    """The packing metadata of the export, in Megatron-Bridge's units (``n - 1`` per
    sequence of ``n`` tokens)."""
    theirs = index.span if reader.aligned else index.length - 1  # after the shift
    packed = np.zeros(reader.num_rows, dtype=np.int64)
    np.add.at(packed, index.row, theirs)
    rows = max(reader.num_rows, 1)
    return {
        "dataset_max_seqlen": int(theirs.max()) if len(index) else 0,
        "max_samples_per_bin": int(index.per_row.max()) if reader.num_rows else 0,
        "packing_factor": round(len(index) / rows, 2),
        "packing_efficiency": round(float(packed.sum()) / rows / reader.max_len * 100, 2),
        "pack_size": reader.max_len,
        "min_packed_seqlen": int(packed.min()) if reader.num_rows else 0,
    }


_NPY_KEYS = tuple(bridge_schema(sources=True).names)  # the last: a mixture's; made once, so
# every entry has the same key objects, and the pickle memoizes them as it always did


def _write_npy(path: Path, tables: list[pa.Table]) -> None:
    """The older format: a NumPy object array of dicts (a pickle), loaded whole by its
    readers (numpy.load with pickles allowed), so it is built whole here too."""
    entries = [  # the keys in the columns' order; the same objects in every entry
        {key: r[key] for key in _NPY_KEYS if key in r}
        for table in tables
        for r in table.to_pylist()
    ]
    array = np.empty(len(entries), dtype=object)
    array[:] = entries
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=True)


def _file_record(path: Path) -> dict[str, Any]:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def export_bridge(reader: PackedReader, staging: Path, *, npy: bool = False) -> dict[str, Any]:
    """Write the packed-SFT files of the pack into ``staging``; return the record for
    ``export.json``."""
    names = bridge_names(reader.max_len)
    index = segment_index(reader)
    files: dict[str, Any] = {}
    kept: list[pa.Table] = []
    learned = 0
    path = staging / names["parquet"]
    with pq.ParquetWriter(path, bridge_schema(reader.has_sources), compression="zstd") as writer:
        for table in bridge_tables(reader, index):
            writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
            learned += int(
                pc.sum(table.column("loss_mask").combine_chunks().flatten()).as_py() or 0
            )
            if npy:
                kept.append(table)
    files[names["parquet"]] = _file_record(path)
    if npy:
        _write_npy(staging / names["npy"], kept)
        files[names["npy"]] = _file_record(staging / names["npy"])
    metadata = bridge_metadata(reader, index)
    with HashingWriter(staging / names["metadata"]) as out:
        out.write(json.dumps([metadata], indent=2).encode() + b"\n")
        files[names["metadata"]] = out.close()
    return write_export_manifest(
        staging,
        {
            "to": "megatron-bridge",
            "source": pack_fingerprint(reader),
            "rows": reader.num_rows,
            "sequences": len(index),
            "tokens": int(index.length.sum()),
            "learned_tokens": learned,
            "packed_sequence_size": reader.max_len,
            **({"pad_seq_to_mult": reader.manifest.pad_to_multiple_of} if reader.aligned else {}),
            "metadata": metadata,
            "files": files,
        },
    )


def bridge_problems(reader: PackedReader, dest: Path, record: dict[str, Any]) -> list[str]:
    """Differences between a Megatron-Bridge export and the pack, row by row from the rows'
    segments (a path of its own, not the writer's). The ``.npy``, a pickle, is checked by its
    sha256 only: packtool never unpickles."""
    names = bridge_names(reader.max_len)
    problems: list[str] = []
    parquet = pq.ParquetFile(dest / names["parquet"])

    def kinds(schema: pa.Schema) -> dict[str, str]:
        return {f.name: str(getattr(f.type, "value_type", f.type)) for f in schema}

    found, expected = kinds(parquet.schema_arrow), kinds(bridge_schema(reader.has_sources))
    if found != expected:
        return [f"{names['parquet']}: columns {found}, expected {expected}"]
    if parquet.metadata.num_rows != reader.num_rows:
        return [f"{names['parquet']}: {parquet.metadata.num_rows} rows, the pack {reader.num_rows}"]
    r = 0
    lengths, per_row, packed = [], [], []
    for batch in parquet.iter_batches(batch_size=ROW_GROUP_ROWS):
        for entry in batch.to_pylist():
            row = reader.row(r)
            n = row.num_tokens
            docs = [s for s in row.segments if not s.is_padding]
            labels = np.array(row.labels if row.labels is not None else row.input_ids, np.int64)
            if not reader.aligned:
                labels[n:] = IGNORE_INDEX
            labels[[s.start for s in row.segments]] = IGNORE_INDEX
            if reader.aligned:
                pad = _alignment_pad(reader)
                want_ids, want_mask, want_starts = [], [], []
                for s in docs:
                    want_starts.append(len(want_ids))
                    want_ids += row.input_ids[s.start : s.end].tolist() + [pad] * (s.pad + 1)
                    learned = labels[s.start + 1 : s.end] != IGNORE_INDEX
                    want_mask += learned.astype(int).tolist() + [0] * (s.pad + 2)
                theirs = [s.length + s.pad for s in docs]
            else:
                want_ids = row.input_ids[:n].tolist()
                want_starts = [s.start for s in docs]
                want_mask = [int(x != IGNORE_INDEX) for x in labels[1:n]] + [0]
                theirs = [s.length - 1 for s in docs]
            wanted = [("input_ids", want_ids), ("seq_start_id", want_starts)]
            wanted.append(("loss_mask", want_mask))
            if row.source_ids is not None:  # a mixture's: each sequence's source
                wanted.append(("source_ids", row.source_ids.tolist()))
            for key, want in wanted:
                if entry[key] != want:
                    problems.append(f"{names['parquet']} row {r}: {key} differs from the pack")
            lengths += theirs
            per_row.append(len(docs))
            packed.append(sum(theirs))
            r += 1
            if len(problems) >= 20:
                return problems
    on_disk = json.loads((dest / names["metadata"]).read_text(encoding="utf-8"))
    rows = max(reader.num_rows, 1)
    want = {
        "dataset_max_seqlen": max(lengths, default=0),
        "max_samples_per_bin": max(per_row, default=0),
        "packing_factor": round(sum(per_row) / rows, 2),
        "packing_efficiency": round(sum(packed) / rows / reader.max_len * 100, 2),
        "pack_size": reader.max_len,
        "min_packed_seqlen": min(packed, default=0),
    }
    if on_disk != [want]:
        problems.append(f"{names['metadata']}: {on_disk}, expected {[want]}")
    return problems


class BridgeExporter:
    """``--to megatron-bridge``: the packed rows as NeMo / Megatron-Bridge packed-SFT files
    (``npy``: the older ``.npy`` too)."""

    name = "megatron-bridge"
    options = frozenset({"npy"})
    sources = True  # a mixture's entries carry source_ids

    def write(self, reader: PackedReader, staging: Path, **options: Any) -> dict[str, Any]:
        return export_bridge(reader, staging, npy=bool(options.get("npy")))

    def problems(self, reader: PackedReader, dest: Path, record: dict[str, Any]) -> list[str]:
        return bridge_problems(reader, dest, record)


EXPORTER = BridgeExporter()
