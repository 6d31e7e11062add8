"""`packtool verify`: clean outputs pass; every kind of damage is caught and named."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import REPO, SAMPLE, CharTokenizer, write_jsonl
from helpers import documents_from_rows, read_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import packtool
from packtool.cli import app
from packtool.errors import FormatError
from packtool.verification import VerifyReport, verify

runner = CliRunner()

# Documents of many lengths under the char tokenizer (+1 EOS each): short, exactly
# max_len, longer (split into chunks), one empty.
LENGTHS = (3, 8, 15, 0, 1, 31, 6, 40, 5, 2, 9, 4, 11, 7, 12, 10, 6, 5, 12, 12, 13, 2, 1, 9)
TEXTS = ["a" * n for n in LENGTHS]


def pack_chars(
    tmp_path: Path, texts: list[str] = TEXTS, max_len: int = 16, name: str = "out", **kw
) -> tuple[Path, Path]:
    """Pack ``texts`` (distinct characters per document, so any swap changes content)."""
    records = [
        {"text": "".join(chr(97 + (i + j) % 26) for j in range(len(t)))}
        for i, t in enumerate(texts)
    ]
    src = write_jsonl(tmp_path / f"{name}.jsonl", records)
    kw.setdefault("tokenizer", CharTokenizer())
    kw.setdefault("shuffle", False)
    out = tmp_path / name
    packtool.pack([src], out, max_len=max_len, **kw)
    return src, out


def rewrite_shard(
    out: Path, mutate: Callable[[list[dict]], None], shard: int = 0, fix_manifest: bool = True
) -> str:
    """Apply ``mutate`` to the rows (dicts) of one shard and write it back, with the same
    schema; with ``fix_manifest``, record the new bytes and sha256 so that only the row
    checks can catch the change. Returns the shard's file name."""
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["shards"][shard]
    path = out / entry["file"]
    with pa.memory_map(str(path)) as src:
        table = pa.ipc.open_stream(src).read_all()
    rows = table.to_pylist()
    mutate(rows)
    new = pa.Table.from_pylist(rows, schema=table.schema)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(new)
    if fix_manifest:
        entry["bytes"] = path.stat().st_size
        entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        entry["rows"] = len(rows)
        (out / "manifest.json").write_text(json.dumps(manifest))
    return entry["file"]


def edit_manifest(out: Path, edit: Callable[[dict], None]) -> None:
    manifest = json.loads((out / "manifest.json").read_text())
    edit(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))


def checks(report: VerifyReport) -> set[str]:
    return set(report.problem_counts)


def padded_row(rows: list[dict], segments: int = 2) -> int:
    """The index of the first row with padding and at least ``segments`` document segments."""
    for i, row in enumerate(rows):
        if row["num_tokens"] < len(row["input_ids"]) and len(row["doc_ids"]) >= segments:
            return i
    raise AssertionError("no such row")


# -- clean outputs ---------------------------------------------------------------------------


@pytest.mark.parametrize("overflow", ["split", "truncate", "drop"])
@pytest.mark.parametrize(("eos", "bos"), [(True, None), (False, None), (True, True)])
def test_clean_outputs_verify_against_inputs(
    tmp_path: Path, overflow: str, eos: bool, bos: bool | None
) -> None:
    src, out = pack_chars(
        tmp_path, overflow=overflow, add_eos=eos, bos=bos, shuffle=True, rows_per_shard=3
    )
    report = verify(out, against=[src], tokenizer=CharTokenizer())
    assert report.ok, report.problems
    manifest, rows = read_rows(out)
    docs = documents_from_rows(rows)  # independent reading of the same rows
    assert report.rows_checked == len(rows) == manifest["rows"]
    assert report.shards_checked == len(manifest["shards"]) > 1
    assert report.documents == len(docs)
    assert report.segments == sum(len(r["doc_ids"]) for r in rows) == manifest["segments"]
    assert report.tokens == sum(r["num_tokens"] for r in rows)
    assert report.against is not None
    assert report.against.documents == manifest["documents"]
    assert report.against.documents_compared == len(docs)


