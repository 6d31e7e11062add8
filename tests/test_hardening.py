"""What an adversarial trial broke (issue 20), each through the CLI: the exit code, one line
on stderr, no traceback, and nothing left behind in or beside the output directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from test_cli import assert_one_line_error, run

from packtool.chat import ChatTemplate

CHAT = REPO / "sample_data" / "chat.jsonl"
RUNAWAY = "{% for i in range(99999) %}{% for j in range(99999) %}{{ j }}{% endfor %}{% endfor %}"


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
