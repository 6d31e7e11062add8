"""Pre-tokenized inputs (--ids-field): every document's ids and labels come back from the rows,
through splits, for each input kind; EOS-separated streams are cut; bad records are one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import write_jsonl
from helpers import assert_row_invariants, read_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli import assert_one_line_error, run

import packtool
from packtool.errors import BadRecordError, FormatError, InputError, OptionError
from packtool.options import PackOptions

IGNORE = -100


def _pieces(rows: list[dict]) -> dict[tuple[int, int], tuple[list[int], list[int] | None]]:
    """(doc, chunk) -> (ids, labels) of every segment in the rows."""
    out = {}
    for row in rows:
        cu = row["cu_seqlens"]
        for k, key in enumerate(zip(row["doc_ids"], row["chunk_ids"], strict=True)):
            assert key not in out, f"{key} twice"
            labels = row.get("labels")
            out[key] = (
                row["input_ids"][cu[k] : cu[k + 1]],
                None if labels is None else labels[cu[k] : cu[k + 1]],
            )
    return out


def _expected(
    docs: list[list[int]], labels: list[list[int]] | None, max_len: int
) -> dict[tuple[int, int], tuple[list[int], list[int] | None]]:
    """What --overflow split must store: chunks of max_len; with labels, each chunk's first
    label -100 and a chunk with nothing learned dropped."""
    out = {}
    for d, ids in enumerate(docs):
        for c, start in enumerate(range(0, len(ids), max_len)):
            piece = ids[start : start + max_len]
            if labels is None:
                out[d, c] = (piece, None)
                continue
            lab = [IGNORE, *labels[d][start + 1 : start + max_len]]
            if any(x != IGNORE for x in lab):
                out[d, c] = (piece, lab)
    return out


def _write(kind: str, path: Path, table: pa.Table) -> Path:
    if kind == "parquet":
        target = path / "in.parquet"
        pq.write_table(table, target, row_group_size=7)
    elif kind == "arrow":
        target = path / "in.arrow"
        with pa.ipc.new_file(str(target), table.schema) as w:
            for b in table.to_batches(max_chunksize=5):
                w.write_batch(b)
    elif kind == "jsonl":
        target = path / "in.jsonl"
        target.write_text("".join(json.dumps(r) + "\n" for r in table.to_pylist()))
    else:
        import datasets

        target = path / "ds"
        datasets.Dataset(table).save_to_disk(str(target))
    return target


def _docs(seed: int, n: int = 40) -> tuple[list[list[int]], list[list[int]]]:
    rng = np.random.default_rng(seed)
    docs, labels = [], []
    for _ in range(n):
        ids = rng.integers(0, 1000, int(rng.integers(0, 40))).tolist()
        learn = rng.random(len(ids)) < 0.6
        docs.append(ids)
        labels.append([t if m else IGNORE for t, m in zip(ids, learn, strict=True)])
    return docs, labels


@pytest.mark.parametrize("kind", ["parquet", "arrow", "jsonl", "hf_dataset"])
def test_each_input_kind_round_trips_ids_and_labels(tmp_path: Path, kind: str) -> None:
    docs, labels = _docs(1)
    src = _write(kind, tmp_path, pa.table({"input_ids": docs, "labels": labels, "x": range(40)}))
    out = tmp_path / "out"
    report = packtool.pack(
        [src], out, max_len=16, ids_field="input_ids", labels_field="labels", pad_id=0
    )
    manifest, rows = read_rows(out)
    for row in rows:
        assert_row_invariants(row, 16, 0)
    assert _pieces(rows) == _expected(docs, labels, 16)
    assert report.documents.read == 40
    assert manifest["tokenizer"]["name"] == "none (pre-tokenized)"
    assert manifest["options"]["ids_field"] == "input_ids"
    # Without labels: every document whole (in chunks), no labels column.
    plain = packtool.pack([src], tmp_path / "plain", max_len=16, ids_field="input_ids", pad_id=0)
    _, rows = read_rows(tmp_path / "plain")
    assert "labels" not in rows[0]
    assert _pieces(rows) == _expected(docs, None, 16)
    assert plain.tokens == sum(map(len, docs))


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.lists(
        st.lists(st.tuples(st.integers(0, 50), st.booleans()), max_size=30), min_size=1, max_size=25
    ),
    max_len=st.integers(2, 12),
)
def test_labels_survive_splitting(tmp_path_factory, data, max_len: int) -> None:
    tmp = tmp_path_factory.mktemp("prop")
    docs = [[t for t, _ in d] for d in data]
    labels = [[t if m else IGNORE for t, m in d] for d in data]
    pq.write_table(
        pa.table({"ids": pa.array(docs, pa.list_(pa.int32())), "y": labels}), tmp / "a.parquet"
    )
    try:
        packtool.pack(
            [tmp / "a.parquet"], tmp / "o", max_len=max_len, ids_field="ids", labels_field="y",
            pad_id=0, vocab_size=51,
        )  # fmt: skip
    except packtool.errors.NothingToPackError:
        assert not _expected(docs, labels, max_len)
        return
    _, rows = read_rows(tmp / "o")
    assert _pieces(rows) == _expected(docs, labels, max_len)


def test_loss_mask_gives_the_labels(tmp_path: Path) -> None:
    table = pa.table({"ids": [[7, 8, 9, 10]], "mask": [[0, 1, 1, 0]]})
    pq.write_table(table, tmp_path / "a.parquet")
    packtool.pack(
        [tmp_path / "a.parquet"], tmp_path / "o", max_len=8, ids_field="ids",
        loss_mask_field="mask", pad_id=0,
    )  # fmt: skip
    _, rows = read_rows(tmp_path / "o")
    assert rows[0]["labels"][:4] == [IGNORE, 8, 9, IGNORE]


def test_split_on_eos_cuts_a_stream_after_each_eos(tmp_path: Path) -> None:
    # Record 0: three documents (the last without an EOS); record 1: an EOS alone, then one;
    # record 2: empty; record 3: ends with EOS (no empty document after it).
    stream = [[5, 6, 2, 7, 2, 8, 9], [2, 4, 4], [], [3, 2]]
    pq.write_table(pa.table({"ids": stream}), tmp_path / "s.parquet")
    report = packtool.pack(
        [tmp_path / "s.parquet"], tmp_path / "o", max_len=8, ids_field="ids", split_on_eos=2,
        pad_id=0, shuffle=False,
    )  # fmt: skip
    _, rows = read_rows(tmp_path / "o")
    docs = {d: ids for (d, _c), (ids, _) in _pieces(rows).items()}
    assert docs == {0: [5, 6, 2], 1: [7, 2], 2: [8, 9], 3: [2], 4: [4, 4], 6: [3, 2]}
    assert report.documents.read == 7 and report.documents.empty == 1
    for row in rows:  # positions restart at every document
        assert_row_invariants(row, 8, 0)


def test_no_tokenizer_backend_is_claimed_for_ids(tmp_path: Path) -> None:
    """Pre-tokenized ids are encoded by no engine: the manifest and the summary do not name
    `tokenizers` (they said "hf ..., instruction data is encoded in pieces")."""
    pq.write_table(pa.table({"ids": [[5, 6, 2], [7, 2]], "y": [[5, 6, 2], [-100, 2]]}),
                   tmp_path / "s.parquet")  # fmt: skip
    for labels in ([], ["--labels-field", "y"]):
        out = tmp_path / f"o{len(labels)}"
        result = run("pack", tmp_path / "s.parquet", "--ids-field", "ids", *labels,
                     "--pad-id", "0", "-L", "8", "-o", out)  # fmt: skip
        assert result.exit_code == 0, result.output
        assert "tokenizer backend" not in result.stdout and "hf 0." not in result.stdout
        backend = json.loads((out / "manifest.json").read_text())["tokenizer"]["backend"]
        assert backend["name"] == "none" and "pre-tokenized" in backend["reason"], backend


def test_the_vocabulary_size_of_a_pre_tokenized_pack(tmp_path: Path) -> None:
    """Training code sizes its embeddings from ``reader.vocab_size``: a pack without a
    tokenizer records it from --vocab-size, and without one the error names that option."""
    pq.write_table(pa.table({"ids": [[5, 6, 2], [7, 2]]}), tmp_path / "s.parquet")
    packtool.pack([tmp_path / "s.parquet"], tmp_path / "a", max_len=8, ids_field="ids", pad_id=0,
                  vocab_size=100)  # fmt: skip
    assert packtool.open_packed(tmp_path / "a").vocab_size == 100
    packtool.pack([tmp_path / "s.parquet"], tmp_path / "b", max_len=8, ids_field="ids", pad_id=0)
    with pytest.raises(FormatError, match=r"records no tokenizer vocab_size \(a pre-tokenized "
                       r"pack records one when packed with --vocab-size N"):  # fmt: skip
        packtool.open_packed(tmp_path / "b").vocab_size  # noqa: B018


def test_eos_and_bos_added_when_asked(tmp_path: Path) -> None:
    pq.write_table(pa.table({"ids": [[5, 6], [7, 1], []], "y": [[5, 6], [7, 1], []]}),
                   tmp_path / "a.parquet")  # fmt: skip
    packtool.pack(
        [tmp_path / "a.parquet"], tmp_path / "o", max_len=16, ids_field="ids", labels_field="y",
        eos_token="1", bos_token="0", add_eos=True, bos=True, shuffle=False,
    )  # fmt: skip
    _, rows = read_rows(tmp_path / "o")
    pieces = _pieces(rows)
    assert pieces[0, 0] == ([0, 5, 6, 1], [IGNORE, 5, 6, 1])
    assert pieces[1, 0] == ([0, 7, 1], [IGNORE, 7, 1])  # already ends with EOS
    assert (2, 0) not in pieces  # empty
    # The default adds nothing (EOS id 1 known, the pad too).
    packtool.pack([tmp_path / "a.parquet"], tmp_path / "p", max_len=16, ids_field="ids",
                  eos_token="1")  # fmt: skip
    _, rows = read_rows(tmp_path / "p")
    assert _pieces(rows)[0, 0] == ([5, 6], None)


@pytest.mark.parametrize(
    ("ids", "labels", "pattern"),
    [
        (
            [[1, 2], [3, 5000]],
            None,
            r"row 1: 'ids'\[1\] is 5000, outside the vocabulary \[0, 100\)",
        ),
        ([[1, 2], [3, -4]], None, r"row 1: 'ids'\[1\] is -4: ids must be >= 0"),
        (pa.array([[1.0], [2.5]]), None, r"row 0: 'ids' holds floats, not integer token ids"),
        ([[1, 2], None], None, r"row 1: 'ids' is null"),
        ([[1, 2], [3, None]], None, r"row 1: 'ids' holds nulls"),
        ([[1, 2], [3, 4]], [[1, 2], [3]], r"row 1: 'y' has 1 values, 'ids' has 2"),
        ([[1, 2], [3, 4]], [[1, 2], [3, -5]], r"row 1: 'y'\[1\] is -5: ids must be -100 or >= 0"),
        # shifted labels (each the next token) would be packed as they are and learned
        # two tokens ahead after collate's shift: every label is -100 or its own token
        (
            [[1, 2], [3, 4]],
            [[1, 2], [4, -100]],
            r"row 1: 'y'\[0\] is 4, but 'ids'\[0\] is 3: a label is -100 or its own token's id",
        ),
    ],
)
def test_bad_records_are_one_line_naming_the_record(tmp_path, ids, labels, pattern) -> None:
    columns = {"ids": ids} if labels is None else {"ids": ids, "y": labels}
    pq.write_table(pa.table(columns), tmp_path / "a.parquet")
    args = ["pack", tmp_path / "a.parquet", "-L", "8", "--ids-field", "ids", "--pad-id", "0"]
    args += ["--vocab-size", "100", "-o", tmp_path / "o", "-q"]
    if labels is not None:
        args += ["--labels-field", "y"]
    assert_one_line_error(run(*args), r"a\.parquet: " + pattern)
    # Skipped and counted with --skip-bad-records: the good record is packed.
    if isinstance(ids, pa.Array):  # a float column: every record is bad
        with pytest.raises(InputError, match=r"all 2 records were bad"):
            packtool.pack([tmp_path / "a.parquet"], tmp_path / "s", max_len=8, ids_field="ids",
                          pad_id=0, skip_bad_records=True)  # fmt: skip
        return
    report = packtool.pack(
        [tmp_path / "a.parquet"], tmp_path / "s", max_len=8, ids_field="ids", pad_id=0,
        vocab_size=100, labels_field=None if labels is None else "y", skip_bad_records=True,
    )  # fmt: skip
    assert report.documents.bad_records_skipped == 1 and report.documents.read == 2
    _, rows = read_rows(tmp_path / "s")
    assert {d for row in rows for d in row["doc_ids"]} == {0}


def test_bad_loss_mask_and_option_mistakes(tmp_path: Path) -> None:
    pq.write_table(pa.table({"ids": [[1, 2]], "m": [[0, 3]]}), tmp_path / "a.parquet")
    with pytest.raises(BadRecordError, match=r"row 0: 'm'\[1\] is 3, not 0 or 1"):
        packtool.pack([tmp_path / "a.parquet"], tmp_path / "o", max_len=8, ids_field="ids",
                      loss_mask_field="m", pad_id=0)  # fmt: skip
    base = ["pack", tmp_path / "a.parquet", "-L", "8", "-o", tmp_path / "o", "-q"]
    assert_one_line_error(run(*base, "--ids-field", "ids"), r"give the padding's id with --pad-id")
    assert_one_line_error(run(*base, "--labels-field", "y"), r"--labels-field is for pre-tok")
    assert_one_line_error(
        run(*base, "--ids-field", "nope", "--pad-id", "0"), r"no column 'nope' \(columns found"
    )
    assert_one_line_error(
        run(*base, "--ids-field", "ids", "--eos-token", "</s>", "--pad-id", "0"),
        r"--eos-token '</s>': without --tokenizer",
    )
    # an EOS or BOS id the vocabulary does not hold was appended to every document (exit 0,
    # every row then failing verify), where --pad-id is checked
    for flag in ("--eos", "--bos"):
        ids = ["--ids-field", "ids", "--pad-id", "0", "--vocab-size", "100", flag]
        assert_one_line_error(
            run(*base, *ids, f"{flag}-token", "100"),
            rf"{flag}-token 100 is outside the vocabulary \[0, 100\) \(--vocab-size 100\)",
            2,
        )
    assert not (tmp_path / "o").exists()
    with pytest.raises(OptionError, match="not both"):
        PackOptions(ids_field="ids", labels_field="a", loss_mask_field="b")
    # --vocab-size on text was ignored without a word: the tokenizer bounds text ids
    text = write_jsonl(tmp_path / "t.jsonl", [{"text": "hello"}])
    pack = run("pack", text, "-L", "8", "--vocab-size", "10", "-o", tmp_path / "t")
    stats = run("stats", text, "-L", "8", "--vocab-size", "10", "--no-cache")
    for result in (pack, stats):
        assert_one_line_error(result, r"--vocab-size bounds pre-tokenized ids: give --ids-field", 2)
    assert not (tmp_path / "t").exists()


def test_ids_checked_against_the_tokenizer_vocabulary(tmp_path: Path) -> None:
    vocab = packtool.load_tokenizer().vocab_size
    pq.write_table(pa.table({"ids": [[1, 2], [vocab]]}), tmp_path / "a.parquet")
    with pytest.raises(BadRecordError, match=rf"row 1: 'ids'\[0\] is {vocab}, outside"):
        packtool.pack([tmp_path / "a.parquet"], tmp_path / "o", max_len=8, ids_field="ids",
                      tokenizer="packtool-default")  # fmt: skip


def test_verify_against_compares_the_ids(tmp_path: Path) -> None:
    docs, _ = _docs(3)
    src = tmp_path / "a.parquet"
    pq.write_table(pa.table({"ids": docs}), src)
    args = ["--ids-field", "ids", "--split-on-eos", "7", "--eos-token", "7", "--eos"]
    assert run("pack", src, "-L", "16", "-o", tmp_path / "o", "-q", *args).exit_code == 0
    ok = run("verify", tmp_path / "o", "--against", src)
    assert ok.exit_code == 0, ok.output
    assert "no tokenizer copy" not in ok.output  # there was no tokenizer
    # One id changed in the input: --against finds the document.
    changed = [list(d) for d in docs]
    d = next(i for i, x in enumerate(changed) if len(x) > 3)
    changed[d][2] = (changed[d][2] + 1) % 7  # never the EOS id: the documents stay the same
    pq.write_table(pa.table({"ids": changed}), src)
    bad = run("verify", tmp_path / "o", "--against", src)
    assert bad.exit_code != 0
    assert f"document {d} (a.parquet record {d}): token 2 is" in bad.output, bad.output
    assert "not the same file" not in bad.output


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.lists(
        st.lists(st.tuples(st.integers(0, 20), st.booleans()), max_size=30), min_size=1, max_size=12
    ),
    max_len=st.integers(2, 12),
    overflow=st.sampled_from(["split", "truncate", "drop"]),
    mask=st.booleans(),
    cut=st.sampled_from([None, 3]),
)
def test_verify_against_recovers_every_id_and_label(
    tmp_path_factory, data, max_len: int, overflow: str, mask: bool, cut: int | None
) -> None:
    """Packed with labels (or a loss mask), through splits and EOS cuts: verify --against
    re-reads the inputs and finds every document's ids and labels in the rows."""
    from packtool.verification import verify

    tmp = tmp_path_factory.mktemp("against")
    docs = [[t for t, _ in d] for d in data]
    columns = {"ids": pa.array(docs, pa.list_(pa.int32()))}
    if mask:
        columns["m"] = [[int(m) for _, m in d] for d in data]
    else:
        columns["y"] = [[t if m else IGNORE for t, m in d] for d in data]
    pq.write_table(pa.table(columns), tmp / "a.parquet")
    field = {"loss_mask_field": "m"} if mask else {"labels_field": "y"}
    try:
        report = packtool.pack(
            [tmp / "a.parquet"], tmp / "o", max_len=max_len, ids_field="ids", pad_id=0,
            overflow=overflow, split_on_eos=cut, vocab_size=21, **field,
        )  # fmt: skip
    except packtool.errors.NothingToPackError:
        return
    checked = verify(tmp / "o", against=[tmp / "a.parquet"])
    assert checked.ok, checked.problems
    assert checked.against is not None
    _, rows = read_rows(tmp / "o")
    assert checked.against.documents_compared == len({d for r in rows for d in r["doc_ids"]})
    assert checked.against.tokens["learned"] == report.tokens_learned


