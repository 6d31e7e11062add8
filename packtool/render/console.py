"""The two rich consoles of the command line: reports on stdout; errors, notes and progress
on stderr. Each is made on first use (``--help`` does not import rich).

Neither console reads markup or emoji codes in what it prints: file names, field names, ids
and the text of records reach these lines (``[red]x.jsonl``, ``{"[/]": 1}``,
``pip install 'packtool[ray]'``) and must be shown as they are. A line's styled label
(``Error:``, ``note:``) is the only markup, given apart (:func:`line`); control characters
(a newline in a file name) are shown escaped (:func:`clean`), so an error stays one line.
"""

from __future__ import annotations

import functools
import unicodedata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text


@functools.cache
def stdout() -> Console:
    """The rich console of the reports."""
    from rich.console import Console

    return Console(markup=False, emoji=False)


@functools.cache
def stderr() -> Console:
    """The rich console of errors, notes and progress."""
    from rich.console import Console

    return Console(stderr=True, markup=False, emoji=False)


def _escaped(ch: str) -> str:
    if ch in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean(text: object) -> str:
    """``text`` with its control characters and line or paragraph separators escaped as
    ``repr`` escapes them (a newline becomes the two characters ``\\``, ``n``): what one line
    of a report or error shows of a file name or a value.

    >>> clean("a\\nb.jsonl")
    'a\\\\nb.jsonl'
    >>> clean("[red]x\\x1b[0m")
    '[red]x\\\\x1b[0m'
    """
    text = str(text)
    if text.isprintable():
        return text
    return "".join(
        _escaped(ch) if unicodedata.category(ch) in ("Cc", "Zl", "Zp") else ch for ch in text
    )


def plain(text: object, style: str = "") -> Text:
    """``text`` as a rich Text, printed as it is (no markup read), control characters
    escaped (:func:`clean`)."""
    from rich.text import Text

    return Text(clean(text), style=style)


def line(label: str, text: object) -> Text:
    """One line: ``label`` (rich markup, e.g. ``[yellow]note:[/]``: a constant of packtool's,
    never user data), a space, then ``text`` as it is (:func:`plain`)."""
    from rich.text import Text

    return Text.assemble(Text.from_markup(label), " ", plain(text))


def say(text: object, *, label: str = "", err: bool = False) -> None:
    """Print one line (``label`` first, if any) on stdout (``err``: stderr): no markup read,
    no highlighting, never wrapped."""
    console = stderr() if err else stdout()
    console.print(line(label, text) if label else plain(text), highlight=False, soft_wrap=True)


def note(label: str, text: str) -> None:
    """One line on stderr, ``label:`` first (``[yellow]note:[/]``, ``[yellow]skipped:[/]``),
    then the line as it is (no markup read; control characters escaped; never wrapped)."""
    say(text, label=label, err=True)


def error(message: str) -> None:
    """The one line of an error on stderr: ``Error:`` (bold red), then ``message`` as it is."""
    say(message, label="[bold red]Error:[/]", err=True)
