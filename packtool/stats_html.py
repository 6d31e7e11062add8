"""``packtool stats --html``/``--svg``: the figures of :mod:`packtool.stats` as a page to share.

One self-contained HTML page: the key figures as tables and every histogram drawn as an inline
SVG chart. The page loads nothing (no script, no external style, font or image), so it opens
offline and can be mailed or attached to an experiment log as one file. The charts are the
same histograms the terminal report draws (:mod:`packtool.render.stats`); nothing here computes
a figure that is not in the stats records.

Charts of a packed output (:class:`~packtool.stats.DatasetStats`)::

    document-lengths   documents by length in tokens
    row-fill           rows by real tokens / max_len
    docs-per-row       rows by the number of documents they hold
    padding            slots (token positions computed) packed against the padded baselines
    balance            steps by imbalance, stored order against a random one (--world-size)

Of a corpus (:class:`~packtool.stats.CorpusStats`): document lengths, and for each max-len
its padding comparison and row fill.

The tables of figures are the terminal report's, a mixture's sources included (``stats OUT`` of
a ``pack --mix`` output, and each max-len of ``stats CORPUS --mix``: the table of
:data:`~packtool.stats.SOURCE_COLUMNS`).
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import OptionError
from .stats import (
    BATCHING_LABELS,
    BATCHINGS,
    SOURCE_COLUMNS,
    BalanceStats,
    CorpusStats,
    DatasetStats,
    Histogram,
    PackingStats,
    SourceStats,
    imbalance_labels,
)

__all__ = ["Chart", "charts", "stats_page", "write_html", "write_svgs"]

_BAR_HEIGHT = 18
_GAP = 4
_LABEL_WIDTH = 150
_BAR_WIDTH = 360
_VALUE_WIDTH = 290
_TITLE_HEIGHT = 26
_FONT = "font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif"
_COLOURS = ("#3b82c4", "#c8832a")  # the first series, the second (a baseline)


@dataclass(frozen=True)
class Chart:
    """One chart: a file-safe ``name`` (``row-fill``), its ``title`` and its ``svg`` text."""

    name: str
    title: str
    svg: str


_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _e(text: object) -> str:
    """``text`` escaped for HTML and XML; characters XML cannot hold (control characters, lone
    surrogates of an undecodable file name) are written as ``\\xNN``/``\\uNNNN``."""
    visible = _NOT_XML.sub(lambda m: repr(m.group())[1:-1], str(text))
    return html.escape(visible, quote=True)


def bar_chart(
    title: str,
    labels: Sequence[str],
    series: Sequence[tuple[str, Sequence[float]]],
    *,
    value_text: Sequence[Sequence[str]] | None = None,
) -> str:
    """Horizontal bars, one group a label, one bar a series (at most two), as an SVG element.

    ``value_text[s][i]`` is written after bar ``i`` of series ``s`` (default: the count and its
    share of the series' total). Lengths are relative to the largest value of all series.
    """
    if not 1 <= len(series) <= len(_COLOURS):
        raise ValueError(f"a chart holds one or two series, got {len(series)}")
    for name, values in series:
        if len(values) != len(labels):
            raise ValueError(f"series {name!r}: {len(values)} values for {len(labels)} labels")
    top = max((v for _, values in series for v in values), default=0) or 1
    group = len(series) * _BAR_HEIGHT + _GAP * 2
    legend = _TITLE_HEIGHT if len(series) > 1 else 0
    height = _TITLE_HEIGHT + legend + group * len(labels) + _GAP
    width = _LABEL_WIDTH + _BAR_WIDTH + _VALUE_WIDTH
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}" '
        f'style="{_FONT};font-size:12px">',
        f"<title>{_e(title)}</title>",
        f'<text x="0" y="16" font-weight="bold" font-size="14">{_e(title)}</text>',
    ]
    if legend:
        x = _LABEL_WIDTH
        for (name, _), colour in zip(series, _COLOURS, strict=False):
            out.append(
                f'<rect x="{x}" y="{_TITLE_HEIGHT + 4}" width="12" height="12" fill="{colour}"/>'
            )
            out.append(f'<text x="{x + 16}" y="{_TITLE_HEIGHT + 14}">{_e(name)}</text>')
            x += 40 + 7 * len(name)
    for s, ((_, values), colour) in enumerate(zip(series, _COLOURS, strict=False)):
        total = sum(values)
        for i, value in enumerate(values):
            y = _TITLE_HEIGHT + legend + i * group + _GAP + s * _BAR_HEIGHT
            length = round(_BAR_WIDTH * value / top, 2) if value > 0 else 0
            if value > 0:
                length = max(length, 1.0)
            if value_text is not None:
                text = value_text[s][i]
            else:
                text = f"{value:,.0f}" + (f" ({value / total:.1%})" if total else "")
            out.append(
                f'<rect x="{_LABEL_WIDTH}" y="{y + 2}" width="{length}" '
                f'height="{_BAR_HEIGHT - 4}" fill="{colour}"><title>{_e(labels[i])}: '
                f"{_e(text)}</title></rect>"
            )
            out.append(
                f'<text x="{_LABEL_WIDTH + length + 6}" y="{y + _BAR_HEIGHT - 5}" '
                f'fill="#333">{_e(text)}</text>'
            )
        if s == 0:
            for i, label in enumerate(labels):
                y = _TITLE_HEIGHT + legend + i * group + _GAP + _BAR_HEIGHT - 5
                out.append(
                    f'<text x="{_LABEL_WIDTH - 8}" y="{y}" text-anchor="end">{_e(label)}</text>'
                )
    out.append("</svg>")
    return "\n".join(out)


def _histogram_chart(
    name: str, title: str, hist: Histogram, *, percent_of: int | None = None, above: str = ""
) -> Chart:
    labels, counts = hist.labels(percent_of), list(hist.counts)
    if hist.above:
        labels.append(above or f"> {hist.edges[-1]:,}")
        counts.append(hist.above)
    return Chart(name, title, bar_chart(title, labels, [("count", counts)]))


def _padding_chart(name: str, p: PackingStats) -> Chart:
    title = f"Slots computed at max_len {p.max_len:,}, batch size {p.batch_size}"
    slots = [p.comparison[k].slots for k in BATCHINGS]
    texts = []
    for k in BATCHINGS:
        b = p.comparison[k]
        speed = "" if k == "packed" or b.speedup is None else f", packing {b.speedup:.2f}x"
        texts.append(f"{b.slots:,} ({b.padding_fraction:.1%} padding{speed})")
    labels = [BATCHING_LABELS[k] for k in BATCHINGS]
    return Chart(name, title, bar_chart(title, labels, [("slots", slots)], value_text=[texts]))


def _balance_chart(b: BalanceStats) -> Chart:
    title = (
        f"Steps by imbalance (slowest rank over mean), world size {b.world_size} x "
        f"{b.micro_batches}"
    )
    stored = [*b.histogram.counts, b.histogram.above]
    random = [*b.random_histogram.counts, b.random_histogram.above]
    svg = bar_chart(
        title, imbalance_labels(b.histogram), [("stored order", stored), ("random order", random)]
    )
    return Chart("balance", title, svg)


def charts(result: DatasetStats | CorpusStats) -> list[Chart]:
    """The charts of a packed output's or a corpus's stats, in the page's order."""
    if isinstance(result, CorpusStats):
        top = max(p.max_len for p in result.results)
        out = [
            _histogram_chart(
                "document-lengths",
                "Document lengths (tokens, with EOS/BOS)",
                result.document_lengths.histogram,
                above=f"> {top:,}",
            )
        ]
        for p in result.results:
            out.append(_padding_chart(f"padding-{p.max_len}", p))
            out.append(
                _histogram_chart(
                    f"row-fill-{p.max_len}",
                    f"Row fill at max_len {p.max_len:,} (real tokens / max_len)",
                    p.row_fill,
                    percent_of=p.max_len,
                )
            )
        return out
    p = result.packing
    out = [
        _histogram_chart(
            "document-lengths",
            "Document lengths (tokens, chunks of split documents joined)",
            result.document_lengths.histogram,
            above=f"> {p.max_len:,} (split)",
        ),
        _histogram_chart(
            "row-fill", "Row fill (real tokens / max_len)", p.row_fill, percent_of=p.max_len
        ),
        _histogram_chart("docs-per-row", "Documents per row", p.docs_per_row.histogram),
        _padding_chart("padding", p),
    ]
    if result.balance is not None:
        out.append(_balance_chart(result.balance))
    return out


def _table(rows: Sequence[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f'<table class="figures">{cells}</table>'


def _sources_table(sources: Sequence[SourceStats], title: str, name: str) -> str:
    """A mixture's sources in the rows, as the terminal's table (:data:`SOURCE_COLUMNS`,
    :meth:`~packtool.stats.SourceStats.cells`): one row a source."""
    head = "".join(f"<th>{_e(c)}</th>" for c in SOURCE_COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(v)}</td>" for v in s.cells()) + "</tr>" for s in sources
    )
    return (
        f"<h3>{_e(title)}</h3>"
        f'<table class="sources" id="{name}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table>"
    )


def _packing_rows(p: PackingStats) -> list[tuple[str, str]]:
    """The terminal report's rows of one packing: its figures, then the documents' outcome."""
    return [("max_len", f"{p.max_len:,}"), *p.figures(), *p.outcome_figures()]


def _figures(result: DatasetStats | CorpusStats) -> tuple[str, str]:
    """The page's heading and its tables of figures."""
    if isinstance(result, CorpusStats):
        what = result.inputs[0] if len(result.inputs) == 1 else f"{len(result.inputs)} inputs"
        head = f"stats of corpus {what}"
        rows = [
            ("tokenizer", result.tokenizer),
            ("documents read", f"{result.documents_read:,}"),
            ("tokens (with EOS/BOS)", f"{result.document_lengths.tokens:,}"),
        ]
        body = _table(rows)
        for p in result.results:
            body += f"<h3>max_len {p.max_len:,}</h3>" + _table(_packing_rows(p))
            if p.sources is not None:  # --mix: the rows pack --mix would make, by source
                title = f"Sources at max_len {p.max_len:,} (as pack --mix would take them)"
                body += _sources_table(p.sources, title, f"sources-{p.max_len}")
        return head, body
    p = result.packing
    rows = [("path", str(result.path)), ("shards", f"{result.shards:,}")]
    if result.tokenizer:
        rows.append(("tokenizer", result.tokenizer))
    rows += _packing_rows(p) + result.document_lengths.figures()
    if result.learned_tokens is not None:
        share = result.learned_share_of_slots or 0.0
        rows.append(("learned tokens", f"{result.learned_tokens:,} ({share:.2%} of slots)"))
    if result.balance is not None:
        b = result.balance
        rows.append(
            (
                f"step imbalance, {b.world_size} ranks",
                f"{b.imbalance:.3f} stored, {b.random_imbalance:.3f} random",
            )
        )
    body = _table(rows)
    if result.sources is not None:
        body += _sources_table(result.sources, "Sources (pack --mix)", "sources")
    return f"stats of {result.path}", body


_STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:2em;
color:#222;max-width:900px}
h1{font-size:1.3em;word-break:break-all}
table.figures{border-collapse:collapse;margin:.5em 0 1.5em}
table.figures th{text-align:left;font-weight:normal;color:#555;padding:2px 1.5em 2px 0}
table.figures td{font-variant-numeric:tabular-nums}
table.sources{border-collapse:collapse;margin:.5em 0 1.5em}
table.sources th{font-weight:normal;color:#555;padding:2px .8em 2px 0;text-align:right}
table.sources td{font-variant-numeric:tabular-nums;padding:2px .8em 2px 0;text-align:right}
table.sources th:nth-child(2),table.sources td:nth-child(2){text-align:left;word-break:break-all}
figure{margin:0 0 1.5em}
footer{color:#777;font-size:.85em}
"""


def stats_page(result: DatasetStats | CorpusStats) -> str:
    """The whole page: figures and charts, self-contained (no script, nothing loaded)."""
    from ._version import __version__

    head, figures = _figures(result)
    figs = "\n".join(f'<figure id="{c.name}">\n{c.svg}\n</figure>' for c in charts(result))
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_e(head)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        f"<h1>{_e(head)}</h1>\n{figures}\n{figs}\n"
        f"<footer>packtool {_e(__version__)} · docs/stats.md explains every figure</footer>\n"
        "</body>\n</html>\n"
    )


def _write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a temporary file renamed; one a
    killed run left is removed first)."""
    from .format.output import remove_stale_temporaries

    remove_stale_temporaries(path)
    tmp = path.with_name(f".{path.name}.packtool-tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_html(result: DatasetStats | CorpusStats, path: str | os.PathLike[str]) -> Path:
    """Write :func:`stats_page` of ``result`` to ``path`` (its directory must exist)."""
    target = Path(path)
    if not target.parent.is_dir():
        raise OptionError(f"--html {target}: the directory {target.parent} does not exist")
    _write_text(target, stats_page(result))
    return target


def write_svgs(result: DatasetStats | CorpusStats, directory: str | os.PathLike[str]) -> list[Path]:
    """Write each chart of ``result`` as ``DIRECTORY/NAME.svg`` (the directory is made)."""
    target = Path(directory)
    if target.exists() and not target.is_dir():
        raise OptionError(f"--svg {target}: a file of that name exists (give a directory)")
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for chart in charts(result):
        path = target / f"{chart.name}.svg"
        _write_text(path, '<?xml version="1.0" encoding="utf-8"?>\n' + chart.svg + "\n")
        written.append(path)
    return written
