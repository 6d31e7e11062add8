"""``packtool merge``: join the outputs of work units into one packed dataset.

The units of ``OUT_DIR/units/unit-I-of-N/`` (see :mod:`packtool.units`) each hold their rows
FFD-packed and shuffled within the unit (seed :func:`~packtool.order.unit_row_seed`). By
default the merge writes no row: its manifest lists the units' shards where they lie, as
paths relative to ``OUT_DIR``, in a seeded order (:func:`~packtool.order.shard_order`), each
with the ``doc_offset`` that numbers its documents over the whole corpus::

    unit 0 shards  u0/s0 u0/s1        documents 0..999 of the corpus      doc_offset 0
    unit 1 shards  u1/s0              documents 1000..1799 (local 0..799)  doc_offset 1000
                   \\ shard_order(3, seed) /
    OUT_DIR/manifest.json   units/u1/s0, units/u0/s1, units/u0/s0  (+ state.json for datasets)

Where a global stored order is needed (``--world-size``: balanced steps over all the units'
rows), or the units' stored order is not the one asked for (another seed, ``--no-shuffle``,
another shard size), or with ``copy=True``, the merge copies: it lays the units' FFD rows end
to end (unit 0's, then unit 1's, ...), orders them as ``pack`` would (the seeded shuffle, or
balanced steps), renumbers ``doc_ids`` and writes new shards into ``OUT_DIR``. With
``--units 1`` the merged rows are exactly those of a plain ``pack`` either way (in the
referencing merge when the unit has one shard; with more, the same shards in another order).

Both measure what packing unit by unit costs: one first-fit-decreasing over all segment
lengths of all units, recorded as ``global_ffd_rows`` (the rows a single ``pack`` would
write), beside ``rows`` and the per-unit figures under ``units``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import FormatError, OptionError, PacktoolError
from .format import (
    CHAT_TEMPLATE_FILE,
    MANIFEST_FILE,
    MERGE_STAGE,
    TOKENIZER_CONFIG_FILE,
    Counts,
    DocumentCounts,
    InputRecord,
    Manifest,
    RunFigures,
    ShardEntry,
    ShardWriter,
    UnitRecord,
    commit_in_place,
    open_packed,
    publish,
    read_manifest,
    remove_stale_temporaries,
    row_bytes,
    write_dataset,
)
from .fs import AnyPath, StorePath, as_path, check_writable, download_tree
from .layout import Layout
from .mixture import join_mixture
from .options import MERGE_KEYS, NO_COPY_BALANCE, OPTIONS
from .order import attention_costs, row_shuffle, shard_order, stored_order, unit_row_seed
from .packing import aligned_lengths, first_fit_decreasing, lower_bound_rows
from .pipeline import PackReport
from .units import UNITS_DIR, unit_dirs

__all__ = ["MERGE_KEYS", "merge_units", "segment_lengths"]


_MERGE_OPTIONS = {o.merge_key: o for o in OPTIONS.values() if o.merge_key is not None}
_LAYOUT_FIELDS = {f.name for f in fields(Layout)}
_BAD_RECORDS_KEPT = 20
_STAGE = MERGE_STAGE  # the merged dataset is built in OUT_DIR/.merge, then moved up
_DATASET_FILES = ("README.md", "dataset_info.json", "state.json", "tokenizer.json")


def segment_lengths(table: pa.Table) -> np.ndarray:
    """The length of every document segment of ``table``'s rows, row by row (int64).

    Row ``cu_seqlens [0, 9, 16, 21, 24]`` with 3 ``doc_ids`` gives ``[9, 7, 5]`` (the padding
    segment is not a document). In an aligned pack, the real lengths (``cu_seqlens_unpadded``).
    """
    names = table.schema.names
    bounds = "cu_seqlens_unpadded" if "cu_seqlens_unpadded" in names else "cu_seqlens"
    cu = table.column(bounds).combine_chunks()
    n_docs = pc.list_value_length(table.column("doc_ids")).to_numpy(zero_copy_only=False)
    n_docs = np.asarray(n_docs, dtype=np.int64)
    offsets = np.asarray(cu.offsets, dtype=np.int64)
    values = np.asarray(cu.values, dtype=np.int64)
    total = int(n_docs.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    first = np.concatenate([[0], np.cumsum(n_docs)[:-1]])
    index = np.repeat(offsets[:-1], n_docs) + (np.arange(total) - np.repeat(first, n_docs))
    return values[index + 1] - values[index]


def _unit(m: Manifest) -> UnitRecord:
    """The unit record of a unit's manifest (units.py's ``Unit.describe``)."""
    record = m.unit
    if record is None:  # _load_units refuses such a manifest
        raise FormatError(f"{m.path}: not a unit output (its manifest has no unit record)")
    return record


def _merge_options(
    manifests: list[Manifest],
    given: dict[str, Any],
) -> dict[str, Any]:
    """Options given to the merge win; else those recorded by the units at pack time."""
    out: dict[str, Any] = {}
    for key in MERGE_KEYS:
        if given.get(key) is not None:
            out[key] = given[key]
            continue
        recorded = {
            repr(_unit(m).merge_options.get(key))
            for m in manifests
            if _unit(m).merge_options.get(key) is not None
        }
        if len(recorded) > 1:
            flag = _MERGE_OPTIONS[key].flags[0]
            raise OptionError(
                f"the units were packed with different {key} values "
                f"({', '.join(sorted(recorded))}): choose one with {flag}"
            )
        values = [
            _unit(m).merge_options[key]
            for m in manifests
            if _unit(m).merge_options.get(key) is not None
        ]
        out[key] = values[0] if values else None
    return out


def _load_units(out: Path) -> list[tuple[Path, Manifest]]:
    if out.is_file():
        raise FormatError(
            f"{out} is a file: pass the directory `packtool pack --units N -o` wrote its units in"
        )
    found = unit_dirs(out)
    if not found:
        raise FormatError(
            f"{out}: no units to merge (expected {out / UNITS_DIR}/unit-00000-of-0000N/ "
            "from `packtool pack ... --units N`)"
        )
    if len(found) > 1:
        counts = ", ".join(str(c) for c in sorted(found))
        raise FormatError(
            f"{out / UNITS_DIR} holds units of different --units ({counts}): "
            "remove the stale ones, or pack again with --overwrite"
        )
    ((count, entries),) = found.items()
    by_index = dict(entries)
    missing = [
        i for i in range(count) if i not in by_index or not (by_index[i] / MANIFEST_FILE).exists()
    ]
    if missing:
        listed = ", ".join(str(i) for i in missing[:10]) + (" ..." if len(missing) > 10 else "")
        raise FormatError(
            f"{out}: {len(missing)} of {count} units are not finished (unit {listed}): run "
            f"`packtool pack ... --units {count} --unit I` for them, or `packtool pack ... "
            f"--units {count}`, which skips the finished ones"
        )
    units = [(by_index[i], read_manifest(by_index[i])) for i in range(count)]
    first = units[0][1]
    for path, m in units:
        record = m.unit
        if record is None or record.count != count:
            raise FormatError(f"{path}: not a unit output (its manifest has no unit record)")
        if m.documents is None or m.tokens is None or m.rows is None:
            raise FormatError(f"{path}: its manifest does not hold every count: pack it again")
        if record.plan != _unit(first).plan:
            raise FormatError(
                f"{path} was packed with other inputs or options than {units[0][0]}: "
                "pack the units again with the same command (--overwrite)"
            )
        if m.max_len != first.max_len:
            raise FormatError(f"{path}: max_len {m.max_len} differs from unit 0's {first.max_len}")
        if m.columns != first.columns:
            raise FormatError(f"{path}: columns {m.columns} differ from unit 0's {first.columns}")
        if m.tokenizer.sha256 != first.tokenizer.sha256:
            raise FormatError(f"{path}: packed with another tokenizer than unit 0")
        if (m.mixture is None) != (first.mixture is None):
            which = "a mixture (pack --mix)" if m.mixture is not None else "not a mixture"
            raise FormatError(
                f"{path} is {which}, unit 0 is not: a mixture's units merge only with units of "
                "the same mixture; pack the units again with one command (--overwrite)"
            )
    return units


def _global_inputs(units: list[tuple[Path, Manifest]], first_docs: list[int]) -> list:
    """One ``inputs`` entry per input file, its documents numbered over the whole corpus."""
    out: list[InputRecord] = []
    for (_, m), base in zip(units, first_docs, strict=True):
        for piece, read in zip(_unit(m).pieces, m.inputs, strict=True):
            documents = read.documents or 0
            if piece.continues and out and out[-1].path == piece.path:
                last = out[-1]  # the next range of the same file
                out[-1] = replace(last, documents=(last.documents or 0) + documents)
                continue
            out.append(
                InputRecord(
                    path=piece.path,
                    kind=piece.kind,
                    compression=piece.compression,
                    size_bytes=piece.file_size,
                    first_doc=base + (read.first_doc or 0),
                    documents=documents,
                )
            )
    return [r.to_record() for r in out]


def merge_units(
    out_dir: str | os.PathLike[str],
    *,
    shuffle: bool | None = None,
    seed: int | None = None,
    rows_per_shard: int | None = None,
    shard_size: str | int | None = None,
    world_size: int | None = None,
    micro_batches: int | None = None,
    copy: bool | None = None,
    progress: Callable[[str, int, int | None], None] | None = None,
) -> PackReport:
    """Join the finished units under ``OUT_DIR/units`` into one dataset in ``OUT_DIR``.

    ``shuffle``, ``seed``, ``rows_per_shard`` (or ``shard_size``), ``world_size``,
    ``micro_batches`` and ``copy`` default to what the units recorded at pack time (``pack``
    defaults: shuffle with seed 0, 256MB shards). ``copy=None`` lists the units' shards where
    they lie unless the rows must be written again (see the module docstring and
    ``units.copy_reason`` in the manifest); ``copy=True`` always writes them; ``copy=False``
    never does, and refuses options that would need it. The merge is skipped when ``OUT_DIR``
    already holds the merge of the same plan with the same options. Raises
    :class:`~packtool.errors.FormatError` when a unit is missing or was packed under another
    plan.
    """
    started = time.perf_counter()
    out = as_path(out_dir)
    given = {
        "shuffle": shuffle,
        "seed": seed,
        "rows_per_shard": rows_per_shard,
        "world_size": world_size,
        "micro_batches": micro_batches,
        "copy": copy,
    }
    if isinstance(out, StorePath):
        return _merge_on_store(out, given, shard_size, progress, started)
    for place in (out, out / _STAGE):  # what killed runs left, the merge skipped or not
        remove_stale_temporaries(place)
    return _merge(out, given, shard_size, progress, started, shards_at=out)


def _merge(
    out: Path,
    given: dict[str, Any],
    shard_size: str | int | None,
    progress: Callable[[str, int, int | None], None] | None,
    started: float,
    *,
    shards_at: AnyPath,
    fetch_shards: Callable[[], None] | None = None,
) -> PackReport:
    """The merge in ``out`` (a local directory holding the units' manifests). The units'
    shards lie under ``shards_at`` (``out``, or the store a scratch copy was made from);
    ``fetch_shards`` brings them into ``out`` where rows must be read (a copying merge, or
    units without a recorded length histogram)."""
    units = _load_units(out)
    manifests = [m for _, m in units]
    first = manifests[0]
    opts, layout = _resolve_options(manifests, given, shard_size)
    plan = _unit(first).plan
    previous = merged_manifest(out)
    if previous is not None and _still_current(shards_at, previous, manifests, plan, opts):
        return PackReport.from_manifest(out, previous, time.perf_counter() - started)
    reason = "--copy" if opts["copy"] else _copy_reason(manifests, layout)
    if opts["copy"] is False and reason is not None:
        raise OptionError(f"the merge cannot list the units' shards as they are: {reason}")
    first_docs = _first_docs(out, manifests)
    n_rows = sum(m.rows for m in manifests)
    lengths = _recorded_lengths(manifests)  # the units' histograms: no shard need be read
    src = None
    if reason is not None or lengths is None:  # rows to copy, or lengths to count
        if fetch_shards is not None:
            fetch_shards()
        src = _sources(out, units)
        if lengths is None:
            per_table = [segment_lengths(t) for t in src.tables]
            lengths = np.concatenate(per_table) if per_table else np.zeros(0, np.int64)
    global_rows = _global_rows(aligned_lengths(lengths, first.pad_to_multiple_of), first.max_len)
    merged = _Merged(first_docs, opts, n_rows, global_rows, plan, reason, lengths)
    if reason is None:
        manifest = _reference(out, units, first_docs, layout, _manifest(units, merged, started),
                              started, shards_at)  # fmt: skip
        if progress:
            progress("merge", n_rows, n_rows)
        return PackReport.from_manifest(out, manifest, time.perf_counter() - started)
    assert src is not None
    if progress:
        progress("merge", 0, src.n_rows)
    ffd = _ffd_rows(manifests)  # global FFD row k is stored row ffd[k]
    order, balance = stored_order(
        src.n_rows, lambda: _row_costs(src.tables, ffd), layout, where="the merge"
    )
    order = ffd[order]
    record = _manifest(units, merged, started, balance)
    manifest = _write(out, units, src, order, layout, record, started, progress)
    return PackReport.from_manifest(out, manifest, time.perf_counter() - started)


def _recorded_lengths(manifests: Sequence[Manifest]) -> np.ndarray | None:
    """Every unit's segment lengths from their manifests, or None if one records none."""
    recorded = [m.segment_lengths for m in manifests]
    if any(r is None for r in recorded):
        return None
    return np.concatenate(recorded) if recorded else np.zeros(0, np.int64)  # type: ignore[arg-type]


def _global_rows(lengths: np.ndarray, max_len: int) -> int:
    """Rows one first-fit-decreasing over every unit's segments would need."""
    return int(first_fit_decreasing(lengths, max_len).max()) + 1 if lengths.size else 0


def _first_docs(out: Path, manifests: Sequence[Manifest]) -> list[int]:
    """The corpus-wide number of each unit's first document; an empty corpus is the error."""
    if not any(m.segments for m in manifests):  # every unit is empty: so is the corpus
        counts = DocumentCounts.total(m.counts.documents for m in manifests)
        paths = list(dict.fromkeys(i.path for m in manifests for i in m.inputs))
        bad = [str(b) for m in manifests for b in m.bad_records]
        raise counts.nothing_to_pack(paths or [str(out)], bad_records=bad)
    docs_read = [m.counts.documents.read for m in manifests]
    return [int(x) for x in np.concatenate([[0], np.cumsum(docs_read)[:-1]])]


def _merge_on_store(
    out: StorePath,
    given: dict[str, Any],
    shard_size: str | int | None,
    progress: Callable[..., None] | None,
    started: float,
) -> PackReport:
    """Merge the units under a store's prefix in a local scratch directory that holds their
    manifests (and their shards only where rows must be read: a copying merge, or units
    without a length histogram); what the merge writes is published to ``out`` (shards first,
    manifest last). A merge without copying reads no shard and uploads only metadata."""
    check_writable(out)
    with tempfile.TemporaryDirectory(prefix="packtool-merge-") as scratch:
        local = Path(scratch) / "out"
        download_tree(out / UNITS_DIR, local / UNITS_DIR, skip_suffix=".arrow")  # metadata

        def fetch_shards() -> None:  # only where rows must be read
            download_tree(out / UNITS_DIR, local / UNITS_DIR, only_suffix=".arrow")

        if (out / MANIFEST_FILE).is_file():  # an earlier merge: kept if it is the same one
            (local / MANIFEST_FILE).write_bytes((out / MANIFEST_FILE).read_bytes())
        previous = (local / MANIFEST_FILE).read_bytes() if (local / MANIFEST_FILE).exists() else b""
        try:
            report = _merge(local, given, shard_size, progress, started, shards_at=out,
                            fetch_shards=fetch_shards)  # fmt: skip
        except PacktoolError as e:  # name the store's prefix, not the scratch copy
            e.args = tuple(
                a.replace(str(local), str(out)) if isinstance(a, str) else a for a in e.args
            )
            raise
        if (local / MANIFEST_FILE).read_bytes() != previous:
            publish(local, out)
    report.out_dir = out
    return report


def _copy_reason(manifests: list[Manifest], layout: Layout) -> str | None:
    """Why the merged rows must be written again, or None: the units' shards, in a seeded
    order, are then exactly the dataset asked for."""
    if layout.world_size is not None:
        return "--world-size stores balanced steps over all the units' rows"
    for i, m in enumerate(manifests):
        shuffled, per_shard = m.recorded_options.shuffle is True, m.recorded_options.rows_per_shard
        if per_shard != layout.rows_per_shard:
            return (
                f"unit {i} holds {per_shard} rows per shard, the merge asks for "
                f"{layout.rows_per_shard} (--rows-per-shard/--shard-size)"
            )
        stored = f"shuffled with seed {m.row_seed}" if shuffled else "not shuffled"
        if not layout.shuffle and shuffled:
            return f"unit {i}'s rows are stored {stored}; --no-shuffle asks for FFD order"
        if layout.shuffle and (not shuffled or m.row_seed != unit_row_seed(layout.seed, i)):
            return (
                f"unit {i}'s rows are stored {stored}; --seed {layout.seed} shuffles them "
                f"with seed {unit_row_seed(layout.seed, i)} (pack the units with that --seed)"
            )
    return None


def _ffd_rows(manifests: list[Manifest]) -> np.ndarray:
    """Where each unit's FFD rows are stored: entry ``k`` of the result is the stored row
    (over the units' shards laid end to end) of global FFD row ``k`` (unit 0's FFD rows,
    then unit 1's, ...). A unit stores FFD row ``perm[j]`` at row ``j``."""
    pieces, base = [], 0
    for m in manifests:
        n = m.rows
        if m.row_seed is not None:
            pieces.append(base + np.argsort(row_shuffle(n, m.row_seed)))
        else:
            pieces.append(base + np.arange(n, dtype=np.int64))
        base += n
    return np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, np.int64)


