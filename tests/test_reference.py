"""The EOS a pack appends (named, and a note when it is a chat end-of-turn token), and
transformers' AutoTokenizer as a reference (a note at pack time, ``verify --reference``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import write_jsonl
from test_cli import assert_one_line_error, run
from tokenizer_families import build_chat_family, build_family

import packtool
from packtool.errors import OptionError
from packtool.reference import PROBE_STRINGS, start_probe
from packtool.verification import verify

TEXTS = [{"text": t} for t in ["  hello world", "Hello world.", "a\n\nb  c", "don't 12345"]]


def _pack_json(*args) -> dict:
    result = run("pack", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_eos_of_a_chat_config_is_named_and_noted(tmp_path: Path) -> None:
    directory = build_chat_family("qwen3", tmp_path / "qwen3", "qwen3.jinja")
    src = write_jsonl(tmp_path / "t.jsonl", TEXTS)
    tok = packtool.load_tokenizer(directory)
    summary = _pack_json(src, "-L", "64", "-o", tmp_path / "o", "--tokenizer", directory)
    im_end = tok.token_to_id("<|im_end|>")
    assert summary["eos_appended"] == {"token": "<|im_end|>", "id": im_end}
    (note,) = [n for n in summary["notices"] if "EOS appended" in n]
    assert "end-of-turn token" in note and "--eos-token <|endoftext|>" in note
    result = run("pack", src, "-L", "64", "-o", tmp_path / "p", "--tokenizer", directory)
    assert "note: the EOS appended to every document is <|im_end|>" in result.stderr
    assert "<|im_end|> (id" in result.stdout  # the summary's row
    # Another EOS chosen: named, no note.
    summary = _pack_json(
        src, "-L", "64", "-o", tmp_path / "q", "--tokenizer", directory,
        "--eos-token", "<|endoftext|>",
    )  # fmt: skip
    assert summary["eos_appended"]["token"] == "<|endoftext|>"
    assert not [n for n in summary["notices"] if "EOS appended" in n]


def test_a_real_end_of_text_gets_no_note(tmp_path: Path) -> None:
    directory = build_chat_family("deepseekv3", tmp_path / "ds", "deepseekv3.jinja")
    src = write_jsonl(tmp_path / "t.jsonl", TEXTS)
    summary = _pack_json(src, "-L", "64", "-o", tmp_path / "o", "--tokenizer", directory)
    assert summary["eos_appended"]["token"] == "<｜end▁of▁sentence｜>"
    assert not [n for n in summary["notices"] if "EOS appended" in n]


def test_chats_append_no_eos(tmp_path: Path) -> None:
    directory = build_chat_family("qwen3", tmp_path / "qwen3", "qwen3.jinja")
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    src = write_jsonl(tmp_path / "c.jsonl", [{"messages": chat}])
    summary = _pack_json(src, "-L", "64", "-o", tmp_path / "o", "--tokenizer", directory)
    assert summary["eos_appended"] is None
    assert not [n for n in summary["notices"] if "EOS appended" in n]


def _llama2(directory: Path, tokenizer_class: str) -> Path:
    build_family("llama2", directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = tokenizer_class
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def test_transformers_probe_notes_a_class_that_rebuilds_the_tokenizer(tmp_path: Path) -> None:
    """Llama 2's LlamaTokenizer drops a leading space that tokenizer.json keeps."""
    src = write_jsonl(tmp_path / "t.jsonl", TEXTS)
    directory = _llama2(tmp_path / "llama2", "LlamaTokenizer")
    report = packtool.pack([src], tmp_path / "o", max_len=64, tokenizer=directory)
    (note,) = [n for n in report.notices if "AutoTokenizer" in n]
    assert "tokenizer_class LlamaTokenizer" in note
    assert f"of {len(PROBE_STRINGS)} probe strings" in note
    # verify --against: the pack's ids are tokenizer.json's, not AutoTokenizer's
    assert verify(tmp_path / "o", against=[src]).ok
    report = verify(tmp_path / "o", against=[src], reference="transformers")
    assert not report.ok
    assert any(p.check == "against" for p in report.problems)
    result = run("verify", tmp_path / "o", "--against", src, "--reference", "transformers")
    assert result.exit_code == 1, result.output


def test_probe_verdict_is_kept_for_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first pack with a directory runs the probe (a process importing transformers);
    the next one with the same files reads its verdict, starts no process, and gives the
    same note (naming the directory it was given); a changed file runs it again."""
    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(tmp_path / "cache"))
    src = write_jsonl(tmp_path / "t.jsonl", TEXTS)
    directory = _llama2(tmp_path / "llama2", "LlamaTokenizer")
    tok = packtool.load_tokenizer(directory)
    first = start_probe(tok)
    assert first is not None and first.process is not None
    note = first.note()
    assert note is not None and "tokenizer_class LlamaTokenizer" in note
    again = start_probe(tok)
    assert again is not None and again.process is None  # no process: the kept verdict
    assert again.note() == note
    report = packtool.pack([src], tmp_path / "o", max_len=64, tokenizer=directory)
    assert [n for n in report.notices if "AutoTokenizer" in n] == [note]
    # the same files in another directory: the kept verdict, the note names this directory
    import shutil

    other = shutil.copytree(directory, tmp_path / "elsewhere")
    moved = start_probe(packtool.load_tokenizer(other))
    assert moved is not None and moved.process is None
    assert moved.note() == note.replace(str(directory), str(other))
    # another tokenizer file: another key, the probe runs again
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["model_max_length"] = 77
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    changed = start_probe(packtool.load_tokenizer(directory))
    assert changed is not None and changed.process is not None
    changed.stop()  # a failed run ends the probe's process without waiting for it
    assert changed.process.poll() is not None


def test_no_probe_for_a_class_that_loads_tokenizer_json(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "t.jsonl", TEXTS)
    directory = _llama2(tmp_path / "llama2", "PreTrainedTokenizerFast")
    assert start_probe(packtool.load_tokenizer(directory)) is None
    report = packtool.pack([src], tmp_path / "o", max_len=64, tokenizer=directory)
    assert not [n for n in report.notices if "AutoTokenizer" in n]
    assert verify(tmp_path / "o", against=[src], reference="transformers").ok


def test_reference_transformers_is_for_text(tmp_path: Path) -> None:
    directory = build_chat_family("qwen3", tmp_path / "qwen3", "qwen3.jinja")
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    src = write_jsonl(tmp_path / "c.jsonl", [{"messages": chat}])
    packtool.pack([src], tmp_path / "o", max_len=64, tokenizer=directory)
    with pytest.raises(OptionError, match="compares text documents"):
        verify(tmp_path / "o", against=[src], reference="transformers")
    result = run("verify", tmp_path / "o", "--against", src, "--reference", "nope")
    assert_one_line_error(result, r"--reference must be one of file, transformers")
