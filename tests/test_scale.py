"""The scale-and-speed machinery: identical results on every path, nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, SAMPLE, CharTokenizer, write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st

import packtool
from packtool.corpus import background as _background
from packtool.gather import gather_rows
from packtool.packing import RowPlan, first_fit_decreasing, plan_rows
from packtool.store import TokenStore
from packtool.tokenize import DocumentEncoder


def _random_plan(rng: np.random.Generator, n_items: int, max_len: int):
    lengths = rng.integers(1, max_len + 1, n_items)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    tokens = rng.integers(0, 50_000, int(lengths.sum())).astype(np.int32)
    labels = np.where(rng.random(tokens.size) < 0.5, tokens, -100).astype(np.int32)
    row = first_fit_decreasing(lengths, max_len)
    order, row_starts = plan_rows(row, lengths)
    return tokens, labels, offsets, lengths, order, row_starts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gather_numba_and_numpy_identical(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(seed)
    max_len = 64
    tokens, labels, offsets, lengths, order, row_starts = _random_plan(rng, 500, max_len)
    n_rows = row_starts.size - 1
    rows = rng.permutation(n_rows)
    docs = np.arange(lengths.size, dtype=np.int64) * 7
    chunks = np.zeros(lengths.size, np.int32)
    plan = RowPlan(offsets, lengths, docs, chunks, order, row_starts)
    args = (tokens, plan, rows, max_len, 3)
    fast = gather_rows(*args, labels=labels)
    monkeypatch.setenv("PACKTOOL_NO_NUMBA", "1")
    slow = gather_rows(*args, labels=labels)
    for name in (
        "input_ids",
        "position_ids",
        "labels",
        "cu_values",
        "cu_offsets",
        "num_tokens",
        "doc_ids",
        "chunk_ids",
        "seg_offsets",
    ):
        assert np.array_equal(getattr(fast, name), getattr(slow, name)), name
    # And both equal a plain loop.
    for r, plan_row in enumerate(rows):
        items = order[row_starts[plan_row] : row_starts[plan_row + 1]]
        expect = np.concatenate([tokens[offsets[i] : offsets[i] + lengths[i]] for i in items])
        n = expect.size
        assert np.array_equal(fast.input_ids[r, :n], expect)
        assert np.all(fast.input_ids[r, n:] == 3)
        assert fast.num_tokens[r] == n
        expect_lab = np.concatenate([labels[offsets[i] : offsets[i] + lengths[i]] for i in items])
        assert np.array_equal(fast.labels[r, :n], expect_lab)
        assert np.all(fast.labels[r, n:] == -100)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 300), min_size=1, max_size=60),
    st.integers(0, 2**32 - 1),
    st.booleans(),
)
def test_store_reader_matches_the_array(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], seed: int, with_labels: bool
) -> None:
    """Ranges read with pread (coalesced, in file order) equal slices of the whole store."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 50_000, sum(sizes) + 1).astype(np.int32)
    labels = rng.integers(-100, 50_000, tokens.size).astype(np.int32)
    with TokenStore(tmp_path_factory.mktemp("store") / "o", with_labels=with_labels) as store:
        store.start()
        for piece in np.array_split(np.arange(tokens.size), 3):
            store.append(tokens[piece], labels[piece] if with_labels else None)
        n = int(rng.integers(0, 40))
        starts = rng.integers(0, tokens.size, n)
        lengths = rng.integers(0, tokens.size - starts + 1)  # overlapping and empty ranges too
        with store.reader() as reader:
            got, got_labels, offsets = reader.read_ranges(starts, lengths)
    assert (got_labels is not None) == with_labels
    for k in range(n):
        a, b = int(starts[k]), int(starts[k] + lengths[k])
        assert np.array_equal(got[offsets[k] : offsets[k] + lengths[k]], tokens[a:b])
        if with_labels:
            assert np.array_equal(got_labels[offsets[k] : offsets[k] + lengths[k]], labels[a:b])


def test_gather_from_the_store_equals_gather_from_the_array(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    max_len = 64
    tokens, labels, offsets, lengths, order, row_starts = _random_plan(rng, 400, max_len)
    rows = rng.permutation(row_starts.size - 1)[:17]
    docs = np.arange(lengths.size, dtype=np.int64)
    chunks = np.zeros(lengths.size, np.int32)
    with TokenStore(tmp_path / "o", with_labels=True) as store:
        store.start()
        store.append(tokens, labels)
        with store.reader() as reader:
            args = (RowPlan(offsets, lengths, docs, chunks, order, row_starts), rows, max_len, 0)
            from_store = gather_rows(reader, *args)
    from_array = gather_rows(tokens, *args, labels=labels)
    for name in ("input_ids", "position_ids", "labels", "cu_values", "doc_ids"):
        assert np.array_equal(getattr(from_store, name), getattr(from_array, name)), name


def test_gather_keeps_memory_bounded(tmp_path: Path) -> None:
    """Gathering reads only what a block needs: no map of the store stays resident."""
    out = tmp_path / "o"
    store = TokenStore(out)
    store.start()
    store.append(np.arange(4_000_000, dtype=np.int32))  # 16 MB
    with store.reader() as reader:
        got, _, offsets = reader.read_ranges(np.array([0, 3_999_990]), np.array([3, 10]))
        assert got.nbytes <= 13 * 4
        assert got[offsets[1]] == 3_999_990
    maps = Path("/proc/self/maps")
    if maps.exists():
        assert str(store.path) not in maps.read_text()
    store.close()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 70), min_size=1, max_size=40), st.integers(0, 2**32 - 1))
