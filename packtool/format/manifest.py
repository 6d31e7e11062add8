"""The manifest of a packed dataset (``manifest.json``): the one place that knows its keys.

:class:`Manifest` is the record parsed once into typed fields (by the loader of
:mod:`.records`), and builds one (:meth:`Manifest.for_pack`, :meth:`Manifest.committed`);
:func:`read_manifest` loads one and checks it before any row is read. ``docs/format.md``
lists the keys for people.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..errors import FormatError
from ..fs import StorePath, as_path
from .counts import Counts, DocumentCounts, LabelFigures, RunFigures, TokenCounts
from .records import (
    BalanceRecord,
    Histogram,
    InputRecord,
    LabelCounts,
    MergedUnits,
    MixtureRecord,
    OptionsRecord,
    Problems,
    ShardEntry,
    SpecialStrings,
    TokenizerRecord,
    UnitRecord,
    is_count,
    key,
    load,
    local,
    raw,
    shard_entry_problem,
    to_record,
    whole,
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


def _holds(column: str, what: str) -> Any:
    """A property: whether the rows hold ``column``."""
    return property(lambda self: column in self.columns, doc=f"Whether the rows hold {what}.")


@dataclass(frozen=True, eq=False)  # equal as mappings (of the JSON record)
class Manifest(Mapping[str, Any]):
    """The manifest of a packed dataset (``manifest.json``), parsed once into typed records.

    This class (with the records of :mod:`.records`) is the only code that knows the
    manifest's keys: other modules read its fields (``tests/test_architecture`` fails on a key
    read elsewhere); writers build one with :meth:`for_pack`, and :meth:`committed` adds the
    layout. A field is None (or its default) where the record lacks the key; loaded leniently,
    also where it holds a malformed value, and :meth:`problems` says so. It is also a
    read-only mapping of the JSON record, so ``manifest["num_rows"]`` keeps working for users
    who read it as a dict.
    """

    # -- the layout (written by ShardWriter.commit)
    max_len: int = 0
    columns: list[str] = field(default_factory=list)
    shards: list[ShardEntry] = field(default_factory=list)
    num_rows: int | None = None
    # -- what was packed
    version: str | None = key("packtool_version", default=None)
    tokenizer: TokenizerRecord = field(default_factory=TokenizerRecord)
    options: dict[str, Any] = field(default_factory=dict)  # as PackOptions.describe wrote them
    recorded_options: OptionsRecord = key("options", default_factory=OptionsRecord)
    inputs: list[InputRecord] = field(default_factory=list)
    documents: DocumentCounts | None = None  # None unless every count is recorded
    segments: int | None = None
    tokens: TokenCounts | None = None  # None unless every count is recorded
    rows: int | None = None
    lower_bound_rows: int | None = None
    efficiency: float = 0.0
    bad_records: list[Any] = field(default_factory=list)
    special_strings: SpecialStrings = field(default_factory=SpecialStrings)
    seconds: float | None = None
    histogram: Histogram | None = key("segment_lengths", default=None)
    global_ffd_rows: int | None = None
    labels: LabelCounts | None = None  # instruction data only
    balance: BalanceRecord | None = None  # rows stored as balanced steps only
    unit: UnitRecord | None = None  # a work unit's output only
    units: MergedUnits | None = None  # a dataset merged from work units only
    mixture: MixtureRecord | None = None  # a mixture (pack --mix) only
    # a labelled pack that split documents: what its rows cannot give back (format.chunks)
    repack_files: list[ShardEntry] = field(default_factory=list)
    record: dict[str, Any] = raw()
    path: Path | None = local()
    load_problems: tuple[str, ...] = local(())

    @classmethod
    def from_record(
        cls, record: Mapping[str, Any], path: Path | None = None, *, strict: bool = True
    ) -> Manifest:
        """The manifest of the JSON ``record`` (strict: a malformed value raises
        :class:`FormatError`; lenient: it reads as None, and :meth:`problems` tells)."""
        problems = Problems(path or MANIFEST_FILE, strict)
        loaded = load(cls, record, problems)
        assert loaded is not None
        return replace(
            loaded,
            documents=loaded.documents if whole(DocumentCounts, record.get("documents")) else None,
            tokens=loaded.tokens if whole(TokenCounts, record.get("tokens")) else None,
            path=path,
            load_problems=tuple(problems.found),
        )

    # -- the Mapping protocol (a read-only view of the JSON record)
    def __getitem__(self, name: str) -> Any:
        return self.record[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.record)

    def __len__(self) -> int:
        return len(self.record)

    def __repr__(self) -> str:
        return f"Manifest({self.path or ''!s}, {self.num_rows} rows)"

    def to_dict(self) -> dict[str, Any]:
        """The JSON record (a copy safe to change)."""
        return json.loads(json.dumps(self.record))  # type: ignore[no-any-return]

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Manifest:
        """The checked manifest of the packed dataset in ``directory`` (:func:`read_manifest`)."""
        return read_manifest(directory)

    @classmethod
    def for_pack(
        cls,
        *,
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
        """The body of a pack's manifest, written by this packtool (a merge's: with
        ``global_ffd_rows`` and ``units``); :meth:`ShardWriter.commit` adds the layout."""
        f = figures
        tokens, rows = f.counts.tokens, f.rows
        data: dict[str, Any] = {
            "packtool_version": __version__,
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
        histogram = Histogram.of(f.segment_lengths)
        if histogram is not None:
            data["segment_lengths"] = histogram.to_record()
        if global_ffd_rows is not None:
            data["global_ffd_rows"] = global_ffd_rows
        if units is not None:
            data["units"] = dict(units)
        if balance is not None:
            data["balance"] = dict(balance)
        if labels is not None:
            data["labels"] = dict(labels)
        return cls.from_record(data)

    @staticmethod
    def summed_labels(manifests: Sequence[Manifest]) -> dict[str, Any] | None:
        """The ``labels`` record of several parts of one corpus (work units): their counts
        summed, the rest as the first records it (the same options, so the same for all)."""
        records = [m.labels or LabelCounts() for m in manifests]
        if not records or manifests[0].labels is None:
            return None
        counts = [f.name for f in fields(LabelCounts) if f.type == "int | None"]  # the figures
        sums = {k: sum(getattr(r, k) or 0 for r in records) for k in counts}
        return to_record(replace(records[0], **sums))  # type: ignore[no-any-return]

    def summary(self) -> dict[str, Any]:
        """The record's counts and figures (for ``--json`` output): documents, tokens, rows..."""
        keys = ("documents", "segments", "tokens", "rows", "lower_bound_rows")
        keys += ("rows_over_lower_bound", "efficiency", "global_ffd_rows", "bad_records")
        keys += ("special_strings", "seconds", "labels")
        out = {k: self.record[k] for k in keys if k in self.record}
        tokenizer = self.tokenizer.record
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
        repack_files: Sequence[ShardEntry] = (),
    ) -> Manifest:
        """The manifest of a finished dataset: ``body`` (:meth:`for_pack`) and the layout,
        the shards in row order (what :meth:`ShardWriter.commit` writes last), and the
        repack records (:mod:`.chunks`) if any."""
        repack = {"repack_files": [e.to_record() for e in repack_files]} if repack_files else {}
        return cls.from_record(
            {
                "format": FORMAT_NAME,
                "format_version": FORMAT_VERSION,
                **body,
                "max_len": max_len,
                "columns": list(columns),
                "num_rows": sum(int(s.rows) for s in shards),
                "shards": [s.to_record() for s in shards],
                **repack,
            },
            path,
        )

    def with_seconds(self, seconds: float) -> Manifest:
        """A copy that records ``seconds`` as the run's time."""
        return Manifest.from_record({**self.record, "seconds": round(seconds, 3)}, self.path)

    def problems(self) -> list[str]:
        """What is malformed in the record, and what in its counts does not agree with the
        rest (its own arithmetic)."""
        found = list(self.load_problems)
        max_len, rows, documents = self.max_len, self.rows, self.documents
        if documents is None:
            found.append("'documents' does not hold every count (read, packed, split, ...)")
        elif documents.accounted != documents.read:
            found.append(
                f"documents.read is {documents.read}, but its parts add up to {documents.accounted}"
            )
        shard_rows = sum(s.rows for s in self.shards)
        if rows is None:
            found.append("no 'rows' count")
        elif rows != shard_rows:
            found.append(f"rows is {rows}, but the shards listed hold {shard_rows}")
        if self.num_rows is not None and self.num_rows != rows:
            found.append(f"num_rows is {self.num_rows!r}, rows is {rows!r}")
        if self.tokens is None:
            found.append("'tokens' does not hold every count (packed, truncated_away, dropped)")
        else:
            packed, lower = self.tokens.packed, -(-self.tokens.packed // max_len)
            if self.lower_bound_rows != lower:
                found.append(
                    f"lower_bound_rows is {self.lower_bound_rows!r}, "
                    f"but ceil(tokens.packed / max_len) is {lower}"
                )
            if rows is not None and packed > rows * max_len:
                found.append(f"tokens.packed {packed} do not fit in {rows} rows of {max_len}")
        if self.options.get("max_len") not in (None, max_len):
            found.append(f"options.max_len is {self.options['max_len']!r}, max_len is {max_len}")
        if documents is not None:
            found.extend(self._input_problems(documents.read))
        return found

    def _input_problems(self, read: int) -> list[str]:
        """Whether the ``inputs`` number their documents one after another, all of them."""
        expected_first = 0
        for i, inp in enumerate(self.inputs):
            if inp.first_doc != expected_first or inp.documents is None:
                return [f"inputs[{i}]: first_doc {inp.first_doc!r} should be {expected_first}"]
            expected_first += inp.documents
        if "inputs" in self.record and expected_first != read:
            return [f"the inputs hold {expected_first} documents, documents.read is {read}"]
        return []

    def locate_document(self, doc: int) -> str:
        """Where document ``doc`` was read: ``FILE record N``, from the ``inputs`` record."""
        for inp in self.inputs:
            first, count = inp.first_doc, inp.documents
            if first is not None and count is not None and first <= doc < first + count:
                return f"{Path(str(inp.path)).name} record {doc - first}"
        return "not in any input the manifest lists"

    # -- derived from the fields
    has_labels = _holds("labels", "the labels of instruction data")
    has_sources = _holds("source_ids", "the sources of a mixture (``pack --mix``)")
    has_seq_lengths = _holds("seq_lengths", "seq_lengths (packs before it was added do not)")
    aligned = _holds("cu_seqlens_unpadded", "the real boundaries (``--pad-to-multiple-of``)")

    @property
    def pad_to_multiple_of(self) -> int:
        """The multiple every segment is padded to (``options.pad_to_multiple_of``; 1: none)."""
        return self.recorded_options.pad_to_multiple_of or 1

    @property
    def row_seed(self) -> int | None:
        """The seed of the row shuffle (``options.seed``), or None if not shuffled."""
        return self.recorded_options.seed if self.recorded_options.shuffle else None

    @property
    def counts(self) -> Counts:
        """What the run counted of its documents, as one record: ``documents``, ``tokens``
        and (instruction data) the ``labels`` counts; zeros for a section not recorded whole
        (an older or damaged record: :meth:`problems` names it)."""
        labels, figures = self.labels, None
        if labels is not None:  # LabelFigures' counts, of the same names as the record's
            figures = LabelFigures(*(getattr(labels, f.name) or 0 for f in fields(LabelFigures)))
        return Counts(self.documents or DocumentCounts(), self.tokens or TokenCounts(), figures)

    @property
    def dropped_label_chunks(self) -> int:
        """Chunks dropped for having nothing to learn (they leave gaps in ``chunk_ids``)."""
        return (self.labels.chunks_without_labels_dropped or 0) if self.labels else 0

    @property
    def segment_lengths(self) -> np.ndarray | None:
        """Every segment's length (sorted), from the recorded histogram; None if there is none
        or it does not add up to the segments recorded."""
        return self.histogram.lengths(self.segments or 0) if self.histogram else None


def read_manifest(path: str | os.PathLike[str] | StorePath, *, strict: bool = True) -> Manifest:
    """The manifest of the packed dataset at ``path``, checked for format, version and
    layout; strict: any malformed value is an error, else it reads as None (for ``verify``
    and ``stats`` of a damaged or older pack: :meth:`Manifest.problems` tells)."""
    path = as_path(path)
    if not path.is_dir():
        if path.exists():  # a corpus file, or the manifest itself, given for the output
            raise FormatError(
                f"{path}: a file, not a directory: give the output directory of `packtool "
                f"pack` (the one holding {MANIFEST_FILE})"
            )
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
    for name in ("max_len", "shards", "columns"):
        if name not in manifest:
            raise FormatError(f"{manifest_path}: manifest lacks {name!r}")
    problem = _manifest_problem(manifest)
    if problem:
        raise FormatError(f"{manifest_path}: {problem}")
    return Manifest.from_record(manifest, manifest_path, strict=strict)


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
    repack = manifest.get("repack_files", [])
    if not isinstance(repack, list):
        return "'repack_files' is not a list"
    for i, entry in enumerate(repack):
        problem = shard_entry_problem(i, entry)
        if problem:
            return f"repack_files: {problem}"
    return None
