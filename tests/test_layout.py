"""The layout of finished rows: one record (shuffle, seed, world size, micro-batches, shard
size) that pack, the order of stored rows and the merge share, and the one rule that gives
the rows of a shard."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import CharTokenizer
from helpers import read_rows
from test_units import mixed_inputs

import packtool
from packtool.engines import pack_units
from packtool.errors import OptionError
from packtool.format import row_bytes
from packtool.layout import Layout
from packtool.merge import merge_units
from packtool.options import PackOptions
from packtool.order import balanced_order, row_shuffle, stored_order


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"seed": -1}, r"--seed must be an integer from 0"),
        ({"rows_per_shard": 0}, r"--rows-per-shard must be an integer from 1"),
        ({"shard_size": "lots"}, r"--shard-size: cannot read 'lots' as a size"),
        ({"shard_size": 0}, r"--shard-size must be positive"),
        ({"world_size": 0}, r"--world-size must be an integer from 1"),
        ({"world_size": 4, "shuffle": False}, r"leave out --no-shuffle \(or --world-size\)"),
        ({"micro_batches": 2}, r"--micro-batches balances steps across ranks"),
        ({"world_size": 2, "micro_batches": 0}, r"--micro-batches must be an integer from 1"),
    ],
)
def test_the_layout_is_checked_once_for_pack_and_merge(values: dict, match: str) -> None:
    with pytest.raises(OptionError, match=match):
        Layout(**values)
    with pytest.raises(OptionError, match=match):  # the flat flags of pack: the same check
        PackOptions(max_len=64, **values)


def test_rows_per_shard_given_or_from_the_shard_size() -> None:
    assert Layout(rows_per_shard=7).shard_rows(10**9) == 7  # given: whatever the row size
    assert Layout(shard_size="1KB").shard_rows(100) == 10
    assert Layout(shard_size="1.5KiB").shard_rows(100) == 15
    assert Layout(shard_size=50).shard_rows(100) == 1  # below one row: one row a shard
    assert Layout().shard_rows(row_bytes(4096)) == (256 << 20) // row_bytes(4096)


def test_pack_options_carry_the_layout_and_record_it_as_before() -> None:
    o = PackOptions(max_len=64, seed=9, world_size=4, micro_batches=2, shard_size="1MB")
    assert o.layout == Layout(seed=9, world_size=4, micro_batches=2, shard_size="1MB")
    assert o.shard_bytes == 1 << 20
    described = o.describe()
    assert list(described) == [  # the manifest's options, in this order
        "max_len", "text_field", "overflow", "add_eos", "bos", "pad_id", "shuffle", "seed",
        "world_size", "micro_batches", "rows_per_shard", "skip_bad_records", "split",
        "txt_unit",
    ]  # fmt: skip
    layout = ("shuffle", "seed", "world_size", "micro_batches", "rows_per_shard")
    assert {k: described[k] for k in layout} == {
        "shuffle": True,
        "seed": 9,
        "world_size": 4,
        "micro_batches": 2,
        "rows_per_shard": None,
    }


def test_stored_order_follows_the_layout() -> None:
    def no_costs() -> tuple[np.ndarray, np.ndarray]:
        raise AssertionError("costs are asked for only with a world size")

    order, balance = stored_order(10, no_costs, Layout(shuffle=False), where="the rows")
    assert order.tolist() == list(range(10)) and balance is None
    order, balance = stored_order(10, no_costs, Layout(seed=3), where="the rows")
    assert order.tolist() == row_shuffle(10, 3).tolist() and balance is None
    costs = np.arange(12, dtype=np.int64)[::-1].copy()
    layout = Layout(seed=3, world_size=2, micro_batches=2)
    order, balance = stored_order(12, lambda: (costs, costs), layout, where="the rows")
    assert order.tolist() == balanced_order(costs, costs, world_size=2, micro_batches=2,
                                            seed=3).tolist()  # fmt: skip
    assert balance is not None and balance["world_size"] == 2
    with pytest.raises(OptionError, match="the rows"):
        stored_order(1, lambda: (costs[:1], costs[:1]), Layout(world_size=2), where="the rows")


def _shard_rows(out: Path) -> tuple[int, list[int]]:
    manifest = json.loads((out / "manifest.json").read_text())
    return manifest["options"]["rows_per_shard"], [s["rows"] for s in manifest["shards"]]


def test_pack_and_merge_cut_shards_by_the_same_rule(tmp_path: Path) -> None:
    """A shard size gives the same rows per shard to a pack, to units (recorded for their
    merge) and to a merge that is given it."""
    paths = mixed_inputs(tmp_path)
    tok = CharTokenizer()
    per_shard = Layout(shard_size="8KB").shard_rows(row_bytes(48))
    packtool.pack(paths, tmp_path / "plain", max_len=48, tokenizer=tok, shard_size="8KB")
    rows_per_shard, rows = _shard_rows(tmp_path / "plain")
    assert rows_per_shard == per_shard and set(rows[:-1]) == {per_shard} and len(rows) > 2

    out = tmp_path / "units"
    pack_units(paths, out, units=2, max_len=48, tokenizer=tok, shard_size="8KB", num_proc=1)
    assert _shard_rows(out)[0] == per_shard  # listed where they lie: the units' shards
    assert not list(out.glob("*.arrow"))

    bigger = Layout(shard_size="20KB").shard_rows(row_bytes(48))
    merged = merge_units(out, shard_size="20KB")
    assert merged.manifest["units"]["copy_reason"].endswith(
        f"the merge asks for {bigger} (--rows-per-shard/--shard-size)"
    )
    rows_per_shard, rows = _shard_rows(out)
    assert rows_per_shard == bigger and set(rows[:-1]) == {bigger}
    assert sum(rows) == len(read_rows(out)[1])
    assert merge_units(out, shard_size="20KB", rows_per_shard=3).manifest["options"][
        "rows_per_shard"
    ] == 3  # fmt: skip
