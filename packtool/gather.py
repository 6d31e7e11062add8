"""Gather planned rows from the token store into arrays ready to write.

Given the row plan (which items go to which row, in which order) and the on-disk token store,
:func:`gather_rows` builds a :class:`~packtool.format.PackedBatch` for a block of rows. The
token copy is a numba kernel (one pass over the items) when it is loaded or the block is large;
otherwise a slice copy per item, or vectorised NumPy for many short items. All give identical
arrays (tested).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from .format import IGNORE_INDEX, PackedBatch
from .packing import RowPlan, numba_disabled

__all__ = ["RangeSource", "gather_rows", "warm_up_gather"]


@runtime_checkable
class RangeSource(Protocol):
    """Where :func:`gather_rows` can read tokens from besides an array (the work store's
    :class:`~packtool.store.StoreReader`)."""

    def read_ranges(
        self, starts: np.ndarray, lengths: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """``(tokens, labels or None, offsets)``: range ``k`` is
        ``tokens[offsets[k]:offsets[k] + lengths[k]]``."""
        ...


_KERNEL: list[Callable[..., Any] | None] = []
_LOCK = threading.Lock()


def _loaded_kernel() -> Callable[..., Any] | None:
    """The compiled kernel if it is loaded already (never loads it)."""
    if numba_disabled() or not _KERNEL:
        return None
    return _KERNEL[0]


_SLICES_MAX_ITEMS = 20_000
"""Blocks with fewer items copy with a Python loop of slices when the kernel is not loaded:
~1.5 us an item, cheaper than loading numba (~0.85 s of CPU) for all but the largest runs."""


def _kernel() -> Callable[..., Any] | None:
    if numba_disabled():
        return None
    if not _KERNEL:
        with _LOCK:
            if not _KERNEL:
                try:
                    _KERNEL.append(_build_kernel())
                except Exception:  # no numba, or one that does not match numpy
                    _KERNEL.append(None)
    return _KERNEL[0]


def _build_kernel() -> Callable[..., Any]:
    from .packing import use_numba_cache_dir

    use_numba_cache_dir()
    from numba import njit

    @njit(cache=True, nogil=True)
    def copy_items(tokens, src_off, lens, dest_start, labels_src, out_ids, out_pos, out_lab):
        # pragma: no cover - compiled
        for k in range(lens.shape[0]):
            s = src_off[k]
            d = dest_start[k]
            for t in range(lens[k]):
                out_ids[d + t] = tokens[s + t]
                out_pos[d + t] = t
            if labels_src.shape[0] > 0:
                for t in range(lens[k]):
                    out_lab[d + t] = labels_src[s + t]

    return copy_items


def warm_up_gather() -> None:
    """Load the compiled copy kernel now, for the array types :func:`gather_rows` passes it
    (numba loads machine code per argument types at the first call)."""
    kernel = _kernel()
    if kernel is None:
        return
    i32, i64 = np.zeros(4, np.int32), np.zeros(1, np.int64)
    kernel(i32, i64, np.ones(1, np.int64), i64, np.zeros(0, np.int32), i32, i32.copy(), i32[:0])


class _Copy(NamedTuple):
    """A block's token copy, the arguments of the kernel: item ``k``,
    ``tokens[src_off[k]:src_off[k] + lens[k]]`` (and its labels from ``labels_src``), goes to
    ``dest_start[k]`` of ``out_ids`` (and ``out_lab``), with positions ``0, 1, ...`` in
    ``out_pos``."""

    tokens: np.ndarray
    src_off: np.ndarray
    lens: np.ndarray
    dest_start: np.ndarray
    labels_src: np.ndarray | None
    out_ids: np.ndarray
    out_pos: np.ndarray
    out_lab: np.ndarray | None


def _copy_slices(c: _Copy) -> None:
    """One slice copy per item: fast for long items, with no compiled code to load."""
    positions = np.arange(int(c.lens.max()) if c.lens.size else 0, dtype=np.int32)
    for s, n, d in zip(c.src_off.tolist(), c.lens.tolist(), c.dest_start.tolist(), strict=True):
        c.out_ids[d : d + n] = c.tokens[s : s + n]
        c.out_pos[d : d + n] = positions[:n]
        if c.labels_src is not None and c.out_lab is not None:
            c.out_lab[d : d + n] = c.labels_src[s : s + n]


def _copy_numpy(c: _Copy) -> None:
    """Vectorised: fast for many short items."""
    total = int(c.lens.sum())
    if total == 0:
        return
    starts = np.concatenate([[0], np.cumsum(c.lens)[:-1]])
    intra = np.arange(total, dtype=np.int64) - np.repeat(starts, c.lens)
    dest = np.repeat(c.dest_start, c.lens) + intra
    src = np.repeat(c.src_off, c.lens) + intra
    c.out_ids[dest] = c.tokens[src]
    c.out_pos[dest] = intra
    if c.labels_src is not None and c.out_lab is not None:
        c.out_lab[dest] = c.labels_src[src]


def gather_rows(
    tokens: np.ndarray | RangeSource,
    plan: RowPlan,
    rows: np.ndarray,
    max_len: int,
    pad_id: int,
    labels: np.ndarray | None = None,
    align: int = 1,
) -> PackedBatch:
    """Build the planned rows ``rows`` (in this order) as a :class:`PackedBatch`.

    ``align`` > 1 (``--pad-to-multiple-of``): every item is followed by ``pad_id`` up to a
    multiple of ``align`` (its positions continuing, its labels -100), the boundaries are
    the padded ones, and ``cu_unpadded`` holds the running sums of the real lengths.

    Row ``p`` of ``plan`` holds its items ``order[row_starts[p]:row_starts[p + 1]]``, in that
    order; item ``i`` is ``tokens[offset[i]:offset[i] + length[i]]``. ``labels``, when
    given, is aligned with ``tokens`` and gathered the same way (-100 in the padding).

    ``tokens`` may also be a :class:`RangeSource`, which reads just the items these rows
    need (and their labels, if it has any; ``labels`` is then ignored).
    """
    item_off, item_len, order, row_starts = plan.offset, plan.length, plan.order, plan.row_starts
    rows = np.asarray(rows, dtype=np.int64)
    n_rows = int(rows.size)
    counts = row_starts[rows + 1] - row_starts[rows]
    seg_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    n_items = int(seg_offsets[-1])
    local = np.arange(n_items, dtype=np.int64) - np.repeat(seg_offsets[:-1], counts)
    items = order[np.repeat(row_starts[rows], counts) + local]
    lens = item_len[items].astype(np.int64)
    spans = lens if align == 1 else -(-lens // align) * align  # with the alignment pad
    ends = np.cumsum(spans)
    row_base = np.repeat(np.concatenate([[0], ends])[seg_offsets[:-1]], counts)
    seg_end = ends - row_base  # end of each item within its row
    seg_start = seg_end - spans
    row_of_item = np.repeat(np.arange(n_rows, dtype=np.int64), counts)
    num_tokens = np.zeros(n_rows, np.int64)
    np.add.at(num_tokens, row_of_item, lens)
    used = num_tokens
    if align > 1:
        used = np.zeros(n_rows, np.int64)
        np.add.at(used, row_of_item, spans)

    # Every cell is written once: the items' tokens and positions by the copy below, the
    # padding after it (filling whole arrays first took half the time of the gather).
    input_ids = np.empty(n_rows * max_len, np.int32)
    position_ids = np.empty(n_rows * max_len, np.int32)
    src_off = item_off[items].astype(np.int64)
    if not isinstance(tokens, np.ndarray):
        tokens, labels, src_off = tokens.read_ranges(src_off, lens)
    out_lab = np.full(n_rows * max_len, IGNORE_INDEX, np.int32) if labels is not None else None
    dest_start = row_of_item * max_len + seg_start
    kernel = _loaded_kernel()
    if kernel is None and n_items > _SLICES_MAX_ITEMS:
        kernel = _kernel()
    copy = _Copy(tokens, src_off, lens, dest_start, labels, input_ids, position_ids, out_lab)
    if kernel is not None:  # compiled for arrays only: no labels are empty ones
        empty = np.zeros(0, np.int32)
        labels_src = empty if labels is None else labels
        kernel(*copy._replace(labels_src=labels_src, out_lab=empty if out_lab is None else out_lab))
    elif n_items <= _SLICES_MAX_ITEMS or lens.mean() >= 32:
        _copy_slices(copy)
    else:
        _copy_numpy(copy)

    if align > 1:
        _fill_alignment_pad(lens, spans, dest_start, pad_id, input_ids, position_ids)
    padded = _fill_tails(input_ids, position_ids, used, max_len, pad_id)
    cu_counts = 1 + counts + padded
    cu_offsets = np.concatenate([[0], np.cumsum(cu_counts)]).astype(np.int64)
    cu_values = np.zeros(int(cu_offsets[-1]), np.int32)
    at = np.repeat(cu_offsets[:-1] + 1, counts) + local
    cu_values[at] = seg_end
    cu_values[cu_offsets[1:][padded] - 1] = max_len
    cu_unpadded = None
    if align > 1:
        real_ends = np.cumsum(lens)
        real_base = np.repeat(np.concatenate([[0], real_ends])[seg_offsets[:-1]], counts)
        cu_unpadded = np.zeros(int(cu_offsets[-1]), np.int32)
        cu_unpadded[at] = real_ends - real_base
        cu_unpadded[cu_offsets[1:][padded] - 1] = num_tokens[padded]
    return PackedBatch(
        input_ids=input_ids.reshape(n_rows, max_len),
        position_ids=position_ids.reshape(n_rows, max_len),
        cu_values=cu_values,
        cu_offsets=cu_offsets,
        num_tokens=num_tokens.astype(np.int32),
        doc_ids=plan.doc_id[items],
        chunk_ids=plan.chunk_id[items],
        seg_offsets=seg_offsets,
        labels=out_lab.reshape(n_rows, max_len) if out_lab is not None else None,
        source_ids=plan.source_id[items] if plan.source_id is not None else None,
        cu_unpadded=cu_unpadded,
    )


def _fill_tails(
    input_ids: np.ndarray, position_ids: np.ndarray, used: np.ndarray, max_len: int, pad_id: int
) -> np.ndarray:
    """Pad every row after its last item (``used`` slots), positions counting up: the padding
    is a segment of its own. Which rows have padding."""
    padded = used < max_len
    if padded.any():
        positions = np.arange(max_len, dtype=np.int32)
        for r in np.flatnonzero(padded).tolist():
            start = int(used[r])
            input_ids[r * max_len + start : (r + 1) * max_len] = pad_id
            position_ids[r * max_len + start : (r + 1) * max_len] = positions[: max_len - start]
    return padded


def _fill_alignment_pad(
    lens: np.ndarray,
    spans: np.ndarray,
    dest_start: np.ndarray,
    pad_id: int,
    out_ids: np.ndarray,
    out_pos: np.ndarray,
) -> None:
    """``pad_id`` after each item's tokens up to its span, positions continuing (the labels
    are -100 there already)."""
    gap = spans - lens
    total = int(gap.sum())
    if total == 0:
        return
    intra = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(gap) - gap, gap)
    where = np.repeat(dest_start + lens, gap) + intra
    out_ids[where] = pad_id
    out_pos[where] = np.repeat(lens, gap) + intra
