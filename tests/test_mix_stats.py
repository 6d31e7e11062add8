"""``stats CORPUS --mix``: the "what if" of ``pack --mix`` before packing. The same plan on the
same lengths, so its figures (tokens, documents, shares, rows, efficiency, each source's part)
are those ``stats OUT`` gives of the pack; bad --mix / --tokens input is pack's one line."""

from __future__ import annotations

import json
from pathlib import Path

import hypothesis.strategies as st
import pytest
from conftest import SAMPLE
from hypothesis import HealthCheck, given, settings
from test_cli import assert_one_line_error, run

import packtool
from packtool.errors import PacktoolError
from packtool.stats import corpus_stats, dataset_stats


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """docs/mixtures.md's three sources: the sample corpus cut by its `source` field."""
    root = tmp_path_factory.mktemp("mix")
    lines = SAMPLE.read_text("utf-8").splitlines(keepends=True)
    out = []
    for kind in ("web", "code", "wiki"):
        path = root / f"{kind}.jsonl"
        path.write_text("".join(x for x in lines if json.loads(x)["source"] == kind), "utf-8")
        out.append(path)
    return out


def _packed_figures(figures: dict) -> dict:
    """What `stats OUT --json` and `stats CORPUS --mix --json` (one max-len) share."""
    keys = ("max_len", "batch_size", "seed", "documents", "segments", "tokens", "rows",
            "lower_bound_rows", "rows_over_lower_bound", "efficiency", "full_rows",
            "docs_per_row", "row_fill", "comparison", "outcome", "sources")  # fmt: skip
    return {k: figures[k] for k in keys}


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("--tokens", "1M"),
        ("--tokens", "300k", "--pad-to-multiple-of", "64", "--seed", "7"),
        ("--tokens", "200k", "--no-repeat", "--overflow", "truncate"),
    ],
)
def test_the_what_if_gives_the_figures_of_the_pack(tmp_path: Path, example, args) -> None:
    """The worked example of docs/mixtures.md (and with a total, repeats, alignment, another
    seed and overflow): `stats CORPUS --mix` before packing, `stats OUT` after, equal."""
    mix = ("--mix", "0.5,0.3,0.2", "-L", "2048", *args)
    out = tmp_path / "mixed"
    assert run("pack", *example, *mix, "-o", out, "-q").exit_code == 0
    seed = args[args.index("--seed") :][:2] if "--seed" in args else ()
    packed = json.loads(run("stats", out, "--json", *seed).stdout)
    result = run("stats", *example, *mix, "--json", "--cache-dir", tmp_path / "cache")
    assert result.exit_code == 0, result.output
    what_if = json.loads(result.stdout)
    (before,) = what_if["max_lens"]
    assert _packed_figures(before) == _packed_figures({**packed, "sources": packed["sources"]})
    assert before.get("alignment") == packed["alignment"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["tokens"] for s in before["sources"]] == [
        s["tokens_taken"] for s in manifest["mixture"]["sources"]
    ]
    assert what_if["documents_read"] == manifest["documents"]["read"]


def test_the_terminal_report_shows_each_source_at_each_max_len(tmp_path: Path, example) -> None:
    cache = ("--cache-dir", tmp_path / "cache")
    plain = run("stats", *example, "-L", "2048", *cache)
    assert plain.exit_code == 0 and "Sources" not in plain.stdout
    result = run("stats", *example, "--mix", "5,3,2", "-L", "1024,2048", *cache)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "lengths from the cache" in text  # the lengths plain stats cached serve the mixture
    assert "Packing at each max_len (the rows pack --mix would make)" in text
    for max_len in ("1,024", "2,048"):
        assert f"Sources at max_len {max_len} (as pack --mix would take them)" in text
    figures = corpus_stats(example, [1024, 2048], mix="5,3,2", cache_dir=tmp_path / "cache")
    for p in figures.results:
        assert p.sources is not None and [s.index for s in p.sources] == [0, 1, 2]
        assert sum(s.tokens for s in p.sources) == p.tokens
        assert sum(s.documents for s in p.sources) == p.documents
        assert sum(s.segments for s in p.sources) == p.segments
        assert abs(sum(s.padding for s in p.sources) - (p.rows * p.max_len - p.tokens)) < 1e-6
        for s in p.sources:
            assert f"{s.tokens:,}" in text


def test_a_cache_entry_without_the_inputs_documents_is_read_again(tmp_path: Path, example) -> None:
    """Lengths cached before the documents of each input were kept serve plain stats, but a
    mixture (which needs them) tokenizes again, and keeps them."""
    cache = tmp_path / "cache"
    first = corpus_stats(example, [2048], cache_dir=cache)
    meta = first.cache_path.with_suffix(".json")  # type: ignore[union-attr]
    record = json.loads(meta.read_text())
    assert record["file_documents"] == [1460, 296, 350]
    del record["file_documents"]
    meta.write_text(json.dumps(record))
    assert corpus_stats(example, [2048], cache_dir=cache).cache_hit
    mixed = corpus_stats(example, [2048], mix="0.5,0.3,0.2", cache_dir=cache)
    assert not mixed.cache_hit and mixed.cache_path == first.cache_path
    again = corpus_stats(example, [2048], mix="0.5,0.3,0.2", cache_dir=cache)
    assert again.cache_hit and again.results == mixed.results


