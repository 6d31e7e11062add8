"""Faults and bad input: kills, Ctrl-C, a full disk, fuzzed inputs, damaged shards.

Whatever happens, packtool must end with a finished output that verifies or with a clear
one-line error, never a traceback or a hang, and never leave behind an output that looks
finished but is not.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, SAMPLE, CharTokenizer, write_jsonl
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import packtool
import packtool.format
import packtool.store
from packtool.cli import app
from packtool.errors import FormatError, PacktoolError
from packtool.format import open_packed
from packtool.verification import verify

runner = CliRunner()
PACK = [sys.executable, "-m", "packtool.cli", "pack"]
HF = ["--tokenizer-backend", "hf"]
FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def leftovers(parent: Path, name: str = "out") -> list[str]:
    """Hidden siblings of ``parent / name`` that packtool works in."""
    return sorted(p.name for p in parent.glob(f".{name}.packtool-*"))


def assert_one_line(message: str) -> None:
    assert "Traceback" not in message
    assert len(message.strip().splitlines()) == 1, message


# -- kill -9 and Ctrl-C ----------------------------------------------------------------------


def _corpus(tmp_path: Path, lines: int = 1000) -> Path:
    src = tmp_path / "corpus.jsonl"
    with open(SAMPLE, encoding="utf-8") as f:
        src.write_text("".join(line for _, line in zip(range(lines), f, strict=False)))
    return src


def _start_pack(src: Path, out: Path) -> subprocess.Popen[str]:
    # Small shards, so that writing (the staging directory's life) lasts a while.
    return subprocess.Popen(
        # The slower backend, so that the run lasts long enough to be interrupted.
        [*PACK, str(src), "-L", "256", "--rows-per-shard", "5", "-o", str(out), "-q", *HF],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        # A shell starts background jobs with SIGINT ignored, and Python then installs no
        # KeyboardInterrupt handler: give the child the default, as a terminal would.
        preexec_fn=_default_sigint,
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for(proc: subprocess.Popen[str], parent: Path, pattern: str) -> None:
    deadline = time.monotonic() + 120
    while not list(parent.glob(pattern)):
        assert proc.poll() is None, f"pack ended before {pattern} appeared: {proc.stderr}"
        assert time.monotonic() < deadline, f"{pattern} never appeared"
        time.sleep(0.002)


@pytest.mark.slow
def test_sigkill_midway_leaves_no_output_and_a_rerun_works(tmp_path: Path) -> None:
    src, out = _corpus(tmp_path), tmp_path / "out"
    proc = _start_pack(src, out)
    _wait_for(proc, tmp_path, ".out.packtool-tmp-*")
    time.sleep(0.1)  # some shards written
    proc.kill()
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    stale = leftovers(tmp_path)
    assert stale  # SIGKILL cannot clean up: the staging directory stays, hidden
    with pytest.raises(FormatError, match="no such directory"):
        open_packed(out)
    result = runner.invoke(app, ["pack", str(src), "-L", "256", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert leftovers(tmp_path) == []  # the dead run's leftovers were removed
    assert verify(out, against=[src]).ok


@pytest.mark.parametrize("stage", [".out.packtool-work", ".out.packtool-tmp-*"])
def test_sigint_exits_130_and_removes_temporaries(tmp_path: Path, stage: str) -> None:
    src, out = _corpus(tmp_path, lines=600), tmp_path / "out"
    proc = _start_pack(src, out)
    _wait_for(proc, tmp_path, stage)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr.strip() == "Error: interrupted; no output was written"
    assert not out.exists()
    assert leftovers(tmp_path) == []


def test_stale_temporaries_of_dead_runs_are_removed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        for kind, pid in (("tmp", dead.pid), ("store", dead.pid), ("tmp", live.pid)):
            (tmp_path / f".out.packtool-{kind}-{pid}").mkdir()
            (tmp_path / f".out.packtool-{kind}-{pid}" / "x").write_text("x")
        (tmp_path / f".other.packtool-tmp-{dead.pid}").mkdir()  # another output's: kept
        src = write_jsonl(tmp_path / "in.jsonl", [{"text": "hello"}])
        packtool.pack([src], out, max_len=8, tokenizer=CharTokenizer())
        assert leftovers(tmp_path) == [f".out.packtool-tmp-{live.pid}"]  # alive: left alone
        assert (tmp_path / f".other.packtool-tmp-{dead.pid}").exists()
    finally:
        live.kill()
        live.wait()


# -- a full disk -----------------------------------------------------------------------------


@contextlib.contextmanager
def small_filesystem(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (root only, as in CI)."""
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"cannot mount a tmpfs as root: {done.stderr}"
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="mounting a tmpfs needs root (CI is)"
)
@pytest.mark.parametrize(
    ("size", "stage"), [("256k", "the work store"), ("1500k", "shard")], ids=["store", "shards"]
)
def test_disk_full_on_a_real_small_filesystem(tmp_path: Path, size: str, stage: str) -> None:
    # ~700 documents: ~1.3 MB of token store, then ~2.7 MB of shards at max_len 1024
    src = _corpus(tmp_path, lines=700)
    with small_filesystem(tmp_path / "disk", size) as disk:
        result = runner.invoke(app, ["pack", str(src), "-L", "1024", "-o", str(disk / "out"), "-q"])
        assert result.exit_code == 1
        assert_one_line(result.stderr)
        assert "No space left on device" in result.stderr
        assert f"cannot write {stage}" in result.stderr
        assert str(disk) in result.stderr  # names the file it could not write
        assert list(disk.iterdir()) == []  # no output, no half output, no temporaries


