"""Exports of a pack for other training stacks: ``packtool export OUT --to KIND -o DIR``.

``megatron``
    a Megatron-LM indexed dataset (``.bin`` / ``.idx``), one sequence per document
    (:mod:`packtool.export.megatron`).
``megatron-bridge``
    the packed-SFT files of NeMo and Megatron-Bridge (``training_L.idx.parquet``, optionally
    the older ``.npy``, and ``L_metadata.jsonl``), one entry per packed row
    (:mod:`packtool.export.bridge`).

Every export streams from the memory-mapped shards, refuses an existing ``DIR``, writes
``export.json`` (what, from which pack, each file's sha256) last, and is checked against the
pack by :func:`verify_export` (``packtool verify OUT --export DIR``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import FormatError, OptionError
from ..format import open_packed
from .bridge import bridge_problems, export_bridge
from .common import (
    export_output,
    file_problems,
    local_export_dir,
    pack_fingerprint,
    read_export_manifest,
)
from .megatron import export_megatron, megatron_problems

__all__ = ["EXPORTS", "ExportCheck", "ExportReport", "export", "verify_export"]

EXPORTS = ("megatron", "megatron-bridge")


@dataclass(frozen=True)
class ExportReport:
    """What :func:`export` wrote: ``record`` is the ``export.json`` of ``path``."""

    path: Path
    to: str
    record: dict[str, Any]
    seconds: float


@dataclass
class ExportCheck:
    """The outcome of :func:`verify_export`; ``ok`` when no problem was found."""

    path: Path
    to: str
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _check_kind(to: str) -> None:
    if to not in EXPORTS:
        raise OptionError(f"--to {to!r} is not an export: choose one of {', '.join(EXPORTS)}")


def export(
    out: str | os.PathLike[str], dest: str | os.PathLike[str], *, to: str, npy: bool = False
) -> ExportReport:
    """Export the pack at ``out`` to the new directory ``dest`` in the format ``to``
    (:data:`EXPORTS`). ``npy``: with ``megatron-bridge``, also write the older ``.npy``."""
    _check_kind(to)
    if npy and to != "megatron-bridge":
        raise OptionError("--npy is an option of --to megatron-bridge only")
    dest = local_export_dir(dest)
    started = time.perf_counter()
    reader = open_packed(out)
    with export_output(dest) as staging:
        if to == "megatron":
            record = export_megatron(reader, staging)
        else:
            record = export_bridge(reader, staging, npy=npy)
    return ExportReport(dest, to, record, time.perf_counter() - started)


def verify_export(out: str | os.PathLike[str], dest: str | os.PathLike[str]) -> ExportCheck:
    """Check the export at ``dest`` against the pack at ``out``: it was made from this pack,
    its files are whole (sizes, sha256), and its contents equal the pack's."""
    dest = local_export_dir(dest)
    reader = open_packed(out)
    record = read_export_manifest(dest)
    to = str(record.get("to"))
    if to not in EXPORTS:
        raise FormatError(f"{dest}: export.json names an unknown export {to!r}")
    check = ExportCheck(dest, to)
    if record.get("source", {}).get("shards_sha256") != pack_fingerprint(reader)["shards_sha256"]:
        check.problems.append(f"{dest} was exported from another pack than {out}")
        return check
    check.problems += file_problems(dest, record)
    if check.problems:
        return check
    problems = megatron_problems if to == "megatron" else bridge_problems
    check.problems += problems(reader, dest, record)
    return check