@pytest.fixture(scope="module")
def sample_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample corpus packed with the bundled tokenizer (shared, read only)."""
    out = tmp_path_factory.mktemp("sample") / "out"
    packtool.pack([SAMPLE], out, max_len=512, rows_per_shard=400)
    return out


def test_sample_corpus_with_the_bundled_tokenizer(sample_out: Path) -> None:
    out = sample_out
    report = verify(out, against=[SAMPLE])
    assert report.ok, report.problems
    assert report.against is not None and report.against.documents["read"] == 2500
    assert report.problem_counts == {} and report.to_dict()["problem_counts"] == {}
    assert report.bytes_hashed == sum(p.stat().st_size for p in out.glob("*.arrow"))
    assert report.notes == []


def test_empty_dataset_verifies(tmp_path: Path) -> None:
    src, out = pack_chars(tmp_path, texts=["", ""], allow_empty=True)  # as a unit may be
    report = verify(out, against=[src], tokenizer=CharTokenizer())
    assert report.ok, report.problems
    assert report.rows_checked == 0 and report.against.documents["empty"] == 2


def test_skipped_bad_records_are_counted_again(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "abc"}\nnot json\n{"text": 5}\n{"text": "defgh"}\n')
    out = tmp_path / "out"
    packtool.pack([src], out, max_len=8, tokenizer=CharTokenizer(), skip_bad_records=True)
    report = verify(out, against=[src], tokenizer=CharTokenizer())
    assert report.ok, report.problems
    assert report.against.documents["bad_records_skipped"] == 2


# -- damaged rows: named by shard and row ----------------------------------------------------


def _bump_position(row: dict) -> None:
    row["position_ids"][3] += 1


def _swap_cu(row: dict) -> None:
    cu = row["cu_seqlens"]
    cu[1], cu[2] = cu[2], cu[1]


def _cu_end(row: dict) -> None:
    row["cu_seqlens"][-1] -= 1


def _num_tokens(row: dict) -> None:
    row["num_tokens"] -= 1


def _pad_token(row: dict) -> None:
    row["input_ids"][-1] = 77


def _extra_chunk_id(row: dict) -> None:
    row["chunk_ids"].append(0)


def _doc_out_of_range(row: dict) -> None:
    row["doc_ids"][0] = 10**6


def _lost_eos(row: dict) -> None:
    row["input_ids"][row["cu_seqlens"][1] - 1] = 99


def _negative_chunk(row: dict) -> None:
    row["chunk_ids"][0] = -1


def _seq_length(row: dict) -> None:
    row["seq_lengths"][0] += 1


def _extra_seq_length(row: dict) -> None:
    row["seq_lengths"].append(0)


@pytest.mark.parametrize(
    ("mutate", "check"),
    [
        (_bump_position, "position_ids"),
        (_swap_cu, "cu_seqlens"),
        (_cu_end, "cu_seqlens"),
        (_num_tokens, "num_tokens"),
        (_pad_token, "padding"),
        (_extra_chunk_id, "doc_ids"),
        (_doc_out_of_range, "doc_ids"),
        (_lost_eos, "eos"),
        (_negative_chunk, "doc_ids"),
        (_seq_length, "seq_lengths"),
        (_extra_seq_length, "seq_lengths"),
    ],
)
def test_damaged_row_is_named(tmp_path: Path, mutate: Callable[[dict], None], check: str) -> None:
    _, out = pack_chars(tmp_path, rows_per_shard=4)
    _, rows = read_rows(out)
    target = padded_row(rows)
    assert target >= 4  # not in the first shard: rows are numbered over the shards
    assert rows[target]["cu_seqlens"][1] < 16  # the first segment is a whole document

    def damage(shard_rows: list[dict]) -> None:
        mutate(shard_rows[target % 4])

    shard = rewrite_shard(out, damage, shard=target // 4)
    report = verify(out)
    assert not report.ok
    named = [p for p in report.problems if p.check == check]
    assert named, report.problems
    assert named[0].shard == shard and named[0].row == target, named[0]
    assert f"row {target}" in str(named[0]) and shard in str(named[0])


def test_token_outside_the_vocabulary(tmp_path: Path) -> None:
    out = tmp_path / "out"
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "hello world " * 5}] * 3)
    packtool.pack([src], out, max_len=64, shuffle=False)
    vocab = json.loads((out / "manifest.json").read_text())["tokenizer"]["vocab_size"]

    def damage(rows: list[dict]) -> None:
        rows[0]["input_ids"][2] = vocab

    rewrite_shard(out, damage)
    report = verify(out)
    assert [(p.check, p.row) for p in report.problems] == [("input_ids", 0)]
    assert f"is {vocab}, outside" in report.problems[0].what


def test_duplicated_and_missing_documents(tmp_path: Path) -> None:
    _, out = pack_chars(tmp_path, texts=["a" * n for n in (9, 9, 5, 4, 3)], max_len=10)
    _, rows = read_rows(out)
    kept, victim = rows[0]["doc_ids"][0], rows[1]["doc_ids"][0]

    def damage(shard_rows: list[dict]) -> None:
        shard_rows[1]["doc_ids"][0] = kept  # now twice; the victim is gone

    rewrite_shard(out, damage)
    report = verify(out)
    whats = [p.what for p in report.problems]
    assert f"document {kept} chunk 0 appears twice (rows 0 and 1)" in whats
    assert any("the rows hold 4 documents" in w for w in whats), whats
    assert not any(f"document {victim} " in w for w in whats)  # its absence shows in counts


def test_missing_chunk_of_a_split_document(tmp_path: Path) -> None:
    _, out = pack_chars(tmp_path, texts=["x" * 50, "y" * 3], max_len=16)  # 51 -> 16,16,16,3

    def damage(rows: list[dict]) -> None:
        for row in rows:
            for k, (d, c) in enumerate(zip(row["doc_ids"], row["chunk_ids"], strict=True)):
                if d == 0 and c == 1:
                    row["chunk_ids"][k] = 7  # chunk 1 gone, a chunk 7 appears

    rewrite_shard(out, damage)
    report = verify(out)
    whats = [p.what for p in report.problems if p.check == "coverage"]
    assert "document 0: chunk 1 missing (the next present is 2)" in whats
    assert "document 0: chunks 4..6 missing (the next present is 7)" in whats


def test_lost_last_chunk(tmp_path: Path) -> None:
    # 32 tokens + EOS = 33 -> chunks 16, 16, 1: removing the last one leaves chunk 1 last,
    # max_len long, and not ending with EOS.
    _, out = pack_chars(tmp_path, texts=["x" * 32], max_len=16)

    def damage(rows: list[dict]) -> None:
        for row in rows:
            if 2 in row["chunk_ids"]:
                k = row["chunk_ids"].index(2)
                del row["chunk_ids"][k], row["doc_ids"][k]
                row["cu_seqlens"].pop(k + 1)
                row["num_tokens"] -= 1
                row["input_ids"][0] = 1  # now padding
                row["position_ids"][0] = 0

    rewrite_shard(out, damage)
    report = verify(out)
    assert any("last chunk 1 does not end with EOS" in p.what for p in report.problems)
    assert "counts" in checks(report)


def test_problems_are_capped_but_all_counted(tmp_path: Path) -> None:
    _, out = pack_chars(tmp_path)

    def damage(rows: list[dict]) -> None:
        for row in rows:
            row["position_ids"][0] = 5

    rewrite_shard(out, damage)
    report = verify(out, max_problems=3)
    n_rows = report.rows_checked
    assert report.problem_counts == {"position_ids": n_rows}
    assert report.problems_total == n_rows > 3
    assert [p.row for p in report.problems] == [0, 1, 2]


# -- what only --against sees ----------------------------------------------------------------


def test_swapped_tokens_are_caught_only_against_the_inputs(tmp_path: Path) -> None:
    src, out = pack_chars(tmp_path)
    _, rows = read_rows(out)
    r = padded_row(rows, segments=1)
    doc = rows[r]["doc_ids"][0]
    assert rows[r]["cu_seqlens"][1] >= 4

    def damage(shard_rows: list[dict]) -> None:
        ids = shard_rows[r]["input_ids"]
        ids[0], ids[1] = ids[1], ids[0]

    rewrite_shard(out, damage)
    assert verify(out).ok  # structurally perfect
    report = verify(out, against=[src], tokenizer=CharTokenizer())
    assert [(p.check, p.row) for p in report.problems] == [("against", r)]
    assert f"document {doc} (out.jsonl record {doc}): token 0 is" in report.problems[0].what


def test_changed_input_is_named(tmp_path: Path) -> None:
    src, out = pack_chars(tmp_path)
    lines = src.read_text().splitlines()
    lines[2] = json.dumps({"text": "zz" + json.loads(lines[2])["text"][2:]})
    src.write_text("\n".join(lines) + "\n")
    report = verify(out, against=[src], tokenizer=CharTokenizer())
    doc2 = [p for p in report.problems if p.what.startswith("document 2 ")]
    assert doc2 and "token 0 is" in doc2[0].what, report.problems


def test_missing_and_extra_input_documents(tmp_path: Path) -> None:
    src, out = pack_chars(tmp_path)
    lines = src.read_text().splitlines()
    fewer = tmp_path / "fewer.jsonl"
    fewer.write_text("\n".join(lines[:-1]) + "\n")
    report = verify(out, against=[fewer], tokenizer=CharTokenizer())
    whats = [p.what for p in report.problems]
    n = len(TEXTS)
    assert any(f"the inputs give {n - 1} documents read, the manifest says {n}" in w for w in whats)
    last = len(lines) - 1
    assert (
        f"document {last} (out.jsonl record {last}) is in the rows, but the inputs end "
        f"after {last} documents" in whats
    )


def test_wrong_tokenizer_is_reported(tmp_path: Path) -> None:
    src, out = pack_chars(tmp_path)

    class Other(CharTokenizer):
        sha256 = "1" * 64

    report = verify(out, against=[src], tokenizer=Other())
    assert any("is not the one the data was packed with" in p.what for p in report.problems)


def test_against_needs_a_tokenizer_when_none_was_copied(tmp_path: Path) -> None:
    src, out = pack_chars(tmp_path)
    with pytest.raises(packtool.OptionError, match=r"pass the tokenizer it was packed with"):
        verify(out, against=[src])


# -- the manifest, the files, the shards -----------------------------------------------------


def test_manifest_counts_that_do_not_add_up(tmp_path: Path) -> None:
    _, out = pack_chars(tmp_path)

    def edit(m: dict) -> None:
        m["documents"]["split"] += 1
        m["documents"]["packed"] -= 1
        m["tokens"]["packed"] += 1

    edit_manifest(out, edit)
    report = verify(out)
    whats = " | ".join(p.what for p in report.problems)
    assert "documents are split into several chunks in the rows, the manifest says" in whats
    assert "the rows hold" in whats and "tokens, the manifest says" in whats


def test_manifest_arithmetic(tmp_path: Path) -> None:
    _, out = pack_chars(tmp_path)
    edit_manifest(out, lambda m: m["documents"].update(read=m["documents"]["read"] + 1))
    report = verify(out)
    assert "manifest" in checks(report)
    assert any("but its parts add up to" in p.what for p in report.problems)


def test_malformed_manifest_values_are_listed_not_raised(tmp_path: Path) -> None:
    """A count of the wrong type: the training side refuses the pack in one line naming the
    key; verify lists it (and skips the arithmetic it would need), and stats still reads."""

    def edit(m: dict) -> None:
        m["documents"]["split"] = "2"
        m["tokens"]["learned"] = [1]

    _, out = pack_chars(tmp_path)
    edit_manifest(out, edit)
    with pytest.raises(
        FormatError, match=r'manifest.json: documents.split must be an integer, got "2"$'
    ):
        packtool.open_packed(out)
    report = verify(out)
    whats = [p.what for p in report.problems if p.check == "manifest"]
    assert 'manifest.json: documents.split must be an integer, got "2"' in whats
    assert "manifest.json: tokens.learned must be an integer, got [1]" in whats
    assert (
        "manifest.json: 'documents' does not hold every count (read, packed, split, ...)" in whats
    )
    assert not any("parts add up" in w for w in whats)
    result = runner.invoke(app, ["verify", str(out)])
    assert result.exit_code == 1 and "documents.split must be an integer" in result.stdout
    assert runner.invoke(app, ["stats", str(out)]).exit_code == 0


def test_stray_files_and_metadata(tmp_path: Path) -> None:
    _, out = pack_chars(tmp_path, tokenizer=None, max_len=64)
    shutil.copy(out / "data-00000-of-00001.arrow", out / "data-00005-of-00009.arrow")
    state = json.loads((out / "state.json").read_text())
    state["_data_files"].append({"filename": "data-00005-of-00009.arrow"})
    (out / "state.json").write_text(json.dumps(state))
    with open(out / "tokenizer.json", "a") as f:
        f.write(" ")
    report = verify(out)
    whats = " | ".join(p.what for p in report.problems)
    assert report.problem_counts == {"files": 3}, report.problems
    assert "data-00005-of-00009.arrow is not a shard of the manifest" in whats
    assert "state.json lists other shards" in whats
    assert "tokenizer.json does not match the sha256" in whats


def test_a_trainers_cache_is_a_warning_not_damage(tmp_path: Path) -> None:
    """`datasets` writes cache-*.arrow beside a dataset it maps (TRL's preparation does, on
    load_from_disk("out")): verify names it as a trainer's cache and still passes the pack."""
    import datasets

    _, out = pack_chars(tmp_path, rows_per_shard=4)
    ds = datasets.load_from_disk(str(out))
    ds.map(lambda row: {"n": len(row["input_ids"])})
    cache = sorted(p.name for p in out.glob("cache-*.arrow"))
    assert cache  # datasets did write into the pack
    report = verify(out)
    assert report.ok, report.problems
    assert len(report.warnings) == 1 and cache[0] in report.warnings[0]
    assert "trainer's cache" in report.warnings[0]
    assert report.to_dict()["warnings"] == report.warnings
    (out / "data-00009-of-00010.arrow").write_bytes(b"")  # any other stray: still a problem
    assert checks(verify(out)) == {"files"}


