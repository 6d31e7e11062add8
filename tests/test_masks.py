"""The mask definition against a brute force over (i, j) pairs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.masks import batch_block_causal_mask, block_causal_mask, document_ids


@st.composite
def rows(draw: st.DrawFn) -> tuple[list[int], int]:
    lengths = draw(st.lists(st.integers(1, 9), min_size=1, max_size=8))
    cu = [0, *np.cumsum(lengths).tolist()]
    return cu, cu[-1]


def brute_force(cu: list[int], max_len: int) -> np.ndarray:
    mask = np.zeros((max_len, max_len), bool)
    for s in range(len(cu) - 1):
        for i in range(cu[s], cu[s + 1]):
            for j in range(cu[s], i + 1):
                mask[i, j] = True
    return mask


@settings(max_examples=200, deadline=None)
@given(rows())
def test_mask_matches_brute_force(row: tuple[list[int], int]) -> None:
    cu, max_len = row
    assert np.array_equal(block_causal_mask(cu, max_len), brute_force(cu, max_len))
    doc = document_ids(cu, max_len)
    assert doc.tolist() == [s for s in range(len(cu) - 1) for _ in range(cu[s + 1] - cu[s])]


def test_batch_and_examples() -> None:
    masks = batch_block_causal_mask([[0, 2, 3], [0, 3]], 3)
    assert masks.shape == (2, 3, 3)
    assert masks[0].astype(int).tolist() == [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    assert masks[1].astype(int).tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


@pytest.mark.parametrize("cu", [[0, 3], [1, 4], [0, 2, 2, 4], [0, 5], [0]])
def test_invalid_cu_seqlens(cu: list[int]) -> None:
    with pytest.raises(ValueError, match="cu_seqlens must"):
        block_causal_mask(cu, 4)
