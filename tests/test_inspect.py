"""`packtool inspect`: the drawn mask against brute force, the row view, and the command line.

The expected masks here are built by plain loops over ``cu_seqlens``, never through
``packtool.masks``, so that a mistake there (or in the downsampling) shows up.
"""

from __future__ import annotations

import html as html_lib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, CharTokenizer, write_jsonl
from helpers import read_rows
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from test_cli import assert_one_line_error, run

import packtool
from packtool.errors import FormatError, OptionError
from packtool.format import PackedBatch, ShardWriter
from packtool.inspect import (
    MAX_DRAW_TOKENS,
    SHADES,
    RowView,
    SegmentView,
    downsample_mask,
    fit_cell,
    head_tail,
    inspect_row,
    parse_window,
    pick_row,
    row_mask_grid,
    shade_index,
)
from packtool.masks import block_causal_mask
from packtool.render import inspect as render

# -- brute force ---------------------------------------------------------------------------


def brute_segment(cu: list[int], i: int) -> int:
    for s in range(len(cu) - 1):
        if cu[s] <= i < cu[s + 1]:
            return s
    raise AssertionError(i)


def brute_allowed(cu: list[int], i: int, j: int) -> bool:
    return brute_segment(cu, i) == brute_segment(cu, j) and j <= i


def brute_mask(cu: list[int]) -> np.ndarray:
    n = cu[-1]
    return np.array([[brute_allowed(cu, i, j) for j in range(n)] for i in range(n)], dtype=bool)


@st.composite
def packed_rows(draw: st.DrawFn) -> tuple[list[int], bool]:
    """Segment boundaries of a row (1 to 7 segments of 1 to 12 tokens) and whether the last
    segment is padding."""
    lengths = draw(st.lists(st.integers(1, 12), min_size=1, max_size=7))
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    padded = len(lengths) > 1 and draw(st.booleans())
    return cu, padded


@st.composite
def windows(draw: st.DrawFn, max_len: int) -> tuple[int, int]:
    start = draw(st.integers(0, max_len - 1))
    end = draw(st.integers(start + 1, max_len))
    return start, end


def make_view(cu: list[int], padded: bool) -> RowView:
    """A RowView of a row with boundaries ``cu`` (doc ids 100, 101, ...), no reader needed."""
    n_seg = len(cu) - 1
    segments = []
    for s in range(n_seg):
        is_pad = padded and s == n_seg - 1
        length = cu[s + 1] - cu[s]
        segments.append(
            SegmentView(
                index=s,
                start=cu[s],
                length=length,
                doc_id=None if is_pad else 100 + s,
                chunk_id=None if is_pad else 0,
                first_position=0,
                last_position=length - 1,
                positions_ok=True,
                token_ids=np.arange(length),
            )
        )
    return RowView(
        index=0,
        num_rows=1,
        shard=0,
        shard_file="data-00000-of-00001.arrow",
        row_in_shard=0,
        max_len=cu[-1],
        num_tokens=cu[-2] if padded else cu[-1],
        cu_seqlens=np.asarray(cu),
        segments=segments,
    )


def expected_shade(fraction: float) -> str:
    """The documented shades: none, up to 1/3, up to 2/3, more, all."""
    if fraction == 0:
        return " "
    if fraction == 1:
        return "█"
    return "░" if fraction <= 1 / 3 else "▒" if fraction <= 2 / 3 else "▓"


def expected_style(cu: list[int], padded: bool, segment: int) -> str:
    if padded and segment == len(cu) - 2:
        return render.PADDING_STYLE
    return render.PALETTE[segment % len(render.PALETTE)]


# -- the drawing at full resolution --------------------------------------------------------