def test_the_three_copy_paths_are_identical(sizes: list[int], seed: int) -> None:
    """The numba kernel, the slice loop and the vectorised NumPy copy fill the same arrays."""
    from packtool import gather

    rng = np.random.default_rng(seed)
    lens = np.array(sizes, np.int64)
    tokens = rng.integers(0, 1000, int(lens.sum()) + 5).astype(np.int32)
    labels = rng.integers(-100, 1000, tokens.size).astype(np.int32)
    src = rng.integers(0, tokens.size - lens + 1)  # ranges anywhere, overlapping too
    dest = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    outs = []
    copies = [gather._copy_slices, gather._copy_numpy]
    kernel = gather._kernel()
    if kernel is not None:
        copies.append(lambda c: kernel(*c))
    for copy in copies:
        ids = np.full(int(lens.sum()), -1, np.int32)
        pos, lab = ids.copy(), ids.copy()
        copy(gather._Copy(tokens, src.astype(np.int64), lens, dest, labels, ids, pos, lab))
        outs.append((ids, pos, lab))
    expect_ids = np.concatenate(
        [tokens[a : a + n] for a, n in zip(src, lens, strict=True)] + [np.zeros(0, np.int32)]
    )
    expect_pos = np.concatenate([np.arange(n) for n in lens] + [np.zeros(0, np.int64)])
    for ids, pos, lab in outs:
        assert np.array_equal(ids, expect_ids)
        assert np.array_equal(pos, expect_pos)
        assert np.array_equal(
            lab,
            np.concatenate(
                [labels[a : a + n] for a, n in zip(src, lens, strict=True)]
                + [np.zeros(0, np.int32)]
            ),
        )


def test_small_runs_do_not_load_numba(tmp_path: Path) -> None:
    """Packing a small corpus uses the NumPy FFD and slice copies: numba is never imported."""
    corpus, out = str(SAMPLE), str(tmp_path / "o")
    code = (
        "import sys, packtool\n"
        f"packtool.pack([{corpus!r}], {out!r}, max_len=4096)\n"
        "print('numba' in sys.modules)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_ffd_backend_by_size(monkeypatch: pytest.MonkeyPatch) -> None:
    from packtool import packing

    monkeypatch.delenv("PACKTOOL_NO_NUMBA", raising=False)
    monkeypatch.setattr(packing, "_KERNEL", [])  # as in a fresh process
    assert packing._ffd_backend(10) == "python"
    assert packing._KERNEL == []  # deciding did not load anything
    big = packing._ffd_backend(packing.NUMBA_MIN_ITEMS)
    assert big == ("numba" if packing._KERNEL[0] is not None else "python")
    assert packing._ffd_backend(10) == big  # once loaded, used for any size


def _reference_encode(tok, texts: list[str], add_eos: bool, bos: bool | None):
    out = []
    for t in texts:
        ids = tok.encode_batch([t], add_special_tokens=bos is None)[0]
        content = len(ids) - (tok.num_special_tokens_to_add() if bos is None else 0)
        if content <= 0:
            out.append(None)
            continue
        if bos:
            ids = [tok.special.bos_id, *ids]
        if add_eos and ids[-1] != tok.special.eos_id:
            ids = [*ids, tok.special.eos_id]
        out.append(ids)
    return out


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(st.text(alphabet="ab\x00\x01 ", max_size=6), max_size=8),
    add_eos=st.booleans(),
    bos=st.sampled_from([None, True, False]),
    post=st.booleans(),
)
def test_encoder_finish_matches_reference(texts, add_eos, bos, post) -> None:
    # "\x00" - 3 never occurs as a code point; chr(0) encodes to id 3. We add texts ending in
    # the EOS id by using a tokenizer whose EOS is the id of "a".
    tok = CharTokenizer(bos_in_post_processor=post)
    got = DocumentEncoder(tok, add_eos=add_eos, bos=bos).encode(texts)
    expect = _reference_encode(tok, texts, add_eos, bos)
    assert got.empty.tolist() == [e is None for e in expect]
    flat = [t for e in expect if e is not None for t in e]
    assert got.ids.tolist() == flat
    assert got.lengths.tolist() == [0 if e is None else len(e) for e in expect]


