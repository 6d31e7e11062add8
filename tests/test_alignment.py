"""``--pad-to-multiple-of N``: every segment padded with the pad id to a multiple of N, the
padded boundaries in ``cu_seqlens`` and the real ones in ``cu_seqlens_unpadded``; read by
packtool's collate and masks, TRL's padding-free collator, Megatron-Bridge's own packed
dataset and collate, megatron-core's ``PackedSeqParams``, and split the way accelerate's
context parallelism splits a batch. No pad is learned or counted as a real token."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from conftest import REPO, CharTokenizer, write_jsonl
from helpers import tiny_llama
from hypothesis import given, settings
from hypothesis import strategies as st

import packtool
from packtool.errors import OptionError
from packtool.export.run import export, verify_export
from packtool.format import IGNORE_INDEX
from packtool.gather import gather_rows
from packtool.options import PackOptions
from packtool.packing import RowPlan, aligned_lengths, first_fit_decreasing, plan_rows
from packtool.stats import dataset_stats

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

from packtool.torch import (  # noqa: E402
    PackedDataset,
    block_causal_mask,
    collate,
    flex_block_mask,
)

ALIGN = 16


def _corpus(tmp: Path, name: str, n: int = 60) -> Path:
    lines = (REPO / "sample_data" / name).read_text(encoding="utf-8").splitlines()[:n]
    path = tmp / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A text and a chat corpus, each packed plainly and aligned to ALIGN."""
    tmp = tmp_path_factory.mktemp("aligned")
    text, chat = _corpus(tmp, "corpus.jsonl"), _corpus(tmp, "chat.jsonl")
    template = REPO / "sample_data" / "chatml.jinja"
    out = {}
    for kind, src, kw in (
        ("text", text, {"max_len": 512, "shuffle": False}),
        ("chat", chat, {"max_len": 256, "chat_template": template}),
    ):
        packtool.pack([src], tmp / kind, **kw)
        packtool.pack([src], tmp / f"{kind}-aligned", pad_to_multiple_of=ALIGN, **kw)
        out[kind], out[f"{kind}-aligned"], out[f"{kind}-src"] = (
            tmp / kind,
            tmp / f"{kind}-aligned",
            src,
        )
    return out


def _segments(out: Path) -> dict[tuple[int, int], np.ndarray]:
    """Every document segment's real tokens, by (doc, chunk)."""
    reader = packtool.open_packed(out)
    found = {}
    for r in range(reader.num_rows):
        row = reader[r]
        for s in row.segments:
            if not s.is_padding:
                found[(s.doc_id, s.chunk_id)] = row.input_ids[s.start : s.end].copy()
    return found


def _sha(out: Path) -> list[str]:
    return [s["sha256"] for s in json.loads((out / "manifest.json").read_text())["shards"]]


