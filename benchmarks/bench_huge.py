"""Peak memory of `packtool pack` on inputs holding one huge record: the regression cases of
the hardening issue (a 50 MB one-line document took 7.2 GB peak RSS, a CSV with one 30 MB
field 4.5 GB, when batches were cut by a count of documents).

    python benchmarks/bench_huge.py            # ~1 minute on 2 cores
    python benchmarks/bench_huge.py --mb 10    # smaller records, for a smoke test
    python benchmarks/bench_huge.py --mb 100 --shapes --tokenizer benchmarks/data/published/gpt4o

Each case is a fresh `packtool pack` process (the bundled tokenizer, or ``--tokenizer``),
once per backend; the table gives its wall time and its peak resident memory (``VmHWM``), and
the tokens it packed (the same on every backend, or the run says so). ``--shapes`` adds the
documents without line breaks or spaces: prose with its spaces taken out (cut between a
letter and the punctuation after it) and letters alone (no exact cut: cut where it is).
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
tok = sys.argv[4] if len(sys.argv) > 4 else None
report = packtool.pack(
    [sys.argv[1]], sys.argv[2], max_len=4096, tokenizer_backend=sys.argv[3], tokenizer=tok
)
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


def write_cases(directory: Path, mb: float, shapes: bool = False) -> dict[str, Path]:
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
    cases = {f"one {mb:g} MB line (JSONL)": jsonl, f"one {mb * 0.6:g} MB CSV field": field}
    if shapes:
        packed = directory / "no-whitespace.jsonl"
        with open(packed, "w", encoding="utf-8") as f:
            f.write(json.dumps({"text": _prose(int(mb * 1.2e6), 3).replace(" ", "")}) + "\n")
        letters = directory / "letters.jsonl"
        with open(letters, "w", encoding="utf-8") as f:
            text = "".join(c for c in _prose(int(mb * 1.3e6), 4) if c.isalpha())
            f.write(json.dumps({"text": text[: int(mb * 1e6)]}) + "\n")
        cases[f"no whitespace, {mb:g} MB"] = packed
        cases[f"letters alone, {mb:g} MB"] = letters
    return cases


def run(path: Path, backend: str, out: Path, tokenizer: str | None = None) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            RUN,
            str(path),
            str(out),
            backend,
            *([tokenizer] if tokenizer else []),
        ],
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
    parser.add_argument("--tokenizer", help="a tokenizer.json or its directory (default: bundled)")
    parser.add_argument("--shapes", action="store_true", help="documents without whitespace too")
    parser.add_argument("--backends", nargs="*", default=["hf", "fastokens", "gigatoken"])
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f}; tokenizer {args.tokenizer or 'bundled'}")
    with tempfile.TemporaryDirectory() as tmp:
        cases = write_cases(Path(tmp), args.mb, args.shapes)
        print(f"{'case':<30} {'backend':<10} {'wall (s)':>9} {'peak RSS (MB)':>14} {'tokens':>12}")
        for name, path in cases.items():
            tokens = set()
            for backend in args.backends:
                out = Path(tmp) / f"out-{backend}-{path.stem}"
                r = run(path, backend, out, args.tokenizer)
                tokens.add(r["tokens"])
                print(
                    f"{name:<30} {backend:<10} {r['seconds']:>9.1f} "
                    f"{r['peak'] / 2**20:>14,.0f} {r['tokens']:>12,}"
                )
            if len(tokens) != 1:
                print(f"  the backends packed different token counts: {sorted(tokens)}")


if __name__ == "__main__":
    main()
