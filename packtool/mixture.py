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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputError, OptionError
from .fs import is_url

__all__ = [
    "MixtureMeasure",
    "Source",
    "SourceTake",
    "UnitMixture",
    "join_mixture",
    "parse_mix",
    "parse_token_total",
    "pick_items",
    "plan_mixture",
    "plan_unit_mixtures",
    "refuse_shared_files",
    "resolve_sources",
    "source_documents",
    "take_source",
]

MAX_DOCUMENTS_TAKEN = (1 << 31) - 1
"""The most documents (copies counted) a mixture's plan takes: each is an index of the plan
and a segment of the rows, so a ``--tokens`` far beyond its sources (``1e30``, or a small
source repeated billions of times) is one line, not an allocation that fails."""

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
    if not math.isfinite(sum(weights)):  # each finite, their sum not: no share is
        raise OptionError(
            f"--mix {text.strip()}: the weights add up to more than a float holds; give "
            "them on a smaller scale (e.g. shares: 0.5,0.3,0.2)"
        )
    if len(weights) != n_inputs:
        raise OptionError(
            f"--mix gives {len(weights)} weight{'s' if len(weights) != 1 else ''} for "
            f"{n_inputs} input{'s' if n_inputs != 1 else ''}: give one per input, in order"
        )
    return tuple(weights)


def resolve_sources(
    inputs: Sequence[Any], mix: str, resolve: Callable[[Any], Sequence[Any]]
) -> tuple[list[Any], list[Source]]:
    """``--mix``: each input argument a source, weighted by ``mix`` (checked first), its files
    ``resolve(argument)`` (as ``pack`` resolves its inputs). Returns the files (source by
    source, in order) and the sources, each with its slice of those files; a file in two
    sources is refused."""
    weights = parse_mix(mix, len(inputs))
    files: list[Any] = []
    sources, groups = [], []
    for spec, weight in zip(inputs, weights, strict=True):
        found = resolve(spec)
        sources.append(Source(str(spec), weight, len(files), len(files) + len(found)))
        files.extend(found)
        groups.append(found)
    refuse_shared_files(inputs, groups)
    return files, sources


