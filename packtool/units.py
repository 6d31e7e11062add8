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
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from ._version import __version__
from .chat import ChatTemplate, load_chat_template
from .errors import FormatError, OutputExistsError
from .format import MANIFEST_FILE, Manifest, UnitRecord, read_manifest
from .fs import AnyPath, as_path, open_input
from .instruct import InputShape, detected_from, input_shape
from .limits import MAX_UNITS, check_int
from .mixture import MixtureMeasure, Source, UnitMixture
from .options import PackOptions
from .order import unit_row_seed
from .prepare import choose_tokenizer, resolve_options
from .readers import InputFile, Piece, cuts
from .tokenize import Tokenizer

__all__ = [
    "UNITS_DIR",
    "Piece",
    "Unit",
    "UnitResult",
    "corpus_options",
    "measure_unit",
    "options_key",
    "plan_units",
    "run_unit",
    "unit_dirs",
    "unit_mixtures",
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
    if spec is None and options.ids_field is not None:  # pre-tokenized: no tokenizer to load
        return choose_tokenizer(options), False
    key = (spec, options.eos_token, options.bos_token)
    cached = _TOKENIZERS.get(key)
    if cached is not None:
        return cached, False
    # The engine loads when a unit first encodes (text: the parity gate picks it).
    tok = choose_tokenizer(options, preload=False)
    _TOKENIZERS[key] = tok
    return tok, True


def corpus_options(files: Sequence[InputFile], options: PackOptions) -> tuple[PackOptions, bool]:
    """``options`` with what every unit must agree on decided once, over the whole corpus
    (as a single ``pack`` decides it), and whether ``auto`` chose the input shape.

    Decided here: the input shape (``auto``: by the fields of the first record of the first
    input; a unit cannot see them, and an empty unit has none), the ids field of Megatron
    inputs, and a chat template, loaded here and carried to the units by value (the plan's
    hash then covers its text)."""
    o = resolve_options(files, options)
    if o.ids_field is not None:
        return o, o.input_shape == "auto"
    shape, auto = input_shape(files, o)
    o = o.replace(input_shape=shape.value)
    if shape is InputShape.CHAT and not isinstance(o.chat_template, ChatTemplate):
        tok, _ = unit_tokenizer(o)
        records = f"chat records{detected_from(files, auto)}"
        o = o.replace(chat_template=load_chat_template(o.chat_template, tok, records=records))
    return o, auto


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
class Unit:
    """Unit ``index`` of ``count``: its pieces, in input order, and the plan it belongs to."""

    index: int
    count: int
    pieces: tuple[Piece, ...]
    plan: str  # sha256 of the whole plan: inputs, cut points, options (options_key)
    inputs_sha256: str = ""  # of the inputs' paths, kinds and sizes
    options_json: str = "null"  # options_key(options), as JSON
    input_shape_auto: bool = False  # the shape was detected (corpus_options), not given

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
            "input_shape_auto": self.input_shape_auto,
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


class _IndexSplitter(_Splitter):
    """An input of numbered parts at known byte offsets, where a unit may start at any part:
    Parquet row groups (group ``g`` at ``4 + (compressed bytes of groups 0..g-1)``; 4: the
    file's magic number) or Megatron sequences (sequence ``i`` at the size of the ``.idx``
    plus its offset in the ``.bin``). A piece holds parts ``[start, stop)``."""

    def __init__(self, inp: InputFile, starts: np.ndarray, split_by: str, shift: int = 0) -> None:
        super().__init__(inp)
        self.starts = starts  # byte offset of each part, minus `shift`; non-decreasing
        self.shift = shift
        self.split_by = split_by

    def _first_at(self, offset: int) -> int:
        """The first part at or after ``offset`` (part 0 is taken to start at 0)."""
        if offset <= 0:
            return 0
        return max(1, int(np.searchsorted(self.starts, offset - self.shift, "left")))

    def next_boundary(self, offset: int) -> int:
        if offset <= 0:
            return 0
        g = self._first_at(offset)
        if g >= len(self.starts):
            return self.inp.size_bytes
        return min(int(self.starts[g]) + self.shift, self.inp.size_bytes)

    def group(self, offset: int) -> int:
        return len(self.starts) if offset >= self.inp.size_bytes else self._first_at(offset)

    def piece(self, start: int, stop: int) -> Piece:
        if start == 0 and stop == self.inp.size_bytes:
            return super().piece(start, stop)
        return _piece(self.inp, self.split_by, self.group(start), self.group(stop), stop - start)


def _splitter(inp: InputFile) -> _Splitter:
    where = cuts(inp)  # the format's reader says where its pieces may start
    if where is None:
        return _Splitter(inp)
    if where.starts is None:
        return _LineSplitter(inp)
    return _IndexSplitter(inp, where.starts, where.split_by, where.shift)


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


def finished_unit(unit: Unit, out_dir: str | os.PathLike[str]) -> Manifest | None:
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
    recorded = manifest.unit
    if recorded is not None and recorded.plan == unit.plan and recorded.index == unit.index:
        return manifest
    raise OutputExistsError(
        f"{directory} was packed with other inputs or options ({_differences(recorded, unit)}); "
        "pass --overwrite to pack it again"
    )


def _differences(recorded: UnitRecord | None, unit: Unit) -> str:
    """What changed since the unit was packed, in a few words."""
    if recorded is None or recorded.plan_version != PLAN_VERSION:
        return "an older unit assignment rule"
    old, new = recorded.options, json.loads(unit.options_json) or {}
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if changed:
        return "other " + ", ".join(changed)
    if recorded.inputs_sha256 != unit.inputs_sha256:
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
    mixture: UnitMixture | None = None,
) -> UnitResult:
    """Pack one unit into ``OUT_DIR/units/unit-I-of-N/``: FFD inside the unit, the rows
    shuffled (unless ``options.shuffle`` is off) with :func:`~packtool.order.unit_row_seed`.

    Skips the unit when it is already finished under the same plan. The unit's manifest
    gets a ``unit`` record: index, count, plan hash, pieces, and ``merge_options`` (the
    ``shuffle``/``seed``/``rows_per_shard``/``copy`` given at pack time, the merge's
    defaults). A merge without copying lists these shards as they are, so their row order is
    the merged dataset's order within each unit.

    ``mixture``: the unit's part of a mixture, planned over every unit (``pack --mix``); the
    unit then packs from the tokens :func:`measure_unit` kept, if this machine holds them.
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
        _unit_options(options, unit, tok, overwrite, num_proc, resume=mixture is not None),
        progress=progress,
        files=unit.pieces,
        extra_manifest={"unit": record},
        allow_empty=True,  # a unit whose range holds nothing; the merge checks the whole
        mixture=mixture,
    )
    result = result_from_manifest(unit, report.manifest, skipped=False, seconds=report.seconds)
    result.tokenizer_loaded = loaded
    return result


def _unit_options(
    options: PackOptions,
    unit: Unit,
    tok: Tokenizer,
    overwrite: bool,
    num_proc: int | None,
    *,
    resume: bool,
) -> PackOptions:
    """The options ``pack`` runs a unit with (the same for a mixture's measure and pack, so
    that the pack resumes the measured tokens)."""
    return options.replace(
        tokenizer=tok,
        seed=unit_row_seed(options.seed, unit.index),  # rows shuffled within the unit
        world_size=None,  # the merge balances the steps, over all units' rows
        micro_batches=1,
        overwrite=overwrite,
        resume=resume,
        num_proc=num_proc,
        units=None,
        unit=None,
        merge_copy=None,
        engine="local",
        ray_address=None,
    )


def measure_unit(
    unit: Unit,
    out_dir: str | os.PathLike[str],
    options: PackOptions,
    mixture: UnitMixture,
    *,
    num_proc: int | None = None,
) -> MixtureMeasure:
    """Tokenize a mixture's unit and measure its sources' documents
    (:func:`packtool.pipeline.measure`), before the mixture is planned over every unit."""
    from .pipeline import measure

    (as_path(out_dir) / UNITS_DIR).mkdir(parents=True, exist_ok=True)
    tok, _ = unit_tokenizer(options)
    found = measure(
        unit.directory(out_dir),
        _unit_options(options, unit, tok, False, num_proc, resume=True),
        unit.pieces,
        mixture,
        index=unit.index,
    )
    return replace(found, pid=os.getpid(), host=socket.gethostname(), packtool_version=__version__)


def unit_mixtures(
    units: Sequence[Unit], files: Sequence[InputFile], sources: Sequence[Source]
) -> list[UnitMixture]:
    """Each unit's sources, over its pieces (``sources``: over ``files``, the inputs in
    reading order, which the units cut into pieces in that order). A piece that starts its
    file (``start`` 0) counts the file for its source."""
    file_of: list[list[int]] = []
    f = -1
    for u in units:
        mine = []
        for piece in u.pieces:
            if piece.start == 0:  # the first piece of the next file
                f += 1
            mine.append(f)
        file_of.append(mine)
    if f != len(files) - 1:  # pragma: no cover - plan_units gives every file a piece
        raise AssertionError(f"{len(files)} inputs, pieces of {f + 1}")
    out = []
    for u, mine in zip(units, file_of, strict=True):
        parts, counts = [], []
        for src in sources:
            lo = bisect.bisect_left(mine, src.first_file)
            hi = bisect.bisect_left(mine, src.end_file)
            parts.append(Source(src.path, src.weight, lo, hi))
            counts.append(sum(1 for p in u.pieces[lo:hi] if p.start == 0))
        out.append(UnitMixture(tuple(parts), files=tuple(counts)))
    return out


def result_from_manifest(
    unit: Unit, manifest: Manifest, *, skipped: bool, seconds: float
) -> UnitResult:
    """A :class:`UnitResult` from a unit's manifest (for this process)."""
    return UnitResult(
        index=unit.index,
        count=unit.count,
        skipped=skipped,
        documents=manifest.counts.documents.read,
        segments=manifest.segments or 0,
        tokens=manifest.counts.tokens.packed,
        rows=manifest.rows or 0,
        seconds=round(seconds, 3),
        pid=os.getpid(),
        host=socket.gethostname(),
        tokenizer_loaded=False,
    )
