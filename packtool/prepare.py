"""The prepare stage: what a run decides about its inputs once, before any work is done.

``pack``, work units, ``stats`` of a corpus and ``verify --against`` all read inputs the same
way, so they all start here:

- :func:`resolve_options`: the options that follow from the inputs (Megatron inputs are
  ids) and the cross-checks of the pre-tokenized options (``--split-on-eos`` and
  ``--vocab-size`` need ``--ids-field``), in one place;
- :func:`choose_tokenizer`: the tokenizer of a run, chosen in one place: an object given by
  a library user as it is, the stand-in of pre-tokenized data without one, else the file or
  name loaded once, with the fast backend only for text documents (instruction data and ids
  are never encoded by it, so its copy is not even loaded);
- :func:`prepare`: both, plus the input shape (``auto``: from the first record's fields,
  read once) and the :class:`~packtool.instruct.InputPlan` that reads and encodes each input;
- :func:`fingerprint_of`: what the work of a run depends on (the inputs as they are now, the
  tokenizer, the options), the one key of ``pack --resume``'s checkpoint and of ``stats``'
  cached lengths.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .errors import OptionError
from .instruct import InputPlan, InputShape, input_shape, megatron_ids, plan_input
from .options import PackOptions
from .pretokenized import IdsTokenizer
from .readers import InputFile
from .repack import packed_options, packed_tokenizer_name, repack_notice
from .tokenize import Tokenizer, for_corpus, load_tokenizer

__all__ = [
    "Prepared",
    "check_ids_options",
    "choose_tokenizer",
    "fingerprint_of",
    "prepare",
    "resolve_options",
]


def check_ids_options(options: PackOptions) -> None:
    """The options of pre-tokenized data given without ``--ids-field``, refused."""
    if options.ids_field is not None:
        return
    if options.split_on_eos is not None:
        raise OptionError("--split-on-eos cuts pre-tokenized records: give --ids-field NAME")
    if options.vocab_size is not None:  # text: the tokenizer's bounds
        raise OptionError("--vocab-size bounds pre-tokenized ids: give --ids-field NAME")


def resolve_options(files: Sequence[InputFile], options: PackOptions) -> PackOptions:
    """``options`` as the inputs make them (Megatron inputs are ids), checked."""
    options = megatron_ids(files, packed_options(files, options))
    check_ids_options(options)
    return options


def choose_tokenizer(
    options: PackOptions,
    *,
    text: bool = True,
    preload: bool = True,
    corpus_bytes: int | None = None,
) -> Tokenizer:
    """The tokenizer of a run.

    ``text``: the documents are text, so the fast backend may encode them (``auto`` or
    ``fastokens`` start loading it now); otherwise only Hugging Face `tokenizers` is used.
    ``preload=False``: no engine is loaded until a document is encoded (work units, and
    ``stats`` whose lengths may be cached). ``corpus_bytes``: the inputs' uncompressed size,
    if known (``auto`` takes `tokenizers` for a small corpus: ``tokenize.for_corpus``)."""
    spec = options.tokenizer
    if spec is None and options.ids_field is not None:  # pre-tokenized: no tokenizer needed
        return IdsTokenizer(  # type: ignore[return-value]
            eos_token=options.eos_token,
            bos_token=options.bos_token,
            vocab_size=options.vocab_size,
        )
    if spec is None or isinstance(spec, (str, os.PathLike)):
        backend, why = for_corpus(options.tokenizer_backend if text else "hf", corpus_bytes)
        tok = load_tokenizer(
            spec,
            eos_token=options.eos_token,
            bos_token=options.bos_token,
            backend=backend,
            preload=preload and options.ids_field is None,  # ids: nothing to encode
        )
        tok.backend_reason = why
        return tok
    return spec  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Prepared:
    """What the prepare stage decided: the inputs, the options they make, their shape, the
    tokenizer and the plan that reads and encodes them."""

    files: list[InputFile]
    options: PackOptions
    shape: InputShape
    shape_auto: bool  # ``auto`` chose the shape (from the first record's fields)
    tokenizer: Tokenizer
    plan: InputPlan


def prepare(
    files: Sequence[InputFile],
    options: PackOptions,
    *,
    tokenizer: Tokenizer | None = None,
    preload: bool = True,
) -> Prepared:
    """Decide the shape, the tokenizer (``tokenizer``: one already chosen, e.g. the one a
    pack was made with) and the plan of ``files``."""
    files = list(files)
    options = resolve_options(files, options)
    if options.ids_field is not None:
        shape, auto = InputShape.IDS, options.input_shape == "auto"
    else:
        shape, auto = input_shape(files, options)
    if tokenizer is None:
        tokenizer = choose_tokenizer(
            options, text=shape is InputShape.TEXT, preload=preload, corpus_bytes=_size(files)
        )
        name = packed_tokenizer_name(files) if options.tokenizer is not None else None
        if name:  # a repack keeps the pack's copy under the name it was packed with
            tokenizer.name = name
    plan = plan_input(files, tokenizer, options, shape=(shape, auto))
    if options.max_len is not None:  # what a repack cannot give back, said once
        lost = repack_notice(files, options.max_len, plan.overflow.value, options.alignment)
        if lost:
            plan = dataclasses.replace(plan, notice="; ".join(filter(None, [plan.notice, lost])))
    return Prepared(files, options, shape, auto, tokenizer, plan)


def _size(files: Sequence[InputFile]) -> int | None:
    """The inputs' bytes when none is compressed (their text's size); else not known."""
    if any(f.compression for f in files):
        return None
    return sum(f.size_bytes for f in files)


def _input_fingerprint(inp: InputFile) -> list[Any]:
    """An input as it is now: its path, kind, size and modification time; a directory (a
    saved dataset) by the newest of its own and every file's inside, since a file rewritten
    in place does not change the directory's."""
    path = inp.path
    mtime = path.stat().st_mtime_ns
    if isinstance(path, Path) and path.is_dir():
        mtime = max([mtime, *(p.stat().st_mtime_ns for p in path.rglob("*") if p.is_file())])
    return [str(path.resolve()), inp.kind, inp.size_bytes, mtime]


def fingerprint_of(files: Sequence[InputFile], tok: Tokenizer, *parts: Any) -> str:
    """What a run's work depends on, as one hex digest: the inputs as they are now
    (:func:`_input_fingerprint`), the tokenizer (its file's sha256, its special tokens) and
    ``parts`` (the options that decide the work, the input plan)."""
    described = [_input_fingerprint(f) for f in files]
    tokenizer = [tok.sha256, asdict(tok.special)]  # type: ignore[call-overload]
    text = json.dumps([described, tokenizer, parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()
