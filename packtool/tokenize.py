"""Tokenizer loading and document encoding.

The tokenizer sits behind a small :class:`Tokenizer` protocol, so tests can use a fake and
Hugging Face `tokenizers` is one implementation (:class:`HFTokenizer`).

``load_tokenizer(spec)`` takes, in this order:

- ``None``: the bundled default, a byte-level BPE (8,192 tokens) trained on the sample corpus
  by ``sample_data/train_tokenizer.py``; it works offline;
- a path to a ``tokenizer.json``;
- a local model directory holding ``tokenizer.json`` (and, optionally,
  ``tokenizer_config.json``, which names the special tokens);
- a hub name such as ``gpt2``: fetched with ``huggingface_hub`` when online or found in the local
  cache; offline and not cached, a clear :class:`~packtool.errors.TokenizerError`.

Fidelity rules (docs/tokenization.md), all kept here and nowhere else:

- **No truncation, no padding.** A ``tokenizer.json`` may carry ``"truncation"`` and ``"padding"``
  (files exported from encoder models often do). Both are turned off at load, whatever loads the
  tokenizer, and :attr:`HFTokenizer.notice` says what the file had on.
- **Data is text.** Document text, prompts, completions and message contents are encoded with
  special-token strings treated as ordinary text (``encode_special_tokens``); ``parse_special``
  restores parsing for data that holds markup on purpose. Added tokens that are not special
  (tool-call markers and the like) are vocabulary and match as ``tokenizers`` matches them.
- **Special tokens are the tokenizer's own.** EOS, BOS and PAD come from ``tokenizer_config.json``
  when it names them, else from the usual names (``<|endoftext|>``, ``</s>``, ``<pad>``...), but
  only where that name is an added token marked special: a byte-level vocabulary's ordinary
  merge spelled ``<s>`` is not a BOS. ``--eos-token`` and friends override.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import itertools
import json
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .errors import TokenizerError
from .fs import AnyPath, as_path, is_url
from .tokenizer_file import SpecialTokens, TokenizerFile, resolve_special_tokens, turned_off_notice

__all__ = [
    "DEFAULT_TOKENIZER",
    "Backend",
    "DocumentEncoder",
    "EncodedBatch",
    "HFTokenizer",
    "SpecialStringFinder",
    "SpecialTokens",
    "Tokenizer",
    "load_tokenizer",
    "set_tokenizer_threads",
]

DEFAULT_TOKENIZER = "packtool-default"
_DATA = Path(__file__).parent / "_data"

ANCHOR = "\ufdd0packtool-anchor\ufdd1"
"""A non-special added token put in front of a piece of text that does not start a document, so
the piece is encoded as it is in the middle of a text (after an added token): Metaspace's
``prepend_scheme="first"`` then adds no word-start mark. Its id is dropped again. Made of Unicode
noncharacters, which never appear in interchanged text, and added to packtool's own copies of the
tokenizer only."""


@runtime_checkable
class Tokenizer(Protocol):
    """What packtool needs of a tokenizer."""

    name: str
    sha256: str
    special: SpecialTokens

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = True, parse_special: bool = False
    ) -> list[list[int]]:
        """Ids of ``texts``; special-token strings in them are text unless ``parse_special``."""
        ...

    def num_special_tokens_to_add(self) -> int: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...


class HFTokenizer:
    """A Hugging Face tokenizer file: its special tokens and provenance, read from its JSON
    (:class:`~packtool.tokenizer_file.TokenizerFile`), and `tokenizers` loaded from it only
    when something is encoded or decoded with `tokenizers` (a run that encodes with fastokens
    never loads it, unless a batch falls back or the parity gate has no cached verdict).

    ``tokenizer``: a `tokenizers.Tokenizer` already loaded from ``json_bytes`` (or ``None``).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        name: str,
        json_bytes: bytes,
        config: dict[str, Any] | None = None,
        eos_token: str | None = None,
        bos_token: str | None = None,
        pad_token: str | None = None,
        directory: Path | None = None,
        fast: concurrent.futures.Future[tuple[Any, str]] | None = None,
        file: TokenizerFile | None = None,
    ) -> None:
        self.file = file if file is not None else TokenizerFile.parse(json_bytes)
        self.notice = self.file.turned_off()
        if tokenizer is not None:
            _disable_truncation_and_padding(tokenizer)
        self.name = name
        self.directory = directory  # where tokenizer.json was found (chat_template.jinja)
        self.json_bytes = json_bytes
        self.sha256 = hashlib.sha256(json_bytes).hexdigest()
        self.config = config or {}
        known = self.file.token_to_id(ANCHOR)  # a file saved from one of packtool's copies
        # The bound of the ids (every id is below it), and the id packtool's anchor gets.
        self.vocab_size = self.file.next_id if known is None else known
        self.anchor_id = self.vocab_size
        if known is None and self.file.added_next_id != self.anchor_id:
            raise TokenizerError(_gapped_vocabulary(name, self.file))
        self._special_ids = self.file.special_ids
        self.special_strings: tuple[str, ...] = self.file.special_strings
        self.added_strings: tuple[str, ...] = self.file.added_strings
        # Copies of the Rust tokenizer, made as they are first needed: one parses
        # special-token strings (chat templates, --parse-special), one encodes them as text.
        # Each also knows ANCHOR; a copy's mode never changes, so threads may share them.
        self._lock = threading.Lock()
        self._copies: dict[bool, Any] = {}
        self._loaded: Any = tokenizer
        try:
            self.special = resolve_special_tokens(
                self.file,
                self.config,
                overrides={"eos": eos_token, "bos": bos_token, "pad": pad_token},
                vocab_size=self.vocab_size,
                name=name,
            )
        except LookupError as e:
            raise TokenizerError(str(e.args[0])) from None
        self._n_special = self.file.num_special_tokens_to_add()
        self._id_to_token: dict[int, str] | None = None
        self._fast = fast

    def fast(self) -> tuple[Any, str]:
        """fastokens' copy of this tokenizer (truncation and padding off, :data:`ANCHOR`
        added), or ``None`` and why not. Loaded once, in a thread started by
        :func:`load_tokenizer` (``backend``) or here."""
        with self._lock:
            if self._fast is None:
                self._fast = _start_fast_load(self.json_bytes)
            future = self._fast
        fast, why = future.result()
        if fast is not None and fast.token_to_id(ANCHOR) != self.anchor_id:
            return None, "fastokens gave packtool's anchor token another id than tokenizers"
        return fast, why

    @property
    def hf_loaded(self) -> bool:
        """Whether `tokenizers` has loaded this file in this process (so far)."""
        return self._loaded is not None or bool(self._copies)

    def _copy(self, parse_special: bool) -> Any:
        """The Rust tokenizer that parses special-token strings, or encodes them as text."""
        copy = self._copies.get(parse_special)
        if copy is not None:
            return copy
        with self._lock:
            if parse_special not in self._copies:
                if self._loaded is not None:
                    tok, self._loaded = self._loaded, None
                else:
                    tok = _load_hf(self.json_bytes, self.name)
                _add_anchor(tok, self.anchor_id)
                tok.encode_special_tokens = not parse_special
                self._copies[parse_special] = tok
        return self._copies[parse_special]

    def _any(self) -> Any:
        """A Rust tokenizer of either mode, for what the mode does not change (decoding)."""
        loaded = self._loaded
        if loaded is not None:
            return loaded
        for copy in list(self._copies.values()):
            return copy
        return self._copy(True)

    @property
    def tokenizer(self) -> Any:
        """The `tokenizers.Tokenizer` as Hugging Face uses it: special-token strings parsed,
        truncation and padding off (plus packtool's :data:`ANCHOR`)."""
        return self._copy(True)

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of the added tokens marked special."""
        return self._special_ids

    def is_special_id(self, tid: int) -> bool:
        """Whether ``tid`` is an added token marked special."""
        return tid in self._special_ids

    def encodings(
        self, texts: Sequence[str], add_special_tokens: bool = True, parse_special: bool = False
    ) -> list[Any]:
        """The `tokenizers` `Encoding` of each text (see :meth:`encode_batch`)."""
        return self._copy(parse_special).encode_batch_fast(
            list(texts), add_special_tokens=add_special_tokens
        )

    def encode_with_offsets(
        self, text: str, parse_special: bool
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids of ``text`` and each one's character span, no post-processor tokens."""
        enc = self._copy(parse_special).encode(text, add_special_tokens=False)
        return list(enc.ids), [tuple(o) for o in enc.offsets]

    def encode_batch_with_offsets(
        self, texts: Sequence[str], parse_special: bool
    ) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """:meth:`encode_with_offsets` of each text, in one batch (the tokenizer's threads)."""
        encodings = self._copy(parse_special).encode_batch(list(texts), add_special_tokens=False)
        return [(e.ids, e.offsets) for e in encodings]  # lists of ints, of (start, end)

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = True, parse_special: bool = False
    ) -> list[list[int]]:
        """Ids of ``texts``; special-token strings in them are text unless ``parse_special``."""
        return [e.ids for e in self.encodings(texts, add_special_tokens, parse_special)]

    def num_special_tokens_to_add(self) -> int:
        if self._n_special is None:  # a post-processor the file reader does not know
            self._n_special = int(self._any().num_special_tokens_to_add(False))
        return int(self._n_special)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self._any().decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        tid = self.file.token_to_id(token)
        return None if tid is None or tid >= self.vocab_size else int(tid)

    def id_to_token(self, tid: int) -> str | None:
        if not 0 <= tid < self.vocab_size:
            return None
        if self._id_to_token is None:
            table = {i: t for t, i in self.file.vocab.items()}
            table.update((a.id, a.content) for a in self.file.added)
            self._id_to_token = table
        return self._id_to_token.get(int(tid))

    def describe(self) -> dict[str, Any]:
        """The manifest's record of this tokenizer."""
        return {
            "name": self.name,
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "special_tokens": {
                "eos_id": self.special.eos_id,
                "bos_id": self.special.bos_id,
                "pad_id": self.special.pad_id,
            },
            "turned_off": self.notice,
        }


