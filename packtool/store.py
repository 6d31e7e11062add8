"""The on-disk work store: tokens, items and a checkpoint, until the rows are written.

Tokens are appended to one flat int32 file as documents are encoded (and, for instruction
data, their labels to a second file aligned with it), and items (the segments to pack: a
document or a chunk of one) to a file of fixed-size records; only what the packer needs is
ever loaded. Rows are gathered by reading just the token ranges each block of rows needs.

The store lives in a hidden sibling of the output directory, ``.NAME.packtool-work`` (same
filesystem as the output, so no surprise from a small ``/tmp``). It is removed when the run
ends, on success, error or Ctrl-C, unless the run is resumable (``pack --resume``): then an
interrupted run keeps it, with a checkpoint, and the next ``--resume`` run continues from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .errors import OutputExistsError, PacktoolError
from .format import write_error

__all__ = ["ITEM_DTYPE", "LOST_DTYPE", "TokenStore", "has_checkpoint", "work_dir_for"]

ITEM_DTYPE = np.dtype(
    [("offset", "<i8"), ("length", "<i4"), ("doc_id", "<i8"), ("chunk_id", "<i4")]
)
"""One item: where its tokens start in the token file, how many, and where they come from."""

LOST_DTYPE = np.dtype(
    [("offset", "<i8"), ("length", "<i4"), ("doc_id", "<i8"), ("chunk_id", "<i4"), ("label", "<i4")]
)
"""One chunk of a labelled split document that the rows cannot give back whole
(:func:`packtool.packing.split_losses`): its first token's label, and where its tokens lie
in the token file (``length`` 0: the rows hold them)."""

_CHECKPOINT = "checkpoint.json"


def work_dir_for(out_dir: Path) -> Path:
    return out_dir.parent / f".{out_dir.name}.packtool-work"


def has_checkpoint(out_dir: Path) -> bool:
    """Whether an interrupted ``--resume`` run left a checkpoint for ``out_dir`` to continue."""
    return (work_dir_for(Path(out_dir)) / _CHECKPOINT).is_file()


_COALESCE_GAP = 256  # tokens: ranges closer than this are read with one call


class StoreReader:
    """Reads scattered token ranges of a finished store with ``pread``, for gathering rows.

    Not a memory map: the kernel maps a whole page-cache folio (up to 2 MB on ext4) into
    the process on each touch of a mapped file, so gathering shuffled rows through a map
    made nearly the whole store resident however small the block. Reading only the ranges
    a block needs keeps memory bounded by the block, whatever the corpus size.
    """

    def __init__(self, path: Path, labels_path: Path | None, num_tokens: int) -> None:
        self.path, self.labels_path, self.num_tokens = path, labels_path, num_tokens
        self._fd = os.open(path, os.O_RDONLY)
        self._labels_fd = os.open(labels_path, os.O_RDONLY) if labels_path else None

    def close(self) -> None:
        for name in ("_fd", "_labels_fd"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                os.close(fd)

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def read_ranges(
        self, starts: np.ndarray, lengths: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """Tokens (and labels) of the ranges ``[starts[k], starts[k] + lengths[k])``.

        Returns ``(tokens, labels or None, offsets)``: range ``k`` is
        ``tokens[offsets[k]:offsets[k] + lengths[k]]``. Ranges are read in file order, close
        ones together.
        """
        starts = np.asarray(starts, np.int64)
        lengths = np.asarray(lengths, np.int64)
        if starts.size == 0:
            empty = np.zeros(0, np.int32)
            return empty, (empty if self._labels_fd is not None else None), starts
        by_start = np.argsort(starts, kind="stable")
        s, e = starts[by_start], starts[by_start] + lengths[by_start]
        reach = np.maximum.accumulate(e)
        new_run = np.ones(s.size, bool)
        new_run[1:] = s[1:] > reach[:-1] + _COALESCE_GAP
        heads = np.flatnonzero(new_run)
        run_start = s[heads]
        run_len = np.maximum.reduceat(e, heads) - run_start
        run_dest = np.concatenate([[0], np.cumsum(run_len)[:-1]]).astype(np.int64)
        run_of = np.cumsum(new_run) - 1
        offsets = np.empty(starts.size, np.int64)
        offsets[by_start] = run_dest[run_of] + (s - run_start[run_of])
        total = int(run_len.sum())
        tokens = self._read(self._fd, self.path, run_start, run_len, run_dest, total)
        labels = None
        if self._labels_fd is not None and self.labels_path is not None:
            labels = self._read(
                self._labels_fd, self.labels_path, run_start, run_len, run_dest, total
            )
        return tokens, labels, offsets

    @staticmethod
    def _read(
        fd: int | None,
        path: Path,
        run_start: np.ndarray,
        run_len: np.ndarray,
        run_dest: np.ndarray,
        total: int,
    ) -> np.ndarray:
        if fd is None:
            raise ValueError("the store reader is closed")
        out = np.empty(total, np.int32)
        view = memoryview(out).cast("B")
        for start, length, dest in zip(
            (run_start * 4).tolist(), (run_len * 4).tolist(), (run_dest * 4).tolist(), strict=True
        ):
            while length:
                try:
                    got = os.preadv(fd, [view[dest : dest + length]], start)
                except OSError as e:
                    raise write_error(e, path, "cannot read the work store") from e
                if got == 0:
                    raise PacktoolError(f"{path}: the work store ends early (was it changed?)")
                start, length, dest = start + got, length - got, dest + got
        return out


@contextlib.contextmanager
def lock_output(out_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``out_dir`` for one ``pack`` (a second one fails at once).

    Two runs writing the same output would share its work store; the lock (``flock`` on a
    hidden sibling file, released by the kernel if the process dies) makes the second one
    stop with a clear error instead.
    """
    import fcntl

    out_dir = Path(out_dir)
    path = lock_path(out_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, refused = -1, False
    try:  # the file is made inside the try: a signal right after still removes it
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            refused = True
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            raise OutputExistsError(
                f"another packtool pack (pid {holder}) is writing {out_dir}: wait for it, or "
                "choose another --output"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        # Ours to remove unless another run holds it, also after a signal at any point
        # above (even between taking the lock and knowing it): flock again to know.
        if fd < 0:
            with contextlib.suppress(OSError):
                remove_unheld_lock(out_dir)  # a signal between the open and the assignment
        else:
            if not refused and _holds_or_takes(fd):
                with contextlib.suppress(OSError):
                    path.unlink()
            os.close(fd)


def lock_path(out_dir: Path) -> Path:
    """The hidden sibling file whose ``flock`` :func:`lock_output` holds."""
    return out_dir.parent / f".{out_dir.name}.packtool-lock"


def remove_unheld_lock(out_dir: Path) -> bool:
    """Remove ``out_dir``'s lock file if no process holds its lock: what a run stopped
    while taking it, or killed, left behind (the kernel released the lock itself)."""
    path = lock_path(Path(out_dir))
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        if not _holds_or_takes(fd):
            return False
        path.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)


def _holds_or_takes(fd: int) -> bool:
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # succeeds when this fd holds it
    except OSError:
        return False
    return True


class TokenStore:
    """Append-only token and item files, a checkpoint, then reads of token ranges.

    >>> with TokenStore(Path("out")) as store:
    ...     store.start()
    ...     base = store.append(np.array([5, 6, 7], np.int32))   # -> 0
    ...     with store.reader() as r:
    ...         tokens, _, offsets = r.read_ranges(np.array([1]), np.array([2]))  # [6, 7]

    With ``with_labels=True``, every :meth:`append` also takes the labels of its tokens
    (int32, same length), and the reader returns them too: label ``i`` is that of token ``i``.
    """

    def __init__(
        self, out_dir: Path, *, with_labels: bool = False, keep_on_error: bool = False
    ) -> None:
        self.directory = work_dir_for(Path(out_dir))
        self.path = self.directory / "tokens.i32"
        self.labels_path = self.directory / "labels.i32"
        self.items_path = self.directory / "items.bin"
        self.lost_path = self.directory / "lost.bin"
        self.with_labels = with_labels
        self.keep_on_error = keep_on_error
        self._file: Any = None
        self._labels_file: Any = None
        self._items: Any = None
        self._lost: Any = None
        self.num_tokens = 0
        self.num_items = 0
        self.num_lost = 0
        self.stale_checkpoint = False  # resume() found a checkpoint of another run, discarded
        self.kept = False  # keep(): left on disk at the end, for a run that resumes it

    def keep(self) -> None:
        """Leave the store (checkpointed) on disk when the ``with`` block ends: a mixture's
        work unit is measured, then packed from the same tokens (:func:`pipeline.measure`)."""
        self.kept = True

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> TokenStore:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if (exc_type is not None and self.keep_on_error) or self.kept:
            self._close_quietly()  # an interrupted resumable run keeps its work
        else:
            self.close()

    def start(self) -> None:
        """Start empty (a stale store from an earlier, killed run is removed)."""
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True)
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed in _close_files
        self._items = open(self.items_path, "wb")  # noqa: SIM115
        if self.with_labels:
            self._labels_file = open(self.labels_path, "wb")  # noqa: SIM115
            self._lost = open(self.lost_path, "wb")  # noqa: SIM115

    def resume(self, fingerprint: str) -> dict[str, Any] | None:
        """Reopen a checkpointed store made with the same ``fingerprint``.

        Returns the checkpoint's state (what the pipeline saved with :meth:`checkpoint`), or
        ``None`` after starting empty when there is no usable checkpoint
        (:attr:`stale_checkpoint` is then true if there was one, of another fingerprint).
        """
        try:
            saved = json.loads((self.directory / _CHECKPOINT).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            saved = None
        if not isinstance(saved, dict) or saved.get("fingerprint") != fingerprint:
            self.stale_checkpoint = isinstance(saved, dict)
            self.start()
            return None
        self.num_tokens = int(saved["num_tokens"])
        self.num_items = int(saved["num_items"])
        self.num_lost = int(saved.get("num_lost", 0))
        # Drop whatever was appended after the checkpoint.
        files = [(self.path, self.num_tokens * 4)]
        files.append((self.items_path, self.num_items * ITEM_DTYPE.itemsize))
        if self.with_labels:
            files.append((self.labels_path, self.num_tokens * 4))
            files.append((self.lost_path, self.num_lost * LOST_DTYPE.itemsize))
        for path, size in files:
            if not path.exists():
                self.start()
                return None
            if path.stat().st_size < size:  # pragma: no cover - a checkpoint is written last
                self.start()
                return None
            os.truncate(path, size)
        self._file = open(self.path, "ab")  # noqa: SIM115
        self._items = open(self.items_path, "ab")  # noqa: SIM115
        if self.with_labels:
            self._labels_file = open(self.labels_path, "ab")  # noqa: SIM115
            self._lost = open(self.lost_path, "ab")  # noqa: SIM115
        return dict(saved["state"])

    # -- writing ---------------------------------------------------------------------------
    def append(self, tokens: np.ndarray, labels: np.ndarray | None = None) -> int:
        """Write ``tokens`` (int32) at the end, and their ``labels`` in a store made
        ``with_labels``; return the offset of the first token."""
        if self.with_labels != (labels is not None):
            raise ValueError(
                "labels go with every append to a store made with_labels, and only there"
            )
        base = self.num_tokens
        if labels is not None and labels.shape != tokens.shape:
            raise ValueError(f"labels {labels.shape} do not match tokens {tokens.shape}")
        self._write(self._file, self.path, tokens)
        if labels is not None:
            self._write(self._labels_file, self.labels_path, labels)
        self.num_tokens += int(tokens.size)
        return base

    def add_items(self, offsets: Any, lengths: Any, doc_ids: Any, chunk_ids: Any) -> None:
        records = np.empty(len(lengths), ITEM_DTYPE)
        records["offset"] = offsets
        records["length"] = lengths
        records["doc_id"] = doc_ids
        records["chunk_id"] = chunk_ids
        self._write(self._items, self.items_path, records)
        self.num_items += len(records)

    def add_lost(self, records: np.ndarray) -> None:
        """Append records of :data:`LOST_DTYPE` (a store made ``with_labels``)."""
        if records.size:
            self._write(self._lost, self.lost_path, records)
            self.num_lost += int(records.size)

    @staticmethod
    def _write(file: Any, path: Path, data: np.ndarray) -> None:
        # file.write, not ndarray.tofile: tofile's error on a full disk has no errno
        if data.dtype not in (ITEM_DTYPE, LOST_DTYPE):
            data = np.ascontiguousarray(data, dtype=np.int32)
        try:
            file.write(memoryview(np.ascontiguousarray(data)).cast("B"))
        except OSError as e:
            raise write_error(e, path, "cannot write the work store") from e

    def checkpoint(self, fingerprint: str, state: dict[str, Any]) -> None:
        """Record that everything appended so far, and ``state``, can be resumed from."""
        for f in (self._file, self._items, self._labels_file, self._lost):
            if f is not None:
                f.flush()
        tmp = self.directory / (_CHECKPOINT + ".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "fingerprint": fingerprint,
                    "num_tokens": self.num_tokens,
                    "num_items": self.num_items,
                    **({"num_lost": self.num_lost} if self.num_lost else {}),
                    "state": state,
                }
            ),
            encoding="utf-8",
        )
        os.replace(tmp, self.directory / _CHECKPOINT)

    # -- reading ---------------------------------------------------------------------------
    def finish(self) -> None:
        """Close for writing."""
        self._close_files()

    def items(self) -> np.ndarray:
        """All items, as a structured array of :data:`ITEM_DTYPE`."""
        self.finish()
        if self.num_items == 0:
            return np.zeros(0, ITEM_DTYPE)
        return np.fromfile(self.items_path, dtype=ITEM_DTYPE, count=self.num_items)

    def lost(self) -> np.ndarray:
        """All records of :meth:`add_lost`, as a structured array of :data:`LOST_DTYPE`."""
        self.finish()
        if self.num_lost == 0:
            return np.zeros(0, LOST_DTYPE)
        return np.fromfile(self.lost_path, dtype=LOST_DTYPE, count=self.num_lost)

    def reader(self) -> StoreReader:
        """A :class:`StoreReader` of the tokens (and labels) appended so far."""
        self.finish()
        return StoreReader(
            self.path, self.labels_path if self.with_labels else None, self.num_tokens
        )

    def _close_files(self) -> None:
        error: OSError | None = None
        for name in ("_file", "_items", "_labels_file", "_lost"):
            f = getattr(self, name)
            if f is not None:
                setattr(self, name, None)
                try:
                    f.close()
                except OSError as e:  # a full disk fails the final flush
                    error = error or write_error(e, Path(f.name), "cannot write the work store")
        if error is not None:
            raise error

    def _close_quietly(self) -> None:
        with contextlib.suppress(OSError):
            self._close_files()

    def close(self) -> None:
        """Remove the store from disk."""
        self._close_quietly()
        shutil.rmtree(self.directory, ignore_errors=True)
