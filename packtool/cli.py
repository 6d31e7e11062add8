"""The ``packtool`` command line: a thin layer over the library.

Each command parses its options, calls the library, and renders the result with rich. The
library's own exceptions become one-line errors and a non-zero exit code, never a traceback.

The options of a pack are declared once, in :mod:`packtool.options` (flags, help, default,
what each changes): :func:`with_flags` makes them flags of ``pack`` (every option, in a help
panel per what it changes), of ``stats`` (those of corpus mode) and of ``merge`` (the layout
options), which receive them in their ``**`` parameter by the options' field names. A
command's own flags are declared in its signature.
"""

from __future__ import annotations

import functools
import inspect
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from inspect import Parameter
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from ._help import PanelCommand, PanelGroup
from ._stop import STOP, Terminated, install_stop_handlers, stop_signal
from ._version import __version__
from .errors import PacktoolError
from .export.registry import choices_help as export_choices
from .fs import as_path, is_url
from .limits import read_token_count
from .options import CORPUS_OPTIONS, LAYOUT, OPTIONS, ROWS, RUN, Option, PackOptions

app = typer.Typer(
    name="packtool",
    cls=PanelGroup,
    help="Offline sequence packing for LLM training data.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help (see _help.py); reports and errors still use rich
)


F = TypeVar("F", bound=Callable[..., Any])


def _token_count(text: str) -> int:
    """``--max-len 4096`` or ``4k``, read as ``stats --max-len`` reads its values."""
    try:
        return read_token_count("--max-len", text)
    except PacktoolError as e:
        raise typer.BadParameter(str(e).removeprefix("--max-len: ")) from None


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print a one-line error to stderr; return the Exit to raise."""
    from .render.console import error

    error(message)
    return typer.Exit(code)


def handle_errors(func: F) -> F:
    """Turn the library's exceptions, OS errors and Ctrl-C into one-line errors."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            previous = install_stop_handlers()
        started = time.time()
        try:
            return func(*args, **kwargs)
        except PacktoolError as e:
            raise fail(str(e), e.exit_code) from None
        except OSError as e:
            where = f"{e.filename}: " if getattr(e, "filename", None) else ""
            raise fail(f"{where}{e.strerror or e}") from None
        except EOFError as e:  # e.g. from a decompressor; named by the readers where they can
            raise fail(f"an input ends early: {e}") from None
        except KeyboardInterrupt as e:
            raise _interrupted(func, kwargs, started, isinstance(e, Terminated)) from None
        except Exception:
            # A signal's exception raised inside a lock's bookkeeping (a queue's get) can come
            # out as another error ("release unlocked lock"): the stop flag says what it was.
            if not STOP.is_set():
                raise
            raise _interrupted(func, kwargs, started, stop_signal() == signal.SIGTERM) from None
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            STOP.clear()

    return wrapper  # type: ignore[return-value]


_READ_ONLY_COMMANDS = {"stats", "verify", "inspect_command"}  # they write no output


def _interrupted(
    func: Callable[..., Any], kwargs: dict[str, Any], started: float, terminated: bool
) -> typer.Exit:
    """The one line, and the exit (143 for SIGTERM, 130 for Ctrl-C), of an interrupted run."""
    code = 143 if terminated else 130
    if func.__name__ in _READ_ONLY_COMMANDS:
        return fail("interrupted", code)
    written = _written_by_this_run(kwargs, started)
    if written is not None:  # the signal came after the manifest: nothing was lost
        return fail(
            f"interrupted after {written} was complete: the output is kept "
            f"(packtool verify {written} checks it)",
            code,
        )
    output = kwargs.get("output")
    if output is not None and is_url(output) and kwargs.get("units") is None:
        # a store has no rename: shards may be there, but no manifest (readers refuse)
        return fail(
            f"interrupted; {output} is not complete (no manifest; shards already uploaded "
            "are replaced by the next run)",
            code,
        )
    hint = ""
    if kwargs.get("resume") and _checkpointed(kwargs):
        hint = " (rerun with --resume to continue from its checkpoint)"
    if kwargs.get("units") is not None:
        hint = " (finished units are kept: run the same command again to go on)"
    return fail(f"interrupted; no output was written{hint}", code)


