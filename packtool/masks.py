"""From ``cu_seqlens`` to attention masks: the one definition, in NumPy.

``packtool inspect`` draws these masks and ``packtool.torch`` builds its tensors from them, so
what a person sees is what the model gets.

A row of ``max_len`` 8 with documents of 3 and 2 tokens, then 3 padding tokens, has
``cu_seqlens = [0, 3, 5, 8]`` and::

    document_ids         0 0 0 1 1 2 2 2

    block_causal_mask    j: 0 1 2 3 4 5 6 7
                    i=0     1 . . . . . . .
                    i=1     1 1 . . . . . .
                    i=2     1 1 1 . . . . .
                    i=3     . . . 1 . . . .
                    i=4     . . . 1 1 . . .
                    i=5     . . . . . 1 . .     <- the padding segment sees only itself,
                    i=6     . . . . . 1 1 .        so no real token attends to padding and
                    i=7     . . . . . 1 1 1        no softmax row is empty

A token ``i`` may attend to token ``j`` when both are in the same segment and ``j <= i``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["batch_block_causal_mask", "block_causal_mask", "document_ids"]


def _check_cu(cu_seqlens: ArrayLike, max_len: int) -> np.ndarray:
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    if cu.ndim != 1 or cu.size < 2:
        raise ValueError(f"cu_seqlens must be 1-D with at least 2 entries, got {cu.tolist()}")
    if cu[0] != 0 or cu[-1] != max_len or np.any(np.diff(cu) <= 0):
        raise ValueError(
            f"cu_seqlens must start at 0, rise strictly and end at max_len={max_len}, "
            f"got {cu.tolist()}"
        )
    return cu


def document_ids(cu_seqlens: ArrayLike, max_len: int) -> np.ndarray:
    """The segment number of every position (int32, length ``max_len``).

    >>> document_ids([0, 3, 5, 8], 8).tolist()
    [0, 0, 0, 1, 1, 2, 2, 2]
    """
    cu = _check_cu(cu_seqlens, max_len)
    return np.repeat(np.arange(cu.size - 1, dtype=np.int32), np.diff(cu))


def block_causal_mask(cu_seqlens: ArrayLike, max_len: int) -> np.ndarray:
    """``[max_len, max_len]`` boolean mask: ``mask[i, j]`` is true when ``i`` may attend to ``j``.

    >>> block_causal_mask([0, 2, 3], 3).astype(int).tolist()
    [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    cu = _check_cu(cu_seqlens, max_len)
    mask = np.zeros((max_len, max_len), dtype=bool)
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        mask[start:end, start:end] = np.tri(end - start, dtype=bool)
    return mask


def batch_block_causal_mask(cu_seqlens: Sequence[ArrayLike], max_len: int) -> np.ndarray:
    """``[batch, max_len, max_len]``: :func:`block_causal_mask` for each row of a batch."""
    return np.stack([block_causal_mask(cu, max_len) for cu in cu_seqlens])
