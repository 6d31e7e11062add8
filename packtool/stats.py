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
import dataclasses
import itertools
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ._version import __version__
from .corpus import ReadState, encoder_backend, read_corpus
from .counts import Counts, DocumentCounts
from .errors import FormatError, OptionError
from .format import (
    IGNORE_INDEX,
    MANIFEST_FILE,
    BalanceRecord,
    Manifest,
    MixtureRecord,
    Per,
    SourceRecord,
    column_names,
    open_packed,
)
from .fs import StorePath, as_path, user_cache_dir
from .limits import MAX_BATCH_SIZE, MAX_LEN_LIMIT, MAX_SEED, check_int, read_token_count
from .mixture import pick_items, plan_mixture, resolve_sources, source_documents
from .options import PackOptions
from .order import attention_costs, balanced_share, rank_share, step_imbalance, step_loads
from .packing import (
    Overflow,
    aligned_lengths,
    cut_items,
    first_fit_decreasing,
    lower_bound_rows,
)
from .prepare import Prepared, fingerprint_of, prepare
from .readers import InputFile, resolve_inputs
from .repack import repack_notice
from .tokenize import EncodedBatch, set_tokenizer_threads

__all__ = [
    "BATCHINGS",
    "BATCHING_LABELS",
    "IMBALANCE_EDGES",
    "SOURCE_COLUMNS",
    "BalanceStats",
    "Batching",
    "CorpusStats",
    "DatasetStats",
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
_CACHE_FORMAT = 3  # 3: the lengths of good documents, the runs of learned tokens (labels)
_BAD_RECORDS_KEPT = 20
# what a pack's statistics read: the columns of its segments, not those of its tokens

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
    outcome: Counts  # what became of the documents read, and their tokens (as pack counts)
    alignment: AlignmentStats | None = None  # what --pad-to-multiple-of costs (corpus mode)
    sources: list[SourceStats] | None = None  # a mixture (--mix): each source's part

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
            *([self.alignment.figure()] if self.alignment is not None else []),
        ]

    def outcome_figures(self) -> list[tuple[str, str]]:
        """The (label, value) rows ``stats`` shows of what happened to the documents."""
        o, t = self.outcome.documents, self.outcome.tokens
        cut = f" ({t.truncated_away:,} tokens cut)" if t.truncated_away else ""
        dropped = f" ({t.dropped:,} tokens)" if t.dropped else ""
        return [
            ("documents read", f"{o.read:,}"),
            ("  packed whole", f"{o.packed:,}"),
            ("  split into chunks", f"{o.split:,}"),
            ("  truncated", f"{o.truncated:,}{cut}"),
            ("  dropped (too long)", f"{o.dropped:,}{dropped}"),
            ("  empty", f"{o.empty:,}"),
            ("  bad records skipped", f"{o.bad_records_skipped:,}"),
        ]

    def _documents_in_rows(self) -> str:
        """The documents in the rows, and what became of the others read (as ``pack`` counts)."""
        o = self.outcome.documents
        if o.read == self.documents:
            return f"{self.documents:,}"
        others = [
            (o.empty, "empty"),
            (o.dropped, "dropped"),
            (o.bad_records_skipped, "bad skipped"),
        ]
        if self.sources is not None:  # a mixture takes some of the documents, some again
            taken = sum(s.documents for s in self.sources)  # copies counted
            rest = o.read - o.empty - o.dropped - o.bad_records_skipped
            others.append((f"{taken:,} taken by --mix of {rest:,} packable", ""))
        told = ", ".join(f"{n:,} {what}" if what else n for n, what in others if n)
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
            "outcome": self.outcome.to_record(),
            **({"alignment": self.alignment.to_dict()} if self.alignment is not None else {}),
            **({"sources": [s.to_dict() for s in self.sources]} if self.sources else {}),
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
    recorded: BalanceRecord | None,
    world_size: int | None,
    micro_batches: int | None,
    seed: int,
) -> BalanceStats | None:
    """The step balance of rows (costs in stored order) for ``world_size`` ranks (default:
    the recorded one), ``micro_batches`` rows per rank and step (default: the recorded one)."""
    recorded = recorded or BalanceRecord()
    w = world_size if world_size is not None else recorded.world_size
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
    balanced = recorded.world_size == w
    g = micro_batches or (int(recorded.micro_batches or 1) if balanced else 1)
    if balanced:
        stored_g = int(recorded.micro_batches or 1)
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
class AlignmentStats:
    """What ``--pad-to-multiple-of`` costs a pack: the pad tokens after its documents (their
    real tokens are ``packing``'s), as a share of all slots, and the rows FFD makes of the
    same segments without it."""

    multiple: int
    pad_tokens: int
    slots: int
    rows: int
    rows_unaligned: int

    @property
    def share_of_slots(self) -> float:
        return self.pad_tokens / self.slots if self.slots else 0.0

    def figure(self) -> tuple[str, str]:
        """The (label, value) row of the alignment's cost."""
        return (
            f"alignment pad (--pad-to-multiple-of {self.multiple:,})",
            f"{self.pad_tokens:,} tokens ({self.share_of_slots:.2%} of slots); "
            f"{self.rows:,} rows, {self.rows_unaligned:,} without it",
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "pad_to_multiple_of": self.multiple,
            "pad_tokens": self.pad_tokens,
            "share_of_slots": round(self.share_of_slots, 6),
            "rows": self.rows,
            "rows_unaligned": self.rows_unaligned,
        }


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
    alignment: AlignmentStats | None = None  # what --pad-to-multiple-of costs

    @property
    def sources(self) -> list[SourceStats] | None:
        """A mixture (pack --mix): each source's part (:attr:`PackingStats.sources`)."""
        return self.packing.sources

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
            "sources": None if self.sources is None else [s.to_dict() for s in self.sources],
            "alignment": None if self.alignment is None else self.alignment.to_dict(),
            "path": str(self.path),
            "shards": self.shards,
            "tokenizer": self.tokenizer,
            **self.packing.to_dict(),
            "document_lengths": self.document_lengths.to_dict(),
            "bad_records": list(self.bad_records),
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class SourceStats:
    """One source of a mixture in the rows (``source_ids``): its tokens, documents (copies
    counted) and segments, its share of the tokens (and the share its weight asked for), and
    its part of the padding: each row's padding shared among the sources of its tokens, in
    proportion to them (the parts add up to the padding)."""

    index: int
    path: str
    weight: float
    target_share: float
    tokens: int
    share: float
    documents: int
    segments: int
    padding: float
    epochs: float

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "share": round(self.share, 6),
            "padding": round(self.padding, 1),
        }

    def cells(self) -> tuple[str, ...]:
        """The row ``stats`` shows of the source (terminal and page), under
        :data:`SOURCE_COLUMNS`."""
        return (
            str(self.index),
            self.path,
            f"{self.tokens:,}",
            f"{self.share:.1%}",
            f"{self.target_share:.1%}",
            f"{self.documents:,}",
            f"{self.segments:,}",
            f"{self.padding:,.0f}",
            f"{self.epochs:.2f}",
        )


