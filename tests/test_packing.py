"""Tests of packtool.packing: FFD against a plain brute force, both backends, plan_rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packtool import packing
from packtool.errors import OptionError
from packtool.packing import (
    Overflow,
    cut_items,
    first_fit_decreasing,
    lower_bound_rows,
    plan_rows,
    segment_items,
)

BACKENDS = ["numba", "python"]
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def brute_ffd(lengths: list[int], max_len: int) -> list[int]:
    """FFD written as plainly as possible: O(n * rows)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    loads: list[int] = []
    row_of = [-1] * len(lengths)
    for i in order:
        for r in range(len(loads)):
            if loads[r] + lengths[i] <= max_len:
                loads[r] += lengths[i]
                row_of[i] = r
                break
        else:
            loads.append(lengths[i])
            row_of[i] = len(loads) - 1
    return row_of


def placement(lengths: list[int]) -> list[int]:
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))


@st.composite
def ffd_inputs(draw: st.DrawFn, max_n: int = 60) -> tuple[list[int], int]:
    """(lengths, max_len): often few distinct values, so equal lengths come in runs."""
    max_len = draw(st.integers(1, 64))
    if draw(st.booleans()):
        pool = draw(st.lists(st.integers(1, max_len), min_size=1, max_size=4))
        values = st.sampled_from(pool)
    else:
        values = st.integers(1, max_len)
    lengths = draw(st.lists(values, max_size=max_n))
    return lengths, max_len


def backend_param(backend: str) -> str:
    if backend == "numba" and packing._numba_kernel() is None:
        pytest.skip("numba is not importable")
    return backend


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return backend_param(request.param)


def check_ffd_invariants(lengths: list[int], max_len: int, rows: np.ndarray) -> None:
    n = len(lengths)
    assert rows.dtype == np.int64
    assert rows.shape == (n,)  # every item gets exactly one row
    if n == 0:
        return
    lens = np.asarray(lengths, dtype=np.int64)
    n_rows = int(rows.max()) + 1
    assert rows.min() >= 0
    loads = np.bincount(rows, weights=lens, minlength=n_rows).astype(np.int64)
    assert (loads <= max_len).all()
    assert (np.bincount(rows, minlength=n_rows) > 0).all()  # rows 0..R-1, none empty
    assert n_rows >= lower_bound_rows(int(lens.sum()), max_len)
    # Rows are numbered in opening order: first occurrences along the placement order are
    # 0, 1, 2, ...
    seq = rows[placement(lengths)]
    _, first_pos = np.unique(seq, return_index=True)
    assert (np.diff(first_pos) > 0).all()
    # FFD's guarantee: at most one row is at most half full.
    assert int((2 * loads <= max_len).sum()) <= 1


# ---------------------------------------------------------------------------------------
# FFD properties
# ---------------------------------------------------------------------------------------


@PROPS
@given(ffd_inputs())
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_ffd_matches_brute_force_and_invariants(
    backend_name: str, inp: tuple[list[int], int]
) -> None:
    backend_name = backend_param(backend_name)
    lengths, max_len = inp
    rows = first_fit_decreasing(lengths, max_len, backend=backend_name)
    assert rows.tolist() == brute_ffd(lengths, max_len)
    check_ffd_invariants(lengths, max_len, rows)


def test_docstring_example(backend: str) -> None:
    rows = first_fit_decreasing([3, 7, 5, 2, 6, 4], 10, backend=backend)
    assert rows.tolist() == [0, 0, 2, 2, 1, 1]
    order, starts = plan_rows(rows, np.array([3, 7, 5, 2, 6, 4]))
    assert order.tolist() == [1, 0, 4, 5, 2, 3]
    assert starts.tolist() == [0, 2, 4, 6]


def test_ties_go_in_input_order(backend: str) -> None:
    # Three 4s and a 2 in rows of 6: the first 4 (index 0) opens row 0, the 2 joins it.
    rows = first_fit_decreasing([4, 4, 2, 4], 6, backend=backend)
    assert rows.tolist() == [0, 1, 0, 2]


def test_first_fit_not_best_fit(backend: str) -> None:
    # Rows of 10. Sorted: 8 -> row 0 (2 left), 6 -> row 1 (4 left), 3 -> row 1 (1 left),
    # then 1 -> row 0, the first row with room (best fit would pick row 1, the tightest).
    rows = first_fit_decreasing([1, 3, 8, 6], 10, backend=backend)
    assert rows.tolist() == [0, 1, 0, 1]


