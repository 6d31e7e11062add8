"""The reports of ``pack``, ``pack --units`` and ``merge``: the summary table, the notes
and skipped lines on stderr, the units' table, or the JSON summary."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .console import clean, note, say, stdout

if TYPE_CHECKING:
    from rich.table import Table


def special_strings_line(documents: int, parsed: bool) -> str | None:
    """The line about special-token strings found in the data (``None``: there were none)."""
    if not documents:
        return None
    hold = "document holds" if documents == 1 else "documents hold"
    if parsed:
        return (
            f"{documents:,} {hold} special-token strings; parsed as control tokens "
            "(--parse-special)"
        )
    return (
        f"{documents:,} {hold} special-token strings of the tokenizer; encoded as "
        "the text they spell (--parse-special parses them)"
    )


BUNDLED_TOKENIZER_NOTE = (
    "tokenized with packtool's bundled sample tokenizer (an 8,192-id BPE trained on "
    "sample_data, for trying packtool out): pass --tokenizer for your model's tokenizer"
)


def _tokenizer_name(report: Any) -> str | None:
    """The tokenizer a pack (or a corpus's stats) used, as the manifest names it."""
    manifest = getattr(report, "manifest", None)
    if manifest is not None:
        return manifest.tokenizer.name  # type: ignore[no-any-return]
    return getattr(report, "tokenizer", None)


def untaken_sources(mixture: Any) -> str | None:
    """The sources of a mixture that gave no document (their share nearer to none than to
    any of their documents), in one line; None if every source gave some."""
    empty = [s for s in (mixture.sources if mixture else ()) if s.documents_taken == 0]
    if not empty:
        return None
    named = ", ".join(f"{s.index} ({s.path}, {s.target_tokens:,} tokens asked)" for s in empty)
    return (
        f"--mix took no document of source {named}: its share is nearer to none than to "
        "its documents; raise --tokens or its weight"
    )


def notices(report: Any) -> list[str]:
    """The run's notices, and the mixture's sources that gave no document."""
    manifest = getattr(report, "manifest", None)
    untaken = untaken_sources(manifest.mixture) if manifest is not None else None
    return [*report.notices, *([untaken] if untaken else [])]


def print_notices(report: Any, *, quiet: bool) -> None:
    """The tokenizer's notices (always, on stderr), the special-token strings line, and
    a reminder when the bundled sample tokenizer was used (without --tokenizer)."""
    for notice in notices(report):
        note("[yellow]note:[/]", notice)
    line = special_strings_line(report.special_strings, report.parse_special)
    if line and not quiet:
        note("[yellow]note:[/]", line)
    from ..tokenize import DEFAULT_TOKENIZER

    manifest = getattr(report, "manifest", None)
    backend = manifest.tokenizer.backend if manifest is not None else None
    tokenized = backend is None or backend.name != "none"  # "none": ids (a repack)
    if not quiet and tokenized and _tokenizer_name(report) == DEFAULT_TOKENIZER:
        note("[yellow]note:[/]", BUNDLED_TOKENIZER_NOTE)


def say_skipped(skipped: list[str], quiet: bool) -> None:
    """The one line on directory members of an unknown type that were not read."""
    from ..readers import describe_skipped

    if skipped and not quiet:
        note("[yellow]skipped:[/]", describe_skipped(skipped))


def summary_table(report: Any, *, tokenized: bool = True) -> Table:
    """The report of a pack (``tokenized=False``: of a merge, which tokenizes nothing)."""
    d = report.documents
    from rich.table import Table

    title = clean(f"packed into {report.out_dir}")
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    mixture = report.manifest.mixture
    table.add_row("documents read", f"{d.read:,}")
    table.add_row(
        # a mixture cuts every document read, then takes some of them (some again)
        f"  {'cut' if mixture else 'packed'} whole / split / truncated",
        f"{d.packed:,} / {d.split:,} / {d.truncated:,}",
    )
    table.add_row(
        "  dropped / empty / bad skipped",
        f"{d.dropped:,} / {d.empty:,} / {d.bad_records_skipped:,}",
    )
    if mixture:
        table.add_row("  taken by --mix (copies counted)", f"{mixture.documents_taken:,}")
    vocab = report.manifest.tokenizer.vocab_size
    name = report.manifest.tokenizer.name
    table.add_row("tokenizer", clean(name) + (f" ({vocab:,} ids)" if vocab else ""))
    eos = report.manifest.tokenizer.eos_appended
    if eos is not None and eos.id is not None:
        table.add_row("EOS appended", f"{clean(eos.token)} (id {eos.id})")
    table.add_row("segments", f"{report.segments:,}")
    table.add_row("tokens in rows", f"{report.tokens:,}")
    if report.tokens_learned is not None:
        labels = report.manifest.labels
        table.add_row(
            f"  learned ({labels.loss_on if labels else None})",
            f"{report.tokens_learned:,} ({report.learned_share:.1%} of slots)",
        )
        if labels and (labels.documents_without_labels or labels.chunks_without_labels_dropped):
            table.add_row(
                "  nothing to learn: documents / chunks dropped",
                f"{labels.documents_without_labels or 0:,} / "
                f"{labels.chunks_without_labels_dropped or 0:,}",
            )
    table.add_row(
        "rows",
        f"{report.rows:,} x {report.max_len:,} tokens (lower bound "
        f"{report.lower_bound_rows:,}, +{report.rows_over_lower_bound:,})",
    )
    table.add_row("shards", f"{report.shards:,}")
    table.add_row("packing efficiency", f"{report.efficiency:.2%}")
    table.add_row(
        "padding saved",
        f"{report.padding_saved:.1%} of slots vs padding every segment to max-len "
        f"({report.unpacked_slots:,} -> {report.rows * report.max_len:,} slots)",
    )
    # (a rerun of --units whose units and merge were all done tokenized nothing: no speed)
    tokenized = tokenized and report.tokens_per_second > 0
    speed = f" ({report.tokens_per_second:,.0f} tokens/s)" if tokenized else ""
    table.add_row("time", f"{report.seconds:.1f} s{speed}")
    backend = report.manifest.tokenizer.backend
    if backend and backend.name != "none":  # "none": pre-tokenized, nothing encoded
        fell_back = backend.fallback_batches or 0
        table.add_row(
            "tokenizer backend",
            f"{backend.name} {backend.version}"
            + (f" ({fell_back:,} batches re-encoded with hf)" if fell_back else ""),
        )
    return table


def units_table(report: Any) -> Table:
    """One line per unit: where it ran and what it packed."""
    from rich.table import Table

    table = Table(title="units", title_justify="left")
    for name, justify in (
        ("unit", "left"),
        ("status", "left"),
        ("documents", "right"),
        ("rows", "right"),
        ("seconds", "right"),
        ("host:pid", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for u in report.units:
        table.add_row(
            clean(u.name),
            "skipped (finished)" if u.skipped else "packed",
            f"{u.documents:,}",
            f"{u.rows:,}",
            f"{u.seconds:.1f}",
            "" if u.skipped else f"{u.host}:{u.pid}",
        )
    return table


def units_line(manifest: Any) -> str:
    units = manifest.units
    if units.copied is False:
        how = "; the rows stay in the units' shards (merged without copying)"
    elif units.copy_reason:
        how = f"; rows copied ({units.copy_reason})"
    else:
        how = ""
    return (
        f"{units.count} units: {manifest.rows:,} rows; one global FFD would need "
        f"{manifest.global_ffd_rows:,} (+{units.rows_over_global_ffd:,} rows, "
        f"{units.packing_loss:.2%} packing loss){how}"
    )


def merged_json(report: Any) -> dict[str, Any]:
    m = report.manifest
    units = m.units.summary() if m.units else {}
    return {"out_dir": str(report.out_dir), **m.summary(), "units": units}


TRAINING_NOTE = (
    "train on these rows with packtool.torch.collate as the data collator, or TRL's "
    "SFTConfig(padding_free=True, max_length=None) with its own collator; TRL's default "
    "collator and DataCollatorWithFlattening let the packed examples attend to each other, "
    "silently (the output's README.md; check a model with `packtool check-model`)"
)
"""The line under an instruction-data pack's summary (docs/trl.md)."""


def show_pack(report: Any, *, quiet: bool, as_json: bool) -> None:
    """What ``pack`` shows of its :class:`~packtool.pipeline.PackReport`."""
    say_skipped(report.skipped_files, quiet)
    if as_json:
        summary = report.manifest.summary()
        summary["notices"] = notices(report)
        summary["tokenizer_backend"] = report.backend
        if report.manifest.mixture is not None:
            summary["mixture"] = report.manifest.mixture.to_record()
        print(json.dumps({"out_dir": str(report.out_dir), **summary}, indent=2))
        return
    print_notices(report, quiet=quiet)
    if quiet:
        return
    if report.resumed:
        say("from the checkpoint of an interrupted run", label="[green]resumed[/]", err=True)
    stdout().print(summary_table(report))
    mixture = report.manifest.mixture
    if mixture is not None:
        stdout().print(mixture_table(mixture))
    if report.tokens_learned is not None:
        note("[yellow]training:[/]", TRAINING_NOTE)
    say_bad_records(report.bad_records, report.documents.bad_records_skipped)


def mixture_table(mixture: Any) -> Table:
    """What a mixture (``--mix``) took of each source: the rows' documents are these, not
    all those read (the summary's document counts)."""
    from rich.table import Table

    table = Table(title="Sources taken (--mix)", title_justify="left", box=None, padding=(0, 1))
    table.add_column("#", justify="right")
    table.add_column("source", overflow="fold")
    for name in ("weight", "tokens taken", "target", "documents taken", "of read", "epochs"):
        table.add_column(name, justify="right", no_wrap=True)
    for s in mixture.sources:
        table.add_row(
            str(s.index),
            clean(s.path),
            f"{s.weight:g}",
            f"{s.tokens_taken:,}",
            f"{s.target_tokens:,}",
            f"{s.documents_taken:,}",
            f"{s.documents_read:,}",
            f"{s.epochs:.2f}",
        )
    return table


def say_bad_records(lines: list[str], skipped: int | None = None) -> None:
    """The first bad records skipped (``skipped``: how many in all, to say how many more)."""
    for line in lines[:5]:
        note("[yellow]skipped:[/]", line)
    more = 0 if skipped is None else skipped - min(5, len(lines))
    if more > 0:
        note("[yellow]skipped:[/]", f"... and {more:,} more bad records")


def show_units(report: Any, *, quiet: bool, as_json: bool) -> None:
    """What ``pack --units`` shows of its :class:`~packtool.engines.UnitsReport`: one unit's
    line (``--unit I``), or the units' table and the merged output's summary."""
    say_skipped(report.skipped_files, quiet)
    if report.merged is None:  # one unit (--unit I)
        (result,) = report.units
        if as_json:
            print(json.dumps({"out_dir": str(report.out_dir), **result.to_dict()}, indent=2))
        elif not quiet:
            what = "already finished, skipped" if result.skipped else "packed"
            say(
                f"{result.name}: {what}: {result.documents:,} documents, {result.rows:,} rows "
                f"-> {report.out_dir / 'units' / result.name}"
            )
        return
    if as_json:
        data = merged_json(report.merged)
        data["engine"] = report.engine
        data["driver"] = {"pid": report.driver_pid, "host": report.driver_host}
        data["units_run"] = [u.to_dict() for u in report.units]
        print(json.dumps(data, indent=2))
        return
    if not quiet:
        if report.units:
            stdout().print(units_table(report))
        else:
            say(f"{report.out_dir}: already packed and merged with these options")
        print_notices(report.merged, quiet=quiet)
        stdout().print(summary_table(report.merged))
        say(units_line(report.merged.manifest))


def show_merge(report: Any, *, quiet: bool, as_json: bool) -> None:
    """What ``merge`` shows of its report."""
    if as_json:
        print(json.dumps(merged_json(report), indent=2))
    elif not quiet:
        stdout().print(summary_table(report, tokenized=False))
        say(units_line(report.manifest))
