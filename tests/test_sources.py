"""Reading every supported input kind, and naming the exact place of bad records."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import write_jsonl
from hypothesis import given, settings

from packtool.errors import BadRecordError, InputError
from packtool.readers import jsonl, read_texts, resolve_inputs

TEXTS = ["first doc", 'second, with "quotes"\nand a newline', "", "ünïcödé 文字 🎉"]


def texts_of(path: Path | str, **kwargs) -> list[str | None]:
    out: list[str | None] = []
    for inp in resolve_inputs([str(path)]):
        for batch in read_texts(inp, **kwargs):
            out.extend(batch.texts)
    return out


def test_jsonl_plain_gz_zst(tmp_path: Path) -> None:
    import zstandard

    records = [{"text": t, "n": i} for i, t in enumerate(TEXTS)]
    plain = write_jsonl(tmp_path / "a.jsonl", records)
    data = plain.read_bytes()
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(data))
    (tmp_path / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    for name in ("a.jsonl", "b.jsonl.gz", "c.jsonl.zst"):
        assert texts_of(tmp_path / name) == TEXTS, name


def test_json_array_and_jsonl_named_json(tmp_path: Path) -> None:
    (tmp_path / "arr.json").write_text(json.dumps([{"text": t} for t in TEXTS]))
    assert texts_of(tmp_path / "arr.json") == TEXTS
    write_jsonl(tmp_path / "lines.json", [{"text": t} for t in TEXTS])
    assert texts_of(tmp_path / "lines.json") == TEXTS


def test_parquet_arrow_csv_txt(tmp_path: Path) -> None:
    table = pa.table({"id": list(range(len(TEXTS))), "body": TEXTS})
    pq.write_table(table, tmp_path / "t.parquet")
    with pa.OSFile(str(tmp_path / "t.arrow"), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    with pa.OSFile(str(tmp_path / "s.arrow"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    import pyarrow.csv as pc

    pc.write_csv(table, tmp_path / "t.csv")
    for name in ("t.parquet", "t.arrow", "s.arrow", "t.csv"):
        got = texts_of(tmp_path / name, text_field="body")
        assert got == TEXTS, name
    (tmp_path / "t.txt").write_text("line one\nline two\n\nline four\n")
    assert texts_of(tmp_path / "t.txt") == ["line one", "line two", "", "line four"]
    assert texts_of(tmp_path / "t.txt", txt_unit="paragraph") == ["line one\nline two", "line four"]
    assert texts_of(tmp_path / "t.txt", txt_unit="document") == [
        "line one\nline two\n\nline four\n"
    ]


def test_saved_hf_dataset_and_dict(tmp_path: Path) -> None:
    import datasets

    ds = datasets.Dataset.from_dict({"text": TEXTS, "x": [1, 2, 3, 4]})
    ds.save_to_disk(str(tmp_path / "ds"))
    assert texts_of(tmp_path / "ds") == TEXTS
    dd = datasets.DatasetDict({"train": ds, "test": ds.select([0])})
    dd.save_to_disk(str(tmp_path / "dd"))
    assert texts_of(tmp_path / "dd") == TEXTS
    assert texts_of(tmp_path / "dd", split="test") == TEXTS[:1]
    dd2 = datasets.DatasetDict({"a": ds, "b": ds})
    dd2.save_to_disk(str(tmp_path / "dd2"))
    with pytest.raises(InputError, match="splits a, b: choose one with --split"):
        texts_of(tmp_path / "dd2")
    # a mistyped --split is named (it read as if no split had been given)
    with pytest.raises(InputError, match="splits train, test: no split 'tset' in it; choose"):
        texts_of(tmp_path / "dd", split="tset")


def test_saved_datasets_inside_an_input_directory(tmp_path: Path) -> None:
    """A dataset saved with save_to_disk inside an input directory is one input, read as when
    named itself (its state.json and dataset_info.json were read as JSON Lines records: an
    error, or with --skip-bad-records bad records around its rows)."""
    import datasets

    d = tmp_path / "d"
    d.mkdir()
    write_jsonl(d / "a.jsonl", [{"text": "from jsonl"}])
    datasets.Dataset.from_dict({"text": ["saved 1", "saved 2"]}).save_to_disk(str(d / "ds"))
    train = datasets.Dataset.from_dict({"text": ["train 1"]})
    datasets.DatasetDict({"train": train, "test": train.select([])}).save_to_disk(str(d / "dd"))
    inputs = resolve_inputs([str(d)])
    assert [(i.path.name, i.kind) for i in inputs] == [
        ("a.jsonl", "jsonl"), ("dd", "hf_dataset"), ("ds", "hf_dataset")
    ]  # fmt: skip
    assert texts_of(d) == ["from jsonl", "train 1", "saved 1", "saved 2"]


def test_a_pattern_that_matches_directories(tmp_path: Path) -> None:
    """A glob's directories were dropped without a word (`d/*` read d/a.jsonl, not d/sub/);
    now a saved dataset it matches is an input, another directory is named on the skipped:
    line (unless the pattern matched its files, as ``**`` does), and a pattern of only such
    directories says so."""
    import datasets

    from packtool.readers import describe_skipped

    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    write_jsonl(d / "a.jsonl", [{"text": "top"}])
    write_jsonl(d / "sub" / "b.jsonl", [{"text": "below"}])
    datasets.Dataset.from_dict({"text": ["saved"]}).save_to_disk(str(d / "ds"))
    skipped: list = []
    inputs = resolve_inputs([str(d / "*")], skipped=skipped)
    assert [(i.path.name, i.kind) for i in inputs] == [("a.jsonl", "jsonl"), ("ds", "hf_dataset")]
    assert skipped == [d / "sub"]
    assert "1 directory matched by a pattern, not read: " in describe_skipped(skipped)
    skipped = []
    every = resolve_inputs([str(d / "**")], skipped=skipped)
    assert [i.path.name for i in every] == ["a.jsonl", "ds", "b.jsonl"] and skipped == []
    with pytest.raises(InputError, match=r"matches no files \(only directories: .*sub\)"):
        resolve_inputs([str(d / "su*")])


def test_saved_dataset_is_read_not_mapped(tmp_path: Path) -> None:
    """A saved dataset's Arrow shards are read batch by batch, in order, one after another
    (datasets.load_from_disk maps them, and memory grew with the dataset); progress moves
    with the shards; a selection with an index mapping still reads right (through datasets)."""
    import datasets

    texts = [f"document {i} " * 20 for i in range(6000)]
    ds = datasets.Dataset.from_dict({"text": texts, "n": list(range(6000))})
    ds.save_to_disk(str(tmp_path / "ds"), num_shards=3)
    assert len(list((tmp_path / "ds").glob("*.arrow"))) == 3
    inp = resolve_inputs([tmp_path / "ds"])[0]
    got: list[str | None] = []
    done: list[int] = []
    maps = Path("/proc/self/maps")
    for batch in read_texts(inp, batch_docs=500):
        got.extend(batch.texts)
        done.append(batch.bytes_done)
        if maps.exists():
            assert str(tmp_path / "ds") not in maps.read_text()
    assert got == texts
    assert done == sorted(done) and done[0] > 0 and len(set(done)) >= 3

    from packtool.instruct import check_prompt_completion
    from packtool.readers import read_records

    pairs = datasets.Dataset.from_dict({"prompt": ["p1", "p2"], "completion": ["c1", "c2"]})
    datasets.DatasetDict({"train": pairs}).save_to_disk(str(tmp_path / "pairs"))
    check = check_prompt_completion("prompt", "completion")
    records = [
        r
        for b in read_records(
            resolve_inputs([tmp_path / "pairs"])[0], fields=["prompt", "completion"], check=check
        )
        for r in b.records
    ]
    assert [tuple(r) for r in records] == [("p1", "c1"), ("p2", "c2")]


def test_saved_dataset_with_an_index_mapping(tmp_path: Path) -> None:
    """A layout other than plain data files (here an index file named in state.json) is
    left to datasets.load_from_disk."""
    import datasets

    from packtool.readers import hf_dataset

    ds = datasets.Dataset.from_dict({"text": TEXTS})
    ds.save_to_disk(str(tmp_path / "ds"))
    state_path = tmp_path / "ds" / "state.json"
    state = json.loads(state_path.read_text())
    assert hf_dataset.saved_dataset_files(str(tmp_path / "ds"), None) == [
        str(tmp_path / "ds" / state["_data_files"][0]["filename"])
    ]
    state["_indices_data_files"] = [{"filename": "indices.arrow"}]
    state_path.write_text(json.dumps(state))
    assert hf_dataset.saved_dataset_files(str(tmp_path / "ds"), None) is None
    (tmp_path / "ds" / "state.json").unlink()
    assert hf_dataset.saved_dataset_files(str(tmp_path / "ds"), None) is None


def test_directory_and_glob(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    write_jsonl(tmp_path / "d" / "b.jsonl", [{"text": "b"}])
    write_jsonl(tmp_path / "d" / "sub" / "a.jsonl", [{"text": "a"}])
    (tmp_path / "d" / "notes.md").write_text("ignored")
    write_jsonl(tmp_path / "d" / ".hidden.jsonl", [{"text": "hidden"}])
    files = resolve_inputs([str(tmp_path / "d")])
    assert [f.path.name for f in files] == ["b.jsonl", "a.jsonl"]
    assert texts_of(tmp_path / "d" / "**" / "*.jsonl") == ["b", "a"]
    with pytest.raises(InputError, match="matches no files"):
        resolve_inputs([str(tmp_path / "*.parquet")])
    with pytest.raises(InputError, match="no such file or directory"):
        resolve_inputs([str(tmp_path / "missing.jsonl")])
    (tmp_path / "x.docx").write_text("?")
    with pytest.raises(InputError, match="unsupported file type"):
        resolve_inputs([str(tmp_path / "x.docx")])


@pytest.mark.parametrize(
    "specs",
    [
        ["d/b.jsonl", "d/b.jsonl"],  # the same file twice
        ["d", "d/b.jsonl"],  # a directory and a file in it
        ["d/*.jsonl", "d"],  # a glob and the directory it lists
        ["d/b.jsonl", "d/../d/b.jsonl"],  # another spelling of the same path
    ],
)
def test_an_input_named_twice_is_refused(
    tmp_path: Path, specs: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its documents would be packed twice, silently (they were: 600 documents of a 300-line
    file given twice)."""
    (tmp_path / "d").mkdir()
    write_jsonl(tmp_path / "d" / "b.jsonl", [{"text": "b"}])
    write_jsonl(tmp_path / "d" / "c.jsonl", [{"text": "c"}])
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=r"b\.jsonl: named twice by the inputs, so its"):
        resolve_inputs(specs)
    assert len(resolve_inputs(["d/b.jsonl", "d/c.jsonl"])) == 2


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"text": "a"}', '{"text": "b"', '{"text": "c"}'], r"bad\.jsonl:2: malformed JSON"),
        (
            ['{"text": "a"}', '{"body": "b", "id": 3}'],
            r"bad\.jsonl:2: no field 'text' \(fields found: 'body', 'id'\).*--text-field",
        ),
        (['{"text": "a"}', '{"text": 5}'], r"bad\.jsonl:2: field 'text' is int, not a string"),
        (['{"text": "a"}', '{"text": null}'], r"bad\.jsonl:2: field 'text' is null, not a string"),
        (['{"text": "a"}', "[1, 2]"], r"bad\.jsonl:2: expected a JSON object, found array"),
    ],
)
def test_bad_jsonl_names_the_line(tmp_path: Path, lines: list[str], message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BadRecordError, match=message):
        texts_of(path)
    skipped = texts_of(path, skip_bad_records=True)
    assert skipped[0] == "a" and None in skipped


