"""Export a pack as a Megatron-LM indexed dataset: ``DIR/text_document.bin`` + ``.idx``.

This is the format ``megatron.core.datasets.indexed_dataset.IndexedDataset`` reads (what
Megatron-LM's ``tools/preprocess_data.py`` writes): train with
``--data-path DIR/text_document``. One sequence per document, in document-id order, its chunks
joined back in chunk order, EOS kept as packed, so packtool serves as Megatron's tokenizer::

    pack: rows   [b0 b1 b2 c0 c1 | a0 a1 a2 a3 P P | c2 c3 b3 ...]  (FFD, shuffled, split)
    export:      a0 a1 a2 a3 | b0 b1 b2 b3 | c0 c1 c2 c3               documents 0, 1, 2

``.bin`` holds the tokens, as ``uint16`` when the vocabulary has fewer than 65,500 ids and
``int32`` otherwise (Megatron's ``DType.optimal_dtype`` rule). ``.idx`` is little-endian::

    b"MMIDIDX\\x00\\x00"  <Q 1  <B dtype code (uint16 8, int32 4)
    <Q sequences  <Q len(document_indices)
    int32[sequences]   sequence lengths (tokens)
    int64[sequences]   sequence pointers (bytes into .bin)
    int64[documents+1] document_indices: 0, 1, ..., sequences (one sequence per document)
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError, OptionError
from ..format import PackedReader
from .common import (
    HashingWriter,
    RowColumn,
    SegmentIndex,
    pack_fingerprint,
    segment_index,
    token_blocks,
    write_export_manifest,
)
from .registry import PlainExporter

__all__ = ["PREFIX", "export_megatron", "megatron_dtype", "read_megatron_index"]

PREFIX = "text_document"
INDEX_HEADER = b"MMIDIDX\x00\x00"
DTYPE_CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}


def megatron_dtype(vocab_size: int) -> np.dtype:
    """Megatron's token dtype for a vocabulary: ``uint16`` below 65,500 ids, else ``int32``."""
    return np.dtype(np.uint16 if vocab_size < 65500 else np.int32)


def _documents(index: SegmentIndex) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Segments in document order, the documents' ids and their lengths in tokens."""
    order = index.document_order()
    doc = index.doc[order]
    chunk = index.chunk[order]
    new = np.ones(len(doc), dtype=bool)
    new[1:] = doc[1:] != doc[:-1]
    starts = np.flatnonzero(new)
    # chunks of a document must be 0, 1, ..., k-1: nothing missing, nothing twice
    expected = np.arange(len(doc)) - np.repeat(starts, np.diff(np.append(starts, len(doc))))
    bad = np.flatnonzero(chunk != expected)
    if bad.size:
        d = int(doc[bad[0]])
        raise FormatError(
            f"document {d} has chunks {sorted(index.chunk[index.doc == d].tolist())}, not "
            "0..k-1: its tokens cannot be joined back (run `packtool verify`)"
        )
    lengths = np.add.reduceat(index.length[order], starts) if len(doc) else np.zeros(0, np.int64)
    return order, doc[starts], lengths


def export_megatron(reader: PackedReader, staging: Path) -> dict[str, Any]:
    """Write ``text_document.bin`` / ``.idx`` of the pack into ``staging``; return the record
    for ``export.json``."""
    if reader.has_labels:
        raise OptionError(
            f"{reader.path} holds instruction data (a labels column), and a Megatron-LM indexed "
            "dataset has no loss masks: export it with --to megatron-bridge"
        )
    vocab_size = reader.vocab_size
    dtype = megatron_dtype(vocab_size)
    index = segment_index(reader)
    order, doc_ids, lengths = _documents(index)
    column = RowColumn(reader, "input_ids")
    files = {}
    bin_name, idx_name = f"{PREFIX}.bin", f"{PREFIX}.idx"
    with HashingWriter(staging / bin_name) as data:
        for block in token_blocks(column, index, order):
            if block.size and (block.min() < 0 or block.max() > np.iinfo(dtype).max):
                raise FormatError(
                    f"{reader.path}: token id {int(block.max())} does not fit Megatron's "
                    f"{dtype.name} for a vocabulary of {vocab_size}"
                )
            data.write(block.astype(dtype))
        files[bin_name] = data.close()
    pointers = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1] * dtype.itemsize, out=pointers[1:])
    with HashingWriter(staging / idx_name) as idx:
        idx.write(INDEX_HEADER)
        idx.write(struct.pack("<Q", 1))
        idx.write(struct.pack("<B", DTYPE_CODES[dtype]))
        idx.write(struct.pack("<Q", len(lengths)))
        idx.write(struct.pack("<Q", len(lengths) + 1))
        idx.write(lengths.astype("<i4"))
        idx.write(pointers.astype("<i8"))
        idx.write(np.arange(len(lengths) + 1, dtype="<i8"))
        files[idx_name] = idx.close()
    return write_export_manifest(
        staging,
        {
            "to": "megatron",
            "source": pack_fingerprint(reader),
            "data_path": PREFIX,
            "dtype": dtype.name,
            "vocab_size": vocab_size,
            "documents": len(lengths),
            "tokens": int(lengths.sum()),
            "first_doc_id": int(doc_ids[0]) if len(doc_ids) else None,
            "files": files,
        },
    )


