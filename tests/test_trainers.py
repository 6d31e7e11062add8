"""The common training paths on packtool's rows, each exact or shown to leak: TRL's own
padding-free collator (exact, through the ``seq_lengths`` column), TRL's default collator and
transformers' DataCollatorWithFlattening (documents attend to each other: docs/trl.md says so,
``check-model --feed plain`` shows it). A real tiny Llama from its config, on the CPU; each
document's logits in the batch against the same document alone."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REPO
from helpers import tiny_llama

import packtool

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")

from packtool.torch import collate  # noqa: E402

ROWS = 4  # rows in the batch


def _pack(tmp: Path, kind: str) -> Path:
    if kind == "chat":
        lines = (REPO / "sample_data" / "chat.jsonl").read_text(encoding="utf-8").splitlines()
        (tmp / "in.jsonl").write_text("\n".join(lines[:60]) + "\n", encoding="utf-8")
        template = REPO / "sample_data" / "chatml.jinja"
        packtool.pack([tmp / "in.jsonl"], tmp / kind, max_len=256, chat_template=template)
    else:
        lines = (REPO / "sample_data" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
        (tmp / "in.jsonl").write_text("\n".join(lines[:60]) + "\n", encoding="utf-8")
        packtool.pack([tmp / "in.jsonl"], tmp / kind, max_len=256, shuffle=False)
    return tmp / kind


@pytest.fixture(scope="module", params=["chat", "text"])
def pack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _pack(tmp_path_factory.mktemp(request.param), request.param)


def tokenizer_of(out: Path) -> Any:
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))
    tokenizer.pad_token_id = packtool.open_packed(out).manifest.tokenizer.special.pad_id
    return tokenizer


def picked(out: Path) -> list[int]:
    """ROWS rows of the pack, those of several documents first."""
    reader = packtool.open_packed(out)
    rows = sorted(range(len(reader)), key=lambda i: -len(reader[i].doc_ids))
    return sorted(rows[:ROWS])


def document_diffs(model: Any, out: Path, logits: Any) -> dict[str, float]:
    """Max |logit difference| of the documents of the :func:`picked` rows (``logits``
    [ROWS, L, V]), packed vs alone: of the first document of each row, and of those after."""
    reader = packtool.open_packed(out)
    diffs = {"first": 0.0, "after": 0.0}
    after = 0
    with torch.no_grad():
        for b, index in enumerate(picked(out)):
            row = reader[index]
            for i, seg in enumerate(row.segments):
                if seg.is_padding:
                    continue
                doc = torch.tensor(row.input_ids[seg.start : seg.end], dtype=torch.long)
                alone = model(input_ids=doc[None], use_cache=False).logits[0]
                diff = float((logits[b, seg.start : seg.end] - alone).abs().max())
                kind = "first" if i == 0 else "after"
                after += kind == "after"
                diffs[kind] = max(diffs[kind], diff)
    assert after > 0  # some documents come after others in their row
    return diffs


def sft_trainer(out: Path, run: Path, **config: Any) -> Any:
    from trl import SFTConfig, SFTTrainer

    reader = packtool.open_packed(out)
    args = SFTConfig(
        output_dir=str(run),
        max_steps=1,
        per_device_train_batch_size=ROWS,
        bf16=False,
        report_to=[],
        save_strategy="no",
        **config,
    )
    return SFTTrainer(
        tiny_llama(reader.vocab_size),
        args,
        train_dataset=datasets.load_from_disk(str(out)),
        processing_class=tokenizer_of(out),
    )


def inputs_of(batch: dict[str, Any]) -> dict[str, Any]:
    """The model's inputs of a collator's batch, as TRL's compute_loss passes them (it adds
    use_cache=False; a KV cache would turn off transformers' packed-sequence detection)."""
    return {**{k: v for k, v in batch.items() if k != "labels"}, "use_cache": False}


def trl_batch(trainer: Any, out: Path) -> dict[str, Any]:
    """TRL's collator on the :func:`picked` rows, as the trainer prepared and kept them."""
    dataset = trainer._remove_unused_columns(trainer.train_dataset, "training")
    return trainer.data_collator([dataset[i] for i in picked(out)])


