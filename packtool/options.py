"""The options of a pack: one frozen record, checked once, carried whole through every stage.

The CLI builds a :class:`PackOptions` from its flags and the library API from keyword
arguments; ``pack``, work units, engines, ``merge`` and ``stats`` of a corpus take it whole. An
option is added here (field, check, description), as a flag of the command that offers it, and
in the stage that uses it; nothing else spells it.

>>> o = PackOptions(max_len=4096, overflow="truncate")
>>> o.overflow, o.add_eos
('truncate', None)
>>> PackOptions(max_len=1)
Traceback (most recent call last):
  ...
packtool.errors.OptionError: --max-len must be an integer from 2 to 16,777,216, got 1
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .chat import DEFAULT_TEMPLATE_TIMEOUT
from .errors import OptionError
from .layout import DEFAULT_SHARD_SIZE, Layout
from .limits import MAX_LEN_LIMIT, MAX_NUM_PROC, MAX_UNITS, check_int

__all__ = [
    "ENGINES",
    "INPUT_SHAPES",
    "LOSS_ON",
    "NO_COPY_BALANCE",
    "OVERFLOWS",
    "TOKENIZER_BACKENDS",
    "TXT_UNITS",
    "PackOptions",
]

OVERFLOWS = ("split", "truncate", "drop")
TXT_UNITS = ("line", "paragraph", "document")
INPUT_SHAPES = ("text", "prompt-completion", "chat", "ids", "auto")
LOSS_ON = ("completion", "assistant", "all")
ENGINES = ("local", "ray")
MAX_TEMPLATE_TIMEOUT = 24 * 3600.0  # seconds
TOKENIZER_BACKENDS = ("auto", "hf", "fastokens", "gigatoken")  # tokenize.registry.choices()
MAX_CHECK_SAMPLE = 1 << 30  # documents re-encoded by --check-sample

_NEEDS_UNITS = "--unit, --engine and --ray-address work on units: give --units N"
NO_COPY_BALANCE = (
    "--world-size stores the rows as balanced steps over all the units' rows, which a merge "
    "must write again: leave out --no-copy (or --world-size)"
)

_ROWS_KEY = (
    "max_len",
    "text_field",
    "input_shape",
    "prompt_field",
    "completion_field",
    "messages_field",
    "loss_on",
    "overflow",
    "add_eos",
    "bos",
    "eos_token",
    "bos_token",
    "pad_id",
    "parse_special",
    "skip_bad_records",
    "split",
    "txt_unit",
    "template_timeout",
    "chat_turns",
    "learn_reasoning",
    "ids_field",
    "labels_field",
    "loss_mask_field",
    "vocab_size",
    "split_on_eos",
)


CHAT_TURNS = ("all", "each")
"""``--chat-turns``: one example per conversation, or one per assistant turn."""


def _enum(flag: str, value: Any, choices: tuple[str, ...]) -> str:
    value = getattr(value, "value", value)  # the library's enums are str enums
    if value not in choices:
        raise OptionError(f"{flag} must be one of {', '.join(choices)}; got {value!r}")
    return str(value)


@dataclass(frozen=True)
class PackOptions:
    """Every option of ``packtool pack`` (and of the library's :func:`packtool.pack`).

    ``None`` means "decided from the data or the tokenizer": ``overflow`` (split for text,
    drop for instruction data), ``add_eos`` (on, except for chats), ``bos`` (the tokenizer's
    post-processor), ``pad_id`` (the pad token, else EOS), ``rows_per_shard`` (from
    ``shard_size``), ``loss_on`` (by the input shape). ``tokenizer`` is a spec (a path, a hub
    name, ``None`` for the bundled one) or a tokenizer object (library use).
    """

    # What the rows hold
    max_len: int | None = None
    tokenizer: Any = None
    text_field: str = "text"
    input_shape: str = "auto"
    prompt_field: str = "prompt"
    completion_field: str = "completion"
    messages_field: str = "messages"
    chat_template: Any = None  # a path, or a packtool.chat.ChatTemplate
    loss_on: str | None = None
    template_timeout: float | None = DEFAULT_TEMPLATE_TIMEOUT  # seconds a record (None: no limit)
    chat_turns: str = "all"  # chats: one example per conversation (all) or per assistant turn
    learn_reasoning: bool = True  # chats: reasoning blocks of assistant turns are learned
    overflow: str | None = None
    add_eos: bool | None = None
    bos: bool | None = None
    eos_token: str | None = None
    bos_token: str | None = None
    pad_id: int | None = None
    parse_special: bool = False
    skip_bad_records: bool = False
    split: str | None = None
    txt_unit: str = "line"
    ids_field: str | None = None  # pre-tokenized records: the list of token ids
    labels_field: str | None = None  # ... and their labels (-100: not learned)
    loss_mask_field: str | None = None  # ... or a 0/1 mask of the learned tokens
    vocab_size: int | None = None  # ids must be below it (default: the tokenizer's)
    split_on_eos: int | None = None  # cut pre-tokenized records after each of this id
    pad_to_multiple_of: int | None = None  # every segment padded to a multiple of it
    # How rows are laid out (the fields of ``layout``)
    shuffle: bool = True
    seed: int = 0
    world_size: int | None = None  # balanced steps for this many data-parallel ranks
    micro_batches: int = 1  # rows a rank reads per step (gradient accumulation)
    rows_per_shard: int | None = None
    shard_size: str | int = DEFAULT_SHARD_SIZE
    # With --units: the merge copies the rows into OUT (True) or lists the units' shards
    # where they lie (False); None: copy only for --world-size, which needs a global order
    merge_copy: bool | None = None
    # How the run goes (never changes the rows)
    overwrite: bool = False
    resume: bool = False
    num_proc: int | None = None
    tokenizer_backend: str = "auto"
    check_sample: int = 0
    units: int | None = None
    unit: int | None = None
    engine: str = "local"
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if self.max_len is not None:
            check_int("--max-len", self.max_len, 2, MAX_LEN_LIMIT)
        if self.overflow is not None:
            object.__setattr__(self, "overflow", _enum("--overflow", self.overflow, OVERFLOWS))
        object.__setattr__(
            self, "input_shape", _enum("--input-shape", self.input_shape, INPUT_SHAPES)
        )
        if self.loss_on is not None:
            object.__setattr__(self, "loss_on", _enum("--loss-on", self.loss_on, LOSS_ON))
        if self.txt_unit not in TXT_UNITS:
            raise OptionError(
                f"--txt-unit must be line, paragraph or document, got {self.txt_unit!r}"
            )
        _enum("--engine", self.engine, ENGINES)
        object.__setattr__(
            self,
            "tokenizer_backend",
            _enum("--tokenizer-backend", self.tokenizer_backend, TOKENIZER_BACKENDS),
        )
        if self.pad_id is not None and (
            isinstance(self.pad_id, bool) or not isinstance(self.pad_id, int)
        ):  # its range is the tokenizer's vocabulary, checked when that is loaded
            raise OptionError(f"--pad-id must be an integer, got {self.pad_id!r}")
        self.layout  # the layout's fields are checked by the record they make  # noqa: B018
        if self.num_proc is not None:
            check_int("--num-proc", self.num_proc, 1, MAX_NUM_PROC)
        object.__setattr__(self, "chat_turns", _enum("--chat-turns", self.chat_turns, CHAT_TURNS))
        timeout = self.template_timeout
        if timeout is not None and not 0 < timeout <= MAX_TEMPLATE_TIMEOUT:
            raise OptionError(
                f"--template-timeout must be more than 0 and at most {MAX_TEMPLATE_TIMEOUT:g} "
                f"seconds, got {timeout:g}"
            )
        check_int("--check-sample", self.check_sample, 0, MAX_CHECK_SAMPLE)
        self._check_units()
        self._check_ids()
        self._check_alignment()
        for name in ("tokenizer", "chat_template"):  # paths as text: they pickle and print
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, name, os.fspath(value))

    def _check_ids(self) -> None:
        if self.ids_field is None:
            for name in ("labels_field", "loss_mask_field"):
                if getattr(self, name) is not None:
                    raise OptionError(
                        f"{_flag(name)} is for pre-tokenized records: give --ids-field NAME"
                    )
            if self.input_shape == "ids":
                raise OptionError("--input-shape ids needs --ids-field NAME")
        elif self.input_shape not in ("auto", "ids"):
            raise OptionError(
                f"--ids-field reads pre-tokenized records, but --input-shape is "
                f"{self.input_shape}: leave out one of them"
            )
        if self.labels_field is not None and self.loss_mask_field is not None:
            raise OptionError("give --labels-field or --loss-mask-field, not both")
        if self.vocab_size is not None:
            check_int("--vocab-size", self.vocab_size, 1, 1 << 31)
        if self.split_on_eos is not None:
            check_int("--split-on-eos", self.split_on_eos, 0, (1 << 31) - 1)

    def _check_alignment(self) -> None:
        n = self.pad_to_multiple_of
        if n is None:
            return
        check_int("--pad-to-multiple-of", n, 1, MAX_LEN_LIMIT)
        if self.max_len is not None and self.max_len % n:
            lower, higher = self.max_len // n * n, -(-self.max_len // n) * n
            raise OptionError(
                f"--max-len {self.max_len} is not a multiple of --pad-to-multiple-of {n}: "
                f"use --max-len {higher}" + (f" or {lower}" if lower >= 2 else "")
            )

    @property
    def alignment(self) -> int:
        """The multiple every segment is padded to (1: none)."""
        return self.pad_to_multiple_of or 1

    def _check_units(self) -> None:
        if self.units is not None:
            check_int("--units", self.units, 1, MAX_UNITS)
        if self.unit is not None:
            if self.units is None:
                raise OptionError(_NEEDS_UNITS)
            if not isinstance(self.unit, int) or not 0 <= self.unit < self.units:
                raise OptionError(
                    f"--unit must be in 0..{self.units - 1} (0-based, for --units "
                    f"{self.units}), got {self.unit}"
                )
            if self.engine != "local":
                raise OptionError(
                    "--unit runs one unit in this process: leave out --engine (the launcher "
                    "is the engine)"
                )
        if self.units is None and (self.engine != "local" or self.ray_address is not None):
            raise OptionError(_NEEDS_UNITS)
        if self.ray_address is not None and self.engine != "ray":
            raise OptionError("--ray-address needs --engine ray")
        if self.merge_copy is not None and self.units is None:
            raise OptionError("--copy/--no-copy choose how units are merged: give --units N")
        if self.merge_copy is False and self.world_size is not None:
            raise OptionError(NO_COPY_BALANCE)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> PackOptions:
        """The options among ``values`` (e.g. a CLI command's parameters); others ignored."""
        names = {f.name for f in fields(cls) if f.init}
        return cls(**{k: v for k, v in values.items() if k in names})

    def replace(self, **changes: Any) -> PackOptions:
        return dataclasses.replace(self, **changes)

    @property
    def tokenizer_spec(self) -> str | None:
        """The tokenizer as given, when it is a spec (``None``: bundled, or an object)."""
        return self.tokenizer if isinstance(self.tokenizer, str) else None

    @property
    def layout(self) -> Layout:
        """How the rows are ordered and sharded: the layout fields as one record, which the
        plan and write stages of ``pack``, a copying merge and the engines take."""
        return Layout(
            shuffle=self.shuffle,
            seed=self.seed,
            world_size=self.world_size,
            micro_batches=self.micro_batches,
            rows_per_shard=self.rows_per_shard,
            shard_size=self.shard_size,
        )

    @property
    def shard_bytes(self) -> int:
        return self.layout.shard_bytes

    def rows_key(self) -> dict[str, Any]:
        """The options that decide which rows a run packs (what work units are keyed by)."""
        out = {name: getattr(self, name) for name in _ROWS_KEY}
        template = self.chat_template
        out["chat_template"] = None if template is None else getattr(template, "sha256", template)
        if self.alignment > 1:  # left out otherwise: the keys of earlier runs stay the same
            out["pad_to_multiple_of"] = self.alignment
        return out

    def describe(self) -> dict[str, Any]:
        """The manifest's ``options`` (the resolved values of a run; see ``pipeline``)."""
        return {
            "max_len": self.max_len,
            "text_field": self.text_field,
            "overflow": self.overflow,
            "add_eos": self.add_eos,
            "bos": self.bos,
            "pad_id": self.pad_id,
            **self.layout.describe(),
            "skip_bad_records": self.skip_bad_records,
            "split": self.split,
            "txt_unit": self.txt_unit,
            **({"pad_to_multiple_of": self.alignment} if self.alignment > 1 else {}),
        }

    def changed(self, *names: str) -> list[str]:
        """The flags among ``names`` (field names) whose values differ from the defaults."""
        default = PackOptions()
        return [_flag(n) for n in names if getattr(self, n) != getattr(default, n)]


def _flag(name: str) -> str:
    return {"add_eos": "--no-eos", "bos": "--bos/--no-bos", "cache": "--no-cache"}.get(
        name, "--" + name.replace("_", "-")
    )
