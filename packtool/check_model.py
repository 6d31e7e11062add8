"""Does a model keep packed documents apart? ``packtool check-model`` measures it.

A transformers causal LM is fed ``rows`` packed rows of a pack (the first that hold two documents
or more: a row of one document cannot show a leak) the way ``feed`` names, and every
document of those rows is run again alone; the largest absolute difference of its logits, packed
against alone, is the measure. Documents that share nothing leak nothing: the difference is
float noise (about 1e-7 in float32). A 2-D attention mask over a packed row, or a model that
ignores the document boundaries, lets each document attend to those before it in its row: their
logits change by about 0.1 to 1, and the first document of a row (which has nothing before it)
stays exact, so the two are reported apart::

    feed          what the model gets                                  as done by
    packtool      packtool.torch.collate(rows): input_ids, position_ids, packtool's recipes, TRL
                  cu_seq_lens_q/k, max_length_q/k, labels, no mask     with data_collator=collate
    position-ids  input_ids and position_ids only, the rows joined     padding-free trainers
                  into one sequence                                    (DataCollatorWithFlattening
                                                                       on unpacked data)
    plain         input_ids and a 2-D attention mask of ones           most default collators (TRL
                                                                       without padding_free)

torch and transformers are imported when :func:`check_model` runs, not with this module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._fields import attributes
from .errors import OptionError

__all__ = [
    "ATTENTION",
    "DEVICES",
    "FEEDS",
    "LEAK_THRESHOLD",
    "ModelCheck",
    "check_model",
    "rows_to_feed",
]

FEEDS = ("packtool", "position-ids", "plain", "mask")
ATTENTION = ("sdpa", "eager", "flex_attention")
DEVICES = ("cpu", "cuda")
LEAK_THRESHOLD = 1e-4
"""A larger difference than this (float32 logits) is a leak, not rounding."""

FIRST = "first in its row"
AFTER = "after others in its row"

_INSTEAD = {
    "packtool": (
        "this model and attention do not keep packtool's rows apart: try "
        "--attn-implementation flex_attention or sdpa, and report the model"
    ),
    "position-ids": (
        "input_ids and position_ids alone do not keep the documents apart here: feed "
        "packtool.torch.collate's batch (it adds cu_seq_lens), or TRL's "
        "SFTConfig(padding_free=True) on the pack's rows"
    ),
    "plain": (
        "a 2-D attention mask over a packed row lets each document attend to those before it: "
        "feed packtool.torch.collate's batch (data_collator=collate), or TRL's "
        "SFTConfig(padding_free=True), not a default collator or DataCollatorWithFlattening"
    ),
    "mask": (
        "an explicit block mask replaces the model's own attention mask, its sliding window "
        "included: feed packtool.torch.collate's batch without a mask (--feed packtool)"
    ),
}


@dataclass
class ModelCheck:
    """The outcome of :func:`check_model`."""

    model: str
    from_config: bool  # random weights from the config (seeded), not loaded
    feed: str
    attn_implementation: str
    device: str
    rows: int
    documents: dict[str, int] = field(default_factory=dict)  # by kind
    max_diff: dict[str, float] = field(default_factory=dict)  # by kind
    seconds: float = 0.0

    @property
    def worst(self) -> float:
        return max(self.max_diff.values(), default=0.0)

    @property
    def leak(self) -> bool:
        return self.worst > LEAK_THRESHOLD

    @property
    def advice(self) -> str | None:
        """One line: the feed that leaks and what to use instead (None: no leak)."""
        if not self.leak:
            return None
        return (
            f"--feed {self.feed} leaks ({self.worst:.2g} > {LEAK_THRESHOLD:g}): "
            + _INSTEAD[self.feed]
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **attributes(
                self, "model from_config feed attn_implementation device rows documents max_diff"
            ),
            "threshold": LEAK_THRESHOLD,
            "leak": self.leak,
            "advice": self.advice,
            "seconds": round(self.seconds, 3),
        }


_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def load_causal_lm(
    path: str | os.PathLike[str], attn_implementation: str, seed: int = 0
) -> tuple[Any, bool]:
    """The causal LM in directory ``path``, in float32, offline: its weights if it has any,
    else random weights from its ``config.json`` (``torch.manual_seed(seed)`` first).
    Returns ``(model, from_config)``."""
    import torch
    import transformers

    directory = Path(path)
    if not directory.is_dir():
        raise OptionError(
            f"{directory}: no such directory (--model takes a local model directory: "
            "check-model downloads nothing)"
        )
    if not (directory / "config.json").is_file():
        raise OptionError(f"{directory}: no config.json (--model takes a model directory)")
    has_weights = any((directory / name).is_file() for name in _WEIGHTS)
    kwargs: dict[str, Any] = {"attn_implementation": attn_implementation, "dtype": torch.float32}
    try:
        if has_weights:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                directory, local_files_only=True, **kwargs
            )
        else:
            config = transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
            torch.manual_seed(seed)
            model = transformers.AutoModelForCausalLM.from_config(config, **kwargs)
    except (OSError, ValueError, KeyError, ImportError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OptionError(f"{directory}: cannot load a causal LM: {first}") from e
    return model.train(False), not has_weights


def _feed(
    kind: str, rows: list[dict[str, Any]], attn_implementation: str = "sdpa", device: str = "cpu"
) -> tuple[dict[str, Any], Any]:
    """The model's inputs for ``rows`` fed as ``kind``, and how to get each row's logits
    ``[rows, max_len, vocab]`` back from the output's."""
    import torch

    from .torch import block_causal_mask, collate, flex_block_mask

    ids = torch.stack([torch.as_tensor(r["input_ids"]).long() for r in rows])
    n, length = ids.shape
    if kind == "packtool":
        batch = collate(rows)
        batch.pop("labels")
        batch.pop("num_learned_tokens")
        batch.pop("use_cache")
        return batch, lambda logits: logits
    if kind == "position-ids":
        pos = torch.stack([torch.as_tensor(r["position_ids"]).long() for r in rows])
        batch = {"input_ids": ids.reshape(1, -1), "position_ids": pos.reshape(1, -1)}
        return batch, lambda logits: logits.reshape(n, length, -1)
    if kind == "mask":
        batch = collate(rows)
        cu = batch["cu_seq_lens_q"]
        if attn_implementation == "flex_attention":
            mask = flex_block_mask(cu, length, device=device)
        elif attn_implementation == "eager":
            mask = block_causal_mask(cu, length, dtype=torch.float32, device=device)
        else:
            mask = block_causal_mask(cu, length, device=device)
        inputs = {"input_ids": ids, "position_ids": batch["position_ids"], "attention_mask": mask}
        return inputs, lambda logits: logits
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, lambda logits: logits