SOURCE_COLUMNS = (
    "#", "source", "tokens", "share", "target", "documents", "segments", "padding", "epochs"
)  # fmt: skip
"""The columns of ``stats``' table of a mixture's sources (:meth:`SourceStats.cells`)."""


def _source_stats(
    mixture: MixtureRecord,
    source_ids: np.ndarray,
    doc_ids: np.ndarray,
    lengths: np.ndarray,
    fill: np.ndarray,
    per_row: np.ndarray,
    max_len: int,
) -> list[SourceStats]:
    """Each source's part of the rows, from the ``source_ids`` column."""
    n = len(mixture.sources)
    row = np.repeat(np.arange(fill.size), per_row)
    lengths = lengths.astype(np.int64)
    tokens = np.bincount(source_ids, weights=lengths, minlength=n).astype(np.int64)
    segments = np.bincount(source_ids, minlength=n)
    pad = (max_len - fill).astype(np.float64)
    pad_share = lengths * (pad[row] / np.maximum(fill[row], 1))
    padding = np.bincount(source_ids, weights=pad_share, minlength=n)
    total = int(tokens.sum())
    out = []
    for src in mixture.sources:
        i = src.index
        mine = source_ids == i
        out.append(
            SourceStats(
                index=i,
                path=src.path,
                weight=src.weight,
                target_share=src.share,
                tokens=int(tokens[i]),
                share=tokens[i] / total if total else 0.0,
                documents=int(np.unique(doc_ids[mine]).size),
                segments=int(segments[i]),
                padding=float(padding[i]),
                epochs=src.epochs,
            )
        )
    return out


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
    segments: np.ndarray,
    rows: tuple[np.ndarray, np.ndarray],
    documents: int,
    outcome: Counts,
    max_len: int,
    batching: tuple[int, int],
) -> PackingStats:
    """The figures of one packing: ``segments`` (in input order), ``rows`` (each row's real
    tokens and segments), the ``documents`` in them, what became of those read (``outcome``),
    and the baselines' ``batching`` (batch size, seed)."""
    fill, docs_per_row = rows
    batch_size, seed = batching
    tokens = int(segments.sum(dtype=np.int64))
    n_rows = int(fill.size)
    return PackingStats(
        max_len=max_len,
        batch_size=batch_size,
        seed=seed,
        documents=documents,
        segments=int(segments.size),
        tokens=tokens,
        rows=n_rows,
        lower_bound_rows=lower_bound_rows(tokens, max_len),
        efficiency=tokens / (n_rows * max_len) if n_rows else 0.0,
        full_rows=int(np.count_nonzero(fill == max_len)),
        docs_per_row=_row_counts(docs_per_row),
        row_fill=histogram(fill, _edges(max_len, FILL_BINS)),
        comparison=_comparison(segments, n_rows, max_len, batch_size, seed),
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
    source_ids: list[np.ndarray] = field(default_factory=list)
    alignment_pad: int = 0  # pad tokens after the documents (--pad-to-multiple-of)

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
    aligned = "cu_seqlens_unpadded" in batch.schema.names
    real_val = _list_parts(batch.column("cu_seqlens_unpadded"), where)[1] if aligned else cu_val
    starts = cu_off[:-1]
    if aligned:  # the documents end at their padded boundary
        reach = ncu - 1 >= ndocs
        used = np.full(nt.size, max_len, np.int64)
        used[reach] = cu_val[(starts + ndocs)[reach]]
        padded = used < max_len
    else:
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
    bad = (
        (cu_val[starts] != 0)
        | (real_val[starts + ndocs] != nt)
        | (cu_val[cu_off[1:] - 1] != max_len)
    )
    if bad.any():
        fail(bad, "cu_seqlens does not run from 0 through num_tokens to max_len")

    n_seg = int(ndocs.sum())
    local = np.arange(n_seg, dtype=np.int64) - np.repeat(ch_off[:-1] - ch_off[0], ndocs)
    pos = np.repeat(starts, ndocs) + local
    lengths = real_val[pos + 1].astype(np.int64) - real_val[pos]
    if (lengths < 1).any():
        fail_segment(lengths < 1, "cu_seqlens does not rise strictly")
    if aligned:
        into.alignment_pad += int((cu_val[starts + ndocs] - nt).sum())
    into.fill.append(nt)
    into.per_row.append(ndocs)
    into.lengths.append(lengths.astype(np.int32))
    into.doc_ids.append(np.asarray(d_val[d_off[0] : d_off[-1]], dtype=np.int64))
    into.chunk_ids.append(np.asarray(ch_val[ch_off[0] : ch_off[-1]], dtype=np.int32))
    if "source_ids" in batch.schema.names:
        s_off, s_val = _list_parts(batch.column("source_ids"), where)
        bad = np.diff(s_off) != ndocs
        if bad.any():
            fail(bad, "source_ids and doc_ids differ in length")
        into.source_ids.append(np.asarray(s_val[s_off[0] : s_off[-1]], dtype=np.int64))


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
    reader = open_packed(path, strict=False)  # an older pack too
    manifest = reader.manifest
    max_len = reader.max_len
    cols = _Columns()
    first_row = 0
    names = column_names(False, Per.ROW, Per.BOUNDARY, Per.SEGMENT, aligned=reader.aligned)
    names += ["source_ids"] if reader.has_sources else []
    for shard, table in enumerate(reader.iter_tables(columns=names)):
        where = str(reader.shard_paths[shard])
        for batch in table.to_batches():
            _read_batch(batch, max_len, where, first_row, cols)
            first_row += batch.num_rows
    fill = _Columns._cat(cols.fill, np.int64)
    per_row = _Columns._cat(cols.per_row, np.int64)
    lengths = _Columns._cat(cols.lengths, np.int32)
    doc_ids = _Columns._cat(cols.doc_ids, np.int64)
    chunk_ids = _Columns._cat(cols.chunk_ids, np.int32)
    sources = None
    mixture = manifest.mixture
    if reader.has_sources and mixture is not None:
        source_ids = _Columns._cat(cols.source_ids, np.int64)
        if source_ids.size and (source_ids.min() < 0 or source_ids.max() >= len(mixture.sources)):
            raise FormatError(f"{reader.path}: a source id outside the mixture's sources "
                              "(run `packtool verify`)")  # fmt: skip
        sources = _source_stats(mixture, source_ids, doc_ids, lengths, fill, per_row, max_len)
    alignment = None
    if reader.aligned:
        unaligned = first_fit_decreasing(lengths, max_len) if lengths.size else lengths
        alignment = AlignmentStats(
            manifest.pad_to_multiple_of,
            cols.alignment_pad,
            first_row * max_len,
            first_row,
            int(unaligned.max()) + 1 if unaligned.size else 0,
        )
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

    packing = _packing_stats(
        segments,
        (fill, per_row),
        int(doc_lengths.size),
        manifest.counts,
        max_len,
        (batch_size, seed),
    )
    packing = replace(packing, sources=sources)
    return DatasetStats(
        path=reader.path,
        shards=len(reader.shard_paths),
        tokenizer=manifest.tokenizer.name,
        packing=packing,
        document_lengths=_length_summary(doc_lengths, max_len),
        bad_records=[str(b) for b in manifest.bad_records],
        seconds=time.perf_counter() - started,
        learned_tokens=manifest.counts.tokens.learned,
        units=_units_summary(manifest),
        balance=balance,
        alignment=alignment,
    )


def _units_summary(manifest: Manifest) -> dict[str, Any] | None:
    """What packing within units cost, from the manifest ``packtool merge`` wrote."""
    units = manifest.units
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


class _LengthsSink:
    """``stats``' sink (:func:`packtool.corpus.read_corpus`): every document's length kept
    (0 for an empty one) and, for documents with labels, the runs of learned tokens in each
    (document, start, end): all that the pipeline's cut needs at any ``max_len``."""

    def __init__(self) -> None:
        self.lengths: list[np.ndarray] = []
        self.runs: list[np.ndarray] = []
        self.documents = 0
        self.batches: list[tuple[int, int]] = []  # (first doc id, documents) of each batch

    def add(self, encoded: EncodedBatch, doc_ids: np.ndarray) -> Counts:
        lengths = np.where(encoded.empty, 0, encoded.lengths).astype(np.int64)
        if encoded.labels is not None:
            self.runs.append(_learned_runs(encoded, self.documents))
        self.lengths.append(lengths)
        self.documents += lengths.size
        if doc_ids is not None and doc_ids.size:  # a batch is of one input: counted by input
            self.batches.append((int(doc_ids[0]), int(lengths.size)))
        return Counts(DocumentCounts(read=int(lengths.size)))

    def checkpoint_due(self) -> bool:
        return False

    def checkpoint(self, state: ReadState) -> None:
        pass

    def tokenized(self, state: ReadState, labelled: bool) -> _Tokenized:
        """What was kept, with what the loop counted (``state``)."""
        runs = np.concatenate(self.runs, axis=1) if self.runs else np.zeros((3, 0), np.int64)
        # the documents each input gave, bad records apart (batches are in reading order)
        first = np.array([b[0] for b in self.batches], np.int64)
        done = np.concatenate([[0], np.cumsum([b[1] for b in self.batches], dtype=np.int64)])
        starts = np.array([r["first_doc"] for r in state.input_records], np.int64)
        ends = starts + np.array([r["documents"] for r in state.input_records], np.int64)
        per_file = done[np.searchsorted(first, ends)] - done[np.searchsorted(first, starts)]
        return _Tokenized(
            np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64),
            runs if labelled else None,
            state.counts.documents.bad_records_skipped,
            state.bad_records,
            state.special_strings,
            state.backend,
            tuple(int(n) for n in per_file),
        )


