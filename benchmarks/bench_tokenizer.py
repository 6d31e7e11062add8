"""A large byte-level BPE tokenizer for the backend benchmark, trained here, never downloaded.

    python benchmarks/bench_tokenizer.py            # builds (or reuses) the cached tokenizer

The layout of a published 151k-vocabulary byte-level BPE (Qwen 2): NFC normalizer, the regex
split pre-tokenizer (digits one by one), ``ByteLevel`` without its own regex, hundreds of
added tokens (special control tokens and non-special tool markers). The vocabulary is
trained with `tokenizers` on Python source files found on this machine (the interpreter's
standard library and site-packages) plus prose from ``sample_data/make_corpus.py``; it is
cached under ``benchmarks/data/`` (ignored by git), with the list of training files' total
size in ``training.json``.
"""

from __future__ import annotations

import json
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
VOCAB_SIZE = 151_000
_QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TRAIN_BYTES = 120 << 20


def python_sources(reverse: bool = False) -> Iterator[Path]:
    """The Python files of this interpreter's standard library and site-packages, in a fixed
    order (``reverse``: from the other end)."""
    seen: set[Path] = set()
    files: list[Path] = []
    for key in ("stdlib", "purelib", "platlib"):
        root = Path(sysconfig.get_paths()[key])
        if root in seen or not root.exists():
            continue
        seen.add(root)
        files.extend(sorted(root.rglob("*.py")))
    yield from reversed(files) if reverse else files


def _training_texts(info: dict) -> Iterator[str]:
    sys.path.insert(0, str(ROOT / "sample_data"))
    from make_corpus import generate_documents

    total = 0
    for doc in generate_documents(8000, seed=11):
        total += len(doc["text"])
        yield doc["text"]
    files = 0
    for path in python_sources():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        files += 1
        total += len(text)
        yield text
        if total >= _TRAIN_BYTES:
            break
    info.update(python_files=files, characters=total)


def build(directory: Path = DATA / "bpe151k") -> Path:
    """The tokenizer's directory (``tokenizer.json``, ``tokenizer_config.json``), built once."""
    if (directory / "tokenizer.json").exists():
        return directory
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    info: dict = {}
    t0 = time.perf_counter()
    tok.train_from_iterator(_training_texts(info), trainer=trainer)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    specials += [f"<|extra_{i}|>" for i in range(200)]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    plain = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"]
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in plain])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "bos_token": None}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    info.update(
        vocab_size=tok.get_vocab_size(), seconds=round(time.perf_counter() - t0, 1), split="qwen2"
    )
    (directory / "training.json").write_text(json.dumps(info, indent=1), encoding="utf-8")
    return directory


if __name__ == "__main__":
    where = build()
    print(where, (where / "training.json").read_text())