# -- the rows --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["text", "chat"])
def test_aligned_rows_hold_the_same_documents_padded(packs: dict[str, Path], kind: str) -> None:
    plain, aligned = packs[kind], packs[f"{kind}-aligned"]
    reader = packtool.open_packed(aligned)
    pad = reader.manifest.tokenizer.special.pad_id
    assert reader.manifest.pad_to_multiple_of == ALIGN
    assert "cu_seqlens_unpadded" in reader.manifest.columns
    assert "cu_seqlens_unpadded" not in packtool.open_packed(plain).manifest.columns
    # the documents, token for token, are those of the plain pack
    assert {k: v.tolist() for k, v in _segments(aligned).items()} == {
        k: v.tolist() for k, v in _segments(plain).items()
    }
    padded_some = False
    for r in range(reader.num_rows):
        row = reader[r]
        cu, real = row.cu_seqlens.astype(np.int64), row.cu_seqlens_unpadded.astype(np.int64)
        assert cu.shape == real.shape and (np.diff(cu) % ALIGN == 0).all()
        assert real[0] == 0 and real[len(row.doc_ids)] == row.num_tokens == real[-1]
        for i, s in enumerate(row.segments):
            if s.is_padding:
                assert real[i + 1] == real[i]  # the tail holds no real token
                assert (row.input_ids[s.start :] == pad).all()
                assert (row.position_ids[s.start :] == np.arange(s.length)).all()
                continue
            assert s.length == real[i + 1] - real[i] >= 1
            assert s.pad == -(-s.length // ALIGN) * ALIGN - s.length
            padded_some |= s.pad > 0
            # positions continue through the document's alignment pad
            span = np.arange(s.start, s.padded_end)
            assert (row.position_ids[span] == span - s.start).all()
            assert (row.input_ids[s.end : s.padded_end] == pad).all()
            if row.labels is not None:
                assert (row.labels[s.end : s.padded_end] == IGNORE_INDEX).all()
        # seq_lengths: each document's real length, then one 1 per pad (its own, the tail's)
        want: list[int] = []
        for s in row.segments:
            want += ([s.length] + [1] * s.pad) if not s.is_padding else [1] * s.length
        assert row.seq_lengths.tolist() == want and sum(want) == reader.max_len
    assert padded_some
    assert packtool.verify(aligned).ok
    report = packtool.verify(aligned, against=[packs[f"{kind}-src"]])
    assert report.ok, report.problems
    assert report.tokens == packtool.verify(plain).tokens  # no pad counted as a real token


def test_ffd_packs_the_padded_lengths(packs: dict[str, Path]) -> None:
    reader = packtool.open_packed(packs["text-aligned"])
    lengths = np.array([len(v) for v in _segments(packs["text"]).values()])
    rows = first_fit_decreasing(aligned_lengths(lengths, ALIGN), reader.max_len)
    assert reader.num_rows == int(rows.max()) + 1
    stats = dataset_stats(packs["text-aligned"])
    assert stats.alignment is not None
    pad = sum(s.pad for r in range(reader.num_rows) for s in reader[r].segments)
    assert stats.alignment.pad_tokens == pad > 0
    assert stats.alignment.rows == reader.num_rows
    assert stats.alignment.rows_unaligned == packtool.open_packed(packs["text"]).num_rows
    assert stats.packing.tokens == int(lengths.sum())
    assert dataset_stats(packs["text"]).alignment is None


def test_without_the_option_the_rows_are_the_same_bytes(tmp_path: Path) -> None:
    src = _corpus(tmp_path, "corpus.jsonl", 40)
    packtool.pack([src], tmp_path / "a", max_len=256)
    packtool.pack([src], tmp_path / "b", max_len=256, pad_to_multiple_of=1)
    assert _sha(tmp_path / "a") == _sha(tmp_path / "b")
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert "pad_to_multiple_of" not in manifest["options"]
    assert "cu_seqlens_unpadded" not in manifest["columns"]


def test_max_len_must_be_a_multiple(tmp_path: Path) -> None:
    with pytest.raises(OptionError) as e:
        PackOptions(max_len=1000, pad_to_multiple_of=64)
    assert str(e.value) == (
        "--max-len 1000 is not a multiple of --pad-to-multiple-of 64: use --max-len 1024 or 960"
    )
    with pytest.raises(OptionError, match="--pad-to-multiple-of must be an integer"):
        PackOptions(max_len=1024, pad_to_multiple_of=0)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    align=st.sampled_from([2, 3, 4, 8]),
    rows_of=st.integers(6, 12),
    labelled=st.booleans(),
)
def test_gather_aligns_every_segment(
    lengths: list[int], align: int, rows_of: int, labelled: bool
) -> None:
    """For any lengths: each row's segments, padded, tile the row; the tokens, positions,
    labels and boundaries are those of the unaligned rows with each pad inserted."""
    max_len = rows_of * align * 2
    lens = np.minimum(np.array(lengths, np.int64), max_len)
    tokens = np.arange(1, int(lens.sum()) + 1, dtype=np.int32) % 1000 + 1
    offsets = np.concatenate([[0], np.cumsum(lens)[:-1]])
    labels = np.where(tokens % 3 == 0, IGNORE_INDEX, tokens).astype(np.int32) if labelled else None
    spans = aligned_lengths(lens, align)
    order, starts = plan_rows(first_fit_decreasing(spans, max_len), spans)
    plan = RowPlan(
        offsets, lens, np.arange(lens.size), np.zeros(lens.size, np.int32), order, starts
    )
    b = gather_rows(tokens, plan, np.arange(plan.n_rows), max_len, 0, labels, align=align)
    for r in range(plan.n_rows):
        items = order[starts[r] : starts[r + 1]]
        cu = b.cu_values[b.cu_offsets[r] : b.cu_offsets[r + 1]]
        real = b.cu_unpadded[b.cu_offsets[r] : b.cu_offsets[r + 1]]
        used = int(spans[items].sum())
        assert cu.tolist() == [0, *np.cumsum(spans[items]).tolist()] + (
            [max_len] if used < max_len else []
        )
        assert real.tolist()[: items.size + 1] == [0, *np.cumsum(lens[items]).tolist()]
        assert b.num_tokens[r] == lens[items].sum()
        at = 0
        for i in items:
            n, span = int(lens[i]), int(spans[i])
            doc = tokens[offsets[i] : offsets[i] + n]
            assert b.input_ids[r, at : at + n].tolist() == doc.tolist()
            assert (b.input_ids[r, at + n : at + span] == 0).all()
            assert b.position_ids[r, at : at + span].tolist() == list(range(span))
            if labels is not None:
                assert (
                    b.labels[r, at : at + n].tolist()
                    == labels[offsets[i] : offsets[i] + n].tolist()
                )
                assert (b.labels[r, at + n : at + span] == IGNORE_INDEX).all()
            at += span
        assert (b.input_ids[r, at:] == 0).all()
        assert b.position_ids[r, at:].tolist() == list(range(max_len - at))


