"""The batches of the readers, and the checks that turn parsed values into them.

Each format's reader yields :class:`Records`: consecutive records as it parsed them (Arrow
columns, or Python values where the format is parsed in Python). The adapters
(:mod:`.adapt`) make them :class:`TextBatch` (texts), :class:`RecordBatch` (instruction
records, made by the caller's check) or :class:`ColumnBatch` (token-id list columns). A bad
record that is skipped keeps its place as ``None``, so document numbering does not depend on it.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from ..errors import BadRecordError, InputError


class Want(str, enum.Enum):
    """What a reader is asked to make of the fields: the types it parses them to."""

    TEXT = "text"  # one string field: Arrow strings where the format's parser gives them
    RECORDS = "records"  # the fields as Python values (instruction records: dicts, lists)
    IDS = "ids"  # lists of integer token ids, as Arrow list columns


@dataclass
class Records:
    """What a format's reader yields: consecutive records of one input, as it parsed them.

    Either ``table`` (Arrow columns of the fields asked for) or ``values`` (the records as
    Python values: JSON parsed by ``json.loads``). ``bad`` holds the records the reader found
    bad (a malformed line or row, a cell that is not a list of ids), by index; their value is
    ``None`` (null in ``table``). ``locate(i)`` names record ``i``: by its line where
    ``lines`` is given (``file:line``, ``file: element n``), else by its row
    (``file: row n``, counted from ``row0``). ``reparse``, given where ``table`` came from
    the format's own parser (JSON Lines), gives the same records parsed in Python, to name a
    record whose Arrow value cannot be converted.

    ``table`` from a file (Parquet, Arrow) is checked before it is converted
    (:func:`validate_arrow`); ``reparse`` marks data that needs no such check.
    """

    where: str
    bytes_done: int  # how far into the input (bytes of the file as stored) this batch ends
    table: pa.RecordBatch | None = None
    values: list[Any] | None = None
    bad: dict[int, BadRecordError] = field(default_factory=dict)
    row0: int = 0
    lines: Callable[[int], Any] | None = None
    reparse: Callable[[], Records] | None = None
    places: list[Any] | None = None  # every record's location, where the reader made them

    def __len__(self) -> int:
        return self.table.num_rows if self.table is not None else len(self.values or ())

    def locate(self, i: int) -> Any:
        """Where record ``i`` is (a ``str``, or an object that becomes one when shown)."""
        if self.places is not None:
            return self.places[i]
        return self.lines(i) if self.lines is not None else f"{self.where}: row {self.row0 + i}"

    def locations(self) -> Sequence[Any]:
        """Every record's location (see :meth:`locate`)."""
        if self.places is not None:
            return self.places
        return [self.locate(i) for i in range(len(self))]

    def drop_first(self, n: int) -> Records:
        """These records without the first ``n`` (a CSV pass that starts again)."""
        lines = self.lines
        return Records(
            self.where,
            self.bytes_done,
            None if self.table is None else self.table.slice(n),
            None if self.values is None else self.values[n:],
            {i - n: e for i, e in self.bad.items() if i >= n},
            self.row0 + n,
            None if lines is None else (lambda i: lines(i + n)),
            places=None if self.places is None else self.places[n:],
        )


@dataclass
class TextBatch:
    """Consecutive records of one input. ``None`` marks a bad record that was skipped."""

    texts: list[str | None]
    bad: list[BadRecordError] = field(default_factory=list)
    bytes_done: int = 0  # how far into the input (bytes of the file as stored) this batch ends

    @property
    def records(self) -> list[str | None]:
        """The texts (so that text and record batches read alike)."""
        return self.texts


@dataclass
class RecordBatch:
    """Consecutive records of one input (see :func:`read_records`).

    ``records[i]`` is what the caller's ``check`` made of record ``i`` (``None``: a bad record
    that was skipped); ``locations[i]`` names it (``file:line`` or ``file: row n``), so that a
    later stage can report a problem with it.
    """

    records: list[Any]
    locations: list[str]
    bad: list[BadRecordError] = field(default_factory=list)
    bytes_done: int = 0
    records_read: int | None = None  # records of the input, when ``records`` holds more
    # documents than that (chats cut into one example per assistant turn); None: len(records)


@dataclass
class ColumnBatch:
    """Arrow list columns of consecutive records of one input (pre-tokenized data).

    ``problems`` names the records found bad while parsing (index in the batch -> what is
    wrong; their columns are null); ``locate(i)`` names record ``i`` (``file:line``), or is
    ``None`` where records are named by their row.
    """

    batch: pa.RecordBatch
    bytes_done: int
    problems: dict[int, str] = field(default_factory=dict)
    locate: Callable[[int], str | None] | None = None

    @property
    def records(self) -> range:
        return range(self.batch.num_rows)

    def drop_first(self, n: int) -> ColumnBatch:
        """This batch without its first ``n`` records (a CSV pass that starts again)."""
        locate = self.locate
        return ColumnBatch(
            self.batch.slice(n),
            self.bytes_done,
            {r - n: p for r, p in self.problems.items() if r >= n},
            None if locate is None else (lambda r: locate(r + n)),
        )