def _reference(
    out: Path,
    units: list[tuple[Path, Manifest]],
    first_docs: list[int],
    layout: Layout,
    record: Manifest,
    started: float,
    shards_at: AnyPath,
) -> Manifest:
    """Commit a manifest that lists the units' shards where they lie (no row is written);
    each is checked to be there (under ``shards_at``) with the size its unit records."""
    shards: list[ShardEntry] = []
    for (path, m), first_doc in zip(units, first_docs, strict=True):
        for entry in m.shards:
            if not entry.rows:
                continue  # an empty unit's empty shard
            file = f"{UNITS_DIR}/{path.name}/{entry.file}"
            try:
                size = (shards_at / file).stat().st_size
            except OSError as e:
                raise FormatError(
                    f"{shards_at / file}: cannot read the unit's shard "
                    f"({e.strerror or 'missing'}): pack that unit again "
                    "(`packtool pack ... --units N --unit I --overwrite`)"
                ) from e
            if size != entry.bytes:
                raise FormatError(
                    f"{shards_at / file}: {size} bytes, its unit's manifest records "
                    f"{entry.bytes}: the shard was altered; pack that unit again "
                    "(`packtool pack ... --units N --unit I --overwrite`)"
                )
            shards.append(replace(entry, file=file, doc_offset=first_doc))
    if layout.shuffle:
        shards = [shards[i] for i in shard_order(len(shards), layout.seed)]
    first = units[0][1]
    _clear_merged(out)
    for name, source in (_tokenizer_copy(units) or {}).items():
        shutil.copyfile(source, out / name)
    record = record.with_seconds(time.perf_counter() - started)
    return commit_in_place(
        out,
        max_len=first.max_len,
        with_labels=first.has_labels,
        shards=shards,
        manifest=record,
        added=first.has_seq_lengths,
        aligned=first.aligned,
        repack_files=_repack_files(units, first_docs),
        sources=first.has_sources,
    )


