"""The repack record of a labelled split pack (``repack.arrows``): ``verify --against``
re-derives what it must hold from the re-read inputs and compares its contents; a labelled
split pack that split nothing writes it too (empty), so its repack is known exact."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import REPO
from test_cli import assert_one_line_error, run
from test_repack import CHATML, _chat_corpus, _long_prompts, _same_pack, _without_repack_record

import packtool


def _record_rows(pack: Path) -> list[dict]:
    """The repack record's rows, read with pyarrow alone (docs/format.md)."""
    data = (pack / "repack.arrows").read_bytes()
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all().to_pylist()


def _rewrite_record(pack: Path, rows: list[dict]) -> None:
    """Write ``rows`` as the pack's repack record, its bytes, sha256 and rows re-recorded in
    the manifest: the files check finds nothing wrong, only a check of the contents can."""
    data = (pack / "repack.arrows").read_bytes()
    schema = pa.ipc.open_stream(pa.py_buffer(data)).schema
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_table(pa.Table.from_pylist(rows, schema=schema))
    new = sink.getvalue().to_pybytes()
    (pack / "repack.arrows").write_bytes(new)
    manifest = json.loads((pack / "manifest.json").read_text())
    (entry,) = manifest["repack_files"]
    entry.update(rows=len(rows), bytes=len(new), sha256=hashlib.sha256(new).hexdigest())
    (pack / "manifest.json").write_text(json.dumps(manifest))


def _tamper(rows: list[dict], how: str) -> tuple[int, int]:
    """Alter ``rows`` (in place) as ``how`` says; returns the (doc_id, chunk_id) altered."""
    if how == "label":  # a learned first label another
        k = next(i for i, r in enumerate(rows) if r["label"] != -100)
        rows[k]["label"] += 1
    elif how == "no label":  # a learned first label said to be none
        k = next(i for i, r in enumerate(rows) if r["label"] != -100)
        rows[k]["label"] = -100
    elif how == "token":  # a token of a left-out chunk another
        k = next(i for i, r in enumerate(rows) if r["input_ids"])
        rows[k]["input_ids"][-1] = rows[k]["input_ids"][-1] + 1
    elif how == "short":  # a left-out chunk without its last token
        k = next(i for i, r in enumerate(rows) if len(r["input_ids"]) > 1)
        rows[k]["input_ids"] = rows[k]["input_ids"][:-1]
    elif how == "missing":
        row = rows.pop(len(rows) // 2)
        return row["doc_id"], row["chunk_id"]
    elif how == "extra":  # a chunk no document has
        last = rows[-1]
        rows.append({**last, "chunk_id": last["chunk_id"] + 50, "input_ids": []})
        k = len(rows) - 1
    else:
        raise AssertionError(how)
    return rows[k]["doc_id"], rows[k]["chunk_id"]


def _chat_pack(tmp_path: Path) -> tuple[Path, Path]:
    corpus = _chat_corpus(tmp_path)
    pack = tmp_path / "chat"
    packtool.pack([corpus], pack, max_len=128, chat_template=CHATML, overflow="split")
    return corpus, pack


def _pc_pack(tmp_path: Path) -> tuple[Path, Path]:
    corpus = _long_prompts(tmp_path)
    pack = tmp_path / "pc"
    packtool.pack([corpus], pack, max_len=64, overflow="split")
    return corpus, pack


_WHAT = {
    "label": "its first label is",
    "no label": "its first label is -100 in the repack record",
    "token": "in the repack record",
    "short": "tokens in the repack record",
    "missing": "missing from the repack record",
    "extra": "re-reading the inputs gives no such chunk",
}


@pytest.mark.parametrize("make", [_chat_pack, _pc_pack], ids=["chat128", "pc64"])
def test_verify_against_compares_the_repack_records_contents(tmp_path: Path, make) -> None:
    """An honest record passes; each alteration, re-hashed in the manifest (the files check
    cannot see it), is one problem naming the record, the document and the chunk."""
    corpus, pack = make(tmp_path)
    honest = _record_rows(pack)
    assert any(r["label"] != -100 for r in honest) and any(r["input_ids"] for r in honest)
    report = packtool.verify(pack, [corpus])
    assert report.ok, report.problems
    assert not any("repack record" in n for n in report.notes)
    for how, what in _WHAT.items():
        rows = [dict(r, input_ids=list(r["input_ids"])) for r in honest]
        doc, chunk = _tamper(rows, how)
        _rewrite_record(pack, rows)
        assert packtool.verify(pack).ok, how  # bytes, sha256, rows: as recorded
        report = packtool.verify(pack, [corpus])
        assert [(p.shard, p.check) for p in report.problems] == [("repack.arrows", "against")]
        (problem,) = report.problems
        assert problem.what.startswith(f"document {doc} ("), (how, problem.what)
        assert f" chunk {chunk}: " in problem.what and what in problem.what, (how, problem)
    _rewrite_record(pack, honest)
    assert packtool.verify(pack, [corpus]).ok


def test_the_cli_names_the_altered_record_and_fails(tmp_path: Path) -> None:
    corpus, pack = _pc_pack(tmp_path)
    rows = _record_rows(pack)
    doc, chunk = _tamper(rows, "label")
    _rewrite_record(pack, rows)
    assert run("verify", pack).exit_code == 0
    result = run("verify", pack, "--against", corpus)
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if "repack.arrows" in line]
    assert len(lines) == 1 and f"document {doc} (" in lines[0], result.output
    assert f"chunk {chunk}: its first label is" in lines[0]


