"""fastokens: a Rust tokenizer that loads tokenizer.json and encodes a batch into one flat
buffer of ids (``encode_batch_flat``). Faster than `tokenizers` on SentencePiece-style files
(Metaspace, byte fallback); it refuses the models it does not know ("unsupported model type")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..tokenizer_file import TokenizerFile
from .backend import ANCHOR, BackendSpec, Flat

__all__ = ["BACKEND", "FastokensEngine"]


@dataclass(frozen=True)
class _AddedToken:
    """packtool's anchor as fastokens' ``add_tokens`` reads an added token (importing
    tokenizers for one costs 10 ms)."""

    content: str
    single_word: bool = False
    lstrip: bool = False
    rstrip: bool = False
    normalized: bool = False
    special: bool = False


class FastokensEngine:
    """fastokens' copy of a tokenizer.json: truncation and padding off, :data:`ANCHOR` added."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def encode(self, texts: list[str], add_special: bool, parse_special: bool) -> Flat:
        ids, offsets = self.tok.encode_batch_flat(
            texts, add_special_tokens=add_special, split_special_tokens=not parse_special
        )
        return Flat.from_offsets(np.frombuffer(ids, "<u4"), np.frombuffer(offsets, "<u8"))

    def token_to_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)  # type: ignore[no-any-return]


def load(json_bytes: bytes, anchor_id: int) -> FastokensEngine:
    import fastokens

    tok = fastokens.Tokenizer.from_json_str(json_bytes.decode("utf-8"))
    tok.no_truncation()
    tok.no_padding()
    if tok.token_to_id(ANCHOR) is None:  # fastokens takes any object of these attributes
        tok.add_tokens([_AddedToken(ANCHOR)])
    if tok.token_to_id(ANCHOR) != anchor_id:
        raise ValueError("fastokens gave packtool's anchor token another id than tokenizers")
    return FastokensEngine(tok)


def _suits(file: TokenizerFile) -> int:
    # docs/performance.md: faster than gigatoken on SentencePiece-style files (Llama 2,
    # Gemma), slower on byte-level BPE.
    return 0 if _byte_level(file) else 2


def _byte_level(file: TokenizerFile) -> bool:
    return "ByteLevel" in repr(file.pre_tokenizer)


BACKEND = BackendSpec(
    name="fastokens",
    package="fastokens",
    refuses=lambda file: None,
    load=load,
    suits=_suits,
)
