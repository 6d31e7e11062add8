"""Bin packing of documents into rows: exact first-fit decreasing (FFD), fast.

Every document (or chunk of one) is an *item* with a length in tokens; every row holds at
most ``max_len`` tokens. FFD takes the items longest first (equal lengths in input order)
and puts each into the lowest-numbered row that still has room, opening a new row when none
has. With ``max_len`` 10 and lengths ``[3, 7, 5, 2, 6, 4]``::

    placement order (longest first):  7(#1)  6(#4)  5(#2)  4(#5)  3(#0)  2(#3)

    row 0 | 7 7 7 7 7 7 7 3 3 3 |   #1, then #0 (3 fits in the 3 left)
    row 1 | 6 6 6 6 6 6 4 4 4 4 |   #4, then #5
    row 2 | 5 5 5 5 5 2 2 . . . |   #2, then #3

    first_fit_decreasing([3, 7, 5, 2, 6, 4], 10)  ->  [0, 0, 2, 2, 1, 1]
    plan_rows(...)  ->  order [1, 0, 4, 5, 2, 3], row_starts [0, 2, 4, 6]

The numba backend sorts with a counting sort (lengths are small integers) and finds "the
lowest-numbered row with room" by descending a max-segment-tree over the rows' remaining
capacities. Rows not opened yet sit in the tree with the full ``max_len`` free, so the
descent lands on the next new row by itself when no open row fits. The pure numpy backend,
used without numba or with ``PACKTOOL_NO_NUMBA=1``, places all items of one length at once
and gives identical results.

Documents longer than ``max_len`` never reach FFD: the pipeline first applies an
:class:`Overflow` policy (see :func:`segment_items`).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from .counts import Counts, DocumentCounts, LabelFigures, TokenCounts
from .errors import OptionError

__all__ = [
    "Overflow",
    "RowPlan",
    "aligned_lengths",
    "cut_items",
    "first_fit_decreasing",
    "lower_bound_rows",
    "plan_rows",
    "segment_items",
    "segment_labelled_items",
    "split_losses",
]

Backend = Literal["numba", "python"]

_NO_NUMBA_ENV = "PACKTOOL_NO_NUMBA"
_TRUTHY = frozenset({"1", "true", "yes", "on"})

# The counting sort allocates one counter per distinct length value in [min, max]; past this
# span (only reachable with a huge max_len) a comparison sort is used instead.
_COUNTING_SORT_MAX_SPAN = 1 << 22


# --------------------------------------------------------------------------------------
# Overflow policy
# --------------------------------------------------------------------------------------


class Overflow(str, Enum):
    """What to do with a document longer than ``max_len``.

    With ``max_len`` 10::

        document  | a a a a a a a a a a a a a a a a a a a a a a a a a |  25 tokens

        split     | a a a a a a a a a a | a a a a a a a a a a | a a a a a |  chunks 10, 10, 5
        truncate  | a a a a a a a a a a |                               first 10 tokens kept
        drop      (nothing)                                             document skipped
    """

    SPLIT = "split"
    TRUNCATE = "truncate"
    DROP = "drop"


@dataclass(frozen=True)
class RowPlan:
    """Items and the rows they go in.

    Item ``i`` is the tokens ``[offset[i], offset[i] + length[i])`` of the token store,
    segment ``chunk_id[i]`` of document ``doc_id[i]``; row ``p`` holds the items
    ``order[row_starts[p]:row_starts[p + 1]]``, in that order (see :func:`plan_rows`).
    """

    offset: np.ndarray
    length: np.ndarray
    doc_id: np.ndarray
    chunk_id: np.ndarray
    order: np.ndarray
    row_starts: np.ndarray
    source_id: np.ndarray | None = None  # a mixture's: each item's source (pack --mix)

    @property
    def n_rows(self) -> int:
        return int(self.row_starts.size - 1)


def aligned_lengths(lengths: np.ndarray, multiple: int) -> np.ndarray:
    """Each length rounded up to a multiple of ``multiple`` (``--pad-to-multiple-of``): the
    span a segment takes in its row with its alignment pad (``lengths`` itself for 1)::

        aligned_lengths([5, 8, 9], 4) -> [8, 8, 12]
    """
    if multiple <= 1:
        return lengths
    lengths = np.asarray(lengths)
    return -(-lengths // multiple) * multiple


def lower_bound_rows(total_tokens: int, max_len: int) -> int:
    """The fewest rows that can hold ``total_tokens``: ``ceil(total_tokens / max_len)``.

    No packing does better; FFD typically lands within a fraction of a percent of it on
    real length distributions::

        lower_bound_rows(25, 10) -> 3      | 10 | 10 | 5 . . . . . |
        lower_bound_rows(0, 10)  -> 0
    """
    _check_max_len(max_len)
    total_tokens = _check_count("total_tokens", total_tokens)
    return -(-total_tokens // max_len)


# --------------------------------------------------------------------------------------
# First-fit decreasing
# --------------------------------------------------------------------------------------


def first_fit_decreasing(
    lengths: ArrayLike, max_len: int, *, backend: Backend | None = None
) -> np.ndarray:
    """For each item in input order, the index (int64) of its row.

    Rows are numbered in the order FFD opens them (row 0 first).

    Exact FFD: items taken by length descending, equal lengths in input order; each goes into
    the lowest-numbered row whose remaining capacity is at least its length, or opens a new
    row. With ``max_len`` 10::

        lengths      [3, 7, 5, 2, 6, 4]
        row of item  [0, 0, 2, 2, 1, 1]

        row 0 | 7 7 7 7 7 7 7 3 3 3 |
        row 1 | 6 6 6 6 6 6 4 4 4 4 |
        row 2 | 5 5 5 5 5 2 2 . . . |

    ``lengths`` must be a 1-D array of integers, each in ``[1, max_len]`` (apply an
    :class:`Overflow` policy first); an empty input gives an empty array. ``backend`` forces
    ``"numba"`` or ``"python"`` (both give identical results). By default numba is used when
    it can be imported and ``PACKTOOL_NO_NUMBA=1`` is not set, for inputs of at least
    1,000,000 items or once its kernel is loaded: below that the NumPy path (~0.2 s per
    million items) is faster than loading the kernel (~0.85 s of CPU: numba's import, then
    the kernel from its on-disk cache).

    Runs in O(n + max_len + n log rows): 10 million lognormal lengths at ``max_len`` 4096
    take about 0.6 s with numba, about 2 s with the numpy fallback (the first numba call in
    a process adds ~0.85 s to load the cached kernel, more to compile it when not cached).
    """
    _check_max_len(max_len)
    max_len = int(max_len)
    arr = _check_lengths(lengths, max_len)
    if backend is None:
        backend = _ffd_backend(arr.size)
    elif backend not in ("numba", "python"):
        raise ValueError(f"backend must be 'numba', 'python' or None, got {backend!r}")
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if backend == "numba":
        kernel = _numba_kernel()
        if kernel is None:
            raise RuntimeError("backend='numba' was asked for but numba cannot be imported")
        return _ffd_numba(arr, max_len, kernel)
    return _ffd_python(arr, max_len)


def plan_rows(row_of_item: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group items by row for gathering: ``(order, row_starts)``, both int64.

    ``order`` lists item indices row by row (row 0 first), and within a row in placement
    order (length descending, equal lengths by input index): the order in which FFD put them
    in. Row ``r``'s items are ``order[row_starts[r]:row_starts[r + 1]]``;
    ``len(row_starts) == n_rows + 1`` with ``n_rows = row_of_item.max() + 1``::

        lengths      [3, 7, 5, 2, 6, 4]
        row_of_item  [0, 0, 2, 2, 1, 1]

        order        [1, 0 | 4, 5 | 2, 3]      row 0: 7 3   row 1: 6 4   row 2: 5 2
        row_starts   [0,     2,     4,     6]

    A row number with no item gets an empty range. Empty inputs give ``([], [0])``.
    """
    rows = np.asarray(row_of_item)
    lens = np.asarray(lengths)
    if rows.ndim != 1 or lens.ndim != 1:
        raise ValueError(
            f"row_of_item and lengths must be 1-D, got shapes {rows.shape} and {lens.shape}"
        )
    if rows.shape != lens.shape:
        raise ValueError(
            f"row_of_item and lengths must have the same length, got {rows.size} and {lens.size}"
        )
    if rows.size == 0:
        return np.empty(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
    for name, a in (("row_of_item", rows), ("lengths", lens)):
        if a.dtype.kind not in "iu":
            raise ValueError(f"{name} must hold integers, got dtype {a.dtype}")
    if rows.dtype.kind == "i" and rows.min() < 0:
        first = int(np.flatnonzero(rows < 0)[0])
        raise ValueError(f"row_of_item[{first}] = {int(rows[first])} is negative")
    rows = rows.astype(np.int64, copy=False)
    n_rows = int(rows.max()) + 1

    placement = _placement_order(lens)
    # Stable, so each row keeps placement order; FFD's row sequence is nearly sorted already
    # (long items open rows in order), which numpy's stable sort exploits.
    order = placement[np.argsort(rows[placement], kind="stable")]
    row_starts = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=row_starts[1:])
    return order, row_starts


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------


