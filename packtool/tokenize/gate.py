"""The parity gate: a fast backend encodes a run's documents only where it gives exactly the
ids of Hugging Face `tokenizers` on a fixed set of probes (many scripts, whitespace runs,
digits, long words, the tokenizer's own added-token strings as text, and all of them joined
into one long text) and on the first documents of the run. The probes' verdict is cached by
the file's sha256, the backend and both libraries' versions; a cached pass skips loading
`tokenizers` at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Sequence
from typing import Any

from ..errors import TokenizerError
from ..fs import user_cache_dir
from .backend import Backend, BackendSpec, Engine, first_line, package_version
from .registry import AUTO, REFERENCE, candidates

__all__ = [
    "GATE_CACHED",
    "GATE_PASSED",
    "LONG_PROBE_CHARS",
    "PROBES",
    "gate_key",
    "parity_gate",
    "probe_texts",
    "reference_backend",
    "save_verdict",
]

GATE_PASSED = "passed the parity gate"
GATE_CACHED = "passed the parity gate (cached verdict; tokenizers not loaded)"

PROBES: tuple[str, ...] = (
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
PROBE_VERSION = 2  # bump when the probes change: cached verdicts are keyed by it
LONG_PROBE_CHARS = 40 << 10
"""The probes are also encoded joined into one text of at least this many characters, in a
call of its own, as is the longest document of the first batch: a backend may encode a batch
of long texts another way (gigatoken: one at a time, past 16 Ki characters each)."""
GATE_DOCS = 16  # first documents of the input in the gate, each cut to GATE_DOC_CHARS
GATE_DOC_CHARS = 8 << 10
GATE_LONGEST_CHARS = 64 << 10  # the longest document of the first batch, cut to this
# Cut, because `tokenizers` encodes the gate's texts at its own speed (1-2 MB/s on 2 cores)
# before the first batch can go on: what the gate reads costs ~0.1 s, not a second.


def reference_backend(reason: str, notice: str | None = None) -> Backend:
    """The record of a run encoded with `tokenizers` (its version read from its metadata: a
    warm fast run never imports it)."""
    return Backend(REFERENCE, package_version("tokenizers"), reason, notice=notice)


def probe_texts(tok: Any) -> list[str]:
    """The fixed part of the parity gate: many scripts, whitespace runs, digits, long words,
    and the tokenizer's own added-token strings alone, glued and inside text; then all of
    them joined into one long text."""
    out = list(PROBES)
    added = sorted(set(tok.added_strings))[:2000]
    out.extend(added)
    out.extend(f"x {a} y{a}z" for a in added)
    out.append("".join(added[:200]))
    joined = "\n".join(out)
    out.append(joined * (LONG_PROBE_CHARS // max(len(joined), 1) + 1))
    return out


def gate_key(tok: Any, backend: BackendSpec, add_special: bool, parse_special: bool) -> str:
    text = json.dumps(
        [
            tok.sha256,
            backend.name,
            backend.version(),
            package_version("tokenizers"),
            PROBE_VERSION,
        ]
    )
    text += f"{add_special:d}{parse_special:d}"
    return hashlib.sha256(text.encode()).hexdigest()


def _cached_verdict(key: str) -> dict[str, Any] | None:
    path = user_cache_dir() / "parity-gate" / f"{key}.json"
    try:
        verdict = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return verdict if isinstance(verdict, dict) and "ok" in verdict else None


def save_verdict(key: str, ok: bool, why: str) -> None:
    folder = user_cache_dir() / "parity-gate"
    with contextlib.suppress(OSError):  # a cache: a read-only home only costs the probes
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_text(json.dumps({"ok": ok, "why": why}), encoding="utf-8")
        os.replace(tmp, folder / f"{key}.json")


def _first_difference(
    tok: Any, engine: Engine, texts: Sequence[str], add_special: bool, parse_special: bool
) -> tuple[int, str] | None:
    """The index of the first text whose ids differ between `tokenizers` and ``engine``,
    and how (``None``: none differs). The last text (the long one) is encoded in a call of its
    own: a backend may encode a batch of long texts another way (gigatoken: one at a time)."""
    if not texts:
        return None
    want = [e.ids for e in tok.encodings(texts, add_special, parse_special)]
    try:
        calls = [list(texts[:-1]), [texts[-1]]] if len(texts) > 1 else [list(texts)]
        got = [ids for c in calls for ids in engine.encode(c, add_special, parse_special).lists()]
    except Exception as e:  # the fast backend failed on a probe: not a pass
        return 0, f"raised {first_line(e)}"
    if len(got) != len(want):
        return 0, "gave another number of documents"
    at = next((i for i, (a, b) in enumerate(zip(want, got, strict=True)) if a != b), None)
    return None if at is None else (at, "differs from tokenizers")


def _try(
    tok: Any,
    backend: BackendSpec,
    first_batch: Sequence[str],
    add_special: bool,
    parse_special: bool,
) -> tuple[Engine | None, str]:
    """``backend``'s engine if it passes the gate (and the reason of its record), else
    ``None`` and why not."""
    refused = backend.refuses(tok.file)
    if refused is not None:
        return None, refused
    # The cached verdict is looked up while the engine may still be loading (the libraries'
    # versions come from their metadata: 20-30 ms of Python, off the load's critical path).
    key = gate_key(tok, backend, add_special, parse_special)
    verdict = _cached_verdict(key)
    engine, why = tok.engine(backend.name)
    if engine is None:
        return None, why
    if verdict is not None:
        return (engine, GATE_CACHED) if verdict["ok"] else (None, str(verdict["why"]))
    probes = probe_texts(tok)
    at = _first_difference(tok, engine, probes, add_special, parse_special)
    why = "" if at is None else f"{backend.name} {at[1]} on {probes[at[0]][:40]!r}"
    save_verdict(key, at is None, why)
    if at is not None:
        return None, why
    data = [text[:GATE_DOC_CHARS] for text in first_batch[:GATE_DOCS]]
    if first_batch:
        data.append(max(first_batch, key=len)[:GATE_LONGEST_CHARS])
    at = _first_difference(tok, engine, data, add_special, parse_special)
    if at is not None:  # remembered: a later run with a cached verdict would not look
        where = f"document {at[0] + 1}" if at[0] < len(data) - 1 else "the longest document"
        save_verdict(key, False, f"{backend.name} {at[1]} on {where} of a run's data")
        return None, f"{backend.name} {at[1]} on {where} of the first batch"
    return engine, GATE_PASSED


def parity_gate(
    tok: Any,
    choice: str,
    first_batch: Sequence[str],
    add_special: bool,
    parse_special: bool,
) -> tuple[Engine | None, Backend]:
    """The first fast backend of ``choice`` (``auto``: each, best suited to this tokenizer
    first) that loads the file and encodes the probes and the first documents exactly as
    `tokenizers` does, with its :class:`Backend`; else `tokenizers` (``auto``) or an error
    (a backend named by the user).

    When a verdict is cached (and good), `tokenizers` is not loaded at all: the first
    documents are not compared either (``--check-sample`` compares documents of the run, at
    the cost of that load); the :class:`Backend`'s reason says which gate was passed.
    """
    whys = []
    for backend in candidates(choice, tok.file):
        engine, why = _try(tok, backend, first_batch, add_special, parse_special)
        if engine is not None:
            return engine, Backend(backend.name, backend.version(), why)
        whys.append(why)
    why = "; ".join(whys) or "no fast backend"
    if choice != AUTO:
        raise TokenizerError(
            f"--tokenizer-backend {choice}: {why}; use --tokenizer-backend auto or hf"
        )
    return None, reference_backend(why, notice=f"{why}: tokenizing with Hugging Face tokenizers")
