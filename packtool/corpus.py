"""The read + encode loop over a corpus, into a sink: the one corpus path.

``pack`` and ``stats`` of a corpus read and encode their inputs through :func:`read_corpus`,
prepared by the same prepare stage (:func:`packtool.prepare.prepare`); only the sink
differs: ``pack``'s cuts each batch into items and appends them to the token store,
``stats``' keeps the documents' lengths (and what of them is learned). The loop counts what
the readers count (documents read, bad records, special-token strings, the inputs'
records) in a :class:`ReadState`, which is also what ``pack --resume`` saves.

Three stages overlap: reading (a thread), tokenizing (two threads; Rust, all cores, without
the GIL), and, in order: flattening the ids and handing each batch to the sink.
"""

from __future__ import annotations

import collections
import concurrent.futures
import queue
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from .counts import Counts
from .instruct import InputPlan, InputShape
from .options import PackOptions
from .readers import InputFile, RecordBatch, TextBatch, skip_records
from .tokenize import Backend, DocumentEncoder, EncodedBatch

__all__ = ["ReadState", "Sink", "background", "encoder_backend", "ordered_map", "read_corpus"]

ProgressCallback = Callable[[str, int, "int | None"], None]

BAD_RECORDS_KEPT = 20  # the first bad records a run keeps (and reports)


class Sink(Protocol):
    """Where the loop puts each encoded batch."""

    def add(self, encoded: EncodedBatch, doc_ids: np.ndarray) -> Counts:
        """Take one encoded batch (``doc_ids``: the corpus-wide number of each document);
        return the counts of what became of its documents and tokens."""

    def checkpoint_due(self) -> bool:
        """Whether to save a checkpoint now (asked after each batch)."""

    def checkpoint(self, state: ReadState) -> None:
        """Save ``state``, the state to resume from (when due, and at the end)."""


@dataclass
class ReadState:
    """Progress of the read + encode loop: what a checkpoint saves to resume from."""

    counts: Counts = field(default_factory=Counts)
    bad_records: list[str] = field(default_factory=list)
    input_records: list[dict[str, Any]] = field(default_factory=list)
    input_index: int = 0  # the input being read
    records_done: int = 0  # records of that input already in the sink
    documents_done: int = 0  # documents they made (more with --chat-turns each)
    bytes_before: int = 0  # size of the inputs before it
    done: bool = False
    special_strings: int = 0  # documents whose data held special-token strings
    backend: dict[str, Any] | None = None  # the engine that encoded the work (Backend)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "counts": self.counts.to_record()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReadState:
        return cls(**{**data, "counts": Counts.from_record(data["counts"])})


def read_corpus(
    files: Sequence[InputFile],
    plan: InputPlan,
    options: PackOptions,
    sink: Sink,
    state: ReadState,
    progress: ProgressCallback | None = None,
) -> ReadState:
    """Read every input from ``state`` on (a fresh one: from the start), encode it by
    ``plan`` and hand each batch to ``sink``; ``state`` holds the counts at the end.

    ``options``: how the inputs are read (``skip_bad_records``, ``split``, ``txt_unit``)."""
    before = (state.backend, state.counts.documents.read)  # what a resumed state recorded
    stream = _encoded(files, plan, options, state.input_index, state.records_done)
    # The tokenizer threads need the GIL briefly around each batch (texts in, encodings out);
    # a short switch interval keeps them from waiting on this thread's NumPy work, which would
    # leave the tokenizer's workers idle (measured: 88% -> 91% of the raw speed).
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(min(switch_interval, 0.0005))
    try:
        _in_order(stream, files, plan, state, sink, progress, before)
    finally:
        sys.setswitchinterval(switch_interval)
    state.done = True
    _record_backend(plan, state, before)
    sink.checkpoint(state)
    return state


_Encoded = tuple[int, "TextBatch | RecordBatch | None", Any]


