"""Instruction data: prompt/completion and chat records, tokenized with exact loss labels.

Two record shapes besides plain text (``--input-shape``):

- ``prompt-completion``: ``{"prompt": "Add 2 and 3.", "completion": " 5"}`` (field names set by
  ``--prompt-field`` / ``--completion-field``). The completion is learned, and the EOS that
  closes it.
- ``chat``: ``{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", ...}]}``
  rendered with a chat template (:mod:`packtool.chat`). The assistant contents are learned, and
  the end-of-turn token that closes each.

A chat's ids are those of the whole conversation rendered once (what
``apply_chat_template(messages, tokenize=True)`` gives) and a token is learned when it overlaps
an assistant span of the rendering (:meth:`~packtool.chat.ChatTemplate.assistant_spans`; the
rule of transformers' ``return_assistant_tokens_mask``). A prompt/completion pair is cut into
pieces (prompt | completion | EOS), each tokenized on its own, so no token straddles the
boundary: what the model meets when generating, the prompt tokenized, then the answer produced
token by token after it. A completion ``"5"`` after the prompt ``"2+3="``, with the bundled
tokenizer (no BOS)::

    text       2     +     3     =   |  5 | <|endoftext|>
    ids       23    16    24    34   | 26 |  0
    labels  -100  -100  -100  -100   | 26 |  0         (the completion and the EOS closing it)

Labels are unshifted (``labels[i]`` is the token at ``i`` when it is learned, else -100), as
Hugging Face models take them.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .chat import (
    KNOWN_ROLES,
    ChatTemplate,
    PieceKind,
    RenderError,
    load_chat_template,
    render_budget,
)
from .errors import BadRecordError, FieldError, OptionError, TokenizerError
from .format import IGNORE_INDEX
from .options import PackOptions
from .packing import Overflow
from .pretokenized import IdsBatch, IdsEncoder, IdsFields, ids_reader
from .readers import (
    InputFile,
    RecordBatch,
    TextBatch,
    first_record_fields,
    ids_field,
    read_records,
    read_texts,
    reader_of,
)
from .readers.batches import describe_value
from .tokenize import (
    ANCHOR,
    AUTO,
    REFERENCE,
    DocumentEncoder,
    EncodedBatch,
    HFTokenizer,
    SpecialStringFinder,
    Tokenizer,
    check_special_tokens,
    special_string_finder,
)

__all__ = [
    "InputPlan",
    "InputShape",
    "InstructEncoder",
    "LossOn",
    "RecordFields",
    "check_chat",
    "check_prompt_completion",
    "detect_shape",
    "detected_from",
    "has_labels",
    "input_shape",
    "megatron_ids",
    "plan_input",
    "text_encoder",
]


class InputShape(str, enum.Enum):
    """The shape of the input records."""

    TEXT = "text"
    PROMPT_COMPLETION = "prompt-completion"
    CHAT = "chat"
    IDS = "ids"  # pre-tokenized: a list of token ids per record (packtool.pretokenized)
    AUTO = "auto"


class LossOn(str, enum.Enum):
    """Which tokens are learned."""

    COMPLETION = "completion"  # prompt/completion: the completion (+ EOS)
    ASSISTANT = "assistant"  # chat: assistant contents (+ end-of-turn)
    ALL = "all"  # every token of the example
    LABELS = "labels"  # pre-tokenized: the record's own labels (or loss mask)


def parse_shape(value: str | InputShape) -> InputShape:
    try:
        return InputShape(value)
    except ValueError:
        raise OptionError(
            f"--input-shape must be one of text, prompt-completion, chat, ids, auto; got {value!r}"
        ) from None


def resolve_loss_on(value: str | LossOn | None, shape: InputShape) -> LossOn | None:
    """``--loss-on`` checked against the input shape (``None``: the shape's default)."""
    wanted = LossOn.COMPLETION if shape is InputShape.PROMPT_COMPLETION else LossOn.ASSISTANT
    if value is None:
        return None if shape is InputShape.TEXT else wanted
    try:
        loss_on = LossOn(value)
    except ValueError:
        raise OptionError(
            f"--loss-on must be one of completion, assistant, all; got {value!r}"
        ) from None
    if shape is InputShape.TEXT:
        if loss_on is not LossOn.ALL:
            needs = "chat" if loss_on is LossOn.ASSISTANT else "prompt/completion"
            raise OptionError(
                f"--loss-on {loss_on.value} needs {needs} records, but the input shape is "
                "text (set --input-shape, or the field options)"
            )
        return loss_on  # text with a labels column: every token learned
    if loss_on not in (wanted, LossOn.ALL):
        raise OptionError(
            f"--loss-on {loss_on.value} does not apply to {shape.value} records: "
            f"use --loss-on {wanted.value} or all"
        )
    return loss_on


def detect_shape(
    fields: Sequence[str] | None,
    *,
    text_field: str = "text",
    prompt_field: str = "prompt",
    completion_field: str = "completion",
    messages_field: str = "messages",
) -> InputShape:
    """The shape of records with these fields: chat if ``messages_field`` is one, else
    prompt-completion if both of those fields are, else text.

    >>> detect_shape(["id", "messages"])
    <InputShape.CHAT: 'chat'>
    """
    names = set(fields or ())
    if messages_field in names:
        return InputShape.CHAT
    if prompt_field in names and completion_field in names:
        return InputShape.PROMPT_COMPLETION
    return InputShape.TEXT


def check_prompt_completion(
    prompt_field: str = "prompt", completion_field: str = "completion"
) -> Callable[[dict[str, Any], str], tuple[str, str]]:
    """The record check of prompt/completion data: ``(prompt, completion)``, both strings."""

    def check(record: dict[str, Any], location: str) -> tuple[str, str]:
        values = []
        fields = ((prompt_field, "--prompt-field"), (completion_field, "--completion-field"))
        for name, option in fields:
            if name not in record:
                found = ", ".join(repr(k) for k in list(record)[:20]) or "none"
                raise BadRecordError(
                    location,
                    f"no field {name!r} (fields found: {found})",
                    f"choose it with {option}",
                )
            value = record[name]
            if not isinstance(value, str):
                raise BadRecordError(
                    location, f"field {name!r} is {describe_value(value)}, not a string"
                )
            values.append(value)
        return values[0], values[1]

    return check


@dataclass
class Chat:
    """A checked chat record: its messages (every key the record gives, ``None`` values
    dropped, as ``apply_chat_template`` does) and the tool schemas passed to the template."""

    messages: list[dict[str, Any]]
    tools: list[Any] | None = None
    turn: int | None = None  # --chat-turns each: the example ends at this assistant message


def _as_chat(record: Any) -> Chat:
    return record if isinstance(record, Chat) else Chat(list(record))


def check_chat(
    messages_field: str = "messages",
    roles: Sequence[str] = KNOWN_ROLES,
    tools_field: str = "tools",
) -> Callable[[dict[str, Any], str], Chat]:
    """The record check of chat data: a list of messages, each with a ``role`` (one of
    ``roles``) and a ``content`` string (an assistant message with ``tool_calls`` may have
    none), and the record's ``tools_field`` (a list of tool schemas) when it has one. The
    other keys of a message (``reasoning_content``, ``tool_calls``, ``tool_call_id``,
    ``name``...) are kept: the template sees them."""
    known = set(roles)

    def check(record: dict[str, Any], location: str) -> Chat:
        if messages_field not in record:
            found = ", ".join(repr(k) for k in list(record)[:20]) or "none"
            raise BadRecordError(
                location,
                f"no field {messages_field!r} (fields found: {found})",
                "choose it with --messages-field",
            )
        messages = record[messages_field]
        if not isinstance(messages, list):
            raise BadRecordError(
                location,
                f"field {messages_field!r} is {describe_value(messages)}, not a list of messages",
            )
        out = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise BadRecordError(location, f"message {i} is {describe_value(m)}, not an object")
            m = {k: v for k, v in m.items() if v is not None}
            calls = m.get("tool_calls")
            if calls is not None and not isinstance(calls, list):
                raise BadRecordError(
                    location, f"message {i}: 'tool_calls' is {describe_value(calls)}, not a list"
                )
            keys = ("role",) if calls and m.get("role") == "assistant" else ("role", "content")
            for key in ("role", "content"):
                if key in keys and m.get(key) is None:
                    raise BadRecordError(location, f"message {i} has no {key!r}")
                if key in m and not isinstance(m[key], str):
                    raise BadRecordError(
                        location, f"message {i}: {key!r} is {describe_value(m[key])}, not a string"
                    )
            if m["role"] not in known:
                raise BadRecordError(
                    location,
                    f"message {i} has an unknown role {m['role']!r} "
                    f"(known: {', '.join(sorted(known))})",
                )
            for key in ("reasoning_content", "thinking"):
                if key in m and not isinstance(m[key], str):
                    raise BadRecordError(
                        location, f"message {i}: {key!r} is {describe_value(m[key])}, not a string"
                    )
            out.append(m)
        tools = record.get(tools_field)
        if tools is not None and not isinstance(tools, list):
            raise BadRecordError(
                location, f"field {tools_field!r} is {describe_value(tools)}, not a list of tools"
            )
        return Chat(out, tools)

    return check


def _special_ids(tokenizer: Tokenizer) -> frozenset[int]:
    """Ids of the tokenizer's special tokens (end-of-turn tokens are among them)."""
    ids = {t for t in (tokenizer.special.eos_id, tokenizer.special.bos_id) if t is not None}
    if tokenizer.special.pad_id is not None:
        ids.add(tokenizer.special.pad_id)
    ids.update(getattr(tokenizer, "special_ids", ()))  # a Hugging Face tokenizer's added ones
    return frozenset(ids)


def _affixes(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """The ids the post-processor adds before and after a text (e.g. Llama's BOS)."""
    if tokenizer.num_special_tokens_to_add() == 0:
        return [], []
    plain = list(tokenizer.encode_batch(["a"], add_special_tokens=False)[0])
    full = list(tokenizer.encode_batch(["a"], add_special_tokens=True)[0])
    for i in range(len(full) - len(plain) + 1):
        if full[i : i + len(plain)] == plain:
            return full[:i], full[i + len(plain) :]
    return [], []


_PROBE = ("Hello", " world", "x", "y z", "ok")  # plain letters: every vocabulary has them


class _Fixed(enum.Enum):
    """Pieces decided once the example is tokenized."""

    BOS_UNLESS_FIRST = "a BOS, unless the rendered example already starts with one"
    EOS_UNLESS_LAST = "an EOS, unless the rendered example already ends with one"


_Source = int | tuple[int, ...] | _Fixed
"""Where a piece's ids come from: the index of its text in the tokenizer's batch (``-i - 1``
when it was tokenized behind the anchor), fixed ids, or a :class:`_Fixed`."""


_Piece = str | tuple[int, ...] | _Fixed


class _Escaper:
    """Hides the special-token strings of a chat's data (message contents, reasoning, tool
    calls, tool schemas) from the chat template's output.

    Each is replaced by a placeholder of Unicode noncharacters before rendering; the rendered
    text gets them back with the spans they occupy, so the tokenizer stage knows which
    special-token strings of the rendered text are data.
    """

    _MARK = re.compile("\ufdd2(\\d+)\ufdd3")
    _RESERVED = re.compile("[\ufdd0-\ufdd3]")

    def __init__(self, finder: SpecialStringFinder) -> None:
        self.finder = finder
        self._index = {t: i for i, t in enumerate(finder.strings)}

    def _escape(self, value: Any, where: str) -> Any:
        if isinstance(value, str):
            if self._RESERVED.search(value):
                raise RenderError(
                    f"{where} holds U+FDD0..U+FDD3, Unicode noncharacters that packtool uses "
                    "internally"
                )
            pattern = self.finder.pattern
            assert pattern is not None
            return pattern.sub(lambda h: f"\ufdd2{self._index[h.group()]}\ufdd3", value)
        if isinstance(value, list):
            return [self._escape(v, where) for v in value]
        if isinstance(value, dict):
            return {k: v if k == "role" else self._escape(v, where) for k, v in value.items()}
        return value

    def escape(self, chat: Chat) -> Chat:
        messages = [self._escape(m, f"message {k}") for k, m in enumerate(chat.messages)]
        return dataclasses.replace(
            chat, messages=messages, tools=self._escape(chat.tools, "the tools")
        )

    def unescape(self, text: str) -> tuple[str, list[tuple[int, int]], Callable[[int], int]]:
        """The text with the data's special-token strings back, their spans, and the map from
        positions in ``text`` to positions in the result."""
        parts: list[str] = []
        spans: list[tuple[int, int]] = []
        marks: list[tuple[int, int, int]] = []  # (start in text, end in text, shift after)
        pos = length = 0
        for hit in self._MARK.finditer(text):
            parts.append(text[pos : hit.start()])
            length += hit.start() - pos
            token = self.finder.strings[int(hit.group(1))]
            parts.append(token)
            spans.append((length, length + len(token)))
            length += len(token)
            pos = hit.end()
            marks.append((hit.start(), hit.end(), length - hit.end()))
        if not spans:
            return text, [], lambda p: p
        parts.append(text[pos:])
        starts = [m[0] for m in marks]

        def convert(p: int) -> int:
            i = bisect.bisect_right(starts, p) - 1
            if i < 0:
                return p
            start, end, shift = marks[i]
            if p >= end:
                return p + shift
            return spans[i][0] if p == start else spans[i][1]

        return "".join(parts), spans, convert


@dataclass
class _Rendered:
    """One chat example: the rendered text, its learned character spans, and the spans of
    special-token strings that came from the data (text, not control tokens)."""

    text: str
    learn: list[tuple[int, int]]
    data: list[tuple[int, int]]


def _per_turn(batch: RecordBatch) -> None:
    """``--chat-turns each``: every chat of ``batch`` becomes one example per assistant turn
    (a chat without one stays one example, with nothing to learn), in place."""
    if batch.records_read is not None:
        return  # already cut
    records: list[Any] = []
    locations: list[str] = []
    for record, location in zip(batch.records, batch.locations, strict=True):
        chat = None if record is None else _as_chat(record)
        turns = [] if chat is None else [
            k for k, m in enumerate(chat.messages) if m.get("role") == "assistant"
        ]  # fmt: skip
        if chat is None or not turns:
            records.append(record)
            locations.append(location)
            continue
        for n, k in enumerate(turns, 1):
            records.append(dataclasses.replace(chat, turn=k))
            locations.append(f"{location} (assistant turn {n})")
    batch.records_read = len(batch.records)
    batch.records, batch.locations = records, locations


def _learned(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """Which tokens overlap a learned span: exactly the rule of transformers'
    ``return_assistant_tokens_mask`` (a token that straddles a span's edge is learned)."""
    out = np.zeros(len(offsets), bool)
    if not spans or not offsets:
        return out
    bounds = np.array(offsets, dtype=np.int64).reshape(-1, 2)
    starts = np.fromiter((a for a, _ in spans), np.int64, len(spans))
    ends = np.fromiter((b for _, b in spans), np.int64, len(spans))
    # the first span that ends after the token starts: learned if it starts before the token ends
    i = np.searchsorted(ends, bounds[:, 0], side="right")
    inside = i < len(spans)
    out[inside] = bounds[inside, 1] > starts[i[inside]]
    return out


def _runs(ids: Sequence[int], learned: np.ndarray) -> list[tuple[PieceKind, tuple[int, ...]]]:
    """``ids`` cut into runs of learned (LEARN) and not learned (CONTEXT) tokens."""
    if not len(ids):
        return []
    cuts = [0, *(np.flatnonzero(learned[1:] != learned[:-1]) + 1).tolist(), len(ids)]
    kinds = (PieceKind.CONTEXT, PieceKind.LEARN)
    return [(kinds[int(learned[a])], tuple(ids[a:b])) for a, b in itertools.pairwise(cuts)]


REASONING = re.compile(
    r"<think>.*?</think>\s*"  # Qwen3, DeepSeek R1, ...: what the model writes before it answers
    r"|<\|channel\|>analysis<\|message\|>.*?<\|end\|>(?:<\|start\|>assistant)?",  # gpt-oss
    re.DOTALL,
)
"""A reasoning block in an assistant turn (``--no-learn-reasoning`` makes it context)."""


def _without_reasoning(text: str, spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` minus the reasoning blocks that start inside them."""
    out: list[tuple[int, int]] = []
    for start, end in spans:
        pos = start
        for hit in REASONING.finditer(text, start, end):
            if hit.start() > pos:
                out.append((pos, hit.start()))
            pos = max(pos, hit.end())
        if end > pos:
            out.append((pos, end))
    return out


@dataclass
class _Tokenized:
    """What :meth:`InstructEncoder.tokenize` hands to :meth:`InstructEncoder.finish`."""

    plans: list[list[tuple[PieceKind, _Source]]]  # per good record
    ids: Sequence[Sequence[int]]  # the tokenizer's output, one list per text piece
    special_strings: int = 0  # records whose data held special-token strings


class InstructEncoder:
    """Turns prompt/completion or chat records into token ids and loss labels.

    Like :class:`~packtool.tokenize.DocumentEncoder`, in two steps a pipeline can overlap:
    :meth:`tokenize` (render, cut into pieces, run the tokenizer) and :meth:`finish` (flat ids,
    labels, lengths). :meth:`encode` does both.

    - ``add_eos``: EOS after each example (prompt/completion: learned with the completion;
      chat: context, the template's end-of-turn being what is learned).
    - ``bos``: ``None`` for prompt/completion lets the post-processor add its tokens (as for
      text); chats are rendered text, so the template decides and no post-processor token is
      added. ``True``: exactly one BOS first; ``False``: none added.
    - ``parse_special`` (default off): prompts, completions and message contents are data, so
      special-token strings in them are text; control tokens come only from the template's
      own text and from BOS/EOS. On, they become the control tokens they spell.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        shape: InputShape,
        loss_on: LossOn,
        template: ChatTemplate | None = None,
        add_eos: bool = True,
        bos: bool | None = None,
        parse_special: bool = False,
        chat_turns: str = "all",
        learn_reasoning: bool = True,
    ) -> None:
        if chat_turns not in ("all", "each"):
            raise OptionError(f"--chat-turns must be all or each; got {chat_turns!r}")
        if shape not in (InputShape.PROMPT_COMPLETION, InputShape.CHAT):
            raise ValueError(f"InstructEncoder encodes prompt-completion or chat, not {shape}")
        if shape is InputShape.CHAT and template is None:
            raise ValueError("chat records need a chat template")
        check_special_tokens(tokenizer, add_eos=add_eos, bos=bos)
        self.tokenizer = tokenizer
        self.shape = shape
        self.loss_on = loss_on
        self.template = template
        self.add_eos = add_eos
        self.bos = bos
        self.parse_special = parse_special
        self.chat_turns = chat_turns
        self.learn_reasoning = learn_reasoning
        self.finder = special_string_finder(tokenizer)
        self.special_ids = _special_ids(tokenizer)
        self.prefix: list[int] = []  # prompt/completion: before the prompt
        self.suffix: list[int] = []  # prompt/completion: after the completion (before EOS)
        if shape is InputShape.PROMPT_COMPLETION and bos is None:
            self.prefix, self.suffix = _affixes(tokenizer)
        elif bos:
            self.prefix = [tokenizer.special.bos_id]  # type: ignore[list-item]
        self.anchor, self.anchor_id = self._choose_anchor()

    @property
    def piece_encoding(self) -> str:
        """``plain``: pieces tokenized as they are; ``anchored``: each piece after the first is
        tokenized behind a special token that is then dropped, for tokenizers (Metaspace with
        ``prepend_scheme="first"``: Llama, Mistral) that would mark every text start as a word
        start."""
        return "plain" if self.anchor is None else "anchored"

    def _glued(self, pieces: Sequence[Sequence[int]]) -> bool:
        ids = [t for p in pieces for t in p]
        return self.tokenizer.decode(ids) == "".join(_PROBE)

    def _choose_anchor(self) -> tuple[str | None, int | None]:
        """:data:`~packtool.tokenize.ANCHOR` where pieces encoded alone would not glue back
        into the text (a Hugging Face tokenizer only; it knows the anchor)."""
        tok = self.tokenizer
        if self._glued(tok.encode_batch(list(_PROBE), add_special_tokens=False)):
            return None, None
        if not isinstance(tok, HFTokenizer):
            return None, None
        rest = tok.encode_batch([ANCHOR + p for p in _PROBE[1:]], add_special_tokens=False)
        if all(r and r[0] == tok.anchor_id for r in rest):
            first = tok.encode_batch([_PROBE[0]], add_special_tokens=False)[0]
            if self._glued([first, *(r[1:] for r in rest)]):
                return ANCHOR, tok.anchor_id
        return None, None  # no better way: tokenize the pieces as they are

    # -- step 1: pieces and the tokenizer -------------------------------------------------
    def _pieces(self, record: Any) -> list[tuple[PieceKind, _Piece]]:
        """The pieces of one prompt/completion record: text to tokenize, or fixed ids."""
        prompt, completion = record
        end = list(self.suffix)
        if self.add_eos and (not end or end[-1] != self.tokenizer.special.eos_id):
            end.append(self.tokenizer.special.eos_id)  # type: ignore[arg-type]
        return [
            (PieceKind.CONTEXT, tuple(self.prefix)),
            (PieceKind.CONTEXT, prompt),
            (PieceKind.LEARN, completion),
            (PieceKind.LEARN, tuple(end)),  # what closes the completion is learned
        ]

    def _rendered(self, record: Any) -> _Rendered:
        """One chat example: the conversation rendered once (up to its assistant turn, for
        ``--chat-turns each``), with the learned character spans."""
        assert self.template is not None
        chat = _as_chat(record)
        if not chat.messages:
            return _Rendered("", [], [])
        escaper = _Escaper(self.finder) if self.finder and not self.parse_special else None
        if escaper is not None:
            chat = escaper.escape(chat)
        messages = chat.messages if chat.turn is None else chat.messages[: chat.turn + 1]
        text, learn = self.template.assistant_spans(  # --chat-turns each: the last turn only
            messages, tools=chat.tools, control=self.finder.pattern, last_turn=chat.turn is not None
        )
        data: list[tuple[int, int]] = []
        if escaper is not None:
            text, data, convert = escaper.unescape(text)
            learn = [(convert(a), convert(b)) for a, b in learn]
        if not self.learn_reasoning:
            learn = _without_reasoning(text, learn)
        return _Rendered(text, learn, data)

    def _has_special_strings(self, record: Any) -> bool:
        if self.shape is InputShape.PROMPT_COMPLETION:
            return any(map(self.finder.contains, record))
        return any(self.finder.contains(m.get("content") or "") for m in _as_chat(record).messages)

    def tokenize(
        self, batch: RecordBatch | Sequence[Any], skip_bad_records: bool = False
    ) -> _Tokenized:
        """Render (chats) or cut (prompt/completion) every good record of ``batch`` and
        tokenize it (the slow part).

        A record the chat template fails on raises :class:`~packtool.errors.BadRecordError`
        naming it or, with ``skip_bad_records``, becomes ``None`` in ``batch.records`` with its
        error added to ``batch.bad``.
        """
        if not isinstance(batch, RecordBatch):
            records = list(batch)
            batch = RecordBatch(records, [f"record {i}" for i in range(len(records))])
        if self.shape is InputShape.CHAT:
            if self.chat_turns == "each":
                _per_turn(batch)
            return self._tokenize_chats(batch, skip_bad_records)
        texts: list[str] = []
        plans: list[list[tuple[PieceKind, _Source]]] = []
        special_strings = 0
        for record in batch.records:
            if record is None:
                continue
            if self.finder and self._has_special_strings(record):
                special_strings += 1
            plan: list[tuple[PieceKind, _Source]] = []
            first_text = True
            for kind, piece in self._pieces(record):
                if not isinstance(piece, str):
                    plan.append((kind, piece))
                    continue
                if not piece:
                    continue
                if self.anchor is not None and not first_text:
                    texts.append(self.anchor + piece)
                    plan.append((kind, -len(texts)))
                else:
                    texts.append(piece)
                    plan.append((kind, len(texts) - 1))
                first_text = False
            plans.append(plan)
        ids = (
            self.tokenizer.encode_batch(
                texts, add_special_tokens=False, parse_special=self.parse_special
            )
            if texts
            else []
        )
        return _Tokenized(plans, ids, special_strings)

    def _tokenize_chats(self, batch: RecordBatch, skip_bad_records: bool) -> _Tokenized:
        """Render every chat once, tokenize the renderings in one batch (those with data
        special-token strings on their own), and mark the learned tokens: a token is learned
        when its characters overlap a learned span (``return_assistant_tokens_mask``'s rule)."""
        examples: list[_Rendered] = []
        special_strings = 0
        for i, record in enumerate(batch.records):
            if record is None:
                continue
            try:
                with render_budget(self.template.timeout if self.template else None):
                    rendered = self._rendered(record)  # one budget for the record's renderings
            except RenderError as e:
                error = BadRecordError(batch.locations[i], str(e))
                if not skip_bad_records:
                    raise error.with_skip_hint() from None
                batch.records[i] = None
                batch.bad.append(error)
                continue
            if self.finder and self._has_special_strings(record):
                special_strings += 1
            examples.append(rendered)
        plain = [e for e in examples if not e.data]
        encoded = iter(self._encode_plain(plain) if plain else [])  # one batch: all threads
        plans: list[list[tuple[PieceKind, _Source]]] = []
        for example in examples:
            if example.data:
                ids, offsets = self._encode_rendered(example.text, example.data)
            else:
                ids, offsets = next(encoded)
            plan: list[tuple[PieceKind, _Source]] = []
            if self.bos:
                plan.append((PieceKind.CONTEXT, _Fixed.BOS_UNLESS_FIRST))
            plan.extend(_runs(ids, _learned(offsets, example.learn)))
            if self.add_eos:
                plan.append((PieceKind.CONTEXT, _Fixed.EOS_UNLESS_LAST))
            plans.append(plan)
        return _Tokenized(plans, [], special_strings)

    def _encode_plain(
        self, examples: list[_Rendered]
    ) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """Ids and character offsets of rendered chats, control-token strings parsed. A
        tokenizer without offsets (not a Hugging Face one) encodes each chat in pieces cut at
        the learned spans' edges, each token given its piece's span."""
        tok = self.tokenizer
        if isinstance(tok, HFTokenizer):
            return tok.encode_batch_with_offsets([e.text for e in examples], parse_special=True)
        out = []
        for e in examples:
            cuts = sorted({0, len(e.text), *(p for span in e.learn for p in span)})
            spans = [(a, b) for a, b in itertools.pairwise(cuts) if b > a]
            pieces = tok.encode_batch(
                [e.text[a:b] for a, b in spans], add_special_tokens=False, parse_special=True
            )
            ids = [t for piece in pieces for t in piece]
            offsets = [span for span, piece in zip(spans, pieces, strict=True) for _ in piece]
            out.append((ids, offsets))
        return out

    def _encode_rendered(
        self, text: str, data: Sequence[tuple[int, int]]
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and offsets of a rendered chat in which ``data`` (spans from the record's
        contents) are text: the text is cut at the control tokens the tokenizer finds outside
        those spans, exactly where it cuts when parsing special tokens, and each stretch
        between two of them that holds a span is encoded with special-token strings as text."""
        tok = self.tokenizer
        if not isinstance(tok, HFTokenizer):  # pragma: no cover - only HF tokenizers have specials
            raise TokenizerError(f"tokenizer {tok.name}: cannot encode special-token strings")
        ids, offsets = tok.encode_with_offsets(text, parse_special=True)

        def in_text(a: int, b: int) -> bool:
            return any(a < end and start < b for start, end in data)

        out: list[int] = []
        out_offsets: list[tuple[int, int]] = []
        run: list[int] = []  # ids since the last control token
        run_offsets: list[tuple[int, int]] = []
        run_start = 0  # where the text after the last control token starts

        def flush(run_end: int) -> None:
            if in_text(run_start, run_end):
                region = text[run_start:run_end]
                anchored = self.anchor is not None and run_start > 0
                prefix = self.anchor if anchored else ""
                got, got_offsets = tok.encode_with_offsets(prefix + region, parse_special=False)
                if anchored:
                    got, got_offsets = got[1:], got_offsets[1:]
                shift = run_start - len(prefix or "")
                out.extend(got)
                out_offsets.extend((a + shift, b + shift) for a, b in got_offsets)
            else:
                out.extend(run)
                out_offsets.extend(run_offsets)

        for tid, (a, b) in zip(ids, offsets, strict=True):
            if tok.is_special_id(tid) and not in_text(a, b):
                flush(a)
                out.append(tid)
                out_offsets.append((a, b))
                run, run_offsets, run_start = [], [], b
            else:
                run.append(tid)
                run_offsets.append((a, b))
        flush(len(text))
        return out, out_offsets

    # -- step 2: flat ids and labels ------------------------------------------------------
    def _piece_ids(self, source: int, tokenized: _Tokenized) -> list[int]:
        if source >= 0:
            return list(tokenized.ids[source])
        piece = list(tokenized.ids[-source - 1])
        if not piece or piece[0] != self.anchor_id:  # pragma: no cover - probed at start
            raise TokenizerError(
                f"tokenizer {self.tokenizer.name}: {self.anchor!r} did not stay one token in "
                "front of a piece"
            )
        return piece[1:]

    def finish(self, tokenized: _Tokenized) -> EncodedBatch:
        """Flat ids and labels of the good records, with their lengths."""
        special = self.special_ids
        bos, eos = self.tokenizer.special.bos_id, self.tokenizer.special.eos_id
        learn_all = self.loss_on is LossOn.ALL
        all_ids: list[list[int]] = []
        all_learn: list[list[bool]] = []
        for plan in tokenized.plans:
            pieces: list[tuple[PieceKind, list[int]]] = []
            bos_at = -1
            for kind, source in plan:
                if isinstance(source, tuple):
                    pieces.append((kind, list(source)))
                elif source is _Fixed.BOS_UNLESS_FIRST:
                    bos_at = len(pieces)
                    pieces.append((kind, []))
                elif source is _Fixed.EOS_UNLESS_LAST:
                    last = next((p[-1] for _k, p in reversed(pieces) if p), None)
                    pieces.append((kind, [] if last == eos else [eos]))  # type: ignore[list-item]
                else:
                    pieces.append((kind, self._piece_ids(source, tokenized)))  # type: ignore[arg-type]
            if bos_at >= 0:
                first = next((p[0] for _k, p in pieces if p), None)
                if first != bos:
                    pieces[bos_at] = (pieces[bos_at][0], [bos])  # type: ignore[list-item]
            ids: list[int] = []
            learn: list[bool] = []
            for kind, piece in pieces:
                n = len(piece)
                ids.extend(piece)
                if kind is PieceKind.LEARN or learn_all:
                    learn.extend([True] * n)
                elif kind is PieceKind.TURN_END:
                    k = next((j + 1 for j, t in enumerate(piece) if t in special), 0)
                    learn.extend([True] * k + [False] * (n - k))
                else:
                    learn.extend([False] * n)
            all_ids.append(ids)
            all_learn.append(learn)
        lengths = np.fromiter(map(len, all_ids), dtype=np.int64, count=len(all_ids))
        total = int(lengths.sum())
        flat = np.fromiter(itertools.chain.from_iterable(all_ids), dtype=np.int32, count=total)
        learned = np.fromiter(itertools.chain.from_iterable(all_learn), dtype=bool, count=total)
        labels = np.where(learned, flat, np.int32(IGNORE_INDEX)).astype(np.int32)
        return EncodedBatch(flat, lengths, lengths == 0, labels, tokenized.special_strings)

    def encode(self, records: Sequence[Any]) -> EncodedBatch:
        """Ids and labels of ``records`` (checked records: ``(prompt, completion)`` tuples or
        message lists), flat, one example after another."""
        return self.finish(self.tokenize(records))


class RecordFields(NamedTuple):
    """The fields records are read by (``--text-field``, ``--prompt-field``,
    ``--completion-field``, ``--messages-field``)."""

    text: str
    prompt: str
    completion: str
    messages: str

    @staticmethod
    def of(options: PackOptions) -> RecordFields:
        o = options
        return RecordFields(o.text_field, o.prompt_field, o.completion_field, o.messages_field)


@dataclass
class InputPlan:
    """How a run reads and encodes its inputs: the shape, and the reader and encoder for it.

    Built by :func:`plan_input`; the pipeline calls :meth:`read` per input, and :meth:`tokenize`
    then :meth:`finish` per batch.
    """

    shape: InputShape
    shape_auto: bool  # chosen by --input-shape auto
    loss_on: LossOn | None
    template: ChatTemplate | None
    encoder: DocumentEncoder | InstructEncoder | IdsEncoder
    add_eos: bool
    overflow: Overflow
    fields: RecordFields
    parse_special: bool = False
    read_ids: Callable[..., Iterator[IdsBatch]] | None = None  # pre-tokenized inputs
    ids_fields: IdsFields | None = None
    notice: str | None = None  # an option given that this input does not use, said once

    @property
    def labelled(self) -> bool:
        """Whether the output has a labels column (instruction data, or text with
        ``--loss-on all``)."""
        return self.loss_on is not None

    def read(
        self, inp: InputFile, *, skip_bad_records: bool, split: str | None, txt_unit: str
    ) -> Iterator[TextBatch | RecordBatch | IdsBatch]:
        if self.read_ids is not None:
            return self.read_ids(inp, skip_bad_records=skip_bad_records, split=split)
        if self.shape is InputShape.TEXT:
            return read_texts(
                inp,
                text_field=self.fields.text,
                skip_bad_records=skip_bad_records,
                split=split,
                txt_unit=txt_unit,
            )
        named = self.fields
        if self.shape is InputShape.CHAT:
            fields, check = [named.messages], check_chat(named.messages)
        else:
            fields = [named.prompt, named.completion]
            check = check_prompt_completion(named.prompt, named.completion)  # type: ignore[assignment]
        return read_records(
            inp, fields=fields, check=check, skip_bad_records=skip_bad_records, split=split
        )

    def tokenize(self, batch: TextBatch | RecordBatch | IdsBatch, skip_bad_records: bool) -> Any:
        """Run the tokenizer on a batch (rendering chats first); ``encoder.finish`` follows."""
        if isinstance(batch, IdsBatch):
            return batch  # already ids, checked as they were read
        if isinstance(self.encoder, InstructEncoder):
            return self.encoder.tokenize(batch, skip_bad_records)  # type: ignore[arg-type]
        return self.encoder.tokenize([t for t in batch.records if t is not None])

    def finish(self, tokenized: Any) -> EncodedBatch:
        """Flat ids (and labels) of a tokenized batch."""
        encoded = self.encoder.finish(tokenized)
        if self.labelled and encoded.labels is None:  # text, --loss-on all
            encoded = dataclasses.replace(encoded, labels=encoded.ids.copy())
        return encoded

    def describe(self) -> dict[str, Any]:
        """The manifest's options about the input shape and the labels."""
        ids = self.ids_fields
        return {
            "ids_field": ids.ids if ids else None,
            "labels_field": ids.labels if ids else None,
            "loss_mask_field": ids.loss_mask if ids else None,
            "split_on_eos": ids.split_on_eos if ids else None,
            "vocab_size": ids.vocab_size if ids else None,
            "input_shape": self.shape.value,
            "input_shape_auto": self.shape_auto,
            "prompt_field": self.fields.prompt,
            "completion_field": self.fields.completion,
            "messages_field": self.fields.messages,
            "loss_on": self.loss_on.value if self.loss_on is not None else None,
            "chat_template": self.template.describe() if self.template is not None else None,
            "parse_special": self.parse_special,
            "chat_turns": getattr(self.encoder, "chat_turns", "all"),
            "learn_reasoning": getattr(self.encoder, "learn_reasoning", True),
        }


def has_labels(options: PackOptions) -> bool:
    """Whether a run with ``options`` writes a labels column (its input shape given, not
    ``auto``): instruction data, ``--loss-on all``, or ids with labels or a loss mask."""
    o = options
    if o.ids_field is not None:
        return bool(o.labels_field or o.loss_mask_field) or o.loss_on is not None
    shape = parse_shape(o.input_shape)
    if shape is InputShape.AUTO:
        raise ValueError("has_labels needs the input shape decided (input_shape() first)")
    return resolve_loss_on(o.loss_on, shape) is not None


def megatron_ids(files: Sequence[InputFile], options: PackOptions) -> PackOptions:
    """Megatron inputs are ids: ``options`` with an ids field named (``tokens``, a name to
    show) when every input is a Megatron indexed dataset and none is given."""
    names = [ids_field(f) for f in files]  # a format of ids only names them (Megatron: tokens)
    if options.ids_field is None and names and None not in names:
        return options.replace(ids_field=names[0])
    return options


def input_shape(files: Sequence[InputFile], options: PackOptions) -> tuple[InputShape, bool]:
    """The input shape of a run, and whether ``auto`` chose it (from the fields of the first
    record of the first input)."""
    o = options
    shape = parse_shape(o.input_shape)
    if shape is not InputShape.AUTO:
        return shape, False
    fields = first_record_fields(files[0], split=o.split) if files else None
    _check_named_fields(files, fields, o)
    return (
        detect_shape(
            fields,
            text_field=o.text_field,
            prompt_field=o.prompt_field,
            completion_field=o.completion_field,
            messages_field=o.messages_field,
        ),
        True,
    )


def _check_named_fields(
    files: Sequence[InputFile], fields: Sequence[str] | None, o: PackOptions
) -> None:
    """A field option given by name (not its default) that the first record does not have is
    the error, not the shape that detection would then choose from the other fields."""
    if not fields:
        return
    named = [
        (flag, name)
        for flag, name, default in (
            ("--messages-field", o.messages_field, "messages"),
            ("--prompt-field", o.prompt_field, "prompt"),
            ("--completion-field", o.completion_field, "completion"),
            ("--text-field", o.text_field, "text"),
        )
        if name != default and name not in fields
    ]
    if named:
        flag, name = named[0]
        found = ", ".join(repr(f) for f in list(fields)[:20])
        raise FieldError(
            f"{files[0].path}: the first record has no field {name!r} ({flag}); its fields "
            f"are {found}"
        )


def _check_ids_fields(files: Sequence[InputFile], o: PackOptions) -> None:
    """``--ids-field`` (and the labels or mask field) that the first record of the first input
    does not have is a mistyped name: the error, not every record skipped as bad. (Tables,
    Parquet and CSV already say so: their columns are known before any record is read.)"""
    first = next((f for f in files if ids_field(f) is None), None)
    if first is None or reader_of(first).schema_first:
        return
    fields = first_record_fields(first, split=o.split) if first is not None else None
    if not fields:
        return
    for flag, name in (
        ("--ids-field", o.ids_field),
        ("--labels-field", o.labels_field),
        ("--loss-mask-field", o.loss_mask_field),
    ):
        if name is not None and name not in fields:
            found = ", ".join(repr(f) for f in list(fields)[:20])
            raise FieldError(
                f"{first.path}: the first record has no field {name!r} ({flag}); its fields "
                f"are {found}"
            )


def _check_every(files: Sequence[InputFile], sample: int) -> int:
    """Characters between two documents checked against `tokenizers` (``--check-sample N``:
    about N documents spread over the inputs; 0: none)."""
    if not sample:
        return 0
    return max(1, sum(f.size_bytes for f in files) // sample)


def text_encoder(
    tokenizer: Tokenizer, options: PackOptions, add_eos: bool, check_every: int = 0
) -> DocumentEncoder:
    """The encoder of text documents ``options`` ask for (BOS, special-token strings, the
    tokenizer backend), with EOS as decided (``add_eos``) and a document checked against
    `tokenizers` every ``check_every`` characters (0: none)."""
    o = options
    # The backend asked for, unless the prepare stage chose another for this corpus (auto's
    # small-corpus rule: the tokenizer then says why).
    chosen = getattr(tokenizer, "backend_reason", None) is not None
    return DocumentEncoder(
        tokenizer,
        add_eos=add_eos,
        bos=o.bos,
        parse_special=o.parse_special,
        backend=getattr(tokenizer, "backend_choice", None) if chosen else o.tokenizer_backend,
        check_every=check_every,
    )


def detected_from(files: Sequence[InputFile], auto: bool) -> str:
    """Which input decided the shape, for the messages that name it (a directory of several
    kinds of records is detected by its first file); "" where the shape was given."""
    return f" (detected from the first record of {files[0].path})" if auto and files else ""


def plan_input(
    files: Sequence[InputFile],
    tokenizer: Tokenizer,
    options: PackOptions,
    *,
    shape: tuple[InputShape, bool] | None = None,
) -> InputPlan:
    """Decide the input shape (``auto``: from the fields of the first record of the first
    input), check the options against it, and build the encoder.

    Defaults that depend on the shape: ``loss_on`` (completion / assistant), ``overflow``
    (split for text, drop for instruction data, which splitting would cut into fragments) and
    ``add_eos`` (on, except for chats: the template closes every turn). ``parse_special``: see
    :class:`~packtool.tokenize.DocumentEncoder`. ``shape``: the shape and whether ``auto``
    chose it, when already decided (:func:`packtool.prepare.prepare`).
    """
    o = options
    if o.ids_field is not None:
        if o.check_sample:
            raise OptionError(
                "--check-sample compares the fast tokenizer backend with Hugging Face "
                "tokenizers, but pre-tokenized inputs (--ids-field) are not tokenized: drop it"
            )
        _check_ids_fields(files, o)
        return _plan_ids(tokenizer, o)
    shape, shape_auto = input_shape(files, o) if shape is None else shape
    resolved_loss = resolve_loss_on(o.loss_on, shape)
    if o.overflow is None:
        overflow = Overflow.SPLIT if shape is InputShape.TEXT else Overflow.DROP
    else:
        overflow = Overflow(o.overflow)  # checked by PackOptions
    add_eos = shape is not InputShape.CHAT if o.add_eos is None else o.add_eos
    template: ChatTemplate | None = None
    detected = detected_from(files, shape_auto)
    if shape is InputShape.CHAT:
        if isinstance(o.chat_template, ChatTemplate):
            template = o.chat_template
        else:
            template = load_chat_template(
                o.chat_template, tokenizer, records=f"chat records{detected}"
            )
        if template.timeout != o.template_timeout:
            template = dataclasses.replace(template, timeout=o.template_timeout)
    elif o.chat_template is not None:
        if not isinstance(o.chat_template, ChatTemplate):
            load_chat_template(o.chat_template, tokenizer)  # a missing file says so first
        raise OptionError(
            f"--chat-template is for chat records, but the input shape is {shape.value}" + detected
        )
    encoder: DocumentEncoder | InstructEncoder
    if shape is InputShape.TEXT:
        encoder = text_encoder(tokenizer, o, add_eos, _check_every(files, o.check_sample))
    else:
        assert resolved_loss is not None
        if o.tokenizer_backend not in (AUTO, REFERENCE):
            raise OptionError(
                f"--tokenizer-backend {o.tokenizer_backend} encodes text documents; instruction "
                "data is encoded piece by piece with Hugging Face tokenizers: use auto or hf"
            )
        if o.check_sample:
            raise OptionError(
                "--check-sample compares the fast tokenizer backend with Hugging Face "
                "tokenizers on text documents; instruction data is encoded with Hugging Face "
                "tokenizers only, so there is nothing to compare: drop it"
            )
        encoder = InstructEncoder(
            tokenizer,
            shape=shape,
            loss_on=resolved_loss,
            template=template,
            add_eos=add_eos,
            bos=o.bos,
            parse_special=o.parse_special,
            chat_turns=o.chat_turns,
            learn_reasoning=o.learn_reasoning,
        )
    notice = None
    if shape is InputShape.CHAT and not add_eos and o.eos_token is not None:
        notice = (
            f"--eos-token {o.eos_token} names the EOS, but chats get none (the template closes "
            "every turn): add --eos to append it to every conversation"
        )
    return InputPlan(
        notice=notice,
        shape=shape,
        shape_auto=shape_auto,
        loss_on=resolved_loss,
        template=template,
        encoder=encoder,
        add_eos=add_eos,
        overflow=overflow,
        fields=RecordFields.of(o),
        parse_special=o.parse_special,
    )


def _plan_ids(tokenizer: Tokenizer, o: PackOptions) -> InputPlan:
    """The plan of pre-tokenized records (``--ids-field``): no tokenizer runs; EOS and BOS are
    added only when asked (``--eos``, ``--bos``)."""
    assert o.ids_field is not None
    fields = IdsFields(o.ids_field, o.labels_field, o.loss_mask_field, o.split_on_eos, o.vocab_size)
    loss_on: LossOn | None
    if fields.labels is not None or fields.loss_mask is not None:
        if o.loss_on is not None:
            given = "--labels-field" if fields.labels else "--loss-mask-field"
            raise OptionError(f"--loss-on does not apply: the labels come from {given}")
        loss_on = LossOn.LABELS
    else:
        loss_on = resolve_loss_on(o.loss_on, InputShape.TEXT)
    add_eos = bool(o.add_eos)
    check_special_tokens(tokenizer, add_eos=add_eos, bos=o.bos)
    vocab = o.vocab_size if o.vocab_size is not None else getattr(tokenizer, "vocab_size", None)
    special = tokenizer.special
    encoder = IdsEncoder(eos_id=special.eos_id, bos_id=special.bos_id, add_eos=add_eos, bos=o.bos)
    return InputPlan(
        shape=InputShape.IDS,
        shape_auto=o.input_shape == "auto",
        loss_on=loss_on,
        template=None,
        encoder=encoder,
        add_eos=add_eos,
        overflow=Overflow(o.overflow) if o.overflow is not None else Overflow.SPLIT,
        fields=RecordFields.of(o),
        read_ids=ids_reader(fields, vocab_size=vocab, split_on_eos=o.split_on_eos),
        ids_fields=fields,
    )
