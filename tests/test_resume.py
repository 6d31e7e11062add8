"""pack --resume: an interrupted run continues from its checkpoint to the same output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE, CharTokenizer
from helpers import read_rows

import packtool
from packtool import pipeline
from packtool.store import work_dir_for


class Stop(KeyboardInterrupt):
    pass


def _interrupt_after(n_batches: int):
    seen = {"n": 0}

    def progress(stage: str, done: int, total: int | None) -> None:
        if stage == "tokenize":
            seen["n"] += 1
            if seen["n"] == n_batches:
                raise Stop

    return progress


def _corpus(tmp_path: Path) -> list[Path]:
    # Two inputs, so that resuming crosses an input boundary and starts inside one.
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(lines[:300]) + "\n", encoding="utf-8")
    b.write_text("\n".join(lines[300:2500]) + "\n{bad json\n", encoding="utf-8")
    return [a, b]


@pytest.mark.parametrize("stop_at", [1, 2, 4])
def test_resume_gives_the_uninterrupted_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop_at: int
) -> None:
    monkeypatch.setattr(pipeline, "_CHECKPOINT_SECONDS", 0.0)  # checkpoint after every batch
    inputs = _corpus(tmp_path)
    opts = {"max_len": 512, "skip_bad_records": True, "rows_per_shard": 500}
    full = packtool.pack(inputs, tmp_path / "full", **opts)
    out = tmp_path / "out"
    with pytest.raises(Stop):
        packtool.pack(inputs, out, resume=True, progress=_interrupt_after(stop_at), **opts)
    assert not out.exists()
    work = work_dir_for(out)
    checkpoint = json.loads((work / "checkpoint.json").read_text())
    assert checkpoint["state"]["counts"]["documents"]["read"] > 0
    resumed = packtool.pack(inputs, out, resume=True, **opts)
    assert resumed.resumed and not full.resumed
    assert not work.exists()
    m_full, rows_full = read_rows(tmp_path / "full")
    m_res, rows_res = read_rows(out)
    assert rows_res == rows_full
    assert [s["sha256"] for s in m_res["shards"]] == [s["sha256"] for s in m_full["shards"]]
    for key in ("documents", "inputs", "tokens", "rows", "bad_records", "segments"):
        assert m_res[key] == m_full[key], key


def test_resume_with_other_options_starts_afresh(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(pipeline, "_CHECKPOINT_SECONDS", 0.0)
    inputs = _corpus(tmp_path)
    with pytest.raises(Stop):
        packtool.pack(
            inputs,
            tmp_path / "out",
            max_len=512,
            skip_bad_records=True,
            resume=True,
            progress=_interrupt_after(2),
        )
    report = packtool.pack(
        inputs, tmp_path / "out", max_len=256, skip_bad_records=True, resume=True
    )
    assert not report.resumed
    # said, not silent: a user who changed an option by mistake learns why nothing resumed
    (notice,) = [n for n in report.notices if n.startswith("--resume")]
    assert f"checkpoint in {work_dir_for(tmp_path / 'out')} was made with other" in notice
    assert "started over" in notice
    # a --resume run with no checkpoint to find says nothing of one
    again = packtool.pack(
        inputs, tmp_path / "again", max_len=256, skip_bad_records=True, resume=True
    )
    assert not [n for n in again.notices if n.startswith("--resume")]
    packtool.pack(inputs, tmp_path / "fresh", max_len=256, skip_bad_records=True)
    assert read_rows(tmp_path / "out")[1] == read_rows(tmp_path / "fresh")[1]


def test_without_resume_an_interrupted_run_leaves_nothing(tmp_path: Path) -> None:
    src = _corpus(tmp_path)[0]
    with pytest.raises(Stop):
        packtool.pack(
            [src],
            tmp_path / "out",
            max_len=512,
            tokenizer=CharTokenizer(),
            progress=_interrupt_after(1),
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl"]


@pytest.mark.slow
def test_resume_after_sigkill(tmp_path: Path) -> None:
    """A real kill -9 in the middle of tokenizing, then `pack --resume` from the CLI."""
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    big = tmp_path / "big.jsonl"
    big.write_text("\n".join(lines * 3) + "\n", encoding="utf-8")
    env = dict(
        os.environ, PYTHONPATH=str(REPO), PACKTOOL_CHECKPOINT_SECONDS="0.2", RAYON_NUM_THREADS="1"
    )
    cmd = [
        sys.executable,
        "-m",
        "packtool.cli",
        "pack",
        str(big),
        "--max-len",
        "1024",
        "--rows-per-shard",
        "2000",
        "-q",
        "--tokenizer-backend",
        "hf",  # the slower backend, so that the kill lands mid-run
    ]
    out = tmp_path / "out"
    proc = subprocess.Popen([*cmd, "-o", str(out), "--resume"], env=env)
    checkpoint = work_dir_for(out) / "checkpoint.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if checkpoint.exists():
            state = json.loads(checkpoint.read_text())["state"]
            if state["counts"]["documents"]["read"] > 0 and not state["done"]:
                break
        time.sleep(0.05)
    assert proc.poll() is None, "pack finished before it could be killed: use a larger corpus"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    result = subprocess.run(
        [*cmd, "-o", str(out), "--resume"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    subprocess.run([*cmd, "-o", str(tmp_path / "ref")], env=env, check=True)
    assert read_rows(out)[1] == read_rows(tmp_path / "ref")[1]
    assert not work_dir_for(out).exists()


def test_resume_chat_keeps_labels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Labels are resumed too: the labels file is cut back to the checkpoint with the tokens."""
    monkeypatch.setattr(pipeline, "_CHECKPOINT_SECONDS", 0.0)
    chat = REPO / "sample_data" / "chat.jsonl"
    lines = chat.read_text(encoding="utf-8").splitlines()
    src = tmp_path / "chat.jsonl"
    src.write_text("\n".join(lines * 8) + "\n", encoding="utf-8")
    opts = {"max_len": 2048, "chat_template": REPO / "sample_data" / "chatml.jinja"}
    packtool.pack([src], tmp_path / "full", **opts)
    with pytest.raises(Stop):
        packtool.pack([src], tmp_path / "out", resume=True, progress=_interrupt_after(2), **opts)
    assert packtool.pack([src], tmp_path / "out", resume=True, **opts).resumed
    m_full, rows_full = read_rows(tmp_path / "full")
    m_res, rows_res = read_rows(tmp_path / "out")
    assert rows_res == rows_full and "labels" in rows_res[0]
    assert m_res["tokens"] == m_full["tokens"] and m_res["labels"] == m_full["labels"]


