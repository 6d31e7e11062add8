"""What every export shares: the segment index of a pack, its token columns, and the output.

An export reads a pack through :func:`packtool.open_packed` only. Its memory is bounded by the
segment index (a few integers per document segment, never the tokens): the tokens are read
from the memory-mapped shards, a block at a time, in the order the export writes them.

The output is written like ``pack``'s: into a hidden sibling directory, renamed into place at
the end, so an interrupted export leaves nothing that looks finished. An existing output is
never replaced. ``export.json``, written last, records what was exported from what, with the
sha256 of every file, for ``packtool verify OUT --export DIR``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import FormatError, OptionError, OutputExistsError
from ..format import PackedReader, Per, column_names, remove_stale_temporaries, sha256_file
from ..format.records import Problems, Record, raw
from ..fs import as_path, is_url

__all__ = [
    "EXPORT_FILE",
    "EXPORT_FORMAT",
    "ExportRecord",
    "HashingWriter",
    "RowColumn",
    "SegmentIndex",
    "export_output",
    "local_export_dir",
    "read_export_manifest",
    "segment_index",
]

EXPORT_FILE = "export.json"
EXPORT_FORMAT = "packtool.export"
BLOCK_TOKENS = 1 << 22
"""Tokens gathered per write (16 MB of int32): the export's working set."""


@dataclass(frozen=True)
class SegmentIndex:
    """Every document segment of a pack, one entry per segment, in stored row order.

    ``row[i]`` is the global row of segment ``i``, ``start[i]`` / ``length[i]`` its place in the
    row (its real tokens), ``doc[i]`` / ``chunk[i]`` its source document and chunk number.
    ``per_row[r]`` is the number of document segments of row ``r``. ``span[i]``: the slots it
    takes with its alignment pad (``--pad-to-multiple-of``; ``length[i]`` otherwise).
    """

    row: np.ndarray
    start: np.ndarray
    length: np.ndarray
    doc: np.ndarray
    chunk: np.ndarray
    per_row: np.ndarray
    span: np.ndarray

    def __len__(self) -> int:
        return int(self.row.size)

    def document_order(self) -> np.ndarray:
        """Segment numbers sorted by (document, chunk): the documents' tokens in order."""
        return np.lexsort((self.chunk, self.doc))


def segment_index(reader: PackedReader) -> SegmentIndex:
    """The :class:`SegmentIndex` of a pack, from its ``cu_seqlens`` (and
    ``cu_seqlens_unpadded``), ``doc_ids``, ``chunk_ids`` (the token columns are not read)."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in SegmentIndex.__dataclass_fields__}
    first_row = 0
    aligned = reader.aligned
    names = column_names(False, Per.BOUNDARY, Per.SEGMENT, aligned=aligned)
    for table in reader.iter_tables(names):
        unpadded = table.column("cu_seqlens_unpadded").chunks if aligned else None
        for k, (cu, docs, chunks) in enumerate(
            zip(
                table.column("cu_seqlens").chunks,
                table.column("doc_ids").chunks,
                table.column("chunk_ids").chunks,
                strict=True,
            )
        ):
            cu_off = cu.offsets.to_numpy().astype(np.int64)
            cu_val = cu.values.to_numpy()
            doc_off = docs.offsets.to_numpy().astype(np.int64)
            per_row = np.diff(doc_off)
            rows = len(per_row)
            seg_row = np.repeat(np.arange(rows, dtype=np.int64), per_row)
            within = np.arange(int(per_row.sum()), dtype=np.int64) - np.repeat(
                doc_off[:-1] - doc_off[0], per_row
            )
            at = cu_off[:-1][seg_row] + within
            start = cu_val[at].astype(np.int64)
            parts["row"].append(seg_row + first_row)
            parts["start"].append(start)
            span = cu_val[at + 1].astype(np.int64) - start
            parts["span"].append(span)
            if unpadded is None:
                parts["length"].append(span)
            else:
                real = unpadded[k].values.to_numpy().astype(np.int64)
                parts["length"].append(real[at + 1] - real[at])
            parts["doc"].append(docs.values.to_numpy()[doc_off[0] : doc_off[-1]].astype(np.int64))
            chunk_off = chunks.offsets.to_numpy().astype(np.int64)
            parts["chunk"].append(
                chunks.values.to_numpy()[chunk_off[0] : chunk_off[-1]].astype(np.int64)
            )
            parts["per_row"].append(per_row)
            first_row += rows
    if first_row != reader.num_rows:  # pragma: no cover - the reader checks the shards
        raise FormatError(f"{reader.path}: read {first_row} rows, expected {reader.num_rows}")
    return SegmentIndex(
        **{k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in parts.items()}
    )


class RowColumn:
    """One fixed-size column of a pack (``input_ids``, ``labels``), ``[row, max_len]``,
    memory-mapped: ``take(rows, starts, lengths)`` joins the pieces in the order given."""

    def __init__(self, reader: PackedReader, name: str) -> None:
        self._blocks: list[np.ndarray] = []
        first = [0]
        for table in reader.iter_tables([name]):
            for chunk in table.column(name).chunks:
                values = chunk.flatten().to_numpy()  # zero-copy: the mapped shard
                self._blocks.append(values.reshape(-1, reader.max_len))
                first.append(first[-1] + len(chunk))
        self._first = np.asarray(first, dtype=np.int64)

    def take(self, rows: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        out = np.empty(int(lengths.sum()), dtype=np.int32)
        block_of = np.searchsorted(self._first, rows, side="right") - 1
        at = 0
        pieces = (block_of.tolist(), rows.tolist(), starts.tolist(), lengths.tolist())
        for b, r, s, n in zip(*pieces, strict=True):
            out[at : at + n] = self._blocks[b][r - self._first[b], s : s + n]
            at += n
        return out

    def row(self, row: int) -> np.ndarray:
        b = int(np.searchsorted(self._first, row, side="right") - 1)
        return self._blocks[b][row - self._first[b]]


def token_blocks(column: RowColumn, index: SegmentIndex, order: np.ndarray) -> Iterator[np.ndarray]:
    """The tokens of the segments ``order`` (indices into ``index``), in that order, in blocks
    of about :data:`BLOCK_TOKENS`."""
    lengths = index.length[order]
    ends = np.cumsum(lengths)
    begin = 0
    while begin < len(order):
        base = ends[begin - 1] if begin else 0
        stop = max(begin + 1, int(np.searchsorted(ends, base + BLOCK_TOKENS, side="right")))
        pick = order[begin:stop]
        yield column.take(index.row[pick], index.start[pick], index.length[pick])
        begin = stop


class HashingWriter:
    """A binary file written in pieces, with its sha256 and size, for ``export.json``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.digest = hashlib.sha256()
        self.size = 0
        self._file: BinaryIO = open(path, "wb")  # noqa: SIM115 - closed in close()

    def write(self, data: bytes | memoryview | np.ndarray) -> None:
        view = memoryview(np.ascontiguousarray(data) if isinstance(data, np.ndarray) else data)
        view = view.cast("B")
        self._file.write(view)
        self.digest.update(view)
        self.size += view.nbytes

    def close(self) -> dict[str, Any]:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return {"bytes": self.size, "sha256": self.digest.hexdigest()}

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._file.closed:
            self._file.close()


