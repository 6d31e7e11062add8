"""Mixtures: which documents of each source a pack takes, so that each source holds its share of
the output's tokens.

Each input of a pack is a source with a weight (``--mix 0.5,0.3,0.2``: shares of the output's
tokens, in input order) and the pack has a total (``--tokens 2G``; by default the most tokens that
need no document repeated). A source with more tokens than its share is sampled by whole
documents, in a seeded order; a smaller one is repeated by whole documents: every document as many
times as whole epochs fit, then a seeded sample for the rest. Either way the tokens taken are
within half a document of the target: the sample stops before or after the document that crosses
the target, whichever lands nearer.

The plan is made from each document's token count (what it puts into rows), so it is exact for
the tokens that are packed. Nothing here reads or tokenizes: :func:`plan_mixture` takes lengths and
gives indices.

>>> import numpy as np
>>> plan = plan_mixture([np.array([5, 5, 5, 5]), np.array([2, 2])], [0.5, 0.5], seed=0)
>>> [t.tokens_taken for t in plan], [t.epochs for t in plan]
([5, 4], [0.25, 1.0])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import OptionError

__all__ = [
    "SourceTake",
    "parse_mix",
    "parse_token_total",
    "pick_items",
    "plan_mixture",
    "source_documents",
    "take_source",
]

_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9, "t": 10**12}


def parse_mix(text: str, n_inputs: int) -> tuple[float, ...]:
    """``--mix W1,W2,...``: one positive weight per input, in input order (any scale: they are
    made shares). One-line errors for what is not that."""
    parts = [p.strip() for p in text.split(",")]
    weights = []
    for part in parts:
        try:
            w = float(part)
        except ValueError:
            raise OptionError(f"--mix: {part!r} is not a number (e.g. --mix 0.5,0.3,0.2)") from None
        if not math.isfinite(w) or w <= 0:
            raise OptionError(f"--mix: every weight must be a positive number, got {part!r}")
        weights.append(w)
    if len(weights) != n_inputs:
        raise OptionError(
            f"--mix gives {len(weights)} weight{'s' if len(weights) != 1 else ''} for "
            f"{n_inputs} input{'s' if n_inputs != 1 else ''}: give one per input, in order"
        )
    return tuple(weights)


def parse_token_total(text: str) -> int:
    """``--tokens N``: a count of tokens, with an optional decimal suffix (``500M``, ``2G`` or
    ``2B``: 2,000,000,000)."""
    s = text.strip().lower().replace("_", "").replace(",", "")
    scale = _SUFFIXES.get(s[-1:], 1)
    number = s[:-1] if scale != 1 else s
    try:
        value = float(number) * scale
    except ValueError:
        raise OptionError(
            f"--tokens: cannot read {text.strip()!r} as a number of tokens (e.g. 500M or 2G)"
        ) from None
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise OptionError(f"--tokens must be a whole number of tokens, at least 1; got {text!r}")
    return int(value)


@dataclass(frozen=True)
class SourceTake:
    """What a mixture takes of one source."""

    indices: np.ndarray  # the documents taken (index in the source, in reading order), repeats
    target: int  # the tokens its share asks for
    tokens_read: int  # tokens of all its documents
    tokens_taken: int  # tokens of the documents taken (within half a document of the target)
    documents_read: int

    @property
    def documents_taken(self) -> int:
        return int(self.indices.size)

    @property
    def epochs(self) -> float:
        """Tokens taken over tokens read: 1.0 is every document once; 2.5, two full epochs and
        a half."""
        return round(self.tokens_taken / self.tokens_read, 6) if self.tokens_read else 0.0


def plan_mixture(
    lengths: Sequence[np.ndarray],
    weights: Sequence[float],
    tokens: int | None = None,
    *,
    seed: int = 0,
    repeat: bool = True,
    names: Sequence[str] | None = None,
) -> list[SourceTake]:
    """The documents each source gives so that source ``i`` holds ``weights[i] / sum`` of
    ``tokens`` (default: the most tokens no source needs repeated for). ``lengths[i]``: the
    tokens each document of source ``i`` puts into rows. ``repeat=False``: a source that
    cannot reach its share without repeating documents is an error naming it."""
    if len(lengths) != len(weights):
        raise OptionError(f"{len(weights)} weights for {len(lengths)} sources")
    names = list(names) if names is not None else [f"source {i}" for i in range(len(lengths))]
    sizes = [np.asarray(x, dtype=np.int64) for x in lengths]
    totals = [int(x.sum()) for x in sizes]
    shares = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
    for name, total in zip(names, totals, strict=True):
        if total == 0:
            raise OptionError(f"{name}: no tokens to mix (every document is empty or dropped)")
    if tokens is None:
        tokens = int(min(t / s for t, s in zip(totals, shares, strict=True)))
    targets = [round(tokens * s) for s in shares]
    out = []
    for i, (x, total, target) in enumerate(zip(sizes, totals, targets, strict=True)):
        if target > total and not repeat:
            raise OptionError(
                f"{names[i]}: its share of --tokens {tokens:,} is {target:,} tokens, but it "
                f"holds {total:,}: lower --tokens, or allow repeating documents (drop --no-repeat)"
            )
        indices = take_source(x, target, seed=seed, index=i)
        taken = int(x[indices].sum())
        out.append(SourceTake(indices, target, total, taken, int(x.size)))
    return out


def source_documents(
    doc_id: np.ndarray, length: np.ndarray, ranges: Sequence[tuple[int, int]]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each source's documents with items and the tokens each puts into rows: ``doc_id`` and
    ``length`` are the items' (sorted by document, a document's items together), ``ranges``
    each source's document numbers ``[first, end)``. Returns (ids, tokens) per source: what
    :func:`plan_mixture` plans on, and what its indices index."""
    ids_of, lengths_of = [], []
    for first, end in ranges:
        lo, hi = np.searchsorted(doc_id, [first, end], side="left")
        ids, starts = np.unique(doc_id[lo:hi], return_index=True)
        per_doc = np.add.reduceat(length[lo:hi].astype(np.int64), starts) if ids.size else ids
        ids_of.append(ids)
        lengths_of.append(np.asarray(per_doc, dtype=np.int64))
    return ids_of, lengths_of


