"""Look inside one packed row: its segments, and its attention mask as a grid of cells.

This is the library side of ``packtool inspect`` (pure NumPy; the rich drawing lives in
``packtool/render/inspect.py``, used by the CLI only). The mask is never re-derived here: it is
built from the row's stored ``cu_seqlens`` by :func:`packtool.masks.block_causal_mask`, the
function the training side builds its masks with, and only *summed* into cells.

A row of ``max_len`` 8 with documents of 3 and 2 tokens, then 3 padding tokens
(``cu_seqlens = [0, 3, 5, 8]``), drawn at one token per cell (``cell=1``) and with cells of
2 x 2 tokens (``cell=2``)::

    cell=1   j: 0 1 2 3 4 5 6 7          cell=2   j: 0-1 2-3 4-5 6-7
       i=0      A . . . . . . .             i=0-1   ▓A
       i=1      A A . . . . . .             i=2-3   ▒A  ▒A
       i=2      A A A . . . . .             i=4-5       ░B  ▒B
       i=3      . . . B . . . .             i=6-7           ▒P  ▓P
       i=4      . . . B B . . .
       i=5      . . . . . P . .       A cell's shade is the share of its (i, j) pairs where
       i=6      . . . . . P P .       i may attend to j (here 3/4, 1/2 or 1/4); its colour
       i=7      . . . . . P P P       (letter) is the segment of the query tokens i holding
                                      most of those pairs, the earlier one on a tie.

:class:`MaskGrid` holds those two numbers per cell: ``fraction`` (0..1) and ``segment``.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .errors import FormatError, OptionError
from .format import IGNORE_INDEX, PackedReader, Segment
from .masks import block_causal_mask, document_ids

__all__ = [
    "MAX_DRAW_TOKENS",
    "SHADES",
    "MaskGrid",
    "RowView",
    "SegmentView",
    "downsample_mask",
    "fit_cell",
    "head_tail",
    "inspect_row",
    "parse_window",
    "pick_row",
    "row_mask_grid",
]

SHADES = " ░▒▓█"
"""Shades of a cell, by the share of its pairs that may attend: none, up to 1/3, up to 2/3,
below 1, all."""

MAX_DRAW_TOKENS = 8192
"""The longest stretch of a row drawn at once: its boolean mask is ``MAX_DRAW_TOKENS ** 2`` bytes
(64 MiB, about a second to build and sum). Longer rows are drawn a window at a time."""


@dataclass(frozen=True)
class MaskGrid:
    """An attention mask (or a square window of it) summed into cells of ``cell x cell`` tokens.

    ``edges`` are the token indices where the cells start, then the end of the window; the last
    cell is smaller when the window's length is not a multiple of ``cell``. For cell ``(r, c)``,
    ``fraction[r, c]`` is the share of its pairs ``(i, j)`` (query ``i`` in rows
    ``edges[r]:edges[r+1]``, key ``j`` in columns ``edges[c]:edges[c+1]``) where ``i`` may
    attend to ``j``, and ``segment[r, c]`` the segment of the query tokens holding most of those
    pairs (ties: the earlier segment), or -1 where no pair may attend.
    """

    fraction: np.ndarray
    segment: np.ndarray
    edges: np.ndarray
    cell: int

    @property
    def start(self) -> int:
        return int(self.edges[0])

    @property
    def end(self) -> int:
        return int(self.edges[-1])

    @property
    def cells(self) -> int:
        """Cells per side."""
        return int(self.edges.size - 1)

    def shade_index(self) -> np.ndarray:
        """``[cells, cells]`` index into :data:`SHADES` of every cell."""
        return shade_index(self.fraction)


def shade_index(fraction: ArrayLike) -> np.ndarray:
    """0 for none, 1 for (0, 1/3], 2 for (1/3, 2/3], 3 for (2/3, 1), 4 for all.

    >>> shade_index([0.0, 0.2, 0.5, 0.9, 1.0]).tolist()
    [0, 1, 2, 3, 4]
    """
    f = np.asarray(fraction, dtype=np.float64)
    out = np.where(f <= 1 / 3, 1, np.where(f <= 2 / 3, 2, 3))
    out = np.where(f <= 0, 0, out)
    return np.where(f >= 1, 4, out).astype(np.int8)


def downsample_mask(
    mask: np.ndarray, segment_of_row: ArrayLike, cell: int, offset: int = 0
) -> MaskGrid:
    """Sum a square boolean ``mask`` into cells of ``cell x cell`` tokens.

    ``segment_of_row[i]`` is the segment of query token ``i`` (non-decreasing, as
    :func:`packtool.masks.document_ids` returns it); ``offset`` is the token index of the mask's
    first row and column, recorded in ``edges``.

    >>> g = downsample_mask(np.tri(4, dtype=bool), [0, 0, 0, 0], cell=2)
    >>> g.fraction.tolist(), g.segment.tolist()
    ([[0.75, 0.0], [1.0, 0.75]], [[0, -1], [0, 0]])
    """
    mask = np.asarray(mask, dtype=bool)
    w = mask.shape[0]
    if mask.ndim != 2 or mask.shape[1] != w or w == 0:
        raise ValueError(f"mask must be square and non-empty, got shape {mask.shape}")
    seg = np.asarray(segment_of_row, dtype=np.int64)
    if seg.shape != (w,) or np.any(np.diff(seg) < 0):
        raise ValueError("segment_of_row must be non-decreasing, one entry per mask row")
    if cell < 1:
        raise ValueError(f"cell must be >= 1, got {cell}")
    starts = np.arange(0, w, cell, dtype=np.int64)
    edges = np.append(starts, w)
    n = starts.size
    # Allowed pairs of every query token, per column cell: [w, n].
    per_row = np.add.reduceat(mask.view(np.uint8), starts, axis=1, dtype=np.int64)
    # Runs of query tokens in one row cell and one segment: their sums per column cell.
    breaks = np.union1d(starts, np.flatnonzero(np.diff(seg)) + 1)
    runs = np.add.reduceat(per_row, breaks, axis=0)
    run_cell = np.searchsorted(starts, breaks, side="right") - 1
    run_seg = seg[breaks]
    bounds = np.searchsorted(run_cell, np.arange(n + 1))
    total = np.add.reduceat(runs, bounds[:-1], axis=0)
    segment = np.full((n, n), -1, dtype=np.int64)
    for r in range(n):
        block = runs[bounds[r] : bounds[r + 1]]
        best = run_seg[bounds[r] : bounds[r + 1]][block.argmax(axis=0)]
        segment[r] = np.where(total[r] > 0, best, -1)
    sizes = np.diff(edges)
    fraction = total / np.outer(sizes, sizes)
    return MaskGrid(fraction=fraction, segment=segment, edges=edges + offset, cell=cell)


def fit_cell(tokens: int, max_cells: int) -> int:
    """The smallest cell size that draws ``tokens`` tokens in at most ``max_cells`` cells.

    >>> fit_cell(4096, 36), fit_cell(30, 36)
    (114, 1)
    """
    if tokens < 1 or max_cells < 1:
        raise ValueError(f"need tokens >= 1 and max_cells >= 1, got {tokens}, {max_cells}")
    return max(1, math.ceil(tokens / max_cells))


def row_mask_grid(
    cu_seqlens: ArrayLike,
    max_len: int,
    cell: int,
    window: tuple[int, int] | None = None,
) -> MaskGrid:
    """The mask of a row with boundaries ``cu_seqlens``, over ``window`` (default: all of it),
    in cells of ``cell x cell`` tokens.

    The mask is :func:`packtool.masks.block_causal_mask`. For a window ``[start, end)`` it is
    built from the window's own boundaries (``cu_seqlens`` clipped to the window), which gives
    exactly the slice ``mask[start:end, start:end]`` of the whole row's mask without building
    the whole (``max_len ** 2``) mask. Segment numbers are the row's (from
    :func:`packtool.masks.document_ids`), not the window's.

    >>> row_mask_grid([0, 3, 5, 8], 8, cell=2).segment.tolist()
    [[0, -1, -1, -1], [0, 0, -1, -1], [-1, 1, 1, -1], [-1, -1, 2, 2]]
    """
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    seg = document_ids(cu, max_len)
    start, end = (0, max_len) if window is None else window
    if not 0 <= start < end <= max_len:
        raise OptionError(f"window {start}:{end} is not inside the row's 0:{max_len}")
    if end - start > MAX_DRAW_TOKENS:
        raise OptionError(
            f"drawing {end - start:,} tokens at once needs a {end - start:,}^2 mask: "
            f"pass --window START:END of at most {MAX_DRAW_TOKENS:,} tokens"
        )
    local_cu = np.unique(np.clip(cu, start, end)) - start
    mask = block_causal_mask(local_cu, end - start)
    return downsample_mask(mask, seg[start:end], cell, offset=start)


def parse_window(spec: str, max_len: int) -> tuple[int, int]:
    """``"START:END"`` (END exclusive; either may be left out) as ``(start, end)``.

    >>> parse_window("100:200", 4096), parse_window(":64", 4096), parse_window("4000:", 4096)
    ((100, 200), (0, 64), (4000, 4096))
    """
    text = spec.strip()
    head, sep, tail = text.partition(":")
    try:
        if not sep:
            raise ValueError
        start = int(head) if head.strip() else 0
        end = int(tail) if tail.strip() else max_len
    except ValueError:
        raise OptionError(
            f"--window must be START:END with integer token indices, e.g. 0:64; got {spec!r}"
        ) from None
    if not 0 <= start < end <= max_len:
        raise OptionError(
            f"--window {spec} is not a range inside the row: need 0 <= START < END <= {max_len}"
        )
    return start, end


def pick_row(num_rows: int, seed: int | None = None) -> int:
    """A row index drawn uniformly from ``range(num_rows)``; the same ``seed`` gives the same row.

    >>> pick_row(1000, seed=7) == pick_row(1000, seed=7)
    True
    """
    if num_rows < 1:
        raise OptionError("the dataset has no rows to pick from")
    return random.Random(seed).randrange(num_rows)


def head_tail(text: str, head: int, tail: int | None = None) -> tuple[str, str]:
    """The first ``head`` and the last ``tail`` (default ``head``) characters of ``text``,
    control characters escaped (``\\n`` becomes the two characters ``\\``, ``n``); the end is
    empty when the whole text fits in ``head + tail`` characters.

    >>> head_tail("one\\ntwo three four", 8)
    ('one\\\\ntwo', 'ree four')
    >>> head_tail("short", 8)
    ('short', '')
    """
    tail = head if tail is None else tail
    escaped = _escape(text)
    if len(escaped) <= head + tail:
        return escaped, ""
    return escaped[:head], escaped[len(escaped) - tail :]


def _escape(text: str) -> str:
    return "".join(
        ch.encode("unicode_escape").decode("ascii")
        if (ord(ch) < 32 or ord(ch) == 127) or ch == "\\"
        else ch
        for ch in text
    )


@dataclass(frozen=True)
class SegmentView(Segment):
    """One segment of an inspected row (the reader's :class:`~packtool.format.Segment`, where
    it is and where it comes from), with its number in the row and what it says.

    ``first_position``/``last_position`` come from the stored ``position_ids``;
    ``positions_ok`` is whether they are exactly ``0..length-1``. ``text`` is the decoded
    segment (``None`` for padding or without a tokenizer); ``learned`` counts tokens whose label
    is not -100 (``None`` when the dataset has no labels). ``pieces`` splits the decoded text
    into runs of learned (``True``) and context (``False``) tokens, when there are labels and a
    tokenizer.
    """

    index: int
    first_position: int
    last_position: int
    positions_ok: bool
    token_ids: np.ndarray
    text: str | None = None
    learned: int | None = None
    pieces: list[tuple[str, bool]] | None = None

    @property
    def name(self) -> str:
        """``"doc 12"``, ``"doc 12 chunk 1"`` (split documents) or ``"padding"``."""
        if self.doc_id is None:
            return "padding"
        return f"doc {self.doc_id}" + (f" chunk {self.chunk_id}" if self.chunk_id else "")


@dataclass(frozen=True)
class RowView:
    """One row of a packed dataset as ``packtool inspect`` shows it."""

    index: int
    num_rows: int
    shard: int
    shard_file: str
    row_in_shard: int
    max_len: int
    num_tokens: int
    cu_seqlens: np.ndarray
    segments: list[SegmentView]

    @property
    def efficiency(self) -> float:
        """Real tokens over slots in this row."""
        return self.num_tokens / self.max_len

    @property
    def documents(self) -> int:
        return sum(not s.is_padding for s in self.segments)

    def mask_grid(self, cell: int, window: tuple[int, int] | None = None) -> MaskGrid:
        """This row's mask (:func:`row_mask_grid`) from its stored ``cu_seqlens``."""
        return row_mask_grid(self.cu_seqlens, self.max_len, cell, window)