def test_a_changed_label_is_one_line_from_verify_against(tmp_path: Path) -> None:
    from test_verify import rewrite_shard

    docs, labels = _docs(5)
    src = tmp_path / "a.parquet"
    pq.write_table(pa.table({"ids": docs, "y": labels}), src)
    out = tmp_path / "o"
    args = ["--ids-field", "ids", "--labels-field", "y", "--pad-id", "0", "--overflow", "split"]
    assert run("pack", src, "-L", "16", "-o", out, "-q", *args).exit_code == 0
    ok = run("verify", out, "--against", src)
    assert ok.exit_code == 0, ok.output
    changed: list = []

    def unlearn(rows: list[dict]) -> None:  # one learned label of a later chunk becomes -100
        for row in rows:
            for k, (doc, chunk) in enumerate(zip(row["doc_ids"], row["chunk_ids"], strict=True)):
                start, end = row["cu_seqlens"][k], row["cu_seqlens"][k + 1]
                learned = [j for j in range(start + 1, end) if row["labels"][j] != IGNORE]
                if chunk > 0 and learned:
                    row["labels"][learned[0]] = IGNORE
                    changed.append((doc, chunk * 16 + learned[0] - start))
                    return

    rewrite_shard(out, unlearn)  # bytes and sha256 recorded anew: only --against can tell
    assert run("verify", out).exit_code == 0
    bad = run("verify", out, "--against", src)
    assert bad.exit_code != 0
    ((doc, j),) = changed
    lines = [line for line in bad.output.splitlines() if line.startswith("problem")]
    assert len(lines) == 1, bad.output
    assert f"document {doc} (a.parquet record {doc}): label {j} is -100 in the rows" in lines[0]
    # A label changed in the input instead: found the same way.
    assert run("pack", src, "-L", "16", "-o", tmp_path / "o2", "-q", *args).exit_code == 0
    moved = [list(y) for y in labels]
    d = next(i for i, y in enumerate(moved) if len(y) > 3 and y[2] != IGNORE)
    moved[d][2] = IGNORE
    pq.write_table(pa.table({"ids": docs, "y": moved}), src)
    bad = run("verify", tmp_path / "o2", "--against", src)
    assert bad.exit_code != 0
    assert f"document {d} (a.parquet record {d}): label 2 is {labels[d][2]} in the rows" in (
        bad.output
    )


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64, np.uint8, np.int16])
def test_megatron_input_written_by_megatron_core_round_trips(tmp_path: Path, dtype) -> None:
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(5)
    high = min(np.iinfo(dtype).max, 30000)
    docs = [rng.integers(0, high, int(rng.integers(1, 60))).tolist() for _ in range(30)]
    prefix = tmp_path / "corpus_text_document"
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for d in docs:
        builder.add_document(torch.tensor(d, dtype=torch.int64), [len(d)])
    builder.finalize(f"{prefix}.idx")
    for spec in (prefix, f"{prefix}.bin", f"{prefix}.idx"):
        out = tmp_path / "o"
        report = packtool.pack([spec], out, max_len=32, pad_id=0, overwrite=True)
        _, rows = read_rows(out)
        assert _pieces(rows) == _expected(docs, None, 32)
        assert report.documents.read == 30
    assert packtool.verify(tmp_path / "o", against=[prefix]).ok  # read again, compared
    # A stream of documents in one Megatron sequence, cut at the EOS.
    builder = IndexedDatasetBuilder(f"{prefix}2.bin", dtype=dtype)
    builder.add_document(torch.tensor([5, 6, 2, 7, 2, 8]), [6])
    builder.finalize(f"{prefix}2.idx")
    packtool.pack([f"{prefix}2"], tmp_path / "s", max_len=8, pad_id=0, split_on_eos=2)
    _, rows = read_rows(tmp_path / "s")
    assert sorted(ids for ids, _ in _pieces(rows).values()) == [[5, 6, 2], [7, 2], [8]]


