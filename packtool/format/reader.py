"""Reading a packed dataset: :func:`open_packed` gives a :class:`PackedReader` of its rows
(memory-mapped where local; a shard at a time, or through a local cache, on a store), checked
against its manifest as each shard is first read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import FormatError, RowIndexError
from ..fs import AnyPath, StorePath, arrow_input, as_path
from .cache import cached_shard
from .manifest import MANIFEST_FILE, Manifest, ShardEntry, is_count, read_manifest
from .schema import Per, columns, int_array, schema_problem, seq_lengths

__all__ = ["PackedReader", "PackedRow", "Segment", "open_packed"]


@dataclass(frozen=True)
class Segment:
    """One segment of a row: a document (or chunk of one), or the padding tail.

    ``[start, end)`` are its tokens; in an aligned pack (``--pad-to-multiple-of``) a
    document's ``pad`` alignment pad tokens follow them, up to ``padded_end``."""

    start: int
    length: int
    doc_id: int | None  # None for the padding segment
    chunk_id: int | None
    pad: int = field(default=0, kw_only=True)  # the alignment pad after the document's tokens

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def padded_end(self) -> int:
        return self.start + self.length + self.pad

    @property
    def is_padding(self) -> bool:
        return self.doc_id is None


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
    cu_seqlens_unpadded: np.ndarray | None = None  # an aligned pack only

    @property
    def seq_lengths(self) -> np.ndarray:
        """The documents' segment lengths, then each pad of the padding tail on its own (the
        ``seq_lengths`` column, derived here also for a pack written before it)."""
        cu = np.asarray(self.cu_seqlens, dtype=np.int64)
        values, _ = seq_lengths(
            cu, np.array([0, cu.size]), np.array([self.num_tokens]), self.cu_seqlens_unpadded
        )
        return values.astype(np.int32)

    @property
    def real_lengths(self) -> np.ndarray:
        """Each segment's real tokens (int64; the padding tail's: 0 in an aligned pack, its
        length otherwise)."""
        if self.cu_seqlens_unpadded is None:
            return np.diff(np.asarray(self.cu_seqlens, dtype=np.int64))
        return np.diff(np.asarray(self.cu_seqlens_unpadded, dtype=np.int64))

    @property
    def segments(self) -> list[Segment]:
        """Document segments in order, then the padding segment if the row has one."""
        cu = self.cu_seqlens
        if len(self.chunk_ids) != len(self.doc_ids) or len(self.doc_ids) > len(cu) - 1:
            raise FormatError(
                f"row {self.index}: {len(self.doc_ids)} doc_ids and {len(self.chunk_ids)} "
                f"chunk_ids for {len(cu) - 1} segments (a damaged shard: run `packtool verify`)"
            )
        real = self.real_lengths.tolist() if self.cu_seqlens_unpadded is not None else None
        out = []
        for i in range(len(cu) - 1):
            start, end = int(cu[i]), int(cu[i + 1])
            if i < len(self.doc_ids):
                n = end - start if real is None else int(real[i])
                out.append(
                    Segment(
                        start, n, int(self.doc_ids[i]), int(self.chunk_ids[i]), pad=end - start - n
                    )
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
    def has_seq_lengths(self) -> bool:
        return self.manifest.has_seq_lengths

    @property
    def aligned(self) -> bool:
        """Whether the rows hold ``cu_seqlens_unpadded`` (packed with ``--pad-to-multiple-of``)."""
        return self.manifest.aligned

    @property
    def vocab_size(self) -> int:
        """The size of the tokenizer's vocabulary (every token id is below it)."""
        try:
            value = self.manifest.tokenizer.vocab_size
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
        if is_count(entry.bytes) and size != entry.bytes:
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
            problem = schema_problem(
                table.schema, self.max_len, self.has_labels, self.has_seq_lengths, self.aligned
            )
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
            path = cached_shard(path, self.manifest.shards[shard], self.cache_dir)
        if isinstance(path, StorePath):
            with arrow_input(path) as source:
                return pa.ipc.open_stream(source).read_all()
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_stream(source).read_all()

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
        values: dict[str, Any] = {}
        for column in columns(self.has_labels, aligned=self.aligned):
            if column.per is Per.SPAN:
                continue  # derived from cu_seqlens (PackedRow.seq_lengths)
            data = rec.column(column.name)
            if column.per is Per.TOKEN:
                values[column.name] = data.chunk(0).flatten().to_numpy(zero_copy_only=False)
            elif column.per is Per.ROW:
                values[column.name] = int(data[0].as_py())
            else:
                values[column.name] = np.asarray(data[0].values.to_numpy(zero_copy_only=False))
        return PackedRow(index=row, **values)

    def __getitem__(self, row: int) -> PackedRow:
        return self.row(row)

    def load_tokenizer(self) -> Any:
        """The tokenizer the dataset was packed with: the copy of its ``tokenizer.json``
        kept in the output, with the special-token ids recorded in the manifest."""
        from ..tokenize import SpecialTokens, load_tokenizer

        m = self.manifest
        path = self.path / (m.tokenizer.file or "tokenizer.json")
        if not path.exists():
            raise FormatError(f"{self.path}: the output holds no tokenizer.json to decode with")
        tokenizer = load_tokenizer(path)
        tokenizer.name = m.tokenizer.name or tokenizer.name
        special = m.tokenizer.special
        if m.tokenizer.pad_from != "tokenizer":  # the padding is not its pad
            special = replace(special, pad_id=tokenizer.special.pad_id)
        tokenizer.special = SpecialTokens(special.eos_id, special.bos_id, special.pad_id)
        return tokenizer


def _offset_doc_ids(table: pa.Table, offset: int) -> pa.Table:
    """``table`` with ``offset`` added to every ``doc_ids`` value (the other columns as they
    are, still memory-mapped)."""
    index = table.schema.get_field_index("doc_ids")
    docs = table.column(index).combine_chunks()
    values = np.asarray(docs.values.to_numpy(zero_copy_only=False), dtype=np.int64) + offset
    shifted = pa.ListArray.from_arrays(docs.offsets, int_array(values, np.int64))
    return table.set_column(index, table.schema.field(index), shifted)


def open_packed(
    path: str | os.PathLike[str] | StorePath,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    strict: bool = True,
) -> PackedReader:
    """Open the packed dataset written by ``packtool pack`` at ``path``.

    An output on an object store is streamed a shard at a time; with ``cache_dir`` (a local
    directory), each shard is fetched once, checked against its recorded sha256, kept there
    under that hash and memory-mapped, as a local output is: a shuffled epoch then reads
    each shard from the store once, not once per visit. Raises
    :class:`~packtool.errors.FormatError` if the directory is not a complete packtool output
    or has a format version this packtool does not read, or (``strict``) if its manifest
    holds a malformed value; not ``strict`` (``verify``, ``stats``), such a value reads as
    None and ``manifest.problems()`` names it.
    """
    cache = None if cache_dir is None else Path(cache_dir)
    return PackedReader(as_path(path), read_manifest(path, strict=strict), cache)