def _check_max_len(max_len: Any) -> None:
    if isinstance(max_len, (bool, np.bool_)) or not isinstance(max_len, (int, np.integer)):
        raise OptionError(f"max_len must be an integer, got {max_len!r}")
    if max_len < 1:
        raise OptionError(f"max_len must be >= 1, got {max_len}")


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def _check_lengths(lengths: ArrayLike, max_len: int) -> np.ndarray:
    """``lengths`` as a contiguous int64 array, or a ValueError naming the problem."""
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"lengths must be a 1-D array, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"lengths must be integers, got dtype {arr.dtype}")
    lo, hi = arr.min(), arr.max()
    if lo < 1 or hi > max_len:
        first = int(np.argmax((arr < 1) | (arr > max_len)))
        raise ValueError(
            f"lengths[{first}] = {int(arr[first])} is outside [1, max_len={max_len}]"
            " (apply an overflow policy to longer documents first)"
        )
    return np.ascontiguousarray(arr, dtype=np.int64)


# --------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------


def numba_disabled() -> bool:
    """Whether ``PACKTOOL_NO_NUMBA`` turns the compiled kernels off (read on every call, so
    tests can set it with monkeypatch)."""
    return os.environ.get(_NO_NUMBA_ENV, "").strip().lower() in _TRUTHY


