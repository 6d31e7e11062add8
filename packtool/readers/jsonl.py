"""JSON Lines (plain, gzip or zstd): texts, records and token-id columns.

The fast paths are pyarrow's JSON parser over bounded pieces of whole lines; when one fails, or
when bad records are to be skipped, a line-by-line reader finds the exact line and what is
wrong with it. A piece by bytes names its lines counted from the start of the file.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

import numpy as np
import pyarrow as pa

from ..errors import BadRecordError, InputError
from ..fs import open_input
from .batches import (
    ColumnBatch,
    RecordBatch,
    RecordCollector,
    TextBatch,
    check_record,
    is_straddling,
    parsed_columns,
)
from .files import (
    InputFile,
    NoArrowCodec,
    arrow_stream,
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
    def __init__(self, path: Any, offset: int, *, records: bool = False) -> None:
        self.path, self.offset, self.records = path, offset, records
        self._count: int | None = None

    def count(self) -> int:
        """Line breaks before ``offset`` (``records``: non-blank lines before it)."""
        if self._count is None:
            count, left, carry = 0, self.offset, b""
            with open_input(self.path) as f:
                while left > 0:
                    block = f.read(min(_SCAN_BLOCK, left))
                    if not block:
                        break
                    left -= len(block)
                    if self.records:
                        lines = (carry + block).split(b"\n")
                        carry = lines.pop()
                        count += sum(1 for line in lines if line.strip())
                    else:
                        count += block.count(b"\n")
            self._count = count
        return self._count


_SCAN_BLOCK = 1 << 20


def _line_locator(inp: InputFile) -> Callable[[int], Any]:
    """``location(lineno)``: where line ``lineno`` of the stream of ``inp`` is, as
    ``file:line`` counted from the start of the file (for a piece too)."""
    span = part_of(inp, "bytes")
    if span is None or span[0] == 0:
        return lambda lineno: f"{inp.path}:{lineno}"
    before = _LinesBefore(inp.path, span[0])
    return lambda lineno: _LineAt(before, lineno)


def _numbered_lines(inp: InputFile, stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """The non-blank lines of ``stream`` with their 1-based line numbers; a read error (a
    truncated or corrupt compressed file) becomes an :class:`InputError` naming the place."""
    lineno = 0
    while True:
        try:
            line = stream.readline()
        except (OSError, EOFError, ValueError, zlib.error) as e:
            after = f" after line {lineno}" if lineno else ""
            raise InputError(f"{inp.path}: cannot read{after}: {e}") from e
        if not line:
            return
        lineno += 1
        if line.strip():
            yield lineno, line


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


def _jsonl_python(
    inp: InputFile, text_field: str, skip_bad: bool, batch_docs: int
) -> Iterator[TextBatch]:
    """The texts line by line. (Not the records reader with :func:`text_check`: that was 3-10%
    slower on short records.)"""
    stream, counter = open_binary(inp)
    locate = _line_locator(inp)
    with stream:
        batch = TextBatch([])
        for lineno, line in _numbered_lines(inp, stream):
            location = locate(lineno)
            try:
                obj = _parse_json_line(line, location)
                batch.texts.append(check_record(obj, text_field, location))
            except BadRecordError as e:
                if not skip_bad:
                    raise e.with_skip_hint() from None
                batch.texts.append(None)
                batch.bad.append(e)
            if len(batch.texts) >= batch_docs:
                batch.bytes_done = counter.count
                yield batch
                batch = TextBatch([])
        batch.bytes_done = inp.size_bytes
        if batch.texts:
            yield batch


_NULL_FIRST = re.compile(rb"[ \t\r]*null")  # at the start of a piece of whole lines


_NULL_LINE = re.compile(rb"\n[ \t\r]*null")  # at the start of any later line


_JSONL_CHUNK = 8 << 20  # bytes of whole lines parsed at a time by the fast JSONL path


def _line_chunks(stream: pa.NativeFile, size: int = _JSONL_CHUNK) -> Iterator[memoryview]:
    """``stream`` in pieces of about ``size`` bytes, each ending at a line end (the last one
    at the end of the input), so that each piece holds whole lines."""
    carry: list[bytes] = []  # the start of a line longer than a chunk, so far
    while True:
        chunk = stream.read(size)
        if not chunk:
            if carry:
                yield memoryview(b"".join(carry))
            return
        cut = chunk.rfind(b"\n") + 1
        if cut == 0:  # kept in pieces: joining each time would copy a long line over and over
            carry.append(chunk)
            continue
        data = b"".join([*carry, chunk]) if carry else chunk
        cut += len(data) - len(chunk)
        carry = [data[cut:]] if cut < len(data) else []
        yield memoryview(data)[:cut]


def _jsonl_arrow(inp: InputFile, text_field: str, batch_docs: int) -> Iterator[TextBatch]:
    """pyarrow's JSON parser over bounded pieces of whole lines; raises ArrowFailed on
    anything irregular.

    pyarrow's own streaming reader reads ahead without bound while its consumer (the
    tokenizer) is slower, buffering most of the input in memory; parsing one piece at a time
    keeps memory flat whatever the input's size. Each piece is also checked for a line that
    starts with the JSON value ``null``: pyarrow's JSON reader (up to at least 26.0) crashes
    the process with a segmentation fault on such a line at the start of a block; it is a
    bad record anyway, so the line-by-line reader takes over there.
    """
    import pyarrow.json as pj

    stream, raw = arrow_stream(inp)
    parse = pj.ParseOptions(
        explicit_schema=pa.schema([(text_field, pa.string())]),
        unexpected_field_behavior="ignore",
    )
    try:
        for piece in _line_chunks(stream):
            if _NULL_FIRST.match(piece) or _NULL_LINE.search(piece):
                raise ArrowFailed("a line holds a top-level null")
            table = pj.read_json(
                pa.py_buffer(piece),
                read_options=pj.ReadOptions(block_size=len(piece) + 1, use_threads=False),
                parse_options=parse,
            )
            column = table.column(0)
            if column.null_count:
                raise ArrowFailed("null or missing text")
            texts = column.to_pylist()
            for i in range(0, len(texts), batch_docs):
                yield TextBatch(texts[i : i + batch_docs], bytes_done=raw.tell())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, UnicodeDecodeError) as e:
        raise ArrowFailed(str(e)) from e
    finally:
        stream.close()


class ArrowFailed(Exception):
    pass


def read_texts(
    inp: InputFile, text_field: str, skip_bad: bool, batch_docs: int
) -> Iterator[TextBatch]:
    if skip_bad:
        yield from _jsonl_python(inp, text_field, True, batch_docs)
        return
    done = 0  # records already yielded by the fast path
    try:
        for batch in _jsonl_arrow(inp, text_field, batch_docs):
            done += len(batch.texts)
            yield batch
        return
    except (ArrowFailed, NoArrowCodec) as failure:
        arrow_message = str(failure)
    # The fast path stopped: re-read line by line to continue (no bad record: the fast path
    # was only pickier) or to name the exact line that is wrong.
    seen = 0
    for batch in _jsonl_python(inp, text_field, False, batch_docs):
        if seen + len(batch.texts) <= done:
            seen += len(batch.texts)
            continue
        skip = max(0, done - seen)
        seen += len(batch.texts)
        batch.texts = batch.texts[skip:]
        yield batch
    del arrow_message  # the line-by-line reader read everything: the fast path was pickier


def records_before(inp: InputFile) -> Callable[[], int]:
    """For a piece of JSON Lines by bytes: ``count()``, the records (non-blank lines) of the
    file before it, counted when first asked (to name a row in an error), once."""
    span = part_of(inp, "bytes")
    if span is None or span[0] == 0:
        return lambda: 0
    return _LinesBefore(inp.path, span[0], records=True).count


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


def _jsonl_python_piece(
    piece: memoryview,
    columns: Sequence[str],
    where: str,
    line0: int,
    bytes_done: int,
    before: Callable[[], int],
) -> ColumnBatch:
    """One piece of whole JSON lines parsed line by line: exact places for bad records."""
    objs: list[Any] = []
    lines: list[int] = []
    problems: dict[int, str] = {}
    for k, line in enumerate(bytes(piece).split(b"\n")):
        if not line.strip():
            continue
        lines.append(line0 + k + 1)
        try:
            objs.append(_parse_json_line(line, f"{where}:{line0 + k + 1}"))
        except BadRecordError as e:
            problems[len(objs)] = e.problem
            objs.append(None)
    batch = parsed_columns(objs, columns, problems)
    return ColumnBatch(batch, bytes_done, problems, lambda r: f"{where}:{before() + lines[r]}")


def read_columns(inp: InputFile, columns: Sequence[str]) -> Iterator[ColumnBatch]:
    """JSON Lines (plain, gzip or zstd) through pyarrow's JSON parser, piece by piece.

    Each piece of whole lines is parsed with the columns typed as lists of int32 (a value
    that is not one fails the piece); a piece that fails, holds a null record or a top-level
    null line (pyarrow's reader crashes on those, see :func:`_jsonl_arrow`), or whose
    records are not one per line, is parsed again line by line to name the exact record.
    """
    import pyarrow.json as pj

    where = str(inp.path)
    try:
        stream, raw = arrow_stream(inp)
        tell: Callable[[], int] = raw.tell
    except NoArrowCodec:
        stream, counter = open_binary(inp)  # type: ignore[assignment]
        tell = lambda: counter.count  # noqa: E731
    schema = pa.schema([(c, pa.list_(pa.int32())) for c in columns])
    parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    threaded = pj.ReadOptions(block_size=1 << 20, use_threads=True)
    line0 = 0  # lines of the stream before the piece; a range of a file: ``before()`` more
    span = part_of(inp, "bytes")
    before = (lambda: 0) if not span or not span[0] else _LinesBefore(inp.path, span[0]).count
    try:
        for piece in _line_chunks(stream, _JSONL_CHUNK):
            lines = int(np.count_nonzero(np.frombuffer(piece, np.uint8) == 0x0A))
            lines += 0 if piece[-1:] == b"\n" else 1
            fast = _jsonl_arrow_piece(piece, parse, threaded)
            line_of: np.ndarray | None = None
            if fast is not None and fast.num_rows != lines:
                line_of = _nonblank_lines(piece)  # blank lines: the records' own lines
                if line_of.size != fast.num_rows:  # two objects on a line: a bad record
                    fast = None
            if fast is None:
                yield _jsonl_python_piece(piece, columns, where, line0, tell(), before)
            elif line_of is None:
                yield ColumnBatch(
                    fast, tell(), {}, lambda r, l0=line0: f"{where}:{before() + l0 + r + 1}"
                )
            else:
                lines_of = line_of + line0 + 1
                yield ColumnBatch(
                    fast, tell(), {}, lambda r, at=lines_of: f"{where}:{before() + int(at[r])}"
                )
            line0 += lines
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"{where}: cannot read after line {line0}: {e}") from None
    finally:
        stream.close()


def _jsonl_arrow_piece(piece: memoryview, parse: Any, threaded: Any) -> pa.RecordBatch | None:
    """The piece parsed by pyarrow, or ``None`` where it must be read line by line."""
    table = arrow_json_piece(piece, parse, threaded)
    return table.combine_chunks().to_batches()[0] if table is not None and table.num_rows else None


def arrow_json_piece(piece: bytes | memoryview, parse: Any, options: Any) -> pa.Table | None:
    """Whole JSON records parsed by pyarrow with the columns' types, or ``None`` where they
    must be parsed in Python to name a bad record (a null, a value of another type)."""
    import pyarrow.json as pj

    if _NULL_FIRST.match(piece) or _NULL_LINE.search(piece):
        return None
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


def first_fields(inp: InputFile) -> list[str] | None:
    """The keys of the first JSON object of a JSON Lines or JSON array input."""
    stream, _ = open_binary(inp)
    with stream:
        head = stream.peek(64)[:64] if hasattr(stream, "peek") else b""
        if head.lstrip().startswith(b"["):
            text = stream.read(1 << 20).decode("utf-8", errors="replace").lstrip()[1:]
            try:
                obj, _end = json.JSONDecoder().raw_decode(text.lstrip())
            except (json.JSONDecodeError, RecursionError):
                return None
            return list(obj) if isinstance(obj, dict) else None
        for _ in range(100):
            line = stream.readline()
            if not line:
                return None
            if not line.strip():
                continue
            try:
                obj = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
                continue
            if isinstance(obj, dict):
                return list(obj)
    return None


def read_records(
    inp: InputFile, collect: RecordCollector, batch_docs: int
) -> Iterator[RecordBatch]:
    """The JSON objects of a JSON Lines input, one a line, made into records by ``collect``."""
    stream, counter = open_binary(inp)
    with stream:
        locate = _line_locator(inp)
        for lineno, line in _numbered_lines(inp, stream):
            location = locate(lineno)
            obj: Any = None
            error = None
            try:
                obj = _parse_json_line(line, location)
            except BadRecordError as e:
                error = e
            collect.add(obj, location, error)
            if len(collect.batch.records) >= batch_docs:
                yield collect.take(counter.count)
        if collect.batch.records:
            yield collect.take(inp.size_bytes)
