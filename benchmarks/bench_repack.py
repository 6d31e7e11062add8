"""Repacking a pack, and packing a Megatron ``.bin/.idx``, beside ``pack --ids-field`` of the
same ids in Parquet: whole processes, side by side.

    python benchmarks/bench_repack.py             # 50M tokens of ids
    python benchmarks/bench_repack.py --quick     # 5M tokens, a smoke test

It writes lognormal-length documents (``bench_pretokenized.write_ids``) as Parquet and as a
Megatron indexed dataset, packs the Parquet once at ``--from-len`` (the pack to repack), then
runs, each as its own process, ``rounds`` times in turn:

- ``parquet``: ``pack ids.parquet --ids-field input_ids --max-len L`` (the fresh pack);
- ``repack``: ``pack FIRST/ --max-len L`` (the documents rebuilt from their chunks);
- ``megatron``: ``pack ids --max-len L`` (the ``.bin/.idx`` prefix);

and reports the wall and CPU seconds (user + system) of each, from process start to
manifest, with its peak resident memory, and checks that the three outputs' shards are the
same bytes. With ``--labels``, the same with a labels column (Megatron holds ids only);
``--overflow split`` packs both ways with it (a labelled split pack: its repack record gives
the chunk starts' labels back). ``--code DIR`` runs the packtool checkout in ``DIR`` (e.g.
another branch, for a before/after figure).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pretokenized import RUN, write_ids

ROOT = Path(__file__).resolve().parents[1]


def write_megatron(parquet: Path, prefix: Path) -> None:
    """The ids of ``parquet`` as a Megatron-LM indexed dataset (int32, one document a
    sequence), written in its index format."""
    table = pq.read_table(parquet, columns=["input_ids"])
    column = table.column("input_ids").combine_chunks()
    lengths = np.diff(np.asarray(column.offsets)).astype(np.int32)
    np.asarray(column.values, dtype=np.int32).tofile(f"{prefix}.bin")
    pointers = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * 4)[:-1]])
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(np.uint64(1).tobytes() + np.uint8(4).tobytes())
        f.write(np.uint64(lengths.size).tobytes() + np.uint64(lengths.size + 1).tobytes())
        f.write(lengths.tobytes() + pointers.astype(np.int64).tobytes())
        f.write(np.arange(lengths.size + 1, dtype=np.int64).tobytes())


def write_prompts(parquet: Path, share: float) -> None:
    """The labels of ``parquet`` made a prompt and a completion: -100 on the first ``share``
    of each document, its ids after (whole chunks of a long prompt learn nothing)."""
    table = pq.read_table(parquet)
    column = table.column("input_ids").combine_chunks()
    offsets = np.asarray(column.offsets, np.int64)
    ids = np.asarray(column.values, np.int32)
    lengths = np.diff(offsets)
    position = np.arange(ids.size) - np.repeat(offsets[:-1], lengths)
    prompt = position < np.repeat((lengths * share).astype(np.int64), lengths)
    labels = np.where(prompt, -100, ids).astype(np.int32)
    labelled = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(labels))
    table = table.set_column(table.schema.get_field_index("labels"), "labels", labelled)
    pq.write_table(table, parquet)


def run(args: list[str], code: Path = ROOT) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", RUN, *args],
        capture_output=True,
        text=True,
        cwd=code,
        env={**__import__("os").environ, "PYTHONPATH": str(code)},
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stderr.strip().splitlines()[-1])


def shard_bytes(out: Path) -> list[bytes]:
    manifest = json.loads((out / "manifest.json").read_text())
    return [(out / s["file"]).read_bytes() for s in manifest["shards"]]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=50_000_000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--from-len", type=int, default=2048)
    parser.add_argument("--to-len", type=int, default=4096)
    parser.add_argument("--labels", action="store_true", help="with a labels column")
    parser.add_argument("--overflow", choices=["split", "truncate", "drop"], default=None)
    parser.add_argument("--code", type=Path, default=ROOT, help="the packtool checkout to run")
    parser.add_argument(
        "--prompt-share",
        type=float,
        default=None,
        help="with --labels: -100 on this share of each document, learned after (a prompt)",
    )
    a = parser.parse_args()
    tokens = 5_000_000 if a.quick else a.tokens
    with tempfile.TemporaryDirectory(prefix="bench-repack-") as tmp:
        t = Path(tmp)
        n = write_ids(t / "ids.parquet", tokens, labels=a.labels)
        if n > tokens * 1.05:  # (written 8192 documents at a time): the first ``tokens``
            table = pq.read_table(t / "ids.parquet")
            lengths = np.asarray(table.column("input_ids").combine_chunks().value_lengths())
            keep = int(np.searchsorted(np.cumsum(lengths), tokens)) + 1
            pq.write_table(table.slice(0, keep), t / "ids.parquet")
            n = int(lengths[:keep].sum())
        if a.labels and a.prompt_share is not None:  # prompt, then completion
            write_prompts(t / "ids.parquet", a.prompt_share)
        fields = ["--ids-field", "input_ids", "--pad-id", "0", "--vocab-size", "50257"]
        if a.labels:
            fields += ["--labels-field", "labels"]
        if a.overflow:
            fields += ["--overflow", a.overflow]
        first = ["-L", str(a.from_len), "-o", str(t / "first")]
        run(["pack", str(t / "ids.parquet"), *fields, *first], a.code)
        size = sum(p.stat().st_size for p in (t / "first").iterdir()) / 1e6
        record = t / "first" / "repack.arrows"  # a labelled split pack's repack record
        record_kb = record.stat().st_size / 1e3 if record.exists() else 0.0
        runs = {
            "parquet": ["pack", str(t / "ids.parquet"), *fields],
            "repack": ["pack", str(t / "first")],
        }
        if not a.labels:
            write_megatron(t / "ids.parquet", t / "ids")
            runs["megatron"] = ["pack", str(t / "ids"), "--pad-id", "0", "--vocab-size", "50257"]
        figures: dict[str, list[dict]] = {name: [] for name in runs}
        for _ in range(a.rounds):
            for name, args in runs.items():
                out = t / name
                args = [*args, "-L", str(a.to_len), "-o", str(out), "--overwrite", "--json"]
                figures[name].append(run(args, a.code))
        same = {name: shard_bytes(t / name) == shard_bytes(t / "parquet") for name in runs}
        print(
            f"{n:,} tokens of ids{' with labels' if a.labels else ''}, pack at "
            f"{a.from_len} ({size:.1f} MB, repack record {record_kb:.1f} kB) repacked at "
            f"{a.to_len}; {a.rounds} rounds, best and median; code {a.code}"
        )
        for name, rows in figures.items():
            wall = sorted(r["seconds"] for r in rows)
            cpu = sorted(r["cpu"] for r in rows)
            peak = max(r["peak_kb"] for r in rows) / 1024
            print(
                f"  {name:9s} wall {wall[0]:6.2f} s (median {wall[len(wall) // 2]:6.2f})  "
                f"cpu {cpu[0]:6.2f} s  {n / cpu[0] / 1e6:5.1f}M tokens/cpu-s  "
                f"peak {peak:,.0f} MB  same shards as parquet: {same[name]}"
            )


if __name__ == "__main__":
    main()
