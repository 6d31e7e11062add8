"""Repacking: a packed output as an input of ``pack``. Its documents are rebuilt from their
chunks and packed again with no tokenizer; the result must be the fresh pack of the original
corpus with the same options, shard for shard, or say in one line what cannot come back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import REPO, SAMPLE, CharTokenizer, write_jsonl
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


def test_a_pack_whose_shard_was_altered_is_refused_not_repacked(tmp_path: Path) -> None:
    """A shard changed in place (one token, its size kept) was repacked as it was: the new
    pack, hashed anew, carried the changed token and passed ``verify``. The repack checks
    each shard's sha256 first and refuses in one line, writing nothing; a missing shard and
    an altered repack record too."""
    corpus = _text_corpus(tmp_path, n=40)
    first = tmp_path / "first"
    packtool.pack([corpus], first, max_len=64)
    shard = first / json.loads((first / "manifest.json").read_text())["shards"][0]["file"]
    original = shard.read_bytes()
    with pa.memory_map(str(shard)) as source:
        reader = pa.ipc.open_stream(source)
        schema, batches = reader.schema, list(reader)
    ids = batches[0].column("input_ids")
    values = ids.values.to_numpy().copy()
    values[0] = (values[0] + 1) % 100  # a token that is still in the vocabulary
    child = pa.array(values, ids.type.value_type)
    changed = pa.Array.from_buffers(ids.type, len(ids), [None], children=[child])
    batches[0] = batches[0].set_column(0, schema.field("input_ids"), changed)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    altered = sink.getvalue().to_pybytes()
    assert len(altered) == len(original) and altered != original
    shard.write_bytes(altered)
    out = tmp_path / "re"
    result = run("pack", first, "-L", "128", "-o", out)
    assert_one_line_error(
        result, rf"{shard.name}: the shard's sha256 is .* the manifest records .*: it was altered"
    )
    assert not out.exists()
    shard.unlink()
    assert_one_line_error(run("pack", first, "-L", "128", "-o", out), r"the file is missing")
    shard.write_bytes(original)
    assert run("pack", first, "-L", "128", "-o", out).exit_code == 0
    assert packtool.verify(out, against=[first]).ok


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
    # the options of how records are read and rendered were ignored, silently
    for flags in (
        ["--chat-template", str(REPO / "sample_data" / "chatml.jinja")],
        ["--text-field", "body"],
        ["--input-shape", "chat"],
        ["--messages-field", "turns"],
        ["--chat-turns", "each"],
        ["--no-learn-reasoning"],
        ["--parse-special"],
    ):
        assert_one_line_error(
            run("pack", first, "-o", out, "-L", "32", *flags),
            rf"{flags[0]} does not apply to a packed output",
        )
        if flags[0] in ("--text-field", "--parse-special"):  # the ones stats takes
            assert_one_line_error(
                run("stats", first, "-L", "32", *flags), rf"{flags[0]} does not apply to a pack"
            )
    assert not out.exists()


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
        ("split", 128, 300, True),  # old chunk starts inside segments: the record's labels
        ("split", 128, 77, True),
        ("truncate", 256, 128, True),
    ],
)
def test_a_repacked_chat_pack_keeps_its_labels(tmp_path: Path, overflow, old, new, exact) -> None:
    corpus = _chat_corpus(tmp_path)
    options = {"chat_template": CHATML, "overflow": overflow}
    first, fresh, repacked = tmp_path / "first", tmp_path / "fresh", tmp_path / "repacked"
    packtool.pack([corpus], first, max_len=old, **options)
    if (overflow, old) == ("split", 128):  # whole chunks with nothing to learn: left out
        labels = json.loads((first / "manifest.json").read_text())["labels"]
        assert labels["chunks_without_labels_dropped"] > 0
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
    dropped = json.loads((first / "manifest.json").read_text())["documents"]["dropped"]
    assert dropped and f"dropped {dropped} documents longer than --max-len {old}" in notice
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
        # ids come back whole (with their labels, by the repack record of a labelled split
        # pack), but for what truncate and drop left out
        assert overflow != "split" and (labelled or new > old)
        return  # said: what cannot come back
    assert fresh is not None
    _same_pack(repacked, fresh)


def _notice_of(first: Path, new: int, overflow: str) -> str | None:
    from packtool.readers import resolve_inputs
    from packtool.repack import repack_notice

    return repack_notice(resolve_inputs([first]), new, overflow)


def _without_repack_record(pack: Path) -> None:
    """``pack`` as packtool wrote it before the repack record (``repack.arrows``)."""
    manifest = json.loads((pack / "manifest.json").read_text())
    for entry in manifest.pop("repack_files"):
        (pack / entry["file"]).unlink()
    (pack / "manifest.json").write_text(json.dumps(manifest))


def test_an_old_labelled_split_pack_repacks_with_its_notice(tmp_path: Path) -> None:
    """A labelled split pack without the repack record (made before it) repacks as before:
    the chunk starts' labels it cannot give back are said in one line."""
    corpus = _chat_corpus(tmp_path)
    first = tmp_path / "first"
    packtool.pack([corpus], first, max_len=128, chat_template=CHATML, overflow="split")
    _without_repack_record(first)
    report = packtool.pack([first], tmp_path / "re", max_len=300, seed=5)
    (notice,) = report.notices
    assert "a chunk's first token keeps no label" in notice
    fresh = tmp_path / "fresh"
    packtool.pack([corpus], fresh, max_len=300, seed=5, chat_template=CHATML, overflow="split")
    _, rows = read_rows(tmp_path / "re")
    _, fresh_rows = read_rows(fresh)
    learned = sum(sum(t != -100 for t in r["labels"]) for r in rows)
    assert learned < sum(sum(t != -100 for t in r["labels"]) for r in fresh_rows)


