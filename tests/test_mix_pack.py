"""``pack --mix``: each input argument is a source holding its share of the rows' tokens
(within half a document), documents sampled or repeated whole; copies exact and identifiable;
``verify`` checks the mixture; bad --mix / --tokens input is one line and writes nothing."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pytest
import torch
from conftest import REPO, SAMPLE
from helpers import documents_from_rows, read_rows
from hypothesis import HealthCheck, given, settings
from test_cli import assert_one_line_error, run

import packtool
from packtool.stats import dataset_stats
from packtool.torch import PackedDataset, collate
from packtool.verification import verify


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three sources cut from the sample corpus: 600, 200 and 60 documents (the last a
    directory of two files: one source)."""
    root = tmp_path_factory.mktemp("sources")
    lines = SAMPLE.read_text("utf-8").splitlines(keepends=True)
    web, code, math = root / "web.jsonl", root / "code.jsonl", root / "math"
    web.write_text("".join(lines[:600]), "utf-8")
    code.write_text("".join(lines[600:800]), "utf-8")
    math.mkdir()
    (math / "a.jsonl").write_text("".join(lines[800:830]), "utf-8")
    (math / "b.jsonl").write_text("".join(lines[830:860]), "utf-8")
    return [web, code, math]


@pytest.fixture(scope="module")
def read_lengths(tmp_path_factory: pytest.TempPathFactory, sources) -> dict[int, int]:
    """Each document's tokens as packed (a plain pack of the same inputs: same numbering)."""
    out = tmp_path_factory.mktemp("plain") / "out"
    packtool.pack(sources, out, max_len=256)
    return {d: len(t) for d, t in documents_from_rows(read_rows(out)[1]).items()}


def _tokens_per_source(out: Path) -> tuple[dict, dict[int, list[int]], list[int]]:
    """The manifest, each row document's tokens, and each source's tokens in the rows (a
    document's source from its doc id, less the copies, in the source's range)."""
    manifest, rows = read_rows(out)
    docs = documents_from_rows(rows)
    mixture = manifest["mixture"]
    stride = mixture["doc_id_stride"]
    per_source = []
    for src in mixture["sources"]:
        lo, hi = src["first_doc"], src["first_doc"] + src["documents_read"]
        per_source.append(sum(len(t) for d, t in docs.items() if lo <= d % stride < hi))
    return manifest, docs, per_source


def test_each_source_holds_its_share_and_verify_passes(tmp_path: Path, sources) -> None:
    out = tmp_path / "mixed"
    result = run("pack", *sources, "--mix", "0.5,0.3,0.2", "-L", "256", "-o", out, "-q")
    assert result.exit_code == 0, result.output
    manifest, docs, per_source = _tokens_per_source(out)
    mixture = manifest["mixture"]
    total = mixture["tokens"]
    assert manifest["tokens"]["packed"] == total == sum(per_source)
    longest = max(len(t) for t in docs.values())
    for src, got, share in zip(mixture["sources"], per_source, (0.5, 0.3, 0.2), strict=True):
        assert got == src["tokens_taken"]
        assert abs(got - share * total) <= longest / 2 + 1, (src["path"], got, share * total)
    assert [s["files"] for s in mixture["sources"]] == [1, 1, 2]
    # the default total needs no repeats: the source smallest for its share is taken whole
    assert min(s["epochs"] for s in mixture["sources"]) < 1.0
    assert max(s["epochs"] for s in mixture["sources"]) == 1.0 and mixture["copies"] == 1
    report = verify(out)
    assert report.ok, report.problems


