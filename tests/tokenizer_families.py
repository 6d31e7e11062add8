"""Small, locally trained tokenizers of every real-world tokenizer family, for tests.

Nothing is downloaded: each family is trained in-process on the first documents of
``sample_data/corpus.jsonl`` plus a few extra strings (several scripts, digits, whitespace runs,
HTML-ish markup), and mirrors the *pipeline* of a well-known model (normalizer, pre-tokenizer,
model options, post-processor, decoder, added tokens, ``tokenizer_config.json``) as closely as
the ``tokenizers`` API allows. Vocabularies are tiny, so ids are meaningless, but every trap of
the real family is there (BOS added by the post-processor, EOS added by the post-processor,
byte fallback, text-changing normalizers, lossy pre-tokenizers, non-special added tokens, a
non-special token spelled ``<s>``, ...).

API::

    FAMILIES                      # names, the keys of the tables below
    build_family(name, directory, truncation_padding=False) -> directory
    SPECIAL_STRINGS[name]         # the special added-token strings of the family
    CHAT_FAMILIES                 # families whose tokenizer_config.json has a chat_template
    hard_texts()                  # documents exercising the traps

Training happens once per family and process (``functools.lru_cache``); ``build_family`` then
only writes files, so tests can call it freely.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

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

__all__ = [
    "CHAT_FAMILIES",
    "CHAT_TEMPLATE_FAMILIES",
    "FALLBACK_CJK",
    "FALLBACK_EMOJI",
    "FAMILIES",
    "SPECIAL_STRINGS",
    "TEMPLATES",
    "build_chat_family",
    "build_family",
    "hard_texts",
]

_CORPUS = Path(__file__).resolve().parent.parent / "sample_data" / "corpus.jsonl"
_N_DOCS = 200  # documents of the sample corpus used for training
_DOC_CHARS = 4000  # each is cut to this many characters, to keep training fast
_MAX_LEN = 16  # truncation / padding length of the ``truncation_padding`` variants

# Characters that the byte-fallback families must never see during training, so that encoding
# them really goes through the <0xNN> byte tokens. hard_texts() uses them.
FALLBACK_EMOJI = "🦜"
FALLBACK_CJK = "龘"

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]

_LLAMA3_SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|reserved_special_token_2|>",
    "<|eot_id|>",
    "<|reserved_special_token_3|>",
    "<|reserved_special_token_4|>",
)
_QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_QWEN_NON_SPECIAL = ("<tool_call>", "</tool_call>")
_GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>")
_GEMMA_NON_SPECIAL = tuple(f"<unused{i}>" for i in range(10))

SPECIAL_STRINGS: dict[str, tuple[str, ...]] = {
    "gpt2": ("<|endoftext|>",),
    "llama3": _LLAMA3_SPECIALS,
    "qwen": _QWEN_SPECIALS,
    "llama2": ("<unk>", "<s>", "</s>"),
    "mistral_metaspace": ("<unk>", "<s>", "</s>"),
    "gemma": _GEMMA_SPECIALS,
    "t5": ("<pad>", "</s>", "<unk>"),
    "bert": ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
    "nfkc_lower": ("<|endoftext|>",),
}
"""Special added tokens (``special=True``) of each family, e.g. for injection tests."""

FAMILIES: tuple[str, ...] = tuple(SPECIAL_STRINGS)
CHAT_FAMILIES: tuple[str, ...] = ("qwen", "llama3")

LLAMA3_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# --------------------------------------------------------------------------- training corpus


def _extra_texts() -> list[str]:
    """Strings added to the sample corpus so every family sees scripts, digits and whitespace."""
    scripts = [
        "Hello world! The quick brown fox jumps over the lazy dog.",
        "Ünïcödé àccents: café, naïve, façade, Ångström, Øresund, São Paulo, Kraków.",
        "中文测试：我们明天去公园散步吧。日本語のテキストです。한국어 문장입니다.",
        "العربية لغة جميلة، ومكتوبة من اليمين إلى اليسار.",
        "हिन्दी एक भाषा है। संस्कृत और नेपाली भी देवनागरी में लिखी जाती हैं।",
        "Русский текст: съешь же ещё этих мягких французских булок.",
        "Ελληνικά: Γειά σου Κόσμε. עברית: שלום עולם.",
        "Numbers: 0 1 2 3 42 256 1024 65536 3.14159 2,718,281 -17 1e-9 ０１２３ ①②③ ＡＢＣ",
        "Whitespace:  two   three    four\ttab\t\ttabs\n\nnewlines\r\nCRLF   trailing   ",
        "    indented code\n        deeper\n\tdef f(x):\n\t\treturn x  # comment\n",
        "Emoji 😀 🎉 🌍 🚀 👍 ❤️ and symbols © ® ™ € £ ¥ § ¶ → ← ≤ ≥ ∞",
        "Contractions: it's, don't, they're, we've, I'm, you'll, he'd, IT'S, DON'T.",
    ]
    # HTML-ish markup with literal "<s>" / "</s>" (strikethrough), so "<s>", "</", "s>"
    # are frequent in training text.
    markup = [
        f"<p>Item {i}: <s>old price {i * 3}</s> new price {i * 2}</p>\n<div><s>x</s></div>"
        for i in range(60)
    ]
    return scripts * 5 + markup


@functools.lru_cache(maxsize=1)
def _training_texts() -> tuple[str, ...]:
    texts: list[str] = []
    with open(_CORPUS, encoding="utf-8") as f:
        for line in itertools.islice(f, _N_DOCS):
            texts.append(json.loads(line)["text"][:_DOC_CHARS])
    texts.extend(_extra_texts())
    # The byte-fallback families must not learn these characters.
    return tuple(t.replace(FALLBACK_EMOJI, "").replace(FALLBACK_CJK, "") for t in texts)


def _train(tok: Tokenizer, trainer: Any) -> None:
    tok.train_from_iterator(list(_training_texts()), trainer=trainer)


# --------------------------------------------------------------------------- helpers


def _json(tok: Tokenizer) -> dict[str, Any]:
    return json.loads(tok.to_str())


def _from_json(data: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False))


def _byte_level_trainer(vocab_size: int = 1500) -> trainers.BpeTrainer:
    return trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )


def _byte_fallback_trainer(specials: list[str]) -> trainers.BpeTrainer:
    # The byte tokens are passed as "special tokens" only to reserve their ids in the vocab;
    # _drop_added() removes them from the added tokens afterwards (as in Llama / Gemma, where
    # <0x00>..<0xFF> are plain vocabulary entries).
    return trainers.BpeTrainer(
        vocab_size=1500,
        min_frequency=2,
        special_tokens=[*specials, *_BYTE_TOKENS],
        show_progress=False,
    )


def _drop_added(tok: Tokenizer, contents: list[str]) -> Tokenizer:
    data = _json(tok)
    drop = set(contents)
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] not in drop]
    return _from_json(data)


def _add_bpe_word(data: dict[str, Any], word: str) -> None:
    """Add ``word`` to a BPE model as an ordinary token, with the merges that build it."""
    model = data["model"]
    vocab: dict[str, int] = model["vocab"]
    for end in range(2, len(word) + 1):
        piece = word[:end]
        if piece not in vocab:
            vocab[piece] = max(vocab.values()) + 1
            model["merges"].append([word[: end - 1], word[end - 1]])


def _added(content: str, *, special: bool) -> AddedToken:
    return AddedToken(content, special=special, normalized=not special)


def _config(**entries: Any) -> dict[str, Any]:
    # "tokenizer_class": plain PreTrainedTokenizerFast (TokenizersBackend in transformers 5),
    # which loads tokenizer.json as is. A family class (LlamaTokenizer, GemmaTokenizer, ...)
    # would rebuild the pipeline from vocab + merges with its own normalizer / pre-tokenizer.
    base: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1_000_000,
        "clean_up_tokenization_spaces": False,
    }
    base.update(entries)
    return base


# --------------------------------------------------------------------------- families


def _gpt2(*, nfkc_lower: bool = False) -> tuple[Tokenizer, dict[str, Any]]:
    tok = Tokenizer(models.BPE())
    if nfkc_lower:
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    _train(tok, _byte_level_trainer())
    data = _json(tok)
    # The GPT-2 regex splits "<s>" into "<", "s", ">", so BPE training can never learn "<s>"
    # however often it occurs. Put "<s>" and "</s>" into the vocab as ordinary tokens (with the
    # merges that spell them): they cannot come out of encoding text, but a packer that looks up
    # vocab["<s>"] to find "the BOS token" falls into the trap. Neither is an added token.
    _add_bpe_word(data, "<s>")
    _add_bpe_word(data, "</s>")
    tok = _from_json(data)
    tok.add_special_tokens([_added("<|endoftext|>", special=True)])
    eot = "<|endoftext|>"
    return tok, _config(bos_token=eot, eos_token=eot, unk_token=eot)


def _llama3() -> tuple[Tokenizer, dict[str, Any]]:
    try:
        model = models.BPE(ignore_merges=True)
    except TypeError:  # tokenizers < 0.19
        model = models.BPE()
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    _train(tok, _byte_level_trainer())
    tok.add_special_tokens([_added(t, special=True) for t in _LLAMA3_SPECIALS])
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos}:0 $A:0",
                pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                special_tokens=[(bos, tok.token_to_id(bos))],
            ),
        ]
    )
    return tok, _config(
        bos_token=bos, eos_token="<|end_of_text|>", chat_template=LLAMA3_CHAT_TEMPLATE
    )


def _qwen() -> tuple[Tokenizer, dict[str, Any]]:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    _train(tok, _byte_level_trainer())
    tok.add_special_tokens([_added(t, special=True) for t in _QWEN_SPECIALS])
    # As in Qwen2.5: added, but not special (normalized=False, special=False).
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in _QWEN_NON_SPECIAL])
    return tok, _config(
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
    )


def _sentencepiece_bpe(*, metaspace: bool) -> tuple[Tokenizer, dict[str, Any]]:
    """Llama 2 (``metaspace=False``) or the Metaspace layout (``metaspace=True``)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    specials = ["<unk>", "<s>", "</s>"]
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="always", split=True
        )
    else:
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
        )
        # Training only: SentencePiece-like pieces ("▁word"), and fast training.
        tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    _train(tok, _byte_fallback_trainer(specials))
    tok = _drop_added(tok, _BYTE_TOKENS)
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="first", split=False
        )
        # A bare Metaspace decoder leaves byte-fallback pieces as "<0xF0>..." text; put
        # ByteFallback in front so decode() round-trips.
        tok.decoder = decoders.Sequence(
            [
                decoders.ByteFallback(),
                decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False),
            ]
        )
    else:
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
    return tok, _config(
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        add_bos_token=True,
        add_eos_token=False,
    )