@pytest.mark.parametrize("stage", ["tokenize", "pack"])
@pytest.mark.parametrize("again", ["gigatoken", "auto"])
def test_resume_records_the_backend_that_encoded_the_stored_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage: str, again: str
) -> None:
    """A run stopped after its documents were encoded (by gigatoken, which auto picks for
    this byte-level BPE) encodes nothing when resumed: the manifest named `tokenizers` ("no
    document to encode") all the same."""
    monkeypatch.setattr(pipeline, "_CHECKPOINT_SECONDS", 0.0)
    inputs = _corpus(tmp_path)
    opts = {"max_len": 512, "skip_bad_records": True, "tokenizer_backend": "gigatoken"}
    full = packtool.pack(inputs, tmp_path / "full", **opts)
    assert full.manifest.tokenizer.backend is not None
    recorded = full.manifest.tokenizer.backend.record
    assert recorded["name"] == "gigatoken"
    out = tmp_path / "out"
    seen = {"n": 0}

    def stop(at: str, done: int, total: int | None) -> None:
        seen["n"] += at == stage
        if at == stage and (stage == "pack" or seen["n"] == 2):
            raise Stop

    with pytest.raises(Stop):
        packtool.pack(inputs, out, resume=True, progress=stop, **opts)
    resumed = packtool.pack(inputs, out, resume=True, **{**opts, "tokenizer_backend": again})
    assert resumed.resumed
    record = json.loads((out / "manifest.json").read_text())["tokenizer"]["backend"]
    assert record["name"] == "gigatoken", record
    assert "no document" not in record["reason"]
    assert record == {**recorded, "reason": record["reason"]}
    if stage == "pack":  # nothing was encoded after the resume: the record is the first run's
        assert record == recorded