def _repack_files(units: list[tuple[Path, Manifest]], first_docs: list[int]) -> list[ShardEntry]:
    """The units' repack records (:mod:`packtool.format.chunks`), listed where they lie with
    the ``doc_offset`` that numbers their documents over the corpus, as their shards are."""
    return [
        replace(entry, file=f"{UNITS_DIR}/{path.name}/{entry.file}", doc_offset=first_doc)
        for (path, m), first_doc in zip(units, first_docs, strict=True)
        for entry in m.repack_files
    ]


def _tokenizer_copy(units: list[tuple[Path, Manifest]]) -> dict[str, Path] | None:
    """The first unit's copy of the tokenizer (and of its config), which the merged output
    copies (if any)."""
    first = units[0][1]
    if first.tokenizer.file is None:  # no tokenizer file (pre-tokenized data)
        return None
    tokenizer_file = units[0][0] / first.tokenizer.file
    if not tokenizer_file.exists():
        return None
    files = {"tokenizer.json": tokenizer_file}
    for name in (TOKENIZER_CONFIG_FILE, CHAT_TEMPLATE_FILE):
        if (tokenizer_file.parent / name).is_file():
            files[name] = tokenizer_file.parent / name
    return files


def _check_mixture_seed(manifests: list[Manifest], seed: int | None) -> None:
    """Refuse a ``--seed`` other than the one a mixture's units were sampled with: with
    ``--mix`` the seed chooses the documents, which a merge cannot choose again (the units
    hold only those taken), so the merged manifest would record a seed its sample is not of
    (and ``verify --against`` would find the plan of that seed not in the rows)."""
    first = manifests[0]
    if seed is None or first.mixture is None:
        return
    sampled = first.recorded_options.seed
    if sampled is not None and seed != sampled:
        raise OptionError(
            f"--seed {seed}: the units are a mixture (pack --mix) whose documents were sampled "
            f"with --seed {sampled}, and a merge cannot sample them again: merge with --seed "
            f"{sampled} (or without --seed), or pack the units again with --seed {seed} "
            "(--overwrite)"
        )


