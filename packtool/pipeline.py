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
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ._version import __version__
from .errors import InputError, OptionError
from .format import (
    CHAT_TEMPLATE_FILE,
    IGNORE_INDEX,
    TOKENIZER_CONFIG_FILE,
    DocumentCounts,
    Manifest,
    RunFigures,
    ShardWriter,
    TokenCounts,
    check_output_dir,
    check_store_output,
    publish,
    remove_stale_temporaries,
    row_bytes,
    write_dataset,
)
from .fs import AnyPath, StorePath, as_path
from .gather import gather_rows, warm_up_gather
from .instruct import InputPlan, InputShape
from .options import PackOptions
from .order import attention_costs, row_sums, stored_order
from .packing import (
    Overflow,
    RowPlan,
    cut_items,
    first_fit_decreasing,
    lower_bound_rows,
    plan_rows,
)
from .prepare import prepare
from .pretokenized import IdsTokenizer
from .readers import InputFile, RecordBatch, TextBatch, resolve_inputs, skip_records
from .reference import eos_appended, eos_note, probe_note, start_probe
from .store import TokenStore, lock_output
from .tokenize import (
    Backend,
    DocumentEncoder,
    EncodedBatch,
    HFTokenizer,
    Tokenizer,
    set_tokenizer_threads,
)

__all__ = ["DocumentCounts", "PackReport", "ProgressCallback", "pack"]

ProgressCallback = Callable[[str, int, "int | None"], None]
"""Called as ``progress(stage, completed, total)``; stages: ``tokenize`` (bytes of input),
``pack`` (items), ``write`` (rows). ``total`` is ``None`` when unknown."""

_BAD_RECORDS_KEPT = 20


@dataclass
class PackReport:
    """What ``pack`` did: counts, the packing figures and where the output is."""

    out_dir: AnyPath
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
    manifest: Manifest = field(default_factory=lambda: Manifest({}))
    resumed: bool = False  # continued from a checkpoint (``resume=True``)
    skipped_files: list[str] = field(default_factory=list)  # directory members not read
    tokens_learned: int | None = None  # tokens with a label (instruction data), else None
    special_strings: int = 0  # documents whose data held special-token strings
    parse_special: bool = False  # whether those strings were parsed as control tokens
    notices: list[str] = field(default_factory=list)  # e.g. the tokenizer file's settings
    backend: dict[str, Any] = field(default_factory=dict)  # the tokenizer backend, its version

    @classmethod
    def from_manifest(cls, out: AnyPath, manifest: Manifest, seconds: float) -> PackReport:
        """The report of the output whose manifest is ``manifest`` (a merge's, a pack's)."""
        tokens = manifest.tokens
        return cls(
            out_dir=out,
            max_len=manifest.max_len,
            documents=manifest.documents,
            segments=int(manifest.segments or 0),
            tokens=tokens.packed,
            tokens_truncated=tokens.truncated_away,
            tokens_dropped=tokens.dropped,
            rows=manifest.rows,
            lower_bound_rows=manifest.lower_bound_rows,
            shards=len(manifest.shards),
            seconds=seconds,
            bad_records=list(manifest.bad_records),
            manifest=manifest,
            special_strings=manifest.special_strings,
            parse_special=manifest.parse_special,
            notices=manifest.notices,
            tokens_learned=tokens.learned,
            backend=manifest.backend or {},
        )

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


def _cut(
    encoded: EncodedBatch, max_len: int, overflow: Overflow
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int], np.ndarray | None]:
    """Items of one encoded batch (document index in batch, chunk, length), the counts, and
    the labels to store with its tokens (``None`` for text)."""
    return cut_items(
        encoded.lengths, encoded.empty, encoded.labels, max_len, overflow, ignore=IGNORE_INDEX
    )


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


