"""The bounds of packtool's numeric options, and the one check that enforces them.

``max_len`` is bounded by the format and by memory: a row is stored as int32 (ids,
positions, ``cu_seqlens``, ``num_tokens``) and gathered whole, 8 to 12 bytes a token, so a
row of the largest ``max_len`` takes 192 MB. The others are bounded where a larger value is
never meant and would exhaust the machine (a thread or a work unit each).
"""

from __future__ import annotations

import numbers
import os
from typing import Any

from .errors import OptionError

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_LEN_LIMIT",
    "MAX_NUM_PROC",
    "MAX_RECORD_BYTES",
    "MAX_ROWS_PER_SHARD",
    "MAX_SEED",
    "MAX_UNITS",
    "check_int",
    "max_record_bytes",
    "read_token_count",
]

MAX_LEN_LIMIT = 1 << 24  # 16,777,216 tokens a row
MAX_NUM_PROC = 1024  # tokenizer threads
MAX_UNITS = 100_000  # work units
MAX_ROWS_PER_SHARD = (1 << 31) - 1  # rows of one shard (int32 offsets of its lists)
MAX_BATCH_SIZE = 1 << 20  # the padded baselines' batch size (stats)
MAX_SEED = (1 << 63) - 1  # NumPy seeds: non-negative

MAX_RECORD_BYTES = 1 << 28
"""The longest record a reader takes, in bytes (256 MiB): a JSON Lines line, a JSON array
element, a CSV row, a ``.txt`` line, paragraph or document. A longer one is an
:class:`~packtool.errors.InputError` naming the file and line, not an allocation: a line
without a line end (a compressed file of zeros) would otherwise be read whole. The environment
variable ``PACKTOOL_MAX_RECORD_BYTES`` (a number of bytes) sets another limit."""

_MAX_RECORD_ENV = "PACKTOOL_MAX_RECORD_BYTES"


def max_record_bytes() -> int:
    """The longest record a reader takes: ``PACKTOOL_MAX_RECORD_BYTES`` if set, else
    :data:`MAX_RECORD_BYTES`."""
    text = os.environ.get(_MAX_RECORD_ENV, "").strip()
    if not text:
        return MAX_RECORD_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise OptionError(f"{_MAX_RECORD_ENV} must be a positive number of bytes, got {text!r}")
    return value


def record_too_long(where: str, limit: int, what: str = "line") -> str:
    """The message of a record over :func:`max_record_bytes`, at ``where`` (``file:line``)."""
    article = "an" if what[0] in "aeiou" else "a"
    return (
        f"{where}: {article} {what} longer than {limit:,} bytes, packtool's maximum record size "
        f"(a file without line ends?); set {_MAX_RECORD_ENV} to read longer records"
    )


def check_int(flag: str, value: Any, low: int, high: int) -> int:
    """``value`` as an int if it is an integer in ``[low, high]``, else an
    :class:`~packtool.errors.OptionError` naming ``flag`` and the bounds."""
    ok = not isinstance(value, bool) and isinstance(value, numbers.Integral)  # NumPy's too
    if not ok or not low <= value <= high:
        raise OptionError(f"{flag} must be an integer from {low:,} to {high:,}, got {value!r}")
    return int(value)


def read_token_count(flag: str, text: str) -> int:
    """A count of tokens as written on a command line: ``4096`` or ``4k`` (4,096); bounds are
    checked where the option is (:func:`check_int`)."""
    s = text.strip().lower()
    try:
        return int(s[:-1]) * 1024 if s.endswith("k") else int(s)
    except ValueError:
        raise OptionError(
            f"{flag}: cannot read {text.strip()!r} as a number of tokens (e.g. 4096 or 4k)"
        ) from None
