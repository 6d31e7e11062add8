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

from collections.abc import Callable

import numpy as np

from .errors import OptionError
from .layout import Layout

__all__ = [
    "COST_MODEL",
    "attention_costs",
    "balance_record",
    "balanced_epoch_order",
    "balanced_layout",
    "balanced_order",
    "balanced_share",
    "check_world_size",
    "epoch_order",
    "rank_share",
    "row_shuffle",
    "row_sums",
    "shard_order",
    "step_imbalance",
    "step_loads",
    "stored_order",
    "unit_row_seed",
]


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


def row_shuffle(num_rows: int, seed: int) -> np.ndarray:
    """The seeded order ``pack`` stores its FFD rows in (``--shuffle``, the default).

    Stored row ``j`` is FFD row ``row_shuffle(n, seed)[j]``. ``pack`` and the work units write
    in this order, and the merge recomputes it to find each unit's FFD rows again.
    """
    return np.random.default_rng(seed).permutation(num_rows).astype(np.int64)


def unit_row_seed(seed: int, index: int) -> int:
    """The seed of unit ``index``'s own row shuffle: ``seed + index`` (wrapping at 2**63).

    Unit 0 uses ``seed`` itself, so with ``--units 1`` the unit's rows are those of a plain
    ``pack``; the other units draw other permutations.
    """
    return (_check_count("seed", seed) + _check_count("index", index)) % (1 << 63)


def shard_order(num_shards: int, seed: int) -> np.ndarray:
    """The seeded order in which a merge without copying lists the units' shards (int64).

    Drawn from ``SeedSequence([seed, num_shards, 0x5A4D])``, a stream of its own: no unit's row
    shuffle draws from it.
    """
    num_shards = _check_count("num_shards", num_shards)
    seed = _check_count("seed", seed)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, num_shards, 0x5A4D])))
    return rng.permutation(num_shards).astype(np.int64)


def rank_share(order: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s rows of an epoch ``order``: positions ``rank, rank + world_size, ...``.

    Every rank gets ``len(order) // world_size`` rows (the same number of steps, which
    collectives need); no row goes to two ranks; the last ``len(order) % world_size``
    positions are left out. Consecutive ``world_size`` positions are read at the same step,
    one by each rank.
    """
    per_rank = len(order) // world_size
    return order[: per_rank * world_size][rank::world_size]


# -- balanced steps ------------------------------------------------------------------------
#
# With ``pack --world-size W --micro-batches G`` the rows are stored *step-major*: step ``s``
# is the ``W * G`` positions ``[s*W*G, (s+1)*W*G)``, rank ``r``'s rows of it are
# ``s*W*G + r*G + g`` for ``g < G``. W = 2, G = 2, 9 rows (costs in brackets)::
#
#     position  0    1    2    3   | 4    5    6    7   | 8
#     row       r5   r0   r2   r7  | r3   r6   r1   r4  | r8
#     step 0    rank 0: [9]+[1]=10  rank 1: [6]+[4]=10  | step 1 ... | left out (< W)
#
# Rows of ``num_rows % (W*G)`` beyond the full steps form one last, shorter step of
# ``q = rem // W`` rows per rank; the last ``rem % W`` rows (fewer than W) are not read.

COST_MODEL = "sum of squared document segment lengths (padding excluded)"
"""The attention cost of a row, as the manifest's ``balance.cost`` names it."""


def attention_costs(segment_lengths: np.ndarray, segments_per_row: np.ndarray) -> np.ndarray:
    """The attention cost of every row (int64): the sum of its squared segment lengths.

    ``segment_lengths`` are the document segments of all rows, row after row (no padding);
    ``segments_per_row`` how many belong to each row::

        attention_costs([5, 9, 7, 20], [3, 1])  ->  [155, 400]     25+81+49, 400
    """
    return row_sums(np.asarray(segment_lengths, dtype=np.int64) ** 2, segments_per_row)


def row_sums(segment_values: np.ndarray, segments_per_row: np.ndarray) -> np.ndarray:
    """Per row, the sum (int64) of its segments' values (rows may have no segment)::

    row_sums([5, 9, 7, 20], [3, 1])  ->  [21, 20]
    """
    ends = np.cumsum(np.asarray(segments_per_row, dtype=np.int64))
    cs = np.concatenate([[0], np.cumsum(np.asarray(segment_values, dtype=np.int64))])
    return cs[ends] - cs[np.concatenate([[0], ends[:-1]])]


