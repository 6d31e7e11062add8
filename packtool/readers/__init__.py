"""Read inputs into batches: texts, instruction records, or token-id columns.

Inputs are files (JSON Lines, JSON arrays, Parquet, Arrow, CSV, plain text; ``.gz``/``.zst``
compressed JSON, CSV and text too), directories or globs of such files, and datasets saved
with ``datasets.save_to_disk``.

Each format has one reader (:class:`Reader`), and one table (:mod:`.registry`) maps each
input kind to it; :func:`read` and every function below go through it. A reader yields
:class:`Records`, the fields asked for as Arrow columns (pyarrow's Parquet, Arrow, CSV and
JSON readers) or, where JSON is parsed in Python (instruction records, a piece pyarrow
refuses), as the values ``json.loads`` gives, each record nameable by its file and line or
row. A piece of an input (:class:`Piece`: a byte range of JSON Lines, row groups of Parquet)
is an argument of the same reader. Three adapters (:mod:`.adapt`) make the records what a
stage takes: :func:`read_texts` (text documents), :func:`read_records` (instruction
records) and :func:`column_batches` (token-id lists) are a reader and an adapter.

Every record gets a place in the stream: a bad record that is skipped is yielded as ``None``
so that document numbering (and so the ``doc_ids`` of the output) does not depend on it.
Plain text (:mod:`.txt`) has no fields: its reader gives the texts itself. A Megatron-LM
indexed dataset (:mod:`.megatron`) gives token ids only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa

from ..errors import OptionError
from .adapt import as_columns, as_records
from .base import Cuts, FieldReader, Reader, Request, TableReader, TextRequest
from .batches import (
    ColumnBatch,
    RecordBatch,
    RecordCheck,
    Records,
    TextBatch,
    Want,
    check_record_columns,
    check_table_columns,
    skip_records,
)
from .files import BATCH_DOCS, TXT_UNITS, InputFile, Piece, guarded, part_of
from .inputs import describe_skipped, refuse_inputs_in, resolve_inputs, supported
from .registry import FORMATS, reader_for, reader_of, register

__all__ = [
    "BATCH_DOCS",
    "FORMATS",
    "TXT_UNITS",
    "ColumnBatch",
    "Cuts",
    "FieldReader",
    "InputFile",
    "Piece",
    "Reader",
    "RecordBatch",
    "RecordCheck",
    "Records",
    "Request",
    "TableReader",
    "TextBatch",
    "TextRequest",
    "Want",
    "column_batches",
    "cuts",
    "describe_skipped",
    "first_record_fields",
    "first_row",
    "ids_field",
    "part_of",
    "read",
    "read_records",
    "read_texts",
    "reader_for",
    "reader_of",
    "refuse_inputs_in",
    "register",
    "resolve_inputs",
    "skip_records",
    "supported",
]


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
    yield from _read(inp, Request(fields, want, split, batch_rows, check))


def _read(inp: InputFile, request: Request) -> Iterator[Records]:
    """The records ``request`` asks of ``inp`` from its reader; a want its format does not
    give is refused at once, not at the first batch."""
    reader = reader_of(inp)
    if request.want not in reader.gives:
        raise reader.refusal(inp, request.want)
    return reader.read(inp, request)


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
    reader = reader_of(inp)
    if Want.TEXT not in reader.gives:
        raise reader.refusal(inp, Want.TEXT)
    request = TextRequest(text_field, skip_bad_records, split, txt_unit, batch_docs)
    return guarded(inp, reader.texts(inp, request))


def first_row(inp: InputFile) -> int:
    """The number in its file of the first row of ``inp``: 0 for a whole input; for a piece,
    the rows of the row groups (or the sequences) before it. (A piece of JSON Lines numbers
    its lines itself.)"""
    return reader_of(inp).first_row(inp)


def cuts(inp: InputFile) -> Cuts | None:
    """Where a work unit's piece of ``inp`` may start (``None``: it is read whole)."""
    return reader_of(inp).cuts(inp)


def ids_field(inp: InputFile) -> str | None:
    """The name shown for the ids of an input that holds token ids only (a Megatron indexed
    dataset: ``tokens``); ``None`` for an input of records with fields."""
    return reader_of(inp).ids_field


def column_batches(
    inp: InputFile, columns: Sequence[str], *, split: str | None = None, batch_rows: int = 2048
) -> Iterator[ColumnBatch]:
    """The list columns ``columns`` (token ids) of the records of ``inp``, batch by batch:
    Parquet, Arrow and saved datasets as stored; JSON Lines, JSON arrays and CSV
    (compressed too) parsed by pyarrow, the CSV cells' lists by NumPy; the sequences of a
    Megatron indexed dataset. A record that cannot be such lists is null, named in the
    batch's ``problems``."""

    def check(schema: pa.Schema) -> None:  # a column missing named before anything is read
        check_table_columns(schema.names, columns, str(inp.path))

    parts = _read(inp, Request(columns, Want.IDS, split, batch_rows, check))
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

    def named(schema: pa.Schema) -> None:  # a field missing named before anything is read
        check_record_columns(schema.names, fields, str(inp.path))

    parts = _read(inp, Request(fields, Want.RECORDS, split, batch_docs, named))
    return guarded(inp, as_records(parts, check, skip_bad_records, batch_docs))


def first_record_fields(inp: InputFile, *, split: str | None = None) -> list[str] | None:
    """The field names of the first readable record of ``inp`` (columns of a table input).

    Used to detect the input shape (``--input-shape auto``). ``None`` when there is nothing to
    look at (a ``.txt`` or Megatron input, an empty file, or no readable record in the first
    100 lines), or when the input cannot be read (reading it for real then names the problem).
    """
    return reader_of(inp).first_fields(inp, split)