def test_megatron_ids_outside_the_vocabulary_name_the_sequence(tmp_path: Path) -> None:
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = tmp_path / "m"
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
    for d in ([1, 2], [3, 4], [5, 900]):
        builder.add_document(torch.tensor(d), [len(d)])
    builder.finalize(f"{prefix}.idx")
    args = ["pack", prefix, "-L", "8", "--pad-id", "0", "--vocab-size", "100", "-o", tmp_path / "o"]
    assert_one_line_error(run(*args), r"m: row 2: 'tokens'\[1\] is 900, outside the vocabulary")
    (tmp_path / "m.bin").write_bytes((tmp_path / "m.bin").read_bytes()[:-4])
    assert_one_line_error(run(*args[:-2], "-o", tmp_path / "p"), r"m\.bin: .* the file ends early")


def test_resuming_skips_whole_documents_of_pre_tokenized_batches(tmp_path: Path) -> None:
    from packtool.pretokenized import IdsFields, read_ids
    from packtool.readers import resolve_inputs, skip_records

    docs, labels = _docs(7, n=60)
    src = _write("arrow", tmp_path, pa.table({"ids": docs, "y": labels}))
    (inp,) = resolve_inputs([src])
    fields = IdsFields("ids", "y")

    def flat(batches) -> tuple[list[int], list[int], list[int]]:
        ids, lab, lengths = [], [], []
        for b in batches:
            ids += b.ids.tolist()
            lab += b.labels.tolist()
            lengths += b.lengths.tolist()
        return ids, lab, lengths

    for n in (0, 3, 5, 17, 60):
        ids, lab, lengths = flat(skip_records(read_ids(inp, fields, vocab_size=None), n))
        rest = docs[n:]
        assert lengths == [len(d) for d in rest]
        assert ids == [t for d in rest for t in d]
        assert lab == [t for d in labels[n:] for t in d]


