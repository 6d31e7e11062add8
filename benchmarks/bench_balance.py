"""Balanced steps (``pack --world-size W``) against a random row order: one command, one table.

    python benchmarks/bench_balance.py             # synthetic mixes + the code corpus
    python benchmarks/bench_balance.py --quick     # fewer rows, a smaller code corpus

A step's imbalance is its slowest rank's attention cost over the mean rank's (the cost of a
row: the sum of its squared document lengths, padding excluded); the figures are means over
the steps, as ``packtool stats OUT --world-size W`` reports them.

1. **Synthetic length mixes**, packed with packtool's FFD at 4k, 16k and 64k, W = 8 and 64,
   one row per rank and step, about ``--rows`` rows each (no tokenizer: lengths only, through
   the same pure functions ``pack`` calls):

   - *SFT-like*: 90% chats, lognormal with median 350 tokens (sigma 0.9), and 10% long
     conversations and documents, lognormal with median 3,000 (sigma 0.8); examples longer
     than max_len are dropped, as ``pack`` drops instruction data by default.
   - *pretraining-like*: web documents, lognormal with median 600 (sigma 1.2), and 5% long
     ones (books, code files) with a Pareto tail (alpha 1.1, from 2,000 tokens); documents
     longer than max_len are split, as ``pack`` does with text.

2. **Scale**: the time of ``balanced_order`` on a million rows.

3. **A code corpus**: the Python files of this environment's site-packages (read from disk,
   sorted by path, one document per file, up to ``--code-mb`` MB), packed by ``packtool
   pack`` at max_len 8,192 with ``--world-size 8`` and the bundled tokenizer, then read
   through ``packtool.torch.PackedDataset(rank=r, world_size=8)`` as stored and after
   ``set_epoch(1)`` (and with G = 4 rows per rank and step, ``--micro-batches 4``). Checked:
   no row read twice; shown: rows read (fewer than W are left out), and the Spearman rank
   correlation of step index and step cost (no curriculum: near 0).
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packtool.order import (  # noqa: E402
    attention_costs,
    balanced_order,
    balanced_share,
    rank_share,
    row_sums,
    step_imbalance,
    step_loads,
)
from packtool.packing import first_fit_decreasing, plan_rows  # noqa: E402

MAX_LENS = (4096, 16384, 65536)
WORLD_SIZES = (8, 64)


def sft_lengths(rng: np.random.Generator, n: int, max_len: int) -> np.ndarray:
    long = rng.random(n) < 0.10
    x = np.where(long, rng.lognormal(np.log(3000), 0.8, n), rng.lognormal(np.log(350), 0.9, n))
    x = np.maximum(np.rint(x), 8).astype(np.int64)
    return x[x <= max_len]  # instruction data: too long is dropped


def pretrain_lengths(rng: np.random.Generator, n: int, max_len: int) -> np.ndarray:
    long = rng.random(n) < 0.05
    tail = 2000 * (1 + rng.pareto(1.1, n))
    x = np.where(long, tail, rng.lognormal(np.log(600), 1.2, n))
    x = np.minimum(np.maximum(np.rint(x), 8), 50 * max_len).astype(np.int64)
    full, rest = np.divmod(x, max_len)  # split into chunks of max_len, as pack does
    chunks = np.concatenate([np.repeat(max_len, int(full.sum())), rest[rest > 0]])
    return rng.permutation(chunks)


def rows_of(lengths: np.ndarray, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    order, starts = plan_rows(first_fit_decreasing(lengths, max_len), lengths)
    per_row = np.diff(starts)
    return attention_costs(lengths[order], per_row), row_sums(lengths[order], per_row)


def spearman(values: np.ndarray) -> float:
    """Rank correlation of step index and step cost (0: no curriculum; robust to the tail)."""
    distinct, inverse = np.unique(values, return_inverse=True)
    first = np.searchsorted(np.sort(values), distinct)  # ties get their mean rank
    count = np.bincount(inverse, minlength=distinct.size)
    ranks = (first + (count - 1) / 2)[inverse]
    return float(np.corrcoef(np.arange(values.size), ranks)[0, 1])


def imbalance(costs: np.ndarray, ranks: np.ndarray, g: int = 1) -> float:
    return float(step_imbalance(step_loads(costs, ranks, g)).mean())


def synthetic(target_rows: int, seed: int) -> list[dict]:
    out = []
    for mix, draw in (("SFT-like", sft_lengths), ("pretraining-like", pretrain_lengths)):
        for max_len in MAX_LENS:
            rng = np.random.default_rng(seed)
            mean = float(draw(rng, 20_000, max_len).mean())
            lengths = draw(rng, int(target_rows * max_len / mean * 1.1), max_len)
            lengths = lengths[np.cumsum(lengths) <= target_rows * max_len]
            costs, tokens = rows_of(lengths, max_len)
            n = costs.size
            for w in WORLD_SIZES:
                t0 = time.perf_counter()
                order = balanced_order(costs, tokens, world_size=w, seed=seed)
                seconds = time.perf_counter() - t0
                stored = np.stack([balanced_share(order, r, w) for r in range(w)])
                shuffled = np.random.default_rng(seed).permutation(n)
                plain = np.stack([rank_share(shuffled, r, w) for r in range(w)])
                out.append(
                    {
                        "corpus": mix,
                        "max_len": max_len,
                        "W": w,
                        "rows": n,
                        "steps": n // w,
                        "random": imbalance(costs, plain),
                        "balanced": imbalance(costs, stored),
                        "tokens": imbalance(tokens, stored),
                        "seconds": seconds,
                    }
                )
    return out


def scale(n: int, seed: int) -> list[dict]:
    """The time of ``balanced_order`` on ``n`` rows (Pareto costs: a heavy tail)."""
    rng = np.random.default_rng(seed)
    costs = (rng.pareto(1.0, n) * 1e5).astype(np.int64)
    tokens = rng.integers(4000, 4097, n)
    out = []
    for w, g in ((8, 1), (64, 1), (64, 8)):
        t0 = time.perf_counter()
        order = balanced_order(costs, tokens, world_size=w, micro_batches=g, seed=seed)
        seconds = time.perf_counter() - t0
        stored = np.stack([balanced_share(order, r, w, g) for r in range(w)])
        out.append(
            {"rows": n, "W": w, "G": g, "balanced": imbalance(costs, stored, g), "seconds": seconds}
        )
    return out


def code_corpus(path: Path, megabytes: int) -> tuple[int, int]:
    """Site-packages' Python files as JSON Lines, sorted by path, up to ``megabytes``."""
    root = Path(sysconfig.get_paths()["purelib"])
    budget, files, size = megabytes << 20, 0, 0
    with path.open("w", encoding="utf-8") as f:
        for py in sorted(root.rglob("*.py")):
            try:
                text = py.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if not text.strip():
                continue
            f.write(json.dumps({"text": text}) + "\n")
            files += 1
            size += len(text.encode())
            if size >= budget:
                break
    return files, size


