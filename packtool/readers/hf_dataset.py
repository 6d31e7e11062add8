"""Datasets saved with ``datasets.save_to_disk``: their Arrow files read batch by batch (a
layout packtool does not know is loaded by `datasets`): one reader of the columns asked for."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import InputError
from ..fs import AnyPath, as_path
from .arrow import open_table as open_arrow_table
from .base import Request, TableReader
from .batches import Records, TableSource
from .files import InputFile


def is_saved_dataset(path: AnyPath) -> bool:
    """Whether the directory ``path`` is a dataset saved with ``save_to_disk``."""
    return (path / "state.json").exists() or (path / "dataset_dict.json").exists()


def _choose_split(where: str, splits: Sequence[str], split: str | None) -> str:
    """The split to read of a saved ``DatasetDict``: ``split``, else "train" if there is one."""
    chosen = split or ("train" if "train" in splits else None)
    if chosen is None or chosen not in splits:
        missing = f"no split {split!r} in it; " if split else ""
        raise InputError(
            f"{where}: a dataset with splits {', '.join(splits)}: {missing}choose one with --split"
        )
    return chosen


def saved_dataset_files(where: str, split: str | None) -> list[str] | None:
    """The Arrow files of a `datasets` ``save_to_disk`` directory (of the chosen split of a
    saved ``DatasetDict``), in order; ``None`` for a layout other than the known one, which
    `datasets` then loads itself.

    Reading these files batch by batch keeps memory flat; ``datasets.load_from_disk`` maps
    them, and every page read stays resident (176 MB and 248 MB peak reading 25 MB and
    100 MB datasets)."""
    root = as_path(where)
    try:
        if (root / "dataset_dict.json").is_file():
            splits = json.loads((root / "dataset_dict.json").read_text(encoding="utf-8"))
            root = root / _choose_split(where, [str(n) for n in splits["splits"]], split)
        state = json.loads((root / "state.json").read_text(encoding="utf-8"))
        files = [str(root / entry["filename"]) for entry in state["_data_files"]]
        if state.get("_indices_data_files"):  # rows picked through an index: datasets knows
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not files or not all(as_path(f).is_file() for f in files):
        return None
    return files


def open_table(
    inp: InputFile, columns: Sequence[str], split: str | None, batch_rows: int
) -> TableSource:
    """The rows of ``columns``: the dataset's Arrow files batch by batch, or, for a layout
    packtool does not know, through `datasets`. Nothing is read until they are iterated."""
    where = str(inp.path)
    files = saved_dataset_files(where, split)
    if files is not None:
        return open_arrow_table(where, files, columns, "the saved dataset")
    import datasets

    try:
        ds: Any = datasets.load_from_disk(where)
    except Exception as e:  # datasets raises many kinds here
        raise InputError(f"{where}: cannot load the saved dataset: {e}") from e
    if isinstance(ds, datasets.DatasetDict):
        ds = ds[_choose_split(where, list(ds), split)]

    def parts() -> Iterator[Records]:
        total, done = max(1, len(ds)), 0
        for table in ds.select_columns(list(columns)).with_format("arrow").iter(batch_rows):
            progress = inp.size_bytes * (done + table.num_rows) // total
            for b in table.to_batches():
                yield Records(where, progress, b, row0=done)
                done += b.num_rows

    return TableSource(ds.data.schema, parts(), lambda: None)


class SavedDatasetReader(TableReader):
    """A directory saved with ``datasets.save_to_disk`` (found by its ``state.json`` or
    ``dataset_dict.json``, not by a suffix)."""

    kind = "hf_dataset"

    def open_table(self, inp: InputFile, request: Request) -> TableSource:
        return open_table(inp, request.fields, request.split, request.batch_rows)

    def input_file(self, path: AnyPath, compression: str | None) -> InputFile:
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return InputFile(path, self.kind, None, size)


READER = SavedDatasetReader()