def _long_prompts(tmp_path: Path, n: int = 40) -> Path:
    """Prompt/completion records, every third with a prompt of several chunks of 64 tokens:
    chunks with nothing to learn."""
    lines = (REPO / "sample_data" / "prompt_completion.jsonl").read_text().splitlines()[:n]
    records = [json.loads(line) for line in lines]
    for i, r in enumerate(records):
        if i % 3 == 0:
            r["prompt"] = r["prompt"] * (3 + i % 5)
    return write_jsonl(tmp_path / "pc.jsonl", records)


def test_a_labelled_split_pack_repacks_exactly(tmp_path: Path) -> None:
    """Prompt/completion data split at 64 tokens, with whole chunks of prompt that learn
    nothing (left out of the rows, kept by the repack record): its repack at any max-len, and
    with another overflow, is the fresh pack; and a repack of that repack too."""
    corpus = _long_prompts(tmp_path)
    first = tmp_path / "first"
    packtool.pack([corpus], first, max_len=64, overflow="split")
    manifest = json.loads((first / "manifest.json").read_text())
    assert manifest["labels"]["chunks_without_labels_dropped"] > 0
    (entry,) = manifest["repack_files"]
    assert entry["file"] == "repack.arrows" and (first / "repack.arrows").is_file()
    assert packtool.verify(first).ok
    for new, more in [(48, {}), (100, {"seed": 3}), (256, {"world_size": 2}), (4096, {})]:
        fresh, repacked = tmp_path / f"fresh{new}", tmp_path / f"re{new}"
        packtool.pack([corpus], fresh, max_len=new, overflow="split", **more)
        report = packtool.pack([first], repacked, max_len=new, **more)
        _same_pack(repacked, fresh)
        assert not report.notices
    again = tmp_path / "again"
    packtool.pack([tmp_path / "re100"], again, max_len=64)
    _same_pack(again, first)
    for overflow in ("drop", "truncate"):  # another overflow: the documents are whole
        fresh, repacked = tmp_path / f"fresh-{overflow}", tmp_path / f"re-{overflow}"
        packtool.pack([corpus], fresh, max_len=200, overflow=overflow)
        packtool.pack([first], repacked, max_len=200, overflow=overflow)
        _same_pack(repacked, fresh)