def _learned_runs(encoded: EncodedBatch, first_doc: int) -> np.ndarray:
    """The runs of learned tokens of an encoded batch, as (document, start, end) columns
    (``first_doc``: the number of its first document), within each non-empty document."""
    assert encoded.labels is not None
    offsets = encoded.offsets
    at = np.flatnonzero(encoded.labels != IGNORE_INDEX)
    doc = np.searchsorted(offsets, at, side="right") - 1
    starts = np.flatnonzero((np.diff(at, prepend=-2) != 1) | (np.diff(doc, prepend=-1) != 0))
    ends = np.append(starts[1:], at.size)[: starts.size] - 1
    run_doc = doc[starts]
    keep = ~encoded.empty[run_doc]
    run_doc = run_doc[keep]
    return np.stack(
        [
            run_doc + first_doc,
            at[starts[keep]] - offsets[run_doc],
            at[ends[keep]] + 1 - offsets[run_doc],
        ]
    ).astype(np.int64)


@dataclass(frozen=True)
class _Tokenized:
    """What the corpus loop keeps of a corpus: every (good) document's length, 0 for an
    empty one; the runs of learned tokens (documents with labels; else None); and what the
    readers counted."""

    lengths: np.ndarray
    runs: np.ndarray | None  # (3, n): document, start, end (within the document)
    bad_records_skipped: int
    bad_records: list[str]
    special_strings: int = 0  # documents whose data held special-token strings
    backend: dict[str, Any] | None = None  # the engine that encoded them (not cached)
    # The documents (entries of ``lengths``) of each input file, in order; None: not known
    # (a cache entry written before they were kept), which a mixture needs.
    file_documents: tuple[int, ...] | None = None

    def cut(self, max_len: int, overflow: Overflow) -> tuple[np.ndarray, Counts, int]:
        """The segments (in input order) ``pack`` cuts at ``max_len`` (the pipeline's own
        cut), their counts, and the documents with a segment in the rows."""
        items = self.items(max_len, overflow)
        return items.length, items.counts, items.in_rows

    def items(self, max_len: int, overflow: Overflow, *, learned: bool = False) -> _Items:
        """The items ``pack`` stores at ``max_len`` (the pipeline's own cut), in input order:
        each one's document (its index in ``lengths``) and tokens; with ``learned``, its
        learned tokens too (documents with labels)."""
        docs: list[np.ndarray] = []
        items: list[np.ndarray] = []
        learned_of: list[np.ndarray] = []
        counts = Counts().add_documents(self.bad_records_skipped, self.bad_records_skipped)
        in_rows = 0
        for lo, hi in self._blocks():
            lengths = self.lengths[lo:hi]
            doc, chunk, item_len, c, labels = cut_items(
                lengths, lengths == 0, self._labels(lo, hi), max_len, overflow, ignore=IGNORE_INDEX
            )
            docs.append(doc.astype(np.int64) + lo)
            items.append(item_len.astype(np.int64))
            if learned and labels is not None:  # the learned tokens of each item's span
                ends = np.concatenate([[0], np.cumsum(labels != IGNORE_INDEX)])
                start = (np.cumsum(lengths) - lengths)[doc] + chunk.astype(np.int64) * max_len
                learned_of.append(ends[start + item_len] - ends[start])
            counts += c
            in_rows += int(np.unique(doc).size)
        empty = np.zeros(0, np.int64)
        return _Items(
            np.concatenate(docs) if docs else empty,
            np.concatenate(items) if items else empty,
            counts,
            in_rows,
            (np.concatenate(learned_of) if learned_of else empty)
            if self.runs is not None and learned
            else None,
        )

    def _blocks(self) -> list[tuple[int, int]]:
        """Documents in blocks of about ``_LABELS_BLOCK`` tokens (one block without labels:
        the cut then needs the lengths only)."""
        n = int(self.lengths.size)
        if self.runs is None or not n:
            return [(0, n)]
        ends = np.cumsum(self.lengths)
        cuts = np.searchsorted(ends, np.arange(_LABELS_BLOCK, int(ends[-1]), _LABELS_BLOCK))
        bounds = np.unique(np.concatenate([[0], cuts + 1, [n]]).clip(0, n))
        return list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))

    def _labels(self, lo: int, hi: int) -> np.ndarray | None:
        """Flat labels of documents ``lo`` to ``hi`` (0 where learned, ``IGNORE_INDEX``
        elsewhere): what the labelled cut reads of them."""
        if self.runs is None:
            return None
        lengths = self.lengths[lo:hi]
        offsets = np.cumsum(lengths) - lengths
        doc, start, end = self.runs
        r = slice(*np.searchsorted(doc, [lo, hi]))
        edges = np.zeros(int(lengths.sum()) + 1, np.int64)
        np.add.at(edges, offsets[doc[r] - lo] + start[r], 1)
        np.add.at(edges, offsets[doc[r] - lo] + end[r], -1)
        learned = np.cumsum(edges[:-1]) > 0
        return np.where(learned, 0, IGNORE_INDEX).astype(np.int32)


