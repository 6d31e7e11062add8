"""``pack --mix`` with ``--units``: the mixture is planned once over every unit's documents, so
whatever the unit layout the rows hold the same documents (each with its source id and its
tokens, copies included) and the merge records the same ``mixture`` as one ``pack``; only
which documents share a row differs (each unit packs its own). A merge refuses units of
another mixture, or a mixture beside units that are not one, in one line."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from helpers import documents_with_sources, read_rows
from test_cli import assert_one_line_error, run
from test_mix_pack import sources  # noqa: F401  (the module's fixture: three sources)

import packtool
from packtool.engines import pack_units
from packtool.errors import OptionError, OutputExistsError
from packtool.verification import verify

MIX = {"max_len": 256, "mix": "1,1,1", "tokens": "300k"}  # the third source repeated


def segments(out: Path) -> tuple[dict, Counter]:
    """The manifest, and the multiset of the rows' documents: ``(doc_id, source_id,
    tokens)`` (read with pyarrow alone)."""
    manifest, rows = read_rows(out)
    return manifest, documents_with_sources(rows)


@pytest.fixture(scope="module")
def one_run(tmp_path_factory: pytest.TempPathFactory, sources) -> tuple[dict, Counter]:  # noqa: F811
    out = tmp_path_factory.mktemp("one") / "out"
    packtool.pack(sources, out, **MIX)
    return segments(out)


@pytest.mark.parametrize(("units", "num_proc"), [(1, 1), (3, 1), (4, 2)])
def test_units_give_the_documents_and_mixture_of_one_run(
    tmp_path: Path,
    sources,  # noqa: F811
    one_run,
    units: int,
    num_proc: int,
) -> None:
    out = tmp_path / "out"
    report = pack_units(sources, out, units=units, num_proc=num_proc, **MIX)
    assert report.packed == units and report.merged is not None
    manifest, docs = segments(out)
    one_manifest, one_docs = one_run
    assert docs == one_docs  # every document, its source and tokens, copies under their ids
    assert manifest["mixture"] == one_manifest["mixture"]
    assert manifest["mixture"]["copies"] >= 3  # the third source is repeated
    assert manifest["tokens"] == one_manifest["tokens"]
    assert manifest["documents"] == one_manifest["documents"]
    assert verify(out).ok, verify(out).problems
    against = verify(out, against=sources)  # each source's sample planned again, re-read
    assert against.ok, against.problems
    # the measured tokens were packed, then their work stores removed
    assert not list((out / "units").glob(".*packtool-work*"))
    # both rounds ran in one engine session: the units packed in the measures' processes
    assert [i for i, _, _ in report.measured] == list(range(units))
    assert {u.pid for u in report.units} <= {pid for _, pid, _ in report.measured}


def test_the_command_line_packs_a_mixture_in_units(tmp_path: Path, sources, one_run) -> None:  # noqa: F811
    out = tmp_path / "out"
    args = ("--mix", "1,1,1", "--tokens", "300k", "-L", "256", "--units", "2", "-q")
    result = run("pack", *[str(s) for s in sources], *args, "-o", out)
    assert result.exit_code == 0, result.output
    manifest, docs = segments(out)
    assert docs == one_run[1]
    paths = [s["path"] for s in manifest["mixture"]["sources"]]
    assert paths == [str(s) for s in sources]


def test_the_units_pack_the_tokens_they_measured(tmp_path: Path, sources, monkeypatch) -> None:  # noqa: F811
    """Each unit is tokenized once: its measure keeps the tokens, its pack resumes them."""
    from packtool import corpus, pipeline

    calls = []
    real = corpus.read_corpus

    def counting(files, *args, **kw):
        calls.append(len(files))
        return real(files, *args, **kw)

    monkeypatch.setattr(pipeline, "read_corpus", counting)
    pack_units(sources, tmp_path / "out", units=3, num_proc=1, **MIX)
    assert len(calls) == 3  # one read per unit, not two


def test_a_rerun_skips_the_finished_units_and_a_new_seed_packs_again(
    tmp_path: Path,
    sources,  # noqa: F811
) -> None:
    out = tmp_path / "out"
    pack_units(sources, out, units=2, num_proc=1, **MIX)
    _, first = segments(out)
    again = pack_units(sources, out, units=2, num_proc=1, **MIX)
    assert again.packed == 0 and segments(out)[1] == first
    # a unit lost: the mixture is planned again over every unit, the one unit packed
    shutil.rmtree(out / "units" / "unit-00001-of-00002")
    partial = pack_units(sources, out, units=2, num_proc=1, **MIX)
    assert partial.packed == 1 and segments(out)[1] == first
    assert not list((out / "units").glob(".*packtool-work*"))
    # with --mix the seed chooses the documents: another seed is another plan
    with pytest.raises(OutputExistsError, match="other seed"):
        pack_units(sources, out, units=2, num_proc=1, seed=5, **MIX)
    pack_units(sources, out, units=2, num_proc=1, seed=5, overwrite=True, **MIX)
    one = tmp_path / "one"
    packtool.pack(sources, one, seed=5, **MIX)
    assert segments(out)[1] == segments(one)[1] != first


def test_world_size_and_a_copying_merge_keep_the_source_ids(
    tmp_path: Path,
    sources,  # noqa: F811
    one_run,
) -> None:
    out = tmp_path / "out"
    pack_units(sources, out, units=3, num_proc=1, world_size=2, **MIX)
    manifest, docs = segments(out)
    assert manifest["units"]["copied"] and manifest["balance"]["world_size"] == 2
    assert docs == one_run[1] and manifest["mixture"] == one_run[0]["mixture"]
    # one pack with --world-size: the same documents and sources, rows balanced
    single = tmp_path / "single"
    packtool.pack(sources, single, world_size=2, **MIX)
    single_manifest, single_docs = segments(single)
    assert single_docs == one_run[1] and single_manifest["balance"]["world_size"] == 2
    assert verify(out).ok and verify(single).ok


def test_no_repeat_refused_after_measuring_leaves_nothing(tmp_path: Path, sources) -> None:  # noqa: F811
    out = tmp_path / "out"
    args = ("--mix", "1,1,1", "--tokens", "300k", "--no-repeat", "-L", "256", "--units", "2")
    result = run("pack", *[str(s) for s in sources], *args, "-o", out)
    assert_one_line_error(result, r"code.jsonl: its share of --tokens 300,000 is 100,000 tokens")
    assert not out.exists()


def test_one_unit_of_a_mixture_alone_is_refused(tmp_path: Path, sources) -> None:  # noqa: F811
    args = ("--mix", "1,1,1", "-L", "256", "--units", "2", "--unit", "0")
    result = run("pack", *[str(s) for s in sources], *args, "-o", tmp_path / "out")
    assert_one_line_error(result, r"--mix is planned over every unit's documents")
    assert not (tmp_path / "out").exists()


def _edit(path: Path, change) -> None:
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        (lambda m: m.pop("mixture"), r"is not a mixture, unit 0 is"),
        (
            lambda m: m["mixture"]["sources"][1].update(weight=2.0),
            r"unit 1 was packed from another mixture than unit 0",
        ),
        (
            lambda m: m["mixture"].update(doc_id_stride=7),
            r"unit 1 was packed from another mixture than unit 0",
        ),
    ],
)
def test_a_merge_refuses_units_of_another_mixture_in_one_line(
    tmp_path: Path,
    sources,  # noqa: F811
    change,
    expect: str,
) -> None:
    out = tmp_path / "out"
    pack_units(sources, out, units=2, num_proc=1, **MIX)
    _edit(out / "units" / "unit-00001-of-00002" / "manifest.json", change)
    assert_one_line_error(run("merge", out, "--copy"), expect)


def test_a_merge_refuses_another_seed_than_the_mixtures(tmp_path: Path, sources) -> None:  # noqa: F811
    """With --mix the seed chose the documents: a merge with another --seed would reorder the
    rows of seed 0's sample under a manifest recording seed 4 (whose plan verify --against
    would not find in them); it is refused in one line, the units' own seed merges."""
    out = tmp_path / "out"
    pack_units(sources, out, units=2, num_proc=1, **MIX)
    before = (out / "manifest.json").read_bytes()
    expect = r"--seed 4: the units are a mixture \(pack --mix\) whose documents were sampled "
    assert_one_line_error(run("merge", out, "--seed", "4", "--copy"), expect + r"with --seed 0")
    assert (out / "manifest.json").read_bytes() == before
    with pytest.raises(OptionError, match="merge with --seed 0"):
        packtool.merge_units(out, seed=4)
    assert run("merge", out, "--seed", "0", "--copy").exit_code == 0
    assert json.loads((out / "manifest.json").read_text())["options"]["seed"] == 0
    assert verify(out, against=sources).ok


