"""The one table of tokenizer backends (like the readers' and the exports').

Each backend is a module with one :class:`~.backend.BackendSpec`; a new one is that module and
one line in :data:`BUILT_IN`. ``hf`` (Hugging Face `tokenizers`) is the reference every other
is compared with by the parity gate; ``auto`` tries the fast ones that load the file, best
suited to the tokenizer's shape first, then falls back to ``hf``.
"""

from __future__ import annotations

from ..tokenizer_file import TokenizerFile
from . import fastokens, gigatoken, hf
from .backend import BackendSpec

__all__ = ["AUTO", "BACKENDS", "BUILT_IN", "candidates", "choices", "spec_of"]

AUTO = "auto"
BUILT_IN: tuple[BackendSpec, ...] = (hf.BACKEND, fastokens.BACKEND, gigatoken.BACKEND)
BACKENDS: dict[str, BackendSpec] = {b.name: b for b in BUILT_IN}
REFERENCE = hf.BACKEND.name


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