def _random_lengths(kind: str, n: int, max_len: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "lognormal":
        x = np.rint(rng.lognormal(np.log(max_len / 12), 1.0, n))
    elif kind == "uniform":
        x = rng.integers(1, max_len + 1, n)
    elif kind == "small":
        x = rng.integers(1, 9, n)
    elif kind == "bimodal":
        x = np.where(rng.random(n) < 0.5, rng.integers(1, 40, n), rng.integers(max_len // 2, n))
    else:  # "equal"
        x = np.full(n, max_len // 3 + 1)
    return np.clip(x, 1, max_len).astype(np.int64)


@pytest.mark.parametrize("kind", ["lognormal", "uniform", "small", "bimodal", "equal"])
def test_backends_identical_on_medium_inputs(kind: str) -> None:
    backend_param("numba")
    rng = np.random.default_rng(abs(hash(kind)) % 2**32)
    for max_len in (512, 4096):
        lengths = _random_lengths(kind, 20_000, max_len, rng)
        a = first_fit_decreasing(lengths, max_len, backend="numba")
        b = first_fit_decreasing(lengths, max_len, backend="python")
        np.testing.assert_array_equal(a, b)
        check_ffd_invariants(lengths.tolist(), max_len, a)


def test_medium_input_matches_brute_force(backend: str) -> None:
    rng = np.random.default_rng(7)
    lengths = _random_lengths("lognormal", 3_000, 256, rng)
    rows = first_fit_decreasing(lengths, 256, backend=backend)
    assert rows.tolist() == brute_ffd(lengths.tolist(), 256)


@pytest.mark.parametrize(
    ("lengths", "max_len"),
    [
        # span of values > 2**22: the numba backend sorts with numpy instead of counting
        ([1, 5_000_000, 3_000_000, 4_999_999, 2, 3_000_001], 8_000_000),
        # max_len past int32: 64-bit capacities
        ([2**39, 2**39 + 1, 5, 2**40, 2**39 - 1, 2**38], 2**40),
    ],
)
def test_huge_lengths(lengths: list[int], max_len: int, backend: str) -> None:
    rows = first_fit_decreasing(lengths, max_len, backend=backend)
    assert rows.tolist() == brute_ffd(lengths, max_len)


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int32, np.uint64, np.int64])
def test_integer_dtypes(dtype: type, backend: str) -> None:
    lengths = [5, 3, 9, 1, 7, 7]
    rows = first_fit_decreasing(np.array(lengths, dtype=dtype), 10, backend=backend)
    assert rows.tolist() == brute_ffd(lengths, 10)


def test_empty_input(backend: str) -> None:
    for empty in ([], np.array([], dtype=np.int32), np.array([], dtype=np.float64)):
        rows = first_fit_decreasing(empty, 8, backend=backend)
        assert rows.dtype == np.int64
        assert rows.shape == (0,)


def test_single_row_cases(backend: str) -> None:
    assert first_fit_decreasing([1], 1, backend=backend).tolist() == [0]
    assert first_fit_decreasing([1, 1, 1], 1, backend=backend).tolist() == [0, 1, 2]
    assert first_fit_decreasing([1] * 5, 5, backend=backend).tolist() == [0] * 5


# ---------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lengths", "max_len", "error", "match"),
    [
        ([[1, 2], [3, 4]], 8, ValueError, r"lengths must be a 1-D array, got shape \(2, 2\)"),
        (5, 8, ValueError, r"lengths must be a 1-D array, got shape \(\)"),
        ([1.0, 2.0], 8, ValueError, r"lengths must be integers, got dtype float64"),
        ([True, False], 8, ValueError, r"lengths must be integers, got dtype bool"),
        ([3, 0, 2], 8, ValueError, r"lengths\[1\] = 0 is outside \[1, max_len=8\]"),
        ([3, 4, 9, 10], 8, ValueError, r"lengths\[2\] = 9 is outside \[1, max_len=8\]"),
        ([3, -2, 99], 8, ValueError, r"lengths\[1\] = -2 is outside \[1, max_len=8\]"),
        ([1], 0, OptionError, r"max_len must be >= 1, got 0"),
        ([1], -5, OptionError, r"max_len must be >= 1, got -5"),
        ([1], 4.0, OptionError, r"max_len must be an integer, got 4\.0"),
        ([1], True, OptionError, r"max_len must be an integer, got True"),
    ],
)
def test_validation_errors(lengths: object, max_len: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        first_fit_decreasing(lengths, max_len)  # type: ignore[arg-type]


def test_option_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        first_fit_decreasing([1], 0)


def test_unknown_backend() -> None:
    with pytest.raises(ValueError, match=r"backend must be 'numba', 'python' or None, got 'c'"):
        first_fit_decreasing([1, 2], 4, backend="c")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# Backend choice
# ---------------------------------------------------------------------------------------


def test_env_var_selects_python(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = packing._ffd_python

    def spy(lengths: np.ndarray, max_len: int) -> np.ndarray:
        calls.append(len(lengths))
        return real(lengths, max_len)

    monkeypatch.setattr(packing, "_ffd_python", spy)
    monkeypatch.setenv("PACKTOOL_NO_NUMBA", "1")
    assert packing._ffd_backend() == "python"
    assert first_fit_decreasing([2, 3, 4], 5).tolist() == [1, 1, 0]
    assert calls == [3]

    monkeypatch.delenv("PACKTOOL_NO_NUMBA")
    expected = "numba" if packing._numba_kernel() is not None else "python"
    assert packing._ffd_backend() == expected
    monkeypatch.setenv("PACKTOOL_NO_NUMBA", "0")
    assert packing._ffd_backend() == expected


def test_no_numba_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PACKTOOL_NO_NUMBA", raising=False)
    monkeypatch.setattr(packing, "_numba_kernel", lambda: None)
    assert packing._ffd_backend() == "python"
    assert first_fit_decreasing([2, 3, 4], 5).tolist() == [1, 1, 0]
    with pytest.raises(RuntimeError, match="numba cannot be imported"):
        first_fit_decreasing([2, 3, 4], 5, backend="numba")


def test_broken_numba_import_is_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise ImportError("no numba here")

    monkeypatch.setattr(packing, "_KERNEL", [])
    monkeypatch.setattr(packing, "_build_numba_kernel", broken)
    assert packing._numba_kernel() is None
    assert packing._ffd_backend() == "python"


# ---------------------------------------------------------------------------------------
# plan_rows
# ---------------------------------------------------------------------------------------


def plain_plan(rows: list[int], lengths: list[int]) -> tuple[list[int], list[int]]:
    n_rows = max(rows) + 1 if rows else 0
    order: list[int] = []
    starts = [0]
    for r in range(n_rows):
        order += [i for i in placement(lengths) if rows[i] == r]
        starts.append(len(order))
    return order, starts


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 12), st.integers(1, 40)), max_size=50),
)
def test_plan_rows_matches_plain_loop(pairs: list[tuple[int, int]]) -> None:
    # Any row assignment, not only FFD's: gaps in row numbers give empty ranges.
    rows = [r for r, _ in pairs]
    lengths = [n for _, n in pairs]
    order, starts = plan_rows(np.array(rows, dtype=np.int64), np.array(lengths, dtype=np.int64))
    assert order.dtype == np.int64
    assert starts.dtype == np.int64
    exp_order, exp_starts = plain_plan(rows, lengths)
    assert order.tolist() == exp_order
    assert starts.tolist() == exp_starts


