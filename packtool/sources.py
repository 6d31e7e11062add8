"""Read inputs into batches of document texts.

Inputs are files (JSON Lines, JSON arrays, Parquet, Arrow, CSV, plain text; ``.gz``/``.zst``
compressed JSON, CSV and text too), directories or globs of such files, and datasets saved
with ``datasets.save_to_disk``. The fast paths are pyarrow's streaming readers; when one of
them fails, or when bad records are to be skipped, a line-by-line reader finds the exact
line and what is wrong with it.

Every record gets a place in the stream: a bad record that is skipped is yielded as ``None``
so that document numbering (and so the ``doc_ids`` of the output) does not depend on it.
"""

from __future__ import annotations

import csv
import glob as globlib
import gzip
import io
import json
import os
import re
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np
import pyarrow as pa

from .errors import BadRecordError, InputError, OptionError
from .fs import AnyPath, StorePath, arrow_input, arrow_source, as_path, open_input

__all__ = [
    "ColumnBatch",
    "InputFile",
    "Piece",
    "RecordBatch",
    "TextBatch",
    "column_batches",
    "describe_skipped",
    "first_record_fields",
    "first_row",
    "part_of",
    "read_records",
    "read_texts",
    "records_before",
    "resolve_inputs",
    "skip_records",
    "table_batches",
]

_KINDS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".csv": "csv",
    ".txt": "txt",
    ".idx": "megatron",  # a Megatron-LM indexed dataset: PREFIX.idx beside PREFIX.bin
}
_COMPRESSED = {".gz": "gzip", ".zst": "zstd"}
SUPPORTED = ", ".join(
    [*_KINDS, *(k + c for k in (".jsonl", ".json", ".csv", ".txt") for c in _COMPRESSED)]
)
BATCH_DOCS = 1024
TXT_UNITS = ("line", "paragraph", "document")


@dataclass(frozen=True)
class InputFile:
    """One input: a file, or a directory holding a dataset saved with `datasets`."""

    path: AnyPath  # a local Path, or a StorePath (a file on an object store)
    kind: str  # jsonl, json, parquet, arrow, csv, txt, hf_dataset
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
            "kind": self.kind,
            "compression": self.compression,
            "file_size": self.file_size,
            "split_by": self.split_by,
            "start": self.start,
            "stop": self.stop,
        }


def part_of(inp: InputFile, split_by: str) -> tuple[int, int] | None:
    """``(start, stop)`` when ``inp`` is a piece cut by ``split_by``, else ``None`` (all of it)."""
    if isinstance(inp, Piece) and inp.split_by == split_by:
        return inp.start, inp.stop
    return None


@dataclass
class TextBatch:
    """Consecutive records of one input. ``None`` marks a bad record that was skipped."""

    texts: list[str | None]
    bad: list[BadRecordError] = field(default_factory=list)
    bytes_done: int = 0  # how far into the input (bytes of the file as stored) this batch ends

    @property
    def records(self) -> list[str | None]:
        """The texts (so that text and record batches read alike)."""
        return self.texts


@dataclass
class RecordBatch:
    """Consecutive records of one input (see :func:`read_records`).

    ``records[i]`` is what the caller's ``check`` made of record ``i`` (``None``: a bad record
    that was skipped); ``locations[i]`` names it (``file:line`` or ``file: row n``), so that a
    later stage can report a problem with it.
    """

    records: list[Any]
    locations: list[str]
    bad: list[BadRecordError] = field(default_factory=list)
    bytes_done: int = 0


def _kind_of(path: AnyPath) -> tuple[str, str | None] | None:
    suffixes = [s.lower() for s in path.suffixes]
    if not suffixes:
        return None
    compression = _COMPRESSED.get(suffixes[-1])
    if compression is not None:
        if len(suffixes) < 2 or suffixes[-2] not in (".jsonl", ".ndjson", ".json", ".csv", ".txt"):
            return None
        return _KINDS[suffixes[-2]], compression
    kind = _KINDS.get(suffixes[-1])
    return (kind, None) if kind else None


def _is_hf_dataset(path: AnyPath) -> bool:
    return (path / "state.json").exists() or (path / "dataset_dict.json").exists()


def _tree_size(path: AnyPath) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _file_input(path: AnyPath) -> InputFile:
    if path.suffix == ".bin" and path.with_suffix(".idx").is_file():
        path = path.with_suffix(".idx")  # the data file of a Megatron indexed dataset
    kind = _kind_of(path)
    if kind == ("megatron", None):
        data = path.with_suffix(".bin")
        if not data.is_file():
            raise InputError(f"{path}: a Megatron index without its data file {data.name}")
        return InputFile(path, "megatron", None, path.stat().st_size + data.stat().st_size)
    if kind is None:
        raise InputError(f"{path}: unsupported file type (supported: {SUPPORTED})")
    return InputFile(path, kind[0], kind[1], path.stat().st_size)


