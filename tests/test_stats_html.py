"""`packtool stats --html/--svg`: one self-contained page, its charts, and a real browser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import SAMPLE, CharTokenizer, write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import assert_one_line_error, run

import packtool
from packtool.stats import BATCHINGS, Histogram
from packtool.stats_html import _BAR_WIDTH, bar_chart, charts, stats_page, write_svgs

SVG = "{http://www.w3.org/2000/svg}"


class _Page(HTMLParser):
    """Every start tag with its attributes, and the text, of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse_page(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    page.close()
    return page


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("page") / "out <&> 'q'"
    packtool.pack([SAMPLE], out, max_len=1024, world_size=4)
    return out


def bars(svg: str) -> list[float]:
    """The widths of an SVG chart's bars, in drawing order."""
    root = ET.fromstring(svg)
    return [
        float(r.get("width", 0))
        for r in root.iter(f"{SVG}rect")
        if r.find(f"{SVG}title") is not None
    ]


def test_page_is_self_contained_and_draws_every_histogram(packed: Path) -> None:
    stats = packtool.dataset_stats(packed)
    page = stats_page(stats)
    parsed = parse_page(page)
    names = [t for t, _ in parsed.tags]
    # nothing to run, nothing to load: no script, no link, no image, no frame, no url()
    assert not {"script", "link", "img", "iframe", "object", "embed"} & set(names)
    for _, attrs in parsed.tags:
        assert "src" not in attrs
        assert not any(k.startswith("on") for k in attrs), attrs
        href = attrs.get("href")
        assert href is None or href.startswith("#"), href
    assert "url(" not in page and "@import" not in page
    figures = [a["id"] for t, a in parsed.tags if t == "figure"]
    assert figures == ["document-lengths", "row-fill", "docs-per-row", "padding", "balance"]
    # the path, with its markup characters, is shown as text, never as markup
    assert str(packed) in "".join(parsed.text)
    assert "<&>" not in page.replace(str(packed), "")
    p = stats.packing
    by_name = {c.name: c for c in charts(stats)}
    fill = by_name["row-fill"]
    counts = list(p.row_fill.counts)
    widths = bars(fill.svg)
    assert len(widths) == len(counts)
    top = max(counts)
    for count, width in zip(counts, widths, strict=True):
        expected = 0 if count == 0 else max(1.0, round(_BAR_WIDTH * count / top, 2))
        assert width == pytest.approx(expected)
    # document lengths: every bin, and the split documents above max_len in their own bar
    h = stats.document_lengths.histogram
    assert len(bars(by_name["document-lengths"].svg)) == len(h.counts) + (1 if h.above else 0)
    # the padding comparison: one bar per batching, longest for the padded baseline
    slots = [p.comparison[k].slots for k in BATCHINGS]
    widths = bars(by_name["padding"].svg)
    assert widths.index(max(widths)) == slots.index(max(slots))
    # balance: stored and random orders, both series
    b = stats.balance
    assert b is not None
    assert len(bars(by_name["balance"].svg)) == 2 * (len(b.histogram.counts) + 1)
    assert f"{p.efficiency:.2%}" in page and f"{p.rows:,}" in page


def test_corpus_page_has_a_chart_per_max_len(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "x" * (i % 50 + 1)} for i in range(300)])
    stats = packtool.corpus_stats([str(corpus)], [64, 128], tokenizer=CharTokenizer())
    names = [c.name for c in charts(stats)]
    assert names == ["document-lengths", "padding-64", "row-fill-64", "padding-128", "row-fill-128"]
    page = parse_page(stats_page(stats))
    assert [a["id"] for t, a in page.tags if t == "figure"] == names


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=30),
    st.text(min_size=1, max_size=20),  # control characters and surrogates too
)
def test_bar_chart_is_valid_svg_with_proportional_bars(counts: list[int], title: str) -> None:
    labels = [f"<{i}&" for i in range(len(counts))]
    svg = bar_chart(title, labels, [("count", counts)])
    root = ET.fromstring(svg)  # escaped: any title and label parse
    shown = root.find(f"{SVG}title").text
    visible = {c for c in title if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF}
    assert visible <= set(shown or "")
    widths = bars(svg)
    assert len(widths) == len(counts)
    top = max(counts)
    for c, w in zip(counts, widths, strict=True):
        assert (w == 0) == (c == 0)
        if c:
            assert w == pytest.approx(max(1.0, round(_BAR_WIDTH * c / top, 2)))
            assert w <= _BAR_WIDTH