def pack(
    inputs: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    options: PackOptions | None = None,
    *,
    progress: ProgressCallback | None = None,
    files: Sequence[InputFile] | None = None,
    extra_manifest: Mapping[str, Any] | None = None,
    allow_empty: bool = False,
    **option_values: Any,
) -> PackReport:
    """Pack ``inputs`` into rows of ``max_len`` tokens and write them to ``out_dir``.

    ``options`` is a :class:`~packtool.options.PackOptions`; keyword arguments are its fields
    (``pack(inputs, out, max_len=4096, tokenizer="tok/")``) and override it. Documents are
    tokenized, EOS-terminated, split/truncated/dropped when longer than ``max_len``
    (``overflow``), packed with first-fit-decreasing, shuffled with ``seed`` (unless
    ``shuffle=False``), and written as Arrow shards plus a manifest (last). Returns a
    :class:`PackReport`. Raises :class:`~packtool.errors.PacktoolError` subclasses for user
    mistakes.

    Instruction data (``input_shape`` prompt-completion or chat, or detected by ``auto``; see
    :mod:`packtool.instruct` and docs/instruct.md) also gets a ``labels`` column: the learned
    tokens (``loss_on``), -100 elsewhere. ``overflow`` defaults to ``split`` for text and
    ``drop`` for instruction data; ``add_eos`` to on, except for chats. A chat template gets
    ``template_timeout`` seconds per record (``None``: no limit); a record it runs longer on
    is a bad record.

    Special-token strings in the data (``<|endoftext|>`` in a web page, ``<|im_end|>`` in a
    message) are encoded as the text they spell; ``parse_special=True`` makes them the control
    tokens instead (docs/tokenization.md). The tokenizer file's truncation and padding are
    always off.

    For work units (``packtool.units``): ``files`` are inputs already resolved (then
    ``inputs`` is ignored; it may be empty), whole or pieces of them
    (:class:`~packtool.readers.Piece`, read by the same readers); ``extra_manifest`` keys
    are added to the manifest; ``allow_empty`` writes an output of no rows when nothing is
    left to pack (a unit whose range is empty), which is otherwise a
    :class:`~packtool.errors.NothingToPackError`.
    """
    started = time.perf_counter()
    options = (options or PackOptions()).replace(**option_values)
    out = as_path(out_dir)
    if isinstance(out, StorePath):

        def pack_locally(local: Path, local_options: PackOptions) -> PackReport:
            return pack(
                inputs,
                local,
                local_options,
                progress=progress,
                files=files,
                extra_manifest=extra_manifest,
                allow_empty=allow_empty,
            )

        return _pack_to_store(out, options, pack_locally)
    run = _prepare(inputs, out, options, files)
    try:
        with (
            lock_output(run.out),
            TokenStore(
                run.out, with_labels=run.plan.labelled, keep_on_error=options.resume
            ) as store,
        ):
            state, resumed = _tokenize_stage(run, store, progress)
            if store.num_items == 0 and not allow_empty:
                raise state.counts.nothing_to_pack(
                    [f.path for f in run.files],
                    state.label_counts["documents_without_labels"],
                    state.bad_records,
                )
            placement = _plan_stage(store, run.options, progress)
            manifest = _write_stage(run, store, state, placement, started, progress, extra_manifest)
        stale = _STALE_CHECKPOINT.format(store.directory) if store.stale_checkpoint else None
        return _report(run, state, manifest, resumed, time.perf_counter() - started, stale)
    finally:
        if run.probe is not None:  # a run that failed does not wait for transformers' probe
            run.probe.stop()


_STALE_CHECKPOINT = (
    "--resume: the checkpoint in {} was made with other inputs, options or tokenizer (or an "
    "input changed since), so it was discarded and the run started over"
)


def _pack_to_store(
    out: StorePath, options: PackOptions, pack_locally: Callable[[Path, PackOptions], PackReport]
) -> PackReport:
    """``pack`` to a prefix on an object store: checked first (a probe write), packed into a
    local scratch directory (the token store and the shards stay on local disk), then
    published, shards first and the manifest last (:func:`packtool.format.publish`).

    The scratch directory is named after the URL, so a ``--resume`` run continues from the
    checkpoint an interrupted one kept there; it is removed once the output is published.
    """
    check_store_output(out, options.overwrite)
    digest = hashlib.sha256(str(out).encode()).hexdigest()[:16]
    scratch = Path(tempfile.gettempdir()) / f"packtool-store-{digest}"
    local = scratch / "out"
    if local.exists():  # finished here by a run killed while it published
        shutil.rmtree(local)
    published = False
    try:
        report = pack_locally(local, options.replace(overwrite=False))
        publish(local, out)
        published = True
    finally:
        shutil.rmtree(scratch if published or not options.resume else local, ignore_errors=True)
    report.out_dir = out
    return report