def test_bad_json_array_elements_are_named(tmp_path: Path) -> None:
    """A JSON array's texts come from its records reader (each element checked to be its
    text): a bad element is named by its index, the hint names the flag; skipped, it keeps its
    place as None, its error in the batch; batches end where the records reader's do."""
    elements = [
        {"text": "a"},
        {"body": "b", "id": 3},
        {"text": 5},
        "x",
        {"text": "\ud800"},
        {"text": "f"},
        {"text": None},
    ]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(elements))
    with pytest.raises(
        BadRecordError,
        match=r"bad\.json: element 1: no field 'text' \(fields found: 'body', 'id'\).*"
        r"--text-field.*--skip-bad-records",
    ):
        texts_of(path)
    (inp,) = resolve_inputs([path])
    batches = list(read_texts(inp, skip_bad_records=True, batch_docs=4))
    assert [b.texts for b in batches] == [["a", None, None, None], [None, "f", None]]
    assert [str(e) for b in batches for e in b.bad] == [
        "bad.json: element 1: no field 'text' (fields found: 'body', 'id')".replace(
            "bad.json", str(path)
        )
        + " (choose the field with --text-field)",
        f"{path}: element 2: field 'text' is int, not a string",
        f"{path}: element 3: expected a JSON object, found string",
        f"{path}: element 4: field 'text' holds an unpaired surrogate \\ud800 at character 0: "
        "not valid Unicode",
        f"{path}: element 6: field 'text' is null, not a string",
    ]
    # The array is parsed whole before its first element is given: all of it is read.
    assert [b.bytes_done for b in batches] == [path.stat().st_size] * 2


