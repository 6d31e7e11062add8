"""gigatoken: a Rust tokenizer (SIMD pre-tokenizer) that loads tokenizer.json and encodes a
text into a NumPy array of ids, or a batch into flat ids with offsets (an awkward array, read
here in place).

A batch of texts of at least :data:`ALONE_CHARS` characters each is encoded one text at a time
(``encode``: one core, without the GIL, 21-25 us of fixed cost a call, and no awkward array:
on long documents it spends half the CPU time of ``encode_batch``, whose import of awkward
alone holds the GIL for 0.1-0.2 s); any other batch in one ``encode_batch``. Batches may share
a copy; a text encoded alone takes it by itself (``encode`` borrows it mutably: beside another
call it raises), so a batch with a few short texts is not cut in two (the long ones' calls
would wait for the other batches).

It always matches added tokens, special ones included, and never runs the post-processor, so
packtool loads it from an edited copy of the JSON: without the special added tokens when their
strings are text (as `tokenizers`' ``encode_special_tokens``), with all of them otherwise, and
:data:`~.backend.ANCHOR` added in both; the post-processor's tokens (a template's BOS/EOS, a
BERT-style CLS/SEP) are added from the file's own record. Whatever it gives passes the parity
gate before a run uses it.

Its caches of pre-tokens grow with the distinct words it has seen and are never trimmed (3.4 GB
of peak RSS after 300 MB of generated text of unique words, o200k): a copy whose process has
grown by more than :data:`CACHE_BUDGET` since it was loaded is dropped and loaded again (what
frees the caches: 350 MiB again after each reload), checked every :data:`CHECK_EVERY`
characters encoded. On real prose the caches level off and no reload happens.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..tokenizer_file import TokenizerFile, file_head
from .backend import ANCHOR, BackendSpec, Flat, made_once

__all__ = [
    "ALONE_CHARS",
    "BACKEND",
    "CACHE_BUDGET",
    "CHECK_EVERY",
    "GigatokenEngine",
    "post_processor_affixes",
]

CACHE_BUDGET = 256 << 20
"""Bytes a process may grow by while one gigatoken copy encodes, before the copy is reloaded."""
CHECK_EVERY = 8 << 20
"""Characters encoded between two looks at the process's resident memory."""
ALONE_CHARS = 16 << 10
"""A batch whose texts are all at least this long is encoded one text at a time."""


