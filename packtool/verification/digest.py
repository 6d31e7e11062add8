"""The token digest ``verify --against`` compares documents by: one 128-bit sum per
document, computed from the rows (in any order) and from the re-tokenized inputs alike."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Digests", "digest_terms", "group_sums"]

# -- the token digest -----------------------------------------------------------------------
#
# A document's digest is the sum (mod 2^64, two lanes) of splitmix64 of (position << 32 |
# token) over its tokens, position counted from the document's start. Sums do not depend on
# the order of the terms, so the chunks of a split document can be added as they come, from
# any rows, in any order; the position inside each term makes a token moved, swapped,
# missing, duplicated or changed change the digest (except with probability ~2^-64 per lane).

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_LANE_SEEDS = (np.uint64(0x243F6A8885A308D3), np.uint64(0x13198A2E03707344))


def _splitmix64(z: np.ndarray) -> np.ndarray:
    z = z + _GOLDEN
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return z


def digest_terms(tokens: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two lanes of each token's term (uint64 arrays like ``tokens``)."""
    key = (positions.astype(np.uint64) << np.uint64(32)) | tokens.astype(np.uint32).astype(
        np.uint64
    )
    return _splitmix64(key ^ _LANE_SEEDS[0]), _splitmix64(key ^ _LANE_SEEDS[1])


def group_sums(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sums (wrapping uint64) of ``values`` over the groups starting at ``starts`` (non-empty,
    increasing)."""
    if starts.size == 0:
        return np.zeros(0, np.uint64)
    return np.add.reduceat(values, starts)


@dataclass
class Digests:
    """Per-document digests and token counts computed from the rows (``against`` only)."""

    lane0: np.ndarray
    lane1: np.ndarray
    length: np.ndarray
    label0: np.ndarray | None = None  # the labels' digests (labelled pre-tokenized data)
    label1: np.ndarray | None = None
