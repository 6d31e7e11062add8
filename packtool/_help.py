"""Plain help for the command line: click's own layout, with typer's help panels as sections.

The CLI does not render its help with rich (whose markdown and syntax modules alone cost
``packtool --help`` about 0.1 s); it keeps rich for its reports and errors. Options declared
with ``rich_help_panel`` are listed under that heading after the other options.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from typing import Any

import typer
import typer.core

from ._params import plain_values

HelpFormatter = typer.Context.formatter_class  # click's, as typer vendors it


def _wrap(text: str, width: int) -> list[str]:
    """Lines of ``text`` at most ``width`` wide, never cut inside a word: an option named
    in a help text (``--max-len``) stays whole, where click would break it at a hyphen."""
    return textwrap.wrap(text, max(width, 10), break_on_hyphens=False, break_long_words=False)


class _Formatter(HelpFormatter):
    def write_text(self, text: str) -> None:
        indent = " " * self.current_indent
        paragraphs = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]
        wrapped = ["\n".join(indent + line for line in _wrap(p, self.width - len(indent)))
                   for p in paragraphs]  # fmt: skip
        self.write("\n\n".join(wrapped) + "\n")

    def write_dl(
        self, rows: Iterable[tuple[str, str]], col_max: int = 30, col_spacing: int = 2
    ) -> None:
        rows = list(rows)
        first = min(max((len(term) for term, _ in rows), default=0), col_max)
        column = self.current_indent + first + col_spacing
        for term, text in rows:
            lines = _wrap(" ".join(text.split()), self.width - column) or [""]
            self.write(" " * self.current_indent + term)
            if len(term) <= first:
                self.write(" " * (column - self.current_indent - len(term)) + lines.pop(0))
            self.write("\n")
            for line in lines:
                self.write(" " * column + line + "\n")


def _plain_help_option(option: Any) -> Any:
    if option is not None:
        plain_values([option])
    return option


class _Context(typer.Context):
    formatter_class = _Formatter


class PanelCommand(typer.core.TyperCommand):
    """A typer command whose plain help groups its options by help panel, and whose plain
    options are converted without a pydantic model each (:mod:`packtool._params`)."""

    context_class = _Context

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        plain_values(self.params)

    def get_help_option(self, ctx: Any) -> Any:
        return _plain_help_option(super().get_help_option(ctx))

    def format_options(self, ctx: Any, formatter: Any) -> None:
        sections: dict[str, list[tuple[str, str]]] = {"Arguments": [], "Options": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                sections["Arguments"].append(record)
            else:
                panel = getattr(param, "rich_help_panel", None) or "Options"
                sections.setdefault(panel, []).append(record)
        for title, records in sections.items():
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)


class PanelGroup(typer.core.TyperGroup):
    """The top-level group: each command's whole first paragraph, wrapped, not cut at 45
    characters as click's short help is."""

    context_class = _Context

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        plain_values(self.params)

    def get_help_option(self, ctx: Any) -> Any:
        return _plain_help_option(super().get_help_option(ctx))

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is None or command.hidden:
                continue
            text = command.short_help or (command.help or "").split("\n\n")[0]
            rows.append((name, " ".join(text.split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
