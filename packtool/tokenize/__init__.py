"""Tokenizer loading and document encoding.

The tokenizer sits behind a small :class:`Tokenizer` protocol, so tests can use a fake and
a tokenizer.json is one implementation (:class:`HFTokenizer`). The engines that encode it are
the backends of one table (:mod:`.registry`: Hugging Face `tokenizers`, the reference;
fastokens and gigatoken, behind the parity gate of :mod:`.gate`), one module each.

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
import functools
import hashlib
import itertools
import json
import os
import re
import threading
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import TokenizerError
from ..fs import AnyPath, as_path, is_url
from ..tokenizer_file import SpecialTokens, TokenizerFile, resolve_special_tokens
from .backend import ANCHOR, Backend, BackendSpec, Engine, Flat, first_line, insert_ids, made_once
from .facts import read_tokenizer_file
from .gate import GATE_CACHED, GATE_PASSED, gate_key, parity_gate, reference_backend, save_verdict
from .hf import add_anchor, disable_truncation_and_padding, load_hf
from .registry import AUTO, REFERENCE, candidates, choices, for_corpus, spec_of

__all__ = [
    "ANCHOR",
    "AUTO",
    "DEFAULT_TOKENIZER",
    "GATE_CACHED",
    "GATE_PASSED",
    "REFERENCE",
    "Backend",
    "BackendSpec",
    "DocumentEncoder",
    "EncodedBatch",
    "Flat",
    "HFTokenizer",
    "SpecialStringFinder",
    "SpecialTokens",
    "Tokenizer",
    "for_corpus",
    "load_tokenizer",
    "set_tokenizer_threads",
]

DEFAULT_TOKENIZER = "packtool-default"
_DATA = Path(__file__).parent.parent / "_data"


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
    when something is encoded or decoded with `tokenizers` (a run that encodes with a fast
    backend never loads it, unless a batch falls back or the parity gate has no cached
    verdict); each fast backend's copy is loaded once, when first asked for
    (:meth:`engine`).

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
        start: Sequence[str] = (),
        file: TokenizerFile | None = None,
    ) -> None:
        self.file = file if file is not None else TokenizerFile.parse(json_bytes)
        self.notice = self.file.turned_off()
        if tokenizer is not None:
            disable_truncation_and_padding(tokenizer)
        self.name = name
        self.directory = directory  # where tokenizer.json was found (chat_template.jinja)
        self.json_bytes = json_bytes
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
        self._engines: dict[str, concurrent.futures.Future[tuple[Engine | None, str]]] = {}
        for backend in start:
            self._start(spec_of(backend))
        self.backend_choice = REFERENCE  # what load_tokenizer was asked for (prepare's choice)
        self.backend_reason: str | None = None  # why prepare chose it, when not asked for

    @functools.cached_property
    def sha256(self) -> str:
        """The sha256 of the tokenizer.json (hex): computed once, when first asked for, or
        given by the loader that has it already."""
        return hashlib.sha256(self.json_bytes).hexdigest()

    def _start(self, backend: BackendSpec) -> concurrent.futures.Future[tuple[Engine | None, str]]:
        """Start loading ``backend``'s copy of this tokenizer in a thread (its Rust loader
        runs while the rest of the run's set-up goes on), once."""
        with self._lock:
            future = self._engines.get(backend.name)
            if future is None:
                future = self._engines[backend.name] = _start_load(
                    backend, self.json_bytes, self.anchor_id
                )
        return future

    def engine(self, backend: str) -> tuple[Engine | None, str]:
        """``backend``'s copy of this tokenizer (truncation and padding off, :data:`ANCHOR`
        added at :attr:`anchor_id`), or ``None`` and why not. Loaded once, in a thread
        started by :func:`load_tokenizer` or here."""
        return self._start(spec_of(backend)).result()

    @property
    def hf_loaded(self) -> bool:
        """Whether `tokenizers` has loaded this file in this process (so far)."""
        return self._loaded is not None or bool(self._copies)

    def _copy(self, parse_special: bool) -> Any:
        """The Rust tokenizer that parses special-token strings, or encodes them as text."""

        def make() -> Any:  # the tokenizer given, else one loaded from the file
            if self._loaded is not None:
                tok, self._loaded = self._loaded, None
            else:
                tok = load_hf(self.json_bytes, self.name)
            add_anchor(tok, self.anchor_id)
            tok.encode_special_tokens = not parse_special
            return tok

        return made_once(self._copies, parse_special, self._lock, make)

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
        for added in reversed(self.file.added):  # an added token's first (as `tokenizers`)
            if added.id == tid:
                return added.content
        if self._id_to_token is None:  # the vocabulary, parsed now if it was not
            self._id_to_token = {i: t for t, i in self.file.vocab.items()}
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
    backend: str = REFERENCE,
    preload: bool = True,
    **overrides: str | None,
) -> HFTokenizer:
    """The tokenizer of ``path``. ``preload``: the engine that will encode starts loading at
    once (`tokenizers` for ``hf``, else the first fast backend the choice tries, in a
    thread); any other engine loads when first needed."""
    try:
        data = path.read_bytes()
    except Exception as e:  # a local OSError, or a store's own error types
        raise TokenizerError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from e
    tok = load_hf(data, str(path), as_is=True) if preload and backend == REFERENCE else None
    sha256 = hashlib.sha256(data).hexdigest()
    try:
        file = read_tokenizer_file(data, sha256, _names_of(config, overrides))
    except (ValueError, KeyError, TypeError, IndexError):
        # Not JSON that packtool reads: `tokenizers` says why (or reads it, and its own
        # serialization is then read instead).
        tok = tok if tok is not None else load_hf(data, str(path), as_is=True)
        file = TokenizerFile.parse(tok.to_str().encode("utf-8"))
    first = candidates(backend, file)[:1] if preload else []
    made = HFTokenizer(
        tok,
        name=name,
        json_bytes=data,
        config=config,
        directory=path.parent,
        start=[b.name for b in first if b.refuses(file) is None],
        file=file,
        **overrides,
    )
    made.sha256 = sha256
    made.backend_choice = backend
    return made