def test_the_repack_record_is_written_by_every_labelled_split_pack(tmp_path: Path) -> None:
    """Only a labelled split pack writes it, empty if it split nothing (every other keeps its
    bytes); verify checks its bytes and sha256."""
    corpus = _long_prompts(tmp_path, n=20)
    text = _text_corpus(tmp_path, n=20)
    cases = [
        ("text", [text], {"tokenizer": CharTokenizer(), "max_len": 64}, False),
        ("drop", [corpus], {"max_len": 64}, False),  # instruction data drops by default
        ("short", [corpus], {"max_len": 8192, "overflow": "split"}, True),  # none split
        ("split", [corpus], {"max_len": 64, "overflow": "split"}, True),
    ]
    for name, inputs, options, written in cases:
        packtool.pack(inputs, tmp_path / name, **options)
        manifest = json.loads((tmp_path / name / "manifest.json").read_text())
        assert ("repack_files" in manifest) is written, name
        assert (tmp_path / name / "repack.arrows").exists() is written, name
    record = tmp_path / "split" / "repack.arrows"
    data = bytearray(record.read_bytes())
    data[-12] ^= 1
    record.write_bytes(bytes(data))
    report = packtool.verify(tmp_path / "split")
    assert [(p.shard, p.check) for p in report.problems] == [("repack.arrows", "sha256")]
    record.unlink()
    report = packtool.verify(tmp_path / "split")
    assert [(p.shard, p.check) for p in report.problems] == [("repack.arrows", "files")]


def test_a_document_learning_only_at_old_chunk_starts_comes_back(tmp_path: Path) -> None:
    """A document whose only learned tokens were chunk starts learned nothing in the first
    pack (not in its rows); the repack record keeps it, so a repack at a max-len where those
    tokens are inside a segment packs it, as a fresh pack does."""
    import pyarrow.parquet as pq

    ids = [list(range(3, 33)), list(range(3, 13))]
    labels = [
        [-100] * 10 + [13] + [-100] * 9 + [23] + [-100] * 9,  # learned at 10 and 20 only
        list(range(3, 13)),
    ]
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"ids": ids, "y": labels}), corpus)
    options = {"ids_field": "ids", "labels_field": "y", "pad_id": 0, "overflow": "split"}
    first = tmp_path / "first"
    packtool.pack([corpus], first, max_len=10, **options)
    _, rows = read_rows(first)
    assert [d for r in rows for d in r["doc_ids"]] == [1]
    fresh, repacked = tmp_path / "fresh", tmp_path / "re"
    packtool.pack([corpus], fresh, max_len=16, **options)
    report = packtool.pack([first], repacked, max_len=16)
    _same_pack(repacked, fresh)
    assert not report.notices
    _, rows = read_rows(repacked)
    assert sorted(d for r in rows for d in r["doc_ids"]) == [0, 0, 1]


def test_a_document_missing_a_chunk_is_left_out_and_said(tmp_path: Path) -> None:
    """A labelled split pack stores no chunk with nothing to learn: without its repack record
    (an old pack), a document missing one before its last cannot be joined back; it is left
    out, in one line. With the record, it is whole."""
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
    fresh = tmp_path / "fresh"
    packtool.pack([corpus], fresh, max_len=16, **options)
    report = packtool.pack([first], tmp_path / "whole", max_len=16)
    _same_pack(tmp_path / "whole", fresh)
    assert not report.notices
    _without_repack_record(first)
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
    packtool.pack_units([a, b], units, max_len=40, units=2, num_proc=1)
    assert json.loads((units / "manifest.json").read_text())["units"]["count"] == 2
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
    if again:
        assert not report.notices
    else:  # the layout the pack had is not kept silently
        assert report.notices == [
            f"{first} was packed with --pad-to-multiple-of 8; this repack's segments are not "
            "aligned (pass --pad-to-multiple-of 8 again for context parallelism or FP8)"
        ]


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.lists(
        st.tuples(st.integers(0, 70), st.sampled_from([0.0, 0.05, 0.3, 0.8])),
        min_size=1,
        max_size=30,
    ),
    st.integers(2, 24),
    st.integers(2, 40),
    st.integers(0, 2**16),
)
def test_a_labelled_split_pack_repacks_as_the_fresh_pack(
    tmp_path_factory: pytest.TempPathFactory, docs, old, new, seed
) -> None:
    """Any labelled documents (some learning nothing, some learning little: whole chunks with
    nothing to learn, learned tokens at chunk starts), split at any max-len: the repack at
    any other is the fresh pack, with nothing to say."""
    import pyarrow.parquet as pq

    tmp = tmp_path_factory.mktemp("labelled")
    rng = np.random.default_rng(seed)
    ids = [rng.integers(3, 50, k).tolist() for k, _ in docs]
    shares = [p for _, p in docs]
    labels = [
        [t if rng.random() < p else -100 for t in d] for d, p in zip(ids, shares, strict=True)
    ]
    corpus = tmp / "c.parquet"
    pq.write_table(pa.table({"ids": ids, "y": labels}), corpus)
    options = {"ids_field": "ids", "labels_field": "y", "pad_id": 0, "overflow": "split"}
    first, fresh, repacked = tmp / "first", tmp / "fresh", tmp / "re"
    try:
        packtool.pack([corpus], first, max_len=old, **options)
    except packtool.errors.NothingToPackError:
        return  # (learned only at its chunk starts: no pack to repack)
    try:
        packtool.pack([corpus], fresh, max_len=new, **options)
    except packtool.errors.NothingToPackError:
        fresh = None
    try:
        report = packtool.pack([first], repacked, max_len=new)
    except packtool.errors.NothingToPackError:
        assert fresh is None
        return
    assert fresh is not None
    _same_pack(repacked, fresh)
    assert "repack_files" in json.loads((first / "manifest.json").read_text())
    assert not report.notices  # (a pack that split nothing has an empty record: exact too)


