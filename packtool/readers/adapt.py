"""The adapters: a format reader's :class:`~.batches.Records` made into what a stage takes.

Every format has one reader (yielding :class:`Records`); the three shapes of input data are
three adapters over it, the same for every format:

- :func:`as_texts`: text documents (:class:`TextBatch`), the string of one field per record;
- :func:`as_records`: instruction records (:class:`RecordBatch`), each made by the caller's
  check from a dict of its fields;
- :func:`as_columns`: token-id list columns (:class:`ColumnBatch`), kept in Arrow.

A bad record (found by the reader, or by the adapter's check) stops the reading with a
:class:`~packtool.errors.BadRecordError` naming it, or, when bad records are skipped, keeps
its place as ``None``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from ..errors import BadRecordError, InputError
from .batches import (
    ColumnBatch,
    RecordBatch,
    RecordCheck,
    RecordCollector,
    Records,
    TextBatch,
    describe_value,
    record_text,
    validate_arrow,
)


def _column_texts(part: Records, text_field: str) -> list[str | None] | None:
    """The strings of ``text_field`` of Arrow records (``None``: the reader's Python parse,
    ``part.reparse()``, must name a record that does not convert)."""
    assert part.table is not None
    column = part.table.column(text_field)
    if part.reparse is None:
        validate_arrow(column, part.where, part.row0, f"in column {text_field!r} ")
    try:
        return column.to_pylist()  # type: ignore[no-any-return]
    except UnicodeDecodeError as e:
        if part.reparse is not None:
            return None
        raise InputError(
            f"{part.where}: invalid UTF-8 in column {text_field!r} near row {part.row0}: {e.reason}"
        ) from None


def _texts(part: Records, text_field: str, skip_bad: bool) -> TextBatch:
    """The texts of one reader batch, bad records raised or kept as ``None``."""
    out = TextBatch([], bytes_done=part.bytes_done)
    texts = _column_texts(part, text_field) if part.table is not None else None
    if texts is None and part.table is not None:
        part = part.reparse()  # type: ignore[misc]
    if texts is not None:  # Arrow strings: a null is the only bad value
        if part.table is not None and part.table.column(text_field).null_count:
            for i in [i for i, t in enumerate(texts) if t is None]:
                error = BadRecordError(part.locate(i), f"{text_field!r} is null")
                if not skip_bad:
                    raise error.with_skip_hint()
                out.bad.append(error)
        out.texts = texts
        return out
    bad = part.bad
    for i, (obj, location) in enumerate(zip(part.values or (), part.locations(), strict=True)):
        try:
            error = bad.get(i) if bad else None
            if error is not None:
                raise error
            out.texts.append(record_text(obj, text_field, location))
        except BadRecordError as e:
            if not skip_bad:
                raise e.with_skip_hint() from None
            out.texts.append(None)
            out.bad.append(e)
    return out


def as_texts(
    parts: Iterable[Records], text_field: str, skip_bad: bool, batch_docs: int
) -> Iterator[TextBatch]:
    """The texts of the field ``text_field`` of each record, in batches of at most
    ``batch_docs``. A record that is not an object, lacks the field, or whose value is not a
    string (null; an unpaired surrogate) is a bad record."""
    for part in parts:
        batch = _texts(part, text_field, skip_bad)
        if len(batch.texts) <= batch_docs:
            if batch.texts:
                yield batch
            continue
        bad = iter(batch.bad)
        for i in range(0, len(batch.texts), batch_docs):
            texts = batch.texts[i : i + batch_docs]
            errors = [next(bad) for t in texts if t is None] if batch.bad else []
            yield TextBatch(texts, errors, batch.bytes_done)


def as_records(
    parts: Iterable[Records], check: RecordCheck, skip_bad: bool, batch_docs: int
) -> Iterator[RecordBatch]:
    """Each record as a dict of its fields, made by ``check`` into what the batch holds, in
    batches of ``batch_docs``. A record that is not an object, or that ``check`` rejects,
    is a bad record."""
    collect = RecordCollector(check, skip_bad)
    bytes_done = 0
    for part in parts:
        bytes_done = part.bytes_done
        if part.table is not None:
            if part.reparse is None:
                validate_arrow(part.table, part.where, part.row0, "")
            try:
                rows = part.table.to_pylist()
            except UnicodeDecodeError as e:
                if part.reparse is None:
                    raise InputError(
                        f"{part.where}: invalid UTF-8 near row {part.row0}: {e.reason}"
                    ) from None
                part = part.reparse()
                rows = part.values or []
        else:
            rows = part.values or []
        bad, add, records = part.bad, collect.add, collect.batch.records
        for i, (obj, location) in enumerate(zip(rows, part.locations(), strict=True)):
            if bad and i in bad:
                add(obj, location, bad[i])
            else:
                add(obj, location)
            if len(records) >= batch_docs:
                yield collect.take(bytes_done)
                records = collect.batch.records
    if collect.batch.records:
        yield collect.take(bytes_done)


def as_columns(parts: Iterable[Records], columns: Sequence[str]) -> Iterator[ColumnBatch]:
    """The list columns ``columns`` (token ids) of each record, kept in Arrow; a record
    that cannot be such lists is null, named in the batch's ``problems``."""
    for part in parts:
        problems = {i: e.problem for i, e in part.bad.items()}
        if part.table is not None:
            batch = part.table
        else:
            batch = parsed_columns(part.values or [], columns, problems)
        yield ColumnBatch(batch, part.bytes_done, problems, part.locate)


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