def _load_hf(json_bytes: bytes, name: str, *, as_is: bool = False) -> Any:
    """`tokenizers`' copy of a tokenizer.json, truncation and padding off (``as_is``: as
    the file has them; :class:`HFTokenizer` turns them off)."""
    from tokenizers import Tokenizer as RustTokenizer

    try:
        tok = RustTokenizer.from_str(json_bytes.decode("utf-8"))
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
        raise TokenizerError(f"{name}: cannot load as a tokenizers tokenizer.json: {e}") from e
    if not as_is:
        _disable_truncation_and_padding(tok)
    return tok


def _disable_truncation_and_padding(tok: Any) -> str | None:
    """Turn off a loaded tokenizer's truncation and padding; say what was on (``None``:
    neither)."""
    truncation, padding = tok.truncation, tok.padding
    if truncation:
        tok.no_truncation()
    if padding:
        tok.no_padding()
    return turned_off_notice(truncation, padding)


def _gapped_vocabulary(name: str, file: TokenizerFile) -> str:
    """Why packtool cannot add its anchor token to a vocabulary with gaps in its ids."""
    top = file.next_id - 1
    where = name if name.endswith(".json") else f"{name.rstrip('/')}/tokenizer.json"
    return (
        f"{where}: the vocabulary's ids have gaps ({len(file.vocab):,} tokens, the highest id "
        f"{top:,}): tokenizers gives a token added to it the id {file.added_next_id:,}, not "
        f"one above every id ({file.next_id:,}) as packtool's anchor token needs; renumber "
        "the ids without gaps"
    )


def _add_anchor(tok: Any, expected_id: int) -> None:
    from tokenizers import AddedToken

    if tok.token_to_id(ANCHOR) is None:
        tok.add_tokens([AddedToken(ANCHOR, special=False, normalized=False)])
    if tok.token_to_id(ANCHOR) != expected_id:  # pragma: no cover - tokenizers' contract
        raise TokenizerError("packtool's anchor token did not get the next id")