def _hf_with_bos_post_processor():
    """The bundled tokenizer, with a post-processor that puts <|bos|> first (as Llama's)."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers.processors import TemplateProcessing

    base = packtool.load_tokenizer()
    rust = RustTokenizer.from_str(base.tokenizer.to_str())
    rust.post_processor = TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A $B", special_tokens=[("<|bos|>", 2)]
    )
    return packtool.HFTokenizer(rust, name="bos-post", json_bytes=rust.to_str().encode())


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(
        st.lists(st.sampled_from(["", "ab", " x", "é", "<|endoftext|>", "<|bos|>"]), max_size=4),
        max_size=8,
    ).map(lambda docs: ["".join(d) for d in docs]),
    add_eos=st.booleans(),
    bos=st.sampled_from([None, True, False]),
    post=st.booleans(),
)
def test_encoder_finish_on_hf_encodings_matches_reference(texts, add_eos, bos, post) -> None:
    # The Hugging Face path reads ids from tokenizers' Encoding objects one at a time and
    # inserts BOS/EOS with NumPy; the reference works on one plain list per document. Texts
    # may be empty, end in the EOS token, or be only a special token.
    tok = _hf_with_bos_post_processor() if post else packtool.load_tokenizer()
    encoder = DocumentEncoder(tok, add_eos=add_eos, bos=bos)
    assert type(encoder.tokenize(texts or ["a"])).__name__ == "_Encodings"
    got = encoder.encode(texts)
    expect = _reference_encode(tok, texts, add_eos, bos)
    assert got.empty.tolist() == [e is None for e in expect]
    assert got.ids.tolist() == [t for e in expect if e is not None for t in e]
    assert got.lengths.tolist() == [0 if e is None else len(e) for e in expect]
    assert got.ids.dtype == np.int32


def test_encoder_does_not_double_eos() -> None:
    tok = CharTokenizer()
    tok.special = type(tok.special)(eos_id=ord("a") + 3, bos_id=2, pad_id=1)
    got = DocumentEncoder(tok).encode(["ba", "ab"])
    a, b = ord("a") + 3, ord("b") + 3
    assert got.ids.tolist() == [b, a, a, b, a]


def test_background_keeps_order_and_forwards_errors() -> None:
    assert list(_background(iter(range(100)), ahead=3)) == list(range(100))

    def failing():
        yield 1
        raise ValueError("from the thread")

    it = _background(failing())
    assert next(it) == 1
    with pytest.raises(ValueError, match="from the thread"):
        next(it)

    produced = []

    def endless():
        i = 0
        while True:
            produced.append(i)
            yield i
            i += 1

    it = _background(endless(), ahead=2)
    assert next(it) == 0
    it.close()  # the consumer stops early: the thread must stop too
    for t in threading.enumerate():
        if t.name == "packtool-stage":
            t.join(timeout=2)
    assert not any(t.name == "packtool-stage" and t.is_alive() for t in threading.enumerate())


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_store_removed_after_success_failure_and_interrupt(tmp_path: Path) -> None:
    tok = CharTokenizer()
    good = write_jsonl(tmp_path / "good.jsonl", [{"text": "x" * 50}] * 200)
    packtool.pack([good], tmp_path / "ok", max_len=64, tokenizer=tok)
    assert _leftovers(tmp_path) == []

    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text() + "{oops\n")
    with pytest.raises(packtool.BadRecordError):
        packtool.pack([bad], tmp_path / "failed", max_len=64, tokenizer=tok)
    assert _leftovers(tmp_path) == [] and not (tmp_path / "failed").exists()

    def interrupt(stage: str, done: int, total: int | None) -> None:
        if stage == "write":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        packtool.pack([good], tmp_path / "stopped", max_len=64, tokenizer=tok, progress=interrupt)
    assert _leftovers(tmp_path) == [] and not (tmp_path / "stopped").exists()


def _cli_pack(out: Path, *extra: str, env_extra: dict[str, str] | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), **(env_extra or {}))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "packtool.cli",
            "pack",
            str(SAMPLE),
            "--max-len",
            "1024",
            "-o",
            str(out),
            "-q",
            "--rows-per-shard",
            "400",
            *extra,
        ],
        check=True,
        env=env,
        cwd=REPO,
    )
    return json.loads((out / "manifest.json").read_text())


@pytest.mark.slow
def test_output_identical_across_num_proc_and_backends(tmp_path: Path) -> None:
    one = _cli_pack(tmp_path / "p1", "--num-proc", "1")
    two = _cli_pack(tmp_path / "p2", "--num-proc", "2")
    fallback = _cli_pack(tmp_path / "py", env_extra={"PACKTOOL_NO_NUMBA": "1"})
    assert len(one["shards"]) > 1
    for other in (two, fallback):
        assert [s["sha256"] for s in other["shards"]] == [s["sha256"] for s in one["shards"]]
        for s in one["shards"]:
            a = (tmp_path / "p1" / s["file"]).read_bytes()
            b = (tmp_path / ("p2" if other is two else "py") / s["file"]).read_bytes()
            assert a == b
