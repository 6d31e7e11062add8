"""The tokenizer backends: fastokens and gigatoken behind a parity gate, Hugging Face `tokenizers`
otherwise.

The conformance matrix over every tokenizer family, on both backends, is in test_fidelity.py;
here: the gate's verdicts (and their cache), the fallback of a batch fastokens raises on, the
options, the manifest, and that ``verify --against`` re-tokenizes with `tokenizers`.
"""

from __future__ import annotations

import itertools
import json
import tempfile
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
from conftest import SAMPLE, write_jsonl
from helpers import documents_from_rows, read_rows
from hypothesis import given, settings
from test_cli import assert_one_line_error, run

import packtool
from packtool.errors import OptionError, TokenizerError
from packtool.options import PackOptions
from packtool.tokenize import DocumentEncoder, Flat, HFTokenizer, load_tokenizer

pytest.importorskip("fastokens")
pytest.importorskip("gigatoken")

TEXTS = [
    "The first document, in plain English.",
    "Второй документ. 第三个文件。 🙂",
    "digits 1234567 and    spaces\n\nand a long word " + "z" * 300,
]


class _Wrapped:
    """A fast backend's real engine, with one fault injected: ids changed, or an exception,
    for texts that hold ``trigger``."""

    def __init__(self, engine, trigger: str, fault: str) -> None:
        self.engine, self.trigger, self.fault = engine, trigger, fault
        self.calls = 0

    def encode(self, texts, add_special, parse_special):
        self.calls += 1
        flat = self.engine.encode(texts, add_special, parse_special)
        if any(self.trigger in t for t in texts):
            if self.fault == "raise":
                raise ValueError("regex match limit exceeded")
            ids = flat.ids.copy()
            ends = np.cumsum(flat.lengths)
            hit = next(i for i, t in enumerate(texts) if self.trigger in t)
            ids[int(ends[hit]) - 1] ^= 1  # the last id of the first text that holds it
            flat = Flat(ids, flat.lengths)
        return flat


def _faulty(monkeypatch, trigger: str, fault: str) -> list[_Wrapped]:
    """Every fast engine loaded from now on is faulty; the parity gate starts from an empty
    cache (a verdict cached by another test would skip the comparison of the first
    documents, and a difference found here is cached too)."""
    monkeypatch.setenv("PACKTOOL_CACHE_DIR", tempfile.mkdtemp(prefix="packtool-faulty-"))
    made: list[_Wrapped] = []
    real = HFTokenizer.engine

    def engine(self, backend):
        tok, why = real(self, backend)
        if tok is None:
            return tok, why
        made.append(_Wrapped(tok, trigger, fault))
        return made[-1], why

    monkeypatch.setattr(HFTokenizer, "engine", engine)
    return made


def test_auto_uses_the_fast_backend_suited_to_the_tokenizer_and_records_it(tmp_path) -> None:
    """The bundled tokenizer is a byte-level BPE: gigatoken is the faster there
    (docs/performance.md), so ``auto`` tries it first."""
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in TEXTS])
    report = packtool.pack([src], tmp_path / "out", max_len=32)
    backend = json.loads((tmp_path / "out" / "manifest.json").read_text())["tokenizer"]["backend"]
    assert backend["name"] == "gigatoken" and backend["reason"].startswith("passed the parity gate")
    assert backend["version"].count(".") >= 1 and backend["fallback_batches"] == 0
    assert report.backend == backend and report.notices == []


def test_a_difference_on_the_first_documents_falls_back_to_hf(tmp_path, monkeypatch) -> None:
    _faulty(monkeypatch, "Второй", "ids")
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in TEXTS])
    report = packtool.pack([src], tmp_path / "out", max_len=32, tokenizer_backend="auto")
    assert report.backend["name"] == "hf"
    assert report.notices == [  # every fast backend tried, in auto's order, and why not
        "gigatoken differs from tokenizers on document 2 of the first batch; fastokens "
        "differs from tokenizers on document 2 of the first batch: tokenizing with Hugging "
        "Face tokenizers"
    ]
    tok = load_tokenizer()
    _, rows = read_rows(tmp_path / "out")
    want = [[*ids, tok.special.eos_id] for ids in tok.encode_batch(TEXTS)]
    got = documents_from_rows(rows)
    assert [got[i] for i in range(3)] == want


@pytest.mark.parametrize("backend", ["fastokens", "gigatoken"])
def test_a_difference_fails_when_a_fast_backend_is_forced(tmp_path, monkeypatch, backend) -> None:
    _faulty(monkeypatch, "z" * 300, "ids")
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in TEXTS])
    with pytest.raises(TokenizerError, match=f"{backend} differs from tokenizers on document 3"):
        packtool.pack([src], tmp_path / "out", max_len=32, tokenizer_backend=backend)
    assert not (tmp_path / "out").exists()


