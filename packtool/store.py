"""The temporary on-disk token store.

Tokens are appended to one flat int32 file as documents are encoded; only per-item lengths
and offsets stay in memory. Rows are later gathered from the memory-mapped file. The store
lives in a hidden sibling of the output directory (same filesystem, so no surprise from a
small ``/tmp``) and is removed when the context exits, on success, error or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from .format import write_error

__all__ = ["TokenStore"]


class TokenStore:
    """Append-only int32 token file, then a read-only memory map.

    >>> with TokenStore(Path("out")) as store:
    ...     base = store.append(np.array([5, 6, 7], np.int32))   # -> 0
    ...     tokens = store.finish()                              # memmap of all tokens
    """

    def __init__(self, out_dir: Path) -> None:
        out_dir = Path(out_dir)
        self.directory = out_dir.parent / f".{out_dir.name}.packtool-store-{os.getpid()}"
        self.path = self.directory / "tokens.i32"
        self._file: Any = None
        self.num_tokens = 0
        self._map: np.ndarray | None = None

    def __enter__(self) -> TokenStore:
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True)
        self._file = open(self.path, "wb")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def append(self, tokens: np.ndarray) -> int:
        """Write ``tokens`` (int32) at the end; return the offset of the first one."""
        base = self.num_tokens
        data = np.ascontiguousarray(tokens, dtype=np.int32)
        try:
            # file.write, not ndarray.tofile: tofile's error on a full disk has no errno
            self._file.write(memoryview(data).cast("B"))
        except OSError as e:
            raise write_error(e, self.path, "cannot write the token store") from e
        self.num_tokens += int(tokens.size)
        return base

    def finish(self) -> np.ndarray:
        """Close for writing; the memory-mapped tokens (an empty array if there are none)."""
        if self._file is not None:
            try:
                self._file.close()
            except OSError as e:
                raise write_error(e, self.path, "cannot write the token store") from e
            finally:
                self._file = None
        if self.num_tokens == 0:
            return np.zeros(0, np.int32)
        self._map = np.memmap(self.path, dtype=np.int32, mode="r", shape=(self.num_tokens,))
        return self._map

    def close(self) -> None:
        """Remove the store from disk."""
        if self._file is not None:
            with contextlib.suppress(OSError):  # a full disk fails the flush; it goes anyway
                self._file.close()
            self._file = None
        self._map = None
        shutil.rmtree(self.directory, ignore_errors=True)
