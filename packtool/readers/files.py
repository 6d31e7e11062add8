"""What an input is and how its bytes are opened.

An :class:`InputFile` is one input (:mod:`.inputs` finds them; a :class:`Piece` is a
contiguous part of one, a work unit's share); :func:`open_binary` and :func:`arrow_stream`
open one (decompressed; a piece by bytes gives only its range); :func:`guarded` turns
low-level read errors into one-line :class:`~packtool.errors.InputError`.
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import pyarrow as pa

from .._fields import attributes
from ..errors import InputError
from ..fs import AnyPath, arrow_input, open_input

BATCH_DOCS = 1024


TXT_UNITS = ("line", "paragraph", "document")


@dataclass(frozen=True)
class InputFile:
    """One input: a file, or a directory holding a dataset saved with `datasets`."""

    path: AnyPath  # a local Path, or a StorePath (a file on an object store)
    kind: str  # the format: a kind of the table of readers (jsonl, json, parquet, ...)
    compression: str | None
    size_bytes: int


@dataclass(frozen=True)
class Piece(InputFile):
    """A contiguous part of one input (a work unit's share of it), read by the same readers
    as the whole input.

    ``split_by`` is ``"file"`` (the whole input), ``"bytes"`` (bytes ``[start, stop)`` of an
    uncompressed JSON Lines file; both are line starts or the end), ``"row_groups"`` (row
    groups ``[start, stop)`` of a Parquet file) or ``"sequences"`` (sequences ``[start,
    stop)`` of a Megatron indexed dataset). ``size_bytes`` is the size of the piece,
    ``file_size`` that of the whole input. Errors name lines and rows counted from the start
    of the input, as a read of the whole input names them.
    """

    file_size: int = 0
    split_by: str = "file"
    start: int = 0
    stop: int = 0

    @property
    def whole(self) -> bool:
        return self.split_by == "file"

    def describe(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            **attributes(self, "kind compression file_size split_by start stop"),
        }


def part_of(inp: InputFile, split_by: str) -> tuple[int, int] | None:
    """``(start, stop)`` when ``inp`` is a piece cut by ``split_by``, else ``None`` (all of it)."""
    if isinstance(inp, Piece) and inp.split_by == split_by:
        return inp.start, inp.stop
    return None


class CountingReader(io.RawIOBase):
    """Counts bytes read from the underlying file (for progress on compressed inputs), and
    stops after ``limit`` bytes (a byte range of the file) if given."""

    def __init__(self, raw: IO[bytes], limit: int | None = None) -> None:
        self.raw = raw
        self.count = 0
        self.limit = limit

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self.limit is not None:
            room = self.limit - self.count
            if room <= 0:
                return 0
            if room < len(b):
                b = memoryview(b)[:room]
        n = self.raw.readinto(b)  # type: ignore[attr-defined]
        self.count += n or 0
        return n or 0

    def close(self) -> None:
        self.raw.close()
        super().close()


def open_binary(inp: InputFile) -> tuple[IO[bytes], CountingReader]:
    """The input's bytes (decompressed), and the counter of bytes read from the file. A piece
    by bytes gives only its range."""
    f = open_input(inp.path)
    span = part_of(inp, "bytes")
    if span is not None:
        f.seek(span[0])
    counter = CountingReader(f, None if span is None else span[1] - span[0])
    raw: IO[bytes] = io.BufferedReader(counter, 1 << 20)
    if inp.compression == "gzip":
        return gzip.GzipFile(fileobj=raw), counter  # type: ignore[return-value]
    if inp.compression == "zstd":
        if pa.Codec.is_available("zstd"):
            # pyarrow's decoder reports a truncated stream; zstandard's stream reader just
            # stops, which would lose the end of a damaged file without a word.
            native = pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), "zstd")
            return io.BufferedReader(native, 1 << 20), counter  # type: ignore[arg-type]
        import zstandard

        stream = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        return io.BufferedReader(stream, 1 << 20), counter  # type: ignore[arg-type]
    return raw, counter


def is_json_array(stream: IO[bytes]) -> bool:
    """Whether a JSON input holds one array (its first byte not blank is ``[``), not JSON
    Lines; ``stream`` is left where it was."""
    head = stream.peek(64)[:64] if hasattr(stream, "peek") else b""
    return head.lstrip().startswith(b"[")


class _ArrowRange:
    """Bytes ``[start, stop)`` of a file, read as a stream; ``tell()`` counts from ``start``."""

    def __init__(self, path: Any, start: int, stop: int) -> None:
        self.file = arrow_input(path)
        self.file.seek(start)
        self.left, self.done = stop - start, 0

    def read(self, size: int = -1) -> bytes:
        data = self.file.read(self.left if size < 0 else min(size, self.left))
        self.left -= len(data)
        self.done += len(data)
        return data  # type: ignore[no-any-return]

    def tell(self) -> int:
        return self.done

    def close(self) -> None:
        self.file.close()


def arrow_stream(inp: InputFile) -> tuple[Any, Any]:
    """(stream to parse, raw file whose tell() gives progress)."""
    span = part_of(inp, "bytes")
    if span is not None:
        ranged = _ArrowRange(inp.path, *span)
        return ranged, ranged
    raw = arrow_input(inp.path)
    if inp.compression is None:
        return raw, raw
    if inp.compression == "zstd" and not pa.Codec.is_available("zstd"):
        raise NoArrowCodec
    return pa.CompressedInputStream(raw, inp.compression), raw


class NoArrowCodec(Exception):
    pass


def guarded(inp: InputFile, batches: Iterator[Any]) -> Iterator[Any]:
    """Turn low-level read errors (a truncated or corrupt compressed file) into one-line
    :class:`~packtool.errors.InputError` naming the file."""
    try:
        yield from batches
    except (EOFError, zlib.error) as e:
        raise InputError(f"{inp.path}: the file ends early or is corrupt ({e})") from None
    except OSError as e:
        if getattr(e, "filename", None):
            raise
        raise InputError(f"{inp.path}: cannot read: {e}") from None
    except Exception as e:
        if type(e).__module__.startswith("zstandard"):
            raise InputError(f"{inp.path}: corrupt zstd data ({e})") from None
        raise