def test_a_difference_on_the_probes_is_cached_by_the_file(tmp_path, monkeypatch) -> None:
    """The probe set (many scripts, whitespace, digits, long words, added tokens) is encoded
    once per tokenizer file; the verdict is kept, keyed by the file's hash."""
    made = _faulty(monkeypatch, "Привет, мир", "ids")  # in the probe set, not in the data
    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(tmp_path / "cache"))
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in TEXTS[:1]])
    first = packtool.pack([src], tmp_path / "a", max_len=32)
    assert first.backend["name"] == "hf"
    assert "gigatoken differs from tokenizers on 'Привет, мир!" in first.notices[0]
    assert "fastokens differs from tokenizers on 'Привет, мир!" in first.notices[0]
    assert len(list((tmp_path / "cache" / "parity-gate").glob("*.json"))) == 2  # one each
    monkeypatch.undo()  # a correct fastokens now: the cached verdict still stands
    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(tmp_path / "cache"))
    second = packtool.pack([src], tmp_path / "b", max_len=32)
    assert second.notices == first.notices and made[0].calls >= 1
    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(tmp_path / "fresh"))
    assert packtool.pack([src], tmp_path / "c", max_len=32).backend["name"] == "gigatoken"


@pytest.mark.parametrize("backend", ["fastokens", "gigatoken"])
def test_a_batch_a_fast_backend_raises_on_is_re_encoded_with_hf_and_counted(
    tmp_path, monkeypatch, backend
) -> None:
    _faulty(monkeypatch, "BOOM", "raise")
    tok = load_tokenizer()
    encoder = DocumentEncoder(tok, backend=backend)
    good = encoder.encode(TEXTS)
    bad = encoder.encode(["BOOM " + t for t in TEXTS])
    assert encoder.backend.name == backend and encoder.backend.fallback_batches == 1
    reference = DocumentEncoder(tok)
    for got, texts in ((good, TEXTS), (bad, ["BOOM " + t for t in TEXTS])):
        want = reference.encode(texts)
        assert got.ids.tolist() == want.ids.tolist()
        assert got.lengths.tolist() == want.lengths.tolist()


@pytest.mark.parametrize("backend", ["fastokens", "gigatoken"])
def test_flat_ids_are_read_in_place(tmp_path, backend) -> None:
    encoder = DocumentEncoder(load_tokenizer(), add_eos=False, backend=backend)
    flat = encoder.tokenize(TEXTS)
    assert isinstance(flat, Flat)
    assert flat.ids.base is not None  # a view of the engine's buffer, not a copy
    assert encoder.finish(flat).ids is flat.ids  # no EOS to insert: not even one copy


def test_verify_against_re_tokenizes_with_hf(tmp_path, monkeypatch) -> None:
    """A fastokens that were wrong on everything after the pack would not fool the check."""
    out = tmp_path / "out"
    packtool.pack([SAMPLE], out, max_len=512, tokenizer_backend="fastokens")
    made = _faulty(monkeypatch, "", "ids")
    result = run("verify", out, "--against", SAMPLE)
    assert result.exit_code == 0, result.output
    assert made == []  # fastokens was never asked


def test_the_option_is_checked(tmp_path) -> None:
    with pytest.raises(OptionError, match="--tokenizer-backend must be one of auto, hf, fas"):
        PackOptions(tokenizer_backend="rust")
    result = run("pack", SAMPLE, "-L", "64", "-o", tmp_path / "o", "--tokenizer-backend", "x")
    assert_one_line_error(result, "--tokenizer-backend must be one of", 2)


def test_the_option_takes_the_backend_table() -> None:
    """``--tokenizer-backend`` takes ``auto`` and every backend of the table (options.py spells
    them without importing the tokenizer stage, which imports numpy)."""
    from packtool.options import TOKENIZER_BACKENDS
    from packtool.tokenize.registry import BACKENDS, choices

    assert TOKENIZER_BACKENDS == choices() == ("auto", *BACKENDS)
    assert [b.name for b in BACKENDS.values() if not b.fast] == ["hf"]


def test_instruction_data_keeps_hf_pieces(tmp_path) -> None:
    src = write_jsonl(tmp_path / "pc.jsonl", [{"prompt": "Q: 2+2?", "completion": " 4"}])
    report = packtool.pack([src], tmp_path / "out", max_len=32)
    assert report.backend["name"] == "hf" and report.notices == []
    with pytest.raises(OptionError, match="instruction data is encoded piece by piece"):
        packtool.pack([src], tmp_path / "o2", max_len=32, tokenizer_backend="fastokens")


