"""Exports of a pack for other training stacks: ``packtool export OUT --to KIND -o DIR``.

``megatron``
    a Megatron-LM indexed dataset (``.bin`` / ``.idx``), one sequence per document
    (:mod:`packtool.export.megatron`).
``megatron-bridge``
    the packed-SFT files of NeMo and Megatron-Bridge (``training_L.idx.parquet``, optionally
    the older ``.npy``, and ``L_metadata.jsonl``), one entry per packed row
    (:mod:`packtool.export.bridge`).

Each export is an :class:`~.registry.Exporter` in its module, and one table
(:data:`~.registry.EXPORTS`) names them: :func:`export` and :func:`verify_export` go
through it, and so do the command line's ``--to`` choices. Every export streams from the
memory-mapped shards, refuses an existing ``DIR``, writes
``export.json`` (what, from which pack, each file's sha256) last, and is checked against the
pack by :func:`verify_export` (``packtool verify OUT --export DIR``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["EXPORTS", "ExportCheck", "ExportReport", "Exporter", "export", "verify_export"]

# Public name -> the module that defines it; loaded when used (PEP 562), so that the table
# of exports is read without loading an export (the command line's ``--help``).
_NAMES = {
    "EXPORTS": "registry",
    "Exporter": "registry",
    "ExportCheck": "run",
    "ExportReport": "run",
    "export": "run",
    "verify_export": "run",
}


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
