"""JSON inputs holding one array of objects (or JSON Lines named .json): one reader,
:func:`read`. Texts and token-id columns stream through pyarrow's parser, cut into
elements by a NumPy scan; instruction records, and an array the stream finds irregular,
are loaded whole with ``json.load``.
"""

from __future__ import annotations

import functools
import json
import zlib
from collections.abc import Iterator, Sequence
from typing import IO, Any

import numpy as np
import pyarrow as pa

from ..errors import InputError
from ..limits import max_record_bytes, record_too_long
from . import jsonl
from .base import Request
from .batches import Records, Want
from .files import (
    InputFile,
    NoArrowCodec,
    arrow_stream,
    is_json_array,
    open_binary,
)
from .jsonl import arrow_json_piece, null_line


class ArrowFailed(Exception):
    """The streamed path met something irregular: the array is parsed whole instead."""


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


def _json_array_arrow(inp: InputFile, columns: Sequence[str], want: Want) -> Iterator[Records]:
    """The texts or token-id columns of a JSON array streamed through pyarrow; raises
    :class:`ArrowFailed` where it must be parsed whole."""
    where = str(inp.path)
    try:
        stream, raw = arrow_stream(inp)
    except NoArrowCodec:
        raise ArrowFailed("no codec") from None
    import pyarrow.json as pj

    kind = pa.string() if want is Want.TEXT else pa.list_(pa.int32())
    schema = pa.schema([(c, kind) for c in columns])
    parse = pj.ParseOptions(
        explicit_schema=schema, unexpected_field_behavior="ignore", newlines_in_values=True
    )
    threaded = pj.ReadOptions(block_size=1 << 20, use_threads=True)
    scan = _ArrayScan()
    element = 0
    limit = max_record_bytes()
    try:
        while True:
            raw_bytes = stream.read(_JSON_ARRAY_WINDOW)
            if not raw_bytes:
                break
            piece, elements = scan.feed(raw_bytes)
            if len(scan.carry) > limit:
                raise InputError(record_too_long(f"{where}: element {element}", limit, "element"))
            if not elements:
                continue
            options = threaded
            if want is Want.TEXT:  # one block, as JSON Lines texts
                options = pj.ReadOptions(block_size=len(piece) + 1, use_threads=False)
            table = None if null_line(piece) else arrow_json_piece(piece, parse, options)
            if table is None or table.num_rows != elements:
                raise ArrowFailed("irregular")
            yield Records(
                where,
                raw.tell(),
                table.combine_chunks().to_batches()[0],
                lines=lambda r, f=element: f"{where}: element {f + r}",
                reparse=functools.partial(_reparse, inp, element, elements),
            )
            element += elements
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"{where}: cannot read: {e}") from None
    finally:
        stream.close()
    if not scan.closed or scan.carry.strip():
        raise ArrowFailed("not one whole JSON array")


def _reparse(inp: InputFile, first: int, count: int) -> Records:
    """Elements ``[first, first + count)`` parsed by ``json.load`` (the whole array): where a
    streamed text does not convert (a surrogate written as raw UTF-8), to name it."""
    stream, _ = open_binary(inp)
    with stream:
        data = _load_json_array(inp, stream)
    return next(_elements(inp, data[: first + count], first, count))


def _elements(inp: InputFile, data: list[Any], first: int, batch_rows: int) -> Iterator[Records]:
    """The elements of the array ``data`` of ``inp`` from ``first`` on, as Python values."""
    where = str(inp.path)
    for start in range(first, len(data), batch_rows):
        stop = min(len(data), start + batch_rows)
        yield Records(
            where,
            inp.size_bytes * stop // max(1, len(data)),
            values=data[start:stop],
            lines=lambda r, f=start: f"{where}: element {f + r}",
        )


def read(inp: InputFile, fields: Sequence[str], want: Want, batch_rows: int) -> Iterator[Records]:
    """The elements of a JSON array (JSON Lines named .json: :func:`.jsonl.read`).

    Texts and token ids stream through pyarrow's parser (:class:`_ArrayScan`); if anything
    is irregular, and for instruction records, the array is loaded whole with ``json.load``
    (from the element the stream stopped at), which names a bad element exactly."""
    stream, _ = open_binary(inp)
    with stream:
        array = is_json_array(stream)
    if not array:
        yield from jsonl.read(inp, fields, want)
        return
    done = 0
    if want is not Want.RECORDS:
        try:
            for part in _json_array_arrow(inp, fields, want):
                done += len(part)
                yield part
            return
        except ArrowFailed:
            pass
    stream, _ = open_binary(inp)
    with stream:
        data = _load_json_array(inp, stream)
    yield from _elements(inp, data, done, batch_rows)


class JsonArrayReader(jsonl.JsonLinesReader):
    """``.json``: one JSON array (or JSON Lines named .json), read whole."""

    kind = "json"
    suffixes = (".json",)

    def read(self, inp: InputFile, request: Request) -> Iterator[Records]:
        return read(inp, request.fields, request.want, request.batch_rows)

    def cuts(self, inp: InputFile) -> None:
        return None


READER = JsonArrayReader()