@pytest.mark.parametrize("backend", ["hf", "fastokens", "gigatoken"])
def test_batches_are_cut_by_text_size_not_by_documents(tmp_path, monkeypatch, backend) -> None:
    """What a tokenizer call gets is bounded by characters (one longer document alone), and
    the rows do not depend on where batches are cut."""
    import random

    import packtool.corpus as corpus

    rng = random.Random(5)
    texts = [
        " ".join(f"w{rng.randrange(500)}" for _ in range(rng.randrange(1, 400))) for _ in range(300)
    ]
    texts[17] = "a very long document " * 400  # 8,400 characters, over the limit alone
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in texts])
    packtool.pack([src], tmp_path / "whole", max_len=128, tokenizer_backend=backend)
    seen: list[list[str]] = []
    real = DocumentEncoder.tokenize

    def tokenize(self, batch):
        seen.append(list(batch))
        return real(self, batch)

    monkeypatch.setattr(DocumentEncoder, "tokenize", tokenize)
    monkeypatch.setattr(corpus, "_BATCH_CHARS", 3000)
    packtool.pack([src], tmp_path / "cut", max_len=128, tokenizer_backend=backend)
    # Two tokenizer calls run at once, so the calls may be seen out of order: every text
    # once; the order of the rows is checked by the bytes below.
    assert len(seen) > 10 and sorted(t for b in seen for t in b) == sorted(texts)
    assert all(sum(map(len, b)) <= 3000 or len(b) == 1 for b in seen)
    assert [texts[17]] in seen
    for a, b in zip(
        sorted((tmp_path / "whole").glob("*.arrow")),
        sorted((tmp_path / "cut").glob("*.arrow")),
        strict=True,
    ):
        assert a.read_bytes() == b.read_bytes()