def rows_to_feed(reader: Any, rows: int) -> list[int]:
    """The first ``rows`` rows of a pack (in stored order) that hold two documents or more.

    A row of one document has nothing before it to leak from, whatever the feed: the first
    rows of a pack at a small max-len (chunks of long documents, each a row) would be found
    exact under any feed. Read from the ``doc_ids`` column's lengths, shard by shard, until
    enough are found."""
    import numpy as np
    import pyarrow.compute as pc

    picked: list[int] = []
    start = 0
    for table in reader.iter_tables(["doc_ids"]):
        counts = pc.list_value_length(table.column("doc_ids")).to_numpy(zero_copy_only=False)
        several = np.flatnonzero(counts >= 2)[: rows - len(picked)]
        picked.extend(start + int(i) for i in several)
        start += table.num_rows
        if len(picked) >= rows:
            break
    return picked


def check_model(
    out_dir: str | os.PathLike[str],
    model: str | os.PathLike[str],
    *,
    rows: int = 4,
    attn_implementation: str = "sdpa",
    feed: str = "packtool",
    device: str = "cpu",
    seed: int = 0,
) -> ModelCheck:
    """Feed the first ``rows`` rows of the pack at ``out_dir`` that hold two documents or
    more (:func:`rows_to_feed`) to the model in directory ``model`` as ``feed`` says, run each
    of their documents alone, and measure the largest logit difference per document kind
    (:data:`FIRST` in its row, :data:`AFTER` others).

    >>> result = check_model("out/", "my-model/", feed="plain")
    >>> result.leak, result.max_diff
    (True, {'first in its row': 2.4e-07, 'after others in its row': 0.79})
    """
    import time

    started = time.perf_counter()
    if feed not in FEEDS:
        raise OptionError(f"--feed must be one of {', '.join(FEEDS)}, got {feed!r}")
    if attn_implementation not in ATTENTION:
        raise OptionError(
            f"--attn-implementation must be one of {', '.join(ATTENTION)}, "
            f"got {attn_implementation!r}"
        )
    if device not in DEVICES:
        raise OptionError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    if not isinstance(rows, int) or rows < 1:
        raise OptionError(f"--rows must be an integer >= 1, got {rows!r}")
    from .format import open_packed

    reader = open_packed(out_dir)
    if reader.num_rows == 0:
        raise OptionError(f"{out_dir}: the pack has no rows to feed")
    picked = rows_to_feed(reader, rows)
    if not picked:
        raise OptionError(
            f"{out_dir}: no row holds two documents or more, so no document can attend to "
            "another and no feed can be told to leak: check a pack whose rows hold several "
            "(a larger --max-len)"
        )
    try:
        import torch
        import transformers  # noqa: F401 - the error below names the extra
    except ImportError as e:
        raise OptionError(
            f"check-model needs torch and transformers ({e.name} is missing): "
            "pip install 'packtool[torch]' transformers"
        ) from e
    if device == "cuda" and not torch.cuda.is_available():
        raise OptionError("--device cuda: torch sees no CUDA device here")
    from .torch import PackedDataset

    lm, from_config = load_causal_lm(model, attn_implementation, seed)
    vocab = int(lm.get_input_embeddings().weight.shape[0])
    if reader.vocab_size > vocab:
        raise OptionError(
            f"{model}: the model's vocabulary ({vocab:,} ids) is smaller than the pack's "
            f"tokenizer's ({reader.vocab_size:,}): it is not the model this pack was made for"
        )
    lm.to(device)
    dataset = PackedDataset(out_dir)
    take = len(picked)
    packed = [dataset[i] for i in picked]
    inputs, by_row = _feed(feed, packed, attn_implementation, device)
    inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    result = ModelCheck(
        model=str(model),
        from_config=from_config,
        feed=feed,
        attn_implementation=attn_implementation,
        device=device,
        rows=take,
    )
    with torch.no_grad():
        logits = by_row(lm(**inputs, use_cache=False).logits.float())
        for b, index in enumerate(picked):
            for i, seg in enumerate(reader.row(index).segments):
                if seg.is_padding:
                    continue
                doc = packed[b]["input_ids"][seg.start : seg.end].long().to(device)
                alone = lm(input_ids=doc[None], use_cache=False).logits[0].float()
                diff = float((logits[b, seg.start : seg.end] - alone).abs().max())
                kind = FIRST if i == 0 else AFTER
                result.documents[kind] = result.documents.get(kind, 0) + 1
                result.max_diff[kind] = max(result.max_diff.get(kind, 0.0), diff)
    result.seconds = time.perf_counter() - started
    return result
