"""The one table of tokenizer backends (like the readers' and the exports').

Each backend is a module with one :class:`~.backend.BackendSpec`; a new one is that module and
one line in :data:`BUILT_IN`. ``hf`` (Hugging Face `tokenizers`) is the reference every other
is compared with by the parity gate; ``auto`` tries the fast ones that load the file, best
suited to the tokenizer's shape first, then falls back to ``hf``.
"""

from __future__ import annotations

import os

from ..tokenizer_file import TokenizerFile
from . import fastokens, gigatoken, hf
from .backend import BackendSpec

__all__ = [
    "AUTO",
    "BACKENDS",
    "BUILT_IN",
    "SMALL_CORPUS_BYTES",
    "candidates",
    "choices",
    "for_corpus",
    "spec_of",
]

AUTO = "auto"
BUILT_IN: tuple[BackendSpec, ...] = (hf.BACKEND, fastokens.BACKEND, gigatoken.BACKEND)
BACKENDS: dict[str, BackendSpec] = {b.name: b for b in BUILT_IN}
REFERENCE = hf.BACKEND.name


SMALL_CORPUS_BYTES = 1_500_000
"""Below this many bytes of uncompressed input, ``auto`` encodes with `tokenizers`: a fast
backend's load and import (0.1-0.2 s more than `tokenizers`', and fastokens' is 2-3x
slower) cost more than its faster encoding saves. Measured whole processes, 2 cores, byte-level
BPE 128k-200k and a Metaspace 32k (docs/performance.md): `tokenizers` faster by 7-15% at 1 MB,
slower by 5-30% at 2-3 MB but for GPT-4o's o200k."""


def small_corpus_bytes() -> int:
    """:data:`SMALL_CORPUS_BYTES`, or ``$PACKTOOL_SMALL_CORPUS_BYTES`` (0: never; the test
    suite sets it so that ``auto`` on its small corpora exercises the fast backends)."""
    value = os.environ.get("PACKTOOL_SMALL_CORPUS_BYTES", "")
    return int(value) if value.strip().isdigit() else SMALL_CORPUS_BYTES


def for_corpus(choice: str, corpus_bytes: int | None) -> tuple[str, str | None]:
    """The backend a run takes for ``choice`` and its inputs' uncompressed size (``None``:
    not known), and why when it is not ``choice``: ``auto`` takes `tokenizers` for a small
    corpus."""
    small = small_corpus_bytes()
    if choice != AUTO or corpus_bytes is None or corpus_bytes >= small:
        return choice, None
    return REFERENCE, (
        f"auto: a small corpus ({corpus_bytes / 1e6:.2g} MB < {small / 1e6:g} MB), "
        "where tokenizers' load costs less than a fast backend's"
    )


def choices() -> tuple[str, ...]:
    """What ``--tokenizer-backend`` takes."""
    return (AUTO, *BACKENDS)


def spec_of(name: str) -> BackendSpec:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown tokenizer backend {name!r} (one of {', '.join(choices())})"
        ) from None


def candidates(choice: str, file: TokenizerFile | None) -> list[BackendSpec]:
    """The fast backends a run tries, in order, for ``choice`` and this tokenizer file
    (``[]``: `tokenizers` alone). ``auto``: every fast backend, best suited first."""
    if choice == AUTO:
        if file is None:
            return []
        fast = [b for b in BUILT_IN if b.fast]
        return sorted(fast, key=lambda b: -b.suits(file))
    spec = spec_of(choice)
    return [spec] if spec.fast else []


__all__ += ["REFERENCE"]