def _rewrite(out: Path, mutate: Any) -> None:
    """Change one shard's rows, and record its new bytes and sha256 (only the row checks
    can catch it)."""
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["shards"][0]
    path = out / entry["file"]
    with pa.memory_map(str(path)) as f:
        table = pa.ipc.open_stream(f).read_all()
    rows = table.to_pylist()
    mutate(rows)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(pa.Table.from_pylist(rows, schema=table.schema))
    entry["bytes"] = path.stat().st_size
    entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest))


def _multi(rows: list[dict]) -> dict:
    return next(
        r
        for r in rows
        if len(r["doc_ids"]) >= 2
        and r["cu_seqlens_unpadded"][1] % 4
        and r["cu_seqlens_unpadded"][1] > 4
    )


@pytest.mark.parametrize("damage", ["unpadded", "pad token", "extra pad"])
def test_verify_finds_a_broken_aligned_row(tmp_path: Path, damage: str) -> None:
    records = [{"text": "x" * n} for n in (5, 9, 7, 13, 2, 11, 6, 3)]
    src = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out"
    packtool.pack(
        [src], out, max_len=32, pad_to_multiple_of=4, tokenizer=CharTokenizer(), shuffle=False
    )
    assert packtool.verify(out).ok

    def mutate(rows: list[dict]) -> None:
        row = _multi(rows)
        if damage == "unpadded":
            row["cu_seqlens_unpadded"][1] -= 1  # the first document one token shorter
        elif damage == "pad token":
            row["input_ids"][row["cu_seqlens_unpadded"][1]] = 7  # a token in its alignment pad
        else:  # a document padded past the least multiple
            row["cu_seqlens_unpadded"][1] -= 4
            row["input_ids"][row["cu_seqlens_unpadded"][1] : row["cu_seqlens"][1]] = [0] * (
                row["cu_seqlens"][1] - row["cu_seqlens_unpadded"][1]
            )

    _rewrite(out, mutate)
    report = packtool.verify(out)
    expected = {
        "unpadded": {"cu_seqlens_unpadded", "padding", "seq_lengths"},
        "pad token": {"padding"},
        "extra pad": {"cu_seqlens_unpadded"},
    }[damage]
    assert not report.ok and expected & set(report.problem_counts), report.problems


# -- the training side -----------------------------------------------------------------------


def _several(out: Path, k: int = 3) -> list[int]:
    reader = packtool.open_packed(out)
    rows = sorted(range(len(reader)), key=lambda i: -len(reader[i].doc_ids))
    return sorted(rows[:k])


def _max_document_diff(model: Any, out: Path, rows: list[int], logits: Any) -> float:
    """Max |logit difference| of every document's real tokens, in the batch vs alone."""
    reader = packtool.open_packed(out)
    worst = 0.0
    with torch.no_grad():
        for b, index in enumerate(rows):
            row = reader[index]
            for s in row.segments:
                if s.is_padding:
                    continue
                doc = torch.tensor(row.input_ids[s.start : s.end], dtype=torch.long)
                alone = model(input_ids=doc[None], use_cache=False).logits[0]
                worst = max(worst, float((logits[b, s.start : s.end] - alone).abs().max()))
    return worst


