"""The ``packtool`` command line: a thin layer over the library.

Each command parses its options, calls the library, and renders the result with rich. The
library's own exceptions become one-line errors and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import functools
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
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


# -- options that pack and stats (corpus mode) share, declared once ----------------------

_CORPUS_PANEL = "Corpus mode: with --max-len, INPUTS read and tokenized as pack would"


def _shared(*decls: str, **kwargs: Any) -> tuple[Any, Any]:
    """A `pack` option, and the same option in `stats`' corpus-mode help panel."""
    return (
        typer.Option(*decls, **kwargs),
        typer.Option(*decls, rich_help_panel=_CORPUS_PANEL, **kwargs),
    )


_TOKENIZER, _TOKENIZER_CORPUS = _shared(
    help="tokenizer.json path, local model directory, or hub name "
    "(default: packtool's bundled byte-level BPE).",
    show_default=False,
)
_TEXT_FIELD, _TEXT_FIELD_CORPUS = _shared(help="Field (column) holding the document text.")
_BOS, _BOS_CORPUS = _shared(
    "--bos/--no-bos",
    help="Force one BOS at each document start, or no post-processor tokens at all "
    "(default: the tokenizer's post-processor decides).",
    show_default=False,
)
_EOS_TOKEN, _EOS_TOKEN_CORPUS = _shared(
    help="EOS token: its text, or a number for an id; overrides the tokenizer's."
)
_BOS_TOKEN, _BOS_TOKEN_CORPUS = _shared(
    help="BOS token: its text, or a number for an id; overrides the tokenizer's."
)
_SKIP_BAD_RECORDS, _SKIP_BAD_RECORDS_CORPUS = _shared(
    "--skip-bad-records",
    help="Skip malformed records (bad JSON, missing or non-string text), counting them, "
    "instead of stopping at the first.",
)
_SPLIT, _SPLIT_CORPUS = _shared(
    help="Split of a saved DatasetDict (default: train).", show_default=False
)
_TXT_UNIT, _TXT_UNIT_CORPUS = _shared(
    help="A document in .txt inputs: line, paragraph or document."
)
_PARSE_SPECIAL, _PARSE_SPECIAL_CORPUS = _shared(
    "--parse-special",
    help="Parse special-token strings in the data (<|endoftext|>, <|im_end|>...) as "
    "control tokens, for data that holds markup on purpose [default: they are text].",
)
_IDS_FIELD, _IDS_FIELD_CORPUS = _shared(
    help="Pre-tokenized records: the field (a list of ints) holding each document's "
    "token ids, packed as they are (Parquet, Arrow, saved datasets, JSON Lines, JSON, "
    "CSV); no tokenizer is loaded unless --tokenizer is given.",
    show_default=False,
)
_VOCAB_SIZE, _VOCAB_SIZE_CORPUS = _shared(
    help="With --ids-field: ids must be below this [default: the tokenizer's vocabulary size].",
    show_default=False,
)
_SPLIT_ON_EOS, _SPLIT_ON_EOS_CORPUS = _shared(
    help="With --ids-field: cut each record into documents after every occurrence of "
    "this id (an EOS-separated stream; the EOS stays with the document before it).",
    show_default=False,
)
_NUM_PROC, _NUM_PROC_CORPUS = _shared(
    help="Tokenizer threads (default: all cores).", show_default=False
)
_TOKENIZER_BACKEND, _TOKENIZER_BACKEND_CORPUS = _shared(
    help="Tokenizer engine: auto (the fast backend suited to the tokenizer, gigatoken or "
    "fastokens, where it loads the file and passes the parity gate, else Hugging Face "
    "tokenizers), hf, fastokens or gigatoken (fail if it cannot). The ids are the same.",
)


