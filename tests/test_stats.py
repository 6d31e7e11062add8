"""`packtool stats`: every figure against an independent computation (plain Python loops over
rows read with pyarrow's to_pylist), hand-computed examples, the corpus mode and its cache,
the CLI (table, --json, errors) and the docs of the JSON keys."""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REPO, SAMPLE, CharTokenizer, write_jsonl
from helpers import read_rows
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import assert_one_line_error, run

import packtool
from packtool.errors import FormatError, OptionError
from packtool.format import PackedBatch, ShardWriter
from packtool.packing import first_fit_decreasing
from packtool.stats import (
    BATCHINGS,
    batch_slots,
    corpus_stats,
    dataset_stats,
    default_cache_dir,
    parse_max_lens,
)


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Never touch ~/.cache: the default cache dir of every test is a tmp dir."""
    cache = tmp_path / "default-cache"
    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(cache))
    return cache


# -- independent computations -------------------------------------------------------------


def edges_of(top: int, bins: int) -> list[int]:
    return sorted({top * i // bins for i in range(bins + 1)}) if top > 0 else [0, 1]


def hist_of(values: list[int], edges: list[int]) -> dict[str, Any]:
    counts = [0] * (len(edges) - 1)
    above = 0
    for v in values:
        for i in range(len(edges) - 1):
            if (i == 0 and v <= edges[1]) or edges[i] < v <= edges[i + 1]:
                counts[i] += 1
                break
        else:
            above += 1
    return {"edges": edges, "counts": counts, "above": above}


def docs_per_row_edges(top: int) -> list[int]:
    width = math.ceil(top / 16)
    return list(range(0, math.ceil(top / width) * width + 1, width))


def cost_of_batches(seq: list[int], batch_size: int) -> int:
    total = 0
    for i in range(0, len(seq), batch_size):
        batch = seq[i : i + batch_size]
        total += len(batch) * max(batch)
    return total


def percentile(values: list[int], q: int) -> int:
    s = sorted(values)
    return s[math.ceil(q * len(s) / 100) - 1]


def expected_comparison(
    segments: list[int], rows: int, max_len: int, batch_size: int, seed: int
) -> dict[str, dict[str, Any]]:
    tokens = sum(segments)
    perm = np.random.default_rng(seed).permutation(len(segments)).tolist()
    slots = {
        "packed": rows * max_len,
        "pad_to_max_len": len(segments) * max_len,
        "random_batches": cost_of_batches([segments[i] for i in perm], batch_size),
        "length_grouped": cost_of_batches(sorted(segments, reverse=True), batch_size),
    }
    packed = slots["packed"]
    return {
        k: {
            "slots": s,
            "padding_slots": s - tokens,
            "padding_fraction": (s - tokens) / s if s else 0.0,
            "tokens_per_slot": tokens / s if s else 0.0,
            "speedup": s / packed if packed else None,
            "slots_saved": s - packed,
        }
        for k, s in slots.items()
    }


def expected_packing(
    max_len: int,
    segments: list[int],
    fill: list[int],
    per_row: list[int],
    documents: int,
    batch_size: int,
    seed: int,
) -> dict[str, Any]:
    """Every PackingStats figure from segment lengths (input order), row fill and counts."""
    tokens = sum(segments)
    rows = len(fill)
    return {
        "max_len": max_len,
        "batch_size": batch_size,
        "seed": seed,
        "documents": documents,
        "segments": len(segments),
        "tokens": tokens,
        "rows": rows,
        "lower_bound_rows": math.ceil(tokens / max_len),
        "rows_over_lower_bound": rows - math.ceil(tokens / max_len),
        "efficiency": tokens / (rows * max_len) if rows else 0.0,
        "full_rows": sum(1 for f in fill if f == max_len),
        "docs_per_row": {
            "min": min(per_row) if per_row else None,
            "mean": sum(per_row) / len(per_row) if per_row else None,
            "max": max(per_row) if per_row else None,
            "histogram": hist_of(per_row, docs_per_row_edges(max(per_row)) if per_row else [0, 1]),
        },
        "row_fill": hist_of(fill, edges_of(max_len, 10)),
        "comparison": expected_comparison(segments, rows, max_len, batch_size, seed),
    }


def expected_lengths(lengths: list[int], top: int) -> dict[str, Any]:
    n = len(lengths)
    return {
        "count": n,
        "tokens": sum(lengths),
        "min": min(lengths) if n else None,
        "mean": sum(lengths) / n if n else None,
        "p50": percentile(lengths, 50) if n else None,
        "p90": percentile(lengths, 90) if n else None,
        "p99": percentile(lengths, 99) if n else None,
        "max": max(lengths) if n else None,
        "histogram": hist_of(lengths, edges_of(top, 16)),
    }


LABEL_COUNTS = (
    "documents_without_labels",
    "chunks_without_labels_dropped",
    "tokens_in_chunks_without_labels",
)


def expected_dataset(out_dir: Path, batch_size: int = 8, seed: int = 0) -> dict[str, Any]:
    """The whole --json object of a packed output, from its rows read independently."""
    manifest, rows = read_rows(out_dir)
    max_len = manifest["max_len"]
    seg: dict[tuple[int, int], int] = {}
    fill, per_row = [], []
    for row in rows:
        cu = row["cu_seqlens"]
        for k, key in enumerate(zip(row["doc_ids"], row["chunk_ids"], strict=True)):
            assert key not in seg
            seg[key] = cu[k + 1] - cu[k]
        fill.append(row["num_tokens"])
        per_row.append(len(row["doc_ids"]))
    doc_len: dict[int, int] = defaultdict(int)
    for (doc, _), length in seg.items():
        doc_len[doc] += length
    segments = [seg[k] for k in sorted(seg)]
    docs, toks = manifest["documents"], manifest["tokens"]
    out = expected_packing(max_len, segments, fill, per_row, len(doc_len), batch_size, seed)
    return {
        "kind": "packed",
        "path": str(out_dir),
        "shards": len(manifest["shards"]),
        "tokenizer": manifest["tokenizer"]["name"],
        **out,
        "outcome": {  # the manifest's sections, under the same names
            "documents": docs,
            "tokens": toks,
            **(
                {"labels": {k: v for k, v in manifest["labels"].items() if k in LABEL_COUNTS}}
                if "labels" in manifest
                else {}
            ),
        },
        "document_lengths": expected_lengths(list(doc_len.values()), max_len),
        "bad_records": manifest["bad_records"],
        **expected_learned(rows, max_len),
        "units": expected_units(manifest, rows),
        "balance": expected_balance(manifest, rows, seed),
        "sources": None,  # a mixture only (tests/test_mix_pack.py)
        # (packs made with --pad-to-multiple-of: tests/test_alignment.py checks the figures)
        "alignment": None,
    }


def expected_balance(
    manifest: dict, rows: list[dict], seed: int, world_size: int | None = None, g: int | None = None
) -> dict[str, Any] | None:
    """The step balance by brute force: each row's cost summed segment by segment, each
    rank's rows by the documented layouts, each step's slowest rank found by a loop."""
    recorded = manifest.get("balance") or {}
    w = world_size or recorded.get("world_size")
    if w is None:
        return None
    n = len(rows)
    cost = []
    for r in rows:
        cu = r["cu_seqlens"]
        cost.append(sum((cu[k + 1] - cu[k]) ** 2 for k in range(len(r["doc_ids"]))))
    tokens = [r["num_tokens"] for r in rows]
    balanced = recorded.get("world_size") == w
    stored_g = recorded.get("micro_batches", 1)
    g = g or (stored_g if balanced else 1)
    if balanced:  # step-major: rank r's rows of step s are s*W*G + r*G + (0..G-1)
        steps, rem = divmod(n, w * stored_g)
        short = rem // w
        ranks = [
            [s * w * stored_g + r * stored_g + k for s in range(steps) for k in range(stored_g)]
            + [steps * w * stored_g + r * short + k for k in range(short)]
            for r in range(w)
        ]
    else:  # contiguous blocks
        per = n // w
        ranks = [list(range(r * per, (r + 1) * per)) for r in range(w)]
    perm = [int(x) for x in np.random.default_rng(seed).permutation(n)]
    per = n // w
    random_ranks = [[perm[i * w + r] for i in range(per)] for r in range(w)]

    def loads(values: list[int], ranks: list[list[int]]) -> list[list[int]]:
        m = len(ranks[0])
        return [[sum(values[i] for i in rank[a : a + g]) for rank in ranks] for a in range(0, m, g)]

    def ratios(steps: list[list[int]]) -> list[float]:
        return [max(x) / (sum(x) / len(x)) if sum(x) else 1.0 for x in steps]

    def lost(steps: list[list[int]]) -> float:
        peak = sum(max(x) for x in steps)
        return 1 - sum(sum(x) / len(x) for x in steps) / peak if peak else 0.0

    def hist(steps: list[list[int]]) -> dict[str, Any]:
        over = [round((r - 1) * 1000) for r in ratios(steps)]
        return hist_of(over, [0, 10, 20, 30, 50, 100, 200, 500, 1000])

    stored, random_ = loads(cost, ranks), loads(cost, random_ranks)
    return {
        "world_size": w,
        "micro_batches": g,
        "layout": "balanced" if balanced else "plain",
        "steps": len(stored),
        "imbalance": sum(ratios(stored)) / len(stored),
        "token_imbalance": sum(ratios(loads(tokens, ranks))) / len(stored),
        "time_lost": lost(stored),
        "random_imbalance": sum(ratios(random_)) / len(random_),
        "random_time_lost": lost(random_),
        "histogram": hist(stored),
        "random_histogram": hist(random_),
    }


def expected_units(manifest: dict, rows: list[dict]) -> dict[str, Any] | None:
    """For a merged output: the rows one FFD over all its segments would need."""
    if "units" not in manifest:
        return None
    lengths = [
        r["cu_seqlens"][k + 1] - r["cu_seqlens"][k] for r in rows for k in range(len(r["doc_ids"]))
    ]
    global_rows = int(first_fit_decreasing(np.asarray(lengths), manifest["max_len"]).max()) + 1
    return {
        "count": manifest["units"]["count"],
        "global_ffd_rows": global_rows,
        "rows_over_global_ffd": len(rows) - global_rows,
        "packing_loss": (len(rows) - global_rows) / global_rows,
    }


def test_units_packing_loss(tmp_path: Path) -> None:
    from packtool import pack_units

    pack_units([str(SAMPLE)], tmp_path / "u", units=4, max_len=1024)
    got = dataset_stats(tmp_path / "u").to_dict()
    want = expected_units(*read_rows(tmp_path / "u"))
    assert got["units"] == want and want["count"] == 4
    assert want["rows_over_global_ffd"] >= 0
    assert_figures_equal(without_seconds(got), expected_dataset(tmp_path / "u"))


def expected_learned(rows: list[dict], max_len: int) -> dict[str, Any]:
    """Learned tokens counted from the labels column (None without one)."""
    if not rows or "labels" not in rows[0]:
        return {"learned_tokens": None, "learned_share_of_slots": None}
    learned = sum(label != -100 for r in rows for label in r["labels"])
    return {
        "learned_tokens": learned,
        "learned_share_of_slots": round(learned / (len(rows) * max_len), 6),
    }


def without_seconds(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != "seconds"}


def assert_figures_equal(got: Any, want: Any, path: str = "") -> None:
    """Exact for ints, 1e-12 relative for floats, key sets equal."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (path, set(got) ^ set(want))
        for k in want:
            assert_figures_equal(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (path, got, want)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_figures_equal(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-12), (path, got, want)
    else:
        assert got == want and type(got) is type(want), (path, got, want)


# -- corpora ------------------------------------------------------------------------------


def random_corpus(path: Path, n: int = 120, seed: int = 1, longest: int = 70) -> Path:
    """Documents of random lengths (0 to ``longest`` characters), a few empty."""
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        length = rng.choice([0, *range(1, longest + 1)]) if i % 17 else 0
        texts.append("".join(rng.choice("abcdefgh") for _ in range(length)))
    return write_jsonl(path, [{"text": t} for t in texts])


# -- hand-made packed datasets, written with ShardWriter ----------------------------------


def write_raw(
    out: Path,
    max_len: int,
    rows: list[dict[str, Any]],
    *,
    rows_per_shard: int = 2,
    manifest: dict[str, Any] | None = None,
) -> Path:
    """Write rows given as dicts (cu_seqlens, num_tokens, doc_ids, chunk_ids), one write
    call per row, so shards hold several record batches."""
    with ShardWriter(
        out, max_len=max_len, num_rows=len(rows), rows_per_shard=rows_per_shard
    ) as writer:
        for row in rows:
            cu, n = row["cu_seqlens"], row["num_tokens"]
            pos = [p for a, b in itertools.pairwise(cu) for p in range(b - a)][:max_len]
            pos += [0] * (max_len - len(pos))
            writer.write(
                PackedBatch(
                    input_ids=np.array([([7] * n + [1] * max_len)[:max_len]], np.int32),
                    position_ids=np.array([pos], np.int32),
                    cu_values=np.array(cu, np.int32),
                    cu_offsets=np.array([0, len(cu)]),
                    num_tokens=np.array([n], np.int32),
                    doc_ids=np.array(row["doc_ids"], np.int64),
                    chunk_ids=np.array(row["chunk_ids"], np.int32),
                    seg_offsets=np.array([0, len(row["doc_ids"])]),
                )
            )
        writer.commit(
            manifest
            or {
                "tokenizer": {"name": "hand-made"},
                "documents": dict.fromkeys(
                    ("read", "packed", "split", "truncated", "dropped", "empty"), 0
                )
                | {"bad_records_skipped": 0},
                "tokens": {"packed": 0, "truncated_away": 0, "dropped": 0},
                "bad_records": [],
            }
        )
    return out


def write_segments(
    out: Path, max_len: int, rows: list[list[tuple[int, int, int]]], **kwargs: Any
) -> Path:
    """Rows given as lists of (doc_id, chunk_id, length) segments."""
    raw = []
    for segs in rows:
        cu = [0]
        for _, _, length in segs:
            cu.append(cu[-1] + length)
        n = cu[-1]
        if n < max_len:
            cu.append(max_len)
        raw.append(
            {
                "cu_seqlens": cu,
                "num_tokens": n,
                "doc_ids": [d for d, _, _ in segs],
                "chunk_ids": [c for _, c, _ in segs],
            }
        )
    return write_raw(out, max_len, raw, **kwargs)


# -- hand-computed figures ----------------------------------------------------------------


def test_hand_computed_ffd_example(tmp_path: Path) -> None:
    # packing.py's example: lengths [3, 7, 5, 2, 6, 4], max_len 10, three rows:
    # | 7 3 | 6 4 | 5 2 . . . |
    rows = [[(1, 0, 7), (0, 0, 3)], [(4, 0, 6), (5, 0, 4)], [(2, 0, 5), (3, 0, 2)]]
    out = write_segments(tmp_path / "out", 10, rows)
    s = dataset_stats(out, batch_size=2).to_dict()
    assert (s["documents"], s["segments"], s["tokens"], s["rows"]) == (6, 6, 27, 3)
    assert s["lower_bound_rows"] == 3 and s["rows_over_lower_bound"] == 0
    assert s["efficiency"] == pytest.approx(0.9)
    assert s["full_rows"] == 2
    assert s["docs_per_row"]["min"] == s["docs_per_row"]["max"] == 2
    assert s["docs_per_row"]["histogram"] == {"edges": [0, 1, 2], "counts": [0, 3], "above": 0}
    assert s["row_fill"]["counts"] == [0, 0, 0, 0, 0, 0, 1, 0, 0, 2]  # 7 in (6, 7], two full
    c = s["comparison"]
    assert c["packed"]["slots"] == 30 and c["packed"]["speedup"] == 1.0
    assert c["pad_to_max_len"]["slots"] == 60 and c["pad_to_max_len"]["speedup"] == 2.0
    assert c["pad_to_max_len"]["padding_slots"] == 33
    # sorted 7 6 | 5 4 | 3 2 -> 2*7 + 2*5 + 2*3 = 30: as good as packing here
    assert c["length_grouped"]["slots"] == 30 and c["length_grouped"]["slots_saved"] == 0
    assert c["length_grouped"]["padding_fraction"] == pytest.approx(3 / 30)
    s3 = dataset_stats(out, batch_size=4).to_dict()["comparison"]
    assert s3["length_grouped"]["slots"] == 4 * 7 + 2 * 3  # 7 6 5 4 | 3 2
    assert s3["length_grouped"]["speedup"] == pytest.approx(34 / 30)
    lengths = s["document_lengths"]
    assert (lengths["min"], lengths["max"], lengths["p50"], lengths["p90"]) == (2, 7, 4, 7)


def test_split_document_joined_and_row_counts(tmp_path: Path) -> None:
    # Document 0 (25 tokens) split into chunks 10, 10, 5; chunk 2 shares a row with doc 1.
    rows = [[(0, 1, 10)], [(0, 2, 5), (1, 0, 4)], [(0, 0, 10)]]
    out = write_segments(tmp_path / "out", 10, rows, rows_per_shard=1)
    s = dataset_stats(out, batch_size=1)
    assert s.shards == 3
    d = s.to_dict()
    assert (d["documents"], d["segments"], d["tokens"], d["rows"]) == (2, 4, 29, 3)
    assert d["document_lengths"]["max"] == 25 and d["document_lengths"]["histogram"]["above"] == 1
    assert d["document_lengths"]["min"] == 4
    # batch size 1: every batching costs exactly its tokens
    for key in ("random_batches", "length_grouped"):
        assert d["comparison"][key]["slots"] == 29
        assert d["comparison"][key]["padding_slots"] == 0
    assert d["comparison"]["pad_to_max_len"]["slots"] == 40


def test_stats_of_a_pack_that_dropped_unlearned_chunks(tmp_path: Path) -> None:
    """A labelled pack keeps the numbers of the chunks it kept (chunk 1 of document 0, with
    nothing to learn, is dropped: chunks 0 and 2 remain); stats read it (it stopped with "the
    chunks of a document are not numbered 0..k-1", on an output that verify passes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = [list(range(10, 20)), [30, 31, 32]]
    learned = [{1, 2, 3, 9}, {1, 2}]
    labels = [
        [t if i in keep else -100 for i, t in enumerate(d)]
        for d, keep in zip(ids, learned, strict=True)
    ]
    pq.write_table(pa.table({"ids": ids, "y": labels}), tmp_path / "in.parquet")
    out = tmp_path / "out"
    packtool.pack([tmp_path / "in.parquet"], out, max_len=4, ids_field="ids",
                  labels_field="y", pad_id=0)  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["labels"]["chunks_without_labels_dropped"] == 1
    assert packtool.verify(out).ok
    d = dataset_stats(out, batch_size=1).to_dict()
    assert (d["documents"], d["segments"], d["tokens"]) == (2, 3, 9)
    assert d["document_lengths"]["max"] == 6  # document 0 in the rows: chunks 0 and 2
    result = run("stats", out)
    assert result.exit_code == 0, result.output
    # a gap in a pack that dropped no chunk is still a broken pack
    with pytest.raises(FormatError, match=r"not numbered 0\.\.k-1"):
        dataset_stats(write_segments(tmp_path / "gap", 10, [[(0, 1, 10)]], rows_per_shard=1))


@pytest.mark.parametrize("batch_size", [1, 3, 8])
@pytest.mark.parametrize("seed", [0, 11])
def test_handmade_matches_independent(tmp_path: Path, batch_size: int, seed: int) -> None:
    rng = random.Random(seed * 100 + batch_size)
    max_len = 20
    rows, doc = [], 0
    for _ in range(23):
        segs, room = [], max_len
        while room and (not segs or rng.random() < 0.7):
            length = rng.randint(1, room)
            segs.append((doc, 0, length))
            room -= length
            doc += 1
        rows.append(segs)
    rng.shuffle(rows)
    out = write_segments(tmp_path / "out", max_len, rows, rows_per_shard=5)
    got = without_seconds(dataset_stats(out, batch_size=batch_size, seed=seed).to_dict())
    want = expected_dataset(out, batch_size, seed)
    assert_figures_equal(got, want)


# -- packed with `pack`, against the independent computation ------------------------------


@pytest.mark.parametrize("overflow", ["split", "truncate", "drop"])
@pytest.mark.parametrize(("batch_size", "seed"), [(1, 0), (3, 5), (8, 0)])
def test_packed_matches_independent(
    tmp_path: Path, char_tokenizer: CharTokenizer, overflow: str, batch_size: int, seed: int
) -> None:
    src = random_corpus(tmp_path / "in.jsonl")
    out = tmp_path / "out"
    packtool.pack(
        [src], out, max_len=32, tokenizer=char_tokenizer, overflow=overflow, rows_per_shard=7
    )
    got = without_seconds(dataset_stats(out, batch_size=batch_size, seed=seed).to_dict())
    assert_figures_equal(got, expected_dataset(out, batch_size, seed))
    if overflow == "split":
        assert (
            got["outcome"]["documents"]["split"] > 0
            and got["document_lengths"]["histogram"]["above"] > 0
        )
    assert got["outcome"]["documents"]["empty"] > 0


def test_row_order_does_not_change_figures(tmp_path: Path, char_tokenizer: CharTokenizer) -> None:
    src = random_corpus(tmp_path / "in.jsonl")
    a = packtool.pack([src], tmp_path / "a", max_len=32, tokenizer=char_tokenizer, seed=1)
    b = packtool.pack([src], tmp_path / "b", max_len=32, tokenizer=char_tokenizer, shuffle=False)
    assert a.rows == b.rows
    sa, sb = dataset_stats(a.out_dir).to_dict(), dataset_stats(b.out_dir).to_dict()
    for d in (sa, sb):
        del d["path"], d["seconds"]
    assert sa == sb  # segments are taken in input order (doc, chunk), not row order


def test_bad_records_and_outcome(tmp_path: Path, char_tokenizer: CharTokenizer) -> None:
    (tmp_path / "in.jsonl").write_text('{"text": "aa"}\n{"text": 3}\nnot json\n{"text": ""}\n')
    out = tmp_path / "out"
    packtool.pack(
        [tmp_path / "in.jsonl"], out, max_len=8, tokenizer=char_tokenizer, skip_bad_records=True
    )
    s = dataset_stats(out).to_dict()
    assert (
        s["outcome"]["documents"]["read"] == 4
        and s["outcome"]["documents"]["bad_records_skipped"] == 2
    )
    assert s["outcome"]["documents"]["empty"] == 1 and s["outcome"]["documents"]["packed"] == 1
    assert len(s["bad_records"]) == 2 and "in.jsonl:2" in s["bad_records"][0]


def test_empty_dataset(tmp_path: Path, char_tokenizer: CharTokenizer) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": ""}, {"text": ""}])
    packtool.pack([src], tmp_path / "out", max_len=8, tokenizer=char_tokenizer, allow_empty=True)
    s = dataset_stats(tmp_path / "out").to_dict()
    assert (s["rows"], s["segments"], s["tokens"], s["documents"]) == (0, 0, 0, 0)
    assert s["efficiency"] == 0.0 and s["docs_per_row"]["mean"] is None
    assert all(c["slots"] == 0 and c["speedup"] is None for c in s["comparison"].values())
    assert s["document_lengths"]["p50"] is None and s["outcome"]["documents"]["empty"] == 2
    result = run("stats", tmp_path / "out")
    assert result.exit_code == 0, result.stderr


# -- batch_slots, by brute force ----------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 50), max_size=40), st.integers(1, 9))
def test_batch_slots_matches_loop(lengths: list[int], batch_size: int) -> None:
    assert batch_slots(np.array(lengths, np.int64), batch_size) == (
        cost_of_batches(lengths, batch_size) if lengths else 0
    )


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3).flatmap(lambda b: st.tuples(st.just(b), st.integers(1, 6 // b))))
def test_length_grouped_is_the_least_padding(b_k: tuple[int, int]) -> None:
    # With a whole number of batches, sorted batches pad least of all orders (brute force).
    batch_size, k = b_k
    rng = random.Random(batch_size * 10 + k)
    lengths = [rng.randint(1, 20) for _ in range(batch_size * k)]
    best = min(cost_of_batches(list(p), batch_size) for p in itertools.permutations(lengths))
    assert batch_slots(np.sort(lengths)[::-1], batch_size) == best


# -- errors -------------------------------------------------------------------------------


def test_not_a_packed_output(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(FormatError, match=r"is not a packtool output: it has no manifest\.json"):
        dataset_stats(tmp_path / "d")


def test_unknown_format_version(tmp_path: Path) -> None:
    out = write_segments(tmp_path / "out", 4, [[(0, 0, 3)]])
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["format_version"] = 99
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FormatError, match=r"format version 99 is not supported"):
        dataset_stats(out)
    assert_one_line_error(run("stats", out), r"format version 99 is not supported")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            {"cu_seqlens": [0, 3, 4], "num_tokens": 2, "doc_ids": [0], "chunk_ids": [0]},
            r"row 1: cu_seqlens does not run from 0 through num_tokens",
        ),
        (
            {"cu_seqlens": [0, 2, 3, 4], "num_tokens": 3, "doc_ids": [0], "chunk_ids": [0]},
            r"row 1: cu_seqlens does not have one boundary per document segment",
        ),
        (
            {"cu_seqlens": [0, 3, 4], "num_tokens": 9, "doc_ids": [0], "chunk_ids": [0]},
            r"row 1: num_tokens outside \[0, max_len=4\]",
        ),
        (
            {"cu_seqlens": [0, 2, 2, 4], "num_tokens": 2, "doc_ids": [0, 1], "chunk_ids": [0, 0]},
            r"row 1: cu_seqlens does not rise strictly",
        ),
        (
            {"cu_seqlens": [0, 3, 4], "num_tokens": 3, "doc_ids": [5], "chunk_ids": [0]},
            r"a \(doc_id, chunk_id\) appears twice",
        ),
        (
            {"cu_seqlens": [0, 3, 4], "num_tokens": 3, "doc_ids": [6], "chunk_ids": [1]},
            r"chunks of a document are not numbered 0\.\.k-1",
        ),
    ],
)
def test_broken_rows(tmp_path: Path, row: dict[str, Any], message: str) -> None:
    good = {"cu_seqlens": [0, 4], "num_tokens": 4, "doc_ids": [5], "chunk_ids": [0]}
    out = write_raw(tmp_path / "out", 4, [good, row])
    with pytest.raises(FormatError, match=message):
        dataset_stats(out)
    assert_one_line_error(run("stats", out), message)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("abc", r"cannot read 'abc' as a number of tokens"),
        ("2048,,4096", r"cannot read '' as a number of tokens"),
        ("1", r"--max-len must be an integer from 2 to 16,777,216, got 1"),
        ("2048,2k", r"2048 is given twice"),
    ],
)
def test_parse_max_lens_errors(text: str, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_max_lens(text)


def test_parse_max_lens() -> None:
    assert parse_max_lens("2048, 4k,8192") == [2048, 4096, 8192]
    assert parse_max_lens([16, 8]) == [16, 8]


def test_batch_size_and_seed_checked(tmp_path: Path) -> None:
    out = write_segments(tmp_path / "out", 4, [[(0, 0, 3)]])
    with pytest.raises(OptionError, match=r"--batch-size must be an integer from 1 to 1,048,576"):
        dataset_stats(out, batch_size=0)
    with pytest.raises(OptionError, match=r"--seed must be an integer from 0 to "):
        dataset_stats(out, seed=-1)


# -- corpus mode --------------------------------------------------------------------------


class CountingTokenizer(CharTokenizer):
    """The char tokenizer, counting the documents it encodes."""

    def __init__(self) -> None:
        super().__init__()
        self.encoded = 0

    def encode_batch(
        self, texts: Any, add_special_tokens: bool = True, parse_special: bool = False
    ) -> list[list[int]]:
        self.encoded += len(texts)
        return super().encode_batch(texts, add_special_tokens, parse_special)


@pytest.mark.parametrize("overflow", ["split", "truncate", "drop"])
def test_corpus_matches_packed(tmp_path: Path, overflow: str) -> None:
    src = random_corpus(tmp_path / "in.jsonl", n=150)
    max_lens = [16, 48, 8]
    c = corpus_stats(
        [src], max_lens, tokenizer=CharTokenizer(), overflow=overflow, batch_size=3, seed=2
    )
    assert [r.max_len for r in c.results] == max_lens
    for result in c.results:
        out = tmp_path / f"out-{result.max_len}"
        packtool.pack(
            [src], out, max_len=result.max_len, tokenizer=CharTokenizer(), overflow=overflow
        )
        want = expected_dataset(out, batch_size=3, seed=2)
        got = result.to_dict()
        assert_figures_equal(got, {k: want[k] for k in got})


def test_corpus_document_lengths_and_counts(tmp_path: Path) -> None:
    texts = ["a" * 5, "", "b" * 40, "c", "d" * 9]
    lines = [json.dumps({"text": t}) for t in texts]
    lines.insert(2, '{"text": null}')
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    c = corpus_stats(
        [tmp_path / "in.jsonl"],
        "10,64",
        tokenizer=CharTokenizer(),
        skip_bad_records=True,
    )
    d = c.to_dict()
    assert (d["documents_read"], d["empty"], d["bad_records_skipped"]) == (6, 1, 1)
    assert_figures_equal(d["document_lengths"], expected_lengths([6, 41, 2, 10], 64))
    at10, at64 = d["max_lens"]
    assert at10["outcome"] == {
        "documents": {
            "read": 6,
            "packed": 3,
            "split": 1,
            "truncated": 0,
            "dropped": 0,
            "empty": 1,
            "bad_records_skipped": 1,
        },
        "tokens": {"packed": 59, "truncated_away": 0, "dropped": 0},
    }
    assert at10["segments"] == 3 + 5  # 41 tokens -> 10 10 10 10 1
    assert at64["outcome"]["documents"]["split"] == 0 and at64["segments"] == 4
    assert at64["rows"] == 1 and at64["efficiency"] == pytest.approx(59 / 64)
    assert len(d["bad_records"]) == 1 and "in.jsonl:3" in d["bad_records"][0]


def test_cache_is_reused(tmp_path: Path) -> None:
    src = random_corpus(tmp_path / "in.jsonl")
    cache = tmp_path / "cache"
    tok = CountingTokenizer()
    first = corpus_stats([src], [32], tokenizer=tok, cache_dir=cache)
    n_docs = first.documents_read
    assert tok.encoded > 0 and not first.cache_hit
    assert first.cache_path is not None and first.cache_path.exists()
    assert first.cache_path.parent.parent == cache

    tok.encoded = 0
    second = corpus_stats([src], [32, 64], tokenizer=tok, cache_dir=cache)
    assert tok.encoded == 0 and second.cache_hit  # not tokenized again
    assert second.results[0].to_dict() == first.results[0].to_dict()
    lengths = [c.document_lengths.to_dict() for c in (first, second)]
    for d in lengths:
        del d["histogram"]  # its range follows the largest max_len asked for
    assert lengths[0] == lengths[1]

    # Options that change the lengths, or a changed input, miss the cache.
    corpus_stats([src], [32], tokenizer=tok, cache_dir=cache, add_eos=False)
    assert tok.encoded == n_docs
    with open(src, "a") as f:
        f.write(json.dumps({"text": "new"}) + "\n")
    tok.encoded = 0
    third = corpus_stats([src], [32], tokenizer=tok, cache_dir=cache)
    assert not third.cache_hit and tok.encoded == n_docs + 1
    assert third.documents_read == n_docs + 1


def test_cache_disabled_damaged_and_default_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _cache_in_tmp: Path
) -> None:
    src = random_corpus(tmp_path / "in.jsonl")
    tok = CountingTokenizer()
    off = corpus_stats([src], [32], tokenizer=tok, use_cache=False)
    assert off.cache_path is None and not _cache_in_tmp.exists()

    on = corpus_stats([src], [32], tokenizer=tok)  # PACKTOOL_CACHE_DIR (the fixture)
    assert on.cache_path is not None and on.cache_path.is_relative_to(_cache_in_tmp)
    on.cache_path.write_bytes(b"not an npy file")
    tok.encoded = 0
    again = corpus_stats([src], [32], tokenizer=tok)
    assert not again.cache_hit and tok.encoded > 0  # damaged: tokenized again, rewritten
    assert again.results[0].to_dict() == on.results[0].to_dict()
    assert corpus_stats([src], [32], tokenizer=tok).cache_hit

    monkeypatch.delenv("PACKTOOL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "packtool"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "packtool"


# -- the command line ---------------------------------------------------------------------


@pytest.fixture
def packed(tmp_path: Path) -> Path:
    src = random_corpus(tmp_path / "in.jsonl", n=200, longest=90)
    out = tmp_path / "out"
    packtool.pack([src], out, max_len=64, tokenizer=CharTokenizer(), rows_per_shard=9)
    return out


def test_cli_table(packed: Path) -> None:
    result = run("stats", packed, "--batch-size", "4")
    assert result.exit_code == 0, result.stderr
    text = result.stdout
    want = expected_dataset(packed, batch_size=4)
    assert f"{want['rows']:,}" in text and f"{want['efficiency']:.2%}" in text
    # the header names the (tmp) path, so it may wrap anywhere: compare words, not lines
    assert f"max_len {want['max_len']}" in " ".join(text.split())
    for key, label in [
        ("pad_to_max_len", "pad to max_len"),
        ("random_batches", "random batches"),
        ("length_grouped", "length-grouped"),
    ]:
        c = want["comparison"][key]
        line = next(ln for ln in text.splitlines() if label in ln and "x" in ln)
        assert f"{c['slots']:,}" in line
        assert f"{c['padding_fraction']:.1%}" in line
        assert f"{c['speedup']:.2f}x" in line
    for title in ("Document lengths", "Row fill", "Documents per row", "What happened"):
        assert title in text
    assert "█" in text  # the histograms have bars
    line = next(ln for ln in text.splitlines() if "split into chunks" in ln)
    assert line.split()[-1] == f"{want['outcome']['documents']['split']:,}"


def test_cli_json(packed: Path) -> None:
    result = run("stats", packed, "--json", "--batch-size", "5", "--seed", "3")
    assert result.exit_code == 0, result.stderr
    got = json.loads(result.stdout)
    assert_figures_equal(without_seconds(got), expected_dataset(packed, 5, 3))
    assert without_seconds(got) == without_seconds(
        dataset_stats(packed, batch_size=5, seed=3).to_dict()
    )


def test_cli_corpus_several_max_lens_and_cache(tmp_path: Path) -> None:
    src = random_corpus(tmp_path / "in.jsonl", n=300, longest=400)
    cache = tmp_path / "cache"
    args = ["stats", src, "--max-len", "64,128,256", "--cache-dir", cache, "--json"]
    first = run(*args)
    assert first.exit_code == 0, first.stderr
    data = json.loads(first.stdout)
    assert data["kind"] == "corpus" and data["cache"]["hit"] is False
    assert [r["max_len"] for r in data["max_lens"]] == [64, 128, 256]
    assert Path(data["cache"]["path"]).is_relative_to(cache)
    # the same figures as the library, with the bundled tokenizer (the default)
    lib = corpus_stats([src], [64, 128, 256], use_cache=False).to_dict()
    assert data["max_lens"] == lib["max_lens"]
    assert data["document_lengths"] == lib["document_lengths"]

    second = run(*args)
    assert json.loads(second.stdout)["cache"]["hit"] is True
    assert json.loads(second.stdout)["max_lens"] == data["max_lens"]

    table = run("stats", src, "-L", "64,128,256", "--cache-dir", cache)
    assert table.exit_code == 0, table.stderr
    assert "lengths from the cache" in table.stdout
    for r in data["max_lens"]:
        assert f"{r['comparison']['random_batches']['slots']:,}" in table.stdout
        assert f"{r['comparison']['pad_to_max_len']['speedup']:.2f}x" in table.stdout
        assert f"{r['efficiency']:.2%}" in table.stdout


def test_cli_errors(tmp_path: Path, packed: Path) -> None:
    src = random_corpus(tmp_path / "c.jsonl", n=5)
    assert_one_line_error(
        run("stats", src), r"c\.jsonl is not a packed output.*pass --max-len", code=2
    )
    assert_one_line_error(run("stats", tmp_path / "nope"), r"nope: no such file or directory")
    shards = tmp_path / "half"
    shards.mkdir()
    (shards / "data-00000-of-00001.arrow").write_bytes(b"")
    assert_one_line_error(
        run("stats", shards), r"half is not a packtool output: it has no manifest\.json"
    )
    assert_one_line_error(run("stats", packed, packed), r"give one packed output at a time", code=2)
    assert_one_line_error(  # with --max-len, a pack is the corpus of its documents
        run("stats", packed, "--max-len", "64", "--tokenizer", "x"),
        r"--tokenizer does not apply to a packed output",
    )
    assert_one_line_error(
        run("stats", packed, "--tokenizer", "x", "--no-cache"),
        r"--tokenizer, --no-cache apply to a corpus",
        code=2,
    )
    assert_one_line_error(
        run("stats", src, "--max-len", "64,abc"), r"cannot read .abc. as a number of tokens", code=2
    )
    assert_one_line_error(
        run("stats", packed, "--batch-size", "0"),
        r"--batch-size must be an integer from 1 to",
        code=2,
    )
    assert_one_line_error(
        run("stats", src, "--max-len", "64", "--overflow", "wrap"),
        r"--overflow must be one of split",
        code=2,
    )
    assert_one_line_error(
        run("stats", src, "--max-len", "64", "--text-field", "body"),
        r"c\.jsonl: the first record has no field 'body' \(--text-field\)",  # as pack says
    )


# -- docs ---------------------------------------------------------------------------------


def key_paths(obj: Any, prefix: str = "") -> set[str]:
    """Dotted paths of every key; list items as ``name[]``; histograms' own keys once."""
    paths: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            path = f"{prefix}.{k}" if prefix else k
            paths.add(path)
            if isinstance(v, dict) and set(v) == {"edges", "counts", "above"}:
                continue  # a Histogram: documented once
            paths |= key_paths(v, path)
    elif isinstance(obj, list) and obj and isinstance(obj[0], dict):
        paths |= key_paths(obj[0], f"{prefix}[]")
    return paths


def test_docs_list_every_json_key(packed: Path, tmp_path: Path) -> None:
    doc = (REPO / "docs" / "stats.md").read_text()
    documented = set(re.findall(r"`([a-z_\[\].0-9]+)`", doc))
    packed_keys = key_paths(dataset_stats(packed).to_dict())
    src = random_corpus(tmp_path / "in.jsonl", n=10)
    corpus_keys = key_paths(corpus_stats([src], [32], tokenizer=CharTokenizer()).to_dict())
    # every per-max_len key of the corpus object is a key of the packed object
    per_max_len = {k.removeprefix("max_lens[].") for k in corpus_keys if "[]" in k}
    assert per_max_len <= packed_keys
    missing = {k for k in packed_keys | corpus_keys if "[]" not in k} - documented
    assert not missing, f"docs/stats.md does not document: {sorted(missing)}"
    for name in ("edges", "counts", "above"):
        assert f"`{name}`" in doc
    for key in BATCHINGS:
        assert f"`{key}`" in doc


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("chat.jsonl", {"chat_template": str(REPO / "sample_data" / "chatml.jinja")}),
        (
            "chat.jsonl",
            {"chat_template": str(REPO / "sample_data" / "chatml.jinja"), "overflow": "split"},
        ),
        ("prompt_completion.jsonl", {}),
        ("prompt_completion.jsonl", {"overflow": "truncate"}),
    ],
)
def test_corpus_of_instruction_data_matches_packed(
    tmp_path: Path, name: str, options: dict[str, Any]
) -> None:
    """Instruction data goes through pack's own read/encode loop and labelled cut: at each
    max_len, the segments (chunks with nothing to learn dropped), the counts and every
    figure are those of the pack made with the same options."""
    from packtool.format import read_manifest
    from packtool.packing import Overflow
    from packtool.stats import _load_cached

    src = REPO / "sample_data" / name
    c = corpus_stats([src], [48, 300], batch_size=3, cache_dir=tmp_path / "cache", **options)
    again = corpus_stats([src], [48, 300], batch_size=3, cache_dir=tmp_path / "cache", **options)
    assert again.cache_hit and not c.cache_hit
    for result, cached in zip(c.results, again.results, strict=True):
        out = tmp_path / f"out-{result.max_len}"
        packtool.pack([src], out, max_len=result.max_len, **options)
        want = expected_dataset(out, batch_size=3)
        assert_figures_equal(result.to_dict(), {k: want[k] for k in result.to_dict()})
        assert cached.to_dict() == result.to_dict()  # the cached runs of learned tokens cut alike
        assert result.outcome.labels is not None and result.outcome.tokens.learned
    # the segment lengths themselves (sorted) against the pack's record of them
    assert c.cache_path is not None
    kept = _load_cached(c.cache_path.parent, c.cache_path.stem)
    assert kept is not None and kept.runs is not None
    segments, counts, _ = kept.cut(48, Overflow(options.get("overflow", "drop")))
    manifest = read_manifest(tmp_path / "out-48")
    assert manifest.segment_lengths is not None
    assert sorted(segments.tolist()) == manifest.segment_lengths.tolist()
    assert counts == manifest.counts