def test_trl_padding_free_is_exact(pack: Path, tmp_path: Path) -> None:
    """SFTConfig(padding_free=True, max_length=None) on load_from_disk(out), with TRL's own
    collator: it reads seq_lengths, so every document is computed as if alone (and, for a
    chat pack, on packtool's labels exactly); datasets.disable_caching() keeps TRL's preparation
    from writing cache-*.arrow into the pack."""
    datasets.disable_caching()
    try:
        before = sorted(os.listdir(pack))
        trainer = sft_trainer(pack, tmp_path / "run", padding_free=True, max_length=None)
        assert sorted(os.listdir(pack)) == before  # nothing written into the pack
    finally:
        datasets.enable_caching()
    batch = trl_batch(trainer, pack)
    max_len = packtool.open_packed(pack).max_len
    assert batch["input_ids"].shape == (1, ROWS * max_len)
    model = trainer.model.eval()
    with torch.no_grad():
        logits = model(**inputs_of(batch)).logits
    diffs = document_diffs(model, pack, logits.reshape(ROWS, max_len, -1))
    assert diffs["first"] < 1e-5 and diffs["after"] < 1e-5, diffs

    ds = datasets.load_from_disk(str(pack))
    rows = [ds[i] for i in picked(pack)]
    ours = collate(rows)
    # the documents' positions are packtool's; each pad is a sequence of its own (position 0)
    theirs = batch["position_ids"].reshape(ROWS, max_len)
    for b, row in enumerate(rows):
        n = row["num_tokens"]
        assert torch.equal(theirs[b, :n], ours["position_ids"][b, :n])
        assert bool((theirs[b, n:] == 0).all())
    # every document boundary of the rows is one of TRL's sequence boundaries
    starts = set(batch["cu_seq_lens_q"].tolist())
    for b, row in enumerate(rows):
        assert {b * max_len + c for c in row["cu_seqlens"]} <= starts
    # the labels are packtool's exactly: a chat's, or a text's every token, and no padding
    assert torch.equal(batch["labels"].reshape(ROWS, max_len), ours["labels"])


def test_trl_padding_free_trains(pack: Path, tmp_path: Path) -> None:
    datasets.disable_caching()
    try:
        trainer = sft_trainer(pack, tmp_path / "run", padding_free=True, max_length=None)
        result = trainer.train()
    finally:
        datasets.enable_caching()
    assert result.global_step == 1 and np.isfinite(result.training_loss)


def test_trl_defaults_let_documents_attend_to_each_other(pack: Path, tmp_path: Path) -> None:
    """TRL's default collator sends a 2-D attention mask and no position_ids: every document
    after the first of its row sees those before it. Nothing in the rows can refuse it (TRL
    reads only input_ids, labels and seq_lengths, and ignores seq_lengths here): docs/trl.md,
    the pack's summary and its README.md say so, and check-model --feed plain measures it."""
    datasets.disable_caching()
    try:
        trainer = sft_trainer(pack, tmp_path / "run")
    finally:
        datasets.enable_caching()
    batch = trl_batch(trainer, pack)
    assert "attention_mask" in batch and "position_ids" not in batch
    model = trainer.model.eval()
    with torch.no_grad():
        logits = model(**inputs_of(batch)).logits
    diffs = document_diffs(model, pack, logits)
    assert diffs["first"] < 1e-5 and diffs["after"] > 0.05, diffs
    # the labels: a chat pack's stored ones as they are (packtool's); on a text pack TRL
    # learns every token, the padding and each document's first token (predicted from the
    # document before it) included
    ours = collate([datasets.load_from_disk(str(pack))[i] for i in picked(pack)])["labels"]
    if packtool.open_packed(pack).has_labels:
        assert torch.equal(batch["labels"], ours)
    else:
        assert bool((batch["labels"] != -100).all())
        assert int((batch["labels"] != -100).sum()) > int((ours != -100).sum())


def test_data_collator_with_flattening_takes_each_row_as_one_sequence(pack: Path) -> None:
    """transformers' DataCollatorWithFlattening numbers positions over the whole row: the
    documents after the first of a row attend to those before it."""
    ds = datasets.load_from_disk(str(pack))
    rows = [{"input_ids": ds[i]["input_ids"]} for i in picked(pack)]
    batch = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)(rows)
    reader = packtool.open_packed(pack)
    model = tiny_llama(reader.vocab_size).eval()
    with torch.no_grad():
        logits = model(**inputs_of(batch)).logits
    diffs = document_diffs(model, pack, logits.reshape(ROWS, reader.max_len, -1))
    assert diffs["first"] < 1e-5 and diffs["after"] > 0.05, diffs


@pytest.mark.parametrize("with_tokenizer", [False, True])
def test_trainer_without_collate_keeps_documents_apart_only_without_a_tokenizer(
    pack: Path, tmp_path: Path, with_tokenizer: bool
) -> None:
    """Hugging Face Trainer on PackedDataset with no data_collator: without a
    processing_class its default_data_collator stacks input_ids, position_ids and labels (no
    mask: exact); with processing_class=tokenizer it takes DataCollatorWithPadding, whose
    tokenizer.pad adds a 2-D attention mask of ones: documents attend to each other, silently
    (docs/hf_trainer.md says so)."""
    from packtool.torch import PackedDataset

    reader = packtool.open_packed(pack)
    model = tiny_llama(reader.vocab_size)
    args = transformers.TrainingArguments(
        str(tmp_path / "run"), per_device_eval_batch_size=ROWS, report_to=[], use_cpu=True
    )
    kwargs = {"processing_class": tokenizer_of(pack)} if with_tokenizer else {}
    trainer = transformers.Trainer(model, args, **kwargs)
    subset = torch.utils.data.Subset(PackedDataset(pack), picked(pack))
    batch = next(iter(trainer.get_eval_dataloader(subset)))
    assert ("attention_mask" in batch) == with_tokenizer
    model.eval()
    with torch.no_grad():
        logits = model(**inputs_of(batch)).logits
    diffs = document_diffs(model, pack, logits)
    assert diffs["first"] < 1e-5, diffs
    if with_tokenizer:
        assert diffs["after"] > 0.05, diffs
    else:
        assert diffs["after"] < 1e-5, diffs


