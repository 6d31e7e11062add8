"""The docs against the code: every command and option is documented."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

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
    assert "| `--seed` | `0` | Seed of the row shuffle (with --mix, also of the documents" in text


README = (REPO / "README.md").read_text(encoding="utf-8")


def test_readme_is_a_front_door() -> None:
    """At most 150 lines; the long option tables live in docs/cli.md, linked from it."""
    assert len(README.splitlines()) <= 150
    assert "(docs/cli.md)" in README
    for doc in re.findall(r"\]\((docs/[\w.]+\.md|CHANGELOG\.md)", README):
        assert (REPO / doc).is_file(), doc


def _cells(line: str) -> list[str]:
    """A table row's cells, whether drawn with rich's box characters or with spaces."""
    return [c.strip() for c in re.split(r"\s{2,}|[│┃|]", line.strip()) if c.strip()]


def _tour() -> list[tuple[str, list[str]]]:
    """The README tour's commands (``$ packtool ...``) and the output lines shown after each."""
    shown: list[tuple[str, list[str]]] = []
    fence: str | None = None  # the info string of the code block we are in
    for line in README.splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line[3:]
        elif fence == "" and line.startswith("$ packtool "):
            shown.append((line[2:], []))
        elif fence == "" and shown and line.strip():
            shown[-1][1].append(line)
        elif fence is None and shown:
            shown.append(("", []))  # prose ends a command's output
    return [(c, lines) for c, lines in shown if c]


@pytest.mark.slow
def test_readme_tour_runs_and_prints_what_it_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every command of the tour runs on the sample data, and every line of output the README
    shows is in what it prints (the same cells, figures recomputed)."""
    from packtool.render import console

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(tmp_path / "cache"))  # a first run's output
    (tmp_path / "sample_data").symlink_to(REPO / "sample_data")
    # the consoles are made once per process, at the width of the first command: make them
    # again at the README's width (100 columns)
    console.stdout.cache_clear()
    console.stderr.cache_clear()
    monkeypatch.setenv("COLUMNS", "100")
    tour = _tour()
    assert [c.split()[1] for c, _ in tour] == ["pack", "stats", "inspect", "verify"]
    for command, lines in tour:
        result = CliRunner().invoke(app, shlex.split(command)[1:], env={"COLUMNS": "100"})
        assert result.exit_code == 0, (command, result.output)
        printed = [_cells(out) for out in result.output.splitlines()]
        for line in lines:
            want = _cells(line)
            assert any(got[: len(want)] == want for got in printed), (command, line)
    assert (tmp_path / "stats.html").is_file()
    # the other commands of the README's code blocks run too
    commands = re.findall(r"^(packtool (?:pack|inspect) .*?)(?:\s+#.*)?$", README, flags=re.M)
    for command in commands:
        result = CliRunner().invoke(app, shlex.split(command)[1:], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (command, result.output)


@pytest.mark.slow
@pytest.mark.torch
def test_readme_training_snippet_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import packtool

    monkeypatch.chdir(tmp_path)
    packtool.pack([REPO / "sample_data" / "corpus.jsonl"], "out/", max_len=4096)
    training = README[README.index("## Training") :]
    (snippet,) = re.findall(r"```python\n(.*?)```", training, flags=re.S)[:1]
    scope: dict = {}
    exec(compile(snippet, "README.md", "exec"), scope)
    loss = scope["loss"]
    assert loss.ndim == 0 and bool(loss.isfinite())
    grads = [p.grad for p in scope["model"].parameters() if p.grad is not None]
    assert grads  # the backward pass reached the model


def test_the_aligned_row_of_the_docs_is_what_pack_writes(tmp_path: Path) -> None:
    """docs/format.md's and docs/context-parallel.md's aligned row (documents a, b, c of 5, 9
    and 7 tokens, max_len 32, N 4) is the row `pack` writes for them, in FFD's order."""
    import json

    import packtool

    ids = {"a": 10, "b": 11, "c": 12}
    lengths = {"a": 5, "b": 9, "c": 7}
    src = tmp_path / "abc.jsonl"
    src.write_text("".join(json.dumps({"ids": [ids[d]] * n}) + "\n" for d, n in lengths.items()))
    packtool.pack([src], tmp_path / "o", max_len=32, pad_to_multiple_of=4, ids_field="ids",
                  add_eos=False, pad_id=1)  # fmt: skip
    row = packtool.open_packed(tmp_path / "o")[0]
    letter = {v: k for k, v in ids.items()}
    got = {
        "input_ids": " ".join(letter.get(int(t), "P") for t in row.input_ids),
        "position_ids": " ".join(str(int(p)) for p in row.position_ids),
        "cu_seqlens": str([int(x) for x in row.cu_seqlens]),
        "cu_seqlens_unpadded": str([int(x) for x in row.cu_seqlens_unpadded]),
        "num_tokens": str(int(row.num_tokens)),
        "doc_ids": str([int(x) for x in row.doc_ids]),
        "seq_lengths": str([int(x) for x in row.seq_lengths]),
    }
    for doc in ("format.md", "context-parallel.md"):
        text = (REPO / "docs" / doc).read_text(encoding="utf-8")
        (block,) = [b for b in re.findall(r"```\n(.*?)```", text, flags=re.S) if "_unpadded" in b]
        shown = dict(re.findall(r"^(\w+) +(\S.*?)(?: {3,}.*)?$", block, flags=re.M))
        shown = {k: v for k, v in shown.items() if k in got}
        assert {"input_ids", "cu_seqlens", "cu_seqlens_unpadded"} <= set(shown), (doc, shown)
        for key, value in shown.items():
            assert value == got[key], (doc, key)