def test_cli_corpus_of_chats_takes_the_instruction_options(tmp_path: Path) -> None:
    """`stats CHATS -L ...` takes pack's instruction options (--chat-template, --loss-on,
    --chat-turns, the field names...): its error for chats without a template asks for
    --chat-template, which stats did not have. The figures are the pack's."""
    lines = (REPO / "sample_data" / "chat.jsonl").read_text(encoding="utf-8").splitlines()
    src = tmp_path / "chat.jsonl"
    src.write_text("\n".join(lines[:40]) + "\n", encoding="utf-8")
    template = str(REPO / "sample_data" / "chatml.jinja")
    assert_one_line_error(
        run("stats", src, "-L", "512", "--no-cache"), r"need a chat template.*--chat-template"
    )
    options = ["--chat-template", template, "--chat-turns", "each", "--loss-on", "all"]
    result = run("stats", src, "-L", "512", "--json", "--no-cache", *options)
    assert result.exit_code == 0, result.output
    (figures,) = json.loads(result.stdout)["max_lens"]
    out = tmp_path / "out"
    assert run("pack", src, "-L", "512", "-o", out, "-q", *options).exit_code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert (
        figures["rows"] == manifest["rows"]
        and figures["outcome"]["documents"] == manifest["documents"]
    )
    assert figures["outcome"]["tokens"]["learned"] == manifest["tokens"]["learned"]
    assert manifest["documents"]["read"] > 40  # one example per assistant turn
    assert_one_line_error(  # on a packed output they are refused, as the other corpus options
        run("stats", out, "--chat-template", template), r"--chat-template applies to a corpus"
    )


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 40), st.booleans()), max_size=12),
    st.integers(0, 2**32 - 1),
    st.integers(1, 16),
    st.sampled_from(["split", "truncate", "drop"]),
)
def test_learned_runs_cut_as_the_labels_do(
    docs: list[tuple[int, bool]], seed: int, max_len: int, overflow: str
) -> None:
    """What the lengths-only sink keeps of labelled documents (their lengths and the runs of
    learned tokens) is cut exactly as the labels themselves are, in any blocks."""
    from packtool import stats
    from packtool.format import IGNORE_INDEX
    from packtool.packing import Overflow, cut_items
    from packtool.tokenize import EncodedBatch

    rng = np.random.default_rng(seed)
    lengths = np.array([n for n, _ in docs], np.int64)
    empty = np.array([n == 0 or e for n, e in docs], bool)
    ids = rng.integers(0, 50, int(lengths.sum())).astype(np.int32)
    labels = np.where(rng.random(ids.size) < 0.4, ids, IGNORE_INDEX).astype(np.int32)
    sink = stats._LengthsSink()
    half = len(docs) // 2
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for lo, hi in ((0, half), (half, len(docs))):  # two batches
        part = slice(int(offsets[lo]), int(offsets[hi]))
        sink.add(EncodedBatch(ids[part], lengths[lo:hi], empty[lo:hi], labels[part]), None)  # type: ignore[arg-type]
    state = stats.ReadState()
    kept = sink.tokenized(state, labelled=True)
    policy = Overflow(overflow)
    # pack's cut of the same documents (an empty one has no tokens in the rows)
    _, _, want_len, want_counts, _ = cut_items(lengths, empty, labels, max_len, policy,
                                               ignore=IGNORE_INDEX)  # fmt: skip
    got_len, got_counts, _ = kept.cut(max_len, policy)
    assert got_len.tolist() == want_len.tolist()
    assert got_counts == want_counts  # documents, tokens, labels: every figure
    stats_blocks = stats._LABELS_BLOCK
    try:
        stats._LABELS_BLOCK = 7  # many small blocks: the same cut
        assert kept.cut(max_len, policy)[0].tolist() == want_len.tolist()
    finally:
        stats._LABELS_BLOCK = stats_blocks


