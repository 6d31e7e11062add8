"""Work units on every input kind: prompt/completion and chat records, and pre-tokenized ids
(Parquet by row groups, JSON Lines by line starts, Megatron .bin/.idx by sequence index).

For each: the units' merged rows equal (every column) what the local engine and `--unit` runs
plus a merge give; every document's ids and labels equal a one-process pack's; the merged
manifest's labels and options are those of the one-process pack; `verify` passes.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO
from helpers import assert_row_invariants, read_rows
from test_cli import assert_one_line_error, run

import packtool
from packtool.engines import pack_units
from packtool.format import Manifest, read_lost_chunks
from packtool.merge import merge_units
from packtool.readers import resolve_inputs
from packtool.units import plan_units
from packtool.verification import verify

CHAT = REPO / "sample_data" / "chat.jsonl"
TEMPLATE = REPO / "sample_data" / "chatml.jinja"
PROMPT_COMPLETION = REPO / "sample_data" / "prompt_completion.jsonl"
IGNORE = -100


def segments(rows: list[dict]) -> dict[int, list[tuple[list[int], list[int] | None]]]:
    """doc -> its chunks in order, each (ids, labels), from the rows."""
    found: dict[int, dict[int, tuple]] = defaultdict(dict)
    for row in rows:
        cu, labels = row["cu_seqlens"], row.get("labels")
        for k, (doc, chunk) in enumerate(zip(row["doc_ids"], row["chunk_ids"], strict=True)):
            assert chunk not in found[doc], f"chunk {chunk} of doc {doc} twice"
            found[doc][chunk] = (
                row["input_ids"][cu[k] : cu[k + 1]],
                None if labels is None else labels[cu[k] : cu[k + 1]],
            )
    return {d: [c[i] for i in sorted(c)] for d, c in found.items()}


# Figures of a run, not of its options: they differ between units and one pack.
_RUN_KEYS = {"shards", "units", "seconds", "created_unix", "rows", "rows_over_lower_bound"}
_RUN_KEYS |= {"efficiency", "global_ffd_rows", "num_rows", "inputs"}
_RUN_KEYS |= {"repack_files"}  # the files: one per unit (their records compared below)


def check_units_against_one_pack(
    tmp: Path, inputs: list[Path], n_units: int, **options
) -> tuple[dict, list[dict]]:
    """Pack ``inputs`` as one process, as ``n_units`` units (pool of 2), and as ``--unit``
    runs plus a merge; check what the module docstring says. Returns the merged manifest and
    rows."""
    one = packtool.pack(inputs, tmp / "one", **options)
    pool = pack_units(inputs, tmp / "pool", units=n_units, num_proc=2, **options)
    for i in reversed(range(n_units)):
        pack_units(inputs, tmp / "array", units=n_units, unit=i, **options)
    merge_units(tmp / "array")
    manifest, rows = read_rows(tmp / "pool")
    assert read_rows(tmp / "array")[1] == rows  # every column, row for row
    one_manifest, one_rows = read_rows(tmp / "one")
    assert segments(rows) == segments(one_rows)  # documents and their labels
    pad = manifest["tokenizer"]["special_tokens"]["pad_id"]
    for row in rows:
        assert_row_invariants(row, options["max_len"], pad)
    for key in set(manifest) | set(one_manifest):  # options, labels, counts: as one pack
        if key not in _RUN_KEYS:
            merged, one_value = manifest.get(key), one_manifest.get(key)
            if key == "options":  # the merge's own option: copy the rows or list the shards
                merged = {k: v for k, v in merged.items() if k != "copy"}
            assert merged == one_value, key
    assert manifest["global_ffd_rows"] == one.rows <= manifest["rows"]
    # A labelled split pack's repack record: the units' records, numbered over the corpus,
    # are the one pack's.
    records = [
        read_lost_chunks(p, Manifest.load(p).repack_files) for p in (tmp / "pool", tmp / "one")
    ]
    assert ("repack_files" in manifest) is ("repack_files" in one_manifest)
    for name in ("doc_id", "chunk_id", "label", "offsets", "tokens"):
        assert np.array_equal(getattr(records[0], name), getattr(records[1], name)), name
    assert pool.merged is not None and pool.merged.tokens_learned == one.tokens_learned
    report = verify(tmp / "pool")
    assert report.ok, report.problems
    return manifest, rows


# -- instruction data ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "options"),
    [
        (CHAT, {"chat_template": str(TEMPLATE), "max_len": 2048}),
        (CHAT, {"chat_template": str(TEMPLATE), "max_len": 512, "overflow": "split"}),
        (PROMPT_COMPLETION, {"max_len": 1024}),
        (PROMPT_COMPLETION, {"max_len": 96, "loss_on": "all", "overflow": "truncate"}),
    ],
    ids=["chat", "chat-split", "prompt-completion", "pc-all-truncate"],
)
def test_instruction_units_give_the_documents_of_one_pack(
    tmp_path: Path, source: Path, options: dict
) -> None:
    manifest, _ = check_units_against_one_pack(tmp_path, [source], 3, **options)
    assert "labels" in manifest["columns"] and manifest["labels"]["learned_tokens"] > 0
    assert manifest["options"]["input_shape_auto"] is True
    pieces = [p for u in manifest["units"]["per_unit"] for p in u["pieces"]]
    assert [p["split_by"] for p in pieces] == ["bytes"] * 3  # cut at line starts


def test_instruction_units_rerun_skips_finished_units(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ("pack", CHAT, "--chat-template", TEMPLATE, "-L", "2048", "-o", out, "--units", "3")
    assert run(*args, "--unit", "1", "-q").exit_code == 0
    marker = out / "units/unit-00001-of-00003/manifest.json"
    before = marker.stat().st_mtime_ns
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert [u["skipped"] for u in summary["units_run"]] == [False, True, False]
    assert marker.stat().st_mtime_ns == before
    assert read_rows(out)[0]["labels"]["loss_on"] == "assistant"
    assert verify(out).ok


def test_a_bad_record_in_a_later_unit_names_its_line_in_the_file(tmp_path: Path) -> None:
    lines = CHAT.read_text().splitlines()
    lines[250] = json.dumps({"messages": [{"role": "user", "content": 5}]})
    src = tmp_path / "c.jsonl"
    src.write_text("\n".join(lines) + "\n")
    args = ("pack", src, "--chat-template", TEMPLATE, "-L", "2048")
    one = run(*args, "-o", tmp_path / "one", "-q")
    assert_one_line_error(one, r"c\.jsonl:251: ")
    units = run(*args, "-o", tmp_path / "u", "--units", "4", "--num-proc", "1", "-q")
    assert units.exit_code == one.exit_code
    assert units.stderr.strip().splitlines()[-1] == one.stderr.strip().splitlines()[-1]


def test_chats_without_a_template_name_the_input_in_units_as_in_one_pack(tmp_path: Path) -> None:
    src = tmp_path / "c.jsonl"
    src.write_text("\n".join(CHAT.read_text().splitlines()[:2]) + "\n")
    want = r"chat records \(detected from the first record of .*c\.jsonl\) need a chat template"
    one = run("pack", src, "-L", "2048", "-o", tmp_path / "one", "-q")
    assert_one_line_error(one, want)
    units = run("pack", src, "-L", "2048", "-o", tmp_path / "u", "--units", "2", "-q")
    assert_one_line_error(units, want)


def test_empty_units_of_chat_data_merge(tmp_path: Path) -> None:
    src = tmp_path / "c.jsonl"
    src.write_text("\n".join(CHAT.read_text().splitlines()[:2]) + "\n")
    report = pack_units(
        [src], tmp_path / "u", units=5, num_proc=1, max_len=2048, chat_template=str(TEMPLATE)
    )
    assert [u.documents for u in report.units].count(0) >= 3
    _, rows = read_rows(tmp_path / "u")
    assert sorted(segments(rows)) == [0, 1]


# -- pre-tokenized ids ---------------------------------------------------------------------


def make_ids(n: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Documents of ids (some with EOS 2 inside, for --split-on-eos) and their labels."""
    rng = np.random.default_rng(seed)
    docs, labels = [], []
    for _ in range(n):
        ids = rng.integers(3, 500, int(rng.integers(1, 90))).tolist()
        if rng.random() < 0.3:
            ids[int(rng.integers(0, len(ids)))] = 2
        docs.append(ids)
        labels.append([t if rng.random() < 0.6 else IGNORE for t in ids])
    return docs, labels


