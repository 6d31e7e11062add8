"""What packtool reads from a tokenizer.json's JSON equals what `tokenizers` says, on every
tokenizer family (plain, and saved with truncation and padding on); and a run that encodes
with fastokens on a cached parity-gate verdict does not load `tokenizers` at all."""

from __future__ import annotations

import json
from pathlib import Path

import hypothesis.strategies as st
import pytest
import tokenizer_families as tf
from conftest import write_jsonl
from helpers import documents_from_rows, read_rows
from hypothesis import given, settings
from test_cli import assert_one_line_error, run
from tokenizers import Tokenizer

import packtool
from packtool.errors import TokenizerError
from packtool.tokenize import (
    GATE_CACHED,
    GATE_PASSED,
    DocumentEncoder,
    SpecialStringFinder,
    load_tokenizer,
)
from packtool.tokenizer_file import (
    BOS_NAMES,
    EOS_NAMES,
    PAD_NAMES,
    SpecialTokens,
    TokenizerFile,
    resolve_special_tokens,
    turned_off_notice,
)

CASES = [(name, trap) for name in tf.FAMILIES for trap in (False, True)]


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], Path]:
    root = tmp_path_factory.mktemp("tokenizer-file")
    return {
        (name, trap): tf.build_family(name, root / f"{name}-{trap}", truncation_padding=trap)
        for name, trap in CASES
    }


def _hf_special_tokens(tok: Tokenizer, config: dict, overrides: dict) -> SpecialTokens:
    """The resolution of docs/tokenization.md (rule 3), asked of `tokenizers` itself."""
    added = tok.get_added_tokens_decoder()
    special = {int(i) for i, t in added.items() if t.special}
    padding = tok.padding

    def resolve(kind: str, names: tuple[str, ...]) -> int | None:
        if overrides.get(kind) is not None:  # a number is an id
            text = overrides[kind]
            return int(text) if text.isdigit() else tok.token_to_id(text)
        configured = config.get(f"{kind}_token")
        if isinstance(configured, dict):
            configured = configured.get("content")
        if isinstance(configured, str) and tok.token_to_id(configured) is not None:
            return tok.token_to_id(configured)
        if kind == "pad" and padding and padding["pad_id"] in special:
            return int(padding["pad_id"])
        for name in names:
            tid = tok.token_to_id(name)
            if tid is not None and tid in special:
                return tid
        return None

    return SpecialTokens(
        resolve("eos", EOS_NAMES), resolve("bos", BOS_NAMES), resolve("pad", PAD_NAMES)
    )


