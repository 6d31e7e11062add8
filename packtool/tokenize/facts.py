"""A tokenizer.json read once per file: its vocabulary's facts cached by the file's sha256.

Parsing the vocabulary of a large tokenizer (a 128-200k BPE: 40-90 ms of Python, holding the
GIL) is on the way to every run's first batch, yet a run needs only a few figures of it: the
highest id, the size, the ids of the added tokens and of a few special-token names
(:meth:`~packtool.tokenizer_file.TokenizerFile.facts`). The first run with a file parses it
whole and keeps those facts in the user's cache (as the parity gate keeps its verdicts); a
later run reads the head of the file and the facts, and parses the vocabulary only if it asks
for a token the facts do not name. The facts are a function of the file's bytes (the key) and
of :data:`~packtool.tokenizer_file.FACTS_VERSION`; a cache that cannot be read or written only
costs the parse.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Sequence

from ..fs import user_cache_dir
from ..tokenizer_file import FACTS_VERSION, TokenizerFile

__all__ = ["read_tokenizer_file"]

_FOLDER = "tokenizer-facts"


def read_tokenizer_file(data: bytes, sha256: str, names: Sequence[str] = ()) -> TokenizerFile:
    """The :class:`TokenizerFile` of ``data`` (whose sha256 is ``sha256``): from its head and
    its cached facts, else parsed whole (and its facts, with the ids of ``names``, cached).
    Raises ``ValueError`` as :meth:`TokenizerFile.parse` does."""
    path = user_cache_dir() / _FOLDER / f"{sha256}-{FACTS_VERSION}.json"
    facts = None
    with contextlib.suppress(OSError, ValueError):
        facts = json.loads(path.read_bytes())
    if facts is not None:
        file = TokenizerFile.with_facts(data, facts)
        if file is not None:
            return file
    file = TokenizerFile.parse(data)
    _save(path, json.dumps(file.facts(names)))
    return file


def _save(path: os.PathLike[str], text: str) -> None:
    with contextlib.suppress(OSError):  # a cache: a read-only home only costs the parse
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
