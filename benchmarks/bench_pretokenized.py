"""Pre-tokenized input (``--ids-field``) end to end, beside the text path.

    python benchmarks/bench_pretokenized.py            # 100M tokens of ids, 25M for memory
    python benchmarks/bench_pretokenized.py --quick    # 5M tokens, a smoke test

It writes a Parquet file of lognormal-length documents (median 300 tokens, ids below 50257,
int32 list column, with a labels column), then runs ``packtool pack --ids-field input_ids
--labels-field labels`` (and without labels) as a subprocess, and reports tokens/s of the
whole run (process start to manifest, from the wall clock) and its peak resident memory
(``VmHWM``), at two corpus sizes 4x apart (memory flat in corpus size). The text path is
``packtool pack`` on the sample corpus texts (``sample_data/make_corpus.py``), same machine,
same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]

RUN = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from packtool.cli import main
sys.argv = ["packtool", *sys.argv[1:]]
try:
    main()
except SystemExit as e:
    assert not e.code, e.code
wall = time.perf_counter() - t0
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"seconds": wall, "peak_kb": peak}), file=sys.stderr)
"""


def write_ids(path: Path, tokens: int, seed: int = 0, labels: bool = True) -> int:
    """A Parquet file of about ``tokens`` ids (row groups of 8192 documents); its tokens."""
    rng = np.random.default_rng(seed)
    written = 0
    writer = None
    while written < tokens:
        lengths = np.maximum(1, rng.lognormal(np.log(300), 1.0, 8192).astype(np.int64))
        lengths = np.minimum(lengths, 32768)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        ids = rng.integers(0, 50257, int(lengths.sum()), dtype=np.int32)
        columns = {"input_ids": pa.ListArray.from_arrays(offsets, ids)}
        if labels:
            lab = np.where(rng.random(ids.size) < 0.7, ids, -100).astype(np.int32)
            columns["labels"] = pa.ListArray.from_arrays(offsets, lab)
        table = pa.table(columns)
        if writer is None:
            writer = pq.ParquetWriter(str(path), table.schema, compression="snappy")
        writer.write_table(table)
        written += int(lengths.sum())
    assert writer is not None
    writer.close()
    return written


def run_pack(args: list[str]) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-c", RUN, "pack", *map(str, args), "-q", "--overwrite"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stderr.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tokens", type=int, default=100_000_000)
    a = parser.parse_args()
    big = 5_000_000 if a.quick else a.tokens
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        results = []
        for size in (big // 4, big):
            src = d / f"ids-{size}.parquet"
            n = write_ids(src, size)
            for name, extra in (
                ("ids + labels", ["--labels-field", "labels"]),
                ("ids", []),
            ):
                base = [src, "-L", "4096", "--ids-field", "input_ids", "--pad-id", "0"]
                r = run_pack([*base, *extra, "-o", d / "out"])
                results.append(
                    {
                        "input": name,
                        "tokens": n,
                        "file_mb": round(src.stat().st_size / 1e6, 1),
                        "seconds": round(r["seconds"], 2),
                        "tokens_per_s": round(n / r["seconds"]),
                        "peak_mb": round(r["peak_kb"] / 1024),
                    }
                )
            src.unlink()
        # The text path, same machine: the sample corpus, repeated.
        text = d / "corpus.jsonl"
        sample = ROOT / "sample_data" / "corpus.jsonl"
        text.write_bytes(sample.read_bytes() * (2 if a.quick else 20))
        r = run_pack([text, "-L", "4096", "-o", d / "text-out"])
        manifest = json.loads((d / "text-out" / "manifest.json").read_text())
        n = int(manifest["tokens"]["packed"])
        results.append(
            {
                "input": "text (bundled tokenizer)",
                "tokens": n,
                "file_mb": round(text.stat().st_size / 1e6, 1),
                "seconds": round(r["seconds"], 2),
                "tokens_per_s": round(n / r["seconds"]),
                "peak_mb": round(r["peak_kb"] / 1024),
            }
        )
    print(f"{'input':26} {'tokens':>12} {'file MB':>8} {'s':>7} {'tokens/s':>12} {'peak MB':>8}")
    for r in results:
        print(
            f"{r['input']:26} {r['tokens']:>12,} {r['file_mb']:>8} {r['seconds']:>7} "
            f"{r['tokens_per_s']:>12,} {r['peak_mb']:>8}"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