@pytest.fixture(scope="module")
def piece_dirs(tmp_path_factory):
    from tokenizer_families import build_family

    root = tmp_path_factory.mktemp("piece-families")
    dirs = {
        name: build_family(name, root / name)
        for name in ("gpt2", "llama3", "qwen", "llama2", "mistral_metaspace")
    }
    # The layouts of the cl100k and o200k files (GPT-4, GPT-4o): the split kept as matches
    # (Removed, invert), and o200k's own pattern, on the Llama 3 family's vocabulary.
    from packtool.tokenize import _O200K

    for name, pattern in (("cl100k_removed", None), ("o200k", _O200K)):
        spec = json.loads((dirs["llama3"] / "tokenizer.json").read_text(encoding="utf-8"))
        split = spec["pre_tokenizer"]["pretokenizers"][0]
        split.update(behavior="Removed", invert=True)
        if pattern is not None:
            split["pattern"] = {"Regex": pattern}
        dirs[name] = root / name
        dirs[name].mkdir()
        (dirs[name] / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
        config = dirs["llama3"] / "tokenizer_config.json"
        (dirs[name] / "tokenizer_config.json").write_bytes(config.read_bytes())
    return dirs


def _huge_text() -> str:
    """Prose of the sample corpus (many lines) with the hard texts in between."""
    from tokenizer_families import hard_texts

    with open(SAMPLE, encoding="utf-8") as f:
        prose = [json.loads(line)["text"] for _, line in zip(range(60), f, strict=False)]
    hard = hard_texts()
    mixed = [t for pair in zip(prose, hard * 10, strict=False) for t in pair]
    return "\n".join(mixed) + "\nthe end"


@pytest.mark.parametrize("backend", ["hf", "fastokens", "gigatoken"])
@pytest.mark.parametrize("family", ["default", "gpt2", "llama3", "qwen"])
def test_a_huge_document_in_pieces_equals_it_whole(piece_dirs, monkeypatch, family, backend):
    """A document over HUGE_CHARS is encoded in pieces cut at single line breaks before letters
    (in a longer line, before a space between letters); its ids are those of the whole text,
    BOS (Llama 3) and EOS included."""
    import packtool.tokenize as tokenize

    tok = load_tokenizer(None if family == "default" else piece_dirs[family])
    text = _huge_text()
    whole = DocumentEncoder(tok, backend=backend).encode([text])
    monkeypatch.setattr(tokenize, "HUGE_CHARS", 1000)
    monkeypatch.setattr(tokenize, "PIECE_CHARS", 700)
    cuts = tokenize.cut_points(text, 700)
    assert len(cuts) > 20
    at_lines = [c for c in cuts[1:-1] if text[c - 1] == "\n"]
    assert len(at_lines) > 10  # line breaks first; a line longer than a piece at a space
    assert all(c in at_lines or (text[c] == " " and text[c - 1].isalpha()) for c in cuts[1:-1])
    encoder = DocumentEncoder(tok, backend=backend)
    assert encoder._in_pieces()  # this tokenizer allows pieces
    pieces = encoder.encode([text])
    assert encoder.backend.name == backend and encoder.backend.fallback_batches == 0
    assert pieces.ids.tolist() == whole.ids.tolist()
    assert pieces.lengths.tolist() == whole.lengths.tolist()
    # The cut matters: pieces cut elsewhere (mid-word) give other ids.
    mid = [text[i : i + 701] for i in range(0, len(text), 701)]
    assert [i for p in tok.encode_batch(mid, False) for i in p] != tok.encode_batch([text], False)[
        0
    ]


@pytest.mark.parametrize("backend", ["hf", "fastokens", "gigatoken"])
@pytest.mark.parametrize("family", ["default", "gpt2", "llama3", "qwen"])
def test_a_huge_one_line_document_in_pieces_equals_it_whole(
    piece_dirs, monkeypatch, family, backend
):
    """A huge document without line breaks is cut before single spaces between letters; its
    ids are those of the whole text (every script, digits, punctuation and space runs)."""
    import packtool.tokenize as tokenize

    tok = load_tokenizer(None if family == "default" else piece_dirs[family])
    text = " ".join(_huge_text().split("\n")).replace("\n", " ")
    assert "\n" not in text
    whole = DocumentEncoder(tok, backend=backend).encode([text])
    monkeypatch.setattr(tokenize, "HUGE_CHARS", 1000)
    monkeypatch.setattr(tokenize, "PIECE_CHARS", 700)
    cuts = tokenize.cut_points(text, 700)
    assert len(cuts) > 20 and all(text[c] == " " and text[c - 1].isalpha() for c in cuts[1:-1])
    encoder = DocumentEncoder(tok, backend=backend)
    assert encoder._in_pieces()
    pieces = encoder.encode([text])
    assert encoder.backend.fallback_batches == 0
    assert pieces.ids.tolist() == whole.ids.tolist()


@pytest.mark.parametrize("backend", ["hf", "auto"])
@pytest.mark.parametrize("shape", ["lines", "one line", "no whitespace"])
@pytest.mark.parametrize("family", ["cl100k_removed", "o200k", "mistral_metaspace"])
def test_huge_documents_of_more_layouts_in_pieces_equal_them_whole(
    piece_dirs, monkeypatch, family, shape, backend
):
    """cl100k/o200k files (their split kept as matches), Metaspace (cut at spaces only), and a
    text without any whitespace (cut between a letter and the punctuation, symbol or digit
    after it): the pieces' ids are the whole text's. Metaspace without whitespace has no
    exact cut: it is cut where it is, and the run says so."""
    import packtool.tokenize as tokenize

    tok = load_tokenizer(piece_dirs[family], backend=backend)
    text = _huge_text()
    if shape == "one line":
        text = text.replace("\n", " ")
    elif shape == "no whitespace":
        text = "".join(text.split())
    whole = DocumentEncoder(tok).encode([text])
    monkeypatch.setattr(tokenize, "HUGE_CHARS", 1000)
    monkeypatch.setattr(tokenize, "PIECE_CHARS", 700)
    encoder = DocumentEncoder(tok)
    assert encoder._in_pieces()
    pieces = encoder.encode([text])
    assert encoder.backend.fallback_batches == 0
    rule = "metaspace" if family == "mistral_metaspace" else "byte-level"
    cuts, inexact = tokenize.cut_plan(text, 700, rule)
    assert len(cuts) > 20
    if rule == "metaspace" and shape == "no whitespace":
        assert inexact == len(cuts) - 2 and encoder.backend.inexact_cuts == inexact
        assert "no exact cut was found" in encoder.backend.notices[-1]
        assert encoder.backend.describe()["inexact_cuts"] == inexact
        return
    assert inexact == 0 and encoder.backend.notices == []
    assert "inexact_cuts" not in encoder.backend.describe()
    assert pieces.ids.tolist() == whole.ids.tolist()


def test_a_huge_document_moves_the_progress_piece_by_piece(tmp_path, monkeypatch) -> None:
    """One huge document is one batch: its pieces report the characters encoded so far, so
    the bar (and a log's heartbeat) moves while it is encoded, never past the input's size."""
    import packtool.tokenize as tokenize

    text = _huge_text()
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": text}])
    monkeypatch.setattr(tokenize, "HUGE_CHARS", 1000)
    monkeypatch.setattr(tokenize, "PIECE_CHARS", 700)
    seen: list[int] = []

    def progress(stage: str, done: int, total: int | None) -> None:
        if stage == "tokenize":
            assert total == src.stat().st_size and done <= total
            seen.append(done)

    packtool.pack([src], tmp_path / "out", max_len=64, progress=progress)
    assert len(seen) > 10 and seen == sorted(seen) and seen[-1] == src.stat().st_size


def test_a_text_of_one_letter_is_cut_where_it_is_and_counted(monkeypatch) -> None:
    import packtool.tokenize as tokenize

    monkeypatch.setattr(tokenize, "HUGE_CHARS", 1000)
    monkeypatch.setattr(tokenize, "PIECE_CHARS", 700)
    encoder = DocumentEncoder(load_tokenizer())
    text = "a" * 20_000
    got = encoder.encode([text])
    cuts, inexact = tokenize.cut_plan(text, 700)
    assert cuts == [*range(0, 20_000 - 2800, 700), 20_000] and inexact == len(cuts) - 2
    assert encoder.backend.inexact_cuts == inexact
    assert got.lengths[0] > 0  # every character encoded; bounded pieces, not one word


@pytest.mark.parametrize("family", ["llama2"])
def test_tokenizers_that_mark_word_starts_keep_huge_documents_whole(piece_dirs, family):
    import packtool.tokenize as tokenize

    assert not tokenize.pieces_are_exact(load_tokenizer(piece_dirs[family]))


def test_pack_of_a_huge_document_is_the_same_in_pieces(tmp_path, monkeypatch) -> None:
    import packtool.tokenize as tokenize

    src = write_jsonl(tmp_path / "d.jsonl", [{"text": "short"}, {"text": _huge_text()}])
    packtool.pack([src], tmp_path / "whole", max_len=64, tokenizer_backend="hf")
    monkeypatch.setattr(tokenize, "HUGE_CHARS", 1000)
    monkeypatch.setattr(tokenize, "PIECE_CHARS", 700)
    for backend in ("hf", "fastokens", "gigatoken"):
        packtool.pack([src], tmp_path / backend, max_len=64, tokenizer_backend=backend)
        for a, b in zip(
            sorted((tmp_path / "whole").glob("*.arrow")),
            sorted((tmp_path / backend).glob("*.arrow")),
            strict=True,
        ):
            assert a.read_bytes() == b.read_bytes()


def test_check_sample_catches_a_divergence_the_gate_did_not_see(tmp_path, monkeypatch) -> None:
    """A document far into the input on which fastokens were wrong: the gate (first batch)
    passes; --check-sample re-encodes documents spread over the run and stops before
    anything is written."""
    import packtool.corpus as corpus

    texts = [f"document {i}: " + "some words here. " * 40 for i in range(60)]
    texts[47] = "the TRIGGER document " + texts[47]
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in texts])
    monkeypatch.setattr(corpus, "_BATCH_CHARS", 4000)  # document 47 is far from batch 1
    _faulty(monkeypatch, "TRIGGER", "ids")
    silent = packtool.pack([src], tmp_path / "silent", max_len=64, tokenizer_backend="fastokens")
    assert silent.backend["name"] == "fastokens" and silent.backend["documents_checked"] == 0
    with pytest.raises(TokenizerError, match="--check-sample: gigatoken and tokenizers give"):
        packtool.pack([src], tmp_path / "out", max_len=64, check_sample=60)
    assert not (tmp_path / "out").exists()


