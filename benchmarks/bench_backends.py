"""The tokenizer backends side by side, in one run: wall time, tokens/s and peak RSS.

    python benchmarks/bench_backends.py             # ~15 minutes on 2 cores
    python benchmarks/bench_backends.py --quick     # smaller corpora, one round, no TRL

Each measurement is a fresh process (its peak RSS is its own ``VmHWM``), on a generated
corpus (``sample_data/make_corpus.py``) with a 151k byte-level BPE trained locally
(``bench_tokenizer.py``, cached in ``benchmarks/data/``):

- ``hf alone``: `tokenizers` loads the file, pyarrow reads the corpus, ``encode_batch_fast``
  (all cores) encodes it in batches of 4 Mi characters: load + read + tokenize, timed inside
  the process;
- ``fastokens alone``: the same with fastokens' ``encode_batch_flat``;
- ``pack hf`` / ``pack fastokens``: ``packtool pack --tokenizer-backend ...`` end to end, the
  whole process's wall time (interpreter start, imports, parity gate, writing, checksums);
- ``TRL``: ``datasets.load_dataset("json")`` + ``map`` with a ``PreTrainedTokenizerFast``
  (batched) + ``trl.pack_dataset(strategy="bfd")``, as TRL's SFT recipe does; tokens/s over
  the tokens it tokenized (its bfd then truncates each document to ``max_len``).

Corpora: ``long`` (documents of 50-120 KB: wiki, web and news prose), ``short`` (the sample
corpus's mix, median ~1.2 KB), ``long code`` (Python sources of this machine joined into
documents of 50-120 KB, read in the reverse order of the tokenizer's training files, so
mostly files it was not trained on: a large vocabulary, where `tokenizers` is slower than
on the generated prose), ``long x4`` (for the memory at four times the size), and
``one huge`` (a single document of about 100 MB). The runs of one corpus alternate in rounds;
the table gives the median and the range of each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "sample_data"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_tokenizer import build  # noqa: E402

_PEAK = r"""
def _peak():
    with open("/proc/self/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("VmHWM:"))) * 1024
"""

ALONE = (
    _PEAK
    + r"""
import json, sys, time
t0 = time.perf_counter()
import pyarrow.json as pj
backend, tok_file, corpus = sys.argv[1:4]
if backend == "hf":
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tok_file)
    tok.encode_special_tokens = True
else:
    import fastokens
    tok = fastokens.Tokenizer.from_file(tok_file)
tok.no_truncation(); tok.no_padding()
loaded = time.perf_counter()
opts = pj.ReadOptions(block_size=256 << 20)
texts = pj.read_json(corpus, read_options=opts).column("text").to_pylist()
read = time.perf_counter()
n, batch, size = 0, [], 0
def encode(batch):
    if backend == "hf":
        return sum(len(e) for e in tok.encode_batch_fast(batch, add_special_tokens=False))
    ids, _ = tok.encode_batch_flat(batch, add_special_tokens=False, split_special_tokens=True)
    return len(ids) // 4
for t in texts:
    batch.append(t); size += len(t)
    if size >= 4 << 20:
        n += encode(batch); batch, size = [], 0
if batch:
    n += encode(batch)
done = time.perf_counter()
print(json.dumps({"seconds": done - t0, "load": loaded - t0, "read": read - loaded,
                  "tokenize": done - read, "tokens": n, "rss": _peak()}))
"""
)

PACK = (
    _PEAK
    + r"""
import json, sys
from packtool.cli import app
try:
    app(args=sys.argv[1:], prog_name="packtool", standalone_mode=False)
finally:
    print("PEAK=" + str(_peak()), file=sys.stderr)
"""
)

TRL = (
    _PEAK
    + r"""
import json, os, sys, time
t0 = time.perf_counter()
import datasets
from transformers import PreTrainedTokenizerFast
from trl import pack_dataset
tok_file, corpus, cache, max_len = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
datasets.disable_progress_bars()
tok = PreTrainedTokenizerFast(tokenizer_file=tok_file)
ds = datasets.load_dataset("json", data_files=corpus, split="train", cache_dir=cache)
def tokenize(batch):
    ids = tok(batch["text"], add_special_tokens=False)["input_ids"]
    return {"input_ids": [x + [tok.convert_tokens_to_ids("<|endoftext|>")] for x in ids]}
ds = ds.map(tokenize, batched=True, remove_columns=ds.column_names)
import pyarrow.compute as pc
tokenized = int(pc.sum(pc.list_value_length(ds.data.column("input_ids"))).as_py())
packed = pack_dataset(ds, max_len, strategy="bfd")
tokens = sum(sum(r) for r in packed.with_format("arrow")["seq_lengths"].to_pylist())
print(json.dumps({"seconds": time.perf_counter() - t0, "rows": len(packed), "kept": tokens,
                  "tokens": tokenized, "rss": _peak()}))
