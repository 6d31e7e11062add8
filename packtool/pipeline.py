"""``pack``: read -> tokenize -> store -> plan (FFD) -> shuffle -> gather -> write.

Only per-item lengths and offsets live in memory; tokens go to a temporary on-disk store and
rows are gathered from it. The plan is a pure function of the item lengths and the options,
so the output is deterministic.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .chat import DEFAULT_TEMPLATE_TIMEOUT, ChatTemplate
from .errors import InputError, NothingToPackError, OptionError
from .format import (
    IGNORE_INDEX,
    ShardWriter,
    check_output_dir,
    remove_stale_temporaries,
    write_error,
)
from .gather import gather_rows, warm_up_gather
from .instruct import InputPlan, InputShape, LossOn, plan_input
from .limits import MAX_LEN_LIMIT, MAX_NUM_PROC, MAX_ROWS_PER_SHARD, MAX_SEED, check_int
from .packing import Overflow, first_fit_decreasing, lower_bound_rows, plan_rows
from .sources import TXT_UNITS, InputFile, RecordBatch, TextBatch, resolve_inputs, skip_records
from .store import TokenStore, lock_output
from .tokenize import EncodedBatch, HFTokenizer, Tokenizer, load_tokenizer

__all__ = ["DocumentCounts", "PackReport", "ProgressCallback", "pack"]

ProgressCallback = Callable[[str, int, "int | None"], None]
"""Called as ``progress(stage, completed, total)``; stages: ``tokenize`` (bytes of input),
``pack`` (items), ``write`` (rows). ``total`` is ``None`` when unknown."""

DEFAULT_SHARD_BYTES = 256 << 20
_MAX_TEMPLATE_TIMEOUT = 24 * 3600.0
_BAD_RECORDS_KEPT = 20


@dataclass
class DocumentCounts:
    """What happened to every document read; ``read`` is the sum of the others."""

    read: int = 0
    packed: int = 0  # whole, as one segment
    split: int = 0  # into several chunks, each a segment
    truncated: int = 0
    dropped: int = 0  # longer than max_len under --overflow drop
    empty: int = 0  # no tokens
    bad_records_skipped: int = 0

    def check(self) -> None:
        accounted = (
            self.packed
            + self.split
            + self.truncated
            + self.dropped
            + self.empty
            + self.bad_records_skipped
        )
        if accounted != self.read:  # pragma: no cover - a bug, never a user error
            raise AssertionError(f"documents read {self.read} != accounted {accounted}: {self}")


@dataclass
class PackReport:
    """What ``pack`` did: counts, the packing figures and where the output is."""

    out_dir: Path
    max_len: int
    documents: DocumentCounts
    segments: int
    tokens: int  # real tokens in rows
    tokens_truncated: int  # tokens cut off by --overflow truncate
    tokens_dropped: int  # tokens of documents dropped by --overflow drop
    rows: int
    lower_bound_rows: int
    shards: int
    seconds: float
    bad_records: list[str] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)
    resumed: bool = False  # continued from a checkpoint (``resume=True``)
    skipped_files: list[str] = field(default_factory=list)  # directory members not read
    tokens_learned: int | None = None  # tokens with a label (instruction data), else None

    @property
    def efficiency(self) -> float:
        """Real tokens / (rows x max_len)."""
        return self.tokens / (self.rows * self.max_len) if self.rows else 0.0

    @property
    def learned_share(self) -> float | None:
        """Learned tokens / (rows x max_len): the share of slots the loss sees."""
        if self.tokens_learned is None:
            return None
        return self.tokens_learned / (self.rows * self.max_len) if self.rows else 0.0

    @property
    def rows_over_lower_bound(self) -> int:
        return self.rows - self.lower_bound_rows

    @property
    def unpacked_slots(self) -> int:
        """Slots if every segment were padded to max_len instead (one row each)."""
        return self.segments * self.max_len

    @property
    def padding_saved(self) -> float:
        """Fraction of the unpacked slots that packing saves."""
        return 1.0 - self.rows / self.segments if self.segments else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def _segment_items(
    lengths: np.ndarray, empty: np.ndarray, max_len: int, overflow: Overflow
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """Items of one encoded batch: (document index in batch, chunk number, item length).

    ``split``: consecutive chunks of ``max_len``, the remainder last; ``truncate``: the first
    ``max_len`` tokens; ``drop``: none. Empty documents give no item.
    """
    long = lengths > max_len
    if overflow is Overflow.SPLIT:
        n_items = np.where(empty, 0, np.maximum(1, -(-lengths // max_len)))
    elif overflow is Overflow.TRUNCATE:
        n_items = np.where(empty, 0, 1)
    else:
        n_items = np.where(empty | long, 0, 1)
    doc = np.repeat(np.arange(lengths.size), n_items)
    first = np.concatenate([[0], np.cumsum(n_items)[:-1]]) if lengths.size else n_items
    chunk = np.arange(doc.size) - np.repeat(first, n_items)
    item_len = np.minimum(lengths[doc] - chunk * max_len, max_len)
    counts = {
        "packed": int(np.count_nonzero(~empty & ~long)),
        "split": int(np.count_nonzero(~empty & long)) if overflow is Overflow.SPLIT else 0,
        "truncated": int(np.count_nonzero(~empty & long)) if overflow is Overflow.TRUNCATE else 0,
        "dropped": int(np.count_nonzero(~empty & long)) if overflow is Overflow.DROP else 0,
        "empty": int(np.count_nonzero(empty)),
        "tokens_truncated": int((lengths[~empty & long] - max_len).sum())
        if overflow is Overflow.TRUNCATE
        else 0,
        "tokens_dropped": int(lengths[~empty & long].sum()) if overflow is Overflow.DROP else 0,
    }
    return doc, chunk, item_len, counts


def _segment_labelled_items(
    encoded: EncodedBatch, max_len: int, overflow: Overflow
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int], np.ndarray]:
    """:func:`_segment_items` for examples with labels; also returns the labels to store.

    - The first token of every segment gets no label: nothing in its segment precedes it, and a
      model shifting labels would otherwise learn it from the segment before.
    - An example with no learned token (in what ``truncate`` keeps) is counted as empty.
    - Under ``split``, a chunk with no learned token is dropped and counted.
    """
    assert encoded.labels is not None
    lengths = encoded.lengths
    offsets = (np.cumsum(lengths) - lengths).astype(np.int64)
    labels = encoded.labels.copy()
    if overflow is Overflow.SPLIT:
        n_starts = -(-lengths // max_len)
    else:
        n_starts = (lengths > 0).astype(np.int64)
    first = (np.cumsum(n_starts) - n_starts).astype(np.int64)
    k = np.arange(int(n_starts.sum()), dtype=np.int64) - np.repeat(first, n_starts)
    labels[np.repeat(offsets, n_starts) + k * max_len] = IGNORE_INDEX
    learned = np.concatenate([[0], np.cumsum(labels != IGNORE_INDEX, dtype=np.int64)])
    kept = np.minimum(lengths, max_len) if overflow is Overflow.TRUNCATE else lengths
    no_labels = ~encoded.empty & (learned[offsets + kept] == learned[offsets])
    doc, chunk, item_len, counts = _segment_items(
        lengths, encoded.empty | no_labels, max_len, overflow
    )
    item_off = offsets[doc] + chunk.astype(np.int64) * max_len
    item_learned = learned[item_off + item_len] - learned[item_off]
    keep = item_learned > 0
    counts["learned"] = int(item_learned[keep].sum())
    counts["documents_without_labels"] = int(no_labels.sum())
    counts["chunks_without_labels_dropped"] = int((~keep).sum())
    counts["tokens_in_chunks_without_labels"] = int(item_len[~keep].sum())
    return doc[keep], chunk[keep], item_len[keep], counts, labels


def _cut(
    encoded: EncodedBatch, max_len: int, overflow: Overflow
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int], np.ndarray | None]:
    """Items of one encoded batch (document index in batch, chunk, length), the counts, and
    the labels to store with its tokens (``None`` for text)."""
    if encoded.labels is None:
        doc, chunk, item_len, counts = _segment_items(
            encoded.lengths, encoded.empty, max_len, overflow
        )
        return doc, chunk, item_len, counts, None
    return _segment_labelled_items(encoded, max_len, overflow)


_LABEL_COUNTS = (
    "learned",
    "documents_without_labels",
    "chunks_without_labels_dropped",
    "tokens_in_chunks_without_labels",
)

_DONE = object()


def _background(iterable: Iterable[Any], ahead: int = 2) -> Iterator[Any]:
    """Iterate ``iterable`` in a daemon thread, at most ``ahead`` items in advance.

    Order is kept. An exception in the thread is raised in the consumer; when the consumer
    stops early (error, Ctrl-C), the thread stops at its next item.
    """
    q: queue.Queue[Any] = queue.Queue(maxsize=ahead)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in iterable:
                if not put((True, item)):
                    return
        except BaseException as e:  # forwarded to the consumer
            put((False, e))
            return
        put((True, _DONE))

    thread = threading.Thread(target=run, daemon=True, name="packtool-stage")
    thread.start()
    try:
        while True:
            ok, item = q.get()
            if not ok:
                raise item
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()


def _ordered_map(fn: Callable[[Any], Any], items: Iterable[Any], *, workers: int) -> Iterator[Any]:
    """``fn`` over ``items`` in ``workers`` threads, results in input order, at most
    ``workers + 1`` items in flight. An exception is raised when its item's turn comes."""
    pending: collections.deque[concurrent.futures.Future[Any]] = collections.deque()
    pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="packtool")
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) > workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except BaseException:
        # An error, or a stop (SIGTERM): the caller cleans up without waiting for the items
        # in flight (a tokenizer call cannot be interrupted; their results are dropped).
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def _parse_size(size: str | int) -> int:
    if isinstance(size, int):
        return size
    text = size.strip().upper().replace("IB", "B")
    units = (("KB", 1 << 10), ("MB", 1 << 20), ("GB", 1 << 30), ("B", 1))
    number, factor = text, 1
    for unit, unit_factor in units:
        if text.endswith(unit):
            number, factor = text[: -len(unit)].strip(), unit_factor
            break
    try:
        value = int(float(number) * factor)
    except (ValueError, OverflowError):  # not a number, or infinite
        raise OptionError(f"--shard-size: cannot read {size!r} as a size (e.g. 256MB)") from None
    if value <= 0:
        raise OptionError(f"--shard-size must be positive, got {size!r}")
    return value


