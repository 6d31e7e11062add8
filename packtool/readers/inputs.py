"""Which inputs the paths, directories, globs and URLs given name.

:func:`resolve_inputs` expands them into :class:`~.files.InputFile`, each of the kind of
the table of formats (:mod:`.registry`) that its suffixes name (a directory saved with
`datasets` is one input); :func:`describe_skipped` says what a directory held that was not
read.
"""

from __future__ import annotations

import glob as globlib
import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import InputError, OptionError
from ..fs import AnyPath, StorePath, as_path, is_url
from .base import Reader
from .files import InputFile
from .hf_dataset import is_saved_dataset
from .registry import FORMATS, reader_for, suffix_readers

_COMPRESSED = {".gz": "gzip", ".zst": "zstd"}


def supported() -> str:
    """The suffixes of the table of formats, and the compressed forms of the first suffix
    of each compressible format (``.jsonl, .ndjson, ..., .jsonl.gz, .jsonl.zst, ...``)."""
    readers = list(FORMATS.values())
    plain = [s for r in readers for s in r.suffixes]
    packed = [
        r.suffixes[0] + c for r in readers if r.compressible and r.suffixes for c in _COMPRESSED
    ]
    return ", ".join(plain + packed)


def _format_of(path: AnyPath) -> tuple[Reader, str | None] | None:
    """The reader that the suffixes of ``path`` name, and the file's compression."""
    suffixes = [s.lower() for s in path.suffixes]
    if not suffixes:
        return None
    by_suffix = suffix_readers()
    compression = _COMPRESSED.get(suffixes[-1])
    if compression is not None:
        reader = by_suffix.get(suffixes[-2]) if len(suffixes) >= 2 else None
        return (reader, compression) if reader is not None and reader.compressible else None
    reader = by_suffix.get(suffixes[-1])
    return (reader, None) if reader is not None else None


def _kind_of(path: AnyPath) -> str | None:
    found = _format_of(path)
    return None if found is None else found[0].kind


def _saved_dataset(path: AnyPath) -> InputFile:
    return reader_for("hf_dataset").input_file(path, None)


def _file_input(path: AnyPath) -> InputFile:
    for reader in FORMATS.values():
        entry = reader.entry_of(path)  # a companion file (a Megatron .bin) names its input
        if entry is not None:
            path = entry
            break
    found = _format_of(path)
    if found is None:
        raise InputError(f"{path}: unsupported file type (supported: {supported()})")
    reader, compression = found
    return reader.input_file(path, compression)


def _companions(path: AnyPath) -> list[AnyPath]:
    found = _format_of(path)
    return [] if found is None else found[0].companions(path)


def _claimed(path: AnyPath) -> Reader | None:
    """The reader of the directory format that ``path`` is, if one claims it."""
    for reader in FORMATS.values():
        claims = getattr(reader, "claims", None)
        if claims is not None and claims(path):
            return reader
    return None


def _by_prefix(spec: str) -> AnyPath | None:
    for reader in FORMATS.values():
        entry = reader.by_prefix(spec)
        if entry is not None:
            return entry
    return None


def resolve_inputs(
    specs: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    *,
    skipped: list[AnyPath] | None = None,
) -> list[InputFile]:
    """Expand paths, directories and globs into a list of inputs, in a stable order.

    ``specs`` is a list of them, or one (a string is one path, never its characters).

    A directory that a reader of the table claims (a packtool output, once
    :mod:`packtool.repack` is imported) is one input of its kind. Else a directory is a
    `datasets` dataset if it holds ``state.json`` or ``dataset_dict.json``;
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
            claimed = _claimed(path)  # a directory format (a packtool output)
            if claimed is not None:
                out.append(claimed.input_file(path, None))
                continue
            if is_saved_dataset(path):
                out.append(_saved_dataset(path))
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
            pairs = {c for p in files for c in _companions(p)}  # a Megatron .bin
            unknown = [p for p in members if _kind_of(p) is None and p not in pairs]
            if not files and not saved:
                s = "s" if len(unknown) != 1 else ""
                others = f" (only {len(unknown):,} file{s} of an unknown type)" if unknown else ""
                raise InputError(
                    f"{path}: directory holds no supported files{others}; supported: {supported()}"
                )
            if skipped is not None:
                skipped.extend(unknown)
            found = [(str(p), _file_input(p)) for p in files]
            found += [(str(d), _saved_dataset(d)) for d in saved]
            out.extend(inp for _, inp in sorted(found, key=lambda pair: pair[0]))
        elif path.is_file():
            out.append(_file_input(path))
        elif (entry := _by_prefix(str(spec))) is not None:  # a Megatron prefix
            out.append(_file_input(entry))
        elif is_glob:
            matches = sorted(Path(p) for p in globlib.glob(str(spec), recursive=True))
            saved = [p for p in matches if p.is_dir() and is_saved_dataset(p)]
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
            found += [(str(d), _saved_dataset(d)) for d in saved]
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
            f"input directories, not read: {listed(files)} (supported: {supported()})"
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


def refuse_inputs_in(files: Sequence[InputFile], out: AnyPath) -> None:
    """Refuse an input that is the output directory ``out``, or inside it: the run replaces
    that directory (a pack repacked into itself would be read while it is deleted)."""
    if not isinstance(out, Path):  # an output on a store: its inputs' URLs are checked there
        return
    where = out.resolve()
    for f in files:
        if not isinstance(f.path, Path):
            continue
        path = f.path.resolve()
        if path == where or where in path.parents:
            what = "the output directory" if path == where else "inside the output directory"
            raise OptionError(
                f"{f.path} is {what} {out}, which the run replaces: choose another --output"
            )
