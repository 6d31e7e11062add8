"""What a pack's tokens are compared with: the EOS it appends, and `transformers`' view of the
tokenizer.

- :func:`eos_appended` and :func:`eos_note`: the EOS token appended to every document (named
  in the summary and ``--json``), and a note when it is the end-of-turn token of a chat
  model's config (``<|im_end|>``, ``<|eot_id|>``...), which pretraining text does not want.
- :func:`start_probe` and :func:`probe_note`: where ``transformers.AutoTokenizer`` for the
  tokenizer's directory would give other ids than its tokenizer.json (a ``tokenizer_class``
  that rebuilds the pipeline: Llama 2's ``LlamaTokenizer`` drops a leading space, GPT-4o's
  ``GPT2Tokenizer`` swaps the pre-tokenizer), a note from a probe of a few strings. The probe
  runs in a thread while the pack tokenizes, and only for such a class, when `transformers` is
  importable: packtool's ids stay tokenizer.json's.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import threading
from collections.abc import Sequence
from typing import Any

__all__ = [
    "END_OF_TURN_TOKENS",
    "PROBE_STRINGS",
    "REFERENCES",
    "eos_appended",
    "eos_note",
    "probe_note",
    "start_probe",
    "transformers_encoder",
    "transformers_tokenizer",
]

END_OF_TURN_TOKENS = frozenset(
    {"<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|return|>", "<|end|>", "<|eom_id|>"}
)
"""Tokens that close a chat turn, not a document (``<｜end▁of▁sentence｜>``, ``</s>`` and
``<|endoftext|>`` are real ends of text)."""

_DOCUMENT_ENDS = ("<|endoftext|>", "<|end_of_text|>", "<eos>", "</s>", "<｜end▁of▁sentence｜>")
"""End-of-text tokens to suggest instead, the first one the vocabulary has."""

GENERIC_CLASSES = frozenset({None, "PreTrainedTokenizerFast", "TokenizersBackend"})
"""``tokenizer_class`` values with which transformers loads tokenizer.json as it is."""

PROBE_STRINGS = (
    "Hello world",
    " hello",
    "  hello",
    "a\n\nb  c",
    "don't stop",
    "12345 67",
    "héllo wörld",
    "def f(x):\n    return x",
    "tab\there",
)
"""The strings of the probe: leading spaces, whitespace runs, digits, accents, code."""


def eos_appended(tokenizer: Any, plan: Any) -> dict[str, Any] | None:
    """``{"token": text, "id": id}`` of the EOS appended to every document, or ``None``."""
    if not getattr(plan, "add_eos", False):
        return None
    eos_id = tokenizer.special.eos_id
    if eos_id is None:
        return None
    to_token = getattr(tokenizer, "id_to_token", None)
    return {"token": to_token(eos_id) if to_token else None, "id": int(eos_id)}


def eos_note(tokenizer: Any, plan: Any) -> str | None:
    """A note when text documents get a chat end-of-turn token as their EOS."""
    from .instruct import InputShape

    eos = eos_appended(tokenizer, plan)
    if eos is None or plan.shape is not InputShape.TEXT or eos["token"] not in END_OF_TURN_TOKENS:
        return None
    instead = next(
        (t for t in _DOCUMENT_ENDS if t != eos["token"] and tokenizer.token_to_id(t) is not None),
        None,
    )
    how = f"--eos-token {instead}" if instead else "--eos-token TOKEN, or --no-eos"
    return (
        f"the EOS appended to every document is {eos['token']} (id {eos['id']}), the "
        "end-of-turn token of this chat model's tokenizer config, not an end of text: for "
        f"pretraining text, choose another with {how}"
    )


def transformers_tokenizer(directory: Any) -> Any:
    """``transformers.AutoTokenizer`` of a tokenizer directory (imported here, lazily)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


