"""The format module: schema, features, writer atomicity, checksums, reader errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.errors import FormatError
from packtool.format import (
    COLUMNS,
    FORMAT_VERSION,
    Column,
    PackedBatch,
    Per,
    ShardWriter,
    SpecialIds,
    column_names,
    columns,
    hf_features,
    open_packed,
    packed_schema,
    row_bytes,
    schema_problem,
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
    """A format-1 output committed to the repo, written before the ``seq_lengths`` column:
    today's reader reads and verifies it, and today's pack writes the same rows and figures
    from the same input, plus ``seq_lengths`` (the documents' lengths, then one per pad)."""
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

    def expected(row: dict) -> list[int]:  # the documents' lengths, then one per pad
        lengths = np.diff(row["cu_seqlens"]).tolist()
        pads = row["cu_seqlens"][-1] - row["num_tokens"]
        return lengths[:-1] + [1] * pads if pads else lengths

    for row in rows:
        assert row.pop("seq_lengths") == expected(row)
    assert rows == golden_rows
    assert manifest["columns"] == [*golden_manifest["columns"], "seq_lengths"]
    assert "seq_lengths" not in golden_manifest["columns"]
    assert not reader.has_seq_lengths
    assert [reader[i].seq_lengths.tolist() for i in range(len(reader))] == [
        expected(r) for r in golden_rows
    ]
    assert packtool.verify(GOLDEN).ok
    for key in (
        "format",
        "format_version",
        "max_len",
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

    from packtool.format import Counts, Manifest, RunFigures

    rng = np.random.default_rng(5)
    for lengths in (rng.integers(1, 4097, 5000), rng.integers(1, 1 << 24, 300), np.zeros(0)):
        lengths = lengths.astype(np.int32)
        m = Manifest.for_pack(
            tokenizer={}, options={}, inputs=[],
            figures=RunFigures(Counts(), int(lengths.size), 1, 1, 1 << 24, [], 0, False, 0.0,
                               segment_lengths=lengths),
        )  # fmt: skip
        assert m.segment_lengths is not None
        assert m.segment_lengths.tolist() == sorted(lengths.tolist())


# -- the column table and what is derived from it --------------------------------------------


def _doc_type(column: Column) -> str:
    value = str(column.value)
    if column.per is Per.TOKEN:
        return f"fixed_size_list<{value}>[max_len]"
    return value if column.per is Per.ROW else f"list<{value}>"


def test_the_column_table_is_the_one_of_docs_format() -> None:
    """docs/format.md's table of columns names each column of COLUMNS, with its type, in
    stored order, and says which are for instruction data only."""
    import re

    from conftest import REPO

    doc = (REPO / "docs" / "format.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)` \| `([^`]+)` \| (.*) \|$", doc, flags=re.M)
    assert [(name, kind) for name, kind, _ in rows] == [(c.name, _doc_type(c)) for c in COLUMNS]
    for (_, _, meaning), column in zip(rows, COLUMNS, strict=True):
        assert ("instruction data only" in meaning) == column.labels_only, column.name
        assert ("packs written before" in meaning) == column.added, column.name


@pytest.mark.parametrize("labels", [False, True])
def test_the_schema_and_row_size_come_from_the_column_table(labels: bool) -> None:
    max_len = 24
    schema = packed_schema(max_len, with_labels=labels)
    assert schema.names == column_names(labels) == [c.name for c in columns(labels)]
    assert ("labels" in schema.names) == labels
    for column in columns(labels):
        field = schema.field(column.name)
        assert not field.nullable and field.type == column.arrow_type(max_len)
    assert set(hf_features(schema)) == set(schema.names)
    # input_ids, position_ids (and labels) as int32 rows of max_len, and a little for the rest
    assert row_bytes(max_len, labels) == (3 if labels else 2) * 4 * max_len + 64
    assert column_names(labels, Per.TOKEN) == ["input_ids", "position_ids"] + (
        ["labels"] if labels else []
    )
    assert column_names(labels, Per.BOUNDARY, Per.SEGMENT) == ["cu_seqlens", "doc_ids", "chunk_ids"]


def test_the_schema_check_names_each_missing_or_mistyped_column() -> None:
    import pyarrow as pa

    schema = packed_schema(8, with_labels=True)
    assert schema_problem(schema, 8, True) is None
    assert schema_problem(schema, 8, False) is None  # a column this check does not ask for
    for column in columns(True):
        without = schema.remove(schema.get_field_index(column.name))
        assert schema_problem(without, 8, True) == f"the shard has no column {column.name!r}"
        other = schema.set(schema.get_field_index(column.name), pa.field(column.name, pa.string()))
        assert f"column {column.name!r} is string" in str(schema_problem(other, 8, True))


def test_a_row_reads_back_column_by_column(tmp_path: Path) -> None:
    """PackedBatch.to_table and PackedReader.row follow the table: what is written is read."""
    rows, max_len = 3, 6
    batch = _batch(rows, max_len)
    labelled = PackedBatch(**{**batch.__dict__, "labels": batch.input_ids * 0 - 100})
    for b in (batch, labelled):
        out = tmp_path / f"out{b.labels is not None}"
        with ShardWriter(out, max_len=max_len, num_rows=rows, rows_per_shard=2,
                         with_labels=b.labels is not None) as w:  # fmt: skip
            w.write(b)
            w.commit({})
        reader = open_packed(out)
        for r in range(rows):
            row = reader.row(r)
            assert row.input_ids.tolist() == b.input_ids[r].tolist()
            assert row.position_ids.tolist() == b.position_ids[r].tolist()
            assert row.cu_seqlens.tolist() == [0, max_len]
            assert row.num_tokens == max_len
            assert row.doc_ids.tolist() == [r] and row.chunk_ids.tolist() == [0]
            assert (row.labels is None) == (b.labels is None)
            if b.labels is not None:
                assert row.labels.tolist() == [-100] * max_len


# -- the manifest's typed accessors -----------------------------------------------------------


def test_typed_accessors_of_an_instruction_pack(tmp_path: Path) -> None:
    from conftest import REPO

    import packtool

    out = tmp_path / "out"
    packtool.pack(
        [REPO / "sample_data" / "chat.jsonl"],
        out,
        max_len=2048,
        chat_template=REPO / "sample_data" / "chatml.jinja",
        seed=3,
    )
    m = open_packed(out).manifest
    raw = json.loads((out / "manifest.json").read_text())
    special, options = raw["tokenizer"]["special_tokens"], m.recorded_options
    assert m.tokenizer.special_tokens == SpecialIds(**special)
    assert options.pad_id == raw["options"]["pad_id"]
    assert options.add_eos == raw["options"]["add_eos"] and options.bos == raw["options"]["bos"]
    assert options.shuffle and m.row_seed == 3
    assert options.chat_template is not None
    assert options.chat_template.sha256 == raw["options"]["chat_template"]["sha256"]
    assert options.chat_template.source == "file"
    labels = m.labels
    assert labels is not None and labels.loss_on == raw["labels"]["loss_on"] == "assistant"
    assert m.tokens is not None and m.documents is not None
    assert labels.learned_tokens == raw["labels"]["learned_tokens"] == m.tokens.learned
    assert m.dropped_label_chunks == raw["labels"]["chunks_without_labels_dropped"]
    assert m.tokens.packed == raw["tokens"]["packed"]
    assert m.documents.read == raw["documents"]["read"]
    backend = m.tokenizer.backend
    assert backend is not None and backend.name == raw["tokenizer"]["backend"]["name"]
    assert backend.version == raw["tokenizer"]["backend"]["version"]
    assert backend.record == raw["tokenizer"]["backend"]
    assert [i.to_record() for i in m.inputs] == raw["inputs"]
    assert [s.to_record() for s in m.shards] == raw["shards"]
    assert options.rows_per_shard == raw["options"]["rows_per_shard"]
    assert m.units is None and m.unit is None and m.balance is None
    assert m.load_problems == () and m.problems() == []


def _damaged() -> dict:
    return {
        "options": {"seed": "7", "shuffle": True, "pad_id": True, "chat_template": "x"},
        "tokenizer": {"special_tokens": {"eos_id": 1.5, "bos_id": None}},
        "labels": {"loss_on": 3, "chunks_without_labels_dropped": "2"},
        "documents": {"read": -1.0},
        "units": {"count": "3", "packing_loss": "x", "copied": 1, "plan": "p"},
        "unit": {"index": False, "plan": 5},
        "balance": {"world_size": 2.0},
    }


def test_a_lenient_manifest_reads_damaged_values_as_none() -> None:
    from packtool.format import Manifest

    m = Manifest.from_record(_damaged(), strict=False)
    options, special = m.recorded_options, m.tokenizer.special
    assert options.shuffle and m.row_seed is None and options.pad_id is None
    assert options.chat_template is None and special.eos_id is None and special.bos_id is None
    assert m.labels is not None and m.labels.loss_on is None
    assert m.dropped_label_chunks == 0 and m.documents is None and m.tokens is None
    units = m.units
    assert units is not None and units.plan == "p"
    assert (units.count, units.packing_loss, units.copied) == (None, None, None)
    assert m.unit is not None and m.unit.index is None and m.unit.plan is None
    assert m.balance is not None and m.balance.world_size is None
    # each malformed value is named by its key path, once
    assert 'options.seed must be an integer, got "7"' in m.load_problems
    assert "tokenizer.special_tokens.eos_id must be an integer, got 1.5" in m.load_problems
    assert "documents.read must be an integer, got -1.0" in m.load_problems
    assert "units.copied must be true or false, got 1" in m.load_problems
    assert len(m.load_problems) == 13, m.load_problems
    problems = m.problems()
    assert problems[: len(m.load_problems)] == list(m.load_problems)
    assert "'documents' does not hold every count (read, packed, split, ...)" in problems


def test_a_strict_manifest_refuses_a_damaged_value_in_one_line(tmp_path: Path) -> None:
    """A pack read to be used names the file and the key path of the first malformed value;
    verify and stats read the same record leniently and list what is wrong."""
    from packtool.format import Manifest

    first = r"^manifest.json: tokenizer.special_tokens.eos_id must be an integer, got 1.5$"
    with pytest.raises(FormatError, match=first):
        Manifest.from_record(_damaged())
    out = tmp_path / "out"
    with ShardWriter(out, max_len=4, num_rows=3, rows_per_shard=4) as w:
        w.write(_batch(3, 4))
        record = w.commit({}).to_dict()
    record["documents"] = {"read": "x"}
    (out / "manifest.json").write_text(json.dumps(record))
    with pytest.raises(FormatError) as e:
        open_packed(out)
    assert str(e.value) == f'{out / "manifest.json"}: documents.read must be an integer, got "x"'
    lenient = open_packed(out, strict=False).manifest
    assert lenient.documents is None
    assert 'documents.read must be an integer, got "x"' in lenient.problems()


def test_records_round_trip_through_the_generic_loader() -> None:
    """Each record read by the loader and written by to_record gives the same JSON."""
    from packtool.format.records import PieceRecord, ShardEntry

    shard = {"file": "units/u/data.arrow", "rows": 3, "bytes": 10, "sha256": "ab", "doc_offset": 0}
    assert ShardEntry.from_record(shard).to_record() == shard
    plain = {"file": "data.arrow", "rows": 3}
    assert ShardEntry.from_record(plain).to_record() == plain
    piece = {"path": "a.jsonl", "kind": "jsonl", "compression": None, "file_size": 9,
             "split_by": "bytes", "start": 0, "stop": 9}  # fmt: skip
    loaded = PieceRecord.from_record(piece)
    assert loaded.to_record() == piece and loaded.record == piece and not loaded.continues


@pytest.mark.parametrize("chat", [False, True])
def test_the_dataset_card_says_which_trainers_keep_documents_apart(
    tmp_path: Path, chat: bool
) -> None:
    """Every pack holds a README.md (written with the `datasets` metadata) naming the
    trainers' paths that keep its documents apart and those that do not."""
    from conftest import REPO

    import packtool
    from packtool.format import CARD_FILE

    if chat:
        src = tmp_path / "in.jsonl"
        lines = (REPO / "sample_data" / "chat.jsonl").read_text(encoding="utf-8").splitlines()
        src.write_text("\n".join(lines[:10]) + "\n", encoding="utf-8")
        template = REPO / "sample_data" / "chatml.jinja"
        packtool.pack([src], tmp_path / "out", max_len=256, chat_template=template)
    else:
        packtool.pack([GOLDEN_INPUT], tmp_path / "out", max_len=16)
    card = (tmp_path / "out" / CARD_FILE).read_text(encoding="utf-8")
    assert card.startswith("---\n")
    for needed in ("padding_free=True", "DataCollatorWithFlattening", "packtool check-model"):
        assert needed in card
    assert ("learns packtool's `labels`" in card) == chat
    assert ("learns no pad" in card) == (not chat)
    assert packtool.verify(tmp_path / "out").ok


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(min_value=1, max_value=50), min_size=0, max_size=6),
            st.integers(min_value=0, max_value=40),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_seq_lengths_are_the_documents_then_one_per_pad(rows: list) -> None:
    """Of many rows at once: each row's document lengths in order, then its padding as that
    many segments of 1; they sum to the row's length, and every document boundary is one."""
    from packtool.format import seq_lengths

    cu_rows, nts = [], []
    for docs, pad in rows:
        cu = np.concatenate([[0], np.cumsum(docs)]).astype(np.int64)
        nt = int(cu[-1])
        if pad or not docs:
            cu = np.append(cu, nt + max(pad, 1))
        cu_rows.append(cu)
        nts.append(nt)
    offsets = np.concatenate([[0], np.cumsum([c.size for c in cu_rows])])
    values, value_off = seq_lengths(np.concatenate(cu_rows), offsets, np.array(nts))
    for i, (cu, nt) in enumerate(zip(cu_rows, nts, strict=True)):
        got = values[value_off[i] : value_off[i + 1]].tolist()
        docs = np.diff(cu[cu <= nt]).tolist()
        assert got == docs + [1] * int(cu[-1] - nt)
        assert sum(got) == cu[-1]
        assert set(np.cumsum([0, *got]).tolist()) >= set(cu.tolist())