def test_a_repeated_document_is_an_exact_copy_under_its_own_id(tmp_path: Path, sources) -> None:
    out = tmp_path / "repeated"
    args = ("--mix", "1,1,1", "--tokens", "300k", "-L", "256", "-o", out, "-q")
    assert run("pack", *sources, *args).exit_code == 0
    manifest, docs, per_source = _tokens_per_source(out)
    mixture = manifest["mixture"]
    stride = mixture["doc_id_stride"]
    assert stride == manifest["documents"]["read"] == 860
    math = mixture["sources"][2]
    assert math["epochs"] > 2 and mixture["copies"] >= 3
    copies = [d for d in docs if d >= stride]
    assert copies
    for d in copies:  # every copy holds exactly the tokens of the document it copies
        assert docs[d] == docs[d % stride]
    # a document taken k times is in the rows k times: the documents taken, copies counted
    assert len(docs) == sum(s["documents_taken"] for s in mixture["sources"])
    assert per_source == [s["tokens_taken"] for s in mixture["sources"]]
    assert verify(out).ok


def test_verify_finds_a_mixture_record_that_lies(tmp_path: Path, sources) -> None:
    out = tmp_path / "lie"
    assert run("pack", *sources, "--mix", "2,1,1", "-L", "256", "-o", out, "-q").exit_code == 0
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["mixture"]["sources"][1]["tokens_taken"] += 7
    path.write_text(json.dumps(manifest))
    report = verify(out)
    assert not report.ok
    mixture = [p.what for p in report.problems if p.check == "mixture"]
    assert any("source 1" in what for what in mixture), report.problems


def test_without_mix_the_rows_are_those_of_a_plain_pack(tmp_path: Path, sources) -> None:
    """--mix with one source and weight 1, at its whole: every document once, as a plain pack
    of it holds them (the mixture takes each document whole, in reading order)."""
    plain, mixed = tmp_path / "plain", tmp_path / "one"
    assert run("pack", sources[1], "-L", "256", "-o", plain, "-q").exit_code == 0
    assert run("pack", sources[1], "--mix", "1", "-L", "256", "-o", mixed, "-q").exit_code == 0
    assert documents_from_rows(read_rows(plain)[1]) == documents_from_rows(read_rows(mixed)[1])
    assert "mixture" not in json.loads((plain / "manifest.json").read_text())


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.integers(1, 9), min_size=3, max_size=3), st.integers(20_000, 200_000))
def test_shares_hold_within_half_a_document_for_any_weights(
    tmp_path_factory, sources, read_lengths, weights, tokens
) -> None:
    """Each source's tokens in the rows are within half of its longest document (as packed,
    from a plain pack of the same inputs) of its share of --tokens, repeated or sampled."""
    out = tmp_path_factory.mktemp("prop") / "out"
    mix = ",".join(map(str, weights))
    packtool.pack(sources, out, max_len=256, mix=mix, tokens=tokens)
    manifest, _, per_source = _tokens_per_source(out)
    shares = np.array(weights) / sum(weights)
    for src, got, share in zip(manifest["mixture"]["sources"], per_source, shares, strict=True):
        lo, hi = src["first_doc"], src["first_doc"] + src["documents_read"]
        longest = max(n for d, n in read_lengths.items() if lo <= d < hi)
        assert abs(got - round(tokens * share)) <= longest / 2 + 0.5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--mix", "0.5,0,0.5"), r"--mix: every weight must be a positive number, got '0'"),
        (("--mix", "0.5,x,0.5"), r"--mix: 'x' is not a number"),
        (("--mix", "0.5,0.5"), r"--mix gives 2 weights for 3 inputs"),
        (("--tokens", "1M"), r"--tokens is for mixtures: give --mix"),
        (("--no-repeat",), r"--no-repeat is for mixtures: give --mix"),
        (
            ("--mix", "1,1,1", "--tokens", "300k", "--no-repeat"),
            r"code.jsonl: its share of --tokens 300,000 is 100,000 tokens, but it holds "
            r"[\d,]+: lower --tokens, or allow repeating",
        ),
        (("--mix", "1,1,1", "--tokens", "12x"), r"--tokens: cannot read '12x'"),
    ],
)
def test_bad_mix_input_is_one_line_and_writes_nothing(
    tmp_path: Path, sources, args, message
) -> None:
    out = tmp_path / "out"
    assert_one_line_error(run("pack", *sources, "-L", "256", "-o", out, *args), message)
    assert not out.exists()