@dataclass(frozen=True)
class _Run:
    """What the stages of one ``pack`` share: the resolved options and what they decided."""

    out: Path
    options: PackOptions  # overflow, add_eos, pad_id, rows_per_shard resolved
    tok: Tokenizer
    plan: InputPlan
    files: list[InputFile]
    fingerprint: str
    pad_from: str  # where the pad id comes from: tokenizer, eos, --pad-id
    skipped: list[str]  # directory members of an unknown type, not read
    notice: str | None = None  # an option that does less than it says (--shard-size)
    probe: Any = None  # transformers' view of the tokenizer, being probed (reference.py)

    @property
    def row_bytes(self) -> int:
        return row_bytes(self.options.row_len, self.plan.labelled)


def _prepare(
    inputs: Sequence[str | os.PathLike[str]],
    out: Path,
    options: PackOptions,
    files: Sequence[InputFile] | None,
) -> _Run:
    """Check the options against the inputs and the tokenizer, before any work is done."""
    options.row_len  # noqa: B018  (a missing --max-len: one line, before any work)
    check_output_dir(out, options.overwrite)
    remove_stale_temporaries(out)
    skipped: list[Path] = []
    files = resolve_inputs(inputs, skipped=skipped) if files is None else list(files)
    prepared = prepare(files, options)
    options, tok, plan = prepared.options, prepared.tokenizer, prepared.plan
    pad_id, pad_from = _pad_id(options.pad_id, tok)
    one_row = row_bytes(options.row_len, plan.labelled)
    rows_per_shard = options.layout.shard_rows(one_row)
    notice = None
    if options.rows_per_shard is None and options.shard_bytes < one_row:
        notice = (
            f"--shard-size {options.shard_size} holds less than one row (about {one_row:,} "
            f"bytes at --max-len {options.max_len}): one row per shard"
        )
    resolved = options.replace(
        overflow=plan.overflow.value,
        add_eos=plan.add_eos,
        pad_id=pad_id,
        rows_per_shard=rows_per_shard,
    )
    set_tokenizer_threads(options.num_proc)
    fingerprint = _fingerprint(files, tok, resolved.rows_key(), plan.describe())
    skipped_names = [str(p) for p in skipped]
    probe = start_probe(tok)  # transformers' view of the tokenizer, in a process meanwhile
    return _Run(
        out, resolved, tok, plan, files, fingerprint, pad_from, skipped_names, notice, probe
    )


def _pad_id(pad_id: int | None, tok: Tokenizer) -> tuple[int, str]:
    """The id written in the padding, and where it comes from: ``--pad-id``, the tokenizer's
    pad token, or (it has none) its EOS."""
    pad_from = "--pad-id" if pad_id is not None else "tokenizer"
    if pad_id is None:
        pad_id = tok.special.pad_id
    if pad_id is None:
        pad_id, pad_from = tok.special.eos_id, "eos"
    if pad_id is None and isinstance(tok, IdsTokenizer):
        raise OptionError(
            "pre-tokenized data without --tokenizer: give the padding's id with --pad-id "
            "(or --eos-token ID, whose id pads)"
        )
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
    return int(pad_id), pad_from


def _tokenize_stage(
    run: _Run,
    store: TokenStore,
    progress: ProgressCallback | None,
) -> tuple[_ReadState, bool]:
    """Read, tokenize and store every input (or resume from a checkpoint): the read state,
    and whether it was resumed."""
    o = run.options
    saved = store.resume(run.fingerprint) if o.resume else None
    if not o.resume:
        store.start()
    state = _ReadState.from_json(saved) if saved else _ReadState()
    if not state.done:
        _read_and_tokenize(run, state, store, progress)
    state.counts.check()
    if state.counts.read and state.counts.bad_records_skipped == state.counts.read:
        first = state.bad_records[0] if state.bad_records else "?"
        raise InputError(
            f"all {state.counts.read:,} records were bad and skipped, so nothing was packed "
            f"(the first: {first})"
        )
    return state, saved is not None


