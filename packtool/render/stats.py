"""rich renderables for ``packtool stats`` (used by the CLI only; the library never imports it).

Turns the dataclasses of :mod:`packtool.stats` into tables and bar histograms; computes
nothing that is not already in them.
"""

from __future__ import annotations

import json
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..stats import (
    BATCHING_LABELS,
    BATCHINGS,
    SOURCE_COLUMNS,
    BalanceStats,
    CorpusStats,
    DatasetStats,
    Histogram,
    PackingStats,
    imbalance_labels,
)
from .console import clean, say, stdout
from .pack import print_notices, say_bad_records, say_skipped

__all__ = ["render_corpus_stats", "render_dataset_stats", "say_written", "show_stats"]

BAR_WIDTH = 40
_EIGHTHS = " ▏▎▍▌▋▊▉"


def _bar(count: int, top: int, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of ``count / top`` of ``width`` cells, in eighths of a cell."""
    if top <= 0 or count <= 0:
        return ""
    eighths = max(1, round(8 * width * count / top))
    full, part = divmod(eighths, 8)
    return "█" * full + (_EIGHTHS[part] if part else "")


def _pct(x: float) -> str:
    return f"{x:.1%}"


def histogram_table(
    title: str, hist: Histogram, *, percent_of: int | None = None, above: str = ""
) -> Table:
    """One histogram as a table: bin, count, share, and a bar."""
    counts = list(hist.counts)
    labels = hist.labels(percent_of)
    if hist.above:
        counts.append(hist.above)
        labels.append(above or f"> {hist.edges[-1]:,}")
    return _counts_table(title, labels, counts)


def _counts_table(title: str, labels: list[str], counts: list[int]) -> Table:
    """Bins as a table: label, count, share, and a bar."""
    total, top = sum(counts), max(counts, default=0)
    table = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    table.add_column(justify="right", style="bold")
    table.add_column(justify="right")
    table.add_column(justify="right", style="dim")
    table.add_column(style="cyan", no_wrap=True)
    for label, count in zip(labels, counts, strict=True):
        share = f"{count / total:.1%}" if total else ""
        table.add_row(label, f"{count:,}", share, _bar(count, top))
    return table


_CAPTION = (
    "slots: token positions computed; padding: share of them that are padding; saved: slots "
    "packing avoids; speed-up: real tokens per slot, packed / that batching (docs/stats.md)"
)


def _comparison_rows(table: Table, p: PackingStats, first: str | None = None) -> None:
    for i, key in enumerate(BATCHINGS):
        b = p.comparison[key]
        saved = "-" if key == "packed" else f"{b.slots_saved:,}"
        speedup = "-" if b.speedup is None else f"{b.speedup:.2f}x"
        cells = [
            BATCHING_LABELS[key],
            f"{b.slots:,}",
            _pct(b.padding_fraction),
            saved,
            speedup,
        ]
        if first is not None:
            cells.insert(0, first if i == 0 else "")
        table.add_row(*cells, style="bold" if key == "packed" else None)


def comparison_table(results: list[PackingStats], title: str) -> Table:
    """Packed rows against padded batching, for one or several max_len."""
    several = len(results) > 1
    table = Table(
        title=title,
        title_justify="left",
        caption=_CAPTION,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    if several:
        table.add_column("max_len", justify="right", no_wrap=True)
    table.add_column("batching", no_wrap=True)
    table.add_column("slots", justify="right", no_wrap=True)
    table.add_column("padding", justify="right", no_wrap=True)
    table.add_column("saved", justify="right", no_wrap=True)
    table.add_column("speed-up", justify="right", no_wrap=True)
    for p in results:
        _comparison_rows(table, p, f"{p.max_len:,}" if several else None)
        if several:
            table.add_section()
    return table


def _key_value_table(title: str | None, pairs: list[tuple[str, str]]) -> Table:
    table = Table(title=title, title_justify="left", show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(justify="right")
    for k, v in pairs:
        table.add_row(k, v)
    return table


def _title(p: PackingStats) -> str:
    return (
        f"Packed rows vs padded batches of {p.batch_size} "
        f"(random batches: seed {p.seed}; length-grouped: sorted)"
    )


def render_dataset_stats(s: DatasetStats) -> RenderableType:
    """Everything ``packtool stats OUT_DIR`` prints."""
    p = s.packing
    head = Text.assemble(
        ("stats of ", ""),
        (clean(s.path), "bold"),
        f"  max_len {p.max_len:,} · {s.shards:,} shard{'s' if s.shards != 1 else ''}"
        + (f" · tokenizer {clean(s.tokenizer)}" if s.tokenizer else ""),
    )
    pairs = p.figures()
    if s.learned_tokens is not None:
        share = s.learned_share_of_slots or 0.0
        pairs.append(("learned tokens (labels)", f"{s.learned_tokens:,} ({share:.2%} of slots)"))
    if s.units is not None:
        u = s.units
        pairs.append(
            (
                f"packed in {u['count']:,} units",
                f"+{u['rows_over_global_ffd']:,} rows ({u['packing_loss']:.3%}) over one "
                f"global FFD ({u['global_ffd_rows']:,} rows)",
            )
        )
    if s.alignment is not None:
        pairs.append(s.alignment.figure())
    pairs.extend(s.document_lengths.figures())
    parts: list[RenderableType] = [
        head,
        _key_value_table(None, pairs),
        Text(""),
        comparison_table([p], _title(p)),
        Text(""),
        histogram_table(
            "Document lengths (tokens, chunks of split documents joined)",
            s.document_lengths.histogram,
            above=f"> {p.max_len:,} (split)",
        ),
        Text(""),
        histogram_table("Row fill (real tokens / max_len)", p.row_fill, percent_of=p.max_len),
        Text(""),
        histogram_table("Documents per row", p.docs_per_row.histogram),
        Text(""),
        _key_value_table("What happened to the documents", p.outcome_figures()),
    ]
    if s.balance is not None:
        parts += [Text(""), *balance_parts(s.balance)]
    if s.sources is not None:
        parts += [Text(""), sources_table(s.sources)]
    return Group(*parts)


def sources_table(sources: list[Any], title: str = "Sources (pack --mix)") -> Table:
    """A mixture's sources in the rows: tokens, share (and the weight's), documents (copies
    counted), segments, padding (each row's, shared by its tokens), epochs."""
    table = Table(title=title, title_justify="left", box=None, padding=(0, 1))
    for name in SOURCE_COLUMNS:
        if name == "source":
            table.add_column(name, justify="left", overflow="fold")
        else:
            table.add_column(name, justify="right", no_wrap=True)
    for s in sources:
        index, path, *figures = s.cells()
        table.add_row(index, clean(path), *figures)
    return table


def balance_line(b: BalanceStats) -> str:
    """The one line of ``stats --world-size``: stored order against a random one."""
    how = "balanced layout" if b.layout == "balanced" else "plain split, not balanced"
    return (
        f"step imbalance at world size {b.world_size} x {b.micro_batches} row"
        f"{'s' if b.micro_batches != 1 else ''} per step ({b.steps:,} steps, {how}): "
        f"{b.imbalance:.3f} stored, {b.random_imbalance:.3f} random; attention time lost "
        f"waiting for the slowest rank {b.time_lost:.1%} stored, {b.random_time_lost:.1%} "
        f"random (tokens: {b.token_imbalance:.3f})"
    )


def _imbalance_table(title: str, hist: Histogram) -> Table:
    return _counts_table(title, imbalance_labels(hist), [*hist.counts, hist.above])


def balance_parts(b: BalanceStats) -> list[RenderableType]:
    """The line and the two histograms of the steps' imbalance (slowest rank / mean)."""
    return [
        Text(balance_line(b)),
        Text(""),
        _imbalance_table("Steps by imbalance, stored order (slowest rank over mean)", b.histogram),
        Text(""),
        _imbalance_table("Steps by imbalance, random order", b.random_histogram),
    ]


def render_corpus_stats(s: CorpusStats) -> RenderableType:
    """Everything ``packtool stats CORPUS --max-len ...`` prints."""
    inputs = s.inputs[0] if len(s.inputs) == 1 else f"{len(s.inputs):,} inputs"
    engine = (s.backend or {}).get("name")
    source = (
        "lengths from the cache"
        if s.cache_hit
        else "ids as stored, not tokenized"  # pre-tokenized ids, a pack's own: no engine
        if s.backend is None
        else f"tokenized with {engine}"
        if engine not in (None, "none", "custom")
        else "tokenized"
    )
    head = Text.assemble(
        ("stats of corpus ", ""),
        (clean(inputs), "bold"),
        f"  tokenizer {clean(s.tokenizer)} · {s.documents_read:,} documents read ({source})",
    )
    mixed = any(p.sources is not None for p in s.results)
    summary = Table(
        title="Packing at each max_len" + (" (the rows pack --mix would make)" if mixed else ""),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for name in (
        "max_len",
        "rows",
        "over bound",
        "efficiency",
        "docs/row",
        "split",
        "truncated",
        "dropped",
    ):
        summary.add_column(name, justify="right", no_wrap=True)
    for p in s.results:
        o = p.outcome.documents
        summary.add_row(
            f"{p.max_len:,}",
            f"{p.rows:,}",
            f"+{p.rows_over_lower_bound:,}",
            f"{p.efficiency:.2%}",
            "-" if p.docs_per_row.mean is None else f"{p.docs_per_row.mean:.2f}",
            f"{o.split:,}",
            f"{o.truncated:,}",
            f"{o.dropped:,}",
        )
    caption = []
    if mixed:  # pack --mix cuts every document read, then takes some (as its summary says)
        taken = "; ".join(f"{p.documents:,} at {p.max_len:,}" for p in s.results)
        caption.append(
            f"documents --mix takes (copies counted): {taken}; split, truncated and dropped "
            "count every document read"
        )
    aligned = [p for p in s.results if p.alignment is not None]
    if aligned:  # what --pad-to-multiple-of costs, under the table
        multiple = aligned[0].alignment.multiple if aligned[0].alignment else 0
        caption.append(f"alignment pad (--pad-to-multiple-of {multiple}):")
        caption += [
            f"  {p.max_len:,}: {p.alignment.pad_tokens:,} tokens "
            f"({p.alignment.share_of_slots:.2%} of slots); {p.alignment.rows_unaligned:,} rows "
            "without it"
            for p in aligned
            if p.alignment is not None
        ]
    if caption:
        summary.caption = "\n".join(caption)
        summary.caption_justify = "left"
    top = max(p.max_len for p in s.results)
    parts: list[RenderableType] = [
        head,
        _key_value_table(
            None,
            [
                ("documents read", f"{s.documents_read:,}"),
                ("  empty", f"{s.empty:,}"),
                ("  bad records skipped", f"{s.bad_records_skipped:,}"),
                ("tokens (with EOS/BOS)", f"{s.document_lengths.tokens:,}"),
                *s.document_lengths.figures(),
            ],
        ),
        Text(""),
        histogram_table(
            "Document lengths, tokens", s.document_lengths.histogram, above=f"> {top:,}"
        ),
        Text(""),
        summary,
        Text(""),
        comparison_table(s.results, _title(s.results[0])),
    ]
    for p in s.results:  # --mix: the rows pack --mix would make, by source
        if p.sources is not None:
            title = f"Sources at max_len {p.max_len:,} (as pack --mix would take them)"
            parts += [Text(""), sources_table(p.sources, title)]
    return Group(*parts)


def show_stats(result: Any, *, as_json: bool) -> None:
    """What ``stats`` shows of a :class:`DatasetStats` (a packed output) or a
    :class:`CorpusStats` (a corpus, with the notes of its tokenizer first)."""
    corpus = isinstance(result, CorpusStats)
    if corpus and not as_json:
        print_notices(result, quiet=False)
    say_skipped(getattr(result, "skipped_files", []), False)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
        return
    stdout().print(render_corpus_stats(result) if corpus else render_dataset_stats(result))
    say_bad_records(result.bad_records)


def say_written(paths: list[Any], *, quiet: bool) -> None:
    """The line naming the page and charts ``stats --html/--svg`` wrote (on stderr with
    ``--json``, so standard output stays one JSON object)."""
    if not paths:
        return
    names = ", ".join(str(p) for p in paths[:3]) + (
        f" and {len(paths) - 3} more" if len(paths) > 3 else ""
    )
    say(f"wrote {names}", err=quiet)