@pytest.mark.parametrize(("family", "trap"), CASES)
def test_the_json_says_what_tokenizers_says(family_dirs, family, trap) -> None:
    directory = family_dirs[family, trap]
    data = (directory / "tokenizer.json").read_bytes()
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    tok = Tokenizer.from_str(data.decode())
    file = TokenizerFile.parse(data)

    assert file.vocab_size == tok.get_vocab_size(with_added_tokens=True)
    added = tok.get_added_tokens_decoder()
    assert file.special_ids == {int(i) for i, t in added.items() if t.special}
    assert set(file.added_strings) == {t.content for t in added.values()}
    assert file.num_special_tokens_to_add() == tok.num_special_tokens_to_add(False)
    assert file.turned_off() == turned_off_notice(tok.truncation, tok.padding)
    assert (file.turned_off() is not None) == trap
    # Every token string of the vocabulary and of the added tokens, and the usual names.
    strings = [*tok.get_vocab(with_added_tokens=True), *EOS_NAMES, *BOS_NAMES, *PAD_NAMES, "?!"]
    assert [file.token_to_id(s) for s in strings] == [tok.token_to_id(s) for s in strings]

    vocab = file.vocab_size
    some_added = sorted(t.content for t in added.values())[0]
    some_word = sorted(tok.get_vocab())[len(tok.get_vocab()) // 2]
    for overrides in ({}, {"eos": some_added, "bos": some_word}, {"pad": "5", "eos": "7"}):
        for conf in (config, {}):
            got = resolve_special_tokens(
                file, conf, overrides=overrides, vocab_size=vocab, name=family
            )
            assert got == _hf_special_tokens(tok, conf, overrides), (overrides, conf)
    loaded = load_tokenizer(directory, backend="auto")
    assert loaded.special == _hf_special_tokens(tok, config, {})
    assert not loaded.hf_loaded  # all of it from the JSON


@pytest.mark.parametrize(("family", "trap"), CASES)
def test_a_file_read_with_its_facts_says_what_the_whole_file_says(family_dirs, family, trap):
    """The facts of a file (cached by its sha256: tokenize/facts.py) stand for its vocabulary:
    read from its head and them, every figure, id and special token a run asks for is the
    whole file's, without parsing the vocabulary; a token the facts do not name parses it."""
    directory = family_dirs[family, trap]
    data = (directory / "tokenizer.json").read_bytes()
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    whole = TokenizerFile.parse(data)
    named = [config[k] for k in ("eos_token", "bos_token", "pad_token") if config.get(k)]
    named = [n["content"] if isinstance(n, dict) else n for n in named]
    facts = json.loads(json.dumps(whole.facts(named)))  # as the cache keeps them
    file = TokenizerFile.with_facts(data, facts)
    assert file is not None and file._vocab is None
    for attr in ("model_type", "dropout", "added", "normalizer", "pre_tokenizer"):
        assert getattr(file, attr) == getattr(whole, attr), attr
    for attr in ("post_processor", "truncation", "padding", "vocab_size", "next_id"):
        assert getattr(file, attr) == getattr(whole, attr), attr
    for attr in ("added_next_id", "special_ids", "special_strings", "added_strings"):
        assert getattr(file, attr) == getattr(whole, attr), attr
    assert file.num_special_tokens_to_add() == whole.num_special_tokens_to_add()
    assert file.turned_off() == whole.turned_off()
    asked = [*EOS_NAMES, *BOS_NAMES, *PAD_NAMES, *named, *(t.content for t in whole.added)]
    assert [file.token_to_id(s) for s in asked] == [whole.token_to_id(s) for s in asked]
    for conf in (config, {}):
        got = resolve_special_tokens(file, conf, overrides={}, vocab_size=9**9, name=family)
        assert got == resolve_special_tokens(
            whole, conf, overrides={}, vocab_size=9**9, name=family
        )
    assert file._vocab is None  # none of that needed the vocabulary
    some = [*sorted(whole.vocab)[::37], "\ufdd0not a token"]
    assert [file.token_to_id(s) for s in some] == [whole.token_to_id(s) for s in some]
    assert file._vocab is not None and file.vocab == whole.vocab  # parsed when asked


def test_facts_are_cached_by_the_files_bytes_and_checked(family_dirs, tmp_path, monkeypatch):
    """The first read of a file parses it and caches its facts by its sha256; the next read
    uses them (the vocabulary unparsed), ids and ``id_to_token`` as `tokenizers` gives them; a
    cache entry of another version, of another shape or not JSON is not used."""
    import hashlib

    from packtool.tokenize.facts import read_tokenizer_file
    from packtool.tokenizer_file import FACTS_VERSION

    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(tmp_path))
    directory = family_dirs["llama3", False]
    data = (directory / "tokenizer.json").read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    parsed = load_tokenizer(directory, backend="hf")  # caches the facts (with the names its
    first = parsed.file  # config looks up)
    assert first._vocab is not None  # parsed whole
    cached = tmp_path / "tokenizer-facts" / f"{sha}-{FACTS_VERSION}.json"
    assert json.loads(cached.read_text())["top_id"] == max(first.vocab.values())
    tok = load_tokenizer(directory, backend="hf")
    assert tok.file._vocab is None and tok.special == parsed.special
    assert tok.vocab_size == first.next_id and tok.sha256 == sha
    ref = Tokenizer.from_str(data.decode())
    ids = range(0, tok.vocab_size, 7)
    assert [tok.id_to_token(i) for i in ids] == [ref.id_to_token(i) for i in ids]
    for broken in (
        "{not json",
        json.dumps({**json.loads(cached.read_text()), "version": FACTS_VERSION + 1}),
        json.dumps({**json.loads(cached.read_text()), "top_id": "9"}),
        json.dumps({**json.loads(cached.read_text()), "added": [[1, "x"]]}),
    ):
        cached.write_text(broken)
        assert read_tokenizer_file(data, sha)._vocab is not None  # parsed whole again
        assert json.loads(cached.read_text())["version"] == FACTS_VERSION  # and cached anew


