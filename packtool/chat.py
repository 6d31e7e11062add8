"""Chat templates: load one, render it in a sandbox, and find the assistant turns in it.

A chat template is a Jinja template (the Hugging Face convention: it sees ``messages``,
``tools``, ``add_generation_prompt``, ``bos_token``, ``eos_token``, ``pad_token`` and can call
``raise_exception`` and ``strftime_now``). packtool renders it in jinja2's
``ImmutableSandboxedEnvironment``: a template cannot reach Python internals (``__class__``,
``__globals__``...), run code, change its arguments, or include files; trying to is a
:class:`~packtool.errors.ChatTemplateError`.

A conversation is rendered once; what the assistant generates in it is a list of character
spans of that text (:meth:`ChatTemplate.assistant_spans`)::

    messages  [system "Be brief.", user "Hi", assistant "Hello!"]

    rendered  <|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n
              <|im_start|>assistant\nHello!<|im_end|>\n
    learned                          "Hello!<|im_end|>"

- where the template has ``{% generation %}...{% endgeneration %}`` blocks (the transformers
  and TRL convention), the text of those blocks;
- else each assistant message is located by rendering the conversation again with its text
  replaced by sentinels (Unicode noncharacters no message holds): the two renderings differ
  exactly where its text is, whatever the template does to the other turns (it need not be
  prefix-consistent). The span starts after the header the generation prompt adds
  (``<|im_start|>assistant\n``) and ends with the control token that closes the turn: the last
  one of the turn's ending as the template writes it when the conversation ends there, else
  the first one after the text.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import functools
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ._stop import check_stop
from .errors import ChatTemplateError
from .fs import as_path

__all__ = [
    "DEFAULT_TEMPLATE_TIMEOUT",
    "KNOWN_ROLES",
    "ChatTemplate",
    "PieceKind",
    "RenderError",
    "load_chat_template",
    "render_budget",
]

KNOWN_ROLES = ("system", "user", "assistant", "tool")
"""Roles a message may have; any other is a bad record."""


class PieceKind(enum.IntEnum):
    """What a piece of a rendered example is, for the loss."""

    CONTEXT = 0  # never learned (under --loss-on all, everything is)
    LEARN = 1  # an assistant content or a completion: every token learned
    TURN_END = 2  # closes an assistant turn: learned up to and including its first special token


class RenderError(Exception):
    """Rendering one record failed (the template raised, or the record does not fit it)."""


class _TemplateRaised(Exception):
    pass


def _raise_exception(message: Any) -> None:
    raise _TemplateRaised(str(message))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    wide = len(indent) if isinstance(indent, str) else indent
    if isinstance(wide, (int, float)) and wide > _MAX_INDENT:
        _refuse(f"tojson with an indent of {wide:,} (at most {_MAX_INDENT})")
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


TEMPLATE_DATE = (2025, 1, 1)
"""The date ``strftime_now`` gives templates (gpt-oss, Llama 3.x write "today's date" into
the system turn): a fixed one, so that a pack is the same whatever the day it runs."""


def _strftime_now(format: str) -> str:
    import datetime

    return datetime.datetime(*TEMPLATE_DATE, tzinfo=datetime.timezone.utc).strftime(str(format))


DEFAULT_TEMPLATE_TIMEOUT = 10.0
"""Seconds a chat template may spend on one record (``--template-timeout``)."""

_MAX_REPEAT = 10_000_000  # longest string or list a template may make in one operation
_MAX_POWER_BITS = 1 << 16  # largest integer (in bits) a template may make with ``**``
_MAX_INDENT = 256  # tojson's widest indent
_MAX_LIPSUM_WORDS = 100_000  # lipsum(n, min, max): n * max
_MAX_OUTPUT_FLOOR = 1 << 22  # characters a rendering may make beyond 4x its messages' text
_WIDE_FORMAT = re.compile(r"(%[^a-zA-Z%]*|\{[^{}]*:[^{}]*)\d{8}")  # a width of 10^7 or more


def _refuse(what: str) -> None:
    from jinja2.sandbox import SecurityError

    raise SecurityError(f"{what} is too large")


def _check_made(value: Any, what: str) -> Any:
    """``value``, if it is not a string or container longer than :data:`_MAX_REPEAT`."""
    if isinstance(value, (str, list, tuple, dict)) and len(value) > _MAX_REPEAT:
        _refuse(f"{what} making a {type(value).__name__} of {len(value):,} items")
    return value


def _check_arguments(what: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Refuse a number above :data:`_MAX_REPEAT` given to a function or filter (a width, a
    count: what makes a string of that size in one step of C that no budget could stop)."""
    for value in (*args, *kwargs.values()):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number and abs(value) > _MAX_REPEAT:
            _refuse(f"{what} given {value:,}")