def _names_of(config: dict[str, Any], overrides: dict[str, str | None]) -> list[str]:
    """The token strings a run may look up in the vocabulary, besides the usual names: those
    ``tokenizer_config.json`` and the options name, and packtool's anchor."""
    names = [ANCHOR, *(v for v in overrides.values() if v)]
    for kind in ("eos", "bos", "pad", "unk"):
        named = config.get(f"{kind}_token")
        named = named.get("content") if isinstance(named, dict) else named
        if isinstance(named, str):
            names.append(named)
    return names


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _from_hub(name: str, backend: str, preload: bool, **overrides: str | None) -> HFTokenizer:
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
    return _from_file(path, name, config, backend, preload, **overrides)


def _start_load(
    backend: BackendSpec, json_bytes: bytes, anchor_id: int
) -> concurrent.futures.Future[tuple[Engine | None, str]]:
    """Load ``backend``'s copy of a tokenizer.json in a thread; its future gives the engine
    (or ``None``) and why not."""
    future: concurrent.futures.Future[tuple[Engine | None, str]] = concurrent.futures.Future()

    def load() -> None:
        try:
            if backend.load is None:
                raise ValueError("it has no engine of its own")
            future.set_result((backend.load(json_bytes, anchor_id), "loaded"))
        except ImportError:
            future.set_result(
                (None, f"{backend.name} is not installed (pip install {backend.package})")
            )
        except Exception as e:  # an engine raises ValueError for the models it does not know
            why = f"{backend.name} cannot load this tokenizer.json ({first_line(e)})"
            future.set_result((None, why))
        except BaseException as e:  # pragma: no cover - an interrupt
            future.set_exception(e)

    # Not a daemon: a process that ends (an error, Ctrl-C) while a daemon thread is inside
    # a Rust loader aborts at exit ("FATAL: exception not rethrown"); this one is joined.
    threading.Thread(target=load, daemon=False, name=f"packtool-{backend.name}-load").start()
    return future


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
    backend: str = REFERENCE,
    preload: bool = True,
) -> HFTokenizer:
    """Load a tokenizer from a ``tokenizer.json``, a model directory, a hub name, or the default.

    ``eos_token``/``bos_token``/``pad_token`` (a token string, or an id) override the special
    tokens found in the tokenizer's files (read from its JSON). ``backend``: a name of the
    backend table (:mod:`packtool.tokenize.registry`) or ``auto``; it is the choice the
    run's :class:`DocumentEncoder` follows (:attr:`HFTokenizer.backend_choice`). The engine
    that will encode starts loading at once: `tokenizers` for ``hf``, else the first fast
    backend tried, in a thread (see :meth:`HFTokenizer.engine`); `tokenizers` is then loaded
    only if something needs it. ``preload=False``: none, until first needed (``stats`` whose
    lengths are cached needs no engine at all).
    """
    if backend not in choices():
        raise TokenizerError(
            f"unknown tokenizer backend {backend!r} (one of {', '.join(choices())})"
        )
    overrides = {"eos_token": eos_token, "bos_token": bos_token, "pad_token": pad_token}
    if spec is None or str(spec) == DEFAULT_TOKENIZER:
        return _from_file(
            _DATA / "tokenizer.json",
            DEFAULT_TOKENIZER,
            _read_config(_DATA),
            backend,
            preload,
            **overrides,
        )
    # A URL (s3://bucket/tok/tokenizer.json, or the prefix holding it) is read through the
    # store: the tokenizer's files are small and read whole.
    path = as_path(spec) if is_url(spec) else Path(spec).expanduser()
    if path.is_file():
        return _from_file(path, str(spec), _read_config(path.parent), backend, preload, **overrides)
    if path.is_dir():
        if not (path / "tokenizer.json").exists():
            raise TokenizerError(
                f"{path}: the directory has no tokenizer.json (packtool reads fast-tokenizer "
                "files; save one with transformers' tokenizer.save_pretrained)"
            )
        return _from_file(
            path / "tokenizer.json", str(spec), _read_config(path), backend, preload, **overrides
        )
    return _from_hub(str(spec), backend, preload, **overrides)