def test_source_ids_name_each_segments_source_and_verify_checks_them(
    tmp_path: Path, sources
) -> None:
    out = tmp_path / "ids"
    assert run("pack", *sources, "--mix", "3,2,1", "-L", "256", "-o", out, "-q").exit_code == 0
    manifest, rows = read_rows(out)
    assert manifest["columns"][-1] == "source_ids"
    stride = manifest["mixture"]["doc_id_stride"]
    ranges = [
        (s["first_doc"], s["first_doc"] + s["documents_read"])
        for s in manifest["mixture"]["sources"]
    ]
    seen = set()
    for row in rows:
        assert len(row["source_ids"]) == len(row["doc_ids"])
        for doc, source in zip(row["doc_ids"], row["source_ids"], strict=True):
            lo, hi = ranges[source]
            assert lo <= doc % stride < hi
            seen.add(source)
    assert seen == {0, 1, 2}
    # a source id changed in a shard is found (besides the shard's sha256)
    shard = out / manifest["shards"][0]["file"]
    with pa.memory_map(str(shard)) as src:
        table = pa.ipc.open_stream(src).read_all()
    changed = table.to_pylist()
    changed[0]["source_ids"][0] = (changed[0]["source_ids"][0] + 1) % 3
    with pa.OSFile(str(shard), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(pa.Table.from_pylist(changed, schema=table.schema))
    checks = {p.check for p in verify(out).problems}
    assert "source_ids" in checks


def test_a_plain_pack_has_no_source_ids(tmp_path: Path, sources) -> None:
    out = tmp_path / "plain"
    assert run("pack", *sources, "-L", "256", "-o", out, "-q").exit_code == 0
    manifest, rows = read_rows(out)
    assert "source_ids" not in manifest["columns"] and "source_ids" not in rows[0]


def test_stats_of_a_mixture_report_each_source(tmp_path: Path, sources) -> None:
    out = tmp_path / "stats"
    args = ("--mix", "0.5,0.3,0.2", "--tokens", "200k", "-L", "256", "-o", out, "-q")
    assert run("pack", *sources, *args).exit_code == 0
    manifest, rows = read_rows(out)
    got = dataset_stats(out)
    assert got.sources is not None
    padding = sum(256 - row["num_tokens"] for row in rows)
    assert sum(s.padding for s in got.sources) == pytest.approx(padding)
    for s, src in zip(got.sources, manifest["mixture"]["sources"], strict=True):
        assert s.tokens == src["tokens_taken"] and s.documents == src["documents_taken"]
        assert s.segments == sum(r["source_ids"].count(s.index) for r in rows)
        assert abs(s.share - s.target_share) < 0.01
    result = run("stats", out, "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert [s["tokens"] for s in data["sources"]] == [s.tokens for s in got.sources]
    assert "Sources (pack --mix)" in run("stats", out).stdout
    plain = tmp_path / "plain"
    assert run("pack", sources[0], "-L", "256", "-o", plain, "-q").exit_code == 0
    assert dataset_stats(plain).sources is None


def test_collate_gives_each_token_its_source(tmp_path: Path, sources) -> None:
    out = tmp_path / "torch"
    assert run("pack", *sources, "--mix", "1,1,1", "-L", "256", "-o", out, "-q").exit_code == 0
    ds = PackedDataset(out)
    assert [s.path for s in ds.sources] == [str(p) for p in sources]
    rows = [ds[i] for i in range(len(ds))]
    batch = collate(rows)
    per_token = batch["source_ids"]
    assert per_token.shape == batch["input_ids"].shape and per_token.dtype == torch.int64
    reader = ds.reader
    for b, item in enumerate(rows):
        row = reader.row(item["row"])
        n = int(row.num_tokens)
        assert (per_token[b, n:] == -1).all()
        cu = row.cu_seqlens
        for k, source in enumerate(row.source_ids):
            assert (per_token[b, cu[k] : cu[k + 1]] == int(source)).all()
    counts = torch.bincount(per_token[per_token >= 0], minlength=3)
    taken = [s.tokens_taken for s in ds.sources]
    assert counts.tolist() == taken  # every row once: each source's tokens exactly
    # a plain pack: no source ids, no sources
    plain = tmp_path / "plain"
    assert run("pack", sources[2], "-L", "256", "-o", plain, "-q").exit_code == 0
    assert PackedDataset(plain).sources is None and "source_ids" not in collate(
        [PackedDataset(plain)[0]]
    )


def test_the_training_example_logs_the_loss_of_each_source(
    tmp_path: Path, sources, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "train"
    assert run("pack", *sources, "--mix", "1,1,1", "-L", "128", "-o", out, "-q").exit_code == 0
    spec = importlib.util.spec_from_file_location("train_example", REPO / "examples" / "train.py")
    assert spec is not None and spec.loader is not None
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    train.main(
        [str(out), "--steps", "2", "--batch-size", "8", "--grad-accum", "1", "--hidden", "32"]
    )
    printed = capsys.readouterr().out
    losses = re.findall(r"(web|code|math) (\d+\.\d+)", printed)
    assert {name for name, _ in losses} == {"web", "code", "math"}, printed
    assert all(abs(float(x) - math.log(8192)) < 1.5 for _, x in losses)


def test_the_worked_example_of_docs_mixtures_prints_what_it_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/mixtures.md: its script builds the three sources, its pack command packs them, and
    `stats` prints the sources table the page shows."""
    doc = (REPO / "docs" / "mixtures.md").read_text("utf-8")
    example = doc.split("## A worked example", 1)[1]
    script = re.search(r"python - <<'EOF'\n(.*?)\nEOF\n", example, flags=re.S)
    assert script is not None
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sample_data").symlink_to(REPO / "sample_data")
    exec(compile(script.group(1), "docs/mixtures.md", "exec"), {})
    command = re.search(r"^packtool (pack mix/.*)$", example, flags=re.M)
    assert command is not None
    assert run(*command.group(1).split(), "-q").exit_code == 0
    shown = re.search(r"```\n(Sources \(pack --mix\)\n.*?)```", example, flags=re.S)
    assert shown is not None
    shown_rows = [line.split() for line in shown.group(1).strip().splitlines()[2:]]
    figures = [
        [str(x.index), x.path, f"{x.tokens:,}", f"{x.share:.1%}", f"{x.target_share:.1%}",
         f"{x.documents:,}", f"{x.segments:,}", f"{x.padding:,.0f}", f"{x.epochs:.2f}"]
        for x in dataset_stats(tmp_path / "mixed").sources or ()
    ]  # fmt: skip
    assert shown_rows == figures
    assert "Sources (pack --mix)" in run("stats", "mixed").stdout


def test_the_pack_summary_names_what_each_source_gave(tmp_path: Path, sources) -> None:
    out = tmp_path / "summary"
    result = run("pack", *sources, "--mix", "0.5,0.3,0.2", "-L", "256", "-o", out)
    assert result.exit_code == 0
    mixture = json.loads((out / "manifest.json").read_text())["mixture"]
    assert "Sources taken (--mix)" in result.stdout
    for src in mixture["sources"]:
        assert f"{src['tokens_taken']:,}" in result.stdout
    # every document read is cut, then the mixture takes some: the summary and stats say so
    # (not "packed whole" of documents the rows do not hold)
    manifest = json.loads((out / "manifest.json").read_text())
    taken = sum(src["documents_taken"] for src in mixture["sources"])
    docs = manifest["documents"]
    assert "packed whole" not in result.stdout
    assert re.search(r"cut whole / split / truncated\s.*\s{:,} / {:,} / {:,}".format(
        docs["packed"], docs["split"], docs["truncated"]), result.stdout)  # fmt: skip
    assert re.search(rf"taken by --mix \(copies counted\)\s.*\s{taken:,}\s", result.stdout)
    assert taken < docs["read"] - docs["empty"]
    in_rows = dataset_stats(out).packing.documents
    packable = docs["read"] - docs["empty"] - docs["dropped"] - docs["bad_records_skipped"]
    shown = dict(dataset_stats(out).packing.figures())["documents in rows"]
    assert shown.startswith(f"{in_rows:,} of {docs['read']:,} read (")
    assert shown.endswith(f"{taken:,} taken by --mix of {packable:,} packable)")
    again = run("pack", *sources, "--mix", "0.5,0.3,0.2", "-L", "256", "-o", out, "--overwrite",
                "--json")  # fmt: skip
    assert json.loads(again.stdout)["mixture"] == mixture


def test_a_mixture_of_instruction_data_counts_the_learned_tokens_of_its_rows(
    tmp_path: Path,
) -> None:
    lines = (REPO / "sample_data" / "prompt_completion.jsonl").read_text("utf-8").splitlines()
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("\n".join(lines[:100]) + "\n", "utf-8")
    second.write_text("\n".join(lines[100:200]) + "\n", "utf-8")
    out = tmp_path / "out"
    args = ("--mix", "0.3,0.7", "--tokens", "40k", "-L", "512", "-o", out, "-q")
    assert run("pack", first, second, *args).exit_code == 0
    manifest, rows = read_rows(out)
    learned = sum(sum(1 for x in row["labels"] if x != -100) for row in rows)
    assert manifest["tokens"]["learned"] == manifest["labels"]["learned_tokens"] == learned
    assert manifest["mixture"]["learned_tokens"] == learned
    assert manifest["mixture"]["sources"][1]["epochs"] > 1  # repeated: copies counted
    assert verify(out).ok


def test_a_mixture_aligned_to_a_multiple_marks_the_alignment_pad_minus_one(
    tmp_path: Path, sources
) -> None:
    out = tmp_path / "aligned"
    args = ("--mix", "1,1,1", "--pad-to-multiple-of", "8", "-L", "256", "-o", out, "-q")
    assert run("pack", *sources, *args).exit_code == 0
    assert verify(out).ok
    ds = PackedDataset(out)
    rows = [ds[i] for i in range(min(len(ds), 32))]
    per_token = collate(rows)["source_ids"]
    for b, item in enumerate(rows):
        row = ds.reader.row(item["row"])
        real = np.full(256, -1)
        cu, ucu = row.cu_seqlens, row.cu_seqlens_unpadded
        for k, source in enumerate(row.source_ids):
            real[cu[k] : cu[k] + (ucu[k + 1] - ucu[k])] = source
        assert per_token[b].tolist() == real.tolist()


def test_a_source_that_gives_no_document_is_noted(tmp_path: Path, sources) -> None:
    """A weight (or --tokens) so small that a source's share is nearer to none than to any
    of its documents: within half a document, as documented, but said, not silent."""
    args = ("--mix", "0.998,0.001,0.001", "--tokens", "20k", "-L", "256")
    result = run("pack", *sources, *args, "-o", tmp_path / "a")
    assert result.exit_code == 0, result.output
    mixture = json.loads((tmp_path / "a" / "manifest.json").read_text())["mixture"]
    untaken = [s for s in mixture["sources"] if s["documents_taken"] == 0]
    assert [s["index"] for s in untaken] == [2]
    said = " ".join(result.stderr.split())
    assert f"--mix took no document of source 2 ({untaken[0]['path']}, 20 tokens asked)" in said
    assert "raise --tokens or its weight" in said
    as_json = run("pack", *sources, *args, "-o", tmp_path / "b", "--json")
    assert any("--mix took no document" in n for n in json.loads(as_json.stdout)["notices"])
    fine = run("pack", *sources, "--mix", "0.5,0.3,0.2", "-L", "256", "-o", tmp_path / "c")
    assert "--mix took no document" not in fine.stderr
