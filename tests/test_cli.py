"""The command line, through typer's runner: success paths and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE, write_jsonl
from helpers import read_rows
from typer.testing import CliRunner

from packtool.cli import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_error(result, pattern: str, code: int | None = None) -> None:
    import re

    assert result.exit_code != 0, result.output
    if code is not None:
        assert result.exit_code == code
    text = result.stderr.strip()
    assert "Traceback" not in result.output + result.stderr
    assert text.startswith("Error: "), text
    assert len(text.splitlines()) == 1, text
    assert re.search(pattern, text), text


def test_pack_sample_and_summary(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run("pack", SAMPLE, "--max-len", "4096", "-o", out, "--rows-per-shard", "100")
    assert result.exit_code == 0, result.output + result.stderr
    manifest, rows = read_rows(out)
    assert "documents read" in result.stdout and "packing efficiency" in result.stdout
    assert f"{manifest['rows']:,}" in result.stdout
    assert manifest["options"]["rows_per_shard"] == 100
    assert len(rows) == manifest["rows"] > 0


def test_progress_lines_off_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a log file (a Slurm job, CI) the bars are drawn only at the end: plain lines say
    that a long stage moves (every LOG_PROGRESS_SECONDS; 0 here), and -q silences them."""
    from packtool.render import progress

    monkeypatch.setattr(progress, "LOG_PROGRESS_SECONDS", 0.0)
    result = run("pack", SAMPLE, "--max-len", "4096", "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output + result.stderr
    lines = result.stderr.splitlines()
    assert any(line.startswith("read + tokenize: 100% 5.4/5.4 MB (") for line in lines), lines
    assert any(line.startswith("write rows: 100% 296/296 (") for line in lines), lines
    quiet = run("pack", SAMPLE, "--max-len", "4096", "-o", tmp_path / "q", "-q")
    assert quiet.exit_code == 0 and quiet.stderr == "", quiet.stderr
    monkeypatch.setattr(progress, "LOG_PROGRESS_SECONDS", 30.0)  # the default: a short run, no line
    result = run("pack", SAMPLE, "--max-len", "4096", "-o", tmp_path / "short")
    assert "read + tokenize:" not in result.stderr


def test_pack_json_summary(tmp_path: Path) -> None:
    result = run("pack", SAMPLE, "--max-len", "2048", "-o", tmp_path / "o", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["rows"] == json.loads((tmp_path / "o" / "manifest.json").read_text())["rows"]
    assert data["documents"]["read"] == 2500


def test_default_output_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = write_jsonl(tmp_path / "corpus.jsonl", [{"text": "hello world"}])
    monkeypatch.chdir(tmp_path)
    result = run("pack", src, "--max-len", "64", "-q")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "corpus-packed-64" / "manifest.json").exists()
    assert result.stdout == ""


def test_version_and_help() -> None:
    assert run("--version").stdout.startswith("packtool ")
    result = run("pack", "--help")
    assert result.exit_code == 0
    for option in ("--max-len", "--tokenizer", "--overflow", "--skip-bad-records", "--seed"):
        assert option in result.stdout


def test_error_missing_input(tmp_path: Path) -> None:
    assert_one_line_error(
        run("pack", tmp_path / "nope.jsonl", "--max-len", "64", "-o", tmp_path / "o"),
        r"nope\.jsonl: no such file or directory",
    )
    assert not (tmp_path / "o").exists()


def test_error_malformed_json(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text('{"text": "a"}\n{"text": "b",,}\n')
    assert_one_line_error(
        run("pack", tmp_path / "in.jsonl", "--max-len", "64", "-o", tmp_path / "o"),
        r"in\.jsonl:2: malformed JSON.*--skip-bad-records",
    )
    assert not (tmp_path / "o").exists()


def test_error_missing_field_lists_fields(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "in.jsonl", [{"content": "a", "meta": 1}])
    assert_one_line_error(
        run("pack", tmp_path / "in.jsonl", "--max-len", "64", "-o", tmp_path / "o"),
        r"in\.jsonl:1: no field 'text' \(fields found: 'content', 'meta'\).*--text-field",
    )
    ok = run(
        "pack",
        tmp_path / "in.jsonl",
        "--max-len",
        "64",
        "-o",
        tmp_path / "o",
        "--text-field",
        "content",
        "-q",
    )
    assert ok.exit_code == 0, ok.stderr


def test_error_missing_field_names_a_chat_field(tmp_path: Path) -> None:
    """Chats under another field than `messages` read as text (auto shape): the error names
    --messages-field with the field that holds them, not only --text-field."""
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    write_jsonl(tmp_path / "c.jsonl", [{"id": 3, "conversation": chat}])
    assert_one_line_error(
        run("pack", tmp_path / "c.jsonl", "--max-len", "64", "-o", tmp_path / "o"),
        r"c\.jsonl:1: no field 'text' \(fields found: 'id', 'conversation'\) \(choose the field "
        r"with --text-field; for these chats, --messages-field conversation; or pass --skip",
    )


def test_error_non_string_text(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}, {"text": ["a", "list"]}])
    assert_one_line_error(
        run("pack", tmp_path / "in.jsonl", "--max-len", "64", "-o", tmp_path / "o"),
        r"in\.jsonl:2: field 'text' is array, not a string",
    )