def pick_items(
    doc_id: np.ndarray, taken: Sequence[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The items of the documents each source gives (``taken``: per source, the document
    numbers taken, repeats kept), in the order a mixture packs them: source by source,
    document by document (its copies together), item by item. Returns (the index of each
    item in ``doc_id``, sorted by document; its copy number: 0 for the first; its source)."""
    picked, copies, source = [], [], []
    for index, t in enumerate(taken):
        t = np.sort(t, kind="stable")
        copy = np.arange(t.size) - np.searchsorted(t, t, side="left")
        lo = np.searchsorted(doc_id, t, side="left")
        hi = np.searchsorted(doc_id, t, side="right")
        n = hi - lo
        at = np.repeat(lo - np.concatenate([[0], np.cumsum(n)[:-1]]), n) + np.arange(n.sum())
        picked.append(at)
        copies.append(np.repeat(copy, n))
        source.append(np.full(at.size, index, np.int64))
    if not picked:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    return (
        np.concatenate(picked).astype(np.int64),
        np.concatenate(copies).astype(np.int64),
        np.concatenate(source),
    )


def take_source(lengths: np.ndarray, target: int, *, seed: int, index: int) -> np.ndarray:
    """The documents (indices into ``lengths``, sorted, repeats kept) that source ``index`` of
    a mixture seeded ``seed`` gives for ``target`` tokens: what :func:`plan_mixture` takes
    of it (``verify --against`` plans a source again from its re-read documents)."""
    x = np.asarray(lengths, dtype=np.int64)
    if int(x.sum()) == 0:  # nothing to take (plan_mixture refuses such a source)
        return np.zeros(0, np.int64)
    return _take(x, int(x.sum()), target, np.random.SeedSequence([seed, index, 0x4D1C]))


def _take(lengths: np.ndarray, total: int, target: int, seq: np.random.SeedSequence) -> np.ndarray:
    """Whole epochs of every document, then a seeded sample whose tokens land nearest the
    rest of ``target``; the indices sorted (reading order), repeats kept."""
    epochs, rest = divmod(target, total)
    full = np.tile(np.arange(lengths.size, dtype=np.int64), epochs)
    rng = np.random.Generator(np.random.PCG64(seq.spawn(epochs + 1)[-1]))
    order = rng.permutation(lengths.size)
    prefix = np.concatenate([[0], np.cumsum(lengths[order])])
    k = int(np.searchsorted(prefix, rest, side="left"))  # the first prefix reaching the rest
    if k > 0 and rest - prefix[k - 1] <= prefix[k] - rest:
        k -= 1  # stopping before the document that crosses the rest lands as near, or nearer
    sample = order[:k]
    return np.sort(np.concatenate([full, sample.astype(np.int64)]), kind="stable")
