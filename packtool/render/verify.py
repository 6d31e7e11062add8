"""The report of ``verify``: its table, notes and problems, and the check of an export."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .console import clean, say, stdout

if TYPE_CHECKING:
    from rich.table import Table


def verify_table(report: Any) -> Table:
    title = clean(f"{'verified' if report.ok else 'FAILED'}: {report.path}")
    from rich.table import Table

    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("shards (bytes, sha256, rows)", f"{report.shards_checked:,}")
    table.add_row("rows", f"{report.rows_checked:,}")
    table.add_row("document segments", f"{report.segments:,}")
    documents = "not counted" if report.documents is None else f"{report.documents:,}"
    table.add_row("documents in rows", documents)
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


def show_verify(report: Any, export_check: Any, *, quiet: bool, as_json: bool) -> None:
    """What ``verify`` shows of its :class:`~packtool.verification.VerifyReport` and of the check
    of an export (``export_check``, or ``None``)."""
    if as_json:
        summary = report.to_dict()
        if export_check is not None:
            summary["export"] = {
                "path": str(export_check.path),
                "to": export_check.to,
                "ok": export_check.ok,
                "problems": export_check.problems,
            }
        print(json.dumps(summary, indent=2))
        return
    if quiet:
        return
    stdout().print(verify_table(report))
    for note in report.notes:
        say(note, label="[dim]note:[/]")
    for warning in report.warnings:
        say(warning, label="[yellow]warning:[/]")
    for problem in report.problems:
        say(problem, label="[red]problem:[/]")
    hidden = report.problems_total - len(report.problems)
    if hidden > 0:
        counts = ", ".join(f"{k} {v:,}" for k, v in sorted(report.problem_counts.items()))
        say(f"... and {hidden:,} more problems (by check: {counts})")
    if export_check is not None:
        state = "verified" if export_check.ok else "FAILED"
        say(f"export ({export_check.to}) {state}: {export_check.path}")
        for problem in export_check.problems:
            say(problem, label="[red]problem:[/]")
