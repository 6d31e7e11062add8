"""The merge without copying: the merged manifest lists the units' shards where they lie.

What it writes (metadata only), what reads it (packtool's readers, `datasets`, PackedDataset
epochs), when it copies after all, and what happens when a unit shard goes missing or changes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLE, CharTokenizer, write_jsonl
from helpers import read_rows
from test_cli import assert_one_line_error, run
from test_units import mixed_inputs

import packtool
from packtool.engines import pack_units
from packtool.errors import FormatError, OptionError
from packtool.merge import merge_units
from packtool.order import shard_order, unit_row_seed

KW = {"units": 4, "max_len": 48, "rows_per_shard": 30, "seed": 5}


@pytest.fixture
def units(tmp_path: Path) -> Path:
    """Four finished units (``--unit I`` runs), not merged yet: 30 rows per shard."""
    paths = mixed_inputs(tmp_path)
    out = tmp_path / "out"
    for i in range(4):
        pack_units(paths, out, unit=i, tokenizer=CharTokenizer(), **KW)
    return out


def wchar() -> int:
    """Bytes this process has passed to write(2) so far (Linux /proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


def rows_by_reader(out: Path) -> list[tuple]:
    ds = packtool.open_packed(out)
    return [
        (
            r.input_ids.tolist(),
            r.position_ids.tolist(),
            r.cu_seqlens.tolist(),
            r.doc_ids.tolist(),
            r.chunk_ids.tolist(),
        )
        for r in (ds[i] for i in range(len(ds)))
    ]


def test_the_merge_lists_the_units_shards_and_writes_no_row(units: Path, tmp_path: Path) -> None:
    copied = tmp_path / "copied"
    shutil.copytree(units, copied)
    shard_files = sorted(units.glob("units/unit-*/data-*.arrow"))
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in shard_files}
    written = wchar()
    report = merge_units(units)
    written = wchar() - written
    manifest = report.manifest

    # Only metadata at the top: no shard, and the units' shards untouched.
    assert sorted(p.name for p in units.iterdir()) == [
        "README.md",
        "dataset_info.json",
        "manifest.json",
        "state.json",
        "units",
    ]
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in shard_files} == before
    metadata = sum(p.stat().st_size for p in units.iterdir() if p.is_file())
    shard_bytes = sum(p.stat().st_size for p in shard_files)
    assert written <= metadata + 4096 < shard_bytes / 10, (written, metadata, shard_bytes)

    # Each entry is its unit's own (rows, bytes, sha256) with the unit's first document.
    per_unit = {u["directory"]: u for u in manifest["units"]["per_unit"]}
    listed = []
    for entry in manifest["shards"]:
        directory, _, name = entry["file"].rpartition("/")
        unit_manifest = json.loads((units / directory / "manifest.json").read_text())
        (own,) = [s for s in unit_manifest["shards"] if s["file"] == name]
        assert {k: entry[k] for k in ("rows", "bytes", "sha256")} == {
            k: own[k] for k in ("rows", "bytes", "sha256")
        }
        assert entry["doc_offset"] == per_unit[directory]["first_doc"]
        listed.append(entry["file"])
    assert sorted(listed) == sorted(str(p.relative_to(units)) for p in shard_files)
    # The shard order is seeded: the units' shards in unit order, permuted by shard_order.
    in_unit_order = sorted(listed)
    assert listed == [in_unit_order[i] for i in shard_order(len(listed), 5)]
    assert listed != in_unit_order
    assert manifest["units"]["copied"] is False and manifest["units"]["copy_reason"] is None
    assert [u["row_seed"] for u in manifest["units"]["per_unit"]] == [
        unit_row_seed(5, i) for i in range(4)
    ]

    # The same rows as the copying merge (global doc_ids), in another order.
    copy = merge_units(copied, copy=True)
    assert copy.manifest["units"]["copied"] is True
    assert copy.manifest["units"]["copy_reason"] == "--copy"
    assert any(p.suffix == ".arrow" for p in copied.iterdir())
    by_reference, by_copy = rows_by_reader(units), rows_by_reader(copied)
    assert by_reference != by_copy
    assert sorted(by_reference) == sorted(by_copy)
    assert {r[3][0] for r in by_reference} & set(range(400, 700))  # global numbers
    # verify checks it all: the shards' sha256, every row, every document once.
    result = run("verify", units)
    assert result.exit_code == 0, result.output
    # A second merge with the same options does nothing.
    assert merge_units(units).manifest["created_unix"] == manifest["created_unix"]


def test_without_shuffle_the_rows_are_the_copying_merges(tmp_path: Path) -> None:
    paths = mixed_inputs(tmp_path)
    kw = {**KW, "shuffle": False, "tokenizer": CharTokenizer(), "num_proc": 1}
    pack_units(paths, tmp_path / "ref", **kw)
    pack_units(paths, tmp_path / "copy", merge_copy=True, **kw)
    ref = json.loads((tmp_path / "ref/manifest.json").read_text())
    assert ref["units"]["copied"] is False
    assert [s["file"].split("/")[1] for s in ref["shards"]] == sorted(
        s["file"].split("/")[1] for s in ref["shards"]
    )  # the units in order
    assert read_rows(tmp_path / "ref")[1] == read_rows(tmp_path / "copy")[1]


