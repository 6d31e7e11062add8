"""The manifest of a packed dataset (``manifest.json``): the one place that knows its keys.

:class:`Manifest` reads a record through typed accessors, and builds one
(:meth:`Manifest.for_pack`, :meth:`Manifest.committed`); :func:`read_manifest` loads one and
checks it before any row is read. ``docs/format.md`` lists the keys for people.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError
from ..fs import StorePath, as_path
from .counts import Counts, DocumentCounts, LabelFigures, RunFigures, TokenCounts
from .records import (
    BackendRecord,
    ChatTemplateRecord,
    InputRecord,
    LabelCounts,
    MergedUnits,
    UnitRecord,
    int_or_none,
)

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "Manifest",
    "ShardEntry",
    "is_count",
    "read_manifest",
    "shard_entry_problem",
]

FORMAT_NAME = "packtool.packed"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"


@dataclass(frozen=True)
class ShardEntry:
    """One shard as the manifest lists it."""

    file: str
    rows: int
    bytes: int | None = None
    sha256: str | None = None
    doc_offset: int = 0  # added to the shard's doc_ids (a unit's shard, listed by a merge)

    @property
    def referenced(self) -> bool:
        """A unit's shard, listed where the unit wrote it (a merge without copying)."""
        return "/" in self.file

    def to_record(self) -> dict[str, Any]:
        """The entry as the manifest's ``shards`` list holds it (``doc_offset`` for a
        referenced shard, or one that has an offset)."""
        record: dict[str, Any] = {"file": self.file, "rows": self.rows}
        if self.bytes is not None:
            record["bytes"] = self.bytes
        if self.sha256 is not None:
            record["sha256"] = self.sha256
        if self.referenced or self.doc_offset:
            record["doc_offset"] = self.doc_offset
        return record

    @staticmethod
    def from_record(record: Mapping[str, Any]) -> ShardEntry:
        return ShardEntry(
            record["file"],
            int(record["rows"]),
            record.get("bytes"),
            record.get("sha256"),
            record.get("doc_offset", 0),
        )


_HISTOGRAM_MAX_VALUES = 1 << 16  # distinct lengths; beyond, the record is left out


def _length_histogram(lengths: np.ndarray | None) -> dict[str, list[int]] | None:
    """The segment lengths as a histogram (``values``, ``counts``): what a merge of work units
    needs to count the global FFD rows without reading the units' shards."""
    if lengths is None:
        return None
    lengths = np.asarray(lengths)
    if lengths.size and int(lengths.min()) >= 0 and int(lengths.max()) < (1 << 22):
        every = np.bincount(lengths)  # one pass, no sort: 20M segments in about 0.1 s
        values = np.flatnonzero(every)
        counts = every[values]
    else:
        values, counts = np.unique(lengths.astype(np.int64), return_counts=True)
    if values.size > _HISTOGRAM_MAX_VALUES:
        return None
    return {"values": values.tolist(), "counts": counts.tolist()}


