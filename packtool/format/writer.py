"""Writing a packed dataset: rows (:class:`PackedBatch`) into shards through
:class:`ShardWriter`, in a staging directory committed by one rename, the manifest last
(:func:`write_dataset` is ``pack``'s and a copying merge's write tail); and the commit of
shards that already lie in place (:func:`commit_in_place`, a merge without copying).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import io
import json
import os
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .chunks import REPACK_FILE, LostChunks
from .manifest import MANIFEST_FILE, Manifest, ShardEntry, shard_entry_problem
from .metadata import write_metadata
from .output import (
    check_output_dir,
    fsync_path,
    move_into_place,
    remove_stale_temporaries,
    shard_name,
    staging_dir,
    write_error,
    write_json,
)
from .schema import Per, columns, hf_features, int_array, packed_schema, seq_lengths

__all__ = ["PackedBatch", "ShardWriter", "commit_in_place", "write_dataset"]


@dataclass(frozen=True)
class PackedBatch:
    """Rows ready to write, as NumPy arrays.

    ``input_ids``, ``position_ids`` (and ``labels``) are ``[rows, max_len]`` int32.
    Ragged per-row lists are flat values plus offsets: row ``r``'s ``cu_seqlens`` is
    ``cu_values[cu_offsets[r]:cu_offsets[r + 1]]``; ``doc_ids`` and ``chunk_ids`` share
    ``seg_offsets``. ``cu_unpadded`` (an aligned pack only): the ``cu_seqlens_unpadded``
    values, split at ``cu_offsets`` too.
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
    source_ids: np.ndarray | None = None  # a mixture's: one per segment, as doc_ids
    cu_unpadded: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def aligned(self) -> bool:
        return self.cu_unpadded is not None

    def to_table(self) -> pa.Table:
        """The rows as an Arrow table of :func:`packed_schema` (the arrays as they are, where
        their type is the column's)."""
        max_len = self.input_ids.shape[1]
        with_labels, sources = self.labels is not None, self.source_ids is not None
        arrays = []
        for column in columns(with_labels, aligned=self.aligned, sources=sources):
            dtype = column.value.to_pandas_dtype()
            if column.per is Per.TOKEN:
                flat = int_array(getattr(self, column.name).reshape(-1), dtype)
                arrays.append(pa.FixedSizeListArray.from_arrays(flat, max_len))
            elif column.per is Per.ROW:
                arrays.append(int_array(getattr(self, column.name), dtype))
            else:
                values, offsets = self._ragged(column.name)
                arrays.append(
                    pa.ListArray.from_arrays(int_array(offsets, np.int32), int_array(values, dtype))
                )
        schema = packed_schema(max_len, with_labels, aligned=self.aligned, sources=sources)
        return pa.Table.from_arrays(arrays, schema=schema)

    def _ragged(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """The values and offsets of a per-segment (or per-boundary) column."""
        if name == "cu_seqlens":
            return self.cu_values, self.cu_offsets
        if name == "cu_seqlens_unpadded":
            assert self.cu_unpadded is not None
            return self.cu_unpadded, self.cu_offsets
        if name == "seq_lengths":
            return seq_lengths(self.cu_values, self.cu_offsets, self.num_tokens, self.cu_unpadded)
        return getattr(self, name), self.seg_offsets


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
        added: bool = True,
        aligned: bool = False,
        sources: bool = False,
    ) -> None:
        if rows_per_shard < 1:
            raise ValueError(f"rows_per_shard must be >= 1, got {rows_per_shard}")
        self.out_dir = Path(out_dir)
        self.max_len = max_len
        self.num_rows = num_rows
        self.rows_per_shard = rows_per_shard
        self.schema = packed_schema(max_len, with_labels, added, aligned, sources)
        self.overwrite = overwrite
        self.num_shards = max(1, -(-num_rows // rows_per_shard))
        check_output_dir(self.out_dir, overwrite)
        remove_stale_temporaries(self.out_dir)  # what killed runs of any command left
        self.staging = staging_dir(self.out_dir)
        self._shards: list[ShardEntry] = []  # the shards closed, in row order
        self._open_file: str | None = None  # the shard being written
        self._sink: pa.ipc.RecordBatchStreamWriter | None = None
        self._sink_file: Any = None
        self._rows_in_shard = 0
        self._rows_written = 0
        self._committed = False
        self._repack: list[ShardEntry] = []

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
        name = shard_name(len(self._shards), self.num_shards)
        path = self.staging / name
        self._open_file = name
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
        assert self._open_file is not None
        path = self.staging / self._open_file
        try:
            self._sink.close()
            self._sink_file.close()  # flushes and fsyncs (_HashingFile.close): the manifest
            # must never reach the disk before the rows it lists
        except OSError as e:
            raise write_error(e, path, "cannot write shard") from e
        self._sink = self._sink_file = None
        size = path.stat().st_size
        if size != self._hashing.size:  # pragma: no cover - a short write
            raise OSError(f"{path}: wrote {size} bytes, expected {self._hashing.size}")
        digest = self._hashing.digest.hexdigest()
        self._shards.append(ShardEntry(self._open_file, self._rows_in_shard, size, digest))
        self._open_file = None

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
                path = self.staging / str(self._open_file)
                raise write_error(e, path, "cannot write shard") from e
            self._rows_in_shard += take
            self._rows_written += take
            start += take
            if self._rows_in_shard == self.rows_per_shard:
                self._close_shard()

    def write_repack_record(self, lost: LostChunks) -> None:
        """Write the repack record (:mod:`.chunks`) beside the shards; the manifest lists it."""
        data = lost.to_bytes()
        path = self.staging / REPACK_FILE
        try:
            with open(path, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise write_error(e, path, "cannot write the repack record") from e
        self._repack = [lost.entry(data)]

    def refer_repack_records(self, entries: Sequence[ShardEntry]) -> None:
        """List repack records that lie elsewhere under ``out_dir`` (a merge's units')."""
        self._repack = list(entries)

    def commit(self, manifest: Mapping[str, Any]) -> Manifest:
        """Finish: metadata, the manifest last, then move into place. Returns the manifest."""
        if self._rows_written != self.num_rows:
            raise RuntimeError(
                f"wrote {self._rows_written} rows, expected {self.num_rows}: not committing"
            )
        if not self._shards and self._sink is None:  # an empty dataset: one (empty) shard
            self._open_shard()
        self._close_shard()
        write_metadata(self.staging, self.schema, self._shards)
        record = Manifest.committed(
            manifest,
            max_len=self.max_len,
            columns=self.schema.names,
            shards=self._shards,
            path=self.out_dir / MANIFEST_FILE,
            repack_files=self._repack,
        )
        write_json(self.staging / MANIFEST_FILE, record.to_dict())
        move_into_place(self.staging, self.out_dir, self.overwrite)
        self._committed = True
        return record


def commit_in_place(
    out_dir: str | os.PathLike[str],
    *,
    max_len: int,
    with_labels: bool,
    shards: Sequence[ShardEntry],
    manifest: Mapping[str, Any],
    added: bool = True,
    aligned: bool = False,
    repack_files: Sequence[ShardEntry] = (),
    sources: bool = False,
) -> Manifest:
    """Commit a dataset whose shards already lie under ``out_dir``: no row is written.

    ``shards`` are the manifest's entries (``file`` relative to ``out_dir``, ``rows``,
    ``bytes``, ``sha256``, ``doc_offset``), in row order; a merge without copying lists the
    units' shards this way. Any old manifest goes first, then the `datasets` metadata, then
    the new manifest (written aside and renamed), so ``out_dir`` never looks complete with
    metadata that does not match it. Returns the manifest.
    """
    out = Path(out_dir)
    schema = packed_schema(max_len, with_labels, added, aligned, sources)
    for i, entry in enumerate(shards):
        problem = shard_entry_problem(i, entry.to_record())
        if problem:
            raise ValueError(problem)
    (out / MANIFEST_FILE).unlink(missing_ok=True)
    write_metadata(out, schema, shards)
    record = Manifest.committed(
        manifest,
        max_len=max_len,
        columns=schema.names,
        shards=shards,
        path=out / MANIFEST_FILE,
        repack_files=repack_files,
    )
    aside = out / f".{MANIFEST_FILE}.packtool-tmp-{os.getpid()}"
    try:
        write_json(aside, record.to_dict())
        os.replace(aside, out / MANIFEST_FILE)
    finally:
        aside.unlink(missing_ok=True)
    fsync_path(out)
    return record


def write_dataset(
    writer: ShardWriter,
    blocks: Iterable[pa.Table | pa.RecordBatch],
    manifest: Callable[[], Mapping[str, Any]],
    *,
    tokenizer: Mapping[str, bytes | Path] | None = None,
    progress: Callable[[int], None] | None = None,
    repack: Callable[[], LostChunks | None] | None = None,
) -> Manifest:
    """The write tail of ``pack`` and of a copying merge: the rows of ``blocks`` through
    ``writer`` (entered here), the tokenizer's files (``tokenizer.json``, and its
    ``tokenizer_config.json`` if any: their bytes, or files to copy), then the manifest, made
    once the rows are written (so its ``seconds`` count the writing), and the commit.
    ``progress`` gets the rows written so far after each block (0 when none); ``repack``
    gives the repack record to write beside the shards, if any (:mod:`.chunks`)."""
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
        lost = repack() if repack is not None else None
        if lost is not None:
            writer.write_repack_record(lost)
        return writer.commit(manifest())
