"""The training side (`packtool.torch`): a packed row gives the same logits as its documents run
one by one, on the CPU in float32, for every way of handing the model its attention inputs.

Documents of uneven lengths are packed by packtool's own writer into two padded rows, read back
through `PackedDataset` + `collate`, and run through tiny randomly initialised models built from
config: a Llama (RoPE, grouped-query attention) and a GPT-2 (absolute positions, which RoPE's
relative positions would hide). Negative controls show the comparison can fail.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import os
import pickle
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REPO, SAMPLE, write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st

import packtool
from packtool.errors import FormatError, OptionError
from packtool.format import PackedBatch, ShardWriter
from packtool.masks import block_causal_mask as np_block_causal_mask
from packtool.order import epoch_order, rank_share
from packtool.tokenize import SpecialTokens

if os.environ.get("CI"):
    # CI installs torch and transformers: there, a missing one is a failure, not a skip.
    import torch
    import transformers
else:
    _HINT = "pip install torch==2.13.0 && pip install -e '.[torch,test]'"
    torch = pytest.importorskip("torch", reason=_HINT)
    transformers = pytest.importorskip("transformers", reason=_HINT)

from packtool.torch import PackedDataset, block_causal_mask, collate, flex_block_mask

pytestmark = pytest.mark.torch

TOL = 1e-5  # max abs logit difference between a packed document and the document alone
LEAK = 1e-2  # a difference above this means the packed rows were not kept apart
VOCAB = 128
MAX_LEN = 32
# Document lengths before EOS; with EOS 13, 11, 9, 7, 6, 5, 2 = 53 tokens. First-fit-decreasing
# into rows of 32: [13, 11, 7] + 1 pad and [9, 6, 5, 2] + 10 pad.
DOC_LENGTHS = [6, 12, 4, 10, 1, 8, 5]


class IdTokenizer:
    """A fake tokenizer whose text is the token ids: ``"17 40 3"`` encodes to ``[17, 40, 3]``."""

    name = "id-fake"
    sha256 = "1" * 64

    def __init__(self) -> None:
        self.special = SpecialTokens(eos_id=0, bos_id=2, pad_id=1)

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = True, parse_special: bool = False
    ) -> list[list[int]]:
        return [[int(t) for t in text.split()] for text in texts]

    def num_special_tokens_to_add(self) -> int:
        return 0

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return " ".join(str(i) for i in ids)

    def token_to_id(self, token: str) -> int | None:
        return None


def pack_ids(
    tmp: Path, docs: Sequence[Sequence[int]], max_len: int, **options: Any
) -> tuple[Path, packtool.PackReport]:
    src = write_jsonl(tmp / "docs.jsonl", [{"text": " ".join(map(str, d))} for d in docs])
    out = tmp / "out"
    report = packtool.pack([src], out, max_len=max_len, tokenizer=IdTokenizer(), **options)
    return out, report


# -- the packed batch of the proof ------------------------------------------------------------


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two padded rows of uneven documents, through pack -> shards -> PackedDataset -> collate.

    ``docs[d]`` are the tokens of document ``d`` (EOS included), built here independently of the
    reader; ``placement`` lists ``(row, start, d)`` for every document in the batch.
    """
    rng = np.random.default_rng(0)
    texts = [rng.integers(3, VOCAB, n).tolist() for n in DOC_LENGTHS]
    out, report = pack_ids(tmp_path_factory.mktemp("packed"), texts, MAX_LEN, shuffle=False)
    assert report.rows == 2
    dataset = PackedDataset(out)
    rows = [dataset[i] for i in range(len(dataset))]
    assert all(r["num_tokens"] < MAX_LEN for r in rows), "both rows must have padding"
    docs = [torch.tensor([*t, 0]) for t in texts]  # EOS (id 0) appended by pack
    placement = []
    reader = packtool.open_packed(out)
    for b in range(2):
        for seg in reader.row(b).segments:
            if not seg.is_padding:
                placement.append((b, seg.start, seg.doc_id))
                got = rows[b]["input_ids"][seg.start : seg.end]
                assert torch.equal(got, docs[seg.doc_id]), seg
    assert sorted(d for _, _, d in placement) == list(range(len(DOC_LENGTHS)))
    return {"batch": collate(rows), "docs": docs, "placement": placement, "rows": rows, "out": out}


def tiny_llama() -> Any:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention
        max_position_embeddings=2 * MAX_LEN,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(
        config, attn_implementation="sdpa", dtype=torch.float32
    ).eval()


def tiny_gpt2() -> Any:
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=2 * MAX_LEN,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel._from_config(
        config, attn_implementation="sdpa", dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def model(request: pytest.FixtureRequest, packed: dict[str, Any]) -> Any:
    """A tiny model, with each document's logits run alone (SDPA, plain causal) as ``.alone``."""
    m = tiny_llama() if request.param == "llama" else tiny_gpt2()
    m.arch = request.param
    with torch.no_grad():
        m.alone = [m(input_ids=d[None], use_cache=False).logits[0] for d in packed["docs"]]
    return m


def doc_diffs(logits: Any, packed: dict[str, Any], alone: list[Any]) -> dict[int, float]:
    """Max abs difference of every document's logits, packed vs alone."""
    out = {}
    for b, start, d in packed["placement"]:
        n = len(packed["docs"][d])
        out[d] = (logits[b, start : start + n] - alone[d]).abs().max().item()
    return out


def run(model: Any, impl: str, **inputs: Any) -> Any:
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(**inputs).logits


def reference_varlen_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Any, None]:
    """What ``flash_attn_varlen_func`` computes, on the CPU: the batch flattened to ``[B * L]``
    tokens, causal attention inside each ``[cu[i], cu[i+1])`` of ``cu_seq_lens_q``. Registered
    as an attention implementation, it proves the varlen keywords of `collate` reach the
    attention layers of a real model and cut the flattened batch in the right places."""
    cu_q, cu_k = kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"]
    assert attention_mask is None
    assert cu_q.dtype == torch.int32 and torch.equal(cu_q, cu_k)
    batch, heads, length, dim = query.shape
    assert int(cu_q[-1]) == batch * length
    groups = heads // key.shape[1]
    q, k, v = (
        x.repeat_interleave(h, dim=1).transpose(1, 2).reshape(batch * length, heads, dim)
        for x, h in ((query, 1), (key, groups), (value, groups))
    )
    out = torch.empty_like(q)
    lengths = torch.diff(cu_q)
    assert int(lengths.max()) == kwargs["max_length_q"] == kwargs["max_length_k"]
    for s, e in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
        seg = [x[s:e].transpose(0, 1) for x in (q, k, v)]
        out[s:e] = torch.nn.functional.scaled_dot_product_attention(
            *seg, is_causal=True, scale=scaling
        ).transpose(0, 1)
    return out.reshape(batch, length, heads, dim), None


