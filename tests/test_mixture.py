"""The mixture plan: each source's tokens within half a document of its share, whole documents
sampled or repeated, seeded; and the one-line errors of --mix and --tokens."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from packtool.errors import OptionError
from packtool.mixture import parse_mix, parse_token_total, plan_mixture

sources = st.lists(
    st.lists(st.integers(0, 300), min_size=1, max_size=40).filter(lambda x: sum(x) > 0),
    min_size=1,
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(sources, st.data())
def test_each_source_holds_its_share_within_half_a_document(lengths, data) -> None:
    weights = data.draw(st.lists(st.floats(0.01, 10), min_size=len(lengths), max_size=len(lengths)))
    tokens = data.draw(st.none() | st.integers(1, 5 * sum(map(sum, lengths))))
    seed = data.draw(st.integers(0, 2**32))
    arrays = [np.array(x, np.int64) for x in lengths]
    try:
        plan = plan_mixture(arrays, weights, tokens, seed=seed)
    except OptionError as e:  # no document taken: every target within half a document of 0
        assert tokens is not None and "the mixture takes no document" in str(e)
        shares = np.asarray(weights) / sum(weights)
        assert all(2 * round(tokens * s) <= x.max() for x, s in zip(arrays, shares, strict=True))
        return
    total = tokens if tokens is not None else None
    for x, take in zip(arrays, plan, strict=True):
        assert take.tokens_read == int(x.sum()) and take.documents_read == x.size
        assert take.tokens_taken == int(x[take.indices].sum())
        assert abs(take.tokens_taken - take.target) <= x.max() / 2
        assert np.all(np.diff(take.indices) >= 0)  # reading order
        counts = np.bincount(take.indices, minlength=x.size)
        epochs = take.target // take.tokens_read
        assert set(np.unique(counts)) <= {epochs, epochs + 1}  # whole epochs, then a sample
        if total is None:
            assert counts.max(initial=0) <= 1  # the default total repeats no document
    if total is not None:
        shares = np.asarray(weights) / sum(weights)
        assert [t.target for t in plan] == [round(total * s) for s in shares]
    again = plan_mixture(arrays, weights, tokens, seed=seed)
    assert all(np.array_equal(a.indices, b.indices) for a, b in zip(plan, again, strict=True))


def test_the_default_total_takes_the_smallest_share_whole() -> None:
    big, small = np.full(100, 10), np.full(10, 10)
    plan = plan_mixture([big, small], [0.5, 0.5], seed=3)
    assert plan[1].epochs == 1.0 and plan[1].documents_taken == 10
    assert plan[0].tokens_taken == 100 and plan[0].documents_taken == 10
    other = plan_mixture([big, small], [0.5, 0.5], seed=4)
    assert not np.array_equal(plan[0].indices, other[0].indices)  # the seed picks the sample


def test_a_total_that_takes_no_document_is_refused() -> None:
    """--tokens nearer to no document than to any of each source: an output of no rows,
    which pack makes an error of anywhere else (``no documents to pack``)."""
    with pytest.raises(OptionError, match=r"--tokens 10: the mixture takes no document .* 25"):
        plan_mixture([np.full(4, 25), np.full(50, 30)], [0.5, 0.5], tokens=10)
    plan = plan_mixture([np.full(4, 25), np.full(50, 30)], [0.5, 0.5], tokens=30)
    assert [t.documents_taken for t in plan] == [1, 0]  # one source is enough


def test_a_total_far_beyond_the_sources_is_refused_before_any_allocation() -> None:
    """A --tokens that would repeat a source billions of times (1T of a 100-token source,
    1e30) was a MemoryError or an OverflowError from NumPy: one line naming the source."""
    for tokens in (10**12, 10**30):
        with pytest.raises(
            OptionError,
            match=r"source 0 would be repeated [\d,]+ times .* "
            r"more than the 2,147,483,647 a mixture takes: lower --tokens",
        ):
            plan_mixture([np.full(4, 25), np.full(50, 10)], [0.5, 0.5], tokens=tokens)


def test_a_small_source_is_repeated_by_whole_epochs() -> None:
    plan = plan_mixture([np.full(4, 25), np.full(50, 10)], [0.5, 0.5], tokens=1000)
    assert plan[0].epochs == 5.0 and np.array_equal(np.bincount(plan[0].indices), [5] * 4)
    with pytest.raises(OptionError, match="source 0: its share of --tokens 1,000 is 500 tokens"):
        plan_mixture([np.full(4, 25), np.full(50, 10)], [0.5, 0.5], tokens=1000, repeat=False)


@pytest.mark.parametrize(
    ("text", "n", "message"),
    [
        ("0.5,x", 2, "--mix: 'x' is not a number"),
        ("0.5,0", 2, "--mix: every weight must be a positive number, got '0'"),
        ("0.5,-1", 2, "positive number, got '-1'"),
        ("0.5,nan", 2, "positive number, got 'nan'"),
        ("0.5,0.3", 3, "--mix gives 2 weights for 3 inputs"),
    ],
)
def test_bad_weights_are_one_line(text: str, n: int, message: str) -> None:
    with pytest.raises(OptionError, match=message.replace("(", r"\(")):
        parse_mix(text, n)


def test_token_totals_read_decimal_suffixes() -> None:
    assert parse_token_total("2G") == parse_token_total("2b") == 2_000_000_000
    assert parse_token_total("500M") == 500_000_000 and parse_token_total("1.5k") == 1500
    assert parse_token_total("12_345") == 12345
    for bad in ("x", "0", "1.5", "-3M"):
        with pytest.raises(OptionError, match="--tokens"):
            parse_token_total(bad)


def test_the_module_example_runs() -> None:
    import doctest

    import packtool.mixture

    failures, tried = doctest.testmod(packtool.mixture)
    assert tried and not failures


def test_the_library_takes_one_weight_as_a_number_and_refuses_other_types() -> None:
    """``PackOptions(mix=1)`` (one input's weight as a number) was an AttributeError from
    ``str.split``; other types than a string or a list of numbers are one line."""
    from packtool.options import PackOptions

    assert PackOptions(mix=2).mix == "2" and PackOptions(mix=[1, 0.5]).mix == "1,0.5"
    for wrong in (b"1", {"a": 1}):
        with pytest.raises(OptionError, match=r"mix must be the weights, one per input"):
            PackOptions(mix=wrong)