def test_split_on_eos_cuts_the_labels_with_their_ids(tmp_path: Path) -> None:
    ids = [[5, 6, 2, 7, 8, 2, 9, 9]]
    labels = [[IGNORE, 6, 2, IGNORE, 8, 2, 9, 9]]
    pq.write_table(pa.table({"ids": ids, "y": labels}), tmp_path / "s.parquet")
    packtool.pack(
        [tmp_path / "s.parquet"], tmp_path / "o", max_len=8, ids_field="ids", labels_field="y",
        split_on_eos=2, pad_id=0,
    )  # fmt: skip
    _, rows = read_rows(tmp_path / "o")
    assert _pieces(rows) == {
        (0, 0): ([5, 6, 2], [IGNORE, 6, 2]),
        (1, 0): ([7, 8, 2], [IGNORE, 8, 2]),  # its first token: nothing before it in the segment
        (2, 0): ([9, 9], [IGNORE, 9]),
    }


def test_a_directory_of_megatron_pairs_reads_each_once(tmp_path: Path) -> None:
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    d = tmp_path / "d"
    d.mkdir()
    for name, docs in (("a", [[1, 2, 3]]), ("b", [[4, 5], [6]])):
        builder = IndexedDatasetBuilder(str(d / f"{name}.bin"), dtype=np.uint16)
        for doc in docs:
            builder.add_document(torch.tensor(doc), [len(doc)])
        builder.finalize(str(d / f"{name}.idx"))
    result = run("pack", d, "-L", "8", "--pad-id", "0", "-o", tmp_path / "o", "-q")
    assert result.exit_code == 0, result.stderr
    assert "skipped" not in result.stderr
    _, rows = read_rows(tmp_path / "o")
    assert sorted(ids for ids, _ in _pieces(rows).values()) == [[1, 2, 3], [4, 5], [6]]