_LABELS_BLOCK = 1 << 24  # tokens whose labels are made at a time, to cut documents with labels


@dataclass(frozen=True)
class _Items:
    """The items of a corpus cut at one ``max_len`` (:meth:`_Tokenized.items`)."""

    doc: np.ndarray  # each item's document (index in the corpus' lengths), ascending
    length: np.ndarray  # its tokens
    counts: Counts  # what became of the documents read
    in_rows: int  # documents with an item
    learned: np.ndarray | None = None  # its learned tokens (documents with labels, if asked)


def _load_cached(directory: Path, key: str) -> _Tokenized | None:
    try:
        meta = json.loads((directory / f"{key}.json").read_text(encoding="utf-8"))
        lengths = np.load(directory / f"{key}.npy", allow_pickle=False)
        runs = np.load(directory / f"{key}.runs.npy") if meta.get("labelled") else None
    except (OSError, ValueError, AttributeError, json.JSONDecodeError):
        return None  # absent, or damaged: tokenize again
    if (
        meta.get("documents") != int(lengths.size)
        or lengths.ndim != 1
        or lengths.dtype.kind != "i"
        or (runs is not None and (runs.ndim != 2 or runs.shape[0] != 3))
    ):
        return None
    per_file = meta.get("file_documents")
    if not isinstance(per_file, list) or sum(per_file) != int(lengths.size):
        per_file = None  # written before the inputs' documents were kept
    return _Tokenized(
        lengths.astype(np.int64, copy=False),
        None if runs is None else runs.astype(np.int64, copy=False),
        int(meta.get("bad_records_skipped", 0)),
        list(meta.get("bad_records", [])),
        int(meta.get("special_strings", 0)),
        file_documents=None if per_file is None else tuple(int(n) for n in per_file),
    )


