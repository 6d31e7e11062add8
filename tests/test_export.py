"""`packtool export`: a pack as other stacks' training files, read back by their own readers.

The packs here are tokenized with a word-level tokenizer whose text is the ids (``"t17 t40"``
is ``[17, 40]``), built locally, so every document's expected tokens are known without
packtool: its ids, then EOS.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import write_jsonl
from typer.testing import CliRunner

import packtool
from packtool.cli import app
from packtool.errors import OptionError, OutputExistsError
from packtool.export import common as export_common
from packtool.export import export, verify_export

EOS, PAD = 0, 1


def word_tokenizer(tmp: Path, vocab_size: int) -> Path:
    """A `tokenizers` WordLevel tokenizer: ``t{i}`` is id ``i``; ``</s>`` 0, ``<pad>`` 1."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"</s>": EOS, "<pad>": PAD, "<unk>": 2, **{f"t{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp / f"words-{vocab_size}.json"
    tok.save(str(path))
    return path


def make_pack(
    tmp: Path, docs: Sequence[Sequence[int]], *, vocab_size: int, max_len: int, **options: Any
) -> Path:
    src = write_jsonl(tmp / "docs.jsonl", [{"text": " ".join(f"t{i}" for i in d)} for d in docs])
    out = tmp / "out"
    tokenizer = str(word_tokenizer(tmp, vocab_size))
    packtool.pack([src], out, max_len=max_len, tokenizer=tokenizer, rows_per_shard=3, **options)
    return out


def random_docs(vocab_size: int, n: int = 60, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    docs = [rng.integers(3, vocab_size, rng.integers(1, 40)).tolist() for _ in range(n)]
    docs[7] = []  # an empty document: skipped by pack, so the document ids have a gap
    return docs


def megatron_indexed_dataset() -> Any:
    if not os.environ.get("CI"):
        pytest.importorskip("megatron.core", reason="pip install --no-deps megatron-core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no Transformer Engine / Apex on a CPU machine
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    return IndexedDataset


# -- megatron -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("vocab_size", "dtype"), [(1000, np.uint16), (70_000, np.int32)])
def test_megatron_core_reads_the_export(tmp_path: Path, vocab_size: int, dtype: type) -> None:
    indexed_dataset = megatron_indexed_dataset()
    docs = random_docs(vocab_size)
    out = make_pack(tmp_path, docs, vocab_size=vocab_size, max_len=16)  # split, shuffled
    manifest = packtool.open_packed(out).manifest
    assert manifest["documents"]["split"] > 0 and manifest["options"]["shuffle"]

    report = export(out, tmp_path / "mega", to="megatron")
    ds = indexed_dataset(str(tmp_path / "mega" / "text_document"))
    expected = [[*d, EOS] for d in docs if d]  # document-id order, the empty one left out
    assert len(ds) == len(expected) == report.record["documents"]
    assert ds.index.dtype == dtype
    assert ds.document_indices.tolist() == list(range(len(expected) + 1))
    for i, want in enumerate(expected):
        got = ds[i]
        assert got.dtype == dtype and got.tolist() == want, i
    assert ds.get(3, offset=1, length=2).tolist() == expected[3][1:3]
    assert report.record["tokens"] == sum(len(d) for d in expected) == ds.sequence_lengths.sum()
    assert verify_export(out, tmp_path / "mega").ok


def test_megatron_export_streams_in_blocks(tmp_path: Path, monkeypatch: Any) -> None:
    """Blocks of 7 tokens (instead of 4M) give the same files: the export never needs more
    than a block of tokens in memory."""
    docs = random_docs(500, n=30, seed=2)
    out = make_pack(tmp_path, docs, vocab_size=500, max_len=12)
    export(out, tmp_path / "whole", to="megatron")
    monkeypatch.setattr(export_common, "BLOCK_TOKENS", 7)
    export(out, tmp_path / "blocks", to="megatron")
    for name in ("text_document.bin", "text_document.idx"):
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "blocks" / name).read_bytes()


def test_verify_finds_a_damaged_export(tmp_path: Path) -> None:
    out = make_pack(tmp_path, random_docs(300, n=20), vocab_size=300, max_len=16)
    dest = tmp_path / "mega"
    export(out, dest, to="megatron")
    data = dest / "text_document.bin"
    raw = bytearray(data.read_bytes())
    raw[10] ^= 1  # one token changed, same size
    data.write_bytes(bytes(raw))
    assert verify_export(out, dest).problems == [
        "text_document.bin: sha256 differs from export.json"
    ]
    # the same damage with export.json updated to match: the contents are compared too
    record = json.loads((dest / "export.json").read_text())
    record["files"]["text_document.bin"]["sha256"] = packtool.format.sha256_file(data)
    (dest / "export.json").write_text(json.dumps(record))
    problems = verify_export(out, dest).problems
    assert len(problems) == 1 and problems[0].startswith("document 0 chunk 0 (row ")
    assert problems[0].endswith("tokens at 0 of .bin differ from the pack")  # byte 10: token 5
    result = CliRunner().invoke(app, ["verify", str(out), "--export", str(dest)])
    assert result.exit_code == 1 and "export (megatron) FAILED" in result.stdout


def test_export_cli(tmp_path: Path) -> None:
    out = make_pack(tmp_path, random_docs(300, n=20), vocab_size=300, max_len=16)
    dest = tmp_path / "mega"
    result = CliRunner().invoke(app, ["export", str(out), "--to", "megatron", "-o", str(dest)])
    assert result.exit_code == 0, result.output
    assert f"--data-path {dest / 'text_document'}" in result.stdout
    result = CliRunner().invoke(app, ["verify", str(out), "--export", str(dest)])
    assert result.exit_code == 0 and "export (megatron) verified" in result.stdout
    # never replaces anything; one-line errors
    result = CliRunner().invoke(app, ["export", str(out), "--to", "megatron", "-o", str(dest)])
    assert result.exit_code == 1 and "already exists" in result.output
    assert "Traceback" not in result.output
    result = CliRunner().invoke(app, ["export", str(out), "--to", "parquet", "-o", str(dest)])
    assert result.exit_code == 2 and "--to 'parquet' is not an export" in result.output
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_export_refusals(tmp_path: Path) -> None:
    out = make_pack(tmp_path, random_docs(300, n=20), vocab_size=300, max_len=16)
    (tmp_path / "taken").mkdir()
    with pytest.raises(OutputExistsError, match="never replaces files"):
        export(out, tmp_path / "taken", to="megatron")
    chat = tmp_path / "chat.jsonl"
    write_jsonl(chat, [{"prompt": "t5 t6", "completion": "t7 t8"}] * 3)
    sft = tmp_path / "sft"
    tokenizer = str(word_tokenizer(tmp_path, 300))
    packtool.pack([chat], sft, max_len=16, tokenizer=tokenizer)
    with pytest.raises(OptionError, match="no loss masks: export it with --to megatron-bridge"):
        export(sft, tmp_path / "mega", to="megatron")
    assert not (tmp_path / "mega").exists()
