"""Mistakes a new user made in a trial run, each now a one-line error (or a safe default)."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import hypothesis.strategies as st
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import REPO, SAMPLE, CharTokenizer, write_jsonl
from helpers import documents_from_rows, read_rows
from hypothesis import given, settings
from test_cli import assert_one_line_error, run

import packtool
from packtool.errors import InputError, OptionError, OutputExistsError, TokenizerError
from packtool.store import lock_output


def test_overwrite_never_deletes_a_directory_that_is_not_an_output(tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    assert_one_line_error(
        run("pack", SAMPLE, "-L", "512", "-o", precious, "--overwrite"),
        r"is not a packtool output \(no manifest\.json\) and not empty",
    )
    assert (precious / "notes.txt").read_text() == "mine"
    # Without --overwrite, the error does not suggest the flag that would be refused too.
    result = run("pack", SAMPLE, "-L", "512", "-o", precious)
    assert_one_line_error(result, r"is not a packtool output \(no manifest\.json\) and not empty")
    assert "pass --overwrite" not in result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run("pack", SAMPLE, "-L", "512", "-o", empty, "--overwrite", "-q").exit_code == 0
    assert (empty / "manifest.json").exists()
    # A packtool output is replaced, as before.
    assert run("pack", SAMPLE, "-L", "1024", "-o", empty, "--overwrite", "-q").exit_code == 0
    assert json.loads((empty / "manifest.json").read_text())["max_len"] == 1024
    (tmp_path / "afile").write_text("x")
    assert_one_line_error(
        run("pack", SAMPLE, "-L", "512", "-o", tmp_path / "afile", "--overwrite"),
        r"exists and is not a directory",
    )


def test_a_second_run_on_the_same_output_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with (
        lock_output(out),
        pytest.raises(OutputExistsError, match=rf"another packtool pack \(pid {os.getpid()}\)"),
    ):
        packtool.pack([SAMPLE], out, max_len=512)
    assert not (tmp_path / ".out.packtool-lock").exists()
    packtool.pack([SAMPLE], out, max_len=512)  # the lock is gone with the first run


def test_pad_id_and_txt_unit_are_checked(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"--pad-id 99999 is not a token id .*0 to 8191"):
        packtool.pack([SAMPLE], tmp_path / "o", max_len=64, pad_id=99999)
    with pytest.raises(OptionError, match=r"--pad-id -5 is not a token id"):
        packtool.pack([SAMPLE], tmp_path / "o", max_len=64, pad_id=-5)
    assert_one_line_error(
        run("pack", SAMPLE, "-L", "64", "-o", tmp_path / "o", "--txt-unit", "sentence"),
        r"--txt-unit must be line, paragraph or document, got 'sentence'",
    )
    assert not (tmp_path / "o").exists()


def test_all_records_bad_is_an_error_not_an_empty_output(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"body": "x"}] * 50)
    with pytest.raises(InputError, match=r"all 50 records were bad.*in\.jsonl:1: no field 'text'"):
        packtool.pack(
            [src], tmp_path / "o", max_len=64, skip_bad_records=True, tokenizer=CharTokenizer()
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_truncated_compressed_inputs_are_named(tmp_path: Path) -> None:
    data = "".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(3000)).encode()
    z = zstandard.ZstdCompressor().compress(data)
    (tmp_path / "cut.jsonl.zst").write_bytes(z[: len(z) // 2])
    (tmp_path / "tiny.jsonl.zst").write_bytes(z[:200])
    g = gzip.compress(data)
    (tmp_path / "cut.jsonl.gz").write_bytes(g[:300])
    (tmp_path / "notgz.jsonl.gz").write_bytes(b"id,text\n1,x\n")
    for name, pattern in [
        ("cut.jsonl.zst", r"cut\.jsonl\.zst.*[Tt]runcated"),
        ("tiny.jsonl.zst", r"tiny\.jsonl\.zst.*[Tt]runcated"),
        ("cut.jsonl.gz", r"cut\.jsonl\.gz.*(ends early|end-of-stream|cannot read)"),
        ("notgz.jsonl.gz", r"notgz\.jsonl\.gz.*(gzip|cannot read)"),
    ]:
        for skip in ([], ["--skip-bad-records"]):
            assert_one_line_error(
                run("pack", tmp_path / name, "-L", "64", "-o", tmp_path / "o", *skip), pattern
            )
            assert not (tmp_path / "o").exists()


def test_default_output_name_from_a_glob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "d").mkdir()
    write_jsonl(tmp_path / "d" / "a.jsonl", [{"text": "hello"}])
    monkeypatch.chdir(tmp_path)
    result = run("pack", "d/*.jsonl", "-L", "64", "-q")
    assert result.exit_code == 0, result.stderr
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith("-packed-64")] == [
        "corpus-packed-64"
    ]


@pytest.mark.slow
def test_sigterm_cleans_up_and_exits_143(tmp_path: Path) -> None:
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    src = tmp_path / "big.jsonl"
    src.write_text("\n".join(lines * 3) + "\n", encoding="utf-8")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "packtool.cli",
            "pack",
            str(src),
            "-L",
            "1024",
            "-o",
            str(tmp_path / "out"),
            "-q",
            "--tokenizer-backend",
            "hf",  # the slower backend, so that the signal lands mid-run
        ],
        env={**os.environ, "PYTHONPATH": str(REPO), "RAYON_NUM_THREADS": "1"},
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / ".out.packtool-work").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert stderr.strip() == "Error: interrupted; no output was written"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.jsonl"]


@pytest.mark.slow
@pytest.mark.parametrize("checkpointed", [True, False])
def test_the_resume_hint_only_where_there_is_a_checkpoint(
    tmp_path: Path, checkpointed: bool
) -> None:
    """An interrupted `--resume` run names --resume only once it has a checkpoint to go on
    from; stopped before the first one, it says only that nothing was written."""
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    src = tmp_path / "big.jsonl"
    src.write_text("\n".join(lines * 3) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "packtool.cli", "pack", str(src), "-L", "1024", "-o", str(out),
           "-q", "--resume", "--tokenizer-backend", "hf"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAYON_NUM_THREADS": "1",
           "PACKTOOL_CHECKPOINT_SECONDS": "0.05" if checkpointed else "100000"}  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    work = tmp_path / ".out.packtool-work"
    ready = (work / "checkpoint.json") if checkpointed else work
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    if checkpointed:
        expected = "interrupted; no output was written (rerun with --resume to continue from"
        assert stderr.strip().startswith(f"Error: {expected}"), stderr
    else:
        assert stderr.strip() == "Error: interrupted; no output was written"


def test_a_field_named_by_option_that_the_data_lacks_is_the_error(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parent.parent / "sample_data"
    chat, template = repo / "chat.jsonl", repo / "chatml.jinja"
    result = run(
        "pack", chat, "-L", "512", "--chat-template", template, "--messages-field",
        "conversations", "-o", tmp_path / "o",
    )  # fmt: skip
    assert_one_line_error(
        result, r"chat.jsonl: the first record has no field 'conversations' \(--messages-field\)"
    )
    result = run(
        "pack", repo / "prompt_completion.jsonl", "-L", "512", "--prompt-field", "question",
        "-o", tmp_path / "o",
    )  # fmt: skip
    assert_one_line_error(result, r"no field 'question' \(--prompt-field\); its fields are 'id'")
    assert not (tmp_path / "o").exists()


def test_a_signal_that_surfaces_as_another_error_is_still_an_interrupt() -> None:
    """SIGTERM raised inside a lock's bookkeeping (a queue's get) can come out as
    "RuntimeError: release unlocked lock"; the run still ends as interrupted (exit 143, one
    line), never with a traceback (it happened once in CI)."""
    import signal as signals

    import typer

    from packtool import _stop
    from packtool.cli import handle_errors

    @handle_errors
    def work() -> None:
        try:
            _stop.on_signal(signals.SIGTERM, None)
        except KeyboardInterrupt:
            raise RuntimeError("release unlocked lock") from None

    with pytest.raises(typer.Exit) as caught:
        work()
    assert caught.value.exit_code == 143
    assert not _stop.STOP.is_set()  # cleared for the next command

    @handle_errors
    def plain_bug() -> None:
        raise RuntimeError("a bug, not a signal")

    with pytest.raises(RuntimeError, match="a bug"):
        plain_bug()


def test_an_interrupted_read_only_command_does_not_talk_of_output(capsys) -> None:
    """Ctrl-C in stats, verify or inspect: "interrupted" (130), not "no output was
    written" (they write none); pack still says what became of its output."""
    import typer

    from packtool.cli import handle_errors

    def stats() -> None:
        raise KeyboardInterrupt

    def pack(output: str | None = None) -> None:
        raise KeyboardInterrupt

    for command, text in ((stats, "Error: interrupted"),
                          (pack, "Error: interrupted; no output was written")):  # fmt: skip
        with pytest.raises(typer.Exit) as caught:
            handle_errors(command)()
        assert caught.value.exit_code == 130
        assert capsys.readouterr().err.strip() == text


