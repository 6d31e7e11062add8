"""How fast the readers hand texts to the tokenizer: ``readers.read_texts`` over generated inputs.

    python benchmarks/bench_read.py --make /tmp/bench-read     # the inputs (~150 MB each), once
    python benchmarks/bench_read.py /tmp/bench-read            # every format, best of 3
    python benchmarks/bench_read.py /tmp/bench-read --only jsonl-short --runs 1
    python benchmarks/bench_read.py /tmp/bench-read --records  # the instruction-records path

The inputs are the sample corpus generator's documents (about 2.3 kB of text each) as JSON
Lines, Parquet and CSV, and short records (about 100 bytes each, where per-record costs
show) as JSON Lines. Each read consumes every batch and counts the characters, so nothing
is left lazy; the line printed per input is the best and the median of ``--runs`` reads (in
one process: run it under an outside timer to compare two checkouts whole-process).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "sample_data"))

INPUTS = {
    "jsonl": "docs.jsonl",
    "jsonl-short": "short.jsonl",
    "parquet": "docs.parquet",
    "csv": "docs.csv",
}


def make(out: Path, megabytes: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pc
    import pyarrow.parquet as pq
    from make_corpus import generate_documents

    out.mkdir(parents=True, exist_ok=True)
    if all((out / name).exists() for name in INPUTS.values()):
        print(f"{out}: the inputs are there already")
        return
    texts: list[str] = []
    size = 0
    for doc in generate_documents(megabytes * 500, 11):
        texts.append(doc["text"])
        size += len(doc["text"]) + 40
        if size >= megabytes << 20:
            break
    with open(out / INPUTS["jsonl"], "w", encoding="utf-8") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": i, "text": text, "source": "bench"}) + "\n")
    table = pa.table({"id": np.arange(len(texts)), "text": texts})
    pq.write_table(table, out / INPUTS["parquet"], row_group_size=20_000)
    pc.write_csv(table, out / INPUTS["csv"])
    words = " ".join(texts[:2000]).split()
    rng = np.random.default_rng(5)
    with open(out / INPUTS["jsonl-short"], "w", encoding="utf-8") as f:
        written, k = 0, 0
        while written < megabytes << 20:
            n = int(rng.integers(5, 25))
            at = (k * 7) % 9000
            line = json.dumps({"id": k, "text": " ".join(words[at : at + n])}) + "\n"
            f.write(line)
            written += len(line)
            k += 1
    for name in INPUTS.values():
        print(f"{out / name}: {(out / name).stat().st_size / 1e6:.1f} MB")


def read_all(path: Path, records: bool = False) -> tuple[int, int]:
    from packtool.readers import read_records, read_texts, resolve_inputs

    (inp,) = resolve_inputs([path])
    docs = chars = 0
    if records:  # the instruction-records path: each record a dict, made by a check
        check = lambda r, loc: r["text"]  # noqa: E731
        batches = read_records(inp, fields=["text"], check=check)
    else:
        batches = read_texts(inp)
    for batch in batches:
        docs += len(batch.records)
        chars += sum(len(t) for t in batch.records if t is not None)
    return docs, chars


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--make", action="store_true", help="write the inputs into DIR")
    parser.add_argument("--megabytes", type=int, default=150)
    parser.add_argument("--only", choices=list(INPUTS), action="append")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--records", action="store_true", help="read_records (a dict per record), not read_texts"
    )
    args = parser.parse_args()
    if args.make:
        make(args.dir, args.megabytes)
        return
    for name in args.only or list(INPUTS):
        path = args.dir / INPUTS[name]
        seconds = []
        for _ in range(args.runs):
            start = time.perf_counter()
            docs, chars = read_all(path, args.records)
            seconds.append(time.perf_counter() - start)
        mb = path.stat().st_size / 1e6
        print(
            f"{name:12} {mb:6.1f} MB {docs:>9,} docs {chars:>12,} chars  "
            f"best {min(seconds):.3f} s  median {statistics.median(seconds):.3f} s  "
            f"({mb / min(seconds):.0f} MB/s)"
        )


if __name__ == "__main__":
    main()
