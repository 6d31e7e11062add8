"""The bounds of packtool's numeric options, and the one check that enforces them.

``max_len`` is bounded by the format and by memory: a row is stored as int32 (ids,
positions, ``cu_seqlens``, ``num_tokens``) and gathered whole, 8 to 12 bytes a token, so a
row of the largest ``max_len`` takes 192 MB. The others are bounded where a larger value is
never meant and would exhaust the machine (a thread or a work unit each).
"""

from __future__ import annotations

import numbers
from typing import Any

from .errors import OptionError

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_LEN_LIMIT",
    "MAX_NUM_PROC",
    "MAX_ROWS_PER_SHARD",
    "MAX_SEED",
    "MAX_UNITS",
    "check_int",
    "read_token_count",
]

MAX_LEN_LIMIT = 1 << 24  # 16,777,216 tokens a row
MAX_NUM_PROC = 1024  # tokenizer threads
MAX_UNITS = 100_000  # work units
MAX_ROWS_PER_SHARD = (1 << 31) - 1  # rows of one shard (int32 offsets of its lists)
MAX_BATCH_SIZE = 1 << 20  # the padded baselines' batch size (stats)
MAX_SEED = (1 << 63) - 1  # NumPy seeds: non-negative


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