# -- JSON Lines (plain, gzip, zstd), JSON arrays and CSV as ids inputs -------------------------


def _write_text_kind(kind: str, path: Path, docs: list[list[int]], labels: list[list[int]]) -> Path:
    """``docs`` (and ``labels``) in a JSON or CSV input of ``kind`` (e.g. ``jsonl.gz``)."""
    import gzip

    import zstandard

    records = [{"ids": d, "y": y, "text": "x"} for d, y in zip(docs, labels, strict=True)]
    base = kind.split(".")[0]
    if base == "jsonl":
        data = "".join(json.dumps(r) + "\n" for r in records).encode()
    elif base == "json":
        data = json.dumps(records, indent=1).encode()
    else:  # three spellings of a list in a cell: JSON's, space-separated, NumPy's
        spell = [
            lambda v: json.dumps(v),
            lambda v: " ".join(map(str, v)),
            lambda v: str(np.array(v, dtype=np.int64)).replace("\n", " "),
        ]
        lines = ["ids,text,y"] + [
            f'"{spell[i % 3](d)}",x,"{spell[(i + 1) % 3](y)}"'
            for i, (d, y) in enumerate(zip(docs, labels, strict=True))
        ]
        data = ("\n".join(lines) + "\n").encode()
    if kind.endswith(".gz"):
        data = gzip.compress(data)
    elif kind.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    target = path / f"in.{kind}"
    target.write_bytes(data)
    return target


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "jsonl.zst", "json", "json.gz", "csv",
                                  "csv.zst"])  # fmt: skip
