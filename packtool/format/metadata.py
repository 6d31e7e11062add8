"""The Hugging Face `datasets` metadata beside the shards (``dataset_info.json``,
``state.json``: what `datasets.load_from_disk` reads), written and checked against the
manifest with the other files of an output."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from ..fs import AnyPath
from .manifest import Manifest, ShardEntry
from .output import write_json
from .schema import hf_features

__all__ = ["CARD_FILE", "dataset_card", "layout_problems", "trainer_cache_files", "write_metadata"]

CARD_FILE = "README.md"

_CARD = """\
---
tags:
- packtool
- packed
---

# A packed dataset (packtool, format 1)

Rows of {max_len} tokens, each several documents one after another ({kind}). Which
tokens attend to which is in the rows: `position_ids` restart at 0 at every document,
`cu_seqlens` and `seq_lengths` give the segments. **A trainer that reads only `input_ids`
(and `labels`) lets every document attend to the documents before it in its row**, silently.

Kept apart (exact):

- `packtool.torch.collate` as the data collator (Hugging Face Trainer, TRL, your own loop);
- TRL `SFTTrainer` with `SFTConfig(padding_free=True, max_length=None)` and its own
  collator, which reads `seq_lengths`{trl_note}.

**Attending to each other** (nothing in the rows can stop them):

- TRL `SFTTrainer` with its default collator (no `padding_free`): a 2-D attention mask and
  no `position_ids`;
- transformers `DataCollatorWithFlattening`: it takes each row as one sequence.

Check a model and a feed before a long run: `packtool check-model OUT --model MODEL_DIR
--feed packtool|position-ids|plain` (exit 1 on a leak). Call `datasets.disable_caching()`
before `datasets.load_from_disk` on this directory, or a trainer's preprocessing writes
`cache-*.arrow` files into it. `manifest.json` records how the rows were made;
`packtool verify` checks them.
"""


def dataset_card(schema: pa.Schema) -> str:
    """The ``README.md`` of a pack: what keeps its documents apart in training, and what
    does not (docs/trl.md, docs/training.md)."""
    labels = "labels" in schema.names
    max_len = next(
        (f.type.list_size for f in schema if pa.types.is_fixed_size_list(f.type)), "max_len"
    )
    kind = (
        "instruction data: `labels` hold the tokens to learn, -100 elsewhere"
        if labels
        else "text: every token of a document is learned"
    )
    trl_note = (
        "; it learns packtool's `labels`"
        if labels
        else "; it builds `labels = input_ids` and learns no pad (`seq_lengths` makes each pad a "
        "sequence of its own)"
    )
    return _CARD.format(max_len=max_len, kind=kind, trl_note=trl_note)


def write_metadata(directory: Path, schema: pa.Schema, shards: Sequence[ShardEntry]) -> None:
    """``dataset_info.json`` and ``state.json``: what `datasets.load_from_disk` reads (its
    ``_data_files`` are the shards' paths relative to ``directory``, in row order), and the
    dataset card ``README.md`` (:func:`dataset_card`)."""
    (directory / CARD_FILE).write_text(dataset_card(schema), encoding="utf-8")
    write_json(
        directory / "dataset_info.json",
        {"citation": "", "description": "packed by packtool", "features": hf_features(schema)},
    )
    write_json(
        directory / "state.json",
        {
            "_data_files": [{"filename": s.file} for s in shards],
            "_fingerprint": hashlib.sha256(
                "".join(s.sha256 or "" for s in shards).encode()
            ).hexdigest()[:16],
            "_format_columns": None,
            "_format_kwargs": {},
            "_format_type": None,
            "_output_all_columns": False,
            "_split": None,
        },
    )


def trainer_cache_files(path: AnyPath, manifest: Manifest) -> list[str]:
    """Files that `datasets` writes beside a dataset it maps (``cache-*.arrow``, as TRL's
    and Hugging Face's preprocessing do on ``load_from_disk("out")``) that the manifest does
    not list: a trainer's cache, not part of the pack and no damage to it."""
    listed = {s.file for s in manifest.shards}
    return sorted(p.name for p in path.glob("cache-*.arrow") if p.name not in listed)


def layout_problems(path: AnyPath, manifest: Manifest) -> list[str]:
    """The files of the dataset at ``path`` that disagree with its manifest: shards it does not
    list, a ``state.json`` naming other shards, a tokenizer copy that is missing or altered."""
    found: list[str] = []
    listed = [s.file for s in manifest.shards]
    cache = set(trainer_cache_files(path, manifest))
    for stray in sorted(p.name for p in path.glob("*.arrow")):
        if stray not in listed and stray not in cache:
            found.append(
                f"{stray} is not a shard of the manifest (load_dataset('arrow', "
                "data_files='*.arrow') would read it too): remove it"
            )
    state_path = path / "state.json"
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
        state_files = [f["filename"] for f in state["_data_files"]]
    except FileNotFoundError:
        found.append("state.json is missing: datasets.load_from_disk cannot open this")
    except (OSError, ValueError, KeyError, TypeError) as e:
        found.append(f"state.json is unreadable ({type(e).__name__}: {e})")
    else:
        if state_files != listed:
            found.append(
                "state.json lists other shards than the manifest: "
                "datasets.load_from_disk would read other rows"
            )
    if manifest.tokenizer.file is not None:  # the output holds a copy of the tokenizer file
        tok_path = path / Path(manifest.tokenizer.file).name
        if not tok_path.is_file():
            found.append(f"{tok_path.name} (the tokenizer copy) is missing")
        elif manifest.tokenizer.sha256 != hashlib.sha256(tok_path.read_bytes()).hexdigest():
            found.append(
                f"{tok_path.name} does not match the sha256 recorded in the manifest: "
                "it is not the tokenizer the data was packed with"
            )
    return found