"""
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="true")
    return env


def _python(script: str, *args: str) -> tuple[str, str, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, env=_env()
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{args} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout, proc.stderr, wall


def alone(backend: str, tok: Path, corpus: Path) -> dict:
    out, _, _ = _python(ALONE, backend, str(tok / "tokenizer.json"), str(corpus))
    return json.loads(out)


def pack(backend: str, tok: Path, corpus: Path, out: Path) -> dict:
    args = ["pack", str(corpus), "-L", "4096", "-o", str(out), "--overwrite", "--json"]
    stdout, stderr, wall = _python(
        PACK, *args, "--tokenizer", str(tok), "--tokenizer-backend", backend
    )
    report = json.loads(stdout)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tokenizer"]["backend"]["name"] == backend, manifest["tokenizer"]
    rss = int(stderr.rsplit("PEAK=", 1)[1].split()[0])
    return {"seconds": wall, "tokens": report["tokens"]["packed"], "rss": rss}


def trl(tok: Path, corpus: Path, cache: Path) -> dict:
    out, _, wall = _python(TRL, str(tok / "tokenizer.json"), str(corpus), str(cache), "4096")
    result = json.loads(out)
    result["seconds"] = wall
    return result


def write_corpus(path: Path, kind: str, megabytes: float, seed: int) -> tuple[int, int]:
    """A JSON Lines corpus of about ``megabytes``; (bytes, documents)."""
    from make_corpus import _Builder, generate_documents

    target, size, docs = int(megabytes * 1e6), 0, 0
    with open(path, "w", encoding="utf-8") as f:
        if kind == "code":  # Python sources found here, joined into 50-120 KB documents
            from bench_tokenizer import python_sources

            builder, text = _Builder(seed), ""
            for source in python_sources(reverse=True):
                try:
                    text += source.read_text(encoding="utf-8") + "\n"
                except (OSError, UnicodeDecodeError):
                    continue
                if len(text) >= 50_000 + builder.u.randint(0, 70_000):
                    line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
                    f.write(line)
                    size, docs, text = size + len(line.encode()), docs + 1, ""
                    if size >= target:
                        break
        elif kind == "short":
            while size < target:
                for doc in generate_documents(2500, seed + docs):
                    line = json.dumps({"text": doc["text"]}, ensure_ascii=False) + "\n"
                    f.write(line)
                    size += len(line.encode())
                    docs += 1
                    if size >= target:
                        break
        else:
            builder = _Builder(seed)
            kinds = ("wiki", "web", "news")
            while size < target:
                chars = target if kind == "huge" else 50_000 + builder.u.randint(0, 70_000)
                text = builder.build[kinds[docs % 3]](chars)
                line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
                f.write(line)
                size += len(line.encode())
                docs += 1
    return size, docs


def _fmt(values: list[float], spec: str) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return format(med, spec)
    return f"{format(med, spec)} ({format(min(values), spec)}-{format(max(values), spec)})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--only", nargs="*", help="corpora to run (long short long-x4 huge)")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    mb = 3 if args.quick else 30
    tok = build()
    corpora = [("long", "long", mb, 3), ("short", "short", mb, 1), ("long code", "code", mb, 9)]
    corpora += [
        ("long x4", "long", 4 * mb, 5),
        ("one huge", "huge", 100 if not args.quick else 10, 7),
    ]
    if args.only:
        corpora = [c for c in corpora if c[0].replace(" ", "-") in args.only]
    print(
        f"tokenizer backends: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}; tokenizer "
        f"{json.loads((tok / 'training.json').read_text())['vocab_size']:,}-token byte-level BPE"
    )
    header = f"{'corpus':<10} {'run':<16} {'seconds':>22} {'tokens/s':>28} {'peak RSS MB':>18}"
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory(prefix="packtool-bench-backends-") as tmp:
        tmpdir = Path(tmp)
        for name, kind, size_mb, seed in corpora:
            corpus = tmpdir / f"{kind}-{size_mb}.jsonl"
            nbytes, ndocs = write_corpus(corpus, kind, size_mb, seed)
            runs: dict[str, list[dict]] = {}
            out = tmpdir / "o"
            measures = [
                ("hf alone", lambda c=corpus: alone("hf", tok, c)),
                ("fastokens alone", lambda c=corpus: alone("fastokens", tok, c)),
                ("pack hf", lambda c=corpus, o=out: pack("hf", tok, c, o)),
                ("pack fastokens", lambda c=corpus, o=out: pack("fastokens", tok, c, o)),
            ]
            if kind == "huge" or name == "long x4":  # memory: the fast path only
                measures = [m for m in measures if "fastokens" in m[0]]
            for _ in range(rounds):
                for label, fn in measures:
                    runs.setdefault(label, []).append(fn())
            if not args.quick and not args.no_trl and name in ("long", "short", "long code"):
                runs["TRL map+pack"] = [trl(tok, corpus, tmpdir / "hf-cache")]
                kept = runs["TRL map+pack"][0]["kept"]
            tokens = runs[measures[0][0]][0]["tokens"]
            print(f"{name:<10} {nbytes / 1e6:.1f} MB, {ndocs:,} documents, {tokens:,} tokens")
            for label, results in runs.items():
                secs = [r["seconds"] for r in results]
                tps = [r["tokens"] / r["seconds"] for r in results]
                rss = [r["rss"] / 1e6 for r in results]
                print(
                    f"{'':<10} {label:<16} {_fmt(secs, '.2f'):>22} {_fmt(tps, ',.0f'):>28} "
                    f"{_fmt(rss, ',.0f'):>18}"
                )
            if "TRL map+pack" in runs:
                print(f"{'':<10} TRL's bfd keeps {kept:,} of the tokens (it truncates documents)")
            med = {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()}
            if "pack fastokens" in med and "fastokens alone" in med:
                print(
                    f"{'':<10} pack fastokens / fastokens alone speed: "
                    f"{med['fastokens alone'] / med['pack fastokens']:.0%}"
                    + (
                        "; pack fastokens vs hf alone: "
                        f"{med['hf alone'] / med['pack fastokens']:.1f}x"
                        f"; vs pack hf: {med['pack hf'] / med['pack fastokens']:.1f}x"
                        if "hf alone" in med
                        else ""
                    )
                )
            sys.stdout.flush()


if __name__ == "__main__":
    main()