def resident_bytes() -> int | None:
    """This process's resident memory (Linux ``/proc``; ``None`` elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


try:
    import os as _os

    _PAGE = _os.sysconf("SC_PAGE_SIZE")
except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
    _PAGE = 4096


def post_processor_affixes(pp: Any) -> tuple[list[int], list[int]] | None:
    """The ids a post-processor puts before and after a single text; ``None``: one this
    module does not know."""
    if pp is None:
        return [], []
    if not isinstance(pp, Mapping):
        return None
    kind = pp.get("type")
    if kind == "ByteLevel":
        return [], []
    if kind == "Sequence":
        before: list[int] = []
        after: list[int] = []
        for step in pp.get("processors") or ():
            got = post_processor_affixes(step)
            if got is None:
                return None
            before, after = before + got[0], got[1] + after
        return before, after
    if kind in ("BertProcessing", "RobertaProcessing"):
        return [int(pp["cls"][1])], [int(pp["sep"][1])]
    if kind == "TemplateProcessing":
        tokens = pp.get("special_tokens") or {}
        before, after, seen = [], [], False
        for item in pp.get("single") or ():
            if "Sequence" in item:
                seen = True
                continue
            name = item.get("SpecialToken", {}).get("id")
            if name not in tokens:
                return None
            ids = [int(i) for i in tokens[name]["ids"]]
            (after if seen else before).extend(ids)
        return before, after
    return None


_EDITED = ("added_tokens", "truncation", "padding")


def edited_json(json_bytes: bytes, anchor_id: int, parse_special: bool) -> bytes:
    """The tokenizer.json gigatoken loads: special added tokens kept only when they are
    parsed, packtool's anchor added, truncation and padding off. Those members are replaced
    in the head of the file, and the rest (the model: most of the file) is copied as bytes,
    never decoded nor parsed (a 151k BPE file is 11 MB: parsing it whole and writing it again
    held the GIL for longer than gigatoken's own load); a file laid out otherwise is parsed
    and written whole."""
    head = file_head(json_bytes, _EDITED)
    spec = json.loads(json_bytes) if head is None else {k: head.value(k) for k in _EDITED}
    added = [a for a in spec.get("added_tokens") or () if parse_special or not a.get("special")]
    added.append(
        {
            "id": anchor_id,
            "content": ANCHOR,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": False,
        }
    )
    changes = {"added_tokens": added, "truncation": None, "padding": None}
    if head is not None:
        return head.edited(changes)
    return json.dumps({**spec, **changes}, ensure_ascii=False).encode("utf-8")


class GigatokenEngine:
    """gigatoken's copies of a tokenizer.json, one per mode (special-token strings as text,
    or parsed), each loaded when first needed."""

    def __init__(self, json_bytes: bytes, anchor_id: int) -> None:
        self._json = json_bytes
        self._anchor_id = anchor_id
        self._copies: dict[bool, Any] = {}
        self._lock = threading.Lock()
        self._calls = _Calls()
        self._encoded = 0  # characters encoded since the last look at the memory
        self._base: int | None = None  # resident bytes when the copies were (re)loaded
        self.reloads = 0
        head = file_head(json_bytes, ("post_processor",))
        pp = (
            TokenizerFile.parse(json_bytes).post_processor
            if head is None
            else head.value("post_processor")
        )
        self._affixes = post_processor_affixes(pp)
        self._copy(False)

    def _copy(self, parse_special: bool) -> Any:
        def make() -> Any:
            import gigatoken

            text = edited_json(self._json, self._anchor_id, parse_special)
            tok = gigatoken.Tokenizer.from_json(text)
            if tok.encode(ANCHOR).tolist() != [self._anchor_id]:
                raise ValueError("gigatoken gave packtool's anchor token another id")
            self._base = resident_bytes()
            return tok

        return made_once(self._copies, parse_special, self._lock, make)

    def _mind_the_caches(self, chars: int) -> None:
        """Reload the copies if the process grew past :data:`CACHE_BUDGET` since their load
        (their pre-token caches are never trimmed)."""
        with self._lock:
            self._encoded += chars
            if self._encoded < CHECK_EVERY:
                return
            self._encoded = 0
            now, base = resident_bytes(), self._base
            if now is None or base is None or now - base <= CACHE_BUDGET:
                return
            modes = list(self._copies)
            self._copies.clear()  # calls under way keep their copy until they return
            self.reloads += 1
        for mode in modes:
            self._copy(mode)

    def encode(self, texts: list[str], add_special: bool, parse_special: bool) -> Flat:
        sizes = np.fromiter(map(len, texts), np.int64, len(texts))
        self._mind_the_caches(int(sizes.sum()))
        tok = self._copy(parse_special)
        before: list[int] = []
        after: list[int] = []
        if add_special:
            if self._affixes is None:
                raise ValueError("gigatoken: a post-processor packtool cannot read")
            before, after = self._affixes
        if not texts or int(sizes.min()) < ALONE_CHARS:
            with self._calls.shared():
                layout = tok.encode_batch(texts).layout
            flat = Flat.from_offsets(
                np.asarray(layout.content.data), np.asarray(layout.offsets.data)
            )
            return _with_affixes(flat, before, after) if before or after else flat
        # Long texts only: one at a time, joined with the post-processor's ids around each
        # (the ids copied once).
        got = []
        for text in texts:
            with self._calls.alone():
                got.append(tok.encode(text))
        head, tail = np.asarray(before, np.uint32), np.asarray(after, np.uint32)
        lengths = np.fromiter(map(len, got), np.int64, len(got)) + head.size + tail.size
        parts = [p for ids in got for p in (head, ids, tail)] if before or after else got
        return Flat(np.concatenate(parts).view(np.int32), lengths)


class _Calls:
    """Calls into one gigatoken copy: batches may run side by side (``encode_batch`` borrows the
    copy shared), a text encoded alone runs by itself (``encode`` borrows it mutably; beside any
    other call it raises "Already borrowed")."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._shared = 0  # batches under way
        self._alone = False  # a text under way

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._alone)
            self._shared += 1
        try:
            yield
        finally:
            with self._changed:
                self._shared -= 1
                self._changed.notify_all()

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._alone and not self._shared)
            self._alone = True
        try:
            yield
        finally:
            with self._changed:
                self._alone = False
                self._changed.notify_all()


def _with_affixes(flat: Flat, before: list[int], after: list[int]) -> Flat:
    """``flat`` with ``before`` put in front of each document's ids and ``after`` behind (the
    ids copied once under a mask, as ``np.insert`` does: a scatter by index cost six times as
    much)."""
    p, s = len(before), len(after)
    lengths = flat.lengths + p + s
    ends = np.cumsum(lengths)
    starts = ends - lengths
    out = np.empty(int(ends[-1]) if ends.size else 0, np.int32)
    keep = np.ones(out.size, bool)
    for at, tid in [*((starts + k, t) for k, t in enumerate(before)),
                    *((ends - s + k, t) for k, t in enumerate(after))]:  # fmt: skip
        out[at] = tid
        keep[at] = False
    out[keep] = flat.ids
    return Flat(out, lengths)


def load(json_bytes: bytes, anchor_id: int) -> GigatokenEngine:
    return GigatokenEngine(json_bytes, anchor_id)


def _refuses(file: TokenizerFile) -> str | None:
    if file.model_type != "BPE":
        return f"gigatoken loads BPE tokenizers, not {file.model_type}"
    return None


def _suits(file: TokenizerFile) -> int:
    # docs/performance.md: the fastest on byte-level BPE (o200k, Qwen3, Llama 3 layouts, load
    # included); slower than fastokens on SentencePiece-style files.
    return 3 if "ByteLevel" in repr(file.pre_tokenizer) else 1


BACKEND = BackendSpec(
    name="gigatoken",
    package="gigatoken",
    refuses=_refuses,
    load=load,
    suits=_suits,
)
