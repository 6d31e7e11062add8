"""Work units: split a corpus into deterministic parts that any launcher can run.

A *unit* is a contiguous part of the inputs. Unit ``I`` of ``N`` tokenizes and packs its own
documents (FFD inside the unit) and writes a normal packtool output to
``OUT_DIR/units/unit-0000I-of-0000N/``, whose manifest (written last) is the unit's completion
marker. ``packtool merge`` (:mod:`packtool.merge`) then joins the units into one dataset.

The assignment rule (:func:`plan_units`) depends on the inputs and the options alone, so every
launcher (a local process pool, a Slurm array task, a Kubernetes indexed job, a Ray task)
computes the same units::

    inputs, in the order `pack` reads them, laid end to end by size in bytes:

    | a.jsonl (600 B)          | b.parquet (300 B) | c.jsonl.gz (100 B) |      total 1000 B
    0                          600                 900                 1000

    --units 4: cut points at 250, 500, 750, each moved forward to the next place where a
    record starts (a line start in uncompressed JSON Lines, a row group in Parquet, else the
    end of the file):

    unit 0: a.jsonl bytes [0, 262)        (the line break after byte 250)
    unit 1: a.jsonl bytes [262, 517)
    unit 2: a.jsonl bytes [517, 600), b.parquet row groups [0, 2)
    unit 3: b.parquet row groups [2, 3), c.jsonl.gz

Units keep the input order, so document ``d`` of unit ``I`` is document
``(documents read by units 0..I-1) + d`` of the whole corpus, the number a single ``pack``
would give it; the merge applies these offsets to ``doc_ids``.

A unit reruns only when needed: :func:`run_unit` skips a unit whose manifest exists and
records the same plan (inputs, cut points and every option that changes rows).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import re
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa

from ._version import __version__
from .errors import BadRecordError, FormatError, InputError, OutputExistsError
from .format import MANIFEST_FILE, read_manifest
from .fs import AnyPath, arrow_source, as_path, open_input
from .limits import MAX_UNITS, check_int
from .options import PackOptions
from .sources import BATCH_DOCS, InputFile, TextBatch, check_column, check_record, read_texts
from .tokenize import Tokenizer, load_tokenizer

__all__ = [
    "UNITS_DIR",
    "Piece",
    "Unit",
    "UnitResult",
    "options_key",
    "plan_units",
    "read_piece",
    "run_unit",
    "unit_dirs",
    "unit_tokenizer",
]

UNITS_DIR = "units"
"""Sub-directory of the output directory that holds the units' outputs."""

PLAN_VERSION = 1
"""Version of the assignment rule, part of every plan's hash: a change of the rule changes
the hash, so units packed under an older rule are never mixed with new ones."""

_UNIT_NAME = "unit-{index:05d}-of-{count:05d}"
_UNIT_RE = re.compile(r"^unit-(\d{5,})-of-(\d{5,})$")
_SCAN_BLOCK = 1 << 20


# -- options -------------------------------------------------------------------------------


def unit_tokenizer(options: PackOptions) -> tuple[Tokenizer, bool]:
    """The tokenizer of ``options``, loaded at most once per process: ``(tokenizer,
    loaded_now)``. A tokenizer object (library use, e.g. a test fake) must pickle to run in
    other processes."""
    spec = options.tokenizer
    if spec is not None and not isinstance(spec, str):
        return spec, False
    key = (spec, options.eos_token, options.bos_token)
    cached = _TOKENIZERS.get(key)
    if cached is not None:
        return cached, False
    # The engine loads when a unit first encodes (the parity gate picks it; units are text).
    tok = load_tokenizer(
        spec, eos_token=options.eos_token, bos_token=options.bos_token, preload=False
    )
    _TOKENIZERS[key] = tok
    return tok, True


def options_key(options: PackOptions) -> dict[str, Any]:
    """What identifies the rows a unit packs: the options that decide rows, and the tokenizer
    by the sha256 of its file (so an edited tokenizer.json re-packs)."""
    tok, _ = unit_tokenizer(options)
    out = options.rows_key()
    out["tokenizer"] = {"spec": options.tokenizer_spec or tok.name, "sha256": tok.sha256}
    return out


_TOKENIZERS: dict[tuple[Any, ...], Tokenizer] = {}
"""Per-process cache: a process (pool worker, Ray worker) loads each tokenizer once."""


# -- pieces and units ----------------------------------------------------------------------