def _learned_runs(
    tokenizer: Any, ids: np.ndarray, is_learned: np.ndarray
) -> list[tuple[str, bool]]:
    """The segment's text as runs of learned / context tokens, each run decoded on its own."""
    cuts = np.flatnonzero(np.diff(is_learned.astype(np.int8))) + 1
    bounds = [0, *cuts.tolist(), int(ids.size)]
    return [
        (tokenizer.decode([int(t) for t in ids[a:b]]), bool(is_learned[a]))
        for a, b in itertools.pairwise(bounds)
    ]


def inspect_row(reader: PackedReader, index: int, tokenizer: Any | None = None) -> RowView:
    """Row ``index`` of ``reader`` with its segments, decoded with ``tokenizer`` if given
    (e.g. ``reader.load_tokenizer()``; anything with ``decode(ids)``).

    Raises :class:`~packtool.errors.OptionError` for a row out of range and
    :class:`~packtool.errors.FormatError` for a row whose ``cu_seqlens`` are invalid.
    """
    n = reader.num_rows
    if n == 0:
        raise OptionError(f"{reader.path} has no rows to inspect")
    if not 0 <= index < n:
        raise OptionError(
            f"row {index} is out of range: {reader.path} has {n:,} rows (pass --row 0 to {n - 1})"
        )
    shard, local = reader.locate(index)
    row = reader.row(index)
    try:
        document_ids(row.cu_seqlens, reader.max_len)
    except ValueError as e:
        raise FormatError(f"{reader.path} row {index}: {e} (run `packtool verify`)") from None
    views = []
    for k, seg in enumerate(row.segments):
        ids = row.input_ids[seg.start : seg.end]
        pos = row.position_ids[seg.start : seg.end]
        text = None
        if tokenizer is not None and not seg.is_padding:
            text = tokenizer.decode([int(t) for t in ids])
        learned = pieces = None
        if row.labels is not None:
            is_learned = row.labels[seg.start : seg.end] != IGNORE_INDEX
            learned = int(np.count_nonzero(is_learned))
            if tokenizer is not None and not seg.is_padding:
                pieces = _learned_runs(tokenizer, ids, is_learned)
        views.append(
            SegmentView(
                index=k,
                start=seg.start,
                length=seg.length,
                doc_id=seg.doc_id,
                chunk_id=seg.chunk_id,
                pad=seg.pad,
                first_position=int(pos[0]),
                last_position=int(pos[-1]),
                positions_ok=bool(np.array_equal(pos, np.arange(seg.length))),
                token_ids=ids,
                text=text,
                learned=learned,
                pieces=pieces,
            )
        )
    return RowView(
        index=index,
        num_rows=n,
        shard=shard,
        shard_file=reader.shard_files[shard],
        row_in_shard=local,
        max_len=reader.max_len,
        num_tokens=row.num_tokens,
        cu_seqlens=np.asarray(row.cu_seqlens, dtype=np.int64),
        segments=views,
    )