def _same_size_rewrite(directory: Path, texts: list[str]) -> None:
    """Rewrite the Arrow file of a saved dataset in place with ``texts`` (the same size),
    leaving the directory's own modification time as it was."""
    import datasets

    (arrow,) = directory.glob("*.arrow")
    before = directory.stat()
    scratch = directory.parent / "scratch"
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(scratch))
    (new,) = scratch.glob("*.arrow")
    assert new.stat().st_size == arrow.stat().st_size
    arrow.write_bytes(new.read_bytes())
    os.utime(directory, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_a_directory_input_changed_inside_is_not_reused(tmp_path: Path) -> None:
    """One fingerprint (prepare.fingerprint_of) keys pack --resume's checkpoint and stats'
    cached lengths: a saved dataset whose file is rewritten in place (same size, the
    directory's own mtime unchanged) is tokenized again, and its figures are the new ones."""
    import datasets

    from packtool.options import PackOptions
    from packtool.prepare import fingerprint_of, prepare
    from packtool.readers import resolve_inputs

    texts = [f"document number {i} " * (1 + i % 7) for i in range(40)]
    other = [t.replace("document", "dOcUmEnT").replace("number", "NuMbEr") for t in texts]
    ds = tmp_path / "ds"
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(ds))
    cache = tmp_path / "cache"

    class Stop(KeyboardInterrupt):
        pass

    def stop_writing(stage: str, done: int, total: int | None) -> None:
        if stage == "write":
            raise Stop  # every document tokenized and checkpointed: a pack to --resume

    out = tmp_path / "out"
    with pytest.raises(Stop):
        packtool.pack([ds], out, max_len=64, resume=True, progress=stop_writing)
    first = corpus_stats([ds], [64], cache_dir=cache)
    assert corpus_stats([ds], [64], cache_dir=cache).cache_hit
    files = resolve_inputs([ds])
    prepared = prepare(files, PackOptions(max_len=64), preload=False)
    key_before = fingerprint_of(files, prepared.tokenizer, "options")
    mtime = ds.stat().st_mtime_ns

    _same_size_rewrite(ds, other)
    assert ds.stat().st_mtime_ns == mtime  # the directory itself looks unchanged
    assert fingerprint_of(resolve_inputs([ds]), prepared.tokenizer, "options") != key_before
    changed = corpus_stats([ds], [64], cache_dir=cache)
    assert not changed.cache_hit
    assert changed.results[0].tokens != first.results[0].tokens  # the new text, tokenized
    resumed = packtool.pack([ds], out, max_len=64, resume=True)  # not the old tokens
    assert not resumed.resumed and any("checkpoint" in n for n in resumed.notices)
    fresh = packtool.pack([ds], tmp_path / "fresh", max_len=64)
    assert resumed.manifest.counts == fresh.manifest.counts
    assert resumed.tokens == changed.results[0].tokens
    want = expected_dataset(out)
    got = changed.results[0].to_dict()
    assert_figures_equal(got, {k: want[k] for k in got})


