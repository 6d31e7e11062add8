"""Read inputs into batches: texts, instruction records, or token-id columns.

Inputs are files (JSON Lines, JSON arrays, Parquet, Arrow, CSV, plain text; ``.gz``/``.zst``
compressed JSON, CSV and text too), directories or globs of such files, and datasets saved
with ``datasets.save_to_disk``. The fast paths are pyarrow's streaming readers; when one of
them fails, or when bad records are to be skipped, a line-by-line reader finds the exact
line and what is wrong with it.

Every record gets a place in the stream: a bad record that is skipped is yielded as ``None``
so that document numbering (and so the ``doc_ids`` of the output) does not depend on it.

One module per format holds that format's readers (:mod:`.jsonl`, :mod:`.json_array`,
:mod:`.parquet`, :mod:`.arrow`, :mod:`.csv`, :mod:`.txt`, :mod:`.hf_dataset`); what they
share is in :mod:`.files` (inputs, pieces, opening) and :mod:`.batches` (the batch types and
record checks). The functions here choose the reader by the input's kind. A piece of an
input (:class:`Piece`: a byte range of JSON Lines, row groups of Parquet) is read by the same
reader as the whole input.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa

from ..errors import InputError, OptionError
from . import arrow, csv, hf_dataset, json_array, jsonl, parquet, txt
from .batches import (
    ColumnBatch,
    RecordBatch,
    RecordCheck,
    RecordCollector,
    TableSource,
    TextBatch,
    check_record_columns,
    skip_records,
    table_records,
)
from .files import (
    BATCH_DOCS,
    SUPPORTED,
    TXT_UNITS,
    InputFile,
    Piece,
    describe_skipped,
    guarded,
    part_of,
    resolve_inputs,
)
from .jsonl import records_before

__all__ = [
    "BATCH_DOCS",
    "SUPPORTED",
    "TXT_UNITS",
    "ColumnBatch",
    "InputFile",
    "Piece",
    "RecordBatch",
    "RecordCheck",
    "TextBatch",
    "column_batches",
    "describe_skipped",
    "first_record_fields",
    "first_row",
    "part_of",
    "read_records",
    "read_texts",
    "records_before",
    "resolve_inputs",
    "skip_records",
    "table_batches",
]


def read_texts(
    inp: InputFile,
    *,
    text_field: str = "text",
    skip_bad_records: bool = False,
    split: str | None = None,
    txt_unit: str = "line",
    batch_docs: int = BATCH_DOCS,
) -> Iterator[TextBatch]:
    """Yield the texts of ``inp`` in order, in batches of about ``batch_docs`` records.

    Raises :class:`~packtool.errors.BadRecordError` naming the file and line (or row) of the
    first bad record, unless ``skip_bad_records``, in which case bad records come as ``None``
    with the error in ``TextBatch.bad``.
    """
    if txt_unit not in TXT_UNITS:
        raise OptionError(f"--txt-unit must be line, paragraph or document, got {txt_unit!r}")
    if inp.kind == "jsonl":
        batches = jsonl.read_texts(inp, text_field, skip_bad_records, batch_docs)
    elif inp.kind == "json":
        batches = json_array.read_texts(inp, text_field, skip_bad_records, batch_docs)
    elif inp.kind == "parquet":
        batches = parquet.read_texts(inp, text_field, skip_bad_records, batch_docs)
    elif inp.kind == "arrow":
        batches = arrow.read_texts(inp, text_field, skip_bad_records, batch_docs)
    elif inp.kind == "csv":
        batches = csv.read_texts(inp, text_field, skip_bad_records, batch_docs)
    elif inp.kind == "txt":
        batches = txt.read_texts(inp, txt_unit, skip_bad_records, batch_docs)
    elif inp.kind == "hf_dataset":
        batches = hf_dataset.read_texts(inp, text_field, split, skip_bad_records, batch_docs)
    elif inp.kind == "megatron":
        raise InputError(f"{inp.path}: a Megatron indexed dataset holds token ids, not text")
    else:
        raise ValueError(f"unknown input kind {inp.kind!r}")
    return guarded(inp, batches)


def first_row(inp: InputFile) -> int:
    """The number in its file of the first row of ``inp``: 0 for a whole input; for a piece,
    the rows of the row groups (or the sequences) before it. (A piece of JSON Lines numbers
    its lines itself.)"""
    if part_of(inp, "sequences") is not None:
        return inp.start  # type: ignore[attr-defined, no-any-return]
    return parquet.rows_before(inp)


def table_batches(
    inp: InputFile, columns: Sequence[str], *, split: str | None = None, batch_rows: int = 2048
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """The Arrow record batches of ``columns`` of a Parquet, Arrow or saved `datasets`
    input, each with how far into the input (bytes) it ends. Columns are not
    converted to Python: a list column stays one flat buffer (for pre-tokenized data)."""
    if inp.kind == "parquet":
        yield from parquet.read_table(inp, columns, batch_rows)
    elif inp.kind == "arrow":
        yield from arrow.read_table(str(inp.path), [str(inp.path)], columns)
    elif inp.kind == "hf_dataset":
        yield from hf_dataset.read_table(inp, columns, split)
    else:
        raise ValueError(f"not a table input: {inp.kind!r}")


def column_batches(
    inp: InputFile, columns: Sequence[str], *, split: str | None = None, batch_rows: int = 2048
) -> Iterator[ColumnBatch]:
    """The list columns ``columns`` (token ids) of the records of ``inp``, batch by batch:
    Parquet, Arrow and saved datasets as stored; JSON Lines, JSON arrays and CSV
    (compressed too) parsed by pyarrow, the CSV cells' lists by NumPy. A record that cannot
    be such lists is null, named in the batch's ``problems``."""
    if inp.kind in ("parquet", "arrow", "hf_dataset"):
        for batch, done in table_batches(inp, columns, split=split, batch_rows=batch_rows):
            yield ColumnBatch(batch, done)
        return
    if inp.kind == "jsonl":
        batches = jsonl.read_columns(inp, columns)
    elif inp.kind == "json":
        batches = json_array.read_columns(inp, columns, batch_rows)
    elif inp.kind == "csv":
        batches = csv.read_columns(inp, columns)
    else:
        raise InputError(f"{inp.path}: a .{inp.kind} input holds text, not token ids")
    yield from guarded(inp, batches)