def test_json_and_csv_inputs_round_trip_ids_and_labels(tmp_path: Path, kind: str) -> None:
    docs, labels = _docs(11)
    src = _write_text_kind(kind, tmp_path, docs, labels)
    report = packtool.pack(
        [src], tmp_path / "o", max_len=16, ids_field="ids", labels_field="y", pad_id=0
    )
    _, rows = read_rows(tmp_path / "o")
    assert _pieces(rows) == _expected(docs, labels, 16)
    assert report.documents.read == 40
    checked = packtool.verify(tmp_path / "o", against=[src])  # ids and labels read again
    assert checked.ok and checked.against is not None, checked.problems
    assert checked.against.documents_compared == len({d for d, _ in _expected(docs, labels, 16)})
    packtool.pack([src], tmp_path / "p", max_len=16, ids_field="ids", pad_id=0)
    _, rows = read_rows(tmp_path / "p")
    assert _pieces(rows) == _expected(docs, None, 16)


def test_jsonl_ids_across_pieces_long_lines_and_blank_lines(tmp_path: Path, monkeypatch) -> None:
    # Many pieces (64 KB here, 8 MB by default), a line longer than pyarrow's 1 MB block,
    # and blank lines: every document comes back, and a bad record is named by its line.
    from packtool.readers import jsonl

    monkeypatch.setattr(jsonl, "_JSONL_CHUNK", 64 << 10)
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 50000, int(n)).tolist() for n in rng.integers(1, 300, 600)]
    docs[7] = rng.integers(0, 50000, 200_000).tolist()  # ~1.2 MB on one line
    lines = [json.dumps({"ids": d}) for d in docs]
    text = "\n".join(lines[:300]) + "\n\n  \n" + "\n".join(lines[300:]) + "\n"
    src = tmp_path / "big.jsonl"
    src.write_text(text)
    packtool.pack([src], tmp_path / "o", max_len=4096, ids_field="ids", pad_id=0)
    _, rows = read_rows(tmp_path / "o")
    assert _pieces(rows) == _expected(docs, None, 4096)
    with src.open("a") as f:
        f.write('{"ids": [1, "2"]}\n')
    with pytest.raises(BadRecordError, match=rf"big\.jsonl:{len(docs) + 3}: 'ids'\[1\] is \"2\""):
        packtool.pack([src], tmp_path / "p", max_len=4096, ids_field="ids", pad_id=0)


_J = '{"ids": [1]}\n'  # a good first line


