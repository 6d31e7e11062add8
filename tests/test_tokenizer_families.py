"""Checks of the locally trained tokenizer families in tests/tokenizer_families.py.

Other tests compare packtool against ``transformers.AutoTokenizer`` and ``tokenizers.Tokenizer``
loaded from these directories, so here we check that the two references agree and that every
trap a family is meant to carry is really there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tokenizer_families as tf
from tokenizers import Tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerFast

BYTE_FALLBACK = ("llama2", "mistral_metaspace", "gemma")
SHORT = "Hello world."


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: tf.build_family(name, root / name) for name in tf.FAMILIES}


@pytest.fixture(scope="module")
def trap_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families_truncation_padding")
    return {
        name: tf.build_family(name, root / name, truncation_padding=True) for name in tf.FAMILIES
    }


def _rust(directory: Path) -> Tokenizer:
    return Tokenizer.from_file(str(directory / "tokenizer.json"))


def _auto(directory: Path) -> PreTrainedTokenizerFast:
    tok = AutoTokenizer.from_pretrained(str(directory))
    assert isinstance(tok, PreTrainedTokenizerFast)
    return tok


def test_api() -> None:
    assert tf.FAMILIES == (
        "gpt2",
        "llama3",
        "qwen",
        "llama2",
        "mistral_metaspace",
        "gemma",
        "t5",
        "bert",
        "nfkc_lower",
    )
    assert set(tf.SPECIAL_STRINGS) == set(tf.FAMILIES)
    assert set(tf.CHAT_FAMILIES) <= set(tf.FAMILIES)
    with pytest.raises(KeyError):
        tf.build_family("no-such-family", Path("unused"))


def test_hard_texts() -> None:
    texts = tf.hard_texts()
    assert 15 <= len(texts) <= 30
    assert "" in texts
    assert any(t and not t.strip(" ") for t in texts)
    assert max(map(len, texts)) >= 20_000
    assert any("<s>" in t and "</s>" in t for t in texts)
    assert any(tf.FALLBACK_EMOJI in t for t in texts)
    assert texts == tf.hard_texts()


@pytest.mark.parametrize("name", tf.FAMILIES)
def test_auto_tokenizer_agrees_with_tokenizers(name: str, family_dirs: dict[str, Path]) -> None:
    directory = family_dirs[name]
    rust = _rust(directory)
    auto = _auto(directory)
    assert auto.is_fast
    assert auto.model_max_length == 1_000_000
    # transformers added no token of its own (e.g. a missing pad or unk token).
    assert len(auto) == rust.get_vocab_size(with_added_tokens=True)
    for text in tf.hard_texts():
        assert auto(text)["input_ids"] == rust.encode(text).ids, (name, text[:60])
        assert (
            auto(text, add_special_tokens=False)["input_ids"]
            == rust.encode(text, add_special_tokens=False).ids
        ), (name, text[:60])


@pytest.mark.parametrize(
    ("name", "first", "last"),
    [
        ("gpt2", None, None),
        ("llama3", "<|begin_of_text|>", None),
        ("qwen", None, None),
        ("llama2", "<s>", None),
        ("mistral_metaspace", "<s>", None),
        ("gemma", "<bos>", None),
        ("t5", None, "</s>"),
        ("bert", "[CLS]", "[SEP]"),
        ("nfkc_lower", None, None),
    ],
)
def test_post_processor_adds(
    name: str, first: str | None, last: str | None, family_dirs: dict[str, Path]
) -> None:
    rust = _rust(family_dirs[name])
    plain = rust.encode(SHORT, add_special_tokens=False).tokens
    added = rust.encode(SHORT).tokens
    expected = ([first] if first else []) + plain + ([last] if last else [])
    assert added == expected
    assert rust.num_special_tokens_to_add(is_pair=False) == len(expected) - len(plain)


@pytest.mark.parametrize("name", tf.FAMILIES)
def test_special_strings_are_the_special_added_tokens(
    name: str, family_dirs: dict[str, Path]
) -> None:
    added = _rust(family_dirs[name]).get_added_tokens_decoder().values()
    assert sorted(t.content for t in added if t.special) == sorted(tf.SPECIAL_STRINGS[name])


@pytest.mark.parametrize("name", BYTE_FALLBACK)
def test_byte_fallback(name: str, family_dirs: dict[str, Path]) -> None:
    rust = _rust(family_dirs[name])
    vocab = rust.get_vocab(with_added_tokens=False)
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    assert all(t in vocab for t in byte_tokens)
    added = {t.content for t in rust.get_added_tokens_decoder().values()}
    assert not added & set(byte_tokens)  # plain vocabulary entries, as in Llama and Gemma
    for char in (tf.FALLBACK_EMOJI, tf.FALLBACK_CJK):
        assert char not in vocab
        enc = rust.encode(f"a {char} b", add_special_tokens=False)
        utf8 = [f"<0x{b:02X}>" for b in char.encode()]
        assert "<unk>" not in enc.tokens
        assert any(enc.tokens[i : i + len(utf8)] == utf8 for i in range(len(enc.tokens)))
        assert rust.decode(enc.ids) == f"a {char} b"


def test_gpt2_plain_s_token_is_not_bos(family_dirs: dict[str, Path]) -> None:
    directory = family_dirs["gpt2"]
    rust = _rust(directory)
    vocab = rust.get_vocab(with_added_tokens=False)
    assert "<s>" in vocab and "</s>" in vocab
    added = {t.content for t in rust.get_added_tokens_decoder().values()}
    assert "<s>" not in added and "</s>" not in added
    assert rust.token_to_id("<s>") is not None
    auto = _auto(directory)
    assert auto.bos_token == auto.eos_token == "<|endoftext|>"
    assert auto.bos_token_id == rust.token_to_id("<|endoftext|>") != rust.token_to_id("<s>")
    assert "<s>" not in auto.all_special_tokens
    # Literal "<s>" in text is split into ordinary pieces and nothing is added.
    assert rust.token_to_id("<s>") not in rust.encode("a <s> b").ids


def test_qwen_tool_call_is_added_not_special(family_dirs: dict[str, Path]) -> None:
    directory = family_dirs["qwen"]
    rust = _rust(directory)
    by_content = {t.content: t for t in rust.get_added_tokens_decoder().values()}
    for content in ("<tool_call>", "</tool_call>"):
        assert not by_content[content].special
        assert content not in rust.get_vocab(with_added_tokens=False)
    enc = rust.encode("x<tool_call>{}</tool_call>y")
    assert enc.tokens[1] == "<tool_call>"
    assert "</tool_call>" in enc.tokens
    auto = _auto(directory)
    assert "<tool_call>" not in auto.all_special_tokens
    assert "<tool_call>" in auto.decode(enc.ids, skip_special_tokens=True)
    assert auto.bos_token is None and auto.eos_token == "<|im_end|>"
    assert auto.pad_token == "<|endoftext|>"


def test_nfkc_lower_normalizer_changes_text(family_dirs: dict[str, Path]) -> None:
    rust = _rust(family_dirs["nfkc_lower"])
    assert rust.normalizer is not None
    assert rust.normalizer.normalize_str("ＡＢＣ ① Ｈello") == "abc 1 hello"
    assert rust.decode(rust.encode("ＡＢＣ").ids) == "abc"


@pytest.mark.parametrize("name", tf.CHAT_FAMILIES)
def test_chat_template(name: str, family_dirs: dict[str, Path]) -> None:
    directory = family_dirs[name]
    auto = _auto(directory)
    messages = [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"}]
    text = auto.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert isinstance(text, str)
    if name == "qwen":
        assert text == (
            "<|im_start|>user\n hi <|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
            "<|im_start|>assistant\n"
        )
    else:
        assert text == (
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
        )
    rust = _rust(directory)
    ids = rust.encode(text, add_special_tokens=False).ids
    assert auto(text, add_special_tokens=False)["input_ids"] == ids
    specials = {rust.token_to_id(s) for s in tf.SPECIAL_STRINGS[name]}
    assert sum(i in specials for i in ids) == text.count("<|")


@pytest.mark.parametrize("name", tf.FAMILIES)
def test_truncation_padding_trap(name: str, trap_dirs: dict[str, Path]) -> None:
    directory = trap_dirs[name]
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["model_max_length"] == 1_000_000
    rust = _rust(directory)
    assert rust.truncation is not None and rust.truncation["max_length"] == 16
    assert rust.padding is not None and rust.padding["length"] == 16
    long_doc = max(tf.hard_texts(), key=len)
    assert len(rust.encode(long_doc).ids) == 16  # silently truncated
    short = rust.encode(SHORT)
    assert len(short.ids) == 16  # silently padded
    assert short.ids[-1] == rust.padding["pad_id"]
    assert short.attention_mask[-1] == 0
    assert len(rust.encode("").ids) == 16


@pytest.mark.parametrize("name", tf.FAMILIES)
def test_truncation_padding_ignored_by_auto_tokenizer(
    name: str, trap_dirs: dict[str, Path], family_dirs: dict[str, Path]
) -> None:
    # transformers' __call__ switches the backend's truncation and padding off unless asked
    # (set_truncation_and_padding with DO_NOT_TRUNCATE / DO_NOT_PAD), so AutoTokenizer on the
    # trap directory still equals the clean tokenizer: only tokenizers.Tokenizer falls into it.
    auto = _auto(trap_dirs[name])
    clean = _rust(family_dirs[name])
    for text in (SHORT, max(tf.hard_texts(), key=len)):
        assert auto(text)["input_ids"] == clean.encode(text).ids


def test_builds_are_deterministic_and_cached(tmp_path: Path) -> None:
    # Train anew (different Rust hash-map seeds than the cached builds): the families whose
    # trainers are not reproducible as such (t5, bert) and the one with a patched vocab (gpt2).
    for name in ("t5", "bert", "gpt2"):
        tokenizer, config = tf._BUILDERS[name]()
        assert (
            tokenizer.to_str(pretty=True),
            json.dumps(config, indent=2, ensure_ascii=False),
        ) == (tf._trained(name)), name
    first = tf.build_family("llama3", tmp_path / "a")
    second = tf.build_family("llama3", tmp_path / "b")
    for file in ("tokenizer.json", "tokenizer_config.json"):
        assert (first / file).read_bytes() == (second / file).read_bytes()