def shard_file(out: Path, index: int) -> Path:
    return out / json.loads((out / "manifest.json").read_text())["shards"][index]["file"]


def test_missing_shard(tmp_path: Path) -> None:
    _, out = pack_chars(tmp_path, rows_per_shard=4)
    path = shard_file(out, 1)
    path.unlink()
    report = verify(out)
    assert [(p.shard, p.check) for p in report.problems] == [(path.name, "files")]
    assert any("skipped" in n for n in report.notes)
    assert report.documents is None  # not counted (the table says so), never "0 documents"
    assert report.to_dict()["documents"] is None


@pytest.mark.parametrize("keep", [0.0, 0.3, 0.9, 0.999])
def test_truncated_shard(tmp_path: Path, keep: float) -> None:
    _, out = pack_chars(tmp_path, rows_per_shard=4)
    path = shard_file(out, 1)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    report = verify(out)
    assert not report.ok
    assert {"bytes", "sha256"} <= checks(report)
    assert all(p.shard == path.name for p in report.problems), report.problems
    assert any("truncated" in p.what for p in report.problems)
    # the reader's advice ("a shard of OUT (run `packtool verify`)") is not repeated by verify
    assert not any("packtool verify" in p.what for p in report.problems), report.problems
    assert not any("cannot read shard" in p.what for p in report.problems), report.problems