def pack(
    inputs: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    *,
    max_len: int,
    tokenizer: str | os.PathLike[str] | Tokenizer | None = None,
    text_field: str = "text",
    overflow: str | Overflow | None = None,
    add_eos: bool | None = None,
    bos: bool | None = None,
    eos_token: str | None = None,
    bos_token: str | None = None,
    pad_id: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    rows_per_shard: int | None = None,
    shard_size: str | int = DEFAULT_SHARD_BYTES,
    overwrite: bool = False,
    skip_bad_records: bool = False,
    split: str | None = None,
    txt_unit: str = "line",
    num_proc: int | None = None,
    resume: bool = False,
    progress: ProgressCallback | None = None,
    input_shape: str | InputShape = InputShape.AUTO,
    prompt_field: str = "prompt",
    completion_field: str = "completion",
    messages_field: str = "messages",
    chat_template: str | os.PathLike[str] | ChatTemplate | None = None,
    loss_on: str | LossOn | None = None,
    template_timeout: float | None = DEFAULT_TEMPLATE_TIMEOUT,
    files: Sequence[InputFile] | None = None,
    read: Callable[..., Iterable[TextBatch]] | None = None,
    extra_manifest: Mapping[str, Any] | None = None,
    allow_empty: bool = False,
) -> PackReport:
    """Pack ``inputs`` into rows of ``max_len`` tokens and write them to ``out_dir``.

    Documents are tokenized, EOS-terminated, split/truncated/dropped when longer than
    ``max_len`` (``overflow``), packed with first-fit-decreasing, shuffled with ``seed``
    (unless ``shuffle=False``), and written as Arrow shards plus a manifest (last). Returns a
    :class:`PackReport`. Raises :class:`~packtool.errors.PacktoolError` subclasses for user
    mistakes.

    Instruction data (``input_shape`` prompt-completion or chat, or detected by ``auto``; see
    :mod:`packtool.instruct` and docs/instruct.md) also gets a ``labels`` column: the learned
    tokens (``loss_on``), -100 elsewhere. ``overflow`` defaults to ``split`` for text and
    ``drop`` for instruction data; ``add_eos`` to on, except for chats. A chat template gets
    ``template_timeout`` seconds per record (``None``: no limit); a record it runs longer on
    is a bad record.

    For work units (``packtool.units``): ``files`` are inputs already resolved (then
    ``inputs`` is ignored; it may be empty), each read, for text inputs, with ``read(file,
    text_field=..., skip_bad_records=..., split=..., txt_unit=...)``; ``extra_manifest`` keys
    are added to the manifest; ``allow_empty`` writes an output of no rows when nothing is
    left to pack (a unit whose range is empty), which is otherwise an
    :class:`~packtool.errors.InputError`.
    """
    started = time.perf_counter()
    check_int("--max-len", max_len, 2, MAX_LEN_LIMIT)
    check_int("--seed", seed, 0, MAX_SEED)
    if overflow is not None:
        try:
            Overflow(overflow)
        except ValueError:
            raise OptionError(
                f"--overflow must be one of split, truncate, drop; got {overflow!r}"
            ) from None
    if rows_per_shard is not None:
        check_int("--rows-per-shard", rows_per_shard, 1, MAX_ROWS_PER_SHARD)
    if template_timeout is not None and not 0 < template_timeout <= _MAX_TEMPLATE_TIMEOUT:
        raise OptionError(
            f"--template-timeout must be more than 0 and at most {_MAX_TEMPLATE_TIMEOUT:g} "
            f"seconds, got {template_timeout:g}"
        )
    out_path = Path(out_dir)
    check_output_dir(out_path, overwrite)
    remove_stale_temporaries(out_path)
    skipped: list[Path] = []
    files = resolve_inputs(inputs, skipped=skipped) if files is None else list(files)
    tok: Tokenizer
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        tok = load_tokenizer(tokenizer, eos_token=eos_token, bos_token=bos_token)
    else:
        tok = tokenizer
    plan = plan_input(
        files,
        tok,
        input_shape=input_shape,
        text_field=text_field,
        prompt_field=prompt_field,
        completion_field=completion_field,
        messages_field=messages_field,
        chat_template=chat_template,
        loss_on=loss_on,
        overflow=overflow,
        add_eos=add_eos,
        bos=bos,
        split=split,
    )
    overflow, add_eos = plan.overflow, plan.add_eos
    if plan.template is not None and plan.template.timeout != template_timeout:
        template = dataclasses.replace(plan.template, timeout=template_timeout)
        plan.template = plan.encoder.template = template  # type: ignore[union-attr]
    if read is not None and plan.shape is not InputShape.TEXT:
        raise OptionError(
            f"--units packs text inputs only for now; these inputs are {plan.shape.value} "
            "records: pack them without --units"
        )
    pad_from = "--pad-id" if pad_id is not None else "tokenizer"
    if pad_id is None:
        pad_id = tok.special.pad_id
    if pad_id is None:
        pad_id, pad_from = tok.special.eos_id, "eos"
    if pad_id is None:
        raise OptionError(
            f"tokenizer {tok.name} has neither a pad nor an EOS token: choose one with --pad-id"
        )
    vocab_size = getattr(tok, "vocab_size", None)
    if pad_id < 0 or (vocab_size is not None and pad_id >= vocab_size):
        raise OptionError(
            f"--pad-id {pad_id} is not a token id of {tok.name} (0 to {vocab_size - 1})"
            if vocab_size is not None
            else f"--pad-id must be >= 0, got {pad_id}"
        )
    if txt_unit not in TXT_UNITS:
        raise OptionError(f"--txt-unit must be line, paragraph or document, got {txt_unit!r}")
    row_bytes = (3 if plan.labelled else 2) * 4 * max_len + 64
    if rows_per_shard is None:
        rows_per_shard = max(1, _parse_size(shard_size) // row_bytes)

    _set_threads(num_proc)

    fingerprint = _fingerprint(
        files,
        tok,
        max_len,
        text_field,
        overflow,
        add_eos,
        bos,
        pad_id,
        skip_bad_records,
        split,
        txt_unit,
        json.dumps(plan.describe(), sort_keys=True, default=str),
    )
    total_bytes = sum(f.size_bytes for f in files)

    with (
        lock_output(out_path),
        TokenStore(out_path, with_labels=plan.labelled, keep_on_error=resume) as store,
    ):
        saved = store.resume(fingerprint) if resume else None
        if not resume:
            store.start()
        state = _ReadState.from_json(saved) if saved else _ReadState()
        if not state.done:
            _read_and_tokenize(
                files,
                state,
                store,
                plan,
                fingerprint,
                read=read,
                read_options={
                    "skip_bad_records": skip_bad_records,
                    "split": split,
                    "txt_unit": txt_unit,
                },
                max_len=max_len,
                overflow=overflow,
                total_bytes=total_bytes,
                progress=progress,
            )
        counts = state.counts
        label_counts = state.label_counts
        counts.check()
        if counts.read and counts.bad_records_skipped == counts.read:
            first = state.bad_records[0] if state.bad_records else "?"
            raise InputError(
                f"all {counts.read:,} records were bad and skipped, so nothing was packed "
                f"(the first: {first})"
            )
        if store.num_items == 0 and not allow_empty:
            raise nothing_to_pack([f.path for f in files], counts, label_counts)
        items = store.items()
        item_off, item_len = items["offset"], items["length"]
        item_doc, item_chunk = items["doc_id"], items["chunk_id"]
        del items

        if progress:
            progress("pack", 0, int(item_len.size))
        row_of_item = first_fit_decreasing(item_len, max_len)
        order, row_starts = plan_rows(row_of_item, item_len)
        n_rows = int(row_starts.size - 1)
        if progress:
            progress("pack", int(item_len.size), int(item_len.size))
        output_order = (
            np.random.default_rng(seed).permutation(n_rows) if shuffle else np.arange(n_rows)
        )
        n_tokens = int(item_len.astype(np.int64).sum())
        with ShardWriter(
            out_path,
            max_len=max_len,
            num_rows=n_rows,
            rows_per_shard=rows_per_shard,
            with_labels=plan.labelled,
            overwrite=overwrite,
        ) as writer:
            # Rows are gathered, and written as Arrow record batches, _GATHER_BYTES at a
            # time: a block's rows hold documents from all over the store, so the store's
            # pages a block touches, like the blocks in flight (three: being gathered,
            # queued, being written), are bounded by the block size, not the corpus.
            block = max(1, min(rows_per_shard, _GATHER_BYTES // row_bytes))

            def gather_blocks() -> Iterator[tuple[int, Any]]:
                with store.reader() as source:
                    for start in range(0, n_rows, block):
                        plan_block = output_order[start : start + block]
                        yield (
                            start + plan_block.size,
                            gather_rows(
                                source,
                                item_off,
                                item_len,
                                item_doc,
                                item_chunk,
                                order,
                                row_starts,
                                plan_block,
                                max_len,
                                pad_id,
                            ),
                        )

            # Gathering (a thread; the copy kernel runs without the GIL) overlaps writing
            # (Arrow, hashing and file I/O, which release it too).
            for done, batch_out in _background(gather_blocks(), ahead=1):
                writer.write(batch_out)
                if progress:
                    progress("write", done, n_rows)
            if progress and n_rows == 0:
                progress("write", 0, 0)
            seconds = time.perf_counter() - started
            lower = lower_bound_rows(n_tokens, max_len)
            manifest = {
                "packtool_version": __version__,
                "created_unix": int(time.time()),
                "tokenizer": _describe_tokenizer(tok, pad_id, pad_from),
                "options": {
                    "max_len": max_len,
                    "text_field": text_field,
                    "overflow": overflow.value,
                    "add_eos": add_eos,
                    "bos": bos,
                    "pad_id": pad_id,
                    "shuffle": shuffle,
                    "seed": seed,
                    "rows_per_shard": rows_per_shard,
                    "skip_bad_records": skip_bad_records,
                    "split": split,
                    "txt_unit": txt_unit,
                    **plan.describe(),
                },
                "inputs": state.input_records,
                "documents": asdict(counts),
                "segments": int(item_len.size),
                "tokens": {
                    "packed": n_tokens,
                    "truncated_away": state.tokens_truncated,
                    "dropped": state.tokens_dropped,
                },
                "rows": n_rows,
                "lower_bound_rows": lower,
                "rows_over_lower_bound": n_rows - lower,
                "efficiency": n_tokens / (n_rows * max_len) if n_rows else 0.0,
                "bad_records": state.bad_records,
                "seconds": round(seconds, 3),
                **(extra_manifest or {}),
            }
            if plan.labelled:
                manifest["tokens"]["learned"] = label_counts["learned"]
                manifest["labels"] = _describe_labels(plan, label_counts)
            if isinstance(tok, HFTokenizer):
                tok_copy = writer.staging / "tokenizer.json"
                try:
                    tok_copy.write_bytes(tok.json_bytes)
                except OSError as e:
                    raise write_error(e, tok_copy, "cannot write the tokenizer copy") from e
            manifest = writer.commit(manifest)
    seconds = time.perf_counter() - started
    return PackReport(
        out_dir=out_path,
        max_len=max_len,
        documents=counts,
        segments=int(item_len.size),
        tokens=n_tokens,
        tokens_truncated=state.tokens_truncated,
        tokens_dropped=state.tokens_dropped,
        rows=n_rows,
        lower_bound_rows=lower,
        shards=len(manifest["shards"]),
        seconds=seconds,
        bad_records=state.bad_records,
        manifest=manifest,
        resumed=saved is not None,
        skipped_files=[str(p) for p in skipped],
        tokens_learned=label_counts["learned"] if plan.labelled else None,
    )


def nothing_to_pack(
    paths: Sequence[Path | str], counts: DocumentCounts, label_counts: Mapping[str, int]
) -> NothingToPackError:
    """The error for inputs that give no segment to pack, saying what became of what was
    read."""
    where = str(paths[0]) if len(paths) == 1 else f"{len(paths):,} inputs ({paths[0]}, ...)"
    if not counts.read:
        return NothingToPackError(f"no documents in {where}: nothing to pack")
    no_labels = label_counts.get("documents_without_labels", 0)  # counted as empty too
    why = [
        (counts.empty - no_labels, "empty (no tokens)"),
        (no_labels, "with nothing to learn"),
        (counts.dropped, "longer than --max-len, dropped (--overflow drop)"),
        (counts.bad_records_skipped, "bad and skipped"),
    ]
    told = ", ".join(f"{n:,} {what}" for n, what in why if n)
    return NothingToPackError(
        f"no documents to pack in {where}: of {counts.read:,} read, {told or 'none has tokens'}"
    )


@dataclass
class _ReadState:
    """Progress of the read + tokenize stage: what a checkpoint saves to resume from."""

    counts: DocumentCounts = field(default_factory=DocumentCounts)
    tokens_truncated: int = 0
    tokens_dropped: int = 0
    bad_records: list[str] = field(default_factory=list)
    input_records: list[dict[str, Any]] = field(default_factory=list)
    input_index: int = 0  # the input being read
    records_done: int = 0  # records of that input already in the store
    bytes_before: int = 0  # size of the inputs before it
    done: bool = False
    label_counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_LABEL_COUNTS, 0))

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "counts": asdict(self.counts)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> _ReadState:
        return cls(**{**data, "counts": DocumentCounts(**data["counts"])})


_CHECKPOINT_SECONDS = float(os.environ.get("PACKTOOL_CHECKPOINT_SECONDS", "10"))


def _fingerprint(files: Sequence[InputFile], tok: Tokenizer, *options: Any) -> str:
    """What the tokens and items depend on: inputs (path, size, mtime), tokenizer, options."""
    described = [[str(f.path.resolve()), f.size_bytes, f.path.stat().st_mtime_ns] for f in files]
    text = json.dumps([described, tok.sha256, [str(o) for o in options]])
    return hashlib.sha256(text.encode()).hexdigest()


def _read_and_tokenize(
    files: Sequence[InputFile],
    state: _ReadState,
    store: TokenStore,
    plan: InputPlan,
    fingerprint: str,
    *,
    read: Callable[..., Iterable[TextBatch]] | None = None,
    read_options: dict[str, Any],
    max_len: int,
    overflow: Overflow,
    total_bytes: int,
    progress: ProgressCallback | None,
) -> None:
    """Read every input from ``state`` on, tokenize, cut items, append to ``store``.

    Three stages overlap: reading (a thread), tokenizing (two threads; Rust, all cores,
    without the GIL), and, here, in order: flattening the ids, cutting items, appending to
    the store. A checkpoint is saved every few seconds and at the end.
    """
    start_input, skip = state.input_index, state.records_done

    def read_all() -> Iterator[tuple[int, TextBatch | RecordBatch | None]]:
        for index in range(start_input, len(files)):
            if read is not None:
                batches = read(files[index], text_field=plan.text_field, **read_options)
            else:
                batches = plan.read(files[index], **read_options)
            if index == start_input and skip:
                batches = skip_records(batches, skip)
            for batch in batches:
                yield index, batch
            yield index, None  # end of this input

    def encode_all() -> Iterator[tuple[int, TextBatch | RecordBatch | None, Any]]:
        skip_bad = read_options["skip_bad_records"]

        def tokenize(item: tuple[int, Any]) -> tuple[int, Any, Any]:
            index, batch = item
            # A record the chat template fails on becomes a bad record here (or stops the run).
            return index, batch, None if batch is None else plan.tokenize(batch, skip_bad)

        # Two batches in the tokenizer at once: while one call turns its results into Python
        # objects (holding the GIL, on one core), the other keeps the tokenizer's threads
        # busy (the stage went from 86% to 89% of the raw tokenizer's speed, median of four).
        batches = _background(read_all(), ahead=4)
        for index, batch, raw in _ordered_map(tokenize, batches, workers=2):
            yield index, batch, None if batch is None else plan.finish(raw)

    # The tokenizer threads need the GIL briefly around each batch (texts in, encodings out);
    # a short switch interval keeps them from waiting on this thread's NumPy work, which would
    # leave the tokenizer's workers idle (measured: 88% -> 91% of the raw speed).
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(min(switch_interval, 0.0005))
    try:
        _tokenize_loop(
            encode_all(),
            files,
            state,
            store,
            fingerprint,
            max_len,
            overflow,
            total_bytes,
            progress,
        )
    finally:
        sys.setswitchinterval(switch_interval)
    state.done = True
    store.checkpoint(fingerprint, state.to_json())


def _tokenize_loop(
    stream: Iterator[tuple[int, Any, EncodedBatch | None]],
    files: Sequence[InputFile],
    state: _ReadState,
    store: TokenStore,
    fingerprint: str,
    max_len: int,
    overflow: Overflow,
    total_bytes: int,
    progress: ProgressCallback | None,
) -> None:
    """The in-order stage of :func:`_read_and_tokenize`: cut items, store, checkpoint."""
    counts = state.counts
    last_checkpoint = time.monotonic()
    warming_up = False
    for index, batch, encoded in stream:
        inp = files[index]
        if batch is None:
            first_doc = counts.read - state.records_done
            state.input_records.append(_describe_input(inp, first_doc, state.records_done))
            state.bytes_before += inp.size_bytes
            state.input_index, state.records_done = index + 1, 0
            continue
        base_doc = counts.read
        counts.read += len(batch.records)
        state.records_done += len(batch.records)
        counts.bad_records_skipped += len(batch.bad)
        room = max(0, _BAD_RECORDS_KEPT - len(state.bad_records))
        state.bad_records.extend(str(e) for e in batch.bad[:room])
        good = np.flatnonzero(np.fromiter((r is not None for r in batch.records), bool))
        doc, chunk, item_len, c, labels = _cut(encoded, max_len, overflow)
        for key in ("packed", "split", "truncated", "dropped", "empty"):
            setattr(counts, key, getattr(counts, key) + c[key])
        state.tokens_truncated += c["tokens_truncated"]
        state.tokens_dropped += c["tokens_dropped"]
        for key in state.label_counts:
            state.label_counts[key] += c.get(key, 0)
        base = store.append(encoded.ids, labels)
        store.add_items(
            base + encoded.offsets[doc] + chunk.astype(np.int64) * max_len,
            item_len,
            base_doc + good[doc],
            chunk,
        )
        if not warming_up and store.num_items >= _WARM_UP_ITEMS:
            _warm_up_kernels()  # a large run: the compiled kernels will pay off
            warming_up = True
        if time.monotonic() - last_checkpoint >= _CHECKPOINT_SECONDS:
            store.checkpoint(fingerprint, state.to_json())
            last_checkpoint = time.monotonic()
        if progress:
            progress("tokenize", state.bytes_before + batch.bytes_done, total_bytes)


_WARM_UP_ITEMS = 500_000
_GATHER_BYTES = 8 << 20  # rows gathered (and written as one Arrow record batch) at a time


def _warm_up_kernels() -> None:
    """Load the compiled packing and gathering kernels in a thread while tokenizing runs.

    Loading costs ~0.85 s of CPU (numba's import, then each kernel's machine code from its
    on-disk cache at its first call). Smaller runs pack and gather with NumPy and slice
    copies instead, which is cheaper than that; from ``_WARM_UP_ITEMS`` items on, the kernels
    are loaded here, under tokenization, by calling both once on tiny inputs of the
    pipeline's own types (once loaded, FFD and the gather use them).
    """

    def load() -> None:
        with contextlib.suppress(Exception):  # no numba: both run without it
            first_fit_decreasing(np.array([3, 2, 2], np.int64), 4, backend="numba")
            warm_up_gather()

    threading.Thread(target=load, daemon=True, name="packtool-warm-up").start()


def _set_threads(num_proc: int | None) -> None:
    """Tokenizer threads: `tokenizers` reads RAYON_NUM_THREADS when its pool first starts.

    Set before the first encoding in the process (the CLI always is); later calls with another
    value cannot resize the pool. The output does not depend on it.
    """
    if num_proc is None:
        return
    check_int("--num-proc", num_proc, 1, MAX_NUM_PROC)
    os.environ["RAYON_NUM_THREADS"] = str(num_proc)


def _describe_input(inp: InputFile, first_doc: int, documents: int) -> dict[str, Any]:
    return {
        "path": str(inp.path),
        "kind": inp.kind,
        "compression": inp.compression,
        "size_bytes": inp.size_bytes,
        "first_doc": first_doc,
        "documents": documents,
    }


def _describe_labels(plan: Any, counts: dict[str, int]) -> dict[str, Any]:
    """The manifest's ``labels`` section (instruction data only)."""
    return {
        "loss_on": plan.loss_on.value,
        "learned_tokens": counts["learned"],
        "documents_without_labels": counts["documents_without_labels"],
        "chunks_without_labels_dropped": counts["chunks_without_labels_dropped"],
        "tokens_in_chunks_without_labels": counts["tokens_in_chunks_without_labels"],
        "piece_encoding": getattr(plan.encoder, "piece_encoding", "plain"),
    }


def _describe_tokenizer(tok: Tokenizer, pad_id: int, pad_from: str) -> dict[str, Any]:
    """The manifest's ``tokenizer``: its special tokens as used, ``pad_id`` being the id in
    the padding (``options.pad_id``), and ``pad_from`` saying where it comes from: the
    tokenizer's pad token, its EOS (it has no pad token), or ``--pad-id``."""
    if isinstance(tok, HFTokenizer):
        info = tok.describe()
        info["file"] = "tokenizer.json"
    else:
        info = {
            "name": tok.name,
            "sha256": tok.sha256,
            "special_tokens": {"eos_id": tok.special.eos_id, "bos_id": tok.special.bos_id},
        }
    info["special_tokens"]["pad_id"] = pad_id
    info["pad_from"] = pad_from
    return info
