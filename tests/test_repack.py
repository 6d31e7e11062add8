"""Repacking: a packed output as an input of ``pack``. Its documents are rebuilt from their
chunks and packed again with no tokenizer; the result must be the fresh pack of the original
corpus with the same options, shard for shard, or say in one line what cannot come back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import REPO, CharTokenizer, write_jsonl
from helpers import read_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli import assert_one_line_error, run

import packtool

CHATML = REPO / "sample_data" / "chatml.jinja"


def _shards(out: Path) -> list[bytes]:
    manifest = json.loads((out / "manifest.json").read_text())
    return [(out / s["file"]).read_bytes() for s in manifest["shards"]]


def _same_pack(repacked: Path, fresh: Path) -> None:
    """Same rows (byte-equal shards: ids, positions, boundaries, doc_ids, labels, order)."""
    a, b = _shards(repacked), _shards(fresh)
    assert len(a) == len(b)
    if a != b:  # say where, for a failure that can be read
        _, ra = read_rows(repacked)
        _, rb = read_rows(fresh)
        assert len(ra) == len(rb)
        for i, (x, y) in enumerate(zip(ra, rb, strict=True)):
            assert x == y, f"row {i} differs"
        raise AssertionError("the shards differ in bytes but not in rows")


def _text_corpus(tmp_path: Path, seed: int = 0, n: int = 120) -> Path:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 300, n)
    lengths[::17] = 0  # empty documents keep their numbers
    texts = ["".join(chr(97 + int(c)) for c in rng.integers(0, 26, int(k))) for k in lengths]
    return write_jsonl(tmp_path / "corpus.jsonl", [{"text": t} for t in texts])


@pytest.mark.parametrize(
    ("old", "new", "layout"),
    [
        (64, 256, {}),  # larger: split documents joined back
        (256, 48, {"seed": 7}),  # smaller: documents longer than both
        (100, 100, {"world_size": 3, "micro_batches": 2}),
        (48, 64, {"shuffle": False}),
    ],
)
def test_a_repacked_text_pack_is_the_fresh_pack(tmp_path: Path, old, new, layout) -> None:
    corpus = _text_corpus(tmp_path)
    tok = CharTokenizer()
    first = tmp_path / "first"
    packtool.pack([corpus], first, tokenizer=tok, max_len=old)
    fresh = tmp_path / "fresh"
    packtool.pack([corpus], fresh, tokenizer=tok, max_len=new, **layout)
    repacked = tmp_path / "repacked"
    report = packtool.pack([first], repacked, max_len=new, **layout)
    _same_pack(repacked, fresh)
    assert not report.notices
    manifest = json.loads((repacked / "manifest.json").read_text())
    assert manifest["tokenizer"]["special_tokens"]["eos_id"] == tok.special.eos_id
    assert manifest["options"]["add_eos"] is False  # the stored EOS is not appended again
    # A repack of a repack is the same pack again, and it verifies, against its input too.
    again = tmp_path / "again"
    packtool.pack([repacked], again, max_len=new, **layout)
    _same_pack(again, fresh)
    assert packtool.verify(repacked, against=[first]).ok


def test_the_cli_repacks_and_stats_answers_what_if(tmp_path: Path) -> None:
    corpus = _text_corpus(tmp_path, seed=1)
    first, fresh, repacked = tmp_path / "first", tmp_path / "fresh", tmp_path / "repacked"
    assert run("pack", corpus, "-o", first, "--max-len", "64").exit_code == 0
    assert run("pack", corpus, "-o", fresh, "--max-len", "200", "--seed", "3").exit_code == 0
    result = run("pack", first, "-o", repacked, "--max-len", "200", "--seed", "3")
    assert result.exit_code == 0, result.output
    _same_pack(repacked, fresh)
    # stats of the pack at other max-lens: its documents, as the corpus's stats give them
    on_pack = run("stats", first, "--max-len", "128,200", "--json", "--no-cache")
    on_corpus = run("stats", corpus, "--max-len", "128,200", "--json", "--no-cache")
    assert on_pack.exit_code == 0, on_pack.output
    pack_results = json.loads(on_pack.stdout)["max_lens"]
    assert pack_results == json.loads(on_corpus.stdout)["max_lens"]
    assert pack_results[1]["rows"] == json.loads((fresh / "manifest.json").read_text())["rows"]


def test_options_that_do_not_apply_to_a_pack_are_refused(tmp_path: Path) -> None:
    corpus = _text_corpus(tmp_path, n=10)
    first = tmp_path / "first"
    packtool.pack([corpus], first, tokenizer=CharTokenizer(), max_len=64)
    out = tmp_path / "o"
    assert_one_line_error(
        run("pack", first, "-o", out, "-L", "32", "--eos"), r"hold the EOS and BOS .* already"
    )
    assert_one_line_error(
        run("pack", first, "-o", out, "-L", "32", "--tokenizer", "gpt2"),
        r"--tokenizer does not apply to a packed output",
    )
    assert_one_line_error(
        run("pack", first, corpus, "-o", out, "-L", "32"), r"repack packed outputs alone"
    )


def _chat_corpus(tmp_path: Path, n: int = 80) -> Path:
    lines = (REPO / "sample_data" / "chat.jsonl").read_text().splitlines()[:n]
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("overflow", "old", "new", "exact"),
    [
        ("drop", 512, 256, True),  # smaller: what was dropped before is dropped again
        ("drop", 512, 1024, False),  # larger: the documents dropped at 512 are missing
        ("split", 256, 128, True),  # the old chunk starts are new chunk starts
        ("split", 256, 256, True),
        ("split", 128, 300, False),  # old chunk starts inside segments: their labels lost
        ("truncate", 256, 128, True),
    ],
)
def test_a_repacked_chat_pack_keeps_its_labels(tmp_path: Path, overflow, old, new, exact) -> None:
    corpus = _chat_corpus(tmp_path)
    options = {"chat_template": CHATML, "overflow": overflow}
    first, fresh, repacked = tmp_path / "first", tmp_path / "fresh", tmp_path / "repacked"
    packtool.pack([corpus], first, max_len=old, **options)
    packtool.pack([corpus], fresh, max_len=new, seed=5, **options)
    report = packtool.pack([first], repacked, max_len=new, seed=5)
    manifest, rows = read_rows(repacked)
    assert "labels" in manifest["columns"]
    if exact:
        _same_pack(repacked, fresh)
        assert not report.notices
        # stats of the pack at that max-len: the fresh pack's figures, labels cut as pack cuts
        (at,) = packtool.corpus_stats([first], [new], use_cache=False).results
        fresh_manifest = json.loads((fresh / "manifest.json").read_text())
        assert (at.rows, at.segments) == (fresh_manifest["rows"], fresh_manifest["segments"])
        return
    (notice,) = report.notices
    if overflow == "drop":
        dropped = json.loads((first / "manifest.json").read_text())["documents"]["dropped"]
        assert dropped and f"dropped {dropped} documents longer than --max-len {old}" in notice
    else:
        assert "a chunk's first token keeps no label" in notice
    # What the repack holds is still the fresh pack's documents, with at most those labels off.
    _, fresh_rows = read_rows(fresh)
    assert sum(r["num_tokens"] for r in rows) <= sum(r["num_tokens"] for r in fresh_rows)


def test_a_prompt_completion_pack_repacks_both_ways(tmp_path: Path) -> None:
    lines = (REPO / "sample_data" / "prompt_completion.jsonl").read_text().splitlines()[:60]
    corpus = tmp_path / "pc.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    first = tmp_path / "first"
    packtool.pack([corpus], first, max_len=4096)  # nothing dropped: both ways are exact
    assert json.loads((first / "manifest.json").read_text())["documents"]["dropped"] == 0
    for new in (256, 8192):
        fresh, repacked = tmp_path / f"fresh{new}", tmp_path / f"re{new}"
        packtool.pack([corpus], fresh, max_len=new, world_size=2)
        report = packtool.pack([first], repacked, max_len=new, world_size=2)
        _same_pack(repacked, fresh)
        assert not report.notices


def test_truncated_documents_stay_cut_and_it_is_said(tmp_path: Path) -> None:
    corpus = _text_corpus(tmp_path, seed=2)
    tok = CharTokenizer()
    first = tmp_path / "first"
    packtool.pack([corpus], first, tokenizer=tok, max_len=64, overflow="truncate")
    report = packtool.pack([first], tmp_path / "larger", max_len=128)
    (notice,) = report.notices
    assert "documents to --max-len 64 when it was packed (--overflow truncate)" in notice
    assert "they stay cut at --max-len 128" in notice
    stats = packtool.corpus_stats([first], [32, 128], use_cache=False)
    assert len(stats.notices) == 1 and "they stay cut at --max-len 128" in stats.notices[0]
    # Smaller: exactly the fresh truncated pack.
    fresh = tmp_path / "fresh"
    packtool.pack([corpus], fresh, tokenizer=tok, max_len=32, overflow="truncate")
    report = packtool.pack([first], tmp_path / "smaller", max_len=32)
    _same_pack(tmp_path / "smaller", fresh)
    assert not report.notices


def _megatron(prefix: Path, docs: list[list[int]]) -> None:
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
    for d in docs:
        builder.add_document(torch.tensor(d, dtype=torch.int64), [len(d)])
    builder.finalize(f"{prefix}.idx")


def test_a_megatron_dataset_and_its_pack_repack_alike(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    docs = [rng.integers(3, 500, int(rng.integers(1, 200))).tolist() for _ in range(200)]
    _megatron(tmp_path / "m", docs)
    parquet = tmp_path / "ids.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"ids": docs}), parquet)
    common = {"pad_id": 0, "vocab_size": 500}
    packtool.pack([str(tmp_path / "m")], tmp_path / "first", max_len=64, **common)
    for new in (32, 300):
        fresh = tmp_path / f"fresh{new}"
        packtool.pack([parquet], fresh, max_len=new, ids_field="ids", **common)
        from_megatron = tmp_path / f"meg{new}"
        packtool.pack([str(tmp_path / "m")], from_megatron, max_len=new, **common)
        _same_pack(from_megatron, fresh)
        repacked = tmp_path / f"re{new}"
        packtool.pack([tmp_path / "first"], repacked, max_len=new)
        _same_pack(repacked, fresh)


def test_a_pack_on_a_store_repacks(tmp_path: Path) -> None:
    corpus = _text_corpus(tmp_path, seed=4, n=40)
    tok = CharTokenizer()
    store = "memory://h33a-repack/first"
    packtool.pack([corpus], store, tokenizer=tok, max_len=64)
    fresh, repacked = tmp_path / "fresh", tmp_path / "repacked"
    packtool.pack([corpus], fresh, tokenizer=tok, max_len=150)
    packtool.pack([store], repacked, max_len=150)
    _same_pack(repacked, fresh)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.lists(st.integers(0, 90), min_size=1, max_size=40),
    st.integers(2, 40),
    st.integers(2, 40),
    st.booleans(),
    st.sampled_from(["split", "truncate", "drop"]),
    st.integers(0, 2**16),
)
def test_repack_is_a_fresh_pack_or_says_why(
    tmp_path_factory: pytest.TempPathFactory, lengths, old, new, labelled, overflow, seed
) -> None:
    """Any corpus of ids (and labels), any two max-lens: the repack equals the fresh pack,
    or its notice says what it cannot give back."""
    tmp = tmp_path_factory.mktemp("prop")
    rng = np.random.default_rng(seed)
    ids = [rng.integers(3, 50, k).tolist() for k in lengths]
    columns = {"ids": ids}
    options: dict = {"ids_field": "ids", "pad_id": 0, "eos_token": "1", "add_eos": True}
    options["overflow"] = overflow
    if labelled:
        columns["y"] = [
            [t if rng.random() < 0.5 else -100 for t in d] for d in ids
        ]  # a label is the token or nothing
        options["labels_field"] = "y"
    corpus = tmp / "c.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), corpus)
    first, fresh, repacked = tmp / "first", tmp / "fresh", tmp / "re"
    try:
        packtool.pack([corpus], first, max_len=old, **options)
    except packtool.errors.NothingToPackError:
        return
    try:
        packtool.pack([corpus], fresh, max_len=new, **options)
    except packtool.errors.NothingToPackError:
        fresh = None
    try:
        report = packtool.pack([first], repacked, max_len=new)
    except packtool.errors.NothingToPackError:
        assert fresh is None or _notice_of(first, new, overflow)
        return
    if report.notices:
        # ids without labels come back whole, but for what truncate and drop left out
        assert labelled or (overflow != "split" and new > old)
        return  # said: what cannot come back
    assert fresh is not None
    _same_pack(repacked, fresh)


def _notice_of(first: Path, new: int, overflow: str) -> str | None:
    from packtool.readers import resolve_inputs
    from packtool.repack import repack_notice

    return repack_notice(resolve_inputs([first]), new, overflow)


def test_a_document_missing_a_chunk_is_left_out_and_said(tmp_path: Path) -> None:
    """A labelled split pack stores no chunk with nothing to learn: a document missing one
    before its last cannot be joined back; it is left out, in one line."""
    import pyarrow.parquet as pq

    ids = [list(range(3, 33)), list(range(3, 13)), list(range(3, 23))]
    labels = [
        [-100] * 10 + [-100] * 10 + list(range(23, 33)),  # chunk 0 and 1 learn nothing
        list(range(3, 13)),
        [-100] * 10 + list(range(13, 23)),  # chunk 0 learns nothing, chunk 1 does
    ]
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"ids": ids, "y": labels}), corpus)
    options = {"ids_field": "ids", "labels_field": "y", "pad_id": 0}
    first = tmp_path / "first"
    packtool.pack([corpus], first, max_len=10, **options)
    from packtool.repack import packed_documents

    docs = packed_documents(first)
    assert docs.docs.tolist() == [1] and docs.gapped == 2
    report = packtool.pack([first], tmp_path / "re", max_len=16)
    (notice,) = report.notices
    assert "left out 3 chunks with nothing to learn" in notice
    assert "the 2 missing one before their last are left out" in notice
    _, rows = read_rows(tmp_path / "re")
    assert [d for r in rows for d in r["doc_ids"]] == [1]


def test_a_pack_merged_from_units_repacks(tmp_path: Path) -> None:
    """Units merged without copying number their documents within each unit (the shards'
    ``doc_offset``): the repack numbers them over the corpus, as a fresh pack does."""
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": "x" * k} for k in range(1, 90, 3)])
    b = write_jsonl(tmp_path / "b.jsonl", [{"text": "y" * k} for k in range(90, 1, -4)])
    units = tmp_path / "units"
    packtool.pack([a, b], units, max_len=40, units=2, num_proc=1)
    fresh = tmp_path / "fresh"
    packtool.pack([a, b], fresh, max_len=64)
    repacked = tmp_path / "repacked"
    packtool.pack([units], repacked, max_len=64)
    _same_pack(repacked, fresh)


@pytest.mark.parametrize("again", [8, None])
def test_an_aligned_pack_repacks_at_its_real_lengths(tmp_path: Path, again) -> None:
    """Segments padded to a multiple (``--pad-to-multiple-of``) are rebuilt from their real
    boundaries (``cu_seqlens_unpadded``): no alignment pad joins a document."""
    corpus = _text_corpus(tmp_path, seed=5)
    tok = CharTokenizer()
    first = tmp_path / "first"
    packtool.pack([corpus], first, tokenizer=tok, max_len=64, pad_to_multiple_of=8)
    fresh, repacked = tmp_path / "fresh", tmp_path / "repacked"
    packtool.pack([corpus], fresh, tokenizer=tok, max_len=128, pad_to_multiple_of=again)
    report = packtool.pack([first], repacked, max_len=128, pad_to_multiple_of=again)
    _same_pack(repacked, fresh)
    assert not report.notices