def test_one_unit_gives_the_rows_of_a_plain_pack(tmp_path: Path) -> None:
    pack_units([SAMPLE], tmp_path / "one", units=1, max_len=4096, seed=3, num_proc=1)
    packtool.pack([SAMPLE], tmp_path / "plain", max_len=4096, seed=3)
    manifest = json.loads((tmp_path / "one/manifest.json").read_text())
    assert [s["file"] for s in manifest["shards"]] == [
        "units/unit-00000-of-00001/data-00000-of-00001.arrow"
    ]
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the tokenizer's files kept
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()
    assert read_rows(tmp_path / "one")[1] == read_rows(tmp_path / "plain")[1]


def test_datasets_load_the_merged_output(units: Path, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")  # in the test extra: never skipped in CI
    merge_units(units)
    manifest = json.loads((units / "manifest.json").read_text())
    expected = rows_by_reader(units)
    from_disk = datasets.load_from_disk(str(units))
    files = [str(units / s["file"]) for s in manifest["shards"]]
    from_files = datasets.load_dataset(
        "arrow", data_files=files, split="train", cache_dir=str(tmp_path / "hf-cache")
    )
    offsets = np.repeat(
        [s["doc_offset"] for s in manifest["shards"]], [s["rows"] for s in manifest["shards"]]
    )
    for ds in (from_disk, from_files):
        assert ds.num_rows == len(expected) == manifest["rows"]
        assert ds["input_ids"] == [r[0] for r in expected]
        assert ds["cu_seqlens"] == [r[2] for r in expected]
        # `datasets` sees doc_ids as the units stored them: numbered within each unit.
        # Plus the shard's doc_offset they are the corpus-wide numbers packtool reads.
        assert [
            [d + int(o) for d in docs] for docs, o in zip(ds["doc_ids"], offsets, strict=True)
        ] == [r[3] for r in expected]


def test_set_epoch_reshuffles_across_all_the_units_shards(units: Path) -> None:
    pytest.importorskip("torch")  # in the test extra: never skipped in CI
    from packtool.torch import PackedDataset

    merge_units(units)
    n = len(packtool.open_packed(units))
    unit_of_row = np.concatenate(
        [
            np.full(s["rows"], int(s["file"].split("/")[1][5:10]))
            for s in json.loads((units / "manifest.json").read_text())["shards"]
        ]
    )

    def epoch(e: int, seed: int = 11) -> list[int]:
        order = []
        ranks = [PackedDataset(units, rank=r, world_size=2, seed=seed) for r in range(2)]
        for ds in ranks:
            ds.set_epoch(e)
        for step in range(len(ranks[0])):  # rank 0 and rank 1 read a row at every step
            order.extend(int(ds[step]["row"]) for ds in ranks)
        return order

    first, second = epoch(0), epoch(1)
    for order in (first, second):
        assert len(order) == len(set(order)) == n - n % 2  # every row once (but n % 2)
        # Globally shuffled: the first steps already mix rows of several units.
        assert len(set(unit_of_row[order[:16]])) >= 3
    assert first != second
    assert epoch(1) == second  # deterministic for a seed
    assert epoch(1, seed=12) != second


def test_a_deleted_or_changed_unit_shard_is_one_clear_line(units: Path, tmp_path: Path) -> None:
    merge_units(units)
    manifest = json.loads((units / "manifest.json").read_text())
    entry = manifest["shards"][0]
    shard = units / entry["file"]
    saved = shard.read_bytes()

    # Altered in place, same size: only the sha256 tells; verify checks it.
    flipped = bytearray(saved)
    flipped[-200] ^= 0xFF
    shard.write_bytes(bytes(flipped))
    result = run("verify", units)
    assert result.exit_code != 0
    assert f"{entry['file']}: sha256 differs from the manifest's" in result.output

    # Truncated: readers refuse it before mapping it.
    shard.write_bytes(saved[:-100])
    with pytest.raises(FormatError, match=r"cannot read shard: .* bytes, the manifest records"):
        packtool.open_packed(units)[0]

    # Deleted: every reader says which file, and what to do.
    shard.unlink()
    with pytest.raises(
        FormatError, match=r"the file is missing; it is a shard of .*packtool merge"
    ):
        packtool.open_packed(units)[0]
    assert_one_line_error(run("stats", units), r"cannot read shard: the file is missing", 1)
    result = run("verify", units)
    assert result.exit_code != 0 and "the shard file is missing" in result.output

    # The unit packed again (another sha256 in its manifest): the merge is stale.
    shard.write_bytes(saved)
    unit_manifest = shard.parent / "manifest.json"
    recorded = json.loads(unit_manifest.read_text())
    for s in recorded["shards"]:
        s["sha256"] = "0" * 64
    unit_manifest.write_text(json.dumps(recorded))
    with pytest.raises(FormatError, match=r"no longer holds the shard the merge listed"):
        packtool.open_packed(units)[0]
    # The unit's manifest gone (the unit being packed again), then the whole unit.
    unit_manifest.unlink()
    with pytest.raises(FormatError, match=r"the unit that .* references is not readable"):
        packtool.open_packed(units)[0]
    shutil.rmtree(shard.parent)
    with pytest.raises(FormatError, match=r"the file is missing"):
        packtool.open_packed(units)[0]


def test_the_merge_copies_where_a_global_order_is_needed(units: Path) -> None:
    # --world-size: balanced steps over all the units' rows are written again.
    balanced = merge_units(units, world_size=2)
    assert balanced.manifest["units"]["copied"] is True
    assert "balanced steps" in balanced.manifest["units"]["copy_reason"]
    assert balanced.manifest["balance"]["world_size"] == 2
    assert all("/" not in s["file"] for s in balanced.manifest["shards"])
    with pytest.raises(OptionError, match="leave out --no-copy"):
        merge_units(units, world_size=2, copy=False)

    # Another seed than the units were packed with: their order is not the one asked for.
    reseeded = merge_units(units, seed=6)
    assert reseeded.manifest["units"]["copied"] is True
    assert reseeded.manifest["units"]["copy_reason"] == (
        "unit 0's rows are stored shuffled with seed 5; --seed 6 shuffles them with seed 6 "
        "(pack the units with that --seed)"
    )
    with pytest.raises(OptionError, match=r"cannot list the units' shards as they are: unit 0"):
        merge_units(units, seed=6, copy=False)
    with pytest.raises(OptionError, match=r"--no-shuffle asks for FFD order"):
        merge_units(units, shuffle=False, copy=False)
    with pytest.raises(OptionError, match=r"holds 30 rows per shard, the merge asks for 7"):
        merge_units(units, rows_per_shard=7, copy=False)

    # Back to the units' own order: the copied shards go, the units' are listed again.
    again = merge_units(units)
    assert again.manifest["units"]["copied"] is False
    assert not list(units.glob("*.arrow"))
    result = run("verify", units)
    assert result.exit_code == 0, result.output


def test_cli_copy_and_no_copy(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": "word " * (i % 30)}) + "\n" for i in range(200)))
    out = tmp_path / "out"
    result = run("pack", src, "-L", "64", "-o", out, "--units", "2", "--copy", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["units"]["copied"] is True
    assert list(out.glob("data-*.arrow"))
    result = run("merge", out, "--no-copy")
    assert result.exit_code == 0, result.output
    assert "merged without copying" in " ".join(result.output.split())
    assert not list(out.glob("data-*.arrow"))
    assert_one_line_error(run("merge", out, "--no-copy", "--world-size", "2"), "--no-copy", 2)
    assert_one_line_error(
        run("pack", src, "-L", "64", "-o", tmp_path / "x", "--copy"), "give --units N", 2
    )
    # The manifest is written aside and renamed: nothing hidden is left in OUT.
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_a_merge_over_units_that_changed_is_redone_not_skipped(tmp_path: Path) -> None:
    """A merge already there is skipped only while the units hold what it lists: a unit packed
    again (another seed) or a unit shard deleted makes `merge` work again, never report the
    old merge as done (a new-user trial found both)."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "word " * (i % 40)} for i in range(300)])
    out = tmp_path / "out"
    args = ("pack", src, "-L", "64", "-o", out, "--units", "3")
    assert run(*args).exit_code == 0
    assert run("merge", out).exit_code == 0  # up to date: skipped
    # unit 1 packed again with another seed: its rows are stored in another order
    again = run("pack", src, "-L", "64", "-o", out, "--units", "3", "--unit", "1", "--seed", "7",
                "--overwrite")  # fmt: skip
    assert again.exit_code == 0, again.output
    result = run("merge", out, "--seed", "0")
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["units"]["copied"] is True  # unit 1's order is not seed 0's: rows copied
    assert run("verify", out, "-q").exit_code == 0
    # unit 1 packed again as the others were (seed 0): the merge lists the shards again
    again = run("pack", src, "-L", "64", "-o", out, "--units", "3", "--unit", "1", "--seed", "0",
                "--overwrite")  # fmt: skip
    assert again.exit_code == 0, again.output
    assert run("merge", out, "--seed", "0").exit_code == 0
    assert json.loads((out / "manifest.json").read_text())["units"]["copied"] is False
    # a unit shard deleted under a merge that lists it: the merge says which, no silent success
    shard = next((out / "units").glob("unit-00002-*/data-*.arrow"))
    shard.unlink()
    result = run("merge", out, "--seed", "0")
    assert result.exit_code != 0 and shard.name in result.output, result.output
