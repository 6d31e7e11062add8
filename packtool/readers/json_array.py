"""JSON inputs holding one array of objects (or JSON Lines named .json): texts, records and
token-id columns. The array is loaded whole for texts and records; token-id columns stream
through pyarrow's parser, cut into elements by a NumPy scan.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator, Sequence
from typing import IO, Any

import numpy as np
import pyarrow as pa

from ..errors import InputError
from . import jsonl
from .batches import (
    ColumnBatch,
    RecordBatch,
    RecordCollector,
    TextBatch,
    parsed_columns,
    text_check,
    texts_of,
)
from .files import (
    InputFile,
    NoArrowCodec,
    arrow_stream,
    open_binary,
)
from .jsonl import ArrowFailed, arrow_json_piece


def _load_json_array(inp: InputFile, stream: IO[bytes]) -> list[Any]:
    """A whole JSON-array input, or an :class:`InputError` naming the line that is wrong."""
    try:
        data = json.load(stream)
    except UnicodeDecodeError as e:
        raise InputError(f"{inp.path}: invalid UTF-8 ({e.reason})") from None
    except json.JSONDecodeError as e:
        raise InputError(
            f"{inp.path}:{e.lineno}: malformed JSON: {e.msg} (column {e.colno})"
        ) from None
    except RecursionError:
        raise InputError(f"{inp.path}: JSON nested too deeply") from None
    if not isinstance(data, list):
        raise InputError(f"{inp.path}: expected a JSON array of objects or JSON Lines")
    return data


def read_texts(
    inp: InputFile, text_field: str, skip_bad: bool, batch_docs: int
) -> Iterator[TextBatch]:
    """The texts of a JSON array: its records reader, each element checked to be its text
    (JSON Lines named .json: the JSON Lines text reader, whose fast path is pyarrow's)."""
    stream, _ = open_binary(inp)
    with stream:
        head = stream.peek(64)[:64] if hasattr(stream, "peek") else b""
        if not head.lstrip().startswith(b"["):
            yield from jsonl.read_texts(inp, text_field, skip_bad, batch_docs)
            return
        data = _load_json_array(inp, stream)
    collect = RecordCollector(text_check(text_field), skip_bad)
    yield from texts_of(_elements(inp, data, collect, batch_docs))


def _array_columns(
    inp: InputFile, columns: Sequence[str], batch_rows: int
) -> Iterator[ColumnBatch]:
    """A JSON array of objects: streamed through pyarrow's parser (:class:`_ArrayScan`); if
    anything is irregular, parsed whole with ``json.load`` from the element it stopped at,
    to name the bad element exactly."""
    done = 0
    try:
        for batch in _json_array_arrow(inp, columns):
            done += batch.batch.num_rows
            yield batch
        return
    except ArrowFailed:
        pass
    stream, _ = open_binary(inp)
    with stream:
        data = _load_json_array(inp, stream)
    where = str(inp.path)
    for first in range(done, len(data), batch_rows):
        problems: dict[int, str] = {}
        batch = parsed_columns(data[first : first + batch_rows], columns, problems)
        progress = inp.size_bytes * min(len(data), first + batch_rows) // max(1, len(data))
        yield ColumnBatch(batch, progress, problems, lambda r, f=first: f"{where}: element {f + r}")


_JSON_ARRAY_WINDOW = 8 << 20  # bytes of a JSON array scanned at a time


class _ArrayScan:
    """Turns a JSON array of objects into pieces of whole elements for pyarrow's JSON parser:
    the array's brackets and the commas between its elements become line ends.

    The structure is found with NumPy over each window of bytes, state carried across
    windows, from the few bytes that can matter: quotes not escaped (an odd run of
    backslashes before them) open and close strings; outside strings, brackets change the
    depth; the comma that ends an element is the first byte not blank after a bracket that
    closes at depth 1. It only has to be right for valid JSON: every byte but the marks goes
    to pyarrow, which refuses what is not JSON (an element that is not an object too), and
    anything irregular here (text outside the array, an empty element, a second array)
    raises :class:`ArrowFailed`.
    """

    def __init__(self) -> None:
        self.in_string = False
        self.backslashes = 0  # the run of backslashes ending the previous window
        self.depth = 0
        self.opened = self.closed = False
        self.solid = False  # something not blank since the last mark
        self.after_element = False  # an element closed, its comma not seen yet
        self.last_kind = 0  # the last mark: 0 none, 1 '[', 2 ',', 3 ']'
        self.carry = b""  # transformed bytes after the last mark

    def _quotes(self, raw: bytes, w: np.ndarray) -> np.ndarray:
        """Positions of the quotes that are not escaped."""
        at = np.flatnonzero(w == 0x22)
        after_backslash = (w[np.maximum(at - 1, 0)] == 0x5C) & (at > 0)
        if at.size and at[0] == 0 and self.backslashes:
            after_backslash[0] = True
        escaped = np.zeros(at.size, bool)
        for k in np.flatnonzero(after_backslash).tolist():  # rare: strings with escapes
            i = j = int(at[k])
            while j > 0 and raw[j - 1] == 0x5C:
                j -= 1
            escaped[k] = (i - j + (self.backslashes if j == 0 else 0)) % 2 == 1
        return at[~escaped]

    @staticmethod
    def _next_solid(raw: bytes, at: int) -> int | None:
        """Where the first byte not blank at or after ``at`` is (``None``: none in ``raw``)."""
        for size in (64, len(raw)):  # a few blanks, as a rule: look at the start first
            piece = raw[at : at + size]
            rest = piece.lstrip()
            if rest:
                return at + len(piece) - len(rest)
        return None

    def feed(self, raw: bytes) -> tuple[bytes, int]:
        """The transformed bytes up to the last mark in ``raw`` (with what was carried), and
        how many elements end there."""
        w = np.frombuffer(raw, np.uint8)
        quotes = self._quotes(raw, w)
        folded = w | 0x20  # [ and ] fold onto { and }
        brackets = np.flatnonzero((folded == 0x7B) | (folded == 0x7D))
        brackets = brackets[(np.searchsorted(quotes, brackets) + self.in_string) % 2 == 0]
        step = np.where(folded[brackets] == 0x7B, 1, -1)
        depth = self.depth + np.cumsum(step)  # after each bracket
        start = brackets[(step == 1) & (depth == 1)]
        end = brackets[(step == -1) & (depth == 0)]
        if (
            (depth < 0).any()
            or (w[start] != 0x5B).any()
            or (w[end] != 0x5D).any()
            or start.size + self.opened > 1
            or end.size + self.closed > 1
            or (self.closed and raw.strip())
            or (end.size and raw[int(end[0]) + 1 :].strip())
            or (not self.opened and not start.size and raw.strip())
        ):
            raise ArrowFailed("not one JSON array of objects")
        after = [int(c) + 1 for c in brackets[(step == -1) & (depth == 1)]]
        if self.after_element:
            after.insert(0, 0)
        self.after_element = False
        commas = []
        for i, at in enumerate(after):  # per element, not per token
            solid = self._next_solid(raw, at)
            if solid is None:
                self.after_element = i == len(after) - 1  # its comma: in the next window
            elif raw[solid] == 0x2C:
                commas.append(solid)
            elif raw[solid] != 0x5D:
                raise ArrowFailed("no comma after an element")
        marks = np.sort(np.concatenate([start, np.array(commas, np.int64), end]))
        elements = 0
        previous = -1
        for m in marks.tolist():  # per element
            first = self._next_solid(raw, previous + 1)
            solid_before = (first is not None and first < m) or (previous < 0 and self.solid)
            kind = 1 if w[m] == 0x5B else 3 if w[m] == 0x5D else 2
            if kind == 1 and solid_before:
                raise ArrowFailed("text before the array")
            if kind > 1 and solid_before:
                elements += 1
            elif kind == 2 or (kind == 3 and self.last_kind != 1):
                raise ArrowFailed("an empty element")  # [1,,2], [1,], [,1]: json.load says
            self.last_kind, previous = kind, m
        tail_solid = self._next_solid(raw, previous + 1) is not None
        self.solid = tail_solid or (previous < 0 and self.solid)
        self.opened |= bool(start.size)
        self.closed |= bool(end.size)
        self.in_string = (quotes.size + self.in_string) % 2 == 1
        self.depth = int(depth[-1]) if depth.size else self.depth
        trailing = len(raw) - len(raw.rstrip(b"\\"))
        self.backslashes = trailing + (self.backslashes if trailing == len(raw) else 0)
        if not marks.size:
            self.carry += raw
            return b"", 0
        out = bytearray(raw)
        for m in marks.tolist():
            out[m] = 0x0A
        cut = len(self.carry) + int(marks[-1]) + 1
        data = self.carry + bytes(out)
        self.carry = data[cut:]
        return data[:cut], elements


def _json_array_arrow(inp: InputFile, columns: Sequence[str]) -> Iterator[ColumnBatch]:
    """:func:`_array_columns`' fast path; raises :class:`ArrowFailed` where the slow
    one must go on."""
    where = str(inp.path)
    try:
        stream, raw = arrow_stream(inp)
    except NoArrowCodec:
        raise ArrowFailed("no codec") from None
    import pyarrow.json as pj

    schema = pa.schema([(c, pa.list_(pa.int32())) for c in columns])
    parse = pj.ParseOptions(
        explicit_schema=schema, unexpected_field_behavior="ignore", newlines_in_values=True
    )
    options = pj.ReadOptions(block_size=1 << 20, use_threads=True)
    scan = _ArrayScan()
    element = 0
    try:
        while True:
            raw_bytes = stream.read(_JSON_ARRAY_WINDOW)
            if not raw_bytes:
                break
            piece, elements = scan.feed(raw_bytes)
            if not elements:
                continue
            table = arrow_json_piece(piece, parse, options)
            if table is None or table.num_rows != elements:
                raise ArrowFailed("irregular")
            batch = table.combine_chunks().to_batches()[0]
            yield ColumnBatch(
                batch, raw.tell(), {}, lambda r, f=element: f"{where}: element {f + r}"
            )
            element += elements
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"{where}: cannot read: {e}") from None
    finally:
        stream.close()
    if not scan.closed or scan.carry.strip():
        raise ArrowFailed("not one whole JSON array")


