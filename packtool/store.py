"""The temporary on-disk token store.

Tokens are appended to one flat int32 file as documents are encoded (and, for instruction
data, their labels to a second file aligned with it); only per-item lengths and offsets stay
in memory. Rows are later gathered from the memory-mapped file. The store
lives in a hidden sibling of the output directory (same filesystem, so no surprise from a
small ``/tmp``) and is removed when the context exits, on success, error or Ctrl-C.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TokenStore"]


class TokenStore:
    """Append-only int32 token file, then a read-only memory map.

    >>> with TokenStore(Path("out")) as store:
    ...     base = store.append(np.array([5, 6, 7], np.int32))   # -> 0
    ...     store.finish()
    ...     tokens = store.open()                                # memmap of all tokens

    With ``with_labels=True``, every :meth:`append` also takes the labels of its tokens
    (int32, same length), and :meth:`open_labels` maps them: label ``i`` is that of token ``i``.
    """

    def __init__(self, out_dir: Path, with_labels: bool = False) -> None:
        out_dir = Path(out_dir)
        self.directory = out_dir.parent / f".{out_dir.name}.packtool-store-{os.getpid()}"
        self.path = self.directory / "tokens.i32"
        self.labels_path = self.directory / "labels.i32"
        self.with_labels = with_labels
        self._file: Any = None
        self._labels_file: Any = None
        self.num_tokens = 0

    def __enter__(self) -> TokenStore:
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True)
        self._file = open(self.path, "wb")
        if self.with_labels:
            self._labels_file = open(self.labels_path, "wb")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def append(self, tokens: np.ndarray, labels: np.ndarray | None = None) -> int:
        """Write ``tokens`` (int32) at the end, and their ``labels`` in a store made
        ``with_labels``; return the offset of the first token."""
        if self.with_labels != (labels is not None):
            raise ValueError(
                "labels go with every append to a store made with_labels, and only there"
            )
        base = self.num_tokens
        np.ascontiguousarray(tokens, dtype=np.int32).tofile(self._file)
        if labels is not None:
            if labels.shape != tokens.shape:
                raise ValueError(f"labels {labels.shape} do not match tokens {tokens.shape}")
            np.ascontiguousarray(labels, dtype=np.int32).tofile(self._labels_file)
        self.num_tokens += int(tokens.size)
        return base

    def finish(self) -> None:
        """Close for writing."""
        for name in ("_file", "_labels_file"):
            f = getattr(self, name)
            if f is not None:
                f.close()
                setattr(self, name, None)

    def open(self) -> np.ndarray:
        """The tokens, memory-mapped read-only (an empty array if there are none).

        Each call maps anew; dropping the array unmaps it, which keeps the pages it touched
        out of the process's resident memory (they stay in the page cache).
        """
        self.finish()
        if self.num_tokens == 0:
            return np.zeros(0, np.int32)
        return np.memmap(self.path, dtype=np.int32, mode="r", shape=(self.num_tokens,))

    def open_labels(self) -> np.ndarray | None:
        """The labels, memory-mapped like :meth:`open` (``None`` in a store without labels)."""
        if not self.with_labels:
            return None
        self.finish()
        if self.num_tokens == 0:
            return np.zeros(0, np.int32)
        return np.memmap(self.labels_path, dtype=np.int32, mode="r", shape=(self.num_tokens,))

    def close(self) -> None:
        """Remove the store from disk."""
        self.finish()
        shutil.rmtree(self.directory, ignore_errors=True)