def describe_value(value: Any) -> str:
    kind = type(value).__name__
    return {"NoneType": "null", "dict": "object", "list": "array", "str": "string"}.get(kind, kind)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _looks_like_chat(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and isinstance(value[0], dict)
        and {"role", "content"} <= value[0].keys()
    )


def _field_hint(obj: dict[str, Any]) -> str:
    """The fix for a record without the text field; a field holding a chat is named."""
    chat = next((k for k, v in obj.items() if _looks_like_chat(v)), None)
    if chat is not None:
        return f"choose the field with --text-field; for these chats, --messages-field {chat}"
    return "choose the field with --text-field"


def check_record(obj: Any, text_field: str, location: str) -> str:
    if not isinstance(obj, dict):
        raise BadRecordError(location, f"expected a JSON object, found {describe_value(obj)}")
    if text_field not in obj:
        fields = ", ".join(repr(k) for k in list(obj)[:20]) or "none"
        raise BadRecordError(
            location, f"no field {text_field!r} (fields found: {fields})", _field_hint(obj)
        )
    text = obj[text_field]
    if not isinstance(text, str):
        raise BadRecordError(
            location, f"field {text_field!r} is {describe_value(text)}, not a string"
        )
    surrogate = _SURROGATE.search(text)
    if surrogate:  # JSON's "\ud800" escape: a str that no tokenizer (nor UTF-8) can take
        raise BadRecordError(
            location,
            f"field {text_field!r} holds an unpaired surrogate "
            f"\\u{ord(surrogate.group()):04x} at character {surrogate.start()}: not valid Unicode",
        )
    return text


def record_text(obj: Any, text_field: str, location: Any) -> str:
    """The text of a parsed record (see :func:`check_record`; the common case checked inline)."""
    if type(obj) is dict:
        text = obj.get(text_field)
        if type(text) is str and not _SURROGATE.search(text):
            return text
    return check_record(obj, text_field, location)  # raises, naming the problem


def check_column(schema: pa.Schema, text_field: str, where: str) -> None:
    if text_field not in schema.names:
        fields = ", ".join(repr(n) for n in schema.names[:20]) or "none"
        raise InputError(
            f"{where}: no column {text_field!r} (columns found: {fields}); "
            "choose the column with --text-field"
        )
    kind = read_type(schema.field(text_field).type)
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise InputError(f"{where}: column {text_field!r} is {kind}, not a string column")


def read_type(t: pa.DataType) -> pa.DataType:
    """The type packtool reads a column stored as ``t`` as: a dictionary-encoded column as its
    values, ``string_view`` as ``large_string`` (``binary_view``: ``large_binary``), a
    ``list_view`` as a list (``large_list_view``: a large list), inside lists and structs too;
    any other type as it is.

    >>> read_type(pa.dictionary(pa.int32(), pa.string()))
    DataType(string)
    >>> read_type(pa.list_view(pa.string_view()))
    ListType(list<item: large_string>)
    """
    if pa.types.is_dictionary(t):
        return read_type(t.value_type)
    if t == pa.string_view():
        return pa.large_string()
    if t == pa.binary_view():
        return pa.large_binary()
    if pa.types.is_list_view(t) or pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(read_type(t.value_type)))
    if pa.types.is_large_list_view(t) or pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(read_type(t.value_type)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(read_type(t.value_type)), t.list_size)
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(read_type(f.type)) for f in t])
    return t


def read_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with each column's type as packtool reads it (:func:`read_type`)."""
    return pa.schema([f.with_type(read_type(f.type)) for f in schema], metadata=schema.metadata)


