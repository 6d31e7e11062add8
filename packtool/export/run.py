"""Run an export, and check one against its pack: both through the table of exports
(:mod:`.registry`)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import FormatError
from ..format import open_packed
from .common import (
    export_output,
    file_problems,
    local_export_dir,
    pack_fingerprint,
    read_export_manifest,
)
from .registry import check_options, exporter, names


@dataclass(frozen=True)
class ExportReport:
    """What :func:`export` wrote: ``record`` is the ``export.json`` of ``path``."""

    path: Path
    to: str
    record: dict[str, Any]
    seconds: float
    notices: list[str] = field(default_factory=list)  # e.g. what the format leaves out


@dataclass
class ExportCheck:
    """The outcome of :func:`verify_export`; ``ok`` when no problem was found."""

    path: Path
    to: str
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def export(
    out: str | os.PathLike[str], dest: str | os.PathLike[str], *, to: str, npy: bool = False
) -> ExportReport:
    """Export the pack at ``out`` to the new directory ``dest`` in the format ``to`` (a name
    of :data:`~.registry.EXPORTS`). ``npy``: with ``megatron-bridge``, also write the older
    ``.npy``."""
    chosen = exporter(to)
    options = {"npy": npy}
    check_options(chosen, **options)
    dest = local_export_dir(dest)
    started = time.perf_counter()
    reader = open_packed(out)
    with export_output(dest) as staging:
        record = chosen.write(reader, staging, **{k: v for k, v in options.items() if v})
    notices = []
    if reader.has_sources and not chosen.sources:
        notices.append(SOURCES_LEFT_OUT.format(to=to))
    return ExportReport(dest, to, record, time.perf_counter() - started, notices)


SOURCES_LEFT_OUT = (
    "the pack is a mixture (pack --mix), but --to {to} has no place for its source ids: they "
    "are left out (the sources stay in the pack and its manifest; docs/export.md)"
)


def verify_export(out: str | os.PathLike[str], dest: str | os.PathLike[str]) -> ExportCheck:
    """Check the export at ``dest`` against the pack at ``out``: it was made from this pack,
    its files are whole (sizes, sha256), and its contents equal the pack's."""
    dest = local_export_dir(dest)
    reader = open_packed(out, strict=False)  # verify lists what is wrong in its record
    record = read_export_manifest(dest)
    to = record.to
    if to not in names():
        raise FormatError(f"{dest}: export.json names an unknown export {to!r}")
    check = ExportCheck(dest, to)
    if record.source.shards_sha256 != pack_fingerprint(reader)["shards_sha256"]:
        check.problems.append(f"{dest} was exported from another pack than {out}")
        return check
    check.problems += file_problems(dest, record)
    if check.problems:
        return check
    check.problems += exporter(to).problems(reader, dest, record.record)
    return check
