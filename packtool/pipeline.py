"""``pack``: read -> tokenize -> store -> plan (FFD) -> shuffle -> gather -> write.

Only per-item lengths and offsets live in memory; tokens go to a temporary on-disk store and
rows are gathered from it. The plan is a pure function of the item lengths and the options,
so the output is deterministic.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .corpus import ReadState, background, encoder_backend, read_corpus
from .counts import Counts, DocumentCounts, LabelFigures, TokenCounts
from .errors import FormatError, InputError, OptionError
from .format import (
    CHAT_TEMPLATE_FILE,
    IGNORE_INDEX,
    TOKENIZER_CONFIG_FILE,
    LostChunks,
    Manifest,
    MixtureRecord,
    RunFigures,
    ShardWriter,
    check_output_dir,
    check_store_output,
    publish,
    remove_stale_temporaries,
    row_bytes,
    write_dataset,
)
from .fs import AnyPath, StorePath, as_path
from .gather import gather_rows, warm_up_gather
from .instruct import InputPlan
from .mixture import (
    MixtureMeasure,
    Source,
    SourceTake,
    UnitMixture,
    pick_items,
    plan_mixture,
    resolve_sources,
    source_documents,
)
from .options import PackOptions
from .order import attention_costs, row_sums, stored_order
from .packing import (
    Overflow,
    RowPlan,
    aligned_lengths,
    cut_items,
    first_fit_decreasing,
    lower_bound_rows,
    plan_rows,
    split_losses,
)
from .prepare import fingerprint_of, prepare
from .pretokenized import IdsTokenizer
from .readers import InputFile, refuse_inputs_in, resolve_inputs
from .reference import eos_appended, eos_note, probe_note, start_probe
from .repack import is_packed_output, packed_mixture
from .store import LOST_DTYPE, TokenStore, lock_output
from .tokenize import (
    EncodedBatch,
    HFTokenizer,
    Tokenizer,
    set_tokenizer_threads,
)

__all__ = ["DocumentCounts", "PackReport", "ProgressCallback", "pack"]

ProgressCallback = Callable[[str, int, "int | None"], None]
"""Called as ``progress(stage, completed, total)``; stages: ``tokenize`` (bytes of input),
``pack`` (items), ``write`` (rows). ``total`` is ``None`` when unknown."""


@dataclass
class PackReport:
    """What ``pack`` did: where the output is and what only the run knows (its time, a
    resume, the directory members not read, the notices printed); every figure is read from
    the output's :class:`~packtool.format.Manifest` (its :class:`~packtool.counts.Counts`)."""

    out_dir: AnyPath
    manifest: Manifest
    seconds: float
    resumed: bool = False  # continued from a checkpoint (``resume=True``)
    skipped_files: list[str] = field(default_factory=list)  # directory members not read
    notices: list[str] = field(default_factory=list)  # e.g. the tokenizer file's settings

    @classmethod
    def from_manifest(cls, out: AnyPath, manifest: Manifest, seconds: float) -> PackReport:
        """The report of the output whose manifest is ``manifest`` (a merge's, a pack's)."""
        return cls(out, manifest, seconds, notices=manifest.tokenizer.notices)

    @property
    def counts(self) -> Counts:
        """What became of the documents read, and their tokens."""
        return self.manifest.counts

    @property
    def documents(self) -> DocumentCounts:
        return self.counts.documents

    @property
    def tokens(self) -> int:
        """Real tokens in rows (``counts.tokens.packed``)."""
        return self.counts.tokens.packed

    @property
    def tokens_learned(self) -> int | None:
        """Tokens with a label (instruction data; ``counts.tokens.learned``), else None."""
        return self.counts.tokens.learned

    @property
    def max_len(self) -> int:
        return self.manifest.max_len

    @property
    def segments(self) -> int:
        return int(self.manifest.segments or 0)

    @property
    def rows(self) -> int:
        return self.manifest.rows or 0

    @property
    def lower_bound_rows(self) -> int:
        return self.manifest.lower_bound_rows or 0

    @property
    def shards(self) -> int:
        return len(self.manifest.shards)

    @property
    def bad_records(self) -> list[str]:
        return list(self.manifest.bad_records)

    @property
    def special_strings(self) -> int:
        """Documents whose data held special-token strings."""
        return self.manifest.special_strings.documents

    @property
    def parse_special(self) -> bool:
        """Whether those strings were parsed as control tokens."""
        return self.manifest.special_strings.parsed

    @property
    def backend(self) -> dict[str, Any]:
        """The tokenizer backend, its version (the manifest's record)."""
        backend = self.manifest.tokenizer.backend
        return dict(backend.record) if backend else {}

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