def test_a_file_in_another_key_order_reads_the_same(family_dirs, tmp_path) -> None:
    """The reader stops before the merges when the file is laid out as tokenizers saves it;
    a file in another order (model first, merges before the vocabulary) is read whole."""
    data = (family_dirs["llama3", True].joinpath("tokenizer.json")).read_bytes()
    spec = json.loads(data)
    model = spec.pop("model")
    model = {"merges": model.pop("merges"), **model}
    reordered = json.dumps({"model": model, **spec}, ensure_ascii=False).encode()
    a, b = TokenizerFile.parse(data), TokenizerFile.parse(reordered)
    for attr in ("vocab", "added", "post_processor", "truncation", "padding", "pre_tokenizer"):
        assert getattr(a, attr) == getattr(b, attr), attr
    assert a.vocab_size == b.vocab_size and a.turned_off() == b.turned_off()


def test_an_unknown_override_names_the_option(family_dirs) -> None:
    with pytest.raises(TokenizerError, match=r"no token '<nope>' in its vocabulary \(given as "):
        load_tokenizer(family_dirs["gpt2", False], eos_token="<nope>", backend="auto")


def test_a_broken_file_is_one_clear_error_on_every_backend(tmp_path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text('{"model": {"type": "BPE", "vocab": ', encoding="utf-8")
    for backend in ("hf", "auto"):
        with pytest.raises(TokenizerError, match=r"cannot load as a tokenizers tokenizer\.json"):
            load_tokenizer(path, backend=backend)


def test_a_cached_verdict_runs_without_tokenizers(tmp_path, monkeypatch) -> None:
    """First run: the gate loads tokenizers for the probes and the first documents. Second
    run, verdict cached: fastokens alone, and the same ids."""
    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(tmp_path / "cache"))
    texts = ["A first document.", "Ein zweites Dokument, 12345.", "第三个文件 🙂"]
    cold_tok = load_tokenizer(backend="auto")
    cold = DocumentEncoder(cold_tok, backend="auto")
    want = cold.encode(texts)
    assert cold.backend.reason == GATE_PASSED and cold_tok.hf_loaded
    warm_tok = load_tokenizer(backend="auto")
    warm = DocumentEncoder(warm_tok, backend="auto")
    got = warm.encode(texts)
    assert warm.backend.name == "gigatoken" and warm.backend.reason == GATE_CACHED
    assert not warm_tok.hf_loaded
    assert got.ids.tolist() == want.ids.tolist() and got.lengths.tolist() == want.lengths.tolist()
    # pack on the cached verdict: recorded as such; the same rows as with tokenizers.
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in texts])
    report = packtool.pack([src], tmp_path / "fast", max_len=16)
    assert report.backend["reason"] == GATE_CACHED
    packtool.pack([src], tmp_path / "hf", max_len=16, tokenizer_backend="hf")
    for shard in sorted((tmp_path / "hf").glob("*.arrow")):
        assert (tmp_path / "fast" / shard.name).read_bytes() == shard.read_bytes()


_SPECIALS = st.lists(
    st.text(alphabet="<|>/sab_e", min_size=1, max_size=6), min_size=1, max_size=12, unique=True
)