def resolve_inputs(
    specs: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    *,
    skipped: list[AnyPath] | None = None,
) -> list[InputFile]:
    """Expand paths, directories and globs into a list of inputs, in a stable order.

    ``specs`` is a list of them, or one (a string is one path, never its characters).

    A directory is a `datasets` dataset if it holds ``state.json`` or ``dataset_dict.json``;
    otherwise its supported files are taken, recursively, sorted by path (hidden files and
    directories are skipped). Its other files are skipped too, and added to ``skipped`` (to
    say so); a file named itself, or matched by a glob, of an unknown type is an error.

    A URL (``s3://bucket/prefix``, any fsspec protocol) is a file, a prefix read like a
    directory, or a glob, on the store.
    """
    if isinstance(specs, (str, os.PathLike)):
        specs = [specs]
    if not specs:
        raise InputError("no input given")
    out: list[InputFile] = []
    for spec in specs:
        path = as_path(spec)
        is_glob = globlib.has_magic(str(spec))
        if isinstance(path, StorePath) and is_glob:
            files = [p for p in path.glob() if _kind_of(p) is not None or p.is_file()]
            if not files:
                raise InputError(f"{spec}: the pattern matches no files")
            out.extend(_file_input(p) for p in files)
        elif path.is_dir():
            if _is_hf_dataset(path):
                out.append(InputFile(path, "hf_dataset", None, _tree_size(path)))
                continue
            members = sorted(
                p
                for p in path.rglob("*")
                if p.is_file()
                and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
            files = [p for p in members if _kind_of(p) is not None]
            pairs = {p.with_suffix(".bin") for p in files if p.suffix == ".idx"}  # Megatron
            unknown = [p for p in members if _kind_of(p) is None and p not in pairs]
            if not files:
                s = "s" if len(unknown) != 1 else ""
                others = f" (only {len(unknown):,} file{s} of an unknown type)" if unknown else ""
                raise InputError(
                    f"{path}: directory holds no supported files{others}; supported: {SUPPORTED}"
                )
            if skipped is not None:
                skipped.extend(unknown)
            out.extend(_file_input(p) for p in files)
        elif path.is_file():
            out.append(_file_input(path))
        elif as_path(f"{spec}.idx").is_file():  # a Megatron prefix
            out.append(_file_input(as_path(f"{spec}.idx")))
        elif is_glob:
            matches = sorted(Path(p) for p in globlib.glob(str(spec), recursive=True))
            files = [p for p in matches if p.is_file()]
            if not files:
                raise InputError(f"{spec}: the pattern matches no files")
            out.extend(_file_input(p) for p in files)
        else:
            raise InputError(f"{spec}: no such file or directory")
    return out


def describe_skipped(skipped: Sequence[AnyPath | str], shown: int = 3) -> str:
    """One line on the directory members that :func:`resolve_inputs` skipped."""
    names = ", ".join(str(p) for p in skipped[:shown])
    more = f" and {len(skipped) - shown:,} more" if len(skipped) > shown else ""
    return (
        f"{len(skipped):,} file{'s' if len(skipped) != 1 else ''} of an unknown type in the "
        f"input directories, not read: {names}{more} (supported: {SUPPORTED})"
    )


# -- opening (possibly compressed) files ----------------------------------------------------


class _CountingReader(io.RawIOBase):
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


def _open_binary(inp: InputFile) -> tuple[IO[bytes], _CountingReader]:
    """The input's bytes (decompressed), and the counter of bytes read from the file. A piece
    by bytes gives only its range."""
    f = open_input(inp.path)
    span = part_of(inp, "bytes")
    if span is not None:
        f.seek(span[0])
    counter = _CountingReader(f, None if span is None else span[1] - span[0])
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


def _arrow_input(inp: InputFile) -> tuple[Any, Any]:
    """(stream to parse, raw file whose tell() gives progress)."""
    span = part_of(inp, "bytes")
    if span is not None:
        ranged = _ArrowRange(inp.path, *span)
        return ranged, ranged
    raw = arrow_input(inp.path)
    if inp.compression is None:
        return raw, raw
    if inp.compression == "zstd" and not pa.Codec.is_available("zstd"):
        raise _NoArrowCodec
    return pa.CompressedInputStream(raw, inp.compression), raw


class _NoArrowCodec(Exception):
    pass


# -- the readers ----------------------------------------------------------------------------


def _describe(value: Any) -> str:
    kind = type(value).__name__
    return {"NoneType": "null", "dict": "object", "list": "array", "str": "string"}.get(kind, kind)


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_record(obj: Any, text_field: str, location: str) -> str:
    if not isinstance(obj, dict):
        raise BadRecordError(location, f"expected a JSON object, found {_describe(obj)}")
    if text_field not in obj:
        fields = ", ".join(repr(k) for k in list(obj)[:20]) or "none"
        raise BadRecordError(
            location,
            f"no field {text_field!r} (fields found: {fields})",
            "choose the field with --text-field",
        )
    text = obj[text_field]
    if not isinstance(text, str):
        raise BadRecordError(location, f"field {text_field!r} is {_describe(text)}, not a string")
    surrogate = _SURROGATE.search(text)
    if surrogate:  # JSON's "\ud800" escape: a str that no tokenizer (nor UTF-8) can take
        raise BadRecordError(
            location,
            f"field {text_field!r} holds an unpaired surrogate "
            f"\\u{ord(surrogate.group()):04x} at character {surrogate.start()}: not valid Unicode",
        )
    return text


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
    stream, counter = _open_binary(inp)
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
    """pyarrow's JSON parser over bounded pieces of whole lines; raises _ArrowFailed on
    anything irregular.

    pyarrow's own streaming reader reads ahead without bound while its consumer (the
    tokenizer) is slower, buffering most of the input in memory; parsing one piece at a time
    keeps memory flat whatever the input's size. Each piece is also checked for a line that
    starts with the JSON value ``null``: pyarrow's JSON reader (up to at least 26.0) crashes
    the process with a segmentation fault on such a line at the start of a block; it is a
    bad record anyway, so the line-by-line reader takes over there.
    """
    import pyarrow.json as pj

    stream, raw = _arrow_input(inp)
    parse = pj.ParseOptions(
        explicit_schema=pa.schema([(text_field, pa.string())]),
        unexpected_field_behavior="ignore",
    )
    try:
        for piece in _line_chunks(stream):
            if _NULL_FIRST.match(piece) or _NULL_LINE.search(piece):
                raise _ArrowFailed("a line holds a top-level null")
            table = pj.read_json(
                pa.py_buffer(piece),
                read_options=pj.ReadOptions(block_size=len(piece) + 1, use_threads=False),
                parse_options=parse,
            )
            column = table.column(0)
            if column.null_count:
                raise _ArrowFailed("null or missing text")
            texts = column.to_pylist()
            for i in range(0, len(texts), batch_docs):
                yield TextBatch(texts[i : i + batch_docs], bytes_done=raw.tell())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, UnicodeDecodeError) as e:
        raise _ArrowFailed(str(e)) from e
    finally:
        stream.close()


class _ArrowFailed(Exception):
    pass