def test_a_ray_address_where_nothing_listens_is_one_line(tmp_path: Path) -> None:
    """`--ray-address HOST:PORT` with no Ray head there: one line within seconds (Ray itself
    retried for minutes, printing warnings, and a ray:// address was a traceback)."""
    import socket

    with socket.socket() as s:  # a loopback port that nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "hello world"}] * 4)
    args = ["pack", src, "-L", "64", "-o", tmp_path / "out", "--units", "2", "--engine", "ray"]
    started = time.monotonic()
    result = run(*args, "--ray-address", f"127.0.0.1:{port}")
    assert time.monotonic() - started < 30
    assert_one_line_error(
        result, rf"--ray-address 127\.0\.0\.1:{port}: cannot connect \(.*\): is a Ray head", 2
    )
    assert_one_line_error(run(*args, "--ray-address", "node1"), r"give HOST:PORT of the Ray", 2)
    result = run(*args, "--ray-address", f"ray://127.0.0.1:{port}")
    assert_one_line_error(result, rf"--ray-address ray://127\.0\.0\.1:{port}: ", 2)
    assert not (tmp_path / "out").exists()


# -- issue 35: error text is shown as it is ---------------------------------------------------


def test_error_text_is_never_read_as_markup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Field names, ids, file names and install hints hold brackets: each error shows them as
    they are (rich read them as markup: a MarkupError traceback, or the bracket eaten)."""
    src = tmp_path / "m.jsonl"
    src.write_text('{"text": "a"}\n{"[/]": "b"}\n')
    out = tmp_path / "out"
    assert_one_line_error(
        run("pack", src, "-L", "64", "-o", out),
        r"m\.jsonl:2: no field 'text' \(fields found: '\[/\]'\)",
    )
    assert_one_line_error(
        run("pack", src, "-L", "64", "-o", out, "--text-field", "[/]"),
        r"the first record has no field '\[/\]' \(--text-field\)",
    )
    ids = write_jsonl(tmp_path / "ids.jsonl", [{"input_ids": ["[/]"]}])
    assert_one_line_error(
        run("pack", ids, "-L", "64", "-o", out, "--ids-field", "input_ids", "--pad-id", "0"),
        r"""'input_ids'\[0\] is "\[/\]", not an integer token id""",
    )
    red = tmp_path / "[red]x.jsonl"
    red.write_text("not json\n")
    assert_one_line_error(run("pack", red, "-L", "64", "-o", out), r"/\[red\]x\.jsonl:1: malformed")
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    result = run("pack", src, "-L", "64", "-o", out, "--units", "2", "--engine", "ray")
    assert_one_line_error(result, r"pip install 'packtool\[ray\]'$", 2)
    assert not out.exists()
    # the reports too: a title naming the output, a note naming a file
    good = write_jsonl(tmp_path / "[b]in :smile:.jsonl", [{"text": "hello"}])
    bracketed = tmp_path / "[bold]o:smile:"
    result = run("pack", good, "-L", "64", "-o", bracketed)
    assert result.exit_code == 0, result.output
    assert "/[bold]o:smile:" in "".join(result.stdout.split())  # (the title may wrap)
    result = run("verify", bracketed)
    assert result.exit_code == 0, result.output
    assert "/[bold]o:smile:" in "".join(result.stdout.split())


def test_a_control_character_in_a_file_name_is_escaped_in_the_error(tmp_path: Path) -> None:
    """A newline in a file name split the error into two lines, the second looking like
    another message: it is shown escaped (``\\n``), as ``repr`` shows it."""
    for name, shown in (
        ("a\nb.jsonl", r"a\\nb\.jsonl"),
        ("c\r\x1b[31md.jsonl", r"c\\r\\x1b\[31md"),
    ):
        src = tmp_path / name
        src.write_text("not json\n")
        result = run("pack", src, "-L", "64", "-o", tmp_path / "out")
        assert_one_line_error(result, rf"{shown}.*:1: malformed JSON")
        assert "\x1b" not in result.stderr and "\r" not in result.stderr
    good = write_jsonl(tmp_path / "x\ny.jsonl", [{"text": "hello"}])
    result = run("pack", good, "-L", "64", "-o", tmp_path / "o\nut")
    assert result.exit_code == 0, result.output
    assert "/o\\nut" in "".join(result.stdout.split())


def test_a_megatron_index_with_a_negative_length_is_one_line(tmp_path: Path) -> None:
    """A damaged ``.idx`` whose last sequence has length -5 (the pointers still chain): one
    line naming the index and the sequence (a traceback from the packer before)."""
    import struct

    from test_units_inputs import write_megatron

    write_megatron(tmp_path / "corpus", [[5, 6, 7], [8, 9]])
    idx = tmp_path / "corpus.idx"
    data = bytearray(idx.read_bytes())
    data[34 + 4 : 34 + 8] = struct.pack("<i", -5)  # lengths[1]
    idx.write_bytes(bytes(data))
    result = run("pack", idx, "-L", "16", "-o", tmp_path / "out", "--pad-id", "0")
    assert_one_line_error(result, r"corpus\.idx: sequence 1 has length -5: .* damaged")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.bin", "corpus.idx"]


def test_an_eos_token_the_vocabulary_lacks_is_one_line_naming_the_config(tmp_path: Path) -> None:
    """tokenizer_config.json names an eos_token the vocabulary does not hold: one line naming
    the config, the token and the fix (before: rc 0, and another token, id 0, as the EOS)."""
    data = REPO / "packtool" / "_data"
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_bytes((data / "tokenizer.json").read_bytes())
    config = json.loads((data / "tokenizer_config.json").read_text())
    (tok / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|eot_id|>"}))
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "hello world"}])
    out = tmp_path / "out"
    args = ["pack", src, "-L", "64", "-o", out, "--tokenizer", tok]
    assert_one_line_error(
        run(*args),
        rf"^Error: {tok}/tokenizer_config\.json: eos_token '<\|eot_id\|>' is not in the "
        r"vocabulary of tokenizer .*: name the EOS with --eos-token, or pass --no-eos$",
    )
    assert not out.exists()
    with pytest.raises(TokenizerError, match=r"eos_token '<\|eot_id\|>' is not in the vocabulary"):
        packtool.pack([src], out, max_len=64, tokenizer=str(tok))
    # the fixes it names
    assert run(*args, "--no-eos", "-q").exit_code == 0
    assert (
        json.loads((out / "manifest.json").read_text())["tokenizer"]["special_tokens"]["eos_id"]
        is None
    )
    assert run(*args, "--eos-token", "<|endoftext|>", "-q", "--overwrite").exit_code == 0
    assert (
        json.loads((out / "manifest.json").read_text())["tokenizer"]["special_tokens"]["eos_id"]
        == 0
    )
    # a bos_token the vocabulary lacks: --bos says so the same way
    (tok / "tokenizer_config.json").write_text(json.dumps({**config, "bos_token": "<|bot|>"}))
    assert_one_line_error(
        run(*args, "--bos", "--overwrite"),
        r"tokenizer_config\.json: bos_token '<\|bot\|>' is not in the vocabulary .*drop --bos$",
    )


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz"])
def test_a_csv_quote_never_closed_is_one_line_naming_its_line(tmp_path: Path, suffix: str) -> None:
    """`1,"unterminated` then more rows: pyarrow read the quoted cell to the end of the file,
    so two rows were packed as one document, rc 0. Now: one line naming the file and the
    line the quote opens on; a quoted cell over several lines is still read."""
    text = 'id,text\n1,first\n2,"unterminated\n3,ok\n4,last\n'
    src = tmp_path / f"u{suffix}"
    src.write_bytes(gzip.compress(text.encode()) if suffix.endswith(".gz") else text.encode())
    out = tmp_path / "out"
    for extra in ([], ["--skip-bad-records"]):
        assert_one_line_error(
            run("pack", src, "-L", "64", "-o", out, *extra),
            rf"u{re.escape(suffix)}:3: a quoted field that starts in the record on this line is "
            r"never closed",
        )
        assert not out.exists()
    # the same rows, the quote closed over two lines: read, three documents
    fine = tmp_path / "fine.csv"
    fine.write_text('id,text\n1,first\n2,"two\nlines"\n3,last')  # (no newline at the end)
    result = run("pack", fine, "-L", "64", "-o", out, "--json", "--tokenizer-backend", "hf")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["documents"]["read"] == 3


def _write_table(path: Path, table: pa.Table) -> Path:
    if path.suffix == ".parquet":
        pq.write_table(table, path)
    else:
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
    return path


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_dictionary_and_view_columns_are_read_as_the_plain_ones(
    tmp_path: Path, suffix: str
) -> None:
    """A text column dictionary-encoded or ``string_view``, ids as ``list_view``: valid
    columns, refused before ("not a string column"); now packed exactly as the plain ones."""
    texts = ["hello world", "a second document", "hello world", None, "three"]
    ids = [[5, 6, 7], [8], None, [], [9, 10]]
    plain = pa.array(texts)
    for name, column in (
        ("dictionary", plain.dictionary_encode()),
        ("string_view", pa.array(texts, pa.string_view())),
        ("large_string", pa.array(texts, pa.large_string())),
    ):
        outs = []
        for label, col in (("plain", plain), (name, column)):
            src = _write_table(tmp_path / f"{label}{suffix}", pa.table({"text": col}))
            out = tmp_path / f"out-{label}"
            result = run("pack", src, "-L", "64", "-o", out, "--skip-bad-records", "--overwrite")
            assert result.exit_code == 0, result.output
            outs.append(read_rows(out)[1])
        assert outs[0] == outs[1], name
    for typ in (
        pa.list_view(pa.int64()),
        pa.large_list_view(pa.int32()),
        pa.large_list(pa.int64()),
    ):
        src = _write_table(tmp_path / f"ids{suffix}", pa.table({"ids": pa.array(ids, typ)}))
        out = tmp_path / "out-ids"
        args = ["--ids-field", "ids", "--pad-id", "0", "--no-eos", "--skip-bad-records"]
        result = run("pack", src, "-L", "64", "-o", out, *args, "--overwrite")
        assert result.exit_code == 0, result.output
        manifest, rows = read_rows(out)
        assert sorted(documents_from_rows(rows).values()) == [[5, 6, 7], [8], [9, 10]], typ
        assert manifest["documents"]["bad_records_skipped"] == 1  # the null


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.tuples(st.integers(0, 8), st.integers(0, 4))), max_size=8),
    st.integers(0, 3),
)
def test_a_list_view_is_read_as_the_lists_it_shows(views, cut) -> None:
    """Views of any offsets (out of order, overlapping, sliced): the lists read are the
    lists the column shows (pyarrow's own cast to a list gave invalid offsets)."""
    from packtool.readers.batches import as_read

    values = pa.array(range(100, 112), pa.int64())
    offsets = [0 if v is None else v[0] for v in views]
    sizes = [0 if v is None else v[1] for v in views]
    mask = pa.array([v is None for v in views], pa.bool_())
    column = pa.ListViewArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(sizes, pa.int32()), values, mask=mask
    ).slice(min(cut, len(views)))
    batch = pa.record_batch([column], names=["ids"])
    read = as_read(batch, "x.parquet", 0)
    read.validate(full=True)
    assert read.schema.field("ids").type == pa.list_(pa.int64())
    assert read.column(0).to_pylist() == column.to_pylist()


def test_a_uint64_id_is_named_with_its_value(tmp_path: Path) -> None:
    """An id of 2**63 + 3 in a uint64 column was reported as 9223372036854775807."""
    table = pa.table({"ids": pa.array([[1, 2], [2**63 + 3, 4]], pa.list_(pa.uint64()))})
    src = _write_table(tmp_path / "ids.parquet", table)
    result = run("pack", src, "-L", "64", "-o", tmp_path / "out", "--ids-field", "ids",
                 "--pad-id", "0")  # fmt: skip
    assert_one_line_error(result, str(2**63 + 3))
    assert "9223372036854775807" not in result.stderr