def test_check_sample_counts_the_documents_it_checked(tmp_path) -> None:
    texts = [f"document {i}: " + "words. " * (10 + i) for i in range(200)]
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in texts])
    report = packtool.pack([src], tmp_path / "out", max_len=64, check_sample=20)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    checked = manifest["tokenizer"]["backend"]["documents_checked"]
    assert report.backend["name"] == "gigatoken" and 15 <= checked <= 25
    with pytest.raises(OptionError, match="--check-sample must be an integer from 0 to"):
        PackOptions(check_sample=-1)


def test_stats_of_a_corpus_tokenizes_with_the_backend_layer(tmp_path, monkeypatch) -> None:
    """`stats CORPUS` takes --tokenizer-backend like pack, behind the same gate: the same
    figures on both engines, and the engine recorded."""
    from packtool.stats import corpus_stats

    got = {
        b: corpus_stats([SAMPLE], [512, 4096], tokenizer_backend=b, use_cache=False).to_dict()
        for b in ("hf", "fastokens", "auto")
    }
    assert got["hf"]["tokenizer_backend"]["name"] == "hf"
    assert got["fastokens"]["tokenizer_backend"]["name"] == "fastokens"
    assert got["auto"]["tokenizer_backend"]["name"] == "gigatoken"
    for key in ("document_lengths", "max_lens", "documents_read", "special_strings"):
        assert got["hf"][key] == got["fastokens"][key] == got["auto"][key], key
    # The same lengths as pack writes, on the fast engine.
    report = packtool.pack([SAMPLE], tmp_path / "out", max_len=4096)
    assert report.rows == got["fastokens"]["max_lens"][1]["rows"]
    # The CLI: the flag, its check, and the line in the table.
    cli = run("stats", SAMPLE, "-L", "512", "--tokenizer-backend", "fastokens", "--no-cache")
    assert cli.exit_code == 0, cli.output
    assert "tokenized with fastokens" in cli.stdout
    bad = run("stats", SAMPLE, "-L", "512", "--tokenizer-backend", "rust")
    assert_one_line_error(bad, "--tokenizer-backend must be one of", 2)
    packed = run("stats", tmp_path / "out", "--tokenizer-backend", "hf")
    assert_one_line_error(packed, "--tokenizer-backend applies to a corpus before packing", 2)
    # A fastokens that differs (here on the probes too): auto says so and uses tokenizers.
    _faulty(monkeypatch, "The", "ids")
    fell = corpus_stats([SAMPLE], [512], use_cache=False)
    assert fell.backend["name"] == "hf"
    assert fell.to_dict()["max_lens"] == got["hf"]["max_lens"][:1]
    assert fell.notices[-1].endswith(
        "The quick brown fox jumps ': tokenizing with Hugging Face tokenizers"
    )


