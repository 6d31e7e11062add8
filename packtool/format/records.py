"""Typed views of the manifest's sub-records that other modules read: the label counts of
instruction data and the record of a merge of work units. Each tolerates a damaged record
(a missing or mistyped value reads as ``None``), as ``verify`` needs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ChatTemplateRecord", "LabelCounts", "MergedUnits", "int_or_none"]


def int_or_none(value: Any) -> int | None:
    """``value`` if it is an integer (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class ChatTemplateRecord:
    """The chat template the chats were rendered with (``options.chat_template``)."""

    name: str | None
    source: str | None  # "file", "tokenizer_config.json", "chat_template.jinja" or "string"
    sha256: str | None

    @staticmethod
    def from_record(record: Mapping[str, Any]) -> ChatTemplateRecord:
        return ChatTemplateRecord(
            name=_str_or_none(record.get("name")),
            source=_str_or_none(record.get("source")),
            sha256=_str_or_none(record.get("sha256")),
        )


@dataclass(frozen=True)
class LabelCounts:
    """The ``labels`` record of instruction data: what was learned, what had nothing to."""

    loss_on: str | None
    learned_tokens: int | None
    documents_without_labels: int | None
    chunks_without_labels_dropped: int | None
    tokens_in_chunks_without_labels: int | None
    piece_encoding: str | None

    @staticmethod
    def from_record(record: Mapping[str, Any]) -> LabelCounts:
        return LabelCounts(
            loss_on=_str_or_none(record.get("loss_on")),
            learned_tokens=int_or_none(record.get("learned_tokens")),
            documents_without_labels=int_or_none(record.get("documents_without_labels")),
            chunks_without_labels_dropped=int_or_none(record.get("chunks_without_labels_dropped")),
            tokens_in_chunks_without_labels=int_or_none(
                record.get("tokens_in_chunks_without_labels")
            ),
            piece_encoding=_str_or_none(record.get("piece_encoding")),
        )


@dataclass(frozen=True)
class MergedUnits:
    """The ``units`` record of a dataset merged from work units (``packtool merge``)."""

    count: int | None
    plan: str | None
    units_sha256: str | None  # what names the units' rows as they were merged
    rows_over_global_ffd: int | None
    packing_loss: float | None  # rows over one global FFD, as a share of its rows
    copied: bool | None  # None: not recorded (merged by an older packtool)
    copy_reason: str | None

    @staticmethod
    def from_record(record: Mapping[str, Any]) -> MergedUnits:
        loss = record.get("packing_loss")
        copied = record.get("copied")
        return MergedUnits(
            count=int_or_none(record.get("count")),
            plan=_str_or_none(record.get("plan")),
            units_sha256=_str_or_none(record.get("units_sha256")),
            rows_over_global_ffd=int_or_none(record.get("rows_over_global_ffd")),
            packing_loss=float(loss) if isinstance(loss, (int, float)) else None,
            copied=copied if isinstance(copied, bool) else None,
            copy_reason=_str_or_none(record.get("copy_reason")),
        )
