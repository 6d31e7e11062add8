"""packtool: offline sequence packing for LLM training data.

Pack a tokenized corpus into fixed-length rows with first-fit-decreasing, each row carrying
per-document ``position_ids`` (restarting at 0) and ``cu_seqlens`` (document boundaries), so
training code builds FlashAttention varlen inputs or a block-diagonal mask without
recomputing anything::

    import packtool

    report = packtool.pack(["corpus.jsonl"], "out/", max_len=4096)
    print(report.rows, f"{report.efficiency:.1%}")

    ds = packtool.open_packed("out/")
    row = ds[0]          # input_ids, position_ids, cu_seqlens, num_tokens, doc_ids, ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__

# Public name -> the module that defines it. Nothing is imported until a name is used (PEP 562),
# so `import packtool` and `packtool --help` load no heavy subsystem.
_EXPORTS: dict[str, str] = {
    "AgainstReport": "verification",
    "BadRecordError": "errors",
    "ChatTemplate": "chat",
    "ChatTemplateError": "errors",
    "CorpusStats": "stats",
    "Counts": "counts",
    "DatasetStats": "stats",
    "DocumentCounts": "counts",
    "DocumentEncoder": "tokenize",
    "FORMAT_VERSION": "format",
    "FormatError": "errors",
    "HFTokenizer": "tokenize",
    "IGNORE_INDEX": "format",
    "InputError": "errors",
    "InputShape": "instruct",
    "InstructEncoder": "instruct",
    "LossOn": "instruct",
    "MaskGrid": "inspect",
    "OptionError": "errors",
    "OutputExistsError": "errors",
    "Overflow": "packing",
    "PackReport": "pipeline",
    "PackedReader": "format",
    "PackedRow": "format",
    "PackingStats": "stats",
    "PacktoolError": "errors",
    "Problem": "verification",
    "RowView": "inspect",
    "Segment": "format",
    "SegmentView": "inspect",
    "SpecialTokens": "tokenize",
    "Tokenizer": "tokenize",
    "TokenizerError": "errors",
    "Unit": "units",
    "UnitResult": "units",
    "UnitsReport": "engines",
    "VerifyReport": "verification",
    "corpus_stats": "stats",
    "dataset_stats": "stats",
    "epoch_order": "order",
    "first_fit_decreasing": "packing",
    "inspect_row": "inspect",
    "load_chat_template": "chat",
    "load_tokenizer": "tokenize",
    "lower_bound_rows": "packing",
    "merge_units": "merge",
    "open_packed": "format",
    "pack": "pipeline",
    "pack_units": "engines",
    "plan_units": "units",
    "rank_share": "order",
    "row_mask_grid": "inspect",
    "stats_page": "stats_html",
    "verify": "verification",
}

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from .chat import ChatTemplate, load_chat_template
    from .counts import Counts, DocumentCounts
    from .engines import UnitsReport, pack_units
    from .errors import (
        BadRecordError,
        ChatTemplateError,
        FormatError,
        InputError,
        OptionError,
        OutputExistsError,
        PacktoolError,
        TokenizerError,
    )
    from .format import FORMAT_VERSION, IGNORE_INDEX, PackedReader, PackedRow, Segment, open_packed
    from .inspect import MaskGrid, RowView, SegmentView, inspect_row, row_mask_grid
    from .instruct import InputShape, InstructEncoder, LossOn
    from .merge import merge_units
    from .order import epoch_order, rank_share
    from .packing import Overflow, first_fit_decreasing, lower_bound_rows
    from .pipeline import PackReport, pack
    from .stats import CorpusStats, DatasetStats, PackingStats, corpus_stats, dataset_stats
    from .stats_html import stats_page
    from .tokenize import DocumentEncoder, HFTokenizer, SpecialTokens, Tokenizer, load_tokenizer
    from .units import Unit, UnitResult, plan_units
    from .verification import AgainstReport, Problem, VerifyReport, verify


__all__ = [
    "FORMAT_VERSION",
    "IGNORE_INDEX",
    "AgainstReport",
    "BadRecordError",
    "ChatTemplate",
    "ChatTemplateError",
    "CorpusStats",
    "Counts",
    "DatasetStats",
    "DocumentCounts",
    "DocumentEncoder",
    "FormatError",
    "HFTokenizer",
    "InputError",
    "InputShape",
    "InstructEncoder",
    "LossOn",
    "MaskGrid",
    "OptionError",
    "OutputExistsError",
    "Overflow",
    "PackReport",
    "PackedReader",
    "PackedRow",
    "PackingStats",
    "PacktoolError",
    "Problem",
    "RowView",
    "Segment",
    "SegmentView",
    "SpecialTokens",
    "Tokenizer",
    "TokenizerError",
    "Unit",
    "UnitResult",
    "UnitsReport",
    "VerifyReport",
    "__version__",
    "corpus_stats",
    "dataset_stats",
    "epoch_order",
    "first_fit_decreasing",
    "inspect_row",
    "load_chat_template",
    "load_tokenizer",
    "lower_bound_rows",
    "merge_units",
    "open_packed",
    "pack",
    "pack_units",
    "plan_units",
    "rank_share",
    "row_mask_grid",
    "stats_page",
    "verify",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'packtool' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
