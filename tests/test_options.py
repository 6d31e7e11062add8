"""The options record: every option declared once with what it changes, and what is derived
from the declarations (the rows key of --resume and work units, the manifest's record, the
merge's keys and defaults, the corpus options of stats)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, SAMPLE
from helpers import read_rows

import packtool
from packtool import pipeline
from packtool.errors import OptionError, OutputExistsError
from packtool.options import (
    CHANGES,
    CORPUS_OPTIONS,
    LAYOUT,
    MERGE_KEYS,
    OPTIONS,
    RECORDED_ROWS,
    ROWS,
    RUN,
    PackOptions,
    declarations,
    opt,
)
from packtool.readers import resolve_inputs
from packtool.units import options_key, plan_units

BASE = {"max_len": 4096}

# Every ROWS option, one non-default valid value each, and what it needs beside it (the base
# the change is made on). A ROWS option missing here fails test_each_rows_option_is_keyed.
ROWS_CHANGES: dict[str, tuple[Any, dict[str, Any]]] = {
    "mix": ("1", {}),
    "tokens": ("1k", {"mix": "1"}),
    "repeat": (False, {"mix": "1"}),
    "max_len": (2048, {}),
    "tokenizer": ("edited", {}),  # a copy of the bundled tokenizer.json with one token more
    "text_field": ("body", {}),
    "input_shape": ("text", {}),
    "prompt_field": ("question", {}),
    "completion_field": ("answer", {}),
    "messages_field": ("conversation", {}),
    "chat_template": (str(REPO / "sample_data" / "chatml.jinja"), {}),
    "loss_on": ("all", {}),
    "template_timeout": (5.0, {}),
    "chat_turns": ("each", {}),
    "learn_reasoning": (False, {}),
    "overflow": ("truncate", {}),
    "add_eos": (False, {}),
    "bos": (True, {}),
    "eos_token": ("<|endoftext|>", {}),
    "bos_token": ("<|bos|>", {}),
    "pad_id": (0, {}),
    "parse_special": (True, {}),
    "skip_bad_records": (True, {}),
    "split": ("test", {}),
    "txt_unit": ("paragraph", {}),
    "ids_field": ("ids", {}),
    "labels_field": ("labels", {"ids_field": "ids"}),
    "loss_mask_field": ("mask", {"ids_field": "ids"}),
    "vocab_size": (1000, {}),
    "split_on_eos": (2, {}),
    "pad_to_multiple_of": (64, {}),
    "units": (3, {"units": 2}),
}


def test_every_option_says_what_it_changes() -> None:
    assert list(OPTIONS) == [f.name for f in dataclasses.fields(PackOptions)]
    assert {o.changes for o in OPTIONS.values()} == set(CHANGES)
    for name, o in OPTIONS.items():
        assert o.help.strip(), name
        assert all(flag.startswith("-") for flag in o.flags), name
    # only a layout option is taken by merge; stats of a corpus takes no layout option
    assert {o.changes for o in OPTIONS.values() if o.merge is not None} == {LAYOUT}
    assert all(OPTIONS[n].changes != LAYOUT for n in CORPUS_OPTIONS)


def test_an_option_declared_without_what_it_changes_is_refused() -> None:
    @dataclasses.dataclass(frozen=True)
    class Declared:
        a: int = opt(1, ROWS, "An option.")
        b: int = 2  # a plain field: not classified

    with pytest.raises(TypeError, match=r"Declared\.b is not declared with opt"):
        declarations(Declared)

    @dataclasses.dataclass(frozen=True)
    class Misclassified:
        a: int = opt(1, "rows-ish", "An option.")

    with pytest.raises(TypeError, match=r"Misclassified\.a"):
        declarations(Misclassified)
    assert list(declarations(dataclasses.make_dataclass("One", [("a", int, opt(1, RUN, "A."))])))


def test_the_manifest_record_keeps_its_keys_and_order() -> None:
    """describe() is derived from the declarations; the manifest's ``options`` keep today's
    keys in today's order (sample packs stay byte for byte the same)."""
    o = PackOptions(max_len=1024, overflow="drop", seed=3, world_size=2, rows_per_shard=10)
    assert list(o.describe().items()) == [
        ("max_len", 1024),
        ("text_field", "text"),
        ("overflow", "drop"),
        ("add_eos", None),
        ("bos", None),
        ("pad_id", None),
        ("shuffle", True),
        ("seed", 3),
        ("world_size", 2),
        ("micro_batches", 1),
        ("rows_per_shard", 10),
        ("skip_bad_records", False),
        ("split", None),
        ("txt_unit", "line"),
    ]
    # the layout's values are those of the layout options
    layout = [k for k in o.describe() if OPTIONS[k].changes == LAYOUT]
    assert layout == ["shuffle", "seed", "world_size", "micro_batches", "rows_per_shard"]
    assert all(o.describe()[k] == getattr(o.layout, k) for k in layout)
    assert set(RECORDED_ROWS) <= set(o.describe())


