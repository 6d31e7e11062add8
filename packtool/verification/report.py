"""What ``verify`` reports: the problems it found (all counted, the first kept) and the
figures of what it checked."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._fields import attributes
from ..fs import AnyPath

__all__ = ["AgainstReport", "Problem", "Problems", "VerifyProgress", "VerifyReport", "int_or_none"]

VerifyProgress = Callable[[str, int, "int | None"], None]
"""Called as ``progress(stage, completed, total)``; stages: ``hash`` (bytes of shards),
``rows`` (rows checked), ``against`` (bytes of inputs re-read)."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong: where (shard file, global row; ``None`` when not about one) and what.

    ``check`` names the kind of check that failed (``sha256``, ``position_ids``,
    ``coverage``, ``against``...), so that problems can be counted by kind.
    """

    shard: str | None
    row: int | None
    what: str
    check: str = ""

    def __str__(self) -> str:
        where = ", ".join(
            part for part in (self.shard, None if self.row is None else f"row {self.row}") if part
        )
        return f"{where}: {self.what}" if where else self.what


@dataclass
class AgainstReport:
    """What ``verify(..., against=...)`` re-read: inputs, documents, and their outcomes."""

    inputs: list[str]
    documents: dict[str, int]  # read, packed, split, truncated, dropped, empty, bad_records_skipped
    tokens: dict[str, int]  # packed, truncated_away, dropped
    documents_compared: int  # documents whose digests were compared with the rows'
    seconds: float = 0.0


@dataclass
class VerifyReport:
    """The outcome of :func:`verify`. ``ok`` when no problem was found."""

    path: AnyPath
    shards_checked: int = 0
    rows_checked: int = 0
    segments: int = 0
    documents: int | None = None  # distinct documents in the rows (None: not counted)
    tokens: int = 0  # real tokens in the rows
    bytes_hashed: int = 0
    problems: list[Problem] = field(default_factory=list)  # the first max_problems
    problems_total: int = 0
    problem_counts: dict[str, int] = field(default_factory=dict)  # by check
    notes: list[str] = field(default_factory=list)  # what could not be checked, and why
    warnings: list[str] = field(default_factory=list)  # not damage, but worth knowing
    against: AgainstReport | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.problems_total == 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (the CLI's ``--json``)."""
        return {
            "path": str(self.path),
            "ok": self.ok,
            **attributes(
                self,
                "shards_checked rows_checked segments documents tokens bytes_hashed "
                "problems_total problem_counts",
            ),
            "problems": [
                {"shard": p.shard, "row": p.row, "check": p.check, "what": p.what}
                for p in self.problems
            ],
            "notes": self.notes,
            "warnings": self.warnings,
            "against": None
            if self.against is None
            else {
                **attributes(self.against, "inputs documents tokens documents_compared"),
                "seconds": round(self.against.seconds, 3),
            },
            "seconds": round(self.seconds, 3),
        }


class Problems:
    """Collects problems: all are counted, the first ``limit`` are kept."""

    def __init__(self, report: VerifyReport, limit: int) -> None:
        self.report = report
        self.limit = limit
        self.counts: Counter[str] = Counter()
        self.shard_of: Callable[[int], str | None] = lambda row: None

    def add(self, check: str, what: str, shard: str | None = None, row: int | None = None):
        self.count(check, 1)
        self.keep(check, what, shard, row)

    def keep(self, check: str, what: str, shard: str | None, row: int | None) -> None:
        """Keep (not count) a problem; a row-located one gets its shard's name."""
        if len(self.report.problems) < self.limit:
            if shard is None and row is not None:
                shard = self.shard_of(row)
            self.report.problems.append(Problem(shard, row, what, check))

    def count(self, check: str, n: int) -> None:
        if n:  # a check that found nothing is not listed (problem_counts of a clean run: {})
            self.counts[check] += n
            self.report.problems_total += n

    def room(self) -> int:
        return max(0, self.limit - len(self.report.problems))

    def rows(
        self,
        check: str,
        bad: np.ndarray,
        shard: str,
        row0: int,
        describe: Callable[[int], str],
    ) -> None:
        """Count the rows flagged in ``bad`` (a block's boolean mask) and name the first."""
        n = int(np.count_nonzero(bad))
        if not n:
            return
        self.count(check, n)
        for i in np.flatnonzero(bad)[: self.room()]:
            i = int(i)
            self.report.problems.append(Problem(shard, row0 + i, describe(i), check))


def int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def first_difference(
    what: str, ours: np.ndarray, where: str, theirs: np.ndarray, how: str
) -> str | None:
    """The first place two equal-length arrays differ, as a problem's words ("token 3 is 7 in
    the rows, 9 after re-tokenizing (2 of 40 tokens differ)"); None where they are equal."""
    diff = np.flatnonzero(ours != theirs)
    if not diff.size:
        return None
    j = int(diff[0])
    return (
        f"{what} {j} is {int(ours[j])} in {where}, {int(theirs[j])} {how} "
        f"({diff.size} of {theirs.size} {what}s differ)"
    )
