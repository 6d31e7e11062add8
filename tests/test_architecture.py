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
    "counts": 1,
    # 2: the stages' own building blocks; the layout of finished rows
    "_stop": 0,
    "_fields": 0,
    "layout": 2,
    "packing": 2,
    "mixture": 2,
    "chat": 2,
    "readers": 2,
    "tokenize": 2,  # and its modules: PACKAGE_LAYERS
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
    "repack": 4,
    # 5: the prepare stage (inputs, shape, tokenizer, plan decided once)
    "prepare": 5,
    "corpus": 5,
    "reference": 5,
    # 6: the stages composed; reports over outputs and corpora
    "pipeline": 6,
    "stats": 6,
    "verification": 6,
    "export": 6,
    # 7: the stats page (figures drawn as SVG in one HTML page)
    "stats_html": 7,
    # 7-9: work units, their merge, the engines that run them
    "units": 7,
    "merge": 8,
    "engines": 9,
    # 10: what renders or adapts for others
    "render": 10,
    "_params": 9,
    "_help": 10,
    "torch": 9,
    "check_model": 10,
    # 11: the command line (12: ``python -m packtool``)
    "cli": 11,
    "__main__": 12,
}
# Inside a package split into modules: the order its modules may import each other in (a
# module imports only lower ones), with no private names across them.
PACKAGE_LAYERS: dict[str, dict[str, int]] = {
    "verification": {
        "report": 0,
        "digest": 0,
        "rows": 1,
        "record": 1,
        "against": 2,
        "__init__": 3,
    },
    "tokenize": {
        "backend": 0,
        "facts": 0,
        "hf": 1,
        "fastokens": 1,
        "gigatoken": 1,
        "registry": 2,
        "gate": 3,
        "__init__": 4,
    },
}
# The modules of packtool/format/, each on a layer of its own within the package.
FORMAT_LAYERS: dict[str, int] = {
    # the column table; what a run counted; typed views of the manifest's sub-records
    "schema": 0,
    "counts": 0,
    "records": 0,
    # the manifest
    "manifest": 1,
    # the repack record of a labelled split pack (its rows' lost labels and chunks)
    "chunks": 1,
    # the output directory; the store shard cache
    "output": 2,
    "cache": 2,
    # the datasets metadata (and the files' check), the reader
    "metadata": 3,
    "reader": 3,
    # the writer
    "writer": 4,
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
    for path in (PACKAGE / "pipeline.py", PACKAGE / "verification" / "against.py"):
        names = {n for _, top, sub, names in _imports(path) if sub == "packing" for n in names}
        assert cut <= names and not names & own, (path, names)
    for path in (PACKAGE / "verification").glob("*.py"):
        called = {
            node.func.id
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        }
        assert not called & own, (path, called & own)


def test_format_modules_import_only_lower_layers() -> None:
    """Within packtool/format/, a module imports only those of lower layers (FORMAT_LAYERS),
    and docs/architecture.md lists each."""
    folder = PACKAGE / "format"
    modules = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    assert modules == set(FORMAT_LAYERS), modules ^ set(FORMAT_LAYERS)
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    bad = [f"docs/architecture.md does not list format/{m}.py" for m in sorted(modules)
           if f"`format/{m}.py`" not in doc]  # fmt: skip
    for name in sorted(modules):
        path = folder / f"{name}.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                other = node.module.split(".")[0]
                if FORMAT_LAYERS[other] >= FORMAT_LAYERS[name]:
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {name} "
                               f"(layer {FORMAT_LAYERS[name]}) imports {other} "
                               f"(layer {FORMAT_LAYERS[other]})")  # fmt: skip
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
_PASS_ON = {"zip", "enumerate", "dict", "list", "tuple", "sorted", "reversed", "iter", "next"}
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _manifesty(name: str) -> bool:
    return "manifest" in name.lower()


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
        if not isinstance(node, _FUNCTIONS):
            stack.extend(ast.iter_child_nodes(node))
    return out