HUGE_CHARS = 8 << 20
"""A document of more characters is encoded in pieces of about :data:`PIECE_CHARS`, where
the tokenizer allows it (:func:`piece_rule`), so that what the tokenizer builds for it
(words, offsets; ten bytes and more per character) stays bounded."""
PIECE_CHARS = 4 << 20
REACH = 4
"""How far past :data:`PIECE_CHARS` an exact cut is looked for (pieces of up to ``REACH``
times that size) before a stretch without one is cut where it is (:func:`cut_plan`)."""

# The regex split pre-tokenizers of GPT-2 (ByteLevel's own), Llama 3 / cl100k, Qwen 2 and
# o200k: each cuts after a single line break before a letter whatever comes before it: no
# alternative matches across a line break into a letter ([^\r\n\p{L}\p{N}]? cannot start
# at the break, \s*[\r\n]+ and \s+ stop at the letter).
_O200K = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SAFE_SPLITS = frozenset(
    {
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        _O200K,
    }
)
# A single line break between a non-space and a letter. Not after a run of whitespace: GPT-2's
# \s+(?!\S) groups a run that ends a text ("\n\n") but splits the same run before a letter.
# A text without such a line break (one huge line) is cut before a single space between two
# letters: every one of these splits ends a word at its last letter and starts the next
# pre-token at the space (" word", [^\r\n\p{L}\p{N}]?\p{L}+), whatever follows. A text
# without spaces either (CJK prose, minified data) is cut between a letter and a punctuation
# mark, a symbol or a digit that follows it (not an apostrophe: o200k keeps "'s" with its
# word): no letter run takes such a character, and the pre-token it starts is the same.
_LINE_START = re.compile(r"(?<=\S)\n(?=[^\W\d_])")
_WORD_START = re.compile(r"(?<=[^\W\d_]) (?=[^\W\d_])")
_MARK_AFTER_LETTER = re.compile(r"(?<=[^\W\d_])[^\w\s']|(?<=[^\W\d_])\d")
# Metaspace (spaces are "▁", a pre-token starts at each): any single space is a cut; a
# line break is not (it is inside a pre-token).
_SPACE = re.compile(r"(?<=\S) (?=\S)")


def _byte_level(p: Any, use_regex: bool) -> bool:
    return (
        isinstance(p, dict)
        and p.get("type") == "ByteLevel"
        and not p.get("add_prefix_space", True)
        and bool(p.get("use_regex", True)) == use_regex
    )