@PROPS
@given(ffd_inputs())
def test_plan_rows_of_ffd(inp: tuple[list[int], int]) -> None:
    lengths, max_len = inp
    rows = first_fit_decreasing(lengths, max_len)
    order, starts = plan_rows(rows, np.asarray(lengths, dtype=np.int64))
    assert sorted(order.tolist()) == list(range(len(lengths)))  # each item exactly once
    assert (order.tolist(), starts.tolist()) == plain_plan(rows.tolist(), lengths)
    lens = np.asarray(lengths, dtype=np.int64)
    for r in range(len(starts) - 1):
        seg = order[starts[r] : starts[r + 1]]
        assert len(seg) > 0
        assert (rows[seg] == r).all()
        assert lens[seg].sum() <= max_len


def test_plan_rows_wide_values() -> None:
    # row numbers and lengths past 16 bits take the non-radix paths
    rows = np.array([70_000, 0, 70_000, 5, 0], dtype=np.int64)
    lengths = np.array([100_000, 3, 100_000, 1, 200_000], dtype=np.int64)
    order, starts = plan_rows(rows, lengths)
    exp_order, exp_starts = plain_plan(rows.tolist(), lengths.tolist())
    assert order.tolist() == exp_order
    assert starts.tolist() == exp_starts
    assert len(starts) == 70_002