@dataclass(frozen=True)
class _Placement:
    """The row plan, and the order rows are written in."""

    plan: RowPlan
    output_order: np.ndarray
    balance: dict[str, Any] | None = None  # the manifest's record, with --world-size

    @property
    def n_rows(self) -> int:
        return self.plan.n_rows

    @property
    def n_tokens(self) -> int:
        return int(self.plan.length.astype(np.int64).sum())


def _plan_stage(store: TokenStore, o: PackOptions, progress: ProgressCallback | None) -> _Placement:
    """First-fit-decreasing over the item lengths, then the order of the options' layout
    (the seeded row shuffle, or balanced steps)."""
    items = store.items()
    item_len = items["length"]
    if progress:
        progress("pack", 0, int(item_len.size))
    row_of_item = first_fit_decreasing(item_len, o.row_len)
    order, row_starts = plan_rows(row_of_item, item_len)
    n_rows = int(row_starts.size - 1)
    if progress:
        progress("pack", int(item_len.size), int(item_len.size))
    plan = RowPlan(items["offset"], item_len, items["doc_id"], items["chunk_id"], order, row_starts)
    seg_lengths, per_row = item_len[order], np.diff(row_starts)
    output_order, balance = stored_order(
        n_rows,
        lambda: (attention_costs(seg_lengths, per_row), row_sums(seg_lengths, per_row)),
        o.layout,
        where="the pack",
    )
    return _Placement(plan, output_order, balance)