def _write_sources(root: Path, sources: list[list[str]]) -> list[Path]:
    paths = []
    for i, texts in enumerate(sources):
        path = root / f"s{i}.jsonl"
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), "utf-8")
        paths.append(path)
    return paths


_words = st.lists(st.sampled_from(["a", "tok", "mixture", "source", "zz", "\n", "42"]), max_size=90)
_corpora = st.lists(st.lists(_words.map(" ".join), min_size=1, max_size=12), min_size=1, max_size=3)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(_corpora, st.data())
def test_the_what_if_equals_the_pack_for_any_small_corpus(tmp_path_factory, texts, data) -> None:
    """Random small corpora, weights, totals, max-len, overflow and seed: either both
    `pack --mix` and `stats CORPUS --mix` refuse with the same line, or `stats OUT` of the
    pack and the what-if give the same figures, source by source."""
    root = tmp_path_factory.mktemp("prop")
    paths = _write_sources(root, texts)
    weights = data.draw(st.lists(st.integers(1, 9), min_size=len(paths), max_size=len(paths)))
    options = {
        "mix": ",".join(map(str, weights)),
        "tokens": data.draw(st.none() | st.integers(1, 3000)),
        "repeat": data.draw(st.booleans()),
        "overflow": data.draw(st.sampled_from(["split", "truncate", "drop"])),
    }
    max_len = data.draw(st.sampled_from([8, 24, 64]))
    seed = data.draw(st.integers(0, 99))
    try:
        packtool.pack(paths, root / "out", max_len=max_len, seed=seed, **options)
    except PacktoolError as e:
        with pytest.raises(PacktoolError) as what_if:
            corpus_stats(paths, [max_len], seed=seed, use_cache=False, **options)
        assert str(what_if.value) == str(e)
        return
    after = dataset_stats(root / "out", seed=seed)
    (before,) = corpus_stats(paths, [max_len], seed=seed, use_cache=False, **options).results
    assert before.sources is not None and after.sources is not None
    assert [s.to_dict() for s in before.sources] == [s.to_dict() for s in after.sources]
    assert _packed_figures({**before.to_dict(), "sources": None}) == _packed_figures(
        {**after.packing.to_dict(), "sources": None}
    )


def test_instruction_data_counts_the_learned_tokens_of_the_rows(tmp_path: Path) -> None:
    lines = (SAMPLE.parent / "prompt_completion.jsonl").read_text("utf-8").splitlines()
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("\n".join(lines[:100]) + "\n", "utf-8")
    second.write_text("\n".join(lines[100:200]) + "\n", "utf-8")
    options = {"mix": "0.3,0.7", "tokens": "40k"}
    packtool.pack([first, second], tmp_path / "out", max_len=512, **options)
    after = dataset_stats(tmp_path / "out")
    (before,) = corpus_stats([first, second], [512], use_cache=False, **options).results
    assert before.outcome.tokens.learned == after.learned_tokens
    assert before.outcome == after.packing.outcome
    assert [s.to_dict() for s in before.sources or ()] == [s.to_dict() for s in after.sources or ()]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--mix", "0.5,0,0.5"), r"--mix: every weight must be a positive number, got '0'"),
        (("--mix", "0.5,x,0.5"), r"--mix: 'x' is not a number"),
        (("--mix", "0.5,0.5"), r"--mix gives 2 weights for 3 inputs"),
        (("--tokens", "1M"), r"--tokens is for mixtures: give --mix"),
        (("--no-repeat",), r"--no-repeat is for mixtures: give --mix"),
        (
            ("--mix", "1,1,1", "--tokens", "600k", "--no-repeat"),
            r"code.jsonl: its share of --tokens 600,000 is 200,000 tokens, but it holds "
            r"[\d,]+: lower --tokens, or allow repeating",
        ),
        (("--mix", "1,1,1", "--tokens", "12x"), r"--tokens: cannot read '12x'"),
    ],
)
def test_bad_mix_input_is_packs_one_line_and_writes_nothing(
    tmp_path: Path, example, args, message
) -> None:
    out, page = tmp_path / "out", tmp_path / "page.html"
    assert_one_line_error(run("pack", *example, "-L", "256", "-o", out, *args), message)
    what_if = run("stats", *example, "-L", "256", "--html", page, "--cache-dir",
                  tmp_path / "cache", *args)  # fmt: skip
    assert_one_line_error(what_if, message)
    assert not out.exists() and not page.exists()


def test_a_packed_output_refuses_mix(tmp_path: Path, example) -> None:
    out = tmp_path / "mixed"
    assert run("pack", *example, "--mix", "1,1,1", "-L", "512", "-o", out, "-q").exit_code == 0
    assert_one_line_error(
        run("stats", out, "--mix", "1,1,1"), r"is a packed output: --mix applies to a corpus"
    )