def drawn_grid(view: RowView, window: tuple[int, int] | None) -> tuple[list[str], list]:
    """Draw the mask at one token per cell as the CLI does; return the grid's text lines (inside
    the frame) and the rich Text objects of those lines."""
    start, end = window or (0, view.max_len)
    label_width, _ = render.mask_layout(200, end)
    grid = view.mask_grid(1, window)
    group = render.render_mask(grid, view, label_width)
    console = Console(width=200, record=True, color_system=None)
    console.print(group)
    lines = console.export_text().splitlines()
    top = next(k for k, line in enumerate(lines) if "┌" in line)
    body = lines[top + 1 : top + 1 + (end - start)]
    texts = group.renderables[3 : 3 + (end - start)]
    assert lines[top + 1 + (end - start)].strip().startswith("└")
    return body, texts


@settings(max_examples=60, deadline=None)
@given(data=st.data(), row=packed_rows())
def test_full_resolution_drawing_matches_brute_force(data: st.DataObject, row) -> None:
    cu, padded = row
    max_len = cu[-1]
    window = data.draw(st.none() | windows(max_len))
    start, end = window or (0, max_len)
    view = make_view(cu, padded)
    body, texts = drawn_grid(view, window)
    label_width = len(str(end))
    console = Console(width=200)
    for r, i in enumerate(range(start, end)):
        line = body[r]
        assert line[:label_width].strip() == str(i)
        assert line[label_width] == "│" and line[-1] == "│"
        cells = line[label_width + 1 : -1]
        assert len(cells) == 2 * (end - start)
        for c, j in enumerate(range(start, end)):
            chars = cells[2 * c : 2 * c + 2]
            offset = label_width + 1 + 2 * c
            style = texts[r].get_style_at_offset(console, offset)
            if brute_allowed(cu, i, j):
                assert chars == "██", (i, j)
                want = Console().get_style(expected_style(cu, padded, brute_segment(cu, i)))
                assert style == want, (i, j, style)
            else:
                assert chars == "  ", (i, j)


def test_small_drawing_literal() -> None:
    # docs of 3 and 2 tokens, 3 padding: the picture in packtool/masks.py, drawn.
    body, _ = drawn_grid(make_view([0, 3, 5, 8], padded=True), None)
    assert body == [
        "0│██              │",
        "1│████            │",
        "2│██████          │",
        "3│      ██        │",
        "4│      ████      │",
        "5│          ██    │",
        "6│          ████  │",
        "7│          ██████│",
    ]


# -- downsampling --------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(data=st.data(), row=packed_rows(), cell=st.integers(1, 7))
def test_downsampled_cells_match_block_average(data: st.DataObject, row, cell: int) -> None:
    cu, _ = row
    max_len = cu[-1]
    window = data.draw(st.none() | windows(max_len))
    start, end = window or (0, max_len)
    grid = row_mask_grid(cu, max_len, cell, window)
    full = brute_mask(cu)
    edges = [*range(start, end, cell), end]
    assert grid.edges.tolist() == edges
    n = len(edges) - 1
    assert grid.fraction.shape == grid.segment.shape == (n, n)
    for r in range(n):
        for c in range(n):
            rows = range(edges[r], edges[r + 1])
            cols = range(edges[c], edges[c + 1])
            block = full[edges[r] : edges[r + 1], edges[c] : edges[c + 1]]
            assert grid.fraction[r, c] == pytest.approx(block.mean()), (r, c)
            counts: dict[int, int] = {}
            for i in rows:
                for j in cols:
                    if brute_allowed(cu, i, j):
                        s = brute_segment(cu, i)
                        counts[s] = counts.get(s, 0) + 1
            if not counts:
                assert grid.segment[r, c] == -1
            else:
                most = max(counts.values())
                assert grid.segment[r, c] == min(s for s, v in counts.items() if v == most)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), row=packed_rows())
def test_window_mask_is_the_slice_of_the_row_mask(data: st.DataObject, row) -> None:
    cu, _ = row
    start, end = data.draw(windows(cu[-1]))
    grid = row_mask_grid(cu, cu[-1], 1, (start, end))
    whole = block_causal_mask(cu, cu[-1])
    assert np.array_equal(grid.fraction == 1, whole[start:end, start:end])


