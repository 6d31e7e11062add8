"""Run the work units of a corpus on an engine, then merge them: ``pack --units N``.

The units decide what is packed together (:func:`packtool.units.plan_units`); an engine only
decides where each unit runs:

- ``local`` (default): a pool of processes on this machine (:mod:`packtool.engines.local`);
- ``ray``: Ray tasks on a Ray cluster, or on a local Ray instance started for the run
  (:mod:`packtool.engines.ray`, the ``packtool[ray]`` extra).

With ``unit=I`` only unit ``I`` runs, here, and nothing is merged: that is the entry point of
a Slurm array task or a Kubernetes indexed job; ``packtool merge OUT_DIR`` joins the units
afterwards. Whatever ran the units, the merged rows are the same.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import NothingToPackError, OptionError, OutputExistsError, PacktoolError
from ..limits import MAX_NUM_PROC, MAX_SEED, MAX_UNITS, check_int
from ..merge import merge_units
from ..pipeline import DEFAULT_SHARD_BYTES, PackReport, _parse_size
from ..sources import resolve_inputs
from ..tokenize import Tokenizer
from ..units import (
    UNITS_DIR,
    Unit,
    UnitOptions,
    UnitResult,
    finished_unit,
    plan_units,
    result_from_manifest,
    run_unit,
    unit_dirs,
    with_tokenizer_spec,
)

__all__ = ["ENGINES", "UnitFailedError", "UnitsReport", "pack_units"]

ENGINES = ("local", "ray")


class UnitFailedError(PacktoolError):
    """A unit failed in another process; the message is the unit's own error."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class UnitsReport:
    """What ``pack_units`` did: the units it ran or skipped, and the merged dataset.

    ``merged`` is ``None`` when a single unit was run (``unit=I``).
    """

    out_dir: Path
    engine: str
    units: list[UnitResult]
    merged: PackReport | None = None
    driver_pid: int = field(default_factory=os.getpid)
    driver_host: str = field(default_factory=socket.gethostname)
    skipped_files: list[str] = field(default_factory=list)  # directory members not read

    @property
    def packed(self) -> int:
        return sum(1 for u in self.units if not u.skipped)

    @property
    def skipped(self) -> int:
        return sum(1 for u in self.units if u.skipped)


def call_unit(
    unit: Unit,
    out_dir: str,
    options: UnitOptions,
    merge_options: dict[str, Any],
    overwrite: bool,
    threads: int | None,
) -> tuple[str, Any]:
    """Run one unit in a worker; errors come back as data (some exceptions do not pickle).

    Returns ``("ok", UnitResult)`` or ``("error", (message, exit_code))``.
    """
    try:
        return "ok", run_unit(
            unit,
            out_dir,
            options,
            merge_options=merge_options,
            overwrite=overwrite,
            num_proc=threads,
        )
    except PacktoolError as e:
        return "error", (str(e), e.exit_code)
    except OSError as e:
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        return "error", (f"{where}{e.strerror or e}", 1)


def unwrap(outcome: tuple[str, Any]) -> UnitResult:
    """The result of :func:`call_unit`, or its error raised as :class:`UnitFailedError`."""
    status, value = outcome
    if status != "ok":
        message, code = value
        raise UnitFailedError(message, code)
    return value  # type: ignore[no-any-return]


def _prepare(out: Path, count: int, single: bool, overwrite: bool) -> None:
    """Check ``out`` before any work: a fresh directory, or the units of the same count.

    ``overwrite`` with all units removes ``out``; with one unit (``single``), only that unit
    is replaced later.
    """
    if not out.exists():
        return
    if not out.is_dir():
        raise OutputExistsError(f"output path {out} exists and is not a directory")
    if overwrite and not single:  # start over: units, merged output, all
        shutil.rmtree(out)
        return
    found = unit_dirs(out)
    holds_units = (out / UNITS_DIR).is_dir()
    foreign = not holds_units and any(
        not p.name.startswith(".") for p in out.iterdir()
    )  # e.g. the output of a plain `pack`
    other = sorted(c for c in found if c != count)
    if not foreign and not other:
        return
    what = (
        f"units of --units {', '.join(map(str, other))}"
        if other
        else "files that are not packtool units"
    )
    hint = (
        "remove them, or pack all units with --overwrite to start over"
        if single
        else "pass --overwrite to start over"
    )
    raise OutputExistsError(f"output directory {out} holds {what}: {hint}")


