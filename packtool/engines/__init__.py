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

import hashlib
import os
import shutil
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import NothingToPackError, OptionError, OutputExistsError, PacktoolError
from ..format import MANIFEST_FILE, row_bytes
from ..fs import AnyPath, StorePath, as_path, check_writable, remove_tree
from ..instruct import has_labels
from ..merge import merge_units
from ..mixture import Source, UnitMixture, plan_unit_mixtures, resolve_sources
from ..options import ENGINES, PackOptions
from ..pipeline import PackReport
from ..readers import refuse_inputs_in, resolve_inputs
from ..units import (
    UNITS_DIR,
    Unit,
    UnitResult,
    corpus_options,
    finished_unit,
    measure_unit,
    plan_units,
    result_from_manifest,
    run_unit,
    unit_dirs,
    unit_mixtures,
)

__all__ = ["ENGINES", "UnitFailedError", "UnitsReport", "pack_units"]


class UnitFailedError(PacktoolError):
    """A unit failed in another process; the message is the unit's own error."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Job(NamedTuple):
    """Units for an engine to run: ``units`` (none finished yet) of the run into ``out_dir``
    with ``options`` (``num_proc``, ``ray_address`` among them) and ``merge_options``;
    ``already`` units finished before them, and ``progress`` told as each one ends."""

    units: Sequence[Unit]
    out_dir: Path
    options: PackOptions
    merge_options: dict[str, Any]
    progress: Callable[[str, int, int | None], None] | None = None
    already: int = 0
    mixture: dict[int, UnitMixture] | None = None  # --mix: each unit's part (see call_unit)
    # the job to run next on the same engine (its pool, its Ray instance), made from this
    # one's results, or None; the engine returns the results of the last job it ran
    then: Callable[[list[Any]], Job | None] | None = None
    stage: str = "units"  # the progress stage its units are counted in (a mixture's measure)


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
    # --mix: where each unit was measured (index, pid, host), before the mixture was planned
    measured: list[tuple[int, int, str]] = field(default_factory=list)

    @property
    def packed(self) -> int:
        return sum(1 for u in self.units if not u.skipped)

    @property
    def skipped(self) -> int:
        return sum(1 for u in self.units if u.skipped)


def call_unit(
    unit: Unit,
    out_dir: str,
    options: PackOptions,
    merge_options: dict[str, Any],
    overwrite: bool,
    threads: int | None,
    mixture: UnitMixture | None = None,
) -> tuple[str, Any]:
    """Run one unit in a worker; errors come back as data (some exceptions do not pickle).

    Returns ``("ok", UnitResult)`` or ``("error", (message, exit_code))``. A mixture's unit
    not planned yet (``mixture.taken`` is None) is measured: ``("ok", MixtureMeasure)``.
    """
    try:
        if mixture is not None and mixture.taken is None:
            return "ok", measure_unit(unit, out_dir, options, mixture, num_proc=threads)
        return "ok", run_unit(
            unit,
            out_dir,
            options,
            merge_options=merge_options,
            overwrite=overwrite,
            num_proc=threads,
            mixture=mixture,
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


def _prepare(out: AnyPath, count: int, single: bool, overwrite: bool) -> None:
    """Check ``out`` before any work: a fresh directory, or the units of the same count.

    ``overwrite`` with all units removes ``out``; with one unit (``single``), only that unit
    is replaced later.
    """
    if not out.exists():
        return
    if not out.is_dir():
        raise OutputExistsError(f"output path {out} exists and is not a directory")
    if overwrite and not single:  # start over: units, merged output, all
        remove_tree(out)
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
    options: PackOptions | None = None,
    *,
    progress: Callable[[str, int, int | None], None] | None = None,
    **option_values: Any,
) -> UnitsReport:
    """Pack ``inputs`` as ``options.units`` work units on ``options.engine``, then merge them
    into ``out_dir``. Keyword arguments are fields of :class:`~packtool.options.PackOptions`
    (``units=4, max_len=4096, ...``) and override ``options``.

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
    options = _check((options or PackOptions()).replace(**option_values))
    assert options.units is not None
    out = as_path(out_dir)
    if isinstance(out, StorePath):  # a missing bucket or a denied write: now, in one line
        check_writable(out)
    # Absolute paths: every launcher (and every node) then plans and reads the same files
    # (URLs are absolute already).
    skipped: list[AnyPath] = []
    resolved, sources = _sources(inputs, options, skipped)
    files = [
        f if isinstance(f.path, StorePath) else replace(f, path=Path(os.path.abspath(f.path)))
        for f in resolved
    ]
    refuse_inputs_in(files, out)
    options, shape_auto = corpus_options(files, options)  # the shape: over all the inputs
    rows_per_shard = options.layout.shard_rows(row_bytes(options.row_len, has_labels(options)))
    merge_options = {
        "shuffle": options.shuffle,
        "seed": options.seed,
        "rows_per_shard": rows_per_shard,
        "world_size": options.world_size,
        "micro_batches": options.micro_batches,
        "copy": options.merge_copy,  # None: the merge copies only what it must
    }
    plan = [  # loads the tokenizer: a bad one fails here
        replace(u, input_shape_auto=shape_auto) for u in plan_units(files, options.units, options)
    ]
    mixtures = None
    if sources:  # which inputs make each source is part of the plan
        grouping = [(s.path, s.weight, s.first_file, s.end_file) for s in sources]
        digest = hashlib.sha256(repr((plan[0].plan, grouping)).encode()).hexdigest()
        plan = [replace(u, plan=digest) for u in plan]
        mixtures = unit_mixtures(plan, files, sources)
    created = not out.exists()
    _prepare(out, options.units, options.unit is not None, options.overwrite)
    skipped_files = [str(p) for p in skipped]
    if options.unit is not None:
        if not options.overwrite:  # --overwrite: every task of the array replaces its unit
            _check_a_sibling(plan, out, options.unit)
        result = run_unit(
            plan[options.unit],
            out,
            options,
            merge_options=merge_options,
            overwrite=options.overwrite,
            num_proc=options.num_proc,
            progress=progress,
        )
        return UnitsReport(out, "unit", [result], skipped_files=skipped_files)
    merged_before = _merged(out, plan[0].plan, merge_options)
    if merged_before is not None:
        return UnitsReport(out, options.engine, [], merged_before, skipped_files=skipped_files)
    try:
        measured: list[tuple[int, int, str]] = []
        results = _run_pending(plan, out, options, merge_options, progress, mixtures, measured)
    except PacktoolError:  # a unit failed (a bad record...): no half-made output left behind
        if created and isinstance(out, Path) and not _any_unit_finished(out):
            remove_tree(out)
        raise
    try:
        merged = merge_units(out, **merge_options, progress=progress)  # type: ignore[arg-type]
    except NothingToPackError:  # every unit is empty: no output, as without --units
        if created:
            remove_tree(out)
        raise
    merged.seconds = time.perf_counter() - started  # the whole run (the manifest: the merge)
    ran = [results[i] for i in range(options.units)]
    return UnitsReport(
        out, options.engine, ran, merged, skipped_files=skipped_files, measured=measured
    )