@pytest.mark.parametrize(
    ("name", "content", "pattern"),
    [
        ("a.jsonl", _J + '\n{"ids": "abc"}\n', r"a\.jsonl:3: 'ids' is string, not a list"),
        ("a.jsonl", _J + '{"ids": [1, 2.5]}\n', r"a\.jsonl:2: 'ids'\[1\] is 2\.5, not an"),
        ("a.jsonl", _J + "null\n", r"a\.jsonl:2: expected a JSON object, found null"),
        ("a.jsonl", _J + '{"x": [1]}\n', r"a\.jsonl:2: no field 'ids' \(fields found: 'x'\)"),
        ("a.jsonl", _J + '{"ids": [1]\n', r"a\.jsonl:2: malformed JSON"),
        ("a.jsonl", '{"ids": [1]}{"ids": [2]}\n', r"a\.jsonl:1: malformed JSON: Extra data"),
        ("a.jsonl", _J + '{"ids": [1, null]}\n', r"a\.jsonl:2: 'ids' holds nulls"),
        ("a.jsonl", _J + '{"ids": [3000000000]}\n', r"a\.jsonl:2: 'ids'\[0\] is 3000000000"),
        ("a.jsonl", '{"ids": [1], "y": [1]}\n{"ids": [1], "y": [1, 2]}\n', r":2: 'y' has 2"),
        ("a.jsonl", '{"ids": [1], "y": [1]}\n{"ids": [5, 6], "y": [0, 7]}\n', r":2: 'y'\[0\] is 0"),
        ("a.json", '[{"ids": [1]}, {"ids": [true]}]', r"a\.json: element 1: 'ids'\[0\] is true"),
        ("a.json", '[{"ids": [1]}, 5]', r"a\.json: element 1: expected a JSON object, found int"),
        ("a.csv", 'ids\n"[1,2]"\n"[1, 2.5]"\n', r"a\.csv: row 1: 'ids' is '\[1, 2\.5\]', not"),
        ("a.csv", 'ids,y\n"[1,2]","[1,2]"\n"[1]","[1]",3\n', r"a\.csv:3: malformed CSV row"),
        ("a.csv", "ids\n1 2\n" + "9" * 30 + "\n", r"a\.csv: row 1: 'ids' holds an integer too"),
        ("a.txt", "1 2 3\n", r"a\.txt: a \.txt input holds text, not token ids"),
    ],
)
def test_bad_json_and_csv_ids_records_are_one_line(tmp_path, name, content, pattern) -> None:
    src = tmp_path / name
    src.write_text(content)
    args = ["pack", src, "-L", "8", "--ids-field", "ids", "--pad-id", "0", "-o", tmp_path / "o"]
    if '"y"' in content or ",y" in content:
        args += ["--labels-field", "y"]
    assert_one_line_error(run(*args, "-q"), pattern)


def test_bad_json_records_are_skipped_and_counted(tmp_path: Path) -> None:
    src = tmp_path / "a.jsonl"
    src.write_text('{"ids": [1, 2]}\n{"ids": "x"}\nnull\n{"ids": [3]}\n{"ids": [4]}{"ids": [5]}\n')
    report = packtool.pack([src], tmp_path / "o", max_len=8, ids_field="ids", pad_id=0,
                           skip_bad_records=True, shuffle=False)  # fmt: skip
    assert report.documents.read == 5 and report.documents.bad_records_skipped == 3
    _, rows = read_rows(tmp_path / "o")
    assert {d: ids for (d, _), (ids, _) in _pieces(rows).items()} == {0: [1, 2], 3: [3]}
    csv = tmp_path / "a.csv"
    csv.write_text('ids,t\n"[1, 2]",a\n"[3]",b,c\nword,d\n"[4]",e\n')
    report = packtool.pack([csv], tmp_path / "c", max_len=8, ids_field="ids", pad_id=0,
                           skip_bad_records=True)  # fmt: skip
    assert report.documents.read == 4 and report.documents.bad_records_skipped == 2
    _, rows = read_rows(tmp_path / "c")
    assert sorted(ids for ids, _ in _pieces(rows).values()) == [[1, 2], [4]]