def _check_string_call(obj: Any, args: Sequence[Any]) -> None:
    """Bound the string methods whose result can be far longer than their arguments."""
    obj = getattr(obj, "__wrapped__", obj)  # the sandbox's wrapper of str.format
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if not isinstance(owner, str):
        return
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str):
        new = args[1] if isinstance(args[1], str) else ""
        count = owner.count(args[0]) if args[0] else len(owner) + 1
        if len(owner) + count * max(0, len(new) - len(args[0])) > _MAX_REPEAT:
            _refuse(f"replacing {count:,} times in a string of {len(owner):,} characters")
    elif name == "join" and args and isinstance(args[0], (list, tuple)):
        if len(owner) * len(args[0]) > _MAX_REPEAT:
            _refuse(f"joining {len(args[0]):,} items with {len(owner):,} characters")
    elif name in ("format", "format_map") and _WIDE_FORMAT.search(owner):
        _refuse("a format width of 10,000,000 or more")


def _check_filter_size(
    name: str, value: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    """Bound, before they run, the filters whose result can be far longer than their
    arguments: ``replace``, ``join``, ``indent`` and ``sum``."""
    if name == "replace" and isinstance(value, str) and len(args) >= 2:
        old, new = str(args[0]), str(args[1])
        count = value.count(old) if old else len(value) + 1
        if len(value) + count * max(0, len(new) - len(old)) > _MAX_REPEAT:
            _refuse(f"replacing {count:,} times in a string of {len(value):,} characters")
    elif name == "join" and isinstance(value, (list, tuple)):
        sep = args[0] if args else kwargs.get("d", "")
        if isinstance(sep, str) and len(sep) * len(value) > _MAX_REPEAT:
            _refuse(f"joining {len(value):,} items with {len(sep):,} characters")
    elif name == "indent" and isinstance(value, str):
        width = args[0] if args else kwargs.get("width", 4)
        wide = len(width) if isinstance(width, str) else width
        if isinstance(wide, int) and wide * (value.count("\n") + 1) > _MAX_REPEAT:
            _refuse(f"indenting {value.count(chr(10)) + 1:,} lines by {wide:,}")
    elif name == "sum" and isinstance(value, (list, tuple)):
        total = sum(len(v) for v in value if isinstance(v, _SIZED))
        if total > _MAX_REPEAT:
            _refuse(f"summing {len(value):,} strings or lists")


def _joined(items: Sequence[Any]) -> str:
    """What ``a ~ b ~ c`` makes, bounded."""
    parts = [str(x) for x in items]
    if sum(map(len, parts)) > _MAX_REPEAT:
        _refuse(f"joining with ~ {sum(map(len, parts)):,} characters")
    return "".join(parts)


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> Any:
    from jinja2.utils import generate_lorem_ipsum

    if not all(isinstance(v, int) for v in (n, min, max)) or n * max > _MAX_LIPSUM_WORDS:
        _refuse(f"lipsum of {n!r} paragraphs of up to {max!r} words")
    return generate_lorem_ipsum(n=n, html=html, min=min, max=max)


_lipsum.__name__ = "lipsum"  # as errors name it


def _bounded_filter(name: str, function: Any) -> Any:
    """A filter checked like a call of the sandbox: budget, arguments, size of the result."""

    skip = 2 if hasattr(function, "jinja_pass_arg") else 1  # the context, then the value

    @functools.wraps(function)  # keeps jinja's pass_context & co
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _check_budget()
        _check_arguments(f"the filter {name}", args[skip:], kwargs)
        value = args[skip - 1] if len(args) >= skip else None
        if name == "format" and isinstance(value, str) and _WIDE_FORMAT.search(value):
            _refuse("a format width of 10,000,000 or more")
        _check_filter_size(name, value, args[skip:], kwargs)
        return _check_made(function(*args, **kwargs), f"the filter {name}")

    return bounded


_TRACKING: contextvars.ContextVar[tuple[list[int], list[tuple[int, int]]] | None] = (
    contextvars.ContextVar("packtool_generation", default=None)
)  # while rendering with tracked {% generation %} blocks: (output length so far, their spans)

_budget = threading.local()  # .deadline, .seconds: the budget of this thread's record


class _OverBudget(Exception):
    pass


@contextlib.contextmanager
def render_budget(seconds: float | None) -> Iterator[None]:
    """Every rendering in this thread inside the block shares one deadline, ``seconds`` from
    now (the renderings of one record: the conversation and its prefixes). A template still
    running at the deadline stops with a :class:`RenderError`. ``None``: no deadline."""
    if seconds is None or getattr(_budget, "deadline", None) is not None:
        yield
        return
    _budget.deadline, _budget.seconds = time.monotonic() + seconds, seconds
    try:
        yield
    finally:
        _budget.deadline = None


def _check_budget() -> None:
    """Called by the sandbox at every call, loop step and ``*``/``**``: stop a template that
    is past its deadline, or that runs while the whole run is being stopped (SIGTERM)."""
    check_stop()
    deadline = getattr(_budget, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise _OverBudget(_budget.seconds)


def _budgeted(iterable: Iterable[Any]) -> Iterator[Any]:
    """What every ``{% for %}`` of a template iterates: ``iterable``, checking the budget."""
    for i, item in enumerate(iterable):
        if not i & 255:
            _check_budget()
        yield item


_SIZED = (str, list, tuple)


class _TooMuchText(Exception):
    pass


def _text_size(messages: Sequence[Mapping[str, Any]]) -> int:
    """About the characters of ``messages`` (their string values; others by their repr)."""
    size = 0
    for m in messages:
        for value in m.values() if isinstance(m, Mapping) else (m,):
            size += len(value) if isinstance(value, str) else len(repr(value))
    return size


def _bounded_output(parts: Iterable[Any], given: Sequence[Any], length: list[int]) -> str:
    """The rendered text from its parts, stopped once longer than the output bound: at most
    :data:`_MAX_OUTPUT_FLOOR` characters beyond 4 times the text of what the template was
    given (the messages and tools; counted only past the floor: the usual rendering never
    needs to). ``length[0]``: the characters so far, kept up to date for the tracking of
    ``{% generation %}`` blocks."""
    limit = _MAX_OUTPUT_FLOOR
    out: list[str] = []
    for part in parts:
        total = length[0] = length[0] + len(part)
        if total > limit:
            if limit == _MAX_OUTPUT_FLOOR:
                limit += 4 * _text_size(given)
            if total > limit:
                raise _TooMuchText(limit)
        out.append(part)
    return "".join(out)


def _check_product(operator: str, left: Any, right: Any) -> None:
    """Refuse, before it is computed, a ``**`` giving too large a number or a ``*`` repeating
    a string or list into too many items (one such operation in C could not be stopped)."""
    from jinja2.sandbox import SecurityError

    ints = isinstance(left, int) and isinstance(right, int)
    if operator == "**" and ints and right > 0 and abs(left) > 1:
        if right * abs(left).bit_length() > _MAX_POWER_BITS:
            raise SecurityError(f"{left} ** {right} is too large a number")
    elif operator == "*" and not ints:
        seq, n = (left, right) if isinstance(right, int) else (right, left)
        sized = isinstance(seq, (str, list, tuple)) and isinstance(n, int)
        if sized and len(seq) * n > _MAX_REPEAT:
            raise SecurityError(
                f"repeating a {type(seq).__name__} of {len(seq):,} items {n:,} times is too large"
            )


def _generation_extension() -> Any:
    """The jinja extension of ``{% generation %}`` (a class made when jinja is loaded)."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class _Generation(Extension):
        """``{% generation %}...{% endgeneration %}`` (the Hugging Face and TRL marker of the
        text the assistant generates): rendered as its body; while :meth:`ChatTemplate.render`
        tracks them, the character span of each body in the output is recorded."""

        tags = {"generation"}  # noqa: RUF012 - jinja's API

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            text = str(caller())
            tracking = _TRACKING.get()
            if tracking is not None:  # the output so far has been yielded: its length is known
                length, spans = tracking
                spans.append((length[0], length[0] + len(text)))
            return text

    return _Generation


def _environment() -> Any:
    from jinja2 import DictLoader, nodes
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.visitor import NodeTransformer

    class _BudgetedEnvironment(ImmutableSandboxedEnvironment):
        """The sandbox, checking the render budget (:func:`render_budget`) at every call, at
        every step of every loop, and before ``*`` and ``**``, which it also bounds (one such
        operation in C could not be stopped)."""

        intercepted_binops = frozenset({"*", "**", "+", "%"})
        budgeted = staticmethod(_budgeted)  # attributes of the environment: no template
        joined = staticmethod(_joined)  # variable can shadow them

        def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
            _check_budget()
            what = f"calling {getattr(obj, '__name__', type(obj).__name__)}"
            _check_arguments(what, args, kwargs)
            _check_string_call(obj, args)
            return _check_made(super().call(context, obj, *args, **kwargs), what)

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "+":  # the common case, kept cheap: checked after the step, which
                made = left + right  # its operands bound (each at most a step's or a record's)
                if isinstance(made, _SIZED) and len(made) > _MAX_REPEAT:
                    _refuse(f"adding {len(left):,} and {len(right):,} items")
                return made
            _check_budget()
            if operator == "%":
                if isinstance(left, str) and _WIDE_FORMAT.search(left):
                    _refuse("a format width of 10,000,000 or more")
                return _check_made(super().call_binop(context, operator, left, right), "%")
            _check_product(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def compile(
            self,
            source: Any,
            name: str | None = None,
            filename: str | None = None,
            raw: bool = False,
            defer_init: bool = False,
        ) -> Any:
            if isinstance(source, str):  # every {% for %} iterates through _budgeted,
                source = self.parse(source, name, filename)  # every ~ is made by _joined
                for loop in source.find_all(nodes.For):
                    budgeted = nodes.EnvironmentAttribute("budgeted", lineno=loop.lineno)
                    loop.iter = nodes.Call(
                        budgeted, [loop.iter], [], None, None, lineno=loop.lineno
                    )
                source = _BoundedConcat().visit(source)
                source.set_environment(self)
            return super().compile(source, name, filename, raw, defer_init)

    class _BoundedConcat(NodeTransformer):
        def visit_Concat(self, node: Any) -> Any:
            self.generic_visit(node)
            joined = nodes.EnvironmentAttribute("joined", lineno=node.lineno)
            items = nodes.List(node.nodes, lineno=node.lineno)
            return nodes.Call(joined, [items], [], None, None, lineno=node.lineno)

    env = _BudgetedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[loopcontrols, _generation_extension()],
        loader=DictLoader({}),  # no files: {% include %} and {% import %} find nothing
    )
    env.filters["tojson"] = _tojson
    for name, function in list(env.filters.items()):
        env.filters[name] = _bounded_filter(name, function)
    env.globals["raise_exception"] = _raise_exception
    env.globals["lipsum"] = _lipsum
    env.globals["strftime_now"] = _strftime_now
    return env


@dataclass
class ChatTemplate:
    """A compiled chat template and where it came from.

    >>> t = ChatTemplate.from_string("{% for m in messages %}[{{ m.role }}] {{ m.content }}\\n"
    ...                              "{% endfor %}", name="tiny")
    >>> t.render([{"role": "user", "content": "Hi"}])
    '[user] Hi\\n'
    """

    text: str
    name: str
    source: str  # "file", "tokenizer_config.json", "chat_template.jinja" or "string"
    variables: Mapping[str, str] = field(default_factory=dict)
    _compiled: Any = field(default=None, repr=False)
    timeout: float | None = DEFAULT_TEMPLATE_TIMEOUT  # seconds per record (render_budget)

    @classmethod
    def from_string(
        cls,
        text: str,
        *,
        name: str = "<string>",
        source: str = "string",
        variables: Mapping[str, str] | None = None,
    ) -> ChatTemplate:
        """Compile ``text``; a syntax error is a :class:`ChatTemplateError` naming the line."""
        from jinja2 import TemplateSyntaxError

        try:
            compiled = _environment().from_string(text)
        except TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"{name}:{e.lineno}: chat template syntax error: {e.message}"
            ) from None
        return cls(text, name, source, dict(variables or {}), compiled)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its text (work units in other processes and on other nodes): the
        compiled template, bound to a sandbox, is compiled again where it is loaded."""
        return (_restore_template, (self.text, self.name, self.source, dict(self.variables),
                                    self.timeout))  # fmt: skip

    def describe(self) -> dict[str, str]:
        """The manifest's record of the template."""
        return {"name": self.name, "source": self.source, "sha256": self.sha256}

    @property
    def has_generation(self) -> bool:
        """Whether the template marks the assistant's text with ``{% generation %}``."""
        return _GENERATION.search(self.text) is not None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = False,
        *,
        tools: Sequence[Any] | None = None,
        track: list[tuple[int, int]] | None = None,
    ) -> str:
        """The text of ``messages`` (``tools``: the tool schemas the template is given, as
        ``tools=`` of ``apply_chat_template``). ``track``: a list that gets the character span
        of every ``{% generation %}`` block of the output.

        Raises :class:`RenderError` when the template fails on these messages (a record
        problem) or runs past :attr:`timeout` (shared by the renderings of one record inside
        :func:`render_budget`), :class:`ChatTemplateError` when it breaks the sandbox (a
        template problem).
        """
        from jinja2.exceptions import SecurityError, TemplateNotFound, TemplatesNotFound

        arguments = {
            **self.variables,
            "messages": list(messages),
            "tools": None if tools is None else list(tools),
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            with render_budget(self.timeout):
                compiled = self._compiled  # what Template.render does, the text bounded
                context = compiled.new_context(arguments)
                length = [0]  # the output so far: where a tracked generation block starts
                reset = None if track is None else _TRACKING.set((length, track))
                try:
                    parts = compiled.root_render_func(context)
                    return _bounded_output(parts, [*messages, *(tools or ())], length)
                except (_TooMuchText, _OverBudget):
                    raise
                except Exception:
                    compiled.environment.handle_exception()
                    raise  # not reached: handle_exception raises the template's error
                finally:
                    if reset is not None:
                        _TRACKING.reset(reset)
        except _TooMuchText as e:
            raise RenderError(
                f"the chat template made more than {e.args[0]:,} characters of text for this "
                f"record (at most {_MAX_OUTPUT_FLOOR:,} beyond 4 times its messages' text)"
            ) from None
        except _OverBudget as e:
            raise RenderError(
                f"the chat template ran for more than {e.args[0]:g} s on this record (a loop "
                "that does not end?); fix the template or raise --template-timeout"
            ) from None
        except SecurityError as e:
            raise ChatTemplateError(
                f"chat template {self.name}: unsafe operation refused: {str(e).rstrip('.')} "
                "(templates are rendered in a sandbox: no Python internals, no code, no files)"
            ) from None
        except (TemplateNotFound, TemplatesNotFound) as e:
            raise ChatTemplateError(
                f"chat template {self.name}: cannot include or import {e.name!r}: templates are "
                "rendered in a sandbox without files; put everything in one template"
            ) from None
        except _TemplateRaised as e:
            raise RenderError(f"the chat template raised an error: {e}") from None
        except Exception as e:  # anything else the template hit on this record
            raise RenderError(f"the chat template failed: {type(e).__name__}: {e}") from None

    def assistant_spans(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Any] | None = None,
        control: re.Pattern[str] | None = None,
        last_turn: bool = False,
    ) -> tuple[str, list[tuple[int, int]]]:
        """The whole conversation rendered once, and the character spans of what the assistant
        generates in it (see the module docstring): the ``{% generation %}`` blocks where the
        template has them, else each assistant turn located with sentinels.

        ``control``: the tokenizer's control-token strings (the turn of a located assistant
        message is learned up to and including the first one after its text). Message
        contents must not hold them as text (escape them first); U+FDD0..U+FDD3 are refused.

        ``last_turn``: the spans of the last assistant message only (``--chat-turns each``).

        Raises :class:`RenderError` when the template fails on ``messages`` or an assistant
        turn cannot be located exactly.
        """
        assistants = [k for k, m in enumerate(messages) if m.get("role") == "assistant"]
        if self.has_generation:
            spans: list[tuple[int, int]] = []
            full = self.render(messages, tools=tools, track=spans)
            if last_turn:  # the blocks after those of the conversation before that turn
                before: list[tuple[int, int]] = []
                if assistants:
                    self.render(messages[: assistants[-1]], tools=tools, track=before)
                spans = spans[len(before) :] if assistants else []
            return full, [(a, b) for a, b in spans if b > a]
        _check_reserved(messages)
        full = self.render(messages, tools=tools)
        spans = []
        low = 0  # nothing of a turn is learned before the end of the previous message
        regions: dict[int, tuple[int, int]] = {}

        def region(k: int) -> tuple[int, int]:
            if k not in regions:
                regions[k] = self._region(full, messages, k, tools)
            return regions[k]

        renderings: dict[tuple[int, bool], str] = {}

        def rendered(n: int, prompt: bool = False) -> str:
            """Messages 0..n-1 rendered (with the generation prompt): each once."""
            if (n, prompt) not in renderings:
                renderings[n, prompt] = self.render(
                    messages[:n], add_generation_prompt=prompt, tools=tools
                )
            return renderings[n, prompt]

        def neighbour(k: int) -> tuple[int, int] | None:
            """The region of a message next to an assistant one; None: not rendered."""
            try:
                return region(k)
            except RenderError:
                return None

        for k in assistants[-1:] if last_turn else assistants:
            start, end = region(k)
            previous = neighbour(k - 1) if k > 0 else None
            if previous is not None and previous[1] <= start:
                low = max(low, previous[1])
            header = self._header(rendered, k)
            at = full.find(header, low, start) if header else -1
            begin = at + len(header) if at >= 0 else start
            last = k + 1 == len(messages)
            following = None if last else neighbour(k + 1)
            bound = len(full) if following is None else max(end, following[0])
            finish = end
            if control is not None:
                ending = full if last else rendered(k + 1)
                tail = self._tail(full, ending, end, messages, k, tools)
                common = _common_prefix(full, end, bound, tail)
                # the last control token of the turn's end, as the template ends it
                closing = next(reversed(list(control.finditer(full, end, end + common))), None)
                if closing is None and control.search(tail):
                    # the template ends the turn with a control token, another one when more
                    # follows (gpt-oss: <|return|>, else <|end|>): the first one after the text
                    closing = control.search(full, end, bound)
                if closing is not None:
                    finish = closing.end()
            if spans and begin < spans[-1][1]:
                raise RenderError(
                    f"message {k} (assistant): its turn cannot be located exactly in what the "
                    "chat template renders (it overlaps the previous one)"
                )
            if finish > begin:
                spans.append((begin, finish))
            low = finish
        return full, spans

    def _region(
        self, full: str, messages: Sequence[Mapping[str, Any]], k: int, tools: Any
    ) -> tuple[int, int]:
        """The span of ``full`` that the text of message ``k`` decides: ``full`` against the
        conversation rendered with that text replaced by sentinels (U+FDD0 k U+FDD1), which
        no content holds, so the two renderings differ exactly there."""
        message = dict(messages[k])
        for key in _TEXT_KEYS:
            if isinstance(message.get(key), str) or (key == "content" and key in message):
                message[key] = f"\ufdd0{k}{key[0]}\ufdd1"
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            message["tool_calls"] = [_sentinel_call(c, f"\ufdd0{k}t{i}\ufdd1")
                                     for i, c in enumerate(calls)]  # fmt: skip
        changed = [*messages[:k], message, *messages[k + 1 :]]
        other = self.render(changed, tools=tools)
        if other == full:
            raise RenderError(
                f"message {k} ({messages[k].get('role')}): the chat template does not render "
                "its text, so its turn cannot be located"
            )
        # The sentinels' characters are in `other` only: the renderings agree up to the first
        # and after the last, unless the template changed more than the text (then: compare).
        first, last = other.find("\ufdd0"), other.rfind("\ufdd1") + 1
        tail = len(other) - last
        same_ends = full.startswith(other[:first]) and full.endswith(other[last:])
        if 0 <= first < last and first + tail <= len(full) and same_ends:
            return first, len(full) - tail
        n = min(len(full), len(other))
        a = _common_prefix(full, 0, n, other)
        b = _common_prefix(full[::-1], 0, n - a, other[::-1])
        return a, len(full) - b

    def _tail(
        self,
        full: str,
        ending: str,
        end: int,
        messages: Sequence[Mapping[str, Any]],
        k: int,
        tools: Any,
    ) -> str:
        """What the template renders after the text of message ``k`` when the conversation
        ends there (``ending``: ``<|im_end|>\n``, ``<|eot_id|>``...): how it closes that turn.
        ``end``: where that text ends in the whole conversation."""
        if end <= len(ending) and full.startswith(ending):
            return ending[end:]  # the same text as the whole conversation's, up to there
        return ending[self._region(ending, messages[: k + 1], k, tools)[1] :]

    @staticmethod
    def _header(rendered: Any, k: int) -> str:
        """What the generation prompt adds after messages ``0..k-1`` (``<|im_start|>assistant\n``):
        the header of an assistant turn, which the model does not generate. Empty when the
        template has no generation prompt, or it is not an addition at the end."""
        try:
            with_prompt, without = rendered(k, True), rendered(k)
        except RenderError:
            return ""
        return with_prompt[len(without) :] if with_prompt.startswith(without) else ""


_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
_TEXT_KEYS = ("content", "reasoning_content", "thinking")
"""Message fields of text a template renders (besides tool calls)."""
_RESERVED = re.compile("[\ufdd0\ufdd1]")


def _common_prefix(full: str, start: int, stop: int, other: str) -> int:
    """Length of the common prefix of ``full[start:stop]`` and ``other`` (a binary search of
    slice comparisons: no loop over characters in Python)."""
    lo, hi = 0, min(stop - start, len(other))
    if full.startswith(other[:hi], start):
        return hi
    while lo < hi:  # full[start:start+lo] == other[:lo], and not at hi
        mid = (lo + hi + 1) // 2
        if full.startswith(other[:mid], start):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _sentinel_call(call: Any, sentinel: str) -> Any:
    """A tool call with its arguments replaced by ``sentinel`` (a string for a string, else
    an object holding it); the name is kept: templates repeat it in the tool's result."""
    if not isinstance(call, Mapping):
        return call
    function = call.get("function")
    inner = function if isinstance(function, Mapping) else call
    arguments = inner.get("arguments")
    replaced = sentinel if isinstance(arguments, str) else {sentinel: sentinel}
    if isinstance(function, Mapping):
        return {**call, "function": {**function, "arguments": replaced}}
    return {**call, "arguments": replaced}


def _check_reserved(messages: Sequence[Mapping[str, Any]]) -> None:
    for k, m in enumerate(messages):
        for key in _TEXT_KEYS:
            value = m.get(key)
            if isinstance(value, str) and _RESERVED.search(value):
                raise RenderError(
                    f"message {k}: its {key} holds U+FDD0 or U+FDD1, Unicode noncharacters that "
                    "packtool uses internally"
                )


def _template_variables(tokenizer: Any) -> dict[str, str]:
    """``bos_token``, ``eos_token``, ``pad_token`` strings of the tokenizer, where it has them."""
    out: dict[str, str] = {}
    to_token = getattr(tokenizer, "id_to_token", None)
    special = tokenizer.special
    for name, tid in (("bos", special.bos_id), ("eos", special.eos_id), ("pad", special.pad_id)):
        token = to_token(tid) if (to_token is not None and tid is not None) else None
        if token is not None:
            out[f"{name}_token"] = token
    return out


def _restore_template(
    text: str, name: str, source: str, variables: dict[str, str], timeout: float | None
) -> ChatTemplate:
    template = ChatTemplate.from_string(text, name=name, source=source, variables=variables)
    return replace(template, timeout=timeout)


def _configured_template(config: Mapping[str, Any]) -> Any:
    """The ``chat_template`` of a tokenizer config: a string, or of a list of named templates
    the ``default`` one (else the first)."""
    configured = config.get("chat_template")
    if isinstance(configured, list):
        named = {t.get("name"): t.get("template") for t in configured if isinstance(t, dict)}
        configured = named.get("default") or next(iter(named.values()), None)
    return configured


def _template_of_json(path: Any, text: str) -> str:
    """The template a ``--chat-template`` JSON file holds (a ``tokenizer_config.json``): its
    text was rendered as a template before, JSON and all."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ChatTemplateError(f"{path}: not valid JSON ({e}); --chat-template takes a Jinja "
                                "template file, or a tokenizer_config.json") from None  # fmt: skip
    configured = _configured_template(config) if isinstance(config, dict) else None
    if not isinstance(configured, str):
        raise ChatTemplateError(
            f"{path}: a JSON file without a chat_template string; --chat-template takes a Jinja "
            "template file, or a tokenizer_config.json that has a chat_template"
        )
    return configured


def load_chat_template(
    spec: str | os.PathLike[str] | None, tokenizer: Any, *, records: str = "chat records"
) -> ChatTemplate:
    """The chat template to render chats with.

    ``spec``: a Jinja file (``--chat-template``), or a ``.json`` file holding a
    ``chat_template`` as ``tokenizer_config.json`` does. Without one: the ``chat_template`` of
    the tokenizer's ``tokenizer_config.json`` (a string, or a list of named templates, of which
    ``default`` is taken), else a ``chat_template.jinja`` next to it. ``records`` names the
    records that need one in the error raised when there is none.
    """
    variables = _template_variables(tokenizer)
    if spec is not None:
        path = as_path(spec)  # a local file, or an fsspec URL (s3://...)
        if path.is_dir():
            raise ChatTemplateError(
                f"{path}: a directory; --chat-template takes a Jinja template file (for the "
                "template of a tokenizer directory, pass the directory as --tokenizer)"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ChatTemplateError(f"{path}: no such chat template file") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ChatTemplateError(f"{path}: cannot read the chat template: {e}") from None
        if path.name.lower().endswith(".json"):
            text = _template_of_json(path, text)
        return ChatTemplate.from_string(text, name=str(path), source="file", variables=variables)
    config = getattr(tokenizer, "config", None) or {}
    name = getattr(tokenizer, "name", "?")
    configured = _configured_template(config)
    if isinstance(configured, str):
        return ChatTemplate.from_string(
            configured,
            name=f"{name} (tokenizer_config.json)",
            source="tokenizer_config.json",
            variables=variables,
        )
    directory = getattr(tokenizer, "directory", None)
    if directory is not None and (as_path(directory) / "chat_template.jinja").is_file():
        path = as_path(directory) / "chat_template.jinja"
        return ChatTemplate.from_string(
            path.read_text(encoding="utf-8"),
            name=str(path),
            source="chat_template.jinja",
            variables=variables,
        )
    raise ChatTemplateError(
        f"{records} need a chat template, and tokenizer {name} has none: pass "
        "--chat-template FILE.jinja (sample_data/chatml.jinja is a ChatML one), or a --tokenizer "
        "whose tokenizer_config.json has a chat_template"
    )
