"""End-to-end behaviour of `packtool.pack`: rows, accounting, round trips, overflow, output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLE, CharTokenizer, write_jsonl
from helpers import assert_row_invariants, documents_from_rows, read_rows

import packtool
from packtool.errors import BadRecordError, NothingToPackError, OptionError, OutputExistsError
from packtool.tokenize import DocumentEncoder


def test_worked_example_row(tmp_path: Path, char_tokenizer: CharTokenizer) -> None:
    # Documents of 5, 9 and 7 tokens (4, 8, 6 characters + EOS) in one row of 24.
    src = write_jsonl(
        tmp_path / "in.jsonl", [{"text": "aaaa"}, {"text": "b" * 8}, {"text": "c" * 6}]
    )
    report = packtool.pack(
        [src], tmp_path / "out", max_len=24, tokenizer=char_tokenizer, shuffle=False
    )
    manifest, rows = read_rows(tmp_path / "out")
    assert report.rows == 1 and len(rows) == 1
    row = rows[0]
    a, b, c = ord("a") + 3, ord("b") + 3, ord("c") + 3
    # FFD places the longest first: b (9), c (7), a (5), then 3 pad tokens (pad id 1).
    assert row["input_ids"] == [b] * 8 + [0] + [c] * 6 + [0] + [a] * 4 + [0] + [1, 1, 1]
    assert row["position_ids"] == list(range(9)) + list(range(7)) + list(range(5)) + [0, 1, 2]
    assert row["cu_seqlens"] == [0, 9, 16, 21, 24]
    assert row["num_tokens"] == 21
    assert row["doc_ids"] == [1, 2, 0]
    assert row["chunk_ids"] == [0, 0, 0]
    assert manifest["efficiency"] == pytest.approx(21 / 24)
    assert manifest["lower_bound_rows"] == 1


def test_full_row_has_no_padding_segment(tmp_path: Path, char_tokenizer: CharTokenizer) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "a" * 7}, {"text": "b" * 7}])
    packtool.pack([src], tmp_path / "out", max_len=16, tokenizer=char_tokenizer)
    _, rows = read_rows(tmp_path / "out")
    assert rows[0]["cu_seqlens"] == [0, 8, 16]
    assert rows[0]["num_tokens"] == 16
    assert_row_invariants(rows[0], 16, 1)


@pytest.mark.parametrize(
    ("policy", "expect"),
    [
        ("split", {"packed": 2, "split": 1, "truncated": 0, "dropped": 0, "empty": 1}),
        ("truncate", {"packed": 2, "split": 0, "truncated": 1, "dropped": 0, "empty": 1}),
        ("drop", {"packed": 2, "split": 0, "truncated": 0, "dropped": 1, "empty": 1}),
    ],
)
def test_overflow_policies(
    tmp_path: Path, char_tokenizer: CharTokenizer, policy: str, expect: dict
) -> None:
    texts = ["x" * 24, "", "yy", "zzz"]  # 25, empty, 3, 4 tokens with EOS
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts])
    report = packtool.pack(
        [src], tmp_path / "out", max_len=10, tokenizer=char_tokenizer, overflow=policy
    )
    counts = report.documents
    assert counts.read == 4
    for key, value in expect.items():
        assert getattr(counts, key) == value, key
    manifest, rows = read_rows(tmp_path / "out")
    assert manifest["documents"] == {**expect, "read": 4, "bad_records_skipped": 0}
    docs = documents_from_rows(rows)
    x_tokens = [ord("x") + 3] * 24 + [0]
    if policy == "split":
        assert docs[0] == x_tokens  # chunks 10, 10, 5 joined back in order
        assert sorted(
            c for r in rows for d, c in zip(r["doc_ids"], r["chunk_ids"], strict=True) if d == 0
        ) == [
            0,
            1,
            2,
        ]
        assert report.tokens == 25 + 3 + 4
    elif policy == "truncate":
        assert docs[0] == x_tokens[:10]
        assert report.counts.tokens.truncated_away == 15
        assert manifest["tokens"]["truncated_away"] == 15
    else:
        assert 0 not in docs
        assert report.counts.tokens.dropped == 25
    assert 1 not in docs  # the empty document
    assert docs[2] == [ord("y") + 3] * 2 + [0]
    for row in rows:
        assert_row_invariants(row, 10, 1)


def test_bos_and_eos_options(tmp_path: Path) -> None:
    tok = CharTokenizer(bos_in_post_processor=True)
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "ab"}])
    a, b = ord("a") + 3, ord("b") + 3
    cases = {
        "default": ({}, [2, a, b, 0]),  # the post-processor's BOS, then EOS
        "no-bos": ({"bos": False}, [a, b, 0]),
        "bos": ({"bos": True}, [2, a, b, 0]),
        "no-eos": ({"add_eos": False}, [2, a, b]),
    }
    for name, (kwargs, expected) in cases.items():
        packtool.pack([src], tmp_path / name, max_len=8, tokenizer=tok, **kwargs)
        _, rows = read_rows(tmp_path / name)
        assert rows[0]["input_ids"][: rows[0]["num_tokens"]] == expected, name


def test_sample_corpus_round_trip(tmp_path: Path) -> None:
    """Every document of the sample corpus comes back, token for token, and decodes to its text."""
    out = tmp_path / "out"
    report = packtool.pack([SAMPLE], out, max_len=1024, rows_per_shard=300)
    manifest, rows = read_rows(out)
    texts = [json.loads(line)["text"] for line in SAMPLE.read_text(encoding="utf-8").splitlines()]
    tok = packtool.load_tokenizer()
    encoder = DocumentEncoder(tok)
    expected = encoder.encode(texts)
    docs = documents_from_rows(rows)
    counts = report.documents
    assert counts.read == len(texts)
    assert counts.empty == sum(1 for t in texts if t == "")
    assert counts.packed + counts.split + counts.empty == counts.read
    assert counts.split == sum(1 for n in expected.lengths if n > 1024)
    offsets = expected.offsets
    for i, text in enumerate(texts):
        if text == "":
            assert i not in docs
            continue
        want = expected.ids[offsets[i] : offsets[i] + expected.lengths[i]].tolist()
        assert docs[i] == want, f"document {i}"
        assert docs[i][-1] == tok.special.eos_id
        assert tok.decode(docs[i][:-1]) == text
    assert len(docs) == counts.read - counts.empty
    for row in rows:
        assert_row_invariants(row, 1024, tok.special.pad_id)
    # The manifest's figures agree with the rows.
    assert manifest["rows"] == len(rows) == report.rows
    assert manifest["tokens"]["packed"] == sum(r["num_tokens"] for r in rows)
    assert manifest["segments"] == sum(len(r["doc_ids"]) for r in rows)
    assert manifest["lower_bound_rows"] == -(-manifest["tokens"]["packed"] // 1024)
    assert len(manifest["shards"]) == -(-len(rows) // 300)
    assert manifest["inputs"][0]["documents"] == len(texts)
    assert (out / "tokenizer.json").read_bytes() == tok.json_bytes


def test_deterministic_and_shuffle_is_a_permutation(tmp_path: Path) -> None:
    a = packtool.pack([SAMPLE], tmp_path / "a", max_len=2048)
    b = packtool.pack([SAMPLE], tmp_path / "b", max_len=2048)
    c = packtool.pack([SAMPLE], tmp_path / "c", max_len=2048, shuffle=False)
    d = packtool.pack([SAMPLE], tmp_path / "d", max_len=2048, seed=1)
    for x in (a, b, c, d):
        assert x.rows == a.rows
    _, rows_a = read_rows(tmp_path / "a")
    _, rows_b = read_rows(tmp_path / "b")
    _, rows_c = read_rows(tmp_path / "c")
    _, rows_d = read_rows(tmp_path / "d")
    assert rows_a == rows_b
    assert [a["shards"] for a in [a.manifest]] == [b.manifest["shards"]]
    assert rows_a != rows_c and rows_a != rows_d

    def key(r: dict) -> tuple:
        return tuple(r["doc_ids"]), tuple(r["chunk_ids"])

    assert sorted(map(key, rows_a)) == sorted(map(key, rows_c)) == sorted(map(key, rows_d))
    # Unshuffled FFD order opens rows with the longest items first.
    firsts = [r["cu_seqlens"][1] for r in rows_c]
    assert firsts == sorted(firsts, reverse=True)


def test_output_loads_with_datasets(tmp_path: Path) -> None:
    import datasets

    packtool.pack([SAMPLE], tmp_path / "out", max_len=512, rows_per_shard=1000)
    _, rows = read_rows(tmp_path / "out")
    ds = datasets.load_from_disk(str(tmp_path / "out"))
    assert len(ds) == len(rows)
    assert ds[0]["input_ids"] == rows[0]["input_ids"]
    assert ds[len(rows) - 1]["cu_seqlens"] == rows[-1]["cu_seqlens"]
    assert set(ds.column_names) >= {"input_ids", "position_ids", "cu_seqlens", "num_tokens"}
    ds2 = datasets.load_dataset(
        "arrow",
        data_files=str(tmp_path / "out" / "*.arrow"),
        split="train",
        cache_dir=str(tmp_path / "cache"),
    )
    assert len(ds2) == len(rows)
    assert ds2[3]["position_ids"] == rows[3]["position_ids"]


def test_existing_output_refused_then_overwritten(
    tmp_path: Path, docs_jsonl: Path, char_tokenizer: CharTokenizer
) -> None:
    out = tmp_path / "out"
    packtool.pack([docs_jsonl], out, max_len=16, tokenizer=char_tokenizer)
    with pytest.raises(OutputExistsError, match=r"already exists.*--overwrite"):
        packtool.pack([docs_jsonl], out, max_len=16, tokenizer=char_tokenizer)
    with pytest.raises(
        OutputExistsError, match=r"is finished .*--resume continues only an interrupted run"
    ):
        packtool.pack([docs_jsonl], out, max_len=16, tokenizer=char_tokenizer, resume=True)
    report = packtool.pack([docs_jsonl], out, max_len=32, tokenizer=char_tokenizer, overwrite=True)
    assert json.loads((out / "manifest.json").read_text())["max_len"] == 32 == report.max_len
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl", "out"]


def test_failure_leaves_no_output_and_no_temporaries(
    tmp_path: Path, char_tokenizer: CharTokenizer
) -> None:
    lines = [json.dumps({"text": "fine"})] * 5000 + ['{"text": broken']
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(BadRecordError, match=r"in\.jsonl:5001: malformed JSON"):
        packtool.pack(
            [tmp_path / "in.jsonl"], tmp_path / "out", max_len=16, tokenizer=char_tokenizer
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_skip_bad_records_counts_them(tmp_path: Path, char_tokenizer: CharTokenizer) -> None:
    lines = [
        '{"text": "good"}',
        '{"text": broken',
        '{"other": 1}',
        '{"text": 7}',
        "[1]",
        '{"text": "fine"}',
    ]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    report = packtool.pack(
        [tmp_path / "in.jsonl"],
        tmp_path / "out",
        max_len=16,
        tokenizer=char_tokenizer,
        skip_bad_records=True,
    )
    assert report.documents.read == 6
    assert report.documents.bad_records_skipped == 4
    assert report.documents.packed == 2
    assert len(report.bad_records) == 4 and "in.jsonl:2" in report.bad_records[0]
    _, rows = read_rows(tmp_path / "out")
    assert sorted(documents_from_rows(rows)) == [0, 5]  # doc ids keep their record numbers


def test_max_len_validated(tmp_path: Path, docs_jsonl: Path) -> None:
    with pytest.raises(OptionError, match="--max-len must be an integer from 2 to 16,777,216"):
        packtool.pack([docs_jsonl], tmp_path / "out", max_len=1)
    with pytest.raises(OptionError, match="--overflow must be one of"):
        packtool.pack([docs_jsonl], tmp_path / "out", max_len=8, overflow="wrap")


def test_empty_corpus_is_an_error_but_an_empty_unit_is_an_empty_dataset(
    tmp_path: Path, char_tokenizer: CharTokenizer
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": ""}])
    with pytest.raises(NothingToPackError, match=r"in\.jsonl: of 1 read, 1 empty \(no tokens\)"):
        packtool.pack([src], tmp_path / "out", max_len=8, tokenizer=char_tokenizer)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
    report = packtool.pack(
        [src], tmp_path / "out", max_len=8, tokenizer=char_tokenizer, allow_empty=True
    )
    assert report.rows == 0 and report.documents.empty == 1
    manifest, rows = read_rows(tmp_path / "out")
    assert rows == [] and manifest["rows"] == 0 and len(manifest["shards"]) == 1


def test_reader_matches_rows(tmp_path: Path) -> None:
    packtool.pack([SAMPLE], tmp_path / "out", max_len=512, rows_per_shard=700)
    _, rows = read_rows(tmp_path / "out")
    reader = packtool.open_packed(tmp_path / "out")
    assert len(reader) == len(rows)
    for i in (0, 699, 700, len(rows) - 1):
        r = reader[i]
        assert r.input_ids.tolist() == rows[i]["input_ids"]
        assert r.cu_seqlens.tolist() == rows[i]["cu_seqlens"]
        segs = r.segments
        assert [s.doc_id for s in segs if not s.is_padding] == rows[i]["doc_ids"]
        assert sum(s.length for s in segs) == 512
    with pytest.raises(IndexError, match="out of range"):
        reader[len(rows)]
    with pytest.raises(packtool.PacktoolError, match=r"row -1 is out of range"):
        reader[-1]
    tok = reader.load_tokenizer()
    assert tok.special.eos_id == packtool.load_tokenizer().special.eos_id
    assert np.array_equal(reader[0].position_ids, np.asarray(rows[0]["position_ids"]))