@settings(max_examples=300, deadline=None)
@given(strings=_SPECIALS, texts=st.lists(st.text(alphabet="<|>/sab_e x", max_size=30), max_size=8))
def test_special_string_finder_counts_as_a_plain_search_does(strings, texts) -> None:
    """The trie-shaped pattern that counts documents holding special-token strings finds one
    exactly where a plain substring search finds one (strings that are prefixes or parts of
    others included); the spans still take the longest string at each position."""
    finder = SpecialStringFinder(strings)
    holds = [any(s in t for s in strings) for t in texts]
    assert [finder.contains(t) for t in texts] == holds
    assert finder.count(texts) == sum(holds)
    for t in texts:
        for a, b in finder.spans(t):
            assert t[a:b] in strings
            assert not any(t.startswith(s, a) and len(s) > b - a for s in strings)


def test_ids_with_a_gap_bound_the_vocabulary_and_place_the_anchor(family_dirs, tmp_path) -> None:
    """A vocabulary whose ids have a gap (GPT-4o's o200k: 200,000 tokens, the last at id
    200,018): the next id `tokenizers` gives is one above the highest, not the count of
    tokens, so packtool's anchor token goes there and the recorded vocab_size bounds every
    id. Before, such a file failed with "packtool's anchor token did not get the next id"."""
    directory = family_dirs["gpt2", False]
    data = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    top = max(vocab.values())
    far = top + 19  # a token of the vocabulary with ids top+1 .. top+18 unused
    vocab["<|far|>"] = far
    data["added_tokens"].append(
        {"id": far, "content": "<|far|>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}
    )  # fmt: skip
    gapped = tmp_path / "gapped"
    gapped.mkdir()
    (gapped / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    (gapped / "tokenizer_config.json").write_bytes(
        (directory / "tokenizer_config.json").read_bytes()
    )

    tok = Tokenizer.from_file(str(gapped / "tokenizer.json"))
    file = TokenizerFile.parse((gapped / "tokenizer.json").read_bytes())
    assert file.vocab_size == tok.get_vocab_size(with_added_tokens=True) < far
    tok.add_tokens(["<probe-token>"])
    assert file.next_id == tok.token_to_id("<probe-token>") == far + 1

    corpus = tmp_path / "c.jsonl"
    write_jsonl(corpus, [{"text": "a plain line <|far|> and more"}, {"text": "second"}])
    for backend in ("hf", "auto"):
        out = tmp_path / f"out-{backend}"
        report = packtool.pack(
            [corpus], out, max_len=64, tokenizer=str(gapped), parse_special=True,
            tokenizer_backend=backend,
        )  # fmt: skip
        manifest, rows = read_rows(out)
        assert manifest["tokenizer"]["vocab_size"] == far + 1
        docs = documents_from_rows(rows)
        want = tok.encode("a plain line <|far|> and more", add_special_tokens=False).ids
        assert far in want and docs[0][: len(want)] == want
        assert report.documents.packed == 2


def test_ids_with_a_gap_in_the_middle_are_one_line_naming_the_file(tmp_path: Path) -> None:
    """Ids above 4000 moved up by 100: `tokenizers` loads the file, but gives a token added
    to it the count of tokens as its id (an id of the vocabulary), never one above the
    highest. packtool says so on one line naming the file (before: "packtool's anchor token
    did not get the next id", naming nothing)."""
    data = json.loads(
        (Path(packtool.__file__).parent / "_data" / "tokenizer.json").read_text(encoding="utf-8")
    )
    vocab = data["model"]["vocab"]
    data["model"]["vocab"] = {k: i + 100 if i > 4000 else i for k, i in vocab.items()}
    gapped = tmp_path / "gapped"
    gapped.mkdir()
    (gapped / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    file = TokenizerFile.parse((gapped / "tokenizer.json").read_bytes())
    tok = Tokenizer.from_file(str(gapped / "tokenizer.json"))
    tok.add_tokens(["<probe-token>"])
    assert file.added_next_id == tok.token_to_id("<probe-token>") == len(vocab)
    assert file.next_id == max(vocab.values()) + 101
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "hello"}])
    for backend in ("hf", "auto"):
        result = run("pack", corpus, "-L", "64", "-o", tmp_path / "out", "--tokenizer", gapped,
                     "--tokenizer-backend", backend)  # fmt: skip
        assert_one_line_error(
            result,
            rf"{gapped}/tokenizer\.json: the vocabulary's ids have gaps \(8,192 tokens, the "
            r"highest id 8,291\): tokenizers gives a token added to it the id 8,192",
        )
    assert not (tmp_path / "out").exists()