NUMBA_MIN_ITEMS = 1_000_000
"""From this many items on, FFD loads its compiled kernel (if not loaded yet)."""


def _ffd_backend(n_items: int = NUMBA_MIN_ITEMS) -> Backend:
    """The backend FFD uses by default for ``n_items``: ``"numba"`` or ``"python"``.

    ``"numba"`` if ``PACKTOOL_NO_NUMBA`` is not set and the kernel is loaded already, or
    ``n_items >= NUMBA_MIN_ITEMS`` and numba can be imported. The environment variable is
    read on every call, so tests can set it with monkeypatch.
    """
    if numba_disabled():
        return "python"
    if _KERNEL and _numba_kernel() is not None:  # loaded already: no cost left
        return "numba"
    if n_items < NUMBA_MIN_ITEMS:
        return "python"
    return "numba" if _numba_importable() else "python"


def _numba_importable() -> bool:
    return _numba_kernel() is not None


_KERNEL_LOCK = threading.Lock()
_KERNEL: list[Callable[..., Any] | None] = []  # [] = not tried yet, [None] = no numba


def _numba_kernel() -> Callable[..., Any] | None:
    """The compiled FFD kernel (built once, on first use), or None if numba is missing."""
    if _KERNEL:
        return _KERNEL[0]
    with _KERNEL_LOCK:
        if not _KERNEL:
            try:
                kernel: Callable[..., Any] | None = _build_numba_kernel()
            except Exception:  # ImportError, or a numba that does not match numpy
                kernel = None
            _KERNEL.append(kernel)
    return _KERNEL[0]