def test_check_sample_is_refused_where_there_is_nothing_to_compare(tmp_path) -> None:
    """Instruction data is encoded with `tokenizers` only, and ids are not tokenized: a
    --check-sample there would check nothing, so it is refused, not silently ignored."""
    data = SAMPLE.parent
    chat = ["--chat-template", str(data / "chatml.jinja"), "--check-sample", "10"]
    assert_one_line_error(
        run("pack", data / "chat.jsonl", "-L", "512", "-o", tmp_path / "c", *chat),
        r"instruction data is encoded with Hugging Face tokenizers only",
    )
    ids = write_jsonl(tmp_path / "ids.jsonl", [{"ids": [1, 2, 3]}])
    assert_one_line_error(
        run(
            "pack",
            ids,
            "--ids-field",
            "ids",
            "--vocab-size",
            "10",
            "-L",
            "8",
            "-o",
            tmp_path / "i",
            "--check-sample",
            "5",
        ),
        r"pre-tokenized inputs \(--ids-field\) are not tokenized",
    )
    assert not (tmp_path / "c").exists() and not (tmp_path / "i").exists()


@pytest.mark.parametrize("bos", [None, False])
@pytest.mark.parametrize("family", ["gpt2", "llama3", "qwen", "llama2", "mistral_metaspace"])
def test_gigatoken_parses_special_strings_when_asked(piece_dirs, monkeypatch, family, bos):
    """gigatoken always matches special added tokens: packtool's copy for data that holds
    markup on purpose keeps them, the copy for text drops them; both through the gate, the
    post-processor's tokens (Llama's BOS) added by packtool."""
    from tokenizer_families import hard_texts

    monkeypatch.setenv("PACKTOOL_CACHE_DIR", tempfile.mkdtemp(prefix="packtool-giga-"))
    texts = [*hard_texts(), "<s>a</s> <|endoftext|> <|im_start|>user"]
    for parse_special in (False, True):
        tok = load_tokenizer(piece_dirs[family], backend="gigatoken")
        giga = DocumentEncoder(tok, parse_special=parse_special, bos=bos)
        got = giga.encode(texts)
        assert giga.backend.name == "gigatoken" and giga.backend.reason == "passed the parity gate"
        ref = DocumentEncoder(
            load_tokenizer(piece_dirs[family]), parse_special=parse_special, bos=bos
        )
        want = ref.encode(texts)
        assert got.ids.tolist() == want.ids.tolist()
        assert got.lengths.tolist() == want.lengths.tolist()


@pytest.mark.parametrize("family", ["default", "gpt2", "llama3", "qwen", "o200k"])
def test_no_whitespace_cuts_after_letters_only(piece_dirs, family) -> None:
    """Without whitespace a text is cut between a letter and a digit or punctuation after it,
    never after a numeral that is not a digit ("²"), which \\p{N}{1,3} joins with the digit
    after it; the pieces' ids are the whole text's."""
    import packtool.tokenize as tokenize

    tok = load_tokenizer(None if family == "default" else piece_dirs[family])
    text = "".join(f"ab²{i}7,cdé{i}x'sΩ½{i}" for i in range(800))
    cuts, inexact = tokenize.cut_plan(text, 100)
    assert inexact == 0 and len(cuts) > 50
    assert all(text[c - 1].isalpha() and not text[c - 1].isnumeric() for c in cuts[1:-1])
    whole = tok.encode_batch([text], False)[0]
    pieces = [
        i for a, b in itertools.pairwise(cuts) for i in tok.encode_batch([text[a:b]], False)[0]
    ]
    assert pieces == whole