@pytest.mark.parametrize(
    "case",
    ["parquet-labels", "parquet-split-on-eos", "jsonl-loss-mask", "jsonl-plain"],
)
def test_ids_units_give_the_documents_of_one_pack(tmp_path: Path, case: str) -> None:
    docs, labels = make_ids(600)
    options: dict = {"max_len": 64, "ids_field": "ids", "pad_id": 0}
    if case.startswith("parquet"):
        src = tmp_path / "in.parquet"
        pq.write_table(pa.table({"ids": docs, "y": labels}), src, row_group_size=50)
        split_by = "row_groups"
    else:
        src = tmp_path / "in.jsonl"
        with open(src, "w") as f:
            for ids, lab in zip(docs, labels, strict=True):
                mask = [int(x != IGNORE) for x in lab]
                f.write(json.dumps({"ids": ids, "m": mask}) + "\n")
        split_by = "bytes"
    if case == "parquet-labels":
        options["labels_field"] = "y"
    if case == "parquet-split-on-eos":
        options.update(split_on_eos=2, eos_token="2")
    if case == "jsonl-loss-mask":
        options["loss_mask_field"] = "m"
    manifest, _ = check_units_against_one_pack(tmp_path, [src], 4, **options)
    pieces = [p for u in manifest["units"]["per_unit"] for p in u["pieces"]]
    assert [p["split_by"] for p in pieces] == [split_by] * 4
    assert ("labels" in manifest["columns"]) == (case in ("parquet-labels", "jsonl-loss-mask"))


