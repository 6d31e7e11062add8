"""``stats CORPUS --mix``: the "what if" of ``pack --mix`` before packing. The same plan on the
same lengths, so its figures (tokens, documents, shares, rows, efficiency, each source's part)
are those ``stats OUT`` gives of the pack; bad --mix / --tokens input is pack's one line.

``verify --against`` of a mixture: every document (copy) in the rows against its source's
document re-read, the sample against the plan of the re-read tokens; sources out of order or
missing refused in one line."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import hypothesis.strategies as st
import pytest
from conftest import REPO, SAMPLE
from helpers import documents_from_rows, read_rows
from hypothesis import HealthCheck, given, settings
from test_cli import assert_one_line_error, run

import packtool
from packtool.errors import PacktoolError
from packtool.stats import corpus_stats, dataset_stats
from packtool.verification import verify


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
    assert _packed_figures(before) == _packed_figures(packed)
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
    # the documents taken, beside the cut's counts (of every document read), named so
    taken = "; ".join(f"{p.documents:,} at {p.max_len:,}" for p in figures.results)
    assert f"documents --mix takes (copies counted): {taken}; split," in " ".join(text.split())
    assert "--mix takes" not in plain.stdout


class _Tables(HTMLParser):
    """The cells of each table with an id on a page, row by row (body rows only)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.table: str | None = None
        self.row: list[str] | None = None
        self.cell: list[str] | None = None
        self.in_body = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table" and dict(attrs).get("id"):
            self.table = str(dict(attrs)["id"])
            self.tables[self.table] = []
        elif tag == "tbody":
            self.in_body = True
        elif tag == "tr" and self.table and self.in_body:
            self.row = []
        elif tag == "td" and self.row is not None:
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self.row is not None and self.cell is not None:
            self.row.append("".join(self.cell))
            self.cell = None
        elif tag == "tr" and self.row is not None and self.table:
            self.tables[self.table].append(self.row)
            self.row = None
        elif tag == "tbody":
            self.in_body = False
        elif tag == "table":
            self.table = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def _page_tables(page: Path) -> dict[str, list[list[str]]]:
    parser = _Tables()
    parser.feed(page.read_text("utf-8"))
    parser.close()
    return parser.tables


def _same_sources(rows: list[list[str]], sources: list[dict]) -> None:
    """The page's table of sources says what `--json`'s `sources` do (to the shown digits)."""
    assert len(rows) == len(sources) > 1

    def number(cell: str) -> float:
        return float(cell.replace(",", "").rstrip("%"))

    for cells, s in zip(rows, sources, strict=True):
        assert len(cells) == 9, cells
        index, path, tokens, share, target, documents, segments, padding, epochs = cells
        assert (int(index), path) == (s["index"], s["path"])
        assert (number(tokens), number(documents), number(segments)) == (
            s["tokens"], s["documents"], s["segments"]
        )  # fmt: skip
        assert share.endswith("%") and abs(number(share) - 100 * s["share"]) <= 0.05 + 1e-9
        assert abs(number(target) - 100 * s["target_share"]) <= 0.05 + 1e-9
        assert abs(number(padding) - s["padding"]) <= 0.5 + 1e-9
        assert abs(number(epochs) - s["epochs"]) <= 0.005 + 1e-9


def test_the_html_page_shows_each_source(tmp_path: Path, example) -> None:
    """`stats OUT --html` of a mixture, and `stats CORPUS --mix --html` at each max-len, hold
    the table of sources the terminal shows, with `--json`'s figures; a page without a
    mixture holds none."""
    out = tmp_path / "mixed"
    mix = ("--mix", "0.5,0.3,0.2", "--tokens", "300k")
    assert run("pack", *example, *mix, "-L", "2048", "-o", out, "-q").exit_code == 0
    page = tmp_path / "out.html"
    result = run("stats", out, "--json", "--html", page)
    assert result.exit_code == 0, result.output
    tables = _page_tables(page)
    assert list(tables) == ["sources"]
    _same_sources(tables["sources"], json.loads(result.stdout)["sources"])

    cache = ("--cache-dir", tmp_path / "cache")
    page = tmp_path / "corpus.html"
    result = run("stats", *example, *mix, "-L", "1024,2048", "--json", "--html", page, *cache)
    assert result.exit_code == 0, result.output
    tables = _page_tables(page)
    assert list(tables) == ["sources-1024", "sources-2048"]
    for figures in json.loads(result.stdout)["max_lens"]:
        _same_sources(tables[f"sources-{figures['max_len']}"], figures["sources"])

    plain = tmp_path / "plain.html"
    assert run("stats", *example, "-L", "2048", "--html", plain, *cache).exit_code == 0
    assert _page_tables(plain) == {} and "Sources" not in plain.read_text("utf-8")


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
    assert verify(tmp_path / "out", against=[first, second]).ok  # the labels compared too
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
        # weights each finite whose sum is not: a traceback (OverflowError) in the plan
        (("--mix", "1e308,1e308,1"), r"--mix 1e308,1e308,1: the weights add up to more than"),
        # a total nearer to no document than to any: an output of 0 rows, exit 0
        (("--mix", "1,1,1", "--tokens", "10"), r"--tokens 10: the mixture takes no document"),
        # a total that repeats a source billions of times: a MemoryError or OverflowError
        (("--mix", "1,1,1", "--tokens", "1e30"), r"code\.jsonl would be repeated [\d,]+ times"),
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


