"""The library's progress callback drawn as rich progress bars (on stderr); off a terminal,
a plain line per stage now and then."""

from __future__ import annotations

import datetime
import threading
import time
from typing import TYPE_CHECKING, Any, ClassVar

from .console import stderr

if TYPE_CHECKING:
    from rich.progress import TaskID


LOG_PROGRESS_SECONDS = 30.0
"""Off a terminal, seconds between the plain progress lines of a stage."""


class RichProgress:
    """Renders the library's progress callback as rich progress bars (on stderr)."""

    _LABELS: ClassVar[dict[str, str]] = {
        "tokenize": "read + tokenize",
        "pack": "pack (FFD)",
        "write": "write rows",
        "measure": "measure units (--mix)",  # a mixture's units, tokenized before the plan
    }

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.tasks: dict[str, TaskID] = {}
        self.begun: dict[str, float] = {}  # monotonic time of each stage's first report
        self.logged: dict[str, float] = {}  # ... and of its last plain progress line
        self.last: dict[str, tuple[int, int | None, str]] = {}  # each stage's last report
        self._beat: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        if not enabled:  # --quiet, --json: rich's progress module is not even imported
            return
        from rich.progress import (
            BarColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("{task.description:<16}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=stderr(),
            transient=False,
        )

    started = False  # at the first report, so that an early error prints its line alone

    def __enter__(self) -> RichProgress:
        self.entered = time.monotonic()  # the first stage's clock starts here, not at its
        return self  # first report (one huge document: minutes later)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        if not self.started:
            return
        if exc[0] is None:
            self.progress.__exit__(*exc)
            return
        # An error follows, on one line: the bars go (a terminal erases them; elsewhere
        # nothing more is written).
        self.progress.live.transient = True
        console = stderr()
        quiet, console.quiet = console.quiet, not console.is_terminal
        try:
            self.progress.__exit__(*exc)
        finally:
            console.quiet = quiet

    def _start(self) -> None:
        if not self.started:
            self.progress.__enter__()
            self.started = True
            if not stderr().is_terminal:
                self._beat = threading.Thread(
                    target=self._heartbeat, daemon=True, name="packtool-progress"
                )
                self._beat.start()

    def _heartbeat(self) -> None:
        """Off a terminal, a stage that has not finished gets its line every
        LOG_PROGRESS_SECONDS even while no report comes (one huge document in the
        tokenizer, a slow store), with its true elapsed time."""
        while not self._stop.wait(max(LOG_PROGRESS_SECONDS / 4, 0.05)):
            for stage, (completed, total, detail) in list(self.last.items()):
                if total is None or completed < total:
                    self._log(stage, completed, total, detail)

    def _detail(self, stage: str, completed: int, total: int | None) -> str:
        if stage == "tokenize":
            return f"{completed / 1e6:,.1f}/{(total or 0) / 1e6:,.1f} MB"
        return "" if total is None else f"{completed:,}/{total:,}"

    def __call__(self, stage: str, completed: int, total: int | None) -> None:
        if not self.enabled:
            return
        self._start()
        task = self.tasks.get(stage)
        if task is None:
            first = not self.tasks
            task = self.progress.add_task(self._LABELS.get(stage, stage), total=total, detail="")
            self.tasks[stage] = task
            entered = getattr(self, "entered", None)
            if first and entered is not None:
                # rich's clock (time.monotonic too) and the plain lines' start at __enter__
                self.progress.tasks[-1].start_time = entered
                self.begun.setdefault(stage, entered)
        detail = self._detail(stage, completed, total)
        self.begun.setdefault(stage, time.monotonic())
        self.last[stage] = (completed, total, detail)
        self.progress.update(task, completed=completed, total=total or 1, detail=detail)
        if not stderr().is_terminal:
            self._log(stage, completed, total, detail)

    def _log(self, stage: str, completed: int, total: int | None, detail: str) -> None:
        """Off a terminal (a Slurm or CI log), the bars are drawn only at the end: a plain
        line per stage every LOG_PROGRESS_SECONDS instead, so a long run shows it moves."""
        now = time.monotonic()
        with self._lock:  # the reports' thread and the heartbeat's
            first = self.begun.setdefault(stage, now)
            if now - self.logged.get(stage, first) < LOG_PROGRESS_SECONDS:
                return
            self.logged[stage] = now
        share = f"{completed / total:4.0%} " if total else ""
        elapsed = datetime.timedelta(seconds=int(now - first))
        stderr().print(
            f"{self._LABELS.get(stage, stage)}: {share}{detail} ({elapsed} elapsed)",
            highlight=False,
            soft_wrap=True,
        )


class VerifyProgress(RichProgress):
    """Progress of ``verify``: bytes hashed, rows checked, input bytes re-read."""

    _LABELS: ClassVar[dict[str, str]] = {
        "hash": "sha256 shards",
        "rows": "check rows",
        "against": "re-tokenize inputs",
    }

    def _detail(self, stage: str, completed: int, total: int | None) -> str:
        if stage in ("hash", "against"):
            return f"{completed / 1e6:,.1f}/{(total or 0) / 1e6:,.1f} MB"
        return f"{completed:,}/{total or 0:,}"
