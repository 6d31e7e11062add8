"""The manifest's records as frozen dataclasses, and the one loader that builds them.

:func:`load` builds any record of this module (and the counts of :mod:`.counts`) from its JSON
object by its fields' types: ``int``, ``float``, ``str``, ``bool``, ``Any``, ``X | None``,
``list[X]``/``tuple[X, ...]``, ``dict[str, Any]`` and nested records. A field is read from
the key of its name (``key(...)`` spells another), a ``raw()`` field holds the JSON object as
read (what a merge copies on unchanged), and a missing key gives the field's default (None
if it has none). What is malformed is reported through :class:`Problems`: strict (a pack read
to be used) raises one line naming the file and the key path, lenient (``verify``, ``stats``)
gives the default and collects the line. :func:`to_record` is the way back.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from functools import cache
from typing import Any, TypeVar, get_args, get_origin

import numpy as np

from ..errors import FormatError

__all__ = [
    "BackendRecord",
    "BalanceRecord",
    "ChatTemplateRecord",
    "EosAppended",
    "Histogram",
    "InputRecord",
    "LabelCounts",
    "MergedUnits",
    "OptionsRecord",
    "PieceRecord",
    "Problems",
    "Record",
    "ShardEntry",
    "SpecialIds",
    "SpecialStrings",
    "TokenizerRecord",
    "UnitRecord",
    "int_or_none",
    "is_count",
    "key",
    "load",
    "raw",
    "shard_entry_problem",
    "to_record",
    "whole",
]

R = TypeVar("R")


def int_or_none(value: Any) -> int | None:
    """``value`` if it is an integer (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def key(name: str, **kw: Any) -> Any:
    """A field read from (and written to) the key ``name``."""
    return field(metadata={"key": name}, **kw)


def raw() -> Any:
    """A field that holds the record's JSON object as read (never written by itself)."""
    return field(default_factory=dict, compare=False, repr=False, metadata={"raw": True})


def local(default: Any = None) -> Any:
    """A field that is no key of the record (set by whoever loads it)."""
    return field(default=default, compare=False, repr=False, metadata={"local": True})


class Problems:
    """Where the problems of a record being loaded go: raised (``strict``) or collected."""

    def __init__(self, where: object = "manifest", strict: bool = True) -> None:
        self.where, self.strict = where, strict
        self.found: list[str] = []

    def add(self, line: str) -> None:
        if self.strict:
            raise FormatError(f"{self.where}: {line}")
        self.found.append(line)


_BAD = object()
_WHAT = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


@cache
def _types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(tp: Any, value: Any, problems: Problems, at: str) -> Any:
    """``value`` as the type ``tp``, or ``_BAD`` (told to ``problems``)."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (types.UnionType, typing.Union):
        if value is None:
            return None
        return _convert(next(a for a in args if a is not type(None)), value, problems, at)
    if tp is Any:
        return value
    if is_dataclass(tp):
        loaded = load(tp, value, problems, at)
        return _BAD if loaded is None else loaded
    if origin in (list, tuple):
        if not isinstance(value, list):
            problems.add(f"{at} must be a list, got {_shown(value)}")
            return _BAD
        items = [_convert(args[0], v, problems, f"{at}[{i}]") for i, v in enumerate(value)]
        return origin(v for v in items if v is not _BAD)
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            problems.add(f"{at} must be an object, got {_shown(value)}")
            return _BAD
        if not args or args[1] is Any:
            return dict(value)
        items = {k: _convert(args[1], v, problems, f"{at}.{k}") for k, v in value.items()}
        return {k: v for k, v in items.items() if v is not _BAD}
    good = isinstance(value, tp) and (tp is bool or not isinstance(value, bool))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if good:
        return value
    problems.add(f"{at} must be {_WHAT.get(tp, tp)}, got {_shown(value)}")
    return _BAD


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _key(f: Field[Any]) -> str:
    return str(f.metadata.get("key", f.name))


def load(cls: type[R], record: Any, problems: Problems | None = None, at: str = "") -> R | None:
    """The record ``cls`` read from the JSON object ``record`` (None if it is no object)."""
    problems = problems or Problems()
    if not isinstance(record, Mapping):
        problems.add(f"{at or 'the record'} must be an object, got {_shown(record)}")
        return None
    hints, values = _types(cls), {}
    for f in fields(cls):  # type: ignore[arg-type]
        name = _key(f)
        if f.metadata.get("raw"):
            values[f.name] = dict(record)
        elif f.metadata.get("local"):
            continue
        elif name in record:
            value = _convert(hints[f.name], record[name], problems, f"{at}.{name}".lstrip("."))
            if value is not _BAD:
                values[f.name] = value
            elif f.default is MISSING and f.default_factory is MISSING:
                values[f.name] = None
        elif f.default is MISSING and f.default_factory is MISSING:
            problems.add(f"{at or 'the record'} lacks {name!r}")
            values[f.name] = None
    return cls(**values)


def to_record(value: Any) -> Any:
    """The JSON form of a record (its keys in field order; ``omit`` fields left out when
    None), of a list of them, or of a plain value."""
    if is_dataclass(value) and not isinstance(value, type):
        return {
            _key(f): to_record(getattr(value, f.name))
            for f in fields(value)
            if not (f.metadata.get("raw") or f.metadata.get("local"))
            and not (f.metadata.get("omit") and getattr(value, f.name) is None)
        }
    if isinstance(value, (list, tuple)):
        return [to_record(v) for v in value]
    return value


class Record:
    """A record of the manifest: read with :meth:`from_record`, written with ``to_record``."""

    @classmethod
    def from_record(cls: type[R], record: Any, problems: Problems | None = None) -> R:
        loaded = load(cls, record, problems or Problems(strict=False))
        assert loaded is not None, record
        return loaded

    def to_record(self) -> dict[str, Any]:
        return to_record(self)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class InputRecord(Record):
    """One entry of the manifest's ``inputs``: a file read, and the documents it gave."""

    path: str
    kind: str | None = None
    compression: str | None = None
    size_bytes: int | None = None
    first_doc: int | None = None  # the doc_id of its first document
    documents: int | None = None


@dataclass(frozen=True)
class PieceRecord(Record):
    """One piece of a work unit as its ``unit`` record lists it (``readers.Piece.describe``)."""

    path: str
    kind: str | None = None
    compression: str | None = None
    file_size: int | None = None
    split_by: str | None = None  # "file", "bytes", "row_groups", ...
    start: int | None = None
    stop: int | None = None
    record: dict[str, Any] = raw()  # as recorded, for a merge

    @property
    def continues(self) -> bool:
        """Whether this piece is a range after the start of its file (not its first)."""
        return self.split_by != "file" and self.start != 0


@dataclass(frozen=True)
class UnitRecord(Record):
    """The ``unit`` record of a work unit's output (``units.Unit.describe``, with the merge
    options ``run_unit`` adds)."""

    index: int | None = None
    count: int | None = None
    plan: str | None = None  # the sha256 of the whole plan: a unit of another plan differs
    plan_version: int | None = None
    inputs_sha256: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # as the plan describes them
    input_shape_auto: bool | None = None  # None: not recorded
    pieces: tuple[PieceRecord, ...] = ()
    merge_options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BackendRecord(Record):
    """The engine that encoded the documents (``tokenizer.backend``: ``tokenize.Backend``)."""

    name: str | None = None  # "fastokens", "hf", or "none" (pre-tokenized: nothing encoded)
    version: str | None = None
    reason: str | None = None
    fallback_batches: int | None = None  # batches re-encoded with hf (the parity gate)
    record: dict[str, Any] = raw()  # as recorded (for reports, and a resumed run)


@dataclass(frozen=True)
class SpecialIds(Record):
    """The special-token ids as used (``tokenizer.special_tokens``)."""

    eos_id: int | None = None
    bos_id: int | None = None
    pad_id: int | None = None  # the id in the padding


@dataclass(frozen=True)
class EosAppended(Record):
    """The EOS appended to every document (``tokenizer.eos_appended``)."""

    id: int
    token: str | None = None


@dataclass(frozen=True)
class TokenizerRecord(Record):
    """The manifest's ``tokenizer``: what encoded the documents, its special ids as used."""

    name: str | None = None
    sha256: str | None = None
    file: str | None = None  # the copy kept in the output (None: no tokenizer file)
    vocab_size: int | None = None
    special_tokens: SpecialIds | None = None
    pad_from: str = "tokenizer"  # where the pad id comes from: tokenizer, eos, --pad-id
    backend: BackendRecord | None = None
    eos_appended: EosAppended | None = None
    turned_off: str | None = None  # what packtool turned off in the file (truncation...)
    record: dict[str, Any] = raw()  # as recorded (a merge copies it)

    @property
    def special(self) -> SpecialIds:
        return self.special_tokens or SpecialIds()

    @property
    def notices(self) -> list[str]:
        return [self.turned_off] if self.turned_off else []


@dataclass(frozen=True)
class ChatTemplateRecord(Record):
    """The chat template the chats were rendered with (``options.chat_template``)."""

    name: str | None = None
    source: str | None = None  # "file", "tokenizer_config.json", "chat_template.jinja", ...
    sha256: str | None = None


@dataclass(frozen=True)
class OptionsRecord(Record):
    """The options of the run that the reading side needs, typed (of ``options``)."""

    max_len: int | None = None
    add_eos: bool | None = None
    bos: bool | None = None
    pad_id: int | None = None
    overflow: str | None = None  # what was done with a document longer than max_len
    chat_template: ChatTemplateRecord | None = None
    shuffle: bool | None = None
    seed: int | None = None
    rows_per_shard: int | None = None
    pad_to_multiple_of: int | None = None  # recorded only when given


@dataclass(frozen=True)
class LabelCounts(Record):
    """The ``labels`` record of instruction data: what was learned, what had nothing to."""

    loss_on: str | None = None
    learned_tokens: int | None = None
    documents_without_labels: int | None = None
    chunks_without_labels_dropped: int | None = None
    tokens_in_chunks_without_labels: int | None = None
    piece_encoding: str | None = None


@dataclass(frozen=True)
class BalanceRecord(Record):
    """The ``balance`` record of rows stored as balanced steps (``--world-size``)."""

    world_size: int | None = None
    micro_batches: int | None = None
    record: dict[str, Any] = raw()


@dataclass(frozen=True)
class MergedUnits(Record):
    """The ``units`` record of a dataset merged from work units (``packtool merge``)."""

    count: int | None = None
    plan: str | None = None
    units_sha256: str | None = None  # what names the units' rows as they were merged
    rows_over_global_ffd: int | None = None
    packing_loss: float | None = None  # rows over one global FFD, as a share of its rows
    copied: bool | None = None  # None: not recorded (merged by an older packtool)
    copy_reason: str | None = None
    record: dict[str, Any] = raw()

    def summary(self) -> dict[str, Any]:
        """The record without its per-unit list (for ``--json`` output)."""
        return {k: v for k, v in self.record.items() if k != "per_unit"}


@dataclass(frozen=True)
class SpecialStrings(Record):
    """``special_strings``: documents that held special-token strings, and whether parsed."""

    documents: int = 0
    parsed: bool = False


_HISTOGRAM_MAX_VALUES = 1 << 16  # distinct lengths; beyond, the record is left out


@dataclass(frozen=True)
class Histogram(Record):
    """A histogram of lengths (``segment_lengths``): each value and how often it occurs; what
    a merge of work units counts the global FFD rows from, without reading their shards."""

    values: list[int]
    counts: list[int]

    @staticmethod
    def of(lengths: np.ndarray | None) -> Histogram | None:
        """The histogram of ``lengths`` (None if they have too many distinct values)."""
        if lengths is None:
            return None
        lengths = np.asarray(lengths)
        if lengths.size and int(lengths.min()) >= 0 and int(lengths.max()) < (1 << 22):
            every = np.bincount(lengths)  # one pass, no sort: 20M segments in about 0.1 s
            values = np.flatnonzero(every)
            counts = every[values]
        else:
            values, counts = np.unique(lengths.astype(np.int64), return_counts=True)
        if values.size > _HISTOGRAM_MAX_VALUES:
            return None
        return Histogram(values.tolist(), counts.tolist())

    def lengths(self, size: int) -> np.ndarray | None:
        """Every length (sorted), or None unless there are ``size`` of them."""
        if len(self.values) != len(self.counts) or min(self.counts, default=0) < 0:
            return None
        out = np.repeat(np.asarray(self.values, np.int64), np.asarray(self.counts, np.int64))
        return out if out.size == size else None


def whole(cls: type, record: Any) -> bool:
    """Whether ``record`` holds every field of ``cls`` that is not optional, as an integer
    (the counts of :mod:`.counts`: their defaults are for counting, not for reading)."""
    return isinstance(record, dict) and all(
        int_or_none(record.get(f.name)) is not None
        for f in fields(cls)
        if "None" not in str(f.type)
    )


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def shard_entry_problem(i: int, shard: Any) -> str | None:
    """What is wrong with ``shards[i]`` of a manifest, or None.

    ``file`` is a path relative to the dataset directory, with ``/`` between its parts: a
    plain name (``data-00000-of-00002.arrow``), or one inside a sub-directory (a merge without
    copying lists ``units/unit-00003-of-00008/data-00000-of-00001.arrow``). No part is empty or
    starts with ``.``, so a manifest cannot make a reader open ``../../somewhere`` or ``/etc``.
    """
    if not isinstance(shard, dict):
        return f"shards[{i}] is not an object"
    name = shard.get("file")
    if (
        not isinstance(name, str)
        or not name
        or "\\" in name
        or ":" in name
        or any(not part or part.startswith(".") for part in name.split("/"))
    ):
        return f"shards[{i}].file is {name!r}, not a path inside the dataset directory"
    if not is_count(shard.get("rows")):
        return f"shards[{i}].rows is {shard.get('rows')!r}, not a row count"
    if not is_count(shard.get("doc_offset", 0)):
        return f"shards[{i}].doc_offset is {shard.get('doc_offset')!r}, not a document count"
    return None


@dataclass(frozen=True)
class ShardEntry(Record):
    """One shard as the manifest lists it."""

    file: str
    rows: int
    bytes: int | None = field(default=None, metadata={"omit": True})
    sha256: str | None = field(default=None, metadata={"omit": True})
    doc_offset: int = 0  # added to the shard's doc_ids (a unit's shard, listed by a merge)

    @property
    def referenced(self) -> bool:
        """A unit's shard, listed where the unit wrote it (a merge without copying)."""
        return "/" in self.file

    def to_record(self) -> dict[str, Any]:
        """The entry as the manifest's ``shards`` list holds it (``doc_offset`` for a
        referenced shard, or one that has an offset)."""
        record = to_record(self)
        if not (self.referenced or self.doc_offset):
            del record["doc_offset"]
        return record  # type: ignore[no-any-return]