@pytest.mark.parametrize("kind", ["text", "chat"])
def test_collate_and_masks_learn_no_alignment_pad(packs: dict[str, Path], kind: str) -> None:
    out = packs[f"{kind}-aligned"]
    ds = PackedDataset(out)
    reader = ds.reader
    rows = _several(out)
    batch = collate([ds[i] for i in rows])
    learned = 0
    for b, index in enumerate(rows):
        row = reader[index]
        source = row.labels if row.labels is not None else row.input_ids
        want = np.full(reader.max_len, IGNORE_INDEX, np.int64)
        for s in row.segments:
            if not s.is_padding:
                want[s.start + 1 : s.end] = source[s.start + 1 : s.end]
        assert batch["labels"][b].tolist() == want.tolist()
        learned += int((want[1:] != IGNORE_INDEX).sum())
    assert batch["num_learned_tokens"] == learned
    # the same from rows of datasets.load_from_disk (they carry cu_seqlens_unpadded)
    hf = datasets.load_from_disk(str(out))
    assert torch.equal(collate([hf[i] for i in rows])["labels"], batch["labels"])

    L = reader.max_len
    model = tiny_llama(reader.vocab_size).eval()
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        default = model(**inputs).logits  # transformers' own packed mask, from position_ids
        mask = block_causal_mask(batch["cu_seq_lens_q"], L)
        sdpa = model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            attention_mask=mask,
            use_cache=False,
        ).logits
    assert _max_document_diff(model, out, rows, default) < 1e-5
    assert _max_document_diff(model, out, rows, sdpa) < 1e-5
    flex = tiny_llama(reader.vocab_size, "flex_attention").eval()
    with torch.no_grad():
        logits = flex(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            attention_mask=flex_block_mask(batch["cu_seq_lens_q"], L),
            use_cache=False,
        ).logits
    assert _max_document_diff(flex, out, rows, logits) < 1e-4
    # FlashAttention's varlen inputs: the padded boundaries, each a multiple of ALIGN
    cu = batch["cu_seq_lens_q"]
    assert (torch.diff(cu) % ALIGN == 0).all() and batch["max_length_q"] == int(
        torch.diff(cu).max()
    )


@pytest.mark.parametrize("kind", ["text", "chat"])
def test_trl_padding_free_learns_no_alignment_pad(
    packs: dict[str, Path], kind: str, tmp_path: Path
) -> None:
    """TRL's padding-free collator reads seq_lengths: it masks the first label of every
    sequence, so each alignment pad, a sequence of one, is never learned; the documents are
    computed as if alone and the labels are packtool's."""
    trl = pytest.importorskip("trl")
    out = packs[f"{kind}-aligned"]
    reader = packtool.open_packed(out)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))
    tokenizer.pad_token_id = reader.manifest.tokenizer.special.pad_id
    datasets.disable_caching()
    try:
        trainer = trl.SFTTrainer(
            tiny_llama(reader.vocab_size),
            trl.SFTConfig(
                output_dir=str(tmp_path / "run"),
                max_steps=1,
                per_device_train_batch_size=3,
                bf16=False,
                report_to=[],
                save_strategy="no",
                padding_free=True,
                max_length=None,
            ),
            train_dataset=datasets.load_from_disk(str(out)),
            processing_class=tokenizer,
        )
    finally:
        datasets.enable_caching()
    rows = _several(out)
    kept = trainer._remove_unused_columns(trainer.train_dataset, "training")
    batch = trainer.data_collator([kept[i] for i in rows])
    L = reader.max_len
    ours = collate([datasets.load_from_disk(str(out))[i] for i in rows])
    assert torch.equal(batch["labels"].reshape(len(rows), L), ours["labels"])
    model = trainer.model.eval()
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits
    assert _max_document_diff(model, out, rows, logits.reshape(len(rows), L, -1)) < 1e-5


# -- Megatron-Bridge and megatron-core -------------------------------------------------------


def _bridge(name: str) -> Any:
    """A module of Megatron-Bridge (installed --no-deps), imported without its package's
    ``__init__``: that one imports the model converters, which need Transformer Engine;
    the packed dataset, its collate and packed_seq_utils need only torch, datasets and
    megatron-core."""
    if "megatron.bridge" not in sys.modules or not hasattr(
        sys.modules["megatron.bridge"], "__path__"
    ):
        spec = importlib.util.find_spec("megatron.bridge")
        assert spec is not None and spec.submodule_search_locations, (
            "pip install --no-deps megatron-bridge"
        )
        package = types.ModuleType("megatron.bridge")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["megatron.bridge"] = package
    return importlib.import_module(f"megatron.bridge.{name}")


