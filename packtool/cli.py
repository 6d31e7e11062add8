"""The ``packtool`` command line: a thin layer over the library.

Each command parses its options, calls the library, and renders the result with rich. The
library's own exceptions become one-line errors and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from . import __version__
from .errors import PacktoolError

app = typer.Typer(
    name="packtool",
    help="Offline sequence packing for LLM training data.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print a one-line error to stderr; return the Exit to raise."""
    err.print(f"[bold red]Error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def handle_errors(func: F) -> F:
    """Turn the library's exceptions, OS errors and Ctrl-C into one-line errors."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except PacktoolError as e:
            raise fail(str(e), e.exit_code) from None
        except OSError as e:
            where = f"{e.filename}: " if getattr(e, "filename", None) else ""
            raise fail(f"{where}{e.strerror or e}") from None
        except KeyboardInterrupt:
            raise fail("interrupted; nothing was written", 130) from None

    return wrapper  # type: ignore[return-value]


def _version(value: bool) -> None:
    if value:
        out.print(f"packtool {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """Offline sequence packing for LLM training data."""


class _RichProgress:
    """Renders the library's progress callback as rich progress bars (on stderr)."""

    _LABELS: ClassVar[dict[str, str]] = {
        "tokenize": "read + tokenize",
        "pack": "pack (FFD)",
        "write": "write rows",
    }

    def __init__(self, enabled: bool) -> None:
        self.progress = Progress(
            TextColumn("{task.description:<16}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=err,
            disable=not enabled,
            transient=False,
        )
        self.tasks: dict[str, TaskID] = {}

    def __enter__(self) -> _RichProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def __call__(self, stage: str, completed: int, total: int | None) -> None:
        task = self.tasks.get(stage)
        if task is None:
            task = self.progress.add_task(self._LABELS.get(stage, stage), total=total, detail="")
            self.tasks[stage] = task
        detail = ""
        if stage == "tokenize":
            detail = f"{completed / 1e6:,.1f}/{(total or 0) / 1e6:,.1f} MB"
        elif total is not None:
            detail = f"{completed:,}/{total:,}"
        self.progress.update(task, completed=completed, total=total or 1, detail=detail)


def _summary_table(report: Any) -> Table:
    d = report.documents
    table = Table(title=f"packed into {report.out_dir}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("documents read", f"{d.read:,}")
    table.add_row(
        "  packed whole / split / truncated",
        f"{d.packed:,} / {d.split:,} / {d.truncated:,}",
    )
    table.add_row(
        "  dropped / empty / bad skipped",
        f"{d.dropped:,} / {d.empty:,} / {d.bad_records_skipped:,}",
    )
    table.add_row("segments", f"{report.segments:,}")
    table.add_row("tokens in rows", f"{report.tokens:,}")
    table.add_row(
        "rows",
        f"{report.rows:,} of {report.max_len:,} (lower bound {report.lower_bound_rows:,}, "
        f"+{report.rows_over_lower_bound:,})",
    )
    table.add_row("shards", f"{report.shards:,}")
    table.add_row("packing efficiency", f"{report.efficiency:.2%}")
    table.add_row(
        "padding saved",
        f"{report.padding_saved:.1%} of slots vs padding every segment to max-len "
        f"({report.unpacked_slots:,} -> {report.rows * report.max_len:,} slots)",
    )
    table.add_row("time", f"{report.seconds:.1f} s ({report.tokens_per_second:,.0f} tokens/s)")
    return table


@app.command()
@handle_errors
def pack(
    inputs: Annotated[
        list[Path],
        typer.Argument(
            help="Input files (.jsonl/.json[.gz|.zst], .parquet, .arrow, .csv, .txt), "
            "directories or globs of them, or a dataset saved with datasets.save_to_disk.",
            show_default=False,
        ),
    ],
    max_len: Annotated[
        int, typer.Option("--max-len", "-L", help="Tokens per packed row.", show_default=False)
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Output directory [default: INPUT-packed-MAXLEN next to the current dir].",
            show_default=False,
        ),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help="tokenizer.json path, local model directory, or hub name "
            "[default: packtool's bundled byte-level BPE].",
            show_default=False,
        ),
    ] = None,
    text_field: Annotated[
        str, typer.Option(help="Field (column) holding the document text.")
    ] = "text",
    overflow: Annotated[
        str,
        typer.Option(
            help="What to do with documents longer than --max-len: split (into chunks), "
            "truncate, or drop."
        ),
    ] = "split",
    eos: Annotated[
        bool, typer.Option("--eos/--no-eos", help="Append EOS to every document.")
    ] = True,
    bos: Annotated[
        bool | None,
        typer.Option(
            "--bos/--no-bos",
            help="Force one BOS at each document start, or no post-processor tokens at all "
            "[default: the tokenizer's post-processor decides].",
            show_default=False,
        ),
    ] = None,
    eos_token: Annotated[
        str | None, typer.Option(help="EOS token (or id), overriding the tokenizer's.")
    ] = None,
    bos_token: Annotated[
        str | None, typer.Option(help="BOS token (or id), overriding the tokenizer's.")
    ] = None,
    pad_id: Annotated[
        int | None,
        typer.Option(
            help="Padding id [default: the tokenizer's pad token, else EOS].", show_default=False
        ),
    ] = None,
    shuffle: Annotated[
        bool,
        typer.Option("--shuffle/--no-shuffle", help="Shuffle rows (FFD puts long ones first)."),
    ] = True,
    seed: Annotated[int, typer.Option(help="Seed of the row shuffle.")] = 0,
    rows_per_shard: Annotated[
        int | None,
        typer.Option(help="Rows per shard [default: from --shard-size].", show_default=False),
    ] = None,
    shard_size: Annotated[
        str, typer.Option(help="Target shard size, e.g. 256MB (ignored with --rows-per-shard).")
    ] = "256MB",
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace the output directory if it exists.")
    ] = False,
    skip_bad_records: Annotated[
        bool,
        typer.Option(
            "--skip-bad-records",
            help="Skip malformed records (bad JSON, missing or non-string text), counting them, "
            "instead of stopping at the first.",
        ),
    ] = False,
    split: Annotated[
        str | None,
        typer.Option(help="Split of a saved DatasetDict [default: train].", show_default=False),
    ] = None,
    txt_unit: Annotated[
        str, typer.Option(help="A document in .txt inputs: line, paragraph or document.")
    ] = "line",
    num_proc: Annotated[
        int | None,
        typer.Option(help="Tokenizer threads [default: all cores].", show_default=False),
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress bars and no summary.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the summary as JSON (the manifest's figures).")
    ] = False,
) -> None:
    """Tokenize INPUTS and pack them into rows of --max-len tokens, written as Arrow shards.

    Each row holds input_ids, position_ids (restarting at 0 at every document) and cu_seqlens
    (document boundaries), ready for FlashAttention varlen or a block-diagonal mask.
    """
    from .pipeline import pack as run_pack

    if num_proc is not None:
        if num_proc < 1:
            raise fail(f"--num-proc must be >= 1, got {num_proc}", 2)
        os.environ["RAYON_NUM_THREADS"] = str(num_proc)
    if output is None:
        output = Path(f"{inputs[0].name.split('.')[0] or 'corpus'}-packed-{max_len}")
    with _RichProgress(enabled=not quiet and not as_json) as progress:
        report = run_pack(
            [str(p) for p in inputs],
            output,
            max_len=max_len,
            tokenizer=tokenizer,
            text_field=text_field,
            overflow=overflow,
            add_eos=eos,
            bos=bos,
            eos_token=eos_token,
            bos_token=bos_token,
            pad_id=pad_id,
            shuffle=shuffle,
            seed=seed,
            rows_per_shard=rows_per_shard,
            shard_size=shard_size,
            overwrite=overwrite,
            skip_bad_records=skip_bad_records,
            split=split,
            txt_unit=txt_unit,
            progress=progress,
        )
    if as_json:
        m = report.manifest
        keys = (
            "documents",
            "segments",
            "tokens",
            "rows",
            "lower_bound_rows",
            "rows_over_lower_bound",
            "efficiency",
            "bad_records",
            "seconds",
        )
        print(json.dumps({"out_dir": str(report.out_dir), **{k: m[k] for k in keys}}, indent=2))
        return
    if not quiet:
        out.print(_summary_table(report))
        for line in report.bad_records[:5]:
            err.print(f"[yellow]skipped:[/] {line}", highlight=False)


# == stats (issue 4): add the `stats` command below this line ==


# == end of stats ==


# == inspect (issue 5): add the `inspect` command below this line ==


# == end of inspect ==


# == verify (issue 8): add the `verify` command below this line ==


class _VerifyProgress(_RichProgress):
    """Progress of ``verify``: bytes hashed, rows checked, input bytes re-read.

    Started at the first report, so that an error before any work (not a packtool output)
    prints its one line and nothing else.
    """

    started = False

    def __enter__(self) -> _VerifyProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.started:
            self.progress.__exit__(*exc)

    _LABELS: ClassVar[dict[str, str]] = {
        "hash": "sha256 shards",
        "rows": "check rows",
        "against": "re-tokenize inputs",
    }

    def __call__(self, stage: str, completed: int, total: int | None) -> None:
        if not self.started:
            self.progress.__enter__()
            self.started = True
        task = self.tasks.get(stage)
        if task is None:
            task = self.progress.add_task(self._LABELS.get(stage, stage), total=total, detail="")
            self.tasks[stage] = task
        if stage in ("hash", "against"):
            detail = f"{completed / 1e6:,.1f}/{(total or 0) / 1e6:,.1f} MB"
        else:
            detail = f"{completed:,}/{total or 0:,}"
        self.progress.update(task, completed=completed, total=total or 1, detail=detail)


def _verify_table(report: Any) -> Table:
    title = f"{'verified' if report.ok else 'FAILED'}: {report.path}"
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("shards (bytes, sha256, rows)", f"{report.shards_checked:,}")
    table.add_row("rows", f"{report.rows_checked:,}")
    table.add_row("document segments", f"{report.segments:,}")
    table.add_row("documents", f"{report.documents:,}")
    table.add_row("tokens", f"{report.tokens:,}")
    if report.against is not None:
        a = report.against
        d = a.documents
        table.add_row("inputs re-read", f"{len(a.inputs):,} ({d['read']:,} documents)")
        table.add_row("documents compared", f"{a.documents_compared:,}")
        table.add_row(
            "  packed / split / truncated",
            f"{d['packed']:,} / {d['split']:,} / {d['truncated']:,}",
        )
        table.add_row(
            "  dropped / empty / bad skipped",
            f"{d['dropped']:,} / {d['empty']:,} / {d['bad_records_skipped']:,}",
        )
    table.add_row("problems", f"{report.problems_total:,}")
    table.add_row("time", f"{report.seconds:.1f} s")
    return table


@app.command()
@handle_errors
def verify(
    out_dir: Annotated[
        Path, typer.Argument(help="The output directory of `packtool pack`.", show_default=False)
    ],
    inputs: Annotated[
        list[Path] | None,
        typer.Argument(
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
    max_problems: Annotated[int, typer.Option(help="Problems to list (all are counted).")] = 20,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress and no summary; only the exit code.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Check that OUT_DIR is whole and right: every row of every shard, the manifest's counts,
    the shards' sha256, and (with --against INPUTS...) every document's tokens.

    Exits 0 when verified, 1 when a problem is found (the first ones are listed: shard, row,
    what) or OUT_DIR is not a packtool output, 2 on wrong usage.
    """
    from .verify import verify as run_verify

    if inputs and not against:
        raise fail(
            f"unexpected argument {str(inputs[0])!r}: to compare with inputs, pass --against",
            2,
        )
    with _VerifyProgress(enabled=not quiet and not as_json) as progress:
        report = run_verify(
            out_dir,
            against=[str(p) for p in inputs or []] if against else None,
            tokenizer=tokenizer,
            max_problems=max_problems,
            progress=progress,
        )
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    elif not quiet:
        out.print(_verify_table(report))
        for note in report.notes:
            out.print(f"[dim]note:[/] {note}", highlight=False, soft_wrap=True)
        for problem in report.problems:
            out.print(f"[red]problem:[/] {problem}", highlight=False, soft_wrap=True)
        hidden = report.problems_total - len(report.problems)
        if hidden > 0:
            counts = ", ".join(f"{k} {v:,}" for k, v in sorted(report.problem_counts.items()))
            out.print(f"... and {hidden:,} more problems (by check: {counts})", highlight=False)
    if not report.ok:
        raise typer.Exit(1)


# == end of verify ==


def main() -> None:
    """Console-script entry point."""
    app(prog_name="packtool")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
