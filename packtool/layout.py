"""How finished rows are laid out: the order they are stored in and the shards that hold them.

A :class:`Layout` never changes which rows a pack makes (which documents share a row), only
where each row lands: ``pack`` orders and shards its rows with it (its plan and write
stages), a copying merge orders and shards the units' rows with it, and the engines record
it for the merge. The rows a shard holds are computed by :meth:`Layout.shard_rows` alone::

    Layout(shard_size="256MB").shard_rows(row_bytes=98_432)   # 2,727 rows a shard
    Layout(rows_per_shard=500).shard_rows(row_bytes=98_432)   # 500, whatever their size

The manifest records the layout as options of the pack (``PackOptions.describe``).

>>> Layout(seed=3, world_size=8).shard_rows(row_bytes=1 << 20)
256
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import OptionError
from .limits import MAX_ROWS_PER_SHARD, MAX_SEED, check_int

__all__ = ["DEFAULT_SHARD_SIZE", "Layout", "parse_size"]

DEFAULT_SHARD_SIZE = "256MB"
MAX_WORLD_SIZE = 1 << 20  # data-parallel ranks
MAX_MICRO_BATCHES = 1 << 16  # rows a rank reads per step


def parse_size(size: str | int) -> int:
    """Bytes in ``size``: an integer, or a text such as ``256MB``, ``1.5GB``, ``64KiB``."""
    if isinstance(size, bool):
        raise OptionError(f"--shard-size: cannot read {size!r} as a size (e.g. 256MB)")
    if isinstance(size, int):
        value = size
    else:
        text = str(size).strip().upper().replace("IB", "B")
        units = (("KB", 1 << 10), ("MB", 1 << 20), ("GB", 1 << 30), ("B", 1))
        number, factor = text, 1
        for unit, unit_factor in units:
            if text.endswith(unit):
                number, factor = text[: -len(unit)].strip(), unit_factor
                break
        try:
            value = int(float(number) * factor)
        except (ValueError, OverflowError):
            raise OptionError(
                f"--shard-size: cannot read {size!r} as a size (e.g. 256MB)"
            ) from None
    if value <= 0:
        raise OptionError(f"--shard-size must be positive, got {size!r}")
    return value


@dataclass(frozen=True)
class Layout:
    """The order and the shards of finished rows, checked as ``pack`` checks its flags.

    ``shuffle`` with ``seed``: the seeded row shuffle; ``world_size`` (with
    ``micro_batches`` rows a rank reads per step): balanced steps across that many
    data-parallel ranks instead. ``rows_per_shard``, when given, is the rows of every shard;
    else a shard holds as many rows as fit in ``shard_size`` (at least one).
    """

    shuffle: bool = True
    seed: int = 0
    world_size: int | None = None
    micro_batches: int = 1
    rows_per_shard: int | None = None
    shard_size: str | int = DEFAULT_SHARD_SIZE

    def __post_init__(self) -> None:
        if self.rows_per_shard is not None:
            check_int("--rows-per-shard", self.rows_per_shard, 1, MAX_ROWS_PER_SHARD)
        parse_size(self.shard_size)
        check_int("--seed", self.seed, 0, MAX_SEED)
        if self.world_size is not None:
            check_int("--world-size", self.world_size, 1, MAX_WORLD_SIZE)
            if not self.shuffle:
                raise OptionError(
                    "--world-size stores the rows as balanced steps in a seeded random order; "
                    "leave out --no-shuffle (or --world-size)"
                )
        check_int("--micro-batches", self.micro_batches, 1, MAX_MICRO_BATCHES)
        if self.micro_batches != 1 and self.world_size is None:
            raise OptionError("--micro-batches balances steps across ranks: give --world-size W")

    @property
    def shard_bytes(self) -> int:
        return parse_size(self.shard_size)

    def shard_rows(self, row_bytes: int) -> int:
        """The rows of each shard, for rows of ``row_bytes`` bytes
        (:func:`packtool.format.row_bytes`): ``rows_per_shard`` if given, else as many as
        ``shard_size`` holds, at least one."""
        return self.rows_per_shard or max(1, self.shard_bytes // row_bytes)
