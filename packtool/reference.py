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
  `transformers` is installed: packtool's ids stay tokenizer.json's. Its verdict is kept in
  the user's cache (keyed by the tokenizer files' bytes and transformers' version), so only
  the first pack with a tokenizer directory waits for it.
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
    import of transformers here, and no lock held while the pack tokenizes), or its verdict
    from an earlier run (``cached``: the note, or ``""`` for none; ``process`` is then None)."""

    tokenizer: Any
    directory: Any
    tokenizer_class: str
    process: subprocess.Popen[str] | None
    key: str = ""
    cached: dict[str, Any] | None = None

    def note(self) -> str | None:
        """The note, once the probe is done (``None``: the same ids, or no answer)."""
        if self.process is None:
            return self._note(self.cached or {})
        try:
            out, _ = self.process.communicate(timeout=PROBE_TIMEOUT)
            theirs_all = json.loads(out) if self.process.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError):
            self.stop()
            return None
        if not isinstance(theirs_all, list) or len(theirs_all) != len(PROBE_STRINGS):
            return None  # transformers cannot load it: nothing to compare with (not cached)
        verdict = self._compare(theirs_all)
        _save_verdict(self.key, verdict)
        return self._note(verdict)

    def stop(self) -> None:
        """End the probe's process (a pack that failed or was interrupted does not wait)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.communicate()

    def _compare(self, theirs_all: list[Any]) -> dict[str, Any]:
        """The verdict: how many probe strings differ, and the first one's ids both ways."""
        ours_all = self.tokenizer.encode_batch(list(PROBE_STRINGS), add_special_tokens=True)
        differ = [
            (text, list(ours), list(theirs))
            for text, ours, theirs in zip(PROBE_STRINGS, ours_all, theirs_all, strict=True)
            if list(ours) != list(theirs)
        ]
        if not differ:
            return {"differ": 0}
        text, ours, theirs = differ[0]
        return {"differ": len(differ), "text": text, "ours": ours[:6], "theirs": theirs[:6]}

    def _note(self, verdict: dict[str, Any]) -> str | None:
        if not verdict.get("differ"):
            return None
        return (
            f"transformers' AutoTokenizer for {self.directory} (tokenizer_class "
            f"{self.tokenizer_class}) gives other ids than its tokenizer.json for "
            f"{verdict['differ']} of {len(PROBE_STRINGS)} probe strings (e.g. "
            f"{verdict['text']!r}: {verdict['ours']} here, {verdict['theirs']} there); packtool "
            "packs tokenizer.json's ids: train with PreTrainedTokenizerFast(tokenizer_file=...), "
            "and see `packtool verify --against ... --reference transformers` "
            "(docs/tokenization.md)"
        )


_PROBE_FORMAT = 1  # bump when PROBE_STRINGS or the verdict change: cached verdicts are keyed by it


def _probe_key(directory: Any, tokenizer_class: str) -> str | None:
    """The key of a probe's verdict: the directory's tokenizer files (their bytes), the class,
    and the version of transformers that would load them (``None``: no version to key by)."""
    import hashlib

    from .tokenize.backend import package_version

    version = package_version("transformers")  # read without importing importlib.metadata
    if version == "unknown":
        return None
    h = hashlib.sha256(f"{_PROBE_FORMAT}|{tokenizer_class}|{version}".encode())
    for path in sorted(directory.iterdir()):
        if path.is_file() and (
            path.name.startswith("tokenizer")
            or path.name in ("special_tokens_map.json", "added_tokens.json", "vocab.json")
            or path.suffix in (".model", ".tiktoken")
        ):
            h.update(path.name.encode() + b"\0")
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()


def _verdict_path(key: str) -> Any:
    from .fs import user_cache_dir

    return user_cache_dir() / "reference" / f"{key}.json"


def _cached_verdict(key: str) -> dict[str, Any] | None:
    """A probe's verdict from an earlier run on the same files, or ``None`` if none."""
    try:
        verdict = json.loads(_verdict_path(key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(verdict, dict) and isinstance(verdict.get("differ"), int)
    return verdict if ok else None


def _save_verdict(key: str, verdict: dict[str, Any]) -> None:
    """Keep a probe's verdict for the next run (best effort: a read-only cache is no error)."""
    if not key:
        return
    path = _verdict_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(verdict), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass


def start_probe(tokenizer: Any) -> Probe | None:
    """Start the probe of ``tokenizer``'s directory in a process of its own, where it applies
    (a local directory with a tokenizer_config.json whose ``tokenizer_class`` rebuilds the
    pipeline, and transformers installed); ``None`` where it does not. A verdict kept from an
    earlier run on the same files and transformers version is used instead of a process."""
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
    key = _probe_key(directory, str(cls))
    if key is None:
        return None
    cached = _cached_verdict(key)
    if cached is not None:
        return Probe(tokenizer, directory, str(cls), None, key, cached)
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
    process = subprocess.Popen(
        [sys.executable, "-c", _PROBE_SCRIPT, str(directory), json.dumps(PROBE_STRINGS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    return Probe(tokenizer, directory, str(cls), process, key)


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
