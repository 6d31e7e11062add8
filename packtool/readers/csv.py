"""CSV inputs (plain, gzip or zstd): one reader, :func:`read`, pyarrow's CSV reader paced so
that it does not read ahead without bound; cells as strings, or as token-id lists."""

from __future__ import annotations

import csv
import io
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import BadRecordError, InputError
from ..limits import max_record_bytes, record_too_long
from .base import FieldReader, Request
from .batches import Records, Want, is_straddling
from .files import InputFile, arrow_stream


def read_header(inp: InputFile) -> list[str]:
    """The column names on the first line of a CSV input."""
    stream, _ = arrow_stream(inp)
    try:
        head = stream.read(1 << 16).decode("utf-8", errors="replace")
    except OSError as e:  # a corrupt compressed file
        raise InputError(f"{inp.path}: cannot read: {e}") from None
    finally:
        stream.close()
    try:
        return next(csv.reader(io.StringIO(head, newline="")), [])
    except csv.Error as e:  # e.g. a lone carriage return inside an unquoted header field
        raise InputError(f"{inp.path}: cannot read the CSV header: {e}") from None


_CSV_BLOCK = 4 << 20


_CSV_MAX_BLOCK = 1 << 30  # pyarrow's block size is a 32-bit int


class _PacedReader:
    """A file for pyarrow's CSV reader that keeps its reading thread at most ``ahead`` bytes
    in front of the consumer.

    pyarrow reads a CSV input ahead in a thread of its own without bound; with a consumer
    slower than the disk (the tokenizer) it ended up holding the whole input in memory
    (96 MB read after three 4 MB batches of a 101 MB file). The consumer reports what it
    took with :meth:`advance`; a read from another thread waits while too far ahead, at most
    ``_PACE_WAIT`` seconds at a time (so a row longer than ``ahead`` still gets read).
    """

    def __init__(self, stream: Any, ahead: int, block: int, end: bytes = b"") -> None:
        self.stream, self.ahead, self.block = stream, ahead, block
        self.end = end  # given once after the stream's last byte (:data:`_END_MARK`)
        self.delivered = self.consumed = 0
        self.closed = False
        self.consumer = threading.get_ident()
        self._cond = threading.Condition()

    def read(self, size: int = -1) -> bytes:
        with self._cond:
            if threading.get_ident() != self.consumer:
                self._cond.wait_for(
                    lambda: self.closed or self.delivered - self.consumed < self.ahead,
                    timeout=_PACE_WAIT,
                )
        data = self.stream.read() if size is None or size < 0 else self.stream.read(size)
        if not data and size != 0:
            data, self.end = self.end, b""
        with self._cond:
            self.delivered += len(data)
        return bytes(data)

    def advance(self, nbytes: int) -> None:
        with self._cond:
            self.consumed += nbytes
            self._cond.notify_all()

    def batches(self, reader: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``reader``'s batches, each reported as a block of the input taken."""
        for batch in reader:
            self.advance(self.block)
            yield batch

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self.delivered

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()


_PACE_WAIT = 1.0


class _CsvBlockTooSmall(Exception):
    """pyarrow's CSV reader met a row longer than its block size."""


def _bigger_blocks(
    inp: InputFile, read_pass: Callable[[int, int], Iterator[Records]]
) -> Iterator[Records]:
    """``read_pass(block, skip)`` with blocks of ``_CSV_BLOCK`` bytes, then, each time a row
    turns out longer than a block (pyarrow cannot read it), again with blocks 8x larger,
    skipping the ``skip`` records already given. Long cells are rare: the usual block keeps
    memory small, and a larger one is used only for the file that needs it."""
    block, done = _CSV_BLOCK, 0
    while True:
        try:
            for batch in read_pass(block, done):
                done += len(batch)
                yield batch
            return
        except _CsvBlockTooSmall as e:
            # A block that held the whole file (or the largest one pyarrow takes) failed:
            # the row is not the problem. A compressed file's size says nothing of its rows.
            limit = inp.size_bytes if inp.compression is None else _CSV_MAX_BLOCK
            if block >= min(limit, _CSV_MAX_BLOCK):
                raise InputError(f"{inp.path}: cannot read as CSV: {e}") from None
            longest = max_record_bytes()  # a row longer than that: an error, not a block
            if block >= longest:
                raise InputError(
                    record_too_long(f"{inp.path}: after row {done:,}", longest, "row")
                ) from None
            block = min(block * 8, _CSV_MAX_BLOCK, max(longest, _CSV_BLOCK))


_END_MARK = "\ufdd0packtool-csv-end\ufdd1"
"""The cell of a row packtool adds after a CSV input's last byte, one cell more than the
header has (so pyarrow hands it to :func:`_on_invalid_row`, which drops it). A quoted field
that is never closed runs to the end of the input: it swallows this row, which is then
missing, and the input is refused (:func:`_unterminated`). pyarrow (and Python's ``csv``)
read such a field as ending with the file, without a word: the rows after the quote became
one document."""


def _end_row(columns: int) -> bytes:
    return ("\n" + ",".join([_END_MARK] * (columns + 1)) + "\n").encode("utf-8")


def _on_invalid_row(
    inp: InputFile, sink: list[BadRecordError], ended: list[bool] | None = None
) -> Any:
    """pyarrow's ``invalid_row_handler``: a malformed row becomes a bad record in ``sink``
    (naming its line), and the reader goes on. The row of :data:`_END_MARK` is noted in
    ``ended`` instead."""

    def on_invalid(row: Any) -> str:
        if ended is not None and row.text.startswith(_END_MARK):
            ended.append(True)
            return "skip"
        where = f"{inp.path}:{row.number}" if row.number is not None else str(inp.path)
        sink.append(
            BadRecordError(
                where,
                f"malformed CSV row {row.text[:60]!r} ({row.actual_columns} columns, "
                f"expected {row.expected_columns})",
            )
        )
        return "skip"

    return on_invalid


def _string_columns(paced: Any, columns: Sequence[str], block: int, on_invalid: Any) -> Any:
    """pyarrow's streaming CSV reader of ``columns``, as strings (no type guessing, no nulls),
    ``block`` bytes at a time; ``on_invalid``: its handler of malformed rows."""
    import pyarrow.csv as pc

    return pc.open_csv(
        pa.PythonFile(paced, mode="r"),
        read_options=pc.ReadOptions(block_size=block, use_threads=False),
        parse_options=pc.ParseOptions(newlines_in_values=True, invalid_row_handler=on_invalid),
        convert_options=pc.ConvertOptions(
            include_columns=list(columns),
            column_types={c: pa.string() for c in columns},
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        ),
    )


def _drop(parts: Iterator[Records], n: int) -> Iterator[Records]:
    """``parts`` without their first ``n`` records (a pass that starts again)."""
    for part in parts:
        if n >= len(part):
            n -= len(part)
            continue
        if n:
            part, n = part.drop_first(n), 0
        yield part


def read(inp: InputFile, fields: Sequence[str], want: Want) -> Iterator[Records]:
    """The records of a CSV input (plain, gzip or zstd): the cells of ``fields`` as strings
    (token ids: lists of integers parsed from the cells, :func:`_int_list_cells`), a block
    at a time. A malformed row (too many or too few cells) is a bad record named by its
    line, placed before the rows of the block it is in."""
    yield from _bigger_blocks(
        inp, lambda block, skip: _drop(_csv_pass(inp, fields, want, block), skip)
    )


def _csv_pass(inp: InputFile, fields: Sequence[str], want: Want, block: int) -> Iterator[Records]:
    """One pass of pyarrow's CSV reader with blocks of ``block`` bytes."""
    where = str(inp.path)
    malformed: list[BadRecordError] = []
    ended: list[bool] = []
    on_invalid = _on_invalid_row(inp, malformed, ended)
    end = _end_row(len(read_header(inp)))
    stream, raw = arrow_stream(inp)
    paced = _PacedReader(stream, ahead=3 * block, block=block, end=end)
    row = 0  # records before this batch (malformed rows too)
    try:
        reader = _string_columns(paced, list(fields), block, on_invalid)
        for batch in paced.batches(reader):
            if malformed:  # rows pyarrow skipped: bad records, first
                yield _malformed(where, raw.tell(), malformed, row)
                row, malformed = row + len(malformed), []
            part = Records(where, raw.tell(), batch, row0=row)
            if want is Want.IDS:
                part = _id_lists(part, fields)
            yield part
            row += batch.num_rows
    except (pa.ArrowInvalid, OSError) as e:
        if is_straddling(e):
            raise _CsvBlockTooSmall(str(e)) from e
        raise InputError(f"{where}: cannot read as CSV: {e}") from e
    finally:
        paced.close()
        stream.close()
    if not ended:
        raise _unterminated(inp)
    if malformed:
        yield _malformed(where, inp.size_bytes, malformed, row)


def _unterminated(inp: InputFile) -> InputError:
    """The error of a CSV input whose last record opens a quoted field that is never
    closed, naming the line it starts on (read again with Python's ``csv``: only then)."""
    stream, _ = arrow_stream(inp)
    line = start = 1  # where the last record read starts, and where the next one does
    try:
        text = io.TextIOWrapper(pa.PythonFile(stream, mode="r"), "utf-8", "replace", newline="")
        reader = csv.reader(text)
        for _ in reader:
            line, start = start, reader.line_num + 1
    except (csv.Error, OSError):
        pass
    finally:
        stream.close()
    return InputError(
        f"{inp.path}:{line}: a quoted field that starts in the record on this line is never "
        "closed (a '\"' without its closing '\"'): the rest of the file would be read as one "
        "cell; close the quote, or double a '\"' that is part of a value ('\"\"')"
    )


def _malformed(where: str, bytes_done: int, errors: list[BadRecordError], row: int) -> Records:
    """Malformed rows as bad records (no values), each named by its line."""
    return Records(
        where,
        bytes_done,
        values=[None] * len(errors),
        bad=dict(enumerate(errors)),
        row0=row,
        places=[e.location for e in errors],
    )


def _id_lists(part: Records, fields: Sequence[str]) -> Records:
    """Cells holding lists of integers made list<int64> columns; a cell that is not one
    is null, and its record bad."""
    assert part.table is not None
    problems: dict[int, str] = {}
    arrays = []
    for name in fields:
        cells: dict[int, str] = {}  # this column's: its bad cells are null
        arrays.append(_int_list_cells(part.table.column(name), name, cells))
        for r, problem in cells.items():
            problems.setdefault(r, problem)
    part.table = pa.RecordBatch.from_arrays(arrays, names=list(fields))
    part.bad = {r: BadRecordError(part.locate(r), p) for r, p in problems.items()}
    return part


# A CSV cell holding a list of integers: "[1, 2, 3]" (pandas, json), "1 2 3", "[1 2 3]" (NumPy).
_INT_LIST_CELL = r"^\s*\[?\s*(-?\d+(\s*,\s*|\s+))*(-?\d+)?\s*,?\s*\]?\s*$"


_POW10 = 10 ** np.arange(19, dtype=np.int64)


def _int_list_cells(column: pa.Array, name: str, problems: dict[int, str]) -> pa.Array:
    """A string column of integer lists, one a cell (``"[1, 2, 3]"``, ``"1 2 3"``), as a
    list<int64> column, parsed with NumPy over the column's bytes (no Python per token).
    A cell that is not such a list goes into ``problems`` and is null."""
    import pyarrow.compute as pc

    n = len(column)
    column = column.cast(pa.large_string())
    ok = np.asarray(pc.match_substring_regex(column, _INT_LIST_CELL).fill_null(False), bool)
    for r in np.flatnonzero(~ok):
        cell = column[int(r)].as_py()
        problems.setdefault(int(r), f"{name!r} is {str(cell)[:40]!r}, not a list of integer ids")
    buffers = column.buffers()
    cell_off = np.frombuffer(buffers[1], np.int64, n + 1, column.offset * 8)
    data = np.frombuffer(buffers[2], np.uint8)[cell_off[0] : cell_off[-1]]
    cell_off = cell_off - cell_off[0]
    good = np.repeat(ok, np.diff(cell_off))
    digit = (data >= 0x30) & (data <= 0x39) & good
    part = digit | ((data == 0x2D) & good)  # a '-' is always right before a digit (checked)
    boundary = np.zeros(data.size + 1, bool)
    boundary[cell_off] = True
    before = np.concatenate([[False], part[:-1]]) & ~boundary[:-1]
    after = np.concatenate([part[1:], [False]]) & ~boundary[1:]
    starts = np.flatnonzero(part & ~before)
    ends = np.flatnonzero(part & ~after) + 1
    negative = data[starts] == 0x2D
    first_digit = starts + negative
    width = ends - first_digit
    too_long = width > 18
    if too_long.any():
        for t in np.flatnonzero(too_long):
            r = int(np.searchsorted(cell_off, starts[t], "right") - 1)
            problems.setdefault(r, f"{name!r} holds an integer too large for a token id")
    at = np.flatnonzero(digit)
    token = np.searchsorted(starts, at, "right") - 1
    place = np.minimum(ends[token] - 1 - at, 18)
    terms = (data[at] - 0x30).astype(np.int64) * _POW10[place]
    values = np.add.reduceat(terms, np.searchsorted(at, first_digit)) if at.size else terms
    values = np.where(negative, -values, values)
    record = np.searchsorted(cell_off, starts, "right") - 1
    offsets = np.concatenate([[0], np.cumsum(np.bincount(record, minlength=n))])
    bad = np.zeros(n, bool)
    bad[list(problems)] = True
    return pa.LargeListArray.from_arrays(
        pa.array(offsets.astype(np.int64)), pa.array(values), mask=pa.array(bad)
    )


class CsvReader(FieldReader):
    """CSV: the header names the columns before any row is read."""

    kind = "csv"
    suffixes = (".csv",)
    compressible = True
    schema_first = True

    def read(self, inp: InputFile, request: Request) -> Iterator[Records]:
        if request.check is not None:
            request.check(pa.schema([(name, pa.string()) for name in read_header(inp)]))
        yield from read(inp, request.fields, request.want)

    def first_fields(self, inp: InputFile, split: str | None) -> list[str] | None:
        try:
            return read_header(inp) or None
        except InputError:
            return None  # reading it for real names the problem


READER = CsvReader()