def use_numba_cache_dir() -> None:
    """Keep numba's compiled-kernel cache out of site-packages, unless NUMBA_CACHE_DIR is set.

    By default numba writes it next to the module; pip does not remove those files when
    packtool is uninstalled, and the left-over ``packtool/__pycache__`` then shadows a later
    (editable) install as an empty namespace package. Set before numba is first imported.
    """
    if "NUMBA_CACHE_DIR" not in os.environ:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        os.environ["NUMBA_CACHE_DIR"] = os.path.join(base, "packtool", "numba")


def _build_numba_kernel() -> Callable[..., Any]:
    use_numba_cache_dir()
    from numba import njit

    @njit(cache=True, nogil=True)
    def ffd_kernel(lengths, order, lo, hi, size, tree):  # pragma: no cover - compiled
        """Place ``lengths`` (int64, all in lo..hi) by FFD; ``tree`` is 2*size times max_len.

        ``order`` is either empty (then a counting sort over the values lo..hi is done here)
        or the placement order computed by the caller. Returns (row_of_item, n_rows), or
        n_rows = -1 if the tree was too small (which the caller's bound rules out).
        """
        n = lengths.shape[0]
        sorted_len = np.empty(n, tree.dtype)
        if order.shape[0] == 0:
            # Counting sort, descending by length, stable: bucket L starts after all longer.
            span = hi - lo + 1
            counts = np.zeros(span, np.int64)
            for i in range(n):
                counts[hi - lengths[i]] += 1
            start = np.empty(span, np.int64)
            acc = 0
            for k in range(span):
                start[k] = acc
                for p in range(acc, acc + counts[k]):
                    sorted_len[p] = hi - k
                acc += counts[k]
            order = np.empty(n, np.int64)
            for i in range(n):
                k = hi - lengths[i]
                order[start[k]] = i
                start[k] += 1
        else:
            for p in range(n):
                sorted_len[p] = lengths[order[p]]

        # Max-segment-tree: leaves size..2*size-1 are rows, node v has children 2v, 2v+1.
        # Items of equal length go in together: the leftmost row with room for one of
        # them takes as many as fit (FFD would put them there one after the other).
        row_sorted = np.empty(n, np.int64)
        n_rows = 0
        p = 0
        group_end = 0
        while p < n:
            s = sorted_len[p]
            if p >= group_end:
                group_end = p + 1
                while group_end < n and sorted_len[group_end] == s:
                    group_end += 1
            if tree[1] < s:
                return row_sorted, -1
            node = 1
            while node < size:  # leftmost leaf with capacity >= s
                node <<= 1
                if tree[node] < s:
                    node += 1
            row = node - size
            if row >= n_rows:
                n_rows = row + 1
            free = tree[node]
            k = min(free // s, group_end - p)
            if k < 1:  # cannot happen; guards against looping forever on a bug
                return row_sorted, -1
            for q in range(p, p + k):
                row_sorted[q] = row
            p += k
            tree[node] = free - k * s
            node >>= 1
            while node >= 1:  # restore maxima upward; stop once one is unchanged
                left = tree[2 * node]
                right = tree[2 * node + 1]
                m = left if left > right else right
                if tree[node] == m:
                    break
                tree[node] = m
                node >>= 1

        row_of_item = np.empty(n, np.int64)
        for p in range(n):
            row_of_item[order[p]] = row_sorted[p]
        return row_of_item, n_rows

    return ffd_kernel


def _row_bound(lengths: np.ndarray, max_len: int) -> int:
    """An upper bound on the rows FFD opens.

    In FFD at most one row ends at most half full: a row opened after a row with load
    <= max_len/2 was opened by an item that did not fit there, so longer than max_len/2.
    Hence rows - 1 < 2 * total / max_len, i.e. rows <= ceil(2 * total / max_len).
    """
    total = int(lengths.sum(dtype=np.int64))
    return max(1, min(int(lengths.size), -(-2 * total // max_len)))


def _ffd_numba(lengths: np.ndarray, max_len: int, kernel: Callable[..., Any]) -> np.ndarray:
    n = int(lengths.size)
    lo, hi = int(lengths.min()), int(lengths.max())
    size = 1 << max(0, (_row_bound(lengths, max_len) - 1).bit_length())
    dtype = np.int32 if max_len <= np.iinfo(np.int32).max else np.int64
    tree = np.full(2 * size, max_len, dtype=dtype)
    if hi - lo < max(_COUNTING_SORT_MAX_SPAN, 2 * n):
        order = np.empty(0, dtype=np.int64)
    else:
        order = _placement_order(lengths)
    row_of_item, n_rows = kernel(lengths, order, lo, hi, size, tree)
    if n_rows < 0:  # pragma: no cover - ruled out by _row_bound
        raise AssertionError("FFD kernel found no row with room; please report this as a bug")
    return row_of_item


def _placement_order(lengths: np.ndarray) -> np.ndarray:
    """Item indices by length descending, equal lengths by index (int64)."""
    lens = np.asarray(lengths)
    if lens.size == 0:
        return np.empty(0, dtype=np.int64)
    hi = int(lens.max())
    span = hi - int(lens.min())
    if span <= np.iinfo(np.uint16).max:
        # Stable argsort of a uint16 key is a radix sort in numpy: O(n).
        key = (hi - lens.astype(np.int64, copy=False)).astype(np.uint16)
    else:
        key = hi - lens.astype(np.int64, copy=False)
    return np.argsort(key, kind="stable").astype(np.int64, copy=False)


def _ffd_python(lengths: np.ndarray, max_len: int) -> np.ndarray:
    """FFD with numpy only, one length at a time.

    All items of one length s are placed together: in FFD they fill the open rows with
    capacity >= s from the left, row r taking ``cap[r] // s`` of them (its capacity only
    drops and the rows before it stay too full), and whatever is left opens new rows of
    ``max_len // s`` items each. Rows are scanned in growing windows from the left, so a
    length whose items fit early does not touch every row.
    """
    n = int(lengths.size)
    order = _placement_order(lengths)
    sorted_len = lengths[order]
    cuts = np.flatnonzero(sorted_len[1:] != sorted_len[:-1]) + 1
    group_starts = np.concatenate(([0], cuts)).tolist()
    group_ends = [*cuts.tolist(), n]

    cap = np.empty(_row_bound(lengths, max_len), dtype=np.int64)  # tokens free per open row
    max_free = 0  # an upper bound on cap[:n_rows], exact after every full scan
    n_rows = 0
    row_sorted = np.empty(n, dtype=np.int64)

    for a, b in zip(group_starts, group_ends, strict=True):
        s = int(sorted_len[a])
        need = b - a
        pos = a
        if max_free >= s:
            lo_row = 0
            window = 1024
            while need and lo_row < n_rows:
                hi_row = min(n_rows, lo_row + window)
                seg = cap[lo_row:hi_row]
                cand = np.flatnonzero(seg >= s)
                if cand.size:
                    fits = seg[cand] // s
                    cum = np.cumsum(fits)
                    if cum[-1] >= need:  # the last row needed takes only what is left
                        k = int(np.searchsorted(cum, need)) + 1
                        cand, fits = cand[:k], fits[:k]
                        fits[-1] -= int(cum[k - 1]) - need
                        placed = need
                    else:
                        placed = int(cum[-1])
                    rows = cand + lo_row
                    row_sorted[pos : pos + placed] = np.repeat(rows, fits)
                    cap[rows] -= fits * s
                    pos += placed
                    need -= placed
                lo_row = hi_row
                window *= 2
            if lo_row >= n_rows:
                max_free = int(cap[:n_rows].max())
        if need:
            per_row = max_len // s
            new_rows = -(-need // per_row)
            row_sorted[pos:b] = n_rows + np.arange(need, dtype=np.int64) // per_row
            cap[n_rows : n_rows + new_rows] = max_len - per_row * s
            last_count = need - per_row * (new_rows - 1)
            cap[n_rows + new_rows - 1] = max_len - last_count * s
            max_free = max(max_free, max_len - last_count * s)
            n_rows += new_rows

    row_of_item = np.empty(n, dtype=np.int64)
    row_of_item[order] = row_sorted
    return row_of_item


def segment_items(
    lengths: np.ndarray, empty: np.ndarray, max_len: int, overflow: Overflow
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Counts]:
    """Items of one encoded batch: (document index in batch, chunk number, item length),
    and the :class:`~packtool.format.Counts` of its documents and tokens.

    ``split``: consecutive chunks of ``max_len``, the remainder last; ``truncate``: the first
    ``max_len`` tokens; ``drop``: none. Empty documents give no item.
    """
    long = lengths > max_len
    if overflow is Overflow.SPLIT:
        n_items = np.where(empty, 0, np.maximum(1, -(-lengths // max_len)))
    elif overflow is Overflow.TRUNCATE:
        n_items = np.where(empty, 0, 1)
    else:
        n_items = np.where(empty | long, 0, 1)
    doc = np.repeat(np.arange(lengths.size), n_items)
    first = np.concatenate([[0], np.cumsum(n_items)[:-1]]) if lengths.size else n_items
    chunk = np.arange(doc.size) - np.repeat(first, n_items)
    item_len = np.minimum(lengths[doc] - chunk * max_len, max_len)
    over = ~empty & long
    n_over = int(np.count_nonzero(over))
    documents = DocumentCounts(
        read=int(lengths.size),
        packed=int(np.count_nonzero(~empty & ~long)),
        split=n_over if overflow is Overflow.SPLIT else 0,
        truncated=n_over if overflow is Overflow.TRUNCATE else 0,
        dropped=n_over if overflow is Overflow.DROP else 0,
        empty=int(np.count_nonzero(empty)),
    )
    over_tokens = int(lengths[over].sum())
    tokens = TokenCounts(
        packed=int(item_len.sum()),
        truncated_away=over_tokens - n_over * max_len if overflow is Overflow.TRUNCATE else 0,
        dropped=over_tokens if overflow is Overflow.DROP else 0,
    )
    return doc, chunk, item_len, Counts(documents, tokens)


def segment_labelled_items(
    lengths: np.ndarray,
    empty: np.ndarray,
    labels: np.ndarray,
    max_len: int,
    overflow: Overflow,
    *,
    ignore: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Counts, np.ndarray]:
    """:func:`segment_items` for documents with labels (flat, like their ids; ``ignore``
    where not learned); also returns the labels to store.

    - The first token of every segment gets no label: nothing in its segment precedes it, and a
      model shifting labels would otherwise learn it from the segment before.
    - A document with no learned token (in what ``truncate`` keeps) is counted as empty.
    - Under ``split``, a chunk with no learned token is dropped and counted.
    """
    offsets = (np.cumsum(lengths) - lengths).astype(np.int64)
    labels = labels.copy()
    if overflow is Overflow.SPLIT:
        n_starts = -(-lengths // max_len)
    else:
        n_starts = (lengths > 0).astype(np.int64)
    first = (np.cumsum(n_starts) - n_starts).astype(np.int64)
    k = np.arange(int(n_starts.sum()), dtype=np.int64) - np.repeat(first, n_starts)
    labels[np.repeat(offsets, n_starts) + k * max_len] = ignore
    # One byte per token and per-range sums: a prefix sum of int64 over every token cost
    # 8 bytes and ~35 ns a token (a third of a pre-tokenized run's time).
    learned = np.concatenate([labels != ignore, [False]]).view(np.uint8)
    kept = np.minimum(lengths, max_len) if overflow is Overflow.TRUNCATE else lengths
    no_labels = ~empty & (_count_in(learned, offsets, kept) == 0)
    doc, chunk, item_len, counts = segment_items(lengths, empty | no_labels, max_len, overflow)
    item_off = offsets[doc] + chunk.astype(np.int64) * max_len
    item_learned = _count_in(learned, item_off, item_len)
    keep = item_learned > 0
    tokens = dataclasses.replace(
        counts.tokens,
        packed=int(item_len[keep].sum()),
        learned=int(item_learned[keep].sum()),
    )
    unlearned = LabelFigures(
        documents_without_labels=int(no_labels.sum()),
        chunks_without_labels_dropped=int((~keep).sum()),
        tokens_in_chunks_without_labels=int(item_len[~keep].sum()),
    )
    counts = Counts(counts.documents, tokens, unlearned)
    return doc[keep], chunk[keep], item_len[keep], counts, labels


def split_losses(
    lengths: np.ndarray,
    empty: np.ndarray,
    labels: np.ndarray,
    max_len: int,
    doc: np.ndarray,
    chunk: np.ndarray,
    *,
    ignore: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What the rows of a labelled ``split`` pack cannot give back of its documents longer
    than ``max_len``: the label of each chunk's first token (``labels``: as read, before
    :func:`segment_labelled_items` set them to ``ignore``) and the chunks it did not keep
    (``doc``, ``chunk``: the items it kept). Returns, for each chunk that lost a learned
    first label or is not kept, of a document that anything of is kept or learned: (document
    index in the batch, chunk, start of its tokens in the flat batch, its length if not kept
    else 0, its first label). A document none of whose chunks is kept and that learns
    nothing at a chunk start learns nothing at any ``max_len``: it gives no record; nor does
    an ``empty`` one (no content tokens: empty at any ``max_len``)."""
    n = np.where((lengths > max_len) & ~empty, -(-lengths // max_len), 0).astype(np.int64)
    offsets = (np.cumsum(lengths) - lengths).astype(np.int64)
    c_doc = np.repeat(np.arange(lengths.size, dtype=np.int64), n)
    c_chunk = np.arange(c_doc.size, dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    start = offsets[c_doc] + c_chunk * max_len
    length = np.minimum(lengths[c_doc] - c_chunk * max_len, max_len)
    label = np.where(c_chunk > 0, labels[start] if start.size else start, ignore)
    width = int(n.max()) + 1 if n.size else 1
    kept = np.isin(c_doc * width + c_chunk, doc.astype(np.int64) * width + chunk)
    learned = label != ignore
    matters = np.zeros(lengths.size, bool)
    matters[c_doc[kept | learned]] = True
    out = matters[c_doc] & (~kept | learned)
    lost_len = np.where(kept, 0, length)
    return (
        c_doc[out],
        c_chunk[out].astype(np.int32),
        start[out],
        lost_len[out].astype(np.int32),
        label[out].astype(np.int32),
    )


def cut_items(
    lengths: np.ndarray,
    empty: np.ndarray,
    labels: np.ndarray | None,
    max_len: int,
    overflow: Overflow,
    *,
    ignore: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Counts, np.ndarray | None]:
    """The items ``pack`` stores for one batch of encoded documents (flat ``labels`` like
    their ids, or ``None``): (document index in the batch, chunk, item length), the counts,
    and the labels to store (``None`` without labels). Documents with labels are cut by
    :func:`segment_labelled_items`, others by :func:`segment_items`; ``pack`` and ``verify
    --against`` cut through this one function, so what verify expects is what pack stored.
    """
    if labels is None:
        doc, chunk, item_len, counts = segment_items(lengths, empty, max_len, overflow)
        return doc, chunk, item_len, counts, None
    return segment_labelled_items(lengths, empty, labels, max_len, overflow, ignore=ignore)


def _count_in(flags: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The sum of ``flags`` (uint8, with one 0 past the end) over each range
    ``[starts[k], starts[k] + lengths[k])``."""
    out = np.zeros(starts.size, np.int64)
    full = lengths > 0
    if full.any():
        s = starts[full]
        bounds = np.column_stack([s, s + lengths[full]]).ravel()
        out[full] = np.add.reduceat(flags, bounds, dtype=np.int64)[::2]
    return out