def test_a_labelled_split_pack_of_units_repacks_exactly(tmp_path: Path) -> None:
    """Units each write their repack record; the merge lists them with their doc_offset
    (referencing or copying), and the merged pack repacks as the fresh pack."""
    corpus = _long_prompts(tmp_path)
    units = tmp_path / "units"
    packtool.pack_units([corpus], units, max_len=64, overflow="split", units=2, num_proc=1)
    manifest = json.loads((units / "manifest.json").read_text())
    files = [e["file"] for e in manifest["repack_files"]]
    assert len(files) == 2 and all(f.startswith("units/") for f in files)
    assert packtool.verify(units).ok
    fresh = tmp_path / "fresh"
    packtool.pack([corpus], fresh, max_len=150, overflow="split")
    repacked = tmp_path / "repacked"
    assert not packtool.pack([units], repacked, max_len=150).notices
    _same_pack(repacked, fresh)
    from packtool.merge import merge_units

    merge_units(units, copy=True, seed=4)
    assert packtool.verify(units).ok
    packtool.pack([units], tmp_path / "again", max_len=150, overwrite=True)
    _same_pack(tmp_path / "again", fresh)


def _mix_sources(tmp_path: Path) -> list[Path]:
    """Two sources cut from the sample corpus (300 and 60 documents): a mixture samples the
    first and repeats the second."""
    lines = SAMPLE.read_text("utf-8").splitlines(keepends=True)
    web, code = tmp_path / "web.jsonl", tmp_path / "code.jsonl"
    web.write_text("".join(lines[:300]), "utf-8")
    code.write_text("".join(lines[300:360]), "utf-8")
    return [web, code]


def test_a_repacked_mixture_is_the_fresh_mixture(tmp_path: Path) -> None:
    """A mixture repacked at another max-len keeps its source ids and its mixture record:
    rows, doc ids (copies included) and source ids are those of ``pack --mix`` of the
    sources at that max-len, and so are the per-source figures of ``stats OUT``. (Text split
    at any max-len puts the same tokens into rows, so the mixture samples the same
    documents.)"""
    from packtool.stats import dataset_stats

    sources = _mix_sources(tmp_path)
    mix = {"mix": "0.4,0.6", "tokens": "60k"}
    first = tmp_path / "first"
    packtool.pack(sources, first, max_len=256, **mix)
    recorded = json.loads((first / "manifest.json").read_text())["mixture"]
    assert recorded["copies"] > 1  # the second source is repeated: copies under their own ids
    for new, layout in [(100, {}), (512, {"world_size": 2}), (1000, {"shuffle": False})]:
        fresh, repacked = tmp_path / f"fresh{new}", tmp_path / f"re{new}"
        packtool.pack(sources, fresh, max_len=new, **mix, **layout)
        report = packtool.pack([first], repacked, max_len=new, **layout)
        assert not report.notices
        _same_pack(repacked, fresh)
        _, rows = read_rows(repacked)
        assert any(s == 1 for r in rows for s in r["source_ids"])
        manifests = [json.loads((p / "manifest.json").read_text()) for p in (repacked, fresh)]
        assert manifests[0]["mixture"] == manifests[1]["mixture"]
        assert manifests[0]["tokens"]["packed"] == manifests[1]["tokens"]["packed"]
        assert dataset_stats(repacked).sources == dataset_stats(fresh).sources
        on_cli = [run("stats", p, "--json") for p in (repacked, fresh)]
        assert [json.loads(r.stdout)["sources"] for r in on_cli] == [
            json.loads(on_cli[1].stdout)["sources"]
        ] * 2
        assert packtool.verify(repacked).ok