def _resolve_options(
    manifests: list[Manifest], given: dict[str, Any], shard_size: str | int | None
) -> tuple[dict[str, Any], Layout]:
    """The merge's options: those given, else what the units recorded, else pack's defaults;
    checked as ``pack`` checks them. Returns them as the manifest records them (with
    ``copy``) and as the :class:`~packtool.layout.Layout` the merged rows are stored in, its
    ``rows_per_shard`` decided."""
    size = row_bytes(manifests[0].max_len, manifests[0].has_labels)
    early = ("seed", "rows_per_shard")  # checked now, before any unit is read
    Layout(**{k: given[k] for k in early if given[k] is not None})
    _check_mixture_seed(manifests, given["seed"])
    if given["rows_per_shard"] is None and shard_size is not None:  # beats the units' record
        given = {**given, "rows_per_shard": Layout(shard_size=shard_size).shard_rows(size)}
    opts = _merge_options(manifests, given)
    for key, option in _MERGE_OPTIONS.items():  # copy: None, as needed
        if opts[key] is None:
            opts[key] = option.default
    layout = Layout(**{k: v for k, v in opts.items() if k in _LAYOUT_FIELDS})
    layout = replace(layout, rows_per_shard=layout.shard_rows(size))
    opts["rows_per_shard"] = layout.rows_per_shard
    if opts["copy"] is False and layout.world_size is not None:
        raise OptionError(NO_COPY_BALANCE)
    return opts, layout


