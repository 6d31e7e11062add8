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


def documentation_texts() -> Iterator[str]:
    """Real prose found on this machine, in a fixed order: the Markdown/reST documents and
    package descriptions (METADATA) of site-packages, then the Debian changelogs of
    /usr/share/doc. English written by people (with some code and markup), unlike the
    generated corpora's small vocabulary; what it holds depends on what is installed."""
    import gzip

    roots = {Path(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")}
    files: list[Path] = []
    for root in sorted(roots):
        for path in sorted(root.rglob("*")):
            if path.suffix in (".md", ".rst") or path.name == "METADATA":
                files.append(path)
    files.extend(sorted(Path("/usr/share/doc").glob("*/changelog*")))
    for path in files:
        try:
            data = path.read_bytes()
            if path.suffix == ".gz":
                data = gzip.decompress(data)
            text = data.decode("utf-8")
        except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile):
            continue
        if len(text) >= 2000:
            yield text


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


METASPACE_VOCAB = 32_000
_BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
_METASPACE_TRAIN_CHARS = 40_000_000


def _prose(chars: int, seed: int) -> Iterator[str]:
    """Documents of the benchmark's prose (wiki, web, news of ``make_corpus``), 50-120 KB."""
    sys.path.insert(0, str(ROOT / "sample_data"))
    from make_corpus import _Builder

    builder, total, n = _Builder(seed), 0, 0
    kinds = ("wiki", "web", "news")
    while total < chars:
        text = builder.build[kinds[n % 3]](50_000 + builder.u.randint(0, 70_000))
        total, n = total + len(text), n + 1
        yield text


def _metaspace_texts() -> Iterator[str]:
    """The prose, and the sample corpus (code, markup, many scripts): every printable ASCII
    character is in the alphabet, as in Llama 2's, so that ``<s>`` spelled in text is built
    by merges. (Without ``<`` in the alphabet, fastokens 0.3.5 encodes the text ``</s>``
    as the vocabulary's ``</s>``, where `tokenizers` falls back to bytes: the parity gate
    refuses it.)"""
    yield from _prose(_METASPACE_TRAIN_CHARS, seed=101)
    with open(ROOT / "sample_data" / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def build_metaspace(directory: Path = DATA / "metaspace32k") -> Path:
    """A Llama 2 / Mistral style BPE, built once: ``▁`` word marks (the normalizer prepends
    one and turns spaces into them; no pre-tokenizer, so the BPE runs over whole documents),
    byte fallback (``<0x00>``..``<0xFF>`` in the vocabulary), ``<unk>``/``<s>``/``</s>``,
    a ``<s>`` post-processor; 32,000 tokens trained on 40M characters of the benchmark's
    generated prose (another seed than its corpora) and the sample corpus. fastokens 0.3
    loads this layout; it does not load the ``Metaspace`` pre-tokenizer that newer
    conversions use."""
    if (directory / "tokenizer.json").exists():
        return directory
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")  # training only
    specials = ["<unk>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(
        vocab_size=METASPACE_VOCAB,
        min_frequency=2,
        special_tokens=[*specials, *_BYTE_TOKENS],  # ids 3..258 for the bytes, as in Llama 2
        limit_alphabet=1000,
        show_progress=False,
    )
    t0 = time.perf_counter()
    tok.train_from_iterator(_metaspace_texts(), trainer=trainer)
    data = json.loads(tok.to_str())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] in specials]
    tok = Tokenizer.from_str(json.dumps(data, ensure_ascii=False))
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0",
        pair="<s>:0 $A:0 <s>:1 $B:1",
        special_tokens=[("<s>", tok.token_to_id("<s>"))],
    )
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    info = {
        "vocab_size": tok.get_vocab_size(),
        "characters": _METASPACE_TRAIN_CHARS,
        "seconds": round(time.perf_counter() - t0, 1),
        "layout": "llama2 (Prepend + Replace normalizer, byte fallback)",
    }
    (directory / "training.json").write_text(json.dumps(info, indent=1), encoding="utf-8")
    return directory


WORDPIECE_VOCAB = 30_522
_WORDPIECE_TRAIN_BYTES = 40 << 20


def build_wordpiece(directory: Path = DATA / "wordpiece30k") -> Path:
    """A BERT-style WordPiece (uncased: NFD, lower case, accents stripped; whitespace and
    punctuation split; ``##`` continuations; ``[CLS] $A [SEP]``), 30,522 tokens trained on
    40 MB of this machine's Python sources, built once. fastokens does not load WordPiece,
    so packtool encodes it with Hugging Face `tokenizers`: the benchmark of the HF path."""
    if (directory / "tokenizer.json").exists():
        return directory
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=WORDPIECE_VOCAB, special_tokens=specials, show_progress=False
    )

    def texts() -> Iterator[str]:
        size = 0
        for source in python_sources():
            try:
                text = source.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            size += len(text)
            yield text
            if size >= _WORDPIECE_TRAIN_BYTES:
                return

    t0 = time.perf_counter()
    tok.train_from_iterator(texts(), trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "eos_token": "[SEP]",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    info = {
        "vocab_size": tok.get_vocab_size(),
        "bytes": _WORDPIECE_TRAIN_BYTES,
        "seconds": round(time.perf_counter() - t0, 1),
        "layout": "bert-base-uncased",
    }
    (directory / "training.json").write_text(json.dumps(info, indent=1), encoding="utf-8")
    return directory


if __name__ == "__main__":
    for where in (build(), build_metaspace(), build_wordpiece()):
        print(where, (where / "training.json").read_text())