def piece_rule(tok: HFTokenizer) -> str | None:
    """How a huge text may be cut into pieces whose ids, joined, are the whole text's:
    ``"byte-level"`` (a byte-level BPE with one of the known regex splits, isolated or kept
    as matches, no normalizer or NFC: at line breaks, spaces, punctuation after letters),
    ``"metaspace"`` (a BPE whose ``Metaspace`` pre-tokenizer splits at every space and whose
    prepend scheme adds a mark only to a text that does not start with a space: at spaces), or
    ``None`` (no exact cut known). No dropout, and no added token holding a line break or a
    space (added tokens are matched before the split)."""
    file = tok.file
    norm, pre = file.normalizer, file.pre_tokenizer
    if file.model_type != "BPE" or file.dropout not in (None, 0, 0.0):
        return None
    empty = isinstance(norm, dict) and norm.get("type") == "Sequence"
    empty = empty and not norm.get("normalizers")
    if norm is not None and norm.get("type") != "NFC" and not empty:
        return None
    if any("\n" in a or " " in a for a in tok.added_strings):
        return None
    if _byte_level(pre, True):
        return "byte-level"
    if isinstance(pre, dict) and pre.get("type") == "Metaspace":
        scheme = pre.get("prepend_scheme", "always" if pre.get("add_prefix_space") else "never")
        mark = pre.get("replacement")
        # Not split at spaces (Mistral's files): the whole text is one word to BPE, and still
        # the same in pieces cut before a space if no token holds the mark but at its start
        # (no merge can join across it).
        exact = scheme in ("always", "first", "never") and mark == "\u2581"
        if exact and not pre.get("split", True):
            exact = not any(mark in t[1:] for t in file.vocab)
        return "metaspace" if exact else None
    steps = pre.get("pretokenizers") if isinstance(pre, dict) else None
    if not steps or len(steps) != 2 or not _byte_level(steps[1], False):
        return None
    split = steps[0]
    kept = (split.get("behavior") == "Isolated" and not split.get("invert")) or (
        split.get("behavior") == "Removed" and split.get("invert")  # cl100k, o200k files
    )
    pattern = (split.get("pattern") or {}).get("Regex")
    exact = split.get("type") == "Split" and kept and pattern in _SAFE_SPLITS
    return "byte-level" if exact else None


def pieces_are_exact(tok: HFTokenizer) -> bool:
    """Whether a huge text of ``tok`` may be cut into pieces exactly (:func:`piece_rule`)."""
    return piece_rule(tok) is not None


def _exact_cut(text: str, pos: int, end: int, rule: str) -> int | None:
    """The first exact cut of ``rule`` in ``text[pos:end]``, by preference of kind."""
    if rule == "metaspace":
        space = _SPACE.search(text, pos, end)
        return None if space is None else space.start()
    line = _LINE_START.search(text, pos, end)
    if line is not None:
        return line.end()
    word = _WORD_START.search(text, pos, end)
    if word is not None:
        return word.start()
    mark = _MARK_AFTER_LETTER.search(text, pos, end)
    while mark is not None:
        # A letter (not a numeral such as "²", which \p{N}{1,3} would join with a digit
        # after it), then a punctuation mark, a symbol or a digit (not a combining mark).
        after = unicodedata.category(mark.group())[0]
        if unicodedata.category(text[mark.start() - 1])[0] == "L" and after in "PSN":
            return mark.start()
        mark = _MARK_AFTER_LETTER.search(text, mark.end(), end)
    return None


def cut_plan(text: str, size: int, rule: str = "byte-level") -> tuple[list[int], int]:
    """Where to cut ``text`` into pieces of about ``size`` characters (see :func:`piece_rule`),
    and how many of the cuts are not exact: a stretch of ``REACH`` times ``size`` characters
    without any exact cut (a text of one letter repeated, a CJK text without punctuation)
    is cut at ``size``, a cut whose ids at the join may differ from the whole text's."""
    cuts, pos, inexact = [0], size, 0
    while pos < len(text):
        cut = _exact_cut(text, pos, pos + size, rule)
        if cut is None:
            cut = _exact_cut(text, pos + size, pos + REACH * size, rule)
        if cut is None:
            if pos + REACH * size >= len(text):
                break  # the rest is short enough to be one piece
            cut, inexact = pos, inexact + 1
        cuts.append(cut)
        pos = cut + size
    cuts.append(len(text))
    return cuts, inexact