def _section(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


_DOCUMENT_PARTS = ("packed", "split", "truncated", "dropped", "empty", "bad_records_skipped")
_LABEL_COUNTS = (
    "learned_tokens",
    "documents_without_labels",
    "chunks_without_labels_dropped",
    "tokens_in_chunks_without_labels",
)


class Manifest(Mapping[str, Any]):
    """The manifest of a packed dataset (``manifest.json``), with typed accessors.

    This class (with the typed records of :mod:`.records` it gives) is the only code that
    reads the manifest's keys: other modules use its properties (``tests/test_architecture``
    fails on a key read elsewhere); writers build one with :meth:`for_pack`, and
    :meth:`committed` adds the layout. It is also a read-only mapping of the JSON record, so
    ``manifest["num_rows"]`` keeps working for users who read it as a dict.
    """

    def __init__(self, data: Mapping[str, Any], path: Path | None = None) -> None:
        self._data: dict[str, Any] = dict(data)
        self.path = path

    # -- the Mapping protocol (a read-only view of the JSON record)
    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Manifest({self.path or ''!s}, {self.num_rows} rows)"

    def to_dict(self) -> dict[str, Any]:
        """The JSON record (a copy safe to change)."""
        return json.loads(json.dumps(self._data))

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Manifest:
        """The checked manifest of the packed dataset in ``directory`` (:func:`read_manifest`)."""
        return read_manifest(directory)

    @classmethod
    def for_pack(
        cls,
        *,
        version: str,
        tokenizer: Mapping[str, Any],
        options: Mapping[str, Any],
        inputs: list[dict[str, Any]],
        figures: RunFigures,
        balance: Mapping[str, Any] | None = None,
        labels: Mapping[str, Any] | None = None,
        global_ffd_rows: int | None = None,
        units: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Manifest:
        """The body of a pack's manifest (a merge's: with ``global_ffd_rows`` and ``units``);
        :meth:`ShardWriter.commit` adds the layout."""
        f = figures
        tokens, rows = f.counts.tokens, f.rows
        data: dict[str, Any] = {
            "packtool_version": version,
            "created_unix": int(time.time()),
            "tokenizer": dict(tokenizer),
            "options": dict(options),
            "inputs": inputs,
            "documents": asdict(f.counts.documents),
            "segments": f.segments,
            "tokens": tokens.to_record(),
            "rows": rows,
            "lower_bound_rows": f.lower_bound_rows,
            "rows_over_lower_bound": rows - f.lower_bound_rows,
            "efficiency": tokens.packed / (rows * f.max_len) if rows else 0.0,
            "bad_records": f.bad_records,
            "special_strings": {"documents": f.special_strings, "parsed": f.parse_special},
            "seconds": round(f.seconds, 3),
            **(extra or {}),
        }
        histogram = _length_histogram(f.segment_lengths)
        if histogram is not None:
            data["segment_lengths"] = histogram
        if global_ffd_rows is not None:
            data["global_ffd_rows"] = global_ffd_rows
        if units is not None:
            data["units"] = dict(units)
        if balance is not None:
            data["balance"] = dict(balance)
        if labels is not None:
            data["labels"] = dict(labels)
        return cls(data)

    @staticmethod
    def summed_labels(manifests: Sequence[Manifest]) -> dict[str, Any] | None:
        """The ``labels`` record of several parts of one corpus (work units): their counts
        summed, the rest as the first records it (the same options, so the same for all)."""
        records = [m.labels for m in manifests]
        if not records or not records[0]:
            return None
        out = dict(records[0])
        for key in _LABEL_COUNTS:
            if key in out:
                out[key] = sum(int(r.get(key, 0)) for r in records)
        return out

    def summary(self) -> dict[str, Any]:
        """The record's counts and figures (for ``--json`` output): documents, tokens, rows..."""
        keys = (
            "documents",
            "segments",
            "tokens",
            "rows",
            "lower_bound_rows",
            "rows_over_lower_bound",
            "efficiency",
            "global_ffd_rows",
            "bad_records",
            "special_strings",
            "seconds",
            "labels",
        )
        out = {k: self._data[k] for k in keys if k in self._data}
        tokenizer = _section(self._data.get("tokenizer"))
        if "eos_appended" in tokenizer:  # {"token", "id"} of the EOS after every document
            out["eos_appended"] = tokenizer["eos_appended"]
        return out

    @classmethod
    def committed(
        cls,
        body: Mapping[str, Any],
        *,
        max_len: int,
        columns: Sequence[str],
        shards: Sequence[ShardEntry],
        path: Path | None = None,
    ) -> Manifest:
        """The manifest of a finished dataset: ``body`` (:meth:`for_pack`) and the layout,
        the shards in row order (what :meth:`ShardWriter.commit` writes last)."""
        return cls(
            {
                "format": FORMAT_NAME,
                "format_version": FORMAT_VERSION,
                **body,
                "max_len": max_len,
                "columns": list(columns),
                "num_rows": sum(int(s.rows) for s in shards),
                "shards": [s.to_record() for s in shards],
            },
            path,
        )

    def with_seconds(self, seconds: float) -> Manifest:
        """A copy that records ``seconds`` as the run's time."""
        return Manifest({**self._data, "seconds": round(seconds, 3)}, self.path)

    def problems(self) -> list[str]:
        """The record's own arithmetic: what in its counts does not agree with the rest."""
        found: list[str] = []
        max_len = self.max_len
        documents = self.documents_recorded
        if documents is None:
            found.append("'documents' does not hold every count (read, packed, split, ...)")
        else:
            accounted = sum(getattr(documents, k) for k in _DOCUMENT_PARTS)
            if accounted != documents.read:
                found.append(
                    f"documents.read is {documents.read}, but its parts add up to {accounted}"
                )
        rows = self.rows_recorded
        shard_rows = sum(s.rows for s in self.shards)
        if rows is None:
            found.append("no 'rows' count")
        elif rows != shard_rows:
            found.append(f"rows is {rows}, but the shards listed hold {shard_rows}")
        num_rows = self._data.get("num_rows")
        if num_rows is not None and num_rows != rows:
            found.append(f"num_rows is {num_rows!r}, rows is {rows!r}")
        packed = self.tokens_recorded.get("packed")
        if packed is None:
            found.append("no 'tokens.packed' count")
        else:
            lower = -(-packed // max_len)
            if self._data.get("lower_bound_rows") != lower:
                found.append(
                    f"lower_bound_rows is {self._data.get('lower_bound_rows')!r}, "
                    f"but ceil(tokens.packed / max_len) is {lower}"
                )
            if rows is not None and packed > rows * max_len:
                found.append(f"tokens.packed {packed} do not fit in {rows} rows of {max_len}")
        if self.options.get("max_len") not in (None, max_len):
            found.append(f"options.max_len is {self.options['max_len']!r}, max_len is {max_len}")
        inputs = self._data.get("inputs")
        if isinstance(inputs, list) and documents is not None:
            expected_first = 0
            for i, inp in enumerate(inputs):
                first = int_or_none(_section(inp).get("first_doc"))
                count = int_or_none(_section(inp).get("documents"))
                if first != expected_first or count is None:
                    found.append(f"inputs[{i}]: first_doc {first!r} should be {expected_first}")
                    break
                expected_first += count
            else:
                if expected_first != documents.read:
                    found.append(
                        f"the inputs hold {expected_first} documents, documents.read is "
                        f"{documents.read}"
                    )
        return found

    def locate_document(self, doc: int) -> str:
        """Where document ``doc`` was read: ``FILE record N``, from the ``inputs`` record."""
        for inp in self._data.get("inputs") or []:
            inp = _section(inp)
            first = int_or_none(inp.get("first_doc"))
            count = int_or_none(inp.get("documents"))
            if first is not None and count is not None and first <= doc < first + count:
                return f"{Path(str(inp.get('path'))).name} record {doc - first}"
        return "not in any input the manifest lists"

    # -- what verify reads from a record that may be damaged: None where a count is missing
    @property
    def documents_recorded(self) -> DocumentCounts | None:
        """The document counts, or None unless every count is recorded as an integer."""
        docs = _section(self._data.get("documents"))
        values = {k: int_or_none(docs.get(k)) for k in ("read", *_DOCUMENT_PARTS)}
        if any(v is None for v in values.values()):
            return None
        return DocumentCounts(**values)  # type: ignore[arg-type]

    @property
    def document_counts_recorded(self) -> dict[str, Any]:
        """The ``documents`` record as written (any value; for comparisons)."""
        return dict(_section(self._data.get("documents")))

    @property
    def tokens_recorded(self) -> dict[str, int]:
        """The token counts recorded as integers (packed, truncated_away, dropped, learned)."""
        toks = _section(self._data.get("tokens"))
        return {k: v for k, v in toks.items() if int_or_none(v) is not None}

    @property
    def packed_tokens_recorded(self) -> int | None:
        """``tokens.packed`` if recorded as an integer."""
        return self.tokens_recorded.get("packed")

    @property
    def documents_read_recorded(self) -> int | None:
        """``documents.read`` if recorded as an integer."""
        return int_or_none(self.document_counts_recorded.get("read"))

    @property
    def rows_recorded(self) -> int | None:
        return int_or_none(self._data.get("rows"))

    @property
    def input_paths(self) -> list[str]:
        return [str(_section(inp).get("path")) for inp in self._data.get("inputs") or []]

    @property
    def input_sizes(self) -> list[tuple[str, int | None]]:
        """(path, size in bytes) of each input as recorded."""
        return [
            (str(_section(inp).get("path")), _section(inp).get("size_bytes"))
            for inp in self._data.get("inputs") or []
        ]

    # -- the layout (written by ShardWriter.commit)
    @property
    def max_len(self) -> int:
        return int(self._data["max_len"])

    @property
    def columns(self) -> list[str]:
        return list(self._data.get("columns", []))

    @property
    def has_labels(self) -> bool:
        return "labels" in self.columns

    @property
    def has_seq_lengths(self) -> bool:
        """Whether the rows hold ``seq_lengths`` (packs written before it was added do not)."""
        return "seq_lengths" in self.columns

    @property
    def shards(self) -> list[ShardEntry]:
        return [ShardEntry.from_record(s) for s in self._data.get("shards", [])]

    @property
    def num_rows(self) -> int:
        return int(self._data.get("num_rows", self._data.get("rows", 0)))

    # -- what was packed
    @property
    def version(self) -> str | None:
        return self._data.get("packtool_version")

    @property
    def options(self) -> dict[str, Any]:
        """The options of the run, as :meth:`PackOptions.describe` (options.py) wrote them."""
        return dict(_section(self._data.get("options")))

    @property
    def shuffled(self) -> bool:
        """Whether the rows are stored in the seeded shuffle's order (``options.shuffle``)."""
        return self.options.get("shuffle") is True

    @property
    def row_seed(self) -> int | None:
        """The seed of the row shuffle (``options.seed``), or None if not shuffled."""
        return int_or_none(self.options.get("seed")) if self.shuffled else None

    @property
    def pad_id_option(self) -> int | None:
        """The id in the padding (``options.pad_id``), if recorded as an integer."""
        return int_or_none(self.options.get("pad_id"))

    @property
    def add_eos(self) -> bool:
        """Whether each document was given an EOS (``options.add_eos``)."""
        return self.options.get("add_eos") is True

    @property
    def add_bos(self) -> bool:
        """Whether each document was given a BOS (``options.bos``)."""
        return self.options.get("bos") is True

    @property
    def chat_template(self) -> ChatTemplateRecord | None:
        """The chat template the chats were rendered with, or None (not chats, or not
        recorded)."""
        value = self.options.get("chat_template")
        return ChatTemplateRecord.from_record(value) if isinstance(value, dict) else None

    @property
    def rows_per_shard(self) -> int | None:
        """The rows per shard the run was asked for (``options.rows_per_shard``)."""
        return int_or_none(self.options.get("rows_per_shard"))

    @property
    def input_records(self) -> list[InputRecord]:
        """The ``inputs``, typed: each file read and the documents it gave."""
        return [InputRecord.from_record(_section(i)) for i in self._data.get("inputs") or []]

    @property
    def inputs(self) -> list[dict[str, Any]]:
        return list(self._data.get("inputs", []))

    @property
    def documents(self) -> DocumentCounts:
        return DocumentCounts(**_section(self._data.get("documents")))

    @property
    def tokens(self) -> TokenCounts:
        t = _section(self._data.get("tokens"))
        return TokenCounts(
            packed=int(t.get("packed", 0)),
            truncated_away=int(t.get("truncated_away", 0)),
            dropped=int(t.get("dropped", 0)),
            learned=None if t.get("learned") is None else int(t["learned"]),
        )

    @property
    def counts(self) -> Counts:
        """What the run counted of its documents: ``documents``, ``tokens`` and (instruction
        data) the ``labels`` counts, as one record."""
        labels = self.label_counts
        figures = None
        if labels is not None:
            figures = LabelFigures(
                documents_without_labels=labels.documents_without_labels or 0,
                chunks_without_labels_dropped=labels.chunks_without_labels_dropped or 0,
                tokens_in_chunks_without_labels=labels.tokens_in_chunks_without_labels or 0,
            )
        return Counts(self.documents, self.tokens, figures)

    @property
    def segments(self) -> int | None:
        return int_or_none(self._data.get("segments"))

    @property
    def rows(self) -> int:
        return int(self._data.get("rows", self.num_rows))

    @property
    def lower_bound_rows(self) -> int:
        return int(self._data.get("lower_bound_rows", 0))

    @property
    def efficiency(self) -> float:
        return float(self._data.get("efficiency", 0.0))

    @property
    def seconds(self) -> float | None:
        return self._data.get("seconds")

    @property
    def bad_records(self) -> list[Any]:
        return list(self._data.get("bad_records", []))

    @property
    def special_strings(self) -> int:
        """Documents that held special-token strings (as text, unless ``parse_special``)."""
        return int(_section(self._data.get("special_strings")).get("documents", 0))

    @property
    def parse_special(self) -> bool:
        return bool(_section(self._data.get("special_strings")).get("parsed", False))

    @property
    def labels(self) -> dict[str, Any]:
        """The ``labels`` record of instruction data (empty for plain text)."""
        return dict(_section(self._data.get("labels")))

    @property
    def label_counts(self) -> LabelCounts | None:
        """The ``labels`` record, typed; None for plain text."""
        record = self._data.get("labels")
        return LabelCounts.from_record(record) if isinstance(record, dict) else None

    @property
    def dropped_label_chunks(self) -> int:
        """Chunks dropped for having nothing to learn (they leave gaps in ``chunk_ids``)."""
        counts = self.label_counts
        return (counts.chunks_without_labels_dropped or 0) if counts else 0

    @property
    def balance_world_size(self) -> int | None:
        """The ranks the rows are stored balanced for (``--world-size``), or None."""
        return int_or_none((self.balance or {}).get("world_size"))

    @property
    def balance_micro_batches(self) -> int | None:
        """The micro-batches per rank and step of a balanced layout, or None."""
        return int_or_none((self.balance or {}).get("micro_batches"))

    @property
    def balance(self) -> dict[str, Any] | None:
        value = self._data.get("balance")
        return dict(value) if isinstance(value, dict) else None

    # -- the tokenizer
    @property
    def tokenizer(self) -> dict[str, Any]:
        return dict(_section(self._data.get("tokenizer")))

    @property
    def tokenizer_sha256(self) -> str | None:
        return self.tokenizer.get("sha256")

    @property
    def tokenizer_file(self) -> str:
        return str(self.tokenizer.get("file", "tokenizer.json"))

    @property
    def tokenizer_name(self) -> str | None:
        return self.tokenizer.get("name")

    @property
    def tokenizer_copied(self) -> bool:
        """Whether the output holds a copy of the tokenizer file (not so for a tokenizer
        object without one, or pre-tokenized data packed without a tokenizer)."""
        return isinstance(self.tokenizer.get("file"), str)

    @property
    def vocab_size(self) -> int | None:
        return int_or_none(self.tokenizer.get("vocab_size"))

    @property
    def special_tokens(self) -> dict[str, Any]:
        return dict(_section(self.tokenizer.get("special_tokens")))

    @property
    def eos_appended(self) -> tuple[str | None, int] | None:
        """``(token, id)`` of the EOS appended to every document (``None``: none, or a
        manifest that does not say)."""
        value = self.tokenizer.get("eos_appended")
        if not isinstance(value, Mapping) or int_or_none(value.get("id")) is None:
            return None
        token = value.get("token")
        return (token if isinstance(token, str) else None), int(value["id"])

    @property
    def eos_id(self) -> int | None:
        """The EOS id as used (``tokenizer.special_tokens.eos_id``), if an integer."""
        return int_or_none(self.special_tokens.get("eos_id"))

    @property
    def bos_id(self) -> int | None:
        return int_or_none(self.special_tokens.get("bos_id"))

    @property
    def pad_id(self) -> int | None:
        """The id in the padding as the tokenizer record has it."""
        return int_or_none(self.special_tokens.get("pad_id"))

    @property
    def pad_from(self) -> str:
        return str(self.tokenizer.get("pad_from", "tokenizer"))

    @property
    def backend(self) -> Any:
        """The ``tokenizer.backend`` record as written (for reports)."""
        return self.tokenizer.get("backend")

    @property
    def backend_record(self) -> BackendRecord | None:
        """The engine that encoded the documents, typed; None if not recorded."""
        value = self.backend
        return BackendRecord.from_record(value) if isinstance(value, dict) else None

    @property
    def notices(self) -> list[str]:
        """What packtool turned off in the tokenizer file (truncation, padding), if anything."""
        return [n for n in (self.tokenizer.get("turned_off"),) if n]

    # -- work units (a unit's own output, or a merged dataset)
    @property
    def unit(self) -> dict[str, Any] | None:
        """A unit output's ``unit`` record (index, count, plan, pieces, merge_options)."""
        value = self._data.get("unit")
        return dict(value) if isinstance(value, dict) else None

    @property
    def unit_record(self) -> UnitRecord | None:
        """A unit output's ``unit`` record, typed; None for any other output."""
        value = self._data.get("unit")
        return UnitRecord.from_record(value) if isinstance(value, dict) else None

    @property
    def unit_plan(self) -> str | None:
        """The plan a unit output was packed under (its ``unit.plan``), else None."""
        record = self.unit_record
        return record.plan if record else None

    @property
    def unit_index(self) -> int | None:
        """A unit output's index in its plan (``unit.index``), else None."""
        record = self.unit_record
        return record.index if record else None

    @property
    def units(self) -> dict[str, Any] | None:
        """A merged dataset's ``units`` record (plan, per_unit, ...), else None."""
        value = self._data.get("units")
        return dict(value) if isinstance(value, dict) else None

    @property
    def merged_units(self) -> MergedUnits | None:
        """A merged dataset's ``units`` record, typed; None for any other output."""
        value = self._data.get("units")
        return MergedUnits.from_record(value) if isinstance(value, dict) else None

    def units_summary(self) -> dict[str, Any]:
        """The ``units`` record without its per-unit list (for ``--json`` output)."""
        return {k: v for k, v in (self.units or {}).items() if k != "per_unit"}

    @property
    def has_segment_lengths(self) -> bool:
        return "segment_lengths" in self._data

    @property
    def segment_lengths(self) -> np.ndarray | None:
        """Every segment's length (sorted), from the recorded histogram; None if there is none
        or it does not add up to the segments recorded."""
        h = _section(self._data.get("segment_lengths"))
        values, counts = h.get("values"), h.get("counts")
        if not isinstance(values, list) or not isinstance(counts, list):
            return None
        try:
            out = np.repeat(np.asarray(values, np.int64), np.asarray(counts, np.int64))
        except (TypeError, ValueError):
            return None
        return out if out.size == (self.segments or 0) else None

    @property
    def global_ffd_rows(self) -> int | None:
        return self._data.get("global_ffd_rows")


def read_manifest(path: str | os.PathLike[str] | StorePath) -> Manifest:
    """The manifest of the packed dataset at ``path``, checked for format and version."""
    path = as_path(path)
    if not path.is_dir():
        raise FormatError(f"{path}: no such directory")
    manifest_path = path / MANIFEST_FILE
    if not manifest_path.exists():
        raise FormatError(
            f"{path} is not a packtool output: it has no {MANIFEST_FILE} "
            "(an interrupted `packtool pack` never writes one)"
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"{manifest_path}: unreadable manifest: {e}") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise FormatError(f"{manifest_path}: not a packtool manifest (no format {FORMAT_NAME!r})")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise FormatError(
            f"{manifest_path}: format version {version!r} is not supported by this packtool "
            f"(it reads version {FORMAT_VERSION}); upgrade packtool or re-pack"
        )
    for key in ("max_len", "shards", "columns"):
        if key not in manifest:
            raise FormatError(f"{manifest_path}: manifest lacks {key!r}")
    problem = _manifest_problem(manifest)
    if problem:
        raise FormatError(f"{manifest_path}: {problem}")
    return Manifest(manifest, manifest_path)


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _manifest_problem(manifest: dict[str, Any]) -> str | None:
    """The first thing that makes ``manifest`` unusable for reading rows, or None.

    Shard files must be plain names inside the dataset directory: a manifest cannot make a
    reader open ``../../somewhere``.
    """
    max_len = manifest["max_len"]
    if not is_count(max_len) or max_len < 1:
        return f"'max_len' is {max_len!r}, not a positive integer"
    columns = manifest["columns"]
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        return "'columns' is not a list of column names"
    shards = manifest["shards"]
    if not isinstance(shards, list):
        return "'shards' is not a list"
    for i, shard in enumerate(shards):
        problem = shard_entry_problem(i, shard)
        if problem:
            return problem
    return None


def shard_entry_problem(i: int, shard: Any) -> str | None:
    """What is wrong with ``shards[i]`` of a manifest, or None.

    ``file`` is a path relative to the dataset directory, with ``/`` between its parts: a
    plain name (``data-00000-of-00002.arrow``), or one inside a sub-directory (a merge without
    copying lists ``units/unit-00003-of-00008/data-00000-of-00001.arrow``). No part is empty or
    starts with ``.``, so a manifest cannot make a reader open ``../../somewhere`` or ``/etc``.
    """
    if not isinstance(shard, dict):
        return f"shards[{i}] is not an object"
    name = shard.get("file")
    if (
        not isinstance(name, str)
        or not name
        or "\\" in name
        or ":" in name
        or any(not part or part.startswith(".") for part in name.split("/"))
    ):
        return f"shards[{i}].file is {name!r}, not a path inside the dataset directory"
    if not is_count(shard.get("rows")):
        return f"shards[{i}].rows is {shard.get('rows')!r}, not a row count"
    if not is_count(shard.get("doc_offset", 0)):
        return f"shards[{i}].doc_offset is {shard.get('doc_offset')!r}, not a document count"
    return None