def _read_jsonl(
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
    except (_ArrowFailed, _NoArrowCodec) as failure:
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


def _read_json_array(
    inp: InputFile, text_field: str, skip_bad: bool, batch_docs: int
) -> Iterator[TextBatch]:
    stream, _ = _open_binary(inp)
    with stream:
        head = stream.peek(64)[:64] if hasattr(stream, "peek") else b""
        if not head.lstrip().startswith(b"["):
            yield from _read_jsonl(inp, text_field, skip_bad, batch_docs)
            return
        data = _load_json_array(inp, stream)
    batch = TextBatch([])
    for i, obj in enumerate(data):
        try:
            batch.texts.append(check_record(obj, text_field, f"{inp.path}: element {i}"))
        except BadRecordError as e:
            if not skip_bad:
                raise e.with_skip_hint() from None
            batch.texts.append(None)
            batch.bad.append(e)
        if len(batch.texts) >= batch_docs:
            yield batch
            batch = TextBatch([])
    batch.bytes_done = inp.size_bytes
    if batch.texts:
        yield batch


def check_column(schema: pa.Schema, text_field: str, where: str) -> None:
    if text_field not in schema.names:
        fields = ", ".join(repr(n) for n in schema.names[:20]) or "none"
        raise InputError(
            f"{where}: no column {text_field!r} (columns found: {fields}); "
            "choose the column with --text-field"
        )
    kind = schema.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise InputError(f"{where}: column {text_field!r} is {kind}, not a string column")


def _parquet_part(inp: InputFile, pf: Any) -> tuple[list[int] | None, int, int]:
    """What to read of the Parquet file ``pf`` for ``inp``: its row groups (``None``: all),
    the number of its first row in the file, and its number of rows."""
    meta = pf.metadata
    span = part_of(inp, "row_groups")
    if span is None:
        return None, 0, meta.num_rows
    groups = list(range(*span))
    first = sum(meta.row_group(g).num_rows for g in range(span[0]))
    return groups, first, sum(meta.row_group(g).num_rows for g in groups)


def first_row(inp: InputFile) -> int:
    """The number in its file of the first row of ``inp``: 0 for a whole input; for a piece,
    the rows of the row groups (or the sequences) before it. (A piece of JSON Lines numbers
    its lines with :func:`_line_locator`.)"""
    if part_of(inp, "sequences") is not None:
        return inp.start  # type: ignore[attr-defined, no-any-return]
    span = part_of(inp, "row_groups")
    if span is None or span[0] == 0:
        return 0
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(arrow_source(inp.path))
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{inp.path}: not a readable Parquet file: {e}") from e
    return sum(meta.row_group(g).num_rows for g in range(span[0]))


def records_before(inp: InputFile) -> Callable[[], int]:
    """For a piece of JSON Lines by bytes: ``count()``, the records (non-blank lines) of the
    file before it, counted when first asked (to name a row in an error), once."""
    span = part_of(inp, "bytes")
    if span is None or span[0] == 0:
        return lambda: 0
    return _LinesBefore(inp.path, span[0], records=True).count


def _validate(data: pa.Array | pa.RecordBatch, where: str, row: int, what: str) -> None:
    """Check Arrow data read from a file before converting it: pyarrow trusts a file's
    offsets, and damaged ones crash the process in ``to_pylist``. Full validation is one scan
    of the data (it includes the UTF-8 check that the conversion would make)."""
    try:
        data.validate(full=True)
    except pa.ArrowInvalid as e:
        at = re.search(r"string index (\d+)", str(e))
        if "UTF8" in str(e):
            place = f"at row {row + int(at.group(1))}" if at else f"near row {row}"
            raise InputError(f"{where}: invalid UTF-8 {what}{place}") from None
        raise InputError(f"{where}: corrupt Arrow data {what}near row {row}: {e}") from None


def _table_batches(
    batches: Iterator[pa.RecordBatch],
    text_field: str,
    where: str,
    skip_bad: bool,
    batch_docs: int,
    progress: Callable[[], int],
    row0: int = 0,
) -> Iterator[TextBatch]:
    row = row0
    for record_batch in batches:
        column = record_batch.column(record_batch.schema.get_field_index(text_field))
        _validate(column, where, row, f"in column {text_field!r} ")
        try:
            texts = column.to_pylist()
        except UnicodeDecodeError as e:
            raise InputError(
                f"{where}: invalid UTF-8 in column {text_field!r} near row {row}: {e.reason}"
            ) from None
        out = TextBatch([])
        for text in texts:
            if text is None:
                error = BadRecordError(f"{where}: row {row}", f"{text_field!r} is null")
                if not skip_bad:
                    raise error.with_skip_hint()
                out.bad.append(error)
            out.texts.append(text)
            row += 1
        out.bytes_done = progress()
        for i in range(0, len(out.texts), batch_docs):
            piece = TextBatch(out.texts[i : i + batch_docs], bytes_done=out.bytes_done)
            if i == 0:
                piece.bad = out.bad
            yield piece


def _read_parquet(
    inp: InputFile, text_field: str, skip_bad: bool, batch_docs: int
) -> Iterator[TextBatch]:
    import pyarrow.parquet as pq

    try:
        # pre_buffer off: its read cache keeps the column chunks already read alive, so
        # memory grew with the file (260 -> 413 MB for a 4x larger one; 219 -> 254 MB off).
        pf = pq.ParquetFile(arrow_source(inp.path), pre_buffer=False)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{inp.path}: not a readable Parquet file: {e}") from e
    check_column(pf.schema_arrow, text_field, str(inp.path))
    groups, row0, rows = _parquet_part(inp, pf)
    rows_total = max(1, rows)
    done = [0]

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            for b in pf.iter_batches(
                batch_size=batch_docs * 8, row_groups=groups, columns=[text_field]
            ):
                done[0] += b.num_rows
                yield b
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError(f"{inp.path}: cannot read Parquet data: {e}") from e

    yield from _table_batches(
        batches(),
        text_field,
        str(inp.path),
        skip_bad,
        batch_docs,
        lambda: inp.size_bytes * done[0] // rows_total,
        row0,
    )


class _ArrowInput(NamedTuple):
    source: Any  # to close
    schema: pa.Schema
    batches: Iterator[pa.RecordBatch]
    tell: Callable[[], int]  # bytes read so far, for progress


def _open_arrow(where: str) -> _ArrowInput:
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
        return _ArrowInput(source, stream.schema, iter(stream), source.tell)
    count, size, done = reader.num_record_batches, as_path(where).stat().st_size, [0]

    def batches() -> Iterator[pa.RecordBatch]:
        for i in range(count):
            batch = reader.get_batch(i)
            done[0] = i + 1
            yield batch

    return _ArrowInput(source, reader.schema, batches(), lambda: size * done[0] // max(1, count))


def _choose_split(where: str, splits: Sequence[str], split: str | None) -> str:
    """The split to read of a saved ``DatasetDict``: ``split``, else "train" if there is one."""
    chosen = split or ("train" if "train" in splits else None)
    if chosen is None or chosen not in splits:
        raise InputError(
            f"{where}: a dataset with splits {', '.join(splits)}: choose one with --split"
        )
    return chosen


def _saved_dataset_files(where: str, split: str | None) -> list[str] | None:
    """The Arrow files of a `datasets` ``save_to_disk`` directory (of the chosen split of a
    saved ``DatasetDict``), in order; ``None`` for a layout other than the known one, which
    `datasets` then loads itself.

    Reading these files batch by batch keeps memory flat; ``datasets.load_from_disk`` maps
    them, and every page read stays resident (176 MB and 248 MB peak reading 25 MB and
    100 MB datasets)."""
    root = as_path(where)
    try:
        if (root / "dataset_dict.json").is_file():
            splits = json.loads((root / "dataset_dict.json").read_text(encoding="utf-8"))
            root = root / _choose_split(where, [str(n) for n in splits["splits"]], split)
        state = json.loads((root / "state.json").read_text(encoding="utf-8"))
        files = [str(root / entry["filename"]) for entry in state["_data_files"]]
        if state.get("_indices_data_files"):  # rows picked through an index: datasets knows
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not files or not all(as_path(f).is_file() for f in files):
        return None
    return files


class _ArrowFiles:
    """Several Arrow files (a saved dataset's shards) read one after another, batch by
    batch, as one :class:`_ArrowInput`."""

    def __init__(self, files: list[str]) -> None:
        self.files = files
        self.sizes = [as_path(f).stat().st_size for f in files]
        self.current = _open_arrow(files[0])
        self.before = 0  # bytes of the files already read

    def batches(self) -> Iterator[pa.RecordBatch]:
        for i, path in enumerate(self.files):
            if i:
                self.current.source.close()
                self.before += self.sizes[i - 1]
                self.current = _open_arrow(path)
            yield from self.current.batches

    def tell(self) -> int:
        return self.before + self.current.tell()

    def close(self) -> None:
        self.current.source.close()

    def as_input(self) -> _ArrowInput:
        return _ArrowInput(self, self.current.schema, self.batches(), self.tell)


def _read_arrow(
    inp: InputFile, text_field: str, skip_bad: bool, batch_docs: int
) -> Iterator[TextBatch]:
    source, schema, batches, tell = _open_arrow(str(inp.path))
    try:
        check_column(schema, text_field, str(inp.path))
        yield from _table_batches(batches, text_field, str(inp.path), skip_bad, batch_docs, tell)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{inp.path}: cannot read Arrow data: {e}") from e
    finally:
        source.close()


def _csv_header(inp: InputFile) -> list[str]:
    """The column names on the first line of a CSV input."""
    stream, _ = _arrow_input(inp)
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

    def __init__(self, stream: Any, ahead: int, block: int) -> None:
        self.stream, self.ahead, self.block = stream, ahead, block
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


def _is_straddling(error: Exception) -> bool:
    return "straddl" in str(error)


def _bigger_blocks(inp: InputFile, read_pass: Callable[[int, int], Iterator[Any]]) -> Iterator[Any]:
    """``read_pass(block, skip)`` with blocks of ``_CSV_BLOCK`` bytes, then, each time a row
    turns out longer than a block (pyarrow cannot read it), again with blocks 8x larger,
    skipping the ``skip`` records already given. Long cells are rare: the usual block keeps
    memory small, and a larger one is used only for the file that needs it."""
    block, done = _CSV_BLOCK, 0
    while True:
        try:
            for batch in read_pass(block, done):
                done += len(batch.records)
                yield batch
            return
        except _CsvBlockTooSmall as e:
            # A block that held the whole file (or the largest one pyarrow takes) failed:
            # the row is not the problem. A compressed file's size says nothing of its rows.
            limit = inp.size_bytes if inp.compression is None else _CSV_MAX_BLOCK
            if block >= min(limit, _CSV_MAX_BLOCK):
                raise InputError(f"{inp.path}: cannot read as CSV: {e}") from None
            block = min(block * 8, _CSV_MAX_BLOCK)


def table_batches(
    inp: InputFile, columns: Sequence[str], *, split: str | None = None, batch_rows: int = 2048
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """The Arrow record batches of ``columns`` of a Parquet, Arrow or saved `datasets`
    input, each with how far into the input (bytes) it ends. Columns are not
    converted to Python: a list column stays one flat buffer (for pre-tokenized data)."""
    where = str(inp.path)

    def check(names: Sequence[str]) -> None:
        for name in columns:
            if name not in names:
                found = ", ".join(repr(n) for n in list(names)[:20]) or "none"
                raise InputError(f"{where}: no column {name!r} (columns found: {found})")

    if inp.kind == "parquet":
        import pyarrow.parquet as pq

        try:
            # pre_buffer off: its read cache kept the column chunks already read alive, and
            # Arrow's memory grew with the file (248 MB reading a 400 MB file; 58 MB off).
            pf = pq.ParquetFile(arrow_source(where), pre_buffer=False)
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError(f"{where}: not a readable Parquet file: {e}") from e
        check(pf.schema_arrow.names)
        groups, _, rows = _parquet_part(inp, pf)
        total, done = max(1, rows), 0
        try:
            for b in pf.iter_batches(
                batch_size=batch_rows, row_groups=groups, columns=list(columns)
            ):
                done += b.num_rows
                yield b, inp.size_bytes * done // total
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError(f"{where}: cannot read Parquet data: {e}") from e
        return
    if inp.kind in ("arrow", "hf_dataset"):
        files = [where] if inp.kind == "arrow" else _saved_dataset_files(where, split)
        if files is None:
            raise InputError(f"{where}: a saved dataset of a layout packtool cannot stream")
        arrow = _ArrowFiles(files).as_input()
        try:
            check(arrow.schema.names)
            for b in arrow.batches:
                yield b.select(list(columns)), arrow.tell()
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError(f"{where}: cannot read Arrow data: {e}") from e
        finally:
            arrow.source.close()
        return
    raise ValueError(f"not a table input: {inp.kind!r}")


# -- token-id columns (pre-tokenized data) of JSON and CSV inputs ----------------------------


@dataclass
class ColumnBatch:
    """Arrow list columns of consecutive records of one input (pre-tokenized data).

    ``problems`` names the records found bad while parsing (index in the batch -> what is
    wrong; their columns are null); ``locate(i)`` names record ``i`` (``file:line``), or is
    ``None`` where records are named by their row.
    """

    batch: pa.RecordBatch
    bytes_done: int
    problems: dict[int, str] = field(default_factory=dict)
    locate: Callable[[int], str | None] | None = None

    @property
    def records(self) -> range:
        return range(self.batch.num_rows)

    def drop_first(self, n: int) -> ColumnBatch:
        """This batch without its first ``n`` records (a CSV pass that starts again)."""
        locate = self.locate
        return ColumnBatch(
            self.batch.slice(n),
            self.bytes_done,
            {r - n: p for r, p in self.problems.items() if r >= n},
            None if locate is None else (lambda r: locate(r + n)),
        )


def _id_list_problem(obj: Any, columns: Sequence[str]) -> str | None:
    """What keeps a parsed JSON record from being lists of integer ids in ``columns``."""
    if not isinstance(obj, dict):
        return f"expected a JSON object, found {_describe(obj)}"
    for name in columns:
        if name not in obj:
            found = ", ".join(repr(k) for k in list(obj)[:20]) or "none"
            return f"no field {name!r} (fields found: {found})"
        value = obj[name]
        if value is None:
            return f"{name!r} is null"
        if not isinstance(value, list):
            return f"{name!r} is {_describe(value)}, not a list of token ids"
        if all(type(v) is int for v in value):
            big = [v for v in value if not -(1 << 63) <= v < 1 << 63]
            if big:
                return f"{name!r}[{value.index(big[0])}] is {big[0]}: too large for a token id"
            continue
        j = next(j for j, v in enumerate(value) if type(v) is not int)
        if value[j] is None:
            return f"{name!r} holds nulls"
        shown = json.dumps(value[j])[:40]
        return f"{name!r}[{j}] is {shown}, not an integer token id"
    return None


def _parsed_columns(
    objs: Sequence[Any], columns: Sequence[str], problems: dict[int, str]
) -> pa.RecordBatch:
    """The list columns of parsed JSON records; a bad one goes into ``problems`` (as null)."""
    values: dict[str, list[Any]] = {c: [] for c in columns}
    for r, obj in enumerate(objs):
        problem = problems.get(r) or _id_list_problem(obj, columns)
        if problem is not None:
            problems[r] = problem
        for c in columns:
            values[c].append(None if problem is not None else obj[c])
    arrays = [pa.array(values[c], pa.list_(pa.int64())) for c in columns]
    return pa.RecordBatch.from_arrays(arrays, names=list(columns))


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
    batch = _parsed_columns(objs, columns, problems)
    return ColumnBatch(batch, bytes_done, problems, lambda r: f"{where}:{before() + lines[r]}")


def _jsonl_columns(inp: InputFile, columns: Sequence[str]) -> Iterator[ColumnBatch]:
    """JSON Lines (plain, gzip or zstd) through pyarrow's JSON parser, piece by piece.

    Each piece of whole lines is parsed with the columns typed as lists of int32 (a value
    that is not one fails the piece); a piece that fails, holds a null record or a top-level
    null line (pyarrow's reader crashes on those, see :func:`_jsonl_arrow`), or whose
    records are not one per line, is parsed again line by line to name the exact record.
    """
    import pyarrow.json as pj

    where = str(inp.path)
    try:
        stream, raw = _arrow_input(inp)
        tell: Callable[[], int] = raw.tell
    except _NoArrowCodec:
        stream, counter = _open_binary(inp)  # type: ignore[assignment]
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
    table = _array_piece(piece, parse, threaded)
    return table.combine_chunks().to_batches()[0] if table is not None and table.num_rows else None


def _json_array_columns(
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
    except _ArrowFailed:
        pass
    stream, _ = _open_binary(inp)
    with stream:
        data = _load_json_array(inp, stream)
    where = str(inp.path)
    for first in range(done, len(data), batch_rows):
        problems: dict[int, str] = {}
        batch = _parsed_columns(data[first : first + batch_rows], columns, problems)
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
    raises :class:`_ArrowFailed`.
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
            raise _ArrowFailed("not one JSON array of objects")
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
                raise _ArrowFailed("no comma after an element")
        marks = np.sort(np.concatenate([start, np.array(commas, np.int64), end]))
        elements = 0
        previous = -1
        for m in marks.tolist():  # per element
            first = self._next_solid(raw, previous + 1)
            solid_before = (first is not None and first < m) or (previous < 0 and self.solid)
            kind = 1 if w[m] == 0x5B else 3 if w[m] == 0x5D else 2
            if kind == 1 and solid_before:
                raise _ArrowFailed("text before the array")
            if kind > 1 and solid_before:
                elements += 1
            elif kind == 2 or (kind == 3 and self.last_kind != 1):
                raise _ArrowFailed("an empty element")  # [1,,2], [1,], [,1]: json.load says
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
    """:func:`_json_array_columns`' fast path; raises :class:`_ArrowFailed` where the slow
    one must go on."""
    where = str(inp.path)
    try:
        stream, raw = _arrow_input(inp)
    except _NoArrowCodec:
        raise _ArrowFailed("no codec") from None
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
            table = _array_piece(piece, parse, options)
            if table is None or table.num_rows != elements:
                raise _ArrowFailed("irregular")
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
        raise _ArrowFailed("not one whole JSON array")


def _array_piece(piece: bytes | memoryview, parse: Any, options: Any) -> pa.Table | None:
    """Whole JSON records parsed by pyarrow with the columns' types, or ``None`` where they
    must be parsed in Python to name a bad record (a null, a value of another type)."""
    import pyarrow.json as pj

    if _NULL_FIRST.match(piece) or _NULL_LINE.search(piece):
        return None
    try:
        try:
            table = pj.read_json(pa.py_buffer(piece), read_options=options, parse_options=parse)
        except pa.ArrowInvalid as e:
            if not _is_straddling(e):
                raise
            big = pj.ReadOptions(block_size=len(piece) + 1, use_threads=False)
            table = pj.read_json(pa.py_buffer(piece), read_options=big, parse_options=parse)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if any(column.null_count for column in table.columns):
        return None  # missing or null: the Python reader says which
    return table


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


def _csv_columns(inp: InputFile, columns: Sequence[str]) -> Iterator[ColumnBatch]:
    header = _csv_header(inp)
    for name in columns:
        if name not in header:
            found = ", ".join(repr(n) for n in header[:20]) or "none"
            raise InputError(f"{inp.path}: no column {name!r} (columns found: {found})")
    yield from _bigger_blocks(
        inp, lambda block, skip: skip_records(_csv_columns_pass(inp, columns, block), skip)
    )


def _csv_columns_pass(inp: InputFile, columns: Sequence[str], block: int) -> Iterator[ColumnBatch]:
    import pyarrow.csv as pc

    malformed: list[BadRecordError] = []

    def on_invalid(row: Any) -> str:
        where = f"{inp.path}:{row.number}" if row.number is not None else str(inp.path)
        malformed.append(
            BadRecordError(
                where,
                f"malformed CSV row {row.text[:60]!r} ({row.actual_columns} columns, "
                f"expected {row.expected_columns})",
            )
        )
        return "skip"

    stream, raw = _arrow_input(inp)
    paced = _PacedReader(stream, ahead=3 * block, block=block)
    try:
        reader = pc.open_csv(
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
        for batch in paced.batches(reader):
            bad, malformed = malformed, []  # rows pyarrow skipped: bad records, first
            problems = {i: e.problem for i, e in enumerate(bad)}
            k, names = len(bad), [e.location for e in bad]
            arrays = []
            for name in columns:
                cells: dict[int, str] = {}
                parsed = _int_list_cells(batch.column(name), name, cells)
                for r, problem in cells.items():
                    problems.setdefault(r + k, problem)
                arrays.append(pa.concat_arrays([pa.nulls(k, parsed.type), parsed]) if k else parsed)
            out = pa.RecordBatch.from_arrays(arrays, names=list(columns))
            yield ColumnBatch(
                out, raw.tell(), problems, lambda r, n=names: n[r] if r < len(n) else None
            )
    except (pa.ArrowInvalid, OSError) as e:
        if _is_straddling(e):
            raise _CsvBlockTooSmall(str(e)) from e
        raise InputError(f"{inp.path}: cannot read as CSV: {e}") from e
    finally:
        paced.close()
        stream.close()
    if malformed:
        problems = {i: e.problem for i, e in enumerate(malformed)}
        names = [e.location for e in malformed]
        empty = pa.RecordBatch.from_arrays(
            [pa.nulls(len(malformed), pa.large_list(pa.int64())) for _ in columns],
            names=list(columns),
        )
        yield ColumnBatch(empty, inp.size_bytes, problems, lambda r, n=names: n[r])


def column_batches(
    inp: InputFile, columns: Sequence[str], *, split: str | None = None, batch_rows: int = 2048
) -> Iterator[ColumnBatch]:
    """The list columns ``columns`` (token ids) of the records of ``inp``, batch by batch:
    Parquet, Arrow and saved datasets as stored; JSON Lines, JSON arrays and CSV
    (compressed too) parsed by pyarrow, the CSV cells' lists by NumPy. A record that cannot
    be such lists is null, named in the batch's ``problems``."""
    if inp.kind in ("parquet", "arrow", "hf_dataset"):
        for batch, done in table_batches(inp, columns, split=split, batch_rows=batch_rows):
            yield ColumnBatch(batch, done)
        return
    if inp.kind == "jsonl":
        batches = _jsonl_columns(inp, columns)
    elif inp.kind == "json":
        stream, _ = _open_binary(inp)
        with stream:
            head = stream.peek(64)[:64] if hasattr(stream, "peek") else b""
        if head.lstrip().startswith(b"["):
            batches = _json_array_columns(inp, columns, batch_rows)
        else:
            batches = _jsonl_columns(inp, columns)
    elif inp.kind == "csv":
        batches = _csv_columns(inp, columns)
    else:
        raise InputError(f"{inp.path}: a .{inp.kind} input holds text, not token ids")
    yield from _guarded(inp, batches)


def skip_records(batches: Iterable[Any], n: int) -> Iterator[Any]:
    """Drop the first ``n`` records of a stream of text or record batches (to resume)."""
    for batch in batches:
        drop_first = getattr(batch, "drop_first", None)
        if drop_first is not None:  # pre-tokenized batches cut their own arrays
            if n >= len(batch.records):
                n -= len(batch.records)
                continue
            if n:
                batch, n = drop_first(n), 0
            yield batch
            continue
        if n >= len(batch.records):
            n -= len(batch.records)
            continue
        if n:
            bad_skipped = sum(r is None for r in batch.records[:n])
            if isinstance(batch, TextBatch):
                batch.texts = batch.texts[n:]
            else:
                batch.records, batch.locations = batch.records[n:], batch.locations[n:]
            batch.bad = batch.bad[bad_skipped:]
            n = 0
        yield batch


def _read_csv(
    inp: InputFile, text_field: str, skip_bad: bool, batch_docs: int
) -> Iterator[TextBatch]:
    header = _csv_header(inp)
    if text_field not in header:
        fields = ", ".join(repr(n) for n in header[:20]) or "none"
        raise InputError(
            f"{inp.path}: no column {text_field!r} (columns found: {fields}); "
            "choose the column with --text-field"
        )
    yield from _bigger_blocks(
        inp,
        lambda block, skip: skip_records(
            _csv_text_pass(inp, text_field, skip_bad, batch_docs, block), skip
        ),
    )


def _csv_text_pass(
    inp: InputFile, text_field: str, skip_bad: bool, batch_docs: int, block: int
) -> Iterator[TextBatch]:
    import pyarrow.csv as pc

    bad: list[BadRecordError] = []

    def on_invalid(row: Any) -> str:
        where = f"{inp.path}:{row.number}" if row.number is not None else str(inp.path)
        bad.append(
            BadRecordError(
                where,
                f"malformed CSV row {row.text[:60]!r} ({row.actual_columns} columns, "
                f"expected {row.expected_columns})",
            )
        )
        return "skip" if skip_bad else "error"

    stream, raw = _arrow_input(inp)
    paced = _PacedReader(stream, ahead=3 * block, block=block)
    try:
        reader = pc.open_csv(
            pa.PythonFile(paced, mode="r"),
            read_options=pc.ReadOptions(block_size=block, use_threads=False),
            parse_options=pc.ParseOptions(newlines_in_values=True, invalid_row_handler=on_invalid),
            convert_options=pc.ConvertOptions(
                include_columns=[text_field],
                column_types={text_field: pa.string()},
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )

        for batch in _table_batches(
            paced.batches(reader), text_field, str(inp.path), skip_bad, batch_docs, raw.tell
        ):
            # Rows skipped as invalid have no place in the stream: count them as bad records.
            if bad:
                batch.texts = [None] * len(bad) + batch.texts
                batch.bad = bad + batch.bad
                bad = []
            yield batch
    except (pa.ArrowInvalid, OSError) as e:
        if bad and not skip_bad:
            raise bad[0].with_skip_hint() from None
        if _is_straddling(e):
            raise _CsvBlockTooSmall(str(e)) from e
        raise InputError(f"{inp.path}: cannot read as CSV: {e}") from e
    finally:
        paced.close()
        stream.close()
    if bad:
        yield TextBatch([None] * len(bad), bad=bad, bytes_done=inp.size_bytes)


def _read_txt(inp: InputFile, unit: str, skip_bad: bool, batch_docs: int) -> Iterator[TextBatch]:
    stream, counter = _open_binary(inp)
    with stream:
        if unit == "document":
            data = stream.read()
            try:
                yield TextBatch([data.decode("utf-8")], bytes_done=inp.size_bytes)
            except UnicodeDecodeError as e:
                error = BadRecordError(str(inp.path), f"invalid UTF-8 at byte {e.start}")
                if not skip_bad:
                    raise error.with_skip_hint() from None
                yield TextBatch([None], bad=[error], bytes_done=inp.size_bytes)
            return
        batch = TextBatch([])
        paragraph: list[str] = []
        lineno = 0
        for raw_line in stream:
            lineno += 1
            try:
                line = raw_line.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                error = BadRecordError(f"{inp.path}:{lineno}", f"invalid UTF-8 ({e.reason})")
                if not skip_bad:
                    raise error.with_skip_hint() from None
                batch.texts.append(None)
                batch.bad.append(error)
                continue
            if unit == "line":
                batch.texts.append(line)
            elif line.strip():
                paragraph.append(line)
            elif paragraph:
                batch.texts.append("\n".join(paragraph))
                paragraph = []
            if len(batch.texts) >= batch_docs:
                batch.bytes_done = counter.count
                yield batch
                batch = TextBatch([])
        if paragraph:
            batch.texts.append("\n".join(paragraph))
        batch.bytes_done = inp.size_bytes
        if batch.texts:
            yield batch


def _read_hf_dataset(
    inp: InputFile, text_field: str, split: str | None, skip_bad: bool, batch_docs: int
) -> Iterator[TextBatch]:
    files = _saved_dataset_files(str(inp.path), split)
    if files is not None:
        arrow = _ArrowFiles(files).as_input()
        try:
            check_column(arrow.schema, text_field, str(inp.path))
            yield from _table_batches(
                arrow.batches, text_field, str(inp.path), skip_bad, batch_docs, arrow.tell
            )
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError(f"{inp.path}: cannot read the saved dataset: {e}") from e
        finally:
            arrow.source.close()
        return
    import datasets

    try:
        ds: Any = datasets.load_from_disk(str(inp.path))
    except Exception as e:  # datasets raises many kinds here
        raise InputError(f"{inp.path}: cannot load the saved dataset: {e}") from e
    if isinstance(ds, datasets.DatasetDict):
        ds = ds[_choose_split(str(inp.path), list(ds), split)]
    where = str(inp.path)
    check_column(ds.data.schema, text_field, where)
    total = max(1, len(ds))
    done = [0]

    def batches() -> Iterator[pa.RecordBatch]:
        for table in ds.select_columns([text_field]).with_format("arrow").iter(batch_docs * 8):
            done[0] += table.num_rows
            yield from table.to_batches()

    yield from _table_batches(
        batches(),
        text_field,
        where,
        skip_bad,
        batch_docs,
        lambda: inp.size_bytes * done[0] // total,
    )


def _guarded(inp: InputFile, batches: Iterator[Any]) -> Iterator[Any]:
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


def read_texts(
    inp: InputFile,
    *,
    text_field: str = "text",
    skip_bad_records: bool = False,
    split: str | None = None,
    txt_unit: str = "line",
    batch_docs: int = BATCH_DOCS,
) -> Iterator[TextBatch]:
    """Yield the texts of ``inp`` in order, in batches of about ``batch_docs`` records.

    Raises :class:`~packtool.errors.BadRecordError` naming the file and line (or row) of the
    first bad record, unless ``skip_bad_records``, in which case bad records come as ``None``
    with the error in ``TextBatch.bad``.
    """
    if txt_unit not in TXT_UNITS:
        raise OptionError(f"--txt-unit must be line, paragraph or document, got {txt_unit!r}")
    if inp.kind == "jsonl":
        batches = _read_jsonl(inp, text_field, skip_bad_records, batch_docs)
    elif inp.kind == "json":
        batches = _read_json_array(inp, text_field, skip_bad_records, batch_docs)
    elif inp.kind == "parquet":
        batches = _read_parquet(inp, text_field, skip_bad_records, batch_docs)
    elif inp.kind == "arrow":
        batches = _read_arrow(inp, text_field, skip_bad_records, batch_docs)
    elif inp.kind == "csv":
        batches = _read_csv(inp, text_field, skip_bad_records, batch_docs)
    elif inp.kind == "txt":
        batches = _read_txt(inp, txt_unit, skip_bad_records, batch_docs)
    elif inp.kind == "hf_dataset":
        batches = _read_hf_dataset(inp, text_field, split, skip_bad_records, batch_docs)
    elif inp.kind == "megatron":
        raise InputError(f"{inp.path}: a Megatron indexed dataset holds token ids, not text")
    else:
        raise ValueError(f"unknown input kind {inp.kind!r}")
    return _guarded(inp, batches)


# -- records (instruction data) -------------------------------------------------------------

RecordCheck = Callable[[dict[str, Any], str], Any]
"""``check(record, location)``: validate one record (a dict of its fields) and return what the
batch should hold for it; raise :class:`~packtool.errors.BadRecordError` for a bad one."""


class _RecordCollector:
    """Builds record batches, turning bad records into ``None`` or raising."""

    def __init__(self, check: RecordCheck, skip_bad: bool) -> None:
        self.check = check
        self.skip_bad = skip_bad
        self.batch = RecordBatch([], [])

    def add(self, obj: Any, location: str, error: BadRecordError | None = None) -> None:
        try:
            if error is not None:
                raise error
            if not isinstance(obj, dict):
                raise BadRecordError(location, f"expected a JSON object, found {_describe(obj)}")
            value = self.check(obj, location)
        except BadRecordError as e:
            if not self.skip_bad:
                raise e.with_skip_hint() from None
            value = None
            self.batch.bad.append(e)
        self.batch.records.append(value)
        self.batch.locations.append(location)

    def take(self, bytes_done: int) -> RecordBatch:
        batch, self.batch = self.batch, RecordBatch([], [])
        batch.bytes_done = bytes_done
        return batch


def _json_records(inp: InputFile, collect: _RecordCollector, batch_docs: int):
    stream, counter = _open_binary(inp)
    with stream:
        head = stream.peek(64)[:64] if hasattr(stream, "peek") else b""
        if head.lstrip().startswith(b"[") and inp.kind == "json":
            data = _load_json_array(inp, stream)
            for i, obj in enumerate(data):
                collect.add(obj, f"{inp.path}: element {i}")
                if len(collect.batch.records) >= batch_docs:
                    yield collect.take(0)
            if collect.batch.records:
                yield collect.take(inp.size_bytes)
            return
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


def _check_columns(names: Sequence[str], fields: Sequence[str], where: str) -> None:
    missing = [f for f in fields if f not in names]
    if missing:
        found = ", ".join(repr(n) for n in list(names)[:20]) or "none"
        raise InputError(
            f"{where}: no column {missing[0]!r} (columns found: {found}); "
            "choose the columns with --prompt-field, --completion-field or --messages-field"
        )


def _table_records(
    batches: Iterator[pa.RecordBatch],
    fields: Sequence[str],
    where: str,
    collect: _RecordCollector,
    batch_docs: int,
    progress: Callable[[], int],
    row0: int = 0,
):
    row = row0
    for record_batch in batches:
        selected = record_batch.select(list(fields))
        _validate(selected, where, row, "")
        try:
            rows = selected.to_pylist()
        except UnicodeDecodeError as e:
            raise InputError(f"{where}: invalid UTF-8 near row {row}: {e.reason}") from None
        for obj in rows:
            collect.add(obj, f"{where}: row {row}")
            row += 1
            if len(collect.batch.records) >= batch_docs:
                yield collect.take(progress())
    if collect.batch.records:
        yield collect.take(progress())


def _table_source(
    inp: InputFile, fields: Sequence[str], split: str | None, batch_docs: int
) -> tuple[list[str], Iterator[pa.RecordBatch], Callable[[], int], Callable[[], None]]:
    """(column names, record batches of ``fields``, progress in bytes, close) of a Parquet,
    Arrow or saved-`datasets` input. Nothing is read until the batches are iterated."""
    where = str(inp.path)
    if inp.kind == "parquet":
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(arrow_source(where), pre_buffer=False)
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError(f"{where}: not a readable Parquet file: {e}") from e
        groups, _, rows = _parquet_part(inp, pf)
        total, done = max(1, rows), [0]

        def parquet_batches() -> Iterator[pa.RecordBatch]:
            try:
                for b in pf.iter_batches(
                    batch_size=batch_docs, row_groups=groups, columns=list(fields)
                ):
                    done[0] += b.num_rows
                    yield b
            except (pa.ArrowInvalid, OSError) as e:
                raise InputError(f"{where}: cannot read Parquet data: {e}") from e

        return (
            list(pf.schema_arrow.names),
            parquet_batches(),
            lambda: inp.size_bytes * done[0] // total,
            lambda: None,
        )
    if inp.kind == "arrow":
        source, schema, batches, tell = _open_arrow(where)
        return list(schema.names), batches, tell, source.close
    files = _saved_dataset_files(where, split)
    if files is not None:
        source, schema, batches, tell = _ArrowFiles(files).as_input()
        return list(schema.names), batches, tell, source.close
    import datasets

    try:
        ds: Any = datasets.load_from_disk(where)
    except Exception as e:  # datasets raises many kinds here
        raise InputError(f"{where}: cannot load the saved dataset: {e}") from e
    if isinstance(ds, datasets.DatasetDict):
        ds = ds[_choose_split(where, list(ds), split)]
    total, done = max(1, len(ds)), [0]

    def dataset_batches() -> Iterator[pa.RecordBatch]:
        for table in ds.select_columns(list(fields)).with_format("arrow").iter(batch_docs):
            done[0] += table.num_rows
            yield from table.to_batches()

    return (
        list(ds.data.schema.names),
        dataset_batches(),
        lambda: inp.size_bytes * done[0] // total,
        lambda: None,
    )


def _csv_records(
    inp: InputFile, fields: Sequence[str], collect: _RecordCollector, batch_docs: int
) -> Iterator[RecordBatch]:
    _check_columns(_csv_header(inp), fields, str(inp.path))
    yield from _bigger_blocks(
        inp,
        lambda block, skip: skip_records(
            _csv_records_pass(inp, fields, collect, batch_docs, block), skip
        ),
    )


def _csv_records_pass(
    inp: InputFile,
    fields: Sequence[str],
    collect: _RecordCollector,
    batch_docs: int,
    block: int,
) -> Iterator[RecordBatch]:
    import pyarrow.csv as pc

    collect.batch = RecordBatch([], [])  # a failed pass may have left records half-collected
    stream, raw = _arrow_input(inp)
    paced = _PacedReader(stream, ahead=3 * block, block=block)
    try:
        reader = pc.open_csv(
            pa.PythonFile(paced, mode="r"),
            read_options=pc.ReadOptions(block_size=block, use_threads=False),
            parse_options=pc.ParseOptions(newlines_in_values=True),
            convert_options=pc.ConvertOptions(
                include_columns=list(fields),
                column_types={f: pa.string() for f in fields},
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
        yield from _table_records(
            paced.batches(reader), fields, str(inp.path), collect, batch_docs, raw.tell
        )
    except (pa.ArrowInvalid, OSError) as e:
        if _is_straddling(e):
            raise _CsvBlockTooSmall(str(e)) from e
        raise InputError(f"{inp.path}: cannot read as CSV: {e}") from e
    finally:
        paced.close()
        stream.close()


def read_records(
    inp: InputFile,
    *,
    fields: Sequence[str],
    check: RecordCheck,
    skip_bad_records: bool = False,
    split: str | None = None,
    batch_docs: int = BATCH_DOCS,
) -> Iterator[RecordBatch]:
    """Yield the records of ``inp`` in order, each made by ``check`` from its ``fields``.

    For instruction data: a record is a JSON object (JSON Lines or a JSON array) or a row of a
    Parquet, Arrow, CSV or saved-`datasets` input, seen by ``check`` as a dict holding (at least)
    ``fields``. A record that is not an object, or that ``check`` rejects, stops the reading
    with a :class:`~packtool.errors.BadRecordError` naming it, unless ``skip_bad_records``: then
    it comes as ``None`` with its error in ``RecordBatch.bad``.

    >>> for batch in read_records(inp, fields=["prompt", "completion"], check=lambda r, loc: r):
    ...     batch.records[0], batch.locations[0]
    ({'prompt': 'Add 2 and 3.', 'completion': ' 5'}, 'data.jsonl:1')
    """
    collect = _RecordCollector(check, skip_bad_records)
    if inp.kind in ("jsonl", "json"):
        return _guarded(inp, _json_records(inp, collect, batch_docs))
    if inp.kind == "csv":
        return _guarded(inp, _csv_records(inp, fields, collect, batch_docs))
    if inp.kind in ("parquet", "arrow", "hf_dataset"):

        def tables() -> Iterator[RecordBatch]:
            names, batches, progress, close = _table_source(inp, fields, split, batch_docs)
            try:
                _check_columns(names, fields, str(inp.path))
                yield from _table_records(
                    batches, fields, str(inp.path), collect, batch_docs, progress, first_row(inp)
                )
            except (pa.ArrowInvalid, OSError) as e:
                raise InputError(f"{inp.path}: cannot read: {e}") from e
            finally:
                close()

        return _guarded(inp, tables())
    if inp.kind == "txt":
        raise InputError(
            f"{inp.path}: a .txt input holds plain text, not prompt/completion or chat "
            "records: use JSON Lines, JSON, Parquet, Arrow or CSV, or --input-shape text"
        )
    raise ValueError(f"unknown input kind {inp.kind!r}")


def _first_json_fields(inp: InputFile) -> list[str] | None:
    """The keys of the first JSON object of a JSON Lines or JSON array input."""
    stream, _ = _open_binary(inp)
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


def first_record_fields(inp: InputFile, *, split: str | None = None) -> list[str] | None:
    """The field names of the first readable record of ``inp`` (columns of a table input).

    Used to detect the input shape (``--input-shape auto``). ``None`` when there is nothing to
    look at (a ``.txt`` input, an empty file, or no readable record in the first 100 lines),
    or when the input cannot be read (reading it for real then names the problem).
    """
    if inp.kind == "txt":
        return None
    if inp.kind in ("jsonl", "json"):
        try:
            return _first_json_fields(inp)
        except Exception:  # a corrupt or truncated file (zlib, zstd...): reading names it
            return None
    if inp.kind == "csv":
        try:
            return _csv_header(inp) or None
        except InputError:
            return None  # reading it for real names the problem
    try:
        names, _batches, _progress, close = _table_source(inp, (), split, 1)
    except InputError:
        return None  # reading it for real names the problem
    close()
    return names