class _StoreSink:
    """``pack``'s sink (:func:`packtool.corpus.read_corpus`): each batch cut into items (the
    overflow policy; labels: :func:`~packtool.packing.cut_items`), its tokens (and labels)
    appended to the token store with the items, a checkpoint every few seconds."""

    def __init__(self, run: _Run, store: TokenStore) -> None:
        self.store, self.fingerprint = store, run.fingerprint
        self.max_len, self.overflow = run.options.row_len, run.plan.overflow
        self.last_checkpoint = time.monotonic()
        self.warming_up = False

    def add(self, encoded: EncodedBatch, doc_ids: np.ndarray) -> Counts:
        doc, chunk, item_len, counts, labels = cut_items(
            encoded.lengths, encoded.empty, encoded.labels, self.max_len, self.overflow,
            ignore=IGNORE_INDEX,
        )  # fmt: skip
        base = self.store.append(encoded.ids, labels)
        self.store.add_items(
            base + encoded.offsets[doc] + chunk.astype(np.int64) * self.max_len,
            item_len,
            doc_ids[doc],
            chunk,
        )
        if labels is not None and self.overflow is Overflow.SPLIT:  # what repack needs back
            l_doc, l_chunk, l_start, l_len, l_label = split_losses(
                encoded.lengths, encoded.empty, encoded.labels, self.max_len, doc, chunk,
                ignore=IGNORE_INDEX,
            )  # fmt: skip
            lost = np.empty(l_doc.size, LOST_DTYPE)
            lost["offset"], lost["length"], lost["label"] = base + l_start, l_len, l_label
            lost["doc_id"], lost["chunk_id"] = doc_ids[l_doc], l_chunk
            self.store.add_lost(lost)
        if not self.warming_up and self.store.num_items >= _WARM_UP_ITEMS:
            _warm_up_kernels()  # a large run: the compiled kernels will pay off
            self.warming_up = True
        return counts

    def checkpoint_due(self) -> bool:
        return time.monotonic() - self.last_checkpoint >= _CHECKPOINT_SECONDS

    def checkpoint(self, state: ReadState) -> None:
        self.store.checkpoint(self.fingerprint, state.to_json())
        self.last_checkpoint = time.monotonic()


def pack(
    inputs: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    options: PackOptions | None = None,
    *,
    progress: ProgressCallback | None = None,
    files: Sequence[InputFile] | None = None,
    extra_manifest: Mapping[str, Any] | None = None,
    allow_empty: bool = False,
    mixture: UnitMixture | None = None,
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
    :class:`~packtool.errors.NothingToPackError`. ``mixture``: a work unit's part of a
    mixture (its sources, and the documents it takes; :mod:`packtool.mixture`).
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
                mixture=mixture,
            )

        return _pack_to_store(out, options, pack_locally)
    run = _prepare(inputs, out, options, files, mixture)
    try:
        with (
            lock_output(run.out),
            TokenStore(
                run.out, with_labels=run.plan.labelled, keep_on_error=options.resume
            ) as store,
        ):
            state, resumed = _tokenize_stage(run, store, progress)
            if store.num_items == 0 and not allow_empty:
                labels = state.counts.labels
                raise state.counts.documents.nothing_to_pack(
                    [f.path for f in run.files],
                    labels.documents_without_labels if labels else 0,
                    state.bad_records,
                )
            items, source_of_item = store.items(), None
            if run.sources is not None:
                items, source_of_item, record = _mix_stage(run, state, items, store, mixture)
                extra_manifest = {**(extra_manifest or {}), "mixture": record}
            elif run.mixture is not None:  # a mixture repacked: its sources carried over
                items, source_of_item, record = _remix_stage(run, items, store)
                extra_manifest = {**(extra_manifest or {}), "mixture": record}
            placement = _plan_stage(items, run.options, progress, source_of_item)
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
    check_store_output(out, options.overwrite, options.resume)
    scratch = scratch_for(out)
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


