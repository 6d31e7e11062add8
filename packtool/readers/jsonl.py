"""JSON Lines (plain, gzip or zstd): one reader, :func:`read`, for texts, records and ids.

It reads bounded pieces of whole lines; pyarrow's JSON parser takes a piece where the fields
have one Arrow type (texts, token ids), ``json.loads`` line by line where it refuses one (to
name the bad line) and for instruction records. A piece by bytes names its lines counted from
the start of the file.
"""

from __future__ import annotations

import functools
import json
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import BadRecordError, InputError
from ..fs import open_input
from ..limits import max_record_bytes, record_too_long
from .base import Cuts, FieldReader, Request
from .batches import Records, Want, is_straddling
from .files import (
    BATCH_DOCS,
    InputFile,
    NoArrowCodec,
    arrow_stream,
    is_json_array,
    open_binary,
    part_of,
)


class _LineAt:
    """``file:line`` of a line of a piece, counted from the start of the file: the lines
    before the piece are counted when a location is first shown (an error), once per piece,
    so that reading a piece never reads the file before it."""

    def __init__(self, before: _LinesBefore, lineno: int) -> None:
        self.before, self.lineno = before, lineno

    def __str__(self) -> str:
        return f"{self.before.path}:{self.before.count() + self.lineno}"

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class _LinesBefore:
    def __init__(self, path: Any, offset: int) -> None:
        self.path, self.offset = path, offset
        self._count: int | None = None

    def count(self) -> int:
        """Line breaks before ``offset``."""
        if self._count is None:
            count, left = 0, self.offset
            with open_input(self.path) as f:
                while left > 0:
                    block = f.read(min(_SCAN_BLOCK, left))
                    if not block:
                        break
                    left -= len(block)
                    count += block.count(b"\n")
            self._count = count
        return self._count


_SCAN_BLOCK = 1 << 20


_BOM = b"\xef\xbb\xbf"


def _line_locator(inp: InputFile) -> Callable[[int], Any]:
    """``location(lineno)``: where line ``lineno`` of the stream of ``inp`` is, as
    ``file:line`` counted from the start of the file (for a piece too)."""
    span = part_of(inp, "bytes")
    if span is None or span[0] == 0:
        return lambda lineno: f"{inp.path}:{lineno}"
    before = _LinesBefore(inp.path, span[0])
    return lambda lineno: _LineAt(before, lineno)


def _parse_json_line(line: bytes, location: str) -> Any:
    """The JSON value on one line; :class:`BadRecordError` naming ``location`` if it is not."""
    try:
        return json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise BadRecordError(location, f"invalid UTF-8 ({e.reason})") from None
    except json.JSONDecodeError as e:
        raise BadRecordError(location, f"malformed JSON: {e.msg}") from None
    except RecursionError:
        raise BadRecordError(location, "JSON nested too deeply") from None


_NULL_FIRST = re.compile(rb"[ \t\r]*null")  # at the start of a piece of whole lines


_NULL_LINE = re.compile(rb"\n[ \t\r]*null")  # at the start of any later line


_JSONL_CHUNK = 8 << 20  # bytes of whole lines parsed at a time by the fast JSONL path
_FIRST_CHUNK = 1 << 20
"""The first piece of an input is smaller, and the next ones double up to :data:`_JSONL_CHUNK`:
the tokenizer's two batches wait for the first pieces (parsing 8 MB of text takes ~35 ms),
and later pieces are read while it works."""


_PYTHON_CHUNK = 1 << 20  # bytes of whole lines read at a time for json.loads (records)


class LineTooLong(Exception):
    """A line of the input is longer than :func:`~packtool.limits.max_record_bytes`: it is the
    first line after the pieces given so far."""


