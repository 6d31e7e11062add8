"""packtool's benchmark: one command, its own inputs, one table.

    python benchmarks/run.py            # full run (~100 MB corpus; a few minutes on 2 cores)
    python benchmarks/run.py --quick    # small corpora, for a smoke test

What it measures, all in one run (ratios are taken within the run: shared machines are noisy):

1. ``first_fit_decreasing`` on 1M and 10M lognormal lengths (median 300) at max_len 4096:
   time (warm, median of 3, sort included), rows, rows over ceil(tokens / max_len), efficiency.
   With ``trl`` installed, TRL's ``pack_dataset(strategy="bfd")`` on the same 1M lengths.
2. End to end on a generated corpus (``sample_data/make_corpus.py``): ``packtool pack
   --tokenizer-backend hf`` against the raw tokenizer ceiling, i.e. `tokenizers`'
   ``encode_batch_fast`` on the same texts with all cores and nothing else (texts already in
   memory). Runs alternate raw / pack /
   raw; the ratio is pack tokens/s over raw tokens/s, for the best run of each and, per
   round, against the mean of the raw runs around it (median and range of the rounds).
3. Peak resident memory (``VmHWM`` of the ``packtool pack`` process) at two corpus sizes
   4x apart.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "sample_data"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_ffd import bench_ffd, synthetic_lengths  # noqa: E402

RAW_SCRIPT = r"""
import json, sys, time
import pyarrow.json as pj
from packtool.tokenize import load_tokenizer
texts = pj.read_json(sys.argv[1]).column("text").to_pylist()
tok = load_tokenizer().tokenizer
tok.encode_batch_fast(texts[:64])  # start the thread pool
t0 = time.perf_counter()
n = 0
for i in range(0, len(texts), 1024):
    n += sum(len(e) for e in tok.encode_batch_fast(texts[i : i + 1024]))
print(json.dumps({"seconds": time.perf_counter() - t0, "tokens": n}))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["HF_HUB_OFFLINE"] = "1"
    env["HF_DATASETS_OFFLINE"] = "1"
    return env


def _run(cmd: list[str]) -> tuple[str, float, int]:
    """Run ``cmd``; (stdout, wall seconds, peak RSS in bytes of that process)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    # communicate() has reaped the child; its rusage is folded into RUSAGE_CHILDREN, so run
    # each measured process through wait4 instead: see _run_rss.
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{err.decode()[-2000:]}")
    return out.decode(), wall, 0


PEAK_WRAPPER = r"""
import sys
from packtool.cli import app
try:
    app(args=sys.argv[1:], prog_name="packtool", standalone_mode=False)
finally:
    # VmHWM: this process's own peak (ru_maxrss would count the parent's memory image
    # inherited by fork before exec).
    with open("/proc/self/status") as f:
        peak = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    print(f"PEAK_RSS_KB={peak}", file=sys.stderr)
"""


def _run_rss(args: list[str]) -> tuple[str, float, int]:
    """Run ``packtool ARGS`` in a fresh process; (stdout, wall seconds, its peak RSS)."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_WRAPPER, *args], capture_output=True, text=True, env=_env()
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"packtool {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    peak = int(proc.stderr.rsplit("PEAK_RSS_KB=", 1)[1].split()[0]) * 1024
    return proc.stdout, wall, peak


def _write_corpus(path: Path, num_docs: int, seed: int) -> int:
    from make_corpus import generate_documents

    with open(path, "w", encoding="utf-8") as f:
        for doc in generate_documents(num_docs, seed):
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    return path.stat().st_size


def _pack(corpus: Path, out: Path, max_len: int) -> tuple[dict[str, Any], float, int]:
    args = ["pack", str(corpus), "--max-len", str(max_len), "-o", str(out), "--overwrite"]
    # Against `tokenizers` alone, so on `tokenizers`: bench_backends.py compares the backends.
    args += ["--tokenizer-backend", "hf"]
    stdout, wall, rss = _run_rss([*args, "--json"])
    return json.loads(stdout), wall, rss


def _raw(corpus: Path) -> dict[str, Any]:
    stdout, _, _ = _run([sys.executable, "-c", RAW_SCRIPT, str(corpus)])
    return json.loads(stdout)


