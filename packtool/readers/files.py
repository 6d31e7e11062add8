"""What the inputs are and how their bytes are opened.

:func:`resolve_inputs` expands paths, directories, globs and URLs into :class:`InputFile` (a
:class:`Piece` is a contiguous part of one, a work unit's share); :func:`open_binary` and
:func:`arrow_stream` open one (decompressed; a piece by bytes gives only its range);
:func:`guarded` turns low-level read errors into one-line :class:`~packtool.errors.InputError`.
"""

from __future__ import annotations

import glob as globlib
import gzip
import io
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from ..errors import InputError
from ..fs import AnyPath, StorePath, arrow_input, as_path, is_url, open_input

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
            matched = list(path.glob())
            files = [p for p in matched if _kind_of(p) is not None or p.is_file()]
            others = [p for p in matched if p not in files]  # prefixes ("directories")
            if not files:
                dirs = f" (only directories: {', '.join(map(str, others[:3]))})" if others else ""
                raise InputError(f"{spec}: the pattern matches no files{dirs}")
            if skipped is not None:  # said on the skipped: line, as for a local glob
                skipped.extend(others)
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
            members, outputs = _without_packed_outputs(members)
            if skipped is not None:
                skipped.extend(outputs)
            members, saved = _saved_datasets(members)
            files = [p for p in members if _kind_of(p) is not None]
            pairs = {p.with_suffix(".bin") for p in files if p.suffix == ".idx"}  # Megatron
            unknown = [p for p in members if _kind_of(p) is None and p not in pairs]
            if not files and not saved:
                s = "s" if len(unknown) != 1 else ""
                others = f" (only {len(unknown):,} file{s} of an unknown type)" if unknown else ""
                raise InputError(
                    f"{path}: directory holds no supported files{others}; supported: {SUPPORTED}"
                )
            if skipped is not None:
                skipped.extend(unknown)
            found = [(str(p), _file_input(p)) for p in files]
            found += [(str(d), InputFile(d, "hf_dataset", None, _tree_size(d))) for d in saved]
            out.extend(inp for _, inp in sorted(found, key=lambda pair: pair[0]))
        elif path.is_file():
            out.append(_file_input(path))
        elif as_path(f"{spec}.idx").is_file():  # a Megatron prefix
            out.append(_file_input(as_path(f"{spec}.idx")))
        elif is_glob:
            matches = sorted(Path(p) for p in globlib.glob(str(spec), recursive=True))
            saved = [p for p in matches if p.is_dir() and _is_hf_dataset(p)]
            inside = tuple(f"{d}/" for d in saved)
            files = [p for p in matches if p.is_file() and not str(p).startswith(inside)]
            others = [p for p in matches if p.is_dir() and p not in saved]
            if not files and not saved:
                dirs = f" (only directories: {', '.join(map(str, others[:3]))})" if others else ""
                raise InputError(f"{spec}: the pattern matches no files{dirs}")
            if skipped is not None:  # said on the skipped: line, not dropped without a word
                read = [str(p) for p in files] + [str(d) for d in saved]
                skipped.extend(  # (``**`` matches the directories of the files it matches)
                    d
                    for d in others
                    if not str(d).startswith(inside)
                    and not any(r.startswith(f"{d}/") for r in read)
                )
            found = [(str(p), _file_input(p)) for p in files]
            found += [(str(d), InputFile(d, "hf_dataset", None, _tree_size(d))) for d in saved]
            out.extend(inp for _, inp in sorted(found, key=lambda pair: pair[0]))
        else:
            raise InputError(f"{spec}: no such file or directory")
    _refuse_repeats(out)
    return out


def _refuse_repeats(inputs: Sequence[InputFile]) -> None:
    """An input named twice (twice over, by a directory and a file in it, by a glob and its
    directory) would have its documents packed twice."""
    seen: set[str] = set()
    for inp in inputs:
        key = str(inp.path) if is_url(inp.path) else str(Path(inp.path).resolve())
        if key in seen:
            raise InputError(
                f"{inp.path}: named twice by the inputs, so its documents would be packed "
                "twice: name each input once (to repeat one on purpose, give a copy)"
            )
        seen.add(key)


def _without_packed_outputs(members: list[AnyPath]) -> tuple[list[AnyPath], list[AnyPath]]:
    """The members of an input directory outside packtool outputs (a directory holding a
    ``manifest.json`` beside a ``state.json``, as ``pack -o DIR/packed`` leaves inside
    ``DIR``), and those outputs: their shards are packed rows, not documents."""
    names = {str(p) for p in members}
    outputs = sorted(
        {
            p.parent
            for p in members
            if p.name == "manifest.json" and str(p.parent / "state.json") in names
        },
        key=str,
    )
    if not outputs:
        return members, []
    prefixes = tuple(f"{o}/" for o in outputs)
    return [p for p in members if not str(p).startswith(prefixes)], outputs


def _saved_datasets(members: list[AnyPath]) -> tuple[list[AnyPath], list[AnyPath]]:
    """The members of an input directory outside datasets saved with ``save_to_disk`` (a
    directory holding ``dataset_dict.json``, else ``state.json``), and those datasets: each is
    one input, read as when named itself (its JSON files are not records)."""
    dicts = {p.parent for p in members if p.name == "dataset_dict.json"}
    inside = tuple(f"{d}/" for d in dicts)
    roots = dicts | {
        p.parent for p in members if p.name == "state.json" and not str(p).startswith(inside)
    }
    if not roots:
        return members, []
    prefixes = tuple(f"{r}/" for r in roots)
    return [p for p in members if not str(p).startswith(prefixes)], sorted(roots, key=str)


def describe_skipped(skipped: Sequence[AnyPath | str], shown: int = 3) -> str:
    """One line on the directory members that :func:`resolve_inputs` skipped: files of an
    unknown type, and packtool outputs (directories) inside the input directories."""
    dirs = [p for p in skipped if as_path(p).is_dir()]
    outputs = [p for p in dirs if (as_path(p) / "manifest.json").is_file()]
    matched = [p for p in dirs if p not in outputs]  # directories a pattern matched
    files = [p for p in skipped if p not in dirs]

    def listed(paths: Sequence[AnyPath | str]) -> str:
        more = f" and {len(paths) - shown:,} more" if len(paths) > shown else ""
        return ", ".join(str(p) for p in paths[:shown]) + more

    said = []
    if files:
        said.append(
            f"{len(files):,} file{'s' if len(files) != 1 else ''} of an unknown type in the "
            f"input directories, not read: {listed(files)} (supported: {SUPPORTED})"
        )
    if outputs:
        said.append(
            f"{len(outputs):,} packtool output{'s' if len(outputs) != 1 else ''} in the input "
            f"directories, not read as inputs: {listed(outputs)}"
        )
    if matched:
        said.append(
            f"{len(matched):,} director{'ies' if len(matched) != 1 else 'y'} matched by a "
            f"pattern, not read: {listed(matched)} (name a directory to read its files, or "
            "match them: DIR/**/*.jsonl)"
        )
    return "; ".join(said)


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
