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
    (command,) = re.findall(r"^pip install torch.*&& python -m pytest.*$", readme, flags=re.M)
    assert "-n auto" in command  # pytest-xdist: every core
    assert command in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