@pytest.mark.parametrize("kind", ["text", "chat"])
def test_megatron_bridge_reads_the_aligned_export(
    packs: dict[str, Path], kind: str, tmp_path: Path
) -> None:
    """Their own GPTSFTPackedDataset and collate_fn with pad_seq_to_mult, then their
    get_packed_seq_params into megatron-core's PackedSeqParams: the padded boundaries are
    packtool's cu_seqlens, every sequence a multiple of N, the real lengths (theirs: up to
    the last token that is not EOS) within them, and the targets their mask keeps are
    exactly the tokens packtool's collate learns."""
    from megatron.core.packed_seq_params import PackedSeqParams

    sft = _bridge("data.datasets.sft")
    tokenizers = _bridge("training.tokenizers.tokenizer")
    packed_seq_utils = _bridge("training.utils.packed_seq_utils")
    out = packs[f"{kind}-aligned"]
    reader = packtool.open_packed(out)
    L = reader.max_len
    record = export(out, tmp_path / "mb", to="megatron-bridge", npy=True).record
    assert record["pad_seq_to_mult"] == ALIGN
    assert verify_export(out, tmp_path / "mb").problems == []
    tokenizer = tokenizers._HuggingFaceTokenizer(str(out))
    eos = reader.manifest.tokenizer.special.eos_id
    assert tokenizer.eos_id == eos
    dataset = sft.create_sft_dataset(
        tmp_path / "mb" / f"training_{L}.npy",
        tokenizer,
        seq_length=L,
        pad_to_max_length=True,
        pad_seq_to_mult=ALIGN,
    )
    assert len(dataset) == reader.num_rows
    ds = PackedDataset(out)
    for index in _several(out, 4):
        batch = dataset.collate_fn([dataset[index]])
        row = reader[index]
        docs = [s for s in row.segments if not s.is_padding]
        cu = batch["cu_seqlens"][0]
        cu = cu[: int(batch["cu_seqlens_argmin"][0])].tolist()
        assert cu == row.cu_seqlens.tolist()  # the padded boundaries, the tail's too
        assert all(c % ALIGN == 0 for c in cu)
        params = packed_seq_utils.get_packed_seq_params(batch)
        assert isinstance(params, PackedSeqParams) and params.qkv_format == "thd"
        assert params.cu_seqlens_q_padded.tolist() == row.cu_seqlens.tolist()
        q = params.cu_seqlens_q.tolist()
        assert len(q) == len(cu)
        for i, s in enumerate(docs):
            ends_eos = int(row.input_ids[s.end - 1]) == eos
            assert q[i + 1] - q[i] == s.length - ends_eos  # their unpadded: EOS stripped
        # their targets: their labels where their loss_mask is 1; packtool's label at t + 1
        # is what position t learns (their collate also never learns after an EOS input)
        keep = batch["loss_mask"][0].bool()
        theirs = torch.where(keep, batch["labels"][0], IGNORE_INDEX)
        ours = torch.full((L,), IGNORE_INDEX, dtype=torch.long)
        ours[:-1] = ds[index]["labels"][1:]
        ours[batch["tokens"][0] == eos] = IGNORE_INDEX
        assert torch.equal(theirs, ours)
        assert (ours != IGNORE_INDEX).any()
        used = docs[-1].padded_end
        assert batch["position_ids"][0][:used].tolist() == row.position_ids[:used].tolist()
        assert batch["tokens"][0][:used].tolist() == [
            eos if not any(s.start <= t < s.end for s in docs) else int(row.input_ids[t])
            for t in range(used)
        ]


def test_bridge_export_without_alignment_is_unchanged(
    packs: dict[str, Path], tmp_path: Path
) -> None:
    record = export(packs["text"], tmp_path / "mb", to="megatron-bridge").record
    assert "pad_seq_to_mult" not in record


# -- context parallelism ---------------------------------------------------------------------


def _head_tail_shards(tensor: Any, cp: int) -> list[Any]:
    """``tensor`` [B, L] split as accelerate's context parallelism splits a batch: torch's
    load balancer for causal attention (``_HeadTailLoadBalancer``: chunks i and 2cp-1-i to
    rank i), then ``Shard(1)`` over the cp ranks."""
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
        _create_default_load_balancer,
    )

    balancer = _create_default_load_balancer(tensor.shape[1], cp, "cpu")
    assert balancer is not None  # torch balances only lengths divisible by 2 * cp
    index = balancer._generate_indices()[0]
    return list(torch.index_select(tensor, 1, index).chunk(cp, dim=1))