@dataclass(frozen=True)
class _Sources:
    """Every shard of every unit, in order, and where each unit's documents start."""

    tables: list[pa.Table]
    starts: np.ndarray  # global row number of each table's first row (and the total last)
    first_docs: list[int]  # each unit's first document number
    doc_offset: np.ndarray  # per table: its unit's first document number

    @property
    def n_rows(self) -> int:
        return int(self.starts[-1])


def _sources(out: Path, units: list[tuple[Path, Manifest]]) -> _Sources:
    manifests = [m for _, m in units]
    tables: list[pa.Table] = []
    table_unit: list[int] = []
    for u, (path, _) in enumerate(units):
        reader = open_packed(path)
        for shard in range(len(reader.shard_paths)):
            tables.append(reader.shard_table(shard))
            table_unit.append(u)
    starts = np.concatenate([[0], np.cumsum([t.num_rows for t in tables])]).astype(np.int64)
    expected_rows = sum(m.rows for m in manifests)
    if int(starts[-1]) != expected_rows:  # pragma: no cover - read_manifest/shard_table check
        raise FormatError(
            f"{out}: units hold {int(starts[-1])} rows, their manifests say {expected_rows}"
        )
    first_docs = _first_docs(out, manifests)
    doc_offset = np.asarray(first_docs, dtype=np.int64)[np.asarray(table_unit, dtype=np.int64)]
    return _Sources(tables, starts, first_docs, doc_offset)