def as_read(batch: pa.RecordBatch, where: str, row: int) -> pa.RecordBatch:
    """``batch`` with its columns in the types packtool reads (:func:`read_type`): Parquet
    and Arrow files may store a valid text column dictionary-encoded or as ``string_view``,
    ids as ``list_view``. Checked first (:func:`validate_arrow`): a cast trusts the data."""
    schema = read_schema(batch.schema)
    if schema.equals(batch.schema):
        return batch
    validate_arrow(batch, where, row, "")
    columns = [
        _as_read(column, field.type) for column, field in zip(batch.columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _as_read(column: pa.Array, to: pa.DataType) -> pa.Array:
    if column.type == to:
        return column
    t = column.type
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        # (pyarrow's cast of a list_view to a list gave invalid offsets: taken by hand)
        nulls = np.asarray(column.is_null(), dtype=bool)
        sizes = np.where(nulls, 0, np.asarray(column.sizes, dtype=np.int64))
        starts = np.asarray(column.offsets, dtype=np.int64)
        ends = np.cumsum(sizes)
        take = np.arange(int(ends[-1]) if sizes.size else 0, dtype=np.int64)
        take += np.repeat(starts - (ends - sizes), sizes)
        values = _as_read(column.values.take(pa.array(take)), to.value_type)
        offsets = pa.array(np.concatenate([[0], ends]), pa.int64())
        if pa.types.is_list(to):
            offsets = offsets.cast(pa.int32())
        make = pa.LargeListArray if pa.types.is_large_list(to) else pa.ListArray
        return make.from_arrays(offsets, values, type=to, mask=pa.array(nulls))
    return column.cast(to)


def validate_arrow(data: pa.Array | pa.RecordBatch, where: str, row: int, what: str) -> None:
    """Check Arrow data read from a file before converting it: pyarrow trusts a file's
    offsets, and damaged ones crash the process in ``to_pylist``. Full validation is one scan
    of the data (it includes the UTF-8 check that the conversion would make)."""
    try:
        data.validate(full=True)
    except pa.ArrowInvalid as e:
        at = re.search(r"string index (\d+)", str(e))
        if "UTF8" in str(e):
            place = f"at row {row + int(at.group(1))}" if at else f"near row {row}"
            raise InputError(f"{where}: invalid UTF-8 {what}{place}") from None
        raise InputError(f"{where}: corrupt Arrow data {what}near row {row}: {e}") from None


RecordCheck = Callable[[dict[str, Any], str], Any]
"""``check(record, location)``: validate one record (a dict of its fields) and return what the
batch should hold for it; raise :class:`~packtool.errors.BadRecordError` for a bad one."""


class RecordCollector:
    """Builds record batches, turning bad records into ``None`` or raising."""

    def __init__(self, check: RecordCheck, skip_bad: bool) -> None:
        self.check = check
        self.skip_bad = skip_bad
        self.batch = RecordBatch([], [])

    def add(self, obj: Any, location: str, error: BadRecordError | None = None) -> None:
        try:
            if error is not None:
                raise error
            if not isinstance(obj, dict):
                raise BadRecordError(
                    location, f"expected a JSON object, found {describe_value(obj)}"
                )
            value = self.check(obj, location)
        except BadRecordError as e:
            if not self.skip_bad:
                raise e.with_skip_hint() from None
            value = None
            self.batch.bad.append(e)
        self.batch.records.append(value)
        self.batch.locations.append(location)

    def take(self, bytes_done: int) -> RecordBatch:
        batch, self.batch = self.batch, RecordBatch([], [])
        batch.bytes_done = bytes_done
        return batch


def check_record_columns(names: Sequence[str], fields: Sequence[str], where: str) -> None:
    missing = [f for f in fields if f not in names]
    if missing:
        found = ", ".join(repr(n) for n in list(names)[:20]) or "none"
        raise InputError(
            f"{where}: no column {missing[0]!r} (columns found: {found}); "
            "choose the columns with --prompt-field, --completion-field or --messages-field"
        )


def skip_records(batches: Iterable[Any], n: int) -> Iterator[Any]:
    """Drop the first ``n`` records of a stream of text or record batches (to resume)."""
    for batch in batches:
        drop_first = getattr(batch, "drop_first", None)
        if drop_first is not None:  # pre-tokenized batches cut their own arrays
            if n >= len(batch.records):
                n -= len(batch.records)
                continue
            if n:
                batch, n = drop_first(n), 0
            yield batch
            continue
        if n >= len(batch.records):
            n -= len(batch.records)
            continue
        if n:
            bad_skipped = sum(r is None for r in batch.records[:n])
            if isinstance(batch, TextBatch):
                batch.texts = batch.texts[n:]
            else:
                batch.records, batch.locations = batch.records[n:], batch.locations[n:]
            batch.bad = batch.bad[bad_skipped:]
            n = 0
        yield batch


def is_straddling(error: Exception) -> bool:
    return "straddl" in str(error)


def check_table_columns(names: Sequence[str], columns: Sequence[str], where: str) -> None:
    """An :class:`~packtool.errors.InputError` naming the first of ``columns`` not in ``names``."""
    for name in columns:
        if name not in names:
            found = ", ".join(repr(n) for n in list(names)[:20]) or "none"
            raise InputError(f"{where}: no column {name!r} (columns found: {found})")


class TableSource(NamedTuple):
    """A table input (Parquet, Arrow, saved dataset) opened: its schema, and its rows as
    :class:`Records` of the columns asked for (nothing is read until they are iterated)."""

    schema: pa.Schema
    parts: Iterator[Records]
    close: Callable[[], None]


def table_parts(
    where: str,
    batches: Callable[[], Iterable[pa.RecordBatch]],
    bytes_done: Callable[[int], int],
    what: str,
    row0: int = 0,
) -> Iterator[Records]:
    """The batches of a table input (``batches()``, called at the first part) as
    :class:`Records` numbered from row ``row0``, each with the bytes read so far
    (``bytes_done(rows so far)``); a read error is ``{where}: cannot read {what}``."""
    rows = 0
    try:
        for b in batches():
            rows += b.num_rows
            yield Records(where, bytes_done(rows), b, row0=row0 + rows - b.num_rows)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{where}: cannot read {what}: {e}") from e