class _FailingFile(io.RawIOBase):
    """A file that fails with ``code`` once ``limit`` bytes were written."""

    def __init__(self, path: str, limit: int, code: int = errno.ENOSPC) -> None:
        self.file = open(path, "wb")  # noqa: SIM115 - closed in close()
        self.limit, self.code, self.written = limit, code, 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        if self.written + len(data) > self.limit:
            raise OSError(self.code, os.strerror(self.code))
        self.written += len(data)
        return self.file.write(data)

    def fileno(self) -> int:
        return self.file.fileno()

    def close(self) -> None:
        self.file.close()
        super().close()


@pytest.mark.parametrize("where", ["shards", "store", "fsync"])
def test_write_failures_leave_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    src = _corpus(tmp_path, lines=300)
    if where == "shards":
        real = open

        def failing_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if mode == "wb" and str(path).endswith(".arrow"):
                return _FailingFile(path, 20_000)
            return real(path, mode, *args, **kwargs)

        monkeypatch.setattr(packtool.format.writer, "open", failing_open, raising=False)
        expected = r"cannot write shard: No space left on device \(free space"
    elif where == "store":
        monkeypatch.setattr(
            packtool.store, "open", lambda p, mode: _FailingFile(p, 100_000), raising=False
        )
        expected = r"cannot write the work store: No space left on device"
    else:

        def failing_fsync(fd: int) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(packtool.format.writer.os, "fsync", failing_fsync)
        expected = r"cannot write .*: Input/output error"
    with pytest.raises(OSError, match=expected):
        packtool.pack([src], tmp_path / "out", max_len=128, rows_per_shard=50)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []
    result = runner.invoke(app, ["pack", str(src), "-L", "128", "-o", str(tmp_path / "out"), "-q"])
    assert result.exit_code == 1
    assert_one_line(result.stderr)
    assert result.stderr.strip().startswith(f"Error: {tmp_path}/.out.packtool-")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


# -- fuzzed and hostile inputs ---------------------------------------------------------------

SUFFIXES = [".jsonl", ".json", ".txt", ".csv", ".jsonl.gz"]


def _pack_or_clear_error(src: Path, out: Path, **options: object) -> None:
    """Pack ``src``: either a PacktoolError with a one-line message and no output, or an
    output that verifies against ``src``."""
    try:
        packtool.pack([src], out, tokenizer=CharTokenizer(), overwrite=True, **options)
    except PacktoolError as e:
        assert_one_line(str(e))
        assert not out.exists()
        return
    report = verify(out, against=[src], tokenizer=CharTokenizer())
    assert report.ok, report.problems


