"""The house rules of docs/architecture.md, checked against the code's imports.

Every module of packtool sits on a layer and imports only modules of lower layers (the
package's ``__init__`` is lazy and exempt); no module imports another module's private names;
only the CLI (and its renderers) use typer or rich.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "packtool"

LAYERS: dict[str, int] = {
    # 0: no packtool imports
    "errors": 0,
    "_version": 0,
    "masks": 0,
    "tokenizer_file": 0,
    # 1: the file-system seam (local paths, fsspec URLs); the bounds of the options
    "fs": 1,
    "limits": 1,
    # 2: the stages' own building blocks; the layout of finished rows
    "_stop": 0,
    "layout": 2,
    "packing": 2,
    "chat": 2,
    "readers": 2,
    "tokenize": 2,
    # 3: the options record; the order of rows; the on-disk format and manifest
    "options": 3,
    "order": 3,
    "format": 3,
    "pretokenized": 3,
    # 4: the token store, the row gather, encoders of instruction data, row views
    "store": 4,
    "gather": 4,
    "instruct": 4,
    "inspect": 4,
    # 5: the prepare stage (inputs, shape, tokenizer, plan decided once)
    "prepare": 5,
    # 6: the stages composed; reports over outputs and corpora
    "pipeline": 6,
    "stats": 6,
    "verify": 6,
    "export": 6,
    # 7-9: work units, their merge, the engines that run them
    "units": 7,
    "merge": 8,
    "engines": 9,
    # 10: what renders or adapts for others
    "render": 10,
    "_params": 9,
    "_help": 10,
    "torch": 10,
    # 11: the command line (12: ``python -m packtool``)
    "cli": 11,
    "__main__": 12,
}
# Inside a package split into modules: the order its modules may import each other in (a
# module imports only lower ones), with no private names across them.
PACKAGE_LAYERS: dict[str, dict[str, int]] = {
    "verify": {"report": 0, "digest": 0, "rows": 1, "against": 2, "__init__": 3},
}
CLI_ONLY = ("typer", "rich")
CLI_MODULES = {"cli", "render", "_help", "_params"}


def _module_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    return rel.parts[0]  # engines/local.py belongs to "engines"


def _imports(path: Path) -> list[tuple[int, str, str | None, list[str]]]:
    """(line, absolute top-level package or packtool module, submodule, names) per import."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    depth = len(path.relative_to(PACKAGE).parts) - 1  # 0 for packtool/x.py
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            if node.level == 0:
                top = (node.module or "").split(".")[0]
                sub = (node.module or "").split(".")[1] if top == "packtool" else None
                out.append((node.lineno, top, sub, names))
                continue
            up = node.level - 1 - depth  # levels above packtool/
            assert up <= 0, f"{path}:{node.lineno}: relative import outside the package"
            parts = list(path.relative_to(PACKAGE).parts[: depth - (node.level - 1)])
            parts += node.module.split(".") if node.module else []
            if not parts:  # from . import x (in packtool/x.py): x are modules
                for name in names:
                    out.append((node.lineno, "packtool", name, []))
            else:
                out.append((node.lineno, "packtool", parts[0], names))
        elif isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                sub = a.name.split(".")[1] if top == "packtool" and "." in a.name else None
                out.append((node.lineno, top, sub, []))
    return out


def _sources() -> list[Path]:
    return sorted(
        p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE
    )


def test_every_module_has_a_layer() -> None:
    modules = {_module_of(p) for p in _sources()}
    assert modules == set(LAYERS), modules ^ set(LAYERS)


def test_modules_import_only_lower_layers() -> None:
    bad = []
    for path in _sources():
        mine = _module_of(path)
        for line, top, sub, _ in _imports(path):
            if top != "packtool" or sub is None or sub == mine:
                continue
            if LAYERS[sub] >= LAYERS[mine]:
                bad.append(f"{path.relative_to(REPO)}:{line}: {mine} (layer {LAYERS[mine]}) "
                           f"imports {sub} (layer {LAYERS[sub]})")  # fmt: skip
    assert not bad, "\n".join(bad)


def test_no_private_names_across_modules() -> None:
    bad = []
    for path in _sources():
        mine = _module_of(path)
        for line, top, sub, names in _imports(path):
            if top != "packtool" or sub == mine:
                continue
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private:
                bad.append(f"{path.relative_to(REPO)}:{line}: {private} from {sub}")
    assert not bad, "\n".join(bad)


def _package_imports(package: str, path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module of ``package``, names) of each import of a sibling module in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 1 and node.module:  # from .rows import x
            out.append((node.lineno, node.module.split(".")[0], [a.name for a in node.names]))
        elif node.level == 0 and (node.module or "").startswith(f"packtool.{package}."):
            out.append((node.lineno, node.module.split(".")[2], [a.name for a in node.names]))
    return out


def test_split_packages_layer_their_modules() -> None:
    bad = []
    for package, layers in PACKAGE_LAYERS.items():
        paths = sorted((PACKAGE / package).glob("*.py"))
        assert {p.stem for p in paths} == set(layers), (package, {p.stem for p in paths})
        for path in paths:
            mine = path.stem
            for line, sub, names in _package_imports(package, path):
                where = f"{path.relative_to(REPO)}:{line}"
                if layers[sub] >= layers[mine]:
                    bad.append(f"{where}: {package}.{mine} imports {package}.{sub}")
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                if private:
                    bad.append(f"{where}: {private} from {package}.{sub}")
    assert not bad, "\n".join(bad)