def test_merge_keys_and_corpus_options_come_from_the_declarations() -> None:
    assert MERGE_KEYS == (
        "shuffle",
        "seed",
        "world_size",
        "micro_batches",
        "rows_per_shard",
        "copy",
    )
    assert OPTIONS["merge_copy"].merge_key == "copy" and OPTIONS["shard_size"].merge_key is None
    assert "seed" not in CORPUS_OPTIONS and "max_len" not in CORPUS_OPTIONS  # stats' own
    assert {"tokenizer", "overflow", "add_eos", "num_proc", "tokenizer_backend"} <= set(
        CORPUS_OPTIONS
    )


def test_a_changed_option_is_named_by_the_flag_that_gives_it() -> None:
    o = PackOptions(add_eos=False, bos=True, text_field="body", num_proc=2)
    assert o.changed("add_eos", "bos", "text_field", "split", "num_proc") == [
        "--no-eos",
        "--bos",
        "--text-field",
        "--num-proc",
    ]


@pytest.fixture(scope="module")
def edited_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The bundled tokenizer.json with one added token more: another file, other sha256."""
    data = json.loads((REPO / "packtool" / "_data" / "tokenizer.json").read_text("utf-8"))
    top = max(t["id"] for t in data["added_tokens"])
    extra = dict(data["added_tokens"][-1], id=top + 1, content="<|extra|>")
    data["added_tokens"].append(extra)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def _keys(options: PackOptions) -> tuple[Any, ...]:
    """The keys a pack's checkpoint (``--resume``) and its work units are made with."""
    files = resolve_inputs([str(SAMPLE)])
    plan = plan_units(files, options.units or 2, options)[0].plan
    return options.rows_key(), json.dumps(options_key(options), sort_keys=True), plan


@pytest.mark.parametrize("name", [n for n, o in OPTIONS.items() if o.changes == ROWS])
def test_each_rows_option_is_keyed(name: str, edited_tokenizer: str) -> None:
    """Changing any option that changes the rows changes the key of work units (and, but for
    what the callers key themselves, the rows key of --resume): stale work is never reused."""
    assert name in ROWS_CHANGES, f"{name} changes the rows: add a value for it to ROWS_CHANGES"
    value, beside = ROWS_CHANGES[name]
    value = edited_tokenizer if name == "tokenizer" else value
    base = PackOptions(**BASE, **beside)
    changed = base.replace(**{name: value})
    assert getattr(changed, name) != getattr(base, name)
    rows_key, unit_key, plan = _keys(base)
    new_rows_key, new_unit_key, new_plan = _keys(changed)
    assert new_plan != plan, name
    if OPTIONS[name].key is not None:
        assert new_rows_key != rows_key and new_unit_key != unit_key, name
    elif name == "tokenizer":  # keyed by its file's sha256, by the unit key and pipeline
        assert new_unit_key != unit_key


def test_layout_and_run_options_do_not_change_the_rows_key() -> None:
    base = PackOptions(**BASE, units=2)
    others = {
        "shuffle": False,
        "seed": 7,
        "rows_per_shard": 9,
        "shard_size": "1MB",
        "num_proc": 1,
        "check_sample": 3,
        "overwrite": True,
        "resume": True,
        "unit": 1,
        "merge_copy": True,
        "tokenizer_backend": "hf",
    }
    keys = _keys(base)
    for name, value in others.items():
        assert OPTIONS[name].changes in (LAYOUT, RUN)
        assert _keys(base.replace(**{name: value})) == keys, name


