"""Arrow IPC inputs (file or stream format), read batch by batch: texts, records, columns."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import pyarrow as pa

from ..errors import InputError
from ..fs import arrow_input, as_path
from .batches import (
    TableSource,
    TextBatch,
    check_column,
    check_table_columns,
    table_texts,
)
from .files import (
    InputFile,
)


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


def read_texts(
    inp: InputFile, text_field: str, skip_bad: bool, batch_docs: int
) -> Iterator[TextBatch]:
    source, schema, batches, tell = open_arrow(str(inp.path))
    try:
        check_column(schema, text_field, str(inp.path))
        yield from table_texts(batches, text_field, str(inp.path), skip_bad, batch_docs, tell)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{inp.path}: cannot read Arrow data: {e}") from e
    finally:
        source.close()


def read_table(
    where: str, files: list[str], columns: Sequence[str]
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """The record batches of ``columns`` of Arrow ``files`` read one after another, each with
    how far into them (bytes) it ends."""
    arrow = ArrowFiles(files).as_input()
    try:
        check_table_columns(arrow.schema.names, columns, where)
        for b in arrow.batches:
            yield b.select(list(columns)), arrow.tell()
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{where}: cannot read Arrow data: {e}") from e
    finally:
        arrow.source.close()


def table_source(inp: InputFile) -> TableSource:
    """The rows of an Arrow input (records). Nothing is read until the batches are iterated."""
    source, schema, batches, tell = open_arrow(str(inp.path))
    return TableSource(list(schema.names), batches, tell, source.close)
