"""What a pack's tokens are compared with: the EOS it appends, and `transformers`' view of the
tokenizer.

- :func:`eos_appended` and :func:`eos_note`: the EOS token appended to every document (named
  in the summary and ``--json``), and a note when it is the end-of-turn token of a chat
  model's config (``<|im_end|>``, ``<|eot_id|>``...), which pretraining text does not want.
- :func:`start_probe` and :func:`probe_note`: where ``transformers.AutoTokenizer`` for the
  tokenizer's directory would give other ids than its tokenizer.json (a ``tokenizer_class``
  that rebuilds the pipeline: Llama 2's ``LlamaTokenizer`` drops a leading space, GPT-4o's
  ``GPT2Tokenizer`` swaps the pre-tokenizer), a note from a probe of a few strings. The probe
  runs in a process of its own while the pack tokenizes, and only for such a class, when
  `transformers` is installed: packtool's ids stay tokenizer.json's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "END_OF_TURN_TOKENS",
    "PROBE_STRINGS",
    "REFERENCES",
    "Probe",
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


_PROBE_SCRIPT = """
import json, sys
from transformers import AutoTokenizer
auto = AutoTokenizer.from_pretrained(sys.argv[1])
print(json.dumps([list(auto(s, add_special_tokens=True)["input_ids"])
                  for s in json.loads(sys.argv[2])]))
"""
PROBE_TIMEOUT = 120.0
"""Seconds the probe may take (importing transformers is most of it); past it, no note."""


@dataclass
class Probe:
    """The probe of a tokenizer directory with transformers, running in its own process (no
    import of transformers here, and no lock held while the pack tokenizes)."""

    tokenizer: Any
    directory: Any
    tokenizer_class: str
    process: subprocess.Popen[str]

    def note(self) -> str | None:
        """The note, once the probe is done (``None``: the same ids, or no answer)."""
        try:
            out, _ = self.process.communicate(timeout=PROBE_TIMEOUT)
            theirs_all = json.loads(out) if self.process.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError):
            self.process.kill()
            self.process.communicate()
            return None
        if not isinstance(theirs_all, list) or len(theirs_all) != len(PROBE_STRINGS):
            return None  # transformers cannot load it: nothing to compare with
        ours_all = self.tokenizer.encode_batch(list(PROBE_STRINGS), add_special_tokens=True)
        differ = [
            (text, list(ours), list(theirs))
            for text, ours, theirs in zip(PROBE_STRINGS, ours_all, theirs_all, strict=True)
            if list(ours) != list(theirs)
        ]
        if not differ:
            return None
        text, ours, theirs = differ[0]
        return (
            f"transformers' AutoTokenizer for {self.directory} (tokenizer_class "
            f"{self.tokenizer_class}) gives other ids than its tokenizer.json for {len(differ)} "
            f"of {len(PROBE_STRINGS)} probe strings (e.g. {text!r}: {ours[:6]} here, "
            f"{theirs[:6]} there); packtool packs tokenizer.json's ids: train with "
            "PreTrainedTokenizerFast(tokenizer_file=...), and see `packtool verify --against "
            "... --reference transformers` (docs/tokenization.md)"
        )


def start_probe(tokenizer: Any) -> Probe | None:
    """Start the probe of ``tokenizer``'s directory in a process of its own, where it applies
    (a local directory with a tokenizer_config.json whose ``tokenizer_class`` rebuilds the
    pipeline, and transformers installed); ``None`` where it does not."""
    from .fs import is_url

    directory = getattr(tokenizer, "directory", None)
    config = getattr(tokenizer, "config", None) or {}
    cls = config.get("tokenizer_class")
    if directory is None or cls in GENERIC_CLASSES or is_url(str(directory)):
        return None
    if not (directory / "tokenizer_config.json").is_file():
        return None
    if importlib.util.find_spec("transformers") is None:
        return None
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
    process = subprocess.Popen(
        [sys.executable, "-c", _PROBE_SCRIPT, str(directory), json.dumps(PROBE_STRINGS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    return Probe(tokenizer, directory, str(cls), process)


def probe_note(probe: Probe | None) -> str | None:
    """The probe's note, once it is done (``None``: nothing to say)."""
    return None if probe is None else probe.note()


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