def test_a_repack_refuses_a_record_altered_in_place(tmp_path: Path) -> None:
    """The repack record changed in place (a learned first label made -100, its size kept,
    the manifest not re-recorded) was read by a repack as it was, the label lost in the new
    pack; the repack checks its sha256 and refuses in one line."""
    _, pack = _pc_pack(tmp_path)
    data = (pack / "repack.arrows").read_bytes()
    rows = _record_rows(pack)
    _tamper(rows, "no label")
    manifest = (pack / "manifest.json").read_text()
    _rewrite_record(pack, rows)
    (pack / "manifest.json").write_text(manifest)  # the old bytes and sha256 recorded
    assert len((pack / "repack.arrows").read_bytes()) == len(data)
    out = tmp_path / "re"
    assert_one_line_error(
        run("pack", pack, "-L", "128", "-o", out),
        r"repack\.arrows: its sha256 is not the one the manifest records: the repack record",
    )
    assert not out.exists()


def test_a_merged_and_a_mixed_pack_check_their_records(tmp_path: Path) -> None:
    """Units' records (each with its doc_offset) and a mixture's (its documents as read)
    pass when honest; an altered unit's record is named by its file."""
    corpus = _long_prompts(tmp_path)
    units = tmp_path / "units"
    packtool.pack_units([corpus], units, max_len=64, overflow="split", units=2, num_proc=1)
    assert packtool.verify(units, [corpus]).ok
    manifest = json.loads((units / "manifest.json").read_text())
    second = manifest["repack_files"][1]
    unit = units / Path(second["file"]).parent
    rows = _record_rows(unit)
    rows[0]["label"] = 7 if rows[0]["label"] != 7 else 8
    _rewrite_record(unit, rows)
    entry = json.loads((unit / "manifest.json").read_text())["repack_files"][0]
    second.update(bytes=entry["bytes"], sha256=entry["sha256"])
    (units / "manifest.json").write_text(json.dumps(manifest))
    assert packtool.verify(units).ok
    (problem,) = packtool.verify(units, [corpus]).problems
    assert problem.shard == second["file"]
    assert problem.what.startswith(f"document {rows[0]['doc_id'] + second['doc_offset']} (")

    lines = (REPO / "sample_data" / "chat.jsonl").read_text().splitlines()
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(lines[:60]) + "\n")
    b.write_text("\n".join(lines[60:80]) + "\n")
    mixed = tmp_path / "mixed"
    options = {"chat_template": CHATML, "overflow": "split"}
    packtool.pack([a, b], mixed, max_len=128, mix="0.3,0.7", tokens="30k", **options)
    assert packtool.verify(mixed, [a, b]).ok
    rows = _record_rows(mixed)
    doc, chunk = _tamper(rows, "missing")
    _rewrite_record(mixed, rows)
    (problem,) = packtool.verify(mixed, [a, b]).problems
    assert (
        problem.what.startswith(f"document {doc} (") and f"chunk {chunk}: missing" in problem.what
    )


def test_an_older_labelled_split_pack_is_verified_with_a_note(tmp_path: Path) -> None:
    corpus, pack = _pc_pack(tmp_path)
    _without_repack_record(pack)
    report = packtool.verify(pack, [corpus])
    assert report.ok
    assert any(n.startswith("no repack record") for n in report.notes)


def _labelled_ids(tmp_path: Path) -> tuple[Path, dict]:
    """Pre-tokenized ids with labels, none longer than 10 tokens, one learning nothing."""
    import pyarrow.parquet as pq

    ids = [list(range(3, 11)), list(range(3, 9)), list(range(5, 15)), list(range(4, 8))]
    labels = [[-100] * 8, list(range(3, 9)), [-100] * 5 + list(range(10, 15)), [-100, 5, 6, 7]]
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"ids": ids, "y": labels}), corpus)
    return corpus, {"ids_field": "ids", "labels_field": "y", "pad_id": 0, "overflow": "split"}


def test_a_labelled_split_pack_that_split_nothing_repacks_exactly(tmp_path: Path) -> None:
    """It writes an empty record: its repack at a max-len that does not divide its own is
    the fresh pack, with no note; the same pack without it (as an older one) gets the note."""
    corpus, options = _labelled_ids(tmp_path)
    first = tmp_path / "first"
    packtool.pack([corpus], first, max_len=10, **options)
    manifest = json.loads((first / "manifest.json").read_text())
    assert manifest["documents"]["split"] == 0
    assert manifest["labels"]["documents_without_labels"] == 1
    (entry,) = manifest["repack_files"]
    assert entry["file"] == "repack.arrows" and entry["rows"] == 0
    assert _record_rows(first) == []
    assert packtool.verify(first, [corpus]).ok
    fresh, repacked = tmp_path / "fresh", tmp_path / "re"
    packtool.pack([corpus], fresh, max_len=7, **options)
    report = packtool.pack([first], repacked, max_len=7)
    _same_pack(repacked, fresh)
    assert not report.notices
    _without_repack_record(first)
    report = packtool.pack([first], tmp_path / "old", max_len=7)
    (notice,) = report.notices
    assert "a chunk's first token keeps no label" in notice