def _store_cached(directory: Path, key: str, data: _Tokenized, describe: dict[str, Any]) -> None:
    """Write the lengths (and runs), then the JSON (last: it marks the entry complete),
    atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = f".tmp-{os.getpid()}"
    lengths = data.lengths
    if lengths.size and lengths.max() <= np.iinfo(np.int32).max:
        lengths = lengths.astype(np.int32)  # half the size; read back as int64
    arrays = {f"{key}.npy": lengths}
    if data.runs is not None:
        arrays[f"{key}.runs.npy"] = data.runs
    for name, array in arrays.items():
        with open(directory / f"{name}{tmp}", "wb") as f:
            np.save(f, array, allow_pickle=False)
        os.replace(directory / f"{name}{tmp}", directory / name)
    meta = {
        "documents": int(data.lengths.size),
        "labelled": data.runs is not None,
        "bad_records_skipped": data.bad_records_skipped,
        "bad_records": data.bad_records,
        "special_strings": data.special_strings,
        **({"file_documents": list(data.file_documents)} if data.file_documents else {}),
        **describe,
    }
    meta_tmp = directory / f"{key}.json{tmp}"
    meta_tmp.write_text(json.dumps(meta, indent=2), encoding="utf-8")
    os.replace(meta_tmp, directory / f"{key}.json")


def _lengths_of(
    prepared: Prepared,
    directory: Path | None,
    progress: ProgressCallback | None,
    per_file: bool = False,
) -> tuple[_Tokenized, bool, str]:
    """What the corpus loop keeps of a corpus: from the cache in ``directory`` (``None``: no
    cache) when it holds these inputs read and encoded this way, else read and encoded by
    the pipeline's own loop (:func:`packtool.corpus.read_corpus`, with a lengths-only sink)
    and cached. Returns them, whether they came from the cache, and the cache key (the
    prepare stage's fingerprint, as ``pack --resume``'s). ``per_file``: the documents of
    each input are needed (a mixture), so a cache entry that lacks them is read again."""
    files, o, plan, tok = prepared.files, prepared.options, prepared.plan, prepared.tokenizer
    plain = o.replace(mix=None, tokens=None, repeat=True)  # a mixture reads as a plain run
    skip = ("max_len", "overflow", "pad_id")
    reading = {k: v for k, v in plain.rows_key().items() if k not in skip}
    key = fingerprint_of(files, tok, _CACHE_FORMAT, __version__, reading, plan.describe())[:32]
    data = _load_cached(directory, key) if directory is not None else None
    if data is not None and per_file and data.file_documents is None:
        data = None
    if data is not None:
        if progress:
            total = sum(f.size_bytes for f in files)
            progress("tokenize", total, total)
        return data, True, key
    sink = _LengthsSink()
    state = read_corpus(files, plan, o, sink, ReadState(), progress)
    data = sink.tokenized(state, plan.labelled)
    if directory is not None:
        describe = {
            "inputs": [str(f.path) for f in files],
            "tokenizer": tok.name,
            "created_unix": int(time.time()),
        }
        with contextlib.suppress(OSError):  # a cache that cannot be written is no reason to fail
            _store_cached(directory, key, data, describe)
    return data, False, key


def _stats_at(
    data: _Tokenized, max_len: int, overflow: Overflow, batching: tuple[int, int], multiple: int
) -> PackingStats:
    """How the documents of ``data`` pack at ``max_len`` (the cut and FFD ``pack`` runs; with
    ``multiple`` > 1, over the segments padded to it, as ``--pad-to-multiple-of``)."""
    segments, outcome, in_rows = data.cut(max_len, overflow)
    spans = aligned_lengths(segments, multiple)
    row_of = first_fit_decreasing(spans, max_len)
    n_rows = int(row_of.max()) + 1 if row_of.size else 0
    fill = np.bincount(row_of, weights=segments, minlength=n_rows).astype(np.int64)
    per_row = np.bincount(row_of, minlength=n_rows).astype(np.int64)
    stats = _packing_stats(segments, (fill, per_row), in_rows, outcome, max_len, batching)
    if multiple == 1:
        return stats
    plain = first_fit_decreasing(segments, max_len)
    pad = int((spans - segments).sum())
    rows_plain = int(plain.max()) + 1 if plain.size else 0
    alignment = AlignmentStats(multiple, pad, n_rows * max_len, n_rows, rows_plain)
    return replace(stats, alignment=alignment)


@dataclass(frozen=True)
class _Mixture:
    """``stats CORPUS --mix``: the sources (one per input argument) and how ``pack --mix``
    would plan them."""

    names: list[str]  # the input arguments, as given
    weights: tuple[float, ...]
    files: list[int]  # the files each resolves to
    tokens: int | None  # --tokens
    repeat: bool
    seed: int
    paths: list[Any]  # the files, for "nothing to pack"

    def ranges(self, per_file: Sequence[int]) -> list[tuple[int, int]]:
        """Each source's documents (entries of the corpus' lengths): ``[first, end)``."""
        ends = np.cumsum([0, *per_file])
        bounds = np.cumsum([0, *self.files])
        return [(int(ends[a]), int(ends[b])) for a, b in itertools.pairwise(bounds)]


def _mixture_at(
    data: _Tokenized,
    max_len: int,
    overflow: Overflow,
    batching: tuple[int, int],
    multiple: int,
    mix: _Mixture,
) -> PackingStats:
    """:func:`_stats_at` of the rows ``pack --mix`` makes: the same plan
    (:func:`~packtool.mixture.plan_mixture` over the same documents' tokens, same seed), its
    items in the order ``pack`` packs them, the same first-fit-decreasing; with each source's
    part (:class:`SourceStats`, as ``stats OUT`` reports it)."""
    assert data.file_documents is not None
    cut = data.items(max_len, overflow, learned=data.runs is not None)
    if cut.length.size == 0:  # where pack stops, before any plan
        labels = cut.counts.labels
        without = labels.documents_without_labels if labels else 0
        raise cut.counts.documents.nothing_to_pack(mix.paths, without, data.bad_records)
    ids, lengths = source_documents(cut.doc, cut.length, mix.ranges(data.file_documents))
    plan = plan_mixture(
        lengths, mix.weights, mix.tokens, seed=mix.seed, repeat=mix.repeat, names=mix.names
    )
    at, copy, source = pick_items(cut.doc, [i[t.indices] for i, t in zip(ids, plan, strict=True)])
    segments = cut.length[at]
    spans = aligned_lengths(segments, multiple)
    row_of = first_fit_decreasing(spans, max_len)
    n_rows = int(row_of.max()) + 1 if row_of.size else 0
    fill = np.bincount(row_of, weights=segments, minlength=n_rows).astype(np.int64)
    per_row = np.bincount(row_of, minlength=n_rows).astype(np.int64)
    # each copy a document of its own, numbered as pack numbers them (d + copy * stride)
    doc = cut.doc[at] + copy * max(1, int(data.lengths.size))
    tokens = dataclasses.replace(
        cut.counts.tokens,
        packed=int(segments.sum()),
        learned=None if cut.learned is None else int(cut.learned[at].sum()),
    )
    outcome = dataclasses.replace(cut.counts, tokens=tokens)
    documents = int(sum(t.documents_taken for t in plan))
    in_order = np.argsort(doc, kind="stable")  # by document (copies after), then chunk
    stats = _packing_stats(
        segments[in_order], (fill, per_row), documents, outcome, max_len, batching
    )
    total = sum(mix.weights)
    record = MixtureRecord(
        sources=tuple(
            SourceRecord(
                index=i, path=name, weight=w, share=round(w / total, 6), epochs=take.epochs
            )
            for i, (name, w, take) in enumerate(zip(mix.names, mix.weights, plan, strict=True))
        )
    )
    by_row = np.argsort(row_of, kind="stable")
    sources = _source_stats(
        record, source[by_row], doc[by_row], segments[by_row], fill, per_row, max_len
    )
    alignment = None
    if multiple > 1:
        plain = first_fit_decreasing(segments, max_len)
        rows_plain = int(plain.max()) + 1 if plain.size else 0
        pad = int((spans - segments).sum())
        alignment = AlignmentStats(multiple, pad, n_rows * max_len, n_rows, rows_plain)
    return replace(stats, alignment=alignment, sources=sources)


def _mixture_inputs(
    inputs: Sequence[str | os.PathLike[str]], o: PackOptions, seed: int, skipped: list[Path]
) -> tuple[list[InputFile], _Mixture]:
    """``stats --mix``: each input argument a source, resolved as ``pack`` resolves it."""
    assert o.mix is not None
    files, sources = resolve_sources(inputs, o.mix, lambda s: resolve_inputs([s], skipped=skipped))
    tokens = o.tokens if isinstance(o.tokens, int) else None
    mix = _Mixture([s.path for s in sources], tuple(s.weight for s in sources),
                   [s.end_file - s.first_file for s in sources], tokens, o.repeat, seed,
                   [f.path for f in files])  # fmt: skip
    return files, mix


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
    for ``pack``). Instruction data (and ids with labels) is cut as ``pack`` cuts it: a
    chunk with nothing to learn is dropped, a document with nothing to learn is empty.

    ``corpus_stats(inputs, [L])`` and ``dataset_stats(pack(inputs, out, max_len=L))`` give
    the same :class:`PackingStats` figures. Special-token strings in the text are text unless
    ``parse_special``, as in ``pack``.
    """
    started = time.perf_counter()
    o = (options or PackOptions()).replace(**option_values)
    lens_wanted = parse_max_lens(max_lens)
    _check_batching(batch_size, seed)
    skipped: list[Path] = []
    if o.mix is not None:
        files, mix = _mixture_inputs(inputs, o, seed, skipped)
    else:
        files, mix = resolve_inputs(inputs, skipped=skipped), None
    # The prepare stage's choices (shape, tokenizer, plan), as pack makes them; nothing is
    # loaded until a document is encoded: cached lengths need no engine.
    prepared = prepare(files, o, preload=False)
    o, tok, plan = prepared.options, prepared.tokenizer, prepared.plan
    set_tokenizer_threads(o.num_proc)
    directory = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    cache = directory / "lengths" if use_cache else None
    data, hit, key = _lengths_of(prepared, cache, progress, per_file=mix is not None)
    for max_len in lens_wanted:  # each a multiple of --pad-to-multiple-of, as pack checks
        o.replace(max_len=max_len)
    batching, multiple = (batch_size, seed), o.alignment
    if mix is None:
        results = [_stats_at(data, m, plan.overflow, batching, multiple) for m in lens_wanted]
        documents = results[0].outcome.documents
        if documents.empty + documents.bad_records_skipped == documents.read:
            labels = results[0].outcome.labels
            raise documents.nothing_to_pack(
                [f.path for f in files], labels.documents_without_labels if labels else 0
            )
    else:  # the rows pack --mix would make at each max-len (its errors, pack's)
        results = [_mixture_at(data, m, plan.overflow, batching, multiple, mix)
                   for m in lens_wanted]  # fmt: skip
        documents = results[0].outcome.documents
    lengths = data.lengths
    ids = plan.read_ids is not None  # pre-tokenized: no engine encodes them
    backend = None if ids else encoder_backend(plan)
    return CorpusStats(
        inputs=[str(f.path) for f in files],
        tokenizer=tok.name,
        documents_read=documents.read,
        empty=int(np.count_nonzero(lengths == 0)),
        bad_records_skipped=documents.bad_records_skipped,
        document_lengths=_length_summary(lengths[lengths > 0], max(lens_wanted)),
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
                *(repack_notice(files, m, plan.overflow.value, o.alignment) for m in lens_wanted),
            )
            if n
        ],
        skipped_files=[str(p) for p in skipped],
        backend=None if hit or ids else data.backend,
    )