def test_skip_bad_records_reports(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text('{"text": "a"}\n{"text": 3}\n{"text": "b"}\n')
    result = run(
        "pack", tmp_path / "in.jsonl", "--max-len", "64", "-o", tmp_path / "o", "--skip-bad-records"
    )
    assert result.exit_code == 0, result.stderr
    assert "skipped:" in result.stderr and "in.jsonl:2" in result.stderr
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["documents"]["bad_records_skipped"] == 1
    assert manifest["documents"]["read"] == 3


@pytest.mark.parametrize("value", ["1", "0", "-5"])
def test_error_max_len(tmp_path: Path, value: str) -> None:
    assert_one_line_error(
        run("pack", SAMPLE, "--max-len", value, "-o", tmp_path / "o"),
        r"--max-len must be an integer from 2 to 16,777,216",
        code=2,
    )


def test_max_len_takes_k_as_stats_does(tmp_path: Path) -> None:
    """`pack -L 4k` is `-L 4096` (as `stats --max-len 4k`); a bad value is one line."""
    assert run("pack", SAMPLE, "-L", "4k", "-o", tmp_path / "k", "-q").exit_code == 0
    assert run("pack", SAMPLE, "-L", "4096", "-o", tmp_path / "n", "-q").exit_code == 0
    assert json.loads((tmp_path / "k" / "manifest.json").read_text())["max_len"] == 4096
    k, n = sorted((tmp_path / "k").glob("*.arrow")), sorted((tmp_path / "n").glob("*.arrow"))
    assert [p.read_bytes() for p in k] == [p.read_bytes() for p in n]
    result = run("pack", SAMPLE, "-L", "4x", "-o", tmp_path / "x")
    assert result.exit_code == 2 and "cannot read '4x' as a number of tokens" in result.output
    assert not (tmp_path / "x").exists()


def test_error_tokenizer_not_found(tmp_path: Path) -> None:
    assert_one_line_error(
        run(
            "pack",
            SAMPLE,
            "--max-len",
            "64",
            "-o",
            tmp_path / "o",
            "--tokenizer",
            tmp_path / "missing" / "tokenizer.json",
        ),
        r"no such file or directory",
    )
    # A hub name while offline (the suite sets HF_HUB_OFFLINE=1): the clear message.
    assert_one_line_error(
        run(
            "pack",
            SAMPLE,
            "--max-len",
            "64",
            "-o",
            tmp_path / "o",
            "--tokenizer",
            "some-org/some-model-that-is-not-cached",
        ),
        r"'some-org/some-model-that-is-not-cached' is not a local file or directory.*offline",
    )
    (tmp_path / "model").mkdir()
    assert_one_line_error(
        run(
            "pack",
            SAMPLE,
            "--max-len",
            "64",
            "-o",
            tmp_path / "o",
            "--tokenizer",
            tmp_path / "model",
        ),
        r"model: the directory has no tokenizer\.json",
    )
    (tmp_path / "broken.json").write_text("{}")
    assert_one_line_error(
        run(
            "pack",
            SAMPLE,
            "--max-len",
            "64",
            "-o",
            tmp_path / "o",
            "--tokenizer",
            tmp_path / "broken.json",
        ),
        r"broken\.json: cannot load as a tokenizers tokenizer\.json",
    )
    assert not (tmp_path / "o").exists()


def test_error_output_exists(tmp_path: Path) -> None:
    (tmp_path / "o").mkdir()
    assert_one_line_error(
        run("pack", SAMPLE, "--max-len", "64", "-o", tmp_path / "o"),
        r"already exists \(pass --overwrite to replace it\)",
    )
    # under a file (it said only "File exists", naming the file)
    src = write_jsonl(tmp_path / "c.jsonl", [{"text": "hi"}])
    assert_one_line_error(
        run("pack", src, "--max-len", "64", "-o", tmp_path / "c.jsonl" / "out"),
        r"output directory .*c\.jsonl/out cannot be made: .*c\.jsonl is a file, not a directory",
    )


def test_error_bad_overflow_and_eos_token(tmp_path: Path) -> None:
    assert_one_line_error(
        run("pack", SAMPLE, "--max-len", "64", "-o", tmp_path / "o", "--overflow", "wrap"),
        r"--overflow must be one of split",
    )
    assert_one_line_error(
        run("pack", SAMPLE, "--max-len", "64", "-o", tmp_path / "o", "--eos-token", "<nope>"),
        r"no token '<nope>'.*--eos-token",
    )


def test_tokenizer_directory_with_config(tmp_path: Path) -> None:
    from packtool.tokenize import _DATA

    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_bytes((_DATA / "tokenizer.json").read_bytes())
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|sep|>"}))
    write_jsonl(tmp_path / "in.jsonl", [{"text": "hello"}])
    result = run(
        "pack",
        tmp_path / "in.jsonl",
        "--max-len",
        "16",
        "-o",
        tmp_path / "o",
        "--tokenizer",
        model,
        "-q",
    )
    assert result.exit_code == 0, result.stderr
    _, rows = read_rows(tmp_path / "o")
    sep = json.loads((tmp_path / "o" / "manifest.json").read_text())["tokenizer"]
    assert sep["special_tokens"]["eos_id"] == 5
    assert rows[0]["input_ids"][rows[0]["num_tokens"] - 1] == 5


def test_a_number_given_as_eos_token_is_an_id(tmp_path: Path) -> None:
    """`--eos-token 7` is id 7, not the digit token "7" the bundled vocabulary also has."""
    from packtool.tokenize import load_tokenizer

    tok = load_tokenizer(None)
    assert tok.token_to_id("7") not in (None, 7)  # the ambiguity is real in this vocabulary
    assert load_tokenizer(None, eos_token="7").special.eos_id == 7
    assert load_tokenizer(None, eos_token="<|im_end|>").special.eos_id == tok.token_to_id(
        "<|im_end|>"
    )
    result = run("pack", SAMPLE, "-L", "512", "--eos-token", "8192", "-o", tmp_path / "o")
    assert result.exit_code != 0 and "no token '8192'" in result.output


def test_an_eos_token_on_chats_without_eos_is_said(tmp_path: Path) -> None:
    """Chats get no EOS by default (the template closes every turn): --eos-token alone would
    change nothing, so a note says to add --eos; with --eos there is no note."""
    data = SAMPLE.parent
    base = ("pack", data / "chat.jsonl", "--chat-template", data / "chatml.jinja", "-L", "2048")
    alone = run(*base, "--eos-token", "2", "-o", tmp_path / "a", "-q")
    assert alone.exit_code == 0 and "add --eos to append it" in alone.stderr
    both = run(*base, "--eos-token", "2", "--eos", "-o", tmp_path / "b", "-q")
    assert both.exit_code == 0 and "--eos-token" not in both.stderr


def test_special_strings_note_counts_in_english() -> None:
    from packtool.render.pack import special_strings_line

    assert special_strings_line(0, False) is None
    assert special_strings_line(1, False).startswith("1 document holds special-token strings")
    assert special_strings_line(1, True).startswith("1 document holds special-token strings;")
    assert special_strings_line(12, False).startswith("12 documents hold special-token strings")


def test_the_bundled_tokenizer_is_said(tmp_path: Path) -> None:
    """Without --tokenizer the ids are those of a toy 8,192-id BPE, valid ids for any larger
    model: the summary names the tokenizer, and a note says to pass --tokenizer."""
    src = write_jsonl(tmp_path / "c.jsonl", [{"text": "hello world"}])
    result = run("pack", src, "-L", "64", "-o", tmp_path / "a")
    assert result.exit_code == 0, result.output
    assert "bundled sample tokenizer" in result.stderr and "pass --tokenizer" in result.stderr
    assert "packtool-default (8,192 ids)" in result.stdout
    bundled = REPO / "packtool" / "_data" / "tokenizer.json"  # the same file, named by the user
    result = run("pack", src, "-L", "64", "-o", tmp_path / "b", "--tokenizer", bundled)
    assert result.exit_code == 0, result.output
    assert "bundled sample tokenizer" not in result.stderr
    assert "packtool-default" not in result.stdout and "(8,192 ids)" in result.stdout
    stats = run("stats", src, "-L", "64", "--cache-dir", tmp_path / "cache")
    assert "bundled sample tokenizer" in stats.stderr


def test_a_pack_inside_its_input_directory_is_not_read_again(tmp_path: Path) -> None:
    """`pack DIR -o DIR/packed`, run again with --overwrite, read its own earlier shards and
    JSON files as inputs (an error naming a shard, or, with --ids-field, packed rows taken for
    documents): a packtool output inside an input directory is skipped, and said."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_jsonl(corpus / "a.jsonl", [{"text": f"document {i}"} for i in range(5)])
    args = ("pack", corpus, "-L", "64", "-o", corpus / "packed", "--json")
    first = run(*args)
    assert first.exit_code == 0, first.output
    again = run(*args, "--overwrite")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["documents"] == json.loads(first.stdout)["documents"]
    assert "skipped: 1 packtool output in the input directories, not read as inputs: " in (
        again.stderr
    )
    assert str(corpus / "packed") in again.stderr
    _, rows = read_rows(corpus / "packed")
    assert sum(len(r["doc_ids"]) for r in rows) == 5


def test_a_shard_size_below_one_row_is_said(tmp_path: Path) -> None:
    """--shard-size smaller than one row writes one row per shard: said in a note (it was
    silent, and 1KB gave thousands of shards), the rows as they would be otherwise."""
    out = tmp_path / "out"
    result = run("pack", SAMPLE, "-L", "512", "-o", out, "--shard-size", "1KB")
    assert result.exit_code == 0, result.output
    said = "note: --shard-size 1KB holds less than one row (about 4,160 bytes at --max-len 512)"
    assert said in result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert {s["rows"] for s in manifest["shards"]} == {1}
    plain = run("pack", SAMPLE, "-L", "512", "-o", tmp_path / "plain", "-q")
    assert plain.exit_code == 0 and "--shard-size" not in plain.stderr


def test_a_stage_without_reports_still_logs_a_heartbeat(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Off a terminal, a stage that has not finished gets its plain line every
    LOG_PROGRESS_SECONDS even when no report comes (one huge document in the tokenizer), with
    the time elapsed since the run began, not since the stage's first report."""
    import time

    from packtool.render import progress

    monkeypatch.setattr(progress, "LOG_PROGRESS_SECONDS", 0.2)
    with progress.RichProgress(True) as bars:
        time.sleep(1.1)  # loading, the first batch...
        bars("tokenize", 1_000_000, 5_000_000)
        time.sleep(0.8)  # no report: the heartbeat writes the lines
        bars("tokenize", 5_000_000, 5_000_000)
    lines = [
        line for line in capsys.readouterr().err.splitlines() if line.startswith("read + tokenize")
    ]
    beats = [line for line in lines if "1.0/5.0 MB" in line]
    assert len(beats) >= 2, lines
    assert all(line.startswith("read + tokenize:  20% 1.0/5.0 MB (0:00:0") for line in beats)
    assert any(line.endswith("(0:00:01 elapsed)") for line in beats), beats


def test_exit_codes_are_as_docs_cli_md_says(tmp_path: Path) -> None:
    """1: an input, an output or the data is wrong; 2: an option is wrong (docs/cli.md)."""
    out = tmp_path / "out"
    assert run("pack", SAMPLE, "-L", "4096", "-o", out, "-q").exit_code == 0
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "fine"}, {"txt": "no field"}])
    for args, code in (
        (["pack", tmp_path / "missing.jsonl", "-L", "512", "-o", tmp_path / "a"], 1),
        (["pack", bad, "-L", "512", "-o", tmp_path / "b"], 1),
        (["pack", SAMPLE, "-L", "512", "-o", out], 1),
        (["pack", SAMPLE, "-L", "0", "-o", tmp_path / "c"], 2),
        (["pack", SAMPLE, "-o", tmp_path / "d"], 2),
        (["pack", SAMPLE, "-L", "512", "--frobnicate", "-o", tmp_path / "e"], 2),
        (["inspect", out, "--row", "1000000"], 2),
        (["export", out, "--to", "nope", "-o", tmp_path / "f"], 2),
    ):
        result = run(*args)
        assert result.exit_code == code, (args, result.output)
        assert "Traceback" not in result.output
    doc = " ".join((REPO / "docs" / "cli.md").read_text("utf-8").split())
    assert "1 when an input, an output or the data is wrong" in doc
    assert "2 when an option is wrong" in doc