@FUZZ
@given(
    data=st.binary(max_size=3000),
    suffix=st.sampled_from(SUFFIXES),
    skip_bad=st.booleans(),
    max_len=st.integers(2, 40),
    overflow=st.sampled_from(["split", "truncate", "drop"]),
)
@example(data=b"\xff\xfe{}", suffix=".jsonl", skip_bad=True, max_len=2, overflow="split")
@example(data=b"", suffix=".json", skip_bad=False, max_len=2, overflow="split")
def test_fuzz_random_bytes(
    tmp_path_factory: pytest.TempPathFactory,
    data: bytes,
    suffix: str,
    skip_bad: bool,
    max_len: int,
    overflow: str,
) -> None:
    tmp = tmp_path_factory.mktemp("fuzz")
    src = tmp / f"in{suffix}"
    src.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    _pack_or_clear_error(
        src, tmp / "out", max_len=max_len, overflow=overflow, skip_bad_records=skip_bad
    )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


@FUZZ
@given(
    records=st.lists(
        st.one_of(
            st.fixed_dictionaries({"text": st.text(max_size=80)}),
            st.dictionaries(st.sampled_from(["text", "id", "meta"]), json_values, max_size=3),
            json_values,
        ),
        max_size=12,
    ),
    as_array=st.booleans(),
    skip_bad=st.booleans(),
)
def test_fuzz_json_records(
    tmp_path_factory: pytest.TempPathFactory, records: list, as_array: bool, skip_bad: bool
) -> None:
    tmp = tmp_path_factory.mktemp("fuzzjson")
    src = tmp / ("in.json" if as_array else "in.jsonl")
    lines = [json.dumps(r) for r in records]  # lone surrogates are written as \\udXXX escapes
    src.write_text("[" + ",".join(lines) + "]" if as_array else "\n".join(lines) + "\n")
    _pack_or_clear_error(src, tmp / "out", max_len=16, skip_bad_records=skip_bad)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.binary(max_size=400), suffix=st.sampled_from(SUFFIXES))
def test_fuzz_through_the_cli(
    tmp_path_factory: pytest.TempPathFactory, data: bytes, suffix: str
) -> None:
    tmp = tmp_path_factory.mktemp("cli")
    src, out = tmp / f"in{suffix}", tmp / "out"
    src.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    result = runner.invoke(app, ["pack", str(src), "-L", "8", "-o", str(out), "-q"])
    assert result.exit_code in (0, 1), result.output
    assert "Traceback" not in result.output + result.stderr
    if result.exit_code:
        assert_one_line(result.stderr)
        assert result.stderr.strip().startswith("Error: ") and not out.exists()
    else:
        assert verify(out, against=[src]).ok