def test_histogram_labels_are_the_terminal_reports() -> None:
    h = Histogram(edges=(0, 4, 8, 12, 16), counts=(1, 0, 1, 2))
    assert h.labels() == ["≤ 4", "5–8", "9–12", "13–16"]
    assert h.labels(percent_of=16) == ["0–25%", "25–50%", "50–75%", "75–100%"]


def test_cli_writes_page_and_svgs(packed: Path, tmp_path: Path) -> None:
    page, svg_dir = tmp_path / "stats.html", tmp_path / "charts"
    result = run("stats", packed, "--html", page, "--svg", svg_dir, "--json")
    assert result.exit_code == 0, result.output + result.stderr
    figures = json.loads(result.stdout)  # stdout stays one JSON object
    assert figures["rows"] > 0
    assert "wrote" in result.stderr and str(page) in result.stderr
    assert parse_page(page.read_text(encoding="utf-8")).tags
    files = sorted(p.name for p in svg_dir.iterdir())
    assert files == sorted(
        f"{n}.svg" for n in ("document-lengths", "row-fill", "docs-per-row", "padding", "balance")
    )
    for f in svg_dir.iterdir():
        ET.parse(f)  # each a standalone SVG document
    # no temporary file left beside them
    assert not [p for p in tmp_path.rglob("*packtool-tmp*")]


def test_cli_refuses_a_page_in_a_missing_directory(packed: Path, tmp_path: Path) -> None:
    result = run("stats", packed, "--html", tmp_path / "nope" / "p.html")
    assert_one_line_error(result, r"--html .*nope.* does not exist")
    (tmp_path / "afile").write_text("x")
    result = run("stats", packed, "--svg", tmp_path / "afile")
    assert_one_line_error(result, r"--svg .*afile.*a file of that name exists")


def test_write_svgs_replaces_charts_whole(packed: Path, tmp_path: Path) -> None:
    stats = packtool.dataset_stats(packed)
    first = write_svgs(stats, tmp_path / "c")
    again = write_svgs(stats, tmp_path / "c")
    assert first == again and all(p.read_text().startswith("<?xml") for p in again)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium(*args: str, user_data: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM, (
        "the browser test needs Chromium from the OS packages (apt-get install chromium; "
        "the README's test command installs it)"
    )
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--enable-logging=stderr",
        "--v=0",
        f"--user-data-dir={user_data}",
    ]
    return subprocess.run(
        [CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.slow
def test_a_real_browser_renders_the_page_offline(packed: Path, tmp_path: Path) -> None:
    page = tmp_path / "stats.html"
    page.write_text(packtool.stats_page(packtool.dataset_stats(packed)), encoding="utf-8")
    dom = _chromium("--dump-dom", page.as_uri(), user_data=tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    # the DOM the browser built: every chart is an SVG element with its bars
    assert len(re.findall(r"<svg\b", dom.stdout)) == 5
    assert dom.stdout.count("<rect") >= 40
    # no console error, no resource the page tried to load (a file or the network)
    log = dom.stderr
    assert not re.search(r"CONSOLE.*(Uncaught|Error)|Failed to load resource|net::ERR_", log), log
    shot = tmp_path / "shot.png"
    png = _chromium(
        "--window-size=900,2200",
        f"--screenshot={shot}",
        page.as_uri(),
        user_data=tmp_path / "profile-shot",
    )
    assert png.returncode == 0, png.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # drawn, not blank
