"""The merge of work units: listing the units' shards (the default) against copying the rows.

    python benchmarks/bench_merge.py                    # 8 units of 12,000 generated documents
    python benchmarks/bench_merge.py --docs 40000 --units 8 --max-len 4096 --repeat 3

Packs the corpus as ``--units N`` unit runs (``--unit I``, not merged), then merges copies of
that directory with ``copy=False`` and with ``copy=True`` and prints, for each, the time of
the merge and the bytes it wrote: the bytes this process passed to ``write(2)``
(``wchar`` in ``/proc/self/io``, Linux) and the size of the files the merge added to OUT.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "sample_data"))

from make_corpus import generate_documents  # noqa: E402

from packtool.engines import pack_units  # noqa: E402
from packtool.merge import merge_units  # noqa: E402


def wchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io (Linux only)")


def added_bytes(out: Path) -> int:
    """Bytes of the files in OUT itself (the merged dataset; units/ excluded)."""
    return sum(p.stat().st_size for p in out.iterdir() if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=12_000, help="generated documents")
    parser.add_argument("--units", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3, help="merges of each kind")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-merge-") as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        with open(corpus, "w", encoding="utf-8") as f:
            for doc in generate_documents(args.docs, 7):
                f.write(json.dumps(doc) + "\n")
        units = Path(tmp) / "units-only"
        for i in range(args.units):
            pack_units([corpus], units, units=args.units, unit=i, max_len=args.max_len)
        shard_bytes = sum(p.stat().st_size for p in units.glob("units/*/data-*.arrow"))
        print(
            f"corpus {corpus.stat().st_size / 1e6:.1f} MB, --units {args.units}, "
            f"max_len {args.max_len}: unit shards {shard_bytes / 1e6:.1f} MB"
        )
        warm = Path(tmp) / "warm-up"  # imports and first calls, not counted
        shutil.copytree(units, warm)
        merge_units(warm, copy=True)
        shutil.rmtree(warm)
        print("merge      rows  seconds (each run)          written (write(2))  files added")
        for copy in (False, True):
            seconds, written, added, rows = [], [], 0, 0
            for r in range(args.repeat):
                out = Path(tmp) / f"out-{copy}-{r}"
                shutil.copytree(units, out)
                before, start = wchar(), time.perf_counter()
                report = merge_units(out, copy=copy)
                seconds.append(time.perf_counter() - start)
                written.append(wchar() - before)
                added, rows = added_bytes(out), report.rows
                shutil.rmtree(out)
            name = "copy" if copy else "no-copy"
            runs = " ".join(f"{s:.3f}" for s in seconds)
            print(
                f"{name:<8} {rows:>6}  {runs:<26}  {max(written) / 1e6:>12.3f} MB  "
                f"{added / 1e6:>8.3f} MB",
                flush=True,
            )


if __name__ == "__main__":
    main()
