"""The on-disk format of a packed dataset: schema, manifest, shard writer and reader.

This module is the only one that knows how a packed dataset is laid out on disk; ``pack``
writes through :class:`ShardWriter`, and ``stats``, ``inspect``, ``verify`` and the training
side read through :func:`open_packed`. ``docs/format.md`` describes the same thing for people.

A packed dataset is a directory::

    out/
      data-00000-of-00002.arrow    Arrow IPC stream shards, the rows (written first)
      data-00001-of-00002.arrow
      dataset_info.json            Hugging Face `datasets` metadata (features)
      state.json                   so that `datasets.load_from_disk("out")` works
      manifest.json                packtool's manifest, written last: its presence marks
                                   the output as complete

One row, ``max_len`` 24, documents of 5, 9 and 7 tokens, then 3 pad tokens (``P``)::

    input_ids    a a a a a b b b b b b b b b c c c c c c c P P P
    position_ids 0 1 2 3 4 0 1 2 3 4 5 6 7 8 0 1 2 3 4 5 6 0 1 2
    cu_seqlens   [0, 5, 14, 21, 24]
    num_tokens   21
    doc_ids      [d_a, d_b, d_c]       (one per document segment; none for the padding)
    chunk_ids    [0, 0, 0]

The padding tail is a segment of its own (the last one), so the segments cover every position
and ``position_ids[cu[i]:cu[i+1]] == arange(cu[i+1] - cu[i])`` holds for every segment.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import hashlib
import io
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .errors import FormatError, NothingToPackError, OutputExistsError, RowIndexError
from .fs import (
    AnyPath,
    StorePath,
    arrow_input,
    as_path,
    check_writable,
    sha256_of,
    upload_file,
)

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "IGNORE_INDEX",
    "MANIFEST_FILE",
    "DocumentCounts",
    "Manifest",
    "PackedBatch",
    "PackedReader",
    "PackedRow",
    "RunFigures",
    "Segment",
    "ShardEntry",
    "ShardWriter",
    "TokenCounts",
    "check_store_output",
    "layout_problems",
    "open_packed",
    "packed_schema",
    "publish",
    "row_bytes",
]

FORMAT_NAME = "packtool.packed"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"  # kept beside the tokenizer copy, if any
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # kept too, if the chats were rendered with it
IGNORE_INDEX = -100
"""The label of a token that is not learned (padding, prompt): PyTorch's cross-entropy default."""

_SHARD_NAME = "data-{index:05d}-of-{count:05d}.arrow"
_SHARD_RE = re.compile(r"data-\d{5}-of-\d{5}\.arrow")
# What a packtool output holds besides its shards (the manifest last), and the folder of work
# units: on a store, the names a rerun or --overwrite may replace.
_OUTPUT_FILES = (
    "dataset_info.json",
    "state.json",
    "tokenizer.json",
    TOKENIZER_CONFIG_FILE,
    CHAT_TEMPLATE_FILE,
    MANIFEST_FILE,
)
_UNITS_DIR = "units"


def row_bytes(max_len: int, with_labels: bool = False) -> int:
    """About the bytes of one row in a shard (its int32 columns of ``max_len``, and a little
    for the others): what ``--shard-size`` is divided by to get the rows per shard."""
    return (3 if with_labels else 2) * 4 * max_len + 64


def packed_schema(max_len: int, with_labels: bool = False) -> pa.Schema:
    """The Arrow schema of a packed dataset's rows."""
    fixed = pa.list_(pa.int32(), max_len)
    fields = [
        pa.field("input_ids", fixed, nullable=False),
        pa.field("position_ids", fixed, nullable=False),
        pa.field("cu_seqlens", pa.list_(pa.int32()), nullable=False),
        pa.field("num_tokens", pa.int32(), nullable=False),
        pa.field("doc_ids", pa.list_(pa.int64()), nullable=False),
        pa.field("chunk_ids", pa.list_(pa.int32()), nullable=False),
    ]
    if with_labels:
        fields.append(pa.field("labels", fixed, nullable=False))
    return pa.schema(fields)


def schema_problem(schema: pa.Schema, max_len: int, with_labels: bool) -> str | None:
    """What is wrong with a shard's ``schema`` (a missing column, a wrong type), or None.

    Columns this version does not know are allowed (readers ignore them).
    """
    for expected in packed_schema(max_len, with_labels):
        index = schema.get_field_index(expected.name)
        if index < 0:
            return f"the shard has no column {expected.name!r}"
        if schema.field(index).type != expected.type:
            return (
                f"column {expected.name!r} is {schema.field(index).type}, expected {expected.type}"
            )
    return None


def _hf_feature(kind: pa.DataType) -> dict[str, Any]:
    if pa.types.is_fixed_size_list(kind):
        return {"feature": _hf_feature(kind.value_type), "length": kind.list_size, "_type": "List"}
    if pa.types.is_list(kind):
        return {"feature": _hf_feature(kind.value_type), "_type": "List"}
    return {"dtype": str(kind), "_type": "Value"}