def test_a_file_in_two_sources_is_refused_in_one_line(tmp_path: Path, example) -> None:
    """The same file in two sources (given twice, or by a directory and a file in it) would
    have its documents sampled for each, as two sources: refused, as a file named twice is
    without --mix, by pack (with --units too) and by stats."""
    web, code, _ = example
    message = r"code\.jsonl: in source 0 \(.*code\.jsonl\) and source 1 \(.*\) of --mix: its"
    for inputs in ([code, code], [code, code.parent]):
        mix = ("--mix", "1,1", "-L", "256")
        for units in ((), ("--units", "2")):
            out = tmp_path / "out"
            assert_one_line_error(run("pack", *inputs, *mix, "-o", out, *units), message)
            assert not out.exists()
        assert_one_line_error(run("stats", *inputs, *mix, "--no-cache"), message)
    assert run("pack", web, code, "--mix", "1,1", "-L", "256", "-o", tmp_path / "ok").exit_code == 0


def test_a_packed_output_refuses_mix(tmp_path: Path, example) -> None:
    out = tmp_path / "mixed"
    assert run("pack", *example, "--mix", "1,1,1", "-L", "512", "-o", out, "-q").exit_code == 0
    assert_one_line_error(
        run("stats", out, "--mix", "1,1,1"), r"is a packed output: --mix applies to a corpus"
    )


# -- verify --against a mixture -------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory, example) -> Path:
    """The worked example with --tokens 1M: web sampled, code repeated (copies), wiki whole
    and a little more."""
    out = tmp_path_factory.mktemp("mixed") / "out"
    args = ("--mix", "0.5,0.3,0.2", "--tokens", "1M", "-L", "2048", "-o", out, "-q")
    assert run("pack", *example, *args).exit_code == 0
    return out


def test_a_mixture_verifies_against_its_sources(mixed: Path, example) -> None:
    manifest = json.loads((mixed / "manifest.json").read_text())
    assert manifest["mixture"]["copies"] > 1  # copies are compared too
    for inputs in (example, []):  # none given: the sources as packed
        report = verify(mixed, against=inputs)
        assert report.ok, report.problems
        assert report.against is not None
        taken = sum(s["documents_taken"] for s in manifest["mixture"]["sources"])
        assert report.against.documents_compared == taken
    result = run("verify", mixed, "--against", *example)
    assert result.exit_code == 0, result.output


def _changed_copy(example: list[Path], root: Path, which: int, record: int, edit) -> list[Path]:
    """The sources copied to ``root``, record ``record`` of source ``which`` edited."""
    root.mkdir()
    out = []
    for i, path in enumerate(example):
        lines = path.read_text("utf-8").splitlines()
        if i == which:
            doc = json.loads(lines[record])
            doc["text"] = edit(doc["text"])
            lines[record] = json.dumps(doc)
        (root / path.name).write_text("\n".join(lines) + "\n", "utf-8")
        out.append(root / path.name)
    return out


def test_a_changed_document_is_named_with_its_source_and_row(
    tmp_path: Path, mixed: Path, example
) -> None:
    """A document of code (taken twice, or more) changed, its length kept: each copy in the
    rows is named, with its source, its record and its row; nothing else is said."""
    manifest = json.loads((mixed / "manifest.json").read_text())
    code = manifest["mixture"]["sources"][1]
    sources = _changed_copy(example, tmp_path / "changed", 1, 5, lambda t: t.replace("e", "q", 3))
    report = verify(mixed, against=sources)
    doc = code["first_doc"] + 5
    lines = [str(p) for p in report.problems]
    assert lines and all(f"source 1 ({example[1]}): document {doc} (code.jsonl record 5" in x
                         for x in lines), lines  # fmt: skip
    stride = manifest["mixture"]["doc_id_stride"]
    copies = sum(1 for d in documents_from_rows(read_rows(mixed)[1]) if d % stride == doc)
    assert copies >= 2 and len(lines) == copies and all(re.search(r"row \d+", x) for x in lines)
    assert any(f"copy 1, doc id {doc + manifest['mixture']['doc_id_stride']}" in x for x in lines)
    result = run("verify", mixed, "--against", *sources)
    assert result.exit_code != 0 and f"document {doc} (code.jsonl record 5" in result.stdout