def test_bad_record_deep_in_a_large_file(tmp_path: Path) -> None:
    """The fast reader's failure is traced back to the exact line, past many blocks."""
    path = tmp_path / "big.jsonl"
    good = json.dumps({"text": "x" * 200})
    with open(path, "w") as f:
        for _ in range(60_000):
            f.write(good + "\n")
        f.write('{"text": 12}\n')
    with pytest.raises(BadRecordError, match=r"big\.jsonl:60001: field 'text' is int"):
        texts_of(path)


def test_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "u.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "\xff\xfe"}\n')
    with pytest.raises(BadRecordError, match=r"u\.jsonl:2: invalid UTF-8"):
        texts_of(path)
    assert texts_of(path, skip_bad_records=True) == ["ok", None]


def test_columnar_errors(tmp_path: Path) -> None:
    pq.write_table(pa.table({"body": ["a"], "n": [1]}), tmp_path / "t.parquet")
    with pytest.raises(InputError, match=r"no column 'text' \(columns found: 'body', 'n'\)"):
        texts_of(tmp_path / "t.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "i.parquet")
    with pytest.raises(InputError, match="column 'text' is int64, not a string column"):
        texts_of(tmp_path / "i.parquet")
    pq.write_table(pa.table({"text": ["a", None, "c"]}), tmp_path / "n.parquet")
    with pytest.raises(BadRecordError, match=r"n\.parquet: row 1: 'text' is null"):
        texts_of(tmp_path / "n.parquet")
    assert texts_of(tmp_path / "n.parquet", skip_bad_records=True) == ["a", None, "c"]
    (tmp_path / "c.csv").write_text("id,body\n1,x\n")
    with pytest.raises(InputError, match=r"no column 'text' \(columns found: 'id', 'body'\)"):
        texts_of(tmp_path / "c.csv")
    (tmp_path / "bad.csv").write_text("id,text\n1,x\n2,y,extra\n3,z\n")
    with pytest.raises(BadRecordError, match=r"bad\.csv.*malformed CSV row"):
        texts_of(tmp_path / "bad.csv")
    got = texts_of(tmp_path / "bad.csv", skip_bad_records=True)
    assert sorted(t for t in got if t) == ["x", "z"] and got.count(None) == 1
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(InputError, match="not a readable Parquet file"):
        texts_of(tmp_path / "bad.parquet")


def test_a_malformed_csv_row_is_the_same_bad_record_for_texts_and_records(
    tmp_path: Path,
) -> None:
    """One CSV reader for texts and records: a malformed row is a bad record naming its line
    in both (the records pass used to stop at it with pyarrow's "cannot read as CSV")."""
    from packtool.readers import read_records

    path = tmp_path / "pc.csv"
    path.write_text("prompt,text\n1,x\n2,y,extra\n3,z\n")
    (inp,) = resolve_inputs([path])
    message = r"pc\.csv:3: malformed CSV row '2,y,extra' \(3 columns, expected 2\)"
    with pytest.raises(BadRecordError, match=message + r".*--skip-bad-records"):
        list(read_records(inp, fields=["prompt", "text"], check=lambda r, loc: r))
    batches = list(
        read_records(inp, fields=["prompt", "text"], check=lambda r, loc: r, skip_bad_records=True)
    )
    # pyarrow reports a malformed row as it parses a block: it comes before the block's rows.
    records = [r for b in batches for r in b.records]
    assert records == [None, {"prompt": "1", "text": "x"}, {"prompt": "3", "text": "z"}]
    assert [str(e) for b in batches for e in b.bad] == [
        f"{path}:3: malformed CSV row '2,y,extra' (3 columns, expected 2)"
    ]
    assert texts_of(path, skip_bad_records=True) == [None, "x", "z"]


@pytest.mark.parametrize("trailing_newline", [True, False])
def test_jsonl_fast_path_reads_in_bounded_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trailing_newline: bool
) -> None:
    """The fast JSONL path parses pieces of whole lines; with pieces far smaller than the
    file (and than some lines), every record still comes back, once, in order."""
    from packtool.readers import jsonl

    texts = [("x" * (i % 7) * 40) + f"doc {i}" for i in range(300)]
    body = "\n".join(json.dumps({"text": t}) for t in texts) + ("\n" if trailing_newline else "")
    path = tmp_path / "c.jsonl"
    path.write_text(body)
    pieces: list[int] = []
    real = jsonl._line_chunks

    def small_pieces(stream, size=0, **_):
        for piece in real(stream, 97):
            assert bytes(piece).endswith(b"\n") or not trailing_newline
            pieces.append(len(piece))
            yield piece

    monkeypatch.setattr(jsonl, "_line_chunks", small_pieces)
    got = [t for b in read_texts(resolve_inputs([path])[0]) for t in b.texts]
    assert got == texts
    assert len(pieces) > 20 and sum(pieces) == len(body.encode())


