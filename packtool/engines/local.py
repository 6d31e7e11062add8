"""The local engine: units in a pool of processes on this machine.

``num_proc`` cores (default: all) are shared: ``min(num_proc, units)`` units run at once,
each with ``num_proc // that`` tokenizer threads. With one process (``--num-proc 1``, or one
unit) the units run one after the other in this process. Workers are started with ``spawn``
(no fork of a process whose tokenizer threads are running), and each loads the tokenizer
once for all the units it runs.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from .. import _stop
from ..store import remove_unheld_lock
from ..units import Unit, UnitResult
from . import Job, UnitFailedError, call_unit, unwrap

__all__ = ["run_local"]


def run_local(job: Job) -> list[UnitResult]:
    """Run the units of ``job`` and return their results in unit order (with ``job.then``,
    the jobs it chains, in the same pool: the last one's results)."""
    if not job.units:
        return []
    cores = job.options.num_proc or os.cpu_count() or 1
    workers = max(1, min(cores, len(job.units)))
    threads = max(1, cores // workers)
    if workers == 1:
        while True:
            results = [_one(job, unit, threads, done) for done, unit in enumerate(job.units, 1)]
            following = job.then(results) if job.then is not None else None
            if following is None:
                return results
            job = following
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_worker_init
    ) as pool:
        while True:
            results = _in_pool(pool, job, threads)
            following = job.then(results) if job.then is not None else None
            if following is None:
                return results
            job = following


def _one(job: Job, unit: Unit, threads: int, done: int) -> Any:
    """Run ``unit`` in this process (``done``: units of the job run with it)."""
    result = unwrap(
        call_unit(unit, str(job.out_dir), job.options, job.merge_options, False, threads,
                  (job.mixture or {}).get(unit.index))
    )  # fmt: skip
    if job.progress:
        job.progress(job.stage, job.already + done, job.already + len(job.units))
    return result


def _in_pool(pool: ProcessPoolExecutor, job: Job, threads: int) -> list[Any]:
    """Run the units of ``job`` in ``pool``; their results in unit order."""
    units, out_dir, progress, already = job.units, job.out_dir, job.progress, job.already
    common = (str(out_dir), job.options, job.merge_options, False, threads)
    parts = job.mixture or {}
    total = already + len(units)
    results: list[Any] = []
    futures = [pool.submit(_worker_unit, unit, *common, parts.get(unit.index)) for unit in units]
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION, timeout=0.5)
            for future in done:
                results.append(unwrap(future.result()))
            if done and progress:
                progress(job.stage, already + len(results), total)
    except BrokenProcessPool:
        raise UnitFailedError(
            "a worker process died while packing units (out of memory? try a smaller "
            "--num-proc or more --units); finished units are kept: run the same command "
            "again to go on"
        ) from None
    except BaseException:  # an error, or SIGTERM/SIGINT here: stop the units now
        # Every worker exits (after its unit's cleanup), so no queued unit starts. Not
        # future.cancel(): a worker dying before its initializer ran breaks the pool, and
        # Python 3.11's pool then fails on cancelled futures and resolves no other.
        children = multiprocessing.active_children()
        for child in children:
            child.terminate()  # each running unit removes its temporaries, then exits
        deadline = time.monotonic() + _STOP_GRACE_SECONDS
        for child in children:
            child.join(max(0.0, deadline - time.monotonic()))
            if child.is_alive():
                child.kill()
        for unit in units:  # a unit stopped while taking its lock, or killed, left it
            directory = unit.directory(out_dir)
            if isinstance(directory, Path):
                remove_unheld_lock(directory)
        raise
    return sorted(results, key=lambda r: r.index)


_busy = False  # a worker process is running a unit
_STOP_GRACE_SECONDS = 10.0  # for the units running at a stop to remove their temporaries


def _worker_init() -> None:
    """SIGTERM/SIGINT in a worker: a running unit stops and removes its temporaries, then the
    worker exits; an idle worker exits at once."""
    signal.signal(signal.SIGTERM, _on_worker_signal)
    signal.signal(signal.SIGINT, _on_worker_signal)


def _on_worker_signal(signum: int, frame: Any) -> None:
    if not _busy:
        os._exit(128 + signum)  # idle: nothing to clean up
    _stop.on_signal(signum, frame)


def _worker_unit(*args: Any) -> tuple[str, Any]:
    global _busy
    _busy = True
    try:
        return call_unit(*args)
    except _stop.Terminated:  # SIGTERM: the unit has removed its temporaries
        os._exit(143)
    except KeyboardInterrupt:  # SIGINT: the same
        os._exit(130)
    finally:
        _busy = False
