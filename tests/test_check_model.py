"""`packtool check-model`: a real tiny causal LM (from its config, on the CPU) fed packed rows
three ways; each document's logits against the same document alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from typer.testing import CliRunner

import packtool
from packtool.check_model import AFTER, FIRST, LEAK_THRESHOLD, check_model
from packtool.cli import app
from packtool.errors import OptionError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

runner = CliRunner()


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 sample chats packed at 256: rows of several documents, with padding."""
    tmp = tmp_path_factory.mktemp("chat")
    lines = (REPO / "sample_data" / "chat.jsonl").read_text(encoding="utf-8").splitlines()[:60]
    (tmp / "chat.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    template = REPO / "sample_data" / "chatml.jinja"
    packtool.pack([tmp / "chat.jsonl"], tmp / "out", max_len=256, chat_template=template)
    reader = packtool.open_packed(tmp / "out")
    assert sum(len(reader[i].doc_ids) > 1 for i in range(2)) >= 1  # documents after others
    return tmp / "out"


def _config(arch: str, vocab: int = 8192) -> Any:
    if arch == "gpt2":
        return transformers.GPT2Config(
            vocab_size=vocab,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=512,
            bos_token_id=0,
            eos_token_id=0,
        )
    kind = transformers.LlamaConfig if arch == "llama" else transformers.Qwen3Config
    return kind(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Config-only model directories (hidden 32, 2 layers)."""
    tmp = tmp_path_factory.mktemp("models")
    out = {}
    for arch in ("llama", "qwen3", "gpt2"):
        _config(arch).save_pretrained(tmp / arch)
        out[arch] = tmp / arch
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt2"])
@pytest.mark.parametrize("feed", ["packtool", "position-ids", "plain"])
def test_feeds_on_sdpa(chat: Path, models: dict[str, Path], arch: str, feed: str) -> None:
    """packtool's collate and position_ids-only batches keep documents apart; a 2-D mask over
    a packed row does not, and only for the documents after the first of a row."""
    result = check_model(chat, models[arch], rows=2, feed=feed)
    assert result.from_config and result.rows == 2
    assert result.documents[FIRST] == 2 and result.documents[AFTER] >= 1
    assert result.max_diff[FIRST] < 1e-5  # nothing before it to leak from
    if feed == "plain":
        assert result.max_diff[AFTER] > 0.05 and result.leak
        assert result.advice is not None and "--feed plain" in result.advice
        assert "collate" in result.advice
    else:
        assert result.max_diff[AFTER] < 1e-5 and not result.leak and result.advice is None


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_explicit_mask_feed_and_a_sliding_window(
    chat: Path, models: dict[str, Path], tmp_path: Path, attn: str
) -> None:
    """--feed mask: the explicit block mask training.md shows for a custom loop. Exact on a
    Llama; on a model with a sliding window shorter than its documents (Mistral, window 16)
    the mask replaces the model's own, window included, and every long document's logits
    differ from the document alone (the first of a row too): a leak, with the advice to feed
    collate's batch without a mask, which stays exact there."""
    assert (
        check_model(chat, models["llama"], rows=2, feed="mask", attn_implementation=attn).worst
        < 1e-5
    )
    kind = transformers.MistralConfig
    config = kind(**{**_config("llama").to_diff_dict(), "sliding_window": 16})
    config.save_pretrained(tmp_path / "mistral")
    masked = check_model(chat, tmp_path / "mistral", rows=2, feed="mask", attn_implementation=attn)
    assert masked.leak and masked.max_diff[FIRST] > 1e-2, masked.max_diff
    assert masked.advice is not None and "--feed packtool" in masked.advice
    plain = check_model(chat, tmp_path / "mistral", rows=2, attn_implementation=attn)
    assert plain.worst < 1e-5 and not plain.leak


def test_rows_of_one_document_are_not_fed(models: dict[str, Path], tmp_path: Path) -> None:
    """A pack whose first rows hold one document each (chunks of long documents, first in
    FFD order; the docs' own `pack sample_data/corpus.jsonl --max-len 256` has them too) was
    fed those rows, and `--feed plain` was found exact: nothing there can leak. The rows fed
    are the first that hold several documents; a pack without any is refused."""
    lines = (REPO / "sample_data" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    (tmp_path / "in.jsonl").write_text("\n".join(lines[:40]) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    packtool.pack([tmp_path / "in.jsonl"], out, max_len=128, shuffle=False)
    reader = packtool.open_packed(out)
    assert all(len(reader[i].doc_ids) == 1 for i in range(4))
    result = check_model(out, models["llama"], rows=2, feed="plain")
    assert result.rows == 2 and result.documents[AFTER] >= 1 and result.leak
    several = [i for i in range(len(reader)) if len(reader[i].doc_ids) > 1]
    from packtool.check_model import rows_to_feed

    assert rows_to_feed(reader, 3) == several[:3]
    one = tmp_path / "one"  # every row a chunk of one document: nothing to check
    (tmp_path / "long.jsonl").write_text(lines[0] + "\n", encoding="utf-8")
    packtool.pack([tmp_path / "long.jsonl"], one, max_len=32)
    result = runner.invoke(app, ["check-model", str(one), "--model", str(models["llama"])])
    assert result.exit_code == 2 and "no row holds two documents" in result.output


def test_eager_and_weights_from_a_directory(
    chat: Path, models: dict[str, Path], tmp_path: Path
) -> None:
    """A directory with weights is loaded, not re-initialised: the same weights give the
    same logits whatever the seed."""
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(_config("llama"))
    model.save_pretrained(tmp_path / "weights")
    a = check_model(chat, tmp_path / "weights", rows=1, attn_implementation="eager")
    b = check_model(chat, tmp_path / "weights", rows=1, attn_implementation="eager", seed=9)
    assert not a.from_config and a.max_diff == b.max_diff and not a.leak


@pytest.mark.slow  # compiles flex attention
def test_flex_attention_without_a_mask(chat: Path, models: dict[str, Path]) -> None:
    result = check_model(chat, models["llama"], rows=2, attn_implementation="flex_attention")
    assert not result.leak and result.worst < 1e-5


def test_cli_exit_codes_and_advice(chat: Path, models: dict[str, Path]) -> None:
    ok = runner.invoke(
        app, ["check-model", str(chat), "--model", str(models["llama"]), "--rows", "2"]
    )
    assert ok.exit_code == 0, ok.output
    assert "verdict: exact" in ok.output and FIRST in ok.output and AFTER in ok.output
    leak = runner.invoke(
        app,
        [
            "check-model",
            str(chat),
            "--model",
            str(models["llama"]),
            "--rows",
            "2",
            "--feed",
            "plain",
        ],
    )
    assert leak.exit_code == 1
    assert "verdict: LEAK" in leak.output
    lines = [line for line in leak.output.splitlines() if line.startswith("leak:")]
    assert len(lines) == 1 and "--feed plain" in lines[0], leak.output
    as_json = runner.invoke(
        app,
        ["check-model", str(chat), "--model", str(models["gpt2"]), "--rows", "1", "--json"],
    )
    record = json.loads(as_json.output)
    assert record["leak"] is False and record["threshold"] == LEAK_THRESHOLD


def test_user_errors_are_one_line(chat: Path, models: dict[str, Path], tmp_path: Path) -> None:
    _config("llama", vocab=100).save_pretrained(tmp_path / "small")
    with pytest.raises(OptionError, match=r"vocabulary \(100 ids\) is smaller"):
        check_model(chat, tmp_path / "small")
    for args, message in (
        (["--model", "Qwen/Qwen3-0.6B"], "no such directory (--model takes a local model"),
        (["--model", str(tmp_path)], "no config.json"),
        (["--model", str(models["llama"]), "--feed", "masks"], "--feed must be one of"),
        (["--model", str(models["llama"]), "--rows", "0"], "--rows must be"),
        (["--model", str(models["llama"]), "--attn-implementation", "flash"], "must be one of"),
    ):
        result = runner.invoke(app, ["check-model", str(chat), *args])
        assert result.exit_code == 2, result.output
        assert message in result.output and "Traceback" not in result.output