def test_bit_flips_are_caught_by_the_checksum(tmp_path: Path) -> None:
    _, out = pack_chars(tmp_path, rows_per_shard=4)
    path = shard_file(out, 0)
    clean = path.read_bytes()
    rng = np.random.default_rng(0)
    for position in rng.integers(0, len(clean), size=25):
        data = bytearray(clean)
        data[position] ^= 1 << int(rng.integers(0, 8))
        path.write_bytes(bytes(data))
        report = verify(out)
        assert "sha256" in checks(report), position
        assert {p.shard for p in report.problems} == {path.name}, report.problems
    path.write_bytes(clean)
    assert verify(out).ok


def test_not_a_packtool_output(tmp_path: Path) -> None:
    _, out = pack_chars(tmp_path)
    edit_manifest(out, lambda m: m.update(format_version=99))
    with pytest.raises(FormatError, match="format version 99 is not supported"):
        verify(out)
    (out / "manifest.json").unlink()
    with pytest.raises(FormatError, match="is not a packtool output"):
        verify(out)


# -- property: any single changed token is found --------------------------------------------


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    lengths=st.lists(st.integers(0, 60), min_size=1, max_size=25),
    max_len=st.integers(4, 24),
    overflow=st.sampled_from(["split", "truncate", "drop"]),
    pick=st.integers(0, 10**9),
    delta=st.integers(1, 50),
)
def test_any_changed_token_is_found(
    tmp_path_factory: pytest.TempPathFactory,
    lengths: list[int],
    max_len: int,
    overflow: str,
    pick: int,
    delta: int,
) -> None:
    tmp = tmp_path_factory.mktemp("prop")
    src, out = pack_chars(
        tmp,
        texts=["a" * n for n in lengths],
        max_len=max_len,
        overflow=overflow,
        shuffle=True,
        allow_empty=True,  # every document dropped: an empty output, as a unit may be
    )
    report = verify(out, against=[src], tokenizer=CharTokenizer())
    assert report.ok, report.problems
    _, rows = read_rows(out)
    real = [(r, j) for r, row in enumerate(rows) for j in range(row["num_tokens"])]
    if not real:
        return
    r, j = real[pick % len(real)]
    k = max(i for i, c in enumerate(rows[r]["cu_seqlens"]) if c <= j)
    doc = rows[r]["doc_ids"][k]

    def damage(shard_rows: list[dict]) -> None:
        shard_rows[r]["input_ids"][j] += delta

    rewrite_shard(out, damage)
    report = verify(out, against=[src], tokenizer=CharTokenizer())
    assert [p.what.split(" (")[0] for p in report.problems if p.check == "against"] == [
        f"document {doc}"
    ]


