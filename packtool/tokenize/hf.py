"""The reference backend: Hugging Face `tokenizers`.

It loads every tokenizer.json packtool reads, and its ids are the ones the others are compared
with (the parity gate, ``--check-sample``, ``verify --against``). :class:`~packtool.tokenize.
HFTokenizer` keeps its copies (one that parses special-token strings, one that encodes them as
text) and encodes with them directly, so its line in the table has no ``load``.
"""

from __future__ import annotations

from typing import Any

from ..errors import TokenizerError
from ..tokenizer_file import turned_off_notice
from .backend import ANCHOR, BackendSpec

__all__ = ["BACKEND", "add_anchor", "disable_truncation_and_padding", "load_hf"]


def load_hf(json_bytes: bytes, name: str, *, as_is: bool = False) -> Any:
    """`tokenizers`' copy of a tokenizer.json, truncation and padding off (``as_is``: as
    the file has them; :class:`HFTokenizer` turns them off)."""
    from tokenizers import Tokenizer as RustTokenizer

    try:
        tok = RustTokenizer.from_str(json_bytes.decode("utf-8"))
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
        raise TokenizerError(f"{name}: cannot load as a tokenizers tokenizer.json: {e}") from e
    if not as_is:
        disable_truncation_and_padding(tok)
    return tok


def disable_truncation_and_padding(tok: Any) -> str | None:
    """Turn off a loaded tokenizer's truncation and padding; say what was on (``None``:
    neither)."""
    truncation, padding = tok.truncation, tok.padding
    if truncation:
        tok.no_truncation()
    if padding:
        tok.no_padding()
    return turned_off_notice(truncation, padding)


def add_anchor(tok: Any, expected_id: int) -> None:
    """Add :data:`ANCHOR` to a `tokenizers` copy, at ``expected_id``."""
    from tokenizers import AddedToken

    if tok.token_to_id(ANCHOR) is None:
        tok.add_tokens([AddedToken(ANCHOR, special=False, normalized=False)])
    if tok.token_to_id(ANCHOR) != expected_id:  # pragma: no cover - tokenizers' contract
        raise TokenizerError("packtool's anchor token did not get the next id")


BACKEND = BackendSpec(
    name="hf",
    package="tokenizers",
    refuses=lambda file: None,
    load=None,  # HFTokenizer's own copies
    fast=False,
)