@pytest.mark.parametrize("cp", [2, 4])
def test_collate_for_context_parallel_shards(packs: dict[str, Path], cp: int) -> None:
    out = packs["text-aligned"]
    ds = PackedDataset(out)
    rows = [ds[i] for i in _several(out)]
    with pytest.raises(OptionError, match=r"row \d+ holds \d+ documents: under context"):
        collate(rows, cp_size=cp)  # causal attention over the whole row: refused by default
    batch = collate(rows, cp_size=cp, cross_document_attention=True)
    assert "cu_seq_lens_q" not in batch and "max_length_q" not in batch
    L = ds.max_len
    labels = batch["labels"]
    assert torch.equal(batch["shift_labels"][:, :-1], labels[:, 1:])
    assert (batch["shift_labels"][:, -1] == IGNORE_INDEX).all()
    index = torch.arange(L).expand(len(rows), L)
    shards = {
        key: _head_tail_shards(batch[key], cp)
        for key in ("input_ids", "position_ids", "shift_labels")
    }
    where = _head_tail_shards(index, cp)
    for rank in range(cp):
        g = where[rank]  # the global slot of each token of this rank's shard
        assert g.shape[1] == L // cp
        for b in range(len(rows)):
            cu = rows[b]["cu_seqlens"].long()
            start = cu[torch.searchsorted(cu, g[b], right=True) - 1]
            # every token keeps its position in its own document
            assert torch.equal(shards["position_ids"][rank][b], g[b] - start)
            assert torch.equal(shards["input_ids"][rank][b], batch["input_ids"][b, g[b]])
            # and learns its true successor, whatever shard that one is on
            nxt = (g[b] + 1).clamp(max=L - 1)
            want = torch.where(g[b] + 1 < L, labels[b, nxt], IGNORE_INDEX)
            assert torch.equal(shards["shift_labels"][rank][b], want)
    with pytest.raises(OptionError, match="multiple of 1024"):
        collate(rows, cp_size=512)


def test_collate_for_context_parallel_takes_rows_of_one_document() -> None:
    """A row of one document (and its padding) is exact under causal attention over the
    whole row: no flag needed; the shifted labels are the row's."""
    L = 16
    ids = torch.arange(100, 100 + L)
    one = {"input_ids": ids, "position_ids": torch.arange(L), "cu_seqlens": [0, 12, L]}
    batch = collate([{**one, "num_tokens": 12}], cp_size=2)
    assert torch.equal(batch["shift_labels"][0, :10], ids[1:11])
    assert (batch["shift_labels"][0, 11:] == IGNORE_INDEX).all()
    two = {**one, "position_ids": torch.cat([torch.arange(6), torch.arange(10)])}
    with pytest.raises(OptionError, match="row 0 holds 2 documents"):
        collate([{**two, "cu_seqlens": [0, 6, L], "num_tokens": L}], cp_size=2)


def test_megatron_export_holds_no_alignment_pad(packs: dict[str, Path], tmp_path: Path) -> None:
    """A Megatron-LM indexed dataset holds documents, not rows: the aligned pack's is the
    plain pack's, byte for byte."""
    for kind in ("text", "text-aligned"):
        export(packs[kind], tmp_path / kind, to="megatron")
        assert verify_export(packs[kind], tmp_path / kind).problems == []
    for name in sorted(
        p.name for p in (tmp_path / "text").iterdir() if p.suffix in (".bin", ".idx")
    ):
        assert (tmp_path / "text" / name).read_bytes() == (
            tmp_path / "text-aligned" / name
        ).read_bytes()


def test_litdata_items_of_an_aligned_pack_collate_as_its_rows(
    packs: dict[str, Path], tmp_path: Path
) -> None:
    litdata = pytest.importorskip("litdata")
    out = packs["chat-aligned"]
    export(out, tmp_path / "ld", to="litdata")
    assert verify_export(out, tmp_path / "ld").problems == []
    items = litdata.StreamingDataset(str(tmp_path / "ld"))
    reader = packtool.open_packed(out)
    rows = _several(out)
    for i in rows:
        assert items[i]["cu_seqlens_unpadded"].tolist() == reader[i].cu_seqlens_unpadded.tolist()
        assert items[i]["seq_lengths"].tolist() == reader[i].seq_lengths.tolist()
    ds = PackedDataset(out)
    assert torch.equal(
        collate([items[i] for i in rows])["labels"], collate([ds[i] for i in rows])["labels"]
    )


