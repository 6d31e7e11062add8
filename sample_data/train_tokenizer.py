"""Train the bundled default tokenizer (``packtool/_data/tokenizer.json``).

A byte-level BPE (vocab 8192, min_frequency 2) trained with the HF ``tokenizers``
library on ``sample_data/corpus.jsonl``.  Special tokens get ids 0..5::

    0 <|endoftext|>  (EOS)   1 <|pad|>   2 <|bos|>   3 <|im_start|>   4 <|im_end|>   5 <|sep|>

No post-processor adds tokens (no BOS by default).  Training runs single-threaded
(``RAYON_NUM_THREADS=1`` is set before ``tokenizers`` is imported) so the output
is byte-for-byte reproducible.

Usage::

    python sample_data/train_tokenizer.py [--corpus CORPUS.jsonl] [--out-dir OUT_DIR]
"""

from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"  # must precede the tokenizers import
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = ROOT / "sample_data" / "corpus.jsonl"
DEFAULT_OUT_DIR = ROOT / "packtool" / "_data"

VOCAB_SIZE = 8192
MIN_FREQUENCY = 2
SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|bos|>", "<|im_start|>", "<|im_end|>", "<|sep|>"]
TOKENIZER_CONFIG = {
    "eos_token": "<|endoftext|>",
    "pad_token": "<|pad|>",
    "bos_token": "<|bos|>",
    "model_max_length": 1000000,
}


def iter_texts(corpus: Path) -> Iterator[str]:
    with corpus.open(encoding="utf-8") as fh:
        for line in fh:
            text = json.loads(line)["text"]
            if text:
                yield text


def build_tokenizer(corpus: Path) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=MIN_FREQUENCY,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(iter_texts(corpus), trainer=trainer)
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    return tok


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    tok = build_tokenizer(args.corpus)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    tok_path = args.out_dir / "tokenizer.json"
    tok.save(str(tok_path), pretty=True)
    cfg_path = args.out_dir / "tokenizer_config.json"
    cfg_path.write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n", encoding="utf-8")
    digest = hashlib.sha256(tok_path.read_bytes()).hexdigest()
    print(
        f"wrote {tok_path} (vocab {tok.get_vocab_size()}, sha256 {digest}) and {cfg_path} "
        f"in {time.perf_counter() - t0:.2f}s"
    )


if __name__ == "__main__":
    main()