@pytest.fixture(scope="module")
def balanced_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stats-balance") / "out"
    packtool.pack([str(SAMPLE)], out, max_len=512, world_size=4, micro_batches=2, seed=1)
    return out


@pytest.mark.parametrize(("world_size", "g"), [(None, None), (4, 1), (None, 3), (3, None), (5, 2)])
def test_balance_by_brute_force(balanced_out: Path, world_size: int | None, g: int | None) -> None:
    """The recorded layout (also read with other rows per step) and the plain split of
    another world size, against loops over the rows."""
    got = dataset_stats(balanced_out, seed=2, world_size=world_size, micro_batches=g).to_dict()
    manifest, rows = read_rows(balanced_out)
    want = expected_balance(manifest, rows, 2, world_size, g)
    assert_figures_equal(got["balance"], want)
    assert want is not None
    if want["layout"] == "balanced" and want["micro_batches"] == 2:
        assert want["imbalance"] < 1.01 < 1.1 < want["random_imbalance"]
        assert got["balance"]["imbalance"] == pytest.approx(manifest["balance"]["imbalance"])


def test_balance_of_an_unbalanced_output(packed: Path) -> None:
    manifest, rows = read_rows(packed)
    got = dataset_stats(packed, world_size=8).to_dict()["balance"]
    assert_figures_equal(got, expected_balance(manifest, rows, 0, 8, None))
    assert got["layout"] == "plain"
    result = run("stats", packed, "--world-size", "8")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())  # rich wraps the line
    assert "step imbalance at world size 8 x 1 row per step" in text
    assert "plain split, not balanced" in text
    assert "Steps by imbalance, random order" in text
    data = json.loads(run("stats", packed, "--world-size", "8", "--json").stdout)
    assert data["balance"]["imbalance"] == pytest.approx(got["imbalance"])
    assert_one_line_error(run("stats", packed, "--micro-batches", "2"), r"needs --world-size W")
    assert_one_line_error(run("stats", packed, "--world-size", "0"), r"--world-size must be")


