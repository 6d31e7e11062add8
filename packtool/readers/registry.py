"""The one table of input formats: each input kind and its reader (:class:`~.base.Reader`).

Every read, the suffixes that name a file's format, and the pieces a work unit may take of
an input go through this table. A new format is a module with its reader and one line in
:data:`BUILT_IN` (or a call of :func:`register`).
"""

from __future__ import annotations

from . import arrow, csv, hf_dataset, json_array, jsonl, megatron, parquet, txt
from .base import Reader
from .files import InputFile

BUILT_IN: tuple[Reader, ...] = (
    jsonl.READER,
    json_array.READER,
    parquet.READER,
    arrow.READER,
    csv.READER,
    txt.READER,
    megatron.READER,
    hf_dataset.READER,
)

FORMATS: dict[str, Reader] = {}


def register(reader: Reader) -> Reader:
    """Add ``reader`` to the table, for the inputs of its kind and the files of its suffixes."""
    if reader.kind in FORMATS:
        raise ValueError(f"input kind {reader.kind!r} has a reader already")
    claimed = {s: r.kind for r in FORMATS.values() for s in r.suffixes}
    taken = [s for s in reader.suffixes if s in claimed]
    if taken:
        raise ValueError(f"{taken[0]} names {claimed[taken[0]]!r} inputs already")
    FORMATS[reader.kind] = reader
    return reader


for _reader in BUILT_IN:
    register(_reader)


def reader_for(kind: str) -> Reader:
    """The reader of the inputs of ``kind``."""
    try:
        return FORMATS[kind]
    except KeyError:
        raise ValueError(f"unknown input kind {kind!r}") from None


def reader_of(inp: InputFile) -> Reader:
    """The reader of ``inp``."""
    return reader_for(inp.kind)


def suffix_readers() -> dict[str, Reader]:
    """Each file suffix of the table and the reader it names."""
    return {s: r for r in FORMATS.values() for s in r.suffixes}
