"""Arrow IPC inputs (file or stream format): one reader of the columns asked for, batch by batch."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import pyarrow as pa

from ..errors import InputError
from ..fs import arrow_input, as_path
from .base import Request, TableReader
from .batches import TableSource, table_parts
from .files import InputFile


class ArrowInput(NamedTuple):
    source: Any  # to close
    schema: pa.Schema
    batches: Iterator[pa.RecordBatch]
    tell: Callable[[], int]  # bytes read so far, for progress


def open_arrow(where: str) -> ArrowInput:
    """An Arrow input, IPC file or stream, read batch by batch.

    Plain reads, not a memory map: every page of a mapped input read once stays resident, so
    memory grew with the input (99 MB and 171 MB peak for 25 MB and 100 MB files).
    """
    source = arrow_input(as_path(where))
    try:
        reader: Any = pa.ipc.open_file(source)
    except pa.ArrowInvalid:
        source.seek(0)
        try:
            stream: Any = pa.ipc.open_stream(source)
        except pa.ArrowInvalid as e:
            source.close()
            raise InputError(f"{where}: not an Arrow IPC file or stream: {e}") from e
        return ArrowInput(source, stream.schema, iter(stream), source.tell)
    count, size, done = reader.num_record_batches, as_path(where).stat().st_size, [0]

    def batches() -> Iterator[pa.RecordBatch]:
        for i in range(count):
            batch = reader.get_batch(i)
            done[0] = i + 1
            yield batch

    return ArrowInput(source, reader.schema, batches(), lambda: size * done[0] // max(1, count))


class ArrowFiles:
    """Several Arrow files (a saved dataset's shards) read one after another, batch by
    batch, as one :class:`ArrowInput`."""

    def __init__(self, files: list[str]) -> None:
        self.files = files
        self.sizes = [as_path(f).stat().st_size for f in files]
        self.current = open_arrow(files[0])
        self.before = 0  # bytes of the files already read

    def batches(self) -> Iterator[pa.RecordBatch]:
        for i, path in enumerate(self.files):
            if i:
                self.current.source.close()
                self.before += self.sizes[i - 1]
                self.current = open_arrow(path)
            yield from self.current.batches

    def tell(self) -> int:
        return self.before + self.current.tell()

    def close(self) -> None:
        self.current.source.close()

    def as_input(self) -> ArrowInput:
        return ArrowInput(self, self.current.schema, self.batches(), self.tell)


def open_table(where: str, files: list[str], columns: Sequence[str], what: str) -> TableSource:
    """The rows of ``columns`` of the Arrow ``files`` (one input, ``where``) read one after
    another, batch by batch as stored; a read error is ``cannot read {what}``. Nothing is
    read until they are iterated."""
    arrow = ArrowFiles(files).as_input()

    def batches() -> Iterator[pa.RecordBatch]:
        return (b.select(list(columns)) for b in arrow.batches)

    parts = table_parts(where, batches, lambda rows: arrow.tell(), what)
    return TableSource(arrow.schema, parts, arrow.source.close)


class ArrowReader(TableReader):
    """Arrow IPC, file or stream format."""

    kind = "arrow"
    suffixes = (".arrow",)

    def open_table(self, inp: InputFile, request: Request) -> TableSource:
        return open_table(str(inp.path), [str(inp.path)], request.fields, "Arrow data")


READER = ArrowReader()
