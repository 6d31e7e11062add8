"""What a ``tokenizer.json`` says, read from its JSON without loading a tokenizer library.

Loading a large tokenizer is seconds (an 11 MB ``tokenizer.json`` of a 151k vocabulary: about
1.2 s in fastokens, 0.4 s in Hugging Face `tokenizers`, each holding the GIL). A run that
encodes with fastokens needs of `tokenizers` only what the file itself says: the added tokens
and which are special, the ids of a few token strings, how many tokens the post-processor
adds, the truncation and padding it carries. :class:`TokenizerFile` reads those from the JSON
(stopping before the BPE merges, the bulk of the file, when the file is laid out as
`tokenizers` saves it), and :func:`resolve_special_tokens` turns them and
``tokenizer_config.json`` into EOS, BOS and PAD: the one place that does, whatever engine
encodes. ``tests/test_tokenizer_file.py`` checks every figure against `tokenizers` on every
tokenizer family.

A layout this module does not know (a post-processor type it cannot count) is ``None``
here; the caller then asks `tokenizers`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "BOS_NAMES",
    "EOS_NAMES",
    "PAD_NAMES",
    "AddedToken",
    "FileHead",
    "SpecialTokens",
    "TokenizerFile",
    "file_head",
    "head_members",
    "resolve_special_tokens",
    "turned_off_notice",
    "with_members",
]

EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "<|im_end|>")
BOS_NAMES = ("<s>", "<|begin_of_text|>", "<bos>", "<|bos|>", "<|startoftext|>")
PAD_NAMES = ("<pad>", "<|pad|>", "[PAD]", "<|padding|>", "<|finetune_right_pad_id|>")

# The keys of a tokenizer.json packtool reads, besides the model's.
_TOP_KEYS = ("truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer")
_TOP_KEYS += ("post_processor",)

FACTS_VERSION = 1
"""Of :meth:`TokenizerFile.facts`: bumped when what they hold, or what it is read from,
changes (facts of another version are not read)."""


def _facts_shape_ok(facts: Any) -> bool:
    """Whether ``facts`` (read from a cache) have the shape :meth:`TokenizerFile.facts`
    writes, at this :data:`FACTS_VERSION`."""
    try:
        model, known, added = facts["model"], facts["known"], facts["added"]
        return (
            facts["version"] == FACTS_VERSION
            and isinstance(model["type"], str)
            and all(type(facts[k]) is int for k in ("model_size", "top_id", "vocab_size"))
            and isinstance(known, dict)
            and all(v is None or type(v) is int for v in known.values())
            and all(
                len(a) == 3 and type(a[0]) is int and isinstance(a[1], str) and type(a[2]) is bool
                for a in added
            )
        )
    except (KeyError, TypeError, IndexError):
        return False


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of the special tokens packtool uses (``None`` where the tokenizer has none)."""

    eos_id: int | None
    bos_id: int | None
    pad_id: int | None
    missing: tuple[tuple[str, str], ...] = ()
    """``(kind, token)`` for the EOS or BOS token ``tokenizer_config.json`` names when it is
    not in the vocabulary (that id is then ``None``: never another token in its place)."""


@dataclass(frozen=True)
class AddedToken:
    """One entry of the file's ``added_tokens``."""

    id: int
    content: str
    special: bool


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _members(text: str, i: int, decoder: json.JSONDecoder) -> Any:
    """(key, index of its value) of the JSON object starting at ``text[i] == '{'``; send it
    the index where that value ends to get the next member."""
    i = _skip_ws(text, i + 1)
    if text[i] == "}":
        return
    while True:
        key, i = decoder.raw_decode(text, i)
        i = _skip_ws(text, i)
        if text[i] != ":":
            raise ValueError("expected ':'")
        i = _skip_ws(text, i + 1)
        i = yield key, i
        i = _skip_ws(text, i)
        if text[i] == "}":
            return
        if text[i] != ",":
            raise ValueError("expected ','")
        i = _skip_ws(text, i + 1)


def _walk_top(
    text: str, decoder: json.JSONDecoder, stop: Callable[[str, Mapping[str, Any]], bool]
) -> tuple[dict[str, tuple[Any, int, int]], int | None]:
    """The top-level members of a JSON object, each with the span of its value, read in order
    until ``stop(key, members read so far)`` is true of one: (those members, the index of the
    stopping member's value, or ``None`` if none stopped). ``ValueError`` (or ``IndexError``)
    when the text is not a JSON object."""
    out: dict[str, tuple[Any, int, int]] = {}
    i = _skip_ws(text, 0)
    if text[i] != "{":
        raise ValueError("not a JSON object")
    top = _members(text, i, decoder)
    step = next(top, None)
    while step is not None:
        key, at = step
        if stop(key, out):
            return out, at
        value, end = decoder.raw_decode(text, at)
        out[key] = (value, at, end)
        step = top.send(end)
    return out, None


