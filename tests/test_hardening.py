"""What an adversarial trial broke (issue 20), each through the CLI: the exit code, one line
on stderr, no traceback, and nothing left behind in or beside the output directory."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import REPO, SAMPLE
from helpers import read_rows
from test_cli import assert_one_line_error, run

from packtool.chat import ChatTemplate

CHAT = REPO / "sample_data" / "chat.jsonl"
# Loops that make no text: they run into the time budget, not the bound of the text.
RUNAWAY = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"


def _chats(tmp_path: Path, n: int = 3) -> Path:
    src = tmp_path / "chat.jsonl"
    with open(CHAT, encoding="utf-8") as f:
        src.write_text("".join(line for _, line in zip(range(n), f, strict=False)))
    return src


def _template(tmp_path: Path, text: str, name: str = "t.jinja") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _only(tmp_path: Path, *names: str) -> None:
    """Nothing in ``tmp_path`` but the inputs: no output, no lock, no work directory."""
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)


# -- 1. a runaway chat template ---------------------------------------------------------------


def test_a_runaway_template_stops_at_its_budget_naming_the_record(tmp_path: Path) -> None:
    src, template = _chats(tmp_path), _template(tmp_path, RUNAWAY)
    started = time.monotonic()
    result = run(
        "pack",
        src,
        "--chat-template",
        template,
        "-L",
        "256",
        "-o",
        tmp_path / "out",
        "--template-timeout",
        "0.5",
    )
    assert time.monotonic() - started < 30
    assert_one_line_error(
        result,
        r"chat\.jsonl:1: the chat template ran for more than 0\.5 s on this record .*"
        r"--template-timeout",
        1,
    )
    _only(tmp_path, "chat.jsonl", "t.jinja")


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("{{ 'x' * 100000000 }}", r"repeating a str of 1 items 100,000,000 times is too large"),
        ("{{ 3 ** (10 ** 6) }}", r"3 \*\* 1000000 is too large a number"),
    ],
)
def test_operations_one_step_could_not_stop_are_bounded(
    tmp_path: Path, text: str, pattern: str
) -> None:
    src, template = _chats(tmp_path), _template(tmp_path, text)
    assert_one_line_error(
        run("pack", src, "--chat-template", template, "-L", "256", "-o", tmp_path / "out"),
        r"unsafe operation refused: " + pattern,
        1,
    )
    _only(tmp_path, "chat.jsonl", "t.jinja")


def test_ordinary_loops_render_as_before() -> None:
    # loop.index, loop.length, loop.last, unpacking and for/else, through the budget's wrapper.
    text = (
        "{% for m in messages %}<{{ m.role }} {{ loop.index }}/{{ loop.length }}>"
        "{{ m.content }}{% if not loop.last %},{% endif %}{% else %}none{% endfor %}"
        "{% for k, v in {'a': 1}.items() %} {{ k }}{{ v }}{% endfor %}"
    )
    template = ChatTemplate.from_string(text)
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    assert template.render(chat) == "<user 1/2>Hi,<assistant 2/2>Yo a1"
    assert template.render([]) == "none a1"


@pytest.mark.parametrize("value", ["0", "-1", "nan", "100000"])
def test_template_timeout_is_checked(tmp_path: Path, value: str) -> None:
    src, template = _chats(tmp_path), _template(tmp_path, RUNAWAY)
    assert_one_line_error(
        run(
            "pack",
            src,
            "--chat-template",
            template,
            "-L",
            "256",
            "-o",
            tmp_path / "out",
            "--template-timeout",
            value,
        ),
        r"--template-timeout must be more than 0 and at most 86400 seconds",
        2,
    )
    _only(tmp_path, "chat.jsonl", "t.jinja")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as a terminal would (see test_faults)


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_a_process_stuck_in_a_template(
    tmp_path: Path, signum: int, code: int
) -> None:
    src, template = _chats(tmp_path), _template(tmp_path, RUNAWAY)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "packtool.cli",
            "pack",
            str(src),
            "--chat-template",
            str(template),
            "-L",
            "256",
            "-o",
            str(tmp_path / "out"),
            "-q",
            "--template-timeout",
            "3600",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / ".out.packtool-work").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(1.0)  # in the template's loops by now, in a worker thread
    assert proc.poll() is None
    sent = time.monotonic()
    proc.send_signal(signum)
    try:
        _, stderr = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the signal did not stop the template") from None
    assert time.monotonic() - sent < 5
    assert proc.returncode == code, stderr
    assert stderr.strip() == "Error: interrupted; no output was written"
    _only(tmp_path, "chat.jsonl", "t.jinja")


# -- 2. corrupt compressed and columnar inputs -------------------------------------------------


def _jsonl_bytes(n: int = 3000) -> bytes:
    return "".join(json.dumps({"text": f"document {i} " * 5}) + "\n" for i in range(n)).encode()


def _damaged_gzip(reason: str) -> bytes:
    """A gzip file with one byte changed, where zlib reports ``reason``."""
    blob = gzip.compress(_jsonl_bytes(), mtime=0)
    for pos in range(20, len(blob)):
        damaged = bytearray(blob)
        damaged[pos] ^= 0x55
        try:
            gzip.decompress(bytes(damaged))
        except zlib.error as e:
            if reason in str(e):
                return bytes(damaged)
        except (OSError, EOFError):
            pass
    raise AssertionError(f"no position gives {reason!r}")


def _damaged_arrow_offsets() -> bytes:
    """An Arrow IPC stream whose string offsets point past the data (pyarrow trusts them)."""
    table = pa.table({"text": ["aaaa", "bbbb", "cccc"]})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    blob = sink.getvalue().to_pybytes()
    offsets = struct.pack("<4i", 0, 4, 8, 12)
    assert blob.count(offsets) == 1
    return blob.replace(offsets, struct.pack("<4i", 0, 4, 0x0FFFFFFF, 12))


def _damaged_parquet() -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": [f"document {i} " * 5 for i in range(3000)]}), buf)
    blob = bytearray(buf.getvalue())
    middle = len(blob) // 2
    blob[middle : middle + 64] = bytes(64)
    return bytes(blob)


def _damaged_zstd() -> bytes:
    blob = bytearray(zstandard.ZstdCompressor().compress(_jsonl_bytes()))
    middle = len(blob) // 2
    blob[middle : middle + 16] = bytes(range(16))
    return bytes(blob)


@pytest.mark.parametrize(
    "name, make, pattern",
    [
        ("far.jsonl.gz", lambda: _damaged_gzip("too far back"), r"invalid distance too far back"),
        ("crc.jsonl.gz", lambda: _damaged_gzip("invalid"), r"cannot read|corrupt"),
        ("far.csv.gz", lambda: _damaged_gzip("too far back"), r"cannot read|corrupt"),
        ("far.txt.gz", lambda: _damaged_gzip("too far back"), r"cannot read|corrupt"),
        ("far.json.gz", lambda: _damaged_gzip("too far back"), r"cannot read|corrupt"),
        ("bad.jsonl.zst", _damaged_zstd, r"cannot read|[Cc]orrupt"),
        ("bad.parquet", _damaged_parquet, r"cannot read Parquet data"),
        ("bad.arrow", _damaged_arrow_offsets, r"corrupt Arrow data in column 'text' near row 0"),
    ],
)
@pytest.mark.parametrize("command", ["pack", "stats"])
def test_corrupt_inputs_are_one_line_naming_the_file(
    tmp_path: Path, name: str, make, pattern: str, command: str
) -> None:
    src = tmp_path / name
    src.write_bytes(make())
    if command == "pack":
        result = run("pack", src, "-L", "64", "-o", tmp_path / "out", "-q")
    else:
        result = run("stats", src, "-L", "64", "--cache-dir", tmp_path / "cache")
    assert_one_line_error(result, rf"^Error: {re.escape(str(src))}(:\d+)?: .*(" + pattern + ")", 1)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_a_corrupt_gzip_line_is_named_in_the_line_reader(tmp_path: Path) -> None:
    src = tmp_path / "far.jsonl.gz"
    src.write_bytes(_damaged_gzip("too far back"))
    result = run("pack", src, "-L", "64", "-o", tmp_path / "out", "--skip-bad-records")
    assert_one_line_error(result, r"far\.jsonl\.gz: cannot read.*too far back", 1)


@pytest.mark.slow
def test_sigterm_stops_the_units_of_a_local_pool(tmp_path: Path) -> None:
    src = tmp_path / "big.jsonl"
    src.write_text(SAMPLE.read_text(encoding="utf-8") * 4, encoding="utf-8")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            *[sys.executable, "-m", "packtool.cli", "pack", str(src), "-L", "1024"],
            *["-o", str(out), "--units", "4", "--num-proc", "2", "-q"],
            *["--tokenizer-backend", "hf"],  # the slower backend: units last long enough
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not list((out / "units").glob(".unit-*")):  # a unit is being packed
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 5
    assert proc.returncode == 143, stderr
    assert stderr.strip().startswith("Error: interrupted; no output was written")
    assert len(stderr.strip().splitlines()) == 1
    # Finished units are kept (a rerun goes on from them); nothing half-done is.
    for unit in (out / "units").iterdir():
        assert not unit.name.startswith("."), unit
        assert (unit / "manifest.json").exists(), unit
    assert not list(tmp_path.glob(".out.*"))


# -- 3. numeric options out of bounds ---------------------------------------------------------


@pytest.mark.parametrize(
    "args, pattern",
    [
        (["-L", "1000000000000"], r"--max-len must be an integer from 2 to 16,777,216, got 1000"),
        (["-L", "16777217"], r"--max-len must be an integer from 2 to 16,777,216"),
        (["-L", "9" * 30], r"--max-len must be an integer from 2 to 16,777,216"),
        (["-L", "64", "--seed", "-1"], r"--seed must be an integer from 0 to "),
        (["-L", "64", "--num-proc", "100000000"], r"--num-proc must be an integer from 1 to 1,024"),
        (
            ["-L", "64", "--rows-per-shard", "1" + "0" * 20],
            r"--rows-per-shard must be .* to 2,147,",
        ),
        (["-L", "64", "--shard-size", "1e3000"], r"--shard-size: cannot read '1e3000' as a size"),
        (["-L", "64", "--units", "1000000000"], r"--units must be an integer from 1 to 100,000"),
        (["-L", "64", "--units", "2", "--seed", "-3"], r"--seed must be an integer from 0 to "),
    ],
)
def test_numeric_options_are_bounded(tmp_path: Path, args: list[str], pattern: str) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello"}\n')
    assert_one_line_error(run("pack", src, *args, "-o", tmp_path / "out", "-q"), pattern, 2)
    _only(tmp_path, "in.jsonl")


def test_stats_numeric_options_are_bounded(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello"}\n')
    common = ["--cache-dir", tmp_path / "cache"]
    assert_one_line_error(
        run("stats", src, "-L", "1000000000000", *common),
        r"--max-len must be an integer from 2 to 16,777,216",
        2,
    )
    assert_one_line_error(
        run("stats", src, "-L", "64", "--batch-size", "1" + "0" * 20, *common),
        r"--batch-size must be an integer from 1 to 1,048,576",
        2,
    )
    assert_one_line_error(
        run("stats", src, "-L", "64", "--num-proc", "5000", *common),
        r"--num-proc must be an integer from 1 to 1,024",
        2,
    )


# -- 4. files of an unknown type ---------------------------------------------------------------


def _mixed_directory(tmp_path: Path) -> Path:
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.jsonl").write_text('{"text": "hello"}\n{"text": "world"}\n')
    (d / "README").write_text("notes\n")
    (d / "c.bin").write_bytes(bytes(range(256)))
    (d / ".hidden.bin").write_bytes(b"x")  # hidden: skipped without a word, as before
    return d


def test_skipped_directory_members_are_named_in_one_line(tmp_path: Path) -> None:
    d = _mixed_directory(tmp_path)
    result = run("pack", d, "-L", "64", "-o", tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    skipped = [line for line in result.stderr.splitlines() if line.startswith("skipped:")]
    assert skipped == [
        f"skipped: 2 files of an unknown type in the input directories, not read: {d / 'README'}"
        f", {d / 'c.bin'} (supported: .jsonl, .ndjson, .json, .parquet, .arrow, .csv, .txt, "
        ".idx, .jsonl.gz, .jsonl.zst, .json.gz, .json.zst, .csv.gz, .csv.zst, .txt.gz, .txt.zst)"
    ]
    stats = run("stats", d, "-L", "64", "--cache-dir", tmp_path / "cache")
    assert stats.exit_code == 0, stats.stderr
    assert "skipped: 2 files of an unknown type" in stats.stderr


def test_a_named_file_of_an_unknown_type_fails(tmp_path: Path) -> None:
    d = _mixed_directory(tmp_path)
    assert_one_line_error(
        run("pack", d / "c.bin", "-L", "64", "-o", tmp_path / "out"),
        rf"^Error: {re.escape(str(d / 'c.bin'))}: unsupported file type \(supported: \.jsonl",
        1,
    )
    assert not (tmp_path / "out").exists()
    only_unknown = tmp_path / "e"
    only_unknown.mkdir()
    (only_unknown / "README").write_text("x")
    assert_one_line_error(
        run("pack", only_unknown, "-L", "64", "-o", tmp_path / "out"),
        r"e: directory holds no supported files \(only 1 file of an unknown type\)",
        1,
    )
    assert not (tmp_path / "out").exists()


# -- 5. empty input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, extra, pattern",
    [
        ("", [], r"no documents in {src}: nothing to pack$"),
        (
            '{"text": ""}\n' * 3,
            [],
            r"no documents to pack in {src}: of 3 read, 3 empty \(no tokens\)$",
        ),
        (
            '{"text": ""}\n{"text": "' + "x" * 300 + '"}\n',
            ["--overflow", "drop"],
            r"no documents to pack in {src}: of 2 read, 1 empty \(no tokens\), 1 longer than "
            r"--max-len, dropped \(--overflow drop\)$",
        ),
        (  # the first bad record says why (a mistyped field, a failing template...)
            '{"text": ""}\n{"txt": "hello"}\n',
            ["--skip-bad-records"],
            r"no documents to pack in {src}: of 2 read, 1 empty \(no tokens\), 1 bad and "
            r"skipped \(the first bad record: {src}:2: no field 'text' \(fields found: 'txt'\) "
            r"\(choose the field with --text-field\)\)$",
        ),
    ],
)
@pytest.mark.parametrize("units", [[], ["--units", "2"]])
def test_empty_input_is_an_error_at_the_top_level(
    tmp_path: Path, content: str, extra: list[str], pattern: str, units: list[str]
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(content)
    result = run("pack", src, "-L", "64", "-o", tmp_path / "out", "-q", *extra, *units)
    assert_one_line_error(result, pattern.format(src=re.escape(str(src))), 1)
    _only(tmp_path, "in.jsonl")
    if not extra:
        stats = run("stats", src, "-L", "64", "--cache-dir", tmp_path / "cache")
        assert_one_line_error(stats, r"no documents", 1)
        assert stats.stderr.startswith("Error: ")  # no progress bar left above it


def test_a_units_rerun_with_nothing_to_do_claims_no_speed(tmp_path: Path) -> None:
    """Every unit and the merge already done: nothing was tokenized (it said "0 tokens/s")."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello world"}\n{"text": "and more"}\n')
    args = ("pack", src, "-L", "64", "-o", tmp_path / "out", "--units", "2")
    first = run(*args)
    assert first.exit_code == 0 and " tokens/s)" in first.stdout, first.output
    again = run(*args)
    assert again.exit_code == 0, again.output
    assert "tokens/s" not in again.stdout and "rows" in again.stdout


