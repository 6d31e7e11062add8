"""Rich renderables for ``packtool inspect`` (used by the CLI only; the library never imports
rich). The numbers come from :mod:`packtool.inspect`; this module only lays them out."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from rich.console import Console, Group, RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from ..inspect import SHADES, MaskGrid, RowView, SegmentView, fit_cell, head_tail

__all__ = [
    "PADDING_STYLE",
    "PALETTE",
    "grid_cells",
    "mask_layout",
    "render_decoded",
    "render_header",
    "render_mask",
    "render_segments",
    "row_console",
    "save_row",
    "segment_style",
    "show_row",
]

PALETTE = (
    "red3",
    "green3",
    "dodger_blue1",
    "gold3",
    "magenta3",
    "cyan3",
    "dark_orange",
    "chartreuse3",
    "orchid",
    "steel_blue1",
)
"""Colours of document segments, cycled (neighbours always differ)."""
PADDING_STYLE = "dim grey50"
CELL_CHARS = 2
"""Characters per cell: two, so that a cell is about as wide as it is tall."""


LEARNED_STYLE = "bold green"
CONTEXT_STYLE = "dim"


def segment_style(segment: int, view: RowView) -> str:
    """The style of segment number ``segment`` of ``view`` (padding dimmed)."""
    if view.segments[segment].is_padding:
        return PADDING_STYLE
    return PALETTE[segment % len(PALETTE)]


def mask_layout(console_width: int, end: int) -> tuple[int, int]:
    """``(label_width, max_cells)``: the row labels' width and the most cells that fit."""
    label_width = len(str(end))
    return label_width, max(1, (console_width - label_width - 2) // CELL_CHARS)


def grid_cells(grid: MaskGrid, view: RowView) -> list[list[tuple[str, str]]]:
    """Every cell of ``grid`` as ``(characters, style)``: the shade of its fraction, repeated
    :data:`CELL_CHARS` times, in the colour of its segment ("" where nothing may attend)."""
    shades = grid.shade_index()
    out = []
    for r in range(grid.cells):
        line = []
        for c in range(grid.cells):
            s = int(grid.segment[r, c])
            chars = SHADES[shades[r, c]] * CELL_CHARS
            line.append((chars, segment_style(s, view) if s >= 0 else ""))
        out.append(line)
    return out


def _ruler(grid: MaskGrid, label_width: int) -> Text:
    """Key-token indices above the columns, at every T-th cell where they fit."""
    widest = len(str(grid.end))
    every = max(1, -(-(widest + 1) // CELL_CHARS))
    chars = [" "] * (grid.cells * CELL_CHARS + 1)
    for c in range(0, grid.cells, every):
        label = str(int(grid.edges[c]))
        pos = c * CELL_CHARS + 1
        if pos + len(label) > len(chars):
            break
        chars[pos : pos + len(label)] = list(label)
    return Text(" " * label_width + "".join(chars).rstrip(), style="dim")


def render_mask(
    grid: MaskGrid, view: RowView, label_width: int, note: str = "", width: int = 80
) -> Group:
    """The mask picture: a title with the scale, the framed grid (query rows labelled with their
    first token, key columns on a ruler), and a legend of colours and shades (lines of at most
    ``width`` characters)."""
    k = grid.cell
    scale = f"1 cell = {k} x {k} tokens" if k > 1 else "1 cell = 1 token pair"
    title = Text.assemble(
        ("attention mask", "bold"),
        f" of row {view.index}, tokens {grid.start}..{grid.end - 1}: ",
        (scale, "bold"),
    )
    if note:
        title.append(f" ({note})", style="italic")
    lines: list[RenderableType] = [title, _ruler(grid, label_width)]
    pad = " " * label_width
    lines.append(Text(pad + "┌" + "─" * (grid.cells * CELL_CHARS) + "┐", style="dim"))
    for r, cells in enumerate(grid_cells(grid, view)):
        line = Text()
        line.append(str(int(grid.edges[r])).rjust(label_width), style="dim")
        line.append("│", style="dim")
        for chars, style in cells:
            line.append(chars, style=style)
        line.append("│", style="dim")
        lines.append(line)
    lines.append(Text(pad + "└" + "─" * (grid.cells * CELL_CHARS) + "┘", style="dim"))
    lines.extend(_legend(grid, view, width))
    return Group(*lines)


def _legend(grid: MaskGrid, view: RowView, width: int) -> list[Text]:
    shown = sorted({int(s) for s in np.unique(grid.segment) if s >= 0})
    lines = [Text("segments:")]
    indent = " " * len("segments:")
    for s in shown:
        entry = Text.assemble(("██", segment_style(s, view)), f" {view.segments[s].name}")
        line = lines[-1]
        if line.plain.strip() != "segments:" and line.cell_len + 2 + entry.cell_len > width:
            line = Text(indent)
            lines.append(line)
        line.append(" " if line.plain.strip() in ("segments:", "") else "  ")
        line.append_text(entry)
    if grid.cell == 1:
        shades = Text("█ query token i (row) may attend to key token j (column)")
    else:
        k = grid.cell
        shades = Text(
            f"shade: share of a cell's {k}x{k} pairs (query i = row, key j = column) where i "
            "may attend to j: ░ up to 1/3  ▒ up to 2/3  ▓ more  █ all"
        )
    return [*lines, shades]


def _abbreviate(values: Sequence[int], keep: int = 6) -> str:
    vals = [str(int(v)) for v in values]
    if len(vals) > 2 * keep:
        vals = [*vals[:keep], "...", *vals[-keep:]]
    return "[" + ", ".join(vals) + "]"


def render_header(view: RowView, picked: str = "") -> Text:
    """Row index, shard, tokens and efficiency, segments, cu_seqlens (abbreviated if long)."""
    padded = len(view.segments) > view.documents
    docs = f"{view.documents} document segment{'s' if view.documents != 1 else ''}"
    text = Text.assemble(
        (f"row {view.index:,}", "bold"),
        f" of {view.num_rows:,}",
        (f" ({picked})" if picked else "", "italic"),
        f" · shard {view.shard_file}, row {view.row_in_shard:,}\n",
        f"{view.num_tokens:,} of {view.max_len:,} tokens ({view.efficiency:.2%} full) · {docs}",
        " + padding" if padded else "",
        f"\ncu_seqlens {_abbreviate(view.cu_seqlens.tolist())}",
    )
    if len(view.cu_seqlens) > 12:
        text.append(f" ({len(view.cu_seqlens)} entries)", style="dim")
    return text


def _ids_head_tail(ids: np.ndarray, keep: int = 6) -> str:
    vals = [str(int(t)) for t in ids]
    if len(vals) > 2 * keep:
        return " ".join(vals[:keep]) + " … " + " ".join(vals[-keep:])
    return " ".join(vals)


def _text_cell(seg: SegmentView, room: int, decoded: bool) -> Text:
    if seg.is_padding:
        plural = "s" if seg.length != 1 else ""
        return Text(f"{seg.length:,} pad token{plural}", style=PADDING_STYLE)
    if not decoded or seg.text is None:
        return Text("ids " + _ids_head_tail(seg.token_ids), style="dim")
    # Two thirds for the beginning, a third for the end (mostly EOS and the last words).
    tail_width = max(4, (room - 3) // 3)
    head, tail = head_tail(seg.text, max(4, room - 3 - tail_width), tail_width)
    text = Text(head)
    if tail:
        text.append(" … ", style="dim")
        text.append(tail)
    return text


def render_segments(view: RowView, console_width: int, decoded: bool) -> Table:
    """One line per segment: colour, number, source (doc, chunk), start, length, (its
    alignment pad, in a pack made with ``--pad-to-multiple-of``), position ids, (learned
    tokens), and the beginning … end of its decoded text."""
    has_labels = any(s.learned is not None for s in view.segments)
    aligned = any(s.pad for s in view.segments)  # --pad-to-multiple-of: each one's pad
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    table.add_column("", no_wrap=True)
    names = ("seg", "doc", "chunk", "start", "length", *(["pad"] if aligned else []), "positions")
    for name in names:
        table.add_column(name, justify="right", no_wrap=True)
    if has_labels:
        table.add_column("learned", justify="right", no_wrap=True)
    # The one column that may wrap, so that a narrow terminal squeezes it first.
    table.add_column("text" if decoded else "token ids", overflow="fold")
    # The text column gets what the other columns leave (1 space of padding on each side).
    widest = [
        2,
        3,
        max(len("padding"), *(len(str(s.doc_id)) for s in view.segments)),
        5,
        max(5, len(f"{view.max_len:,}")),
        max(6, len(f"{view.max_len:,}")),
        *([max(3, *(len(f"{s.pad:,}") for s in view.segments))] if aligned else []),
        max(9, len(f"0..{view.max_len - 1}")),
    ]
    if has_labels:
        widest.append(max(7, len(f"{view.max_len:,}")))
    room = max(12, console_width - sum(w + 2 for w in widest))
    for seg in view.segments:
        style = segment_style(seg.index, view)
        positions = Text(f"{seg.first_position}..{seg.last_position}")
        if not seg.positions_ok:
            positions = Text(f"{positions.plain} (not 0..{seg.length - 1}!)", style="bold red")
        cells: list[RenderableType] = [
            Text("██", style=style),
            str(seg.index),
            "padding" if seg.is_padding else str(seg.doc_id),
            "" if seg.is_padding else str(seg.chunk_id),
            f"{seg.start:,}",
            f"{seg.length:,}",
            *([f"{seg.pad:,}" if seg.pad else ""] if aligned else []),
            positions,
        ]
        if has_labels:
            cells.append("" if seg.learned is None else f"{seg.learned:,}")
        cells.append(_text_cell(seg, room, decoded))
        table.add_row(*cells, style=PADDING_STYLE if seg.is_padding else None)
    return table


def render_decoded(view: RowView) -> Group:
    """The full decoded text of every document segment, each under a rule in its colour."""
    parts: list[RenderableType] = []
    for seg in view.segments:
        if seg.is_padding:
            continue
        title = f"segment {seg.index}: {seg.name}, tokens {seg.start:,}..{seg.end - 1:,}"
        parts.append(Rule(Text(title, style=segment_style(seg.index, view)), align="left"))
        if seg.pieces is not None:
            text = Text()
            for piece, learned in seg.pieces:
                text.append(piece, style=LEARNED_STYLE if learned else CONTEXT_STYLE)
            parts.append(text)
        elif seg.text is None:
            parts.append(Text(" ".join(str(int(t)) for t in seg.token_ids)))
        else:
            parts.append(Text(seg.text))
    if any(seg.pieces is not None for seg in view.segments):
        key = Text("key: ")
        key.append("learned tokens (labels)", style=LEARNED_STYLE)
        key.append(" · ")
        key.append("context (label -100)", style=CONTEXT_STYLE)
        parts.insert(0, key)
    return Group(*parts)


def row_console(width: int | None, *, record: bool) -> Console:
    """The console ``inspect`` draws on: ``width`` columns (default: the terminal's),
    recording what it prints when it is to be saved (``--svg``, ``--html``)."""
    return Console(width=width, record=record, highlight=False, markup=False, emoji=False)


def show_row(
    console: Console,
    view: RowView,
    *,
    span: tuple[int, int] | None,
    picked: str,
    decoded: bool,
    no_tokenizer: str,
    decode: bool,
) -> None:
    """What ``inspect`` shows of one row: its header, its segments (``decoded``: with their
    text; ``no_tokenizer`` says why not), its mask (tokens ``span``
    only, if given; downsampled to fit the console) and, with ``decode``, every segment's
    full text."""
    start, end = span if span is not None else (0, view.max_len)
    label_width, max_cells = mask_layout(console.width, end)
    cell = fit_cell(end - start, max_cells)
    note = ""
    if cell > 1:
        fit = f"downsampled to fit {console.width} columns"
        note = f"window of {end - start:,} tokens {fit}" if span is not None else fit
    grid = view.mask_grid(cell, span)

    console.print(render_header(view, picked))
    if no_tokenizer:
        console.print(f"no text shown: {no_tokenizer}", style="dim", markup=False)
    console.print()
    console.print(render_segments(view, console.width, decoded=decoded))
    console.print()
    console.print(render_mask(grid, view, label_width, note, console.width))
    if decode:
        console.print()
        console.print(render_decoded(view))


def save_row(console: Console, *, title: str, svg: Path | None, html: Path | None) -> None:
    """What ``console`` recorded, saved as an SVG picture and as HTML where asked."""
    if svg is not None:
        svg.write_text(console.export_svg(title=title, clear=False), encoding="utf-8")
    if html is not None:
        html.write_text(console.export_html(clear=False), encoding="utf-8")
