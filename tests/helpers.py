"""Independent checks of a packed output, written plainly against pyarrow (not via packtool's
reader), so that the tests do not trust the code they test."""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa


def read_rows(out_dir: Path) -> tuple[dict, list[dict]]:
    """The manifest and every row (as Python lists), shards in manifest order, read with
    pyarrow alone as docs/format.md tells: ``doc_ids`` plus the shard's ``doc_offset``."""
    manifest = json.loads((out_dir / "manifest.json").read_text())
    rows: list[dict] = []
    for shard in manifest["shards"]:
        with pa.memory_map(str(out_dir / shard["file"])) as src:
            table = pa.ipc.open_stream(src).read_all()
        assert table.num_rows == shard["rows"]
        for row in table.to_pylist():
            row["doc_ids"] = [d + shard.get("doc_offset", 0) for d in row["doc_ids"]]
            rows.append(row)
    return manifest, rows


def assert_row_invariants(row: dict, max_len: int, pad_id: int) -> None:
    """The written invariants of one row (docs/format.md)."""
    ids, pos, cu = row["input_ids"], row["position_ids"], row["cu_seqlens"]
    n, docs, chunks = row["num_tokens"], row["doc_ids"], row["chunk_ids"]
    assert len(ids) == max_len and len(pos) == max_len
    assert cu[0] == 0 and cu[-1] == max_len
    assert all(b > a for a, b in itertools.pairwise(cu)), cu
    assert len(docs) == len(chunks)
    padded = n < max_len
    assert len(cu) - 1 == len(docs) + (1 if padded else 0)
    assert cu[len(docs)] == n, (cu, n)
    for i in range(len(cu) - 1):
        assert pos[cu[i] : cu[i + 1]] == list(range(cu[i + 1] - cu[i])), i
    assert all(t == pad_id for t in ids[n:])
    if "labels" in row and row["labels"] is not None:
        assert all(label == -100 for label in row["labels"][n:])


def documents_from_rows(rows: list[dict]) -> dict[int, list[int]]:
    """Each document's tokens, its chunks joined in chunk order."""
    pieces: dict[int, dict[int, list[int]]] = defaultdict(dict)
    for row in rows:
        cu = row["cu_seqlens"]
        for k, (doc, chunk) in enumerate(zip(row["doc_ids"], row["chunk_ids"], strict=True)):
            assert chunk not in pieces[doc], f"chunk {chunk} of doc {doc} appears twice"
            pieces[doc][chunk] = row["input_ids"][cu[k] : cu[k + 1]]
    out = {}
    for doc, chunks in pieces.items():
        assert sorted(chunks) == list(range(len(chunks))), f"doc {doc} misses chunks"
        out[doc] = [t for c in range(len(chunks)) for t in chunks[c]]
    return out


def documents_with_sources(rows: list[dict]) -> Counter:
    """The multiset of a mixture's documents in ``rows``: ``(doc_id, source_id, tokens)``, a
    document's chunks joined in chunk order (each chunk once, one source per document)."""
    chunks: dict[int, dict[int, tuple[int, ...]]] = defaultdict(dict)
    source: dict[int, int] = {}
    for row in rows:
        cu = row["cu_seqlens"]
        for k, (doc, chunk, src) in enumerate(
            zip(row["doc_ids"], row["chunk_ids"], row["source_ids"], strict=True)
        ):
            assert chunk not in chunks[doc], f"chunk {chunk} of doc {doc} appears twice"
            chunks[doc][chunk] = tuple(row["input_ids"][cu[k] : cu[k + 1]])
            assert source.setdefault(doc, src) == src, f"doc {doc} has two sources"
    out: Counter = Counter()
    for doc, parts in chunks.items():
        assert sorted(parts) == list(range(len(parts))), f"doc {doc} misses chunks"
        out[(doc, source[doc], sum((parts[c] for c in range(len(parts))), ()))] += 1
    return out


def as_np(x: list[int]) -> np.ndarray:
    return np.asarray(x, dtype=np.int64)


def tiny_llama(vocab: int, attn: str = "sdpa") -> Any:
    """A 2-layer Llama from config (seeded random weights, float32) for the trainer and
    alignment tests; ``attn``: its attention implementation."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(
        config, attn_implementation=attn, dtype=torch.float32
    )