def balanced_layout(num_rows: int, world_size: int, micro_batches: int = 1) -> tuple[int, int, int]:
    """``(full steps, rows per rank in the last short step, rows left out)`` of the layout.

    ``balanced_layout(9, 2, 2)  ->  (2, 0, 1)``; ``balanced_layout(11, 2, 2) -> (2, 1, 1)``.
    """
    num_rows = _check_count("num_rows", num_rows)
    world_size, micro_batches = _check_positive(world_size, micro_batches)
    block = world_size * micro_batches
    steps, rem = divmod(num_rows, block)
    return steps, rem // world_size, rem % world_size


def _check_positive(world_size: object, micro_batches: object) -> tuple[int, int]:
    for name, value in (("world_size", world_size), ("micro_batches", micro_batches)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise OptionError(f"{name} must be an integer >= 1, got {value!r}")
    return int(world_size), int(micro_batches)  # type: ignore[call-overload]


def _deal(rows: np.ndarray, costs: np.ndarray, world_size: int) -> np.ndarray:
    """Deal ``rows`` (shape ``(steps, world_size * k)``, each step's rows by cost descending)
    to the ranks, ``k`` rounds of one row each: in every round the costliest row left goes to
    the rank with the least cost so far (greedy LPT, one row per rank per round). Returns
    shape ``(steps, world_size, k)``: rank ``r``'s rows of each step."""
    steps, width = rows.shape
    k = width // world_size
    out = np.empty((steps, world_size, k), dtype=np.int64)
    load = np.zeros((steps, world_size), dtype=np.float64)
    by_step = np.arange(steps)[:, None]
    for g in range(k):
        round_rows = rows[:, g * world_size : (g + 1) * world_size]  # costliest first
        lightest = np.argsort(load, axis=1, kind="stable")  # lightest rank first
        out[by_step, lightest, g] = round_rows
        load[by_step, lightest] += costs[round_rows]
    return _refine(out, costs) if k > 1 and steps else out


_REFINE_ROUNDS = 64


def _refine(shares: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """Improve each step's deal by swaps: the costliest rank's row ``a`` and the cheapest
    rank's row ``b`` trade places when ``0 < c[a] - c[b] < gap`` (the two ranks' difference),
    choosing the pair that brings both nearest to their mean; the costliest rank gets cheaper
    and the cheapest stays below it. Repeated (all steps at once) until no step improves."""
    shares = shares.copy()
    steps, _, k = shares.shape
    at = np.arange(steps)
    c = costs.astype(np.float64)
    for _ in range(_REFINE_ROUNDS):
        load = c[shares].sum(axis=2)
        heavy, light = load.argmax(axis=1), load.argmin(axis=1)
        gap = load[at, heavy] - load[at, light]
        rows_h, rows_l = shares[at, heavy], shares[at, light]  # (steps, k)
        d = c[rows_h][:, :, None] - c[rows_l][:, None, :]  # (steps, k, k)
        useful = (d > 0) & (d < gap[:, None, None])
        score = np.where(useful, np.abs(gap[:, None, None] - 2 * d), np.inf).reshape(steps, -1)
        best = score.argmin(axis=1)
        move = np.isfinite(score[at, best])
        if not move.any():
            break
        i, j = np.divmod(best[move], k)
        s, h, low = at[move], heavy[move], light[move]
        a, b = shares[s, h, i], shares[s, low, j]
        shares[s, h, i], shares[s, low, j] = b, a
    return shares


def _mix(shares: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``shares`` (``(steps, W, G)``) with, in every step, the shares dealt to the ranks in a
    random order (each share kept whole) and each share's rows in a random order."""
    steps, w, _ = shares.shape
    to_rank = rng.permuted(np.tile(np.arange(w), (steps, 1)), axis=1)
    return rng.permuted(shares[np.arange(steps)[:, None], to_rank], axis=2)


def check_world_size(num_rows: int, world_size: int, where: str) -> None:
    """Refuse to balance fewer rows than ranks: every rank could not read a row, and
    ``PackedDataset`` would refuse the output on every rank."""
    if num_rows < world_size:
        raise OptionError(
            f"--world-size {world_size:,}: {where} has only {num_rows:,} rows, fewer than the "
            "ranks (each needs at least one row): give a smaller --world-size, or more data"
        )


def balanced_order(
    costs: np.ndarray,
    tokens: np.ndarray,
    *,
    world_size: int,
    micro_batches: int = 1,
    seed: int = 0,
) -> np.ndarray:
    """The stored order of the rows (int64: position ``p`` holds row ``order[p]``) in which
    every step has nearly the same cost on every rank, in the step-major layout above.

    Rows are sorted by cost (then tokens, then row number); each run of ``W * G`` consecutive
    rows is one step, so a step's rows cost nearly the same; inside a step they are dealt to
    the ranks by greedy LPT (:func:`_deal`), so each rank's ``G`` rows sum to nearly the same
    cost. Then, from ``seed``: the steps are shuffled (no curriculum: a step's place says
    nothing about its cost), and inside each step which rank gets which share and the order of
    a rank's ``G`` rows. The cheapest ``num_rows % (W*G)`` rows form the last, shorter step and
    the rows left out. A pure function of its arguments.
    """
    costs = np.asarray(costs, dtype=np.int64)
    tokens = np.asarray(tokens, dtype=np.int64)
    n = int(costs.size)
    if tokens.shape != costs.shape:
        raise OptionError(f"costs and tokens differ in length: {costs.size} and {tokens.size}")
    world_size, micro_batches = _check_positive(world_size, micro_batches)
    seed = _check_count("seed", seed)
    steps, short, _ = balanced_layout(n, world_size, micro_batches)
    block = world_size * micro_batches
    by_cost = np.lexsort((np.arange(n), -tokens, -costs)).astype(np.int64)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 0xBA1A])))
    full = _deal(by_cost[: steps * block].reshape(steps, block), costs, world_size)
    full = _mix(full[rng.permutation(steps)], rng)
    tail = by_cost[steps * block :]
    last = _mix(_deal(tail[: short * world_size].reshape(1, -1), costs, world_size), rng)
    rest = rng.permutation(tail[short * world_size :])
    return np.concatenate([full.reshape(-1), last.reshape(-1), rest]).astype(np.int64)