def _checkpointed(kwargs: dict[str, Any]) -> bool:
    """Whether the interrupted pack left a checkpoint (a run stopped before its first one
    has nothing to resume from)."""
    from .store import has_checkpoint

    output = kwargs.get("output")
    return isinstance(output, Path) and has_checkpoint(output)


def _written_by_this_run(kwargs: dict[str, Any], started: float) -> Path | None:
    """The output directory of the command, if this run wrote its manifest (the last file of
    an output, so the output is complete)."""
    for key in ("output", "out_dir", "dest"):
        path = kwargs.get(key)
        if isinstance(path, Path):  # a store's output is published manifest last, in one go
            manifest = path / "manifest.json"
            try:
                if manifest.stat().st_mtime >= started - 1:
                    return path
            except OSError:
                continue
    return None


def _version(value: bool) -> None:
    if value:
        from .render.console import say

        say(f"packtool {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """Offline sequence packing for LLM training data."""


# -- the options of a pack, as flags: declared once, in options.py -----------------------

_PANELS = {
    ROWS: "Rows: what the rows hold (a change packs again; --resume and units start over)",
    LAYOUT: "Layout: the order of the rows and the shards that hold them",
    RUN: "Run: how the run goes",
}
_CORPUS_PANEL = "Corpus mode: with --max-len, INPUTS read and tokenized as pack would"
_CLI_TYPES: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}


def _flag(name: str, value_type: Any, default: Any, *decls: str, **info: Any) -> Parameter:
    """A command-line option as a parameter of the command's signature (what typer reads):
    ``value_type | None`` when its default is ``None``; no default: the option is required."""
    annotation = value_type | None if default is None else value_type
    option = typer.Option(*decls, **info)
    return Parameter(name, Parameter.KEYWORD_ONLY, default=default,
                     annotation=Annotated[annotation, option])  # fmt: skip


def _declared(option: Option, name: str, default: Any, help: str, **info: Any) -> Parameter:
    """The flag of an option declared in :mod:`packtool.options`, as ``name``."""
    kind = option.cli or option.annotation.split("|")[0].strip()
    info.setdefault("show_default", option.show_default)
    if kind == "path":
        value_type, info["parser"] = Path, as_path
    elif kind == "token_count":  # --max-len 4096, or 4k
        value_type, info["parser"], info["metavar"] = int, _token_count, "INTEGER"
    else:
        value_type = _CLI_TYPES[kind]
    return _flag(name, value_type, default, *option.flags, help=help, **info)


def _pack_flags() -> list[Parameter]:
    """Every option of a pack, in its panel (what it changes)."""
    out = []
    for o in OPTIONS.values():
        default = Parameter.empty if o.required else o.default
        out.append(_declared(o, o.name, default, o.help, rich_help_panel=_PANELS[o.changes]))
    return out


def _corpus_flags() -> list[Parameter]:
    """The options of a pack that `stats` of a corpus takes (its corpus-mode panel)."""
    out = []
    for o in OPTIONS.values():
        if o.corpus:
            text = o.corpus if isinstance(o.corpus, str) else o.help
            out.append(_declared(o, o.name, o.default, text, rich_help_panel=_CORPUS_PANEL))
    return out


def _merge_flags() -> list[Parameter]:
    """The layout options `merge` takes, by its names for them; unset: as given to pack."""
    return [
        _declared(o, o.merge_key or o.name, None, o.merge.help, show_default=False)
        for o in OPTIONS.values()
        if o.merge is not None
    ]


def with_flags(*flags: Parameter) -> Callable[[F], F]:
    """Give a command these flags, which it receives in its ``**`` parameter: the command's
    signature (what typer reads) is its own parameters, then ``flags``, then its own
    keyword-only ones."""

    def decorate(func: F) -> F:
        own = inspect.signature(func, eval_str=True).parameters.values()
        first = [p.replace(kind=Parameter.KEYWORD_ONLY) for p in own
                 if p.kind is Parameter.POSITIONAL_OR_KEYWORD]  # fmt: skip
        last = [p for p in own if p.kind is Parameter.KEYWORD_ONLY]
        func.__signature__ = inspect.Signature([*first, *flags, *last])  # type: ignore[attr-defined]
        return func

    return decorate


_OUT = typer.Argument(
    metavar="OUT_DIR",
    parser=as_path,
    help="The output directory of `packtool pack`.",
    show_default=False,
)


@app.command(cls=PanelCommand)
@handle_errors
@with_flags(*_pack_flags())
def pack(
    inputs: Annotated[
        list[Path],
        typer.Argument(
            metavar="INPUTS",
            parser=as_path,
            help="Input files (.jsonl/.json[.gz|.zst], .parquet, .arrow, .csv, .txt), "
            "directories or globs of them, a dataset saved with datasets.save_to_disk, or a "
            "packtool output (its documents packed again, no tokenizer).",
            show_default=False,
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            parser=as_path,
            help="Output directory (default: INPUT-packed-MAXLEN in the current directory).",
            show_default=False,
        ),
    ] = None,
    *,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress bars and no summary.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the summary as JSON (the manifest's figures).")
    ] = False,
    **values: Any,
) -> None:
    """Tokenize INPUTS and pack them into rows of --max-len tokens, written as Arrow shards.

    Each row holds input_ids, position_ids (restarting at 0 at every document) and cu_seqlens
    (document boundaries), ready for FlashAttention varlen or a block-diagonal mask.
    """
    from .pipeline import pack as run_pack
    from .render.pack import show_pack
    from .render.progress import RichProgress

    options = PackOptions(**values)  # every flag of options.py, by its field's name
    if output is None:
        stem = re.sub(r"[^\w-]", "", inputs[0].name.split(".")[0]) or "corpus"
        output = Path(f"{stem}-packed-{options.max_len}")  # here, also for inputs on a store
    if options.units is not None:
        return _pack_units(inputs, output, options, quiet=quiet, as_json=as_json)
    with RichProgress(enabled=not quiet and not as_json) as progress:
        report = run_pack([str(p) for p in inputs], output, options, progress=progress)
    show_pack(report, quiet=quiet, as_json=as_json)


# -- stats --------------------------------------------------------------------------------


def _refuse_corpus_flags(path: Any, given: list[str]) -> None:
    """Corpus-mode flags given with a packed output: the usage error naming them."""
    if given:
        raise fail(
            f"{path} is a packed output: {', '.join(given)} appl"
            f"{'ies' if len(given) == 1 else 'y'} to a corpus before packing; drop "
            f"{'it' if len(given) == 1 else 'them'}",
            2,
        )


def _not_a_packed_output(first: Path) -> typer.Exit:
    """Why `stats PATH` without --max-len cannot go on (printed; the exit to raise)."""
    if first.name == "manifest.json" and first.is_file():
        return fail(f"{first} is the manifest: pass its directory, {first.parent}", 2)
    if (first / "units").is_dir():
        return fail(
            f"{first} holds work units but no merged output yet: join them with "
            f"`packtool merge {first}`, then run stats on it",
            2,
        )
    members = first.iterdir() if first.is_dir() else ()
    if any(re.fullmatch(r"data-\d+-of-\d+\.arrow", p.name) for p in members):
        return fail(
            f"{first} is not a packtool output: it has no manifest.json (an interrupted "
            "`packtool pack` never writes one); for the stats of a corpus, pass --max-len",
            2,
        )
    if not first.exists() and not any(c in str(first) for c in "*?["):
        return fail(f"{first}: no such file or directory")
    return fail(
        f"{first} is not a packed output (no manifest.json); to see how this corpus would "
        "pack, pass --max-len, e.g. --max-len 2048,4096,8192",
        2,
    )


_STATS_CACHE = (
    _flag("cache_dir", Path, None, rich_help_panel=_CORPUS_PANEL, show_default=False,
          help="Where tokenized lengths are cached (default: $PACKTOOL_CACHE_DIR, else "
          "$XDG_CACHE_HOME/packtool, else ~/.cache/packtool)."),
    _flag("cache", bool, True, "--cache/--no-cache", rich_help_panel=_CORPUS_PANEL,
          help="Reuse and keep tokenized lengths."),
)  # fmt: skip


_PATHS = typer.Argument(
    metavar="PATHS",
    parser=as_path,
    help="A packed output directory (OUT_DIR), or, with --max-len, a corpus: input files, "
    "directories or globs as for `pack`.",
    show_default=False,
)
_MAX_LENS = typer.Option(
    "--max-len",
    "-L",
    rich_help_panel=_CORPUS_PANEL,
    help="The max-len values to compare, comma-separated (e.g. 2048,4096,8192).",
    show_default=False,
)
_BATCH_SIZE = typer.Option(
    "--batch-size", "-b", help="Batch size of the padded baselines it compares with."
)
_BASELINE_SEED = typer.Option(
    help="Seed of the random-batches and random-order baselines; with --mix, also of the "
    "mixture's sample (as pack --seed)."
)
_RANKS = typer.Option(
    help="Packed output: the step imbalance across W data-parallel ranks, stored order against "
    "a random one [default: the world size the output records].",
    show_default=False,
)
_RANK_ROWS = typer.Option(
    help="Packed output: rows a rank reads per step, for --world-size [default: the recorded "
    "one, else 1].",
    show_default=False,
)
_FIGURES_JSON = typer.Option("--json", help="Print the figures as one JSON object.")
_PAGE = typer.Option(
    "--html",
    help="Also write the figures and charts as one self-contained HTML page (no script, "
    "nothing loaded: it opens offline).",
    show_default=False,
)
_CHARTS = typer.Option(
    "--svg",
    help="Also write each chart as DIR/NAME.svg (the directory is made).",
    show_default=False,
)


@app.command(cls=PanelCommand)
@handle_errors
@with_flags(*_corpus_flags(), *_STATS_CACHE)
def stats(
    paths: Annotated[list[Path], _PATHS],
    max_len: Annotated[str | None, _MAX_LENS] = None,
    batch_size: Annotated[int, _BATCH_SIZE] = 8,
    seed: Annotated[int, _BASELINE_SEED] = 0,
    world_size: Annotated[int | None, _RANKS] = None,
    micro_batches: Annotated[int | None, _RANK_ROWS] = None,
    as_json: Annotated[bool, _FIGURES_JSON] = False,
    html: Annotated[Path | None, _PAGE] = None,
    svg: Annotated[Path | None, _CHARTS] = None,
    **corpus: Any,
) -> None:
    """Report packing statistics: rows, efficiency, padding saved against padded batches.

    On a packed output (a directory with manifest.json): what is in it. On a corpus, with
    --max-len 2048,4096,...: how it would pack at each max-len, without writing rows
    (tokenized lengths are cached, so a second call is fast); a packed output with --max-len
    is the corpus of its documents.
    """
    from .render.progress import RichProgress
    from .render.stats import show_stats
    from .stats import corpus_stats, dataset_stats, is_packed_output, parse_max_lens

    balance = {"world_size": world_size, "micro_batches": micro_batches}
    cache_dir, cache = corpus.pop("cache_dir"), corpus.pop("cache")
    options = PackOptions(**corpus)  # the corpus-mode flags of options.py
    packed_outputs = [p for p in paths if is_packed_output(p)]
    if packed_outputs and max_len is None and len(paths) > 1:
        raise fail(
            f"{packed_outputs[0]} is a packed output: give one packed output at a time "
            "(or only corpus inputs, with --max-len)",
            2,
        )
    if packed_outputs and max_len is None:  # with --max-len: its documents, as a corpus
        given = options.changed(*CORPUS_OPTIONS)
        given += [n for n, on in (("--cache-dir", cache_dir), ("--no-cache", not cache)) if on]
        _refuse_corpus_flags(paths[0], given)
        result: Any = dataset_stats(paths[0], batch_size=batch_size, seed=seed, **balance)
    else:
        if max_len is None:
            raise _not_a_packed_output(paths[0])
        given = [f"--{k.replace('_', '-')}" for k, v in balance.items() if v is not None]
        if given:
            raise fail(
                f"{', '.join(given)}: the step balance is measured on a packed output "
                "(pack with --world-size, then `packtool stats OUT`)",
                2,
            )
        with RichProgress(enabled=not as_json) as progress:
            result = corpus_stats(
                [str(p) for p in paths],
                parse_max_lens(max_len),
                options,
                batch_size=batch_size,
                seed=seed,
                cache_dir=cache_dir,
                use_cache=cache,
                progress=progress,
            )
    show_stats(result, as_json=as_json)
    if html is not None or svg is not None:
        from .render.stats import say_written
        from .stats_html import write_html, write_svgs

        written = [write_html(result, html)] if html is not None else []
        written += write_svgs(result, svg) if svg is not None else []
        say_written(written, quiet=as_json)


# -- inspect ------------------------------------------------------------------------------


@app.command("inspect", cls=PanelCommand)
@handle_errors
def inspect_command(
    out_dir: Annotated[
        Path,
        typer.Argument(
            metavar="OUT_DIR",
            parser=as_path,
            help="A directory written by `packtool pack`.",
            show_default=False,
        ),
    ],
    row: Annotated[
        int | None,
        typer.Option("--row", "-r", help="Row to show (default: 0).", show_default=False),
    ] = None,
    random_row: Annotated[
        bool, typer.Option("--random", help="Show a row picked at random (see --seed).")
    ] = False,
    seed: Annotated[
        int | None,
        typer.Option(
            help="Seed of --random: the same seed picks the same row.", show_default=False
        ),
    ] = None,
    window: Annotated[
        str | None,
        typer.Option(
            help="Draw only tokens START:END of the mask (END exclusive), at one token per cell "
            "when it fits the terminal.",
            show_default=False,
        ),
    ] = None,
    decode: Annotated[
        bool, typer.Option("--decode", help="Also print the full decoded text of every segment.")
    ] = False,
    svg: Annotated[
        Path | None,
        typer.Option(help="Also save the output as an SVG picture.", show_default=False),
    ] = None,
    html: Annotated[
        Path | None, typer.Option(help="Also save the output as HTML.", show_default=False)
    ] = None,
    width: Annotated[
        int | None,
        typer.Option(
            help="Draw for this many columns (default: the terminal's width).", show_default=False
        ),
    ] = None,
) -> None:
    """Show one packed row: its segments (source, positions, decoded text) and its attention
    mask drawn from the stored cu_seqlens, so you can see that documents do not see each other.
    """
    from .errors import OptionError
    from .format import open_packed
    from .inspect import inspect_row, parse_window, pick_row

    if row is not None and random_row:
        raise OptionError("--row and --random exclude each other: pass one of them")
    if seed is not None and not random_row:
        raise OptionError("--seed only applies to --random: add --random, or pass --row N")
    if width is not None and width < 20:
        raise OptionError(f"--width must be at least 20 columns, got {width}")
    for flag, path in (("--svg", svg), ("--html", html)):
        if path is not None and not path.parent.is_dir():
            raise OptionError(f"{flag} {path}: the directory {path.parent} does not exist")
    reader = open_packed(out_dir)
    span = parse_window(window, reader.max_len) if window is not None else None
    picked = ""
    if random_row and reader.num_rows:
        index = pick_row(reader.num_rows, seed)
        picked = f"--random --seed {seed}" if seed is not None else f"picked: --row {index}"
    else:
        index = 0 if row is None else row
    tokenizer, no_tokenizer = None, ""
    try:
        tokenizer = reader.load_tokenizer()
    except PacktoolError as e:
        no_tokenizer = str(e)
    view = inspect_row(reader, index, tokenizer)

    from .render.inspect import row_console, save_row, show_row

    console = row_console(width, record=svg is not None or html is not None)
    show_row(
        console,
        view,
        span=span,
        picked=picked,
        decoded=tokenizer is not None,
        no_tokenizer=no_tokenizer,
        decode=decode,
    )
    save_row(console, title=f"packtool inspect {out_dir} --row {index}", svg=svg, html=html)


# -- verify -------------------------------------------------------------------------------


_AGAINST = (  # what verify --against re-tokenizes with (verify's keyword arguments)
    _flag("tokenizer", str, None, show_default=False, help="With --against: the tokenizer to "
          "re-tokenize with [default: the copy of tokenizer.json in the output]."),
    _flag("parse_special", bool, None, "--parse-special/--no-parse-special", show_default=False,
          help="With --against: re-tokenize with special-token strings in the inputs parsed "
          "as control tokens, or as text [default: as the manifest records]."),
    _flag("chat_template", str, None, show_default=False, help="With --against, chat records: "
          "the Jinja template they were packed with [default: the file the manifest names, "
          "else the tokenizer's]."),
    _flag("reference", str, "file", help="With --against, text documents: re-tokenize with the "
          "tokenizer.json (file, as pack does) or with transformers' AutoTokenizer for its "
          "directory (transformers: the ids your transformers code gets)."),
)  # fmt: skip


@app.command(cls=PanelCommand)
@handle_errors
@with_flags(*_AGAINST)
def verify(
    out_dir: Annotated[Path, _OUT],
    inputs: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="INPUTS",
            parser=as_path,
            help="With --against: the inputs given to pack [default: the paths recorded in "
            "the manifest].",
            show_default=False,
        ),
    ] = None,
    against: Annotated[
        bool,
        typer.Option(
            "--against",
            help="Also re-read and re-tokenize the inputs with the recorded options and check "
            "that every document's tokens are in the rows exactly once, in order.",
        ),
    ] = False,
    *,
    max_problems: Annotated[int, typer.Option(help="Problems to list (all are counted).")] = 20,
    export_dir: Annotated[
        Path | None,
        typer.Option(
            "--export",
            parser=as_path,
            help="Also check an export of OUT_DIR (`packtool export`): its files' sha256 and "
            "its contents against the rows.",
            show_default=False,
        ),
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress and no summary; only the exit code.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    **retokenize: Any,
) -> None:
    """Check that OUT_DIR is whole and right: every row of every shard, the manifest's counts,
    the shards' sha256, (with --against INPUTS...) every document's tokens, and (with
    --export DIR) an export of it.

    Exits 0 when verified, 1 when a problem is found (the first ones are listed: shard, row,
    what) or OUT_DIR is not a packtool output, 2 on wrong usage.
    """
    from .render.progress import VerifyProgress
    from .render.verify import show_verify
    from .verification import verify as run_verify

    if inputs and not against:
        raise fail(
            f"unexpected argument {str(inputs[0])!r}: to compare with inputs, pass --against",
            2,
        )
    if export_dir is not None:
        from .export.common import local_export_dir

        export_dir = local_export_dir(export_dir)  # a store URL: one line before any work
    with VerifyProgress(enabled=not quiet and not as_json) as progress:
        report = run_verify(
            out_dir,
            against=[str(p) for p in inputs or []] if against else None,
            max_problems=max_problems,
            progress=progress,
            **retokenize,
        )
    export_check = None
    if export_dir is not None:
        from .export import verify_export

        export_check = verify_export(out_dir, export_dir)
    show_verify(report, export_check, quiet=quiet, as_json=as_json)
    if not report.ok or (export_check is not None and not export_check.ok):
        raise typer.Exit(1)


# -- export: other training stacks' formats --------------------------------------------


@app.command(cls=PanelCommand)
@handle_errors
def export(
    out_dir: Annotated[Path, _OUT],
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help=export_choices(),  # the table of exports (no export loaded)
        ),
    ],
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            parser=as_path,
            help="A new local directory to write (never replaced).",
            show_default=False,
        ),
    ],
    npy: Annotated[
        bool,
        typer.Option(
            "--npy", help="With megatron-bridge: also write the older .npy (a pickle, built whole)."
        ),
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No summary.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the export record as JSON.")
    ] = False,
) -> None:
    """Export OUT_DIR for another training stack into the new directory -o DIR.

    The export streams from the shards, writes export.json (its files' sha256) last, and is
    checked against the pack by `packtool verify OUT_DIR --export DIR`.
    """
    from .export import export as run_export
    from .render.export import show_export

    report = run_export(out_dir, output, to=to, npy=npy)
    show_export(report, quiet=quiet, as_json=as_json)


# -- check-model: does a model keep the packed documents apart? -------------------------


@app.command("check-model", cls=PanelCommand)
@handle_errors
def check_model_command(
    out_dir: Annotated[Path, _OUT],
    model: Annotated[
        Path,
        typer.Option(
            "--model",
            help="A transformers causal LM directory: its weights, or only its config.json "
            "(then random weights, seeded). Read offline.",
            show_default=False,
        ),
    ],
    rows: Annotated[
        int,
        typer.Option(
            "--rows", help="Packed rows to feed: the first that hold two documents or more."
        ),
    ] = 4,
    attn_implementation: Annotated[
        str,
        typer.Option("--attn-implementation", help="sdpa, eager or flex_attention."),
    ] = "sdpa",
    feed: Annotated[
        str,
        typer.Option(
            "--feed",
            help="packtool (packtool.torch.collate's batch), position-ids (input_ids and "
            "position_ids only, as padding-free trainers feed) or plain (input_ids and a 2-D "
            "attention mask, as most default collators feed) or mask (input_ids, position_ids and "
            "the explicit block mask of the attention, as a custom loop feeds).",
        ),
    ] = "packtool",
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Check that a model, fed packed rows of OUT_DIR as --feed says, keeps the documents
    apart: each document's logits, packed against alone (float32).

    Prints the largest difference per document kind and a verdict. Exits 0 when the
    documents are kept apart, 1 when a difference shows a leak (> 1e-4), with a line naming
    the feed and what to use instead, 2 on wrong usage.
    """
    from .check_model import check_model
    from .render.check_model import show_check_model

    result = check_model(
        out_dir,
        model,
        rows=rows,
        attn_implementation=attn_implementation,
        feed=feed,
        device=device,
    )
    show_check_model(result, as_json=as_json)
    if result.leak:
        raise typer.Exit(1)


# -- work units (`pack --units`) and `merge` -------------------------------------------


def _pack_units(
    inputs: list[Path], output: Path, options: PackOptions, *, quiet: bool, as_json: bool
) -> None:
    """`pack --units N [--unit I] [--engine local|ray]`."""
    from .engines import pack_units
    from .render.pack import show_units
    from .render.progress import RichProgress

    with RichProgress(enabled=not quiet and not as_json) as progress:
        report = pack_units([str(p) for p in inputs], output, options, progress=progress)
    show_units(report, quiet=quiet, as_json=as_json)


@app.command(cls=PanelCommand)
@handle_errors
@with_flags(*_merge_flags())
def merge(
    out_dir: Annotated[
        Path,
        typer.Argument(
            metavar="OUT_DIR",
            parser=as_path,
            help="Output directory of `pack --units N`, holding units/unit-I-of-N/.",
            show_default=False,
        ),
    ],
    *,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress and no summary.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    **layout: Any,
) -> None:
    """Join the work units in OUT_DIR/units into one dataset in OUT_DIR, with one manifest.

    By default no row is copied: the manifest lists the units' shards (rows shuffled within
    each unit) in a seeded order, with doc_ids offsets over the whole corpus; the units then
    hold the only copy of the rows. --copy (implied by --world-size, and by an order the
    units do not hold) writes the rows again, shuffled as `pack` does. The manifest records
    global_ffd_rows: the rows one global packing would need, to measure what packing unit
    by unit costs. A second merge with the same options does nothing.
    """
    from .merge import merge_units
    from .render.pack import show_merge
    from .render.progress import RichProgress

    with RichProgress(enabled=not quiet and not as_json) as progress:
        report = merge_units(out_dir, progress=progress, **layout)
    show_merge(report, quiet=quiet, as_json=as_json)


def main() -> None:
    """Console-script entry point."""
    app(prog_name="packtool")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