class SpecialStringFinder:
    """Finds special-token strings (``<|endoftext|>``...) in data, to count and to escape them.

    >>> f = SpecialStringFinder(["<|im_end|>", "<s>"])
    >>> f.spans("a <s> b<|im_end|>")
    [(2, 5), (7, 17)]
    >>> f.count(["<s>", "plain", None, "x<|im_end|>"])
    2
    """

    def __init__(self, strings: Sequence[str]) -> None:
        self.strings = tuple(sorted(set(strings), key=lambda t: (-len(t), t)))
        self._spans: re.Pattern[str] | None = None
        # Whether a text holds any of the strings, asked of every document: one pattern
        # shaped as a trie of the strings that hold no other (a text that holds one of the
        # others holds that one too), so a position is given up after a character or two,
        # not after trying each of a tokenizer's hundreds of strings in turn.
        self._any = re.compile(_trie_pattern(_minimal(self.strings))) if self.strings else None

    def __bool__(self) -> bool:
        return self._any is not None

    def contains(self, text: str) -> bool:
        return self._any is not None and self._any.search(text) is not None

    def count(self, texts: Sequence[str | None]) -> int:
        """How many of ``texts`` hold a special-token string."""
        if self._any is None:
            return 0
        search = self._any.search
        return sum(1 for t in texts if t and search(t) is not None)

    def spans(self, text: str) -> list[tuple[int, int]]:
        pattern = self.pattern
        if pattern is None:
            return []
        return [m.span() for m in pattern.finditer(text)]

    @property
    def pattern(self) -> re.Pattern[str] | None:
        """The strings as one alternation, longest first (the longest string that starts at
        a position is the one matched there), compiled when first asked for."""
        if self._spans is None and self.strings:
            self._spans = re.compile("|".join(map(re.escape, self.strings)))
        return self._spans


def _minimal(strings: Sequence[str]) -> list[str]:
    """The strings of ``strings`` (non-empty, longest first) that hold no other one."""
    kept: list[str] = []
    for s in sorted(strings, key=len):
        if s and not any(k in s for k in kept):
            kept.append(s)
    return kept


def _trie_pattern(strings: Sequence[str]) -> str:
    """A regular expression matching exactly the ``strings`` (none a prefix of another), as a
    trie: ``<(?:s>|\\|(?:im_end\\|>|endoftext\\|>))``."""
    trie: dict[str, Any] = {}
    for s in strings:
        node = trie
        for ch in s:
            node = node.setdefault(ch, {})
        node[""] = {}

    def alternatives(node: dict[str, Any]) -> str:
        parts = []
        for ch, child in sorted(node.items()):
            if ch == "":
                continue  # an end: no string continues it (none is a prefix of another)
            # A chain of single children is written out as one literal.
            run = ch
            while len(child) == 1 and "" not in child:
                ((nxt, child),) = child.items()
                run += nxt
            rest = alternatives(child) if "" not in child else ""
            parts.append(re.escape(run) + rest)
        if len(parts) == 1:
            return parts[0]
        return "(?:" + "|".join(parts) + ")"

    return alternatives(trie)


def special_string_finder(tokenizer: Tokenizer) -> SpecialStringFinder:
    """The finder of ``tokenizer``'s special-token strings (none for a tokenizer without)."""
    return SpecialStringFinder(getattr(tokenizer, "special_strings", ()))


class _Encodings(list):  # type: ignore[type-arg]
    """A batch of `tokenizers` encodings (``len()`` of one is its number of ids)."""

    special_strings = 0  # documents of the batch that held special-token strings


class _Lists(list):  # type: ignore[type-arg]
    """A batch of id lists from a tokenizer other than Hugging Face's."""

    special_strings = 0


_IDS = attrgetter("ids")


def _read_config(directory: AnyPath) -> dict[str, Any]:
    path = directory / "tokenizer_config.json"
    if not path.exists():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{path}: unreadable tokenizer config: {e}") from e
    return config if isinstance(config, dict) else {}


def _from_file(
    path: AnyPath,
    name: str,
    config: dict[str, Any],
    backend: str = "hf",
    **overrides: str | None,
) -> HFTokenizer:
    """The tokenizer of ``path``. With ``backend="hf"`` `tokenizers` loads it at once;
    ``auto``/``fastokens``: fastokens starts loading it in a thread; ``lazy``: neither. Any
    other engine loads when first needed."""
    try:
        data = path.read_bytes()
    except Exception as e:  # a local OSError, or a store's own error types
        raise TokenizerError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from e
    tok = _load_hf(data, str(path), as_is=True) if backend == "hf" else None
    # fastokens' load (seconds for a large vocabulary, mostly without the GIL) starts first,
    # so that reading the JSON here and the rest of the run's set-up happen beside it.
    fast = _start_fast_load(data) if backend in ("auto", "fastokens") else None
    try:
        file = TokenizerFile.parse(data)
    except (ValueError, KeyError, TypeError, IndexError):
        # Not JSON that packtool reads: `tokenizers` says why (or reads it, and its own
        # serialization is then read instead).
        tok = tok if tok is not None else _load_hf(data, str(path), as_is=True)
        file = TokenizerFile.parse(tok.to_str().encode("utf-8"))
    return HFTokenizer(
        tok,
        name=name,
        json_bytes=data,
        config=config,
        directory=path.parent,
        fast=fast,
        file=file,
        **overrides,
    )


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _from_hub(name: str, backend: str, **overrides: str | None) -> HFTokenizer:
    if name.count("/") > 1 or name.startswith((".", "/", "~")) or name.endswith(".json"):
        raise TokenizerError(f"tokenizer {name!r}: no such file or directory")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as e:  # pragma: no cover - huggingface_hub comes with datasets
        raise TokenizerError(f"tokenizer {name!r}: not a local path, and no huggingface_hub") from e
    try:
        path = Path(hf_hub_download(name, "tokenizer.json"))
    except Exception as e:
        if _offline():
            raise TokenizerError(
                f"tokenizer {name!r} is not a local file or directory and is not in the local "
                "hub cache, and the hub is offline (HF_HUB_OFFLINE=1): pass the path of a "
                "tokenizer.json or of a model directory that holds one"
            ) from None
        raise TokenizerError(
            f"tokenizer {name!r}: not a local path, and the hub could not provide "
            f"tokenizer.json ({type(e).__name__}): check the name, or pass a local path "
            "(on a machine without the hub, HF_HUB_OFFLINE=1 makes this fail at once)"
        ) from None
    config: dict[str, Any] = {}
    with contextlib.suppress(Exception):  # an optional file
        config = _read_config(Path(hf_hub_download(name, "tokenizer_config.json")).parent)
    return _from_file(path, name, config, backend, **overrides)