def local_export_dir(dest: str | os.PathLike[str]) -> Path:
    """``dest`` as a local directory (``file://`` URLs too); a store URL is refused, since
    an export is a local directory (Megatron reads its files memory-mapped)."""
    if is_url(dest):
        raise OptionError(
            f"{dest}: an export is written to a local directory, not to a store: export to "
            "local disk (-o DIR), then copy DIR to the store"
        )
    path = as_path(dest)
    assert isinstance(path, Path)
    return path


@contextlib.contextmanager
def export_output(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """A staging directory that becomes ``dest`` when the block ends without an error.

    Refuses an existing ``dest`` (an export never replaces anything) and a store URL;
    removes the staging directory on an error or Ctrl-C.
    """
    dest = local_export_dir(dest)
    if dest.exists():
        raise OutputExistsError(
            f"export directory {dest} already exists: an export never replaces files; "
            "choose another -o or remove it"
        )
    remove_stale_temporaries(dest)  # what killed exports left
    staging = dest.parent / f".{dest.name}.packtool-tmp-{os.getpid()}"
    try:
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir(parents=True)
        yield staging
        if dest.exists():
            raise OutputExistsError(f"export directory {dest} appeared while exporting")
        os.rename(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def pack_fingerprint(reader: PackedReader) -> dict[str, Any]:
    """What names the pack an export came from: its path, rows and shard checksums."""
    joined = "".join(str(s.sha256 or "") for s in reader.manifest.shards)
    return {
        "path": str(reader.path.resolve()),
        "num_rows": reader.num_rows,
        "max_len": reader.max_len,
        "shards_sha256": hashlib.sha256(joined.encode()).hexdigest(),
    }


def write_export_manifest(staging: Path, record: dict[str, Any]) -> dict[str, Any]:
    record = {"format": EXPORT_FORMAT, "format_version": 1, **record}
    path = staging / EXPORT_FILE
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


@dataclass(frozen=True)
class ExportSource(Record):
    """What names the pack an export came from (:func:`pack_fingerprint`)."""

    shards_sha256: str | None = None


@dataclass(frozen=True)
class ExportFile(Record):
    """One file of an export as ``export.json`` lists it."""

    bytes: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class ExportRecord(Record):
    """The ``export.json`` of an export, read by the manifest's loader (what ``verify
    --export`` needs of it, typed; the rest as written in ``record``)."""

    to: str
    source: ExportSource = field(default_factory=ExportSource)
    files: dict[str, ExportFile] = field(default_factory=dict)
    record: dict[str, Any] = raw()


def read_export_manifest(dest: str | os.PathLike[str]) -> ExportRecord:
    """The ``export.json`` of an export directory, checked for its format; a malformed value
    is a :class:`FormatError` naming its key."""
    path = Path(dest) / EXPORT_FILE
    if not path.exists():
        raise FormatError(
            f"{dest} is not a packtool export: it has no {EXPORT_FILE} "
            "(an interrupted `packtool export` never writes one)"
        )
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"{path}: unreadable: {e}") from e
    if not isinstance(record, dict) or record.get("format") != EXPORT_FORMAT:
        raise FormatError(f"{path}: not a packtool export manifest")
    return ExportRecord.from_record(record, Problems(path))


def file_problems(dest: Path, record: ExportRecord) -> list[str]:
    """Files of ``export.json`` that are missing or whose size or sha256 differ."""
    problems = []
    for name, info in record.files.items():
        path = dest / name
        if not path.exists():
            problems.append(f"{name}: missing")
        elif path.stat().st_size != info.bytes:
            size = path.stat().st_size
            problems.append(f"{name}: {size} bytes, export.json says {info.bytes}")
        elif sha256_file(path) != info.sha256:
            problems.append(f"{name}: sha256 differs from export.json")
    return problems
