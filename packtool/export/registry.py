"""The one table of exports: each ``--to`` name, what it is, and the module of its exporter.

The table is plain data, so that the command line can list the exports (``--to``'s help)
without loading one: :func:`exporter` imports an export's module when it is used. A new
export is a module with its :class:`Exporter` (``EXPORTER``) and one line in
:data:`EXPORTS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..errors import OptionError

if TYPE_CHECKING:
    from ..format import PackedReader


class Exporter(Protocol):
    """One export format: ``name`` (its ``--to``), the export options it accepts
    (``options``: ``npy``), what it writes into a staging directory (returning the record of
    ``export.json``), and what differs between such a directory and the pack."""

    name: str
    options: frozenset[str]
    sources: bool  # it carries a mixture's per-segment source ids (else a notice says so)

    def write(self, reader: PackedReader, staging: Path, **options: Any) -> dict[str, Any]:
        """Write the export of ``reader`` into ``staging``; the record for ``export.json``."""
        ...

    def problems(self, reader: PackedReader, dest: Path, record: dict[str, Any]) -> list[str]:
        """Differences between the export at ``dest`` (its ``export.json``: ``record``) and
        the pack, after its files' sizes and sha256 were found whole."""
        ...


class PlainExporter(NamedTuple):
    """An export with no options of its own: its ``name`` and its two functions,
    ``write(reader, staging)`` and ``problems(reader, dest, record)``, as :class:`Exporter`
    asks for them; ``sources``: it carries a mixture's source ids."""

    name: str
    write_to: Callable[[PackedReader, Path], dict[str, Any]]
    problems_of: Callable[[PackedReader, Path, dict[str, Any]], list[str]]
    options: frozenset[str] = frozenset()
    sources: bool = False

    def write(self, reader: PackedReader, staging: Path, **options: Any) -> dict[str, Any]:
        return self.write_to(reader, staging)

    def problems(self, reader: PackedReader, dest: Path, record: dict[str, Any]) -> list[str]:
        return self.problems_of(reader, dest, record)


class Export(NamedTuple):
    """A line of the table: the ``--to`` name, what it writes (for ``--help``), the module
    whose ``EXPORTER`` writes and checks it (relative: in :mod:`packtool.export`)."""

    name: str
    summary: str
    module: str


EXPORTS: tuple[Export, ...] = (
    Export("megatron", "a Megatron-LM .bin/.idx indexed dataset", ".megatron"),
    Export(
        "megatron-bridge",
        "NeMo / Megatron-Bridge packed-SFT .idx.parquet + metadata",
        ".bridge",
    ),
    Export("litdata", "LitData's optimized format, read by litdata.StreamingDataset", ".litdata"),
)


def names() -> list[str]:
    """The ``--to`` names, in the table's order."""
    return [e.name for e in EXPORTS]


def choices_help() -> str:
    """The exports as ``--to``'s help lists them."""
    listed = " or ".join(f"{e.name} ({e.summary})" for e in EXPORTS)
    return f"The format: {listed}."


def exporter(name: str) -> Exporter:
    """The exporter of ``--to name`` (its module imported now)."""
    for e in EXPORTS:
        if e.name == name:
            found: Exporter = importlib.import_module(e.module, __package__).EXPORTER
            return found
    raise OptionError(f"--to {name!r} is not an export: choose one of {', '.join(names())}")


def check_options(chosen: Exporter, **options: Any) -> None:
    """An export option given (true) that ``chosen`` does not accept is an error naming the
    exports that do."""
    for option, value in options.items():
        if value and option not in chosen.options:
            takers = [e.name for e in EXPORTS if option in exporter(e.name).options]
            raise OptionError(f"--{option} is an option of --to {', '.join(takers)} only")