def _line_chunks(
    stream: pa.NativeFile,
    size: int = _JSONL_CHUNK,
    limit: int | None = None,
    first: int | None = None,
) -> Iterator[memoryview]:
    """``stream`` in pieces of about ``size`` bytes (if ``first`` is given, the first of about
    ``first``, each next one twice the last up to ``size``), each ending at a line end (the
    last one at the end of the input), so that each piece holds whole lines. A line longer
    than ``limit`` bytes raises :class:`LineTooLong` once that many bytes of it are read
    (memory bounded by the limit, not by the line)."""
    limit = max_record_bytes() if limit is None else limit
    carry: list[bytes] = []  # the start of a line longer than a chunk, so far
    carried = 0
    step = min(size, first or size)
    while True:
        chunk = stream.read(step)
        step = min(size, 2 * step)
        if not chunk:
            if carry:
                yield memoryview(b"".join(carry))
            return
        first = chunk.find(b"\n")
        if carried + (len(chunk) if first < 0 else first) > limit:
            raise LineTooLong(limit)
        cut = chunk.rfind(b"\n") + 1
        if cut == 0:  # kept in pieces: joining each time would copy a long line over and over
            carry.append(chunk)
            carried += len(chunk)
            continue
        data = b"".join([*carry, chunk]) if carry else chunk
        cut += len(data) - len(chunk)
        carry = [data[cut:]] if cut < len(data) else []
        carried = len(data) - cut
        yield memoryview(data)[:cut]


_BLANK = np.array([0x20, 0x09, 0x0D, 0x0A], np.uint8)


def _nonblank_lines(piece: memoryview) -> np.ndarray:
    """The 0-based numbers of the lines of ``piece`` that hold more than white space."""
    data = np.frombuffer(piece, np.uint8)
    ends = np.flatnonzero(data == 0x0A)
    if not data.size or data[-1] != 0x0A:
        ends = np.append(ends, data.size)
    starts = np.concatenate([[0], ends[:-1] + 1])
    solid = np.concatenate([[0], np.cumsum(~np.isin(data, _BLANK), dtype=np.int64)])
    return np.flatnonzero(solid[ends] > solid[starts])


def null_line(piece: bytes | memoryview) -> bool:
    """Whether a line of ``piece`` starts with the JSON value ``null`` (see
    :func:`_may_crash_pyarrow`)."""
    return bool(_NULL_FIRST.match(piece) or _NULL_LINE.search(piece))


def arrow_json_piece(piece: bytes | memoryview, parse: Any, options: Any) -> pa.Table | None:
    """Whole JSON records parsed by pyarrow with the columns' types, or ``None`` where they
    must be parsed in Python to name a bad record (a null, a value of another type). The
    caller has made sure that no line starts with ``null`` (:func:`null_line`)."""
    import pyarrow.json as pj

    try:
        try:
            table = pj.read_json(pa.py_buffer(piece), read_options=options, parse_options=parse)
        except pa.ArrowInvalid as e:
            if not is_straddling(e):
                raise
            big = pj.ReadOptions(block_size=len(piece) + 1, use_threads=False)
            table = pj.read_json(pa.py_buffer(piece), read_options=big, parse_options=parse)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if any(column.null_count for column in table.columns):
        return None  # missing or null: the Python reader says which
    return table


def _line_count(piece: memoryview) -> int:
    """The lines of a piece of whole lines (the last one may lack its line end).

    Line ends are looked for with ``bytes.find`` (memchr) while they are few, as in a corpus
    of long documents (eight times faster than a comparison of every byte); past
    :data:`_FINDS`, the rest are counted by NumPy."""
    if not piece.nbytes:
        return 0
    data = piece.obj if isinstance(piece.obj, bytes) else bytes(piece)
    start = _offset_in(piece) if data is piece.obj else 0
    end = start + piece.nbytes
    lines, at = 0, data.find(b"\n", start, end)
    while at >= 0:
        lines += 1
        if lines == _FINDS:
            rest = np.frombuffer(data, np.uint8, end - at - 1, at + 1)
            lines += int(np.count_nonzero(rest == 0x0A))
            break
        at = data.find(b"\n", at + 1, end)
    return lines + int(data[end - 1] != 0x0A)


_FINDS = 256


