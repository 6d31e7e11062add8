"""The options of a pack: each declared once, checked once, carried whole through every stage.

Each field of :class:`PackOptions` is declared with :func:`opt`: its default, what it changes
(``ROWS``: which rows a run makes; ``LAYOUT``: only their order and shards; ``RUN``: only how
the run goes), its check, whether the manifest records it, whether ``merge`` and corpus-mode
``stats`` take it, and its flags and help on the command line. Everything else is derived from
the declaration: :meth:`PackOptions.rows_key` (what ``--resume`` and work units are keyed by:
every ``ROWS`` option), :meth:`PackOptions.describe` (the manifest's ``options``),
:data:`CORPUS_OPTIONS`, :data:`MERGE_KEYS` and :data:`RECORDED_ROWS` (what ``verify --against``
needs recorded), and the command line's options of ``pack``, ``merge`` and ``stats``.

An option is added in two places: its declaration here, and the stage that uses it.

>>> o = PackOptions(max_len=4096, overflow="truncate")
>>> o.overflow, o.add_eos
('truncate', None)
>>> PackOptions(max_len=1)
Traceback (most recent call last):
  ...
packtool.errors.OptionError: --max-len must be an integer from 2 to 16,777,216, got 1
>>> OPTIONS["seed"].changes, OPTIONS["seed"].merge is not None
('layout', True)
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .chat import DEFAULT_TEMPLATE_TIMEOUT
from .errors import OptionError
from .layout import DEFAULT_SHARD_SIZE, Layout
from .limits import MAX_LEN_LIMIT, MAX_NUM_PROC, MAX_UNITS, check_int

__all__ = [
    "CHANGES",
    "CORPUS_OPTIONS",
    "ENGINES",
    "INPUT_SHAPES",
    "LAYOUT",
    "LOSS_ON",
    "MERGE_KEYS",
    "NO_COPY_BALANCE",
    "OPTIONS",
    "OVERFLOWS",
    "RECORDED_ROWS",
    "ROWS",
    "RUN",
    "TOKENIZER_BACKENDS",
    "TXT_UNITS",
    "Merge",
    "Option",
    "PackOptions",
    "declarations",
    "opt",
]

OVERFLOWS = ("split", "truncate", "drop")
TXT_UNITS = ("line", "paragraph", "document")
INPUT_SHAPES = ("text", "prompt-completion", "chat", "ids", "auto")
LOSS_ON = ("completion", "assistant", "all")
ENGINES = ("local", "ray")
CHAT_TURNS = ("all", "each")
"""``--chat-turns``: one example per conversation, or one per assistant turn."""
MAX_TEMPLATE_TIMEOUT = 24 * 3600.0  # seconds
TOKENIZER_BACKENDS = ("auto", "hf", "fastokens", "gigatoken")  # tokenize.registry.choices()
MAX_CHECK_SAMPLE = 1 << 30  # documents re-encoded by --check-sample

_NEEDS_UNITS = "--unit, --engine and --ray-address work on units: give --units N"
NO_COPY_BALANCE = (
    "--world-size stores the rows as balanced steps over all the units' rows, which a merge "
    "must write again: leave out --no-copy (or --world-size)"
)

ROWS = "rows"
"""The option changes which rows a run makes (their tokens, labels, or which documents share
a row): ``--resume`` and work units start over when it changes."""
LAYOUT = "layout"
"""The option changes only the order of the rows and the shards that hold them."""
RUN = "run"
"""The option changes only how the run goes (threads, engine, what it overwrites)."""
CHANGES = (ROWS, LAYOUT, RUN)

_SPELLED = object()  # rows_key: the option as it is spelled
_IF_GIVEN = object()  # rows_key: the option as it is spelled, left out when None (an option
# added after packs were keyed: their keys, and the units' plans, stay as they were)


# -- how an option is declared -------------------------------------------------------------


@dataclass(frozen=True)
class Merge:
    """How ``packtool merge`` takes a layout option: its help there (its default there is
    what the units recorded), and the key the merge takes and records it by (``None``: it
    records no key of its own, e.g. ``shard_size``, which it turns into rows per shard)."""

    help: str
    key: str | None = ""  # "": the option's own name


@dataclass(frozen=True)
class Option:
    """What one option of :class:`PackOptions` is (the metadata of its field; see :func:`opt`).

    ``flags``: its spellings on the command line (default ``--field-name``); ``cli``: how the
    command line reads it when the field's type does not say (``"str"``, ``"path"``, or
    ``"token_count"``: 4096 or 4k); ``required``: the command line must give it. ``key``:
    its value in :meth:`PackOptions.rows_key` (``None``: not there, because the caller keys
    it by what it loaded, e.g. the tokenizer's sha256; ``_IF_GIVEN``: there only when not
    ``None``, for an option added after packs were keyed). ``rows_with``: a ``LAYOUT``
    option that also decides which rows a run makes when the option of that name is given
    (``seed`` with ``mix``: it also chooses the documents a mixture samples); it is then
    keyed as the ``ROWS`` options are.
    """

    changes: str
    help: str
    flags: tuple[str, ...] = ()
    check: Callable[[str, Any], Any] | None = None
    recorded: bool = False
    corpus: bool | str = False  # corpus-mode `stats` takes it (a text: its help there)
    merge: Merge | None = None
    key: Any = _SPELLED
    show_default: bool = True
    cli: str | None = None
    required: bool = False
    rows_with: str | None = None
    name: str = ""  # the field's name, filled in by declarations()
    default: Any = None  # the field's default, filled in by declarations()
    annotation: str = ""  # the field's type, filled in by declarations()

    @property
    def flag(self) -> str:
        """The option's flag as a message names it (``--max-len``; ``--eos`` for a pair)."""
        return self.flags[0].split("/")[0]

    def flag_for(self, value: Any) -> str:
        """The flag that gives ``value`` (``--no-eos`` for ``add_eos=False``)."""
        first = self.flags[0]
        if "/" in first:
            on, off = first.split("/")
            return on if value else off
        return first

    @property
    def merge_key(self) -> str | None:
        if self.merge is None:
            return None
        return self.name if self.merge.key == "" else self.merge.key


