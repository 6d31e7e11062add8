"""What every tokenizer backend is and gives: the shape of a backend's entry in the table
(:class:`BackendSpec`), the flat ids it encodes into (:class:`Flat`), the record of the one a
run used (:class:`Backend`), and packtool's anchor token, which every backend's copy knows.

A backend is one module (``hf``, ``fastokens``, ``gigatoken``) with one :class:`BackendSpec`,
listed once in :mod:`.registry`. Nothing here imports an engine.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..tokenizer_file import TokenizerFile

__all__ = [
    "ANCHOR",
    "Backend",
    "BackendSpec",
    "Engine",
    "Flat",
    "insert_ids",
    "made_once",
    "package_version",
]

ANCHOR = "\ufdd0packtool-anchor\ufdd1"
"""A non-special added token put in front of a piece of text that does not start a document, so
the piece is encoded as it is in the middle of a text (after an added token): Metaspace's
``prepend_scheme="first"`` then adds no word-start mark. Its id is dropped again. Made of Unicode
noncharacters, which never appear in interchanged text, and added to packtool's own copies of the
tokenizer only."""


def made_once(
    copies: dict[Any, Any], key: Any, lock: threading.Lock, make: Callable[[], Any]
) -> Any:
    """``copies[key]``, made by ``make()`` the first time it is asked for (a backend's copy of
    a tokenizer, one per mode): made under ``lock``, so never twice, and read without it once
    made."""
    copy = copies.get(key)
    if copy is not None:
        return copy
    with lock:
        if key not in copies:
            copies[key] = make()
        return copies[key]


@functools.cache
def package_version(package: str) -> str:
    """The installed version of ``package``, as ``importlib.metadata`` finds it (the first
    distribution of that name on ``sys.path``), nothing imported.

    Read from the name of its ``.dist-info`` directory, which the wheel format spells
    ``{name}-{version}.dist-info``: importing ``importlib.metadata`` costs ~17 ms (it imports
    the ``email`` package), on the way to a run's first encoded batch. Metadata of another
    shape (an ``.egg-info``) is read by ``importlib.metadata``."""
    found = _dist_info_version(_normalized(package))
    if found is not None:
        return found
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:  # pragma: no cover - installed, or not imported at all
        return "unknown"


def _dist_info_version(wanted: str) -> str | None:
    """The version in the name of the first ``.dist-info`` of ``wanted`` on ``sys.path``, or
    ``None`` where ``importlib.metadata`` must decide (none found; a zip file on the path, or
    an ``.egg-info`` of that name first)."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except NotADirectoryError:  # a zip file: importlib.metadata reads inside it
            return None
        except OSError:
            continue
        for name in names:
            stem, dot, kind = name.rpartition(".")
            if kind not in ("dist-info", "egg-info") or not dot:
                continue
            dist, _, version = stem.partition("-")
            if _normalized(dist) == wanted:
                return version if kind == "dist-info" and version else None
    return None


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


_SLICES_FROM = 64
"""Mean ids between two insertions from which :func:`insert_ids` copies slices (else a mask)."""