def write_megatron(prefix: Path, docs: list[list[int]]) -> Path:
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for doc in docs:
        builder.add_document(torch.tensor(doc), [len(doc)])
    builder.finalize(f"{prefix}.idx")
    return prefix


def test_megatron_units_cut_at_sequences(tmp_path: Path) -> None:
    docs, _ = make_ids(500, seed=1)
    prefix = write_megatron(tmp_path / "corpus_text_document", docs)
    idx = Path(f"{prefix}.idx")
    units = plan_units(resolve_inputs([idx]), 4)
    pieces = [p for u in units for p in u.pieces]
    assert [p.split_by for p in pieces] == ["sequences"] * 4
    assert pieces[0].start == 0 and pieces[-1].stop == len(docs)
    assert all(a.stop == b.start for a, b in itertools.pairwise(pieces))
    options = {"max_len": 64, "pad_id": 0, "split_on_eos": 2, "eos_token": "2"}
    check_units_against_one_pack(tmp_path, [idx], 4, **options)


def test_a_bad_id_in_a_later_unit_names_its_row_in_the_file(tmp_path: Path) -> None:
    docs, _ = make_ids(300)
    docs[250] = [5, -1, 6]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"ids": d}) + "\n" for d in docs))
    pq.write_table(pa.table({"ids": docs}), tmp_path / "in.parquet", row_group_size=20)
    for path in (src, tmp_path / "in.parquet"):
        args = ("pack", path, "-L", "64", "--ids-field", "ids", "--pad-id", "0", "-q")
        one = run(*args, "-o", tmp_path / f"one-{path.suffix}")
        # JSON Lines names the line (251, counted from 1), Parquet the row (250, from 0)
        assert_one_line_error(one, r"in\.jsonl:251: " if path == src else r"row 250: ")
        units = run(*args, "-o", tmp_path / f"u-{path.suffix}", "--units", "4", "--num-proc", "1")
        assert units.stderr.strip().splitlines()[-1] == one.stderr.strip().splitlines()[-1]
