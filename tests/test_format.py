"""The format module: schema, features, writer atomicity, checksums, reader errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from packtool.errors import FormatError
from packtool.format import (
    FORMAT_VERSION,
    PackedBatch,
    ShardWriter,
    hf_features,
    open_packed,
    packed_schema,
)


def test_hf_features_match_datasets_own_conversion() -> None:
    import datasets

    for labels in (False, True):
        schema = packed_schema(16, with_labels=labels)
        assert hf_features(schema) == datasets.Features.from_arrow_schema(schema).to_dict()


def _batch(rows: int, max_len: int, start: int = 0) -> PackedBatch:
    ids = np.arange(start * max_len, (start + rows) * max_len, dtype=np.int32).reshape(
        rows, max_len
    )
    return PackedBatch(
        input_ids=ids,
        position_ids=np.tile(np.arange(max_len, dtype=np.int32), (rows, 1)),
        cu_values=np.tile(np.array([0, max_len], np.int32), rows),
        cu_offsets=np.arange(0, 2 * rows + 1, 2),
        num_tokens=np.full(rows, max_len, np.int32),
        doc_ids=np.arange(start, start + rows, dtype=np.int64),
        chunk_ids=np.zeros(rows, np.int32),
        seg_offsets=np.arange(rows + 1),
    )


def test_writer_round_trip_shards_and_checksums(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with ShardWriter(out, max_len=4, num_rows=10, rows_per_shard=4) as w:
        w.write(_batch(3, 4))
        w.write(_batch(7, 4, start=3))
        manifest = w.commit({"note": "x"})
    assert [s["rows"] for s in manifest["shards"]] == [4, 4, 2]
    assert [s["file"] for s in manifest["shards"]] == [
        f"data-0000{i}-of-00003.arrow" for i in range(3)
    ]
    for s in manifest["shards"]:
        assert s["sha256"] == hashlib.sha256((out / s["file"]).read_bytes()).hexdigest()
        assert s["bytes"] == (out / s["file"]).stat().st_size
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == manifest and on_disk["format_version"] == FORMAT_VERSION
    reader = open_packed(out)
    assert len(reader) == 10
    for i in range(10):
        assert reader[i].input_ids.tolist() == list(range(4 * i, 4 * i + 4))
        assert reader[i].doc_ids.tolist() == [i]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_writer_without_commit_leaves_nothing(tmp_path: Path) -> None:
    with (
        pytest.raises(RuntimeError, match="boom"),
        ShardWriter(tmp_path / "out", max_len=4, num_rows=3, rows_per_shard=2) as w,
    ):
        w.write(_batch(3, 4))
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with ShardWriter(tmp_path / "out", max_len=4, num_rows=3, rows_per_shard=2) as w:
        w.write(_batch(2, 4))
        with pytest.raises(RuntimeError, match="wrote 2 rows, expected 3"):
            w.commit({})
    assert list(tmp_path.iterdir()) == []


def test_reader_refuses_non_outputs(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="no such directory"):
        open_packed(tmp_path / "missing")
    (tmp_path / "d").mkdir()
    with pytest.raises(FormatError, match=r"not a packtool output: it has no manifest\.json"):
        open_packed(tmp_path / "d")
    (tmp_path / "d" / "manifest.json").write_text("{not json")
    with pytest.raises(FormatError, match="unreadable manifest"):
        open_packed(tmp_path / "d")
    (tmp_path / "d" / "manifest.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(FormatError, match="not a packtool manifest"):
        open_packed(tmp_path / "d")
    (tmp_path / "d" / "manifest.json").write_text(
        json.dumps({"format": "packtool.packed", "format_version": 99})
    )
    with pytest.raises(FormatError, match="format version 99 is not supported"):
        open_packed(tmp_path / "d")


def test_reader_reports_a_truncated_shard(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with ShardWriter(out, max_len=4, num_rows=4, rows_per_shard=4) as w:
        w.write(_batch(4, 4))
        w.commit({})
    shard = out / "data-00000-of-00001.arrow"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(FormatError, match="cannot read shard"):
        open_packed(out)[0]


GOLDEN = Path(__file__).parent / "data" / "golden-v1"
GOLDEN_INPUT = Path(__file__).parent / "data" / "golden_input.jsonl"


def test_golden_v1_output_still_reads_and_is_reproduced(tmp_path: Path) -> None:
    """A format-1 output committed to the repo: today's reader reads it, and today's pack
    writes the same rows and figures from the same input (a format change shows here)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import CharTokenizer
    from helpers import assert_row_invariants, documents_from_rows, read_rows

    import packtool

    golden_manifest, golden_rows = read_rows(GOLDEN)
    assert golden_manifest["format_version"] == 1
    reader = open_packed(GOLDEN)
    assert [reader[i].input_ids.tolist() for i in range(len(reader))] == [
        r["input_ids"] for r in golden_rows
    ]
    for row in golden_rows:
        assert_row_invariants(row, 16, 1)
    texts = [json.loads(line)["text"] for line in GOLDEN_INPUT.read_text().splitlines()]
    docs = documents_from_rows(golden_rows)
    for i, text in enumerate(texts):
        if text:
            assert "".join(chr(t - 3) for t in docs[i][:-1]) == text and docs[i][-1] == 0

    packtool.pack(
        [GOLDEN_INPUT],
        tmp_path / "now",
        max_len=16,
        tokenizer=CharTokenizer(),
        rows_per_shard=3,
        seed=7,
    )
    manifest, rows = read_rows(tmp_path / "now")
    assert rows == golden_rows
    for key in (
        "format",
        "format_version",
        "max_len",
        "columns",
        "documents",
        "segments",
        "tokens",
        "rows",
        "lower_bound_rows",
        "efficiency",
    ):
        assert manifest[key] == golden_manifest[key], key
    assert [s["rows"] for s in manifest["shards"]] == [s["rows"] for s in golden_manifest["shards"]]


def test_the_segment_length_histogram_is_exact(tmp_path: Path) -> None:
    """`segment_lengths` gives back every segment's length, whichever way it is counted."""
    import numpy as np

    from packtool.format import DocumentCounts, Manifest, RunFigures, TokenCounts

    rng = np.random.default_rng(5)
    for lengths in (rng.integers(1, 4097, 5000), rng.integers(1, 1 << 24, 300), np.zeros(0)):
        lengths = lengths.astype(np.int32)
        m = Manifest.for_pack(
            version="0", tokenizer={}, options={}, inputs=[],
            figures=RunFigures(DocumentCounts(), int(lengths.size), TokenCounts(), 1, 1, 1 << 24,
                               [], 0, False, 0.0, segment_lengths=lengths),
        )  # fmt: skip
        assert m.segment_lengths is not None
        assert m.segment_lengths.tolist() == sorted(lengths.tolist())