@dataclass(frozen=True)
class Piece(InputFile):
    """A contiguous part of one input file: the whole file, or a range of it.

    ``split_by`` is ``"file"`` (the whole input, read as ``pack`` reads it), ``"bytes"``
    (bytes ``[start, stop)`` of an uncompressed JSON Lines file; both are line starts or the
    end) or ``"row_groups"`` (row groups ``[start, stop)`` of a Parquet file).
    ``size_bytes`` is the size of the piece, ``file_size`` the size of the whole input.
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


@dataclass(frozen=True)
class Unit:
    """Unit ``index`` of ``count``: its pieces, in input order, and the plan it belongs to."""

    index: int
    count: int
    pieces: tuple[Piece, ...]
    plan: str  # sha256 of the whole plan: inputs, cut points, options (options_key)
    inputs_sha256: str = ""  # of the inputs' paths, kinds and sizes
    options_json: str = "null"  # options_key(options), as JSON

    @property
    def name(self) -> str:
        return _UNIT_NAME.format(index=self.index, count=self.count)

    @property
    def size_bytes(self) -> int:
        return sum(p.size_bytes for p in self.pieces)

    def directory(self, out_dir: str | os.PathLike[str]) -> AnyPath:
        return as_path(out_dir) / UNITS_DIR / self.name

    def describe(self) -> dict[str, Any]:
        """The manifest's ``unit`` record (with the merge options added by :func:`run_unit`)."""
        return {
            "index": self.index,
            "count": self.count,
            "plan": self.plan,
            "plan_version": PLAN_VERSION,
            "inputs_sha256": self.inputs_sha256,
            "options": json.loads(self.options_json),
            "pieces": [p.describe() for p in self.pieces],
        }


class _Splitter:
    """Where records may start in one input, as byte offsets: a cut moves forward to one."""

    def __init__(self, inp: InputFile) -> None:
        self.inp = inp

    def next_boundary(self, offset: int) -> int:
        """The first offset >= ``offset`` where a unit may start (the file end at the latest)."""
        return 0 if offset <= 0 else self.inp.size_bytes

    def piece(self, start: int, stop: int) -> Piece:
        return _piece(self.inp, "file", 0, self.inp.size_bytes, self.inp.size_bytes)


def _piece(inp: InputFile, split_by: str, start: int, stop: int, size: int) -> Piece:
    return Piece(
        path=inp.path,
        kind=inp.kind,
        compression=inp.compression,
        size_bytes=size,
        file_size=inp.size_bytes,
        split_by=split_by,
        start=start,
        stop=stop,
    )


class _LineSplitter(_Splitter):
    """Uncompressed JSON Lines: a record starts after every line break."""

    def next_boundary(self, offset: int) -> int:
        size = self.inp.size_bytes
        if offset <= 0 or offset >= size:
            return min(max(offset, 0), size)
        with open_input(self.inp.path) as f:
            position = offset - 1  # a line starts at `offset` if the byte before is "\n"
            f.seek(position)
            while True:
                block = f.read(_SCAN_BLOCK)
                if not block:
                    return size
                found = block.find(b"\n")
                if found >= 0:
                    return position + found + 1
                position += len(block)

    def piece(self, start: int, stop: int) -> Piece:
        if start == 0 and stop == self.inp.size_bytes:
            return super().piece(start, stop)
        return _piece(self.inp, "bytes", start, stop, stop - start)


class _RowGroupSplitter(_Splitter):
    """Parquet: a unit may start at any row group. Row group ``g`` sits at byte offset
    ``4 + (compressed bytes of groups 0..g-1)`` (4: the file's magic number)."""

    def __init__(self, inp: InputFile, starts: list[int]) -> None:
        super().__init__(inp)
        self.starts = starts  # byte offset of each row group; starts[0] is taken as 0

    def next_boundary(self, offset: int) -> int:
        if offset <= 0:
            return 0
        g = bisect.bisect_left(self.starts, offset)
        return self.starts[g] if g < len(self.starts) else self.inp.size_bytes

    def group(self, offset: int) -> int:
        return (
            len(self.starts)
            if offset >= self.inp.size_bytes
            else bisect.bisect_left(self.starts, offset)
        )

    def piece(self, start: int, stop: int) -> Piece:
        if start == 0 and stop == self.inp.size_bytes:
            return super().piece(start, stop)
        return _piece(self.inp, "row_groups", self.group(start), self.group(stop), stop - start)


