"""``pack``: read -> tokenize -> store -> plan (FFD) -> shuffle -> gather -> write.

Only per-item lengths and offsets live in memory; tokens go to a temporary on-disk store and
rows are gathered from it. The plan is a pure function of the item lengths and the options,
so the output is deterministic.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .errors import OptionError
from .format import (
    PackedBatch,
    ShardWriter,
    check_output_dir,
    remove_stale_temporaries,
    write_error,
)
from .packing import Overflow, first_fit_decreasing, lower_bound_rows, plan_rows
from .sources import InputFile, read_texts, resolve_inputs
from .store import TokenStore
from .tokenize import DocumentEncoder, HFTokenizer, Tokenizer, load_tokenizer

__all__ = ["DocumentCounts", "PackReport", "ProgressCallback", "pack"]

ProgressCallback = Callable[[str, int, "int | None"], None]
"""Called as ``progress(stage, completed, total)``; stages: ``tokenize`` (bytes of input),
``pack`` (items), ``write`` (rows). ``total`` is ``None`` when unknown."""

DEFAULT_SHARD_BYTES = 256 << 20
_BAD_RECORDS_KEPT = 20


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


@dataclass
class PackReport:
    """What ``pack`` did: counts, the packing figures and where the output is."""

    out_dir: Path
    max_len: int
    documents: DocumentCounts
    segments: int
    tokens: int  # real tokens in rows
    tokens_truncated: int  # tokens cut off by --overflow truncate
    tokens_dropped: int  # tokens of documents dropped by --overflow drop
    rows: int
    lower_bound_rows: int
    shards: int
    seconds: float
    bad_records: list[str] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def efficiency(self) -> float:
        """Real tokens / (rows x max_len)."""
        return self.tokens / (self.rows * self.max_len) if self.rows else 0.0

    @property
    def rows_over_lower_bound(self) -> int:
        return self.rows - self.lower_bound_rows

    @property
    def unpacked_slots(self) -> int:
        """Slots if every segment were padded to max_len instead (one row each)."""
        return self.segments * self.max_len

    @property
    def padding_saved(self) -> float:
        """Fraction of the unpacked slots that packing saves."""
        return 1.0 - self.rows / self.segments if self.segments else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Items:
    """Growing per-item arrays (an item is a segment to pack: a document or a chunk of one)."""

    offsets: list[np.ndarray] = field(default_factory=list)
    lengths: list[np.ndarray] = field(default_factory=list)
    doc_ids: list[np.ndarray] = field(default_factory=list)
    chunk_ids: list[np.ndarray] = field(default_factory=list)

    def add(self, offsets: np.ndarray, lengths: np.ndarray, docs: np.ndarray, chunks: np.ndarray):
        self.offsets.append(offsets.astype(np.int64))
        self.lengths.append(lengths.astype(np.int32))
        self.doc_ids.append(docs.astype(np.int64))
        self.chunk_ids.append(chunks.astype(np.int32))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        def cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
            return np.concatenate(parts) if parts else np.zeros(0, dtype)

        return (
            cat(self.offsets, np.int64),
            cat(self.lengths, np.int32),
            cat(self.doc_ids, np.int64),
            cat(self.chunk_ids, np.int32),
        )


def _segment_items(
    lengths: np.ndarray, empty: np.ndarray, max_len: int, overflow: Overflow
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """Items of one encoded batch: (document index in batch, chunk number, item length).

    ``split``: consecutive chunks of ``max_len``, the remainder last; ``truncate``: the first
    ``max_len`` tokens; ``drop``: none. Empty documents give no item.
    """
    long = lengths > max_len
    if overflow is Overflow.SPLIT:
        n_items = np.where(empty, 0, np.maximum(1, -(-lengths // max_len)))
    elif overflow is Overflow.TRUNCATE:
        n_items = np.where(empty, 0, 1)
    else:
        n_items = np.where(empty | long, 0, 1)
    doc = np.repeat(np.arange(lengths.size), n_items)
    first = np.concatenate([[0], np.cumsum(n_items)[:-1]]) if lengths.size else n_items
    chunk = np.arange(doc.size) - np.repeat(first, n_items)
    item_len = np.minimum(lengths[doc] - chunk * max_len, max_len)
    counts = {
        "packed": int(np.count_nonzero(~empty & ~long)),
        "split": int(np.count_nonzero(~empty & long)) if overflow is Overflow.SPLIT else 0,
        "truncated": int(np.count_nonzero(~empty & long)) if overflow is Overflow.TRUNCATE else 0,
        "dropped": int(np.count_nonzero(~empty & long)) if overflow is Overflow.DROP else 0,
        "empty": int(np.count_nonzero(empty)),
        "tokens_truncated": int((lengths[~empty & long] - max_len).sum())
        if overflow is Overflow.TRUNCATE
        else 0,
        "tokens_dropped": int(lengths[~empty & long].sum()) if overflow is Overflow.DROP else 0,
    }
    return doc, chunk, item_len, counts


def _gather(
    tokens: np.ndarray,
    item_off: np.ndarray,
    item_len: np.ndarray,
    item_doc: np.ndarray,
    item_chunk: np.ndarray,
    order: np.ndarray,
    row_starts: np.ndarray,
    plan_rows_block: np.ndarray,
    max_len: int,
    pad_id: int,
) -> PackedBatch:
    """Build the rows ``plan_rows_block`` (plan row numbers, in output order), vectorised."""
    n_rows = plan_rows_block.size
    counts = row_starts[plan_rows_block + 1] - row_starts[plan_rows_block]
    seg_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    n_items = int(seg_offsets[-1])
    local = np.arange(n_items) - np.repeat(seg_offsets[:-1], counts)
    items = order[np.repeat(row_starts[plan_rows_block], counts) + local]
    lens = item_len[items].astype(np.int64)
    ends_global = np.cumsum(lens)
    row_token_base = np.repeat(np.concatenate([[0], ends_global])[seg_offsets[:-1]], counts)
    seg_start = ends_global - lens - row_token_base  # start of each item within its row
    seg_end = seg_start + lens
    num_tokens = np.zeros(n_rows, np.int64)
    if n_items:
        np.add.at(num_tokens, np.repeat(np.arange(n_rows), counts), lens)

    total = int(lens.sum())
    intra = np.arange(total) - np.repeat(np.concatenate([[0], ends_global[:-1]]), lens)
    row_of_item = np.repeat(np.arange(n_rows), counts)
    dest = np.repeat(row_of_item * max_len + seg_start, lens) + intra
    src = np.repeat(item_off[items], lens) + intra

    input_ids = np.full(n_rows * max_len, pad_id, np.int32)
    input_ids[dest] = tokens[src]
    position_ids = (np.arange(max_len)[None, :] - num_tokens[:, None]).astype(np.int32).reshape(-1)
    position_ids[dest] = intra

    padded = num_tokens < max_len
    cu_counts = 1 + counts + padded
    cu_offsets = np.concatenate([[0], np.cumsum(cu_counts)]).astype(np.int64)
    cu_values = np.zeros(int(cu_offsets[-1]), np.int32)
    cu_values[np.repeat(cu_offsets[:-1] + 1, counts) + local] = seg_end
    cu_values[cu_offsets[1:][padded] - 1] = max_len
    return PackedBatch(
        input_ids=input_ids.reshape(n_rows, max_len),
        position_ids=position_ids.reshape(n_rows, max_len),
        cu_values=cu_values,
        cu_offsets=cu_offsets,
        num_tokens=num_tokens.astype(np.int32),
        doc_ids=item_doc[items],
        chunk_ids=item_chunk[items],
        seg_offsets=seg_offsets,
    )


def _parse_size(size: str | int) -> int:
    if isinstance(size, int):
        return size
    text = size.strip().upper().replace("IB", "B")
    units = (("KB", 1 << 10), ("MB", 1 << 20), ("GB", 1 << 30), ("B", 1))
    number, factor = text, 1
    for unit, unit_factor in units:
        if text.endswith(unit):
            number, factor = text[: -len(unit)].strip(), unit_factor
            break
    try:
        value = int(float(number) * factor)
    except ValueError:
        raise OptionError(f"--shard-size: cannot read {size!r} as a size (e.g. 256MB)") from None
    if value <= 0:
        raise OptionError(f"--shard-size must be positive, got {size!r}")
    return value


def pack(
    inputs: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    *,
    max_len: int,
    tokenizer: str | os.PathLike[str] | Tokenizer | None = None,
    text_field: str = "text",
    overflow: str | Overflow = Overflow.SPLIT,
    add_eos: bool = True,
    bos: bool | None = None,
    eos_token: str | None = None,
    bos_token: str | None = None,
    pad_id: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    rows_per_shard: int | None = None,
    shard_size: str | int = DEFAULT_SHARD_BYTES,
    overwrite: bool = False,
    skip_bad_records: bool = False,
    split: str | None = None,
    txt_unit: str = "line",
    progress: ProgressCallback | None = None,
) -> PackReport:
    """Pack ``inputs`` into rows of ``max_len`` tokens and write them to ``out_dir``.

    Documents are tokenized, EOS-terminated, split/truncated/dropped when longer than
    ``max_len`` (``overflow``), packed with first-fit-decreasing, shuffled with ``seed``
    (unless ``shuffle=False``), and written as Arrow shards plus a manifest (last). Returns a
    :class:`PackReport`. Raises :class:`~packtool.errors.PacktoolError` subclasses for user
    mistakes.
    """
    started = time.perf_counter()
    if not isinstance(max_len, int) or max_len < 2:
        raise OptionError(f"--max-len must be an integer >= 2, got {max_len!r}")
    try:
        overflow = Overflow(overflow)
    except ValueError:
        raise OptionError(
            f"--overflow must be one of split, truncate, drop; got {overflow!r}"
        ) from None
    if rows_per_shard is not None and rows_per_shard < 1:
        raise OptionError(f"--rows-per-shard must be >= 1, got {rows_per_shard}")
    out_path = Path(out_dir)
    check_output_dir(out_path, overwrite)
    remove_stale_temporaries(out_path)
    files = resolve_inputs(inputs)
    tok: Tokenizer
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        tok = load_tokenizer(tokenizer, eos_token=eos_token, bos_token=bos_token)
    else:
        tok = tokenizer
    encoder = DocumentEncoder(tok, add_eos=add_eos, bos=bos)
    if pad_id is None:
        pad_id = tok.special.pad_id if tok.special.pad_id is not None else tok.special.eos_id
    if pad_id is None:
        raise OptionError(
            f"tokenizer {tok.name} has neither a pad nor an EOS token: choose one with --pad-id"
        )
    row_bytes = 2 * 4 * max_len + 64
    if rows_per_shard is None:
        rows_per_shard = max(1, _parse_size(shard_size) // row_bytes)

    counts = DocumentCounts()
    tokens_truncated = tokens_dropped = 0
    bad_records: list[str] = []
    input_records: list[dict[str, Any]] = []
    total_bytes = sum(f.size_bytes for f in files)
    items = _Items()
    with TokenStore(out_path) as store:
        bytes_before = 0
        for inp in files:
            first_doc = counts.read
            for batch in read_texts(
                inp,
                text_field=text_field,
                skip_bad_records=skip_bad_records,
                split=split,
                txt_unit=txt_unit,
            ):
                base_doc = counts.read
                counts.read += len(batch.texts)
                counts.bad_records_skipped += len(batch.bad)
                for error in batch.bad:
                    if len(bad_records) < _BAD_RECORDS_KEPT:
                        bad_records.append(str(error))
                good = [i for i, t in enumerate(batch.texts) if t is not None]
                texts = [batch.texts[i] for i in good]
                encoded = encoder.encode(texts)  # type: ignore[arg-type]
                doc, chunk, item_len, c = _segment_items(
                    encoded.lengths, encoded.empty, max_len, overflow
                )
                for key in ("packed", "split", "truncated", "dropped", "empty"):
                    setattr(counts, key, getattr(counts, key) + c[key])
                tokens_truncated += c["tokens_truncated"]
                tokens_dropped += c["tokens_dropped"]
                base = store.append(encoded.ids)
                doc_offsets = encoded.offsets
                items.add(
                    base + doc_offsets[doc] + chunk.astype(np.int64) * max_len,
                    item_len,
                    base_doc + np.asarray(good, np.int64)[doc],
                    chunk,
                )
                if progress:
                    progress("tokenize", bytes_before + batch.bytes_done, total_bytes)
            bytes_before += inp.size_bytes
            input_records.append(_describe_input(inp, first_doc, counts.read - first_doc))
        counts.check()
        tokens = store.finish()
        item_off, item_len, item_doc, item_chunk = items.arrays()
        del items

        if progress:
            progress("pack", 0, int(item_len.size))
        row_of_item = first_fit_decreasing(item_len, max_len)
        order, row_starts = plan_rows(row_of_item, item_len)
        n_rows = int(row_starts.size - 1)
        if progress:
            progress("pack", int(item_len.size), int(item_len.size))
        output_order = (
            np.random.default_rng(seed).permutation(n_rows) if shuffle else np.arange(n_rows)
        )
        n_tokens = int(item_len.astype(np.int64).sum())
        with ShardWriter(
            out_path,
            max_len=max_len,
            num_rows=n_rows,
            rows_per_shard=rows_per_shard,
            overwrite=overwrite,
        ) as writer:
            block = max(1, min(rows_per_shard, (64 << 20) // row_bytes))
            for start in range(0, n_rows, block):
                plan_block = output_order[start : start + block]
                writer.write(
                    _gather(
                        tokens,
                        item_off,
                        item_len,
                        item_doc,
                        item_chunk,
                        order,
                        row_starts,
                        plan_block,
                        max_len,
                        pad_id,
                    )
                )
                if progress:
                    progress("write", start + plan_block.size, n_rows)
            if progress and n_rows == 0:
                progress("write", 0, 0)
            seconds = time.perf_counter() - started
            lower = lower_bound_rows(n_tokens, max_len)
            manifest = {
                "packtool_version": __version__,
                "created_unix": int(time.time()),
                "tokenizer": _describe_tokenizer(tok),
                "options": {
                    "max_len": max_len,
                    "text_field": text_field,
                    "overflow": overflow.value,
                    "add_eos": add_eos,
                    "bos": bos,
                    "pad_id": pad_id,
                    "shuffle": shuffle,
                    "seed": seed,
                    "rows_per_shard": rows_per_shard,
                    "skip_bad_records": skip_bad_records,
                    "split": split,
                    "txt_unit": txt_unit,
                },
                "inputs": input_records,
                "documents": asdict(counts),
                "segments": int(item_len.size),
                "tokens": {
                    "packed": n_tokens,
                    "truncated_away": tokens_truncated,
                    "dropped": tokens_dropped,
                },
                "rows": n_rows,
                "lower_bound_rows": lower,
                "rows_over_lower_bound": n_rows - lower,
                "efficiency": n_tokens / (n_rows * max_len) if n_rows else 0.0,
                "bad_records": bad_records,
                "seconds": round(seconds, 3),
            }
            if isinstance(tok, HFTokenizer):
                tok_copy = writer.staging / "tokenizer.json"
                try:
                    tok_copy.write_bytes(tok.json_bytes)
                except OSError as e:
                    raise write_error(e, tok_copy, "cannot write the tokenizer copy") from e
            manifest = writer.commit(manifest)
    seconds = time.perf_counter() - started
    return PackReport(
        out_dir=out_path,
        max_len=max_len,
        documents=counts,
        segments=int(item_len.size),
        tokens=n_tokens,
        tokens_truncated=tokens_truncated,
        tokens_dropped=tokens_dropped,
        rows=n_rows,
        lower_bound_rows=lower,
        shards=len(manifest["shards"]),
        seconds=seconds,
        bad_records=bad_records,
        manifest=manifest,
    )


def _describe_input(inp: InputFile, first_doc: int, documents: int) -> dict[str, Any]:
    return {
        "path": str(inp.path),
        "kind": inp.kind,
        "compression": inp.compression,
        "size_bytes": inp.size_bytes,
        "first_doc": first_doc,
        "documents": documents,
    }


def _describe_tokenizer(tok: Tokenizer) -> dict[str, Any]:
    if isinstance(tok, HFTokenizer):
        info = tok.describe()
        info["file"] = "tokenizer.json"
        return info
    return {
        "name": tok.name,
        "sha256": tok.sha256,
        "special_tokens": {
            "eos_id": tok.special.eos_id,
            "bos_id": tok.special.bos_id,
            "pad_id": tok.special.pad_id,
        },
    }