def stored_order(
    num_rows: int,
    costs_and_tokens: Callable[[], tuple[np.ndarray, np.ndarray]],
    layout: Layout,
    *,
    where: str,
) -> tuple[np.ndarray, dict[str, object] | None]:
    """The order rows are stored in, and the manifest's ``balance`` record (with a world
    size), for ``pack`` and a copying merge alike, from their :class:`~packtool.layout.Layout`:
    balanced over ``world_size`` ranks (the rows' attention costs and tokens, asked for only
    then), else the seeded shuffle, else as they are. ``where`` names the rows in the error of
    too small a world."""
    if layout.world_size is not None:
        check_world_size(num_rows, layout.world_size, where)
        costs, tokens = costs_and_tokens()
        kw = {
            "world_size": layout.world_size,
            "micro_batches": layout.micro_batches,
            "seed": layout.seed,
        }
        order = balanced_order(costs, tokens, **kw)
        return order, balance_record(costs[order], tokens[order], **kw)
    if layout.shuffle:
        return row_shuffle(num_rows, layout.seed), None
    return np.arange(num_rows, dtype=np.int64), None


def balanced_epoch_order(
    num_rows: int, *, world_size: int, micro_batches: int = 1, seed: int, epoch: int
) -> np.ndarray:
    """The positions of a balanced layout read in epoch ``epoch`` (int64, a permutation).

    Whole steps are permuted, and in each step the ranks' shares (``G`` rows each, kept
    together) are permuted among the ranks, from ``(seed, epoch)`` alone: every rank computes
    the same order, every step keeps exactly the rows (and so the balance) it was stored with,
    and a rank reads other rows each epoch. The last short step stays last (its shares
    permuted); the rows left out stay out. Read a rank's rows with :func:`balanced_share`.
    """
    seed = _check_count("seed", seed)
    epoch = _check_count("epoch", epoch)
    steps, short, left_out = balanced_layout(num_rows, world_size, micro_batches)
    w, g = int(world_size), int(micro_batches)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, 0xBA1A])))
    step = rng.permutation(steps)[:, None, None]
    shares = rng.permuted(np.tile(np.arange(w), (steps, 1)), axis=1)[:, :, None]
    full = step * (w * g) + shares * g + np.arange(g)
    last = steps * w * g + rng.permutation(w)[:, None] * short + np.arange(short)
    rest = np.arange(num_rows - left_out, num_rows)
    return np.concatenate([full.reshape(-1), last.reshape(-1), rest]).astype(np.int64)


