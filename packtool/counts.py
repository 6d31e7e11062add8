"""What a run counts of its documents: one additive record, :class:`Counts`, from the cut to
the report.

The cut (:func:`packtool.packing.cut_items`) returns the :class:`Counts` of one batch; the
pipeline sums them (``+``) over the batches, ``stats`` and ``verify --against`` likewise,
work units over their parts; the manifest records them in its sections ``documents``,
``tokens`` (and, with labels, ``labels``) under the same names, and the reports read them
back from it (:attr:`packtool.format.Manifest.counts`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from .errors import NothingToPackError

__all__ = ["Counts", "DocumentCounts", "LabelFigures", "TokenCounts"]

_T = TypeVar("_T", bound="_Additive")


def _plus(a: Any, b: Any) -> Any:
    """``a + b``, where ``None`` is "not counted" (``None + x`` is ``x``)."""
    if a is None:
        return b
    return a if b is None else a + b


class _Additive:
    """A frozen record of counts that adds up field by field (``None``: not counted)."""

    def __add__(self: _T, other: _T) -> _T:
        return type(self)(  # type: ignore[call-arg]
            **{f.name: _plus(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)}  # type: ignore[arg-type]
        )

    @classmethod
    def total(cls: type[_T], parts: Iterable[_T]) -> _T:
        """The counts of several parts of one corpus (batches, work units), summed."""
        return sum(parts, cls())  # type: ignore[call-arg]


@dataclass(frozen=True)
class DocumentCounts(_Additive):
    """What happened to every document read (the manifest's ``documents``); ``read`` is the
    sum of the others."""

    read: int = 0
    packed: int = 0  # whole, as one segment
    split: int = 0  # into several chunks, each a segment
    truncated: int = 0
    dropped: int = 0  # longer than max_len under --overflow drop
    empty: int = 0  # no tokens (with labels: nothing to learn, too)
    bad_records_skipped: int = 0

    @property
    def accounted(self) -> int:
        """The documents whose outcome is counted: what ``read`` should be."""
        return sum(getattr(self, f.name) for f in fields(self) if f.name != "read")

    @property
    def in_rows(self) -> int:
        """Documents with at least one segment in the rows."""
        return self.packed + self.split + self.truncated

    def check(self) -> None:
        if self.accounted != self.read:  # pragma: no cover - a bug, never a user error
            raise AssertionError(f"documents read {self.read} != accounted {self.accounted}")

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
class TokenCounts(_Additive):
    """Tokens of the documents read (the manifest's ``tokens``): packed into rows, cut away
    by ``truncate``, dropped, and learned (labels; ``None`` without labels)."""

    packed: int = 0
    truncated_away: int = 0
    dropped: int = 0
    learned: int | None = None

    def to_record(self) -> dict[str, int]:
        """The manifest's ``tokens`` section (``learned`` only with labels)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class LabelFigures(_Additive):
    """What had nothing to learn (the counts of the manifest's ``labels`` section)."""

    documents_without_labels: int = 0  # counted as empty documents too
    chunks_without_labels_dropped: int = 0  # under split: they leave gaps in chunk_ids
    tokens_in_chunks_without_labels: int = 0


@dataclass(frozen=True)
class Counts(_Additive):
    """Every figure a run counts of its documents, one name each, as the manifest names
    them: ``documents``, ``tokens`` and, for documents with labels, ``labels``."""

    documents: DocumentCounts = field(default_factory=DocumentCounts)
    tokens: TokenCounts = field(default_factory=TokenCounts)
    labels: LabelFigures | None = None

    def to_record(self) -> dict[str, Any]:
        """The sections as JSON (a checkpoint; :meth:`from_record` reads it back)."""
        record: dict[str, Any] = {
            "documents": asdict(self.documents),
            "tokens": self.tokens.to_record(),
        }
        if self.labels is not None:
            record["labels"] = asdict(self.labels)
        return record

    @staticmethod
    def from_record(record: Mapping[str, Any]) -> Counts:
        labels = record.get("labels")
        return Counts(
            DocumentCounts(**record["documents"]),
            TokenCounts(**record["tokens"]),
            None if labels is None else LabelFigures(**labels),
        )

    def add_documents(self, read: int, bad_records_skipped: int) -> Counts:
        """These counts with ``read`` documents more, ``bad_records_skipped`` of them bad
        (what the readers count, before the cut counts the others)."""
        more = DocumentCounts(read=read, bad_records_skipped=bad_records_skipped)
        return Counts(self.documents + more, self.tokens, self.labels)
