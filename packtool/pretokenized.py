"""Pre-tokenized inputs: records that already hold token ids (``--ids-field``).

Each record's list of ints is a document as it is. The list column of an Arrow record batch
(Parquet, Arrow, a saved dataset, a Megatron-LM indexed dataset; JSON Lines, JSON and CSV
parsed to Arrow by :func:`~packtool.readers.column_batches`) is read as one flat NumPy array
with the record offsets: no Python per token or per document. Optional ``--labels-field`` (ints,
-100 where not learned) or ``--loss-mask-field`` (0/1 per token) give the labels.
``--split-on-eos ID`` cuts every record into documents after each occurrence of ``ID``.

Every record is checked, vectorized: nulls, floats, negative ids, ids outside
``[0, vocab_size)``, a labels list of another length than its ids. The first bad record is a
one-line error naming it (``file: row n``); with ``--skip-bad-records`` each bad record is
skipped and counted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from .errors import BadRecordError, InputError, OptionError
from .readers import InputFile, column_batches, first_row
from .tokenize import Backend, EncodedBatch, SpecialTokens

__all__ = ["IdsBatch", "IdsEncoder", "IdsTokenizer", "read_ids"]

IGNORE = -100  # the label of a token that is not learned (packtool.format.IGNORE_INDEX)
_INT32_MAX = (1 << 31) - 1


class IdsTokenizer:
    """The stand-in tokenizer of pre-tokenized data packed without ``--tokenizer``: it
    encodes nothing, and knows only the ids it is told (``--eos-token``/``--bos-token`` as
    ids, ``--vocab-size``)."""

    name = "none (pre-tokenized)"
    sha256 = hashlib.sha256(b"packtool: no tokenizer").hexdigest()

    def __init__(
        self, *, eos_token: str | None, bos_token: str | None, vocab_size: int | None
    ) -> None:
        self.special = SpecialTokens(
            eos_id=_token_id("--eos-token", eos_token, vocab_size),
            bos_id=_token_id("--bos-token", bos_token, vocab_size),
            pad_id=None,
        )
        self.vocab_size = vocab_size

    def num_special_tokens_to_add(self) -> int:
        return 0

    def encode_batch(self, texts: Any, **kwargs: Any) -> list[list[int]]:
        raise OptionError("pre-tokenized data without --tokenizer: there is no text to encode")

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        return " ".join(str(int(i)) for i in ids)

    def token_to_id(self, token: str) -> int | None:
        return int(token) if token.isdigit() else None


def _token_id(flag: str, value: str | None, vocab_size: int | None) -> int | None:
    if value is None:
        return None
    if not str(value).isdigit():
        raise OptionError(
            f"{flag} {value!r}: without --tokenizer, pre-tokenized data names special tokens "
            "by id (e.g. --eos-token 2)"
        )
    high = vocab_size if vocab_size is not None else _INT32_MAX + 1
    if int(value) >= high:  # appended to documents (--eos, --bos), it would be a bad id
        bound = f"--vocab-size {vocab_size}" if vocab_size is not None else "int32"
        raise OptionError(
            f"{flag} {value} is outside the vocabulary [0, {high}) ({bound}): the rows would "
            "hold an id that is no token"
        )
    return int(value)


@dataclass
class IdsBatch:
    """Documents of consecutive records of one input, flat.

    ``records`` has one slot per document (after ``--split-on-eos`` cuts) or skipped bad
    record: true for a document, false for a bad record; document ``i`` of the good ones is
    ``ids[offsets[i]:offsets[i] + lengths[i]]``.
    """

    ids: np.ndarray  # int32
    lengths: np.ndarray  # int64, one per good document
    labels: np.ndarray | None  # int32, like ids
    records: np.ndarray  # bool, one per slot
    bad: list[BadRecordError] = field(default_factory=list)
    bytes_done: int = 0

    @property
    def good(self) -> np.ndarray:
        """Indices of the slots that are documents."""
        return np.flatnonzero(self.records)

    def drop_first(self, n: int) -> IdsBatch:
        """This batch without its first ``n`` slots (to resume)."""
        g = int(self.records[:n].sum())
        start = int(self.lengths[:g].sum())
        return IdsBatch(
            self.ids[start:],
            self.lengths[g:],
            None if self.labels is None else self.labels[start:],
            self.records[n:],
            self.bad[n - g :],
            self.bytes_done,
        )


def _kind(t: pa.DataType) -> str:
    if pa.types.is_floating(t):
        return "floats"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "strings"
    return str(t)


def _list_parts(
    column: pa.Array, name: str, where: str, problems: dict[int, str]
) -> tuple[np.ndarray, np.ndarray]:
    """The flat values (int64) and the offsets (from 0) of an Arrow list-of-ints column;
    records that are null, or hold nulls, floats or non-integers, go into ``problems``."""
    t = column.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
        raise InputError(f"{where}: column {name!r} is {t}, not a list of token ids")
    if pa.types.is_fixed_size_list(t):
        column = column.cast(pa.list_(t.value_type))
    offsets = np.asarray(column.offsets, dtype=np.int64)
    offsets = offsets - offsets[0]
    lengths = np.diff(offsets)
    flat = column.flatten()
    vt = flat.type
    if column.null_count:
        for r in np.flatnonzero(np.asarray(column.is_null(), dtype=bool)):
            problems.setdefault(int(r), f"{name!r} is null")
        lengths = np.where(np.asarray(column.is_null(), dtype=bool), 0, lengths)
    if pa.types.is_null(vt):  # only empty lists (JSON infers no type for them)
        values = np.zeros(len(flat), np.int64)
        if len(flat):
            for r in np.unique(np.searchsorted(offsets, np.arange(len(flat)), "right") - 1):
                problems.setdefault(int(r), f"{name!r} holds nulls")
        return values, offsets
    if not (pa.types.is_integer(vt) or pa.types.is_boolean(vt)):
        for r in np.flatnonzero(lengths > 0):  # empty lists hold nothing wrong
            problems.setdefault(int(r), f"{name!r} holds {_kind(vt)}, not integer token ids")
        return np.zeros(len(flat), np.int64), offsets
    if flat.null_count:
        at = np.flatnonzero(np.asarray(flat.is_null(), dtype=bool))
        for r in np.unique(np.searchsorted(offsets, at, "right") - 1):
            problems.setdefault(int(r), f"{name!r} holds nulls")
        flat = flat.fill_null(0)
    values = flat.to_numpy(zero_copy_only=False)
    if values.dtype == np.uint64 and values.size and values.max() > np.iinfo(np.int64).max:
        # named here with their value: as int64 (clamped) they would read 9223372036854775807
        at = np.flatnonzero(values > np.iinfo(np.int64).max)
        rows, first = np.unique(np.searchsorted(offsets, at, "right") - 1, return_index=True)
        for r, i in zip(rows.tolist(), at[first].tolist(), strict=True):
            problems.setdefault(r, f"{name!r}[{i - offsets[r]}] is {int(values[i])}, beyond int32")
        values = np.minimum(values, np.iinfo(np.int64).max)
    return values, offsets


def _record_of(offsets: np.ndarray, at: np.ndarray) -> np.ndarray:
    return np.unique(np.searchsorted(offsets, at, "right") - 1)


def _check_range(
    values: np.ndarray,
    offsets: np.ndarray,
    name: str,
    vocab_size: int | None,
    problems: dict[int, str],
    allow_ignore: bool = False,
) -> None:
    if not values.size:
        return
    high = vocab_size if vocab_size is not None else _INT32_MAX + 1
    lo, hi = values.min(), values.max()
    if lo >= 0 and hi < high:
        return
    bad = (values < 0) | (values >= high)
    if allow_ignore:
        bad &= values != IGNORE
    at = np.flatnonzero(bad)
    for r in _record_of(offsets, at):
        i = int(at[np.searchsorted(at, offsets[r])])
        v = int(values[i])
        if v < 0:
            what = "-100 or " if allow_ignore else ""
            problems.setdefault(
                int(r), f"{name!r}[{i - offsets[r]}] is {v}: ids must be {what}>= 0"
            )
        elif vocab_size is not None:
            problems.setdefault(
                int(r),
                f"{name!r}[{i - offsets[r]}] is {v}, outside the vocabulary [0, {vocab_size})",
            )
        else:
            problems.setdefault(int(r), f"{name!r}[{i - offsets[r]}] is {v}, beyond int32")


def _check_learned(
    labels: np.ndarray,
    ids: np.ndarray,
    offsets: np.ndarray,
    name: str,
    ids_name: str,
    problems: dict[int, str],
) -> None:
    """Every label is -100 or its own token's id (labels are unshifted: a label that is
    another id, as shifted labels are, would teach the rows something else than their
    tokens, and no check downstream could tell)."""
    at = np.flatnonzero((labels != IGNORE) & (labels != ids))
    for r in _record_of(offsets, at):
        i = int(at[np.searchsorted(at, offsets[r])])
        k = i - int(offsets[r])
        problems.setdefault(
            int(r),
            f"{name!r}[{k}] is {int(labels[i])}, but {ids_name!r}[{k}] is {int(ids[i])}: a "
            f"label is -100 or its own token's id (unshifted labels)",
        )


@dataclass(frozen=True)
class IdsFields:
    """What to read: the ids column, and the labels or loss mask column (or neither)."""

    ids: str
    labels: str | None = None
    loss_mask: str | None = None
    split_on_eos: int | None = None  # recorded in the manifest with the fields
    vocab_size: int | None = None  # --vocab-size as given (the check uses the resolved one)

    @property
    def columns(self) -> list[str]:
        return [c for c in (self.ids, self.labels, self.loss_mask) if c is not None]


def ids_of_batch(
    batch: pa.RecordBatch,
    fields: IdsFields,
    where: str,
    row0: int,
    *,
    vocab_size: int | None,
    split_on_eos: int | None,
    skip_bad: bool,
    known: dict[int, str] | None = None,
    locate: Callable[[int], str | None] | None = None,
) -> IdsBatch:
    """The checked documents of one Arrow record batch; ``row0`` is the number of its first
    row in the input. ``known`` are problems found while parsing (record -> what);
    ``locate(i)`` names record ``i`` (default: ``where: row n``)."""
    problems: dict[int, str] = dict(known or {})
    n = batch.num_rows

    def name(r: int) -> str:
        return (locate(r) if locate else None) or f"{where}: row {row0 + r}"

    values, offsets = _list_parts(batch.column(fields.ids), fields.ids, where, problems)
    _check_range(values, offsets, fields.ids, vocab_size, problems)
    lengths = np.diff(offsets)
    labels: np.ndarray | None = None
    other = fields.labels or fields.loss_mask
    if other is not None:
        lv, lo = _list_parts(batch.column(other), other, where, problems)
        llen = np.diff(lo)
        for r in np.flatnonzero(llen != lengths):
            problems.setdefault(
                int(r),
                f"{other!r} has {int(llen[r])} values, {fields.ids!r} has {int(lengths[r])}",
            )
        same = llen == lengths
        if not same.all():  # align the labels with the ids: bad records are dropped below
            keep_l = np.repeat(same, llen)
            lv = lv[keep_l]
            values = values[np.repeat(same, lengths)]
            offsets = np.concatenate([[0], np.cumsum(np.where(same, lengths, 0))])
            lengths = np.where(same, lengths, 0)
        if fields.labels is not None:
            _check_range(lv, offsets, other, vocab_size, problems, allow_ignore=True)
            _check_learned(lv, values, offsets, other, fields.ids, problems)
            labels = lv
        else:
            not01 = np.flatnonzero((lv != 0) & (lv != 1))
            for r in _record_of(offsets, not01):
                i = int(not01[np.searchsorted(not01, offsets[r])])
                problems.setdefault(
                    int(r), f"{other!r}[{i - offsets[r]}] is {int(lv[i])}, not 0 or 1"
                )
            labels = np.where(lv.astype(bool), values, IGNORE)
    bad: list[BadRecordError] = []
    keep = np.ones(n, bool)
    if problems:
        if not skip_bad:
            r = min(problems)
            raise BadRecordError(name(r), problems[r]).with_skip_hint()
        for r in sorted(problems):
            bad.append(BadRecordError(name(r), problems[r]))
            keep[r] = False
        tokens = np.repeat(keep, lengths)
        values = values[tokens]
        if labels is not None:
            labels = labels[tokens]
        lengths = lengths[keep]
    ids = values.astype(np.int32, copy=False)
    if labels is not None:
        labels = labels.astype(np.int32, copy=False)
    pieces = np.ones(lengths.size, np.int64)
    if split_on_eos is not None and ids.size:
        ends = np.cumsum(lengths)
        cut = np.flatnonzero(ids == split_on_eos) + 1
        k = np.searchsorted(ends, cut, "left")
        inner = cut[cut != ends[np.minimum(k, ends.size - 1)]]
        pieces += np.bincount(np.searchsorted(ends, inner, "left"), minlength=lengths.size)
        all_ends = np.sort(np.concatenate([ends, inner]), kind="stable")
        lengths = np.diff(np.concatenate([[0], all_ends]))
    slots = np.ones(n, np.int64)
    slots[keep] = pieces
    records = np.repeat(keep, slots)
    return IdsBatch(ids, lengths.astype(np.int64), labels, records, bad)


def read_ids(
    inp: InputFile,
    fields: IdsFields,
    *,
    vocab_size: int | None,
    split_on_eos: int | None = None,
    skip_bad_records: bool = False,
    split: str | None = None,
) -> Iterator[IdsBatch]:
    """The documents of ``inp``, checked, batch by batch (Arrow record batches; a Megatron
    indexed dataset's sequences too)."""
    where = str(inp.path)
    row = first_row(inp)  # a piece of Parquet row groups: the rows of the groups before it
    for part in column_batches(inp, fields.columns, split=split):
        out = ids_of_batch(
            part.batch,
            fields,
            where,
            row,
            vocab_size=vocab_size,
            split_on_eos=split_on_eos,
            skip_bad=skip_bad_records,
            known=part.problems,
            locate=part.locate,
        )
        out.bytes_done = part.bytes_done or inp.size_bytes
        row += part.batch.num_rows
        yield out


class IdsEncoder:
    """Pre-tokenized documents to :class:`~packtool.tokenize.EncodedBatch`, adding EOS (unless
    a document ends with it) and BOS (first) when asked. An added EOS is learned when the
    token before it is; an added BOS never is."""

    def __init__(
        self, *, eos_id: int | None, bos_id: int | None, add_eos: bool, bos: bool | None
    ) -> None:
        self.eos_id, self.bos_id = eos_id, bos_id
        self.add_eos, self.bos = add_eos, bool(bos)
        # no engine encodes anything: the manifest's tokenizer.backend says so
        self.backend = Backend("none", None, "pre-tokenized ids are packed as they are")

    def finish(self, batch: IdsBatch) -> EncodedBatch:
        ids, lengths, labels = batch.ids, batch.lengths, batch.labels
        empty = lengths == 0
        at: list[np.ndarray] = []
        what: list[np.ndarray] = []
        lab: list[np.ndarray] = []
        ends = np.cumsum(lengths)
        full = ~empty
        new_lengths = lengths
        if self.add_eos and self.eos_id is not None:
            needs = full.copy()
            needs[full] = ids[ends[full] - 1] != self.eos_id
            at.append(ends[needs])
            what.append(np.full(at[-1].size, self.eos_id, np.int32))
            if labels is not None:
                learned = labels[ends[needs] - 1] != IGNORE
                lab.append(np.where(learned, np.int32(self.eos_id), np.int32(IGNORE)))
            new_lengths = new_lengths + needs
        if self.bos and self.bos_id is not None:
            at.append((ends - lengths)[full])
            what.append(np.full(at[-1].size, self.bos_id, np.int32))
            lab.append(np.full(at[-1].size, IGNORE, np.int32))
            new_lengths = new_lengths + full
        if at and sum(a.size for a in at):
            where = np.concatenate(at)
            order = np.argsort(where, kind="stable")  # EOS before the next document's BOS
            where = where[order]
            ids = np.insert(ids, where, np.concatenate(what)[order])
            if labels is not None:
                labels = np.insert(labels, where, np.concatenate(lab)[order])
        return EncodedBatch(ids, new_lengths.astype(np.int64), empty, labels)


def ids_reader(
    fields: IdsFields, *, vocab_size: int | None, split_on_eos: int | None
) -> Callable[..., Iterator[IdsBatch]]:
    """``read(inp, skip_bad_records=..., split=...)`` for pre-tokenized inputs."""

    def read(inp: InputFile, *, skip_bad_records: bool, split: str | None) -> Iterator[IdsBatch]:
        return read_ids(
            inp,
            fields,
            vocab_size=vocab_size,
            split_on_eos=split_on_eos,
            skip_bad_records=skip_bad_records,
            split=split,
        )

    return read
