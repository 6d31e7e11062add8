"""The docs against the code: every command and option is documented."""

from __future__ import annotations

import re

import pytest
from conftest import REPO
from typer.testing import CliRunner

from packtool.cli import app

DOCS = "\n".join(
    p.read_text(encoding="utf-8")
    for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
)
COMMANDS = sorted(
    c.name or c.callback.__name__.replace("_", "-")  # type: ignore[union-attr]
    for c in app.registered_commands
)


def options_of(command: str) -> set[str]:
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", result.stdout)) - {"--help"}


def test_every_command_is_documented() -> None:
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "240"})
    commands = result.stdout.split("Commands:\n", 1)[1]
    listed = set(re.findall(r"^  ([\w-]+) ", commands, flags=re.M))
    assert set(COMMANDS) <= listed
    for command in listed:
        assert f"packtool {command}" in DOCS, command


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_is_documented(command: str) -> None:
    options = options_of(command)
    assert options, command
    missing = sorted(o for o in options if not re.search(re.escape(o) + r"(?![a-z-])", DOCS))
    assert not missing, f"packtool {command}: undocumented options {missing}"


def test_readme_pack_table_lists_every_pack_option() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## `packtool pack` options") :]
    table = table[: table.index("\n## ")]
    missing = sorted(
        o for o in options_of("pack") if not re.search(re.escape(o) + r"(?![a-z-])", table)
    )
    assert not missing, f"README's pack table misses {missing}"


def test_ci_runs_the_readme_test_command_in_parallel() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    (command,) = re.findall(
        r"^(?:apt-get .*&& )?pip install torch.*&& python -m pytest.*$", readme, flags=re.M
    )
    assert "-n auto" in command  # pytest-xdist: every core
    # the browser test of `stats --html` renders the page in Chromium from the OS packages
    assert re.search(r"apt-get install .*\bchromium\b", command)
    assert command in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()


def test_the_cli_reference_is_what_the_cli_declares() -> None:
    """docs/cli.md is generated from the CLI (scripts/cli_reference.py): regenerated here, it
    must be the same text, so it cannot go stale."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "cli_reference", REPO / "scripts" / "cli_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = module.reference()
    on_disk = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert on_disk == text, "docs/cli.md is out of date: run python scripts/cli_reference.py"
    # every option of every command is in it, with its default where the CLI declares one
    import click
    import typer.main

    group = typer.main.get_command(app)
    ctx = click.Context(group)
    for command in group.list_commands(ctx):
        section = text.split(f"## `packtool {command}`", 1)[1].split("\n## ", 1)[0]
        for param in group.get_command(ctx, command).params:
            for option in [*param.opts, *param.secondary_opts]:
                if param.param_type_name == "option":
                    assert f"`{option}`" in section, (command, option)
    assert "| `--max-len`, `-L` INTEGER | (required) |" in text
    assert "| `--seed` | `0` | Seed of the row shuffle. |" in text
