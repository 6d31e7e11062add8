"""What every input format answers: the :class:`Reader` protocol, and the defaults most
formats share (:class:`FieldReader`, :class:`TableReader`).

A format is one module with one reader object; the table of formats
(:mod:`.registry`) maps each input kind to its reader, and every read, every suffix that
names a file's format and every piece a work unit may take of an input goes through it::

    class TsvReader(FieldReader):
        kind, suffixes = "tsv", (".tsv",)

        def read(self, inp, request):
            ...  # yield Records of request.fields

    register(TsvReader())  # in the table: one line
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple, Protocol

import numpy as np
import pyarrow as pa

from ..errors import InputError
from ..fs import AnyPath
from .adapt import as_texts
from .batches import Records, TableSource, TextBatch, Want, as_read, check_column, read_schema
from .files import BATCH_DOCS, InputFile

SchemaCheck = Callable[[pa.Schema], None]


class Cuts(NamedTuple):
    """Where a work unit's piece of an input may start (``Piece.split_by`` names the kind of
    piece): after any line break (``starts`` is ``None``: JSON Lines by bytes), or at the
    byte offsets ``starts`` (plus ``shift``) of its numbered parts (Parquet row groups,
    Megatron sequences)."""

    split_by: str
    starts: np.ndarray | None = None
    shift: int = 0


class Request(NamedTuple):
    """What a read asks of an input: ``fields`` of each record, parsed as ``want`` says; the
    ``split`` of a saved dataset; ``batch_rows`` rows at a time (tables); ``check(schema)``
    sees the columns before anything is read, where they are known (a table, a CSV header),
    to name a missing column."""

    fields: Sequence[str]
    want: Want
    split: str | None = None
    batch_rows: int = BATCH_DOCS
    check: SchemaCheck | None = None


class TextRequest(NamedTuple):
    """What a read of texts asks (:func:`~packtool.readers.read_texts`): the text of
    ``text_field`` of each record (a ``.txt`` input: a ``txt_unit``), in batches of about
    ``batch_docs``; a bad record stops the reading unless ``skip_bad_records``."""

    text_field: str = "text"
    skip_bad_records: bool = False
    split: str | None = None
    txt_unit: str = "line"
    batch_docs: int = BATCH_DOCS


class Reader(Protocol):
    """One input format: what it claims, what it gives, and its one reader.

    ``kind`` is :attr:`InputFile.kind`; ``suffixes`` the file suffixes that name the format
    (lower case; none for a directory format), also ``.gz``/``.zst`` compressed where
    ``compressible``. ``gives`` is what :meth:`read` can make of the fields (:class:`Want`);
    ``schema_first``: its columns are known before any record is read (a table, a CSV
    header); ``ids_field``: the name shown for the ids of a format that holds token ids
    only (``None`` for the others).
    """

    kind: str
    suffixes: tuple[str, ...]
    compressible: bool
    gives: frozenset[Want]
    schema_first: bool
    ids_field: str | None

    def read(self, inp: InputFile, request: Request) -> Iterator[Records]:
        """The records of ``inp`` (a piece too), as ``request`` asks (:class:`Request`)."""
        ...

    def texts(self, inp: InputFile, request: TextRequest) -> Iterator[TextBatch]:
        """The texts of ``inp`` in batches (what ``read_texts`` gives)."""
        ...

    def first_fields(self, inp: InputFile, split: str | None) -> list[str] | None:
        """The field names of the first readable record; ``None`` where there is nothing to
        look at or the input cannot be read (reading it for real names the problem)."""
        ...

    def first_row(self, inp: InputFile) -> int:
        """The number in its file of the first row of ``inp`` (0 for a whole input)."""
        ...

    def cuts(self, inp: InputFile) -> Cuts | None:
        """Where pieces of ``inp`` may start; ``None``: it is read whole."""
        ...

    def refusal(self, inp: InputFile, want: Want) -> Exception:
        """The error for asking ``inp`` for what the format does not give."""
        ...

    def input_file(self, path: AnyPath, compression: str | None) -> InputFile:
        """The input that the file ``path`` (of this format) is; checks its companions."""
        ...

    def companions(self, path: AnyPath) -> list[AnyPath]:
        """The other files of the input ``path`` names (not inputs of their own)."""
        ...

    def entry_of(self, path: AnyPath) -> AnyPath | None:
        """The file that names the input which the file ``path`` belongs to, when that is
        not ``path`` itself (a companion file); else ``None``."""
        ...

    def by_prefix(self, spec: str) -> AnyPath | None:
        """The file that names the input a prefix ``spec`` (no such file) stands for."""
        ...


class FieldReader:
    """The defaults of a format of records with fields, read whole: texts through
    :meth:`read` and the text adapter; no pieces; one file an input."""

    kind: str = ""
    suffixes: tuple[str, ...] = ()
    compressible: bool = False
    gives: frozenset[Want] = frozenset(Want)
    schema_first: bool = False
    ids_field: str | None = None

    def read(self, inp: InputFile, request: Request) -> Iterator[Records]:
        raise self.refusal(inp, request.want)

    def texts(self, inp: InputFile, request: TextRequest) -> Iterator[TextBatch]:
        field, where = request.text_field, str(inp.path)
        asked = Request(
            [field],
            Want.TEXT,
            split=request.split,
            batch_rows=request.batch_docs * 8,
            check=lambda schema: check_column(schema, field, where),
        )
        return as_texts(self.read(inp, asked), field, request.skip_bad_records, request.batch_docs)

    def first_fields(self, inp: InputFile, split: str | None) -> list[str] | None:
        return None

    def first_row(self, inp: InputFile) -> int:
        return 0

    def cuts(self, inp: InputFile) -> Cuts | None:
        return None

    def refusal(self, inp: InputFile, want: Want) -> Exception:
        if want is Want.IDS:
            return InputError(f"{inp.path}: a .{inp.kind} input holds text, not token ids")
        return InputError(f"{inp.path}: a .{inp.kind} input gives no {want.value}")

    def input_file(self, path: AnyPath, compression: str | None) -> InputFile:
        return InputFile(path, self.kind, compression, path.stat().st_size)

    def companions(self, path: AnyPath) -> list[AnyPath]:
        return []

    def entry_of(self, path: AnyPath) -> AnyPath | None:
        return None

    def by_prefix(self, spec: str) -> AnyPath | None:
        return None


class TableReader(FieldReader):
    """A table format (Parquet, Arrow, a saved dataset): opened with its schema first (to
    name a missing column), then :class:`Records` of the columns, as stored."""

    schema_first = True

    def open_table(self, inp: InputFile, request: Request) -> TableSource:
        """The table ``inp`` opened for the columns ``request.fields`` (its ``split`` and
        ``batch_rows``): its schema now, its rows when iterated."""
        raise NotImplementedError

    def read(self, inp: InputFile, request: Request) -> Iterator[Records]:
        source = self.open_table(inp, request)
        try:
            if request.check is not None:
                request.check(read_schema(source.schema))
            for part in source.parts:  # dictionary-encoded, view types: as packtool reads them
                if part.table is not None:
                    part.table = as_read(part.table, part.where, part.row0)
                yield part
        finally:
            source.close()

    def first_fields(self, inp: InputFile, split: str | None) -> list[str] | None:
        try:
            source = self.open_table(inp, Request((), Want.RECORDS, split, batch_rows=1))
        except InputError:
            return None  # reading it for real names the problem
        source.close()
        return list(source.schema.names)
