"""The result of ``check-model``: the differences per document kind, and the verdict."""

from __future__ import annotations

import json
from typing import Any

from .console import plain, say, stdout


def show_check_model(result: Any, *, as_json: bool) -> None:
    """What ``check-model`` shows of its :class:`~packtool.check_model.ModelCheck`."""
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
        return
    from rich.table import Table

    weights = "random weights from its config (seeded)" if result.from_config else "its weights"
    title = (
        f"{result.model} ({weights}), {result.rows} rows fed as --feed {result.feed}, "
        f"{result.attn_implementation} on {result.device}"
    )
    table = Table(title=plain(title), title_justify="left")
    table.add_column("documents")
    table.add_column("count", justify="right")
    table.add_column("max |logit difference|, packed vs alone", justify="right")
    for kind, count in result.documents.items():
        table.add_row(kind, f"{count:,}", f"{result.max_diff[kind]:.2g}")
    stdout().print(table)
    if result.advice is None:
        say(
            f"verdict: exact (every difference <= 1e-4): --feed {result.feed} keeps the "
            "documents apart"
        )
    else:
        say("verdict: LEAK")
        say(result.advice, label="[bold red]leak:[/]", err=True)
