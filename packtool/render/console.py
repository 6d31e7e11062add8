"""The two rich consoles of the command line: reports on stdout; errors, notes and progress
on stderr. Each is made on first use (``--help`` does not import rich)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


@functools.cache
def stdout() -> Console:
    """The rich console of the reports."""
    from rich.console import Console

    return Console()


@functools.cache
def stderr() -> Console:
    """The rich console of errors, notes and progress."""
    from rich.console import Console

    return Console(stderr=True)


def note(label: str, line: str) -> None:
    """One line on stderr, ``label:`` first (``[yellow]note:[/]``, ``[yellow]skipped:[/]``),
    then the line (markup read as rich reads it; no highlighting; never wrapped)."""
    stderr().print(f"{label} {line}", highlight=False, soft_wrap=True)
