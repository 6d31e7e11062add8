"""Write docs/cli.md, the command-line reference, from the command line's own declarations.

Every command, its usage, its help, and a table of its arguments and options (grouped by help
panel, as ``--help`` groups them) with each option's default and meaning, all read from the
click commands that typer builds from packtool/cli.py: nothing is written by hand, so the
reference cannot differ from what the CLI declares (tests/test_docs.py regenerates it and
compares)::

    python scripts/cli_reference.py            # rewrite docs/cli.md
    python scripts/cli_reference.py --check    # exit 1 if docs/cli.md is not up to date
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"

_DEFAULT = re.compile(r"\s*\[(default: (?P<default>[^\]]*)|(?P<required>required))\]\.?\s*$")

HEADER = """\
# Command-line reference

Every command of `packtool` and every option, with its default and meaning. This file is
generated from the command line's own declarations by `python scripts/cli_reference.py`;
`tests/test_docs.py` fails when it differs from what the CLI declares. `packtool COMMAND
--help` prints the same text.

Every command exits 0 when it did what was asked; 1 when an input, an output or the data is
wrong (a missing file, a bad record, an output that exists, a problem `verify` or
`check-model` found), with one line `Error: ...` naming it; 2 when an option is wrong
(missing, unknown, or a value out of its range, such as `--max-len 0` or an `inspect --row`
past the last row).
"""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _split_default(help_text: str) -> tuple[str, str]:
    """A help record's text without its trailing ``[default: X]`` (or ``[required]``), and X."""
    m = _DEFAULT.search(help_text)
    if m is None:
        return help_text, ""
    value = m.group("default") or ""
    default = "(required)" if m.group("required") else value if " " in value else f"`{value}`"
    return help_text[: m.start()], default


def _term(param: Any) -> str:
    """An option's names as code spans (``-L``, ``--max-len``; ``--eos`` / ``--no-eos``), with
    its metavar where it declares one."""
    term = ", ".join(f"`{o}`" for o in sorted(param.opts, key=len, reverse=True))
    if param.secondary_opts:
        term += " / " + ", ".join(f"`{o}`" for o in param.secondary_opts)
    return term + (f" {param.metavar}" if param.metavar else "")


def _flag_default(param: Any, default: str) -> str:
    """The default of an on/off flag named as its flag (``--shuffle``, ``off``)."""
    if not getattr(param, "is_flag", False) or param.default is None:
        return default
    if param.secondary_opts:
        return f"`{param.opts[0] if param.default else param.secondary_opts[0]}`"
    return "on" if param.default else "off"


def _command_section(name: str, command: Any, ctx: Any) -> list[str]:
    import click

    sub = click.Context(command, info_name=f"packtool {name}", parent=ctx)
    usage = " ".join(command.collect_usage_pieces(sub))
    lines = [f"## `packtool {name}`", "", "```", f"packtool {name} {usage}", "```", ""]
    help_text = (command.help or "").strip()
    for paragraph in help_text.split("\n\n"):
        lines += [" ".join(paragraph.split()), ""]
    sections: dict[str, list[tuple[str, str, str]]] = {"Arguments": [], "Options": []}
    for param in command.get_params(sub):
        record = param.get_help_record(sub)
        if param.param_type_name == "argument":
            name = (param.name or "").upper() + ("..." if param.nargs == -1 else "")
            meaning, default = _split_default(record[1] if record else "")
            sections["Arguments"].append((f"`{name}`", default, meaning))
            continue
        if record is None or param.name == "help":
            continue
        meaning, default = _split_default(record[1])
        panel = getattr(param, "rich_help_panel", None) or "Options"
        sections.setdefault(panel, []).append(
            (_term(param), _flag_default(param, default), meaning)
        )
    for title, rows in sections.items():
        if not rows:
            continue
        lines += [f"### {title}", "", "| option | default | meaning |", "|---|---|---|"]
        lines += [f"| {_cell(t)} | {_cell(d)} | {_cell(m)} |" for t, d, m in rows]
        lines.append("")
    return lines


def reference() -> str:
    """The text of docs/cli.md, from the CLI as it is declared now."""
    import click
    import typer.main

    from packtool.cli import app

    group = typer.main.get_command(app)
    ctx = click.Context(group, info_name="packtool")
    names = [n for n in group.list_commands(ctx) if not group.get_command(ctx, n).hidden]
    lines = [HEADER, "| command | what it does |", "|---|---|"]
    for name in names:
        command = group.get_command(ctx, name)
        first = (command.help or "").strip().split("\n\n")[0]
        lines.append(f"| [`{name}`](#packtool-{name}) | {_cell(first)} |")
    lines.append("")
    for name in names:
        lines += _command_section(name, group.get_command(ctx, name), ctx)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = reference()
    if "--check" in argv:
        if DOC.read_text(encoding="utf-8") != text:
            print(f"{DOC} is out of date: run python scripts/cli_reference.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