def test_jsonl_first_piece_is_small(tmp_path: Path) -> None:
    """The first piece of a JSON Lines input is about ``first`` bytes (the tokenizer waits for
    it), the next ones twice the last up to ``size``; every piece holds whole lines, and
    together the file."""
    import pyarrow as pa

    from packtool.readers import jsonl

    body = b"".join(b'{"t":%03d}\n' % i for i in range(500))  # 10-byte lines
    path = tmp_path / "p.jsonl"
    path.write_bytes(body)
    with pa.OSFile(str(path)) as stream:
        pieces = [bytes(p) for p in jsonl._line_chunks(stream, 1000, first=105)]
    assert [len(p) for p in pieces[:6]] == [100, 210, 420, 840, 1000, 1000]
    assert b"".join(pieces) == body and all(p.endswith(b"\n") for p in pieces)
    assert jsonl._FIRST_CHUNK < jsonl._JSONL_CHUNK


def test_jsonl_null_line_in_a_later_piece(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line holding a bare null far into the file (where pyarrow would crash) is named."""
    from packtool.readers import jsonl

    lines = [json.dumps({"text": f"doc {i}"}) for i in range(200)]
    lines[150] = "null"
    path = tmp_path / "n.jsonl"
    path.write_text("\n".join(lines) + "\n")
    real = jsonl._line_chunks
    monkeypatch.setattr(jsonl, "_line_chunks", lambda stream, size=0, **_: real(stream, 256))
    with pytest.raises(BadRecordError, match=r"n\.jsonl:151: expected a JSON object, found null"):
        list(read_texts(resolve_inputs([path])[0]))


def test_csv_reading_ahead_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pyarrow's CSV reader reads ahead in its own thread; a slow consumer must not make it
    buffer the whole input. Rows come back whole and in order, values with newlines too."""
    import csv
    import time

    from packtool.readers import csv as csv_reader

    block = 16 << 10
    monkeypatch.setattr(csv_reader, "_CSV_BLOCK", block)
    monkeypatch.setattr(csv_reader, "_PACE_WAIT", 0.05)
    texts = [
        f"row {i} " + "word " * (i % 50) + ("\nsecond line" if i % 7 == 0 else "")
        for i in range(4000)
    ]
    texts[2000] = "x" * (block // 2)
    path = tmp_path / "c.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text"])
        writer.writerows([i, t] for i, t in enumerate(texts))
    ahead_seen: list[int] = []
    real = csv_reader._PacedReader

    class Spy(real):  # type: ignore[misc, valid-type]
        def advance(self, nbytes: int) -> None:
            ahead_seen.append(self.delivered - self.consumed)
            super().advance(nbytes)

    monkeypatch.setattr(csv_reader, "_PacedReader", Spy)
    got: list[str | None] = []
    for batch in read_texts(resolve_inputs([path])[0]):
        got.extend(batch.texts)
        time.sleep(0.002)  # a slow consumer
    assert got == texts
    assert path.stat().st_size > 20 * block
    # Without pacing pyarrow had read the whole file by the second batch.
    assert max(ahead_seen) <= 5 * block