def _sources(
    inputs: Sequence[str | os.PathLike[str]], options: PackOptions, skipped: list[AnyPath]
) -> tuple[list[Any], list[Source]]:
    """The inputs resolved, and with ``--mix`` each input argument as a source (resolved one
    by one: the files of each, in order)."""
    if options.mix is None:
        return list(resolve_inputs(inputs, skipped=skipped)), []
    return resolve_sources(inputs, options.mix, lambda s: resolve_inputs([s], skipped=skipped))


def _check_a_sibling(plan: list[Unit], out: AnyPath, index: int) -> None:
    """Before one unit of an array runs: a finished sibling packed under another plan (the
    command changed between array tasks) would make the merge fail after every unit ran, so
    stop now. One sibling's manifest is read, not all of them (thousands of array tasks)."""
    for count, found in unit_dirs(out).items():
        if count != len(plan):
            continue
        for i, directory in found:
            if i == index or not (directory / MANIFEST_FILE).exists():
                continue
            try:
                finished_unit(plan[i], out)
            except OutputExistsError as e:
                raise OutputExistsError(
                    f"{e}".replace("; pass --overwrite to pack it again", "")
                    + f" than unit {index} would be: run every unit with the same command "
                    "(to pack them all again with this one, pass --overwrite to every task)"
                ) from None
            return