def test_an_empty_unit_is_fine(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello world"}\n')
    result = run("pack", src, "-L", "64", "-o", tmp_path / "out", "-q", "--units", "3")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    units = manifest["units"]["per_unit"]
    assert sorted(u["documents"] for u in units) == [0, 0, 1]


# -- 6. numbers that line up ---------------------------------------------------------------------


def _tokenizer_without_pad(tmp_path: Path) -> Path:
    """A word-level tokenizer with an EOS and no pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"</s>": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate("abcdefgh")}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["</s>"])
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.mark.parametrize(
    "pad, expected, source", [([], 0, "eos"), (["--pad-id", "5"], 5, "--pad-id")]
)
def test_the_manifest_names_the_pad_id_in_the_rows(
    tmp_path: Path, pad: list[str], expected: int, source: str
) -> None:
    tokenizer = _tokenizer_without_pad(tmp_path)
    src = tmp_path / "in.jsonl"
    src.write_text(
        "".join(json.dumps({"text": " ".join("abc"[: i % 3 + 1])}) + "\n" for i in range(9))
    )
    out = tmp_path / "out"
    result = run("pack", src, "-L", "8", "-o", out, "-q", "--tokenizer", tokenizer, *pad)
    assert result.exit_code == 0, result.stderr
    manifest, rows = read_rows(out)
    assert manifest["tokenizer"]["special_tokens"]["pad_id"] == expected
    assert manifest["options"]["pad_id"] == expected
    assert manifest["tokenizer"]["pad_from"] == source
    pads = {t for row in rows for t in row["input_ids"][row["num_tokens"] :]}
    assert pads == {expected}
    verified = run("verify", out, "--against", src)
    assert verified.exit_code == 0, verified.stdout + verified.stderr


def test_pack_and_stats_account_for_the_same_documents(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    texts = ["hello there", "", "a longer document " * 3, "", "x" * 300, "last"]
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "out"
    packed = run("pack", src, "-L", "32", "-o", out, "--overflow", "drop")
    assert packed.exit_code == 0, packed.stderr
    assert re.search(r"documents read\s+│?\s+6\b", packed.stdout), packed.stdout
    assert re.search(r"dropped / empty / bad skipped\s+│?\s+1 / 2 / 0", packed.stdout)
    stats = run("stats", out)
    assert stats.exit_code == 0, stats.stderr
    assert re.search(r"documents in rows\s+3 of 6 read \(2 empty, 1 dropped\)", stats.stdout)
    assert re.search(r"documents read\s+6\b", stats.stdout)  # its outcome table, as pack's


def test_a_signal_after_the_manifest_says_the_output_is_complete(tmp_path, monkeypatch) -> None:
    """Ctrl-C that lands after the output was committed (while the report is built) must not
    claim that no output was written: the output is complete and kept."""
    from typer.testing import CliRunner

    import packtool.pipeline as pipeline
    from packtool.cli import app

    real_report = pipeline._report

    def interrupted(*args, **kwargs):
        real_report(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "_report", interrupted)
    out = tmp_path / "out"
    src = Path(__file__).resolve().parent.parent / "sample_data" / "corpus.jsonl"
    result = CliRunner().invoke(app, ["pack", str(src), "-L", "4096", "-o", str(out)])
    assert result.exit_code == 130
    assert f"interrupted after {out} was complete: the output is kept" in result.stderr
    assert "no output was written" not in result.stderr
    from packtool import verify

    assert verify(out).ok


def test_a_lock_left_by_a_stopped_or_killed_run_is_removed_and_a_held_one_kept(
    tmp_path: Path,
) -> None:
    """A run stopped while taking its lock (or SIGKILLed) leaves the lock file, the lock
    itself released by the kernel: removed when nobody holds it, kept while somebody does."""
    from packtool.store import lock_output, lock_path, remove_unheld_lock

    out = tmp_path / "out"
    lock_path(out).write_text("12345")  # left by a killed run: no process holds it
    assert remove_unheld_lock(out) and not lock_path(out).exists()
    assert not remove_unheld_lock(out)  # nothing left to remove
    with lock_output(out):
        assert lock_path(out).exists()
        assert not remove_unheld_lock(out)  # held (by this process's open lock)
        assert lock_path(out).exists()
    assert not lock_path(out).exists()


def test_a_signal_while_the_lock_file_is_made_leaves_no_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race behind a leftover ``.unit-*.packtool-lock`` after SIGTERM: the signal's
    exception raised just as the lock file has been made, before its cleanup is armed."""
    import packtool.store as store

    real_open, signalled = os.open, []

    def open_then_signal(path: str, flags: int, *args: int) -> int:
        fd = real_open(path, flags, *args)
        if str(path).endswith(".packtool-lock") and not signalled:
            signalled.append(path)
            os.close(fd)
            raise KeyboardInterrupt  # as the SIGINT handler would, right after the open
        return fd

    out = tmp_path / "out"
    monkeypatch.setattr(store.os, "open", open_then_signal)
    with pytest.raises(KeyboardInterrupt), store.lock_output(out):
        pass
    monkeypatch.undo()
    assert not store.lock_path(out).exists()


# -- issue 35, 2: a record longer than the maximum record size ---------------------------------


def _zeros(n: int, codec: str) -> bytes:
    """``n`` zero bytes compressed (a bomb: no line end anywhere)."""
    block = bytes(1 << 20)
    if codec == "gzip":
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        return b"".join(z.compress(block) for _ in range(n >> 20)) + z.flush()
    writer = zstandard.ZstdCompressor().compressobj()
    return b"".join(writer.compress(block) for _ in range(n >> 20)) + writer.flush()


def _long_inputs(tmp_path: Path) -> list[tuple[Path, list[str], str]]:
    big = "x" * (20 << 20)
    cases = [
        ("bomb.jsonl.gz", _zeros(64 << 20, "gzip"), [], r"bomb\.jsonl\.gz:1: a line"),
        ("bomb.jsonl.zst", _zeros(64 << 20, "zstd"), [], r"bomb\.jsonl\.zst:1: a line"),
        ("long.jsonl", ('{"text":"a"}\n{"text":"' + big + '"}\n').encode(), [], r"long\.jsonl:2"),
        (
            "array.json",
            ('[{"text":"a"}, {"text":"' + big + '"}]').encode(),
            [],
            "element 1: an element",
        ),
        ("long.csv", ("text\nok\n" + big + "\n").encode(), [], r"long\.csv: after row 1: a row"),
        ("long.txt", ("a\n" + big + "\n").encode(), [], r"long\.txt:2: a line"),
        (
            "para.txt",
            ("y" * 999 + "\n") * 9000,
            ["--txt-unit", "paragraph"],
            r"para\.txt:8\d\d\d: a paragraph",
        ),
        ("doc.txt", big.encode(), ["--txt-unit", "document"], r"doc\.txt: a document"),
    ]
    out = []
    for name, data, args, pattern in cases:
        (tmp_path / name).write_bytes(data if isinstance(data, bytes) else data.encode())
        out.append((tmp_path / name, args, pattern))
    return out


def test_a_record_over_the_maximum_record_size_is_one_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PACKTOOL_MAX_RECORD_BYTES", str(8 << 20))
    for src, args, pattern in _long_inputs(tmp_path):
        out = tmp_path / f"out-{src.name}"
        result = run("pack", src, "-L", "64", "-o", out, *args)
        assert_one_line_error(
            result, pattern + r".*longer than 8,388,608 bytes.*PACKTOOL_MAX_RECORD_BYTES", 1
        )
        assert not out.exists()


def test_a_compressed_bomb_is_refused_with_memory_bounded_by_the_limit(tmp_path: Path) -> None:
    # 512 MiB of zeros without a line end (0.5 MB gzipped): refused once 64 MiB are read,
    # instead of being read whole (8.5 GB for the trial's 4 GiB).
    src = tmp_path / "bomb.jsonl.gz"
    src.write_bytes(_zeros(512 << 20, "gzip"))
    # The peak of this process's own memory (VmHWM): ru_maxrss would carry the pytest
    # worker's peak over the fork and exec.
    code = (
        "import re, sys\n"
        "from packtool.cli import app\n"
        "try:\n"
        "    app(sys.argv[1:])\n"
        "except SystemExit as e:\n"
        "    status = open('/proc/self/status').read()\n"
        "    print(e.code, re.search(r'VmHWM:\\s*(\\d+) kB', status)[1])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "pack", str(src), "-L", "64", "-o", str(tmp_path / "o")],
        env={**os.environ, "PYTHONPATH": str(REPO), "PACKTOOL_MAX_RECORD_BYTES": str(64 << 20)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    status, rss_kb = proc.stdout.split()[-2:]
    assert status == "1", proc.stdout + proc.stderr
    assert "bomb.jsonl.gz:1: a line longer than 67,108,864 bytes" in proc.stderr
    # 200 MB measured here (the process alone is about 150 MB); the line read whole: 2.8 GB.
    assert int(rss_kb) < 450 << 10, f"{int(rss_kb) >> 10} MB"


def test_the_maximum_record_size_is_checked(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PACKTOOL_MAX_RECORD_BYTES", "lots")
    (tmp_path / "a.jsonl").write_text('{"text":"a"}\n')
    result = run("pack", tmp_path / "a.jsonl", "-L", "64", "-o", tmp_path / "out")
    assert_one_line_error(result, r"PACKTOOL_MAX_RECORD_BYTES must be a positive number", None)


# -- issue 35, 6: chat templates bounded in time and in the size of what they make -------------


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("{{ lipsum(n=100000000) }}", "calling lipsum given 100,000,000"),
        ("{{ lipsum(n=9999999) }}", "lipsum of 9999999 paragraphs"),
        (
            "{% set ns = namespace(s='x') %}" + "{% set ns.s = ns.s ~ ns.s %}" * 40,
            "joining with ~ 16,777,216 characters",
        ),
        (
            "{% set ns = namespace(s='x') %}" + "{% set ns.s = ns.s + ns.s %}" * 40,
            "adding 8,388,608 and 8,388,608 items",
        ),
        ("{{ messages|tojson(indent=1000000000) }}", "the filter tojson given 1,000,000,000"),
        ("{{ messages|tojson(indent=9999999) }}", "tojson with an indent of 9,999,999"),
        ("{{ 'a'|center(1000000000) }}", "the filter center given"),
        ("{{ 'a\\na'|indent(9999999) }}", "indenting 2 lines by 9,999,999"),
        ("{{ '%999999999d' % 1 }}", "a format width"),
        ("{{ '{:>999999999}'.format(1) }}", "a format width"),
        ("{% set s = 'a' * 100000 %}{{ s.replace('a', s) }}", "replacing 100,000 times"),
        ("{% set s = 'a' * 100000 %}{{ s.join(range(100000)|list) }}", "joining 100,000 items"),
        ("{{ 'a'.ljust(999999999) }}", "calling ljust given 999,999,999"),
        ("{% set s = 'a' * 100000 %}{{ s|replace('a', s) }}", "replacing 100,000 times"),
        ("{% set s = 'a' * 100000 %}{{ range(100000)|list|join(s) }}", "joining 100,000 items"),
        ("{% set s = 'a\n' * 100000 %}{{ s|indent(9999999) }}", "indenting 100,001 lines"),
        ("{% set l = ['x'] * 1000000 %}{{ ([l] * 100)|sum(start=[]) }}", "summing 100 strings"),
    ],
)
def test_template_operations_that_make_huge_text_are_refused(
    tmp_path: Path, text: str, pattern: str
) -> None:
    src, template = _chats(tmp_path), _template(tmp_path, text)
    started = time.monotonic()
    result = run("pack", src, "--chat-template", template, "-L", "256", "-o", tmp_path / "out")
    assert time.monotonic() - started < 30
    assert_one_line_error(result, r"unsafe operation refused: " + re.escape(pattern), 1)
    _only(tmp_path, "chat.jsonl", "t.jinja")


def test_the_text_a_template_makes_for_a_record_is_bounded(tmp_path: Path) -> None:
    # The trial's 100,000 x 'x' * 1000 per message: each step small, the whole 100 MB a message.
    text = (
        "{% for m in messages %}{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"
        "{% endfor %}"
    )
    src, template = _chats(tmp_path), _template(tmp_path, text)
    result = run("pack", src, "--chat-template", template, "-L", "256", "-o", tmp_path / "out")
    assert_one_line_error(
        result, r"chat\.jsonl:1: the chat template made more than [\d,]+ characters of text", 1
    )
    _only(tmp_path, "chat.jsonl", "t.jinja")


def test_sigterm_stops_a_template_of_many_bounded_steps(tmp_path: Path) -> None:
    # Every step bounded, the render budget an hour: SIGTERM still stops it within seconds.
    text = (
        "{% for i in range(99999) %}{% for j in range(99999) %}"
        "{% set s = lipsum(n=10) ~ ('y' * 100000) %}{% endfor %}{% endfor %}"
    )
    src, template = _chats(tmp_path), _template(tmp_path, text)
    proc = subprocess.Popen(
        [sys.executable, "-m", "packtool.cli", "pack", str(src), "--chat-template",
         str(template), "-L", "256", "-o", str(tmp_path / "out"), "-q",
         "--template-timeout", "3600"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (tmp_path / ".out.packtool-work").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(1.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        _, stderr = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("SIGTERM did not stop the template") from None
    assert time.monotonic() - sent < 5
    assert proc.returncode == 143, stderr
    _only(tmp_path, "chat.jsonl", "t.jinja")


def test_the_bounds_leave_ordinary_templates_alone() -> None:
    text = (
        "{% for m in messages %}{{ '<|' ~ m.role ~ '|>' + m.content }}{{ '%-6s|' % m.role }}"
        "{{ m|tojson(indent=2) }}{{ '{:>4}'.format(loop.index) }}{% endfor %}{{ lipsum(1)[:3] }}"
    )
    chat = [{"role": "user", "content": "Hi"}]
    rendered = ChatTemplate.from_string(text).render(chat)
    assert rendered.startswith('<|user|>Hiuser  |{\n  "role": "user",\n  "content": "Hi"\n}   1')


# -- issue 35, 7: what a killed run left is removed by the next run and named by verify ---------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _leave(path: Path, megabytes: int = 1) -> Path:
    """A staging directory as a run killed by SIGKILL leaves it."""
    path.mkdir()
    (path / "data-00000-of-00001.arrow").write_bytes(bytes(megabytes << 20))
    return path


def test_what_killed_runs_left_is_named_by_verify_and_removed_by_the_next_run(
    tmp_path: Path,
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": "word " * (i % 30)}) + "\n" for i in range(200)))
    out = tmp_path / "out"
    result = run("pack", src, "-L", "64", "-o", out, "--units", "2", "--copy")
    assert result.exit_code == 0, result.output
    pid = _dead_pid()
    merge_stage = _leave(out / f"..merge.packtool-tmp-{pid}", 2)  # merge --copy, kill -9
    aside = out / f".manifest.json.packtool-tmp-{pid}"
    aside.write_text("{}")
    beside = _leave(tmp_path / f".out.packtool-tmp-{pid}")  # pack, kill -9
    live = _leave(tmp_path / f".out.packtool-tmp-{os.getpid()}")  # a live run's: kept

    result = run("verify", out)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    for left in (merge_stage, aside, beside):
        assert f"left by a killed run: {left}" in said, said
    assert "(2.1 MB)" in said and str(live) not in said

    result = run("merge", out, "--copy")
    assert result.exit_code == 0, result.output
    assert not merge_stage.exists() and not aside.exists() and not beside.exists()
    assert live.exists()
    result = run("verify", out)
    assert result.exit_code == 0 and "left by a killed run" not in result.output


def test_an_export_removes_what_a_killed_export_left(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run("pack", SAMPLE, "-L", "256", "-o", out).exit_code == 0
    left = _leave(tmp_path / f".megatron.packtool-tmp-{_dead_pid()}")
    result = run("export", out, "--to", "megatron", "-o", tmp_path / "megatron")
    assert result.exit_code == 0, result.output
    assert not left.exists()


# -- issue 35, 9: verify while another run replaces the output -----------------------------------


def test_verify_says_the_output_changed_under_it_instead_of_false_corruptions(
    tmp_path: Path,
) -> None:
    from packtool.verification import verify

    src, other = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    src.write_text(
        "".join(json.dumps({"text": f"alpha {i} " * (i % 40)}) + "\n" for i in range(400))
    )
    other.write_text(
        "".join(json.dumps({"text": f"beta {i} " * (i % 25)}) + "\n" for i in range(300))
    )
    out = tmp_path / "out"
    assert run("pack", src, "-L", "64", "-o", out, "--rows-per-shard", "40").exit_code == 0
    assert verify(out, against=[src]).ok
    replaced = []

    def replace_it(stage: str, done: int, total: int | None) -> None:
        if not replaced:  # pack --overwrite lands while verify reads the shards
            result = run("pack", other, "-L", "64", "-o", out, "--overwrite",
                         "--rows-per-shard", "40")  # fmt: skip
            assert result.exit_code == 0, result.output
            replaced.append(stage)

    report = verify(out, against=[src], progress=replace_it)
    assert replaced
    assert not report.ok
    assert [p.check for p in report.problems] == ["changed"]
    assert report.problems_total == 1
    assert "changed while it was being verified" in report.problems[0].what
    assert verify(out, against=[other]).ok  # the new output, verified once the run is done