def _splitter(inp: InputFile) -> _Splitter:
    if inp.kind == "jsonl" and inp.compression is None:
        return _LineSplitter(inp)
    if inp.kind == "parquet":
        import pyarrow.parquet as pq

        try:
            meta = pq.ParquetFile(arrow_source(inp.path)).metadata
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError(f"{inp.path}: not a readable Parquet file: {e}") from e
        starts, position = [0], 4
        for g in range(meta.num_row_groups - 1):
            group = meta.row_group(g)
            position += sum(group.column(c).total_compressed_size for c in range(group.num_columns))
            starts.append(min(max(position, starts[-1] + 1), inp.size_bytes))
        if meta.num_row_groups > 1 and len(set(starts)) == len(starts):
            return _RowGroupSplitter(inp, starts)
    return _Splitter(inp)


def plan_units(
    files: Sequence[InputFile], units: int, options: PackOptions | None = None
) -> list[Unit]:
    """Assign the inputs to ``units`` contiguous units, balanced by bytes.

    The inputs are laid end to end (in the order given, which is ``pack``'s reading order),
    cut at ``k * total_bytes // units`` for ``k = 1 .. units - 1``, and each cut is moved
    forward to the first offset where a record may start: the next line start in an
    uncompressed JSON Lines file, the next row group in a Parquet file, the end of the file
    for any other input. A cut never moves backwards past the one before it, so a unit can
    be empty (more units than places to cut). An empty file goes with the unit where it
    starts. The plan's hash covers the inputs (path, kind, size), the cut points and
    ``options_key(options)``; the same inputs and options give the same units everywhere.
    """
    check_int("--units", units, 1, MAX_UNITS)
    splitters = [_splitter(f) for f in files]
    prefix = [0]
    for f in files:
        prefix.append(prefix[-1] + f.size_bytes)
    total = prefix[-1]
    bounds = [0]
    for k in range(1, units):
        cut = k * total // units
        f = bisect.bisect_right(prefix, cut) - 1
        if cut >= total or f >= len(files):
            bounds.append(total)
            continue
        snapped = prefix[f] + splitters[f].next_boundary(cut - prefix[f])
        bounds.append(max(snapped, bounds[-1]))
    bounds.append(total)

    inputs = [[str(f.path), f.kind, f.compression, f.size_bytes] for f in files]
    inputs_sha = _sha256({"inputs": inputs})
    key = options_key(options) if options is not None else None
    plan = _sha256(
        {
            "plan_version": PLAN_VERSION,
            "units": units,
            "options": key,
            "inputs": inputs_sha,
            "bounds": bounds,
        }
    )

    pieces: list[list[Piece]] = [[] for _ in range(units)]
    for i, splitter in enumerate(splitters):
        lo_file, hi_file = prefix[i], prefix[i + 1]
        if lo_file == hi_file:  # empty file: the last unit starting at or before it
            pieces[bisect.bisect_right(bounds, lo_file, hi=units) - 1].append(splitter.piece(0, 0))
            continue
        for u in range(units):
            lo, hi = max(bounds[u], lo_file), min(bounds[u + 1], hi_file)
            if lo < hi:
                pieces[u].append(splitter.piece(lo - lo_file, hi - lo_file))
    options_json = json.dumps(key, sort_keys=True)
    return [Unit(u, units, tuple(pieces[u]), plan, inputs_sha, options_json) for u in range(units)]