def _probe(tokenizer: Any, directory: Any, cls: str) -> str | None:
    try:
        auto = transformers_tokenizer(directory)
    except Exception:  # transformers cannot load it: nothing to compare with
        return None
    differ: list[tuple[str, Sequence[int], Sequence[int]]] = []
    for text in PROBE_STRINGS:
        ours = list(tokenizer.encode_batch([text], add_special_tokens=True)[0])
        theirs = list(auto(text, add_special_tokens=True)["input_ids"])
        if ours != theirs:
            differ.append((text, ours, theirs))
    if not differ:
        return None
    text, ours, theirs = differ[0]
    return (
        f"transformers' AutoTokenizer for {directory} (tokenizer_class {cls}) gives other ids "
        f"than its tokenizer.json for {len(differ)} of {len(PROBE_STRINGS)} probe strings (e.g. "
        f"{text!r}: {ours[:6]} here, {theirs[:6]} there); packtool packs tokenizer.json's ids: "
        "train with PreTrainedTokenizerFast(tokenizer_file=...), and see `packtool verify "
        "--against ... --reference transformers` (docs/tokenization.md)"
    )


def start_probe(tokenizer: Any) -> concurrent.futures.Future[str | None] | None:
    """Start the probe of ``tokenizer``'s directory in a thread, where it applies (a directory
    with a tokenizer_config.json whose ``tokenizer_class`` rebuilds the pipeline, and
    transformers importable); ``None`` where it does not."""
    directory = getattr(tokenizer, "directory", None)
    config = getattr(tokenizer, "config", None) or {}
    cls = config.get("tokenizer_class")
    if directory is None or cls in GENERIC_CLASSES:
        return None
    if not (directory / "tokenizer_config.json").is_file():
        return None
    if importlib.util.find_spec("transformers") is None:
        return None
    future: concurrent.futures.Future[str | None] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(_probe(tokenizer, directory, str(cls)))
        except BaseException as e:  # pragma: no cover - reported as no note
            future.set_exception(e)

    threading.Thread(target=run, name="packtool-transformers-probe", daemon=True).start()
    return future


def probe_note(future: concurrent.futures.Future[str | None] | None) -> str | None:
    """The probe's note, once it is done (``None``: nothing to say)."""
    if future is None:
        return None
    try:
        return future.result()
    except Exception:
        return None


REFERENCES = ("file", "transformers")
"""``verify --against --reference``: tokenizer.json (as ``pack``), or transformers'
``AutoTokenizer`` for the tokenizer's directory."""


def transformers_encoder(tokenizer: Any, encoder: Any) -> Any:
    """A :class:`~packtool.tokenize.DocumentEncoder` with ``encoder``'s settings whose ids come
    from ``transformers.AutoTokenizer`` for ``tokenizer``'s directory (BOS and EOS added as
    ``pack`` adds them), for ``verify --against --reference transformers``."""
    from .errors import OptionError
    from .tokenize import DocumentEncoder

    if not isinstance(encoder, DocumentEncoder):
        raise OptionError(
            "--reference transformers compares text documents with AutoTokenizer; the ids of "
            "chats are apply_chat_template's and of prompt/completion pairs their pieces' "
            "(docs/instruct.md): use --reference file"
        )
    directory = getattr(tokenizer, "directory", None)
    if directory is None:
        raise OptionError(
            f"--reference transformers needs a tokenizer directory; {tokenizer.name} has none"
        )
    if importlib.util.find_spec("transformers") is None:
        raise OptionError("--reference transformers needs transformers: pip install transformers")
    try:
        auto = transformers_tokenizer(directory)
    except Exception as e:
        raise OptionError(
            f"--reference transformers: AutoTokenizer cannot load {directory}: {e}"
        ) from None

    class TransformersEncoder(DocumentEncoder):
        def tokenize(self, texts: Sequence[str]) -> Sequence[Any]:
            return [
                list(
                    auto(
                        text,
                        add_special_tokens=self._add_special,
                        split_special_tokens=not self.parse_special,
                    )["input_ids"]
                )
                for text in texts
            ]

    return TransformersEncoder(
        tokenizer, add_eos=encoder.add_eos, bos=encoder.bos, parse_special=encoder.parse_special
    )
