"""``packtool merge``: join the outputs of work units into one packed dataset.

The units of ``OUT_DIR/units/unit-I-of-N/`` (see :mod:`packtool.units`) are read in unit
order, their rows laid end to end (unit 0's rows in FFD order, then unit 1's, ...), shuffled
with ``seed`` as ``pack`` shuffles its rows, and written to ``OUT_DIR`` itself as one dataset
with one manifest (the units stay in ``OUT_DIR/units`` for reruns)::

    unit 0 rows  r0 r1 r2        documents 0..999 of the corpus      doc_ids + 0
    unit 1 rows  r3 r4           documents 1000..1799 (local 0..799)  doc_ids + 1000
                 \\ permutation(5, seed) /
    OUT_DIR      r4 r0 r3 r2 r1

So with ``--units 1`` the merged rows are exactly those of a plain ``pack``; with more
units they differ only in which documents share a row. The merge measures that difference:
it runs one first-fit-decreasing over all segment lengths of all units and records the rows
it needs as ``global_ffd_rows`` in the manifest (the rows a single ``pack`` would write),
beside ``rows`` and the per-unit figures under ``units``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ._version import __version__
from .errors import FormatError, OptionError
from .format import (
    MANIFEST_FILE,
    DocumentCounts,
    ShardWriter,
    open_packed,
    publish,
    read_manifest,
)
from .fs import StorePath, as_path, check_writable, download_tree
from .limits import MAX_ROWS_PER_SHARD, MAX_SEED, check_int
from .options import DEFAULT_SHARD_SIZE, PackOptions, parse_size
from .order import attention_costs, balance_record, balanced_order, check_world_size
from .packing import first_fit_decreasing, lower_bound_rows
from .pipeline import PackReport
from .units import UNITS_DIR, unit_dirs

__all__ = ["MERGE_KEYS", "merge_units", "segment_lengths"]

MERGE_KEYS = ("shuffle", "seed", "rows_per_shard", "world_size", "micro_batches")
"""Options that apply at the merge (they do not change which documents share a row)."""

_BAD_RECORDS_KEPT = 20
_STAGE = ".merge"  # the merged dataset is built in OUT_DIR/.merge, then moved up
_DATASET_FILES = ("dataset_info.json", "state.json", "tokenizer.json")


def segment_lengths(table: pa.Table) -> np.ndarray:
    """The length of every document segment of ``table``'s rows, row by row (int64).

    Row ``cu_seqlens [0, 9, 16, 21, 24]`` with 3 ``doc_ids`` gives ``[9, 7, 5]`` (the padding
    segment is not a document).
    """
    cu = table.column("cu_seqlens").combine_chunks()
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


def _merge_options(
    manifests: list[dict[str, Any]],
    given: dict[str, Any],
) -> dict[str, Any]:
    """Options given to the merge win; else those recorded by the units at pack time."""
    out: dict[str, Any] = {}
    for key in MERGE_KEYS:
        if given.get(key) is not None:
            out[key] = given[key]
            continue
        recorded = {
            repr(m["unit"].get("merge_options", {}).get(key))
            for m in manifests
            if m["unit"].get("merge_options", {}).get(key) is not None
        }
        if len(recorded) > 1:
            flag = "--" + key.replace("_", "-")
            flag = "--shuffle/--no-shuffle" if key == "shuffle" else flag
            raise OptionError(
                f"the units were packed with different {key} values "
                f"({', '.join(sorted(recorded))}): choose one with {flag}"
            )
        values = [
            m["unit"]["merge_options"][key]
            for m in manifests
            if m["unit"].get("merge_options", {}).get(key) is not None
        ]
        out[key] = values[0] if values else None
    return out


def _load_units(out: Path) -> list[tuple[Path, dict[str, Any]]]:
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
        record = m.get("unit")
        if not isinstance(record, dict) or record.get("count") != count:
            raise FormatError(f"{path}: not a unit output (its manifest has no unit record)")
        if record.get("plan") != first["unit"].get("plan"):
            raise FormatError(
                f"{path} was packed with other inputs or options than {units[0][0]}: "
                "pack the units again with the same command (--overwrite)"
            )
        for key in ("max_len", "columns"):
            if m[key] != first[key]:
                raise FormatError(f"{path}: {key} {m[key]} differs from unit 0's {first[key]}")
        if m["tokenizer"].get("sha256") != first["tokenizer"].get("sha256"):
            raise FormatError(f"{path}: packed with another tokenizer than unit 0")
    return units


def _global_inputs(units: list[tuple[Path, dict[str, Any]]], first_docs: list[int]) -> list:
    """One ``inputs`` entry per input file, its documents numbered over the whole corpus."""
    out: list[dict[str, Any]] = []
    for (_, m), base in zip(units, first_docs, strict=True):
        pieces = m["unit"]["pieces"]
        for piece, read in zip(pieces, m["inputs"], strict=True):
            continues = piece["split_by"] != "file" and piece["start"] != 0
            if continues and out and out[-1]["path"] == piece["path"]:
                out[-1]["documents"] += read["documents"]  # the next range of the same file
                continue
            out.append(
                {
                    "path": piece["path"],
                    "kind": piece["kind"],
                    "compression": piece["compression"],
                    "size_bytes": piece["file_size"],
                    "first_doc": base + read["first_doc"],
                    "documents": read["documents"],
                }
            )
    return out


def report_from_manifest(out: Path, manifest: dict[str, Any], seconds: float) -> PackReport:
    return PackReport(
        out_dir=out,
        max_len=int(manifest["max_len"]),
        documents=DocumentCounts(**manifest["documents"]),
        segments=int(manifest["segments"]),
        tokens=int(manifest["tokens"]["packed"]),
        tokens_truncated=int(manifest["tokens"]["truncated_away"]),
        tokens_dropped=int(manifest["tokens"]["dropped"]),
        rows=int(manifest["rows"]),
        lower_bound_rows=int(manifest["lower_bound_rows"]),
        shards=len(manifest["shards"]),
        seconds=seconds,
        bad_records=list(manifest.get("bad_records", [])),
        manifest=manifest,
        special_strings=int(manifest.get("special_strings", {}).get("documents", 0)),
        parse_special=bool(manifest.get("special_strings", {}).get("parsed", False)),
        notices=[n for n in (manifest.get("tokenizer", {}).get("turned_off"),) if n],
    )


def merge_units(
    out_dir: str | os.PathLike[str],
    *,
    shuffle: bool | None = None,
    seed: int | None = None,
    rows_per_shard: int | None = None,
    shard_size: str | int | None = None,
    world_size: int | None = None,
    micro_batches: int | None = None,
    progress: Callable[[str, int, int | None], None] | None = None,
) -> PackReport:
    """Join the finished units under ``OUT_DIR/units`` into one dataset in ``OUT_DIR``.

    ``shuffle``, ``seed`` and ``rows_per_shard`` (or ``shard_size``) default to what the
    units recorded at pack time (``pack`` defaults: shuffle with seed 0, 256MB shards).
    The merge is skipped when ``OUT_DIR`` already holds the merge of the same plan with the
    same options. Raises :class:`~packtool.errors.FormatError` when a unit is missing or
    was packed under another plan.
    """
    started = time.perf_counter()
    out = as_path(out_dir)
    if isinstance(out, StorePath):
        return _merge_on_store(
            out,
            dict(
                shuffle=shuffle,
                seed=seed,
                rows_per_shard=rows_per_shard,
                shard_size=shard_size,
                world_size=world_size,
                micro_batches=micro_batches,
            ),
            progress,
        )
    units = _load_units(out)
    manifests = [m for _, m in units]
    first = manifests[0]
    max_len = int(first["max_len"])
    given = {
        "shuffle": shuffle,
        "seed": seed,
        "rows_per_shard": rows_per_shard,
        "world_size": world_size,
        "micro_batches": micro_batches,
    }
    opts, layout = _resolve_options(manifests, given, shard_size)
    plan = first["unit"]["plan"]
    previous = merged_manifest(out)
    if (
        previous is not None
        and previous.get("units", {}).get("plan") == plan
        and all(previous["options"].get(k) == opts[k] for k in MERGE_KEYS)
    ):
        return report_from_manifest(out, previous, time.perf_counter() - started)

    src = _sources(out, units)
    if progress:
        progress("merge", 0, src.n_rows)
    lengths = [segment_lengths(t) for t in src.tables]
    all_lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    global_rows = (
        int(first_fit_decreasing(all_lengths, max_len).max()) + 1 if all_lengths.size else 0
    )
    balance = None
    if layout.world_size is not None:
        order, balance = _balanced_order(src.tables, lengths, layout)
    elif layout.shuffle:
        order = np.random.default_rng(layout.seed).permutation(src.n_rows)
    else:
        order = np.arange(src.n_rows)
    record = _manifest(units, src.first_docs, opts, src.n_rows, global_rows, started, plan)
    if balance is not None:
        record["balance"] = balance
    rows_per_shard = int(opts["rows_per_shard"])
    manifest = _write(out, units, src, order, rows_per_shard, record, started, progress)
    return report_from_manifest(out, manifest, time.perf_counter() - started)


def _merge_on_store(
    out: StorePath, options: dict[str, Any], progress: Callable[..., None] | None
) -> PackReport:
    """Merge the units under a store's prefix: they are copied to a local scratch directory,
    merged there, and the merged shards published to ``out`` (shards first, manifest last);
    the units stay where they are."""
    check_writable(out)
    with tempfile.TemporaryDirectory(prefix="packtool-merge-") as scratch:
        local = Path(scratch) / "out"
        download_tree(out / UNITS_DIR, local / UNITS_DIR)
        if (out / MANIFEST_FILE).is_file():  # an earlier merge: kept if it is the same one
            (local / MANIFEST_FILE).write_bytes((out / MANIFEST_FILE).read_bytes())
        previous = (local / MANIFEST_FILE).read_bytes() if (local / MANIFEST_FILE).exists() else b""
        report = merge_units(local, **options, progress=progress)
        if (local / MANIFEST_FILE).read_bytes() != previous:
            publish(local, out)
    report.out_dir = out
    return report


def _resolve_options(
    manifests: list[dict[str, Any]], given: dict[str, Any], shard_size: str | int | None
) -> tuple[dict[str, Any], PackOptions]:
    """The merge's options: those given, else what the units recorded, else pack's defaults;
    checked as ``pack`` checks them."""
    row_bytes = 2 * 4 * int(manifests[0]["max_len"]) + 64
    if given["rows_per_shard"] is not None:
        check_int("--rows-per-shard", given["rows_per_shard"], 1, MAX_ROWS_PER_SHARD)
    if given["seed"] is not None:
        check_int("--seed", given["seed"], 0, MAX_SEED)
    if given["rows_per_shard"] is None and shard_size is not None:
        given = {**given, "rows_per_shard": max(1, parse_size(shard_size) // row_bytes)}
    opts = _merge_options(manifests, given)
    defaults = {"shuffle": True, "seed": 0, "micro_batches": 1}
    for key, value in defaults.items():
        if opts[key] is None:
            opts[key] = value
    layout = PackOptions(  # checks them as pack does
        shuffle=opts["shuffle"],
        seed=opts["seed"],
        world_size=opts["world_size"],
        micro_batches=opts["micro_batches"],
    )
    if opts["rows_per_shard"] is None:
        opts["rows_per_shard"] = max(1, parse_size(DEFAULT_SHARD_SIZE) // row_bytes)
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


def _sources(out: Path, units: list[tuple[Path, dict[str, Any]]]) -> _Sources:
    manifests = [m for _, m in units]
    tables: list[pa.Table] = []
    table_unit: list[int] = []
    for u, (path, _) in enumerate(units):
        reader = open_packed(path)
        for shard in range(len(reader.shard_paths)):
            tables.append(reader.shard_table(shard))
            table_unit.append(u)
    starts = np.concatenate([[0], np.cumsum([t.num_rows for t in tables])]).astype(np.int64)
    expected_rows = sum(int(m["rows"]) for m in manifests)
    if int(starts[-1]) != expected_rows:  # pragma: no cover - read_manifest/shard_table check
        raise FormatError(
            f"{out}: units hold {int(starts[-1])} rows, their manifests say {expected_rows}"
        )
    if not any(int(m["segments"]) for m in manifests):  # every unit is empty: so is the corpus
        counts = DocumentCounts()
        for m in manifests:
            for key, value in m["documents"].items():
                setattr(counts, key, getattr(counts, key) + int(value))
        paths = list(dict.fromkeys(str(p["path"]) for m in manifests for p in m["inputs"]))
        raise counts.nothing_to_pack(paths or [str(out)])
    docs_read = [int(m["documents"]["read"]) for m in manifests]
    first_docs = [int(x) for x in np.concatenate([[0], np.cumsum(docs_read)[:-1]])]
    doc_offset = np.asarray(first_docs, dtype=np.int64)[np.asarray(table_unit, dtype=np.int64)]
    return _Sources(tables, starts, first_docs, doc_offset)


def _write(
    out: Path,
    units: list[tuple[Path, dict[str, Any]]],
    src: _Sources,
    order: np.ndarray,
    rows_per_shard: int,
    record: dict[str, Any],
    started: float,
    progress: Callable[[str, int, int | None], None] | None,
) -> dict[str, Any]:
    """Write the rows in ``order`` to a staging directory, then install it into ``out``
    (the manifest ``record`` last, its ``seconds`` counted from ``started``)."""
    first = units[0][1]
    max_len = int(first["max_len"])
    n_rows = src.n_rows
    stage = out / _STAGE
    with ShardWriter(
        stage,
        max_len=max_len,
        num_rows=n_rows,
        rows_per_shard=rows_per_shard,
        with_labels="labels" in first["columns"],
        overwrite=True,
    ) as writer:
        block = max(1, min(rows_per_shard, (64 << 20) // (2 * 4 * max_len + 64)))
        for start in range(0, n_rows, block):
            rows = order[start : start + block]
            writer.write(_gather(src.tables, src.starts, src.doc_offset, rows))
            if progress:
                progress("merge", min(start + block, n_rows), n_rows)
        tokenizer_file = units[0][0] / first["tokenizer"].get("file", "tokenizer.json")
        if "file" in first["tokenizer"] and tokenizer_file.exists():
            shutil.copyfile(tokenizer_file, writer.staging / "tokenizer.json")
        record = {**record, "seconds": round(time.perf_counter() - started, 3)}
        manifest = writer.commit(record)
    _install(stage, out)
    return manifest


def _balanced_order(
    tables: list[pa.Table], lengths: list[np.ndarray], layout: PackOptions
) -> tuple[np.ndarray, dict[str, Any]]:
    """The balanced order (``--world-size``) of the units' rows laid end to end, and its
    manifest record: the same function ``pack`` uses, over the same per-row costs."""
    per_row = [
        np.asarray(pc.list_value_length(t.column("doc_ids")).to_numpy(), dtype=np.int64)
        for t in tables
    ]
    costs = np.concatenate(
        [attention_costs(seg, n) for seg, n in zip(lengths, per_row, strict=True)]
        or [np.zeros(0, np.int64)]
    )
    tokens = np.concatenate(
        [np.asarray(t.column("num_tokens").to_numpy(), dtype=np.int64) for t in tables]
        or [np.zeros(0, np.int64)]
    )
    assert layout.world_size is not None
    check_world_size(int(costs.size), layout.world_size, "the merge")
    kw = {"world_size": layout.world_size, "micro_batches": layout.micro_batches}
    order = balanced_order(costs, tokens, seed=layout.seed, **kw)
    return order, balance_record(costs[order], tokens[order], seed=layout.seed, **kw)


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


def _manifest(
    units: list[tuple[Path, dict[str, Any]]],
    first_docs: list[int],
    opts: dict[str, Any],
    n_rows: int,
    global_rows: int,
    started: float,
    plan: str,
) -> dict[str, Any]:
    manifests = [m for _, m in units]
    first = manifests[0]
    max_len = int(first["max_len"])
    documents = {
        key: sum(int(m["documents"][key]) for m in manifests) for key in first["documents"]
    }
    tokens = {key: sum(int(m["tokens"][key]) for m in manifests) for key in first["tokens"]}
    bad: list[str] = []
    for m in manifests:
        bad.extend(m.get("bad_records", [])[: _BAD_RECORDS_KEPT - len(bad)])
    lower = lower_bound_rows(tokens["packed"], max_len)
    options = {**first["options"], **opts}
    per_unit = [
        {
            "index": m["unit"]["index"],
            "directory": f"{UNITS_DIR}/{path.name}",
            "first_doc": base,
            "documents": int(m["documents"]["read"]),
            "segments": int(m["segments"]),
            "tokens": int(m["tokens"]["packed"]),
            "rows": int(m["rows"]),
            "lower_bound_rows": int(m["lower_bound_rows"]),
            "efficiency": m["efficiency"],
            "seconds": m.get("seconds"),
            "pieces": m["unit"]["pieces"],
        }
        for (path, m), base in zip(units, first_docs, strict=True)
    ]
    return {
        "packtool_version": __version__,
        "created_unix": int(time.time()),
        "tokenizer": first["tokenizer"],
        "options": options,
        "inputs": _global_inputs(units, first_docs),
        "documents": documents,
        "segments": sum(int(m["segments"]) for m in manifests),
        "tokens": tokens,
        "rows": n_rows,
        "lower_bound_rows": lower,
        "rows_over_lower_bound": n_rows - lower,
        "efficiency": tokens["packed"] / (n_rows * max_len) if n_rows else 0.0,
        "global_ffd_rows": global_rows,
        "bad_records": bad,
        "special_strings": {
            "documents": sum(
                int(m.get("special_strings", {}).get("documents", 0)) for m in manifests
            ),
            "parsed": bool(first.get("special_strings", {}).get("parsed", False)),
        },
        "seconds": round(time.perf_counter() - started, 3),
        "units": {
            "count": len(units),
            "plan": plan,
            "plan_version": first["unit"].get("plan_version"),
            "rows_over_global_ffd": n_rows - global_rows,
            "packing_loss": (n_rows - global_rows) / global_rows if global_rows else 0.0,
            "per_unit": per_unit,
        },
    }


def merged_manifest(out: Path) -> dict[str, Any] | None:
    if not (out / MANIFEST_FILE).exists():
        return None
    try:
        manifest = read_manifest(out)
    except FormatError:
        return None
    return manifest if "units" in manifest else None


def _install(stage: Path, out: Path) -> None:
    """Move the dataset built in ``stage`` into ``out`` (which keeps ``units/``), manifest last.

    The old manifest goes first, so that ``out`` never looks complete while its shards are
    being replaced; an interrupted install is finished by merging again.
    """
    (out / MANIFEST_FILE).unlink(missing_ok=True)
    for old in out.iterdir():
        if old.is_file() and (
            (old.name.startswith("data-") and old.suffix == ".arrow") or old.name in _DATASET_FILES
        ):
            old.unlink()
    for new in sorted(stage.iterdir()):
        if new.name != MANIFEST_FILE:
            os.replace(new, out / new.name)
    os.replace(stage / MANIFEST_FILE, out / MANIFEST_FILE)
    stage.rmdir()
