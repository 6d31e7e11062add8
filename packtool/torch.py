"""The training side: packed rows as PyTorch batches, and the attention inputs built from them.

Install with ``pip install 'packtool[torch]'``. ``import packtool`` never imports torch; this
module does, and raises an ImportError with the install line when torch is missing.

Two rows of ``max_len`` 8 (``P`` = padding, ``-`` = -100)::

    row 0: documents a (3 tokens), b (3), then 2 pad      row 1: documents c (5), d (3)
    input_ids     a0 a1 a2 b0 b1 b2 P  P                   c0 c1 c2 c3 c4 d0 d1 d2
    position_ids  0  1  2  0  1  2  0  1                   0  1  2  3  4  0  1  2
    cu_seqlens    [0, 3, 6, 8]                             [0, 5, 8]
    labels        -  a1 a2 -  b1 b2 -  -                   -  c1 c2 c3 c4 -  d1 d2

:func:`collate` turns them into one batch::

    input_ids, position_ids, labels   [2, 8] int64
    cu_seq_lens_q = cu_seq_lens_k     [0, 3, 6, 8, 13, 16]   int32, over the flattened batch
    max_length_q = max_length_k       5                      the longest segment
    num_learned_tokens                10                     labels[:, 1:] != -100

and :func:`block_causal_mask` / :func:`flex_block_mask` build the attention masks from
``cu_seq_lens_q``, through :mod:`packtool.masks` (the one definition, also drawn by
``packtool inspect``). See ``docs/training.md`` for the traps this avoids.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

try:
    import torch
    from torch.utils.data import Dataset
except ImportError as e:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "packtool.torch needs PyTorch: pip install 'packtool[torch]'. On a machine without a "
        "GPU, install a CPU build of torch first (pip install torch --index-url "
        "https://download.pytorch.org/whl/cpu), or pip pulls the multi-GB CUDA build."
    ) from e

from packtool.errors import OptionError
from packtool.format import (
    IGNORE_INDEX,
    PackedReader,
    Per,
    SourceRecord,
    column_names,
    open_packed,
)
from packtool.masks import batch_block_causal_mask, document_ids
from packtool.order import (
    balanced_epoch_order,
    balanced_layout,
    balanced_share,
    epoch_order,
    rank_share,
)

__all__ = [
    "IGNORE_INDEX",
    "PackedDataset",
    "block_causal_mask",
    "collate",
    "flex_block_mask",
    "learned_labels",
    "real_tokens",
]


class PackedDataset(Dataset):
    """A map-style dataset over a packed output: one packed row per item, memory-mapped.

    >>> ds = PackedDataset("out/")          # packtool pack sample_data/corpus.jsonl -L 4096
    >>> len(ds), ds.max_len
    (296, 4096)
    >>> item = ds[0]
    >>> item["input_ids"].shape, item["num_tokens"]
    (torch.Size([4096]), 4095)
    >>> item["cu_seqlens"].tolist()             # 9 documents, then 1 pad token
    [0, 480, 958, 1436, 1912, 2388, 2863, 3338, 3813, 4095, 4096]

    Each item is a dict: ``input_ids`` and ``position_ids`` (int64, ``[max_len]``),
    ``cu_seqlens`` (int32, the row's segment boundaries, padding tail included), ``num_tokens``
    (int, real tokens; the padding segment is ``[num_tokens, max_len)``), ``row`` (int, the row's
    number in the whole output) and ``labels`` (int64, ``[max_len]``: :func:`learned_labels`,
    the row's ``input_ids`` or its stored ``labels`` column, -100 on padding and document starts);
    a row of an aligned pack (``--pad-to-multiple-of``) also has ``cu_seqlens_unpadded`` (int32,
    the real boundaries) and ``labels`` -100 on every alignment pad.
    Batch items with :func:`collate`. ``input_ids``, ``position_ids`` and ``labels`` are enough
    for it, so the rows survive Hugging Face Trainer's default ``remove_unused_columns=True``,
    which drops every key the model's ``forward`` does not name.

    **Data parallel.** With ``world_size`` > 1, rank ``rank`` gets a contiguous block of
    ``num_rows // world_size`` rows: rows ``[rank * n, (rank + 1) * n)``. The shards are thus split
    between the ranks in order, each rank opening only the shards that hold its block (whole
    shards when the shard sizes divide evenly; a shard on a boundary is shared by two ranks).
    Every rank gets the same number of rows, which distributed training needs (a rank that runs
    out of batches first leaves the others waiting in a collective): the last
    ``num_rows % world_size`` rows (fewer than ``world_size``) are left out. This also works when
    there are fewer shards than ranks. Do not add a ``DistributedSampler`` (it would split the
    rank's share once more).

    >>> [len(PackedDataset("out/", rank=r, world_size=4)) for r in range(4)]  # 296 rows
    [74, 74, 74, 74]
    >>> [len(PackedDataset("out/", rank=r, world_size=5)) for r in range(5)]  # 1 left out
    [59, 59, 59, 59, 59]

    **Balanced steps.** An output packed with ``--world-size W --micro-batches G`` is stored
    step-major (docs/balance.md): opened with ``world_size=W``, rank ``r`` reads rows
    ``s*W*G + r*G + g``, so the ``G`` rows every rank reads at step ``s`` have nearly the same
    attention cost on all ranks; :attr:`micro_batches` is then ``G``. With another
    ``world_size`` (> 1) it warns and reads the plain split above.

    **Epochs.** :meth:`set_epoch` reshuffles all the rows globally, the same way on every rank
    (from ``seed`` and the epoch), each rank taking its share; a rank then sees other rows every
    epoch. :meth:`state_dict` / :meth:`load_state_dict` make it resumable mid-epoch with
    torchdata's ``StatefulDataLoader``::

        ds = PackedDataset("out/", rank=rank, world_size=world_size, seed=0)
        loader = StatefulDataLoader(ds, batch_size=8, collate_fn=collate)   # shuffle=False
        for epoch in range(start_epoch, epochs):
            ds.set_epoch(epoch)
            for batch in loader: ...            # checkpoint loader.state_dict() with the model

    **Object stores.** ``path`` may be a URL (``s3://bucket/out``). Give ``cache_dir`` (a
    local directory) to keep each shard there once fetched (checked against its sha256), so
    a shuffled epoch reads each shard from the store once; without it one shard is held in
    memory at a time and a random order fetches shards again and again.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(world_size, int) or world_size < 1:
            raise OptionError(f"world_size must be an integer >= 1, got {world_size!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise OptionError(f"rank must be in [0, {world_size - 1}], got {rank!r}")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise OptionError(f"seed must be an integer >= 0, got {seed!r}")
        self.path = path
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.cache_dir = cache_dir
        self._reader: PackedReader | None = open_packed(path, cache_dir=cache_dir)
        reader = self._reader
        self.max_len: int = reader.max_len
        self.has_labels: bool = reader.has_labels
        mixture = reader.manifest.mixture if reader.has_sources else None
        self.sources: tuple[SourceRecord, ...] | None = mixture.sources if mixture else None
        """A mixture's sources (``pack --mix``), by ``source_ids``: each one's ``index``,
        ``path``, ``weight``, ``tokens_taken``, ``epochs``...
        (:class:`~packtool.format.SourceRecord`); None for other packs."""
        self.num_rows_total: int = reader.num_rows
        self.micro_batches: int | None = None
        """Rows per rank and step of a balanced layout read as stored (None: plain split)."""
        manifest = reader.manifest
        balance = manifest.balance
        balanced_for = balance.world_size if balance else None
        per_rank = reader.num_rows // world_size
        if balance is not None and balanced_for == world_size:
            self.micro_batches = int(balance.micro_batches or 1)
            steps, short, _ = balanced_layout(reader.num_rows, world_size, self.micro_batches)
            per_rank = steps * self.micro_batches + short
        elif balance is not None and world_size > 1:
            warnings.warn(
                f"{path} is stored as balanced steps for world_size={balanced_for}"
                f", not {world_size}: reading the plain split, whose steps are not balanced "
                f"(pack again with --world-size {world_size})",
                stacklevel=2,
            )
        if per_rank == 0:
            raise OptionError(
                f"{path} has {reader.num_rows} rows, fewer than world_size={world_size}: "
                "every rank needs at least one row (pack more data or a smaller --max-len)"
            )
        self._per_rank = per_rank
        self.epoch: int | None = None
        """The epoch of the last :meth:`set_epoch`, or None: contiguous blocks in stored order."""
        self._rows: Sequence[int] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Read the rows of epoch ``epoch``: a global reshuffle, each rank taking its share.

        Every rank draws the same permutation of all the rows from ``(seed, epoch)``
        (:func:`packtool.order.epoch_order`) and takes positions ``rank, rank + world_size, ...``
        of it (:func:`packtool.order.rank_share`): no row on two ranks, every rank the same
        number, the last ``num_rows % world_size`` positions left out (other rows each epoch).
        Deterministic: the same ``(seed, epoch)`` gives the same rows in the same order. On a
        balanced output read with its world size, it permutes whole steps and, in each step,
        the ranks' shares (:func:`packtool.order.balanced_epoch_order`): every step keeps its
        balance, each rank reads other rows. Call it
        before each epoch's iteration (Hugging Face Trainer and accelerate do), and use
        ``shuffle=False`` in the DataLoader.
        """
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise OptionError(f"epoch must be an integer >= 0, got {epoch!r}")
        if epoch != self.epoch:
            self.epoch = epoch
            self._rows = None

    @property
    def rows(self) -> Sequence[int]:
        """The global row numbers this rank reads, in order: ``self[i]`` is row ``rows[i]``."""
        if self._rows is None:
            g = self.micro_batches
            if g is not None:
                n, w = self.num_rows_total, self.world_size
                order = (
                    np.arange(n)
                    if self.epoch is None
                    else balanced_epoch_order(
                        n, world_size=w, micro_batches=g, seed=self.seed, epoch=self.epoch
                    )
                )
                self._rows = balanced_share(order, self.rank, w, g)
            elif self.epoch is None:
                n = self._per_rank
                self._rows = range(self.rank * n, (self.rank + 1) * n)
            else:
                order = epoch_order(self.num_rows_total, seed=self.seed, epoch=self.epoch)
                self._rows = rank_share(order, self.rank, self.world_size)
        return self._rows

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to read the same rows: the epoch (and, as a check, the
        seed and the sharding). torchdata's ``StatefulDataLoader`` saves it with its own
        position, so that ``load_state_dict`` continues mid-epoch."""
        return {
            "epoch": self.epoch,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "num_rows": self.num_rows_total,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; refuses a state saved with another seed or sharding."""
        mine = self.state_dict()
        for key in ("seed", "rank", "world_size", "num_rows"):
            if state.get(key) != mine[key]:
                raise OptionError(
                    f"cannot resume: the saved state has {key}={state.get(key)!r}, this "
                    f"dataset {key}={mine[key]!r} (open it with the same path, seed, rank and "
                    "world_size as the run that saved it)"
                )
        epoch = state.get("epoch")
        self.epoch = None
        self._rows = None
        if epoch is not None:
            self.set_epoch(epoch)

    @property
    def reader(self) -> PackedReader:
        """The underlying :class:`~packtool.format.PackedReader` (opened lazily after pickling)."""
        if self._reader is None:
            self._reader = open_packed(self.path, cache_dir=self.cache_dir)
        return self._reader

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers get a copy of the dataset: send the path, not the mapped tables
        # (pickling a pyarrow table copies its data).
        # The row numbers too: a worker recomputes them from the epoch.
        state = self.__dict__.copy()
        state["_reader"] = None
        state["_rows"] = None
        return state

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} rows")
        row = self.reader.row(int(self.rows[index]))
        item: dict[str, Any] = {
            # astype copies out of the read-only memory map, so torch gets writable memory
            "input_ids": torch.from_numpy(row.input_ids.astype(np.int64)),
            "position_ids": torch.from_numpy(row.position_ids.astype(np.int64)),
            "cu_seqlens": torch.from_numpy(row.cu_seqlens.astype(np.int32)),
            "num_tokens": int(row.num_tokens),
            "row": int(row.index),
        }
        unpadded = row.cu_seqlens_unpadded
        if unpadded is not None:
            item["cu_seqlens_unpadded"] = torch.from_numpy(unpadded.astype(np.int32))
        source = row.labels if row.labels is not None else row.input_ids
        item["labels"] = torch.from_numpy(
            learned_labels(source, row.cu_seqlens, int(row.num_tokens), unpadded)
        )
        if row.source_ids is not None:  # per segment; collate makes them per token
            item["source_ids"] = torch.from_numpy(row.source_ids.astype(np.int64))
        return item


def token_sources(
    source_ids: Any,
    cu_seqlens: Any,
    num_tokens: int,
    max_len: int,
    cu_seqlens_unpadded: Any = None,
) -> np.ndarray:
    """Each token's source (int64, ``[max_len]``) from a row's per-segment ``source_ids``:
    the source of the segment it is in, -1 on the padding (and on the alignment pad of a
    ``--pad-to-multiple-of`` pack: ``cu_seqlens_unpadded`` gives the real tokens)."""
    sources = np.asarray(source_ids, dtype=np.int64)
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    real = cu if cu_seqlens_unpadded is None else np.asarray(cu_seqlens_unpadded, np.int64)
    lengths = np.diff(real)[: sources.size]
    if cu_seqlens_unpadded is None and int(lengths.sum()) != num_tokens:
        raise ValueError(
            f"{sources.size} source_ids for segments of {int(lengths.sum())} tokens, but the "
            f"row holds {num_tokens}"
        )
    out = np.full(max_len, -1, np.int64)
    inner = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[np.repeat(cu[: sources.size], lengths) + inner] = np.repeat(sources, lengths)
    return out


def learned_labels(
    source: Any, cu_seqlens: Any, num_tokens: int, cu_seqlens_unpadded: Any = None
) -> np.ndarray:
    """The labels of one row (int64): ``source`` (``input_ids``, or the stored labels of
    instruction data), with -100 on the padding ``[num_tokens, max_len)`` and on the first token
    of every segment (``cu_seqlens[:-1]``)::

        input_ids  a0 a1 a2 b0 b1 b2 P  P          cu_seqlens [0, 3, 6, 8], num_tokens 6
        labels     -  a1 a2 -  b1 b2 -  -

    In an aligned pack (``cu_seqlens_unpadded`` given), every pad is -100: each document's
    alignment pad and the padding tail (``num_tokens`` then counts the real tokens only)::

        input_ids  a0 a1 a2 P  b0 b1 P  P          cu_seqlens [0, 4, 8], unpadded [0, 3, 5]
        labels     -  a1 a2 -  -  b1 -  -
    """
    labels = np.array(source, dtype=np.int64)  # a copy: the caller's array is left alone
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    if cu_seqlens_unpadded is None:
        labels[num_tokens:] = IGNORE_INDEX
    else:
        labels[~real_tokens(cu, cu_seqlens_unpadded)] = IGNORE_INDEX
    labels[cu[:-1]] = IGNORE_INDEX
    return labels


def real_tokens(cu_seqlens: Any, cu_seqlens_unpadded: Any) -> np.ndarray:
    """``[max_len]`` bool: which positions of an aligned row hold a document's token (not its
    alignment pad, not the padding tail): the first ``diff(cu_seqlens_unpadded)[i]`` of each
    segment ``i``."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    real = np.diff(np.asarray(cu_seqlens_unpadded, dtype=np.int64))
    spans = np.diff(cu)
    if real.shape != spans.shape or (real < 0).any() or (real > spans).any():
        raise ValueError(
            f"cu_seqlens_unpadded {np.asarray(cu_seqlens_unpadded).tolist()} does not fit "
            f"cu_seqlens {cu.tolist()}"
        )
    within = np.arange(int(cu[-1]), dtype=np.int64) - np.repeat(cu[:-1], spans)
    return within < np.repeat(real, spans)


def _as_long(x: Any) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x).long()


def _segment_starts(position_ids: torch.Tensor) -> np.ndarray:
    """``cu_seqlens`` of a row from its ``position_ids``: a segment starts wherever they are 0
    (the format guarantees it, for the padding segment too)."""
    pos = position_ids.numpy()
    return np.append(np.flatnonzero(pos == 0), pos.size).astype(np.int64)


def collate(
    rows: Sequence[Mapping[str, Any]], *, cp_size: int = 1, cross_document_attention: bool = False
) -> dict[str, Any]:
    """Batch packed rows for a causal LM; the keys are the keywords Hugging Face models take,
    so ``model(**collate(rows))`` is right as it stands (also with a default model config).

    ``rows`` are :class:`PackedDataset` items, or any mappings with ``input_ids`` and
    ``position_ids`` as tensors, arrays or lists, plus ``cu_seqlens`` and ``num_tokens`` (rows of
    ``datasets.load_from_disk("out/")``) or ``labels`` (``PackedDataset`` items after Hugging
    Face Trainer's ``remove_unused_columns`` kept only the keys the model's ``forward`` names).
    Missing ``cu_seqlens`` are found where ``position_ids`` restart at 0. Returns::

        input_ids           [B, L] int64
        position_ids        [B, L] int64    restart at 0 at every segment
        labels              [B, L] int64    input_ids (or the stored labels), with -100 on the
                                            padding and on the first token of every document
        cu_seq_lens_q       [S + 1] int32   every row's cu_seqlens, offset by row * L, joined:
        cu_seq_lens_k                       boundaries over the flattened [B * L] batch
        max_length_q        int             the longest segment (padding segments included)
        max_length_k        int
        num_learned_tokens  int             (labels[:, 1:] != -100).sum(): the tokens the loss
                                            is taken over, after the model's shift by one
        use_cache           False           a model that builds a KV cache turns off the
                                            packed-sequence handling: documents would leak
        source_ids          [B, L] int64    a mixture's rows only (``pack --mix``): each
                                            token's source (the input it came from), -1 on
                                            the padding, for a loss per source
                                            (examples/train.py); rows carry them per segment

    Why -100 on document starts: the model shifts labels by one (logits at ``t`` predict
    ``labels[t + 1]``), so ``labels[cu[k]] = -100`` stops the last token of document ``k - 1``
    (its EOS) from being trained to predict the first token of document ``k``, which it cannot
    see. With documents ``a`` (3 tokens) and ``b`` (3), then 2 pad tokens::

        input_ids  a0 a1 a2 b0 b1 b2 P  P
        labels     -  a1 a2 -  b1 b2 -  -
        learned    a0->a1, a1->a2, b0->b1, b1->b2        num_learned_tokens = 4
                   (not a2->b0: labels[3] is -100; not b2->P: padding)

    Deliberately, there is no ``attention_mask`` key: a 2-D mask, even all ones, turns off
    Hugging Face's packed-sequence handling.

    Rows of an aligned pack (``--pad-to-multiple-of``: they carry ``cu_seqlens_unpadded``)
    learn no alignment pad either, and ``num_learned_tokens`` counts none.

    ``cp_size`` > 1 (context parallelism, as accelerate and Hugging Face Trainer shard a batch
    along the sequence into ``2 * cp_size`` load-balanced chunks): the row length must be a
    multiple of ``2 * cp_size``; the batch gains ``shift_labels`` (``labels`` shifted by one,
    made before sharding, so each shard's loss pairs every token with its true successor)
    and loses ``cu_seq_lens_*`` and ``max_length_*``, which describe the unsharded rows
    (docs/context-parallel.md). That backend attends causally over the whole row, so the
    documents of a row would see each other: rows holding more than one document are refused
    unless ``cross_document_attention=True`` says that is accepted (positions and labels stay
    per document).
    """
    input_ids, position_ids = _stacked(rows, cp_size)
    max_len = input_ids.shape[1]
    labels = torch.empty_like(input_ids)
    with_sources = "source_ids" in rows[0]  # a mixture: per token, -1 on padding
    source_ids = torch.empty_like(input_ids) if with_sources else None
    cu_parts = [np.zeros(1, dtype=np.int64)]
    for b, r in enumerate(rows):
        cu, num_tokens, unpadded = _row_bounds(b, r, position_ids[b], max_len)
        if cp_size > 1 and not cross_document_attention:
            _one_document(b, cu, num_tokens, unpadded)
        stored = r.get("labels")
        source = _as_long(stored) if stored is not None else input_ids[b]
        labels[b] = torch.from_numpy(learned_labels(source.numpy(), cu, num_tokens, unpadded))
        if with_sources:
            source_ids[b] = torch.from_numpy(
                token_sources(_as_long(r["source_ids"]).numpy(), cu, num_tokens, max_len, unpadded)
            )
        cu_parts.append(cu[1:] + b * max_len)
    cu_global = np.concatenate(cu_parts)
    cu_tensor = torch.from_numpy(cu_global.astype(np.int32))
    max_length = int(np.diff(cu_global).max())
    extra = {"source_ids": source_ids} if source_ids is not None else {}
    batch: dict[str, Any] = {
        "input_ids": input_ids,
        "position_ids": position_ids,
        "labels": labels,
        **extra,
        "cu_seq_lens_q": cu_tensor,
        "cu_seq_lens_k": cu_tensor.clone(),
        "max_length_q": max_length,
        "max_length_k": max_length,
        "num_learned_tokens": int((labels[:, 1:] != IGNORE_INDEX).sum()),
        "use_cache": False,
    }
    if cp_size > 1:
        for key in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
            del batch[key]
        shift = torch.full_like(labels, IGNORE_INDEX)
        shift[:, :-1] = labels[:, 1:]
        batch["shift_labels"] = shift
    return batch


def _one_document(b: int, cu: np.ndarray, num_tokens: int, unpadded: np.ndarray | None) -> None:
    """Under context parallelism (causal attention over the whole row): row ``b`` must hold
    one document, else one line saying why and what to do."""
    real = np.diff(unpadded) > 0 if unpadded is not None else cu[:-1] < num_tokens
    documents = int(np.count_nonzero(real))
    if documents > 1:
        raise OptionError(
            f"row {b} holds {documents} documents: under context parallelism (accelerate's "
            "torch backend) attention is causal over the whole row, so they would attend to "
            "each other; export --to megatron-bridge for per-document attention with CP "
            "(docs/context-parallel.md), or pass cross_document_attention=True to accept it "
            "(positions and labels stay per document)"
        )


def _stacked(rows: Sequence[Mapping[str, Any]], cp_size: int) -> tuple[Any, Any]:
    """The rows' input_ids and position_ids as [B, L] int64 tensors, checked (with
    ``cp_size``, that L splits into ``2 * cp_size`` chunks)."""
    if not rows:
        raise ValueError("collate needs at least one row")
    if isinstance(cp_size, bool) or not isinstance(cp_size, int) or cp_size < 1:
        raise OptionError(f"cp_size must be an integer >= 1, got {cp_size!r}")
    missing = [key for key in column_names(False, Per.TOKEN) if key not in rows[0]]
    if missing:
        raise ValueError(
            f"rows have no {' and no '.join(missing)} (keys: {sorted(rows[0])}): something "
            "dropped them before collate; with TRL's SFTTrainer, which keeps only input_ids, "
            "labels and seq_lengths, pass SFTConfig(remove_unused_columns=False)"
        )
    input_ids = torch.stack([_as_long(r["input_ids"]) for r in rows])
    position_ids = torch.stack([_as_long(r["position_ids"]) for r in rows])
    max_len = input_ids.shape[1]
    if position_ids.shape != input_ids.shape:
        raise ValueError(
            f"position_ids {tuple(position_ids.shape)} do not match input_ids "
            f"{tuple(input_ids.shape)}"
        )
    if max_len % (2 * cp_size) and cp_size > 1:
        raise OptionError(
            f"rows of {max_len} tokens cannot be split into 2 x cp_size = {2 * cp_size} equal "
            f"chunks for context parallelism: pack with a --max-len that is a multiple of "
            f"{2 * cp_size}"
        )
    return input_ids, position_ids


def _row_bounds(
    b: int, r: Mapping[str, Any], positions: Any, max_len: int
) -> tuple[np.ndarray, int, np.ndarray | None]:
    """Row ``b``'s boundaries (stored, or where its positions restart at 0), its real tokens
    (``max_len`` when only its labels tell the padding), and its real boundaries if aligned."""
    if "cu_seqlens" in r:
        cu = np.asarray(r["cu_seqlens"], dtype=np.int64)
        what = "cu_seqlens"
    else:
        cu = _segment_starts(positions)
        what = "the segments where position_ids restart at 0"
    if cu.ndim != 1 or cu.size < 2 or cu[0] != 0 or cu[-1] != max_len:
        raise ValueError(
            f"row {b}: {what} must run from 0 to the row length {max_len}, got {cu.tolist()}"
        )
    if "num_tokens" in r:
        num_tokens = int(r["num_tokens"])
    elif r.get("labels") is not None:
        num_tokens = max_len  # labels already hold -100 on the padding
    else:
        raise ValueError(
            f"row {b} has neither num_tokens nor labels, so its padding cannot be told "
            "from its tokens: pass rows of packtool.torch.PackedDataset (they carry labels), "
            "or, with Hugging Face Trainer and rows of datasets.load_from_disk, "
            "TrainingArguments(remove_unused_columns=False)"
        )
    unpadded = r.get("cu_seqlens_unpadded") if "cu_seqlens" in r else None
    if unpadded is None and "num_tokens" in r and num_tokens not in (cu[-2], cu[-1]):
        # A plain row's padding is its last segment, [num_tokens, max_len). A row of an
        # aligned pack stripped of cu_seqlens_unpadded would learn its alignment pads and
        # lose the real tokens after num_tokens.
        raise ValueError(
            f"row {b}: num_tokens {num_tokens} is not where its last segment starts "
            f"(cu_seqlens {cu.tolist()}): a row of an aligned pack (--pad-to-multiple-of) "
            "needs its cu_seqlens_unpadded, or its alignment pads would be learned; keep "
            "that column (or pass PackedDataset items)"
        )
    return cu, num_tokens, None if unpadded is None else np.asarray(unpadded, dtype=np.int64)


def _rows_cu(cu_seqlens: Any, max_len: int) -> list[np.ndarray]:
    """Per-row ``cu_seqlens`` from a global (flattened batch) one or from a list of rows."""
    if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.ndim == 1:
        cu_seqlens = cu_seqlens.detach().cpu().numpy()
    elif isinstance(cu_seqlens, Sequence) and cu_seqlens and np.ndim(cu_seqlens[0]) == 0:
        cu_seqlens = np.asarray(cu_seqlens)  # a plain list of ints: the global form
    if isinstance(cu_seqlens, np.ndarray) and cu_seqlens.ndim == 1:
        cu = cu_seqlens.astype(np.int64)
        if cu.size < 2 or cu[-1] <= 0 or cu[-1] % max_len:
            raise ValueError(
                f"cu_seqlens must end at a multiple of max_len={max_len} "
                f"(batch x max_len), got {cu.tolist()}"
            )
        batch = int(cu[-1]) // max_len
        bounds = np.arange(batch + 1) * max_len
        missing = np.setdiff1d(bounds, cu)
        if missing.size:
            raise ValueError(
                f"cu_seqlens must hold every row boundary (multiples of max_len={max_len}); "
                f"{missing.tolist()} missing from {cu.tolist()}"
            )
        return [
            cu[(cu >= b * max_len) & (cu <= (b + 1) * max_len)] - b * max_len for b in range(batch)
        ]
    return [
        np.asarray(c.detach().cpu() if isinstance(c, torch.Tensor) else c, dtype=np.int64)
        for c in cu_seqlens
    ]


def _device_of(cu_seqlens: Any, device: torch.device | str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    if isinstance(cu_seqlens, torch.Tensor):
        return cu_seqlens.device
    return torch.device("cpu")


def block_causal_mask(
    cu_seqlens: Any,
    max_len: int,
    dtype: torch.dtype = torch.bool,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The ``[B, 1, L, L]`` block-diagonal causal mask of a batch, for SDPA or eager attention.

    ``cu_seqlens`` is the batch's ``cu_seq_lens_q`` from :func:`collate` (global, ending at
    ``B * max_len``), or a list of per-row ``cu_seqlens``. The mask is
    :func:`packtool.masks.block_causal_mask` (the one definition) for every row::

        >>> block_causal_mask(torch.tensor([0, 2, 3, 6]), 3).int()[:, 0].tolist()
        [[[1, 0, 0], [1, 1, 0], [0, 0, 1]],        row 0: segments [0, 2), [2, 3)
         [[1, 0, 0], [1, 1, 0], [1, 1, 1]]]        row 1: one segment [3, 6)

    ``dtype=torch.bool`` (the default): ``True`` where a query may attend to a key, as SDPA
    takes it. A float ``dtype``: an additive mask, ``0`` where allowed and ``finfo(dtype).min``
    elsewhere, as eager attention takes it (it *adds* the mask to the scores, so a boolean mask
    there is silently wrong). The result is on ``device``, else on ``cu_seqlens``' device.
    """
    mask = torch.from_numpy(batch_block_causal_mask(_rows_cu(cu_seqlens, max_len), max_len))
    mask = mask[:, None].to(_device_of(cu_seqlens, device))
    if dtype == torch.bool:
        return mask
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be torch.bool or a floating dtype, got {dtype}")
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return additive.masked_fill_(~mask, torch.finfo(dtype).min)


def flex_block_mask(
    cu_seqlens: Any, max_len: int, *, device: torch.device | str | None = None
) -> Any:
    """A flex-attention ``BlockMask`` for the batch: same document and ``q_idx >= kv_idx``.

    Built from the document id of every token (:func:`packtool.masks.document_ids`), so it
    allows exactly what :func:`block_causal_mask` allows, without materialising ``L x L``::

        >>> bm = flex_block_mask(batch["cu_seq_lens_q"], batch["input_ids"].shape[1])
        >>> model(**inputs, attention_mask=bm, use_cache=False)  # attn: flex_attention

    Hand the model this ``BlockMask``, not a 4-D tensor: flex attention on CPU crashes on a dense
    mask.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    dev = _device_of(cu_seqlens, device)
    rows = _rows_cu(cu_seqlens, max_len)
    docs = torch.from_numpy(np.stack([document_ids(cu, max_len) for cu in rows])).to(dev)

    def same_document_causal(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (docs[b, q_idx] == docs[b, kv_idx]) & (q_idx >= kv_idx)

    return create_block_mask(
        same_document_causal, B=len(rows), H=None, Q_LEN=max_len, KV_LEN=max_len, device=dev
    )
