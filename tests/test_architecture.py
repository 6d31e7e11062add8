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
    # 1: the file-system seam (local paths, fsspec URLs)
    "fs": 1,
    # 2: the stages' own building blocks
    "limits": 2,
    "_stop": 0,
    "order": 2,
    "packing": 2,
    "chat": 2,
    "readers": 2,
    "tokenize": 2,
    # 3: the options record; the on-disk format and manifest
    "options": 3,
    "format": 3,
    "pretokenized": 3,
    # 4: the token store, the row gather, encoders of instruction data, row views
    "store": 4,
    "gather": 4,
    "instruct": 4,
    "inspect": 4,
    # 5: the stages composed; reports over outputs and corpora
    "pipeline": 5,
    "stats": 5,
    "verify": 5,
    "export": 5,
    # 6-8: work units, their merge, the engines that run them
    "units": 6,
    "merge": 7,
    "engines": 8,
    # 9: what renders or adapts for others
    "_stats_render": 9,
    "_render_inspect": 9,
    "_help": 9,
    "torch": 9,
    # 10: the command line (11: ``python -m packtool``)
    "cli": 10,
    "__main__": 11,
}
CLI_ONLY = ("typer", "rich")
CLI_MODULES = {"cli", "_stats_render", "_render_inspect", "_help"}


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


_READS = {"get", "pop", "setdefault"}  # dict methods that read a key


def _manifesty(name: str) -> bool:
    return "manifest" in name.lower()


def _reaches_manifest(node: ast.AST, bound: set[str]) -> bool:
    """Whether ``node`` is a manifest, or a value read from one: a chain of attributes,
    subscripts and method calls that starts at (or passes) a name or attribute containing
    ``manifest`` (``manifest``, ``reader.manifest.options``, ``manifests[0]``,
    ``m.summary()``), or at a local name bound to such a value (``bound``)."""
    while True:
        if isinstance(node, ast.Name):
            return _manifesty(node.id) or node.id in bound
        if isinstance(node, ast.Attribute):
            if _manifesty(node.attr):
                return True
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            node = node.func.value
        elif isinstance(node, ast.BoolOp):  # manifest.units or {}
            return any(_reaches_manifest(v, bound) for v in node.values)
        else:
            return False


def _target_names(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _target_names(e)]
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    return []


def _scope_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of ``scope``, not those of the functions defined in it."""
    out, stack = [], list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        out.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))
    return out


def _bound_to_manifests(scope: ast.AST, nodes: list[ast.AST], inherited: set[str]) -> set[str]:
    """The names of ``scope`` that hold a manifest or a value read from one: parameters
    annotated with ``Manifest``, and names assigned (or looped over) from such values."""
    bound = set(inherited)
    args = getattr(scope, "args", None)
    if isinstance(args, ast.arguments):
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        for a in every:
            if a is not None and a.annotation and "Manifest" in ast.unparse(a.annotation):
                bound.add(a.arg)
    changed = True
    while changed:  # x = manifest.options; y = x  ...
        changed = False
        for node in nodes:
            pairs: list[tuple[ast.AST, ast.AST]] = []
            if isinstance(node, ast.Assign):
                pairs = [(t, node.value) for t in node.targets]
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                pairs = [(node.target, node.value)]
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                pairs = [(node.target, node.iter)]
            for target, value in pairs:
                new = set(_target_names(target)) - bound
                if new and _reaches_manifest(value, bound):
                    bound |= new
                    changed = True
    return bound


def _key_read(node: ast.AST, bound: set[str]) -> ast.AST | None:
    """The key ``node`` reads from a manifest (or a record read from one), if it does:
    ``x[key]``, ``x.get(key)`` (``pop``, ``setdefault``), ``key in x``."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        return node.slice if _reaches_manifest(node.value, bound) else None
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _READS
        and node.args
    ):
        return node.args[0] if _reaches_manifest(node.func.value, bound) else None
    if isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
        return node.left if _reaches_manifest(node.comparators[0], bound) else None
    return None


def _manifest_key_reads(source: str, where: str) -> list[str]:
    """Where ``source`` (the module ``where``) reads a manifest key by a string literal:
    ``manifest["key"]``, ``manifests[0]["max_len"]``, ``m.options.get("seed")`` (``m``
    looped over manifests), ``"labels" in manifest.columns``, ``manifest.summary()["rows"]``,
    and the same through a local name (``units = manifest.units; units["count"]``)."""
    found: list[str] = []

    def scan(scope: ast.AST, inherited: set[str]) -> None:
        nodes = _scope_nodes(scope)
        bound = _bound_to_manifests(scope, nodes, inherited)
        for node in nodes:
            key = _key_read(node, bound)
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                line = getattr(node, "lineno", 0)
                found.append(f"{where}:{line}: {ast.unparse(node)[:70]}")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                scan(node, bound)

    scan(ast.parse(source), set())
    return sorted(found)


def test_only_format_knows_the_manifest_keys() -> None:
    """Other modules read the manifest through :class:`packtool.format.Manifest`'s typed
    accessors (and its records' attributes), never by a key."""
    bad = [
        hit
        for p in _sources()
        if _module_of(p) != "format"
        for hit in _manifest_key_reads(p.read_text(encoding="utf-8"), str(p.relative_to(REPO)))
    ]
    assert not bad, "\n".join(bad)


def test_the_manifest_key_check_finds_key_reads() -> None:
    """The check above on code that reads keys, and on code that only looks alike."""
    reads = (
        'manifest["rows"]',
        'reader.manifest.options.get("seed")',
        'manifests[0]["max_len"]',
        '"labels" in manifests[0].columns',
        'manifest.summary()["rows"]',
        'units = manifest.units or {}\n    units["count"]',
        'for m in manifests:\n        m.options["shuffle"]',
        'def inner(m: Manifest):\n        return m.tokenizer.get("name")',
    )
    alike = (
        'm = re.match("x", s)\n    m["protocol"]',  # a regex match, not a manifest
        'record = {"a": 1}\n    record.get("a")',
        "manifest.shards[0].rows",
        "manifest.options.get(name)",  # not a literal: the check is about spelled keys
        'for m in messages:\n        m["role"]',
    )
    for snippet in (*reads, *alike):
        source = f"def f(manifest, manifests, reader, s, name):\n    {snippet}\n"
        hits = _manifest_key_reads(source, "probe")
        assert bool(hits) == (snippet in reads), (snippet, hits)


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