def head_members(text: str, keys: Sequence[str]) -> dict[str, tuple[Any, int, int]] | None:
    """The values of the top-level ``keys`` of a tokenizer.json, each with the span of its
    text, read from the top and no further than the model (which `tokenizers` writes last, and
    which is most of the file); ``None`` when one of them is not before the model or the text
    is not a JSON object (the caller then parses the whole file)."""
    try:
        read, _ = _walk_top(
            text, json.JSONDecoder(), lambda k, got: k == "model" or all(w in got for w in keys)
        )
    except (ValueError, IndexError, StopIteration):
        return None
    return {k: read[k] for k in keys} if all(k in read for k in keys) else None


class FileHead(NamedTuple):
    """Top-level members of a tokenizer.json read from its head (:func:`file_head`): their
    values and spans in ``text``, the file's first ``end`` bytes decoded. (A named tuple: a
    dataclass costs every run ~1 ms of import.)"""

    members: dict[str, tuple[Any, int, int]]
    text: str
    end: int
    data: bytes

    def value(self, key: str) -> Any:
        return self.members[key][0]

    def edited(self, values: Mapping[str, Any]) -> bytes:
        """The file with the members given ``values`` (:func:`with_members`), every other
        byte as it was; the part after the head is copied as bytes, never decoded."""
        return with_members(self.text, self.members, values).encode("utf-8") + self.data[self.end :]


_WS = b" \t\r\n"


def _model_value_start(data: bytes) -> int:
    """The offset just past the first byte of the value of the first ``"model"`` key in
    ``data`` (the first occurrence followed by a colon), or ``len(data)``."""
    at = data.find(b'"model"')
    while at >= 0:
        i = at + len(b'"model"')
        while i < len(data) and data[i] in _WS:
            i += 1
        if i < len(data) and data[i] == ord(":"):
            i += 1
            while i < len(data) and data[i] in _WS:
                i += 1
            return min(i + 1, len(data))
        at = data.find(b'"model"', at + 1)
    return len(data)


def file_head(data: bytes, keys: Sequence[str]) -> FileHead | None:
    """The top-level ``keys`` of the tokenizer.json ``data``, read as :func:`head_members`
    reads them, decoding only the bytes before the model's value (which `tokenizers` writes
    last: 11 of the 11.4 MB of a 151k BPE file). ``None`` as :func:`head_members` (the caller
    then parses the whole file). The cut is made after the first ``"model":``; if that is not
    the top-level key, reading the head fails and the whole file is decoded and read."""
    end = _model_value_start(data)
    try:
        text = data[:end].decode("utf-8")
        found = head_members(text, keys)
    except UnicodeDecodeError:
        found = None
    if found is None and end < len(data):
        end = len(data)
        text = data.decode("utf-8")
        found = head_members(text, keys)
    return None if found is None else FileHead(found, text, end, data)


def with_members(
    text: str, found: Mapping[str, tuple[Any, int, int]], values: Mapping[str, Any]
) -> str:
    """``text`` (a tokenizer.json) with the top-level members ``found`` by
    :func:`head_members` given ``values``, every other byte as it was."""
    out, last = [], 0
    for key, (_, start, end) in sorted(found.items(), key=lambda kv: kv[1][1]):
        out += [text[last:start], json.dumps(values[key], ensure_ascii=False)]
        last = end
    out.append(text[last:])
    return "".join(out)


def _read_head(text: str) -> dict[str, Any] | None:
    """The file's top-level keys, with the model's ``merges`` left out, or ``None`` when the
    layout is not the one `tokenizers` saves (the caller then parses the whole file).

    `tokenizers` writes the model last and, in it, the merges last: once every other key has
    been read, the merges (half of the parsing time of a large BPE) are not read at all.
    """
    decoder = json.JSONDecoder()
    try:
        read, at = _walk_top(text, decoder, lambda key, _: key == "model")
        if at is None or text[at] != "{":
            return None
        out = {k: value for k, (value, _, _) in read.items()}
        model: dict[str, Any] = {}
        inner = _members(text, at, decoder)
        mstep = next(inner, None)
        while mstep is not None:
            mkey, mat = mstep
            if mkey == "merges" and "vocab" in model and all(k in out for k in _TOP_KEYS):
                out["model"] = model
                return out  # the rest is the merges (and whatever follows, unread)
            model[mkey], mend = decoder.raw_decode(text, mat)
            mstep = inner.send(mend)
    except (ValueError, IndexError, StopIteration):
        return None
    return None  # no merges to stop at: parse the whole file instead