def opt(default: Any, changes: str, help: str, **spec: Any) -> Any:
    """A field of :class:`PackOptions` declared with what it is (:class:`Option`)."""
    return field(default=default, metadata={"option": Option(changes, help, **spec)})


def declarations(cls: type) -> dict[str, Option]:
    """Every field of the options record ``cls`` as its :class:`Option`, in declaration
    order; a field declared without :func:`opt` (so not classified) is a ``TypeError``."""
    out: dict[str, Option] = {}
    for f in fields(cls):
        spec = f.metadata.get("option")
        if not isinstance(spec, Option) or spec.changes not in CHANGES:
            raise TypeError(
                f"{cls.__name__}.{f.name} is not declared with opt(default, ROWS | LAYOUT | "
                "RUN, help): say what the option changes"
            )
        flags = spec.flags or ("--" + f.name.replace("_", "-"),)
        out[f.name] = dataclasses.replace(
            spec, name=f.name, default=f.default, annotation=str(f.type), flags=flags
        )
    return out


# -- checks -------------------------------------------------------------------------------


def _one_of(choices: tuple[str, ...]) -> Callable[[str, Any], str]:
    def check(flag: str, value: Any) -> str:
        value = getattr(value, "value", value)  # the library's enums are str enums
        if value not in choices:
            raise OptionError(f"{flag} must be one of {', '.join(choices)}; got {value!r}")
        return str(value)

    return check


def _int_in(low: int, high: int) -> Callable[[str, Any], int]:
    return lambda flag, value: check_int(flag, value, low, high)


def _txt_unit(flag: str, value: Any) -> str:
    if value not in TXT_UNITS:
        raise OptionError(f"{flag} must be line, paragraph or document, got {value!r}")
    return str(value)


