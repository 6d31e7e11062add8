"""`packtool export --to litdata`: read back with LitData's own StreamingDataset, item by item
against the pack's rows; `verify --export` checks it."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO
from typer.testing import CliRunner

import packtool
from packtool.cli import app
from packtool.errors import OptionError
from packtool.export import export, verify_export

litdata = pytest.importorskip("litdata", reason="pip install -e '.[test]'")

runner = CliRunner()
GOLDEN = Path(__file__).parent / "data" / "golden-v1"  # a pack written before seq_lengths


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("chat")
    lines = (REPO / "sample_data" / "chat.jsonl").read_text(encoding="utf-8").splitlines()
    (tmp / "chat.jsonl").write_text("\n".join(lines[:40]) + "\n", encoding="utf-8")
    template = REPO / "sample_data" / "chatml.jinja"
    packtool.pack(
        [tmp / "chat.jsonl"], tmp / "out", max_len=256, chat_template=template, rows_per_shard=4
    )
    return tmp / "out"


def assert_items_are_the_rows(pack: Path, dest: Path) -> None:
    reader = packtool.open_packed(pack)
    dataset = litdata.StreamingDataset(str(dest))
    assert len(dataset) == reader.num_rows
    for r in range(reader.num_rows):
        item, row = dataset[r], reader[r]
        expected = {
            "input_ids": (row.input_ids, np.int32),
            "position_ids": (row.position_ids, np.int32),
            "cu_seqlens": (row.cu_seqlens, np.int32),
            "doc_ids": (row.doc_ids, np.int64),
            "chunk_ids": (row.chunk_ids, np.int32),
            "seq_lengths": (row.seq_lengths, np.int32),
        }
        if reader.has_labels:
            expected["labels"] = (row.labels, np.int32)
        assert sorted(item) == sorted([*expected, "num_tokens"])
        for name, (values, dtype) in expected.items():
            assert item[name].dtype == dtype, name
            assert item[name].tolist() == np.asarray(values).tolist(), (r, name)
        assert item["num_tokens"] == row.num_tokens and isinstance(item["num_tokens"], int)


def test_litdata_reads_the_rows_and_verify_checks_them(chat: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["export", str(chat), "--to", "litdata", "-o", str(tmp_path / "l")])
    assert result.exit_code == 0, result.output
    assert_items_are_the_rows(chat, tmp_path / "l")
    record = json.loads((tmp_path / "l" / "export.json").read_text())
    assert record["to"] == "litdata" and record["rows"] == packtool.open_packed(chat).num_rows
    assert "index.json" in record["files"]
    checked = runner.invoke(app, ["verify", str(chat), "--export", str(tmp_path / "l")])
    assert checked.exit_code == 0, checked.output
    assert "export (litdata) verified" in checked.output


def test_a_pack_written_before_seq_lengths(tmp_path: Path) -> None:
    export(GOLDEN, tmp_path / "l", to="litdata")
    assert_items_are_the_rows(GOLDEN, tmp_path / "l")
    assert verify_export(GOLDEN, tmp_path / "l").ok


def test_verify_finds_an_item_that_differs(chat: Path, tmp_path: Path) -> None:
    """Another export whose files are whole (export.json's sha256 updated) but one item's
    token changed: verify --export names it, read through LitData."""
    from litdata.streaming.writer import BinaryWriter

    from packtool.export.litdata import items
    from packtool.format import sha256_file

    dest = tmp_path / "l"
    export(chat, dest, to="litdata")
    forged = tmp_path / "forged"
    writer = BinaryWriter(str(forged), chunk_bytes=64 << 20)
    for i, item in enumerate(items(packtool.open_packed(chat))):
        if i == 3:
            item["input_ids"] = item["input_ids"].copy()
            item["input_ids"][5] += 1
        writer.add_item(i, item)
    writer.done()
    writer.merge()
    record = json.loads((dest / "export.json").read_text())
    for p in forged.iterdir():
        shutil.copyfile(p, dest / p.name)
        record["files"][p.name] = {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
    (dest / "export.json").write_text(json.dumps(record))
    check = verify_export(chat, dest)
    assert check.problems == ["item 3: input_ids differs from the pack's row 3"]


def test_without_litdata_the_export_says_how_to_install_it(
    chat: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "litdata", None)  # import litdata raises ImportError
    with pytest.raises(OptionError, match=r"needs LitData.*pip install"):
        export(chat, tmp_path / "l", to="litdata")
    assert not (tmp_path / "l").exists()