def _csv_with_a_long_cell(path: Path, block: int, header: list[str], make_row) -> list[list[str]]:
    """A CSV whose row 700 holds a cell 20 blocks long (with newlines and quotes)."""
    import csv

    rows = [make_row(i, f"row {i} " + "word " * (i % 30)) for i in range(1500)]
    rows[700] = make_row(700, 'a "quoted" line, and more\n' * (20 * block // 26))
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return rows


@pytest.mark.parametrize("gzipped", [False, True])
def test_csv_cell_longer_than_a_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gzipped: bool
) -> None:
    """pyarrow cannot read a CSV row much longer than its block ("straddling object"): the
    reader retries with larger blocks and goes on after the records it already gave, so
    every record comes exactly once, in order (batches were given before the long row).
    Gzipped, the file is smaller than one block: its size must not stop the retries."""
    from packtool.readers import csv as csv_reader

    block = 16 << 10
    monkeypatch.setattr(csv_reader, "_CSV_BLOCK", block)
    path = tmp_path / "long.csv"
    rows = _csv_with_a_long_cell(path, block, ["id", "text"], lambda i, t: [str(i), t])
    if gzipped:
        data = path.read_bytes()
        path = tmp_path / "long.csv.gz"
        path.write_bytes(gzip.compress(data))
        assert path.stat().st_size < 3 * block
    import pyarrow.csv as pc

    with pytest.raises(pa.ArrowInvalid, match="straddl"):  # the failure being handled
        pc.open_csv(
            tmp_path / "long.csv",
            read_options=pc.ReadOptions(block_size=block),
            parse_options=pc.ParseOptions(newlines_in_values=True),
        ).read_all()
    passes: list[int] = []
    real_pass = csv_reader._csv_pass
    monkeypatch.setattr(
        csv_reader,
        "_csv_pass",
        lambda inp, fields, want, blk: passes.append(blk) or real_pass(inp, fields, want, blk),
    )
    got: list[str | None] = []
    for batch in read_texts(resolve_inputs([path])[0], batch_docs=100):
        got.extend(batch.texts)
    assert got == [text for _, text in rows]
    assert passes[0] == block and len(passes) >= 2 and passes[-1] > 20 * block


def test_csv_records_with_a_long_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from packtool.instruct import check_prompt_completion
    from packtool.readers import csv as csv_reader
    from packtool.readers import read_records

    block = 16 << 10
    monkeypatch.setattr(csv_reader, "_CSV_BLOCK", block)
    path = tmp_path / "pc.csv"
    rows = _csv_with_a_long_cell(
        path, block, ["prompt", "completion"], lambda i, t: [f"question {i}", t]
    )
    check = check_prompt_completion("prompt", "completion")
    got = []
    for batch in read_records(
        resolve_inputs([path])[0], fields=["prompt", "completion"], check=check, batch_docs=100
    ):
        got.extend(batch.records)
    assert len(got) == len(rows)
    assert [tuple(r) for r in got] == [tuple(row) for row in rows]


def test_arrow_input_is_read_not_mapped_and_reports_progress(tmp_path: Path) -> None:
    """An Arrow IPC file is read batch by batch (a memory map would keep every page read
    resident), and its progress moves with the batches instead of staying at 0."""
    path = tmp_path / "t.arrow"
    table = pa.table({"text": [f"document {i} " * 20 for i in range(5000)]})
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
        writer.write_table(table, max_chunksize=1000)
    inp = resolve_inputs([path])[0]
    done: list[int] = []
    texts: list[str | None] = []
    maps = Path("/proc/self/maps")
    for batch in read_texts(inp, batch_docs=1000):
        texts.extend(batch.texts)
        done.append(batch.bytes_done)
        if maps.exists():
            assert str(path) not in maps.read_text()
    assert texts == table.column("text").to_pylist()
    assert done == sorted(done) and done[0] > 0 and done[-1] == path.stat().st_size
    assert len(set(done)) == 5


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(min_size=1, max_size=3000)
    | st.lists(st.sampled_from([b"\n", b"x", b"{}", b"\n\n"]), min_size=1, max_size=900).map(
        b"".join
    ),
    cut=st.tuples(st.integers(0, 3000), st.integers(0, 3000)),
    copy=st.booleans(),
)
def test_the_lines_of_a_piece_are_counted_as_every_byte_compared(data, cut, copy) -> None:
    """A piece's lines are counted with ``bytes.find`` while the line ends are few and by
    NumPy past :data:`~packtool.readers.jsonl._FINDS`: the count of line ends, plus one for a
    last line without its end, for a piece anywhere in its buffer."""
    a, b = sorted(cut)
    view = memoryview(bytearray(data) if copy else data)[min(a, len(data) - 1) : max(b, a + 1)]
    every = np.frombuffer(view, np.uint8)
    want = int(np.count_nonzero(every == 0x0A)) + int(every[-1] != 0x0A)
    assert jsonl._line_count(view) == want