def test_packs_summary_says_which_trainers_keep_examples_apart(tmp_path: Path) -> None:
    """`pack` of instruction data names the exact paths and the leaking defaults, in one line;
    a text pack's summary does not (its README.md does)."""
    from typer.testing import CliRunner

    from packtool.cli import app

    runner = CliRunner()
    lines = (REPO / "sample_data" / "chat.jsonl").read_text(encoding="utf-8").splitlines()
    (tmp_path / "chat.jsonl").write_text("\n".join(lines[:10]) + "\n", encoding="utf-8")
    template = str(REPO / "sample_data" / "chatml.jinja")
    chat = runner.invoke(
        app, ["pack", str(tmp_path / "chat.jsonl"), "--chat-template", template, "-L", "256",
              "-o", str(tmp_path / "chat")],
    )  # fmt: skip
    assert chat.exit_code == 0, chat.output
    (line,) = [x for x in chat.output.splitlines() if x.startswith("training:")]
    for needed in ("padding_free=True", "DataCollatorWithFlattening", "check-model"):
        assert needed in line
    (tmp_path / "text.jsonl").write_text('{"text": "a b c"}\n', encoding="utf-8")
    text = runner.invoke(
        app, ["pack", str(tmp_path / "text.jsonl"), "-L", "16", "-o", str(tmp_path / "t")]
    )
    assert text.exit_code == 0 and "training:" not in text.output


def _python_blocks(doc: str) -> list[str]:
    import re

    text = (REPO / "docs" / doc).read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)


def test_the_tokenizer_trl_md_suggests_has_the_packs_pad_token(pack: Path) -> None:
    """docs/trl.md's `processing_class`: AutoTokenizer of the pack's directory (its
    tokenizer.json and tokenizer_config.json) has the pad token TRL asks for, the pack's own;
    PreTrainedTokenizerFast of the tokenizer.json alone has none, and SFTTrainer refuses it."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(pack))
    assert tokenizer.pad_token_id == packtool.open_packed(pack).manifest.tokenizer.special.pad_id
    bare = transformers.PreTrainedTokenizerFast(tokenizer_file=str(pack / "tokenizer.json"))
    assert bare.pad_token_id is None
    assert 'AutoTokenizer.from_pretrained("chat/")' in (REPO / "docs" / "trl.md").read_text()


@pytest.mark.slow  # two short TRL runs
def test_the_trl_recipes_run_on_a_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """docs/trl.md's code blocks, as written, on a chat pack in chat/ with a tiny Llama: they
    train on the CPU and write nothing into the pack."""
    import shutil

    chat = _pack(tmp_path_factory.mktemp("docs"), "chat")
    shutil.copytree(chat, tmp_path / "chat")
    monkeypatch.chdir(tmp_path)
    blocks = _python_blocks("trl.md")
    assert len(blocks) == 2
    before = sorted(os.listdir(tmp_path / "chat"))
    for block in blocks:
        shutil.rmtree(tmp_path / "run", ignore_errors=True)
        scope: dict[str, Any] = {
            "model": tiny_llama(packtool.open_packed(chat).vocab_size),
            "tokenizer": tokenizer_of(chat),
        }
        try:
            exec(compile(block, "docs/trl.md", "exec"), scope)
        finally:
            datasets.enable_caching()
        state = scope["trainer"].state
        assert state.global_step > 0 and np.isfinite(state.log_history[-1]["train_loss"])
        assert sorted(os.listdir(tmp_path / "chat")) == before


def test_trl_packing_on_a_pack_stops_with_trls_own_error(pack: Path, tmp_path: Path) -> None:
    """docs/trl.md: leave `packing` off; on rows packed already TRL's packing=True stops with
    its own TypeError before training (nothing packed twice, nothing silent)."""
    datasets.disable_caching()
    try:
        with pytest.raises(TypeError, match="Packing requires all columns to be lists of lists"):
            sft_trainer(pack, tmp_path / "run", packing=True)
    finally:
        datasets.enable_caching()
    doc = " ".join((REPO / "docs" / "trl.md").read_text("utf-8").split())
    assert "`TypeError: Packing requires all columns to be lists of lists`" in doc