def _write_stage(
    run: _Run,
    store: TokenStore,
    state: _ReadState,
    placement: _Placement,
    started: float,
    progress: ProgressCallback | None,
    extra_manifest: Mapping[str, Any] | None,
) -> Manifest:
    """Gather the rows from the store and write them in shards of the options' layout, then
    the manifest (last)."""
    o = run.options
    assert o.pad_id is not None
    rows_per_shard = o.layout.shard_rows(run.row_bytes)
    n_rows = placement.n_rows
    # Rows are gathered, and written as Arrow record batches, _GATHER_BYTES at a time: a
    # block's rows hold documents from all over the store, so the store's pages a block
    # touches, like the blocks in flight (three: being gathered, queued, being written), are
    # bounded by the block size, not the corpus.
    block = max(1, min(rows_per_shard, _GATHER_BYTES // run.row_bytes))

    def gather_blocks() -> Iterator[Any]:
        with store.reader() as source:
            for start in range(0, n_rows, block):
                plan_block = placement.output_order[start : start + block]
                yield gather_rows(source, placement.plan, plan_block, o.row_len, o.pad_id)

    writer = ShardWriter(
        run.out,
        max_len=o.row_len,
        num_rows=n_rows,
        rows_per_shard=rows_per_shard,
        with_labels=run.plan.labelled,
        overwrite=o.overwrite,
    )
    return write_dataset(
        writer,
        # Gathering (a thread; the copy kernel runs without the GIL) overlaps writing
        # (Arrow, hashing and file I/O, which release it too).
        _background(gather_blocks(), ahead=1),
        lambda: _manifest(run, state, placement, time.perf_counter() - started, extra_manifest),
        tokenizer=_tokenizer_files(run.tok, run.plan),
        progress=(lambda done: progress("write", done, n_rows)) if progress else None,
    )


def _tokenizer_files(tok: Tokenizer, plan: InputPlan) -> dict[str, bytes] | None:
    """What the output keeps of a Hugging Face tokenizer: its ``tokenizer.json``, the
    ``tokenizer_config.json`` it was loaded with (chat template, special tokens) and, as
    ``chat_template.jinja``, the chat template the chats were rendered with unless it came
    from that config (a ``--chat-template`` file, or the ``chat_template.jinja`` beside the
    tokenizer), so that ``AutoTokenizer.from_pretrained(OUT)`` loads the tokenizer and
    renders chats as they were packed, and ``verify`` finds the template."""
    if not isinstance(tok, HFTokenizer):
        return None
    files = {"tokenizer.json": tok.json_bytes}
    if tok.config:
        config = json.dumps(tok.config, indent=2, ensure_ascii=False) + "\n"
        files[TOKENIZER_CONFIG_FILE] = config.encode("utf-8")
    if plan.template is not None and plan.template.source != TOKENIZER_CONFIG_FILE:
        files[CHAT_TEMPLATE_FILE] = plan.template.text.encode("utf-8")
    return files


def _manifest(
    run: _Run,
    state: _ReadState,
    placement: _Placement,
    seconds: float,
    extra: Mapping[str, Any] | None,
) -> Manifest:
    o = run.options
    learned = state.label_counts["learned"] if run.plan.labelled else None
    return Manifest.for_pack(
        version=__version__,
        tokenizer={
            **_describe_tokenizer(run.tok, o.pad_id, run.pad_from),
            "backend": state.backend or _backend(run.plan).describe(),
            "eos_appended": eos_appended(run.tok, run.plan),
        },
        options={**o.describe(), **run.plan.describe()},
        inputs=state.input_records,
        figures=RunFigures(
            documents=state.counts,
            segments=int(placement.plan.length.size),
            tokens=TokenCounts(
                placement.n_tokens, state.tokens_truncated, state.tokens_dropped, learned
            ),
            rows=placement.n_rows,
            lower_bound_rows=lower_bound_rows(placement.n_tokens, o.row_len),
            max_len=o.row_len,
            bad_records=state.bad_records,
            special_strings=state.special_strings,
            parse_special=o.parse_special,
            seconds=seconds,
            segment_lengths=placement.plan.length,
        ),
        balance=placement.balance,
        labels=_describe_labels(run.plan, state.label_counts) if run.plan.labelled else None,
        extra=extra,
    )


def _report(
    run: _Run,
    state: _ReadState,
    manifest: Manifest,
    resumed: bool,
    seconds: float,
    resume_notice: str | None = None,
) -> PackReport:
    """The manifest's report, with what only the run knows: a resume, the directory members
    not read, the notices printed."""
    notices = (
        getattr(run.tok, "notice", None),
        *_backend(run.plan).notices,
        run.plan.notice,
        run.notice,
        resume_notice,
        eos_note(run.tok, run.plan),
        probe_note(run.probe),
    )
    return dataclasses.replace(
        PackReport.from_manifest(run.out, manifest, seconds),
        resumed=resumed,
        skipped_files=run.skipped,
        notices=[n for n in notices if n],
    )


def _backend(plan: InputPlan) -> Backend:
    """Which engine encoded the documents (instruction data: `tokenizers`, piece by piece;
    pre-tokenized ids: none)."""
    backend = getattr(plan.encoder, "backend", None)
    if backend is None:
        import tokenizers

        return Backend("hf", tokenizers.__version__, "instruction data is encoded in pieces")
    return backend  # type: ignore[no-any-return]


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
    documents_done: int = 0  # documents they made (more with --chat-turns each)
    bytes_before: int = 0  # size of the inputs before it
    done: bool = False
    label_counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_LABEL_COUNTS, 0))
    special_strings: int = 0  # documents whose data held special-token strings
    backend: dict[str, Any] | None = None  # the engine that encoded the stored work (Backend)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "counts": asdict(self.counts)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> _ReadState:
        return cls(**{**data, "counts": DocumentCounts(**data["counts"])})


_CHECKPOINT_SECONDS = float(os.environ.get("PACKTOOL_CHECKPOINT_SECONDS", "10"))


