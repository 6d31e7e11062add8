"""Datasets saved with ``datasets.save_to_disk``: their Arrow files read batch by batch (a
layout packtool does not know is loaded by `datasets`): texts, records, columns."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from ..errors import InputError
from ..fs import as_path
from .arrow import ArrowFiles
from .arrow import read_table as read_arrow_table
from .batches import (
    TableSource,
    TextBatch,
    check_column,
    table_texts,
)
from .files import (
    InputFile,
)


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


def read_texts(
    inp: InputFile, text_field: str, split: str | None, skip_bad: bool, batch_docs: int
) -> Iterator[TextBatch]:
    files = saved_dataset_files(str(inp.path), split)
    if files is not None:
        arrow = ArrowFiles(files).as_input()
        try:
            check_column(arrow.schema, text_field, str(inp.path))
            yield from table_texts(
                arrow.batches, text_field, str(inp.path), skip_bad, batch_docs, arrow.tell
            )
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError(f"{inp.path}: cannot read the saved dataset: {e}") from e
        finally:
            arrow.source.close()
        return
    import datasets

    try:
        ds: Any = datasets.load_from_disk(str(inp.path))
    except Exception as e:  # datasets raises many kinds here
        raise InputError(f"{inp.path}: cannot load the saved dataset: {e}") from e
    if isinstance(ds, datasets.DatasetDict):
        ds = ds[_choose_split(str(inp.path), list(ds), split)]
    where = str(inp.path)
    check_column(ds.data.schema, text_field, where)
    total = max(1, len(ds))
    done = [0]

    def batches() -> Iterator[pa.RecordBatch]:
        for table in ds.select_columns([text_field]).with_format("arrow").iter(batch_docs * 8):
            done[0] += table.num_rows
            yield from table.to_batches()

    yield from table_texts(
        batches(),
        text_field,
        where,
        skip_bad,
        batch_docs,
        lambda: inp.size_bytes * done[0] // total,
    )


def read_table(
    inp: InputFile, columns: Sequence[str], split: str | None
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """The record batches of ``columns`` of the dataset's Arrow files, as stored."""
    where = str(inp.path)
    files = saved_dataset_files(where, split)
    if files is None:
        raise InputError(f"{where}: a saved dataset of a layout packtool cannot stream")
    yield from read_arrow_table(where, files, columns)


def table_source(
    inp: InputFile, fields: Sequence[str], split: str | None, batch_docs: int
) -> TableSource:
    """The rows of ``fields`` (records): its Arrow files batch by batch, or through `datasets`
    for another layout. Nothing is read until the batches are iterated."""
    where = str(inp.path)
    files = saved_dataset_files(where, split)
    if files is not None:
        source, schema, batches, tell = ArrowFiles(files).as_input()
        return TableSource(list(schema.names), batches, tell, source.close)
    import datasets

    try:
        ds: Any = datasets.load_from_disk(where)
    except Exception as e:  # datasets raises many kinds here
        raise InputError(f"{where}: cannot load the saved dataset: {e}") from e
    if isinstance(ds, datasets.DatasetDict):
        ds = ds[_choose_split(where, list(ds), split)]
    total, done = max(1, len(ds)), [0]

    def dataset_batches() -> Iterator[pa.RecordBatch]:
        for table in ds.select_columns(list(fields)).with_format("arrow").iter(batch_docs):
            done[0] += table.num_rows
            yield from table.to_batches()

    return TableSource(
        list(ds.data.schema.names),
        dataset_batches(),
        lambda: inp.size_bytes * done[0] // total,
        lambda: None,
    )