def _gemma() -> tuple[Tokenizer, dict[str, Any]]:
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")  # training only
    _train(tok, _byte_fallback_trainer(list(_GEMMA_SPECIALS)))
    tok = _drop_added(tok, _BYTE_TOKENS)
    # As Gemma's tokenizer.json (and transformers' GemmaTokenizer): split on " " after a
    # normalizer that has already replaced every " " by "▁", i.e. effectively no split.
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok.add_tokens([_added(t, special=False) for t in _GEMMA_NON_SPECIAL])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos>:0 $A:0",
        pair="<bos>:0 $A:0 <bos>:1 $B:1",
        special_tokens=[("<bos>", tok.token_to_id("<bos>"))],
    )
    return tok, _config(
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        add_bos_token=True,
        add_eos_token=False,
    )


def _t5() -> tuple[Tokenizer, dict[str, Any]]:
    specials = ["<pad>", "</s>", "<unk>"]
    tok = Tokenizer(models.Unigram())
    # Real T5 has Precompiled (an NFKC-like charsmap) then this Replace.
    tok.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")]
    )
    # As in T5's tokenizer.json: WhitespaceSplit drops tabs and newlines (a lossy family).
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
        ]
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.UnigramTrainer(
        vocab_size=1500, special_tokens=specials, unk_token="<unk>", show_progress=False
    )
    _train(tok, trainer)
    # UnigramTrainer picks a reproducible set of pieces, but its EM scores (and so the piece
    # order) vary from process to process (Rust hash-map order changes float sums). Keep the
    # pieces and re-score them deterministically: log relative frequency of each piece as an
    # (overlapping) substring of the pre-tokenized training words.
    pieces = [p for p, _ in _json(tok)["model"]["vocab"] if p not in specials]
    assert tok.normalizer is not None and tok.pre_tokenizer is not None
    words = Counter(
        word
        for text in _training_texts()
        for word, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text))
    )
    counts = dict.fromkeys(pieces, 0)
    longest = max(map(len, pieces))
    for word, n in words.items():
        for i in range(len(word)):
            for j in range(i + 1, min(len(word), i + longest) + 1):
                if word[i:j] in counts:
                    counts[word[i:j]] += n
    total = sum(counts.values())
    costs = sorted((round(-math.log((c + 1) / total), 6), p) for p, c in counts.items())
    vocab = [(s, 0.0) for s in specials] + [(p, -cost) for cost, p in costs]
    tok.model = models.Unigram(vocab, unk_id=specials.index("<unk>"), byte_fallback=False)
    tok.post_processor = processors.TemplateProcessing(
        single="$A:0 </s>:0",
        pair="$A:0 </s>:0 $B:1 </s>:1",
        special_tokens=[("</s>", tok.token_to_id("</s>"))],
    )
    return tok, _config(eos_token="</s>", pad_token="<pad>", unk_token="<unk>")