def _offset_in(piece: memoryview) -> int:
    """Where ``piece`` starts in the bytes object it views."""

    def address(data: Any) -> int:
        return int(np.frombuffer(data, np.uint8).__array_interface__["data"][0])

    return address(piece) - address(piece.obj)


def _may_crash_pyarrow(piece: memoryview, one_block: bool) -> bool:
    """Whether pyarrow's JSON reader could crash on ``piece``: it does (a segmentation
    fault, up to at least 26.0) on a line that starts with the JSON value ``null`` at the
    start of one of its blocks. Parsed as one block, only the first line is at a block's
    start; a ``null`` line further on is a null record, which the caller re-reads in Python
    anyway. Parsed in blocks, any line may be."""
    return bool(_NULL_FIRST.match(piece)) if one_block else null_line(piece)


def _python_piece(
    piece: memoryview,
    where: str,
    line0: int,
    bytes_done: int,
    locate: Callable[[int], Any],
    chunk: int = BATCH_DOCS,
) -> Iterator[Records]:
    """A piece of whole lines parsed line by line with ``json.loads``, ``chunk`` records at
    a time (a piece's records all alive at once made the garbage collector scan them over
    and over: 25% slower); a malformed line is a bad record, named by its line."""
    lines = bytes(piece).split(b"\n")
    loads = json.loads
    for first in range(0, len(lines), chunk):
        values: list[Any] = []
        places: list[Any] = []
        bad: dict[int, BadRecordError] = {}
        for k, line in enumerate(lines[first : first + chunk], line0 + first + 1):
            if not line.strip():
                continue
            location = locate(k)
            places.append(location)
            try:
                values.append(loads(line.decode("utf-8")))
            except (UnicodeDecodeError, ValueError, RecursionError):
                try:
                    _parse_json_line(line, location)  # raises, naming the problem
                except BadRecordError as e:
                    bad[len(values)] = e
                    values.append(None)
        if values:
            yield Records(where, bytes_done, values=values, bad=bad, places=places)


def _python_whole_piece(*args: Any) -> Records:
    """:func:`_python_piece` as one :class:`Records` (the re-parse of an Arrow piece)."""
    parts = list(_python_piece(*args, chunk=1 << 62))
    return parts[0] if parts else Records(args[1], args[3], values=[])


def _arrow_options(fields: Sequence[str], want: Want) -> tuple[Any, Any] | None:
    """pyarrow's parse and read options for ``want`` (``None``: records, parsed in Python)."""
    import pyarrow.json as pj

    if want is Want.TEXT:
        schema = pa.schema([(f, pa.string()) for f in fields])
        read = None  # one block: the whole piece, in this thread
    elif want is Want.IDS:
        schema = pa.schema([(f, pa.list_(pa.int32())) for f in fields])
        read = pj.ReadOptions(block_size=1 << 20, use_threads=True)
    else:
        return None
    return pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"), read


def _arrow_piece(piece: memoryview, options: tuple[Any, Any], lines: int) -> Any:
    """The piece parsed by pyarrow as a record batch and how its records map to lines
    (``None``: consecutive lines), or ``None`` where it must be parsed in Python: pyarrow
    refused it, a field is null or missing, or its records are not one a line."""
    import pyarrow.json as pj

    parse, read = options
    whole = pj.ReadOptions(block_size=len(piece) + 1, use_threads=False)
    table = arrow_json_piece(piece, parse, read or whole)
    if table is None or not table.num_rows:
        return None
    line_of = None
    if table.num_rows != lines:
        line_of = _nonblank_lines(piece)  # blank lines: the records' own lines
        if line_of.size != table.num_rows:  # two objects on a line: a bad record
            return None
    batches = table.to_batches()  # one block: one batch, not copied again
    return (batches[0] if len(batches) == 1 else table.combine_chunks().to_batches()[0]), line_of