def test_downsample_mask_example_and_shades() -> None:
    grid = downsample_mask(np.tri(5, dtype=bool), [0, 0, 0, 1, 1], cell=2, offset=10)
    assert grid.edges.tolist() == [10, 12, 14, 15]
    # cells: [0:2]x[0:2] 3 of 4; [2:4]x[0:2] 4 of 4; [4:5]x[4:5] 1 of 1 ...
    assert grid.fraction[0].tolist() == [0.75, 0.0, 0.0]
    assert grid.fraction[1].tolist() == [1.0, 0.75, 0.0]
    assert grid.fraction[2].tolist() == [1.0, 1.0, 1.0]
    # [2:4]x[2:4]: query 2 (segment 0) has 1 pair, query 3 (segment 1) has 2.
    assert grid.segment.tolist() == [[0, -1, -1], [0, 1, -1], [1, 1, 1]]
    assert [SHADES[k] for k in shade_index([0, 1e-9, 1 / 3, 0.34, 2 / 3, 0.7, 1])] == list(
        " ░░▒▒▓█"
    )
    with pytest.raises(ValueError, match="non-decreasing"):
        downsample_mask(np.tri(3, dtype=bool), [1, 0, 0], cell=1)


def test_fit_cell_fits() -> None:
    for tokens in (1, 7, 36, 37, 4096, 32768):
        for cells in (1, 5, 36, 100):
            k = fit_cell(tokens, cells)
            assert -(-tokens // k) <= cells
            assert k == 1 or -(-tokens // (k - 1)) > cells


def test_long_rows_need_a_window() -> None:
    max_len = MAX_DRAW_TOKENS + 8
    cu = [0, 100, max_len]
    with pytest.raises(OptionError, match=r"pass --window START:END"):
        row_mask_grid(cu, max_len, cell=1000)
    grid = row_mask_grid(cu, max_len, cell=1, window=(95, 105))
    assert np.array_equal(grid.fraction == 1, brute_mask([0, 5, 10]))
    assert grid.segment[-1, -1] == 1


# -- small library helpers -----------------------------------------------------------------


def test_parse_window() -> None:
    assert parse_window("3:9", 24) == (3, 9)
    assert parse_window(":8", 24) == (0, 8)
    assert parse_window("20:", 24) == (20, 24)
    for bad, pattern in [
        ("abc", "START:END with integer"),
        ("5", "START:END with integer"),
        ("9:3", r"need 0 <= START < END <= 24"),
        ("4:4", r"need 0 <= START < END <= 24"),
        ("0:25", r"need 0 <= START < END <= 24"),
        ("-1:5", r"need 0 <= START < END <= 24"),
    ]:
        with pytest.raises(OptionError, match=pattern):
            parse_window(bad, 24)


def test_pick_row_is_repeatable_and_uniform_enough() -> None:
    assert all(pick_row(50, seed=s) == pick_row(50, seed=s) for s in range(20))
    picks = [pick_row(50, seed=s) for s in range(200)]
    assert all(0 <= p < 50 for p in picks)
    assert len(set(picks)) > 25
    with pytest.raises(OptionError, match="no rows"):
        pick_row(0, seed=1)


def test_head_tail_escapes_and_cuts() -> None:
    assert head_tail("a\nb\tc", 10) == ("a\\nb\\tc", "")
    head, tail = head_tail("x" * 10 + "MIDDLE" + "y" * 10, 10)
    assert (head, tail) == ("x" * 10, "y" * 10)
    assert head_tail("back\\slash", 20) == ("back\\\\slash", "")


# -- inspect_row on real outputs -----------------------------------------------------------

TEXTS = [
    "The first document.",
    "A second, longer document\nwith two lines.",
    "Third.",
    "Number four is here, and it talks for a while about nothing much at all.",
    "Five",
    "The sixth and last document of this small corpus.",
]


@pytest.fixture(scope="module")
def bpe_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The TEXTS packed with the bundled tokenizer into rows of 32 (several rows, padding)."""
    tmp = tmp_path_factory.mktemp("bpe")
    src = write_jsonl(tmp / "in.jsonl", [{"text": t} for t in TEXTS * 3])
    packtool.pack([src], tmp / "out", max_len=32, seed=3)
    return tmp / "out"


@pytest.fixture(scope="module")
def char_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Documents of 5, 9 and 7 tokens in one row of 24 (char tokenizer: no tokenizer.json)."""
    tmp = tmp_path_factory.mktemp("char")
    src = write_jsonl(tmp / "in.jsonl", [{"text": "aaaa"}, {"text": "b" * 8}, {"text": "c" * 6}])
    packtool.pack([src], tmp / "out", max_len=24, tokenizer=CharTokenizer(), shuffle=False)
    return tmp / "out"


def test_inspect_row_matches_the_shards(bpe_out: Path) -> None:
    _, rows = read_rows(bpe_out)
    reader = packtool.open_packed(bpe_out)
    tok = reader.load_tokenizer()
    texts = TEXTS * 3
    assert len(rows) > 3
    for index, row in enumerate(rows):
        view = inspect_row(reader, index, tok)
        cu = row["cu_seqlens"]
        assert view.cu_seqlens.tolist() == cu
        assert view.num_tokens == row["num_tokens"]
        assert view.efficiency == pytest.approx(row["num_tokens"] / 32)
        assert len(view.segments) == len(cu) - 1
        for k, seg in enumerate(view.segments):
            assert (seg.start, seg.length) == (cu[k], cu[k + 1] - cu[k])
            assert (seg.first_position, seg.last_position) == (0, seg.length - 1)
            assert seg.positions_ok
            if k < len(row["doc_ids"]):
                assert seg.doc_id == row["doc_ids"][k]
                assert seg.chunk_id == row["chunk_ids"][k]
                assert seg.text == texts[seg.doc_id] + "<|endoftext|>"
            else:
                assert seg.is_padding and seg.text is None and seg.name == "padding"


def test_inspect_row_errors(bpe_out: Path, tmp_path: Path) -> None:
    reader = packtool.open_packed(bpe_out)
    n = reader.num_rows
    with pytest.raises(OptionError, match=rf"row {n} is out of range: .* has {n} rows"):
        inspect_row(reader, n)
    with pytest.raises(OptionError, match="out of range"):
        inspect_row(reader, -1)


def write_custom_row(
    out: Path, position_ids: list[int], cu: list[int], labels: list[int] | None = None
) -> Path:
    """One row of 8 tokens, documents 0 (5 tokens) and 1 (3), with the given columns."""
    batch = PackedBatch(
        input_ids=np.arange(10, 18, dtype=np.int32)[None, :],
        position_ids=np.asarray([position_ids], dtype=np.int32),
        cu_values=np.asarray(cu, dtype=np.int32),
        cu_offsets=np.asarray([0, len(cu)], dtype=np.int32),
        num_tokens=np.asarray([8], dtype=np.int32),
        doc_ids=np.asarray([0, 1], dtype=np.int64),
        chunk_ids=np.asarray([0, 0], dtype=np.int32),
        seg_offsets=np.asarray([0, 2], dtype=np.int32),
        labels=None if labels is None else np.asarray([labels], dtype=np.int32),
    )
    with_labels = labels is not None
    with ShardWriter(
        out, max_len=8, num_rows=1, rows_per_shard=1, with_labels=with_labels
    ) as writer:
        writer.write(batch)
        writer.commit({})
    return out


def test_wrong_positions_are_flagged(tmp_path: Path) -> None:
    out = write_custom_row(tmp_path / "o", [0, 1, 2, 3, 4, 5, 6, 7], [0, 5, 8])
    view = inspect_row(packtool.open_packed(out), 0)
    assert [s.positions_ok for s in view.segments] == [True, False]
    assert (view.segments[1].first_position, view.segments[1].last_position) == (5, 7)
    result = run("inspect", out, "--width", "120")
    assert result.exit_code == 0, result.stderr
    assert "5..7 (not 0..2!)" in result.stdout
    assert "no text shown" in result.stdout and "ids 15 16 17" in result.stdout


def test_learned_tokens_are_counted(tmp_path: Path) -> None:
    labels = [-100, -100, 5, 5, 5, -100, 7, 7]
    out = write_custom_row(tmp_path / "o", [0, 1, 2, 3, 4, 0, 1, 2], [0, 5, 8], labels)
    view = inspect_row(packtool.open_packed(out), 0)
    assert [s.learned for s in view.segments] == [3, 2]
    result = run("inspect", out, "--width", "120")
    assert result.exit_code == 0, result.stderr
    assert "learned" in result.stdout
    assert re.search(r"██\s+1\s+1\s+0\s+5\s+3\s+0\.\.2\s+2\s+ids 15 16 17", result.stdout)


def test_docstring_examples() -> None:
    import doctest

    import packtool.inspect

    failures, tried = doctest.testmod(packtool.inspect)
    assert tried > 5 and failures == 0


def test_bad_cu_seqlens_is_a_format_error(tmp_path: Path) -> None:
    out = write_custom_row(tmp_path / "o", [0, 1, 2, 3, 4, 0, 1, 2], [0, 5, 7])
    with pytest.raises(FormatError, match=r"row 0: cu_seqlens must .*run `packtool verify`"):
        inspect_row(packtool.open_packed(out), 0)
    assert_one_line_error(run("inspect", out), r"row 0: cu_seqlens must")


# -- the command line ----------------------------------------------------------------------


def grid_body(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    top = next(k for k, line in enumerate(lines) if "┌" in line)
    bottom = next(k for k, line in enumerate(lines) if "└" in line)
    return lines[top + 1 : bottom]


def test_cli_row_table_and_mask(bpe_out: Path) -> None:
    _, rows = read_rows(bpe_out)
    texts = TEXTS * 3
    for index in (0, len(rows) - 1):
        result = run("inspect", bpe_out, "--row", index, "--width", "150")
        assert result.exit_code == 0, result.stderr
        row = rows[index]
        out = result.stdout
        assert f"row {index} of {len(rows)}" in out
        assert f"cu_seqlens {row['cu_seqlens']}" in out
        assert f"{row['num_tokens']} of 32 tokens" in out
        for k, doc in enumerate(row["doc_ids"]):
            length = row["cu_seqlens"][k + 1] - row["cu_seqlens"][k]
            line = next(x for x in out.splitlines() if re.match(rf"██\s+{k}\s+{doc}\s", x))
            assert re.search(rf"\s{row['cu_seqlens'][k]}\s+{length}\s+0\.\.{length - 1}\s", line)
            assert texts[doc].replace("\n", "\\n")[:8] in line
        if row["num_tokens"] < 32:
            assert re.search(r"padding\s+\d+\s+\d+\s+0\.\.\d+\s+\d+ pad tokens?", out)
        # 32 tokens fit 150 columns: the whole row at one token per cell, as brute force says.
        assert "1 cell = 1 token pair" in out
        cu = row["cu_seqlens"]
        body = grid_body(out)
        assert len(body) == 32
        for i, line in enumerate(body):
            cells = line.split("│")[1]
            assert cells == "".join("██" if brute_allowed(cu, i, j) else "  " for j in range(32))


def test_cli_downsamples_to_the_terminal(char_out: Path) -> None:
    # 24 tokens in 40 columns: (40 - 2 - 2) // 2 = 18 cells, so cells of 2 x 2 tokens.
    result = runner_invoke(["inspect", str(char_out)], env={"COLUMNS": "40"})
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    words = " ".join(out.split())
    assert "1 cell = 2 x 2 tokens (downsampled to fit 40 columns)" in words
    body = grid_body(out)
    assert len(body) == 12 and all(len(line) <= 40 for line in out.splitlines())
    cu = [0, 9, 16, 21, 24]
    full = brute_mask(cu)
    for r, line in enumerate(body):
        cells = line.split("│")[1]
        for c in range(12):
            f = full[2 * r : 2 * r + 2, 2 * c : 2 * c + 2].mean()
            assert cells[2 * c : 2 * c + 2] == expected_shade(f) * 2, (r, c)
    # A window drawn at full resolution, and one too wide for the terminal.
    result = runner_invoke(["inspect", str(char_out), "--window", "7:18"], env={"COLUMNS": "40"})
    assert "tokens 7..17: 1 cell = 1 token pair" in " ".join(result.stdout.split())
    body = grid_body(result.stdout)
    assert [line.split("│")[0].strip() for line in body] == [str(i) for i in range(7, 18)]
    for line, i in zip(body, range(7, 18), strict=True):
        want = "".join("██" if brute_allowed(cu, i, j) else "  " for j in range(7, 18))
        assert line.split("│")[1] == want
    result = runner_invoke(["inspect", str(char_out), "--window", "0:20"], env={"COLUMNS": "30"})
    words = " ".join(result.stdout.split())
    assert "1 cell = 2 x 2 tokens (window of 20 tokens downsampled to fit 30 columns)" in words


def runner_invoke(args: list[str], env: dict[str, str]):
    from typer.testing import CliRunner

    from packtool.cli import app

    return CliRunner().invoke(app, args, env=env)


def test_cli_without_tokenizer_shows_ids(char_out: Path) -> None:
    result = run("inspect", char_out, "--width", "120", "--decode")
    assert result.exit_code == 0, result.stderr
    assert "no text shown" in result.stdout and "no tokenizer.json" in result.stdout
    b = ord("b") + 3
    assert f"ids {b} {b} {b}" in result.stdout
    assert "segment 0: doc 1, tokens 0..8" in result.stdout


def test_cli_decode_prints_every_text(bpe_out: Path) -> None:
    _, rows = read_rows(bpe_out)
    index = max(range(len(rows)), key=lambda r: len(rows[r]["doc_ids"]))
    result = run("inspect", bpe_out, "--row", index, "--decode", "--width", "200")
    assert result.exit_code == 0, result.stderr
    texts = TEXTS * 3
    for doc in rows[index]["doc_ids"]:
        assert texts[doc] + "<|endoftext|>" in result.stdout
    assert result.stdout.count("segment ") >= len(rows[index]["doc_ids"])


def test_cli_svg_and_html(bpe_out: Path, tmp_path: Path) -> None:
    svg, page = tmp_path / "row.svg", tmp_path / "row.html"
    result = run("inspect", bpe_out, "--row", 1, "--svg", svg, "--html", page, "--width", "100")
    assert result.exit_code == 0, result.stderr
    _, rows = read_rows(bpe_out)
    first_doc = rows[1]["doc_ids"][0]
    for path in (svg, page):
        text = html_lib.unescape(path.read_text(encoding="utf-8")).replace("\xa0", " ")
        assert "segments:" in text and f"doc {first_doc}" in text
        assert "1 cell = 1 token pair" in text and "attention mask" in text
    assert svg.read_text().lstrip().startswith("<svg")
    assert "<html" in page.read_text().lower()


def test_cli_random_is_repeatable(bpe_out: Path) -> None:
    def picked(*extra: str) -> int:
        result = run("inspect", bpe_out, "--random", *extra, "--width", "100")
        assert result.exit_code == 0, result.stderr
        return int(re.match(r"row (\d+) of", result.stdout).group(1))

    n = json.loads((bpe_out / "manifest.json").read_text())["rows"]
    by_seed = [picked("--seed", str(s)) for s in range(8)]
    assert by_seed == [picked("--seed", str(s)) for s in range(8)]
    assert all(0 <= r < n for r in by_seed) and len(set(by_seed)) > 1
    a = run("inspect", bpe_out, "--random", "--seed", "5", "--width", "100").stdout
    assert a == run("inspect", bpe_out, "--random", "--seed", "5", "--width", "100").stdout
    assert "(--random --seed 5)" in a
    unseeded = run("inspect", bpe_out, "--random", "--width", "100").stdout
    row = re.match(r"row (\d+) of", unseeded).group(1)
    assert f"(picked: --row {row})" in unseeded


def test_cli_default_row_is_0(char_out: Path) -> None:
    assert run("inspect", char_out).stdout.startswith("row 0 of 1")


def test_cli_errors(bpe_out: Path, tmp_path: Path) -> None:
    n = json.loads((bpe_out / "manifest.json").read_text())["rows"]
    assert_one_line_error(
        run("inspect", bpe_out, "--row", n), rf"row {n} is out of range: .*{n} rows", code=2
    )
    assert_one_line_error(run("inspect", bpe_out, "--row", "-3"), r"row -3 is out of range")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(
        run("inspect", tmp_path / "empty"), r"empty is not a packtool output: it has no manifest"
    )
    assert_one_line_error(run("inspect", tmp_path / "missing"), r"missing: no such directory")
    # a file given for the output (the corpus, or the manifest itself) is not "no such
    # directory": it is there, and not the output directory
    for a_file in (bpe_out / "manifest.json", REPO / "sample_data" / "corpus.jsonl"):
        for command in ("inspect", "verify"):
            assert_one_line_error(
                run(command, a_file), r"a file, not a directory: give the output directory"
            )
    assert_one_line_error(
        run("inspect", bpe_out, "--row", "1", "--random"), r"--row and --random exclude"
    )
    assert_one_line_error(
        run("inspect", bpe_out, "--seed", "1"), r"--seed only applies to --random"
    )
    for window in ("9:3", "0:33", "x:y"):
        assert_one_line_error(run("inspect", bpe_out, "--window", window), r"--window ", code=2)
    assert_one_line_error(run("inspect", bpe_out, "--width", "5"), r"--width must be at least 20")
    assert_one_line_error(
        run("inspect", bpe_out, "--svg", tmp_path / "nope" / "x.svg"),
        r"--svg .*x\.svg: the directory .*nope does not exist",
        code=2,
    )


def test_cli_empty_dataset(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": ""}])
    packtool.pack([src], tmp_path / "out", max_len=16, allow_empty=True)  # as a unit may be
    for extra in ([], ["--random"]):
        assert_one_line_error(
            run("inspect", tmp_path / "out", *extra), r"out has no rows to inspect"
        )


def test_library_does_not_import_rich() -> None:
    code = (
        "import sys, packtool, packtool.inspect, packtool.masks, packtool.format; "
        "bad = [m for m in ('rich', 'typer') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_docs_cover_every_option() -> None:
    doc = (REPO / "docs" / "inspect.md").read_text(encoding="utf-8")
    help_text = run("inspect", "--help").stdout
    options = set(re.findall(r"(--[a-z][a-z-]+)", help_text)) - {"--help"}
    assert {"--row", "--random", "--seed", "--window", "--decode", "--svg", "--html"} <= options
    for option in options:
        assert f"`{option}" in doc, option


def test_docs_example_is_the_real_output(tmp_path: Path) -> None:
    """docs/inspect.md shows the output of its own commands: run them and compare."""
    doc = (REPO / "docs" / "inspect.md").read_text(encoding="utf-8")
    texts = re.findall(r"'(\{\"text\": [^']*\})'", doc)
    assert len(texts) == 4
    src = tmp_path / "tiny.jsonl"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    packtool.pack([src], tmp_path / "tiny", max_len=40, shuffle=False)
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```$", doc, flags=re.S | re.M)
    for args in (["--width", "72"], ["--width", "72", "--window", "20:40"]):
        command = "packtool inspect tiny/ " + " ".join(args)
        shown = next(b for i, b in enumerate(blocks) if i and command in blocks[i - 1])
        result = run("inspect", tmp_path / "tiny", *args)
        assert result.exit_code == 0, result.stderr
        actual = [line.rstrip() for line in result.stdout.splitlines()]
        expected = [line.rstrip() for line in shown.splitlines()]
        assert actual[len(actual) - len(expected) :] == expected