def test_a_repacked_mixture_is_verified_against_the_pack_it_was_repacked_from(
    tmp_path: Path,
) -> None:
    """``verify --against`` of a repacked mixture re-reads the pack it was repacked from (its
    recorded input), each copy under its own doc id; it took the mixture's text sources with
    the repack's ids options (``no field 'input_ids'``) and refused the pack as one input
    given for several sources, so no repacked mixture could be verified against anything."""
    sources = _mix_sources(tmp_path)
    first, repacked = tmp_path / "first", tmp_path / "re"
    packtool.pack(sources, first, max_len=256, mix="0.4,0.6", tokens="60k")
    packtool.pack([first], repacked, max_len=512)
    assert json.loads((repacked / "manifest.json").read_text())["mixture"]["copies"] > 1
    report = packtool.verify(repacked, against=[first])
    assert report.ok, report.problems
    assert report.against is not None and report.against.documents_compared > 0
    assert run("verify", repacked, "--against").exit_code == 0  # the recorded input: first
    assert_one_line_error(
        run("verify", repacked, "--against", *sources),
        r"--against: .*re was repacked from .*first \(a packtool output\), not from "
        r".*web\.jsonl: give that pack",
    )
    packtool.pack(sources, first, max_len=256, mix="0.4,0.6", tokens="60k", seed=1,
                  overwrite=True)  # fmt: skip
    assert not packtool.verify(repacked, against=[first]).ok  # another sample: found


def test_a_repacked_mixture_keeps_what_it_took_when_the_plan_depends_on_max_len(
    tmp_path: Path,
) -> None:
    """Instruction data drops a document longer than --max-len, so what a mixture can take,
    and so its sample, depends on the max-len: a repack keeps the documents the mixture
    took (each copy under its doc id, with its source id) and packs those that fit; the
    record counts what its rows hold."""
    lines = (REPO / "sample_data" / "prompt_completion.jsonl").read_text().splitlines()
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(lines[:100]) + "\n")
    b.write_text("\n".join(lines[100:160]) + "\n")
    first = tmp_path / "first"
    packtool.pack([a, b], first, max_len=1024, mix="0.3,0.7", tokens="40k")
    _, old_rows = read_rows(first)
    repacked = tmp_path / "re"
    packtool.pack([first], repacked, max_len=256)
    manifest, rows = read_rows(repacked)
    length: dict[int, int] = {}
    source: dict[int, int] = {}
    for r in old_rows:
        cu = r["cu_seqlens"]
        for k, (d, s) in enumerate(zip(r["doc_ids"], r["source_ids"], strict=True)):
            length[d], source[d] = cu[k + 1] - cu[k], s
    kept = {d for d, n in length.items() if n <= 256}
    assert 0 < len(kept) < len(length)  # some dropped at 256
    got = {d: s for r in rows for d, s in zip(r["doc_ids"], r["source_ids"], strict=True)}
    assert got == {d: source[d] for d in kept}
    record = manifest["mixture"]
    for i, src in enumerate(record["sources"]):
        assert src["tokens_taken"] == sum(length[d] for d in kept if source[d] == i)
        assert src["documents_taken"] == sum(1 for d in kept if source[d] == i)
    assert record["tokens"] == manifest["tokens"]["packed"]
    assert packtool.verify(repacked).ok