def hf_features(schema: pa.Schema) -> dict[str, Any]:
    """The Hugging Face `datasets` (>= 4) features dict of ``schema``.

    Written by hand rather than with `datasets.Features` to keep the slow `datasets` import out
    of ``pack``; a test checks it against `datasets`' own conversion.
    """
    return {f.name: _hf_feature(f.type) for f in schema}


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
class PackedBatch:
    """Rows ready to write, as NumPy arrays.

    ``input_ids``, ``position_ids`` (and ``labels``) are ``[rows, max_len]`` int32.
    Ragged per-row lists are flat values plus offsets: row ``r``'s ``cu_seqlens`` is
    ``cu_values[cu_offsets[r]:cu_offsets[r + 1]]``; ``doc_ids`` and ``chunk_ids`` share
    ``seg_offsets``.
    """

    input_ids: np.ndarray
    position_ids: np.ndarray
    cu_values: np.ndarray
    cu_offsets: np.ndarray
    num_tokens: np.ndarray
    doc_ids: np.ndarray
    chunk_ids: np.ndarray
    seg_offsets: np.ndarray
    labels: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    def to_table(self) -> pa.Table:
        max_len = self.input_ids.shape[1]

        def fixed(a: np.ndarray) -> pa.Array:
            return pa.FixedSizeListArray.from_arrays(_int_array(a.reshape(-1), np.int32), max_len)

        seg_offsets = _int_array(self.seg_offsets, np.int32)
        arrays = [
            fixed(self.input_ids),
            fixed(self.position_ids),
            pa.ListArray.from_arrays(
                _int_array(self.cu_offsets, np.int32), _int_array(self.cu_values, np.int32)
            ),
            _int_array(self.num_tokens, np.int32),
            pa.ListArray.from_arrays(seg_offsets, _int_array(self.doc_ids, np.int64)),
            pa.ListArray.from_arrays(seg_offsets, _int_array(self.chunk_ids, np.int32)),
        ]
        if self.labels is not None:
            arrays.append(fixed(self.labels))
        schema = packed_schema(max_len, with_labels=self.labels is not None)
        return pa.Table.from_arrays(arrays, schema=schema)


def _int_array(a: np.ndarray, dtype: type[np.integer]) -> pa.Array:
    """A NumPy integer array as an Arrow array of ``dtype``, without a copy when it already
    is one (``pa.array`` would also import pandas, ~0.2 s, on its first call)."""
    a = np.ascontiguousarray(a, dtype=dtype)
    return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), a.size, [None, pa.py_buffer(a)])


