"""The batches every reader yields, and the checks that turn parsed values into them.

A reader yields :class:`TextBatch` (texts), :class:`RecordBatch` (instruction records, made by
the caller's check) or :class:`ColumnBatch` (token-id list columns). A bad record that is
skipped keeps its place as ``None``, so document numbering does not depend on it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pyarrow as pa

from ..errors import BadRecordError, InputError


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


def text_check(text_field: str) -> RecordCheck:
    """The ``check`` of :class:`RecordCollector` that makes a record its text (see
    :func:`check_record`)."""

    def check(obj: dict[str, Any], location: str) -> str:
        text = obj.get(text_field)
        if type(text) is str and not _SURROGATE.search(text):
            return text
        return check_record(obj, text_field, location)  # raises, naming the problem

    return check


def texts_of(batches: Iterable[RecordBatch]) -> Iterator[TextBatch]:
    """Record batches made by :func:`text_check` as text batches: the adapter that lets a
    format's records reader be its text reader too."""
    for batch in batches:
        yield TextBatch(batch.records, batch.bad, batch.bytes_done)


def check_column(schema: pa.Schema, text_field: str, where: str) -> None:
    if text_field not in schema.names:
        fields = ", ".join(repr(n) for n in schema.names[:20]) or "none"
        raise InputError(
            f"{where}: no column {text_field!r} (columns found: {fields}); "
            "choose the column with --text-field"
        )
    kind = schema.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise InputError(f"{where}: column {text_field!r} is {kind}, not a string column")


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


def table_texts(
    batches: Iterator[pa.RecordBatch],
    text_field: str,
    where: str,
    skip_bad: bool,
    batch_docs: int,
    progress: Callable[[], int],
    row0: int = 0,
) -> Iterator[TextBatch]:
    row = row0
    for record_batch in batches:
        column = record_batch.column(record_batch.schema.get_field_index(text_field))
        validate_arrow(column, where, row, f"in column {text_field!r} ")
        try:
            texts = column.to_pylist()
        except UnicodeDecodeError as e:
            raise InputError(
                f"{where}: invalid UTF-8 in column {text_field!r} near row {row}: {e.reason}"
            ) from None
        out = TextBatch([])
        for text in texts:
            if text is None:
                error = BadRecordError(f"{where}: row {row}", f"{text_field!r} is null")
                if not skip_bad:
                    raise error.with_skip_hint()
                out.bad.append(error)
            out.texts.append(text)
            row += 1
        out.bytes_done = progress()
        for i in range(0, len(out.texts), batch_docs):
            piece = TextBatch(out.texts[i : i + batch_docs], bytes_done=out.bytes_done)
            if i == 0:
                piece.bad = out.bad
            yield piece


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


def table_records(
    batches: Iterator[pa.RecordBatch],
    fields: Sequence[str],
    where: str,
    collect: RecordCollector,
    batch_docs: int,
    progress: Callable[[], int],
    row0: int = 0,
):
    row = row0
    for record_batch in batches:
        selected = record_batch.select(list(fields))
        validate_arrow(selected, where, row, "")
        try:
            rows = selected.to_pylist()
        except UnicodeDecodeError as e:
            raise InputError(f"{where}: invalid UTF-8 near row {row}: {e.reason}") from None
        for obj in rows:
            collect.add(obj, f"{where}: row {row}")
            row += 1
            if len(collect.batch.records) >= batch_docs:
                yield collect.take(progress())
    if collect.batch.records:
        yield collect.take(progress())


def _id_list_problem(obj: Any, columns: Sequence[str]) -> str | None:
    """What keeps a parsed JSON record from being lists of integer ids in ``columns``."""
    if not isinstance(obj, dict):
        return f"expected a JSON object, found {describe_value(obj)}"
    for name in columns:
        if name not in obj:
            found = ", ".join(repr(k) for k in list(obj)[:20]) or "none"
            return f"no field {name!r} (fields found: {found})"
        value = obj[name]
        if value is None:
            return f"{name!r} is null"
        if not isinstance(value, list):
            return f"{name!r} is {describe_value(value)}, not a list of token ids"
        if all(type(v) is int for v in value):
            big = [v for v in value if not -(1 << 63) <= v < 1 << 63]
            if big:
                return f"{name!r}[{value.index(big[0])}] is {big[0]}: too large for a token id"
            continue
        j = next(j for j, v in enumerate(value) if type(v) is not int)
        if value[j] is None:
            return f"{name!r} holds nulls"
        shown = json.dumps(value[j])[:40]
        return f"{name!r}[{j}] is {shown}, not an integer token id"
    return None


def parsed_columns(
    objs: Sequence[Any], columns: Sequence[str], problems: dict[int, str]
) -> pa.RecordBatch:
    """The list columns of parsed JSON records; a bad one goes into ``problems`` (as null)."""
    values: dict[str, list[Any]] = {c: [] for c in columns}
    for r, obj in enumerate(objs):
        problem = problems.get(r) or _id_list_problem(obj, columns)
        if problem is not None:
            problems[r] = problem
        for c in columns:
            values[c].append(None if problem is not None else obj[c])
    arrays = [pa.array(values[c], pa.list_(pa.int64())) for c in columns]
    return pa.RecordBatch.from_arrays(arrays, names=list(columns))


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
    """The rows of a table input (Parquet, Arrow, saved dataset) as record batches."""

    names: list[str]  # its column names
    batches: Iterator[pa.RecordBatch]  # of the columns asked for; nothing read until iterated
    progress: Callable[[], int]  # bytes read so far
    close: Callable[[], None]