def _edited_whole(data: bytes, anchor_id: int, parse_special: bool) -> dict:
    """What gigatoken is given, made the plain way: the whole file parsed and edited."""
    from packtool.tokenize.backend import ANCHOR

    spec = json.loads(data)
    added = [a for a in spec.get("added_tokens") or () if parse_special or not a.get("special")]
    anchor = {"id": anchor_id, "content": ANCHOR, "single_word": False, "lstrip": False}
    added.append({**anchor, "rstrip": False, "normalized": False, "special": False})
    return {**spec, "added_tokens": added, "truncation": None, "padding": None}


@pytest.mark.parametrize(
    "before",
    [
        '"added_tokens": [{"id": 3, "content": "model", "special": true}], ',  # a token "model"
        '"normalizer": {"type": "x", "model": {"a": "\u00e9"}}, ',  # a nested "model" key
        r'"pre_tokenizer": "\"model\": {", ',  # inside a string
        "",
    ],
)
def test_the_head_of_a_file_is_read_without_decoding_the_model(before):
    """``file_head`` decodes the bytes up to the first ``"model":`` only; a first match that
    is not the top-level key (in a string, a nested object) still gives the members the whole
    file gives, and ``edited`` equals the file parsed whole and edited."""
    from packtool.tokenizer_file import file_head, head_members

    model = '"model": {"type": "BPE", "vocab": {"\u00e9": 0, "a": 1}, "merges": []}'
    data = ("{" + '"version": "1.0", ' + before + '"truncation": null, ' + model + "}").encode()
    keys = ("truncation", *(["added_tokens"] if "added_tokens" in before else []))
    head = file_head(data, keys)
    assert head is not None
    assert head.members == head_members(data.decode(), keys)
    edited = head.edited({"truncation": {"max_length": 5}, **{k: [] for k in keys[1:]}})
    expected = {**json.loads(data), "truncation": {"max_length": 5}, **{k: [] for k in keys[1:]}}
    assert json.loads(edited) == expected
    assert edited.endswith(data[data.rindex(b'"model"') :])
    assert file_head(data, ("no_such_key",)) is None


@pytest.mark.parametrize(("family", "trap"), CASES)
@pytest.mark.parametrize("parse_special", [False, True])
def test_gigatokens_copy_is_the_file_edited_in_place(family_dirs, family, trap, parse_special):
    """The members gigatoken's copy changes are replaced in the text, which is not parsed past
    them: the result is the file parsed whole and edited, and every other byte is the file's
    (also for a file in another key order, which is parsed whole)."""
    from packtool.tokenize.gigatoken import edited_json
    from packtool.tokenizer_file import head_members

    data = (family_dirs[family, trap] / "tokenizer.json").read_bytes()
    text = edited_json(data, 123_456, parse_special)
    assert json.loads(text) == _edited_whole(data, 123_456, parse_special)
    found = head_members(data.decode(), ("added_tokens", "truncation", "padding"))
    assert found is not None  # laid out as tokenizers saves it: edited in place
    assert text.endswith(data[data.index(b'"model"') :])  # the model: the file's own bytes
    spec = json.loads(data)
    reordered = json.dumps({"model": spec.pop("model"), **spec}, ensure_ascii=False).encode()
    assert head_members(reordered.decode(), ("added_tokens",)) is None
    again = edited_json(reordered, 123_456, parse_special)
    assert json.loads(again) == _edited_whole(reordered, 123_456, parse_special)