def test_auto_takes_tokenizers_for_a_small_corpus(tmp_path: Path, monkeypatch) -> None:
    """A corpus under SMALL_CORPUS_BYTES (uncompressed) is encoded with `tokenizers` by
    `auto`, the reason recorded; at or over it, or compressed (its text's size not known),
    the fast backend; an explicit backend is kept whatever the size. The ids are the same."""
    from packtool.tokenize.registry import SMALL_CORPUS_BYTES, for_corpus

    monkeypatch.delenv("PACKTOOL_SMALL_CORPUS_BYTES")
    assert for_corpus("auto", SMALL_CORPUS_BYTES)[0] == "auto"
    assert for_corpus("gigatoken", 10)[0] == "gigatoken" and for_corpus("auto", None)[1] is None
    src = tmp_path / "small.jsonl"
    write_jsonl(src, [{"text": f"document {i} " * 20} for i in range(50)])
    small = packtool.pack([src], tmp_path / "a", max_len=64)
    assert small.backend["name"] == "hf"
    assert small.backend["reason"].startswith("auto: a small corpus (0.0")
    monkeypatch.setenv("PACKTOOL_SMALL_CORPUS_BYTES", "100")
    fast = packtool.pack([src], tmp_path / "b", max_len=64)
    assert fast.backend["name"] == "gigatoken"
    shards = [sorted((tmp_path / d).glob("*.arrow")) for d in ("a", "b")]
    assert [p.read_bytes() for p in shards[0]] == [p.read_bytes() for p in shards[1]]


def test_backend_versions_are_the_ones_importlib_metadata_reads(tmp_path, monkeypatch) -> None:
    """The versions a manifest and the gate's key record are read from the names of the
    ``.dist-info`` directories on ``sys.path`` (importing ``importlib.metadata`` costs a run
    ~17 ms before its first batch): for every distribution installed here, the version
    ``importlib.metadata`` gives; an ``.egg-info`` first, or a zip on the path, is left to it."""
    from importlib.metadata import distributions, version

    from packtool.tokenize.backend import package_version

    names = sorted({d.metadata["Name"] for d in distributions()})
    assert len(names) > 50 and {"tokenizers", "gigatoken", "fastokens"} <= set(names)
    for name in names:
        assert package_version.__wrapped__(name) == version(name), name
    assert package_version.__wrapped__("no-such-package-here") == "unknown"
    # An egg-info of the same name earlier on the path: importlib.metadata's answer.
    egg = tmp_path / "tokenizers-0.0.1.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: tokenizers\nVersion: 0.0.1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert package_version.__wrapped__("tokenizers") == "0.0.1" == version("tokenizers")


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), max_size=20),
    before=st.lists(st.integers(0, 99), max_size=2),
    after=st.lists(st.integers(0, 99), max_size=2),
)
def test_post_processor_affixes_wrap_each_document(lengths, before, after) -> None:
    """gigatoken's ids get the post-processor's tokens around each document (Llama 3's BOS)
    as a plain loop over the documents puts them."""
    from packtool.tokenize.gigatoken import _with_affixes

    ids = np.arange(sum(lengths), dtype=np.int32) + 1000
    got = _with_affixes(Flat(ids, np.array(lengths, np.int64)), before, after)
    expected, at = [], 0
    for n in lengths:
        expected += [*before, *ids[at : at + n].tolist(), *after]
        at += n
    assert got.ids.tolist() == expected
    assert got.lengths.tolist() == [n + len(before) + len(after) for n in lengths]


