"""Work units: the assignment rule, reading pieces, running units, merging, reruns, the CLI.

The Ray engine has its own file (test_ray.py), which runs Ray in a network namespace.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SAMPLE, CharTokenizer, write_jsonl
from helpers import assert_row_invariants, documents_from_rows, read_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli import assert_one_line_error, run

import packtool
from packtool.engines import pack_units
from packtool.errors import BadRecordError, FormatError, OptionError, OutputExistsError
from packtool.merge import merge_units, segment_lengths
from packtool.options import PackOptions
from packtool.readers import InputFile, read_texts, resolve_inputs
from packtool.units import plan_units

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- helpers -------------------------------------------------------------------------------


def char_ids(text: str) -> list[int]:
    """What CharTokenizer makes of a document: one id per character, then EOS (0)."""
    return [ord(c) + 3 for c in text] + [0]


def all_texts(inp: InputFile, **kw) -> tuple[list, list[str]]:
    texts, bad = [], []
    for batch in read_texts(inp, **kw):
        texts.extend(batch.texts)
        bad.extend(str(e) for e in batch.bad)
    return texts, bad


def piece_texts(pieces, **kw) -> tuple[list, list[str]]:
    texts, bad = [], []
    for piece in pieces:
        for batch in read_texts(piece, **kw):  # a piece is read by the file's reader
            texts.extend(batch.texts)
            bad.extend(str(e) for e in batch.bad)
    return texts, bad


def boundaries(path: Path, kind: str) -> list[int]:
    """Brute force: every offset where a unit may start in a file of this kind."""
    data = path.read_bytes()
    if kind != "jsonl" or path.suffix == ".gz":
        return [0, len(data)]
    return sorted({0, len(data), *(i + 1 for i, b in enumerate(data) if b == ord("\n"))})


# -- the assignment rule -------------------------------------------------------------------

line = st.one_of(
    st.text(alphabet="abc xyz", max_size=12).map(lambda t: json.dumps({"text": t})),
    st.just(""),  # blank line
    st.just("  "),
    st.just('{"text": 5}'),  # bad: not a string
    st.just("{oops"),  # bad: malformed
)


@st.composite
def corpora(draw):
    """A few files: JSON Lines (maybe CRLF, maybe no final newline), gzipped JSON Lines, empty."""
    files = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["jsonl", "jsonl", "gz", "empty"]))
        lines = draw(st.lists(line, max_size=12))
        newline = draw(st.sampled_from(["\n", "\r\n"]))
        body = newline.join(lines) + (newline if draw(st.booleans()) else "")
        files.append((kind, body.encode()))
    return files, draw(st.integers(1, 9))


def write_corpus(root: Path, files) -> list[InputFile]:
    paths = []
    for i, (kind, body) in enumerate(files):
        if kind == "gz":
            path = root / f"f{i}.jsonl.gz"
            path.write_bytes(gzip.compress(body))
        else:
            path = root / f"f{i}.jsonl"
            path.write_bytes(b"" if kind == "empty" else body)
        paths.append(path)
    return resolve_inputs(paths)


@PROPS
@given(corpora())
def test_plan_follows_the_rule(case) -> None:
    files_spec, n_units = case
    with tempfile.TemporaryDirectory() as tmp:
        files = write_corpus(Path(tmp), files_spec)
        units = plan_units(files, n_units)
        assert units == plan_units(files, n_units)  # deterministic
        assert [u.index for u in units] == list(range(n_units))
        assert len({u.plan for u in units}) == 1

        # Every byte of every file in exactly one piece, in input order.
        order = [(str(p.path), p) for u in units for p in u.pieces]
        assert [f for f, _ in order] == sorted(
            (f for f, _ in order), key=lambda f: [str(x.path) for x in files].index(f)
        )
        for inp in files:
            mine = [p for f, p in order if f == str(inp.path)]
            assert mine, f"{inp.path} is in no unit"
            if len(mine) == 1 and mine[0].whole:
                continue
            spans = [
                (p.start, p.stop) if p.split_by == "bytes" else (0, inp.size_bytes) for p in mine
            ]
            assert spans[0][0] == 0 and spans[-1][1] == inp.size_bytes
            assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
            assert all(lo < hi for lo, hi in spans)

        # The cut points, recomputed by brute force from every allowed boundary.
        allowed, start = set(), 0
        for inp in files:
            allowed.update(start + b for b in boundaries(inp.path, inp.kind))
            start += inp.size_bytes
        total = start
        expected = [0]
        for k in range(1, n_units):
            cut = k * total // n_units
            expected.append(max(min(b for b in allowed if b >= cut), expected[-1]))
        sizes = [u.size_bytes for u in units]
        assert [int(x) for x in np.cumsum([0, *sizes])[:-1]] == expected
        assert sum(sizes) == total


@PROPS
@given(corpora(), st.booleans())
def test_pieces_read_like_the_whole_file(case, skip_bad: bool) -> None:
    files_spec, n_units = case
    with tempfile.TemporaryDirectory() as tmp:
        files = write_corpus(Path(tmp), files_spec)
        pieces = [p for u in plan_units(files, n_units) for p in u.pieces]
        whole_texts, whole_bad, whole_error = [], [], None
        try:
            for inp in files:
                t, b = all_texts(inp, skip_bad_records=skip_bad)
                whole_texts += t
                whole_bad += b
        except BadRecordError as e:
            whole_error = str(e)
        if whole_error is not None:
            with pytest.raises(BadRecordError) as info:
                piece_texts(pieces, skip_bad_records=skip_bad)
            assert str(info.value) == whole_error  # same file:line, counted from the file start
        else:
            assert piece_texts(pieces, skip_bad_records=skip_bad) == (whole_texts, whole_bad)


def test_parquet_is_cut_at_row_groups(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)  # incompressible text: the row groups outweigh the footer
    texts = [
        None if i % 17 == 5 else "".join(rng.choice(list("abcdefgh"), 200)) for i in range(200)
    ]
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": texts, "n": list(range(200))}), path, row_group_size=20)
    files = resolve_inputs([path])
    units = plan_units(files, 4)
    split = [p for u in units for p in u.pieces]
    assert [p.split_by for p in split] == ["row_groups"] * 4
    assert split[0].start == 0 and split[-1].stop == 10
    assert all(a.stop == b.start for a, b in itertools.pairwise(split))
    assert piece_texts(split, skip_bad_records=True) == all_texts(files[0], skip_bad_records=True)
    with pytest.raises(BadRecordError, match=r"t\.parquet: row 5: 'text' is null"):
        piece_texts(split)
    # The row number of an error counts from the start of the file, not of the piece.
    first_null = next(i for i in range(split[2].start * 20, 200) if texts[i] is None)
    assert first_null > 20
    with pytest.raises(BadRecordError, match=rf"row {first_null}: 'text' is null"):
        piece_texts(split[2:])


# -- packing units -------------------------------------------------------------------------


def mixed_inputs(root: Path) -> list[Path]:
    """JSON Lines, gzipped, Parquet, text, an empty file: documents of many lengths."""
    rng = np.random.default_rng(3)

    def text(i: int) -> str:
        return f"{i}:" + "abcdefgh"[i % 8] * int(rng.integers(0, 90))

    paths = [write_jsonl(root / "a.jsonl", [{"text": text(i)} for i in range(300)])]
    gz = root / "b.jsonl.gz"
    gz.write_bytes(
        gzip.compress(
            b"".join(json.dumps({"text": text(i)}).encode() + b"\n" for i in range(300, 400))
        )
    )
    paths.append(gz)
    (root / "c.jsonl").write_bytes(b"")
    paths.append(root / "c.jsonl")
    pq.write_table(
        pa.table({"text": [text(i) for i in range(400, 600)]}),
        root / "d.parquet",
        row_group_size=25,
    )
    paths.append(root / "d.parquet")
    (root / "e.txt").write_text("\n".join(text(i) for i in range(600, 700)) + "\n")
    paths.append(root / "e.txt")
    return paths


def input_texts(paths: list[Path]) -> list[str]:
    out: list[str] = []
    for inp in resolve_inputs(paths):
        out.extend(all_texts(inp)[0])
    return out


def table_rows(out: Path) -> list[dict]:
    return read_rows(out)[1]


@pytest.mark.parametrize("n_units", [1, 3, 7])
def test_units_keep_every_document_with_global_ids(tmp_path: Path, n_units: int) -> None:
    paths = mixed_inputs(tmp_path)
    texts = input_texts(paths)
    tok = CharTokenizer()
    report = pack_units(paths, tmp_path / "u", units=n_units, max_len=64, tokenizer=tok, num_proc=1)
    plain = packtool.pack(paths, tmp_path / "plain", max_len=64, tokenizer=tok)
    manifest, rows = read_rows(tmp_path / "u")
    for row in rows:
        assert_row_invariants(row, 64, 1)
    # doc_id d is record d of the inputs, in input order, as for a single pack.
    docs = documents_from_rows(rows)
    assert docs == {d: char_ids(t) for d, t in enumerate(texts) if t}
    assert (
        manifest["documents"]
        == json.loads((tmp_path / "plain/manifest.json").read_text())["documents"]
    )
    first = {Path(i["path"]).name: (i["first_doc"], i["documents"]) for i in manifest["inputs"]}
    assert first == {
        "a.jsonl": (0, 300),
        "b.jsonl.gz": (300, 100),
        "c.jsonl": (400, 0),
        "d.parquet": (400, 200),
        "e.txt": (600, 100),
    }
    # One global FFD over the same segments needs exactly the rows of a single pack.
    assert manifest["global_ffd_rows"] == plain.rows
    assert manifest["rows"] >= plain.rows
    assert manifest["units"]["rows_over_global_ffd"] == manifest["rows"] - plain.rows
    per_unit = manifest["units"]["per_unit"]
    assert len(per_unit) == n_units and sum(u["rows"] for u in per_unit) == manifest["rows"]
    assert [u["first_doc"] for u in per_unit] == list(
        np.cumsum([0] + [u["documents"] for u in per_unit])[:-1]
    )
    assert report.merged is not None and report.merged.rows == len(rows)
    if n_units == 1:  # one unit is one global packing: the very same rows as `pack`
        assert rows == table_rows(tmp_path / "plain")


def test_engines_and_unit_runs_give_the_same_rows(tmp_path: Path) -> None:
    paths = mixed_inputs(tmp_path)
    tok = CharTokenizer()
    kw = {"units": 4, "max_len": 48, "tokenizer": tok, "seed": 5, "rows_per_shard": 40}
    pool = pack_units(paths, tmp_path / "pool", num_proc=2, **kw)  # 2 processes
    pack_units(paths, tmp_path / "seq", num_proc=1, **kw)  # here, one after the other
    for i in (3, 1, 0, 2):  # any order, as array tasks finish
        single = pack_units(paths, tmp_path / "arr", unit=i, **kw)
        assert single.merged is None and [u.index for u in single.units] == [i]
    assert not (tmp_path / "arr/manifest.json").exists()
    merged = merge_units(tmp_path / "arr")  # seed and shard size: as recorded by the units
    expected = table_rows(tmp_path / "pool")
    assert table_rows(tmp_path / "seq") == expected
    assert table_rows(tmp_path / "arr") == expected
    assert merged.manifest["options"]["seed"] == 5
    # Merged without copying: the units' own shards of 40 rows (and each unit's last one).
    assert merged.manifest["units"]["copied"] is False
    assert {s["rows"] for s in merged.manifest["shards"]} - {40} != set()
    assert max(s["rows"] for s in merged.manifest["shards"]) == 40
    pids = {u.pid for u in pool.units}
    assert os.getpid() not in pids and len(pids) <= 2  # worker processes, at most 2
    # A merge with another seed gives the same rows in another order: the units hold the
    # order of seed 5, so this merge copies the rows (was: every merge copied).
    other = merge_units(tmp_path / "arr", seed=6)
    assert other.manifest["options"]["seed"] == 6
    assert other.manifest["units"]["copied"] is True
    assert other.manifest["shards"][0]["rows"] == 40
    again = table_rows(tmp_path / "arr")
    assert again != expected
    assert sorted(map(json.dumps, again)) == sorted(map(json.dumps, expected))


def test_an_array_task_with_another_command_stops_before_packing(tmp_path: Path) -> None:
    """`--unit 1` run with another -L than the finished unit 0 packed its unit, and only
    the merge, after every task, refused the mixed units: it now stops at once."""
    paths = mixed_inputs(tmp_path)
    tok = CharTokenizer()
    out = tmp_path / "out"
    pack_units(paths, out, units=3, unit=0, max_len=48, tokenizer=tok)
    pattern = (
        r"unit-00000-of-00003 was packed with other inputs or options \(other max_len\) than "
        r"unit 1 would be: run every unit with the same command"
    )
    with pytest.raises(OutputExistsError, match=pattern):
        pack_units(paths, out, units=3, unit=1, max_len=40, tokenizer=tok)
    assert not (out / "units" / "unit-00001-of-00003").exists()
    pack_units(paths, out, units=3, unit=1, max_len=48, tokenizer=tok)  # the same command: fine
    assert (out / "units" / "unit-00001-of-00003" / "manifest.json").exists()
    # the whole array again with new options and --overwrite: each task replaces its unit
    for i in range(3):
        pack_units(paths, out, units=3, unit=i, max_len=40, tokenizer=tok, overwrite=True)
    assert merge_units(out).max_len == 40


def test_reruns_skip_finished_units(tmp_path: Path) -> None:
    paths = mixed_inputs(tmp_path)
    tok = CharTokenizer()
    out = tmp_path / "out"
    pack_units(paths, out, units=3, unit=1, max_len=48, tokenizer=tok)
    marker = out / "units/unit-00001-of-00003/manifest.json"
    before = marker.stat().st_mtime_ns
    report = pack_units(paths, out, units=3, max_len=48, tokenizer=tok, num_proc=1)
    assert [u.skipped for u in report.units] == [False, True, False]
    assert marker.stat().st_mtime_ns == before
    # A second run finds the merged dataset: nothing to do.
    again = pack_units(paths, out, units=3, max_len=48, tokenizer=tok, num_proc=1)
    assert again.units == [] and again.merged is not None
    assert again.merged.rows == report.merged.rows
    # Other options: the finished units do not fit; say so, and --overwrite starts over.
    with pytest.raises(OutputExistsError, match=r"unit-00000-of-00003 .*\(other max_len\)"):
        pack_units(paths, out, units=3, max_len=40, tokenizer=tok, num_proc=1)
    with open(paths[0], "a") as f:  # the corpus grew: other byte ranges
        f.write(json.dumps({"text": "one more"}) + "\n")
    with pytest.raises(
        OutputExistsError, match=r"unit-00000-of-00003 .*\(other input files or sizes\)"
    ):
        pack_units(paths, out, units=3, max_len=48, tokenizer=tok, num_proc=1)
    with pytest.raises(OutputExistsError, match=r"holds units of --units 3"):
        pack_units(paths, out, units=2, max_len=48, tokenizer=tok, num_proc=1)
    redone = pack_units(paths, out, units=2, max_len=40, tokenizer=tok, num_proc=1, overwrite=True)
    assert [u.skipped for u in redone.units] == [False, False]
    again = pack_units(paths, out, units=2, max_len=40, tokenizer=tok, num_proc=1, overwrite=True)
    assert [u.skipped for u in again.units] == [False, False]  # --overwrite: start over
    assert sorted(p.name for p in (out / "units").iterdir()) == [
        "unit-00000-of-00002",
        "unit-00001-of-00002",
    ]


def test_more_units_than_records(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "ab"}, {"text": "cde"}])
    report = pack_units(
        [src], tmp_path / "out", units=5, max_len=16, tokenizer=CharTokenizer(), num_proc=1
    )
    assert [u.documents for u in report.units] == [1, 0, 1, 0, 0]
    _, rows = read_rows(tmp_path / "out")
    assert documents_from_rows(rows) == {0: char_ids("ab"), 1: char_ids("cde")}


def test_segment_lengths() -> None:
    table = pa.table(
        {
            "cu_seqlens": [[0, 9, 16, 21, 24], [0, 24], [0, 5, 24]],
            "doc_ids": [[1, 2, 0], [3], []],
        }
    )
    assert segment_lengths(table).tolist() == [9, 7, 5, 24]
    assert segment_lengths(table.slice(1)).tolist() == [24]


def test_sample_corpus_units_bytes_balanced(tmp_path: Path) -> None:
    files = resolve_inputs([SAMPLE])
    units = plan_units(files, 4, PackOptions(max_len=4096))
    sizes = [u.size_bytes for u in units]
    assert sum(sizes) == SAMPLE.stat().st_size
    longest_line = max(len(x) for x in SAMPLE.read_bytes().split(b"\n"))
    assert max(sizes) - min(sizes) <= longest_line + 1


# -- errors --------------------------------------------------------------------------------


def test_merge_errors(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "ab" * i} for i in range(1, 40)])
    with pytest.raises(FormatError, match="no units to merge"):
        merge_units(tmp_path)
    pack_units([src], tmp_path / "out", units=3, unit=0, max_len=16, tokenizer=CharTokenizer())
    with pytest.raises(FormatError, match=r"2 of 3 units are not finished \(unit 1, 2\)"):
        merge_units(tmp_path / "out")


def test_option_errors(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "ab"}])
    with pytest.raises(OptionError, match=r"--unit must be in 0\.\.3"):
        pack_units([src], tmp_path / "o", units=4, unit=4, max_len=16)
    with pytest.raises(OptionError, match="--units must be an integer from 1 to 100,000"):
        pack_units([src], tmp_path / "o", units=0, max_len=16)
    with pytest.raises(OptionError, match="--engine must be one of local, ray"):
        pack_units([src], tmp_path / "o", units=2, engine="spark", max_len=16)
    with pytest.raises(OptionError, match="--ray-address needs --engine ray"):
        pack_units([src], tmp_path / "o", units=2, ray_address="x:1", max_len=16)
    plain = tmp_path / "plain"
    packtool.pack([src], plain, max_len=16, tokenizer=CharTokenizer())
    with pytest.raises(OutputExistsError, match="holds files that are not packtool units"):
        pack_units([src], plain, units=2, max_len=16, tokenizer=CharTokenizer())


def test_a_bad_record_in_a_worker_is_a_one_line_error(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "ab"}] * 50 + [{"txt": "x"}])
    result = run(
        "pack", src, "-L", "16", "-o", tmp_path / "o", "--units", "2", "--num-proc", "2", "-q"
    )
    assert_one_line_error(result, r"in\.jsonl:51: no field 'text'.*--skip-bad-records")


def test_cli_units_unit_and_merge(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "word " * (i % 30)} for i in range(200)])
    out = tmp_path / "out"
    for i in range(2):
        result = run("pack", src, "-L", "64", "-o", out, "--units", "2", "--unit", i)
        assert result.exit_code == 0, result.output
        assert f"unit-0000{i}-of-00002: packed" in result.output
    result = run("merge", out)
    assert result.exit_code == 0, result.output
    assert "time" in result.output and "tokens/s" not in result.output  # it tokenizes nothing
    result = run("merge", out, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["units"]["count"] == 2 and data["rows"] >= data["global_ffd_rows"]
    result = run("pack", src, "-L", "64", "-o", tmp_path / "all", "--units", "2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rows"] == data["rows"]
    assert table_rows(out) == table_rows(tmp_path / "all")
    result = run("pack", src, "-L", "64", "-o", tmp_path / "x", "--unit", "1")
    assert_one_line_error(result, "give --units N", 2)
    result = run("pack", src, "-L", "64", "-o", tmp_path / "x", "--units", "2", "--unit", "2")
    assert_one_line_error(result, r"--unit must be in 0\.\.1", 2)
    result = run("merge", tmp_path / "nothing")
    assert_one_line_error(result, "no units to merge")


def test_stats_of_unmerged_units_names_merge(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert (
        run("pack", SAMPLE, "-L", "4096", "-o", out, "--units", "2", "--unit", "0", "-q").exit_code
        == 0
    )
    assert_one_line_error(
        run("stats", out),
        r"holds work units but no merged output yet: join them with `packtool merge",
        2,
    )


def test_a_failed_units_run_leaves_no_empty_output(tmp_path: Path) -> None:
    """Units that fail before any finishes leave nothing (a trial found an empty OUT/units/);
    a finished unit is kept, for the rerun to skip."""
    lines = ['{"text": "word ' + "x " * (i % 9) + '"}' for i in range(60)]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([*lines, "{broken"]) + "\n")
    out = tmp_path / "out"
    result = run("pack", src, "-L", "64", "-o", out, "--units", "1")
    assert_one_line_error(result, r"in\.jsonl:61: ")
    assert not out.exists()
    result = run("pack", src, "-L", "64", "-o", out, "--units", "2", "--num-proc", "1")
    assert result.exit_code != 0
    finished = list((out / "units").glob("*/manifest.json"))
    assert len(finished) == 1  # unit 0 (the first half) finished and is kept
