"""Benchmark of first-fit decreasing on synthetic document lengths.

Lengths are lognormal with median 300 tokens (sigma 1.0, so mean ~495), rounded and clipped
to ``[1, max_len]``: roughly the shape of web-text documents. Run from the repository root::

    python benchmarks/bench_ffd.py                   # 1M and 10M items, numba backend
    python benchmarks/bench_ffd.py --python 1000000  # also the numpy fallback at 1M

The target is 10M items at ``max_len`` 4096 in at most 3 s (sort included) on 2 cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

try:
    from packtool import packing
except ImportError:  # run as a script from a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from packtool import packing

MEDIAN_TOKENS = 300
SIGMA = 1.0


def synthetic_lengths(n: int, max_len: int = 4096, seed: int = 0) -> np.ndarray:
    """``n`` lognormal lengths (median 300) clipped to ``[1, max_len]``, int64."""
    rng = np.random.default_rng(seed)
    x = np.rint(rng.lognormal(np.log(MEDIAN_TOKENS), SIGMA, n))
    return np.clip(x, 1, max_len).astype(np.int64)


def _timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t0, out


def bench_ffd(
    n: int, max_len: int = 4096, seed: int = 0, *, backend: packing.Backend | None = None
) -> dict[str, Any]:
    """Time ``first_fit_decreasing`` on ``n`` synthetic lengths.

    Returns a dict::

        backend          "numba" or "python"
        n, max_len, tokens
        cold_s           first call, with the numba kernel dropped from memory first, so it
                         includes loading it from numba's on-disk cache or compiling it
        cold_kind        "cache load" or "compile" (numba), "-" (python)
        time_s           median of 3 calls after the cold one
        times_s          those 3 times
        plan_rows_s      one plan_rows call on the result
        rows             rows FFD opened
        lower_bound      ceil(tokens / max_len)
        rows_over_bound  rows - lower_bound
        efficiency       tokens / (rows * max_len)
    """
    backend = backend or packing._ffd_backend()
    lengths = synthetic_lengths(n, max_len, seed)

    cold_kind = "-"
    if backend == "numba":
        packing._KERNEL.clear()  # force a fresh load: cache load or compile
    cold_s, rows = _timed(packing.first_fit_decreasing, lengths, max_len, backend=backend)
    if backend == "numba":
        kernel = packing._numba_kernel()
        stats = kernel.stats  # type: ignore[union-attr]
        cold_kind = "cache load" if sum(stats.cache_hits.values()) else "compile"

    times = []
    for _ in range(3):
        t, again = _timed(packing.first_fit_decreasing, lengths, max_len, backend=backend)
        times.append(t)
        if not np.array_equal(again, rows):
            raise AssertionError("first_fit_decreasing is not deterministic")
    plan_s, _ = _timed(packing.plan_rows, rows, lengths)

    tokens = int(lengths.sum())
    n_rows = int(rows.max()) + 1 if n else 0
    bound = packing.lower_bound_rows(tokens, max_len)
    return {
        "backend": backend,
        "n": n,
        "max_len": max_len,
        "tokens": tokens,
        "cold_s": cold_s,
        "cold_kind": cold_kind,
        "time_s": statistics.median(times),
        "times_s": times,
        "plan_rows_s": plan_s,
        "rows": n_rows,
        "lower_bound": bound,
        "rows_over_bound": n_rows - bound,
        "efficiency": tokens / (n_rows * max_len) if n_rows else 1.0,
    }


def _print_table(results: list[dict[str, Any]]) -> None:
    head = (
        f"{'backend':>7} {'items':>11} {'cold s':>7} {'(kind)':>11} {'median s':>9} "
        f"{'plan s':>7} {'rows':>10} {'bound':>10} {'over':>6} {'efficiency':>10}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        print(
            f"{r['backend']:>7} {r['n']:>11,} {r['cold_s']:>7.3f} {r['cold_kind']:>11} "
            f"{r['time_s']:>9.3f} {r['plan_rows_s']:>7.3f} {r['rows']:>10,} "
            f"{r['lower_bound']:>10,} {r['rows_over_bound']:>6,} {r['efficiency']:>10.5f}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[1_000_000, 10_000_000])
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--python",
        type=int,
        nargs="*",
        default=[],
        metavar="N",
        help="also time the numpy fallback at these sizes",
    )
    args = parser.parse_args(argv)
    results = [bench_ffd(n, args.max_len, args.seed) for n in args.sizes]
    results += [bench_ffd(n, args.max_len, args.seed, backend="python") for n in args.python]
    _print_table(results)


if __name__ == "__main__":
    main()
