"""Parquet inputs, whole or by row-group ranges: texts, records and columns as stored."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from ..errors import InputError
from ..fs import arrow_source
from .batches import (
    TableSource,
    TextBatch,
    check_column,
    check_table_columns,
    table_texts,
)
from .files import (
    InputFile,
    part_of,
)


def _parquet_part(inp: InputFile, pf: Any) -> tuple[list[int] | None, int, int]:
    """What to read of the Parquet file ``pf`` for ``inp``: its row groups (``None``: all),
    the number of its first row in the file, and its number of rows."""
    meta = pf.metadata
    span = part_of(inp, "row_groups")
    if span is None:
        return None, 0, meta.num_rows
    groups = list(range(*span))
    first = sum(meta.row_group(g).num_rows for g in range(span[0]))
    return groups, first, sum(meta.row_group(g).num_rows for g in groups)


def read_texts(
    inp: InputFile, text_field: str, skip_bad: bool, batch_docs: int
) -> Iterator[TextBatch]:
    import pyarrow.parquet as pq

    try:
        # pre_buffer off: its read cache keeps the column chunks already read alive, so
        # memory grew with the file (260 -> 413 MB for a 4x larger one; 219 -> 254 MB off).
        pf = pq.ParquetFile(arrow_source(inp.path), pre_buffer=False)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{inp.path}: not a readable Parquet file: {e}") from e
    check_column(pf.schema_arrow, text_field, str(inp.path))
    groups, row0, rows = _parquet_part(inp, pf)
    rows_total = max(1, rows)
    done = [0]

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            for b in pf.iter_batches(
                batch_size=batch_docs * 8, row_groups=groups, columns=[text_field]
            ):
                done[0] += b.num_rows
                yield b
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError(f"{inp.path}: cannot read Parquet data: {e}") from e

    yield from table_texts(
        batches(),
        text_field,
        str(inp.path),
        skip_bad,
        batch_docs,
        lambda: inp.size_bytes * done[0] // rows_total,
        row0,
    )


def rows_before(inp: InputFile) -> int:
    """The rows of the row groups of the file before the piece ``inp`` (0: a whole input)."""
    span = part_of(inp, "row_groups")
    if span is None or span[0] == 0:
        return 0
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(arrow_source(inp.path))
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{inp.path}: not a readable Parquet file: {e}") from e
    return sum(meta.row_group(g).num_rows for g in range(span[0]))


def read_table(
    inp: InputFile, columns: Sequence[str], batch_rows: int
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """The record batches of ``columns`` as stored, each with how far into the file it ends."""
    import pyarrow.parquet as pq

    where = str(inp.path)
    try:
        # pre_buffer off: its read cache kept the column chunks already read alive, and
        # Arrow's memory grew with the file (248 MB reading a 400 MB file; 58 MB off).
        pf = pq.ParquetFile(arrow_source(where), pre_buffer=False)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{where}: not a readable Parquet file: {e}") from e
    check_table_columns(pf.schema_arrow.names, columns, where)
    groups, _, rows = _parquet_part(inp, pf)
    total, done = max(1, rows), 0
    try:
        for b in pf.iter_batches(batch_size=batch_rows, row_groups=groups, columns=list(columns)):
            done += b.num_rows
            yield b, inp.size_bytes * done // total
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{where}: cannot read Parquet data: {e}") from e


def table_source(inp: InputFile, fields: Sequence[str], batch_docs: int) -> TableSource:
    """The rows of ``fields`` (records). Nothing is read until the batches are iterated."""
    import pyarrow.parquet as pq

    where = str(inp.path)
    try:
        pf = pq.ParquetFile(arrow_source(where), pre_buffer=False)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{where}: not a readable Parquet file: {e}") from e
    groups, _, rows = _parquet_part(inp, pf)
    total, done = max(1, rows), [0]

    def parquet_batches() -> Iterator[pa.RecordBatch]:
        try:
            for b in pf.iter_batches(
                batch_size=batch_docs, row_groups=groups, columns=list(fields)
            ):
                done[0] += b.num_rows
                yield b
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError(f"{where}: cannot read Parquet data: {e}") from e

    return TableSource(
        list(pf.schema_arrow.names),
        parquet_batches(),
        lambda: inp.size_bytes * done[0] // total,
        lambda: None,
    )
