"""Peak memory of `packtool pack` on inputs holding one huge record: the regression cases of
the hardening issue (a 50 MB one-line document took 7.2 GB peak RSS, a CSV with one 30 MB
field 4.5 GB, when batches were cut by a count of documents).

    python benchmarks/bench_huge.py            # ~1 minute on 2 cores
    python benchmarks/bench_huge.py --mb 10    # smaller records, for a smoke test

Each case is a fresh `packtool pack` process with the bundled tokenizer, once per backend;
the table gives its wall time and its peak resident memory (``VmHWM``), and the tokens it
packed (the same on both backends, or the run says so).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUN = r"""
import json, sys
import packtool
report = packtool.pack([sys.argv[1]], sys.argv[2], max_len=4096, tokenizer_backend=sys.argv[3])
with open("/proc/self/status") as f:
    peak = int(next(line.split()[1] for line in f if line.startswith("VmHWM:"))) * 1024
print(json.dumps({"tokens": report.tokens, "peak": peak}))
"""


def _prose(chars: int, seed: int) -> str:
    rng = random.Random(seed)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        for _ in range(5000)
    ]
    out: list[str] = []
    n = 0
    while n < chars:
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(5, 25))) + ". "
        out.append(sentence)
        n += len(sentence)
    return "".join(out)[:chars]


def write_cases(directory: Path, mb: float) -> dict[str, Path]:
    jsonl = directory / "one-line.jsonl"
    with open(jsonl, "w", encoding="utf-8") as f:
        f.write(json.dumps({"text": _prose(int(mb * 1e6), 1)}) + "\n")
    field = directory / "one-field.csv"
    with open(field, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text"])
        writer.writerow([0, _prose(int(mb * 0.6 * 1e6), 2)])
        for i in range(1, 100):
            writer.writerow([i, _prose(2000, 2 + i)])
    return {f"one {mb:g} MB line (JSONL)": jsonl, f"one {mb * 0.6:g} MB CSV field": field}


def run(path: Path, backend: str, out: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", RUN, str(path), str(out), backend],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"pack failed on {path}: {result.stderr.strip().splitlines()[-1:]}")
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    figures["seconds"] = time.perf_counter() - started
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=50.0, help="size of the one-line document")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cases = write_cases(Path(tmp), args.mb)
        print(f"{'case':<30} {'backend':<10} {'wall (s)':>9} {'peak RSS (MB)':>14} {'tokens':>12}")
        for name, path in cases.items():
            tokens = set()
            for backend in ("hf", "fastokens"):
                out = Path(tmp) / f"out-{backend}-{path.stem}"
                r = run(path, backend, out)
                tokens.add(r["tokens"])
                print(
                    f"{name:<30} {backend:<10} {r['seconds']:>9.1f} "
                    f"{r['peak'] / 2**20:>14,.0f} {r['tokens']:>12,}"
                )
            if len(tokens) != 1:
                print(f"  the backends packed different token counts: {sorted(tokens)}")


if __name__ == "__main__":
    main()