def test_a_labelled_split_mixture_repacks_its_documents_whole(tmp_path: Path) -> None:
    """A mixture of chats split into chunks: each copy of a document gets its chunks'
    first labels and its left-out chunks back from the repack record of the document it
    copies, so the repacked documents (ids and labels) are the mixture's, whole."""
    from packtool.repack import packed_documents

    lines = (REPO / "sample_data" / "chat.jsonl").read_text().splitlines()
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(lines[:60]) + "\n")
    b.write_text("\n".join(lines[60:80]) + "\n")
    options = {"chat_template": CHATML, "overflow": "split"}
    first = tmp_path / "first"
    packtool.pack([a, b], first, max_len=128, mix="0.3,0.7", tokens="30k", **options)
    assert json.loads((first / "manifest.json").read_text())["mixture"]["copies"] > 1
    repacked, again = tmp_path / "re", tmp_path / "again"
    packtool.pack([first], repacked, max_len=300)
    packtool.pack([repacked], again, max_len=77)

    def documents(path: Path) -> dict[int, dict]:
        """Each document the pack holds (ids and labels), by doc id."""
        batches = packed_documents(path).batches(["input_ids", "labels"], str(path), 0)
        out = {}
        for b in batches:
            assert b.table is not None
            for k, r in enumerate(b.table.to_pylist()):
                if r["input_ids"]:
                    out[b.row0 + k] = r
        return out

    whole = documents(repacked)
    assert whole == documents(again)
    fresh = tmp_path / "fresh"  # the same chats, split at 300 in one plain pack
    packtool.pack([a, b], fresh, max_len=300, **options)
    by_doc = documents(fresh)
    mixture = json.loads((first / "manifest.json").read_text())["mixture"]
    assert any(d >= mixture["doc_id_stride"] for d in whole)  # copies
    for d, r in whole.items():
        assert r == by_doc[d % mixture["doc_id_stride"]]
    assert len(whole) == sum(s["documents_taken"] for s in mixture["sources"])
    # Their own repack records hold each document read once (format.md), not a row per copy
    # under the copy's doc id, which verify found outside the documents read; and each
    # verifies against the pack it was repacked from.
    for path, source in ((repacked, first), (again, repacked)):
        record = pa.ipc.open_stream((path / "repack.arrows").read_bytes()).read_all()
        assert max(record.column("doc_id").to_pylist()) < mixture["doc_id_stride"]
        report = packtool.verify(path, against=[source])
        assert report.ok, report.problems