def set_tokenizer_threads(num_proc: int | None) -> None:
    """Tokenizer threads: `tokenizers` reads RAYON_NUM_THREADS when its pool first starts.

    Set before the first encoding in the process (the CLI always is); later calls with another
    value cannot resize the pool. The output does not depend on it. ``None``: all cores.
    """
    if num_proc is not None:
        os.environ["RAYON_NUM_THREADS"] = str(num_proc)


def load_tokenizer(
    spec: str | os.PathLike[str] | None = None,
    *,
    eos_token: str | None = None,
    bos_token: str | None = None,
    pad_token: str | None = None,
    backend: str = "hf",
    preload: bool = True,
) -> HFTokenizer:
    """Load a tokenizer from a ``tokenizer.json``, a model directory, a hub name, or the default.

    ``eos_token``/``bos_token``/``pad_token`` (a token string, or an id) override the special
    tokens found in the tokenizer's files (read from its JSON). The engine that will encode
    starts loading at once: `tokenizers` for ``backend="hf"``, else fastokens, in a thread
    (see :meth:`HFTokenizer.fast`); `tokenizers` is then loaded only if something needs it.
    ``preload=False``: neither, until first needed (``stats`` whose lengths are cached needs
    no engine at all).
    """
    if not preload:
        backend = "lazy"
    overrides = {"eos_token": eos_token, "bos_token": bos_token, "pad_token": pad_token}
    if spec is None or str(spec) == DEFAULT_TOKENIZER:
        return _from_file(
            _DATA / "tokenizer.json", DEFAULT_TOKENIZER, _read_config(_DATA), backend, **overrides
        )
    # A URL (s3://bucket/tok/tokenizer.json, or the prefix holding it) is read through the
    # store: the tokenizer's files are small and read whole.
    path = as_path(spec) if is_url(spec) else Path(spec).expanduser()
    if path.is_file():
        return _from_file(path, str(spec), _read_config(path.parent), backend, **overrides)
    if path.is_dir():
        if not (path / "tokenizer.json").exists():
            raise TokenizerError(
                f"{path}: the directory has no tokenizer.json (packtool reads fast-tokenizer "
                "files; save one with transformers' tokenizer.save_pretrained)"
            )
        return _from_file(
            path / "tokenizer.json", str(spec), _read_config(path), backend, **overrides
        )
    return _from_hub(str(spec), backend, **overrides)


# -- backends: Hugging Face `tokenizers`, or fastokens behind a parity gate ------------------


def _start_fast_load(json_bytes: bytes) -> concurrent.futures.Future[tuple[Any, str]]:
    """Load fastokens' copy of a ``tokenizer.json`` in a thread (its Rust loader runs while
    `tokenizers` loads the other copy)."""
    future: concurrent.futures.Future[tuple[Any, str]] = concurrent.futures.Future()

    def load() -> None:
        try:
            future.set_result(_load_fast(json_bytes))
        except BaseException as e:  # pragma: no cover - _load_fast catches what it can
            future.set_exception(e)

    # Not a daemon: a process that ends (an error, Ctrl-C) while a daemon thread is inside
    # the Rust loader aborts at exit ("FATAL: exception not rethrown"); this one is joined.
    threading.Thread(target=load, daemon=False, name="packtool-fastokens-load").start()
    return future


def _load_fast(json_bytes: bytes) -> tuple[Any, str]:
    try:
        import fastokens
    except ImportError:
        return None, "fastokens is not installed (pip install fastokens)"
    try:
        tok = fastokens.Tokenizer.from_json_str(json_bytes.decode("utf-8"))
    except Exception as e:  # fastokens raises ValueError for the models it does not support
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None, f"fastokens cannot load this tokenizer.json ({first})"
    tok.no_truncation()
    tok.no_padding()
    if tok.token_to_id(ANCHOR) is None:  # fastokens takes any object of these attributes
        tok.add_tokens([_FastAddedToken(ANCHOR)])  # (importing tokenizers for one: 10 ms)
    return tok, "loaded"


@dataclass(frozen=True)
class _FastAddedToken:
    """packtool's anchor as fastokens' ``add_tokens`` reads an added token."""

    content: str
    single_word: bool = False
    lstrip: bool = False
    rstrip: bool = False
    normalized: bool = False
    special: bool = False


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:  # pragma: no cover - installed, or not imported at all
        return "unknown"


@dataclass
class Backend:
    """Which engine encodes a run's documents, and why (the manifest's ``tokenizer.backend``).

    ``fallback_batches`` counts the batches the fast backend raised on, re-encoded with
    Hugging Face `tokenizers`; ``notice`` is the one line a run prints when ``auto`` chose
    `tokenizers` because fastokens could not be used.
    """

    name: str  # "fastokens", "hf", "custom" (a tokenizer object of the library user), "none"
    version: str | None
    reason: str
    fallback_batches: int = 0
    notice: str | None = None
    documents_checked: int = 0  # --check-sample: documents re-encoded with tokenizers, equal

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "reason": self.reason,
            "fallback_batches": self.fallback_batches,
            "documents_checked": self.documents_checked,
        }


def _hf_backend(reason: str, notice: str | None = None) -> Backend:
    # The installed version, read without importing `tokenizers` (a warm fastokens run
    # never loads it).
    return Backend("hf", _version("tokenizers"), reason, notice=notice)


