"""Generate the bundled instruction-data samples (``chat.jsonl``, ``prompt_completion.jsonl``).

Both are synthetic, like ``corpus.jsonl``: the prose, code and lists come from the generators of
``make_corpus.py`` (handwritten word lists and a seeded ``numpy`` generator), the requests from
the handwritten patterns below, and the arithmetic answers are computed. No text is copied from
anywhere, and the output is byte-for-byte reproducible for a given ``(count, seed)``.

``chat.jsonl``: one conversation per line, ``{"id", "messages": [{"role", "content"}, ...]}``.
One to four user/assistant exchanges, a system message in about 40% of them, a tool exchange in
a few; assistant answers from a few words to a few thousand tokens (13 conversations are
longer than 2,048 tokens under the bundled tokenizer, so that ``--overflow`` has something to
do). Some contents start or end with spaces or newlines, and some hold non-ASCII text, to
exercise the boundaries.

``prompt_completion.jsonl``: ``{"id", "prompt", "completion"}`` per line: questions with computed
answers, summaries, continuations and code requests.

Usage (from the repository root)::

    python sample_data/make_instruct.py          # writes sample_data/chat.jsonl and
                                                 # sample_data/prompt_completion.jsonl
    python sample_data/make_instruct.py --count 5000 --seed 3 --out-dir /tmp/instruct
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_corpus import _Builder

DEFAULT_COUNT = 300
DEFAULT_SEED = 20240607
DEFAULT_OUT_DIR = Path(__file__).resolve().parent

_SYSTEM = (
    "You are a helpful assistant. Answer briefly.",
    "You are a careful assistant who explains each step.",
    "You answer in plain language, without lists unless asked.",
    "You are a patient teacher. Keep answers short and clear.",
    "Reply as a friendly guide to the {place}.",
    "You write python code with docstrings and no external libraries.",
)
_ASKS = (
    "Tell me about the {thing}.",
    "Write a short note about the {thing}.",
    "Can you describe the {thing} in a few sentences?",
    "What do people say about the {thing}?",
    "Explain the {thing} to a child.",
    "Describe a day near the {place}.",
)
_FOLLOW_UPS = (
    "Can you say more?",
    "Shorter, please.",
    "And what about the {thing}?",
    "Thanks. Now give me a list.",
    "Why?",
    "Make it more formal.",
)
_LIST_HEADS = ("Here is a list:", "Sure:", "Some points:", "In short:")


class _Maker:
    def __init__(self, seed: int) -> None:
        ss = np.random.SeedSequence(seed)
        r_builder, r_here = (np.random.default_rng(s) for s in ss.spawn(2))
        self.b = _Builder(int(r_builder.integers(2**63)))
        self.rng = r_here

    # -- small helpers -------------------------------------------------------------------
    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def pick(self, seq: tuple[str, ...] | list[str]) -> str:
        return seq[int(self.rng.integers(len(seq)))]

    def phrase(self, n: int = 2) -> str:
        return self.b.prose.phrase(n).lower()

    def fill(self, pattern: str) -> str:
        return pattern.format(thing=self.phrase(int(self.rng.integers(1, 4))), place=self.phrase(1))

    def answer_chars(self) -> float:
        """Length of an answer in characters: lognormal, a few very long."""
        if self.chance(0.02):
            return float(self.rng.uniform(9_000, 16_000))
        return float(np.clip(np.exp(self.rng.normal(np.log(500), 0.9)), 12, 6_000))

    def answer(self, chars: float) -> str:
        r = self.rng.random()
        if r < 0.55:
            text = self.b.web(chars)
        elif r < 0.7:
            text = f"{self.pick(_LIST_HEADS)}\n\n{self.b._block()}"
        elif r < 0.8:
            text = self.b.news(chars)
        elif r < 0.9:
            text = "```python\n" + self.b.code.file(chars) + "```"
        else:
            text = self.b.multilingual(chars)
        # Some answers start or end with whitespace: boundaries must survive it.
        if self.chance(0.08):
            text = self.pick(("  ", "\n", " ")) + text
        if self.chance(0.08):
            text += self.pick(("\n", "\n\n", " "))
        return text

    def arithmetic(self) -> tuple[str, str]:
        a, b = (int(x) for x in self.rng.integers(2, 999, size=2))
        op = self.pick(("+", "-", "*"))
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        return f"What is {a} {op} {b}?", f"{a} {op} {b} = {value}."

    # -- chats ---------------------------------------------------------------------------
    def chat(self, i: int) -> dict:
        messages = []
        if self.chance(0.4):
            messages.append({"role": "system", "content": self.fill(self.pick(_SYSTEM))})
        if self.chance(0.04):
            return {"id": i, "messages": [*messages, *self.tool_exchange()]}
        for turn in range(int(self.rng.integers(1, 5))):
            if self.chance(0.2):
                question, reply = self.arithmetic()
            else:
                ask = self.fill(self.pick(_ASKS if turn == 0 else _FOLLOW_UPS))
                if self.chance(0.15):
                    ask = f"{ask}\n\n{self.b.multilingual(200.0)}"
                question, reply = ask, self.answer(self.answer_chars())
            messages.append({"role": "user", "content": question})
            messages.append({"role": "assistant", "content": reply})
        return {"id": i, "messages": messages}

    def tool_exchange(self) -> list[dict]:
        thing = self.phrase(2)
        return [
            {"role": "user", "content": f"Look up the latest figures for the {thing}."},
            {"role": "assistant", "content": f'lookup("{thing}")'},
            {"role": "tool", "content": self.b._block()},
            {"role": "assistant", "content": self.b.web(300.0)},
        ]

    # -- prompt / completion -------------------------------------------------------------
    def prompt_completion(self, i: int) -> dict:
        r = self.rng.random()
        if r < 0.25:
            question, reply = self.arithmetic()
            prompt, completion = f"Question: {question}\nAnswer:", f" {reply}"
        elif r < 0.5:
            text = self.b.web(float(self.rng.uniform(300, 2_500)))
            prompt = f"Summarize the text below.\n\n{text}\n\nSummary:"
            completion = " " + self.b.web(float(self.rng.uniform(60, 400)))
        elif r < 0.75:
            start = self.b.web(float(self.rng.uniform(100, 600)))
            prompt = f"Continue the story.\n\n{start}"
            completion = " " + self.b.web(self.answer_chars())
        elif r < 0.9:
            prompt = f"Write a python module about the {self.phrase(2)}.\n"
            completion = self.b.code.file(self.answer_chars())
        else:
            prompt = f"{self.fill(self.pick(_ASKS))}\n"
            completion = self.answer(self.answer_chars())
        return {"id": i, "prompt": prompt, "completion": completion}


def generate(count: int, seed: int) -> tuple[list[dict], list[dict]]:
    """``count`` conversations and ``count`` prompt/completion pairs, deterministically."""
    maker = _Maker(seed)
    chats = [maker.chat(i) for i in range(count)]
    pairs = [maker.prompt_completion(i) for i in range(count)]
    return chats, pairs


def _write(records: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    path.write_bytes(data.encode("utf-8"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=DEFAULT_COUNT)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    args = ap.parse_args(argv)
    chats, pairs = generate(args.count, args.seed)
    _write(chats, args.out_dir / "chat.jsonl")
    _write(pairs, args.out_dir / "prompt_completion.jsonl")
    print(f"wrote {len(chats)} conversations and {len(pairs)} pairs to {args.out_dir}")


if __name__ == "__main__":
    main()
