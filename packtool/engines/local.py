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
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from .._stop import install_stop_handlers
from ..units import Unit, UnitOptions, UnitResult
from . import UnitFailedError, call_unit, unwrap

__all__ = ["run_local"]


def run_local(
    units: Sequence[Unit],
    out_dir: Path,
    options: UnitOptions,
    *,
    merge_options: dict[str, Any],
    num_proc: int | None = None,
    progress: Callable[[str, int, int | None], None] | None = None,
    already: int = 0,
) -> list[UnitResult]:
    """Run ``units`` (none of them finished yet) and return their results in unit order."""
    if not units:
        return []
    total = already + len(units)
    cores = num_proc or os.cpu_count() or 1
    workers = max(1, min(cores, len(units)))
    threads = max(1, cores // workers)
    results: list[UnitResult] = []
    if workers == 1:
        for unit in units:
            results.append(
                unwrap(call_unit(unit, str(out_dir), options, merge_options, False, threads))
            )
            if progress:
                progress("units", already + len(results), total)
        return results
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=install_stop_handlers
    ) as pool:
        futures = [
            pool.submit(call_unit, unit, str(out_dir), options, merge_options, False, threads)
            for unit in units
        ]
        try:
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_EXCEPTION, timeout=0.5)
                for future in done:
                    results.append(unwrap(future.result()))
                if done and progress:
                    progress("units", already + len(results), total)
        except BrokenProcessPool:
            raise UnitFailedError(
                "a worker process died while packing units (out of memory? try a smaller "
                "--num-proc or more --units); finished units are kept: run the same command "
                "again to go on"
            ) from None
        except BaseException:  # an error, or SIGTERM/SIGINT here: stop the units now
            for future in futures:
                future.cancel()
            for child in multiprocessing.active_children():
                child.terminate()  # each unit removes its temporaries and stops
            raise
    return sorted(results, key=lambda r: r.index)