# -- the command line ------------------------------------------------------------------------


def test_cli_verified(sample_out: Path) -> None:
    out = sample_out
    result = runner.invoke(app, ["verify", str(out)])
    assert result.exit_code == 0, result.output
    assert "verified:" in result.stdout and "FAILED" not in result.stdout
    # --against without inputs re-reads the paths recorded in the manifest
    result = runner.invoke(app, ["verify", str(out), "--against", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] and data["against"]["documents"]["read"] == 2500
    assert data["against"]["inputs"] == [str(SAMPLE)]


def test_cli_problems_exit_1_and_are_listed(tmp_path: Path) -> None:
    _, out = pack_chars(tmp_path, rows_per_shard=4)
    path = shard_file(out, 2)
    path.write_bytes(path.read_bytes()[:-100])
    result = runner.invoke(app, ["verify", str(out)])
    assert result.exit_code == 1
    assert "FAILED" in result.stdout
    assert f"problem: {path.name}: " in result.stdout
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["verify", str(out), "--json", "--max-problems", "1"])
    data = json.loads(result.stdout)
    assert result.exit_code == 1 and not data["ok"]
    assert len(data["problems"]) == 1 and data["problems_total"] > 1
    assert runner.invoke(app, ["verify", str(out), "-q"]).stdout == ""


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    from test_cli import assert_one_line_error

    assert_one_line_error(
        runner.invoke(app, ["verify", str(tmp_path)]), r"is not a packtool output", 1
    )
    _, out = pack_chars(tmp_path, tokenizer=None)
    assert_one_line_error(
        runner.invoke(app, ["verify", str(out), str(tmp_path / "out.jsonl")]),
        r"pass --against",
        2,
    )
    assert_one_line_error(
        runner.invoke(app, ["verify", str(out), "--against", str(tmp_path / "nope.jsonl")]),
        r"nope\.jsonl: no such file",
    )
    # another input (chats) against a text pack: a record pack would have stopped at. The
    # advice is verify's, not pack's (verify has no --text-field, --messages-field nor
    # --skip-bad-records)
    chats = REPO / "sample_data" / "chat.jsonl"
    result = runner.invoke(app, ["verify", str(out), "--against", str(chats)])
    assert_one_line_error(result, r"chat\.jsonl:1: no field 'text'.* --against re-reads the")
    assert not re.search(r"--(text-field|messages-field|skip-bad-records)", result.stderr)
    # a pack of ids against a file without its ids field: the same question
    ids = write_jsonl(tmp_path / "ids.jsonl", [{"ids": [5, 6, 7]}, {"ids": [8, 9]}])
    packtool.pack([ids], tmp_path / "ids-out", max_len=8, ids_field="ids", pad_id=0)
    result = runner.invoke(app, ["verify", str(tmp_path / "ids-out"), "--against", str(chats)])
    assert_one_line_error(result, r"no field 'ids' \(--ids-field\).* --against re-reads the")


# -- blocks, labels, every input kind --------------------------------------------------------