def cut_points(text: str, size: int, rule: str = "byte-level") -> list[int]:
    """Where to cut ``text`` into pieces of about ``size`` characters (:func:`cut_plan`)."""
    return cut_plan(text, size, rule)[0]


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
    - ``backend`` (default: the choice the tokenizer was loaded with,
      :attr:`HFTokenizer.backend_choice`, made once by ``prepare.choose_tokenizer``): ``"hf"``
      encodes with `tokenizers`; ``"auto"`` with the first fast backend of the table that
      loads the file and passes the parity gate on the first batch (:attr:`backend` says
      which and why); a fast backend named (``"fastokens"``, ``"gigatoken"``) fails when it
      cannot. A batch a fast backend raises on is re-encoded with `tokenizers` and counted
      (``Backend.fallback_batches``). The ids are the same.

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
        backend: str | None = None,
        check_every: int = 0,
    ):
        if backend is None:
            backend = getattr(tokenizer, "backend_choice", REFERENCE)
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
        self._engine: Engine | None = None
        self._rule: str | None = None
        self.on_progress: Callable[[int], None] | None = None
        """Called with the characters encoded so far of a huge document, piece by piece."""
        self._check_every = check_every
        self._chars_seen = 0
        self._gate_lock = threading.Lock()
        self._gated = backend == REFERENCE or not isinstance(tokenizer, HFTokenizer)
        if isinstance(tokenizer, HFTokenizer):
            self.backend = reference_backend(
                (getattr(tokenizer, "backend_reason", None) or "--tokenizer-backend hf")
                if backend == REFERENCE
                else "no document to encode"
            )
        elif backend not in (AUTO, REFERENCE):
            raise TokenizerError(
                f"--tokenizer-backend {backend} needs a tokenizer.json; {tokenizer.name} is "
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
            self._rule = piece_rule(tok)
            if self._rule is None:
                self._pieces = False
            elif not self._add_special or not self._n_special:
                self._pieces = True
            elif self._engine is not None:
                bare = self._engine.encode(["a"], False, self.parse_special).ids.tolist()
                full = self._engine.encode(["a"], True, self.parse_special).ids.tolist()
                self._pieces = full[len(full) - len(bare) :] == bare
            else:
                bare = tok.encode_batch(["a"], add_special_tokens=False)[0]
                full = tok.encode_batch(["a"], add_special_tokens=True)[0]
                self._pieces = full[len(full) - len(bare) :] == bare
        return self._pieces

    def _encode_huge(self, text: str, fast: Engine | None) -> Flat:
        """One document of more than :data:`HUGE_CHARS` characters, encoded a few pieces at
        a time (as many as the tokenizer's threads can share) and joined."""
        cuts, inexact = cut_plan(text, PIECE_CHARS, self._rule or "byte-level")
        if inexact:
            with self._gate_lock:
                self.backend.inexact_cuts += inexact
        spans = list(itertools.pairwise(cuts))
        # Byte-level BPE (or byte fallback): every id holds at least one byte, so a document
        # of n characters (at most 4n bytes) has at most 4n ids, plus a word-start mark, the
        # post-processor's and an EOS. Pages of the array count in memory only once written.
        room = np.empty(4 * len(text) + self._n_special + 8, np.int32)
        n = 0
        for g in range(0, len(spans), 2):
            group = [text[a:b] for a, b in spans[g : g + 2]]
            parts: list[Any] = []
            if fast is not None:
                first, rest = group[:1], group[1:]
                for part, special in ((first, g == 0 and self._add_special), (rest, False)):
                    if part:
                        parts.append(fast.encode(part, special, self.parse_special).ids)
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
            if self.on_progress is not None:
                self.on_progress(spans[min(g + 1, len(spans) - 1)][1])
        return Flat.of_document(room, n)

    def _check(self, texts: Sequence[str], flat: Flat) -> None:
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
                name = self.backend.name
                key = gate_key(self.tokenizer, spec_of(name), self._add_special, self.parse_special)
                save_verdict(key, False, f"{name} differed from tokenizers on a document")
                raise TokenizerError(
                    f"--check-sample: {name} and tokenizers give different ids for a "
                    f"document ({text[:40]!r}...): nothing was written; pack with "
                    "--tokenizer-backend hf"
                )
        with self._gate_lock:
            self.backend.documents_checked += int(picks.size)

    def _gate(self, texts: Sequence[str]) -> None:
        with self._gate_lock:
            if not self._gated:
                assert isinstance(self.tokenizer, HFTokenizer)
                self._engine, self.backend = parity_gate(
                    self.tokenizer, self._choice, texts, self._add_special, self.parse_special
                )
                self._gated = True

    def tokenize(self, texts: Sequence[str]) -> Sequence[Any]:
        """Run the tokenizer on ``texts`` (the heavy, parallel part).

        With a fast backend the result is one flat buffer of ids for the whole batch; with
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
                out = self._encode_huge(texts[0], self._engine)
            except Exception:  # as below: the whole document with tokenizers, counted
                if self._engine is None:
                    raise
                with self._gate_lock:
                    self.backend.fallback_batches += 1
                out = self._encode_huge(texts[0], None)
        elif self._engine is not None:
            try:
                out = self._engine.encode(list(texts), self._add_special, self.parse_special)
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
        if isinstance(encoded, Flat):  # the ids are read in place, no object per document
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
            ids = insert_ids(ids, where, special[what])
        return EncodedBatch(ids, lengths, empty, None, getattr(encoded, "special_strings", 0))

    def encode(self, texts: Sequence[str]) -> EncodedBatch:
        """Token ids of ``texts``, flat, one document after another."""
        return self.finish(self.tokenize(texts))
