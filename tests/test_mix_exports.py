"""Exports of a mixture (``pack --mix``): LitData and Megatron-Bridge carry each segment's
source id (read back here by LitData's ``StreamingDataset`` and by Megatron-Bridge's own packed
dataset, installed --no-deps); Megatron-LM's indexed dataset has no place for them, so the
export leaves them out and says so in one notice line (docs/export.md). Plain packs export as
before: no source column, no notice."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_alignment import _bridge
from test_cli import run
from test_mix_pack import sources  # noqa: F401  (the module's fixture: three sources)

import packtool
from packtool.export import export, verify_export

L = 256


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory, sources) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("mixed") / "out"
    packtool.pack(sources, out, max_len=L, mix="1,1,1", tokens="300k", rows_per_shard=200)
    return out


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory, sources) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("plain") / "out"
    packtool.pack(sources, out, max_len=L)
    return out


def test_megatron_leaves_the_source_ids_out_with_one_notice(
    tmp_path: Path, mixed: Path, plain: Path
) -> None:
    result = run("export", mixed, "--to", "megatron", "-o", tmp_path / "mega", "-q")
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "--to megatron has no place for its source ids" in notes[0]
    assert "left out" in notes[0]
    written = b"".join(p.read_bytes() for p in (tmp_path / "mega").iterdir())
    assert b"source_ids" not in written
    assert verify_export(mixed, tmp_path / "mega").ok
    quiet = run("export", plain, "--to", "megatron", "-o", tmp_path / "plain", "-q")
    assert quiet.exit_code == 0 and quiet.stderr == ""  # a plain pack: nothing to say


def test_litdata_items_carry_the_source_ids(tmp_path: Path, mixed: Path, plain: Path) -> None:
    import litdata

    report = export(mixed, tmp_path / "lit", to="litdata")
    assert report.notices == [] and "source_ids" in report.record["columns"]
    dataset = litdata.StreamingDataset(str(tmp_path / "lit"))
    reader = packtool.open_packed(mixed)
    assert len(dataset) == reader.num_rows
    seen = set()
    for r in range(reader.num_rows):
        item, row = dataset[r], reader.row(r)
        assert item["source_ids"].dtype == np.int32
        assert item["source_ids"].tolist() == row.source_ids.tolist()
        assert len(item["source_ids"]) == len(item["doc_ids"])
        seen.update(row.source_ids.tolist())
    assert seen == {0, 1, 2}
    assert verify_export(mixed, tmp_path / "lit").ok
    plain_report = export(plain, tmp_path / "plain", to="litdata")
    assert "source_ids" not in plain_report.record["columns"]
    assert "source_ids" not in litdata.StreamingDataset(str(tmp_path / "plain"))[0]


def test_megatron_bridge_reads_a_mixture_export_with_its_source_ids(
    tmp_path: Path, mixed: Path
) -> None:
    """Their GPTSFTPackedDataset (Megatron-Bridge 0.3.1, the released reader of the .npy)
    loads the entries, which carry source_ids beside the three keys it reads, and cuts and
    collates them as without it; the parquet holds the same entries, its three columns the
    ones their parquet reader (after 0.3.1) asks for by name."""
    sft = _bridge("data.datasets.sft")
    tokenizers = _bridge("training.tokenizers.tokenizer")
    report = export(mixed, tmp_path / "mb", to="megatron-bridge", npy=True)
    assert report.notices == []
    reader = packtool.open_packed(mixed)
    dataset = sft.create_sft_dataset(
        tmp_path / "mb" / f"training_{L}.npy",
        tokenizers._HuggingFaceTokenizer(str(mixed)),
        seq_length=L,
        pad_to_max_length=True,
    )
    assert len(dataset) == reader.num_rows
    table = pq.read_table(tmp_path / "mb" / f"training_{L}.idx.parquet")
    assert table.column_names == ["input_ids", "loss_mask", "seq_start_id", "source_ids"]
    parquet = table.to_pylist()
    for r in range(reader.num_rows):
        row = reader.row(r)
        entry = dataset.indexed_dataset[r]  # their loader's entry (np.load of the pickle)
        assert entry["source_ids"] == row.source_ids.tolist() == parquet[r]["source_ids"]
        assert len(entry["source_ids"]) == len(entry["seq_start_id"])
        assert entry == parquet[r]
        item = dataset[r]  # their item: the three keys they read
        assert item["seq_boundaries"] == entry["seq_start_id"] + [row.num_tokens]
        batch = dataset.collate_fn([item])  # each sequence's inputs: its tokens but the last
        inputs = [
            t for g in row.segments if not g.is_padding for t in row.input_ids[g.start : g.end - 1]
        ]
        assert batch["tokens"][0][: len(inputs)].tolist() == inputs
    assert verify_export(mixed, tmp_path / "mb").ok


def test_verify_finds_a_wrong_source_id_in_a_bridge_export(tmp_path: Path, mixed: Path) -> None:
    dest = tmp_path / "mb"
    export(mixed, dest, to="megatron-bridge")
    path = dest / f"training_{L}.idx.parquet"
    rows = pq.read_table(path).to_pylist()
    rows[3]["source_ids"][0] = (rows[3]["source_ids"][0] + 1) % 3
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(path)), path)
    record = json.loads((dest / "export.json").read_text())
    record["files"][path.name] = {
        "bytes": path.stat().st_size,
        "sha256": packtool.format.sha256_file(path),
    }
    (dest / "export.json").write_text(json.dumps(record))
    assert verify_export(mixed, dest).problems == [
        f"{path.name} row 3: source_ids differs from the pack"
    ]


def test_a_plain_bridge_export_is_unchanged(tmp_path: Path, plain: Path) -> None:
    export(plain, tmp_path / "mb", to="megatron-bridge", npy=True)
    schema = pq.read_schema(tmp_path / "mb" / f"training_{L}.idx.parquet")
    assert schema.names == ["input_ids", "loss_mask", "seq_start_id"]
    npy = tmp_path / "mb" / f"training_{L}.npy"
    entries = np.load(npy, allow_pickle=True)
    assert list(entries[0]) == ["input_ids", "loss_mask", "seq_start_id"]
    # byte for byte the pickle of the entries as written before mixtures had source ids
    rows = pq.read_table(tmp_path / "mb" / f"training_{L}.idx.parquet").to_pylist()
    before = np.empty(len(rows), dtype=object)
    before[:] = [
        {
            "input_ids": r["input_ids"],
            "loss_mask": r["loss_mask"],
            "seq_start_id": r["seq_start_id"],
        }
        for r in rows
    ]
    buffer = io.BytesIO()
    np.save(buffer, before, allow_pickle=True)
    assert npy.read_bytes() == buffer.getvalue()
