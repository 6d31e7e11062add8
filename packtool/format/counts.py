"""What a pack (or a merge) records of its run: the :class:`~packtool.counts.Counts` of its
documents (re-exported here, for the manifest) and the figures of the rows
(:meth:`Manifest.for_pack`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..counts import Counts, DocumentCounts, LabelFigures, TokenCounts

__all__ = ["Counts", "DocumentCounts", "LabelFigures", "RunFigures", "TokenCounts"]


@dataclass(frozen=True)
class RunFigures:
    """What a pack (or a merge) counted: the figures of its manifest."""

    counts: Counts
    segments: int
    rows: int
    lower_bound_rows: int
    max_len: int
    bad_records: list[Any]
    special_strings: int  # documents that held special-token strings
    parse_special: bool
    seconds: float
    segment_lengths: np.ndarray | None = None  # every segment's length (any order)