def _sha256(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


# -- reading a piece -----------------------------------------------------------------------


def read_piece(
    piece: InputFile,
    *,
    text_field: str = "text",
    skip_bad_records: bool = False,
    split: str | None = None,
    txt_unit: str = "line",
    batch_docs: int = BATCH_DOCS,
) -> Iterator[TextBatch]:
    """The texts of one piece, in order, as :func:`packtool.sources.read_texts` gives them.

    A whole file is read by ``read_texts`` itself. A byte range of a JSON Lines file and a
    row-group range of a Parquet file give the same records as the corresponding part of
    the whole file, with error locations (line, row) counted from the start of the file.
    """
    if not isinstance(piece, Piece) or piece.whole:
        return read_texts(
            piece,
            text_field=text_field,
            skip_bad_records=skip_bad_records,
            split=split,
            txt_unit=txt_unit,
            batch_docs=batch_docs,
        )
    if piece.split_by == "bytes":
        return _read_jsonl_range(piece, text_field, skip_bad_records, batch_docs)
    if piece.split_by == "row_groups":
        return _read_parquet_groups(piece, text_field, skip_bad_records, batch_docs)
    raise ValueError(f"unknown split_by {piece.split_by!r}")


def _lines_before(path: AnyPath, offset: int) -> int:
    count = 0
    with open_input(path) as f:
        while offset > 0:
            block = f.read(min(_SCAN_BLOCK, offset))
            if not block:
                break
            count += block.count(b"\n")
            offset -= len(block)
    return count


def _read_jsonl_range(
    piece: Piece, text_field: str, skip_bad: bool, batch_docs: int
) -> Iterator[TextBatch]:
    """Lines of bytes ``[start, stop)``, parsed like ``sources``' line-by-line reader."""
    first_line: list[int] = []  # computed on the first error only

    def location(lineno: int) -> str:
        if not first_line:
            first_line.append(_lines_before(piece.path, piece.start))
        return f"{piece.path}:{first_line[0] + lineno}"

    remaining = piece.stop - piece.start
    try:
        f = open_input(piece.path)
    except OSError as e:
        raise InputError(f"{piece.path}: cannot open: {e.strerror or e}") from e
    with f:
        f.seek(piece.start)
        stream = f
        batch = TextBatch([])
        lineno = 0
        done = 0
        while done < remaining:  # `stop` is a line start: the last line ends there
            line = stream.readline()
            if not line:
                break
            done += len(line)
            lineno += 1
            if not line.strip():
                continue
            try:
                try:
                    obj = json.loads(line.decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise BadRecordError(location(lineno), f"invalid UTF-8 ({e.reason})") from None
                except json.JSONDecodeError as e:
                    raise BadRecordError(location(lineno), f"malformed JSON: {e.msg}") from None
                except RecursionError:
                    raise BadRecordError(location(lineno), "JSON nested too deeply") from None
                if isinstance(obj, dict) and isinstance(obj.get(text_field), str):
                    batch.texts.append(obj[text_field])
                else:
                    batch.texts.append(check_record(obj, text_field, location(lineno)))
            except BadRecordError as e:
                if not skip_bad:
                    raise e.with_skip_hint() from None
                batch.texts.append(None)
                batch.bad.append(e)
            if len(batch.texts) >= batch_docs:
                batch.bytes_done = done
                yield batch
                batch = TextBatch([])
        batch.bytes_done = piece.size_bytes
        if batch.texts:
            yield batch


def _read_parquet_groups(
    piece: Piece, text_field: str, skip_bad: bool, batch_docs: int
) -> Iterator[TextBatch]:
    """Row groups ``[start, stop)``; rows numbered from the start of the file."""
    import pyarrow.parquet as pq

    where = str(piece.path)
    try:
        pf = pq.ParquetFile(arrow_source(piece.path), pre_buffer=False)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{where}: not a readable Parquet file: {e}") from e
    check_column(pf.schema_arrow, text_field, where)
    groups = list(range(piece.start, piece.stop))
    row = sum(pf.metadata.row_group(g).num_rows for g in range(piece.start))
    rows_total = max(1, sum(pf.metadata.row_group(g).num_rows for g in groups))
    done = 0
    try:
        for record_batch in pf.iter_batches(
            batch_size=batch_docs * 8, row_groups=groups, columns=[text_field]
        ):
            try:
                texts = record_batch.column(0).to_pylist()
            except UnicodeDecodeError as e:
                raise InputError(
                    f"{where}: invalid UTF-8 in column {text_field!r} near row {row}: {e.reason}"
                ) from None
            done += len(texts)
            bytes_done = piece.size_bytes * done // rows_total
            for i in range(0, len(texts), batch_docs):
                out = TextBatch(texts[i : i + batch_docs], bytes_done=bytes_done)
                for text in out.texts:
                    if text is None:
                        error = BadRecordError(f"{where}: row {row}", f"{text_field!r} is null")
                        if not skip_bad:
                            raise error.with_skip_hint()
                        out.bad.append(error)
                    row += 1
                yield out
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{where}: cannot read Parquet data: {e}") from e


# -- running a unit ------------------------------------------------------------------------


@dataclass
class UnitResult:
    """What running (or skipping) one unit did; ``pid`` and ``host`` say where it ran."""

    index: int
    count: int
    skipped: bool  # already finished by an earlier run with the same plan
    documents: int
    segments: int
    tokens: int
    rows: int
    seconds: float
    pid: int
    host: str
    tokenizer_loaded: bool  # this process loaded the tokenizer for this unit
    packtool_version: str = __version__

    @property
    def name(self) -> str:
        return _UNIT_NAME.format(index=self.index, count=self.count)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def unit_dirs(out_dir: str | os.PathLike[str]) -> dict[int, list[tuple[int, AnyPath]]]:
    """Unit directories under ``OUT_DIR/units``, by unit count: ``{count: [(index, path)]}``."""
    root = as_path(out_dir) / UNITS_DIR
    found: dict[int, list[tuple[int, AnyPath]]] = {}
    if not root.is_dir():
        return found
    for entry in sorted(root.iterdir()):
        m = _UNIT_RE.match(entry.name)
        if m and entry.is_dir():
            found.setdefault(int(m.group(2)), []).append((int(m.group(1)), entry))
    return found


def finished_unit(unit: Unit, out_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The manifest of ``unit`` if it is finished under the same plan, else ``None``.

    Raises :class:`~packtool.errors.OutputExistsError` when the unit was finished under
    another plan (other inputs, options or unit count).
    """
    directory = unit.directory(out_dir)
    if not (directory / MANIFEST_FILE).exists():
        return None
    try:
        manifest = read_manifest(directory)
    except FormatError:
        return None  # an unreadable marker: pack the unit again
    recorded = manifest.get("unit", {})
    if recorded.get("plan") == unit.plan and recorded.get("index") == unit.index:
        return manifest
    raise OutputExistsError(
        f"{directory} was packed with other inputs or options ({_differences(recorded, unit)}); "
        "pass --overwrite to pack it again"
    )


def _differences(recorded: dict[str, Any], unit: Unit) -> str:
    """What changed since the unit was packed, in a few words."""
    if recorded.get("plan_version") != PLAN_VERSION:
        return "an older unit assignment rule"
    old, new = recorded.get("options") or {}, json.loads(unit.options_json) or {}
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if changed:
        return "other " + ", ".join(changed)
    if recorded.get("inputs_sha256") != unit.inputs_sha256:
        return "other input files or sizes"
    return "other input ranges"


def run_unit(
    unit: Unit,
    out_dir: str | os.PathLike[str],
    options: PackOptions,
    *,
    merge_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    num_proc: int | None = None,
    progress: Any = None,
) -> UnitResult:
    """Pack one unit into ``OUT_DIR/units/unit-I-of-N/`` (FFD inside the unit, no shuffle).

    Skips the unit when it is already finished under the same plan. The unit's manifest
    gets a ``unit`` record: index, count, plan hash, pieces, and ``merge_options`` (the
    ``shuffle``/``seed``/``rows_per_shard`` given at pack time, the merge's defaults).
    """
    from .pipeline import pack

    started = time.perf_counter()
    if not overwrite:
        done = finished_unit(unit, out_dir)
        if done is not None:
            return result_from_manifest(
                unit, done, skipped=True, seconds=time.perf_counter() - started
            )
    (as_path(out_dir) / UNITS_DIR).mkdir(parents=True, exist_ok=True)  # on a store: nothing
    tok, loaded = unit_tokenizer(options)
    record = unit.describe()
    if merge_options is not None:
        record["merge_options"] = merge_options
    report = pack(
        [],
        unit.directory(out_dir),
        options.replace(
            tokenizer=tok,
            shuffle=False,
            world_size=None,  # the merge balances the steps, over all units' rows
            micro_batches=1,
            overwrite=overwrite,
            resume=False,
            num_proc=num_proc,
            units=None,
            unit=None,
            engine="local",
            ray_address=None,
        ),
        progress=progress,
        files=unit.pieces,
        read=read_piece,
        extra_manifest={"unit": record},
        allow_empty=True,  # a unit whose range holds nothing; the merge checks the whole
    )
    result = result_from_manifest(unit, report.manifest, skipped=False, seconds=report.seconds)
    result.tokenizer_loaded = loaded
    return result


def result_from_manifest(
    unit: Unit, manifest: dict[str, Any], *, skipped: bool, seconds: float
) -> UnitResult:
    """A :class:`UnitResult` from a unit's manifest (for this process)."""
    return UnitResult(
        index=unit.index,
        count=unit.count,
        skipped=skipped,
        documents=int(manifest["documents"]["read"]),
        segments=int(manifest["segments"]),
        tokens=int(manifest["tokens"]["packed"]),
        rows=int(manifest["rows"]),
        seconds=round(seconds, 3),
        pid=os.getpid(),
        host=socket.gethostname(),
        tokenizer_loaded=False,
    )
