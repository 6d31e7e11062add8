"""What packing unit by unit costs: rows with ``--units N`` against one global FFD.

    python benchmarks/bench_units.py                       # 40,000 generated documents
    python benchmarks/bench_units.py --docs 200000 --units 1 4 16 --max-len 4096 2048

For each corpus and ``max_len``, packs with each ``--units`` value (local engine) and prints
the rows, the rows one global FFD needs (``global_ffd_rows``, the same for every N), the
extra rows and the packing loss ``rows / global_ffd_rows - 1``, with the time of the run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "sample_data"))

from make_corpus import generate_documents  # noqa: E402

from packtool.engines import pack_units  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=40_000, help="generated documents")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--units", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--max-len", type=int, nargs="+", default=[4096])
    parser.add_argument("--corpus", type=Path, help="use this corpus instead of generating one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-units-") as tmp:
        corpus = args.corpus
        if corpus is None:
            corpus = Path(tmp) / "corpus.jsonl"
            with open(corpus, "w", encoding="utf-8") as f:
                for doc in generate_documents(args.docs, args.seed):
                    f.write(json.dumps(doc) + "\n")
        print(f"corpus {corpus} ({corpus.stat().st_size / 1e6:.1f} MB)")
        print("max_len  units  docs/unit   rows  global_ffd  extra  loss     seconds")
        for max_len in args.max_len:
            for n in args.units:
                start = time.perf_counter()
                report = pack_units(
                    [corpus], Path(tmp) / f"out-{max_len}-{n}", units=n, max_len=max_len
                )
                seconds = time.perf_counter() - start
                m = report.merged.manifest
                docs = m["documents"]["read"]
                print(
                    f"{max_len:>7}  {n:>5}  {docs // n:>9,}  {m['rows']:>6,}  "
                    f"{m['global_ffd_rows']:>10,}  {m['units']['rows_over_global_ffd']:>5}  "
                    f"{m['units']['packing_loss']:>6.3%}  {seconds:>7.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
