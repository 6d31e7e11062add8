"""Imports are cheap: `import packtool` and `packtool --help` load no heavy subsystem."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

import packtool

HEAVY = ("numpy", "pyarrow", "tokenizers", "datasets", "jinja2", "numba", "torch", "ray")

_CHECK = "import sys; heavy = {heavy!r}; bad = [m for m in heavy if m in sys.modules]; print(bad)"


def _loaded_heavy(code: str) -> list[str]:
    program = code + "\n" + _CHECK.format(heavy=HEAVY)
    result = subprocess.run(
        [sys.executable, "-c", program], check=True, cwd=REPO, capture_output=True, text=True
    )
    return eval(result.stdout.strip().splitlines()[-1])  # a list literal printed above


def test_import_packtool_loads_no_heavy_subsystem() -> None:
    assert _loaded_heavy("import packtool; packtool.__version__") == []


def test_help_loads_no_heavy_subsystem() -> None:
    code = (
        "import contextlib, io, sys\n"
        "sys.argv = ['packtool', '--help']\n"
        "from packtool.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main()\n"
    )
    assert _loaded_heavy(code) == []
    for command in ("pack", "stats", "verify", "inspect", "merge", "export"):
        assert _loaded_heavy(code.replace("'--help'", f"{command!r}, '--help'")) == [], command


def test_help_loads_no_renderer() -> None:
    """The render modules (and rich's tables) load inside the command that shows a report,
    never for ``--help``; the table of exports that ``--to``'s help lists loads no export."""
    code = (
        "import contextlib, io, sys\n"
        "sys.argv = ['packtool', 'export', '--help']\n"
        "from packtool.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main()\n"
        "loaded = [m for m in sys.modules if m.startswith(('packtool.render', 'rich.table',\n"
        "          'packtool.export.megatron', 'packtool.export.bridge', 'packtool.format'))]\n"
        "print(sorted(loaded))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True, text=True
    )
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_every_public_name_resolves() -> None:
    for name in packtool.__all__:
        assert getattr(packtool, name) is not None, name
    assert sorted(dir(packtool)) == sorted(packtool.__all__)


def test_verify_is_the_function_and_its_package_has_another_name() -> None:
    """``packtool.verify`` is the function; its package is ``packtool.verification``, so
    importing the package's modules never rebinds the name."""
    import packtool.verification.rows

    assert callable(packtool.verify) and packtool.verify.__name__ == "verify"
    assert sys.modules["packtool.verification"].verify is packtool.verify
    assert packtool.verification is sys.modules["packtool.verification"]


def test_the_cli_flags_are_the_declared_options() -> None:
    """`pack`'s flags are the options declared in options.py, with their defaults (the
    template timeout's is chat.py's), under the field names PackOptions takes."""
    import inspect as pyinspect

    from packtool.chat import DEFAULT_TEMPLATE_TIMEOUT
    from packtool.cli import pack
    from packtool.options import OPTIONS

    parameters = pyinspect.signature(pack).parameters
    assert parameters["template_timeout"].default == DEFAULT_TEMPLATE_TIMEOUT
    for name, option in OPTIONS.items():
        default = pyinspect.Parameter.empty if option.required else option.default
        assert parameters[name].default == default, name


def test_the_format_loads_only_arrow_and_numpy() -> None:
    """`packtool.format` (every module of the package, re-exported) needs pyarrow and NumPy
    for its rows, and no tokenizer, template engine, kernel compiler, torch or ray: readers of
    a pack (the training side, exports) import it alone."""
    assert set(_loaded_heavy("import packtool.format")) <= {"numpy", "pyarrow"}