_PROBES: tuple[str, ...] = (
    "Hello, world! The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see.",
    "Ünïcödé façade naïve café — “double” ‘single’ «guillemets» … ½ ² ™ ©",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "Γειά σου Κόσμε. שלום עולם. مرحبا بالعالم. नमस्ते दुनिया. ภาษาไทย. ქართული.",
    "こんにちは世界、カタカナ、ひらがな。你好，世界。中文文本测试。안녕하세요 세계",
    "emoji 😀👍🏽🇫🇷👨‍👩‍👧‍👦 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and \U0001f9ea\U0001fae0",
    "   leading spaces",
    "trailing spaces   ",
    "tabs\t\tand\nnewlines\n\n\r\n\r\nend",
    " " * 257,
    "\n" * 65 + "x",
    "a  b   c    d     e\u00a0f\u2003g\u3000h\u200bi\ufeffj",
    "digits 0 12 123 1234 12345 3.14159 1,000,000 2026-12-01 +44 (0)20 7946 0958",
    "9" * 301,
    "x" * 5003,
    "supercalifragilisticexpialidocious" * 60,
    "a" + "ą" * 1001 + "b",
    "def f(x):\n    return x ** 2  # comment\n\tif (a && b) { y = [1, 2]; }\n",
    '<html><body class="x">&amp; &#x27;</body></html>',
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE I'M you'LL",
    "MiXeD CaSe ÀÉÎÕÜ ǅ ß ẞ ﬁ ﬂ ｆｕｌｌｗｉｄｔｈ ①②③",
    "",
    " ",
)
_PROBE_VERSION = 1  # bump when _PROBES change: cached verdicts are keyed by it
_GATE_DOCS = 16  # first documents of the input in the gate, each cut to _GATE_DOC_CHARS
_GATE_DOC_CHARS = 8 << 10
_GATE_LONGEST_CHARS = 64 << 10  # the longest document of the first batch, cut to this
# Cut, because `tokenizers` encodes the gate's texts at its own speed (1-2 MB/s on 2 cores)
# before the first batch can go on: what the gate reads costs ~0.1 s, not a second.


def _probe_texts(tok: HFTokenizer) -> list[str]:
    """The fixed part of the parity gate: many scripts, whitespace runs, digits, long words,
    and the tokenizer's own added-token strings alone, glued and inside text."""
    out = list(_PROBES)
    added = sorted(set(tok.added_strings))[:2000]
    out.extend(added)
    out.extend(f"x {a} y{a}z" for a in added)
    out.append("".join(added[:200]))
    return out


def _cache_dir() -> Path:
    root = os.environ.get("PACKTOOL_CACHE_DIR")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "packtool"


def _gate_key(tok: HFTokenizer, add_special: bool, parse_special: bool) -> str:
    text = json.dumps(
        [tok.sha256, _version("fastokens"), _version("tokenizers"), _PROBE_VERSION],
    )
    text += f"{add_special:d}{parse_special:d}"
    return hashlib.sha256(text.encode()).hexdigest()


def _cached_verdict(key: str) -> dict[str, Any] | None:
    path = _cache_dir() / "parity-gate" / f"{key}.json"
    try:
        verdict = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return verdict if isinstance(verdict, dict) and "ok" in verdict else None


def _save_verdict(key: str, ok: bool, why: str) -> None:
    folder = _cache_dir() / "parity-gate"
    with contextlib.suppress(OSError):  # a cache: a read-only home only costs the probes
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_text(json.dumps({"ok": ok, "why": why}), encoding="utf-8")
        os.replace(tmp, folder / f"{key}.json")


def _flat_lists(ids: bytes, offsets: bytes) -> list[list[int]]:
    flat = np.frombuffer(ids, dtype="<u4")
    off = np.frombuffer(offsets, dtype="<u8")
    return [flat[off[i] : off[i + 1]].tolist() for i in range(off.size - 1)]


def _first_difference(
    tok: HFTokenizer, fast: Any, texts: Sequence[str], add_special: bool, parse_special: bool
) -> int | None:
    """The index of the first text whose ids differ between the two backends."""
    if not texts:
        return None
    want = [e.ids for e in tok.encodings(texts, add_special, parse_special)]
    try:
        got = _flat_lists(
            *fast.encode_batch_flat(
                list(texts), add_special_tokens=add_special, split_special_tokens=not parse_special
            )
        )
    except Exception:  # the fast backend failed on a probe: not a pass
        return 0
    if len(got) != len(want):
        return 0
    return next((i for i, (a, b) in enumerate(zip(want, got, strict=True)) if a != b), None)


def _parity_gate(
    tok: HFTokenizer,
    choice: str,
    first_batch: Sequence[str],
    add_special: bool,
    parse_special: bool,
) -> tuple[Any, Backend]:
    """fastokens' copy and its :class:`Backend` if it encodes the probes and the first
    documents exactly as `tokenizers` does; else `tokenizers` (``auto``) or an error
    (``fastokens``).

    The probes' verdict is cached by the file's sha256 and both libraries' versions. When it
    is cached (and good), `tokenizers` is not loaded at all: the first documents are not
    compared either (``--check-sample`` compares documents of the run, at the cost of that
    load); the :class:`Backend`'s reason says which gate was passed.
    """

    def refuse(why: str) -> tuple[Any, Backend]:
        if choice == "fastokens":
            raise TokenizerError(
                f"--tokenizer-backend fastokens: {why}; use --tokenizer-backend auto or hf"
            )
        return None, _hf_backend(why, notice=f"{why}: tokenizing with Hugging Face tokenizers")

    # The cached verdict is looked up while fastokens may still be loading (the libraries'
    # versions come from their metadata: 20-30 ms of Python, off the load's critical path).
    key = _gate_key(tok, add_special, parse_special)
    verdict = _cached_verdict(key)
    fast, why = tok.fast()
    if fast is None:
        return refuse(why)
    if verdict is not None:
        if not verdict["ok"]:
            return refuse(str(verdict["why"]))
        return fast, Backend("fastokens", _version("fastokens"), GATE_CACHED)
    probes = _probe_texts(tok)
    at = _first_difference(tok, fast, probes, add_special, parse_special)
    why = "" if at is None else f"fastokens differs from tokenizers on {probes[at][:40]!r}"
    _save_verdict(key, at is None, why)
    if at is not None:
        return refuse(why)
    data = [text[:_GATE_DOC_CHARS] for text in first_batch[:_GATE_DOCS]]
    if first_batch:
        data.append(max(first_batch, key=len)[:_GATE_LONGEST_CHARS])
    at = _first_difference(tok, fast, data, add_special, parse_special)
    if at is not None:  # remembered: a later run with a cached verdict would not look
        where = f"document {at + 1}" if at < len(data) - 1 else "the longest document"
        _save_verdict(key, False, f"fastokens differed from tokenizers on {where} of a run's data")
        return refuse(f"fastokens differs from tokenizers on {where} of the first batch")
    return fast, Backend("fastokens", _version("fastokens"), GATE_PASSED)