class TokenizerFile:
    """The parts of a ``tokenizer.json`` packtool needs, from its JSON.

    ``TokenizerFile.parse(data)`` raises ``ValueError`` for bytes that are not a
    tokenizer.json (not JSON, no model); `tokenizers` gives the precise reason.
    """

    def __init__(self, spec: Mapping[str, Any]) -> None:
        model = spec.get("model")
        if not isinstance(model, Mapping) or not isinstance(model.get("type", "BPE"), str):
            raise ValueError("no model")
        self.model_type: str = str(model.get("type") or _infer_model_type(model))
        self.dropout = model.get("dropout")
        vocab = model.get("vocab")
        self._vocab: dict[str, int] | None
        if isinstance(vocab, Mapping):  # token -> id (a file whose ids are not integers
            self._vocab = dict(vocab)  # loads in neither engine: the run fails there)
        elif isinstance(vocab, list):  # Unigram: [piece, score] pairs, ids in order
            self._vocab = {}
            for i, entry in enumerate(vocab):  # a piece listed twice: its last id
                self._vocab[str(entry[0])] = i
        else:
            raise ValueError("no vocabulary")
        self._data: bytes | None = None
        self._facts: Mapping[str, Any] | None = None
        self.added = self._assign_ids(spec.get("added_tokens") or ())
        self._added_ids = {t.content: t.id for t in self.added}
        self._read_members(spec)

    def _read_members(self, spec: Mapping[str, Any]) -> None:
        self.normalizer: Any = spec.get("normalizer")
        self.pre_tokenizer: Any = spec.get("pre_tokenizer")
        self.post_processor: Any = spec.get("post_processor")
        self.truncation: Mapping[str, Any] | None = spec.get("truncation") or None
        self.padding: Mapping[str, Any] | None = spec.get("padding") or None

    @property
    def vocab(self) -> dict[str, int]:
        """The model's vocabulary, token -> id (read from the file when first asked for, for
        a file read with its facts: :meth:`with_facts`)."""
        if self._vocab is None:
            assert self._data is not None
            self._vocab = TokenizerFile.parse(self._data)._vocab
        assert self._vocab is not None
        return self._vocab

    def facts(self, names: Sequence[str] = ()) -> dict[str, Any]:
        """What this file's vocabulary says that a run needs, without the vocabulary (the
        bulk of the file: 40-90 ms to parse for a 128-200k BPE): the model's members but its
        vocabulary and merges, its size and highest id, the added tokens with their ids, and
        the id of each of ``names`` and of the usual special-token names (``None``: not in
        it). :meth:`with_facts` reads the file again with them."""
        vocab = self.vocab
        model = {"type": self.model_type, "dropout": self.dropout}
        looked = {*names, *EOS_NAMES, *BOS_NAMES, *PAD_NAMES}
        return {
            "version": FACTS_VERSION,
            "model": model,
            "model_size": len(vocab),
            "top_id": max(vocab.values(), default=-1),
            "vocab_size": self.vocab_size,
            "added": [[t.id, t.content, t.special] for t in self.added],
            "known": {name: vocab.get(name) for name in sorted(looked)},
        }

    @classmethod
    def with_facts(cls, data: bytes, facts: Mapping[str, Any]) -> TokenizerFile | None:
        """The file of ``data`` read from its head (the members before the model) and the
        :meth:`facts` of an earlier read of the same bytes; its vocabulary is parsed only if
        asked for (:attr:`vocab`: a token not among the facts' names). ``None`` when the
        facts are of another shape or the head lacks a member (read it whole then)."""
        if not _facts_shape_ok(facts):
            return None
        head = file_head(data, _TOP_KEYS)
        if head is None:
            return None
        made = cls.__new__(cls)
        made.model_type = str(facts["model"]["type"])
        made.dropout = facts["model"]["dropout"]
        made._vocab, made._data, made._facts = None, data, facts
        made.added = tuple(AddedToken(int(i), str(c), bool(sp)) for i, c, sp in facts["added"])
        made._added_ids = {t.content: t.id for t in made.added}
        made._read_members({k: head.value(k) for k in _TOP_KEYS})
        return made

    def _assign_ids(self, entries: Sequence[Mapping[str, Any]]) -> tuple[AddedToken, ...]:
        """The added tokens with the ids `tokenizers` gives them as it loads the file (the
        file's ``id`` is not what counts): a content the model or an earlier added token
        has keeps that id; any other goes above the model's vocabulary, in file order."""
        ids: dict[str, int] = {}
        out: list[AddedToken] = []
        model_size = len(self.vocab)
        for entry in entries:
            content, special = str(entry["content"]), bool(entry.get("special", False))
            tid = ids.get(content, self.vocab.get(content))
            if tid is None:
                top = max(ids.values(), default=None)
                tid = model_size if top is None or (top < model_size and model_size) else top + 1
            if content in ids:  # the same content twice: one token, the last flags
                out = [t for t in out if t.content != content]
            ids[content] = tid
            out.append(AddedToken(tid, content, special))
        return tuple(out)

    @classmethod
    def parse(cls, data: bytes) -> TokenizerFile:
        text = data.decode("utf-8")
        spec = _read_head(text)
        if spec is None:
            spec = json.loads(text)
        if not isinstance(spec, dict):
            raise ValueError("not a JSON object")
        return cls(spec)

    def token_to_id(self, token: str) -> int | None:
        """The id of ``token``: an added token's first, else the model's (as `tokenizers`)."""
        tid = self._added_ids.get(token)
        if tid is not None:
            return tid
        if self._vocab is None and self._facts is not None and token in self._facts["known"]:
            known = self._facts["known"][token]
            return None if known is None else int(known)
        return self.vocab.get(token)

    def _fact(self, name: str) -> int | None:
        """A figure of the vocabulary from the facts, while it is not parsed."""
        return int(self._facts[name]) if self._vocab is None and self._facts else None

    @property
    def vocab_size(self) -> int:
        """The number of tokens with the added ones (`tokenizers`' ``get_vocab_size(True)``)."""
        fact = self._fact("vocab_size")
        return fact if fact is not None else len(self.vocab.keys() | self._added_ids.keys())

    @property
    def next_id(self) -> int:
        """The id `tokenizers` gives the next token added: one above the highest id of the
        vocabulary and the added tokens. It is :attr:`vocab_size` unless the ids have gaps
        (GPT-4o's o200k: 200,000 tokens, the last at id 200,018), and every id is below it."""
        top = self._fact("top_id")
        if top is None:
            top = max(self.vocab.values(), default=-1)
        return max(top, *(t.id for t in self.added)) + 1 if self.added else top + 1

    @property
    def added_next_id(self) -> int:
        """The id `tokenizers` gives a new token added to the loaded file (as :meth:`_assign_ids`
        gives the file's own): the model's count of tokens, or one above the highest added
        token if that is at or above it. It is :attr:`next_id` unless the model's ids have gaps
        in the middle (then it is an id below the highest, perhaps one already taken)."""
        model_size = self._fact("model_size")
        if model_size is None:
            model_size = len(self.vocab)
        top = max((t.id for t in self.added), default=None)
        return model_size if top is None or (top < model_size and model_size) else top + 1

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset(t.id for t in self.added if t.special)

    @property
    def special_strings(self) -> tuple[str, ...]:
        """The special added tokens' strings, shortest first."""
        return tuple(sorted({t.content for t in self.added if t.special and t.content}, key=len))

    @property
    def added_strings(self) -> tuple[str, ...]:
        return tuple(t.content for t in sorted(self.added, key=lambda t: t.id) if t.content)

    @property
    def padding_pad_id(self) -> int | None:
        """The pad id of the file's padding settings (turned off, but a hint for PAD)."""
        return int(self.padding["pad_id"]) if self.padding and "pad_id" in self.padding else None

    def num_special_tokens_to_add(self) -> int | None:
        """Tokens the post-processor adds to a single text; ``None``: a post-processor this
        module does not know."""
        return _post_processor_count(self.post_processor)

    def turned_off(self) -> str | None:
        """The notice of :func:`turned_off_notice` for this file's settings."""
        padding = None
        if self.padding:
            strategy = self.padding.get("strategy")
            length = strategy.get("Fixed") if isinstance(strategy, Mapping) else None
            padding = {
                "length": length,
                "pad_to_multiple_of": self.padding.get("pad_to_multiple_of"),
            }
        return turned_off_notice(self.truncation, padding)


