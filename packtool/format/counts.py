"""What a run counted: the documents read and what became of them, the tokens, and the
figures a pack or a merge records in its manifest (:meth:`Manifest.for_pack`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import NothingToPackError

__all__ = ["DocumentCounts", "RunFigures", "TokenCounts"]


@dataclass
class DocumentCounts:
    """What happened to every document read; ``read`` is the sum of the others."""

    read: int = 0
    packed: int = 0  # whole, as one segment
    split: int = 0  # into several chunks, each a segment
    truncated: int = 0
    dropped: int = 0  # longer than max_len under --overflow drop
    empty: int = 0  # no tokens
    bad_records_skipped: int = 0

    @staticmethod
    def total(parts: Iterable[DocumentCounts]) -> DocumentCounts:
        """The counts of several parts of one corpus (work units), summed."""
        out = DocumentCounts()
        for part in parts:
            for f in fields(DocumentCounts):
                setattr(out, f.name, getattr(out, f.name) + getattr(part, f.name))
        return out

    def check(self) -> None:
        accounted = (
            self.packed
            + self.split
            + self.truncated
            + self.dropped
            + self.empty
            + self.bad_records_skipped
        )
        if accounted != self.read:  # pragma: no cover - a bug, never a user error
            raise AssertionError(f"documents read {self.read} != accounted {accounted}: {self}")

    def nothing_to_pack(
        self,
        paths: Sequence[Path | str],
        without_labels: int = 0,
        bad_records: Sequence[str] = (),
    ) -> NothingToPackError:
        """The error for inputs that give no segment to pack, saying what became of what was
        read (``without_labels``: examples with nothing to learn, counted as empty too), and
        the first of the ``bad_records`` skipped, which often says why."""
        where = str(paths[0]) if len(paths) == 1 else f"{len(paths):,} inputs ({paths[0]}, ...)"
        if not self.read:
            return NothingToPackError(f"no documents in {where}: nothing to pack")
        why = [
            (self.empty - without_labels, "empty (no tokens)"),
            (without_labels, "with nothing to learn"),
            (self.dropped, "longer than --max-len, dropped (--overflow drop)"),
            (self.bad_records_skipped, "bad and skipped"),
        ]
        told = ", ".join(f"{n:,} {what}" for n, what in why if n)
        first = f" (the first bad record: {bad_records[0]})" if bad_records else ""
        return NothingToPackError(
            f"no documents to pack in {where}: of {self.read:,} read, "
            f"{told or 'none has tokens'}{first}"
        )


@dataclass(frozen=True)
class TokenCounts:
    """Tokens of the documents read: packed into rows, cut away, dropped, learned (labels)."""

    packed: int = 0
    truncated_away: int = 0
    dropped: int = 0
    learned: int | None = None

    @staticmethod
    def total(parts: Iterable[TokenCounts]) -> TokenCounts:
        """The counts of several parts of one corpus, summed (``learned``: None if none has)."""
        parts = list(parts)
        learned = [p.learned for p in parts if p.learned is not None]
        return TokenCounts(
            packed=sum(p.packed for p in parts),
            truncated_away=sum(p.truncated_away for p in parts),
            dropped=sum(p.dropped for p in parts),
            learned=sum(learned) if learned else None,
        )


@dataclass(frozen=True)
class RunFigures:
    """What a pack (or a merge) counted: the figures of its manifest."""

    documents: DocumentCounts
    segments: int
    tokens: TokenCounts
    rows: int
    lower_bound_rows: int
    max_len: int
    bad_records: list[Any]
    special_strings: int  # documents that held special-token strings
    parse_special: bool
    seconds: float
    segment_lengths: np.ndarray | None = None  # every segment's length (any order)
