"""The command line converts its plain option values as typer does, without pydantic.

``packtool._params`` gives each plain option (str, int, float, bool, a parser) its own
``process_value``; typer's own is the class's method. For every option of every command and
generated values (digits, signs, spaces, points, exponents, underscores, letters, the
default, nothing), both give the same value of the same type, or the same error."""

from __future__ import annotations

import subprocess
import sys

import hypothesis.strategies as st
import pytest
import typer
import typer.main
from hypothesis import given, settings

from packtool.cli import app

_GROUP = typer.main.get_command(app)
_COMMANDS = {"": _GROUP, **_GROUP.commands}


def _params() -> list[tuple[str, str]]:
    found = []
    for name, command in _COMMANDS.items():
        ctx = command.context_class(command, info_name=name or "packtool")
        for param in [*command.params, command.get_help_option(ctx)]:
            if param is not None and "process_value" in vars(param):
                found.append((name, param.name))
    return found


PARAMS = _params()


def _outcome(fn, ctx, value):
    try:
        result = fn(ctx, value)
    except Exception as e:
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        return ("error", type(e).__name__, message)
    return ("value", type(result).__name__, repr(result))  # repr: nan equals nan


_VALUES = st.one_of(
    st.text(alphabet="0123456789+-. eE_x,", max_size=8),
    st.integers(-(10**20), 10**20).map(str),
    st.floats(allow_nan=False).map(repr),
    st.sampled_from(["", " 7 ", "4k", "007", "1_000", "inf", "nan", "1e3", ".5", "5.", "-0"]),
)


def test_every_plain_option_of_pack_has_its_own_conversion() -> None:
    pack = {p for c, p in PARAMS if c == "pack"}
    assert {"max_len", "inputs", "seed", "template_timeout", "tokenizer", "add_eos"} <= pack
    assert len(pack) >= 35


@pytest.mark.parametrize(("command", "name"), PARAMS)
@settings(max_examples=60, deadline=None)
@given(value=_VALUES)
def test_the_conversion_is_typers(command, name, value) -> None:
    cmd = _COMMANDS[command]
    ctx = cmd.context_class(cmd, info_name=command or "packtool")
    param = next(p for p in [*cmd.params, cmd.get_help_option(ctx)] if p and p.name == name)
    if param.callback is not None:  # --help, --version: their callbacks print and exit
        values = [False, None]
    elif param.nargs == -1 or param.multiple:
        values = [(value,), (value, "b"), (), None]
    else:
        values = [value, param.default, None]
    for v in values:
        ours = _outcome(param.process_value, ctx, v)
        theirs = _outcome(lambda c, x, p=param: type(p).process_value(p, c, x), ctx, v)
        assert ours == theirs, (command, name, v)


def test_a_pack_command_line_imports_no_pydantic(tmp_path) -> None:
    """Parsing ``pack``'s command line (every option processed, given or left at its
    default) imports no pydantic: the conversion typer would build for each option is not
    built."""
    script = (
        "import sys\n"
        "import packtool.cli as cli, packtool.pipeline as pl\n"
        "class Stop(Exception): pass\n"
        "def fake(*a, **k): raise Stop\n"
        "pl.pack = fake\n"
        "try:\n"
        "    cli.app(sys.argv[1:], standalone_mode=False)\n"
        "except Stop:\n"
        "    print('pydantic' in sys.modules)\n"
    )
    args = ["pack", "x.jsonl", "-L", "4k", "--seed", "3", "--template-timeout", "2.5"]
    args += ["-o", str(tmp_path / "o"), "--no-shuffle", "--tokenizer", "t"]
    out = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False", out.stderr
