"""``stats``: what packing does to a dataset, and what it saves against padded batches.

Two entry points, one set of figures:

- :func:`dataset_stats` reads a packed output (``packtool pack``'s directory) column by
  column, shard by shard: only ``num_tokens``, ``cu_seqlens``, ``doc_ids`` and ``chunk_ids``,
  memory-mapped and vectorised; ``input_ids`` are never touched.
- :func:`corpus_stats` tokenizes a corpus (or reuses the cached document lengths of an
  earlier call), applies the overflow policy and first-fit-decreasing for each ``max_len``,
  and reports the same figures without writing any row, so one can choose ``max_len``.

Everything is computed on *segments*, the items that were packed: a document, or one chunk of
a document split under ``--overflow split``. One row of ``max_len`` 24 with segments of 9, 7
and 5 tokens::

    input_ids    b b b b b b b b b c c c c c c c a a a a a P P P
    cu_seqlens   [0, 9, 16, 21, 24]        segment lengths 9 7 5 (then the padding, 3)
    num_tokens   21                        row fill 21/24
    doc_ids      [1, 2, 0]                 3 documents in the row

The comparison puts the packed rows next to three ways of batching the same segments without
packing, each batch costing ``len(batch) * max_len_in_batch`` slots (``docs/stats.md`` has
the exact definitions)::

    pad_to_max_len   every segment alone, padded to max_len
    random_batches   segments shuffled (seed), batches of B, each padded to its longest
    length_grouped   segments sorted longest first, batches of B, each padded to its longest
    packed           rows * max_len

This module computes; it never prints. The CLI renders the dataclasses with rich.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ._version import __version__
from .errors import FormatError, InputError, OptionError
from .format import MANIFEST_FILE, DocumentCounts, Manifest, Per, column_names, open_packed
from .fs import StorePath, as_path, user_cache_dir
from .instruct import InputShape, detect_shape
from .limits import MAX_BATCH_SIZE, MAX_LEN_LIMIT, MAX_SEED, check_int, read_token_count
from .options import PackOptions
from .order import attention_costs, balanced_share, rank_share, step_imbalance, step_loads
from .packing import Overflow, first_fit_decreasing, lower_bound_rows, segment_items
from .prepare import choose_tokenizer, prepare, resolve_options
from .pretokenized import IdsEncoder
from .readers import InputFile, first_record_fields, read_texts, resolve_inputs
from .repack import lengths_only, repack_notice
from .tokenize import (
    Backend,
    DocumentEncoder,
    Tokenizer,
    set_tokenizer_threads,
)

__all__ = [
    "BATCHINGS",
    "BATCHING_LABELS",
    "IMBALANCE_EDGES",
    "BalanceStats",
    "Batching",
    "CorpusStats",
    "DatasetStats",
    "DocumentOutcome",
    "Histogram",
    "LengthSummary",
    "PackingStats",
    "RowCounts",
    "batch_slots",
    "corpus_stats",
    "dataset_stats",
    "default_cache_dir",
    "histogram",
    "imbalance_labels",
    "is_packed_output",
    "parse_max_lens",
]

BATCHINGS = ("packed", "pad_to_max_len", "random_batches", "length_grouped")
"""The keys of :attr:`PackingStats.comparison`, in display order."""
BATCHING_LABELS = {
    "packed": "packed",
    "pad_to_max_len": "pad to max_len",
    "random_batches": "random batches",
    "length_grouped": "length-grouped",
}
"""How the terminal report and the HTML page name each of :data:`BATCHINGS`."""

LENGTH_BINS = 16
FILL_BINS = 10
DOCS_PER_ROW_BINS = 16
PERCENTILES = (50, 90, 99)
_CACHE_FORMAT = 2  # 2: special-token strings are text, no file truncation or padding
_BAD_RECORDS_KEPT = 20
# what a pack's statistics read: the columns of its segments, not those of its tokens
_COLUMNS = column_names(False, Per.ROW, Per.BOUNDARY, Per.SEGMENT)

ProgressCallback = Callable[[str, int, "int | None"], None]


# -- the figures --------------------------------------------------------------------------


@dataclass(frozen=True)
class Histogram:
    """Counts of integer values in bins ``[e0, e1], (e1, e2], ..., (e(k-1), ek]``.

    ``counts[i]`` counts the values ``v`` with ``edges[i] < v <= edges[i + 1]`` (the first
    bin also holds ``v == edges[0]``); ``above`` counts ``v > edges[-1]``. Row fill of rows
    holding 3, 12, 16 and 16 tokens with ``max_len`` 16 and 4 bins::

        edges  [0, 4, 8, 12, 16]
        counts [1, 0, 1, 2]           [0, 4]: 3   (8, 12]: 12   (12, 16]: 16, 16
        above  0
    """

    edges: tuple[int, ...]
    counts: tuple[int, ...]
    above: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"edges": list(self.edges), "counts": list(self.counts), "above": self.above}

    def labels(self, percent_of: int | None = None) -> list[str]:
        """Labels of the bins: ``≤ e1``, ``e1+1–e2``, ..., or percents of ``percent_of``
        (``above`` has none: its reader names it)."""
        e = self.edges
        labels = []
        for i in range(len(e) - 1):
            lo, hi = e[i], e[i + 1]
            if percent_of:
                labels.append(f"{100 * lo / percent_of:.0f}–{100 * hi / percent_of:.0f}%")
            elif i == 0:
                labels.append(f"≤ {hi:,}" if hi - lo > 1 else f"{hi:,}")
            elif hi - lo == 1:
                labels.append(f"{hi:,}")
            else:
                labels.append(f"{lo + 1:,}–{hi:,}")
        return labels


@dataclass(frozen=True)
class LengthSummary:
    """The distribution of document lengths in tokens.

    ``p50``/``p90``/``p99``: the smallest length such that at least that percent of the
    documents are no longer (``sorted[ceil(q * n / 100) - 1]``). ``None`` when there are no
    documents.
    """

    count: int
    tokens: int
    min: int | None
    mean: float | None
    p50: int | None
    p90: int | None
    p99: int | None
    max: int | None
    histogram: Histogram

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["histogram"] = self.histogram.to_dict()
        return d

    def figures(self) -> list[tuple[str, str]]:
        """The (label, value) rows ``stats`` shows of the lengths (terminal and page)."""
        if self.count == 0:
            return [("document length", "no documents")]
        return [
            ("document length mean", f"{self.mean:,.1f}"),
            ("  p50 · p90 · p99", f"{self.p50:,} · {self.p90:,} · {self.p99:,}"),
            ("  min · max", f"{self.min:,} · {self.max:,}"),
        ]


@dataclass(frozen=True)
class RowCounts:
    """Documents (segments) per row: ``min``, ``mean``, ``max`` and a histogram."""

    min: int | None
    mean: float | None
    max: int | None
    histogram: Histogram

    def to_dict(self) -> dict[str, Any]:
        return {
            "min": self.min,
            "mean": self.mean,
            "max": self.max,
            "histogram": self.histogram.to_dict(),
        }


@dataclass(frozen=True)
class Batching:
    """The cost of one way of batching the segments, in slots (token positions computed).

    ``tokens_per_slot`` is real tokens / slots; ``speedup`` is the packed rows' tokens per slot
    divided by this one's (``slots / packed slots``; ``None`` if there is nothing packed);
    ``slots_saved`` is ``slots - packed slots``, the padding that packing does not compute.
    """

    slots: int
    padding_slots: int
    padding_fraction: float
    tokens_per_slot: float
    speedup: float | None
    slots_saved: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DocumentOutcome:
    """What happened to every document read; ``read`` is the sum of the six counts after it.

    ``packed`` is whole documents (one segment each); ``split`` documents became several
    segments; ``truncated`` ones lost ``tokens_truncated_away`` tokens; ``dropped`` ones (and
    their ``tokens_dropped`` tokens) are not in the rows.
    """

    read: int = 0
    packed: int = 0
    split: int = 0
    truncated: int = 0
    dropped: int = 0
    empty: int = 0
    bad_records_skipped: int = 0
    tokens_truncated_away: int = 0
    tokens_dropped: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def figures(self) -> list[tuple[str, str]]:
        """The (label, value) rows ``stats`` shows of what happened to the documents."""
        cut = f" ({self.tokens_truncated_away:,} tokens cut)" if self.tokens_truncated_away else ""
        dropped = f" ({self.tokens_dropped:,} tokens)" if self.tokens_dropped else ""
        return [
            ("documents read", f"{self.read:,}"),
            ("  packed whole", f"{self.packed:,}"),
            ("  split into chunks", f"{self.split:,}"),
            ("  truncated", f"{self.truncated:,}{cut}"),
            ("  dropped (too long)", f"{self.dropped:,}{dropped}"),
            ("  empty", f"{self.empty:,}"),
            ("  bad records skipped", f"{self.bad_records_skipped:,}"),
        ]


@dataclass(frozen=True)
class PackingStats:
    """The figures of one packing (one ``max_len``): rows, efficiency, and the comparison.

    ``comparison`` maps each of :data:`BATCHINGS` to its :class:`Batching`; ``row_fill`` is
    the histogram of real tokens per row; ``docs_per_row`` counts document segments per row
    (a row never holds two chunks of one document, so this is also documents per row).
    """

    max_len: int
    batch_size: int
    seed: int
    documents: int  # documents with at least one segment in the rows
    segments: int
    tokens: int
    rows: int
    lower_bound_rows: int
    efficiency: float
    full_rows: int
    docs_per_row: RowCounts
    row_fill: Histogram
    comparison: dict[str, Batching]
    outcome: DocumentOutcome

    @property
    def rows_over_lower_bound(self) -> int:
        return self.rows - self.lower_bound_rows

    def figures(self) -> list[tuple[str, str]]:
        """The (label, value) rows ``stats`` shows of the packing (terminal and page)."""
        over = self.rows_over_lower_bound
        over_pct = f", {over / self.lower_bound_rows:+.2%}" if self.lower_bound_rows else ""
        d = self.docs_per_row
        per_row = "-" if d.min is None else f"min {d.min:,} · mean {d.mean:,.2f} · max {d.max:,}"
        return [
            ("documents in rows", self._documents_in_rows()),
            ("segments", f"{self.segments:,}"),
            ("tokens", f"{self.tokens:,}"),
            ("rows", f"{self.rows:,}"),
            (
                "lower bound ceil(tokens / max_len)",
                f"{self.lower_bound_rows:,} (+{over:,}{over_pct})",
            ),
            ("efficiency (tokens / slots)", f"{self.efficiency:.2%}"),
            ("full rows", f"{self.full_rows:,}"),
            ("documents per row", per_row),
        ]

    def _documents_in_rows(self) -> str:
        """The documents in the rows, and what became of the others read (as ``pack`` counts)."""
        o = self.outcome
        if o.read == self.documents:
            return f"{self.documents:,}"
        others = [
            (o.empty, "empty"),
            (o.dropped, "dropped"),
            (o.bad_records_skipped, "bad skipped"),
        ]
        told = ", ".join(f"{n:,} {what}" for n, what in others if n)
        return f"{self.documents:,} of {o.read:,} read ({told})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_len": self.max_len,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "documents": self.documents,
            "segments": self.segments,
            "tokens": self.tokens,
            "rows": self.rows,
            "lower_bound_rows": self.lower_bound_rows,
            "rows_over_lower_bound": self.rows_over_lower_bound,
            "efficiency": self.efficiency,
            "full_rows": self.full_rows,
            "docs_per_row": self.docs_per_row.to_dict(),
            "row_fill": self.row_fill.to_dict(),
            "comparison": {k: b.to_dict() for k, b in self.comparison.items()},
            "outcome": self.outcome.to_dict(),
        }


IMBALANCE_EDGES = (0, 10, 20, 30, 50, 100, 200, 500, 1000)
"""Bins of the per-step imbalance histogram, in thousandths over 1 (10: max/mean 1.01)."""


def imbalance_labels(hist: Histogram) -> list[str]:
    """Labels of an imbalance histogram's bins and of its ``above``, in percent over 1."""
    e = hist.edges
    inner = [f"+{e[i] / 10:g}–{e[i + 1] / 10:g}%" for i in range(1, len(e) - 1)]
    return [f"≤ +{e[1] / 10:g}%", *inner, f"> +{e[-1] / 10:g}%"]