def refuse_shared_files(specs: Sequence[Any], groups: Sequence[Sequence[Any]]) -> None:
    """A file in two sources of a mixture (the same input given twice, a glob and a file it
    matches) is refused in one line, as a file named twice is without ``--mix``: its
    documents would be sampled for each source, as if they were two. ``groups``: each
    source's files (``.path``), in source order."""
    seen: dict[str, int] = {}
    for i, group in enumerate(groups):
        for f in group:
            key = str(f.path) if is_url(f.path) else str(Path(f.path).resolve())
            j = seen.setdefault(key, i)
            if j != i:
                raise InputError(
                    f"{f.path}: in source {j} ({specs[j]}) and source {i} ({specs[i]}) of "
                    "--mix: its documents would be sampled for both: name each file in one "
                    "source (to give it more of the tokens, raise its weight)"
                )


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
    shares = [float(w) / float(sum(weights)) for w in weights]  # a tiny one: t / s is inf
    for name, total in zip(names, totals, strict=True):
        if total == 0:
            raise OptionError(f"{name}: no tokens to mix (every document is empty or dropped)")
    if tokens is None:
        tokens = int(min(t / s for t, s in zip(totals, shares, strict=True)))
    targets = [round(tokens * s) for s in shares]
    taken = sum(t * x.size // n for x, n, t in zip(sizes, totals, targets, strict=True))  # about
    if taken > MAX_DOCUMENTS_TAKEN:  # each a segment of the rows, and an index here first
        i = max(range(len(sizes)), key=lambda k: targets[k] // totals[k])
        raise OptionError(
            f"--tokens {tokens:,}: {names[i]} would be repeated {targets[i] // totals[i]:,} "
            f"times ({targets[i]:,} tokens of its {totals[i]:,}), about {taken:,} documents "
            f"in the rows, more than the {MAX_DOCUMENTS_TAKEN:,} a mixture takes: lower --tokens"
        )
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
    if not any(t.indices.size for t in out):  # rows of nothing: not an output
        shortest = min(int(x[x > 0].min()) for x in sizes)
        raise OptionError(
            f"--tokens {tokens:,}: the mixture takes no document (each source's share is "
            f"nearer to none than to its documents; the shortest has {shortest:,} tokens): "
            "raise --tokens"
        )
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


# -- a mixture over work units (``pack --mix ... --units N``) ------------------------------


@dataclass(frozen=True)
class Source:
    """One source of a mixture: an INPUT argument, its weight, and its files
    (``files[first_file:end_file]`` of the run, or the pieces of a work unit)."""

    path: str
    weight: float
    first_file: int
    end_file: int


@dataclass(frozen=True)
class MixtureMeasure:
    """What a work unit read of each source, measured before the mixture is planned: the
    documents with tokens (``ids``, the unit's own doc ids, ascending) and the tokens each
    puts into rows (``lengths``), the unit's doc-id range of each source (``first``,
    ``end``), and the documents the unit read (all sources)."""

    index: int
    ids: tuple[np.ndarray, ...]
    lengths: tuple[np.ndarray, ...]
    first: tuple[int, ...]
    end: tuple[int, ...]
    documents_read: int
    pid: int = 0
    host: str = ""
    packtool_version: str = ""


@dataclass(frozen=True)
class UnitMixture:
    """A work unit's part of a mixture: its sources (over the unit's pieces), and, once the
    plan over every unit is made (:func:`plan_unit_mixtures`), the documents it takes of
    each (``taken``: its own doc ids, ascending, a document repeated as often as it is taken;
    ``None``: not planned yet, the unit is measured). ``stride``, ``targets`` and ``files``
    are the whole mixture's (``files``: the source's files that start in this unit, so that
    the units' counts add up to the source's)."""

    sources: tuple[Source, ...]
    taken: tuple[np.ndarray, ...] | None = None
    stride: int = 0
    targets: tuple[int, ...] = ()
    files: tuple[int, ...] = ()
    keep_tokens: bool = True  # measured: keep the tokens for the unit's pack (not if finished)


def plan_unit_mixtures(
    measures: Sequence[MixtureMeasure],
    parts: Sequence[UnitMixture],
    *,
    tokens: int | None,
    seed: int,
    repeat: bool,
) -> list[UnitMixture]:
    """The plan of a mixture over work units: :func:`plan_mixture` over every unit's
    documents laid end to end (unit 0's, then unit 1's...; the numbering a single ``pack``
    gives them), so it is the plan one run makes, whatever the units; then each unit's part
    of it, in its own doc ids. ``parts``: each unit's sources (not planned yet)."""
    sources = parts[0].sources
    bases = np.concatenate([[0], np.cumsum([m.documents_read for m in measures])])
    lengths, ids = [], []
    for i in range(len(sources)):
        lengths.append(np.concatenate([m.lengths[i] for m in measures] or [np.zeros(0, np.int64)]))
        ids.append(
            np.concatenate(
                [m.ids[i].astype(np.int64) + bases[u] for u, m in enumerate(measures)]
                or [np.zeros(0, np.int64)]
            )
        )
    plan = plan_mixture(
        lengths, [s.weight for s in sources], tokens, seed=seed, repeat=repeat,
        names=[s.path for s in sources],
    )  # fmt: skip
    taken = [np.sort(ids[i][take.indices], kind="stable") for i, take in enumerate(plan)]
    stride = int(max(1, bases[-1]))
    out = []
    for u, part in enumerate(parts):
        lo, hi = int(bases[u]), int(bases[u + 1])
        mine = []
        for t in taken:
            a, b = np.searchsorted(t, [lo, hi], side="left")
            mine.append(t[a:b] - lo)
        targets = tuple(take.target for take in plan)
        out.append(UnitMixture(part.sources, tuple(mine), stride, targets, part.files))
    return out


_SUMMED = ("documents_read", "documents_packable", "tokens_read", "documents_taken", "tokens_taken")
_SAME = ("index", "path", "weight", "share", "target_tokens")


def join_mixture(records: Sequence[dict], first_docs: Sequence[int]) -> dict:
    """The ``mixture`` record of a merge: the units' records (each unit's figures, its doc
    ids its own; ``first_docs``: where each unit's documents start) summed per source, as
    one ``pack --mix`` of the whole corpus records them. Units of another mixture (other
    sources, weights, targets, doc-id stride) are an :class:`OptionError`."""
    first = records[0]
    for u, r in enumerate(records):
        same = (r["doc_id_stride"], r["repeat"], [[s[k] for k in _SAME] for s in r["sources"]])
        if same != (
            first["doc_id_stride"], first["repeat"],
            [[s[k] for k in _SAME] for s in first["sources"]],
        ):  # fmt: skip
            raise OptionError(
                f"unit {u} was packed from another mixture than unit 0 (other sources, weights "
                "or --tokens): pack the units again with one command (--overwrite)"
            )
    sources = []
    for i, src in enumerate(first["sources"]):
        mine = [r["sources"][i] for r in records]
        summed = {k: int(sum(s[k] for s in mine)) for k in _SUMMED}
        starts = [
            b + s["first_doc"] for b, s in zip(first_docs, mine, strict=True) if s["documents_read"]
        ]
        read, taken = summed["tokens_read"], summed["tokens_taken"]
        sources.append(
            {
                "index": src["index"],
                "path": src["path"],
                "weight": src["weight"],
                "share": src["share"],
                "files": int(sum(s["files"] for s in mine)),
                "first_doc": int(min(starts)) if starts else 0,
                "documents_read": summed["documents_read"],
                "documents_packable": summed["documents_packable"],
                "tokens_read": read,
                "target_tokens": src["target_tokens"],
                "documents_taken": summed["documents_taken"],
                "tokens_taken": taken,
                "epochs": round(taken / read, 6) if read else 0.0,
            }
        )
    learned = [r.get("learned_tokens") for r in records]
    return {
        "doc_id_stride": first["doc_id_stride"],
        "copies": int(max(r["copies"] for r in records)),
        "tokens": int(sum(r["tokens"] for r in records)),
        **({"learned_tokens": int(sum(learned))} if None not in learned else {}),
        "repeat": first["repeat"],
        "sources": sources,
    }