def test_rows_checked_in_small_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks are slices of record batches: offsets of sliced lists must be handled."""
    import importlib

    # packtool.verify is the function (exported); its row checks are packtool.verification.rows
    verify_module = importlib.import_module("packtool.verification.rows")

    src, out = pack_chars(tmp_path, shuffle=True)
    monkeypatch.setattr(verify_module, "BLOCK_TOKENS", 3 * 16)  # 3 rows per block
    assert verify(out, against=[src], tokenizer=CharTokenizer()).ok
    _, rows = read_rows(out)
    target = padded_row(rows)

    def damage(shard_rows: list[dict]) -> None:
        shard_rows[target]["position_ids"][-1] += 1

    rewrite_shard(out, damage)
    report = verify(out, against=[src], tokenizer=CharTokenizer())
    assert [(p.check, p.row) for p in report.problems] == [("position_ids", target)]


def test_labels_column(tmp_path: Path) -> None:
    """Instruction data carries labels: -100 in the padding, like input_ids' pad_id."""
    from packtool.format import packed_schema

    _, out = pack_chars(tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    path = out / manifest["shards"][0]["file"]
    with pa.memory_map(str(path)) as f:
        table = pa.ipc.open_stream(f).read_all()
    rows = table.to_pylist()
    for row in rows:
        n = row["num_tokens"]
        row["labels"] = row["input_ids"][:n] + [-100] * (16 - n)
        for start in row["cu_seqlens"][: len(row["doc_ids"])]:
            row["labels"][start] = -100  # nothing in its segment precedes a first token
    schema = packed_schema(16, with_labels=True)

    def write(rows: list[dict]) -> None:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as w:
            w.write_table(pa.Table.from_pylist(rows, schema=schema))
        manifest["columns"] = schema.names
        manifest["shards"][0]["bytes"] = path.stat().st_size
        manifest["shards"][0]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        (out / "manifest.json").write_text(json.dumps(manifest))

    write(rows)
    assert verify(out).ok
    target = padded_row(rows)
    rows[target]["labels"][-1] = 5
    write(rows)
    report = verify(out)
    assert [(p.check, p.row) for p in report.problems] == [("labels", target)]
    assert "labels[15] is 5 in the padding, expected -100" in report.problems[0].what


def test_against_every_input_kind(tmp_path: Path) -> None:
    import datasets
    import pyarrow.parquet as pq

    texts = [t for t in TEXTS if t] + ["x" * 70]
    cols = {"text": [f"{i}:{t}" for i, t in enumerate(texts)]}
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table(cols), tmp_path / "in" / "a.parquet")
    with (
        pa.OSFile(str(tmp_path / "in" / "b.arrow"), "wb") as sink,
        pa.ipc.new_file(sink, pa.table(cols).schema) as w,
    ):
        w.write_table(pa.table(cols))
    (tmp_path / "in" / "c.csv").write_text(
        "text,n\n" + "".join(f'"{t}",{i}\n' for i, t in enumerate(cols["text"]))
    )
    (tmp_path / "in" / "d.txt").write_text("\n\n".join(cols["text"]) + "\n")
    write_jsonl(tmp_path / "in" / "e.jsonl", [{"text": t} for t in cols["text"]])
    datasets.Dataset.from_dict(cols).save_to_disk(str(tmp_path / "saved"))
    inputs = [tmp_path / "in", tmp_path / "saved"]
    out = tmp_path / "out"
    packtool.pack(inputs, out, max_len=16, tokenizer=CharTokenizer(), txt_unit="paragraph")
    report = verify(out, against=inputs, tokenizer=CharTokenizer())
    assert report.ok, report.problems
    assert report.against.documents["read"] == 6 * len(texts)
    # the same inputs in another order: the documents are numbered differently
    report = verify(out, against=inputs[::-1], tokenizer=CharTokenizer())
    assert not report.ok and "against" in checks(report)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    column=st.sampled_from(
        ["input_ids", "position_ids", "cu_seqlens", "num_tokens", "doc_ids", "chunk_ids"]
    ),
    action=st.sampled_from(["set", "append", "delete"]),
    pick=st.integers(0, 10**9),
    value=st.one_of(st.integers(-3, 40), st.integers(-(2**31), 2**31 - 1)),
)
def test_any_single_change_to_a_row_is_found_and_never_crashes(
    tmp_path_factory: pytest.TempPathFactory, column: str, action: str, pick: int, value: int
) -> None:
    tmp = tmp_path_factory.mktemp("mutate")
    src, out = pack_chars(tmp, rows_per_shard=5, shuffle=True)
    _, rows = read_rows(out)
    r = pick % len(rows)
    row = rows[r]
    cell = row[column]
    if column in ("input_ids", "position_ids"):
        action = "set"  # fixed-size lists keep their size
    if column == "num_tokens":
        if value == cell:
            return
    elif action == "set":
        if not cell or cell[pick % len(cell)] == value:
            return
    elif action == "delete" and not cell:
        return

    def damage(shard_rows: list[dict]) -> None:
        target = shard_rows[r % 5]
        if column == "num_tokens":
            target[column] = value
        elif action == "set":
            target[column][pick % len(cell)] = value
        elif action == "append":
            target[column].append(value)
        else:
            del target[column][pick % len(cell)]

    rewrite_shard(out, damage, shard=r // 5)
    report = verify(out, against=[src], tokenizer=CharTokenizer())
    assert not report.ok
    assert all(p.shard is None or p.shard.endswith(".arrow") for p in report.problems)


def _chat_pack(tmp_path: Path, **options: object) -> tuple[Path, Path, Path]:
    repo = Path(__file__).resolve().parent.parent
    chat, template = repo / "sample_data" / "chat.jsonl", repo / "sample_data" / "chatml.jinja"
    out = tmp_path / "out"
    packtool.pack([chat], out, max_len=2048, chat_template=template, **options)
    return chat, template, out


def _first_learned_label_unlearned(changed: list) -> Callable[[list[dict]], None]:
    def unlearn(rows: list[dict]) -> None:  # the first learned label of a segment -> -100
        for row in rows:
            for k, doc in enumerate(row["doc_ids"]):
                start, end = row["cu_seqlens"][k], row["cu_seqlens"][k + 1]
                learned = [j for j in range(start + 1, end) if row["labels"][j] != -100]
                if learned:
                    row["labels"][learned[0]] = -100
                    changed.append((doc, learned[0] - start))
                    return

    return unlearn


def test_a_label_of_another_token_or_at_a_segment_start_is_found(tmp_path: Path) -> None:
    """The format's rules for labels (docs/format.md), which verify did not check: a label is
    -100 or its own token's id, the first token of every document segment is not learned,
    and every document segment learns something. Each broken one (the shard's sha256
    recorded anew) is a problem naming the row."""
    _, _, out = _chat_pack(tmp_path)
    _, rows = read_rows(out)
    r = next(i for i, row in enumerate(rows) if len(row["doc_ids"]) > 1)
    row = rows[r]
    start, end = row["cu_seqlens"][1], row["cu_seqlens"][2]
    j = next(j for j in range(start + 1, end) if row["labels"][j] != -100)

    def relabel(at: int | range, value: int) -> Callable[[list[dict]], None]:
        def edit(shard_rows: list[dict]) -> None:
            for k in [at] if isinstance(at, int) else at:
                shard_rows[r]["labels"][k] = value

        return edit

    for at, value, what in [
        (range(start, end), -100, rf"document {row['doc_ids'][1]} chunk 0 learns nothing"),
        (j, row["input_ids"][j] + 1, rf"labels\[{j}\] is {row['input_ids'][j] + 1}, neither -100 "
         rf"nor its token input_ids\[{j}\] {row['input_ids'][j]}"),
        (start, row["input_ids"][start], rf"labels\[{start}\] is {row['input_ids'][start]} at the "
         rf"start of document {row['doc_ids'][1]} chunk 0, expected -100"),
    ]:  # fmt: skip
        shard, manifest = out / "data-00000-of-00001.arrow", out / "manifest.json"
        original = shard.read_bytes(), manifest.read_text()
        rewrite_shard(out, relabel(at, value))
        report = verify(out)
        assert [(p.check, p.row) for p in report.problems] == [("labels", r)], report.problems
        assert re.search(what, report.problems[0].what), report.problems[0].what
        shard.write_bytes(original[0])
        manifest.write_text(original[1])
    assert verify(out).ok


def test_against_checks_chat_records_ids_and_labels(tmp_path: Path) -> None:
    """Chats are rendered with the template the manifest names and re-tokenized; every
    document's ids and labels are compared: a label changed in a shard (its sha256 recorded
    anew, so only --against can tell) is one problem naming the document."""
    chat, _, out = _chat_pack(tmp_path)
    report = verify(out, against=[chat])
    assert report.ok, report.problems
    assert report.against is not None and report.against.documents_compared > 250
    changed: list = []
    rewrite_shard(out, _first_learned_label_unlearned(changed))
    assert verify(out).ok
    result = CliRunner().invoke(app, ["verify", str(out), "--against", str(chat)])
    assert result.exit_code == 1, result.output
    ((doc, j),) = changed
    lines = [line for line in result.stdout.splitlines() if line.startswith("problem")]
    assert len(lines) == 1, result.output
    assert f"document {doc} (chat.jsonl record {doc}): label {j} is -100 in the rows" in lines[0]


def test_against_checks_prompt_completion_records(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parent.parent
    src = repo / "sample_data" / "prompt_completion.jsonl"
    out = tmp_path / "out"
    packtool.pack([src], out, max_len=2048)
    assert verify(out, against=[src]).ok
    changed: list = []
    rewrite_shard(out, _first_learned_label_unlearned(changed))
    report = verify(out, against=[src])
    assert [p.check for p in report.problems] == ["against"], report.problems
    assert f"document {changed[0][0]} " in report.problems[0].what


def test_against_refuses_another_chat_template_in_one_line(tmp_path: Path) -> None:
    """A template other than the one packed with would change every label: refused, naming
    both, before any row is read; the template given with --chat-template is used."""
    chat, template, out = _chat_pack(tmp_path)
    other = tmp_path / "other.jinja"
    other.write_text(template.read_text(encoding="utf-8").replace("<|im_start|>", "<|im_start|> "))
    result = CliRunner().invoke(
        app, ["verify", str(out), "--against", str(chat), "--chat-template", str(other)]
    )
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert "is not the one the data was packed with" in lines[0]
    assert str(other) in lines[0] and str(template) in lines[0]
    moved = tmp_path / "moved.jinja"  # the recorded file gone: the same text, given again
    moved.write_bytes(template.read_bytes())
    template_copy = tmp_path / "t.jinja"
    template_copy.write_bytes(template.read_bytes())
    out2 = tmp_path / "out2"
    packtool.pack([chat], out2, max_len=2048, chat_template=template_copy)
    template_copy.unlink()
    assert verify(out2, against=[chat], chat_template=moved).ok
    # The output keeps the template it was rendered with: found there once the file is gone.
    assert (out2 / "chat_template.jinja").read_bytes() == template.read_bytes()
    assert verify(out2, against=[chat]).ok


def test_against_finds_the_template_that_came_with_the_tokenizer(tmp_path: Path) -> None:
    """A chat template from the tokenizer's tokenizer_config.json: verify --against takes it
    from the tokenizer pack was given while it is there, else from the output's copy of that
    config; an output without the copy (written before it was kept) and the tokenizer gone:
    one line saying to pass --chat-template, which takes that tokenizer_config.json too."""
    from packtool.tokenize import _DATA

    repo = Path(__file__).resolve().parent.parent
    chat, template = repo / "sample_data" / "chat.jsonl", repo / "sample_data" / "chatml.jinja"
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_bytes((_DATA / "tokenizer.json").read_bytes())
    config = json.loads((_DATA / "tokenizer_config.json").read_text())
    config["chat_template"] = template.read_text()
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    packtool.pack([chat], out, max_len=2048, tokenizer=str(model))
    report = verify(out, against=[chat])
    assert report.ok, report.problems
    assert report.against is not None and report.against.documents_compared > 250
    moved = tmp_path / "elsewhere"
    model.rename(moved)
    assert verify(out, against=[chat]).ok  # the output's copy of the config
    (out / "tokenizer_config.json").unlink()  # as an output written before the copy was kept
    result = CliRunner().invoke(app, ["verify", str(out), "--against", str(chat)])
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    (line,) = result.stderr.strip().splitlines()
    assert "which is not found from here (nor a copy in the output): pass it with" in line
    given = verify(out, against=[chat], chat_template=moved / "tokenizer_config.json")
    assert given.ok, given.problems


def test_split_examples_whose_chunks_had_nothing_to_learn_verify(tmp_path: Path) -> None:
    """Chunks with nothing to learn are dropped and counted: a split chat may keep one chunk,
    and verify accounts for them instead of calling the pack damaged."""
    repo = Path(__file__).resolve().parent.parent
    chat, template = repo / "sample_data" / "chat.jsonl", repo / "sample_data" / "chatml.jinja"
    out = tmp_path / "out"
    packtool.pack([chat], out, max_len=512, chat_template=template, overflow="split")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["labels"]["chunks_without_labels_dropped"] >= 1
    report = verify(out)
    assert report.ok, report.problems
    # The allowance is the manifest's count: without it, the same rows are a problem.
    manifest["labels"]["chunks_without_labels_dropped"] = 0
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert not verify(out).ok


def test_text_with_labels_whose_last_chunk_is_only_eos_verifies(tmp_path: Path) -> None:
    """--loss-on all: a last chunk of one token (the EOS) has no label (the first token of a
    segment is never learned), so it is dropped; the document keeps one full chunk."""
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": "a" * 16}, {"text": "bb"}])
    out = tmp_path / "out"
    packtool.pack([src], out, max_len=16, tokenizer=CharTokenizer(), loss_on="all")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["labels"]["chunks_without_labels_dropped"] == 1
    assert verify(out).ok


def test_the_segment_length_histogram_is_checked(tmp_path: Path) -> None:
    """The manifest's segment_lengths (what a merge of units counts the global FFD rows from)
    must be the rows' segment lengths."""
    _, out = pack_chars(tmp_path, rows_per_shard=4)
    assert verify(out).ok
    manifest = json.loads((out / "manifest.json").read_text())
    assert sum(manifest["segment_lengths"]["counts"]) == manifest["segments"]

    def shift(m: dict) -> None:  # one segment moved to another length, the total kept
        h = m["segment_lengths"]
        h["values"][-1] += 1

    edit_manifest(out, shift)
    report = verify(out)
    assert any("segment_lengths" in p.what for p in report.problems), report.problems


def test_shard_sizes_are_checked_before_any_shard_is_hashed(tmp_path: Path) -> None:
    """A shard grown (sparse, as a 10 GB one was) is named by its size before the first
    shard is hashed, and is not hashed itself: its bytes cannot be the recorded ones (verify
    hashed all 10 GB, 38 s, before saying so)."""
    _, out = pack_chars(tmp_path, rows_per_shard=4)
    first, grown = shard_file(out, 0), shard_file(out, 2)
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0x01
    first.write_bytes(bytes(data))  # altered, same size: only its hash tells
    size = grown.stat().st_size
    with open(grown, "r+b") as f:
        f.truncate(size + (256 << 20))  # 256 MiB more, no disk used
    report = verify(out)
    assert not report.ok
    assert (report.problems[0].shard, report.problems[0].check) == (grown.name, "bytes")
    assert "grown" in report.problems[0].what
    assert (first.name, "sha256") in {(p.shard, p.check) for p in report.problems}
    assert (grown.name, "sha256") in {(p.shard, p.check) for p in report.problems}
    shards = sorted(out.glob("*.arrow"))
    assert report.bytes_hashed == sum(p.stat().st_size for p in shards if p != grown)