@dataclass(frozen=True)
class BalanceStats:
    """How even the ranks' attention cost is at every step, read as ``PackedDataset`` reads.

    A step's imbalance is its slowest rank's cost over the mean rank's (the cost of a row:
    :data:`packtool.order.COST_MODEL`); ``imbalance`` is the mean over the steps of the stored
    order (``layout`` ``balanced``: the recorded step-major layout, else ``plain``: contiguous
    blocks), ``random_imbalance`` that of the same rows in a random order (seed).
    ``time_lost`` is the share of the steps' attention time spent waiting for the slowest
    rank, ``1 - sum(mean) / sum(max)``. Histograms bin the steps by imbalance in thousandths
    over 1 (:data:`IMBALANCE_EDGES`).
    """

    world_size: int
    micro_batches: int
    layout: str
    steps: int
    imbalance: float
    token_imbalance: float
    time_lost: float
    random_imbalance: float
    random_time_lost: float
    histogram: Histogram
    random_histogram: Histogram

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["histogram"] = self.histogram.to_dict()
        d["random_histogram"] = self.random_histogram.to_dict()
        return d


def _balance_stats(
    costs: np.ndarray,
    tokens: np.ndarray,
    recorded: Any,
    world_size: int | None,
    micro_batches: int | None,
    seed: int,
) -> BalanceStats | None:
    """The step balance of rows (costs in stored order) for ``world_size`` ranks (default:
    the recorded one), ``micro_batches`` rows per rank and step (default: the recorded one)."""
    recorded = recorded if isinstance(recorded, dict) else {}
    w = world_size if world_size is not None else recorded.get("world_size")
    if w is None:
        if micro_batches is not None:
            raise OptionError("--micro-batches needs --world-size W (this output records none)")
        return None
    n = int(costs.size)
    for flag, value in (("--world-size", w), ("--micro-batches", micro_batches)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise OptionError(f"{flag} must be an integer >= 1, got {value!r}")
        if value is not None and value < 1:
            raise OptionError(f"{flag} must be an integer >= 1, got {value!r}")
    if n < w:
        raise OptionError(f"--world-size {w}: the output has only {n} rows")
    balanced = recorded.get("world_size") == w
    g = micro_batches or (int(recorded["micro_batches"]) if balanced else 1)
    if balanced:
        stored_g = int(recorded["micro_batches"])
        rows = np.stack([balanced_share(np.arange(n), r, w, stored_g) for r in range(w)])
    else:
        per = n // w
        rows = np.arange(per * w).reshape(w, per)
    shuffled = np.random.default_rng(seed).permutation(n)
    plain = np.stack([rank_share(shuffled, r, w) for r in range(w)])
    loads, random_loads = step_loads(costs, rows, g), step_loads(costs, plain, g)

    def lost(x: np.ndarray) -> float:
        peak = float(x.max(axis=1).sum())
        return 1.0 - float(x.mean(axis=1).sum()) / peak if peak > 0 else 0.0

    def hist(x: np.ndarray) -> Histogram:
        over = np.rint((step_imbalance(x) - 1.0) * 1000).astype(np.int64)
        return histogram(over, IMBALANCE_EDGES)

    def mean(x: np.ndarray) -> float:
        return float(step_imbalance(x).mean()) if x.size else 1.0

    return BalanceStats(
        world_size=int(w),
        micro_batches=int(g),
        layout="balanced" if balanced else "plain",
        steps=int(loads.shape[0]),
        imbalance=mean(loads),
        token_imbalance=mean(step_loads(tokens, rows, g)),
        time_lost=lost(loads),
        random_imbalance=mean(random_loads),
        random_time_lost=lost(random_loads),
        histogram=hist(loads),
        random_histogram=hist(random_loads),
    )


@dataclass(frozen=True)
class DatasetStats:
    """Statistics of a packed output (:func:`dataset_stats`).

    ``document_lengths`` are lengths as packed: the chunks of a split document joined, a
    truncated document at ``max_len``.
    """

    path: Path
    shards: int
    tokenizer: str | None
    packing: PackingStats
    document_lengths: LengthSummary
    bad_records: list[str] = field(default_factory=list)
    seconds: float = 0.0
    learned_tokens: int | None = None  # instruction data: tokens with a label (manifest)
    units: dict[str, Any] | None = None  # packed in work units: the cost against one global FFD
    balance: BalanceStats | None = None  # steps across data-parallel ranks (--world-size)

    @property
    def learned_share_of_slots(self) -> float | None:
        """Learned tokens over all slots (rows x max_len): the share of compute that trains."""
        slots = self.packing.rows * self.packing.max_len
        if self.learned_tokens is None:
            return None
        return self.learned_tokens / slots if slots else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The ``packtool stats OUT --json`` object (keys listed in docs/stats.md)."""
        share = self.learned_share_of_slots
        return {
            "kind": "packed",
            "learned_tokens": self.learned_tokens,
            "learned_share_of_slots": None if share is None else round(share, 6),
            "units": self.units,
            "balance": None if self.balance is None else self.balance.to_dict(),
            "path": str(self.path),
            "shards": self.shards,
            "tokenizer": self.tokenizer,
            **self.packing.to_dict(),
            "document_lengths": self.document_lengths.to_dict(),
            "bad_records": list(self.bad_records),
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class CorpusStats:
    """Statistics of a corpus before packing, for several ``max_len`` (:func:`corpus_stats`).

    ``document_lengths`` are the tokenized lengths (with EOS/BOS as ``pack`` adds them) of
    the non-empty documents, before any overflow policy; ``results`` holds one
    :class:`PackingStats` per ``max_len``, in the order given.
    """

    inputs: list[str]
    tokenizer: str
    documents_read: int
    empty: int
    bad_records_skipped: int
    document_lengths: LengthSummary
    results: list[PackingStats]
    cache_path: Path | None = None
    cache_hit: bool = False
    bad_records: list[str] = field(default_factory=list)
    seconds: float = 0.0
    special_strings: int = 0  # documents whose text holds special-token strings
    parse_special: bool = False  # whether those were parsed as control tokens
    notices: list[str] = field(default_factory=list)  # e.g. the tokenizer file's settings
    skipped_files: list[str] = field(default_factory=list)  # directory members not read
    # The engine that tokenized (as in pack's manifest); None: the lengths came from the cache.
    backend: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``packtool stats CORPUS --max-len ... --json`` object (docs/stats.md)."""
        return {
            "kind": "corpus",
            "inputs": list(self.inputs),
            "tokenizer": self.tokenizer,
            "tokenizer_backend": self.backend,
            "cache": {
                "path": str(self.cache_path) if self.cache_path else None,
                "hit": self.cache_hit,
            },
            "documents_read": self.documents_read,
            "empty": self.empty,
            "bad_records_skipped": self.bad_records_skipped,
            "document_lengths": self.document_lengths.to_dict(),
            "max_lens": [r.to_dict() for r in self.results],
            "bad_records": list(self.bad_records),
            "special_strings": {"documents": self.special_strings, "parsed": self.parse_special},
            "notices": list(self.notices),
            "seconds": round(self.seconds, 3),
        }


# -- shared computations ------------------------------------------------------------------


def _edges(top: int, bins: int) -> tuple[int, ...]:
    """Integer edges ``0 = e0 < e1 < ... = top``, about ``bins`` bins of equal width."""
    if top <= 0:
        return (0, 1)
    return tuple(sorted({(top * i) // bins for i in range(bins + 1)}))


def histogram(values: np.ndarray, edges: Sequence[int]) -> Histogram:
    """Bin integer ``values`` (see :class:`Histogram` for the bins)."""
    e = np.asarray(edges, dtype=np.int64)
    k = e.size - 1
    if values.size == 0:
        return Histogram(tuple(int(x) for x in e), (0,) * k, 0)
    idx = np.searchsorted(e, values, side="left") - 1
    np.maximum(idx, 0, out=idx)  # v <= e0 goes to the first (closed) bin
    counts = np.bincount(idx, minlength=k + 1)
    return Histogram(
        tuple(int(x) for x in e), tuple(int(c) for c in counts[:k]), int(counts[k:].sum())
    )


def _length_summary(lengths: np.ndarray, top: int) -> LengthSummary:
    n = int(lengths.size)
    hist = histogram(lengths, _edges(top, LENGTH_BINS))
    if n == 0:
        return LengthSummary(0, 0, None, None, None, None, None, None, hist)
    kth = [max(0, -(-q * n // 100) - 1) for q in PERCENTILES]
    part = np.partition(lengths, kth)
    tokens = int(lengths.sum(dtype=np.int64))
    p50, p90, p99 = (int(part[i]) for i in kth)
    return LengthSummary(
        count=n,
        tokens=tokens,
        min=int(lengths.min()),
        mean=tokens / n,
        p50=p50,
        p90=p90,
        p99=p99,
        max=int(lengths.max()),
        histogram=hist,
    )


def _row_counts(per_row: np.ndarray) -> RowCounts:
    if per_row.size == 0:
        return RowCounts(None, None, None, histogram(per_row, (0, 1)))
    top = int(per_row.max())
    width = -(-top // DOCS_PER_ROW_BINS)  # 1 up to DOCS_PER_ROW_BINS, then wider integer bins
    edges = tuple(range(0, -(-top // width) * width + 1, width))
    return RowCounts(
        min=int(per_row.min()),
        mean=float(per_row.sum(dtype=np.int64) / per_row.size),
        max=top,
        histogram=histogram(per_row, edges),
    )


def batch_slots(lengths: np.ndarray, batch_size: int) -> int:
    """Slots of batching ``lengths`` in order, ``batch_size`` at a time, each batch padded to
    its longest: ``sum(len(batch) * max(batch))`` (the last batch may be smaller)::

        batch_slots([3, 9, 2, 5, 4], 2)  ->  2*9 + 2*5 + 1*4 = 32
    """
    a = np.asarray(lengths, dtype=np.int64)
    n = int(a.size)
    full = n // batch_size
    slots = int(a[: full * batch_size].reshape(full, batch_size).max(axis=1).sum()) * batch_size
    if n % batch_size:
        slots += (n % batch_size) * int(a[full * batch_size :].max())
    return slots


def _batching(slots: int, tokens: int, packed_slots: int) -> Batching:
    return Batching(
        slots=slots,
        padding_slots=slots - tokens,
        padding_fraction=(slots - tokens) / slots if slots else 0.0,
        tokens_per_slot=tokens / slots if slots else 0.0,
        speedup=slots / packed_slots if packed_slots else None,
        slots_saved=slots - packed_slots,
    )


def _comparison(
    segments: np.ndarray, rows: int, max_len: int, batch_size: int, seed: int
) -> dict[str, Batching]:
    """The four batchings of ``segments`` (lengths in input order: by document, then chunk)."""
    tokens = int(segments.sum(dtype=np.int64))
    n = int(segments.size)
    packed = rows * max_len
    shuffled = segments[np.random.default_rng(seed).permutation(n)]
    longest_first = np.sort(segments)[::-1]
    slots = {
        "packed": packed,
        "pad_to_max_len": n * max_len,
        "random_batches": batch_slots(shuffled, batch_size),
        "length_grouped": batch_slots(longest_first, batch_size),
    }
    return {k: _batching(slots[k], tokens, packed) for k in BATCHINGS}


def _packing_stats(
    *,
    segments: np.ndarray,
    fill: np.ndarray,
    docs_per_row: np.ndarray,
    documents: int,
    max_len: int,
    batch_size: int,
    seed: int,
    outcome: DocumentOutcome,
) -> PackingStats:
    tokens = int(segments.sum(dtype=np.int64))
    rows = int(fill.size)
    return PackingStats(
        max_len=max_len,
        batch_size=batch_size,
        seed=seed,
        documents=documents,
        segments=int(segments.size),
        tokens=tokens,
        rows=rows,
        lower_bound_rows=lower_bound_rows(tokens, max_len),
        efficiency=tokens / (rows * max_len) if rows else 0.0,
        full_rows=int(np.count_nonzero(fill == max_len)),
        docs_per_row=_row_counts(docs_per_row),
        row_fill=histogram(fill, _edges(max_len, FILL_BINS)),
        comparison=_comparison(segments, rows, max_len, batch_size, seed),
        outcome=outcome,
    )


def _check_batching(batch_size: int, seed: int) -> None:
    check_int("--batch-size", batch_size, 1, MAX_BATCH_SIZE)
    check_int("--seed", seed, 0, MAX_SEED)


# -- packed outputs -----------------------------------------------------------------------


def is_packed_output(path: str | os.PathLike[str] | StorePath) -> bool:
    """True if ``path`` is a directory holding a ``manifest.json`` (a packed output, or
    something claiming to be one: :func:`dataset_stats` checks its format)."""
    p = as_path(path)
    return p.is_dir() and (p / MANIFEST_FILE).exists()


_NUMPY_TYPES = {pa.int32(): np.int32, pa.int64(): np.int64}


def _values(array: pa.Array, where: str) -> np.ndarray:
    """Zero-copy NumPy view of a null-free int32/int64 array (slices too).

    Reads the Arrow buffer directly: pyarrow's own ``to_numpy`` imports pandas, which costs
    more time and memory than the statistics themselves.
    """
    dtype = _NUMPY_TYPES.get(array.type)
    if dtype is None or array.null_count:
        raise FormatError(f"{where}: unexpected {array.type} column with nulls or of another type")
    size = np.dtype(dtype).itemsize
    return np.frombuffer(array.buffers()[1], dtype, len(array), array.offset * size)


def _list_parts(array: pa.Array, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, values) of a list array; offsets index ``values`` directly (slices too)."""
    if not pa.types.is_list(array.type) or array.null_count:
        raise FormatError(f"{where}: unexpected {array.type} column with nulls or of another type")
    offsets = np.frombuffer(array.buffers()[1], np.int32, len(array) + 1, array.offset * 4)
    return offsets.astype(np.int64), _values(array.values, where)


@dataclass
class _Columns:
    """The per-row and per-segment arrays of a packed dataset, gathered shard by shard."""

    fill: list[np.ndarray] = field(default_factory=list)
    per_row: list[np.ndarray] = field(default_factory=list)
    lengths: list[np.ndarray] = field(default_factory=list)
    doc_ids: list[np.ndarray] = field(default_factory=list)
    chunk_ids: list[np.ndarray] = field(default_factory=list)

    @staticmethod
    def _cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype)


def _read_batch(
    batch: pa.RecordBatch, max_len: int, where: str, first_row: int, into: _Columns
) -> None:
    """Segment lengths, fill and counts of one record batch, checked against the format."""
    nt = _values(batch.column("num_tokens"), where).astype(np.int64)
    cu_off, cu_val = _list_parts(batch.column("cu_seqlens"), where)
    ch_off, ch_val = _list_parts(batch.column("chunk_ids"), where)
    d_off, d_val = _list_parts(batch.column("doc_ids"), where)
    ndocs = np.diff(ch_off)
    ncu = np.diff(cu_off)
    padded = nt < max_len

    def fail(bad: np.ndarray, problem: str) -> None:
        row = first_row + int(np.flatnonzero(bad)[0])
        raise FormatError(f"{where}: row {row}: {problem} (run `packtool verify`)")

    def fail_segment(bad_seg: np.ndarray, problem: str) -> None:
        row = first_row + int(np.repeat(np.arange(nt.size), ndocs)[bad_seg][0])
        raise FormatError(f"{where}: row {row}: {problem} (run `packtool verify`)")

    bad = np.diff(d_off) != ndocs
    if bad.any():
        fail(bad, "doc_ids and chunk_ids differ in length")
    bad = (nt < 0) | (nt > max_len)
    if bad.any():
        fail(bad, f"num_tokens outside [0, max_len={max_len}]")
    bad = ncu - 1 != ndocs + padded
    if bad.any():
        fail(bad, "cu_seqlens does not have one boundary per document segment (+ padding)")
    starts = cu_off[:-1]
    bad = (
        (cu_val[starts] != 0) | (cu_val[starts + ndocs] != nt) | (cu_val[cu_off[1:] - 1] != max_len)
    )
    if bad.any():
        fail(bad, "cu_seqlens does not run from 0 through num_tokens to max_len")

    n_seg = int(ndocs.sum())
    local = np.arange(n_seg, dtype=np.int64) - np.repeat(ch_off[:-1] - ch_off[0], ndocs)
    pos = np.repeat(starts, ndocs) + local
    lengths = cu_val[pos + 1].astype(np.int64) - cu_val[pos]
    if (lengths < 1).any():
        fail_segment(lengths < 1, "cu_seqlens does not rise strictly")
    into.fill.append(nt)
    into.per_row.append(ndocs)
    into.lengths.append(lengths.astype(np.int32))
    into.doc_ids.append(np.asarray(d_val[d_off[0] : d_off[-1]], dtype=np.int64))
    into.chunk_ids.append(np.asarray(ch_val[ch_off[0] : ch_off[-1]], dtype=np.int32))


def _input_order(
    doc_ids: np.ndarray, chunk_ids: np.ndarray, where: str, *, gaps: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(position of each segment in input order, segments per document id).

    Input order is by document, then chunk. Checks that every (doc_id, chunk_id) appears once
    and that chunks run 0..k-1, in O(segments + documents) without sorting. With ``gaps``
    (a pack that dropped chunks with nothing to learn, which keep their numbers) the chunks
    of a document may skip numbers; they are then put in order by sorting.
    """
    n = int(doc_ids.size)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if doc_ids.min() < 0 or chunk_ids.min() < 0:
        raise FormatError(f"{where}: negative doc_id or chunk_id (run `packtool verify`)")
    per_doc = np.bincount(doc_ids)
    first = np.concatenate([[0], np.cumsum(per_doc)[:-1]])
    if gaps and (chunk_ids >= per_doc[doc_ids]).any():
        order = np.lexsort((chunk_ids, doc_ids))
        d, c = doc_ids[order], chunk_ids[order]
        if ((d[1:] == d[:-1]) & (c[1:] == c[:-1])).any():
            raise FormatError(
                f"{where}: a (doc_id, chunk_id) appears twice (run `packtool verify`)"
            )
        pos = np.empty(n, np.int64)
        pos[order] = np.arange(n)
        return pos, per_doc
    if (chunk_ids >= per_doc[doc_ids]).any():
        raise FormatError(
            f"{where}: the chunks of a document are not numbered 0..k-1 (run `packtool verify`)"
        )
    pos = first[doc_ids] + chunk_ids
    seen = np.zeros(n, dtype=bool)
    seen[pos] = True
    if not seen.all():
        raise FormatError(f"{where}: a (doc_id, chunk_id) appears twice (run `packtool verify`)")
    return pos, per_doc


def dataset_stats(
    path: str | os.PathLike[str],
    *,
    batch_size: int = 8,
    seed: int = 0,
    world_size: int | None = None,
    micro_batches: int | None = None,
) -> DatasetStats:
    """Statistics of the packed output at ``path``, read column by column.

    Reads ``num_tokens``, ``cu_seqlens``, ``doc_ids`` and ``chunk_ids`` of each shard through
    :meth:`~packtool.format.PackedReader.iter_tables` (memory-mapped); keeps in memory one
    int32 length and two ids per segment, and two numbers per row. ``batch_size`` and
    ``seed`` define the padded baselines (see :func:`batch_slots`). Raises
    :class:`~packtool.errors.FormatError` for a directory that is not a packtool output, an
    unsupported format version, or rows that break the format's invariants.

    ``world_size`` (default: the one the output records, if any) and ``micro_batches`` give
    :attr:`DatasetStats.balance`, the step imbalance across data-parallel ranks
    (:class:`BalanceStats`).
    """
    started = time.perf_counter()
    _check_batching(batch_size, seed)
    reader = open_packed(path)
    manifest = reader.manifest
    max_len = reader.max_len
    cols = _Columns()
    first_row = 0
    for shard, table in enumerate(reader.iter_tables(columns=list(_COLUMNS))):
        where = str(reader.shard_paths[shard])
        for batch in table.to_batches():
            _read_batch(batch, max_len, where, first_row, cols)
            first_row += batch.num_rows
    fill = _Columns._cat(cols.fill, np.int64)
    per_row = _Columns._cat(cols.per_row, np.int64)
    lengths = _Columns._cat(cols.lengths, np.int32)
    doc_ids = _Columns._cat(cols.doc_ids, np.int64)
    chunk_ids = _Columns._cat(cols.chunk_ids, np.int32)
    del cols
    balance = _balance_stats(
        attention_costs(lengths, per_row),
        fill,
        manifest.balance,
        world_size,
        micro_batches,
        seed,
    )

    gaps = bool(manifest.dropped_label_chunks)
    pos, per_doc = _input_order(doc_ids, chunk_ids, str(reader.path), gaps=gaps)
    segments = np.empty_like(lengths)
    segments[pos] = lengths
    doc_lengths = np.bincount(doc_ids, weights=lengths, minlength=per_doc.size)[per_doc > 0]
    doc_lengths = doc_lengths.astype(np.int64)
    del doc_ids, chunk_ids, pos

    docs, toks = manifest.documents, manifest.tokens
    outcome = DocumentOutcome(
        read=docs.read,
        packed=docs.packed,
        split=docs.split,
        truncated=docs.truncated,
        dropped=docs.dropped,
        empty=docs.empty,
        bad_records_skipped=docs.bad_records_skipped,
        tokens_truncated_away=toks.truncated_away,
        tokens_dropped=toks.dropped,
    )
    packing = _packing_stats(
        segments=segments,
        fill=fill,
        docs_per_row=per_row,
        documents=int(doc_lengths.size),
        max_len=max_len,
        batch_size=batch_size,
        seed=seed,
        outcome=outcome,
    )
    return DatasetStats(
        path=reader.path,
        shards=len(reader.shard_paths),
        tokenizer=manifest.tokenizer_name,
        packing=packing,
        document_lengths=_length_summary(doc_lengths, max_len),
        bad_records=[str(b) for b in manifest.bad_records],
        seconds=time.perf_counter() - started,
        learned_tokens=toks.learned,
        units=_units_summary(manifest),
        balance=balance,
    )


def _units_summary(manifest: Manifest) -> dict[str, Any] | None:
    """What packing within units cost, from the manifest ``packtool merge`` wrote."""
    units = manifest.merged_units
    if units is None or manifest.global_ffd_rows is None:
        return None
    return {
        "count": units.count,
        "global_ffd_rows": manifest.global_ffd_rows,
        "rows_over_global_ffd": units.rows_over_global_ffd,
        "packing_loss": units.packing_loss,
    }


# -- corpora, before packing --------------------------------------------------------------


def parse_max_lens(text: str | Sequence[int]) -> list[int]:
    """``"2048,4096"`` (or a list of ints) -> ``[2048, 4096]``; each an integer >= 2, no repeats.

    Also takes ``4k``-style values: ``"2k,4k"`` -> ``[2048, 4096]``.
    """
    items: list[Any] = text.split(",") if isinstance(text, str) else list(text)
    out: list[int] = []
    for item in items:
        value: Any = item
        if isinstance(item, str):
            value = read_token_count("--max-len", item)
        value = check_int("--max-len", value, 2, MAX_LEN_LIMIT)
        if int(value) in out:
            raise OptionError(f"--max-len: {int(value)} is given twice")
        out.append(int(value))
    if not out:
        raise OptionError("--max-len: give at least one value, e.g. --max-len 2048,4096")
    return out


def default_cache_dir() -> Path:
    """``$PACKTOOL_CACHE_DIR``, else ``$XDG_CACHE_HOME/packtool``, else ``~/.cache/packtool``."""
    return user_cache_dir()


def _fingerprint(inp: InputFile) -> list[Any]:
    st = inp.path.stat()
    mtime = st.st_mtime_ns
    if inp.path.is_dir():
        mtime = max([mtime, *(p.stat().st_mtime_ns for p in inp.path.rglob("*") if p.is_file())])
    return [str(inp.path.resolve()), inp.kind, inp.size_bytes, mtime]


def _cache_key(files: Sequence[InputFile], tok: Tokenizer, options: dict[str, Any]) -> str:
    spec = {
        "cache_format": _CACHE_FORMAT,
        "packtool": __version__,
        "inputs": [_fingerprint(f) for f in files],
        "tokenizer": [tok.name, tok.sha256, asdict(tok.special)],
        **options,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class _Tokenized:
    """Per-record token lengths in input order: -1 for a skipped bad record, 0 for empty."""

    lengths: np.ndarray
    bad_records: list[str]
    special_strings: int = 0  # documents whose text held special-token strings


def _load_cached(directory: Path, key: str) -> _Tokenized | None:
    meta_path, data_path = directory / f"{key}.json", directory / f"{key}.npy"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        lengths = np.load(data_path, allow_pickle=False)
    except (OSError, ValueError, json.JSONDecodeError):
        return None  # absent, or damaged: tokenize again
    if (
        not isinstance(meta, dict)
        or meta.get("records") != int(lengths.size)
        or lengths.ndim != 1
        or lengths.dtype.kind != "i"
    ):
        return None
    return _Tokenized(
        lengths.astype(np.int64, copy=False),
        list(meta.get("bad_records", [])),
        int(meta.get("special_strings", 0)),
    )


def _store_cached(directory: Path, key: str, data: _Tokenized, describe: dict[str, Any]) -> None:
    """Write the lengths, then the JSON (last: it marks the entry complete), atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = f".tmp-{os.getpid()}"
    data_tmp = directory / f"{key}.npy{tmp}"
    lengths = data.lengths
    if lengths.size and lengths.max() <= np.iinfo(np.int32).max:
        lengths = lengths.astype(np.int32)  # half the size; read back as int64
    with open(data_tmp, "wb") as f:
        np.save(f, lengths, allow_pickle=False)
    os.replace(data_tmp, directory / f"{key}.npy")
    meta_tmp = directory / f"{key}.json{tmp}"
    meta = {
        "records": int(data.lengths.size),
        "bad_records": data.bad_records,
        "special_strings": data.special_strings,
        **describe,
    }
    meta_tmp.write_text(json.dumps(meta, indent=2), encoding="utf-8")
    os.replace(meta_tmp, directory / f"{key}.json")


def _tokenize_lengths(
    files: Sequence[InputFile],
    encoder: DocumentEncoder,
    *,
    text_field: str,
    skip_bad_records: bool,
    split: str | None,
    txt_unit: str,
    progress: ProgressCallback | None,
) -> _Tokenized:
    parts: list[np.ndarray] = []
    bad_records: list[str] = []
    special_strings = 0
    total_bytes = sum(f.size_bytes for f in files)
    bytes_before = 0
    for inp in files:
        for batch in read_texts(
            inp,
            text_field=text_field,
            skip_bad_records=skip_bad_records,
            split=split,
            txt_unit=txt_unit,
        ):
            for error in batch.bad[: max(0, _BAD_RECORDS_KEPT - len(bad_records))]:
                bad_records.append(str(error))
            good = [i for i, t in enumerate(batch.texts) if t is not None]
            encoded = encoder.encode([batch.texts[i] for i in good])  # type: ignore[misc]
            lengths = np.full(len(batch.texts), -1, dtype=np.int64)
            lengths[good] = np.where(encoded.empty, 0, encoded.lengths)
            special_strings += encoded.special_strings
            parts.append(lengths)
            if progress:
                progress("tokenize", bytes_before + batch.bytes_done, total_bytes)
        bytes_before += inp.size_bytes
    lengths = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return _Tokenized(lengths, bad_records, special_strings)


def _segment_lengths(
    lengths: np.ndarray, max_len: int, overflow: Overflow
) -> tuple[np.ndarray, DocumentOutcome]:
    """Segments (in input order) of non-empty document ``lengths`` under ``overflow``, as
    ``pack`` makes them (the pipeline's own code), and what happened to the documents."""
    good = lengths[lengths >= 0]
    _, _, item_len, c = segment_items(good, good == 0, max_len, overflow)
    outcome = DocumentOutcome(
        read=int(lengths.size),
        packed=c["packed"],
        split=c["split"],
        truncated=c["truncated"],
        dropped=c["dropped"],
        empty=c["empty"],
        bad_records_skipped=int(np.count_nonzero(lengths < 0)),
        tokens_truncated_away=c["tokens_truncated"],
        tokens_dropped=c["tokens_dropped"],
    )
    return item_len.astype(np.int64), outcome


def _refuse_instruction_data(first: InputFile, text_field: str, split: str | None) -> None:
    """Name the limitation instead of failing on a missing text field later."""
    fields = first_record_fields(first, split=split) or []
    if text_field in fields:
        return
    shape = detect_shape(fields, text_field=text_field)  # the pack's own rules, default names
    if shape is not InputShape.TEXT:
        name = "chat" if shape is InputShape.CHAT else "prompt/completion"
        raise InputError(
            f"{first.path} holds {name} records: `stats` before packing reads text corpora "
            "only; pack it, then run `packtool stats` on the output (it reports the learned "
            "tokens too)"
        )


def _ids_lengths(
    files: Sequence[InputFile],
    read: Callable[..., Any],
    encoder: IdsEncoder,
    o: PackOptions,
    progress: ProgressCallback | None,
) -> _Tokenized:
    """Every document's length in pre-tokenized inputs (``--ids-field``, Megatron): read and
    checked as ``pack`` reads them (EOS cuts, EOS/BOS added when asked), ids never kept."""
    parts: list[np.ndarray] = []
    bad_records: list[str] = []
    total_bytes = sum(f.size_bytes for f in files)
    bytes_before = 0
    for inp in files:
        for batch in read(inp, skip_bad_records=o.skip_bad_records, split=o.split):
            for error in batch.bad[: max(0, _BAD_RECORDS_KEPT - len(bad_records))]:
                bad_records.append(str(error))
            encoded = encoder.finish(batch)
            lengths = np.full(batch.records.size, -1, dtype=np.int64)
            lengths[batch.good] = np.where(encoded.empty, 0, encoded.lengths)
            parts.append(lengths)
            if progress:
                progress("tokenize", bytes_before + batch.bytes_done, total_bytes)
        bytes_before += inp.size_bytes
    lengths = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return _Tokenized(lengths, bad_records)


def _cached_lengths(
    files: Sequence[InputFile],
    tok: Tokenizer,
    key_options: dict[str, Any],
    compute: Callable[[], _Tokenized],
    directory: Path | None,
    progress: ProgressCallback | None,
) -> tuple[_Tokenized, bool, str]:
    """Every record's token length: from the cache in ``directory`` (``None``: no cache) when
    it holds these inputs under these options (``key_options``: how they were read and
    encoded), else ``compute()`` (and cached). Returns the lengths, whether they came from
    the cache, and the cache key."""
    key = _cache_key(files, tok, key_options)
    data = _load_cached(directory, key) if directory is not None else None
    if data is not None:
        if progress:
            total = sum(f.size_bytes for f in files)
            progress("tokenize", total, total)
        return data, True, key
    data = compute()
    if directory is not None:
        describe = {
            "inputs": [str(f.path) for f in files],
            "tokenizer": tok.name,
            "created_unix": int(time.time()),
        }
        with contextlib.suppress(OSError):  # a cache that cannot be written is no reason to fail
            _store_cached(directory, key, data, describe)
    return data, False, key


def _lengths_of(
    files: Sequence[InputFile],
    o: PackOptions,
    directory: Path | None,
    progress: ProgressCallback | None,
) -> tuple[_Tokenized, bool, str, Tokenizer, Overflow, Backend | None]:
    """The lengths of a corpus (cached), the tokenizer, the overflow policy and the engine
    that tokenizes (``None`` for ids): text tokenized as ``pack`` does, through the same
    backend layer, or pre-tokenized ids read as they are."""
    overflow = Overflow(o.overflow or Overflow.SPLIT)
    tok: Tokenizer
    if o.ids_field is not None:
        if o.labels_field or o.loss_mask_field:
            raise OptionError(
                "stats of a corpus counts pre-tokenized ids only, not labels (a chunk without "
                "labels is dropped by pack): drop --labels-field/--loss-mask-field, or pack "
                "it and run `packtool stats OUT` (it reports the learned tokens)"
            )
        # A tokenizer file gives its special tokens and vocabulary size only.
        prepared = prepare(files, o, preload=False)
        plan, tok = prepared.plan, prepared.tokenizer
        encoder = plan.encoder
        assert isinstance(encoder, IdsEncoder) and plan.read_ids is not None
        ids_options = {
            "ids_field": o.ids_field,
            "split_on_eos": o.split_on_eos,
            "vocab_size": o.vocab_size,
            "skip_bad_records": o.skip_bad_records,
            "split": o.split,
            "add_eos": plan.add_eos,
            "bos": o.bos,
        }
        data, hit, key = _cached_lengths(
            files,
            tok,
            ids_options,
            lambda: _ids_lengths(files, plan.read_ids, encoder, o, progress),
            directory,
            progress,
        )
        return data, hit, key, tok, overflow, None
    _refuse_instruction_data(files[0], o.text_field, o.split)
    set_tokenizer_threads(o.num_proc)
    # Nothing loaded until a document is encoded: cached lengths need no engine.
    tok = choose_tokenizer(o, preload=False)
    add_eos = True if o.add_eos is None else o.add_eos
    text = DocumentEncoder(
        tok,
        add_eos=add_eos,
        bos=o.bos,
        parse_special=o.parse_special,
        backend=o.tokenizer_backend,
    )
    read_options = {
        "text_field": o.text_field,
        "skip_bad_records": o.skip_bad_records,
        "split": o.split,
        "txt_unit": o.txt_unit,
    }
    encoding = {"add_eos": add_eos, "bos": o.bos, "parse_special": o.parse_special}
    data, hit, key = _cached_lengths(
        files,
        tok,
        {**read_options, **encoding},
        lambda: _tokenize_lengths(files, text, progress=progress, **read_options),  # type: ignore[arg-type]
        directory,
        progress,
    )
    return data, hit, key, tok, overflow, text.backend


def _stats_at(
    lengths: np.ndarray, max_len: int, overflow: Overflow, batch_size: int, seed: int
) -> PackingStats:
    """How documents of ``lengths`` pack at ``max_len`` (FFD, as ``pack`` does)."""
    segments, outcome = _segment_lengths(lengths, max_len, overflow)
    row_of = first_fit_decreasing(segments, max_len)
    n_rows = int(row_of.max()) + 1 if row_of.size else 0
    return _packing_stats(
        segments=segments,
        fill=np.bincount(row_of, weights=segments, minlength=n_rows).astype(np.int64),
        docs_per_row=np.bincount(row_of, minlength=n_rows).astype(np.int64),
        documents=outcome.packed + outcome.split + outcome.truncated,
        max_len=max_len,
        batch_size=batch_size,
        seed=seed,
        outcome=outcome,
    )


def corpus_stats(
    inputs: Sequence[str | os.PathLike[str]],
    max_lens: Sequence[int] | str,
    options: PackOptions | None = None,
    *,
    batch_size: int = 8,
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
    use_cache: bool = True,
    progress: ProgressCallback | None = None,
    **option_values: Any,
) -> CorpusStats:
    """How ``inputs`` would pack at each of ``max_lens``, without writing any row.

    ``options`` (a :class:`~packtool.options.PackOptions`, or its fields as keyword
    arguments) say how to read and tokenize, as for :func:`packtool.pack`; ``seed`` is the
    seed of the random-batches baseline. Reads and tokenizes like ``pack`` (same EOS/BOS handling,
    same overflow policy and first-fit-decreasing), keeping only each document's token
    count. Those counts are cached in ``cache_dir`` (default :func:`default_cache_dir`) under
    a key made of the inputs' paths, sizes and modification times, the tokenizer's sha256
    and special tokens, and the reading/encoding options, so a second call on the same corpus
    does not tokenize again (``use_cache=False`` neither reads nor writes the cache).

    Pre-tokenized corpora (``ids_field``, or Megatron ``.bin``/``.idx`` inputs) are read as
    ``pack`` reads them, with no tokenizer (``split_on_eos``, ``vocab_size``, EOS/BOS ids as
    for ``pack``); their labels are not counted (``labels_field`` is refused).

    ``corpus_stats(inputs, [L])`` and ``dataset_stats(pack(inputs, out, max_len=L))`` give
    the same :class:`PackingStats` figures. Special-token strings in the text are text unless
    ``parse_special``, as in ``pack``.
    """
    started = time.perf_counter()
    o = (options or PackOptions()).replace(**option_values)
    lens_wanted = parse_max_lens(max_lens)
    _check_batching(batch_size, seed)
    skipped: list[Path] = []
    files = resolve_inputs(inputs, skipped=skipped)
    o = resolve_options(files, o)  # Megatron data is ids; the ids options checked
    o = lengths_only(files, o)  # a labelled pack: its documents' lengths
    directory = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    data, hit, key, tok, overflow, backend = _lengths_of(
        files, o, directory / "lengths" if use_cache else None, progress
    )
    lengths = data.lengths
    results = [_stats_at(lengths, max_len, overflow, batch_size, seed) for max_len in lens_wanted]
    nonempty = lengths[lengths > 0]
    if not nonempty.size:
        counts = DocumentCounts(
            read=int(lengths.size),
            empty=int(np.count_nonzero(lengths == 0)),
            bad_records_skipped=int(np.count_nonzero(lengths < 0)),
        )
        raise counts.nothing_to_pack([f.path for f in files])
    return CorpusStats(
        inputs=[str(f.path) for f in files],
        tokenizer=tok.name,
        documents_read=int(lengths.size),
        empty=int(np.count_nonzero(lengths == 0)),
        bad_records_skipped=int(np.count_nonzero(lengths < 0)),
        document_lengths=_length_summary(nonempty, max(lens_wanted)),
        results=results,
        cache_path=(directory / "lengths" / f"{key}.npy") if use_cache else None,
        cache_hit=hit,
        bad_records=data.bad_records,
        seconds=time.perf_counter() - started,
        special_strings=data.special_strings,
        parse_special=o.parse_special,
        notices=[
            n
            for n in (
                getattr(tok, "notice", None),
                *(backend.notices if backend else ()),
                *(repack_notice(files, m, overflow.value) for m in lens_wanted),  # a pack's
            )
            if n
        ],
        skipped_files=[str(p) for p in skipped],
        backend=None if hit or backend is None else backend.describe(),
    )