def read_megatron_index(path: Path) -> dict[str, Any]:
    """Parse a ``.idx`` file (packtool's own reader, for ``verify``): dtype, lengths,
    pointers, document_indices."""
    raw = path.read_bytes()
    problem = None
    if raw[:9] != INDEX_HEADER:
        problem = "bad header"
    elif struct.unpack_from("<Q", raw, 9)[0] != 1:
        problem = "version is not 1"
    if problem:
        raise FormatError(f"{path}: {problem}: not a Megatron indexed dataset index")
    code = struct.unpack_from("<B", raw, 17)[0]
    dtypes = {v: k for k, v in DTYPE_CODES.items()}
    if code not in dtypes:
        raise FormatError(f"{path}: dtype code {code} is not one packtool writes")
    sequences, documents = struct.unpack_from("<QQ", raw, 18)
    at = 34
    lengths = np.frombuffer(raw, "<i4", sequences, at)
    at += lengths.nbytes
    pointers = np.frombuffer(raw, "<i8", sequences, at)
    at += pointers.nbytes
    document_indices = np.frombuffer(raw, "<i8", documents, at)
    at += document_indices.nbytes
    if at != len(raw):
        raise FormatError(f"{path}: {len(raw) - at} bytes after the document indices")
    return {
        "dtype": dtypes[code],
        "lengths": lengths,
        "pointers": pointers,
        "document_indices": document_indices,
    }


def megatron_problems(reader: PackedReader, dest: Path, record: dict[str, Any]) -> list[str]:
    """Differences between a Megatron export and the pack: the index's structure, then every
    document segment's tokens at the place the export must hold them."""
    idx = read_megatron_index(dest / f"{PREFIX}.idx")
    dtype = idx["dtype"]
    problems = []
    expected_dtype = megatron_dtype(reader.vocab_size)
    if dtype != expected_dtype:
        problems.append(f"dtype {dtype.name}, expected {expected_dtype.name}")
    index = segment_index(reader)
    order, _, lengths = _documents(index)
    if not np.array_equal(idx["lengths"], lengths):
        problems.append(
            f"{len(idx['lengths'])} sequences / {int(idx['lengths'].sum())} tokens in the "
            f"index; the pack has {len(lengths)} documents / {int(lengths.sum())} tokens"
        )
        return problems
    if not np.array_equal(idx["document_indices"], np.arange(len(lengths) + 1)):
        problems.append("document_indices are not 0, 1, ..., documents")
    pointers = np.concatenate([[0], np.cumsum(lengths * dtype.itemsize)])
    if not np.array_equal(idx["pointers"], pointers[:-1]):
        problems.append("sequence pointers do not follow the lengths")
    data = np.memmap(dest / f"{PREFIX}.bin", dtype=dtype, mode="r")
    if data.size != int(lengths.sum()):
        problems.append(f".bin holds {data.size} tokens, the index {int(lengths.sum())}")
        return problems
    # where each segment's tokens are in .bin: segments in document order, back to back
    offset = np.empty(len(index), dtype=np.int64)
    offset[order] = np.concatenate([[0], np.cumsum(index.length[order])[:-1]])
    column = RowColumn(reader, "input_ids")
    first = np.concatenate([[0], np.cumsum(index.per_row)])
    for r in range(reader.num_rows):
        row = column.row(r)
        for s in range(int(first[r]), int(first[r + 1])):
            start, n, at = int(index.start[s]), int(index.length[s]), int(offset[s])
            if not np.array_equal(data[at : at + n], row[start : start + n]):
                problems.append(
                    f"document {int(index.doc[s])} chunk {int(index.chunk[s])} (row {r}): "
                    f"tokens at {at} of .bin differ from the pack"
                )
                if len(problems) >= 20:
                    return problems
    return problems


EXPORTER = PlainExporter("megatron", export_megatron, megatron_problems)
"""``--to megatron``: the documents as a Megatron-LM indexed dataset."""