def test_a_resumed_labelled_split_pack_keeps_its_repack_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The records of the chunks are checkpointed with the tokens: a run interrupted and
    resumed writes the repack record the uninterrupted run writes, byte for byte."""
    from test_resume import Stop, _interrupt_after

    from packtool import pipeline

    monkeypatch.setattr(pipeline, "_CHECKPOINT_SECONDS", 0.0)
    lines = (REPO / "sample_data" / "chat.jsonl").read_text().splitlines()
    src = tmp_path / "chat.jsonl"
    src.write_text("\n".join(lines * 5) + "\n")
    opts = {"max_len": 128, "chat_template": CHATML, "overflow": "split"}
    packtool.pack([src], tmp_path / "full", **opts)
    with pytest.raises(Stop):
        packtool.pack([src], tmp_path / "out", resume=True, progress=_interrupt_after(2), **opts)
    assert packtool.pack([src], tmp_path / "out", resume=True, **opts).resumed
    full, resumed = (
        json.loads((tmp_path / p / "manifest.json").read_text()) for p in ("full", "out")
    )
    assert full["repack_files"][0]["rows"] > 0
    assert resumed["repack_files"] == full["repack_files"]


def test_a_labelled_split_pack_on_a_store_repacks_exactly(tmp_path: Path) -> None:
    """The repack record is published with the shards and read from the store."""
    corpus = _long_prompts(tmp_path, n=20)
    store = "memory://h33c-repack/labelled"
    packtool.pack([corpus], store, max_len=64, overflow="split")
    fresh, repacked = tmp_path / "fresh", tmp_path / "repacked"
    packtool.pack([corpus], fresh, max_len=150, overflow="split")
    assert not packtool.pack([store], repacked, max_len=150).notices
    _same_pack(repacked, fresh)
    assert packtool.verify(store).ok


def test_an_input_in_the_output_directory_is_refused_before_anything_is_replaced(
    tmp_path: Path,
) -> None:
    """`pack OUT -o OUT --overwrite` read the pack while replacing it (and recorded itself as
    its input); a corpus inside the output directory would be deleted with it."""
    out = tmp_path / "out"
    packtool.pack([_text_corpus(tmp_path)], out, tokenizer=CharTokenizer(), max_len=64)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert_one_line_error(
        run("pack", out, "-o", out, "-L", "128", "--overwrite"),
        r"out is the output directory .*out, which the run replaces: choose another --output",
        code=2,
    )
    inside = write_jsonl(out / "more.jsonl", [{"text": "abc"}])
    assert_one_line_error(
        run("pack", inside, "-o", out, "-L", "128", "--overwrite"),
        r"more\.jsonl is inside the output directory .*out, which the run replaces",
        code=2,
    )
    assert_one_line_error(  # work units check it too, before any unit runs
        run("pack", inside, "-o", out, "-L", "128", "--units", "2", "--overwrite"),
        r"more\.jsonl is inside the output directory",
        code=2,
    )
    inside.unlink()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    packtool.pack([out], tmp_path / "elsewhere", max_len=128)  # the way that works


def test_a_repack_keeps_the_tokenizer_the_pack_kept(tmp_path: Path) -> None:
    """A repack holds the pack's copy of its tokenizer (and config), recorded under the
    name and sha256 it was packed with: `inspect` decodes it, AutoTokenizer loads it from
    the repack's directory, verify checks the copy; a pack with no copy gives a repack
    with none."""
    transformers = pytest.importorskip("transformers")
    lines = SAMPLE.read_text("utf-8").splitlines()[:200]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(lines) + "\n", "utf-8")
    first, again, twice = tmp_path / "first", tmp_path / "again", tmp_path / "twice"
    packtool.pack([corpus], first, max_len=512)
    packtool.pack([first], again, max_len=1024)
    packtool.pack([again], twice, max_len=300)
    recorded = json.loads((first / "manifest.json").read_text())["tokenizer"]
    for out in (again, twice):
        for name in ("tokenizer.json", "tokenizer_config.json"):
            assert (out / name).read_bytes() == (first / name).read_bytes()
        kept = json.loads((out / "manifest.json").read_text())["tokenizer"]
        assert {k: kept[k] for k in ("name", "sha256", "file", "vocab_size")} == {
            k: recorded[k] for k in ("name", "sha256", "file", "vocab_size")
        }
        assert kept["special_tokens"] == recorded["special_tokens"]
        assert packtool.verify(out).ok
        reader = packtool.open_packed(out)
        row = reader[0]
        segment = row.input_ids[: int(row.cu_seqlens[1])].tolist()
        document = json.loads(lines[int(row.doc_ids[0])])["text"] + "<|endoftext|>"
        assert reader.load_tokenizer().decode(segment) in document  # its document's text
        text = lines[1][:300]
        ours = transformers.AutoTokenizer.from_pretrained(out)(text)["input_ids"]
        assert ours == transformers.AutoTokenizer.from_pretrained(first)(text)["input_ids"]
    assert run("inspect", twice).exit_code == 0
    store, local = "memory://repack-keeps/first", tmp_path / "from-store"
    packtool.pack([corpus], store, max_len=512)
    packtool.pack([store], local, max_len=1024)  # the copy read through the store
    assert (local / "tokenizer.json").read_bytes() == (first / "tokenizer.json").read_bytes()
    assert packtool.verify(local).ok
    ids_only = tmp_path / "ids"
    packtool.pack([_text_corpus(tmp_path)], ids_only, tokenizer=CharTokenizer(), max_len=64)
    repacked = tmp_path / "ids2"
    packtool.pack([ids_only], repacked, max_len=128)
    assert not (repacked / "tokenizer.json").exists()


def test_a_repack_of_chats_keeps_the_template_they_were_rendered_with(tmp_path: Path) -> None:
    """The chat template file a chat pack keeps (`--chat-template`) is kept by its repack:
    AutoTokenizer of the repack's directory renders a chat as the pack's does."""
    transformers = pytest.importorskip("transformers")
    chats, template = REPO / "sample_data" / "chat.jsonl", REPO / "sample_data" / "chatml.jinja"
    first, again = tmp_path / "first", tmp_path / "again"
    packtool.pack([chats], first, max_len=4096, chat_template=template)
    packtool.pack([first], again, max_len=2048)
    assert (again / "chat_template.jinja").read_bytes() == template.read_bytes()
    messages = json.loads(chats.read_text("utf-8").splitlines()[0])["messages"]
    ours, theirs = (
        transformers.AutoTokenizer.from_pretrained(out).apply_chat_template(
            messages, tokenize=False
        )
        for out in (again, first)
    )
    assert ours == theirs and "<|im_start|>" in ours
    assert packtool.verify(again).ok