transformers.AttentionInterface.register("packtool_reference_varlen", reference_varlen_attention)


def _inputs(mode: str, batch: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    cu, ids, pos = batch["cu_seq_lens_q"], batch["input_ids"], batch["position_ids"]
    common = {"input_ids": ids, "position_ids": pos, "use_cache": False}
    if mode == "sdpa + bool mask":
        return "sdpa", {**common, "attention_mask": block_causal_mask(cu, MAX_LEN)}
    if mode == "eager + float mask":
        mask = block_causal_mask(cu, MAX_LEN, dtype=torch.float32)
        return "eager", {**common, "attention_mask": mask}
    if mode == "sdpa + position_ids only":
        return "sdpa", common
    if mode == "eager + position_ids only":
        return "eager", common
    if mode == "varlen keywords":
        keys = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
        return "packtool_reference_varlen", {**common, **{k: batch[k] for k in keys}}
    if mode == "flex + BlockMask":
        return "flex_attention", {**common, "attention_mask": flex_block_mask(cu, MAX_LEN)}
    raise AssertionError(mode)


@pytest.mark.parametrize(
    "mode",
    [
        "sdpa + bool mask",
        "eager + float mask",
        "sdpa + position_ids only",
        "eager + position_ids only",
        "varlen keywords",
    ],
)
def test_packed_logits_equal_documents_alone(model: Any, packed: dict[str, Any], mode: str) -> None:
    impl, inputs = _inputs(mode, packed["batch"])
    diffs = doc_diffs(run(model, impl, **inputs), packed, model.alone)
    print(f"{model.arch}, {mode}: max abs diff {max(diffs.values()):.2e}")
    assert max(diffs.values()) < TOL, diffs


@pytest.mark.slow  # compiles flex attention: 7 s warm, 20-35 s cold on 2 cores
def test_flex_block_mask_logits_equal_documents_alone(packed: dict[str, Any]) -> None:
    # GPT-2 has no flex attention in transformers; the Llama covers the BlockMask.
    llama = tiny_llama()
    with torch.no_grad():
        alone = [llama(input_ids=d[None], use_cache=False).logits[0] for d in packed["docs"]]
    impl, inputs = _inputs("flex + BlockMask", packed["batch"])
    diffs = doc_diffs(run(llama, impl, **inputs), packed, alone)
    print(f"llama, flex + BlockMask: max abs diff {max(diffs.values()):.2e}")
    assert max(diffs.values()) < TOL, diffs


def _first_in_row(packed: dict[str, Any]) -> set[int]:
    return {d for _, start, d in packed["placement"] if start == 0}


def assert_leaks(diffs: dict[int, float], packed: dict[str, Any]) -> None:
    """Documents that start a row see nothing before them; every other one must differ."""
    first = _first_in_row(packed)
    for d, diff in diffs.items():
        if d in first:
            assert diff < TOL, (d, diffs)
        else:
            assert diff > LEAK, (d, diffs)


def test_negative_control_no_position_reset_no_mask(model: Any, packed: dict[str, Any]) -> None:
    batch = packed["batch"]
    logits = run(model, "sdpa", input_ids=batch["input_ids"], use_cache=False)
    diffs = doc_diffs(logits, packed, model.alone)
    print(f"{model.arch}, control: max abs diff {max(diffs.values()):.2e}")
    assert_leaks(diffs, packed)


# -- the traps ---------------------------------------------------------------------------------


def test_trap_cache_on_turns_off_packed_detection(model: Any, packed: dict[str, Any]) -> None:
    """With the cache on (the config default, in eval), position_ids no longer separate the
    documents: pass use_cache=False."""
    assert model.config.use_cache
    batch = packed["batch"]
    logits = run(model, "sdpa", input_ids=batch["input_ids"], position_ids=batch["position_ids"])
    assert_leaks(doc_diffs(logits, packed, model.alone), packed)


def test_trap_2d_attention_mask_turns_off_packed_detection(
    model: Any, packed: dict[str, Any]
) -> None:
    """Any 2-D attention_mask, even all ones, disables packed handling; collate emits none."""
    batch = packed["batch"]
    assert "attention_mask" not in batch
    logits = run(
        model,
        "sdpa",
        input_ids=batch["input_ids"],
        position_ids=batch["position_ids"],
        attention_mask=torch.ones_like(batch["input_ids"]),
        use_cache=False,
    )
    assert_leaks(doc_diffs(logits, packed, model.alone), packed)


def test_trap_boolean_mask_is_wrong_for_eager(model: Any, packed: dict[str, Any]) -> None:
    """Eager attention adds the mask to the scores: a boolean one adds 1 and 0, masking nothing."""
    batch = packed["batch"]
    logits = run(
        model,
        "eager",
        input_ids=batch["input_ids"],
        position_ids=batch["position_ids"],
        attention_mask=block_causal_mask(batch["cu_seq_lens_q"], MAX_LEN),
        use_cache=False,
    )
    diffs = doc_diffs(logits, packed, model.alone)
    assert min(diffs.values()) > LEAK, diffs  # not even the future is masked


def test_rope_hides_wrong_positions_gpt2_does_not(model: Any, packed: dict[str, Any]) -> None:
    """The right mask with positions that do not restart: RoPE scores depend only on relative
    positions, so the Llama still matches; GPT-2's absolute positions expose the mistake. This
    is why the proof runs both."""
    batch = packed["batch"]
    logits = run(
        model,
        "sdpa",
        input_ids=batch["input_ids"],
        attention_mask=block_causal_mask(batch["cu_seq_lens_q"], MAX_LEN),
        use_cache=False,
    )
    diffs = doc_diffs(logits, packed, model.alone)
    if model.arch == "llama":
        assert max(diffs.values()) < 1e-4, diffs
    else:
        assert_leaks(diffs, packed)


def test_loss_over_packed_batch_is_sum_of_document_losses(
    model: Any, packed: dict[str, Any]
) -> None:
    """collate's labels + num_learned_tokens: the packed loss is every document's own loss, and
    the count is every document's length minus one (its first token is never a target)."""
    batch = packed["batch"]
    docs = packed["docs"]
    assert batch["num_learned_tokens"] == sum(len(d) - 1 for d in docs)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        packed_loss = model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            labels=batch["labels"],
            num_items_in_batch=torch.tensor(batch["num_learned_tokens"]),
            use_cache=False,
        ).loss
        total = sum(
            model(input_ids=d[None], labels=d[None], use_cache=False).loss * (len(d) - 1)
            for d in docs
        )
    assert packed_loss.item() == pytest.approx(total.item() / batch["num_learned_tokens"], 1e-5)