def through_dataset(out: Path, w: int, epoch: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's rows as ``PackedDataset`` gives them, and every row's cost."""
    from packtool.torch import PackedDataset

    ranks = [PackedDataset(out, rank=r, world_size=w) for r in range(w)]
    if epoch is not None:
        for ds in ranks:
            ds.set_epoch(epoch)
    reader = ranks[0].reader
    costs = np.array(
        [
            int((np.diff(np.asarray(row.cu_seqlens, np.int64))[: len(row.doc_ids)] ** 2).sum())
            for row in (reader.row(i) for i in range(reader.num_rows))
        ]
    )
    return np.stack([np.asarray(ds.rows) for ds in ranks]), costs


def code(megabytes: int, seed: int) -> list[dict]:
    from packtool.pipeline import pack

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "code.jsonl"
        files, size = code_corpus(src, megabytes)
        for g in (1, 4):
            dest = Path(tmp) / f"out-{g}"
            t0 = time.perf_counter()
            report = pack([str(src)], dest, max_len=8192, world_size=8, micro_batches=g, seed=seed)
            seconds = time.perf_counter() - t0
            for epoch in (None, 1):
                ranks, costs = through_dataset(dest, 8, epoch)
                read = ranks.ravel()
                assert np.unique(read).size == read.size, "a row read twice"
                loads = step_loads(costs, ranks, g)
                per_step = loads.max(axis=1)
                shuffled = np.random.default_rng(seed).permutation(costs.size)
                plain = np.stack([rank_share(shuffled, r, 8) for r in range(8)])
                out.append(
                    {
                        "corpus": f"code: {files:,} .py files, {size / 2**20:.0f} MB",
                        "max_len": 8192,
                        "W": 8,
                        "G": g,
                        "epoch": "stored" if epoch is None else f"set_epoch({epoch})",
                        "rows": int(costs.size),
                        "rows read": int(read.size),
                        "steps": int(loads.shape[0]),
                        "random": imbalance(costs, plain, g),
                        "balanced": float(step_imbalance(loads).mean()),
                        "step/cost rank corr": spearman(per_step),
                        "pack s": seconds,
                        "tokens": report.tokens,
                    }
                )
    return out


def table(rows: list[dict]) -> str:
    keys = list(rows[0])
    cells = [
        [
            f"{r[k]:,}"
            if isinstance(r[k], int)
            else f"{r[k]:.4f}"
            if isinstance(r[k], float)
            else str(r[k])
            for k in keys
        ]
        for r in rows
    ]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.rjust(w) for k, w in zip(keys, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rows, less code")
    parser.add_argument("--rows", type=int, default=None, help="rows per synthetic packing")
    parser.add_argument("--code-mb", type=int, default=None, help="MB of Python files")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = args.rows or (2048 if args.quick else 8192)
    megabytes = args.code_mb or (8 if args.quick else 64)
    print("Synthetic length mixes (imbalance: mean over steps of max rank cost / mean; G = 1)")
    print(table(synthetic(rows, args.seed)))
    print()
    print("balanced_order on many rows (Pareto costs)")
    print(table(scale(100_000 if args.quick else 1_000_000, args.seed)))
    print()
    print("Code corpus through PackedDataset (max_len 8,192, W = 8, bundled tokenizer)")
    print(table(code(megabytes, args.seed)))


if __name__ == "__main__":
    main()