def test_a_source_that_gives_other_documents_is_sampled_otherwise(
    tmp_path: Path, mixed: Path, example
) -> None:
    """A document added at the end of wiki (every document taken once, then a seeded sample):
    the documents in the rows still match, but the plan on the re-read tokens samples others
    than the rows hold: said of wiki, by the plan's seed and target."""
    root = tmp_path / "added"
    root.mkdir()
    sources = [root / p.name for p in example]
    for path, copy in zip(example, sources, strict=True):
        copy.write_text(path.read_text("utf-8"), "utf-8")
    with sources[2].open("a", encoding="utf-8") as f:
        f.write(json.dumps({"text": "an article added since " * 50}) + "\n")
    report = verify(mixed, against=sources)
    said = [str(p) for p in report.problems if p.check == "against"]
    wiki = json.loads((mixed / "manifest.json").read_text())["mixture"]["sources"][2]
    assert any(f"source 2 ({example[2]}): its documents in the rows are not those its plan "
               f"takes from the re-read inputs (seed 0, {wiki['target_tokens']:,} tokens)" in x
               for x in said), said  # fmt: skip
    assert not any("source 0" in x or "source 1" in x for x in said), said


@pytest.mark.parametrize(
    ("order", "message"),
    [
        ((1, 0, 2), r"--against: .*code.jsonl is source 1 of the mixture \(.*code.jsonl\), given "
                    r"in the place of source 0 \(.*web.jsonl\): give the sources in the order"),
        ((0, 2), r"--against: 2 inputs given for a mixture of 3 sources: give each source"),
        ((0, 0, 2), r"web.jsonl is source 0 of the mixture .* in the place of source 1"),
    ],
)  # fmt: skip
def test_sources_out_of_order_or_missing_are_refused_in_one_line(
    mixed: Path, example, order, message
) -> None:
    result = run("verify", mixed, "--against", *[example[i] for i in order])
    assert_one_line_error(result, message)


def test_the_what_if_of_docs_mixtures_shows_what_it_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/mixtures.md: the sources tables of its `stats ... --mix` command are the figures
    that command gives (on the sources its worked example builds)."""
    doc = (REPO / "docs" / "mixtures.md").read_text("utf-8")
    script = re.search(r"python - <<'EOF'\n(.*?)\nEOF\n", doc.split("## A worked example")[1],
                       flags=re.S)  # fmt: skip
    section = doc.split("## Before packing: `stats CORPUS --mix`", 1)[1].split("\n## ", 1)[0]
    command = re.search(r"^packtool (stats mix/.*)$", section, flags=re.M)
    shown = re.search(r"```\n(Sources at max_len .*?)```", section, flags=re.S)
    assert script is not None and command is not None and shown is not None
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sample_data").symlink_to(REPO / "sample_data")
    exec(compile(script.group(1), "docs/mixtures.md", "exec"), {})
    result = run(*command.group(1).split(), "--cache-dir", tmp_path / "cache")
    assert result.exit_code == 0, result.output
    args = command.group(1).split()
    inputs = [a for a in args[1:] if a.startswith("mix/")]
    figures = corpus_stats(inputs, args[args.index("-L") + 1], mix=args[args.index("--mix") + 1],
                           cache_dir=tmp_path / "cache")  # fmt: skip
    tables = [t.strip().splitlines() for t in shown.group(1).split("\n\n")]
    assert len(tables) == len(figures.results)
    for table, p in zip(tables, figures.results, strict=True):
        assert table[0] == f"Sources at max_len {p.max_len:,} (as pack --mix would take them)"
        assert table[0] in result.stdout
        rows = [line.split() for line in table[2:]]
        assert rows == [
            [str(x.index), x.path, f"{x.tokens:,}", f"{x.share:.1%}", f"{x.target_share:.1%}",
             f"{x.documents:,}", f"{x.segments:,}", f"{x.padding:,.0f}", f"{x.epochs:.2f}"]
            for x in p.sources or ()
        ]  # fmt: skip
    assert f"{figures.results[0].rows:,} rows at 2,048, efficiency " in section.replace("\n", " ")
    assert f"{figures.results[0].efficiency:.2%})" in section


def test_bad_records_skipped_keep_each_source_its_documents(tmp_path: Path, example) -> None:
    """Bad records take a document number but give no length: each source's documents are
    still its own, in the what-if (tokenized, then from the cache) as in the pack, and the
    pack verifies against its sources."""
    lines = [p.read_text("utf-8").splitlines(keepends=True) for p in example]
    parts = [lines[0][:300], [*lines[1][:50], "{bad json\n", '{"text": 5}\n', *lines[1][50:200]],
             ["nope\n", *lines[2][:80]]]  # fmt: skip
    sources = []
    for path, part in zip(example, parts, strict=True):
        sources.append(tmp_path / path.name)
        sources[-1].write_text("".join(part), "utf-8")
    options = {"mix": "1,2,1", "tokens": "300k", "skip_bad_records": True}
    packtool.pack(sources, tmp_path / "out", max_len=1024, **options)
    after = dataset_stats(tmp_path / "out")
    assert after.packing.outcome.documents.bad_records_skipped == 3
    for hit in (False, True):
        what_if = corpus_stats(sources, [1024], cache_dir=tmp_path / "cache", **options)
        assert what_if.cache_hit is hit
        (before,) = what_if.results
        assert [s.to_dict() for s in before.sources or ()] == [
            s.to_dict() for s in after.sources or ()
        ]
        assert {**before.to_dict(), "sources": None} == {**after.packing.to_dict(), "sources": None}
    assert verify(tmp_path / "out", against=sources).ok