def test_each_unit_names_its_pieces_of_each_source(sources) -> None:  # noqa: F811
    """A source cut over units (web.jsonl) and one of two files (math/): each unit's part
    names exactly its pieces of each source, and the files add up to the sources'."""
    from packtool.mixture import Source
    from packtool.readers import resolve_inputs
    from packtool.units import plan_units, unit_mixtures

    files, whole = [], []
    for s in sources:
        found = resolve_inputs([str(s)])
        whole.append(Source(str(s), 1.0, len(files), len(files) + len(found)))
        files.extend(found)
    units = plan_units(files, 4)
    parts = unit_mixtures(units, files, whole)
    assert sum(1 for u in units for p in u.pieces if p.path == files[0].path) >= 2  # web cut
    for unit, part in zip(units, parts, strict=True):
        for src, mine in zip(whole, part.sources, strict=True):
            paths = {f.path for f in files[src.first_file : src.end_file]}
            inside = unit.pieces[mine.first_file : mine.end_file]
            outside = unit.pieces[: mine.first_file] + unit.pieces[mine.end_file :]
            assert all(p.path in paths for p in inside)
            assert not any(p.path in paths for p in outside)
    assert [sum(p.files[i] for p in parts) for i in range(3)] == [1, 1, 2]


def test_library_pack_of_a_unit_without_its_part_is_one_line(tmp_path: Path, sources) -> None:  # noqa: F811
    from packtool.readers import resolve_inputs

    files = resolve_inputs([str(sources[0])])
    with pytest.raises(OptionError, match="--mix with --units"):
        packtool.pack([], tmp_path / "out", files=files, max_len=256, mix="1")