def scratch_for(out: StorePath) -> Path:
    """The local directory a pack to ``out`` (a store prefix) works in: named after the URL,
    so that a ``--resume`` run (or a mixture's unit, measured then packed) finds the work
    store an earlier run kept there."""
    digest = hashlib.sha256(str(out).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"packtool-store-{digest}"


def measure(
    out_dir: str | os.PathLike[str],
    options: PackOptions,
    files: Sequence[InputFile],
    mixture: UnitMixture,
    *,
    index: int = 0,
) -> MixtureMeasure:
    """A mixture's work unit, before the mixture is planned: read and tokenize its ``files``
    (as :func:`pack` would, with the same options), and measure each source's documents (the
    tokens each puts into rows). The tokens stay in the unit's work store, checkpointed, so
    that :func:`pack` of the unit with ``resume`` packs them without tokenizing again (on
    another machine, whose disk does not hold that store, it tokenizes again)."""
    out = as_path(out_dir)
    local = out if isinstance(out, Path) else scratch_for(out) / "out"
    if isinstance(out, StorePath) and local.exists():
        shutil.rmtree(local)  # the store is beside it; a half-published output is not kept
    # overwrite: the measure writes no output (a finished unit, measured again, is kept)
    run = _prepare([], local, options.replace(resume=True, overwrite=True), files, mixture)
    try:
        with (
            lock_output(run.out),
            TokenStore(run.out, with_labels=run.plan.labelled, keep_on_error=True) as store,
        ):
            state, _ = _tokenize_stage(run, store, None)
            store.checkpoint(run.fingerprint, state.to_json())
            _, lengths, docs, read = _source_documents(run, state, store.items())
            if mixture.keep_tokens:
                store.keep()
    finally:
        if run.probe is not None:
            run.probe.stop()
    return MixtureMeasure(
        index, tuple(docs), tuple(lengths), tuple(int(r[0]) for r in read),
        tuple(int(r[1]) for r in read), int(state.counts.documents.read),
    )  # fmt: skip


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
    sources: tuple[Source, ...] | None = None  # --mix: the sources, in input order
    mixture: MixtureRecord | None = None  # the mixture of a mixed pack being repacked

    @property
    def row_bytes(self) -> int:
        return row_bytes(self.options.row_len, self.plan.labelled)


def _prepare(
    inputs: Sequence[str | os.PathLike[str]],
    out: Path,
    options: PackOptions,
    files: Sequence[InputFile] | None,
    mixture: UnitMixture | None = None,
) -> _Run:
    """Check the options against the inputs and the tokenizer, before any work is done."""
    options.row_len  # noqa: B018  (a missing --max-len: one line, before any work)
    check_output_dir(out, options.overwrite, options.resume)
    remove_stale_temporaries(out)
    skipped: list[Path] = []
    sources = None
    if options.mix is not None:
        if files is not None:  # a work unit: its part of the mixture says its sources
            if mixture is None:
                raise OptionError("--mix with --units: run the units with packtool.pack_units")
            sources = list(mixture.sources)
        else:
            files, sources = resolve_sources(
                inputs, options.mix, lambda spec: resolve_inputs([spec], skipped=skipped)
            )
    files = resolve_inputs(inputs, skipped=skipped) if files is None else list(files)
    refuse_inputs_in(files, out)
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
    fingerprint = fingerprint_of(files, tok, resolved.rows_key(), plan.describe())
    skipped_names = [str(p) for p in skipped]
    # transformers' view of the tokenizer, in a process meanwhile (ids: nothing is tokenized)
    probe = start_probe(tok) if resolved.ids_field is None else None
    return _Run(
        out, resolved, tok, plan, files, fingerprint, pad_from, skipped_names, notice, probe,
        tuple(sources) if sources is not None else None,
        packed_mixture(files) if sources is None else None,
    )  # fmt: skip


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
) -> tuple[ReadState, bool]:
    """Read, tokenize and store every input (or resume from a checkpoint): the read state,
    and whether it was resumed."""
    o = run.options
    saved = store.resume(run.fingerprint) if o.resume else None
    if not o.resume:
        store.start()
    state = ReadState.from_json(saved) if saved else ReadState()
    if not state.done:
        read_corpus(run.files, run.plan, o, _StoreSink(run, store), state, progress)
    documents = state.counts.documents
    documents.check()
    if documents.read and documents.bad_records_skipped == documents.read:
        first = state.bad_records[0] if state.bad_records else "?"
        raise InputError(
            f"all {documents.read:,} records were bad and skipped, so nothing was packed "
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


def _source_documents(
    run: _Run, state: ReadState, items: np.ndarray
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray], list[tuple[int, int]]]:
    """Each item's doc id, and per source: the tokens each of its documents puts into rows,
    those documents' ids, and the doc-id range ``(first, end)`` of the documents it read."""
    assert run.sources is not None
    doc_id = items["doc_id"].astype(np.int64)
    records = state.input_records
    read = []
    for src in run.sources:
        first = records[src.first_file]["first_doc"] if src.first_file < len(records) else 0
        end = sum(r["documents"] for r in records[src.first_file : src.end_file]) + first
        read.append((int(first), int(end)))
    docs, lengths = source_documents(doc_id, items["length"], read)
    return doc_id, lengths, docs, read