def _fingerprint(files: Sequence[InputFile], tok: Tokenizer, *options: Any) -> str:
    """What the tokens and items depend on: inputs (path, size, mtime), tokenizer, options
    (``PackOptions.rows_key()`` of the resolved options, and the input plan)."""
    described = [[str(f.path.resolve()), f.size_bytes, f.path.stat().st_mtime_ns] for f in files]
    text = json.dumps([described, tok.sha256, options], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _read_and_tokenize(
    run: _Run,
    state: _ReadState,
    store: TokenStore,
    progress: ProgressCallback | None,
) -> None:
    """Read every input from ``state`` on, tokenize, cut items, append to ``store``.

    Three stages overlap: reading (a thread), tokenizing (two threads; Rust, all cores,
    without the GIL), and, here, in order: flattening the ids, cutting items, appending to
    the store. A checkpoint is saved every few seconds and at the end.
    """
    files, plan, fingerprint, o = run.files, run.plan, run.fingerprint, run.options
    read_options = {
        "skip_bad_records": o.skip_bad_records,
        "split": o.split,
        "txt_unit": o.txt_unit,
    }
    start_input, skip = state.input_index, state.records_done
    before = (state.backend, state.counts.read)  # what a resumed checkpoint recorded

    def read_all() -> Iterator[tuple[int, TextBatch | RecordBatch | None]]:
        for index in range(start_input, len(files)):
            batches = plan.read(files[index], **read_options)
            if index == start_input and skip:
                batches = skip_records(batches, skip)
            huge = False
            for batch in batches:
                if huge:
                    _give_back_arrow_memory()
                for piece in _cut_by_size(batch, _BATCH_CHARS):
                    yield index, piece
                huge = _holds_a_huge_document(batch)
            if huge:
                _give_back_arrow_memory()
            yield index, None  # end of this input

    def encode_all() -> Iterator[tuple[int, TextBatch | RecordBatch | None, Any]]:
        skip_bad = read_options["skip_bad_records"]

        def tokenize(item: tuple[int, Any]) -> tuple[int, Any, Any]:
            index, batch = item
            if batch is None:
                return index, None, None
            # A record the chat template fails on becomes a bad record here (or stops the run).
            raw = plan.tokenize(batch, skip_bad)
            # Text: the flat ids are made here too (NumPy, a pure function of the batch), so
            # that this thread's work overlaps the in-order stage's store writes.
            return index, batch, plan.finish(raw) if text else raw

        # Two batches in the tokenizer at once: while one call turns its results into Python
        # objects (holding the GIL, on one core), the other keeps the tokenizer's threads
        # busy (the stage went from 86% to 89% of the raw tokenizer's speed, median of four).
        batches = _background(read_all(), ahead=4)
        text = plan.shape is InputShape.TEXT
        for index, batch, raw in _ordered_map(tokenize, batches, workers=2):
            yield index, batch, raw if batch is None or text else plan.finish(raw)

    # The tokenizer threads need the GIL briefly around each batch (texts in, encodings out);
    # a short switch interval keeps them from waiting on this thread's NumPy work, which would
    # leave the tokenizer's workers idle (measured: 88% -> 91% of the raw speed).
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(min(switch_interval, 0.0005))
    try:
        _tokenize_loop(encode_all(), run, state, store, progress, before)
    finally:
        sys.setswitchinterval(switch_interval)
    state.done = True
    _record_backend(run, state, before)
    store.checkpoint(fingerprint, state.to_json())


def _record_backend(
    run: _Run, state: _ReadState, before: tuple[dict[str, Any] | None, int]
) -> None:
    """Record in ``state`` (so in the checkpoint, then the manifest) the engine that encoded
    the stored work: a run resumed after all of it was encoded encodes nothing, and its own
    encoder's record ("hf", "no document to encode") would name the wrong one."""
    saved, read_before = before
    now = _backend(run.plan).describe()
    if saved is None or state.counts.read == read_before:  # nothing before, or nothing now
        state.backend = saved or now
        return
    summed = {k: (saved.get(k) or 0) + (now.get(k) or 0)
              for k in ("fallback_batches", "documents_checked")}  # fmt: skip
    cuts = (saved.get("inexact_cuts") or 0) + (now.get("inexact_cuts") or 0)
    if cuts:  # a key only where it happened (Backend.describe)
        summed["inexact_cuts"] = cuts
    if saved.get("name") != now["name"]:
        now["reason"] = (
            f"{now['reason']}; before --resume: {saved.get('name')} {saved.get('version')} "
            f"({saved.get('reason')})"
        )
    state.backend = {**now, **summed}


def _tokenize_loop(
    stream: Iterator[tuple[int, Any, EncodedBatch | None]],
    run: _Run,
    state: _ReadState,
    store: TokenStore,
    progress: ProgressCallback | None,
    before: tuple[dict[str, Any] | None, int],
) -> None:
    """The in-order stage of :func:`_read_and_tokenize`: cut items, store, checkpoint
    (``before``: the backend a resumed checkpoint recorded, and the documents read then)."""
    files, fingerprint, overflow = run.files, run.fingerprint, run.plan.overflow
    max_len = run.options.row_len
    total_bytes = sum(f.size_bytes for f in files)
    counts = state.counts
    last_checkpoint = time.monotonic()
    warming_up = False
    done_before = [state.bytes_before]
    if progress and isinstance(run.plan.encoder, DocumentEncoder):
        # One huge document is encoded in pieces: each piece moves the bar (characters for
        # bytes, below the batch's true end, which the batch's report then gives).
        run.plan.encoder.on_progress = lambda chars: progress(
            "tokenize", min(done_before[0] + chars, total_bytes), total_bytes
        )
    for index, batch, encoded in stream:
        inp = files[index]
        if batch is None:
            first_doc = counts.read - state.documents_done
            state.input_records.append(_describe_input(inp, first_doc, state.documents_done))
            state.bytes_before += inp.size_bytes
            state.input_index, state.records_done, state.documents_done = index + 1, 0, 0
            continue
        base_doc = counts.read
        counts.read += len(batch.records)
        records_read = getattr(batch, "records_read", None)
        state.records_done += len(batch.records) if records_read is None else records_read
        state.documents_done += len(batch.records)
        counts.bad_records_skipped += len(batch.bad)
        room = max(0, _BAD_RECORDS_KEPT - len(state.bad_records))
        state.bad_records.extend(str(e) for e in batch.bad[:room])
        good = getattr(batch, "good", None)  # pre-tokenized batches know theirs
        if good is None:
            good = np.flatnonzero(np.fromiter((r is not None for r in batch.records), bool))
        doc, chunk, item_len, c, labels = _cut(encoded, max_len, overflow)
        for key in ("packed", "split", "truncated", "dropped", "empty"):
            setattr(counts, key, getattr(counts, key) + c[key])
        state.tokens_truncated += c["tokens_truncated"]
        state.tokens_dropped += c["tokens_dropped"]
        state.special_strings += encoded.special_strings
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
            _record_backend(run, state, before)
            store.checkpoint(fingerprint, state.to_json())
            last_checkpoint = time.monotonic()
        if progress:
            done_before[0] = state.bytes_before + batch.bytes_done
            progress("tokenize", done_before[0], total_bytes)


_BATCH_CHARS = 4 << 20
"""Text in one tokenizer batch, at most (unless one document is longer): what is in flight
(the batches queued and in the tokenizer, and what a tokenizer makes of them) is bounded by
bytes, not by a count of documents, whatever their length."""


def _give_back_arrow_memory() -> None:
    """pyarrow's allocator (mimalloc) keeps what parsing a huge line freed, 2-3x the line,
    in the reading thread's heap: returned to the system from this thread, once the reader
    has moved past the line, while the tokenizer works on the document."""
    pa.default_memory_pool().release_unused()


def _holds_a_huge_document(batch: Any) -> bool:
    return (
        isinstance(batch, TextBatch)
        and len(batch.texts) == 1
        and len(batch.texts[0] or "") > _BATCH_CHARS
    )


def _cut_by_size(batch: Any, limit: int) -> Iterator[Any]:
    """``batch`` (of texts) in consecutive pieces of at most ``limit`` characters each (a
    longer document alone). Record batches (instruction data) pass as they are."""
    if not isinstance(batch, TextBatch) or len(batch.texts) < 2:
        yield batch
        return
    sizes = np.fromiter((len(t) if t else 0 for t in batch.texts), np.int64, len(batch.texts))
    if int(sizes.sum()) <= limit:
        yield batch
        return
    start, total = 0, 0
    pieces: list[TextBatch] = []
    for i, size in enumerate(sizes.tolist()):
        if i > start and total + size > limit:
            pieces.append(TextBatch(batch.texts[start:i], bytes_done=batch.bytes_done))
            start, total = i, 0
        total += size
    pieces.append(TextBatch(batch.texts[start:], bytes_done=batch.bytes_done))
    pieces[0].bad = batch.bad  # counted once, with the first piece
    yield from pieces


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


def _describe_tokenizer(tok: Tokenizer, pad_id: int | None, pad_from: str) -> dict[str, Any]:
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
        if getattr(tok, "vocab_size", None) is not None:  # pre-tokenized, --vocab-size
            info["vocab_size"] = tok.vocab_size
    info["special_tokens"]["pad_id"] = pad_id
    info["pad_from"] = pad_from
    return info
