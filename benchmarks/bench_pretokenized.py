"""Pre-tokenized input (``--ids-field``) end to end, beside the text path.

    python benchmarks/bench_pretokenized.py            # 100M tokens of ids, 25M for memory
    python benchmarks/bench_pretokenized.py --quick    # 5M tokens, a smoke test
    python benchmarks/bench_pretokenized.py --only jsonl   # the JSON Lines inputs only

It writes a Parquet file of lognormal-length documents (median 300 tokens, ids below 50257,
int32 list column, with a labels column), then runs ``packtool pack --ids-field input_ids
--labels-field labels`` (and without labels) as a subprocess, and reports tokens/s of the
whole run (process start to manifest, from the wall clock) and its peak resident memory
(``VmHWM``) and CPU seconds (user + system: what a loaded machine does not inflate), at
two corpus sizes 4x apart (memory flat in corpus size). The text path is
``packtool pack`` on the sample corpus texts (``sample_data/make_corpus.py``), same machine,
same run. The JSON Lines inputs (``--jsonl-tokens``, default 40M, and a quarter of it) hold
the same documents, one ``{"input_ids": [...], "labels": [...]}`` a line, plain, gzip
(level 1) and zstd (level 3), and as one JSON array.
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
use = resource.getrusage(resource.RUSAGE_SELF)
cpu = use.ru_utime + use.ru_stime
print(json.dumps({"seconds": wall, "cpu": cpu, "peak_kb": peak}), file=sys.stderr)
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


def write_jsonl(path: Path, tokens: int, seed: int = 0) -> int:
    """A JSON Lines file of about ``tokens`` ids, with labels; its tokens."""
    rng = np.random.default_rng(seed)
    written = 0
    with path.open("w") as f:
        while written < tokens:
            lengths = np.maximum(1, rng.lognormal(np.log(300), 1.0, 8192).astype(np.int64))
            lengths = np.minimum(lengths, 32768)
            ids = rng.integers(0, 50257, int(lengths.sum()), dtype=np.int32)
            lab = np.where(rng.random(ids.size) < 0.7, ids, -100)
            ends = np.cumsum(lengths)
            for a, b in zip(ends - lengths, ends, strict=True):
                ids_s, lab_s = ids[a:b].tolist(), lab[a:b].tolist()
                f.write(json.dumps({"input_ids": ids_s, "labels": lab_s}) + "\n")
            written += int(lengths.sum())
    return written


def compress(src: Path, codec: str) -> Path:
    import gzip

    import zstandard

    if codec == "gz":
        dst = src.with_suffix(".jsonl.gz")
        with src.open("rb") as f, gzip.open(dst, "wb", compresslevel=1) as g:
            while chunk := f.read(1 << 24):
                g.write(chunk)
    else:
        dst = src.with_suffix(".jsonl.zst")
        with src.open("rb") as f, dst.open("wb") as g:
            zstandard.ZstdCompressor(level=3).copy_stream(f, g)
    return dst


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
    parser.add_argument("--jsonl-tokens", type=int, default=40_000_000)
    parser.add_argument("--only", choices=["parquet", "jsonl", "text"], default=None)
    a = parser.parse_args()
    big = 5_000_000 if a.quick else a.tokens
    jbig = 2_000_000 if a.quick else a.jsonl_tokens
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        results = []

        def measure(name: str, src: Path, n: int, args: list[str]) -> None:
            r = run_pack(args)
            results.append(
                {
                    "input": name,
                    "tokens": n,
                    "file_mb": round(src.stat().st_size / 1e6, 1),
                    "seconds": round(r["seconds"], 2),
                    "tokens_per_s": round(n / r["seconds"]),
                    "cpu_s": round(r["cpu"], 2),
                    "peak_mb": round(r["peak_kb"] / 1024),
                }
            )

        for size in (jbig // 4, jbig) if a.only in (None, "jsonl") else ():
            src = d / f"ids-{size}.jsonl"
            n = write_jsonl(src, size)
            base = ["-L", "4096", "--ids-field", "input_ids", "--pad-id", "0", "-o", d / "out"]
            measure("jsonl ids + labels", src, n, [src, *base, "--labels-field", "labels"])
            measure("jsonl ids", src, n, [src, *base])
            for codec in ("gz", "zst"):
                packed = compress(src, codec)
                measure(f"jsonl.{codec} ids", packed, n, [packed, *base])
                packed.unlink()
            array = src.with_suffix(".json")  # the same records as one JSON array
            with src.open("rb") as f, array.open("wb") as g:
                g.write(b"[\n")
                for i, line in enumerate(f):
                    g.write((b",\n" if i else b"") + line.rstrip(b"\n"))
                g.write(b"\n]\n")
            measure("json array ids", array, n, [array, *base])
            array.unlink()
            src.unlink()
        for size in (big // 4, big) if a.only in (None, "parquet") else ():
            src = d / f"ids-{size}.parquet"
            n = write_ids(src, size)
            base = [src, "-L", "4096", "--ids-field", "input_ids", "--pad-id", "0"]
            measure("ids + labels", src, n, [*base, "--labels-field", "labels", "-o", d / "out"])
            measure("ids", src, n, [*base, "-o", d / "out"])
            src.unlink()
        if a.only in (None, "text"):  # the text path, same machine: the sample corpus, repeated
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
                    "cpu_s": round(r["cpu"], 2),
                    "peak_mb": round(r["peak_kb"] / 1024),
                }
            )
    after = os.getloadavg()
    print(f"load average before: {load[0]:.1f}, after: {after[0]:.1f} (2 cores)")
    head = f"{'input':26} {'tokens':>12} {'file MB':>8} {'s':>7} {'tokens/s':>12} {'cpu s':>7}"
    print(f"{head} {'peak MB':>8}")
    for r in results:
        print(
            f"{r['input']:26} {r['tokens']:>12,} {r['file_mb']:>8} {r['seconds']:>7} "
            f"{r['tokens_per_s']:>12,} {r['cpu_s']:>7} {r['peak_mb']:>8}"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