def _mix_stage(
    run: _Run,
    state: ReadState,
    items: np.ndarray,
    store: TokenStore,
    part: UnitMixture | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """``--mix``: the items of the documents each source gives (:func:`plan_mixture`, from
    the tokens each document puts into rows), repeats included, and the manifest's
    ``mixture`` record.

    A document taken ``k`` times is in the rows ``k`` times, exactly; copy ``c`` (0-based)
    of document ``d`` has the doc id ``d + c * stride`` (``stride``: the documents read), so
    every ``(doc_id, chunk_id)`` is still once in the rows and ``doc_id % stride`` is the
    document read. Each item also gets its source's index (the ``source_ids`` column).

    A work unit (``part``) takes the documents the plan over every unit gave it
    (:func:`~packtool.mixture.plan_unit_mixtures`); its record holds its own figures (its doc
    ids its own, the stride and targets the whole mixture's), which the merge adds up."""
    assert run.sources is not None
    o = run.options
    doc_id, lengths, docs, read = _source_documents(run, state, items)
    if part is None:
        stride = max(1, int(state.counts.documents.read))
        files = [src.end_file - src.first_file for src in run.sources]
        plan = plan_mixture(
            lengths, [s.weight for s in run.sources], o.tokens, seed=o.seed, repeat=o.repeat,
            names=[s.path for s in run.sources],
        )  # fmt: skip
    else:
        assert part.taken is not None
        stride, files = part.stride, list(part.files)
        plan = []
        for x, ids, t, target in zip(lengths, docs, part.taken, part.targets, strict=True):
            at = np.searchsorted(ids, t).astype(np.int64)
            plan.append(SourceTake(at, target, int(x.sum()), int(x[at].sum()), int(x.size)))
    taken = [ids[take.indices] for ids, take in zip(docs, plan, strict=True)]
    at, copy_of_item, source = pick_items(doc_id, taken)
    learned = _learned_of(store, items, at) if run.plan.labelled else None
    out = items[at].copy()
    out["doc_id"] = out["doc_id"] + copy_of_item * stride
    record = {
        "doc_id_stride": stride,
        "copies": int(copy_of_item.max()) + 1 if copy_of_item.size else 0,
        "tokens": int(sum(t.tokens_taken for t in plan)),
        **({"learned_tokens": learned} if learned is not None else {}),
        "repeat": o.repeat,
        "sources": [
            {
                "index": i,
                "path": src.path,
                "weight": src.weight,
                "share": round(src.weight / sum(s.weight for s in run.sources), 6),
                "files": files[i],
                "first_doc": int(read[i][0]),
                "documents_read": int(read[i][1] - read[i][0]),
                "documents_packable": int(take.documents_read),
                "tokens_read": take.tokens_read,
                "target_tokens": take.target,
                "documents_taken": take.documents_taken,
                "tokens_taken": take.tokens_taken,
                "epochs": take.epochs,
            }
            for i, (src, take) in enumerate(zip(run.sources, plan, strict=True))
        ],
    }
    return out, source.astype(np.int32), record


def _remix_stage(
    run: _Run, items: np.ndarray, store: TokenStore
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """A mixed pack repacked: its documents (each copy under its own doc id ``d + c *
    stride``, as the rows held it) in the order :func:`_mix_stage` gives them (by document
    read, then copy, then chunk), each item with the source its doc id falls in, and the
    pack's ``mixture`` record, what was taken counted again from these items (the same, unless
    the new overflow policy dropped or cut some)."""
    mixture = run.mixture
    assert mixture is not None
    stride = max(1, mixture.doc_id_stride)
    doc = items["doc_id"].astype(np.int64)
    order = np.lexsort((doc // stride, doc % stride))  # stable: a document's chunks in order
    out = items[order]
    read_doc = out["doc_id"].astype(np.int64) % stride
    first = np.array([s.first_doc for s in mixture.sources], np.int64)
    source = np.searchsorted(first, read_doc, side="right") - 1
    inside = source >= 0
    inside[inside] = (
        read_doc[inside] - first[source[inside]]
        < np.array([s.documents_read for s in mixture.sources], np.int64)[source[inside]]
    )
    if not inside.all():
        bad = int(out["doc_id"][np.flatnonzero(~inside)[0]])
        raise FormatError(
            f"{run.files[0].path}: doc id {bad} is in none of its mixture's sources "
            "(run `packtool verify`)"
        )
    length = out["length"].astype(np.int64)
    sources = []
    for i, src in enumerate(mixture.sources):
        mine = source == i
        taken = int(length[mine].sum())
        sources.append(
            dataclasses.replace(
                src,
                documents_taken=int(np.unique(out["doc_id"][mine]).size),
                tokens_taken=taken,
                epochs=round(taken / src.tokens_read, 6) if src.tokens_read else 0.0,
            )
        )
    learned = _learned_of(store, out, np.arange(out.size)) if run.plan.labelled else None
    record = dataclasses.replace(
        mixture, tokens=int(length.sum()), learned_tokens=learned, sources=tuple(sources)
    )
    return out, source.astype(np.int32), record.to_record()


def _learned_of(store: TokenStore, items: np.ndarray, taken: np.ndarray) -> int:
    """The learned tokens (labels) of the items ``taken`` (indices, repeats counted)."""
    unique, times = np.unique(taken, return_counts=True)
    with store.reader() as source:
        _, labels, offsets = source.read_ranges(items["offset"][unique], items["length"][unique])
    assert labels is not None
    learned = np.concatenate([[0], np.cumsum(labels != IGNORE_INDEX)])
    length = items["length"][unique].astype(np.int64)
    per_item = learned[offsets + length] - learned[offsets]
    return int((per_item * times).sum())


def _plan_stage(
    items: np.ndarray,
    o: PackOptions,
    progress: ProgressCallback | None,
    source_id: np.ndarray | None = None,
) -> _Placement:
    """First-fit-decreasing over the item lengths, then the order of the options' layout
    (the seeded row shuffle, or balanced steps)."""
    item_len = items["length"]
    if progress:
        progress("pack", 0, int(item_len.size))
    spans = aligned_lengths(item_len, o.alignment)  # FFD packs the padded lengths
    row_of_item = first_fit_decreasing(spans, o.row_len)
    order, row_starts = plan_rows(row_of_item, spans)
    n_rows = int(row_starts.size - 1)
    if progress:
        progress("pack", int(item_len.size), int(item_len.size))
    plan = RowPlan(
        items["offset"], item_len, items["doc_id"], items["chunk_id"], order, row_starts, source_id
    )
    seg_lengths, per_row = spans[order], np.diff(row_starts)
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
    state: ReadState,
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
                yield gather_rows(
                    source, placement.plan, plan_block, o.row_len, o.pad_id, align=o.alignment
                )

    writer = ShardWriter(
        run.out,
        max_len=o.row_len,
        num_rows=n_rows,
        rows_per_shard=rows_per_shard,
        with_labels=run.plan.labelled,
        overwrite=o.overwrite,
        aligned=o.alignment > 1,
        sources=run.sources is not None or run.mixture is not None,
    )
    return write_dataset(
        writer,
        # Gathering (a thread; the copy kernel runs without the GIL) overlaps writing
        # (Arrow, hashing and file I/O, which release it too).
        background(gather_blocks(), ahead=1),
        lambda: _manifest(run, state, placement, time.perf_counter() - started, extra_manifest),
        tokenizer=_tokenizer_files(run.tok, run.plan),
        progress=(lambda done: progress("write", done, n_rows)) if progress else None,
        repack=lambda: _lost_chunks(run, store),
    )


def _lost_chunks(run: _Run, store: TokenStore) -> LostChunks | None:
    """The repack record of a labelled split pack (:mod:`packtool.format.chunks`: the chunks'
    first labels and the chunks with nothing to learn, that its rows do not hold), empty when
    it split nothing (so that its repack is known exact, not taken for an older pack's); None
    for every other pack, which keeps its bytes."""
    if not run.plan.labelled or run.plan.overflow is not Overflow.SPLIT:
        return None
    lost = store.lost()
    if run.mixture is not None and lost.size:  # a mixed pack repacked: its copies' doc ids
        stride = max(1, run.mixture.doc_id_stride)
        order = np.argsort(lost["doc_id"], kind="stable")  # each document's copy 0 first
        lost = lost[order]
        read = lost["doc_id"] % stride
        key = read.astype(np.int64) * (int(lost["chunk_id"].max()) + 1) + lost["chunk_id"]
        _, first = np.unique(key, return_index=True)  # one entry per document read: the
        lost = lost[np.sort(first)]  # record's rows go with each copy (format.md)
        lost["doc_id"] = lost["doc_id"] % stride
    if not lost.size:
        return LostChunks.empty()
    with store.reader() as source:
        tokens, _, at = source.read_ranges(lost["offset"], lost["length"])
    lengths = lost["length"].astype(np.int64)
    flat = np.repeat(at - (np.cumsum(lengths) - lengths), lengths)
    tokens = tokens[flat + np.arange(int(lengths.sum()), dtype=np.int64)]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return LostChunks(lost["doc_id"], lost["chunk_id"], lost["label"], offsets, tokens).sorted()


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
    beside = getattr(tok, "directory", None)
    if plan.template is None and beside is not None and is_packed_output(beside):
        kept = beside / CHAT_TEMPLATE_FILE  # a repack: the template its chats were rendered with
        if kept.is_file():
            files[CHAT_TEMPLATE_FILE] = kept.read_bytes()
    return files


def _manifest(
    run: _Run,
    state: ReadState,
    placement: _Placement,
    seconds: float,
    extra: Mapping[str, Any] | None,
) -> Manifest:
    o = run.options
    counts = state.counts
    if run.plan.labelled:  # counted even where no batch was (an empty unit)
        counts = Counts(labels=LabelFigures(), tokens=TokenCounts(learned=0)) + counts
    mixture = (extra or {}).get("mixture")
    if mixture is not None:  # the rows hold the documents taken (the documents: as read)
        tokens = dataclasses.replace(
            counts.tokens,
            packed=mixture["tokens"],
            learned=mixture.get("learned_tokens", counts.tokens.learned),
        )
        counts = dataclasses.replace(counts, tokens=tokens)
    return Manifest.for_pack(
        tokenizer={
            **_describe_tokenizer(run.tok, o.pad_id, run.pad_from),
            "backend": state.backend or encoder_backend(run.plan).describe(),
            "eos_appended": eos_appended(run.tok, run.plan),
        },
        options={
            **o.describe(),
            **run.plan.describe(),
            # only when given, so that the packs made before the option still verify
            **({"pad_to_multiple_of": o.alignment} if o.alignment > 1 else {}),
        },
        inputs=state.input_records,
        figures=RunFigures(
            counts=counts,
            segments=int(placement.plan.length.size),
            rows=placement.n_rows,
            lower_bound_rows=lower_bound_rows(counts.tokens.packed, o.row_len),
            max_len=o.row_len,
            bad_records=state.bad_records,
            special_strings=state.special_strings,
            parse_special=o.parse_special,
            seconds=seconds,
            segment_lengths=placement.plan.length,
        ),
        balance=placement.balance,
        labels=_describe_labels(run.plan, counts) if counts.labels else None,
        extra=extra,
    )


def _report(
    run: _Run,
    state: ReadState,
    manifest: Manifest,
    resumed: bool,
    seconds: float,
    resume_notice: str | None = None,
) -> PackReport:
    """The manifest's report, with what only the run knows: a resume, the directory members
    not read, the notices printed."""
    notices = (
        getattr(run.tok, "notice", None),
        *encoder_backend(run.plan).notices,
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


_CHECKPOINT_SECONDS = float(os.environ.get("PACKTOOL_CHECKPOINT_SECONDS", "10"))


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


def _describe_labels(plan: Any, counts: Counts) -> dict[str, Any]:
    """The manifest's ``labels`` section (instruction data only)."""
    return {
        "loss_on": plan.loss_on.value,
        "learned_tokens": counts.tokens.learned,
        **asdict(counts.labels),  # type: ignore[call-overload]
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