def _null_at_a_block_start() -> str:
    # pyarrow reads JSON in 4 MiB blocks cut at line ends; a block starting with a
    # top-level null crashed the process (segmentation fault) before packtool checked.
    line = '{"text": "' + "a" * 87 + '"}\n'  # 100 bytes
    return line * ((4 << 20) // 100) + "null\n" + line * 10


HOSTILE_JSON = {
    "deep-array": ("[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
    "deep-object": ('{"text":' * 50_000 + '"a"' + "}" * 50_000 + "\n", "nested too deeply"),
    "surrogate": ('{"text": "a\\ud800b"}\n', r"unpaired surrogate \\ud800 at character 1"),
    "string": ('{"text": "ok"}\n"a string"\n', "expected a JSON object, found string"),
    "array-text": ('{"text": ["a"]}\n', "field 'text' is array, not a string"),
    "null-first": ("null\n", r"in\.jsonl:1: expected a JSON object, found null"),
    "null-block": (None, r"in\.jsonl:41944: expected a JSON object, found null"),
}


@pytest.mark.parametrize("case", list(HOSTILE_JSON))
def test_hostile_json_is_a_clear_error(tmp_path: Path, case: str) -> None:
    content, message = HOSTILE_JSON[case]
    src = tmp_path / "in.jsonl"
    src.write_text(content if content is not None else _null_at_a_block_start())
    # in a subprocess, with a time limit: a hang or a crash fails the test
    done = subprocess.run(
        [*PACK, str(src), "-L", "16", "-o", str(tmp_path / "out"), "-q"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 1, done.stderr
    assert_one_line(done.stderr)
    assert re.search(message, done.stderr), done.stderr
    assert f"{src}:" in done.stderr
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".txt", ".csv", ".parquet", ".jsonl.gz"])
def test_empty_files(tmp_path: Path, suffix: str) -> None:
    src = tmp_path / f"empty{suffix}"
    src.write_bytes(gzip.compress(b"") if suffix.endswith(".gz") else b"")
    result = runner.invoke(app, ["pack", str(src), "-L", "16", "-o", str(tmp_path / "out"), "-q"])
    assert result.exit_code == 1
    assert_one_line(result.stderr)
    first = result.stderr.strip()
    assert first.startswith((f"Error: {src}", f"Error: no documents in {src}: nothing to pack"))
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


@pytest.mark.slow
def test_a_document_of_ten_million_tokens(tmp_path: Path) -> None:
    n = 10_000_000
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "ab" * (n // 2 - 1)}, {"text": "c"}])
    started = time.perf_counter()
    report = packtool.pack([src], tmp_path / "out", max_len=4096, tokenizer=CharTokenizer())
    assert report.documents.split == 1 and report.tokens == n - 2 + 1 + 2
    checked = verify(tmp_path / "out", against=[src], tokenizer=CharTokenizer())
    assert checked.ok, checked.problems
    assert checked.segments == -(-(n - 1) // 4096) + 1
    assert time.perf_counter() - started < 120


@pytest.mark.slow
def test_huge_lines(tmp_path: Path) -> None:
    # A 6 MB line (over pyarrow's 4 MB JSON block), as JSON Lines and as text.
    text = "word " * 1_200_000
    jsonl = write_jsonl(tmp_path / "huge.jsonl", [{"text": "short"}, {"text": text}])
    txt = tmp_path / "huge.txt"
    txt.write_text("short\n" + text + "\n")
    for src in (jsonl, txt):
        out = tmp_path / f"out-{src.suffix}"
        report = packtool.pack([src], out, max_len=8192, tokenizer=CharTokenizer())
        assert report.documents.read == 2 and report.documents.split == 1
        assert verify(out, against=[src], tokenizer=CharTokenizer()).ok


# -- damaged shards: readers fail cleanly ----------------------------------------------------


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("packed")
    src = write_jsonl(tmp / "in.jsonl", [{"text": "x" * (i % 37)} for i in range(300)])
    packtool.pack([src], tmp / "out", max_len=32, tokenizer=CharTokenizer(), rows_per_shard=60)
    return tmp / "out"


def _read_everything(out: Path) -> None:
    """Every row through packtool's reader: rows, or a FormatError; nothing else."""
    try:
        ds = open_packed(out)
        for i in range(len(ds)):
            ds[i].segments  # noqa: B018
    except FormatError as e:
        assert_one_line(str(e))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7), head=st.booleans())
def test_bit_flips_never_crash_the_reader_and_verify_names_the_shard(
    packed: Path, tmp_path_factory: pytest.TempPathFactory, where: float, bit: int, head: bool
) -> None:
    import shutil

    out = tmp_path_factory.mktemp("flip") / "out"
    shutil.copytree(packed, out)
    shard = sorted(out.glob("*.arrow"))[1]
    data = bytearray(shard.read_bytes())
    # half of the flips in the first 2 KB: schema and record batch headers
    position = int(where * (min(len(data), 2048) if head else len(data)))
    data[position] ^= 1 << bit
    shard.write_bytes(bytes(data))
    _read_everything(out)
    report = verify(out)
    assert not report.ok
    assert [p.shard for p in report.problems if p.check == "sha256"] == [shard.name]
    # problems found in rows name the shard; a changed doc_id may also show as a document
    # twice (in this shard's row and another's) or in the counts, dataset-wide
    local = [p for p in report.problems if p.check not in ("coverage", "counts")]
    assert {p.shard for p in local} == {shard.name}


@pytest.mark.parametrize("keep", [0, 8, 100, 1000, -1])
def test_truncated_shard_is_a_format_error(packed: Path, tmp_path: Path, keep: int) -> None:
    import shutil

    out = tmp_path / "out"
    shutil.copytree(packed, out)
    shard = sorted(out.glob("*.arrow"))[2]
    data = shard.read_bytes()
    shard.write_bytes(data[:keep] if keep >= 0 else data[:-1])
    with pytest.raises(FormatError, match=rf"{shard.name}: "):
        ds = open_packed(out)
        for i in range(len(ds)):
            ds[i].segments  # noqa: B018
    report = verify(out)
    assert {"bytes", "sha256", "shard"} <= set(report.problem_counts)
    assert all(p.shard == shard.name for p in report.problems)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        # Paths inside the directory are allowed (a merge without copying lists
        # units/unit-I-of-N/data-*.arrow); nothing that climbs out or hides is.
        ({"shards": [{"file": "../../etc/passwd", "rows": 1}]}, "not a path inside"),
        ({"shards": [{"file": "units/../../x.arrow", "rows": 1}]}, "not a path inside"),
        ({"shards": [{"file": "/etc/passwd", "rows": 1}]}, "not a path inside"),
        ({"shards": [{"file": "units/.u/x.arrow", "rows": 1}]}, "not a path inside"),
        ({"shards": [{"file": "units//x.arrow", "rows": 1}]}, "not a path inside"),
        ({"shards": [{"file": "C:x.arrow", "rows": 1}]}, "not a path inside"),
        ({"shards": [{"file": "a.arrow", "rows": 1, "doc_offset": -2}]}, "not a document"),
        ({"shards": [{"file": "data.arrow", "rows": -1}]}, "not a row count"),
        ({"shards": "data.arrow"}, "'shards' is not a list"),
        ({"max_len": "4096"}, "not a positive integer"),
        ({"format_version": 2}, "format version 2 is not supported"),
        ({"format": "something.else"}, "not a packtool manifest"),
    ],
)
def test_hostile_manifests_are_refused(
    packed: Path, tmp_path: Path, edit: dict, message: str
) -> None:
    import shutil

    out = tmp_path / "out"
    shutil.copytree(packed, out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest.update(edit)
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FormatError, match=message):
        open_packed(out)
    result = runner.invoke(app, ["verify", str(out)])
    assert result.exit_code == 1 and result.stderr.strip().startswith("Error: ")
    assert_one_line(result.stderr)


# -- security --------------------------------------------------------------------------------


def test_no_code_from_inputs() -> None:
    """No pickle, eval/exec or remote code anywhere in packtool (docs/security.md)."""

    # The one pickle packtool writes, never reads: the older Megatron-Bridge .npy export
    # (`export --to megatron-bridge --npy`), a pickle by its format (docs/security.md).
    npy_writer = "np.save(f, array, allow_pickle=True)"
    for path in (REPO / "packtool").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if path == REPO / "packtool" / "export" / "bridge.py":
            assert text.count(npy_writer) == 1
            text = text.replace(npy_writer, "")
        for pattern in (
            r"\bimport pickle\b",
            r"\bpickle\.",
            r"\beval\(",
            r"\bexec\(",
            r"trust_remote_code\s*=\s*True",
            r"allow_pickle\s*=\s*True",
            r"torch\.load\(",
            r"\bmarshal\.",
            r"datasets\.load_dataset\(|import load_dataset",  # may run a loading script
        ):
            assert not re.search(pattern, text), f"{path.name}: {pattern}"