def _encoded(
    files: Sequence[InputFile], plan: InputPlan, o: PackOptions, start_input: int, skip: int
) -> Iterator[_Encoded]:
    """(input index, batch, its encoding) of every batch from input ``start_input``'s record
    ``skip`` on; ``(index, None, None)`` at the end of each input."""

    def read_all() -> Iterator[tuple[int, TextBatch | RecordBatch | None]]:
        for index in range(start_input, len(files)):
            batches = plan.read(
                files[index],
                skip_bad_records=o.skip_bad_records,
                split=o.split,
                txt_unit=o.txt_unit,
            )
            if index == start_input and skip:
                batches = skip_records(batches, skip)
            huge = False
            for batch in batches:
                if huge:
                    _give_back_arrow_memory()
                yield from ((index, piece) for piece in _cut_by_size(batch, _BATCH_CHARS))
                huge = _holds_a_huge_document(batch)
            if huge:
                _give_back_arrow_memory()
            yield index, None  # end of this input

    text = plan.shape is InputShape.TEXT

    def tokenize(item: tuple[int, Any]) -> _Encoded:
        index, batch = item
        if batch is None:
            return index, None, None
        # A record the chat template fails on becomes a bad record here (or stops the run).
        raw = plan.tokenize(batch, o.skip_bad_records)
        # Text: the flat ids are made here too (NumPy, a pure function of the batch), so
        # that this thread's work overlaps the in-order stage's sink.
        return index, batch, plan.finish(raw) if text else raw

    # Two batches in the tokenizer at once: while one call turns its results into Python
    # objects (holding the GIL, on one core), the other keeps the tokenizer's threads
    # busy (the stage went from 86% to 89% of the raw tokenizer's speed, median of four).
    batches = background(read_all(), ahead=4)
    for index, batch, raw in ordered_map(tokenize, batches, workers=2):
        yield index, batch, raw if batch is None or text else plan.finish(raw)


def _in_order(
    stream: Iterator[_Encoded],
    files: Sequence[InputFile],
    plan: InputPlan,
    state: ReadState,
    sink: Sink,
    progress: ProgressCallback | None,
    before: tuple[dict[str, Any] | None, int],
) -> None:
    """The in-order stage of :func:`read_corpus`: count, hand each batch to the sink,
    checkpoint (``before``: the backend a resumed state recorded, and the documents read
    then)."""
    total_bytes = sum(f.size_bytes for f in files)
    done_before = [state.bytes_before]
    if progress and isinstance(plan.encoder, DocumentEncoder):
        # One huge document is encoded in pieces: each piece moves the bar (characters for
        # bytes, below the batch's true end, which the batch's report then gives).
        plan.encoder.on_progress = lambda chars: progress(
            "tokenize", min(done_before[0] + chars, total_bytes), total_bytes
        )
    for index, batch, encoded in stream:
        if batch is None:
            _end_of_input(state, files[index], index)
            continue
        base_doc = state.counts.documents.read
        records_read = getattr(batch, "records_read", None)
        state.records_done += len(batch.records) if records_read is None else records_read
        state.documents_done += len(batch.records)
        room = max(0, BAD_RECORDS_KEPT - len(state.bad_records))
        state.bad_records.extend(str(e) for e in batch.bad[:room])
        good = getattr(batch, "good", None)  # pre-tokenized batches know theirs
        if good is None:
            good = np.flatnonzero(np.fromiter((r is not None for r in batch.records), bool))
        counts = sink.add(encoded, base_doc + good)
        state.counts += counts.add_documents(len(batch.records) - good.size, len(batch.bad))
        state.special_strings += encoded.special_strings
        if sink.checkpoint_due():
            _record_backend(plan, state, before)
            sink.checkpoint(state)
        if progress:
            done_before[0] = state.bytes_before + batch.bytes_done
            progress("tokenize", done_before[0], total_bytes)


def _end_of_input(state: ReadState, inp: InputFile, index: int) -> None:
    """Record input ``index`` as read: the documents it gave, where the next one starts."""
    first_doc = state.counts.documents.read - state.documents_done
    state.input_records.append(
        {
            "path": str(inp.path),
            "kind": inp.kind,
            "compression": inp.compression,
            "size_bytes": inp.size_bytes,
            "first_doc": first_doc,
            "documents": state.documents_done,
        }
    )
    state.bytes_before += inp.size_bytes
    state.input_index, state.records_done, state.documents_done = index + 1, 0, 0


def encoder_backend(plan: InputPlan) -> Backend:
    """Which engine encodes the documents (instruction data: `tokenizers`, piece by piece;
    pre-tokenized ids: none)."""
    backend = getattr(plan.encoder, "backend", None)
    if backend is None:
        import tokenizers

        return Backend("hf", tokenizers.__version__, "instruction data is encoded in pieces")
    return backend  # type: ignore[no-any-return]


def _record_backend(
    plan: InputPlan, state: ReadState, before: tuple[dict[str, Any] | None, int]
) -> None:
    """Record in ``state`` (so in the checkpoint, then the manifest) the engine that encoded
    the work: a run resumed after all of it was encoded encodes nothing, and its own
    encoder's record ("hf", "no document to encode") would name the wrong one."""
    saved, read_before = before
    now = encoder_backend(plan).describe()
    if saved is None or state.counts.documents.read == read_before:  # nothing before, or now
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


_DONE = object()


def background(iterable: Iterable[Any], ahead: int = 2) -> Iterator[Any]:
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


def ordered_map(fn: Callable[[Any], Any], items: Iterable[Any], *, workers: int) -> Iterator[Any]:
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