def pack_units(
    inputs: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    *,
    units: int,
    unit: int | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    max_len: int,
    tokenizer: str | os.PathLike[str] | Tokenizer | None = None,
    text_field: str = "text",
    overflow: str = "split",
    add_eos: bool = True,
    bos: bool | None = None,
    eos_token: str | None = None,
    bos_token: str | None = None,
    pad_id: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    rows_per_shard: int | None = None,
    shard_size: str | int = DEFAULT_SHARD_BYTES,
    overwrite: bool = False,
    skip_bad_records: bool = False,
    split: str | None = None,
    txt_unit: str = "line",
    num_proc: int | None = None,
    progress: Callable[[str, int, int | None], None] | None = None,
) -> UnitsReport:
    """Pack ``inputs`` as ``units`` work units on ``engine``, then merge them into ``out_dir``.

    Each unit is FFD-packed on its own (:mod:`packtool.units`), so the rows differ from a
    single ``pack`` only in which documents share a row; the manifest's ``global_ffd_rows``
    says what one global packing would need. Finished units are skipped on a rerun.

    ``unit=I`` runs only unit ``I`` here and does not merge (a Slurm or Kubernetes array
    task). ``num_proc``: with the local engine, the cores to use in all (default: all),
    shared among units running at once; with Ray, the CPUs each unit task reserves and its
    tokenizer threads (default 1). ``ray_address`` joins a running Ray cluster; without it
    a local Ray instance is started for the run and stopped after it.
    """
    started = time.perf_counter()
    check_int("--units", units, 1, MAX_UNITS)
    check_int("--seed", seed, 0, MAX_SEED)
    if unit is not None and not 0 <= unit < units:
        raise OptionError(
            f"--unit must be in 0..{units - 1} (0-based, for --units {units}), got {unit}"
        )
    if engine not in ENGINES:
        raise OptionError(f"--engine must be one of {', '.join(ENGINES)}; got {engine!r}")
    if ray_address is not None and engine != "ray":
        raise OptionError("--ray-address needs --engine ray")
    if unit is not None and engine != "local":
        raise OptionError(
            "--unit runs one unit in this process: leave out --engine (the launcher is the engine)"
        )
    if rows_per_shard is not None and rows_per_shard < 1:
        raise OptionError(f"--rows-per-shard must be >= 1, got {rows_per_shard}")
    if num_proc is not None:
        check_int("--num-proc", num_proc, 1, MAX_NUM_PROC)
    options = with_tokenizer_spec(
        UnitOptions(
            max_len=max_len,
            text_field=text_field,
            overflow=str(getattr(overflow, "value", overflow)),
            add_eos=add_eos,
            bos=bos,
            eos_token=eos_token,
            bos_token=bos_token,
            pad_id=pad_id,
            skip_bad_records=skip_bad_records,
            split=split,
            txt_unit=txt_unit,
        ),
        tokenizer,
    )
    options.check()
    if rows_per_shard is None:
        rows_per_shard = max(1, _parse_size(shard_size) // (2 * 4 * max_len + 64))
    merge_options = {"shuffle": shuffle, "seed": seed, "rows_per_shard": rows_per_shard}
    out = Path(out_dir)
    # Absolute paths: every launcher (and every node) then plans and reads the same files.
    skipped: list[Path] = []
    resolved = resolve_inputs(inputs, skipped=skipped)
    files = [replace(f, path=Path(os.path.abspath(f.path))) for f in resolved]
    plan = plan_units(files, units, options)  # loads the tokenizer: a bad one fails here
    created = not out.exists()
    _prepare(out, units, unit is not None, overwrite)

    if unit is not None:
        result = run_unit(
            plan[unit],
            out,
            options,
            merge_options=merge_options,
            overwrite=overwrite,
            num_proc=num_proc,
            progress=progress,
        )
        return UnitsReport(out, "unit", [result], skipped_files=[str(p) for p in skipped])

    merged_before = _merged(out, plan[0].plan, merge_options)
    if merged_before is not None:
        return UnitsReport(out, engine, [], merged_before, skipped_files=[str(p) for p in skipped])
    results: dict[int, UnitResult] = {}
    pending: list[Unit] = []
    for u in plan:
        done = finished_unit(u, out)
        if done is None:
            pending.append(u)
        else:
            results[u.index] = result_from_manifest(u, done, skipped=True, seconds=0.0)
    if progress:
        progress("units", len(results), units)
    if pending:
        if engine == "ray":
            from .ray import run_ray

            ran = run_ray(
                pending,
                out,
                options,
                merge_options=merge_options,
                num_proc=num_proc,
                address=ray_address,
                progress=progress,
                already=len(results),
            )
        else:
            from .local import run_local

            ran = run_local(
                pending,
                out,
                options,
                merge_options=merge_options,
                num_proc=num_proc,
                progress=progress,
                already=len(results),
            )
        results.update({r.index: r for r in ran})
    try:
        merged = merge_units(
            out, shuffle=shuffle, seed=seed, rows_per_shard=rows_per_shard, progress=progress
        )
    except NothingToPackError:  # every unit is empty: no output, as without --units
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    merged.seconds = time.perf_counter() - started  # the whole run (the manifest: the merge)
    ran = [results[i] for i in range(units)]
    return UnitsReport(out, engine, ran, merged, skipped_files=[str(p) for p in skipped])


def _merged(out: Path, plan: str, merge_options: dict[str, Any]) -> PackReport | None:
    """The merged dataset in ``out`` if it is the merge of ``plan`` with these options."""
    from ..merge import _merged_manifest, _report

    manifest = _merged_manifest(out)
    if manifest is None or manifest["units"].get("plan") != plan:
        return None
    if any(manifest["options"].get(k) != v for k, v in merge_options.items()):
        return None
    return _report(out, manifest, 0.0)