def read_records(
    inp: InputFile, collect: RecordCollector, batch_docs: int
) -> Iterator[RecordBatch]:
    """The elements of a JSON array made into records by ``collect`` (JSON Lines named .json:
    line by line)."""
    stream, _ = open_binary(inp)
    with stream:
        head = stream.peek(64)[:64] if hasattr(stream, "peek") else b""
        if not head.lstrip().startswith(b"["):
            yield from jsonl.read_records(inp, collect, batch_docs)
            return
        data = _load_json_array(inp, stream)
    yield from _elements(inp, data, collect, batch_docs)


def _elements(
    inp: InputFile, data: list[Any], collect: RecordCollector, batch_docs: int
) -> Iterator[RecordBatch]:
    """The elements of the array ``data`` of ``inp`` made into records by ``collect``."""
    for i, obj in enumerate(data):
        collect.add(obj, f"{inp.path}: element {i}")
        if len(collect.batch.records) >= batch_docs:
            yield collect.take(0)
    if collect.batch.records:
        yield collect.take(inp.size_bytes)


def read_columns(inp: InputFile, columns: Sequence[str], batch_rows: int) -> Iterator[ColumnBatch]:
    """The token-id list columns of a JSON array (JSON Lines named .json: as JSON Lines)."""
    stream, _ = open_binary(inp)
    with stream:
        head = stream.peek(64)[:64] if hasattr(stream, "peek") else b""
    if head.lstrip().startswith(b"["):
        yield from _array_columns(inp, columns, batch_rows)
    else:
        yield from jsonl.read_columns(inp, columns)