def balanced_share(
    order: np.ndarray, rank: int, world_size: int, micro_batches: int = 1
) -> np.ndarray:
    """Rank ``rank``'s rows of ``order`` read in the step-major layout: its ``G`` positions of
    every full step (``s*W*G + rank*G + g``), then its ``q`` of the last short step. Every rank
    gets the same number; consecutive ``G`` of them are one step."""
    world_size, micro_batches = _check_positive(world_size, micro_batches)
    steps, short, _ = balanced_layout(len(order), world_size, micro_batches)
    block = world_size * micro_batches
    full = np.arange(steps)[:, None] * block + rank * micro_batches + np.arange(micro_batches)
    last = steps * block + rank * short + np.arange(short)
    return np.asarray(order)[np.concatenate([full.reshape(-1), last])]


def step_loads(values: np.ndarray, rank_rows: np.ndarray, micro_batches: int = 1) -> np.ndarray:
    """Per step and rank, the sum of ``values`` over the rank's rows of that step.

    ``rank_rows`` is ``(world_size, rows per rank)``: each rank's rows in the order it reads
    them; consecutive ``micro_batches`` rows are one step (a last shorter run is one more step).
    Returns ``(steps, world_size)`` float64.
    """
    v = np.asarray(values, dtype=np.float64)[np.asarray(rank_rows, dtype=np.int64)]
    w, m = v.shape
    full, rest = divmod(m, micro_batches)
    loads = v[:, : full * micro_batches].reshape(w, full, micro_batches).sum(axis=2)
    if rest:
        loads = np.concatenate([loads, v[:, full * micro_batches :].sum(axis=1, keepdims=True)], 1)
    return loads.T


def step_imbalance(loads: np.ndarray) -> np.ndarray:
    """Per step, the slowest rank's load over the mean rank's (1.0: even; empty steps: 1.0)."""
    loads = np.asarray(loads, dtype=np.float64)
    mean = loads.mean(axis=1)
    peak = loads.max(axis=1)
    return np.divide(peak, mean, out=np.ones_like(mean), where=mean > 0)


def balance_record(
    costs: np.ndarray, tokens: np.ndarray, *, world_size: int, micro_batches: int, seed: int
) -> dict[str, object]:
    """The manifest's ``balance`` record of rows stored in a balanced layout.

    ``costs`` and ``tokens`` are per row in *stored* order. The imbalances are means over the
    steps of the slowest rank's sum over the mean rank's (:func:`step_imbalance`);
    ``random_imbalance`` is that of the same rows in a random order (seed ``seed``), split
    as without balancing (:func:`rank_share`).
    """
    n = int(np.asarray(costs).size)
    steps, short, left_out = balanced_layout(n, world_size, micro_batches)
    rows = np.stack(
        [balanced_share(np.arange(n), r, world_size, micro_batches) for r in range(world_size)]
    )
    shuffled = np.random.default_rng(seed).permutation(n)
    plain = np.stack([rank_share(shuffled, r, world_size) for r in range(world_size)])

    def mean(x: np.ndarray) -> float:
        return round(float(x.mean()), 6) if x.size else 1.0

    return {
        "world_size": int(world_size),
        "micro_batches": int(micro_batches),
        "layout": "step-major",
        "cost": COST_MODEL,
        "steps": steps + (1 if short else 0),
        "rows_per_rank": steps * micro_batches + short,
        "rows_left_out": left_out,
        "imbalance": mean(step_imbalance(step_loads(costs, rows, micro_batches))),
        "token_imbalance": mean(step_imbalance(step_loads(tokens, rows, micro_batches))),
        "random_imbalance": mean(step_imbalance(step_loads(costs, plain, micro_batches))),
    }