class _ManifestReads:
    """Where a module reads a manifest key by a string literal.

    A value is a manifest's (``reaches``) if it is a chain of attributes, subscripts and
    method calls that starts at (or passes) a name or attribute containing ``manifest``
    (``manifest``, ``reader.manifest.options``, ``manifests[0]``, ``m.summary()``), or at a
    local name bound to such a value (assigned or looped over, or a parameter annotated
    ``Manifest``); or a builtin that passes values on (``zip(pieces, m.inputs)``), or a
    function of the module that returns such a value (``unit_record(m)``), called on one.
    A read is ``x[key]``, ``x.get(key)`` (``pop``, ``setdefault``) or ``key in x``.
    """

    def __init__(self, source: str, where: str) -> None:
        self.tree = ast.parse(source)
        self.where = where
        self.giving: set[str] = set()  # the module's functions that return a manifest's value
        self.found: list[str] = []

    def reaches(self, node: ast.AST, bound: set[str]) -> bool:
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
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                passes = node.func.id in _PASS_ON or node.func.id in self.giving
                return passes and any(self.reaches(a, bound) for a in node.args)
            elif isinstance(node, ast.BoolOp):  # manifest.units or {}
                return any(self.reaches(v, bound) for v in node.values)
            else:
                return False

    def bound(self, scope: ast.AST, nodes: list[ast.AST], inherited: set[str]) -> set[str]:
        """The names of ``scope`` that hold a manifest's values."""
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
                    if new and self.reaches(value, bound):
                        bound |= new
                        changed = True
        return bound

    def key(self, node: ast.AST, bound: set[str]) -> ast.AST | None:
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            return node.slice if self.reaches(node.value, bound) else None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _READS
            and node.args
        ):
            return node.args[0] if self.reaches(node.func.value, bound) else None
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            return node.left if self.reaches(node.comparators[0], bound) else None
        return None

    def find_giving(self) -> None:
        """The module's functions that return a manifest's value (until no more are found)."""
        functions = [n for n in ast.walk(self.tree) if isinstance(n, ast.FunctionDef)]
        changed = True
        while changed:
            changed = False
            for f in functions:
                if f.name in self.giving:
                    continue
                nodes = _scope_nodes(f)
                bound = self.bound(f, nodes, set())
                returns = [n.value for n in nodes if isinstance(n, ast.Return) and n.value]
                if any(self.reaches(r, bound) for r in returns):
                    self.giving.add(f.name)
                    changed = True

    def scan(self, scope: ast.AST, inherited: set[str]) -> None:
        nodes = _scope_nodes(scope)
        bound = self.bound(scope, nodes, inherited)
        for node in nodes:
            key = self.key(node, bound)
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                line = getattr(node, "lineno", 0)
                self.found.append(f"{self.where}:{line}: {ast.unparse(node)[:70]}")
            if isinstance(node, _FUNCTIONS):
                self.scan(node, bound)


def _manifest_key_reads(source: str, where: str) -> list[str]:
    """Where ``source`` (the module ``where``) reads a manifest key by a string literal
    (:class:`_ManifestReads`)."""
    reads = _ManifestReads(source, where)
    reads.find_giving()
    reads.scan(reads.tree, set())
    return sorted(reads.found)


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
        'for piece, read in zip(pieces, manifest.inputs):\n        read["documents"]',
        'def unit(m: Manifest):\n        return m.unit or {}\n    unit(manifest)["pieces"]',
    )
    alike = (
        'm = re.match("x", s)\n    m["protocol"]',  # a regex match, not a manifest
        'record = {"a": 1}\n    record.get("a")',
        "manifest.shards[0].rows",
        "manifest.options.get(name)",  # not a literal: the check is about spelled keys
        'for m in messages:\n        m["role"]',
        'opts = resolve(manifests)\n    opts["copy"]',  # the merge's own options, not a read
        'def make(m):\n        return {"a": m}\n    make(manifest)["a"]',
    )
    for snippet in (*reads, *alike):
        source = f"def f(manifest, manifests, reader, s, name):\n    {snippet}\n"
        hits = _manifest_key_reads(source, "probe")
        assert bool(hits) == (snippet in reads), (snippet, hits)


def test_the_columns_are_listed_once() -> None:
    """The packed columns are listed in one table (``format/schema.py``'s ``COLUMNS``): no
    other module spells a list of them (it takes ``column_names(...)`` instead)."""
    from packtool.format import COLUMNS

    names = {c.name for c in COLUMNS}
    bad = []
    for path in _sources():
        if path == PACKAGE / "format" / "schema.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
                spelled = [
                    e.value
                    for e in node.elts
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)
                ]
                if len(set(spelled) & names) >= 2:
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {spelled}")
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


MAX_PARAMETERS = 10
MAX_FUNCTION_LINES = 100


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The parameters of a function: ``self``/``cls`` not counted, ``*args`` and ``**kwargs``
    one each."""
    a = node.args
    named = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return (
        sum(n not in ("self", "cls") for n in named)
        + (a.vararg is not None)
        + (a.kwarg is not None)
    )


def _function_sizes() -> list[str]:
    """Every function of packtool/ (methods and nested ones too) with more than
    ``MAX_PARAMETERS`` parameters or more than ``MAX_FUNCTION_LINES`` lines (``def`` to its
    last line)."""
    bad = []
    for path in [*_sources(), PACKAGE / "__init__.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            params = _parameters(node)
            lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            if params > MAX_PARAMETERS or lines > MAX_FUNCTION_LINES:
                where = f"{path.relative_to(REPO)}:{node.lineno}"
                bad.append(f"{where}: {node.name}: {params} parameters, {lines} lines")
    return bad


def test_no_function_has_too_many_parameters_or_lines() -> None:
    """No function of packtool/ takes more than 10 parameters or runs over 100 lines: a
    longer one is split by what it does, a wider one takes a record."""
    bad = _function_sizes()
    assert not bad, "\n".join(bad)


def test_the_function_size_check_sees_methods_nested_functions_and_star_parameters() -> None:
    source = (
        "class A:\n"
        "    def m(self, a, b, c, d, e, f, g, h, i, *args, **kwargs):\n"
        "        def inner():\n" + "            x = 1\n" * 100 + "        return inner\n"
    )
    tree = ast.parse(source)
    found = {
        n.name: (_parameters(n), n.end_lineno - n.lineno + 1)
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef)
    }
    assert found == {"m": (11, 103), "inner": (0, 101)}
