"""Read inputs into batches: texts, instruction records, or token-id columns.

Inputs are files (JSON Lines, JSON arrays, Parquet, Arrow, CSV, plain text; ``.gz``/``.zst``
compressed JSON, CSV and text too), directories or globs of such files, and datasets saved
with ``datasets.save_to_disk``.

Each format has one reader (:func:`read` chooses it by the input's kind): it yields
:class:`Records`, the fields asked for as Arrow columns (pyarrow's Parquet, Arrow, CSV and
JSON readers) or, where JSON is parsed in Python (instruction records, a piece pyarrow
refuses), as the values ``json.loads`` gives, each record nameable by its file and line or
row. A piece of an input (:class:`Piece`: a byte range of JSON Lines, row groups of Parquet)
is an argument of the same reader. Three adapters (:mod:`.adapt`) make the records what a
stage takes: :func:`read_texts` (text documents), :func:`read_records` (instruction
records) and :func:`column_batches` (token-id lists) are a reader and an adapter.

Every record gets a place in the stream: a bad record that is skipped is yielded as ``None``
so that document numbering (and so the ``doc_ids`` of the output) does not depend on it.
Plain text (:mod:`.txt`) has no fields: its reader gives the texts itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa

from ..errors import InputError, OptionError
from . import arrow, csv, hf_dataset, json_array, jsonl, parquet, txt
from .adapt import as_columns, as_records, as_texts
from .batches import (
    ColumnBatch,
    RecordBatch,
    RecordCheck,
    Records,
    TableSource,
    TextBatch,
    Want,
    check_column,
    check_record_columns,
    check_table_columns,
    skip_records,
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

__all__ = [
    "BATCH_DOCS",
    "SUPPORTED",
    "TXT_UNITS",
    "ColumnBatch",
    "InputFile",
    "Piece",
    "RecordBatch",
    "RecordCheck",
    "Records",
    "TextBatch",
    "Want",
    "column_batches",
    "describe_skipped",
    "first_record_fields",
    "first_row",
    "part_of",
    "read",
    "read_records",
    "read_texts",
    "resolve_inputs",
    "skip_records",
]

_TABLES = ("parquet", "arrow", "hf_dataset")


def _open_table(inp: InputFile, fields: Sequence[str], split: str | None, rows: int) -> TableSource:
    if inp.kind == "parquet":
        return parquet.open_table(inp, fields, rows)
    if inp.kind == "arrow":
        return arrow.open_table(str(inp.path), [str(inp.path)], fields, "Arrow data")
    if inp.kind == "hf_dataset":
        return hf_dataset.open_table(inp, fields, split, rows)
    raise ValueError(f"unknown input kind {inp.kind!r}")


def read(
    inp: InputFile,
    fields: Sequence[str],
    want: Want,
    *,
    split: str | None = None,
    batch_rows: int = BATCH_DOCS,
    check: Callable[[pa.Schema], None] | None = None,
) -> Iterator[Records]:
    """The records of ``inp`` as its format's one reader parses them, batch by batch:
    ``fields`` of each, parsed as ``want`` says (a piece, :class:`Piece`, read by the same
    reader). ``check(schema)`` sees the columns of a table or CSV input before anything is
    read (to name a missing column). Table inputs give ``batch_rows`` rows at a time, JSON
    Lines a piece of lines, CSV a block."""
    if inp.kind == "jsonl":
        yield from jsonl.read(inp, fields, want)
    elif inp.kind == "json":
        yield from json_array.read(inp, fields, want, batch_rows)
    elif inp.kind == "csv":
        if check is not None:
            check(pa.schema([(name, pa.string()) for name in csv.read_header(inp)]))
        yield from csv.read(inp, fields, want)
    else:
        source = _open_table(inp, fields, split, batch_rows)
        try:
            if check is not None:
                check(source.schema)
            yield from source.parts
        finally:
            source.close()


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
    if inp.kind == "txt":  # no fields: a line, a paragraph or the file is the document
        return guarded(inp, txt.read_texts(inp, txt_unit, skip_bad_records, batch_docs))
    if inp.kind == "megatron":
        raise InputError(f"{inp.path}: a Megatron indexed dataset holds token ids, not text")
    where = str(inp.path)
    parts = read(
        inp,
        [text_field],
        Want.TEXT,
        split=split,
        batch_rows=batch_docs * 8,
        check=lambda schema: check_column(schema, text_field, where),
    )
    return guarded(inp, as_texts(parts, text_field, skip_bad_records, batch_docs))


def first_row(inp: InputFile) -> int:
    """The number in its file of the first row of ``inp``: 0 for a whole input; for a piece,
    the rows of the row groups (or the sequences) before it. (A piece of JSON Lines numbers
    its lines itself.)"""
    if part_of(inp, "sequences") is not None:
        return inp.start  # type: ignore[attr-defined, no-any-return]
    return parquet.rows_before(inp)


def column_batches(
    inp: InputFile, columns: Sequence[str], *, split: str | None = None, batch_rows: int = 2048
) -> Iterator[ColumnBatch]:
    """The list columns ``columns`` (token ids) of the records of ``inp``, batch by batch:
    Parquet, Arrow and saved datasets as stored; JSON Lines, JSON arrays and CSV
    (compressed too) parsed by pyarrow, the CSV cells' lists by NumPy. A record that cannot
    be such lists is null, named in the batch's ``problems``."""
    if inp.kind not in ("jsonl", "json", "csv", *_TABLES):
        raise InputError(f"{inp.path}: a .{inp.kind} input holds text, not token ids")
    where = str(inp.path)
    parts = read(
        inp,
        columns,
        Want.IDS,
        split=split,
        batch_rows=batch_rows,
        check=lambda schema: check_table_columns(schema.names, columns, where),
    )
    yield from guarded(inp, as_columns(parts, columns))


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
    if inp.kind == "txt":
        raise InputError(
            f"{inp.path}: a .txt input holds plain text, not prompt/completion or chat "
            "records: use JSON Lines, JSON, Parquet, Arrow or CSV, or --input-shape text"
        )
    if inp.kind not in ("jsonl", "json", "csv", *_TABLES):
        raise ValueError(f"unknown input kind {inp.kind!r}")
    where = str(inp.path)
    parts = read(
        inp,
        fields,
        Want.RECORDS,
        split=split,
        batch_rows=batch_docs,
        check=lambda schema: check_record_columns(schema.names, fields, where),
    )
    return guarded(inp, as_records(parts, check, skip_bad_records, batch_docs))


def first_record_fields(inp: InputFile, *, split: str | None = None) -> list[str] | None:
    """The field names of the first readable record of ``inp`` (columns of a table input).

    Used to detect the input shape (``--input-shape auto``). ``None`` when there is nothing to
    look at (a ``.txt`` or Megatron input, an empty file, or no readable record in the first
    100 lines), or when the input cannot be read (reading it for real then names the problem).
    """
    if inp.kind not in ("jsonl", "json", "csv", *_TABLES):
        return None  # plain text, token ids
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
        source = _open_table(inp, (), split, 1)
    except InputError:
        return None  # reading it for real names the problem
    source.close()
    return list(source.schema.names)