def _any_unit_finished(out: Path) -> bool:
    """Whether a unit under ``out`` has its manifest (a rerun would then skip it)."""
    return any((out / UNITS_DIR).glob(f"*/{MANIFEST_FILE}"))


def _check(options: PackOptions) -> PackOptions:
    """What units need of the options, checked before any work."""
    if options.units is None:
        raise OptionError("--unit, --engine and --ray-address work on units: give --units N")
    options.row_len  # noqa: B018  (a missing --max-len: one line, before any work)
    return options


def _run_pending(
    plan: list[Unit],
    out: Path,
    options: PackOptions,
    merge_options: dict[str, Any],
    progress: Callable[[str, int, int | None], None] | None,
    mixtures: list[UnitMixture] | None = None,
    measured: list[tuple[int, int, str]] | None = None,
) -> dict[int, UnitResult]:
    """Run the units of ``plan`` that are not finished yet on the engine; every unit's result.

    A mixture (``mixtures``: each unit's sources) runs in two rounds when a unit is pending:
    every unit is measured (tokenized, its documents' tokens counted; the tokens kept), the
    mixture is planned once over all of them (the plan one ``pack`` makes), then the pending
    units pack their part of it from the tokens kept, in the same engine session (one pool of
    processes, one Ray instance; ``measured``: where each unit was measured, filled in)."""
    results: dict[int, UnitResult] = {}
    pending: list[Unit] = []
    for u in plan:
        done = finished_unit(u, out)
        if done is None:
            pending.append(u)
        else:
            results[u.index] = result_from_manifest(u, done, skipped=True, seconds=0.0)
    if progress:
        progress("units", len(results), len(plan))
    if not pending:
        return results
    run_engine: Callable[[Job], list[UnitResult]]
    if options.engine == "ray":
        from .ray import run_ray as run_engine
    else:
        from .local import run_local as run_engine
    packing = Job(pending, out, options, merge_options, progress, len(results))
    job = packing
    if mixtures is not None:  # measured first, all units; then the packing, on the same engine
        finished = set(results)
        measuring = {u: replace(m, keep_tokens=u not in finished) for u, m in enumerate(mixtures)}

        def pack_parts(found: list[Any]) -> Job:
            parts = _plan_mixture(plan, out, options, mixtures, found, measured)
            return packing._replace(mixture=parts)

        job = Job(plan, out, options, merge_options, progress, 0, measuring, pack_parts, "measure")
    ran = run_engine(job)
    results.update({r.index: r for r in ran})
    return results


def _merged(out: Path, plan: str, merge_options: dict[str, Any]) -> PackReport | None:
    """The merged dataset in ``out`` if it is the merge of ``plan`` with these options."""
    from ..merge import up_to_date_merge
    from ..pipeline import PackReport

    manifest = up_to_date_merge(out, plan, merge_options)
    return None if manifest is None else PackReport.from_manifest(out, manifest, 0.0)


def _plan_mixture(
    plan: list[Unit],
    out: Path,
    options: PackOptions,
    mixtures: list[UnitMixture],
    found: list[Any],
    measured_at: list[tuple[int, int, str]] | None,
) -> dict[int, UnitMixture]:
    """The plan over every unit of ``plan`` (``mixtures``: their sources), from their
    measures (``found``); each unit's part. A refused plan (e.g. --no-repeat and a source
    too small) removes the tokens the measures kept."""
    measured = sorted(found, key=lambda m: m.index)
    if measured_at is not None:
        measured_at.extend((m.index, m.pid, m.host) for m in measured)
    o = options
    try:
        planned = plan_unit_mixtures(
            measured, mixtures, tokens=o.tokens, seed=o.seed, repeat=o.repeat
        )
    except PacktoolError:
        for u in plan:
            _drop_work_store(u.directory(out))
        raise
    return dict(enumerate(planned))


def _drop_work_store(directory: AnyPath) -> None:
    """Remove the work store a unit's measure kept for ``directory`` (on this machine)."""
    from ..pipeline import scratch_for
    from ..store import work_dir_for

    if isinstance(directory, StorePath):
        shutil.rmtree(scratch_for(directory), ignore_errors=True)
    else:
        shutil.rmtree(work_dir_for(Path(directory)), ignore_errors=True)
