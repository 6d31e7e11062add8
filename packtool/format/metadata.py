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

__all__ = ["layout_problems", "trainer_cache_files", "write_metadata"]


def write_metadata(directory: Path, schema: pa.Schema, shards: Sequence[ShardEntry]) -> None:
    """``dataset_info.json`` and ``state.json``: what `datasets.load_from_disk` reads. Its
    ``_data_files`` are the shards' paths relative to ``directory``, in row order."""
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
    if manifest.tokenizer_copied:
        tok_path = path / Path(manifest.tokenizer_file).name
        if not tok_path.is_file():
            found.append(f"{tok_path.name} (the tokenizer copy) is missing")
        elif manifest.tokenizer_sha256 != hashlib.sha256(tok_path.read_bytes()).hexdigest():
            found.append(
                f"{tok_path.name} does not match the sha256 recorded in the manifest: "
                "it is not the tokenizer the data was packed with"
            )
    return found
