"""Export a pack in LitData's optimized format, read by ``litdata.StreamingDataset``.

One item per packed row, a dict of the pack's columns, each id column in its own dtype::

    input_ids, position_ids (, labels)   int32 arrays of max_len
    cu_seqlens, seq_lengths, chunk_ids   int32 arrays (per boundary / segment)
    doc_ids                              int64 array (corpus-wide document numbers)
    source_ids                           int32 array (a mixture's: each segment's source)
    num_tokens                           int

``DIR/chunk-*.bin`` and ``DIR/index.json`` are written by LitData's own ``BinaryWriter``
(its format, with its serializers and index, as the installed LitData reads it), so the
export needs ``litdata`` installed; so does its check, which reads the rows back with
``StreamingDataset``. ``seq_lengths`` is in every export (derived from ``cu_seqlens`` for a
pack written before the column), so a padding-free collator can read it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import OptionError
from ..format import PackedReader, Per, columns, seq_lengths, sha256_file
from .common import pack_fingerprint, write_export_manifest
from .registry import PlainExporter

CHUNK_BYTES = 64 << 20
"""LitData's chunk size: rows are grouped into chunk files of about this many bytes."""

_INSTALL = (
    "pip install litdata (it asks for torchvision; without it: pip install --no-deps litdata "
    "lightning-utilities, next to torch, numpy, filelock, boto3 and requests)"
)


def _litdata(what: str) -> Any:
    try:
        import litdata
    except ImportError as e:
        raise OptionError(f"{what} needs LitData, which is not installed: {_INSTALL}") from e
    return litdata


def export_columns(reader: PackedReader) -> list[str]:
    """The names of an item's fields: the pack's columns, ``seq_lengths`` always."""
    every = columns(reader.has_labels, aligned=reader.aligned, sources=reader.has_sources)
    return [c.name for c in every]


def _ragged(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    offsets = column.offsets.to_numpy().astype(np.int64)
    values = column.values.to_numpy(zero_copy_only=False)
    return offsets, values


def items(reader: PackedReader) -> Iterator[dict[str, Any]]:
    """Every row of the pack as an export item, in stored order."""
    every = columns(reader.has_labels, aligned=reader.aligned, sources=reader.has_sources)
    names = [c for c in every if c.name != "seq_lengths"]
    for table in reader.iter_tables([c.name for c in names]):
        for batch in table.to_batches():
            n = batch.num_rows
            fixed: dict[str, np.ndarray] = {}
            ragged: dict[str, tuple[np.ndarray, np.ndarray]] = {}
            for c in names:
                data = batch.column(c.name)
                if c.per is Per.TOKEN:
                    flat = data.flatten().to_numpy(zero_copy_only=False)
                    fixed[c.name] = flat.reshape(n, reader.max_len)
                elif c.per is Per.ROW:
                    fixed[c.name] = data.to_numpy(zero_copy_only=False)
                else:
                    ragged[c.name] = _ragged(data)
            cu_off, cu = ragged["cu_seqlens"]
            unpadded = ragged.get("cu_seqlens_unpadded")
            span, span_off = seq_lengths(
                cu[cu_off[0] : cu_off[-1]],
                cu_off - cu_off[0],
                fixed["num_tokens"],
                None if unpadded is None else unpadded[1][cu_off[0] : cu_off[-1]],
            )
            ragged["seq_lengths"] = (span_off, span)
            for r in range(n):
                item: dict[str, Any] = {}
                for c in every:
                    dtype = c.value.to_pandas_dtype()
                    if c.per is Per.TOKEN:
                        item[c.name] = np.ascontiguousarray(fixed[c.name][r], dtype=dtype)
                    elif c.per is Per.ROW:
                        item[c.name] = int(fixed[c.name][r])
                    else:
                        off, values = ragged[c.name]
                        item[c.name] = np.asarray(values[off[r] : off[r + 1]], dtype=dtype)
                yield item


def export_litdata(reader: PackedReader, staging: Path) -> dict[str, Any]:
    """Write the rows of the pack into ``staging`` with LitData's ``BinaryWriter``; return
    the record for ``export.json``."""
    _litdata("--to litdata")
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(str(staging), chunk_bytes=CHUNK_BYTES)
    rows = 0
    for i, item in enumerate(items(reader)):
        writer.add_item(i, item)
        rows += 1
    writer.done()
    writer.merge()
    files = {
        p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(staging.iterdir())
        if p.is_file()
    }
    return write_export_manifest(
        staging,
        {
            "to": "litdata",
            "source": pack_fingerprint(reader),
            "rows": rows,
            "columns": export_columns(reader),
            "litdata_version": _litdata("--to litdata").__version__,
            "files": files,
        },
    )


def litdata_problems(reader: PackedReader, dest: Path, record: dict[str, Any]) -> list[str]:
    """Differences between a LitData export and the pack: every item read back with
    ``litdata.StreamingDataset`` against the row, column by column."""
    try:
        litdata = _litdata("checking a --to litdata export")
    except OptionError as e:
        return [str(e)]
    dataset = litdata.StreamingDataset(str(dest))
    if len(dataset) != reader.num_rows:
        return [f"{dest}: {len(dataset)} items, the pack {reader.num_rows} rows"]
    problems: list[str] = []
    want_names = export_columns(reader)
    for r, want in enumerate(items(reader)):
        got = dataset[r]
        if sorted(got) != sorted(want_names):
            problems.append(f"item {r}: fields {sorted(got)}, expected {sorted(want_names)}")
        else:
            for name in want_names:
                a, b = got[name], want[name]
                same = (
                    isinstance(a, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
                    if isinstance(b, np.ndarray)
                    else a == b
                )
                if not same:
                    problems.append(f"item {r}: {name} differs from the pack's row {r}")
        if len(problems) >= 20:
            break
    return problems


EXPORTER = PlainExporter("litdata", export_litdata, litdata_problems, sources=True)
"""``--to litdata``: the packed rows as LitData's optimized format."""
