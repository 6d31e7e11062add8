"""Typed views of the manifest's sub-records that other modules read: the inputs, the label
counts of instruction data, the chat template, a work unit's record, the record of a merge of
units and a mixture's sources. Each but the mixture tolerates a damaged record (a missing or
mistyped value reads as ``None``), as ``verify`` needs; a damaged mixture record is a
:class:`~packtool.errors.FormatError`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..errors import FormatError

__all__ = [
    "BackendRecord",
    "ChatTemplateRecord",
    "InputRecord",
    "LabelCounts",
    "MergedUnits",
    "MixtureRecord",
    "PieceRecord",
    "SourceRecord",
    "UnitRecord",
    "int_or_none",
]


def int_or_none(value: Any) -> int | None:
    """``value`` if it is an integer (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class InputRecord:
    """One entry of the manifest's ``inputs``: a file read, and the documents it gave."""

    path: str
    kind: str | None = None
    compression: str | None = None
    size_bytes: int | None = None
    first_doc: int | None = None  # the doc_id of its first document
    documents: int | None = None

    @staticmethod
    def from_record(record: Mapping[str, Any]) -> InputRecord:
        return InputRecord(
            path=str(record.get("path")),
            kind=_str_or_none(record.get("kind")),
            compression=_str_or_none(record.get("compression")),
            size_bytes=int_or_none(record.get("size_bytes")),
            first_doc=int_or_none(record.get("first_doc")),
            documents=int_or_none(record.get("documents")),
        )

    def to_record(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "compression": self.compression,
            "size_bytes": self.size_bytes,
            "first_doc": self.first_doc,
            "documents": self.documents,
        }


@dataclass(frozen=True)
class PieceRecord:
    """One piece of a work unit as its ``unit`` record lists it (``readers.Piece.describe``)."""

    path: str
    kind: str | None
    compression: str | None
    file_size: int | None
    split_by: str | None  # "file", "bytes", "row_groups", ...
    start: int | None
    stop: int | None

    @property
    def continues(self) -> bool:
        """Whether this piece is a range after the start of its file (not its first)."""
        return self.split_by != "file" and self.start != 0

    @staticmethod
    def from_record(record: Mapping[str, Any]) -> PieceRecord:
        return PieceRecord(
            path=str(record.get("path")),
            kind=_str_or_none(record.get("kind")),
            compression=_str_or_none(record.get("compression")),
            file_size=int_or_none(record.get("file_size")),
            split_by=_str_or_none(record.get("split_by")),
            start=int_or_none(record.get("start")),
            stop=int_or_none(record.get("stop")),
        )


@dataclass(frozen=True)
class UnitRecord:
    """The ``unit`` record of a work unit's output (``units.Unit.describe``, with the merge
    options ``run_unit`` adds)."""

    index: int | None
    count: int | None
    plan: str | None  # the sha256 of the whole plan: a unit of another plan differs
    plan_version: int | None
    inputs_sha256: str | None
    options: dict[str, Any]  # the unit's options, as the plan describes them
    input_shape_auto: bool | None  # None: not recorded
    pieces: tuple[PieceRecord, ...]
    piece_records: tuple[dict[str, Any], ...] = field(repr=False)  # as recorded, for a merge
    merge_options: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def from_record(record: Mapping[str, Any]) -> UnitRecord:
        pieces = [p for p in record.get("pieces") or [] if isinstance(p, Mapping)]
        shape_auto = record.get("input_shape_auto")
        options, merge_options = record.get("options"), record.get("merge_options")
        return UnitRecord(
            index=int_or_none(record.get("index")),
            count=int_or_none(record.get("count")),
            plan=_str_or_none(record.get("plan")),
            plan_version=int_or_none(record.get("plan_version")),
            inputs_sha256=_str_or_none(record.get("inputs_sha256")),
            options=dict(options) if isinstance(options, Mapping) else {},
            input_shape_auto=shape_auto if isinstance(shape_auto, bool) else None,
            pieces=tuple(PieceRecord.from_record(p) for p in pieces),
            piece_records=tuple(dict(p) for p in pieces),
            merge_options=dict(merge_options) if isinstance(merge_options, Mapping) else {},
        )


@dataclass(frozen=True)
class BackendRecord:
    """The engine that encoded the documents (``tokenizer.backend``: ``tokenize.Backend``)."""

    name: str | None  # "fastokens", "hf", or "none" (pre-tokenized: nothing encoded)
    version: str | None
    reason: str | None
    fallback_batches: int | None  # batches re-encoded with hf (the parity gate)

    @staticmethod
    def from_record(record: Mapping[str, Any]) -> BackendRecord:
        return BackendRecord(
            name=_str_or_none(record.get("name")),
            version=_str_or_none(record.get("version")),
            reason=_str_or_none(record.get("reason")),
            fallback_batches=int_or_none(record.get("fallback_batches")),
        )


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


@dataclass(frozen=True)
class SourceRecord:
    """One source: an INPUT argument of ``pack --mix`` and what the mixture took of it. Its
    documents are numbered ``first_doc .. first_doc + documents_read - 1``; ``segments of it
    carry ``index`` in ``source_ids``."""

    index: int
    path: str
    weight: float
    share: float  # the share its weight asks for
    files: int
    first_doc: int
    documents_read: int
    documents_packable: int  # with tokens after the overflow policy
    tokens_read: int
    target_tokens: int
    documents_taken: int  # copies counted
    tokens_taken: int
    epochs: float  # tokens taken over tokens read

    def holds(self, read_doc: Any) -> Any:
        """Whether the document(s) read as ``read_doc`` are this source's."""
        return (read_doc >= self.first_doc) & (read_doc < self.first_doc + self.documents_read)


@dataclass(frozen=True)
class MixtureRecord:
    """The manifest's ``mixture``: copy ``c`` of document ``d`` has the doc id
    ``d + c * doc_id_stride``; ``copies``: the most copies of one document."""

    doc_id_stride: int
    copies: int
    tokens: int
    repeat: bool
    sources: tuple[SourceRecord, ...]

    @classmethod
    def from_dict(cls, data: Any) -> MixtureRecord:
        try:
            sources = tuple(
                SourceRecord(**{f.name: s[f.name] for f in fields(SourceRecord)})
                for s in data["sources"]
            )
            return cls(
                doc_id_stride=int(data["doc_id_stride"]),
                copies=int(data["copies"]),
                tokens=int(data["tokens"]),
                repeat=bool(data["repeat"]),
                sources=sources,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise FormatError(f"the manifest's mixture record is malformed ({e!r})") from None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "sources": [asdict(s) for s in self.sources]}

    @property
    def documents_taken(self) -> int:
        return sum(s.documents_taken for s in self.sources)
