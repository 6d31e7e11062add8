"""Benchmark of ``packtool.stats.dataset_stats`` on a synthetic packed dataset.

Writes a packed dataset of ``--rows`` rows (default 1,000,000) at a small ``--max-len``
(default 128) directly with ``ShardWriter`` + ``PackedBatch`` (no tokenization): document
lengths are lognormal (median 40 tokens, sigma 0.8, clipped to ``[1, max_len]``), packed with
first-fit-decreasing, rows shuffled. Then it times ``dataset_stats`` in a fresh Python process
(so the peak RSS is that of the stats alone) and in this one. Run from the repository root::

    python benchmarks/bench_stats.py                      # 1M rows, max_len 128
    python benchmarks/bench_stats.py --rows 200000 --keep /tmp/ds

The target: a million rows in a few seconds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

try:
    from packtool import packing, stats
    from packtool.format import ShardWriter
    from packtool.gather import gather_rows
except ImportError:  # run as a script from a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from packtool import packing, stats
    from packtool.format import ShardWriter
    from packtool.gather import gather_rows

MEDIAN_TOKENS = 40
SIGMA = 0.8


def write_synthetic(
    out: Path, rows: int, max_len: int = 128, seed: int = 0, rows_per_shard: int = 100_000
) -> dict[str, Any]:
    """Write a packed dataset of about ``rows`` rows (FFD decides the exact count)."""
    rng = np.random.default_rng(seed)
    mean = np.exp(np.log(MEDIAN_TOKENS) + SIGMA**2 / 2)
    drawn = rng.lognormal(np.log(MEDIAN_TOKENS), SIGMA, int(rows * max_len / mean * 1.2))
    lengths = np.clip(np.rint(drawn), 1, max_len).astype(np.int64)
    # as many documents as fill `rows` rows to 99.9%: FFD then lands within a few rows of it
    n_docs = int(np.searchsorted(np.cumsum(lengths), rows * max_len * 0.999))
    lengths = lengths[:n_docs]
    t0 = time.perf_counter()
    row_of = packing.first_fit_decreasing(lengths, max_len)
    order, row_starts = packing.plan_rows(row_of, lengths)
    n_rows = int(row_starts.size - 1)
    output_order = rng.permutation(n_rows)
    tokens = np.full(max_len, 5, np.int32)  # every item reads tokens[0:len]: content is moot
    item_off = np.zeros(n_docs, np.int64)
    item_doc = np.arange(n_docs, dtype=np.int64)
    item_chunk = np.zeros(n_docs, np.int32)
    with ShardWriter(
        out, max_len=max_len, num_rows=n_rows, rows_per_shard=rows_per_shard
    ) as writer:
        block = 50_000
        for start in range(0, n_rows, block):
            writer.write(
                gather_rows(
                    tokens,
                    packing.RowPlan(item_off, lengths, item_doc, item_chunk, order, row_starts),
                    output_order[start : start + block],
                    max_len,
                    1,
                )
            )
        total = int(lengths.sum())
        writer.commit(
            {
                "tokenizer": {"name": "synthetic"},
                "documents": {
                    "read": n_docs,
                    "packed": n_docs,
                    "split": 0,
                    "truncated": 0,
                    "dropped": 0,
                    "empty": 0,
                    "bad_records_skipped": 0,
                },
                "segments": n_docs,
                "tokens": {"packed": total, "truncated_away": 0, "dropped": 0},
                "rows": n_rows,
                "bad_records": [],
            }
        )
    return {
        "rows": n_rows,
        "documents": n_docs,
        "tokens": total,
        "write_s": time.perf_counter() - t0,
        "bytes": sum(p.stat().st_size for p in out.iterdir()),
    }


_CHILD = """
import json, sys, time
sys.path.insert(0, {repo!r})
def peak_mb():  # VmHWM: this process's peak RSS (ru_maxrss would count the parent's too)
    status = open("/proc/self/status").read()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024
t0 = time.perf_counter()
from packtool.stats import dataset_stats
t1 = time.perf_counter()
s = dataset_stats({path!r})
t2 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "stats_s": t2 - t1,
                  "max_rss_mb": peak_mb(),
                  "rows": s.packing.rows}}))
"""


def bench(path: Path, repeats: int = 3) -> dict[str, Any]:
    repo = str(Path(__file__).resolve().parents[1])
    child = subprocess.run(
        [sys.executable, "-c", _CHILD.format(repo=repo, path=str(path))],
        check=True,
        capture_output=True,
        text=True,
    )
    fresh = json.loads(child.stdout)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = stats.dataset_stats(path)
        times.append(time.perf_counter() - t0)
    p = result.packing
    return {
        **fresh,
        "in_process_s": statistics.median(times),
        "times_s": times,
        "segments": p.segments,
        "efficiency": p.efficiency,
        "speedup_random": p.comparison["random_batches"].speedup,
        "speedup_grouped": p.comparison["length_grouped"].speedup,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--keep", type=Path, help="write the dataset here and keep it")
    args = parser.parse_args(argv)
    tmp = None
    if args.keep:
        out = args.keep
    else:
        tmp = Path(tempfile.mkdtemp(prefix="bench-stats-", dir="."))
        out = tmp / "ds"
    try:
        if not (out / "manifest.json").exists():
            made = write_synthetic(out, args.rows, args.max_len)
            print(
                f"wrote {made['rows']:,} rows ({made['documents']:,} documents, "
                f"{made['tokens']:,} tokens, {made['bytes'] / 1e6:,.0f} MB) "
                f"in {made['write_s']:.1f} s"
            )
        r = bench(out)
        print(
            f"dataset_stats: {r['stats_s']:.2f} s in a fresh process (import {r['import_s']:.2f} s,"
            f" peak RSS {r['max_rss_mb']:,.0f} MB); median {r['in_process_s']:.2f} s warm "
            f"({', '.join(f'{t:.2f}' for t in r['times_s'])})"
        )
        print(
            f"  {r['rows']:,} rows, {r['segments']:,} segments, efficiency "
            f"{r['efficiency']:.4f}, speed-up vs random batches {r['speedup_random']:.2f}x, "
            f"vs length-grouped {r['speedup_grouped']:.3f}x"
        )
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