def _infer_model_type(model: Mapping[str, Any]) -> str:
    if "merges" in model:
        return "BPE"
    if isinstance(model.get("vocab"), list):
        return "Unigram"
    return "WordPiece" if "continuing_subword_prefix" in model else "WordLevel"


def _post_processor_count(pp: Any) -> int | None:
    if pp is None:
        return 0
    if not isinstance(pp, Mapping):
        return None
    kind = pp.get("type")
    if kind == "ByteLevel":
        return 0
    if kind in ("BertProcessing", "RobertaProcessing"):
        return 2
    if kind == "TemplateProcessing":
        tokens = pp.get("special_tokens") or {}
        total = 0
        for piece in pp.get("single") or ():
            special = piece.get("SpecialToken") if isinstance(piece, Mapping) else None
            if special is not None:
                entry = tokens.get(special.get("id"))
                total += len(entry.get("ids", ())) if isinstance(entry, Mapping) else 0
        return total
    if kind == "Sequence":
        counts = [_post_processor_count(p) for p in pp.get("processors") or ()]
        return None if None in counts else sum(c for c in counts if c is not None)
    return None


def turned_off_notice(
    truncation: Mapping[str, Any] | None, padding: Mapping[str, Any] | None
) -> str | None:
    """The one line that says what truncation and padding a file had on (``None``: neither);
    ``padding`` as `tokenizers` reports it (``length``, ``pad_to_multiple_of``)."""
    if not truncation and not padding:
        return None
    said = []
    if truncation:
        said.append(f"truncates to {truncation['max_length']}")
    if padding:
        length = padding.get("length")
        multiple = padding.get("pad_to_multiple_of")
        if length:
            said.append(f"pads to {length}")
        elif multiple:
            said.append(f"pads to a multiple of {multiple}")
        else:
            said.append("pads to the longest in a batch")
    both = "both" if truncation and padding else "it"
    return f"tokenizer.json {' and '.join(said)}; packtool turned {both} off"


