"""The order rows are read in, epoch by epoch, and each data-parallel rank's share of it.

:meth:`packtool.torch.PackedDataset.set_epoch` calls these two functions and nothing else, so
another ordering (for example one that balances the work of every step across the ranks)
replaces :func:`epoch_order` alone. Ten rows, two ranks::

    epoch_order(10, seed=0, epoch=1)   [9 1 3 8 7 6 0 4 2 5]    the same on every rank
    position                            0 1 2 3 4 5 6 7 8 9
    rank_share(order, 0, 2)            [9   3   7   0   2  ]    positions 0, 2, 4, ...
    rank_share(order, 1, 2)            [  1   8   6   4   5]    positions 1, 3, 5, ...
    epoch_order(10, seed=0, epoch=2)   [8 2 1 0 5 6 7 4 3 9]    the next epoch

With ``world_size`` not dividing the rows, the last ``num_rows % world_size`` positions of the
epoch are left out; they hold other rows every epoch.

Torch-free: ``import packtool`` imports this module.
"""

from __future__ import annotations

import numpy as np

from .errors import OptionError

__all__ = ["epoch_order", "rank_share"]


def _check_count(name: str, value: object) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise OptionError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


def epoch_order(num_rows: int, *, seed: int, epoch: int) -> np.ndarray:
    """The global order of the rows ``0 .. num_rows - 1`` in epoch ``epoch`` (int64).

    A permutation drawn from ``(seed, epoch)`` alone, through NumPy's ``SeedSequence`` and
    ``PCG64``: every rank, every restart and every DataLoader worker computes the same one
    without talking to the others, and each epoch gets a new one. Position ``i`` of the order
    is read at global step ``i // (world_size * batch_size)`` (see :func:`rank_share`).
    """
    num_rows = _check_count("num_rows", num_rows)
    seed = _check_count("seed", seed)
    epoch = _check_count("epoch", epoch)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))
    return rng.permutation(num_rows).astype(np.int64)


def rank_share(order: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s rows of an epoch ``order``: positions ``rank, rank + world_size, ...``.

    Every rank gets ``len(order) // world_size`` rows (the same number of steps, which
    collectives need); no row goes to two ranks; the last ``len(order) % world_size``
    positions are left out. Consecutive ``world_size`` positions are read at the same step,
    one by each rank.
    """
    per_rank = len(order) // world_size
    return order[: per_rank * world_size][rank::world_size]