def _write(
    out: Path,
    units: list[tuple[Path, Manifest]],
    src: _Sources,
    order: np.ndarray,
    layout: Layout,
    record: dict[str, Any],
    started: float,
    progress: Callable[[str, int, int | None], None] | None,
) -> dict[str, Any]:
    """Write the rows in ``order`` to a staging directory, in shards of the ``layout``, then
    install it into ``out`` (the manifest ``record`` last, its ``seconds`` counted from
    ``started``)."""
    first = units[0][1]
    n_rows = src.n_rows
    size = row_bytes(first.max_len, first.has_labels)
    rows_per_shard = layout.shard_rows(size)
    stage = out / _STAGE
    writer = ShardWriter(
        stage,
        max_len=first.max_len,
        num_rows=n_rows,
        rows_per_shard=rows_per_shard,
        with_labels=first.has_labels,
        overwrite=True,
        added=first.has_seq_lengths,
        aligned=first.aligned,
        sources=first.has_sources,
    )
    writer.refer_repack_records(_repack_files(units, src.first_docs))
    block = max(1, min(rows_per_shard, (64 << 20) // size))
    manifest = write_dataset(
        writer,
        (
            _gather(src.tables, src.starts, src.doc_offset, order[start : start + block])
            for start in range(0, n_rows, block)
        ),
        lambda: record.with_seconds(time.perf_counter() - started),
        tokenizer=_tokenizer_copy(units),
        progress=(lambda done: progress("merge", done, n_rows)) if progress else None,
    )
    _install(stage, out)
    return manifest


def _row_costs(tables: list[pa.Table], ffd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's attention cost and tokens, in the global FFD order ``ffd`` (stored row
    ``ffd[k]`` is FFD row ``k``): what ``pack`` balances over, for the same rows."""
    per_row = [
        np.asarray(pc.list_value_length(t.column("doc_ids")).to_numpy(), dtype=np.int64)
        for t in tables
    ]
    lengths = [segment_lengths(t) for t in tables]
    costs = np.concatenate(
        [attention_costs(seg, n) for seg, n in zip(lengths, per_row, strict=True)]
        or [np.zeros(0, np.int64)]
    )
    tokens = np.concatenate(
        [np.asarray(t.column("num_tokens").to_numpy(), dtype=np.int64) for t in tables]
        or [np.zeros(0, np.int64)]
    )
    return costs[ffd], tokens[ffd]


def _gather(
    tables: list[pa.Table], starts: np.ndarray, doc_offset: np.ndarray, rows: np.ndarray
) -> pa.Table:
    """Rows ``rows`` (global numbers, in that order), with ``doc_ids`` made global."""
    table_of = np.searchsorted(starts, rows, side="right") - 1
    by_table = np.argsort(table_of, kind="stable")
    sorted_rows, sorted_tables = rows[by_table], table_of[by_table]
    ids, firsts = np.unique(sorted_tables, return_index=True)
    ends = [*firsts[1:], sorted_rows.size]
    pieces = [
        tables[int(t)].take(pa.array(sorted_rows[a:b] - starts[t]))
        for t, a, b in zip(ids, firsts, ends, strict=True)
    ]
    grouped = pa.concat_tables(pieces)
    inverse = np.empty_like(by_table)
    inverse[by_table] = np.arange(by_table.size)
    table = grouped.take(pa.array(inverse)).combine_chunks()
    docs = table.column("doc_ids").chunk(0) if table.num_rows else None
    if docs is None:
        return table
    n_docs = np.asarray(pc.list_value_length(docs), dtype=np.int64)
    values = np.asarray(docs.flatten(), dtype=np.int64) + np.repeat(doc_offset[table_of], n_docs)
    offsets = np.concatenate([[0], np.cumsum(n_docs)]).astype(np.int32)
    new_docs = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int64()))
    index = table.schema.get_field_index("doc_ids")
    return table.set_column(index, table.schema.field(index), new_docs)


@dataclass(frozen=True)
class _Merged:
    """What the merge decided: the units' first documents, options, rows, why it copies."""

    first_docs: list[int]
    opts: dict[str, Any]
    n_rows: int
    global_rows: int
    plan: str
    copy_reason: str | None
    segment_lengths: np.ndarray  # every segment's length, over all the units


def _manifest(
    units: list[tuple[Path, Manifest]],
    merged: _Merged,
    started: float,
    balance: dict[str, Any] | None = None,
) -> Manifest:
    first_docs, opts, plan = merged.first_docs, merged.opts, merged.plan
    n_rows, global_rows = merged.n_rows, merged.global_rows
    manifests = [m for _, m in units]
    first = manifests[0]
    options = {**first.options, **opts}
    if _unit(first).input_shape_auto is not None:  # the units were told the shape detected
        options["input_shape_auto"] = _unit(first).input_shape_auto
    per_unit = [
        {
            "index": _unit(m).index,
            "directory": f"{UNITS_DIR}/{path.name}",
            "first_doc": base,
            "documents": m.counts.documents.read,
            "segments": m.segments,
            "tokens": m.counts.tokens.packed,
            "rows": m.rows,
            "lower_bound_rows": m.lower_bound_rows,
            "efficiency": m.efficiency,
            "seconds": m.seconds,
            "row_seed": m.row_seed,
            "pieces": [p.record for p in _unit(m).pieces],
        }
        for (path, m), base in zip(units, first_docs, strict=True)
    ]
    counts = Counts.total(m.counts for m in manifests)
    bad: list[Any] = []
    for m in manifests:
        bad.extend(m.bad_records[: _BAD_RECORDS_KEPT - len(bad)])
    return Manifest.for_pack(
        tokenizer=first.tokenizer.record,
        options=options,
        inputs=_global_inputs(units, first_docs),
        figures=RunFigures(
            counts=counts,
            segments=sum(m.segments or 0 for m in manifests),
            rows=n_rows,
            lower_bound_rows=lower_bound_rows(counts.tokens.packed, first.max_len),
            max_len=first.max_len,
            bad_records=bad,
            special_strings=sum(m.special_strings.documents for m in manifests),
            parse_special=first.special_strings.parsed,
            seconds=time.perf_counter() - started,
            segment_lengths=merged.segment_lengths,
        ),
        labels=Manifest.summed_labels(manifests),
        global_ffd_rows=global_rows,
        units={
            "count": len(units),
            "plan": plan,
            "plan_version": _unit(first).plan_version,
            "units_sha256": units_fingerprint(manifests),
            "rows_over_global_ffd": n_rows - global_rows,
            "packing_loss": (n_rows - global_rows) / global_rows if global_rows else 0.0,
            "per_unit": per_unit,
            "copied": merged.copy_reason is not None,
            "copy_reason": merged.copy_reason,
        },
        balance=balance,
        extra=_joined_mixture(manifests, first_docs),
    )


def _joined_mixture(manifests: Sequence[Manifest], first_docs: list[int]) -> dict[str, Any] | None:
    """The merged ``mixture`` record (:func:`~packtool.mixture.join_mixture`), for units of a
    mixture; another mixture among them is one line."""
    records = [m.mixture.to_record() for m in manifests if m.mixture is not None]
    if not records:
        return None
    try:
        return {"mixture": join_mixture(records, first_docs)}
    except OptionError as e:
        raise FormatError(f"{manifests[0].path}: {e}") from None


def units_fingerprint(manifests: Sequence[Manifest]) -> str:
    """What names the units' rows as they are now: each unit's shards (file, rows, sha256) in
    order. A unit packed again (another seed, other bytes) changes it."""
    digest = hashlib.sha256()
    for m in manifests:
        for entry in m.shards:
            digest.update(f"{entry.file}:{entry.rows}:{entry.sha256}\n".encode())
        digest.update(b"--\n")
    return digest.hexdigest()


def _still_current(
    out: Path, merged: Manifest, manifests: Sequence[Manifest], plan: str, opts: dict[str, Any]
) -> bool:
    """Whether ``merged`` is the merge of these units as they are now, with these options,
    and every shard it lists is still there at its size (the merge can then be skipped)."""
    units = merged.units
    if units is None or units.plan != plan or units.units_sha256 != units_fingerprint(manifests):
        return False
    if any(merged.options.get(k) != opts[k] for k in MERGE_KEYS):
        return False
    for entry in merged.shards:
        try:
            if (out / entry.file).stat().st_size != entry.bytes:
                return False
        except OSError:
            return False
    return True


def up_to_date_merge(out: Path, plan: str, options: dict[str, Any]) -> Manifest | None:
    """The merge in ``out`` if it is that of the finished units there, as they are now, under
    ``plan`` with these merge options; else None (the merge must run)."""
    merged = merged_manifest(out)
    if merged is None:
        return None
    try:
        manifests = [m for _, m in _load_units(out)]
    except FormatError:
        return None
    if any(merged.options.get(k) != v for k, v in options.items()):
        return None
    recorded = {k: merged.options.get(k) for k in MERGE_KEYS}
    return merged if _still_current(out, merged, manifests, plan, recorded) else None


def merged_manifest(out: Path) -> Manifest | None:
    """The manifest of the merge in ``out``, or None (no merge yet, or not readable)."""
    if not (out / MANIFEST_FILE).exists():
        return None
    try:
        manifest = read_manifest(out)
    except FormatError:
        return None
    return manifest if manifest.units is not None else None


def _install(stage: Path, out: Path) -> None:
    """Move the dataset built in ``stage`` into ``out`` (which keeps ``units/``), manifest last.

    The old manifest goes first, so that ``out`` never looks complete while its shards are
    being replaced; an interrupted install is finished by merging again.
    """
    _clear_merged(out)
    for new in sorted(stage.iterdir()):
        if new.name != MANIFEST_FILE:
            os.replace(new, out / new.name)
    os.replace(stage / MANIFEST_FILE, out / MANIFEST_FILE)
    stage.rmdir()


def _clear_merged(out: Path) -> None:
    """Remove the previous merge from ``out`` (``units/`` stays): its manifest first, so that
    ``out`` never looks complete while its files change."""
    (out / MANIFEST_FILE).unlink(missing_ok=True)
    for old in out.iterdir():
        if old.is_file() and (
            (old.name.startswith("data-") and old.suffix == ".arrow") or old.name in _DATASET_FILES
        ):
            old.unlink()
