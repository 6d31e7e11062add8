"""Shared fixtures. The whole suite runs offline: no hub, no dataset download."""

from __future__ import annotations

import os
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
# The parity gate's verdicts are cached per tokenizer file: in a folder of this run's own.
os.environ["PACKTOOL_CACHE_DIR"] = tempfile.mkdtemp(prefix="packtool-test-cache-")
# The suite's corpora are small: `auto` would take `tokenizers` for them (its small-corpus
# rule), and the tests of the fast backends' exactness would test it instead. Off here;
# tests/test_backends.py tests the rule itself.
os.environ["PACKTOOL_SMALL_CORPUS_BYTES"] = "0"

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from packtool.tokenize import SpecialTokens

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_data" / "corpus.jsonl"


class CharTokenizer:
    """A fake tokenizer: one token per character (id = code point + 3).

    Ids 0, 1, 2 are EOS, PAD and BOS. Decoding inverts encoding exactly, so tests can check
    round trips without a real vocabulary. ``bos_in_post_processor`` mimics a Llama-style
    post-processor that adds BOS when special tokens are on.
    """

    name = "char-fake"
    sha256 = "0" * 64

    def __init__(self, bos_in_post_processor: bool = False) -> None:
        self.special = SpecialTokens(eos_id=0, bos_id=2, pad_id=1)
        self.bos_in_post_processor = bos_in_post_processor

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = True, parse_special: bool = False
    ) -> list[list[int]]:
        prefix = [2] if (add_special_tokens and self.bos_in_post_processor) else []
        return [prefix + [ord(c) + 3 for c in t] for t in texts]

    def num_special_tokens_to_add(self) -> int:
        return 1 if self.bos_in_post_processor else 0

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i - 3) for i in ids if i >= 3 or (not skip_special_tokens and i >= 3))

    def token_to_id(self, token: str) -> int | None:
        return {"<eos>": 0, "<pad>": 1, "<bos>": 2}.get(token)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``stats``' length cache in a directory of this test process, never ~/.cache: the
    suite runs in parallel (pytest-xdist), and other runs share the home directory."""
    os.environ["PACKTOOL_CACHE_DIR"] = str(tmp_path_factory.mktemp("packtool-cache"))


@pytest.fixture
def char_tokenizer() -> CharTokenizer:
    return CharTokenizer()


def write_jsonl(path: Path, records: Sequence[object]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return path


@pytest.fixture
def docs_jsonl(tmp_path: Path) -> Path:
    """Documents of lengths 5, 9, 7 (+EOS each under the char tokenizer) and friends."""
    texts = ["aaaa", "bbbbbbbb", "cccccc", "d" * 30, "", "ee"]
    return write_jsonl(tmp_path / "docs.jsonl", [{"text": t, "id": i} for i, t in enumerate(texts)])