# -- cu_seq_lens and the masks, against the rows' position_ids ---------------------------------


def segments_from_positions(position_ids: Any) -> np.ndarray:
    """Segment number of every token of every row: a new segment wherever position_ids is 0."""
    pos = np.asarray(position_ids)
    return np.cumsum(pos == 0, axis=1) - 1


def test_cu_seq_lens_agree_with_positions_and_mask(packed: dict[str, Any]) -> None:
    batch = packed["batch"]
    pos = batch["position_ids"].numpy()
    b, length = pos.shape
    flat_starts = np.flatnonzero(pos.reshape(-1) == 0)
    expected_cu = [*flat_starts.tolist(), b * length]
    cu = batch["cu_seq_lens_q"]
    assert cu.dtype == torch.int32 and batch["cu_seq_lens_k"].dtype == torch.int32
    assert cu.tolist() == expected_cu == batch["cu_seq_lens_k"].tolist()
    assert batch["max_length_q"] == batch["max_length_k"] == max(np.diff(expected_cu))
    assert isinstance(batch["max_length_q"], int) and isinstance(batch["max_length_k"], int)

    seg = segments_from_positions(pos)
    causal = np.tri(length, dtype=bool)
    brute = np.stack([(s[:, None] == s[None, :]) & causal for s in seg])[:, None]
    mask = block_causal_mask(cu, length)
    assert mask.shape == (b, 1, length, length) and mask.dtype == torch.bool
    assert np.array_equal(mask.numpy(), brute)
    # the flex BlockMask allows the same (query, key) pairs, token by token
    bm = flex_block_mask(cu, length)
    q, kv = torch.meshgrid(torch.arange(length), torch.arange(length), indexing="ij")
    for row in range(b):
        allowed = bm.mask_mod(torch.tensor(row), torch.tensor(0), q, kv)
        assert np.array_equal(allowed.numpy(), brute[row, 0]), row


def test_labels_of_the_batch(packed: dict[str, Any]) -> None:
    batch = packed["batch"]
    labels, ids = batch["labels"], batch["input_ids"]
    starts = {(b, s) for b, s, _ in packed["placement"]}
    for b, row in enumerate(packed["rows"]):
        for t in range(MAX_LEN):
            if t >= row["num_tokens"] or (b, t) in starts:
                assert labels[b, t] == -100, (b, t)
            else:
                assert labels[b, t] == ids[b, t], (b, t)


# -- safe with the defaults: a default model config, Hugging Face Trainer's defaults ---------


SAFE = 1e-4  # the bound of the issue for the default setups below