@app.command(cls=PanelCommand)
@handle_errors
def pack(
    inputs: Annotated[
        list[Path],
        typer.Argument(
            parser=as_path,
            help="Input files (.jsonl/.json[.gz|.zst], .parquet, .arrow, .csv, .txt), "
            "directories or globs of them, a dataset saved with datasets.save_to_disk, or a "
            "packtool output (its documents packed again, no tokenizer).",
            show_default=False,
        ),
    ],
    max_len: Annotated[
        int,
        typer.Option(
            "--max-len",
            "-L",
            help="Tokens per packed row (4096, or 4k).",
            show_default=False,
            parser=_token_count,
            metavar="INTEGER",
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
    tokenizer: Annotated[str | None, _TOKENIZER] = None,
    text_field: Annotated[str, _TEXT_FIELD] = "text",
    input_shape: Annotated[
        str,
        typer.Option(
            help="Records are text, prompt-completion, chat or ids (pre-tokenized, with "
            "--ids-field); auto decides by the fields of the first record (messages -> chat, "
            "prompt + completion -> prompt-completion), or ids when --ids-field is given.",
        ),
    ] = "auto",
    prompt_field: Annotated[
        str, typer.Option(help="Field holding the prompt (prompt-completion records).")
    ] = "prompt",
    completion_field: Annotated[
        str, typer.Option(help="Field holding the completion (prompt-completion records).")
    ] = "completion",
    messages_field: Annotated[
        str,
        typer.Option(help="Field holding the list of {role, content} messages (chat records)."),
    ] = "messages",
    chat_template: Annotated[
        Path | None,
        typer.Option(
            parser=as_path,
            help="Jinja chat template for chat records (or a tokenizer_config.json holding "
            "one), rendered in a sandbox [default: the chat_template of the tokenizer's "
            "tokenizer_config.json].",
            show_default=False,
        ),
    ] = None,
    loss_on: Annotated[
        str | None,
        typer.Option(
            help="Tokens learned (labels column): completion, assistant or all [default: "
            "completion for prompt-completion, assistant for chat].",
            show_default=False,
        ),
    ] = None,
    template_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds the chat template may run on one record; a record it runs longer "
            "on stops the run, naming the record (or is skipped with --skip-bad-records).",
        ),
    ] = 10.0,  # chat.DEFAULT_TEMPLATE_TIMEOUT (tests/test_imports.py checks they agree)
    chat_turns: Annotated[
        str,
        typer.Option(
            help="Chats: one example per conversation, every assistant turn learned (all), or "
            "one per assistant turn, its history rendered as the template renders it at that "
            "turn and only that turn learned (each: for reasoning templates that drop earlier "
            "reasoning).",
        ),
    ] = "all",
    learn_reasoning: Annotated[
        bool,
        typer.Option(
            "--learn-reasoning/--no-learn-reasoning",
            help="Chats: learn the reasoning of assistant turns (<think> blocks, gpt-oss "
            "analysis) with the answer, or keep it as context.",
        ),
    ] = True,
    overflow: Annotated[
        str | None,
        typer.Option(
            help="What to do with documents longer than --max-len: split (into chunks), "
            "truncate, or drop [default: split for text, drop for prompt-completion and chat].",
            show_default=False,
        ),
    ] = None,
    add_eos: Annotated[
        bool | None,
        typer.Option(
            "--eos/--no-eos",
            help="Append EOS to every document [default: on, except for chats, whose template "
            "closes every turn].",
            show_default=False,
        ),
    ] = None,
    bos: Annotated[bool | None, _BOS] = None,
    eos_token: Annotated[str | None, _EOS_TOKEN] = None,
    bos_token: Annotated[str | None, _BOS_TOKEN] = None,
    pad_id: Annotated[
        int | None,
        typer.Option(
            help="Padding id (default: the tokenizer's pad token, else EOS).", show_default=False
        ),
    ] = None,
    parse_special: Annotated[bool, _PARSE_SPECIAL] = False,
    shuffle: Annotated[
        bool,
        typer.Option("--shuffle/--no-shuffle", help="Shuffle rows (FFD puts long ones first)."),
    ] = True,
    seed: Annotated[int, typer.Option(help="Seed of the row shuffle.")] = 0,
    world_size: Annotated[
        int | None,
        typer.Option(
            help="Store the rows as balanced steps for W data-parallel ranks: read through "
            "PackedDataset(rank=r, world_size=W), every rank's rows of a step have nearly the "
            "same attention cost (docs/balance.md).",
            show_default=False,
        ),
    ] = None,
    micro_batches: Annotated[
        int,
        typer.Option(
            help="With --world-size: rows a rank reads per step (batch size x gradient "
            "accumulation); the sum over them is balanced.",
        ),
    ] = 1,
    rows_per_shard: Annotated[
        int | None,
        typer.Option(help="Rows per shard (default: from --shard-size).", show_default=False),
    ] = None,
    shard_size: Annotated[
        str, typer.Option(help="Target shard size, e.g. 256MB (ignored with --rows-per-shard).")
    ] = "256MB",
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace the output directory if it exists.")
    ] = False,
    skip_bad_records: Annotated[bool, _SKIP_BAD_RECORDS] = False,
    split: Annotated[str | None, _SPLIT] = None,
    txt_unit: Annotated[str, _TXT_UNIT] = "line",
    ids_field: Annotated[str | None, _IDS_FIELD] = None,
    labels_field: Annotated[
        str | None,
        typer.Option(
            help="With --ids-field: the field of labels (ints, -100 where not learned), one "
            "per id, carried into the labels column.",
            show_default=False,
        ),
    ] = None,
    loss_mask_field: Annotated[
        str | None,
        typer.Option(
            help="With --ids-field: the field of a 0/1 mask per id (1: learned), instead of "
            "--labels-field.",
            show_default=False,
        ),
    ] = None,
    vocab_size: Annotated[int | None, _VOCAB_SIZE] = None,
    split_on_eos: Annotated[int | None, _SPLIT_ON_EOS] = None,
    pad_to_multiple_of: Annotated[
        int | None,
        typer.Option(
            help="Pad every segment (a document, or a chunk of one) with the pad id to a "
            "multiple of N (2 x context-parallel size for Megatron THD, 16/32/128 for FP8 "
            "kernels); --max-len must be a multiple of N. cu_seqlens are then the padded "
            "boundaries, cu_seqlens_unpadded the real ones; no pad is learned "
            "(docs/format.md).",
            show_default=False,
        ),
    ] = None,
    num_proc: Annotated[int | None, _NUM_PROC] = None,
    tokenizer_backend: Annotated[str, _TOKENIZER_BACKEND] = "auto",
    check_sample: Annotated[
        int,
        typer.Option(
            help="Re-encode about N documents, spread over the inputs, with Hugging Face "
            "tokenizers and stop (writing nothing) if the fast backend gave other ids.",
        ),
    ] = 0,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue an interrupted --resume run from its checkpoint, and keep this "
            "run's work if it is interrupted.",
        ),
    ] = False,
    mix: Annotated[
        str | None,
        typer.Option(
            help="Each input's share of the output's tokens, in input order (e.g. "
            "0.5,0.3,0.2): a larger source is sampled, a smaller one repeated, by whole "
            "documents (docs/mixtures.md).",
            show_default=False,
        ),
    ] = None,
    tokens: Annotated[
        str | None,
        typer.Option(
            help="With --mix: the output's tokens (e.g. 500M, 2G) [default: the most that "
            "need no document repeated].",
            show_default=False,
        ),
    ] = None,
    repeat: Annotated[
        bool,
        typer.Option(
            "--repeat/--no-repeat",
            help="With --mix: a source smaller than its share is repeated by whole documents "
            "(--no-repeat: an error instead).",
        ),
    ] = True,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress bars and no summary.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the summary as JSON (the manifest's figures).")
    ] = False,
    units: Annotated[
        int | None,
        typer.Option(
            help="Pack as N work units (FFD inside each), then merge them (docs/cluster.md).",
            show_default=False,
        ),
    ] = None,
    unit: Annotated[
        int | None,
        typer.Option(
            help="Run only unit I (0-based) of --units, here, without merging (Slurm array, "
            "Kubernetes indexed job); `packtool merge` joins the units.",
            show_default=False,
        ),
    ] = None,
    engine: Annotated[
        str, typer.Option(help="Where --units run: local (process pool) or ray.")
    ] = "local",
    ray_address: Annotated[
        str | None,
        typer.Option(
            help="Ray cluster to join with --engine ray, or auto (default: start a local Ray "
            "instance for the run).",
            show_default=False,
        ),
    ] = None,
    merge_copy: Annotated[
        bool | None,
        typer.Option(
            "--copy/--no-copy",
            help="With --units: the merge writes the rows again into OUTPUT (--copy), or lists "
            "the units' shards where they lie (--no-copy) [default: list them, copy only what "
            "--world-size or a changed order needs].",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Tokenize INPUTS and pack them into rows of --max-len tokens, written as Arrow shards.

    Each row holds input_ids, position_ids (restarting at 0 at every document) and cu_seqlens
    (document boundaries), ready for FlashAttention varlen or a block-diagonal mask.
    """
    from .options import PackOptions
    from .pipeline import pack as run_pack
    from .render.pack import show_pack
    from .render.progress import RichProgress

    if output is None:
        stem = re.sub(r"[^\w-]", "", inputs[0].name.split(".")[0]) or "corpus"
        output = Path(f"{stem}-packed-{max_len}")  # here, also for inputs on a store
    options = PackOptions.from_mapping(locals())
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


@app.command(cls=PanelCommand)
@handle_errors
def stats(
    paths: Annotated[
        list[Path],
        typer.Argument(
            parser=as_path,
            help="A packed output directory (OUT_DIR), or, with --max-len, a corpus: input "
            "files, directories or globs as for `pack`.",
            show_default=False,
        ),
    ],
    max_len: Annotated[
        str | None,
        typer.Option(
            "--max-len",
            "-L",
            rich_help_panel=_CORPUS_PANEL,
            help="The max-len values to compare, comma-separated (e.g. 2048,4096,8192).",
            show_default=False,
        ),
    ] = None,
    batch_size: Annotated[
        int,
        typer.Option(
            "--batch-size", "-b", help="Batch size of the padded baselines it compares with."
        ),
    ] = 8,
    seed: Annotated[
        int, typer.Option(help="Seed of the random-batches and random-order baselines.")
    ] = 0,
    world_size: Annotated[
        int | None,
        typer.Option(
            help="Packed output: the step imbalance across W data-parallel ranks, stored order "
            "against a random one [default: the world size the output records].",
            show_default=False,
        ),
    ] = None,
    micro_batches: Annotated[
        int | None,
        typer.Option(
            help="Packed output: rows a rank reads per step, for --world-size [default: the "
            "recorded one, else 1].",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the figures as one JSON object.")
    ] = False,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            help="Also write the figures and charts as one self-contained HTML page (no "
            "script, nothing loaded: it opens offline).",
            show_default=False,
        ),
    ] = None,
    svg: Annotated[
        Path | None,
        typer.Option(
            "--svg",
            help="Also write each chart as DIR/NAME.svg (the directory is made).",
            show_default=False,
        ),
    ] = None,
    tokenizer: Annotated[str | None, _TOKENIZER_CORPUS] = None,
    text_field: Annotated[str, _TEXT_FIELD_CORPUS] = "text",
    overflow: Annotated[
        str | None,
        typer.Option(
            rich_help_panel=_CORPUS_PANEL,
            help="Split, truncate or drop documents over max-len [default: split].",
            show_default=False,
        ),
    ] = None,
    add_eos: Annotated[
        bool | None,
        typer.Option(
            "--eos/--no-eos",
            rich_help_panel=_CORPUS_PANEL,
            help="Append EOS to every document [default: on].",
            show_default=False,
        ),
    ] = None,
    bos: Annotated[bool | None, _BOS_CORPUS] = None,
    eos_token: Annotated[str | None, _EOS_TOKEN_CORPUS] = None,
    bos_token: Annotated[str | None, _BOS_TOKEN_CORPUS] = None,
    skip_bad_records: Annotated[bool, _SKIP_BAD_RECORDS_CORPUS] = False,
    split: Annotated[str | None, _SPLIT_CORPUS] = None,
    txt_unit: Annotated[str, _TXT_UNIT_CORPUS] = "line",
    parse_special: Annotated[bool, _PARSE_SPECIAL_CORPUS] = False,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            rich_help_panel=_CORPUS_PANEL,
            help="Where tokenized lengths are cached (default: $PACKTOOL_CACHE_DIR, "
            "else $XDG_CACHE_HOME/packtool, else ~/.cache/packtool).",
            show_default=False,
        ),
    ] = None,
    cache: Annotated[
        bool,
        typer.Option(
            "--cache/--no-cache",
            rich_help_panel=_CORPUS_PANEL,
            help="Reuse and keep tokenized lengths.",
        ),
    ] = True,
    ids_field: Annotated[str | None, _IDS_FIELD_CORPUS] = None,
    vocab_size: Annotated[int | None, _VOCAB_SIZE_CORPUS] = None,
    split_on_eos: Annotated[int | None, _SPLIT_ON_EOS_CORPUS] = None,
    num_proc: Annotated[int | None, _NUM_PROC_CORPUS] = None,
    tokenizer_backend: Annotated[str, _TOKENIZER_BACKEND_CORPUS] = "auto",
) -> None:
    """Report packing statistics: rows, efficiency, padding saved against padded batches.

    On a packed output (a directory with manifest.json): what is in it. On a corpus, with
    --max-len 2048,4096,...: how it would pack at each max-len, without writing rows
    (tokenized lengths are cached, so a second call is fast); a packed output with --max-len
    is the corpus of its documents.
    """
    from .options import CORPUS_OPTIONS, PackOptions
    from .render.progress import RichProgress
    from .render.stats import show_stats
    from .stats import corpus_stats, dataset_stats, is_packed_output, parse_max_lens

    balance = {"world_size": world_size, "micro_batches": micro_batches}
    corpus = {k: v for k, v in locals().items() if k not in ("seed", "max_len", *balance)}
    options = PackOptions.from_mapping(corpus)  # max_len and seed mean other things here
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
            parser=as_path, help="A directory written by `packtool pack`.", show_default=False
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


@app.command(cls=PanelCommand)
@handle_errors
def verify(
    out_dir: Annotated[
        Path,
        typer.Argument(
            parser=as_path, help="The output directory of `packtool pack`.", show_default=False
        ),
    ],
    inputs: Annotated[
        list[Path] | None,
        typer.Argument(
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
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help="With --against: the tokenizer to re-tokenize with [default: the copy of "
            "tokenizer.json in the output].",
            show_default=False,
        ),
    ] = None,
    parse_special: Annotated[
        bool | None,
        typer.Option(
            "--parse-special/--no-parse-special",
            help="With --against: re-tokenize with special-token strings in the inputs parsed "
            "as control tokens, or as text [default: as the manifest records].",
            show_default=False,
        ),
    ] = None,
    chat_template: Annotated[
        str | None,
        typer.Option(
            help="With --against, chat records: the Jinja template they were packed with "
            "[default: the file the manifest names, else the tokenizer's].",
            show_default=False,
        ),
    ] = None,
    reference: Annotated[
        str,
        typer.Option(
            help="With --against, text documents: re-tokenize with the tokenizer.json (file, "
            "as pack does) or with transformers' AutoTokenizer for its directory "
            "(transformers: the ids your transformers code gets).",
        ),
    ] = "file",
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
) -> None:
    """Check that OUT_DIR is whole and right: every row of every shard, the manifest's counts,
    the shards' sha256, (with --against INPUTS...) every document's tokens, and (with
    --export DIR) an export of it.

    Exits 0 when verified, 1 when a problem is found (the first ones are listed: shard, row,
    what) or OUT_DIR is not a packtool output, 2 on wrong usage.
    """
    from .render.progress import VerifyProgress
    from .render.verify import show_verify
    from .verify import verify as run_verify

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
            tokenizer=tokenizer,
            max_problems=max_problems,
            progress=progress,
            parse_special=parse_special,
            chat_template=chat_template,
            reference=reference,
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
    out_dir: Annotated[
        Path,
        typer.Argument(
            parser=as_path, help="The output directory of `packtool pack`.", show_default=False
        ),
    ],
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
    out_dir: Annotated[
        Path,
        typer.Argument(
            parser=as_path, help="The output directory of `packtool pack`.", show_default=False
        ),
    ],
    model: Annotated[
        Path,
        typer.Option(
            "--model",
            help="A transformers causal LM directory: its weights, or only its config.json "
            "(then random weights, seeded). Read offline.",
            show_default=False,
        ),
    ],
    rows: Annotated[int, typer.Option("--rows", help="Packed rows to feed.")] = 4,
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
            "attention mask, as most default collators feed).",
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
    inputs: list[Path], output: Path, options: Any, *, quiet: bool, as_json: bool
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
def merge(
    out_dir: Annotated[
        Path,
        typer.Argument(
            parser=as_path,
            help="Output directory of `pack --units N`, holding units/unit-I-of-N/.",
            show_default=False,
        ),
    ],
    shuffle: Annotated[
        bool | None,
        typer.Option(
            "--shuffle/--no-shuffle",
            help="Shuffle the rows (default: as given to pack).",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            help="Seed of the row shuffle (default: as given to pack).", show_default=False
        ),
    ] = None,
    rows_per_shard: Annotated[
        int | None,
        typer.Option(help="Rows per shard (default: as given to pack).", show_default=False),
    ] = None,
    shard_size: Annotated[
        str | None,
        typer.Option(
            help="Target shard size, e.g. 256MB (ignored with --rows-per-shard).",
            show_default=False,
        ),
    ] = None,
    world_size: Annotated[
        int | None,
        typer.Option(
            help="Store the rows as balanced steps for W data-parallel ranks, as `pack "
            "--world-size` (default: as given to pack).",
            show_default=False,
        ),
    ] = None,
    micro_batches: Annotated[
        int | None,
        typer.Option(
            help="With --world-size: rows a rank reads per step (default: as given to pack).",
            show_default=False,
        ),
    ] = None,
    copy: Annotated[
        bool | None,
        typer.Option(
            "--copy/--no-copy",
            help="Write the rows again into OUT_DIR (--copy), or list the units' shards where "
            "they lie, writing no row (--no-copy) [default: as given to pack, else list them "
            "and copy only what --world-size or another order than the units' needs].",
            show_default=False,
        ),
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress and no summary.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
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
        report = merge_units(
            out_dir,
            shuffle=shuffle,
            seed=seed,
            rows_per_shard=rows_per_shard,
            shard_size=shard_size,
            world_size=world_size,
            micro_batches=micro_batches,
            copy=copy,
            progress=progress,
        )
    show_merge(report, quiet=quiet, as_json=as_json)


def main() -> None:
    """Console-script entry point."""
    app(prog_name="packtool")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