def test_verify_cuts_documents_with_the_pipelines_cut() -> None:
    """``verify --against`` expects the items ``pack`` stored: both cut documents with
    ``packing.cut_items`` (the overflow policy, the labelled cut), none with its own."""
    cut = {"cut_items"}
    own = {"segment_items", "segment_labelled_items"}
    for path in (PACKAGE / "pipeline.py", PACKAGE / "verify" / "against.py"):
        names = {n for _, top, sub, names in _imports(path) if sub == "packing" for n in names}
        assert cut <= names and not names & own, (path, names)
    for path in (PACKAGE / "verify").glob("*.py"):
        called = {
            node.func.id
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        }
        assert not called & own, (path, called & own)


def test_only_the_cli_uses_typer_and_rich() -> None:
    bad = []
    for path in _sources():
        if _module_of(path) in CLI_MODULES:
            continue
        for line, top, _, _ in _imports(path):
            if top in CLI_ONLY:
                bad.append(f"{path.relative_to(REPO)}:{line}: imports {top}")
    assert not bad, "\n".join(bad)


def test_the_layers_are_those_of_the_docs() -> None:
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = [m for m, layer in LAYERS.items() if f"| `{m}` | {layer} |" not in doc]
    assert not missing, f"docs/architecture.md's table of layers misses {missing}"


def _manifest_key_reads(path: Path) -> list[str]:
    """``manifest["key"]`` and ``manifest.get("key")`` (or ``x.manifest[...]``) in ``path``."""
    import ast

    def is_manifest(node: ast.AST) -> bool:
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
        return "manifest" in name.lower()

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Subscript) and is_manifest(node.value):
            key = node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and is_manifest(node.func.value)
            and node.args
        ):
            key = node.args[0]
        else:
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: manifest[{key.value!r}]")
    return found


def test_only_format_knows_the_manifest_keys() -> None:
    """Other modules read the manifest through :class:`packtool.format.Manifest`'s accessors."""
    bad = [hit for p in _sources() if _module_of(p) != "format" for hit in _manifest_key_reads(p)]
    assert not bad, "\n".join(bad)


def test_a_pack_option_lives_in_the_options_record() -> None:
    """An option is added in one place: every `pack` flag but the CLI's own is a field of
    PackOptions (from_mapping would drop any other silently), every field is a flag, and
    the library's entry points take the record whole instead of spelling options."""
    import dataclasses
    import inspect

    from packtool import cli, engines, pipeline, stats, units
    from packtool.options import PackOptions

    names = {f.name for f in dataclasses.fields(PackOptions)}
    flags = set(inspect.signature(cli.pack).parameters)
    assert flags - names == {"inputs", "output", "quiet", "as_json"}
    assert names - flags == set()
    for entry in (pipeline.pack, engines.pack_units, stats.corpus_stats):
        parameters = inspect.signature(entry).parameters
        assert "options" in parameters, entry
        # stats' --seed is its baselines' seed, another meaning than pack's row shuffle
        assert not (set(parameters) & names) - {"seed"}, (entry, set(parameters) & names)
    # A unit takes the record too; its process overrides overwrite and the threads it gets.
    unit_parameters = set(inspect.signature(units.run_unit).parameters)
    assert "options" in unit_parameters
    assert unit_parameters & names == {"unit", "overwrite", "num_proc"}


def _commands() -> list[ast.FunctionDef]:
    """The typer commands of cli.py (functions decorated with ``@app.command``)."""
    tree = ast.parse((PACKAGE / "cli.py").read_text(encoding="utf-8"))
    return [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any(
            isinstance(d, ast.Call) and getattr(d.func, "attr", "") == "command"
            for d in node.decorator_list
        )
    ]


def test_cli_command_bodies_are_short() -> None:
    """A command parses, builds the options, calls one library function and renders: its
    body (after the docstring) is at most 60 lines; the option declarations are apart."""
    commands = _commands()
    assert {c.name for c in commands} >= {"pack", "stats", "verify", "export", "merge"}
    long = []
    for command in commands:
        body = command.body
        has_doc = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
        first = body[1] if has_doc else body[0]
        lines = command.end_lineno - first.lineno + 1  # type: ignore[operator]
        if lines > 60:
            long.append(f"cli.{command.name}: {lines} lines")
    assert not long, long


def test_the_cli_renders_through_the_render_package() -> None:
    """cli.py builds no table and prints no report itself: rich is used by render/ only."""
    bad = [
        f"cli.py:{line}: imports {top}"
        for line, top, _, _ in _imports(PACKAGE / "cli.py")
        if top == "rich"
    ]
    assert not bad, bad


def _is_dispatch(node: ast.Compare) -> bool:
    """``x.kind == "..."`` (an input's kind, not a dtype's) or ``to == "..."``."""
    strings = [
        c
        for c in node.comparators
        for c in (c.elts if isinstance(c, (ast.Tuple, ast.List, ast.Set)) else [c])
        if isinstance(c, ast.Constant) and isinstance(c.value, str)
    ]
    left = node.left
    if not strings:
        return False
    if isinstance(left, ast.Attribute) and left.attr == "kind":
        return not (isinstance(left.value, ast.Attribute) and left.value.attr == "dtype")
    return isinstance(left, ast.Name) and left.id == "to"


def test_no_dispatch_on_an_input_kind_or_export_name_outside_their_tables() -> None:
    """Formats are chosen through the readers' table, exports through the exports' table:
    no ``inp.kind == "jsonl"`` or ``to == "megatron"`` anywhere."""
    bad = [
        f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}"
        for path in _sources()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Compare) and _is_dispatch(node)
    ]
    assert not bad, "\n".join(bad)