def test_balance_line_of_a_balanced_output(balanced_out: Path) -> None:
    result = run("stats", balanced_out)
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert re.search(r"world size 4 x 2 rows per step \([\d,]+ steps, balanced layout\)", text)


# -- corpora of token ids (pack --ids-field), without a tokenizer -------------------------------


def _ids_corpus(tmp_path: Path, kind: str) -> tuple[Path, dict[str, Any]]:
    """A pre-tokenized corpus of ``kind`` and the options that read it."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(4)
    docs = [rng.integers(3, 500, int(n)).tolist() for n in rng.integers(0, 60, 120)]
    if kind == "parquet-stream":  # EOS-separated streams of documents, cut by --split-on-eos
        stream = [[t for d in docs[i : i + 10] for t in [*d, 2]] for i in range(0, 120, 10)]
        pq.write_table(pa.table({"ids": stream}), tmp_path / "s.parquet")
        return tmp_path / "s.parquet", {"ids_field": "ids", "split_on_eos": 2}
    if kind == "jsonl.gz":
        data = "".join(json.dumps({"ids": d}) + "\n" for d in docs).encode()
        (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(data))
        return tmp_path / "a.jsonl.gz", {"ids_field": "ids", "eos_token": "2", "add_eos": True}
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(str(tmp_path / "m.bin"), dtype=np.uint16)
    for d in docs:
        builder.add_document(torch.tensor(d, dtype=torch.int64), [len(d)])
    builder.finalize(str(tmp_path / "m.idx"))
    return tmp_path / "m", {}


@pytest.mark.parametrize(
    ("kind", "overflow"),
    [("parquet-stream", "split"), ("jsonl.gz", "truncate"), ("megatron", "drop")],
)
def test_corpus_of_ids_matches_packed(tmp_path: Path, kind: str, overflow: str) -> None:
    src, options = _ids_corpus(tmp_path, kind)
    c = corpus_stats([src], [16, 48], overflow=overflow, batch_size=3, use_cache=False, **options)
    assert c.tokenizer == "none (pre-tokenized)"
    for result in c.results:
        out = tmp_path / f"out-{result.max_len}"
        report = packtool.pack([src], out, max_len=result.max_len, overflow=overflow, pad_id=0,
                               **options)  # fmt: skip
        assert c.documents_read == report.documents.read
        want = expected_dataset(out, batch_size=3)
        got = result.to_dict()
        assert_figures_equal(got, {k: want[k] for k in got})


def test_ids_corpus_from_the_cli_and_its_mistakes(tmp_path: Path) -> None:
    src, _ = _ids_corpus(tmp_path, "parquet-stream")
    cache = tmp_path / "cache"
    args = ["stats", src, "--ids-field", "ids", "--split-on-eos", "2", "-L", "16,48", "--json"]
    first = run(*args, "--cache-dir", cache)
    assert first.exit_code == 0, first.stderr
    data = json.loads(first.stdout)
    lib = corpus_stats([src], [16, 48], ids_field="ids", split_on_eos=2, use_cache=False)
    assert data["max_lens"] == lib.to_dict()["max_lens"]
    assert data["documents_read"] == 120 and data["tokenizer"] == "none (pre-tokenized)"
    again = json.loads(run(*args, "--cache-dir", cache).stdout)
    assert again["cache"]["hit"] is True and again["max_lens"] == data["max_lens"]
    other = json.loads(run(*args[:4], "-L", "16,48", "--json", "--cache-dir", cache).stdout)
    assert other["cache"]["hit"] is False  # not cut at the EOS: another key
    # the table says the ids were read as they are, not "tokenized" (there is no tokenizer)
    table = run(*args[:-1], "--no-cache").stdout
    assert "(ids as stored, not tokenized)" in " ".join(table.split()), table
    assert other["documents_read"] == 12
    # ids with labels: cut as pack cuts them (the first token of each chunk is not learned)
    labelled = corpus_stats([src], [16], ids_field="ids", labels_field="ids", use_cache=False)
    packtool.pack([src], tmp_path / "labelled", max_len=16, ids_field="ids", labels_field="ids",
                  pad_id=0)  # fmt: skip
    want = expected_dataset(tmp_path / "labelled")
    got = labelled.results[0].to_dict()
    assert_figures_equal(got, {k: want[k] for k in got})
    assert labelled.results[0].outcome.tokens.learned
    assert_one_line_error(
        run("stats", src, "--ids-field", "ids", "--vocab-size", "100", "-L", "16", "--no-cache"),
        r"s\.parquet: row 0: 'ids'\[\d+\] is \d+, outside the vocabulary \[0, 100\)",
    )
    assert_one_line_error(
        run("stats", src, "--split-on-eos", "2", "-L", "16", "--no-cache"),
        r"--split-on-eos cuts pre-tokenized records: give --ids-field",
    )
    out = tmp_path / "packed"
    packtool.pack([src], out, max_len=16, ids_field="ids", pad_id=0)
    assert_one_line_error(
        run("stats", out, "--ids-field", "ids"), r"is a packed output: --ids-field applies to"
    )