def test_with_mix_the_seed_is_keyed_as_a_rows_option() -> None:
    """--seed is a layout option, but with --mix it also chooses the documents a mixture
    samples (which rows there are): it is then in the rows key of --resume and in the work
    units' key and plan, so a unit packed with another seed is never reused; without --mix
    it stays out of them (plain packs keep their keys)."""
    assert OPTIONS["seed"].changes == LAYOUT and OPTIONS["seed"].rows_with == "mix"
    assert "--mix" in OPTIONS["seed"].help
    mixed = PackOptions(**BASE, mix="1")
    assert mixed.rows_key()["seed"] == 0
    for old, new in zip(_keys(mixed), _keys(mixed.replace(seed=7)), strict=True):
        assert old != new
    plain = PackOptions(**BASE)
    assert "seed" not in plain.rows_key()
    assert _keys(plain.replace(seed=7)) == _keys(plain)


def test_resume_starts_over_when_a_rows_option_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: the checkpoint of a run interrupted with EOS appended is not resumed by a
    run with --no-eos; the output is that of a fresh run without EOS."""
    monkeypatch.setattr(pipeline, "_CHECKPOINT_SECONDS", 0.0)  # checkpoint after every batch
    seen = {"n": 0}

    def stop_at_second_batch(stage: str, done: int, total: int | None) -> None:
        seen["n"] += stage == "tokenize"
        if seen["n"] == 2:
            raise KeyboardInterrupt

    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        packtool.pack([SAMPLE], out, max_len=512, resume=True, progress=stop_at_second_batch)
    report = packtool.pack([SAMPLE], out, max_len=512, resume=True, add_eos=False)
    assert not report.resumed
    assert any(n.startswith("--resume") and "started over" in n for n in report.notices)
    packtool.pack([SAMPLE], tmp_path / "fresh", max_len=512, add_eos=False)
    assert read_rows(out)[1] == read_rows(tmp_path / "fresh")[1]


def test_a_unit_is_not_reused_when_a_rows_option_changes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    packtool.pack_units([SAMPLE], out, max_len=1024, units=2, unit=0)
    again = packtool.pack_units([SAMPLE], out, max_len=1024, units=2, unit=0)
    assert again.units[0].skipped  # the same options: the finished unit is kept
    with pytest.raises(OutputExistsError, match="other overflow"):
        packtool.pack_units([SAMPLE], out, max_len=1024, units=2, unit=0, overflow="truncate")


def test_each_check_names_its_flag() -> None:
    bad = {
        "max_len": 1,
        "overflow": "wrap",
        "txt_unit": "sentence",
        "num_proc": 0,
        "vocab_size": 0,
        "template_timeout": -1.0,
        "tokenizer_backend": "fast",
        "pad_id": "x",
    }
    for name, value in bad.items():
        with pytest.raises(OptionError, match=OPTIONS[name].flag):
            PackOptions(**{name: value})


def test_a_pack_needs_max_len_said_in_one_line(tmp_path: Path) -> None:
    """``max_len`` may be left out of the options (``stats`` of a corpus takes its lengths
    apart), but a pack, and packing by units, say at once that it is missing."""
    assert PackOptions(max_len=512).row_len == 512
    for run in (packtool.pack, packtool.pack_units):
        kwargs = {"units": 2} if run is packtool.pack_units else {}
        with pytest.raises(OptionError, match=r"^--max-len is required"):
            run([SAMPLE], tmp_path / "out", **kwargs)
        assert not (tmp_path / "out").exists()


def _click_params(command: str) -> dict[str, Any]:
    import click
    import typer.main

    from packtool.cli import app

    group = typer.main.get_command(app)
    cmd = group.get_command(click.Context(group), command)
    return {p.name: p for p in cmd.params}


def test_the_flags_of_pack_merge_and_stats_are_the_declarations() -> None:
    """A flag goes from its spelling to its declaration: every option is a flag of `pack`
    with its declared spelling, default and help; corpus-mode `stats` and `merge` take those
    declared for them (merge's unset: what the units recorded)."""
    pack, stats, merge = _click_params("pack"), _click_params("stats"), _click_params("merge")
    for name, o in OPTIONS.items():
        flag = pack[name]
        spelled = [*flag.opts, *flag.secondary_opts]
        assert spelled == [s for f in o.flags for s in f.split("/")], name
        assert flag.help.startswith(o.help), name
        assert flag.required == o.required and (o.required or flag.default == o.default), name
        if name not in ("max_len", "seed", "world_size", "micro_batches"):  # stats' own
            assert (name in stats) == bool(o.corpus), name
        key = o.merge_key or o.name
        assert (key in merge) == (o.merge is not None), name
        if o.merge is not None:
            assert merge[key].default is None and merge[key].opts == flag.opts, name
    assert set(pack) - set(OPTIONS) == {"inputs", "output", "quiet", "as_json"}