def _trl(lengths: Any, max_len: int) -> tuple[float, int] | None:
    """TRL's ``pack_dataset(strategy="bfd")`` on ``lengths``: (seconds, rows), or None."""
    try:
        import datasets
        import numpy as np
        import pyarrow as pa
        from trl import pack_dataset
    except ImportError:
        return None
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = pa.array(np.ones(int(offsets[-1]), np.int32))
    column = pa.LargeListArray.from_arrays(pa.array(offsets), values)
    datasets.disable_progress_bars()
    ds = datasets.Dataset(pa.table({"input_ids": column}))
    t0 = time.perf_counter()
    packed = pack_dataset(ds, max_len, strategy="bfd")
    return time.perf_counter() - t0, len(packed)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--docs", type=int, default=48_000, help="documents in the large corpus")
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of raw/pack/raw runs")
    args = parser.parse_args(argv)
    big_docs = 4_000 if args.quick else args.docs
    ffd_sizes = (100_000, 1_000_000) if args.quick else (1_000_000, 10_000_000)
    rows: list[tuple[str, str]] = []

    # 1. FFD
    for n in ffd_sizes:
        r = bench_ffd(n, args.max_len)
        rows.append((f"FFD {n:,} items (s, warm median of 3)", f"{r['time_s']:.3f}"))
        rows.append(
            (
                f"FFD {n:,}: rows / lower bound / over",
                f"{r['rows']:,} / {r['lower_bound']:,} / {r['rows_over_bound']:,}",
            )
        )
        rows.append((f"FFD {n:,}: efficiency", f"{r['efficiency']:.5f}"))
    # TRL packs inside datasets.map batches of 1,000 rows; it gets 100k items (20k quick).
    trl_n = 20_000 if args.quick else 100_000
    trl_lengths = synthetic_lengths(trl_n, args.max_len)
    trl = _trl(trl_lengths, args.max_len)
    if trl is not None:
        import trl as trl_module

        ours = bench_ffd(trl_n, args.max_len)
        rows.append(
            (f"TRL {trl_module.__version__} pack_dataset bfd, {trl_n:,} items (s)", f"{trl[0]:.3f}")
        )
        rows.append((f"packtool FFD, same {trl_n:,} items (s)", f"{ours['time_s']:.4f}"))
        rows.append(("  TRL time / packtool time", f"{trl[0] / ours['time_s']:,.0f}x"))
        rows.append(
            (
                "  rows: TRL / packtool / lower bound",
                f"{trl[1]:,} / {ours['rows']:,} / {ours['lower_bound']:,}",
            )
        )
    else:
        rows.append(("TRL pack_dataset bfd", "not installed (pip install trl)"))

    with tempfile.TemporaryDirectory(prefix="packtool-bench-") as tmp:
        tmpdir = Path(tmp)
        big = tmpdir / "big.jsonl"
        small = tmpdir / "small.jsonl"
        big_bytes = _write_corpus(big, big_docs, 1)
        small_bytes = _write_corpus(small, big_docs // 4, 2)

        # 2. End to end vs the raw tokenizer: rounds of raw / pack / raw.
        raws: list[dict[str, Any]] = []
        packs: list[tuple[dict[str, Any], float, int]] = []
        round_ratios: list[float] = []
        raw = _raw(big)
        raws.append(raw)
        for _ in range(args.repeats):
            packs.append(_pack(big, tmpdir / "out-big", args.max_len))
            before, raw = raw, _raw(big)
            raws.append(raw)
            raw_s = (before["seconds"] + raw["seconds"]) / 2
            round_ratios.append(raw_s / packs[-1][0]["seconds"])
        raw_best = min(raws, key=lambda r: r["seconds"])
        report, wall, rss_big = min(packs, key=lambda p: p[0]["seconds"])
        raw_tps = raw_best["tokens"] / raw_best["seconds"]
        pack_tps = report["tokens"]["packed"] / report["seconds"]
        pack_wall_tps = report["tokens"]["packed"] / wall
        round_ratios.sort()
        median = round_ratios[len(round_ratios) // 2]
        rows.append(("corpus (MB, documents)", f"{big_bytes / 1e6:,.1f}, {big_docs:,}"))
        rows.append(("raw tokenizer ceiling (tokens/s)", f"{raw_tps:,.0f}"))
        rows.append(("packtool pack (tokens/s, pack())", f"{pack_tps:,.0f}"))
        rows.append(("  ratio to the raw ceiling (best / best)", f"{pack_tps / raw_tps:.1%}"))
        rows.append(
            (
                f"  ratio per round, median (range) of {len(round_ratios)}",
                f"{median:.1%} ({round_ratios[0]:.1%}-{round_ratios[-1]:.1%})",
            )
        )
        rows.append(("packtool pack (tokens/s, whole process)", f"{pack_wall_tps:,.0f}"))
        rows.append(("  ratio to the raw ceiling (best / best)", f"{pack_wall_tps / raw_tps:.1%}"))
        rows.append(
            (
                "pack: rows / lower bound / over",
                f"{report['rows']:,} / "
                f"{report['lower_bound_rows']:,} / {report['rows_over_lower_bound']:,}",
            )
        )
        rows.append(("pack: efficiency", f"{report['efficiency']:.4%}"))

        # 3. Peak RSS at two sizes.
        _, _, rss_small = _pack(small, tmpdir / "out-small", args.max_len)
        rows.append(
            (f"peak RSS, {small_bytes / 1e6:,.0f} MB corpus (MB)", f"{rss_small / 1e6:,.0f}")
        )
        rows.append((f"peak RSS, {big_bytes / 1e6:,.0f} MB corpus (MB)", f"{rss_big / 1e6:,.0f}"))
        rows.append(("  large / small", f"{rss_big / rss_small:.2f}x"))

    width = max(len(k) for k, _ in rows)
    print(
        f"packtool benchmark: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d')}"
    )
    print(f"{'measure':<{width}}  value")
    print(f"{'-' * width}  {'-' * 24}")
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    main()