GATE_PASSED = "passed the parity gate"
GATE_CACHED = "passed the parity gate (cached verdict; tokenizers not loaded)"


HUGE_CHARS = 8 << 20
"""A document of more characters is encoded in pieces of about :data:`PIECE_CHARS`, where
the tokenizer allows it (:func:`pieces_are_exact`), so that what the tokenizer builds for it
(words, offsets; ten bytes and more per character) stays bounded."""
PIECE_CHARS = 4 << 20

# The regex split pre-tokenizers of GPT-2 (ByteLevel's own), Llama 3 and Qwen 2: each cuts
# after a single line break before a letter whatever comes before it: no alternative matches
# across a line break into a letter ([^\r\n\p{L}\p{N}]?\p{L}+ cannot start at the break,
# \s*[\r\n]+ and \s+ stop at the letter).
_SAFE_SPLITS = frozenset(
    {
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    }
)
# A single line break between a non-space and a letter. Not after a run of whitespace: GPT-2's
# \s+(?!\S) groups a run that ends a text ("\n\n") but splits the same run before a letter.
# A text without such a line break (one huge line) is cut before a single space between two
# letters: every one of these splits ends a word at its last letter and starts the next
# pre-token at the space (" word", [^\r\n\p{L}\p{N}]?\p{L}+), whatever follows.
_LINE_START = re.compile(r"(?<=\S)\n(?=[^\W\d_])")
_WORD_START = re.compile(r"(?<=[^\W\d_]) (?=[^\W\d_])")


def _byte_level(p: Any, use_regex: bool) -> bool:
    return (
        isinstance(p, dict)
        and p.get("type") == "ByteLevel"
        and not p.get("add_prefix_space", True)
        and bool(p.get("use_regex", True)) == use_regex
    )


def pieces_are_exact(tok: HFTokenizer) -> bool:
    """Whether cutting a text at a single line break before a letter (after a non-space)
    leaves its ids unchanged:
    a byte-level BPE (no dropout) with no normalizer or NFC, one of the known regex splits,
    and no added token holding a line break (added tokens are matched before the split)."""
    file = tok.file
    norm, pre = file.normalizer, file.pre_tokenizer
    if file.model_type != "BPE" or file.dropout not in (None, 0, 0.0):
        return False
    if norm is not None and norm.get("type") != "NFC":
        return False
    if any("\n" in a or " " in a for a in tok.added_strings):
        return False
    if _byte_level(pre, True):
        return True
    steps = pre.get("pretokenizers") if isinstance(pre, dict) else None
    if not steps or len(steps) != 2 or not _byte_level(steps[1], False):
        return False
    split = steps[0]
    return (
        split.get("type") == "Split"
        and split.get("behavior") == "Isolated"
        and not split.get("invert")
        and (split.get("pattern") or {}).get("Regex") in _SAFE_SPLITS
    )


def cut_points(text: str, size: int) -> list[int]:
    """Where to cut ``text`` into pieces of about ``size`` characters: after a single line
    break before a letter, else (a line longer than ``size``) before a single space between
    two letters (see :func:`pieces_are_exact`); ``[0, len(text)]`` if neither is found."""
    cuts, pos = [0], size
    while pos < len(text):
        line = _LINE_START.search(text, pos, pos + size)
        if line is not None:
            cut = line.end()
        else:
            word = _WORD_START.search(text, pos)
            if word is None:
                break
            cut = word.start()
        cuts.append(cut)
        pos = cut + size
    cuts.append(len(text))
    return cuts


class _Flat:
    """A batch as fastokens returns it: every document's ids in one buffer, read in place."""

    __slots__ = ("ids", "lengths", "room", "special_strings")

    def __init__(self, ids: bytes, offsets: bytes) -> None:
        self.ids = np.frombuffer(ids, dtype="<i4")  # ids < 2**31: the same bits as uint32
        self.lengths = np.diff(np.frombuffer(offsets, dtype="<u8")).astype(np.int64)
        self.room: np.ndarray | None = None
        self.special_strings = 0

    @classmethod
    def of_document(cls, room: np.ndarray, n: int) -> _Flat:
        """One document's ``n`` ids, encoded in pieces into ``room`` (which has space after
        them for an EOS)."""
        out = cls.__new__(cls)
        out.ids, out.lengths, out.room = room[:n], np.array([n], np.int64), room
        out.special_strings = 0
        return out

    def __len__(self) -> int:
        return int(self.lengths.size)


@dataclass(frozen=True)
class EncodedBatch:
    """Token ids of a batch of documents, flat, with each document's length.

    Document ``i`` is ``ids[offsets[i]:offsets[i] + lengths[i]]``; ``empty[i]`` is true for
    a document with no content tokens (it is skipped and counted as empty). ``labels`` (for
    instruction data) is aligned with ``ids``: the token where it is learned, else -100.
    ``special_strings`` counts the documents whose data held special-token strings.
    """

    ids: np.ndarray  # int32
    lengths: np.ndarray  # int64
    empty: np.ndarray  # bool
    labels: np.ndarray | None = None  # int32, like ids
    special_strings: int = 0

    @property
    def offsets(self) -> np.ndarray:
        starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        return starts[: self.lengths.size]  # no documents: no offsets (not [0])


def check_special_tokens(tokenizer: Tokenizer, *, add_eos: bool, bos: bool | None) -> None:
    """Fail early, naming the option, when EOS or BOS is asked for and the tokenizer has none."""
    special = tokenizer.special
    missing = dict(getattr(special, "missing", ()))
    if add_eos and special.eos_id is None and "eos" in missing:
        raise TokenizerError(_not_in_vocabulary(tokenizer, "eos", missing["eos"], "--no-eos"))
    if bos and special.bos_id is None and "bos" in missing:
        raise TokenizerError(_not_in_vocabulary(tokenizer, "bos", missing["bos"], "drop --bos"))
    if add_eos and special.eos_id is None:
        raise TokenizerError(
            f"tokenizer {tokenizer.name} has no EOS token I can find: "
            "name it with --eos-token, or pass --no-eos"
        )
    if bos and special.bos_id is None:
        raise TokenizerError(
            f"tokenizer {tokenizer.name} has no BOS token (tokenizer_config.json names none, "
            "and no special token has a usual BOS name): name one with --bos-token, or drop --bos"
        )