def read(inp: InputFile, fields: Sequence[str], want: Want) -> Iterator[Records]:
    """The records of a JSON Lines input (plain, gzip or zstd; a piece by bytes), a piece of
    about 8 MB of whole lines at a time.

    Texts and token ids: each piece parsed by pyarrow with the fields typed (strings, lists
    of int32), in bounded pieces so that memory stays flat whatever the input's size
    (pyarrow's own streaming reader reads ahead without bound); a piece pyarrow refuses or
    that holds anything irregular is parsed line by line with ``json.loads``, which names
    the bad line. Instruction records: every piece line by line. Lines are named counted
    from the start of the file, for a piece too.
    """
    where = str(inp.path)
    try:
        stream, raw = arrow_stream(inp)
        tell: Callable[[], int] = raw.tell
    except NoArrowCodec:
        stream, counter = open_binary(inp)  # type: ignore[assignment]
        tell = lambda: counter.count  # noqa: E731
    locate = _line_locator(inp)
    options = _arrow_options(fields, want)
    line0 = 0  # lines of the stream before the piece
    span = part_of(inp, "bytes")
    at_start = span is None or span[0] == 0  # a byte-order mark can only be there
    try:
        chunks = (
            _line_chunks(stream, _JSONL_CHUNK, first=_FIRST_CHUNK)
            if options
            else _line_chunks(stream, _PYTHON_CHUNK)
        )
        for piece in chunks:
            if at_start:
                # A UTF-8 byte-order mark (Windows tools write one) is not part of the first
                # record: pyarrow skips it, json.loads would refuse the line.
                at_start = False
                if piece[:3] == _BOM:
                    piece = piece[3:]
                    if not len(piece):
                        continue  # a file of the mark alone: no record
            lines = _line_count(piece)
            fast = None
            if options is not None and not _may_crash_pyarrow(piece, options[1] is None):
                fast = _arrow_piece(piece, options, lines)
            done = tell()
            if fast is None:
                yield from _python_piece(piece, where, line0, done, locate)
            else:
                batch, line_of = fast
                at = (line0 + 1 + np.arange(lines)) if line_of is None else line0 + 1 + line_of
                yield Records(
                    where,
                    done,
                    batch,
                    lines=lambda r, at=at: locate(int(at[r])),
                    reparse=functools.partial(
                        _python_whole_piece, piece, where, line0, done, locate
                    ),
                )
            line0 += lines
    except LineTooLong as e:
        raise InputError(record_too_long(str(locate(line0 + 1)), e.args[0])) from None
    except (OSError, EOFError, zlib.error) as e:
        after = f" after line {line0}" if line0 else ""
        raise InputError(f"{where}: cannot read{after}: {e}") from None
    finally:
        stream.close()


def first_fields(inp: InputFile) -> list[str] | None:
    """The keys of the first JSON object of a JSON Lines or JSON array input."""
    stream, _ = open_binary(inp)
    with stream:
        if is_json_array(stream):
            text = stream.read(1 << 20).decode("utf-8", errors="replace").lstrip()[1:]
            try:
                obj, _end = json.JSONDecoder().raw_decode(text.lstrip())
            except (json.JSONDecodeError, RecursionError):
                return None
            return list(obj) if isinstance(obj, dict) else None
        limit = max_record_bytes()
        for k in range(100):
            line = stream.readline(limit + 1)
            if not line or len(line) > limit:
                return None  # none, or too long a line: reading the input names it
            if k == 0:
                line = line.removeprefix(_BOM)
            if not line.strip():
                continue
            try:
                obj = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
                continue
            if isinstance(obj, dict):
                return list(obj)
    return None


class JsonLinesReader(FieldReader):
    """JSON Lines: pieces by bytes (of an uncompressed file), cut after a line break."""

    kind = "jsonl"
    suffixes = (".jsonl", ".ndjson")
    compressible = True

    def read(self, inp: InputFile, request: Request) -> Iterator[Records]:
        return read(inp, request.fields, request.want)

    def first_fields(self, inp: InputFile, split: str | None) -> list[str] | None:
        try:
            return first_fields(inp)
        except Exception:  # a corrupt or truncated file (zlib, zstd...): reading names it
            return None

    def cuts(self, inp: InputFile) -> Cuts | None:
        return Cuts("bytes") if inp.compression is None else None


READER = JsonLinesReader()
