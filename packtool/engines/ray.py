"""The Ray engine: one Ray task per unit (``pip install 'packtool[ray]'``).

The units decide what is packed together; Ray only places the tasks. Each task runs
:func:`packtool.units.run_unit` in a Ray worker process, which loads the tokenizer once for
all the tasks it runs, writes the unit to ``OUT_DIR/units/`` (a filesystem every node sees
at the same path), and returns its figures with the worker's process id and host. The
driver merges the units when all are done.

With ``address`` the run joins a running cluster (``ray start --head`` ...); packtool and
its dependencies must be installed on every node. Without it packtool starts a local Ray
instance for the run: bound to 127.0.0.1, no dashboard, its temporary files in a directory
of packtool's own that is removed afterwards. Ray's usage statistics are always switched
off (``RAY_USAGE_STATS_ENABLED=0``): a data tool does not report anywhere by itself.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from typing import Any

from .._version import __version__
from ..errors import OptionError
from ..mixture import UnitMixture
from ..options import PackOptions
from ..units import Unit, UnitResult
from . import Job, UnitFailedError, call_unit, unwrap

__all__ = ["import_ray", "run_ray"]


def import_ray() -> Any:
    """Import Ray with its usage statistics off, or say how to install it."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    try:
        import ray
    except ImportError:
        raise OptionError(
            "--engine ray needs Ray, which is not installed: pip install 'packtool[ray]'"
        ) from None
    return ray


CONNECT_SECONDS = 10.0
"""How long ``--ray-address HOST:PORT`` may take to accept a connection before the run stops."""


def check_address(address: str) -> None:
    """Stop in one line when nothing answers at ``--ray-address HOST:PORT`` (Ray itself retries
    for minutes, printing warnings); ``auto`` and URLs (``ray://``) are left to Ray."""
    if address == "auto" or "://" in address:
        return
    host, colon, port = address.rpartition(":")
    host = host.strip("[]")  # [::1]:6379
    if not colon or not host or not port.isdigit():
        raise OptionError(
            f"--ray-address {address!r}: give HOST:PORT of the Ray head (e.g. node1:6379), "
            "or auto on a node of the cluster"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_SECONDS):
            pass
    except OSError as e:
        why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise OptionError(
            f"--ray-address {address}: cannot connect ({why}): is a Ray head running there "
            f"(`ray start --head --port={port}`)?"
        ) from None


def _join(ray: Any, address: str) -> None:
    """``ray.init`` on a running cluster; its refusals (no cluster, a Ray Client address
    without ``ray[client]``) as one line naming --ray-address."""
    check_address(address)
    try:
        ray.init(address=address, log_to_driver=False)
    except (ConnectionError, ValueError) as e:
        said = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        said = said.replace("by setting `--address` flag or", "with --ray-address HOST:PORT or")
        raise OptionError(f"--ray-address {address}: {said}") from None


def _task(
    unit: Unit,
    out_dir: str,
    options: PackOptions,
    merge_options: dict[str, Any],
    threads: int,
    mixture: UnitMixture | None = None,
) -> tuple[str, Any]:
    """Runs in a Ray worker."""
    return call_unit(unit, out_dir, options, merge_options, False, threads, mixture)


def run_ray(job: Job) -> list[UnitResult]:
    """Run the units of ``job`` as Ray tasks of ``--num-proc`` CPUs each (default 1); results
    in unit order.

    Uses the Ray instance already initialised in this process if there is one, else joins
    ``--ray-address``, else starts a local instance (and stops it at the end).
    """
    options = job.options
    address = options.ray_address
    ray = import_ray()
    cpus = options.num_proc or 1
    started_here = False
    temp_dir: str | None = None
    if not ray.is_initialized():
        if address is not None:
            _join(ray, address)
        else:
            temp_dir = _temp_dir()
            ray.init(
                num_cpus=max(os.cpu_count() or 1, cpus),
                include_dashboard=False,
                _temp_dir=temp_dir,
                _node_ip_address="127.0.0.1",
                log_to_driver=False,
                configure_logging=False,
            )
        started_here = True
    refs: list[Any] = []  # the tasks in flight: cancelled on an error
    try:
        # A task whose worker or node dies is retried by Ray (a unit can run again: its
        # output appears only when complete).
        task = ray.remote(num_cpus=cpus)(_task)
        current: Job | None = job
        while current is not None:  # the job, then the jobs it chains (job.then)
            results = _tasks(ray, task, current, cpus, refs)
            current = current.then(results) if current.then is not None else None
        return results
    except BaseException:
        for ref in refs:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise
    finally:
        if started_here:
            ray.shutdown()
            if temp_dir is not None:
                _remove(temp_dir)


def _tasks(ray: Any, task: Any, job: Job, cpus: int, refs: list[Any]) -> list[Any]:
    """Run the units of ``job`` as Ray tasks (their refs put in ``refs``); their results in
    unit order."""
    units, progress, already = job.units, job.progress, job.already
    parts = job.mixture or {}
    out_dir = str(job.out_dir.resolve())
    refs[:] = [
        task.remote(unit, out_dir, job.options, job.merge_options, cpus, parts.get(unit.index))
        for unit in units
    ]
    names = {ref: unit.name for ref, unit in zip(refs, units, strict=True)}
    results: list[Any] = []
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
        for ref in done:
            try:
                outcome = ray.get(ref)
            except ray.exceptions.RayError as e:
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise UnitFailedError(
                    f"{names[ref]}: the Ray task failed: {first} (finished units are kept: "
                    "run the same command again to go on)"
                ) from None
            result = unwrap(outcome)
            if result.packtool_version != __version__:
                raise UnitFailedError(
                    f"a Ray worker on {result.host} runs packtool {result.packtool_version}, "
                    f"the driver {__version__}: install the same version on every node"
                )
            results.append(result)
        if done and progress:
            progress(job.stage, already + len(results), already + len(units))
    return sorted(results, key=lambda r: r.index)


def _temp_dir() -> str:
    """A new directory for Ray's files, under $TMPDIR if its path is short enough.

    Ray puts Unix sockets at ``<dir>/session_<date>_<pid>/sockets/plasma_store``, and a
    socket path has at most 107 bytes; past that, the directory goes under /tmp.
    """
    root = tempfile.gettempdir()
    if len(os.path.join(root, "packtool-ray-12345678")) > _MAX_TEMP_DIR:
        root = "/tmp"
    return tempfile.mkdtemp(prefix="packtool-ray-", dir=root)


_MAX_TEMP_DIR = 107 - len("/session_2026-01-01_00-00-00_000000_1234567/sockets/plasma_store")


def _remove(path: str) -> None:
    """Remove Ray's temporary directory; its last processes may still be writing logs."""
    for _ in range(20):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return
        time.sleep(0.25)