def _any_int(flag: str, value: Any) -> int:
    """An integer (``--pad-id``: its range is the tokenizer's vocabulary, checked when that
    is loaded)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionError(f"{flag} must be an integer, got {value!r}")
    return value


def _timeout(flag: str, value: Any) -> float:
    if not 0 < value <= MAX_TEMPLATE_TIMEOUT:
        raise OptionError(
            f"{flag} must be more than 0 and at most {MAX_TEMPLATE_TIMEOUT:g} seconds, "
            f"got {value:g}"
        )
    return value


def _text(flag: str, value: Any) -> Any:
    """A path as text (it pickles and prints); anything else (a loaded object) as it is."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _template_key(template: Any) -> Any:
    """A chat template in :meth:`PackOptions.rows_key`: a loaded one by its sha256."""
    return getattr(template, "sha256", template)


_AS_PACK = "(default: as given to pack)"


@dataclass(frozen=True)
class PackOptions:
    """Every option of ``packtool pack`` (and of the library's :func:`packtool.pack`).

    ``None`` means "decided from the data or the tokenizer": ``overflow`` (split for text,
    drop for instruction data), ``add_eos`` (on, except for chats), ``bos`` (the tokenizer's
    post-processor), ``pad_id`` (the pad token, else EOS), ``rows_per_shard`` (from
    ``shard_size``), ``loss_on`` (by the input shape). ``tokenizer`` is a spec (a path, a hub
    name, ``None`` for the bundled one) or a tokenizer object (library use). Each field's
    declaration says what it is (:class:`Option`); the command line's help is its ``help``.
    """

    max_len: int | None = opt(
        None, ROWS, "Tokens per packed row (4096, or 4k).", flags=("--max-len", "-L"),
        check=_int_in(2, MAX_LEN_LIMIT), recorded=True, show_default=False, cli="token_count",
        required=True,
    )  # fmt: skip
    tokenizer: Any = opt(
        None, ROWS, "tokenizer.json path, local model directory, or hub name (default: "
        "packtool's bundled byte-level BPE).", check=_text, corpus=True, key=None,
        show_default=False, cli="str",
    )  # fmt: skip  # key: the loaded tokenizer's sha256 (units.options_key, pipeline)
    text_field: str = opt(
        "text", ROWS, "Field (column) holding the document text.", recorded=True, corpus=True
    )
    input_shape: str = opt(
        "auto", ROWS, "Records are text, prompt-completion, chat or ids (pre-tokenized, with "
        "--ids-field); auto decides by the fields of the first record (messages -> chat, prompt "
        "+ completion -> prompt-completion), or ids when --ids-field is given.",
        check=_one_of(INPUT_SHAPES), corpus=True,
    )  # fmt: skip
    prompt_field: str = opt(
        "prompt", ROWS, "Field holding the prompt (prompt-completion records).", corpus=True
    )
    completion_field: str = opt(
        "completion", ROWS, "Field holding the completion (prompt-completion records).",
        corpus=True,
    )  # fmt: skip
    messages_field: str = opt(
        "messages", ROWS, "Field holding the list of {role, content} messages (chat records).",
        corpus=True,
    )  # fmt: skip
    chat_template: Any = opt(
        None, ROWS, "Jinja chat template for chat records (or a tokenizer_config.json holding "
        "one), rendered in a sandbox [default: the chat_template of the tokenizer's "
        "tokenizer_config.json].", check=_text, key=_template_key, show_default=False,
        cli="path", corpus=True,
    )  # fmt: skip  # a path, or a packtool.chat.ChatTemplate
    loss_on: str | None = opt(
        None, ROWS, "Tokens learned (labels column): completion, assistant or all [default: "
        "completion for prompt-completion, assistant for chat].", check=_one_of(LOSS_ON),
        show_default=False, corpus=True,
    )  # fmt: skip
    template_timeout: float | None = opt(
        DEFAULT_TEMPLATE_TIMEOUT, ROWS, "Seconds the chat template may run on one record; a "
        "record it runs longer on stops the run, naming the record (or is skipped with "
        "--skip-bad-records).", check=_timeout, corpus=True,
    )  # fmt: skip  # None: no limit
    chat_turns: str = opt(
        "all", ROWS, "Chats: one example per conversation, every assistant turn learned (all), "
        "or one per assistant turn, its history rendered as the template renders it at that "
        "turn and only that turn learned (each: for reasoning templates that drop earlier "
        "reasoning).", check=_one_of(CHAT_TURNS), corpus=True,
    )  # fmt: skip
    learn_reasoning: bool = opt(
        True, ROWS, "Chats: learn the reasoning of assistant turns (<think> blocks, gpt-oss "
        "analysis) with the answer, or keep it as context.",
        flags=("--learn-reasoning/--no-learn-reasoning",), corpus=True,
    )  # fmt: skip
    overflow: str | None = opt(
        None, ROWS, "What to do with documents longer than --max-len: split (into chunks), "
        "truncate, or drop [default: split for text, drop for prompt-completion and chat].",
        check=_one_of(OVERFLOWS), recorded=True, show_default=False,
        corpus=True,
    )  # fmt: skip
    add_eos: bool | None = opt(
        None, ROWS, "Append EOS to every document [default: on, except for chats, whose "
        "template closes every turn].", flags=("--eos/--no-eos",), recorded=True,
        show_default=False, corpus=True,
    )  # fmt: skip
    bos: bool | None = opt(
        None, ROWS, "Force one BOS at each document start, or no post-processor tokens at all "
        "(default: the tokenizer's post-processor decides).", flags=("--bos/--no-bos",),
        recorded=True, corpus=True, show_default=False,
    )  # fmt: skip
    eos_token: str | None = opt(
        None,
        ROWS,
        "EOS token: its text, or a number for an id; overrides the tokenizer's.",
        corpus=True,
    )
    bos_token: str | None = opt(
        None,
        ROWS,
        "BOS token: its text, or a number for an id; overrides the tokenizer's.",
        corpus=True,
    )
    pad_id: int | None = opt(
        None, ROWS, "Padding id (default: the tokenizer's pad token, else EOS).",
        check=_any_int, recorded=True, show_default=False,
    )  # fmt: skip
    parse_special: bool = opt(
        False, ROWS, "Parse special-token strings in the data (<|endoftext|>, <|im_end|>...) "
        "as control tokens, for data that holds markup on purpose [default: they are text].",
        flags=("--parse-special",), corpus=True,
    )  # fmt: skip
    # Mixtures (docs/mixtures.md): each INPUT argument is a source
    mix: str | None = opt(
        None, ROWS, "Each input's share of the output's tokens, in input order (e.g. "
        "0.5,0.3,0.2): a larger source is sampled, a smaller one repeated, by whole documents "
        "(docs/mixtures.md).", cli="str", show_default=False,
        corpus="The rows pack --mix would make (same weights, --tokens, --no-repeat, --seed), "
        "with each source's part (docs/mixtures.md).",
    )  # fmt: skip
    tokens: str | int | None = opt(
        None, ROWS, "With --mix: the output's tokens (e.g. 500M, 2G) [default: the most that "
        "need no document repeated].", cli="str", show_default=False, corpus=True,
    )  # fmt: skip
    repeat: bool = opt(
        True, ROWS, "With --mix: a source smaller than its share is repeated by whole documents "
        "(--no-repeat: an error instead).", flags=("--repeat/--no-repeat",), corpus=True,
    )  # fmt: skip
    # How rows are laid out (the fields of ``layout``, checked by that record)
    shuffle: bool = opt(
        True, LAYOUT, "Shuffle rows (FFD puts long ones first).", flags=("--shuffle/--no-shuffle",),
        recorded=True, merge=Merge(f"Shuffle the rows {_AS_PACK}."),
    )  # fmt: skip
    seed: int = opt(
        0, LAYOUT, "Seed of the row shuffle (with --mix, also of the documents sampled: then it "
        "changes the rows).", recorded=True, rows_with="mix",
        merge=Merge(f"Seed of the row shuffle {_AS_PACK}."),
    )  # fmt: skip
    world_size: int | None = opt(
        None, LAYOUT, "Store the rows as balanced steps for W data-parallel ranks: read through "
        "PackedDataset(rank=r, world_size=W), every rank's rows of a step have nearly the same "
        "attention cost (docs/balance.md).", recorded=True, show_default=False,
        merge=Merge("Store the rows as balanced steps for W data-parallel ranks, as `pack "
                    f"--world-size` {_AS_PACK}."),
    )  # fmt: skip  # balanced steps for this many data-parallel ranks
    micro_batches: int = opt(
        1, LAYOUT, "With --world-size: rows a rank reads per step (batch size x gradient "
        "accumulation); the sum over them is balanced.", recorded=True,
        merge=Merge(f"With --world-size: rows a rank reads per step {_AS_PACK}."),
    )  # fmt: skip  # gradient accumulation
    rows_per_shard: int | None = opt(
        None, LAYOUT, "Rows per shard (default: from --shard-size).", recorded=True,
        show_default=False, merge=Merge(f"Rows per shard {_AS_PACK}."),
    )  # fmt: skip
    shard_size: str | int = opt(
        DEFAULT_SHARD_SIZE, LAYOUT, "Target shard size, e.g. 256MB (ignored with "
        "--rows-per-shard).", cli="str",
        merge=Merge("Target shard size, e.g. 256MB (ignored with --rows-per-shard).", key=None),
    )  # fmt: skip  # the merge turns it into rows_per_shard
    # How the run goes (never changes the rows); what the rows hold from pre-tokenized records
    overwrite: bool = opt(
        False, RUN, "Replace the output directory if it exists.", flags=("--overwrite",)
    )
    skip_bad_records: bool = opt(
        False, ROWS, "Skip malformed records (bad JSON, missing or non-string text), counting "
        "them, instead of stopping at the first.", flags=("--skip-bad-records",),
        recorded=True, corpus=True,
    )  # fmt: skip
    split: str | None = opt(
        None, ROWS, "Split of a saved DatasetDict (default: train).", recorded=True,
        corpus=True, show_default=False,
    )  # fmt: skip
    txt_unit: str = opt(
        "line", ROWS, "A document in .txt inputs: line, paragraph or document.", check=_txt_unit,
        recorded=True, corpus=True,
    )  # fmt: skip
    ids_field: str | None = opt(
        None, ROWS, "Pre-tokenized records: the field (a list of ints) holding each document's "
        "token ids, packed as they are (Parquet, Arrow, saved datasets, JSON Lines, JSON, CSV); "
        "no tokenizer is loaded unless --tokenizer is given.", corpus=True, show_default=False,
    )  # fmt: skip
    labels_field: str | None = opt(
        None, ROWS, "With --ids-field: the field of labels (ints, -100 where not learned), one "
        "per id, carried into the labels column.", show_default=False,
    )  # fmt: skip
    loss_mask_field: str | None = opt(
        None, ROWS, "With --ids-field: the field of a 0/1 mask per id (1: learned), instead of "
        "--labels-field.", show_default=False,
    )  # fmt: skip
    vocab_size: int | None = opt(
        None, ROWS, "With --ids-field: ids must be below this [default: the tokenizer's "
        "vocabulary size].", check=_int_in(1, 1 << 31), corpus=True, show_default=False,
    )  # fmt: skip
    split_on_eos: int | None = opt(
        None, ROWS, "With --ids-field: cut each record into documents after every occurrence "
        "of this id (an EOS-separated stream; the EOS stays with the document before it).",
        check=_int_in(0, (1 << 31) - 1), corpus=True, show_default=False,
    )  # fmt: skip
    pad_to_multiple_of: int | None = opt(
        None, ROWS, "Pad every segment (a document, or a chunk of one) with the pad id to a "
        "multiple of N (2 x context-parallel size for Megatron THD, 16/32/128 for FP8 "
        "kernels); --max-len must be a multiple of N. cu_seqlens are then the padded "
        "boundaries, cu_seqlens_unpadded the real ones; no pad is learned (docs/format.md).",
        check=_int_in(1, MAX_LEN_LIMIT), key=_IF_GIVEN, show_default=False,
        corpus="Pad every segment to a multiple of N as pack would, and report what the "
        "alignment costs (pad tokens, rows) at each max-len; each must be a multiple of N.",
    )  # fmt: skip  # recorded by pipeline._manifest only when given (older packs lack it)
    num_proc: int | None = opt(
        None, RUN, "Tokenizer threads (default: all cores).", check=_int_in(1, MAX_NUM_PROC),
        corpus=True, show_default=False,
    )  # fmt: skip
    tokenizer_backend: str = opt(
        "auto", RUN, "Tokenizer engine: auto (the fast backend suited to the tokenizer, "
        "gigatoken or fastokens, where it loads the file and passes the parity gate, else "
        "Hugging Face tokenizers), hf, fastokens or gigatoken (fail if it cannot). The ids are "
        "the same.", check=_one_of(TOKENIZER_BACKENDS), corpus=True,
    )  # fmt: skip
    check_sample: int = opt(
        0, RUN, "Re-encode about N documents, spread over the inputs, with Hugging Face "
        "tokenizers and stop (writing nothing) if the fast backend gave other ids.",
        check=_int_in(0, MAX_CHECK_SAMPLE),
    )  # fmt: skip
    resume: bool = opt(
        False, RUN, "Continue an interrupted --resume run from its checkpoint, and keep this "
        "run's work if it is interrupted.", flags=("--resume",),
    )  # fmt: skip
    # Work units: each unit is keyed by the plan of units, which holds their count
    units: int | None = opt(
        None, ROWS, "Pack as N work units (FFD inside each), then merge them (docs/cluster.md).",
        check=_int_in(1, MAX_UNITS), key=None, show_default=False,
    )  # fmt: skip  # key: units.plan_units hashes the count into the plan
    unit: int | None = opt(
        None, RUN, "Run only unit I (0-based) of --units, here, without merging (Slurm array, "
        "Kubernetes indexed job); `packtool merge` joins the units.", show_default=False,
    )  # fmt: skip
    engine: str = opt(
        "local", RUN, "Where --units run: local (process pool) or ray.", check=_one_of(ENGINES)
    )
    ray_address: str | None = opt(
        None, RUN, "Ray cluster to join with --engine ray, or auto (default: start a local Ray "
        "instance for the run).", show_default=False,
    )  # fmt: skip
    # With --units: the merge copies the rows into OUT (True) or lists the units' shards
    # where they lie (False); None: copy only for --world-size, which needs a global order
    merge_copy: bool | None = opt(
        None, LAYOUT, "With --units: the merge writes the rows again into OUTPUT (--copy), or "
        "lists the units' shards where they lie (--no-copy) [default: list them, copy only what "
        "--world-size or a changed order needs].", flags=("--copy/--no-copy",),
        show_default=False, merge=Merge(
            "Write the rows again into OUT_DIR (--copy), or list the units' shards where they "
            "lie, writing no row (--no-copy) [default: as given to pack, else list them and "
            "copy only what --world-size or another order than the units' needs].", key="copy"
        ),
    )  # fmt: skip

    def __post_init__(self) -> None:
        for spec in OPTIONS.values():
            value = getattr(self, spec.name)
            if value is not None and spec.check is not None:
                object.__setattr__(self, spec.name, spec.check(spec.flag, value))
        self.layout  # the layout's fields are checked by the record they make  # noqa: B018
        self._check_units()
        self._check_ids()
        self._check_mix()
        self._check_alignment()

    def _check_mix(self) -> None:
        if self.mix is not None and self.unit is not None:
            raise OptionError(
                "--mix is planned over every unit's documents, so one unit cannot run alone: "
                "leave out --unit and run them all with --units N (--engine local or ray)"
            )
        if self.mix is None:
            for name, default in (("tokens", None), ("repeat", True)):
                if getattr(self, name) != default:
                    raise OptionError(
                        f"{OPTIONS[name].flag_for(getattr(self, name))} is for mixtures: give "
                        "--mix W1,W2,... (one weight per input)"
                    )
        if isinstance(self.mix, (list, tuple)):  # library use: the weights as numbers
            object.__setattr__(self, "mix", ",".join(str(w) for w in self.mix))
        elif isinstance(self.mix, numbers.Real) and not isinstance(self.mix, bool):
            object.__setattr__(self, "mix", str(self.mix))  # one input's weight
        elif self.mix is not None and not isinstance(self.mix, str):
            raise OptionError(
                f'mix must be the weights, one per input ("0.5,0.3,0.2" or a list of numbers), '
                f"got {self.mix!r}"
            )
        if self.tokens is not None:
            from .mixture import parse_token_total

            object.__setattr__(self, "tokens", parse_token_total(str(self.tokens)))

    def _check_alignment(self) -> None:
        n = self.pad_to_multiple_of
        if n is not None and self.max_len is not None and self.max_len % n:
            lower, higher = self.max_len // n * n, -(-self.max_len // n) * n
            raise OptionError(
                f"--max-len {self.max_len} is not a multiple of --pad-to-multiple-of {n}: "
                f"use --max-len {higher}" + (f" or {lower}" if lower >= 2 else "")
            )

    @property
    def alignment(self) -> int:
        """The multiple every segment is padded to (``--pad-to-multiple-of``; 1: none)."""
        return self.pad_to_multiple_of or 1

    def _check_ids(self) -> None:
        if self.ids_field is None:
            for name in ("labels_field", "loss_mask_field"):
                if getattr(self, name) is not None:
                    raise OptionError(
                        f"{OPTIONS[name].flag} is for pre-tokenized records: give --ids-field NAME"
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

    def _check_units(self) -> None:
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
        """The options among ``values`` (e.g. a manifest's record); others ignored."""
        return cls(**{k: v for k, v in values.items() if k in OPTIONS})

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
    def row_len(self) -> int:
        """``max_len``, which every pack needs (``stats`` of a corpus takes its lengths apart,
        so the field may be ``None``): the tokens per row, or the one line naming --max-len."""
        if self.max_len is None:
            raise OptionError("--max-len is required: the tokens per row, e.g. --max-len 4096")
        return self.max_len

    @property
    def shard_bytes(self) -> int:
        return self.layout.shard_bytes

    def rows_key(self) -> dict[str, Any]:
        """The options that decide which rows a run packs (what ``--resume`` and work units
        are keyed by): every ``ROWS`` option, but those its callers key by what they loaded
        (the tokenizer, by its sha256) or planned (the count of units); and a ``LAYOUT``
        option whose ``rows_with`` option is given (``seed`` with ``mix``)."""
        out = {}
        for name in _KEYED:
            key, value = OPTIONS[name].key, getattr(self, name)
            if key is _IF_GIVEN and value is None:
                continue
            out[name] = value if key in (_SPELLED, _IF_GIVEN) or value is None else key(value)
        for name in _ROWS_WITH:
            if getattr(self, OPTIONS[name].rows_with) is not None:  # type: ignore[arg-type]
                out[name] = getattr(self, name)
        return out

    def describe(self) -> dict[str, Any]:
        """The manifest's ``options`` (the resolved values of a run; see ``pipeline``): the
        options declared ``recorded``, in declaration order."""
        return {name: getattr(self, name) for name in _RECORDED}

    def changed(self, *names: str) -> list[str]:
        """The flags that give the options among ``names`` (field names) whose values
        differ from the defaults."""
        return [
            OPTIONS[n].flag_for(getattr(self, n))
            for n in names
            if getattr(self, n) != OPTIONS[n].default
        ]


OPTIONS: dict[str, Option] = declarations(PackOptions)
"""Every option, by field name, in declaration order: what each is (:class:`Option`)."""
_KEYED = tuple(n for n, o in OPTIONS.items() if o.changes == ROWS and o.key is not None)
_ROWS_WITH = tuple(n for n, o in OPTIONS.items() if o.rows_with is not None)
_RECORDED = tuple(n for n, o in OPTIONS.items() if o.recorded)
RECORDED_ROWS = tuple(n for n in _RECORDED if OPTIONS[n].changes == ROWS)
"""The rows options every pack's manifest records (``verify --against`` needs them)."""
CORPUS_OPTIONS = tuple(n for n, o in OPTIONS.items() if o.corpus)
"""The options corpus-mode ``stats`` takes (it reads and tokenizes as ``pack`` would)."""
MERGE_KEYS = tuple(
    key for o in OPTIONS.values() if o.merge is not None and (key := o.merge_key) is not None
)
"""The options ``merge`` takes and records, by its names for them (``copy``: ``merge_copy``)."""