def resolve_special_tokens(
    file: TokenizerFile,
    config: Mapping[str, Any],
    *,
    overrides: Mapping[str, str | None],
    vocab_size: int,
    name: str,
) -> SpecialTokens:
    """EOS, BOS and PAD of a tokenizer (docs/tokenization.md, rule 3).

    In this order: ``overrides`` (``eos``/``bos``/``pad``: a token's text, or a number, which
    is always an id below ``vocab_size``; one not found is a ``LookupError`` naming the
    option); the token
    ``tokenizer_config.json`` names; for PAD, the pad id of the file's padding settings when
    it is a special token; a usual name (:data:`EOS_NAMES`...) that is an added token marked
    special. ``None`` where none of them gives one, and for an EOS or BOS that
    ``tokenizer_config.json`` names but the vocabulary lacks (listed in ``missing``).
    """
    special_ids = file.special_ids
    missing: list[tuple[str, str]] = []

    def resolve(kind: str, names: Sequence[str]) -> int | None:
        override = overrides.get(kind)
        if override is not None:
            # A number is an id (--eos-token 2: id 2, never the digit token "2" that most
            # vocabularies have); anything else is a token's text.
            if override.isascii() and override.isdigit():
                tid = int(override) if int(override) < vocab_size else None
            else:
                tid = file.token_to_id(override)
            if tid is None:
                raise LookupError(
                    f"tokenizer {name}: no token {override!r} in its vocabulary "
                    f"(given as --{kind}-token)"
                )
            return tid
        configured = config.get(f"{kind}_token")
        if isinstance(configured, Mapping):
            configured = configured.get("content")
        if isinstance(configured, str):
            tid = file.token_to_id(configured)
            if tid is not None:
                return tid
            if configured and kind != "pad":  # named, not there: no other token stands in
                missing.append((kind, configured))
                return None
        if kind == "pad" and file.padding_pad_id in special_ids:
            return file.padding_pad_id
        for candidate in names:
            tid = file.token_to_id(candidate)
            if tid is not None and tid in special_ids:
                return tid
        return None

    return SpecialTokens(
        eos_id=resolve("eos", EOS_NAMES),
        bos_id=resolve("bos", BOS_NAMES),
        pad_id=resolve("pad", PAD_NAMES),
        missing=tuple(missing),
    )
