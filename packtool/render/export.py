"""The report of ``export``: what was written, and how to train on it."""

from __future__ import annotations

import json
from typing import Any

from .console import clean, note, say, stdout


def show_export(report: Any, *, quiet: bool, as_json: bool) -> None:
    """What ``export`` shows of its :class:`~packtool.export.ExportReport`; its notices
    always (on stderr)."""
    for notice in report.notices:
        note("[yellow]note:[/]", notice)
    if as_json:
        print(json.dumps(report.record, indent=2))
        return
    if quiet:
        return
    from rich.table import Table

    record = report.record
    title = clean(f"exported ({report.to}): {report.path}")
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    for key in ("documents", "rows", "sequences", "tokens", "learned_tokens"):
        if key in record:
            table.add_row(key, f"{record[key]:,}")
    for name, info in record["files"].items():
        table.add_row(clean(name), f"{info['bytes']:,} bytes")
    table.add_row("time", f"{report.seconds:.1f} s")
    stdout().print(table)
    if "data_path" in record:
        say(f"train with --data-path {report.path / record['data_path']}")