def default_model(arch: str, impl: str) -> Any:
    """A tiny model whose config keeps the defaults that matter here (``use_cache=True``, as
    ``from_pretrained`` gives), without dropout so that training mode is deterministic."""
    if arch == "llama":
        config = transformers.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2 * MAX_LEN,
        )
        cls = transformers.LlamaForCausalLM
    else:
        config = transformers.GPT2Config(
            vocab_size=VOCAB,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=2 * MAX_LEN,
            bos_token_id=0,
            eos_token_id=0,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        cls = transformers.GPT2LMHeadModel
    torch.manual_seed(0)
    model = cls._from_config(config, attn_implementation=impl, dtype=torch.float32)
    assert model.config.use_cache
    return model


def alone_logits(model: Any, packed: dict[str, Any]) -> list[Any]:
    with torch.no_grad():
        return [model(input_ids=d[None], use_cache=False).logits[0] for d in packed["docs"]]


def inner_docs(packed: dict[str, Any]) -> list[int]:
    """The documents that do not start a row: a leak shows in these."""
    return [d for _, start, d in packed["placement"] if start > 0]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_model_on_collate_is_leak_free_with_a_default_config(
    packed: dict[str, Any], arch: str, impl: str, mode: str
) -> None:
    """``model(**collate(rows))``, nothing else: the batch turns the cache off itself."""
    model = default_model(arch, impl).train(mode == "train")
    alone = alone_logits(model, packed)
    batch = packed["batch"]
    assert batch["use_cache"] is False
    with torch.no_grad():
        diffs = doc_diffs(model(**batch).logits, packed, alone)
    assert max(diffs.values()) < SAFE, diffs
    # control: the same batch with the config's cache left on leaks
    with torch.no_grad():
        leaky = model(**{k: v for k, v in batch.items() if k != "use_cache"}).logits
    leaked = doc_diffs(leaky, packed, alone)
    assert all(leaked[d] > LEAK for d in inner_docs(packed)), leaked


def _logits_by_row(ids: Any, logits: Any, packed: dict[str, Any]) -> Any:
    """Reorder a batch that Trainer shuffled into the packed rows' order, by their tokens."""
    order = []
    for row in packed["rows"]:
        matches = [b for b in range(ids.shape[0]) if torch.equal(ids[b], row["input_ids"])]
        assert len(matches) == 1
        order.append(matches[0])
    return logits[order]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_trainer_with_default_arguments(
    packed: dict[str, Any], arch: str, impl: str, tmp_path: Path
) -> None:
    """The real Trainer, default TrainingArguments (remove_unused_columns=True among them):
    it trains, and the logits it computes equal every document run alone, in its training
    steps and in predict()."""
    model = default_model(arch, impl)
    model.train()
    before = alone_logits(model, packed)
    initial = [p.detach().clone() for p in model.parameters()]
    seen: list[tuple[Any, Any, dict[str, Any]]] = []

    def record(module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        if module.training:
            seen.append((kwargs["input_ids"].detach(), output.logits.detach(), kwargs))

    handle = model.register_forward_hook(record, with_kwargs=True)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"))
    assert args.remove_unused_columns
    train = PackedDataset(packed["out"])
    trainer = transformers.Trainer(model, args, train_dataset=train, data_collator=collate)
    result = trainer.train()
    handle.remove()
    assert train.epoch == 2  # Trainer called set_epoch(0), (1), (2)
    assert result.global_step == 3  # 2 rows, batches of 8, 3 epochs
    assert math.isfinite(result.training_loss)
    assert any(not torch.equal(a, b) for a, b in zip(initial, model.parameters(), strict=True))

    ids, logits, kwargs = seen[0]  # the first step runs on the initial weights
    assert set(kwargs) >= {"labels", "position_ids", "cu_seq_lens_q", "use_cache"}
    assert kwargs["use_cache"] is False and "attention_mask" not in kwargs
    assert torch.equal(_logits_by_row(ids, kwargs["labels"], packed), packed["batch"]["labels"])
    diffs = doc_diffs(_logits_by_row(ids, logits, packed), packed, before)
    assert max(diffs.values()) < SAFE, diffs

    model.eval()
    after = alone_logits(model, packed)
    prediction = trainer.predict(PackedDataset(packed["out"]))
    diffs = doc_diffs(torch.from_numpy(prediction.predictions), packed, after)
    assert max(diffs.values()) < SAFE, diffs


@pytest.mark.slow  # compiles flex attention: tens of seconds on 2 cores
def test_flex_attention_needs_no_mask(packed: dict[str, Any], tmp_path: Path) -> None:
    """docs/training.md, hf_trainer.md: with flex attention, ``model(**collate(rows))`` as it
    is (no ``flex_block_mask``) and the real Trainer with default arguments (its ``predict``:
    flex attention has no backward on the CPU, torch 2.13) are exact: transformers builds the
    document mask from ``position_ids``."""
    model = default_model("llama", "flex_attention").eval()
    alone = alone_logits(model, packed)
    with torch.no_grad():
        diffs = doc_diffs(model(**packed["batch"]).logits, packed, alone)
    assert max(diffs.values()) < SAFE, diffs
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"))
    trainer = transformers.Trainer(model, args, data_collator=collate)
    prediction = trainer.predict(PackedDataset(packed["out"]))
    diffs = doc_diffs(torch.from_numpy(prediction.predictions), packed, alone)
    assert max(diffs.values()) < SAFE, diffs


def test_trainer_refuses_rows_it_stripped_of_their_padding(
    packed: dict[str, Any], tmp_path: Path
) -> None:
    """Rows of datasets.load_from_disk lose num_tokens and cu_seqlens to remove_unused_columns;
    without labels, the padding cannot be found: an error before the first step."""
    import datasets

    model = default_model("llama", "sdpa")
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"))
    hf_rows = datasets.load_from_disk(str(packed["out"]))
    trainer = transformers.Trainer(model, args, train_dataset=hf_rows, data_collator=collate)
    with pytest.raises(ValueError, match=r"neither num_tokens nor labels.*remove_unused_columns"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_collate_from_the_columns_trainer_keeps(packed: dict[str, Any]) -> None:
    """input_ids, position_ids and labels alone collate to the same batch as whole items."""
    kept = [{k: r[k] for k in ("input_ids", "position_ids", "labels")} for r in packed["rows"]]
    small, whole = collate(kept), packed["batch"]
    assert small.keys() == whole.keys()
    for key, value in whole.items():
        same = torch.equal(value, small[key]) if isinstance(value, torch.Tensor) else None
        assert same if same is not None else value == small[key], key


# -- collate and the masks on their own --------------------------------------------------------


def test_collate_worked_example() -> None:
    """The module docstring's two rows, written out by hand."""
    a, b, c, d, pad = [10, 11, 12], [20, 21, 22], [30, 31, 32, 33, 34], [40, 41, 42], 1
    rows = [
        {
            "input_ids": [*a, *b, pad, pad],
            "position_ids": [0, 1, 2, 0, 1, 2, 0, 1],
            "cu_seqlens": [0, 3, 6, 8],
            "num_tokens": 6,
        },
        {
            "input_ids": np.array([*c, *d], dtype=np.int32),
            "position_ids": np.array([0, 1, 2, 3, 4, 0, 1, 2], dtype=np.int32),
            "cu_seqlens": np.array([0, 5, 8], dtype=np.int32),
            "num_tokens": 8,
        },
    ]
    batch = collate(rows)
    assert batch["input_ids"].dtype == torch.int64 and batch["input_ids"].shape == (2, 8)
    assert batch["labels"].tolist() == [
        [-100, 11, 12, -100, 21, 22, -100, -100],
        [-100, 31, 32, 33, 34, -100, 41, 42],
    ]
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 6, 8, 13, 16]
    assert batch["max_length_q"] == batch["max_length_k"] == 5
    assert batch["num_learned_tokens"] == 10
    assert "attention_mask" not in batch


@st.composite
def packed_rows(draw: st.DrawFn) -> list[dict[str, Any]]:
    max_len = draw(st.integers(2, 24))
    rows = []
    for _ in range(draw(st.integers(1, 4))):
        lengths: list[int] = []
        while sum(lengths) < max_len and draw(st.booleans()):
            lengths.append(draw(st.integers(1, max_len - sum(lengths))))
        if not lengths:
            lengths = [max_len]
        num_tokens = sum(lengths)
        cu = [0, *np.cumsum(lengths).tolist()] + ([max_len] if num_tokens < max_len else [])
        pos = [p for s, e in itertools.pairwise(cu) for p in range(e - s)]
        ids = draw(st.lists(st.integers(3, 99), min_size=num_tokens, max_size=num_tokens))
        row: dict[str, Any] = {
            "input_ids": ids + [1] * (max_len - num_tokens),
            "position_ids": pos,
            "cu_seqlens": cu,
            "num_tokens": num_tokens,
        }
        if draw(st.booleans()):  # stored loss labels (e.g. instruction data): some -100 already
            row["labels"] = [
                t if draw(st.booleans()) else -100 for t in row["input_ids"][:num_tokens]
            ] + [-100] * (max_len - num_tokens)
        rows.append(row)
    return rows


@settings(max_examples=150, deadline=None)
@given(packed_rows())
def test_collate_properties(rows: list[dict[str, Any]]) -> None:
    max_len = len(rows[0]["input_ids"])
    batch = collate(rows)
    expected_cu = [0]
    learned = 0
    for b, row in enumerate(rows):
        cu, n = row["cu_seqlens"], row["num_tokens"]
        doc_starts = {s for s in cu[:-1] if s < n}
        source = row.get("labels", row["input_ids"])
        want = [-100 if (t >= n or t in doc_starts) else source[t] for t in range(max_len)]
        assert batch["labels"][b].tolist() == want
        learned += sum(1 for t in want[1:] if t != -100)
        expected_cu += [c + b * max_len for c in cu[1:]]
    assert batch["cu_seq_lens_q"].tolist() == expected_cu
    assert batch["num_learned_tokens"] == learned
    assert batch["max_length_q"] == max(np.diff(expected_cu))
    # the mask from the global cu_seq_lens is packtool.masks' definition, row by row
    mask = block_causal_mask(batch["cu_seq_lens_q"], max_len)
    per_row = block_causal_mask([r["cu_seqlens"] for r in rows], max_len)
    assert torch.equal(block_causal_mask(batch["cu_seq_lens_q"].tolist(), max_len), mask)
    for b, row in enumerate(rows):
        assert np.array_equal(mask[b, 0].numpy(), np_block_causal_mask(row["cu_seqlens"], max_len))
    assert torch.equal(mask, per_row)


def test_collate_errors() -> None:
    with pytest.raises(ValueError, match="at least one row"):
        collate([])
    row = {"input_ids": [5, 6, 7], "position_ids": [0, 1, 2], "num_tokens": 3}
    with pytest.raises(ValueError, match=r"row 0: cu_seqlens must run from 0 to the row length 3"):
        collate([{**row, "cu_seqlens": [0, 2]}])
    with pytest.raises(ValueError, match="position_ids"):
        collate([{**row, "cu_seqlens": [0, 3], "position_ids": [0, 1]}])
    with pytest.raises(
        ValueError, match=r"rows have no position_ids .*remove_unused_columns=False"
    ):
        collate([{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}])


def test_collate_refuses_an_aligned_row_without_its_real_boundaries(tmp_path: Path) -> None:
    """Rows of an aligned pack (--pad-to-multiple-of) given with cu_seqlens and num_tokens but
    not cu_seqlens_unpadded (the keys collate documents for load_from_disk rows) were taken as
    plain rows: every alignment pad before num_tokens learned, the real tokens after it not."""
    lines = (REPO / "sample_data" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    (tmp_path / "in.jsonl").write_text("\n".join(lines[:20]) + "\n", encoding="utf-8")
    packtool.pack([tmp_path / "in.jsonl"], tmp_path / "out", max_len=256, pad_to_multiple_of=8)
    ds = PackedDataset(tmp_path / "out")
    items = [ds[i] for i in range(len(ds))]
    aligned = [it for it in items if int(it["num_tokens"]) not in it["cu_seqlens"].tolist()]
    assert aligned  # rows whose real tokens end inside a segment
    keys = ("input_ids", "position_ids", "cu_seqlens", "num_tokens")
    with pytest.raises(ValueError, match=r"row 0: num_tokens \d+ .*cu_seqlens_unpadded"):
        collate([{k: aligned[0][k] for k in keys}])
    # with the column (PackedDataset items, load_from_disk rows): the pads are -100
    batch = collate(
        [
            {
                **{k: aligned[0][k] for k in keys},
                "cu_seqlens_unpadded": aligned[0]["cu_seqlens_unpadded"],
            }
        ]
    )
    assert torch.equal(batch["labels"][0], aligned[0]["labels"])
    assert torch.equal(
        collate(items[:4])["labels"], torch.stack([it["labels"] for it in items[:4]])
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_float_mask_is_additive(dtype: Any) -> None:
    cu = torch.tensor([0, 2, 3, 6], dtype=torch.int32)
    boolean = block_causal_mask(cu, 3)
    additive = block_causal_mask(cu, 3, dtype=dtype)
    assert additive.dtype == dtype and additive.shape == (2, 1, 3, 3)
    assert torch.all(additive[boolean] == 0)
    assert torch.all(additive[~boolean] == torch.finfo(dtype).min)
    assert boolean[:, 0].int().tolist() == [
        [[1, 0, 0], [1, 1, 0], [0, 0, 1]],
        [[1, 0, 0], [1, 1, 0], [1, 1, 1]],
    ]


def test_mask_errors() -> None:
    with pytest.raises(ValueError, match="must end at a multiple of max_len=4"):
        block_causal_mask(torch.tensor([0, 3, 6]), 4)
    with pytest.raises(ValueError, match=r"row boundary .*\[4\] missing"):
        block_causal_mask(torch.tensor([0, 3, 6, 8]), 4)
    with pytest.raises(ValueError, match="cu_seqlens must"):
        block_causal_mask([[0, 3]], 4)  # a per-row cu_seqlens that stops short
    with pytest.raises(ValueError, match=r"torch\.bool or a floating dtype"):
        block_causal_mask(torch.tensor([0, 4]), 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="must end at a multiple"):
        flex_block_mask(torch.tensor([0, 3]), 4)


# -- PackedDataset -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few dozen rows of 16 in shards of 4 rows (the last one shorter)."""
    rng = np.random.default_rng(1)
    docs = [rng.integers(3, VOCAB, rng.integers(1, 15)).tolist() for _ in range(120)]
    out, report = pack_ids(tmp_path_factory.mktemp("sharded"), docs, 16, rows_per_shard=4)
    assert report.rows % 4 != 0 and report.rows > 20, report.rows
    return out


def test_dataset_items_are_the_rows(sharded: Path) -> None:
    reader = packtool.open_packed(sharded)
    ds = PackedDataset(sharded)
    assert len(ds) == reader.num_rows and ds.max_len == 16 and not ds.has_labels
    for i in (0, 5, len(ds) - 1, -1):
        item, row = ds[i], reader.row(i % len(ds))
        assert item["input_ids"].dtype == torch.int64 and item["input_ids"].shape == (16,)
        assert item["cu_seqlens"].dtype == torch.int32
        assert item["input_ids"].tolist() == row.input_ids.tolist()
        assert item["position_ids"].tolist() == row.position_ids.tolist()
        assert item["cu_seqlens"].tolist() == row.cu_seqlens.tolist()
        assert item["num_tokens"] == row.num_tokens and item["row"] == row.index
        cu, n = row.cu_seqlens, row.num_tokens
        want = [-100 if t >= n or t in cu[:-1] else int(row.input_ids[t]) for t in range(16)]
        assert item["labels"].dtype == torch.int64 and item["labels"].tolist() == want
        item["input_ids"][0] = 7  # writable, and a copy: the mapped shard is untouched
    assert ds[0]["input_ids"].tolist() == reader.row(0).input_ids.tolist()
    with pytest.raises(IndexError, match="out of range"):
        ds[len(ds)]


def test_collate_takes_hf_datasets_rows(sharded: Path) -> None:
    """Rows loaded by `datasets` (Python lists) collate to the same batch as PackedDataset's."""
    import datasets

    hf = datasets.load_from_disk(str(sharded))
    ours = PackedDataset(sharded)
    a, b = collate([hf[0], hf[1]]), collate([ours[0], ours[1]])
    assert a.keys() == b.keys()
    for key, value in a.items():
        assert torch.equal(value, b[key]) if isinstance(value, torch.Tensor) else value == b[key]


@pytest.mark.parametrize("world_size", [1, 2, 3, 5, 8])
def test_ranks_split_the_rows(sharded: Path, world_size: int) -> None:
    reader = packtool.open_packed(sharded)
    n = reader.num_rows
    per_rank = n // world_size
    shard_of = np.repeat(np.arange(len(reader.shard_rows)), reader.shard_rows)
    seen: list[int] = []
    for rank in range(world_size):
        ds = PackedDataset(sharded, rank=rank, world_size=world_size)
        assert len(ds) == per_rank  # every rank the same number of steps
        rows = [ds[i]["row"] for i in range(len(ds))]
        assert rows == list(range(rank * per_rank, (rank + 1) * per_rank))  # contiguous
        shards = sorted(set(shard_of[rows]))
        assert shards == list(range(shards[0], shards[-1] + 1))  # consecutive shards
        assert ds[0]["input_ids"].tolist() == reader.row(rows[0]).input_ids.tolist()
        seen += rows
    assert sorted(seen) == list(range(world_size * per_rank))
    assert n - len(seen) == n % world_size < world_size


def test_epoch_order() -> None:
    order = epoch_order(10, seed=0, epoch=1)
    assert order.tolist() == [9, 1, 3, 8, 7, 6, 0, 4, 2, 5]  # the example of packtool/order.py
    assert rank_share(order, 0, 2).tolist() == [9, 3, 7, 0, 2]
    assert rank_share(order, 1, 2).tolist() == [1, 8, 6, 4, 5]
    assert epoch_order(10, seed=0, epoch=2).tolist() == [8, 2, 1, 0, 5, 6, 7, 4, 3, 9]
    assert rank_share(order, 2, 3).tolist() == [3, 6, 2]  # positions 2, 5, 8; 9 is left out
    for n in (0, 1, 7, 1000):
        assert sorted(epoch_order(n, seed=5, epoch=3).tolist()) == list(range(n))
    with pytest.raises(OptionError, match="epoch must be an integer >= 0"):
        epoch_order(10, seed=0, epoch=-1)


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_set_epoch_reshuffles_globally(sharded: Path, world_size: int) -> None:
    reader = packtool.open_packed(sharded)
    n, per_rank = reader.num_rows, reader.num_rows // world_size
    ranks = [
        PackedDataset(sharded, rank=r, world_size=world_size, seed=7) for r in range(world_size)
    ]
    epochs = []
    for epoch in range(3):
        shares = []
        for ds in ranks:
            ds.set_epoch(epoch)
            assert len(ds) == per_rank  # every rank the same number of steps
            rows = [ds[i]["row"] for i in range(len(ds))]
            assert ds[1]["input_ids"].tolist() == reader.row(rows[1]).input_ids.tolist()
            shares.append(rows)
        seen = [row for share in shares for row in share]
        assert len(set(seen)) == len(seen) == world_size * per_rank  # no row on two ranks
        assert n - len(seen) == n % world_size  # none lost beyond the remainder
        # global: position i of the epoch goes to rank i % world_size
        order = [shares[i % world_size][i // world_size] for i in range(len(seen))]
        assert order == epoch_order(n, seed=7, epoch=epoch)[: len(seen)].tolist()
        epochs.append(shares)
    assert epochs[0] != epochs[1] != epochs[2]
    if world_size > 1:  # a rank sees other rows in another epoch
        assert set(epochs[0][0]) != set(epochs[1][0])
    again = PackedDataset(sharded, rank=world_size - 1, world_size=world_size, seed=7)
    again.set_epoch(1)
    assert [again[i]["row"] for i in range(len(again))] == epochs[1][-1]  # deterministic
    other = PackedDataset(sharded, rank=0, world_size=world_size, seed=8)
    other.set_epoch(1)
    assert [other[i]["row"] for i in range(len(other))] != epochs[1][0]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_mid_epoch_with_stateful_dataloader(
    sharded: Path, num_workers: int, shuffle: bool
) -> None:
    """The batches after a restore equal those of the uninterrupted run."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader(ds: PackedDataset) -> Any:
        return StatefulDataLoader(
            ds,
            batch_size=3,
            shuffle=shuffle,  # a second shuffle inside the rank's share is allowed
            collate_fn=collate,
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(1),
        )

    def rows(batches: list[dict[str, Any]]) -> list[list[int]]:
        return [b["input_ids"][:, :4].tolist() for b in batches]

    ds = PackedDataset(sharded, rank=1, world_size=2, seed=3)
    ds.set_epoch(4)
    run = loader(ds)
    it = iter(run)
    head = [next(it) for _ in range(2)]
    state = run.state_dict()
    tail = list(it)
    assert len(tail) >= 2 and rows(head) != rows(tail[:2])

    fresh = PackedDataset(sharded, rank=1, world_size=2, seed=3)  # a new process: epoch unset
    resumed = loader(fresh)
    resumed.load_state_dict(state)  # restores the dataset's epoch too (its state_dict)
    assert rows(list(resumed)) == rows(tail)
    if not shuffle:
        # the next epoch of the resumed run is the next epoch of the uninterrupted one (with a
        # DataLoader shuffle on top, torchdata 0.11 draws that epoch's permutation from
        # another generator state after a restore: set_epoch's order alone is reproducible)
        fresh.set_epoch(5)
        ds.set_epoch(5)
        assert rows(list(resumed)) == rows(list(run))


def test_dataset_state_restores_the_epoch(sharded: Path) -> None:
    ds = PackedDataset(sharded, rank=0, world_size=2, seed=3)
    ds.set_epoch(6)
    fresh = PackedDataset(sharded, rank=0, world_size=2, seed=3)
    fresh.load_state_dict(ds.state_dict())
    assert fresh.epoch == 6 and list(fresh.rows) == list(ds.rows)
    with pytest.raises(OptionError, match="saved state has seed=3, this dataset seed=4"):
        PackedDataset(sharded, rank=0, world_size=2, seed=4).load_state_dict(ds.state_dict())
    with pytest.raises(OptionError, match="saved state has rank=0, this dataset rank=1"):
        PackedDataset(sharded, rank=1, world_size=2, seed=3).load_state_dict(ds.state_dict())
    with pytest.raises(OptionError, match="epoch must be an integer >= 0"):
        ds.set_epoch(-1)
    with pytest.raises(OptionError, match="seed must be an integer >= 0"):
        PackedDataset(sharded, seed=-1)


def test_dataset_errors(sharded: Path, tmp_path: Path) -> None:
    n = packtool.open_packed(sharded).num_rows
    with pytest.raises(OptionError, match=f"has {n} rows, fewer than world_size={n + 1}"):
        PackedDataset(sharded, rank=0, world_size=n + 1)
    with pytest.raises(OptionError, match=r"rank must be in \[0, 1\], got 2"):
        PackedDataset(sharded, rank=2, world_size=2)
    with pytest.raises(OptionError, match="world_size must be an integer >= 1"):
        PackedDataset(sharded, world_size=0)
    (tmp_path / "half").mkdir()
    with pytest.raises(FormatError, match="not a packtool output"):
        PackedDataset(tmp_path / "half")


def test_dataset_pickles_without_its_data(sharded: Path) -> None:
    ds = PackedDataset(sharded, rank=1, world_size=2)
    ds.set_epoch(3)
    ds[0]  # map a shard, compute the epoch's rows
    blob = pickle.dumps(ds)
    assert len(blob) < 2_000  # the path and the row range, not the mapped tables
    copy = pickle.loads(blob)
    assert len(copy) == len(ds) and torch.equal(copy[3]["input_ids"], ds[3]["input_ids"])


def test_stored_labels_are_respected(tmp_path: Path) -> None:
    """A dataset with a labels column (instruction data): collate starts from the stored labels
    and still masks document starts and padding."""
    ids = np.array([[10, 11, 12, 13, 20, 21, 1, 1]], dtype=np.int32)
    stored = np.array([[-100, -100, 12, 13, 20, 21, -100, -100]], dtype=np.int32)
    batch = PackedBatch(
        input_ids=ids,
        position_ids=np.array([[0, 1, 2, 3, 0, 1, 0, 1]], dtype=np.int32),
        cu_values=np.array([0, 4, 6, 8]),
        cu_offsets=np.array([0, 4]),
        num_tokens=np.array([6]),
        doc_ids=np.array([0, 1]),
        chunk_ids=np.array([0, 0]),
        seg_offsets=np.array([0, 2]),
        labels=stored,
    )
    with ShardWriter(
        tmp_path / "sft", max_len=8, num_rows=1, rows_per_shard=1, with_labels=True
    ) as w:
        w.write(batch)
        w.commit({})
    ds = PackedDataset(tmp_path / "sft")
    learned = [-100, -100, 12, 13, -100, 21, -100, -100]
    assert ds.has_labels and ds[0]["labels"].tolist() == learned
    out = collate([ds[0]])
    assert out["labels"].tolist() == [learned]
    assert out["num_learned_tokens"] == 3  # 12, 13, 21


# -- imports -----------------------------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_import_packtool_does_not_import_torch() -> None:
    result = _python("import sys, packtool; print('torch' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_missing_torch_gives_install_hint() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "try:\n    import packtool.torch\n"
        "except ImportError as e:\n    print(e)\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert "pip install 'packtool[torch]'" in result.stdout
    assert "CPU build" in result.stdout


# -- the example ---------------------------------------------------------------------------------


def test_example_trains_two_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()[:150]
    (tmp_path / "sample.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    packtool.pack([tmp_path / "sample.jsonl"], tmp_path / "out", max_len=128)
    spec = importlib.util.spec_from_file_location("train_example", REPO / "examples" / "train.py")
    assert spec is not None and spec.loader is not None
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    args = [str(tmp_path / "out"), "--steps", "2", "--batch-size", "2", "--grad-accum", "2"]
    losses = train.main([*args, "--hidden", "32"])
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    # a random model over a vocabulary of 8,192 starts near ln(8192) per token
    assert abs(losses[0] - math.log(8192)) < 1.0
    printed = capsys.readouterr().out
    assert "sdpa + block mask" in printed and "step    2" in printed
    vocab = json.loads((tmp_path / "out" / "manifest.json").read_text())["tokenizer"]
    assert vocab["vocab_size"] == 8192


def _example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_hf_trainer_example(tmp_path: Path) -> None:
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()[:150]
    (tmp_path / "sample.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    packtool.pack([tmp_path / "sample.jsonl"], tmp_path / "out", max_len=128)
    run = str(tmp_path / "run")
    result = _example("hf_trainer").main(
        [str(tmp_path / "out"), "--steps", "6", "--output-dir", run]
    )
    assert result["after"] < result["before"]  # the example asserts it too


@pytest.fixture(scope="module")
def chat_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 sample chats packed at 256 with assistant-only labels."""
    if not os.environ.get("CI"):
        pytest.importorskip("trl", reason="pip install -e '.[test]'")
    tmp = tmp_path_factory.mktemp("chat")
    lines = (REPO / "sample_data" / "chat.jsonl").read_text(encoding="utf-8").splitlines()[:120]
    (tmp / "chat.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    template = REPO / "sample_data" / "chatml.jinja"
    report = packtool.pack([tmp / "chat.jsonl"], tmp / "chat", max_len=256, chat_template=template)
    assert report.rows >= 8
    return tmp / "chat"


@pytest.mark.slow
def test_trl_sft_example(chat_pack: Path, tmp_path: Path) -> None:
    run = str(tmp_path / "run")
    result = _example("trl_sft").main([str(chat_pack), "--steps", "2", "--output-dir", run])
    assert math.isfinite(result["train_loss"]) and math.isfinite(result["eval_loss"])


def test_trl_defaults_refuse_before_the_first_step(chat_pack: Path, tmp_path: Path) -> None:
    """SFTConfig's defaults drop position_ids (remove_unused_columns): collate says so, before
    any step, instead of training documents that attend to each other."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(chat_pack / "tokenizer.json")
    )
    tokenizer.pad_token_id = packtool.open_packed(chat_pack).manifest["tokenizer"][
        "special_tokens"
    ]["pad_id"]
    model = default_model("llama", "sdpa")
    model.resize_token_embeddings(packtool.open_packed(chat_pack).vocab_size)
    config = SFTConfig(output_dir=str(tmp_path / "run"), max_steps=1, bf16=False)
    trainer = SFTTrainer(
        model,
        config,
        train_dataset=datasets.load_from_disk(str(chat_pack)),
        data_collator=collate,
        processing_class=tokenizer,
    )
    with pytest.raises(
        ValueError, match=r"no position_ids .*SFTConfig\(remove_unused_columns=False\)"
    ):
        trainer.train()
    assert trainer.state.global_step == 0