def _long_and_short(n: int = 12) -> list[str]:
    """Hard texts of every kind, alone (short) and joined into texts past ALONE_CHARS."""
    from tokenizer_families import hard_texts

    from packtool.tokenize.gigatoken import ALONE_CHARS

    hard = [*hard_texts(), *TEXTS]
    joined = "\n".join(hard)
    long = [(joined[i:] + joined) * (ALONE_CHARS // len(joined) + 1) for i in range(0, n * 7, 7)]
    return [t for pair in zip(long, hard, strict=False) for t in pair] + [long[-1], ""]


@pytest.mark.parametrize("add_special", [False, True])
@pytest.mark.parametrize("family", ["gpt2", "llama3", "qwen", "o200k", "cl100k_removed"])
def test_gigatoken_encodes_long_texts_one_at_a_time_as_tokenizers_does(
    piece_dirs, family, add_special
) -> None:
    """A batch of texts of ALONE_CHARS characters or more each is encoded one text at a time
    (no awkward array), a batch with shorter ones in one call: either way the ids are those of
    `tokenizers`, the post-processor's tokens (Llama 3's BOS) around each document."""
    from packtool.tokenize.gigatoken import ALONE_CHARS, GigatokenEngine

    tok = load_tokenizer(piece_dirs[family])
    engine, _ = tok.engine("gigatoken")
    assert isinstance(engine, GigatokenEngine)
    texts = _long_and_short()
    assert sum(len(t) >= ALONE_CHARS for t in texts) == 13 and min(map(len, texts)) == 0
    want = [e.ids for e in tok.encodings(texts, add_special, False)]
    for batch in (texts, texts[::2], texts[1::2][:-1]):  # mixed, long only, short only
        got = engine.encode(batch, add_special, False)
        assert got.ids.dtype == np.int32
        assert got.lists() == [want[texts.index(t)] for t in batch]


def test_gigatoken_takes_one_call_at_a_time(piece_dirs) -> None:
    """Two threads encoding long texts (``encode`` borrows gigatoken's copy mutably) and a
    batch of short ones at once: no call raises (gigatoken's "Already borrowed"), and each
    gets the ids it gets alone."""
    import threading

    from packtool.tokenize.gigatoken import GigatokenEngine

    engine, _ = load_tokenizer(piece_dirs["qwen"]).engine("gigatoken")
    assert isinstance(engine, GigatokenEngine)
    texts = _long_and_short()
    batches = [texts, texts[1::2][:-1], texts[::2]]
    alone = [engine.encode(b, True, False).lists() for b in batches]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for _ in range(6):
                assert engine.encode(batches[k], True, False).lists() == alone[k]
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in (0, 1, 2, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_the_gate_sees_a_difference_in_gigatokens_one_at_a_time_path(tmp_path, monkeypatch) -> None:
    """The probes are also encoded joined into one long text, so a backend that encodes long
    texts another way is compared there too: a fault in gigatoken's one-at-a-time path alone
    (data of short documents) fails the gate."""
    import gigatoken

    from packtool.tokenize.gate import LONG_PROBE_CHARS, probe_texts

    assert len(probe_texts(load_tokenizer())[-1]) >= LONG_PROBE_CHARS
    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(tmp_path / "cache"))
    real = gigatoken.Tokenizer.encode

    def encode(self, text):
        ids = real(self, text).copy()
        if len(ids) > 1:
            ids[-1] ^= 1
        return ids

    monkeypatch.setattr(gigatoken.Tokenizer, "encode", encode)
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in TEXTS])
    with pytest.raises(TokenizerError, match="gigatoken differs from tokenizers on 'Hello, world"):
        packtool.pack([src], tmp_path / "out", max_len=32, tokenizer_backend="gigatoken")


def test_a_pack_of_long_documents_never_imports_awkward(tmp_path) -> None:
    """gigatoken's batches come as awkward arrays, whose import holds the GIL for 0.1-0.2 s:
    a corpus of long documents is encoded one document at a time, without it."""
    import os
    import subprocess
    import sys

    from packtool.tokenize.gigatoken import ALONE_CHARS

    texts = [t for t in _long_and_short() if len(t) >= ALONE_CHARS]
    src = write_jsonl(tmp_path / "long.jsonl", [{"text": t} for t in texts])
    script = (
        "import sys, packtool\n"
        "r = packtool.pack([sys.argv[1]], sys.argv[2], max_len=512,\n"
        "                  tokenizer_backend='gigatoken')\n"
        "print(r.backend['name'], r.documents.read, 'awkward' in sys.modules)\n"
    )
    env = {**os.environ, "PACKTOOL_CACHE_DIR": str(tmp_path / "cache")}
    runs = [
        subprocess.run(
            [sys.executable, "-c", script, str(src), str(tmp_path / out)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout.split()
        for out in ("cold", "warm")
    ]
    # The first run's parity gate encodes the short probes in a batch; a later one has its
    # verdict and encodes the corpus alone.
    assert runs == [["gigatoken", str(len(texts)), v] for v in ("True", "False")]


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 400), max_size=12),
    picks=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 99)), max_size=14),
)
def test_ids_are_inserted_as_numpy_inserts_them(lengths, picks) -> None:
    """``insert_ids`` copies slices between few insertions (long documents) and falls back to
    NumPy's mask otherwise: either way the array of ``np.insert``, equal positions in order."""
    from packtool.tokenize.backend import insert_ids

    ids = np.arange(sum(lengths), dtype=np.int32) + 1000
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    where = np.array(sorted(int(bounds[min(k, len(lengths))]) for k, _ in picks), np.int64)
    values = np.array([v for _, v in picks], np.int32)
    got = insert_ids(ids, where, values)
    assert got.dtype == np.int32
    assert got.tolist() == np.insert(ids, where, values).tolist()