def test_stats_of_a_corpus_says_what_alignment_would_cost(tmp_path: Path) -> None:
    """`stats CORPUS --max-len L --pad-to-multiple-of N` gives the figures of the aligned pack
    (rows, tokens, the alignment pad and the rows without it), without packing; a max-len that
    is not a multiple is the pack's one-line error."""
    from packtool.stats import corpus_stats

    src = REPO / "sample_data" / "corpus.jsonl"
    packtool.pack([src], tmp_path / "o", max_len=256, pad_to_multiple_of=32)
    packed = dataset_stats(tmp_path / "o")
    what_if = corpus_stats([src], [256, 512], pad_to_multiple_of=32, use_cache=False)
    got, want = what_if.results[0], packed.packing
    assert (got.rows, got.tokens, got.segments) == (want.rows, want.tokens, want.segments)
    assert got.alignment == packed.alignment and got.alignment.pad_tokens > 0
    assert got.alignment.rows_unaligned < got.rows
    assert (
        "alignment" in got.to_dict()
        and "alignment" not in corpus_stats([src], [256]).results[0].to_dict()
    )
    assert got.figures()[-1][0] == "alignment pad (--pad-to-multiple-of 32)"
    with pytest.raises(OptionError, match="--max-len 300 is not a multiple of"):
        corpus_stats([src], [256, 300], pad_to_multiple_of=32, use_cache=False)


def test_stats_command_of_a_corpus_and_of_a_pack_with_alignment(tmp_path: Path) -> None:
    """The flag in corpus-mode `stats`: the cost under the table and in --json, for a corpus
    and for a pack re-cut at other max-lens; a max-len not a multiple is one line, exit 2."""
    from test_cli import assert_one_line_error, run

    src = REPO / "sample_data" / "corpus.jsonl"
    result = run("stats", src, "-L", "256,512", "--pad-to-multiple-of", "32", "--no-cache")
    assert result.exit_code == 0, result.output
    assert "alignment pad (--pad-to-multiple-of 32):" in result.output
    packtool.pack([src], tmp_path / "o", max_len=128)
    flags = ("-L", "256", "--pad-to-multiple-of", "32", "--no-cache", "--json")
    again = json.loads(run("stats", tmp_path / "o", *flags).stdout)
    fresh = json.loads(run("stats", src, *flags).stdout)
    assert again["max_lens"][0]["alignment"] == fresh["max_lens"][0]["alignment"]
    bad = run("stats", src, "-L", "300", "--pad-to-multiple-of", "32", "--no-cache")
    assert_one_line_error(bad, "--max-len 300 is not a multiple of --pad-to-multiple-of 32", 2)


def test_inspect_shows_each_segments_alignment_pad(packs: dict[str, Path]) -> None:
    """``inspect`` of an aligned pack has a ``pad`` column: each document segment's alignment
    pad, the gap between its real end and the next boundary; a plain pack has no such
    column."""
    from test_cli import run

    reader = packtool.open_packed(packs["text-aligned"])
    index = next(r for r in range(reader.num_rows) if any(s.pad for s in reader.row(r).segments))
    docs = [s for s in reader.row(index).segments if not s.is_padding]
    assert all(s.padded_end % ALIGN == 0 for s in docs)
    result = run("inspect", str(packs["text-aligned"]), "--row", str(index), "--width", "120")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    at = next(i for i, line in enumerate(lines) if "positions" in line)
    assert lines[at].split()[:7] == ["seg", "doc", "chunk", "start", "length", "pad", "positions"]
    for k, seg in enumerate(docs):
        cells = lines[at + 1 + k].split()  # the colour swatch, then the cells
        expected = [str(k), str(seg.doc_id), str(seg.chunk_id), f"{seg.start:,}"]
        expected += [f"{seg.length:,}", f"{seg.pad:,}" if seg.pad else cells[6]]
        assert cells[1:7] == expected
        assert (seg.pad == 0) == (cells[6] == f"0..{seg.length - 1}")  # no pad: positions
    plain = run("inspect", str(packs["text"]), "--row", "0", "--width", "120").output
    header = next(line for line in plain.splitlines() if "positions" in line)
    assert header.split()[:6] == ["seg", "doc", "chunk", "start", "length", "positions"]