class _HashingFile(io.RawIOBase):
    """A write-only file that hashes (sha256) what goes through it, for the manifest.

    A large buffer is hashed in a thread while it is written here (both release the GIL, so
    they run on two cores), and the kernel is told every ``_WRITEBACK_BYTES`` to start
    writing back to disk, so the fsync at :meth:`close` has little left to wait for.
    """

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.digest = hashlib.sha256()
        self.size = 0
        self._unsynced = 0
        self._hasher: concurrent.futures.ThreadPoolExecutor | None = None

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if view.nbytes >= _HASH_IN_THREAD_BYTES:
            if self._hasher is None:
                self._hasher = concurrent.futures.ThreadPoolExecutor(1, "packtool-hash")
            hashed = self._hasher.submit(self.digest.update, view)
            try:
                self.raw.write(view)
            finally:
                hashed.result()  # the digest must take buffers in order: wait for this one
        else:
            self.digest.update(view)
            self.raw.write(view)
        self.size += view.nbytes
        self._unsynced += view.nbytes
        if self._unsynced >= _WRITEBACK_BYTES:
            self._unsynced = 0
            self.raw.flush()
            if hasattr(os, "posix_fadvise"):  # Linux: starts writeback without waiting for it
                with contextlib.suppress(OSError):
                    os.posix_fadvise(self.raw.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return view.nbytes

    def flush(self) -> None:
        if not self.raw.closed:
            self.raw.flush()

    def close(self) -> None:
        if not self.closed:
            try:
                self.raw.flush()
                os.fsync(self.raw.fileno())
            finally:
                self.raw.close()
                if self._hasher is not None:
                    self._hasher.shutdown()
        super().close()


_HASH_IN_THREAD_BYTES = 1 << 20
_WRITEBACK_BYTES = 32 << 20


def sha256_file(path: Path) -> str:
    """The sha256 of a file (exports record one per file they write)."""
    return sha256_of(path)


def _write_json(path: Path, obj: Any) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, sort_keys=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise write_error(e, path, f"cannot write {path.name}") from e


def _fsync(path: Path) -> None:
    """Flush ``path`` (a file or a directory) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # some filesystems cannot fsync a directory; nothing to do then
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def write_error(error: OSError, path: Path, what: str) -> OSError:
    """``error`` (raised while writing ``path``) as an OSError with a message fit to print.

    pyarrow's and numpy's write errors do not name the file and bury the reason
    (``Error writing bytes to file. Detail: [errno 28] ...``). The CLI prints the result as
    ``Error: PATH: cannot write shard: No space left on device (free space ...)``.
    """
    code = error.errno
    reason = os.strerror(code) if code else str(error)
    if code in (errno.ENOSPC, errno.EDQUOT):
        reason += " (free space on that filesystem, or write the output elsewhere with --output)"
    return OSError(code or errno.EIO, f"{what}: {reason}", str(path))


class ShardWriter:
    """Writes rows into shards in a staging directory, then commits them atomically.

    Used as a context manager. Shards go to a hidden sibling of ``out_dir``; :meth:`commit`
    writes the `datasets` metadata and the manifest (last), and renames the staging directory
    to ``out_dir``. On an exception, or without a commit, the staging directory is removed, so
    an interrupted run never leaves an output that looks finished.

    >>> with ShardWriter(out, max_len=4096, num_rows=1000, rows_per_shard=500) as w:
    ...     w.write(batch)            # any number of batches, rows in order
    ...     w.commit(manifest)        # returns the final manifest dict
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        max_len: int,
        num_rows: int,
        rows_per_shard: int,
        with_labels: bool = False,
        overwrite: bool = False,
    ) -> None:
        if rows_per_shard < 1:
            raise ValueError(f"rows_per_shard must be >= 1, got {rows_per_shard}")
        self.out_dir = Path(out_dir)
        self.max_len = max_len
        self.num_rows = num_rows
        self.rows_per_shard = rows_per_shard
        self.schema = packed_schema(max_len, with_labels)
        self.overwrite = overwrite
        self.num_shards = max(1, -(-num_rows // rows_per_shard))
        check_output_dir(self.out_dir, overwrite)
        self.staging = self.out_dir.parent / f".{self.out_dir.name}.packtool-tmp-{os.getpid()}"
        self._shards: list[dict[str, Any]] = []
        self._sink: pa.ipc.RecordBatchStreamWriter | None = None
        self._sink_file: Any = None
        self._rows_in_shard = 0
        self._rows_written = 0
        self._committed = False

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> ShardWriter:
        # A Ctrl-C that lands here, after the mkdir but before the with-statement holds
        # __exit__, must not leave the staging directory behind.
        try:
            if self.staging.exists():
                shutil.rmtree(self.staging)
            self.staging.mkdir(parents=True)
            return self
        except BaseException:
            shutil.rmtree(self.staging, ignore_errors=True)
            raise

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._committed:
            return
        # Not committed (an error, Ctrl-C, or no commit): the rows are thrown away, so the
        # open shard is closed quietly; closing can fail again (a full disk), and that must
        # neither hide the original error nor keep the staging directory from being removed.
        for closable in (self._sink, self._sink_file):
            with contextlib.suppress(Exception):
                if closable is not None:
                    closable.close()
        self._sink = self._sink_file = None
        shutil.rmtree(self.staging, ignore_errors=True)

    # -- writing ---------------------------------------------------------------------------
    def _open_shard(self) -> None:
        name = _SHARD_NAME.format(index=len(self._shards), count=self.num_shards)
        path = self.staging / name
        self._shards.append({"file": name, "rows": 0})
        schema = self.schema.with_metadata(
            {"huggingface": json.dumps({"info": {"features": hf_features(self.schema)}})}
        )
        try:
            self._hashing = _HashingFile(open(path, "wb"))  # noqa: SIM115 - closed below
            self._sink_file = pa.PythonFile(self._hashing, mode="w")
            self._sink = pa.ipc.new_stream(self._sink_file, schema)
        except OSError as e:
            raise write_error(e, path, "cannot write shard") from e
        self._rows_in_shard = 0

    def _close_shard(self) -> None:
        if self._sink is None:
            return
        entry = self._shards[-1]
        path = self.staging / entry["file"]
        try:
            self._sink.close()
            self._sink_file.close()  # flushes and fsyncs (_HashingFile.close): the manifest
            # must never reach the disk before the rows it lists
        except OSError as e:
            raise write_error(e, path, "cannot write shard") from e
        self._sink = self._sink_file = None
        entry["rows"] = self._rows_in_shard
        entry["bytes"] = path.stat().st_size
        entry["sha256"] = self._hashing.digest.hexdigest()
        if entry["bytes"] != self._hashing.size:  # pragma: no cover - a short write
            raise OSError(f"{path}: wrote {entry['bytes']} bytes, expected {self._hashing.size}")

    def write(self, batch: PackedBatch | pa.Table) -> None:
        """Append rows, starting new shards every ``rows_per_shard`` rows."""
        table = batch.to_table() if isinstance(batch, PackedBatch) else batch
        if table.schema != self.schema:
            raise ValueError(f"batch schema does not match the dataset's:\n{table.schema}")
        start = 0
        while start < table.num_rows:
            if self._sink is None:
                self._open_shard()
            take = min(self.rows_per_shard - self._rows_in_shard, table.num_rows - start)
            assert self._sink is not None
            try:
                self._sink.write_table(table.slice(start, take))
            except OSError as e:
                path = self.staging / self._shards[-1]["file"]
                raise write_error(e, path, "cannot write shard") from e
            self._rows_in_shard += take
            self._rows_written += take
            start += take
            if self._rows_in_shard == self.rows_per_shard:
                self._close_shard()

    def commit(self, manifest: Mapping[str, Any]) -> Manifest:
        """Finish: metadata, the manifest last, then move into place. Returns the manifest."""
        if self._rows_written != self.num_rows:
            raise RuntimeError(
                f"wrote {self._rows_written} rows, expected {self.num_rows}: not committing"
            )
        if not self._shards:  # an empty dataset still gets one (empty) shard
            self._open_shard()
        self._close_shard()
        _write_metadata(self.staging, self.schema, self._shards)
        record = _full_manifest(manifest, self.schema, self.max_len, self._shards)
        _write_json(self.staging / MANIFEST_FILE, record)
        _move_into_place(self.staging, self.out_dir, self.overwrite)
        self._committed = True
        return Manifest(record, self.out_dir / MANIFEST_FILE)


def _write_metadata(directory: Path, schema: pa.Schema, shards: list[dict[str, Any]]) -> None:
    """``dataset_info.json`` and ``state.json``: what `datasets.load_from_disk` reads. Its
    ``_data_files`` are the shards' paths relative to ``directory``, in row order."""
    _write_json(
        directory / "dataset_info.json",
        {"citation": "", "description": "packed by packtool", "features": hf_features(schema)},
    )
    _write_json(
        directory / "state.json",
        {
            "_data_files": [{"filename": s["file"]} for s in shards],
            "_fingerprint": hashlib.sha256(
                "".join(s["sha256"] for s in shards).encode()
            ).hexdigest()[:16],
            "_format_columns": None,
            "_format_kwargs": {},
            "_format_type": None,
            "_output_all_columns": False,
            "_split": None,
        },
    )


def _full_manifest(
    manifest: Mapping[str, Any], schema: pa.Schema, max_len: int, shards: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        **manifest,
        "max_len": max_len,
        "columns": schema.names,
        "num_rows": sum(int(s["rows"]) for s in shards),
        "shards": shards,
    }


def commit_in_place(
    out_dir: str | os.PathLike[str],
    *,
    max_len: int,
    with_labels: bool,
    shards: list[dict[str, Any]],
    manifest: Mapping[str, Any],
) -> Manifest:
    """Commit a dataset whose shards already lie under ``out_dir``: no row is written.

    ``shards`` are manifest entries (``file`` relative to ``out_dir``, ``rows``, ``bytes``,
    ``sha256``, optionally ``doc_offset``), in row order; a merge without copying lists the
    units' shards this way. Any old manifest goes first, then the `datasets` metadata, then
    the new manifest (written aside and renamed), so ``out_dir`` never looks complete with
    metadata that does not match it. Returns the manifest.
    """
    out = Path(out_dir)
    schema = packed_schema(max_len, with_labels)
    for i, entry in enumerate(shards):
        problem = _shard_entry_problem(i, entry)
        if problem:
            raise ValueError(problem)
    (out / MANIFEST_FILE).unlink(missing_ok=True)
    _write_metadata(out, schema, shards)
    record = _full_manifest(manifest, schema, max_len, shards)
    aside = out / f".{MANIFEST_FILE}.packtool-tmp-{os.getpid()}"
    try:
        _write_json(aside, record)
        os.replace(aside, out / MANIFEST_FILE)
    finally:
        aside.unlink(missing_ok=True)
    _fsync(out)
    return Manifest(record, out / MANIFEST_FILE)


def check_output_dir(out_dir: Path, overwrite: bool) -> None:
    """Refuse an existing ``out_dir`` unless ``overwrite`` (eagerly, before any work).

    Even with ``overwrite``, only a packtool output (it has a manifest) or an empty directory
    is replaced: ``--overwrite`` must never delete a directory of other files by mistake.
    """
    if not out_dir.exists():
        above = next((p for p in out_dir.parents if p.exists()), None)
        if above is not None and not above.is_dir():  # -o corpus.jsonl/out
            raise OutputExistsError(
                f"output directory {out_dir} cannot be made: {above} is a file, not a "
                "directory; choose another --output"
            )
        return
    if not out_dir.is_dir():
        raise OutputExistsError(
            f"output path {out_dir} exists and is not a directory: choose another --output"
        )
    replaceable = (out_dir / MANIFEST_FILE).exists() or not any(out_dir.iterdir())
    if replaceable and not overwrite:
        raise OutputExistsError(
            f"output directory {out_dir} already exists (pass --overwrite to replace it)"
        )
    if replaceable:
        return
    raise OutputExistsError(
        f"output directory {out_dir} is not a packtool output (no {MANIFEST_FILE}) and not "
        "empty: --overwrite replaces only packtool outputs; choose another --output"
    )


def _store_members(url: StorePath) -> dict[str, StorePath]:
    if not url.is_dir():
        return {}
    return {p.name: p for p in url.iterdir()}


def check_store_output(url: StorePath, overwrite: bool) -> None:
    """Check an output prefix on a store before any work (the store's :func:`check_output_dir`).

    A probe object is written and deleted first: a missing bucket, missing credentials or a
    denied write fail here. A finished output (it has a manifest) is replaced only with
    ``overwrite``; a prefix holding what a failed or killed run left (shards, no manifest) is
    written over; a prefix holding other objects is refused, with or without ``overwrite``.
    """
    check_writable(url)
    members = _store_members(url)
    if MANIFEST_FILE in members and not overwrite:
        raise OutputExistsError(f"output {url} already exists (pass --overwrite to replace it)")
    foreign = sorted(n for n in members if not _ours(n))
    if foreign:
        raise OutputExistsError(
            f"output {url} holds objects that are not a packtool output ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}): choose another --output"
        )


def _ours(name: str) -> bool:
    return bool(_SHARD_RE.fullmatch(name)) or name in (*_OUTPUT_FILES, _UNITS_DIR)


def write_dataset(
    writer: ShardWriter,
    blocks: Iterable[pa.Table | pa.RecordBatch],
    manifest: Callable[[], Mapping[str, Any]],
    *,
    tokenizer: Mapping[str, bytes | Path] | None = None,
    progress: Callable[[int], None] | None = None,
) -> Manifest:
    """The write tail of ``pack`` and of a copying merge: the rows of ``blocks`` through
    ``writer`` (entered here), the tokenizer's files (``tokenizer.json``, and its
    ``tokenizer_config.json`` if any: their bytes, or files to copy), then the manifest, made
    once the rows are written (so its ``seconds`` count the writing), and the commit.
    ``progress`` gets the rows written so far after each block (0 when none)."""
    with writer:
        done = 0
        for block in blocks:
            writer.write(block)
            done += block.num_rows
            if progress:
                progress(done)
        if progress and done == 0:
            progress(0)
        for name, content in (tokenizer or {}).items():
            copy = writer.staging / name
            try:
                if isinstance(content, bytes):
                    copy.write_bytes(content)
                else:
                    shutil.copyfile(content, copy)
            except OSError as e:
                raise write_error(e, copy, "cannot write the tokenizer copy") from e
        return writer.commit(manifest())


def publish(local: Path, url: StorePath) -> None:
    """Copy the finished output ``local`` to the prefix ``url``: shards first, manifest last.

    Object stores have no atomic rename, so the order is the commit: an old manifest is
    deleted before anything else (the prefix no longer reads as finished), then the shards
    and metadata are uploaded, then objects of an older output that this one does not hold
    are deleted, and the manifest is uploaded last. A run killed at any point leaves a
    prefix without a manifest, which readers refuse and a rerun writes over.
    """
    names = sorted(p.name for p in local.iterdir() if p.is_file())
    members = _store_members(url)
    if MANIFEST_FILE in members:
        members.pop(MANIFEST_FILE).unlink(missing_ok=True)
    for name in names:
        if name != MANIFEST_FILE:
            upload_file(local / name, url / name)
    for name, member in members.items():
        if name not in names and name != _UNITS_DIR and _ours(name):
            member.unlink(missing_ok=True)
    upload_file(local / MANIFEST_FILE, url / MANIFEST_FILE)


_TEMPORARY = re.compile(r"\.(?P<name>.+)\.packtool-(?:tmp|store|old)-(?P<pid>\d+)")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    except (OverflowError, OSError):  # not a possible pid
        return False
    return True


def remove_stale_temporaries(out_dir: str | os.PathLike[str]) -> list[Path]:
    """Remove what killed runs left next to ``out_dir``; return the paths removed.

    A run killed by SIGKILL (or the OOM killer, or a power cut) cannot clean up its hidden
    siblings ``.OUT.packtool-tmp-PID`` and ``.OUT.packtool-old-PID`` (the work store
    ``.OUT.packtool-work`` is reset by the next run, or continued by ``--resume``). Those of
    processes that no longer exist are removed; those of a live process (another ``pack``
    writing the same output) are left alone.
    """
    out_dir = Path(out_dir)
    parent = out_dir.parent if str(out_dir.parent) else Path(".")
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    for entry in parent.iterdir():
        match = _TEMPORARY.fullmatch(entry.name)
        if match is None or match["name"] != out_dir.name:
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or _process_alive(pid):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
        removed.append(entry)
    return removed


def _move_into_place(staging: Path, out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists():
        check_output_dir(out_dir, overwrite)
        trash = out_dir.parent / f".{out_dir.name}.packtool-old-{os.getpid()}"
        os.rename(out_dir, trash)
        os.rename(staging, out_dir)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(staging, out_dir)
    _fsync(out_dir.parent)  # make the rename itself durable


# -- reading -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """One segment of a row: a document (or chunk of one), or the padding tail."""

    start: int
    length: int
    doc_id: int | None  # None for the padding segment
    chunk_id: int | None

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def is_padding(self) -> bool:
        return self.doc_id is None


@dataclass(frozen=True)
class ShardEntry:
    """One shard as the manifest lists it."""

    file: str
    rows: int
    bytes: int | None = None
    sha256: str | None = None
    doc_offset: int = 0  # added to the shard's doc_ids (a unit's shard, listed by a merge)


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


def _count_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_DOCUMENT_PARTS = ("packed", "split", "truncated", "dropped", "empty", "bad_records_skipped")
_LABEL_COUNTS = (
    "learned_tokens",
    "documents_without_labels",
    "chunks_without_labels_dropped",
    "tokens_in_chunks_without_labels",
)


class Manifest(Mapping[str, Any]):
    """The manifest of a packed dataset (``manifest.json``), with typed accessors.

    This class is the only code that knows the manifest's key names: readers use its
    properties, writers build one with :meth:`for_pack` (the writer adds the layout on
    commit). It is also a read-only mapping of the JSON record, so ``manifest["num_rows"]``
    keeps working for users who read it as a dict.
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
        documents, tokens, rows = f.documents, f.tokens, f.rows
        token_record: dict[str, Any] = {
            "packed": tokens.packed,
            "truncated_away": tokens.truncated_away,
            "dropped": tokens.dropped,
        }
        if tokens.learned is not None:
            token_record["learned"] = tokens.learned
        data: dict[str, Any] = {
            "packtool_version": version,
            "created_unix": int(time.time()),
            "tokenizer": dict(tokenizer),
            "options": dict(options),
            "inputs": inputs,
            "documents": asdict(documents),
            "segments": f.segments,
            "tokens": token_record,
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
        return {k: self._data[k] for k in keys if k in self._data}

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
                first = _count_or_none(_section(inp).get("first_doc"))
                count = _count_or_none(_section(inp).get("documents"))
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
            first = _count_or_none(inp.get("first_doc"))
            count = _count_or_none(inp.get("documents"))
            if first is not None and count is not None and first <= doc < first + count:
                return f"{Path(str(inp.get('path'))).name} record {doc - first}"
        return "not in any input the manifest lists"

    # -- what verify reads from a record that may be damaged: None where a count is missing
    @property
    def documents_recorded(self) -> DocumentCounts | None:
        """The document counts, or None unless every count is recorded as an integer."""
        docs = _section(self._data.get("documents"))
        values = {k: _count_or_none(docs.get(k)) for k in ("read", *_DOCUMENT_PARTS)}
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
        return {k: v for k, v in toks.items() if _count_or_none(v) is not None}

    @property
    def rows_recorded(self) -> int | None:
        return _count_or_none(self._data.get("rows"))

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
    def shards(self) -> list[ShardEntry]:
        return [
            ShardEntry(
                s["file"], int(s["rows"]), s.get("bytes"), s.get("sha256"), s.get("doc_offset", 0)
            )
            for s in self._data.get("shards", [])
        ]

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
    def segments(self) -> int | None:
        return _count_or_none(self._data.get("segments"))

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
        return _count_or_none(self.tokenizer.get("vocab_size"))

    @property
    def special_tokens(self) -> dict[str, Any]:
        return dict(_section(self.tokenizer.get("special_tokens")))

    @property
    def pad_from(self) -> str:
        return str(self.tokenizer.get("pad_from", "tokenizer"))

    @property
    def backend(self) -> Any:
        return self.tokenizer.get("backend")

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
    def units(self) -> dict[str, Any] | None:
        """A merged dataset's ``units`` record (plan, per_unit, ...), else None."""
        value = self._data.get("units")
        return dict(value) if isinstance(value, dict) else None

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


@dataclass(frozen=True)
class PackedRow:
    """One packed row, as NumPy arrays."""

    index: int
    input_ids: np.ndarray
    position_ids: np.ndarray
    cu_seqlens: np.ndarray
    num_tokens: int
    doc_ids: np.ndarray
    chunk_ids: np.ndarray
    labels: np.ndarray | None = None

    @property
    def segments(self) -> list[Segment]:
        """Document segments in order, then the padding segment if the row has one."""
        cu = self.cu_seqlens
        if len(self.chunk_ids) != len(self.doc_ids) or len(self.doc_ids) > len(cu) - 1:
            raise FormatError(
                f"row {self.index}: {len(self.doc_ids)} doc_ids and {len(self.chunk_ids)} "
                f"chunk_ids for {len(cu) - 1} segments (a damaged shard: run `packtool verify`)"
            )
        out = []
        for i in range(len(cu) - 1):
            start, end = int(cu[i]), int(cu[i + 1])
            if i < len(self.doc_ids):
                out.append(
                    Segment(start, end - start, int(self.doc_ids[i]), int(self.chunk_ids[i]))
                )
            else:
                out.append(Segment(start, end - start, None, None))
        return out


class PackedReader:
    """Read access to a packed dataset, memory-mapped; see :func:`open_packed`."""

    def __init__(self, path: AnyPath, manifest: Manifest, cache_dir: Path | None = None) -> None:
        self.path = path
        self.manifest = manifest
        self.cache_dir = cache_dir
        """Where shards of an output on a store are kept once fetched (``None``: streamed)."""
        self.max_len: int = manifest.max_len
        self.shard_files: list[str] = [s.file for s in manifest.shards]
        """The shards as the manifest lists them: paths relative to ``path``."""
        self.shard_paths = [path / name for name in self.shard_files]
        self.shard_rows = [s.rows for s in manifest.shards]
        self._doc_offsets = [s.doc_offset for s in manifest.shards]
        self._starts = np.concatenate([[0], np.cumsum(self.shard_rows)]).astype(np.int64)
        self._tables: dict[int, pa.Table] = {}
        self._referenced: dict[str, dict[str, ShardEntry]] = {}

    @property
    def num_rows(self) -> int:
        return int(self._starts[-1])

    def __len__(self) -> int:
        return self.num_rows

    @property
    def has_labels(self) -> bool:
        return self.manifest.has_labels

    @property
    def vocab_size(self) -> int:
        """The size of the tokenizer's vocabulary (every token id is below it)."""
        try:
            value = self.manifest.vocab_size
        except (TypeError, ValueError):
            value = None
        if value is None:
            raise FormatError(
                f"{self.path / MANIFEST_FILE}: the manifest records no tokenizer vocab_size "
                "(a pre-tokenized pack records one when packed with --vocab-size N or "
                "--tokenizer)"
            )
        return value

    @property
    def references_units(self) -> bool:
        """True for a merge without copying: the shards lie in the units' directories."""
        return any("/" in name for name in self.shard_files)

    def _check_shard_file(self, shard: int) -> None:
        """Before mapping a shard: it exists, has the size the manifest records, and, when it
        lies in a sub-directory (a unit's shard, referenced by a merge without copying), that
        directory's own manifest still lists it with the same rows and sha256. Hashing the
        bytes is left to ``packtool verify``."""
        path, name = self.shard_paths[shard], self.shard_files[shard]
        entry = self.manifest.shards[shard]
        referenced = "/" in name
        whose = (
            f"a shard of {self.path}, referenced where the unit wrote it (merged without "
            "copying): restore it, or pack that unit again (`packtool pack ... --units N "
            "--unit I --overwrite`) and run `packtool merge`"
            if referenced
            else f"a shard of {self.path} (run `packtool verify`)"
        )
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise FormatError(
                f"{path}: cannot read shard: the file is missing; it is {whose}"
            ) from None
        except OSError as e:
            raise FormatError(f"{path}: cannot read shard: {e}") from e
        if _is_count(entry.bytes) and size != entry.bytes:
            raise FormatError(
                f"{path}: cannot read shard: {size} bytes, the manifest records "
                f"{entry.bytes} (altered or truncated); it is {whose}"
            )
        if referenced:
            directory, _, file = name.rpartition("/")
            listed = self._listed_in(directory).get(file)
            if listed is None or (listed.rows, listed.bytes, listed.sha256) != (
                entry.rows,
                entry.bytes,
                entry.sha256,
            ):
                raise FormatError(
                    f"{path}: {self.path / directory} no longer holds the shard the merge "
                    f"listed (it was packed again or altered); run `packtool merge {self.path}`"
                )

    def _listed_in(self, directory: str) -> dict[str, ShardEntry]:
        """The shards that the packed dataset in ``directory`` (relative) lists, by file."""
        listed = self._referenced.get(directory)
        if listed is None:
            where = self.path / directory
            try:
                manifest = read_manifest(where)
            except FormatError as e:
                raise FormatError(
                    f"{where}: the unit that {self.path} references is not readable ({e}); "
                    f"pack it again and run `packtool merge {self.path}`"
                ) from e
            listed = {s.file: s for s in manifest.shards}
            self._referenced[directory] = listed
        return listed

    def shard_table(self, shard: int, copy: Path | None = None) -> pa.Table:
        """The rows of one shard, memory-mapped (zero-copy).

        In a merge without copying, a unit's shard numbers its documents within the unit;
        ``doc_ids`` are returned numbered over the whole corpus (plus the shard's
        ``doc_offset``), like every other column as stored. ``copy``: a local copy of the
        shard's bytes to read instead (``verify`` of a store output downloads each shard
        once, hashes it, then reads its rows from that copy).
        """
        table = self._tables.get(shard)
        if table is None:
            path = self.shard_paths[shard]
            self._check_shard_file(shard)
            try:
                table = self._read_shard(shard, copy)
                # A damaged shard can parse and still hold lengths or offsets that point
                # outside its buffers; reading such rows would crash the process.
                table.validate(full=True)
            except (OSError, pa.ArrowException, UnicodeDecodeError) as e:
                raise FormatError(f"{path}: cannot read shard: {e}") from e
            problem = schema_problem(table.schema, self.max_len, self.has_labels)
            if problem:
                raise FormatError(f"{path}: {problem} (run `packtool verify`)")
            if table.num_rows != self.shard_rows[shard]:
                raise FormatError(
                    f"{path}: shard holds {table.num_rows} rows, the manifest says "
                    f"{self.shard_rows[shard]} (run `packtool verify`)"
                )
            if isinstance(path, StorePath) and self.cache_dir is None:
                self._tables.clear()  # streamed: one shard in memory at a time
            if self._doc_offsets[shard]:
                table = _offset_doc_ids(table, self._doc_offsets[shard])
            self._tables[shard] = table
        return table

    def release(self, shard: int) -> None:
        """Unmap shard ``shard`` (read again on its next use): for a reader that visits each
        shard once and wants one mapped at a time."""
        self._tables.pop(shard, None)

    def _read_shard(self, shard: int, copy: Path | None = None) -> pa.Table:
        path: AnyPath = copy if copy is not None else self.shard_paths[shard]
        if isinstance(path, StorePath) and self.cache_dir is not None:
            path = self._cached(path, self.manifest.shards[shard])
        if isinstance(path, StorePath):
            with arrow_input(path) as source:
                return pa.ipc.open_stream(source).read_all()
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_stream(source).read_all()

    def _cached(self, path: StorePath, entry: ShardEntry) -> Path:
        """The local copy of a shard on a store, fetched once into :attr:`cache_dir` under
        its sha256 (so a copy is never stale), its bytes hashed as they arrive."""
        assert self.cache_dir is not None
        if not entry.sha256:
            raise FormatError(f"{path}: the manifest records no sha256 to cache the shard by")
        local = self.cache_dir / f"{entry.sha256}.arrow"
        if local.is_file() and (not _is_count(entry.bytes) or local.stat().st_size == entry.bytes):
            return local
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            part = local.with_name(f".{local.name}.{os.getpid()}-{threading.get_ident()}")
            digest = sha256_of(path, copy_to=part)
        except OSError as e:
            raise FormatError(f"{path}: cannot copy the shard into {self.cache_dir}: {e}") from e
        if digest != entry.sha256:
            part.unlink(missing_ok=True)
            raise FormatError(
                f"{path}: the shard's sha256 is {digest[:12]}..., the manifest "
                f"records {entry.sha256[:12]}... (run `packtool verify`)"
            )
        os.replace(part, local)
        return local

    def iter_tables(self, columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
        """Each shard in order, restricted to ``columns``."""
        for shard in range(len(self.shard_paths)):
            table = self.shard_table(shard)
            yield table.select(list(columns)) if columns is not None else table

    def locate(self, row: int) -> tuple[int, int]:
        """(shard, row within shard) of global row ``row``."""
        if not 0 <= row < self.num_rows:
            raise RowIndexError(
                f"row {row} is out of range: {self.path} has {self.num_rows} rows "
                f"(0 to {self.num_rows - 1})"
            )
        shard = int(np.searchsorted(self._starts, row, side="right") - 1)
        return shard, row - int(self._starts[shard])

    def row(self, row: int) -> PackedRow:
        """Row ``row`` (0-based, over all shards in order)."""
        shard, local = self.locate(row)
        rec = self.shard_table(shard).slice(local, 1)

        def fixed(name: str) -> np.ndarray:
            return rec.column(name).chunk(0).flatten().to_numpy(zero_copy_only=False)

        def ragged(name: str) -> np.ndarray:
            return np.asarray(rec.column(name)[0].values.to_numpy(zero_copy_only=False))

        return PackedRow(
            index=row,
            input_ids=fixed("input_ids"),
            position_ids=fixed("position_ids"),
            cu_seqlens=ragged("cu_seqlens"),
            num_tokens=int(rec.column("num_tokens")[0].as_py()),
            doc_ids=ragged("doc_ids"),
            chunk_ids=ragged("chunk_ids"),
            labels=fixed("labels") if self.has_labels else None,
        )

    def __getitem__(self, row: int) -> PackedRow:
        return self.row(row)

    def load_tokenizer(self) -> Any:
        """The tokenizer the dataset was packed with: the copy of its ``tokenizer.json``
        kept in the output, with the special-token ids recorded in the manifest."""
        from .tokenize import SpecialTokens, load_tokenizer

        m = self.manifest
        path = self.path / m.tokenizer_file
        if not path.exists():
            raise FormatError(f"{self.path}: the output holds no tokenizer.json to decode with")
        tokenizer = load_tokenizer(path)
        tokenizer.name = m.tokenizer.get("name", tokenizer.name)
        special = m.special_tokens
        if m.pad_from != "tokenizer":  # the padding is not its pad
            special["pad_id"] = tokenizer.special.pad_id
        tokenizer.special = SpecialTokens(**special)
        return tokenizer


def _offset_doc_ids(table: pa.Table, offset: int) -> pa.Table:
    """``table`` with ``offset`` added to every ``doc_ids`` value (the other columns as they
    are, still memory-mapped)."""
    index = table.schema.get_field_index("doc_ids")
    docs = table.column(index).combine_chunks()
    values = np.asarray(docs.values.to_numpy(zero_copy_only=False), dtype=np.int64) + offset
    shifted = pa.ListArray.from_arrays(docs.offsets, _int_array(values, np.int64))
    return table.set_column(index, table.schema.field(index), shifted)


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


def layout_problems(path: AnyPath, manifest: Manifest) -> list[str]:
    """The files of the dataset at ``path`` that disagree with its manifest: shards it does not
    list, a ``state.json`` naming other shards, a tokenizer copy that is missing or altered."""
    found: list[str] = []
    listed = [s.file for s in manifest.shards]
    for stray in sorted(p.name for p in path.glob("*.arrow")):
        if stray not in listed:
            found.append(
                f"{stray} is not a shard of the manifest (load_dataset('arrow', "
                "data_files='*.arrow') would read it too): remove it"
            )
    state_path = path / "state.json"
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
        state_files = [f["filename"] for f in state["_data_files"]]
    except FileNotFoundError:
        found.append("state.json is missing: datasets.load_from_disk cannot open this")
    except (OSError, ValueError, KeyError, TypeError) as e:
        found.append(f"state.json is unreadable ({type(e).__name__}: {e})")
    else:
        if state_files != listed:
            found.append(
                "state.json lists other shards than the manifest: "
                "datasets.load_from_disk would read other rows"
            )
    if manifest.tokenizer_copied:
        tok_path = path / Path(manifest.tokenizer_file).name
        if not tok_path.is_file():
            found.append(f"{tok_path.name} (the tokenizer copy) is missing")
        elif manifest.tokenizer_sha256 != hashlib.sha256(tok_path.read_bytes()).hexdigest():
            found.append(
                f"{tok_path.name} does not match the sha256 recorded in the manifest: "
                "it is not the tokenizer the data was packed with"
            )
    return found


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _manifest_problem(manifest: dict[str, Any]) -> str | None:
    """The first thing that makes ``manifest`` unusable for reading rows, or None.

    Shard files must be plain names inside the dataset directory: a manifest cannot make a
    reader open ``../../somewhere``.
    """
    max_len = manifest["max_len"]
    if not _is_count(max_len) or max_len < 1:
        return f"'max_len' is {max_len!r}, not a positive integer"
    columns = manifest["columns"]
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        return "'columns' is not a list of column names"
    shards = manifest["shards"]
    if not isinstance(shards, list):
        return "'shards' is not a list"
    for i, shard in enumerate(shards):
        problem = _shard_entry_problem(i, shard)
        if problem:
            return problem
    return None


def _shard_entry_problem(i: int, shard: Any) -> str | None:
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
    if not _is_count(shard.get("rows")):
        return f"shards[{i}].rows is {shard.get('rows')!r}, not a row count"
    if not _is_count(shard.get("doc_offset", 0)):
        return f"shards[{i}].doc_offset is {shard.get('doc_offset')!r}, not a document count"
    return None


def open_packed(
    path: str | os.PathLike[str] | StorePath, *, cache_dir: str | os.PathLike[str] | None = None
) -> PackedReader:
    """Open the packed dataset written by ``packtool pack`` at ``path``.

    An output on an object store is streamed a shard at a time; with ``cache_dir`` (a local
    directory), each shard is fetched once, checked against its recorded sha256, kept there
    under that hash and memory-mapped, as a local output is: a shuffled epoch then reads
    each shard from the store once, not once per visit. Raises
    :class:`~packtool.errors.FormatError` if the directory is not a complete packtool output
    or has a format version this packtool does not read.
    """
    cache = None if cache_dir is None else Path(cache_dir)
    return PackedReader(as_path(path), read_manifest(path), cache)