def test_plan_rows_empty() -> None:
    order, starts = plan_rows(np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    assert order.tolist() == []
    assert starts.tolist() == [0]


@pytest.mark.parametrize(
    ("rows", "lengths", "match"),
    [
        ([0, 1], [1, 2, 3], r"same length, got 2 and 3"),
        ([[0]], [[1]], r"must be 1-D"),
        ([0, -1], [1, 2], r"row_of_item\[1\] = -1 is negative"),
        ([0.0, 1.0], [1, 2], r"row_of_item must hold integers, got dtype float64"),
        ([0, 1], [1.5, 2.0], r"lengths must hold integers, got dtype float64"),
    ],
)
def test_plan_rows_validation(rows: list, lengths: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        plan_rows(np.array(rows), np.array(lengths))


# ---------------------------------------------------------------------------------------
# Overflow, split, lower bound
# ---------------------------------------------------------------------------------------


def _items(lengths: list[int], max_len: int, policy: Overflow) -> list[list[int]]:
    """The item lengths of each document under ``policy``, from :func:`segment_items`."""
    arr = np.asarray(lengths, np.int64)
    doc, _chunk, item_len, _ = segment_items(arr, arr == 0, max_len, policy)
    out: list[list[int]] = [[] for _ in lengths]
    for d, n in zip(doc.tolist(), item_len.tolist(), strict=True):
        out[d].append(n)
    return out


def test_segment_items_examples() -> None:
    assert _items([25, 20, 7, 0, 3], 10, Overflow.SPLIT) == [[10, 10, 5], [10, 10], [7], [], [3]]
    assert _items([3], 1, Overflow.SPLIT) == [[1, 1, 1]]
    assert _items([25, 7, 10, 0], 10, Overflow.TRUNCATE) == [[10], [7], [10], []]
    assert _items([25, 7, 10, 0], 10, Overflow.DROP) == [[], [7], [10], []]


@given(st.lists(st.integers(0, 10_000), max_size=20), st.integers(1, 500))
def test_segment_items_split_property(lengths: list[int], max_len: int) -> None:
    arr = np.asarray(lengths, np.int64)
    doc, chunk, item_len, counts = segment_items(arr, arr == 0, max_len, Overflow.SPLIT)
    for d, length in enumerate(lengths):
        chunks = item_len[doc == d].tolist()
        assert sum(chunks) == length
        assert all(1 <= c <= max_len for c in chunks)
        assert all(c == max_len for c in chunks[:-1])
        assert len(chunks) == lower_bound_rows(length, max_len)
        assert chunk[doc == d].tolist() == list(range(len(chunks)))
    assert counts.documents.empty == lengths.count(0)
    assert counts.documents.split == sum(n > max_len for n in lengths)
    assert counts.documents.read == len(lengths) == counts.documents.accounted


@given(
    st.lists(st.integers(0, 300), max_size=16),
    st.integers(0, 16),
    st.integers(1, 64),
    st.sampled_from(list(Overflow)),
    st.booleans(),
)
def test_the_cut_counts_add_up(
    lengths: list[int], at: int, max_len: int, overflow: Overflow, labelled: bool
) -> None:
    """The counts the cut returns are additive: a batch cut in two parts counts what the
    whole counts; every token read is packed, truncated away or dropped; one name each."""
    from packtool.counts import Counts

    arr = np.asarray(lengths, np.int64)
    rng = np.random.default_rng(len(lengths) * 1000 + max_len)
    labels = np.where(rng.random(int(arr.sum())) < 0.5, 7, -100) if labelled else None

    def cut(lo: int, hi: int) -> Counts:
        part = arr[lo:hi]
        start = int(arr[:lo].sum())
        flat = None if labels is None else labels[start : start + int(part.sum())]
        return cut_items(part, part == 0, flat, max_len, overflow, ignore=-100)[3]

    at = min(at, len(lengths))
    whole = cut(0, len(lengths))
    assert cut(0, at) + cut(at, len(lengths)) == whole
    t = whole.tokens
    if not labelled:
        assert t.packed + t.truncated_away + t.dropped == int(arr.sum())
        assert whole.labels is None and t.learned is None
    else:
        assert whole.labels is not None and t.learned is not None
        assert t.packed + t.truncated_away + t.dropped <= int(arr.sum())
    assert whole.documents.accounted == whole.documents.read == len(lengths)
    assert Counts.from_record(whole.to_record()) == whole


def test_overflow_enum() -> None:
    assert [p.value for p in Overflow] == ["split", "truncate", "drop"]
    assert Overflow("truncate") is Overflow.TRUNCATE
    assert Overflow.DROP == "drop"
    assert isinstance(Overflow.SPLIT, str)


def test_lower_bound_rows() -> None:
    assert lower_bound_rows(25, 10) == 3
    assert lower_bound_rows(30, 10) == 3
    assert lower_bound_rows(0, 10) == 0
    assert lower_bound_rows(1, 10) == 1
    assert lower_bound_rows(10**18 + 1, 10**9) == 10**9 + 1  # exact, no float rounding
    with pytest.raises(ValueError, match=r"total_tokens must be >= 0, got -3"):
        lower_bound_rows(-3, 10)
    with pytest.raises(OptionError, match=r"max_len must be >= 1, got 0"):
        lower_bound_rows(10, 0)