def _not_in_vocabulary(tokenizer: Tokenizer, kind: str, token: str, off: str) -> str:
    """The config names an EOS or BOS token that the vocabulary does not hold."""
    directory = getattr(tokenizer, "directory", None)
    where = directory / "tokenizer_config.json" if directory is not None else tokenizer.name
    return (
        f"{where}: {kind}_token {token!r} is not in the vocabulary of tokenizer "
        f"{tokenizer.name}: name the {kind.upper()} with --{kind}-token, or pass {off}"
    )


class DocumentEncoder:
    """Turns document texts into token ids, with BOS and EOS handled as configured.

    - ``add_eos`` (default on): EOS appended to every document, unless it already ends the
      document (a post-processor may add it).
    - ``bos=None`` (default): the tokenizer's post-processor decides (Llama's adds BOS, GPT-2's
      adds nothing). ``bos=True``: exactly one BOS first; ``bos=False``: no special tokens from
      the post-processor at all.
    - ``parse_special`` (default off): special-token strings in the text are text; on, they
      become the control tokens they spell (for data that holds markup on purpose).
    - ``backend`` (default ``"hf"``): ``"auto"`` encodes with fastokens when it loads the file
      and passes the parity gate on the first batch (:attr:`backend` says which and why),
      ``"fastokens"`` fails when it cannot. A batch fastokens raises on is re-encoded with
      `tokenizers` and counted (``Backend.fallback_batches``). The ids are the same.

    Encoding is two steps so that a pipeline can overlap them: :meth:`tokenize` runs the
    tokenizer (Rust, all cores, without the GIL) and :meth:`finish` turns its output into flat
    arrays (Python). :meth:`encode` does both.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        add_eos: bool = True,
        bos: bool | None = None,
        parse_special: bool = False,
        backend: str = "hf",
        check_every: int = 0,
    ):
        self.tokenizer = tokenizer
        self.add_eos = add_eos
        self.bos = bos
        self.parse_special = parse_special
        self.finder = special_string_finder(tokenizer)
        check_special_tokens(tokenizer, add_eos=add_eos, bos=bos)
        self._add_special = bos is None
        self._n_special = tokenizer.num_special_tokens_to_add() if bos is None else 0
        self._choice = backend
        # Huge documents in pieces: None until the first one (asked of the engine in use).
        self._pieces: bool | None = None if isinstance(tokenizer, HFTokenizer) else False
        self._fast: Any = None
        self._check_every = check_every
        self._chars_seen = 0
        self._gate_lock = threading.Lock()
        self._gated = backend == "hf" or not isinstance(tokenizer, HFTokenizer)
        if isinstance(tokenizer, HFTokenizer):
            self.backend = _hf_backend(
                "--tokenizer-backend hf" if backend == "hf" else "no document to encode"
            )
        elif backend == "fastokens":
            raise TokenizerError(
                f"--tokenizer-backend fastokens needs a tokenizer.json; {tokenizer.name} is "
                "not a Hugging Face tokenizer"
            )
        else:
            self.backend = Backend("custom", None, type(tokenizer).__name__)

    def _in_pieces(self) -> bool:
        """Whether a huge document may be encoded in pieces: the tokenizer allows it, and the
        post-processor's tokens in this mode (if any) all go before the text (Llama 3's BOS),
        so that only the first piece gets them."""
        if self._pieces is None:
            tok = self.tokenizer
            assert isinstance(tok, HFTokenizer)
            if not pieces_are_exact(tok):
                self._pieces = False
            elif not self._add_special or not self._n_special:
                self._pieces = True
            elif self._fast is not None:
                bare = self._encode_flat(["a"], False, self._fast).ids.tolist()
                full = self._encode_flat(["a"], True, self._fast).ids.tolist()
                self._pieces = full[len(full) - len(bare) :] == bare
            else:
                bare = tok.encode_batch(["a"], add_special_tokens=False)[0]
                full = tok.encode_batch(["a"], add_special_tokens=True)[0]
                self._pieces = full[len(full) - len(bare) :] == bare
        return self._pieces

    def _encode_huge(self, text: str, fast: Any) -> _Flat:
        """One document of more than :data:`HUGE_CHARS` characters, encoded a few pieces at
        a time (as many as the tokenizer's threads can share) and joined."""
        cuts = cut_points(text, PIECE_CHARS)
        spans = list(itertools.pairwise(cuts))
        # Byte-level BPE: every id holds at least one byte, so a document of n characters
        # (at most 4n bytes) has at most 4n ids, plus the post-processor's and an EOS. Pages
        # of the array count in memory only once written.
        room = np.empty(4 * len(text) + self._n_special + 2, np.int32)
        n = 0
        for g in range(0, len(spans), 2):
            group = [text[a:b] for a, b in spans[g : g + 2]]
            parts: list[Any] = []
            if fast is not None:
                first, rest = group[:1], group[1:]
                for part, special in ((first, g == 0 and self._add_special), (rest, False)):
                    if part:
                        parts.append(self._encode_flat(part, special, fast).ids)
            else:
                assert isinstance(self.tokenizer, HFTokenizer)
                for i, piece in enumerate(group):
                    special = g == 0 and i == 0 and self._add_special
                    enc = self.tokenizer.encodings([piece], special, self.parse_special)[0]
                    parts.append(np.asarray(enc.ids, dtype=np.int32))
            for ids in parts:
                room[n : n + ids.size] = ids
                n += ids.size
            del group, parts
        return _Flat.of_document(room, n)

    def _encode_flat(self, texts: list[str], add_special: bool, fast: Any) -> _Flat:
        return _Flat(
            *fast.encode_batch_flat(
                texts, add_special_tokens=add_special, split_special_tokens=not self.parse_special
            )
        )

    def _check(self, texts: Sequence[str], flat: _Flat) -> None:
        """``--check-sample``: the documents of this batch at every ``check_every``-th
        character of the run, re-encoded with `tokenizers`, must have the same ids."""
        sizes = np.fromiter(map(len, texts), np.int64, len(texts))
        ends = np.cumsum(sizes)
        with self._gate_lock:
            start = self._chars_seen
            self._chars_seen += int(ends[-1]) if ends.size else 0
        every = self._check_every
        marks = np.arange((start // every + 1) * every, start + int(ends[-1]) + 1, every)
        picks = np.unique(np.searchsorted(ends, marks - start, side="left"))
        picks = picks[picks < len(texts)]
        if not picks.size:
            return
        assert isinstance(self.tokenizer, HFTokenizer)
        chosen = [texts[int(i)] for i in picks]
        want = self.tokenizer.encodings(chosen, self._add_special, self.parse_special)
        offsets = np.concatenate([[0], np.cumsum(flat.lengths)])
        for i, text, enc in zip(picks.tolist(), chosen, want, strict=True):
            if flat.ids[offsets[i] : offsets[i + 1]].tolist() != enc.ids:
                key = _gate_key(self.tokenizer, self._add_special, self.parse_special)
                _save_verdict(key, False, "fastokens differed from tokenizers on a document")
                raise TokenizerError(
                    f"--check-sample: fastokens and tokenizers give different ids for a "
                    f"document ({text[:40]!r}...): nothing was written; pack with "
                    "--tokenizer-backend hf"
                )
        with self._gate_lock:
            self.backend.documents_checked += int(picks.size)

    def _gate(self, texts: Sequence[str]) -> None:
        with self._gate_lock:
            if not self._gated:
                assert isinstance(self.tokenizer, HFTokenizer)
                self._fast, self.backend = _parity_gate(
                    self.tokenizer, self._choice, texts, self._add_special, self.parse_special
                )
                self._gated = True

    def tokenize(self, texts: Sequence[str]) -> Sequence[Any]:
        """Run the tokenizer on ``texts`` (the heavy, parallel part).

        With fastokens the result is one flat buffer of ids for the whole batch; with
        Hugging Face `tokenizers` its `Encoding` objects, whose ids :meth:`finish` reads one
        document at a time; otherwise, lists of ids.
        """
        if not texts:
            return []
        if not self._gated:
            self._gate(texts)
        out: Any
        if len(texts) == 1 and len(texts[0]) > HUGE_CHARS and self._in_pieces():
            try:
                out = self._encode_huge(texts[0], self._fast)
            except Exception:  # as below: the whole document with tokenizers, counted
                if self._fast is None:
                    raise
                with self._gate_lock:
                    self.backend.fallback_batches += 1
                out = self._encode_huge(texts[0], None)
        elif self._fast is not None:
            try:
                out = self._encode_flat(list(texts), self._add_special, self._fast)
                if self._check_every:
                    self._check(texts, out)
            except TokenizerError:
                raise
            except Exception:  # a regex limit, an unexpected input: never a silent divergence
                with self._gate_lock:
                    self.backend.fallback_batches += 1
                assert isinstance(self.tokenizer, HFTokenizer)
                out = _Encodings(
                    self.tokenizer.encodings(texts, self._add_special, self.parse_special)
                )
        elif isinstance(self.tokenizer, HFTokenizer):
            out = _Encodings(self.tokenizer.encodings(texts, self._add_special, self.parse_special))
        else:
            out = _Lists(
                self.tokenizer.encode_batch(
                    texts, add_special_tokens=self._add_special, parse_special=self.parse_special
                )
            )
        out.special_strings = self.finder.count(texts)  # type: ignore[attr-defined]
        return out

    def finish(self, encoded: Sequence[Any]) -> EncodedBatch:
        """Flatten the tokenizer's output, adding BOS/EOS and marking empty documents."""
        if isinstance(encoded, _Flat):  # the ids are read in place, no object per document
            raw_len, ids = encoded.lengths, encoded.ids
        else:
            n = len(encoded)
            raw_len = np.fromiter(map(len, encoded), dtype=np.int64, count=n)
            # One pass of NumPy over the ids, read one document at a time: a document's
            # Python list (and its ints) is freed before the next is built, so the memory is
            # reused while it is still in the cache. Building every list first cost a quarter
            # more.
            pieces = map(_IDS, encoded) if isinstance(encoded, _Encodings) else encoded
            ids = np.fromiter(
                itertools.chain.from_iterable(pieces), dtype=np.int32, count=int(raw_len.sum())
            )
        empty = raw_len <= self._n_special
        if empty.any():  # special tokens alone: the document is dropped as empty
            if raw_len[empty].any():
                ids = ids[np.repeat(~empty, raw_len)]
            raw_len = np.where(empty, 0, raw_len)
        ends = np.cumsum(raw_len)
        full = ~empty
        lengths = raw_len
        at: list[np.ndarray] = []  # where special tokens go in (indices into ids)
        kind: list[np.ndarray] = []  # 0: EOS, 1: BOS
        if self.add_eos:  # EOS last, unless the document already ends with it
            needs = full.copy()
            needs[full] = ids[ends[full] - 1] != self.tokenizer.special.eos_id
            at.append(ends[needs])
            kind.append(np.zeros(at[-1].size, np.int8))
            lengths = lengths + needs
        if self.bos:  # exactly one BOS first (the post-processor added none)
            at.append((ends - raw_len)[full])
            kind.append(np.ones(at[-1].size, np.int8))
            lengths = lengths + full
        room = getattr(encoded, "room", None)
        if room is not None and len(at) == 1 and at[0].size == 1 and at[0][0] == ids.size:
            # One huge document and its EOS: written after its ids, in the room left for it
            # (np.insert would copy the document's ids once more).
            room[ids.size] = self.tokenizer.special.eos_id
            ids = room[: ids.size + 1]
        elif at and sum(a.size for a in at):
            where, what = np.concatenate(at), np.concatenate(kind)
            if len(at) > 1:
                # A document's EOS and the next one's BOS go in at the same place: EOS first.
                order = np.lexsort((what, where))
                where, what = where[order], what[order]
            special = np.array(
                [self.tokenizer.special.eos_id or 0, self.tokenizer.special.bos_id or 0], np.int32
            )
            ids = np.insert(ids, where, special[what])
        return EncodedBatch(ids, lengths, empty, None, getattr(encoded, "special_strings", 0))

    def encode(self, texts: Sequence[str]) -> EncodedBatch:
        """Token ids of ``texts``, flat, one document after another."""
        return self.finish(self.tokenize(texts))