def _bert() -> tuple[Tokenizer, dict[str, Any]]:
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    # WordPieceTrainer is not reproducible across processes (the ids of its "##" pieces follow
    # Rust hash-map order, which changes tie-breaks), so train a plain character BPE (which is)
    # on the same normalized, pre-tokenized text and offer every learned piece both word-initial
    # and as a "##" continuation. WordPiece only needs the set of pieces.
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    bpe.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=1200, min_frequency=2, special_tokens=specials, show_progress=False
    )
    _train(bpe, trainer)
    learned = sorted(bpe.get_vocab().items(), key=lambda kv: kv[1])
    pieces = [p for p, _ in learned if p not in specials]
    ordered = specials + pieces + [f"##{p}" for p in pieces]
    vocab = {p: i for i, p in enumerate(ordered)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = bpe.normalizer
    tok.pre_tokenizer = bpe.pre_tokenizer
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens([_added(t, special=True) for t in specials])
    cls_id, sep_id = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return tok, _config(
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        unk_token="[UNK]",
        mask_token="[MASK]",
        do_lower_case=True,
    )


_BUILDERS: dict[str, Callable[[], tuple[Tokenizer, dict[str, Any]]]] = {
    "gpt2": _gpt2,
    "llama3": _llama3,
    "qwen": _qwen,
    "llama2": lambda: _sentencepiece_bpe(metaspace=False),
    "mistral_metaspace": lambda: _sentencepiece_bpe(metaspace=True),
    "gemma": _gemma,
    "t5": _t5,
    "bert": _bert,
    "nfkc_lower": lambda: _gpt2(nfkc_lower=True),
}
assert tuple(_BUILDERS) == FAMILIES


@functools.cache
def _trained(name: str) -> tuple[str, str]:
    """(tokenizer.json text, tokenizer_config.json text) of a family; trained once a process."""
    if name not in _BUILDERS:
        raise KeyError(f"unknown tokenizer family {name!r}; expected one of {FAMILIES}")
    tok, config = _BUILDERS[name]()
    return tok.to_str(pretty=True), json.dumps(config, indent=2, ensure_ascii=False)


def _pad_token(config: dict[str, Any]) -> str:
    for key in ("pad_token", "eos_token", "unk_token"):
        if config.get(key):
            return str(config[key])
    raise ValueError("family has no pad, eos or unk token")


def build_family(name: str, directory: Path, *, truncation_padding: bool = False) -> Path:
    """Write the ``name`` family as a model directory (tokenizer.json, tokenizer_config.json).

    With ``truncation_padding=True`` the tokenizer.json has truncation (max_length 16) and
    padding (fixed length 16, with the pad token, else the eos, else the unk token) switched on:
    a tokenizer file that silently truncates and pads every encoding.
    """
    tokenizer_json, config_json = _trained(name)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if truncation_padding:
        tok = Tokenizer.from_str(tokenizer_json)
        pad = _pad_token(json.loads(config_json))
        pad_id = tok.token_to_id(pad)
        assert pad_id is not None, (name, pad)
        tok.enable_truncation(_MAX_LEN)
        tok.enable_padding(length=_MAX_LEN, pad_id=pad_id, pad_token=pad)
        tokenizer_json = tok.to_str(pretty=True)
    (directory / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(config_json, encoding="utf-8")
    return directory


# --------------------------------------------------------------------------- test documents


def hard_texts() -> list[str]:
    """About twenty documents exercising tokenizer and packing traps.

    Includes several scripts, combining accents, NFKC-sensitive characters, emoji (one that the
    byte-fallback families never saw), whitespace runs / tabs / leading and trailing spaces and
    newlines, digit runs, very long words, a ~20k-character document, literal "<s>" / "</s>",
    the empty string and a string of spaces only.
    """
    sentence = (
        "The packer must split this long document into many rows; 12345 tokens, naïve café, "
        "中文字符 and العربية too.\n"
    )
    long_doc = "".join(f"[{i}] {sentence}" for i in range(200))
    return [
        "Hello world.",
        "中文测试：我们明天去公园散步吧。日本語のテキスト、한국어 문장.",
        "العربية: مرحبا بالعالم، كيف حالك؟",
        "हिन्दी: नमस्ते दुनिया, यह एक परीक्षण है।",
        f"Emoji {FALLBACK_EMOJI} and 😀🎉👍🏽 family 👨‍👩‍👧 flag 🇫🇷, rare CJK {FALLBACK_CJK}.",
        "Combining accents: e\u0301 vs \u00e9, n\u0303, A\u030a; precomposed é ñ Å.",
        "Fullwidth and circled: ＡＢＣ ０１２３ ① ② ⑩ ﬁ ㎏ Ⅻ.",
        "   leading spaces and trailing spaces   ",
        "\n\nleading newlines\nand trailing newlines\n\n",
        "tabs\tand\t\tmore\t\t\ttabs, runs of  two   three    four     spaces",
        "line one\r\nline two\r\n\r\n  indented\n\t\tdeeper\n",
        "Digits: 0 7 42 123 1234 12345 3141592653589793238462643383279 1,000,000 1e-10",
        "a" * 600,
        "Pneumonoultramicroscopicsilicovolcanoconiosis" * 12,
        long_doc,
        "HTML: <s>struck</s> and <s> alone, </s> alone, <s></s><s>",
        "Contractions it's don't WE'RE y'all I'd've.",
        "",
        "     ",
        "Mixed: Привет, Γειά, שלום, hello, नमस्ते, 你好 — ‘quotes’ “double” … end",
    ]


# --------------------------------------------------------------------------- chat families

TEMPLATES = Path(__file__).resolve().parent / "data" / "templates"
"""The models' own chat templates (see its README.md)."""

_DEEPSEEK_SPECIALS = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
    "<｜tool▁sep｜>",
)
_HARMONY_SPECIALS = (
    "<|endoftext|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
)

CHAT_TEMPLATE_FAMILIES: dict[str, dict[str, Any]] = {
    # name: base family, special and non-special tokens added, tokenizer_config.json entries
    "qwen3": {
        "base": "qwen",
        "special": (),
        "plain": ("<think>", "</think>", "<tool_response>", "</tool_response>"),
        "config": {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    },
    "llama3": {
        "base": "llama3",
        "special": ("<|eom_id|>", "<|python_tag|>"),
        "plain": (),
        "config": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    },
    "gemma3": {
        "base": "gemma",
        "special": (),
        "plain": (),
        "config": {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"},
    },
    "deepseekv3": {
        "base": "qwen",
        "special": _DEEPSEEK_SPECIALS,
        "plain": ("<think>", "</think>"),
        "config": {
            "bos_token": "<｜begin▁of▁sentence｜>",
            "eos_token": "<｜end▁of▁sentence｜>",
        },
    },
    "gptoss": {
        "base": "qwen",
        "special": _HARMONY_SPECIALS,
        "plain": (),
        "config": {"bos_token": None, "eos_token": "<|return|>", "pad_token": "<|endoftext|>"},
    },
}
"""Tokenizers in the shape of chat model families: a trained family of the same pipeline with
the model's control tokens added (special) and its markup tokens (not special)."""


def build_chat_family(name: str, directory: Path, template: str) -> Path:
    """Write the ``name`` chat family (see :data:`CHAT_TEMPLATE_FAMILIES`) as a model directory
    whose tokenizer_config.json holds ``template`` (a file name under :data:`TEMPLATES`, or the
    template's text)."""
    family = CHAT_TEMPLATE_FAMILIES[name]
    tokenizer_json, config_json = _trained(family["base"])
    tok = Tokenizer.from_str(tokenizer_json)
    tok.add_special_tokens([_added(t, special=True) for t in family["special"]])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in family["plain"]])
    path = TEMPLATES / template
    text = path.read_text(encoding="utf-8") if template.endswith(".jinja") else template
    config = {**json.loads(config_json), **family["config"], "chat_template": text}
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(tok.to_str(pretty=True), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8"
    )
    return directory
