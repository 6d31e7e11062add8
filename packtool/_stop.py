"""One stop flag for every stage of a run, and the SIGTERM/SIGINT handlers that set it.

The CLI (and each worker process of the local units engine) handles SIGTERM, what Slurm and
Kubernetes send, and SIGINT by setting the flag and raising in the main thread, which then
removes the run's temporaries. Work in other threads that can run long in Python (a chat
template's loops) checks the flag and stops with :class:`Stopped`, so that the main thread,
which waits for its worker threads before it cleans up, is not kept waiting.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = [
    "STOP",
    "Stopped",
    "Terminated",
    "check_stop",
    "install_stop_handlers",
    "on_signal",
    "stop_signal",
]

STOP = threading.Event()
_SIGNAL: list[int] = []  # the signal that set STOP


class Stopped(KeyboardInterrupt):
    """A stage saw the stop flag (SIGTERM or SIGINT arrived) and stopped."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: clean up; the CLI exits 143."""


def check_stop() -> None:
    """Raise :class:`Stopped` once the run has been told to stop."""
    if STOP.is_set():
        raise Stopped


def on_signal(signum: int, frame: Any) -> None:
    """Set the flag and raise in the main thread, once: a second signal does not interrupt
    the cleanup of the first."""
    if STOP.is_set():
        return
    _SIGNAL[:] = [signum]
    STOP.set()
    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


def stop_signal() -> int | None:
    """The signal that set the stop flag (``signal.SIGTERM``, ``signal.SIGINT``), if one did."""
    return _SIGNAL[0] if STOP.is_set() and _SIGNAL else None


def install_stop_handlers() -> dict[int, Any]:
    """Handle SIGTERM, and SIGINT unless it is ignored (as in a shell's background job);
    return the handlers they replace. Call from the main thread."""
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, on_signal)}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, on_signal)
    return previous
