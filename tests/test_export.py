"""`packtool export`: a pack as other stacks' training files, read back by their own readers.

The packs here are tokenized with a word-level tokenizer whose text is the ids (``"t17 t40"``
is ``[17, 40]``), built locally, so every document's expected tokens are known without
packtool: its ids, then EOS.
"""

from __future__ import annotations

import itertools
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
from packtool.errors import FormatError, OptionError, OutputExistsError
from packtool.export import common as export_common
from packtool.export import export, verify_export
from packtool.export import registry as export_registry

EOS, PAD = 0, 1


def word_tokenizer(tmp: Path, vocab_size: int) -> Path:
    """A `tokenizers` WordLevel tokenizer: ``t{i}`` is id ``i``; ``</s>`` 0, ``<pad>`` 1."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"</s>": EOS, "<pad>": PAD, "<unk>": 2, **{f"t{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["</s>", "<pad>", "<unk>"])  # special: packtool's EOS and PAD
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
    # a malformed export.json: one line naming the file and the key
    record["files"]["text_document.bin"]["bytes"] = "12"
    (dest / "export.json").write_text(json.dumps(record))
    with pytest.raises(FormatError, match=r"export.json: files.text_document.bin.bytes must be an"):
        verify_export(out, dest)


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


def test_export_to_a_store_url_is_refused(tmp_path: Path, monkeypatch: Any) -> None:
    """An export is a local directory: ``-o s3://...`` is one line, not files written to a
    local directory named ``s3:`` (what a plain Path made of the URL)."""
    out = make_pack(tmp_path, random_docs(300, n=20), vocab_size=300, max_len=16)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = CliRunner().invoke(app, ["export", str(out), "--to", "megatron", "-o", "s3://b/mega"])
    assert result.exit_code == 2, result.output
    assert "s3://b/mega: an export is written to a local directory" in result.output
    assert "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    with pytest.raises(OptionError, match="written to a local directory"):
        export(out, "s3://b/mega", to="megatron-bridge")
    result = CliRunner().invoke(app, ["verify", str(out), "--export", "s3://b/mega"])
    assert result.exit_code == 2 and "written to a local directory" in result.output
    # a file:// URL is a local path
    result = CliRunner().invoke(
        app, ["export", str(out), "--to", "megatron", "-o", f"file://{tmp_path / 'mega'}"]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "mega" / "text_document.idx").exists()


# -- megatron-bridge ----------------------------------------------------------------------------


def bridge_sequences(entry: dict[str, Any]) -> list[tuple[list[int], list[int], list[int]]]:
    """How NeMo / Megatron-Bridge's packed SFT dataset reads one entry: the sequences
    ``[s, e)`` of ``seq_start_id + [len(input_ids)]``, each as (inputs ``ids[s:e-1]``, targets
    ``ids[s+1:e]``, mask ``loss_mask[s:e-1]``)."""
    ids, mask = entry["input_ids"], entry["loss_mask"]
    bounds = [*entry["seq_start_id"], len(ids)]
    return [
        (ids[s : e - 1], ids[s + 1 : e], mask[s : e - 1]) for s, e in itertools.pairwise(bounds)
    ]


def read_bridge(dest: Path, max_len: int) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    table = pq.read_table(dest / f"training_{max_len}.idx.parquet")
    types = {f.name: str(f.type.value_type) for f in table.schema}
    assert types == {"input_ids": "int32", "loss_mask": "int8", "seq_start_id": "int32"}
    return table.to_pylist()


def test_bridge_export_trains_exactly_the_completions(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    examples = [
        (
            rng.integers(3, 300, rng.integers(1, 8)).tolist(),
            rng.integers(3, 300, rng.integers(1, 6)).tolist(),
        )
        for _ in range(40)
    ]
    src = write_jsonl(
        tmp_path / "pc.jsonl",
        [
            {"prompt": " ".join(f"t{i}" for i in p), "completion": " ".join(f"t{i}" for i in c)}
            for p, c in examples
        ],
    )
    out = tmp_path / "out"
    packtool.pack(
        [src], out, max_len=32, tokenizer=str(word_tokenizer(tmp_path, 300)), rows_per_shard=4
    )
    reader = packtool.open_packed(out)
    assert reader.has_labels

    report = export(out, tmp_path / "bridge", to="megatron-bridge", npy=True)
    entries = read_bridge(tmp_path / "bridge", 32)
    assert len(entries) == reader.num_rows == report.record["rows"]
    by_tokens = {}
    for entry in entries:
        assert len(entry["loss_mask"]) == len(entry["input_ids"]) <= 32
        for inputs, targets, mask in bridge_sequences(entry):
            document = (*inputs, targets[-1])
            learned = [t for t, m in zip(targets, mask, strict=True) if m]
            by_tokens[document] = learned
    # every example once, and exactly its completion and EOS learned
    expected = {(*p, *c, EOS): [*c, EOS] for p, c in examples}
    assert by_tokens == expected
    assert report.record["learned_tokens"] == sum(len(c) + 1 for _, c in examples)

    # the older .npy: the same entries (a pickle, as their loader reads it)
    old = np.load(tmp_path / "bridge" / "training_32.npy", allow_pickle=True)
    assert [dict(e) for e in old] == entries

    metadata = json.loads((tmp_path / "bridge" / "32_metadata.jsonl").read_text())
    docs_per_row = [len(r["seq_start_id"]) for r in entries]
    assert metadata == [
        {
            "dataset_max_seqlen": max(len(p) + len(c) + 1 for p, c in examples) - 1,
            "max_samples_per_bin": max(docs_per_row),
            "packing_factor": round(40 / len(entries), 2),
            "packing_efficiency": round(
                sum(len(r["input_ids"]) - len(r["seq_start_id"]) for r in entries)
                / len(entries)
                / 32
                * 100,
                2,
            ),
            "pack_size": 32,
            "min_packed_seqlen": min(len(r["input_ids"]) - len(r["seq_start_id"]) for r in entries),
        }
    ]
    assert verify_export(out, tmp_path / "bridge").ok


def test_bridge_export_of_text_learns_every_next_token(tmp_path: Path) -> None:
    docs = random_docs(300, n=30, seed=4)
    out = make_pack(tmp_path, docs, vocab_size=300, max_len=16)  # split documents too
    export(out, tmp_path / "bridge", to="megatron-bridge")
    assert not (tmp_path / "bridge" / "training_16.npy").exists()
    reader = packtool.open_packed(out)
    entries = read_bridge(tmp_path / "bridge", 16)
    for r, entry in enumerate(entries):
        row = reader.row(r)
        assert entry["input_ids"] == row.input_ids[: row.num_tokens].tolist()  # no padding
        assert entry["seq_start_id"] == [s.start for s in row.segments if not s.is_padding]
        for _, targets, mask in bridge_sequences(entry):
            assert mask == [1] * len(targets)
    assert verify_export(out, tmp_path / "bridge").ok


def test_verify_finds_a_wrong_bridge_loss_mask(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = make_pack(tmp_path, random_docs(300, n=20), vocab_size=300, max_len=16)
    dest = tmp_path / "bridge"
    export(out, dest, to="megatron-bridge")
    path = dest / "training_16.idx.parquet"
    rows = pq.read_table(path).to_pylist()
    rows[2]["loss_mask"][0] ^= 1
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(path)), path)
    record = json.loads((dest / "export.json").read_text())
    record["files"][path.name] = {
        "bytes": path.stat().st_size,
        "sha256": packtool.format.sha256_file(path),
    }
    (dest / "export.json").write_text(json.dumps(record))
    assert verify_export(out, dest).problems == [
        f"{path.name} row 2: loss_mask differs from the pack"
    ]
    with pytest.raises(OptionError, match="--npy is an option of --to megatron-bridge only"):
        export(out, tmp_path / "mega", to="megatron", npy=True)


class RowCountExporter:
    """An export of this test module's own, through the one table: the pack's row count."""

    name = "row-count"
    options: frozenset[str] = frozenset()

    def write(self, reader: Any, staging: Path, **options: Any) -> dict[str, Any]:
        path = staging / "rows.txt"
        path.write_text(f"{reader.num_rows}\n")
        info = {"bytes": path.stat().st_size, "sha256": packtool.format.sha256_file(path)}
        return export_common.write_export_manifest(
            staging,
            {
                "to": self.name,
                "source": export_common.pack_fingerprint(reader),
                "rows": reader.num_rows,
                "files": {path.name: info},
            },
        )

    def problems(self, reader: Any, dest: Path, record: dict[str, Any]) -> list[str]:
        found = int((dest / "rows.txt").read_text())
        return [] if found == reader.num_rows else [f"rows.txt: {found} rows"]


EXPORTER = RowCountExporter()


def test_every_export_is_a_line_of_the_one_table() -> None:
    assert export_registry.names() == ["megatron", "megatron-bridge", "litdata"]
    for line in export_registry.EXPORTS:
        assert export_registry.exporter(line.name).name == line.name
        assert f"{line.name} ({line.summary})" in export_registry.choices_help()
    result = CliRunner().invoke(app, ["export", "--help"], terminal_width=400)
    assert export_registry.choices_help() in " ".join(result.stdout.split())


def test_a_new_export_is_one_module_and_one_table_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = export_registry.Export("row-count", "the number of rows", __name__)
    monkeypatch.setattr(export_registry, "EXPORTS", (*export_registry.EXPORTS, line))
    out = make_pack(tmp_path, random_docs(300, n=20), vocab_size=300, max_len=16)
    dest = tmp_path / "rows"
    result = CliRunner().invoke(app, ["export", str(out), "--to", "row-count", "-o", str(dest)])
    assert result.exit_code == 0, result.output
    assert int((dest / "rows.txt").read_text()) == packtool.open_packed(out).num_rows
    result = CliRunner().invoke(app, ["verify", str(out), "--export", str(dest)])
    assert result.exit_code == 0 and "export (row-count) verified" in result.stdout
    with pytest.raises(OptionError, match="--npy is an option of --to megatron-bridge only"):
        export(out, tmp_path / "again", to="row-count", npy=True)