def _table_source(
    inp: InputFile, fields: Sequence[str], split: str | None, batch_docs: int
) -> TableSource:
    """The rows of ``fields`` of a Parquet, Arrow or saved-`datasets` input."""
    if inp.kind == "parquet":
        return parquet.table_source(inp, fields, batch_docs)
    if inp.kind == "arrow":
        return arrow.table_source(inp)
    return hf_dataset.table_source(inp, fields, split, batch_docs)


def _table_records(
    inp: InputFile,
    fields: Sequence[str],
    split: str | None,
    collect: RecordCollector,
    batch_docs: int,
) -> Iterator[RecordBatch]:
    names, batches, progress, close = _table_source(inp, fields, split, batch_docs)
    try:
        check_record_columns(names, fields, str(inp.path))
        yield from table_records(
            batches, fields, str(inp.path), collect, batch_docs, progress, first_row(inp)
        )
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{inp.path}: cannot read: {e}") from e
    finally:
        close()


def read_records(
    inp: InputFile,
    *,
    fields: Sequence[str],
    check: RecordCheck,
    skip_bad_records: bool = False,
    split: str | None = None,
    batch_docs: int = BATCH_DOCS,
) -> Iterator[RecordBatch]:
    """Yield the records of ``inp`` in order, each made by ``check`` from its ``fields``.

    For instruction data: a record is a JSON object (JSON Lines or a JSON array) or a row of a
    Parquet, Arrow, CSV or saved-`datasets` input, seen by ``check`` as a dict holding (at least)
    ``fields``. A record that is not an object, or that ``check`` rejects, stops the reading
    with a :class:`~packtool.errors.BadRecordError` naming it, unless ``skip_bad_records``: then
    it comes as ``None`` with its error in ``RecordBatch.bad``.

    >>> for batch in read_records(inp, fields=["prompt", "completion"], check=lambda r, loc: r):
    ...     batch.records[0], batch.locations[0]
    ({'prompt': 'Add 2 and 3.', 'completion': ' 5'}, 'data.jsonl:1')
    """
    collect = RecordCollector(check, skip_bad_records)
    if inp.kind == "jsonl":
        return guarded(inp, jsonl.read_records(inp, collect, batch_docs))
    if inp.kind == "json":
        return guarded(inp, json_array.read_records(inp, collect, batch_docs))
    if inp.kind == "csv":
        return guarded(inp, csv.read_records(inp, fields, collect, batch_docs))
    if inp.kind in ("parquet", "arrow", "hf_dataset"):
        return guarded(inp, _table_records(inp, fields, split, collect, batch_docs))
    if inp.kind == "txt":
        raise InputError(
            f"{inp.path}: a .txt input holds plain text, not prompt/completion or chat "
            "records: use JSON Lines, JSON, Parquet, Arrow or CSV, or --input-shape text"
        )
    raise ValueError(f"unknown input kind {inp.kind!r}")


def first_record_fields(inp: InputFile, *, split: str | None = None) -> list[str] | None:
    """The field names of the first readable record of ``inp`` (columns of a table input).

    Used to detect the input shape (``--input-shape auto``). ``None`` when there is nothing to
    look at (a ``.txt`` input, an empty file, or no readable record in the first 100 lines),
    or when the input cannot be read (reading it for real then names the problem).
    """
    if inp.kind == "txt":
        return None
    if inp.kind in ("jsonl", "json"):
        try:
            return jsonl.first_fields(inp)
        except Exception:  # a corrupt or truncated file (zlib, zstd...): reading names it
            return None
    if inp.kind == "csv":
        try:
            return csv.read_header(inp) or None
        except InputError:
            return None  # reading it for real names the problem
    try:
        names, _batches, _progress, close = _table_source(inp, (), split, 1)
    except InputError:
        return None  # reading it for real names the problem
    close()
    return names