def test_a_truncated_compressed_ids_input_is_one_line(tmp_path: Path) -> None:
    import gzip

    data = gzip.compress(b"".join(b'{"ids": [%d, 2, 3]}\n' % i for i in range(5000)))
    (tmp_path / "a.jsonl.gz").write_bytes(data[: len(data) // 2])
    assert_one_line_error(
        run("pack", tmp_path / "a.jsonl.gz", "-L", "8", "--ids-field", "ids", "--pad-id", "0",
            "-o", tmp_path / "o"),
        r"a\.jsonl\.gz: cannot read",
    )  # fmt: skip
    assert not (tmp_path / "o" / "manifest.json").exists()


@settings(max_examples=60, deadline=None)
@given(
    cells=st.lists(
        st.one_of(
            st.lists(st.integers(-(10**18) + 1, 10**18 - 1), max_size=6).map(
                lambda v: (v, st.sampled_from(["json", "spaces", "numpy", "commas"]))
            ),
            st.sampled_from(["1.5", "abc", "[1, x]", "--1", "1-2", "[1,,2]x"]).map(
                lambda t: (t, None)
            ),
        ),
        max_size=12,
    ),
    style=st.data(),
)
def test_csv_cells_parse_exactly_as_python_does(cells, style) -> None:
    from packtool.readers import csv as csv_reader

    texts, expected = [], []
    for value, spelling in cells:
        if spelling is None:
            texts.append(value)
            expected.append(None)
            continue
        how = style.draw(spelling)
        texts.append(
            json.dumps(value) if how == "json"
            else " ".join(map(str, value)) if how == "spaces"
            else "[" + " ".join(map(str, value)) + "]" if how == "numpy"
            else ",".join(map(str, value))
        )  # fmt: skip
        expected.append(value)
    problems: dict[int, str] = {}
    parsed = csv_reader._int_list_cells(pa.array(texts, pa.string()), "ids", problems)
    assert parsed.to_pylist() == expected
    assert sorted(problems) == [i for i, e in enumerate(expected) if e is None]


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    records=st.lists(st.lists(st.integers(0, 9), max_size=25), min_size=1, max_size=10),
    kind=st.sampled_from(["jsonl", "jsonl.zst", "json", "csv", "parquet"]),
    max_len=st.integers(2, 9),
    blank=st.booleans(),
)
def test_every_document_of_an_eos_stream_comes_back(
    tmp_path_factory, records, kind: str, max_len: int, blank: bool
) -> None:
    """Records of any input kind, cut at every EOS (id 0): each document, as a Python cut
    makes it, is in the rows exactly once (in chunks of max_len), numbered in order."""
    tmp = tmp_path_factory.mktemp("eos")
    labels = [[t if t % 2 else IGNORE for t in r] for r in records]
    if kind == "parquet":
        src = tmp / "in.parquet"
        pq.write_table(pa.table({"ids": pa.array(records, pa.list_(pa.int64())), "y": labels}), src)
    else:
        src = _write_text_kind(kind, tmp, records, labels)
        if blank and kind == "jsonl":  # blank lines between records: not records
            src.write_text(src.read_text().replace("\n", "\n\n  \n"))
    docs: list[list[int]] = []
    for r in records:  # the oracle: after every 0; a record's tail without a 0 is one more
        start = 0
        for i, t in enumerate(r):
            if t == 0:
                docs.append(r[start : i + 1])
                start = i + 1
        if start < len(r) or not r:
            docs.append(r[start:])
    try:
        packtool.pack([src], tmp / "o", max_len=max_len, ids_field="ids", split_on_eos=0,
                      pad_id=0, vocab_size=10)  # fmt: skip
    except packtool.errors.NothingToPackError:
        assert not any(docs)
        return
    _, rows = read_rows(tmp / "o")
    for row in rows:
        assert_row_invariants(row, max_len, 0)
    assert _pieces(rows) == _expected(docs, None, max_len)


_WORDS = st.text(alphabet=st.sampled_from(list('ab[]{},:"\\ \n\t\u00e9\U0001f600')), max_size=8)


@settings(max_examples=80, deadline=None)
@given(
    docs=st.lists(st.lists(st.integers(0, 2**31 - 1), max_size=8), max_size=8),
    notes=st.lists(_WORDS, min_size=8, max_size=8),
    indent=st.sampled_from([None, 0, 1, 4]),
    window=st.integers(1, 64),
)
def test_json_arrays_stream_exactly(tmp_path_factory, docs, notes, indent, window) -> None:
    """A JSON array of objects (strings holding brackets, commas, quotes and backslashes,
    any layout) is cut into elements by the NumPy scan, in windows of any size, and read by
    pyarrow: the ids json.load gives, never falling back to json.load."""
    from packtool import readers
    from packtool.readers import json_array

    tmp = tmp_path_factory.mktemp("array")
    records = [
        {"note": notes[i], "ids": d, "meta": {"ids": [notes[i]], "x": [[1], {}]}}
        for i, d in enumerate(docs)
    ]
    (tmp / "a.json").write_text(json.dumps(records, indent=indent))
    (inp,) = readers.resolve_inputs([tmp / "a.json"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(json_array, "_JSON_ARRAY_WINDOW", window)
        mp.setattr(json_array, "_load_json_array", lambda *a: pytest.fail("fell back"))
        batches = list(readers.column_batches(inp, ["ids"]))
    got = [ids for b in batches for ids in b.batch.column(0).to_pylist()]
    assert got == docs


@pytest.mark.parametrize(
    "text",
    ['[{"ids": [1]},, {"ids": [2]}]', '[{"ids": [1]},]', '[{"ids": [1]}] x', '[{"ids": [1]}][]',
     '[{"ids": [1]}, {"ids": [2]}', '[{"ids": [1]}, 7]', '[{"ids": [1]}, null]'],
)  # fmt: skip
def test_irregular_json_arrays_are_named_by_json_load(tmp_path: Path, text: str) -> None:
    (tmp_path / "a.json").write_text(text)
    result = run("pack", tmp_path / "a.json", "-L", "8", "--ids-field", "ids", "--pad-id", "0",
                 "-o", tmp_path / "o")  # fmt: skip
    assert_one_line_error(result, r"a\.json(:\d+: malformed JSON|: element 1: expected a JSON)")


def test_a_mistyped_ids_field_is_named_not_every_record_skipped(tmp_path: Path) -> None:
    """A field option the first record lacks is a typo: one line naming the fields found,
    without the --skip-bad-records hint (which would skip every record; a trial found it)."""
    src = tmp_path / "ids.jsonl"
    src.write_text('{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}\n{"input_ids": [4]}\n')
    base = ("pack", src, "--vocab-size", "10", "--pad-id", "0", "-L", "8")
    for flags, name in (
        (("--ids-field", "input_id"), "'input_id' (--ids-field)"),
        (("--ids-field", "input_ids", "--labels-field", "label"), "'label' (--labels-field)"),
    ):
        result = run(*base, *flags, "-o", tmp_path / "o")
        assert_one_line_error(result, f"first record has no field {re.escape(name)}")
        assert "skip-bad-records" not in result.output
    assert not (tmp_path / "o").exists()