def insert_ids(ids: np.ndarray, where: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``np.insert(ids, where, values)`` for ``where`` sorted: the same array, but where the
    insertions are few (a BOS/EOS per long document), the ids between them are copied as
    slices, without the mask over the whole array that ``np.insert`` builds (which cost
    three times as much)."""
    n = int(where.size)
    if not n or ids.size < _SLICES_FROM * n:
        return np.insert(ids, where, values)
    out = np.empty(ids.size + n, ids.dtype)
    bounds = [0, *where.tolist(), int(ids.size)]
    for k, (a, b) in enumerate(itertools.pairwise(bounds)):
        out[a + k : b + k] = ids[a:b]
    out[where + np.arange(n)] = values
    return out


class Flat:
    """A batch as a fast backend returns it: every document's ids in one int32 buffer, and
    each document's length (read in place, no object per document)."""

    __slots__ = ("ids", "lengths", "room", "special_strings")

    def __init__(self, ids: np.ndarray, lengths: np.ndarray) -> None:
        self.ids = ids  # int32 (ids < 2**31: the same bits as uint32)
        self.lengths = lengths  # int64
        self.room: np.ndarray | None = None
        self.special_strings = 0

    @classmethod
    def from_offsets(cls, ids: Any, offsets: Any) -> Flat:
        """From a buffer of ids (uint32 or int32) and the ``n + 1`` offsets of ``n``
        documents."""
        flat = np.asarray(ids)
        if flat.dtype != np.int32:
            flat = flat.view(np.int32) if flat.dtype == np.uint32 else flat.astype(np.int32)
        return cls(flat, np.diff(np.asarray(offsets)).astype(np.int64))

    @classmethod
    def of_document(cls, room: np.ndarray, n: int) -> Flat:
        """One document's ``n`` ids, encoded in pieces into ``room`` (which has space after
        them for an EOS)."""
        out = cls(room[:n], np.array([n], np.int64))
        out.room = room
        return out

    def __len__(self) -> int:
        return int(self.lengths.size)

    def lists(self) -> list[list[int]]:
        """Each document's ids as a list (the parity gate compares these)."""
        ends = np.cumsum(self.lengths)
        starts = ends - self.lengths
        return [self.ids[a:b].tolist() for a, b in zip(starts, ends, strict=True)]


class Engine(Protocol):
    """A backend's loaded copy of a tokenizer.json (truncation and padding off, the
    :data:`ANCHOR` added at ``anchor_id``)."""

    def encode(self, texts: list[str], add_special: bool, parse_special: bool) -> Flat:
        """The ids of ``texts`` (special-token strings are text unless ``parse_special``;
        the post-processor's tokens added when ``add_special``)."""
        ...


@dataclass(frozen=True)
class BackendSpec:
    """One line of the backend table.

    - ``name``: what ``--tokenizer-backend`` and the manifest call it;
    - ``package``: the Python package it needs (its version is the backend's version);
    - ``refuses(file)``: why it cannot load this tokenizer.json (``None``: it may try; the
      parity gate decides);
    - ``load(json_bytes, anchor_id)``: its :class:`Engine`, or raises (the message says why);
    - ``fast``: whether ``auto`` may choose it (it sits behind the parity gate);
    - ``suits(file)``: how well ``auto`` ranks it for this tokenizer's shape (higher first),
      from the measurements in docs/performance.md.
    """

    name: str
    package: str
    refuses: Callable[[TokenizerFile], str | None]
    load: Callable[[bytes, int], Engine] | None
    fast: bool = True
    suits: Callable[[TokenizerFile], int] = lambda file: 0

    def version(self) -> str:
        return package_version(self.package)


@dataclass
class Backend:
    """Which engine encodes a run's documents, and why (the manifest's ``tokenizer.backend``).

    ``fallback_batches`` counts the batches the fast backend raised on, re-encoded with
    Hugging Face `tokenizers`; ``notice`` is the one line a run prints when ``auto`` chose
    `tokenizers` because no fast backend could be used.
    """

    name: str  # a backend of the table, "custom" (a library user's tokenizer), "none"
    version: str | None
    reason: str
    fallback_batches: int = 0
    notice: str | None = None
    documents_checked: int = 0  # --check-sample: documents re-encoded with tokenizers, equal
    inexact_cuts: int = 0  # huge documents cut where no exact cut was found (see notices)

    def describe(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "version": self.version,
            "reason": self.reason,
            "fallback_batches": self.fallback_batches,
            "documents_checked": self.documents_checked,
        }
        if self.inexact_cuts:  # a key of its own only where it happened (same manifests)
            out["inexact_cuts"] = self.inexact_cuts
        return out

    @property
    def notices(self) -> list[str]:
        """The lines a run prints about its engine."""
        out = [self.notice] if self.notice else []
        if self.inexact_cuts:
            out.append(
                f"{self.inexact_cuts} cut(s) of huge documents were made where no exact cut "
                "was found (a stretch of 16 Mi characters without a line break, space or "
                "punctuation): the ids at those joins may differ from the whole text's"
            )
        return out


def first_line(error: BaseException) -> str:
    """The first line of an engine's error message (or its type's name)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def flat_of(texts: Sequence[str], lists: Sequence[Sequence[int]]) -> Flat:
    """A :class:`Flat` of id lists (one per text)."""
    lengths = np.fromiter(map(len, lists), np.int64, len(texts))
    ids = np.fromiter((i for ids in lists for i in ids), np.int32, int(lengths.sum()))
    return Flat(ids, lengths)


__all__ += ["first_line", "flat_of"]
