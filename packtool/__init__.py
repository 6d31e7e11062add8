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

__version__ = "0.1.0"

from .chat import ChatTemplate, load_chat_template
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
from .format import (
    FORMAT_VERSION,
    IGNORE_INDEX,
    PackedReader,
    PackedRow,
    Segment,
    open_packed,
)
from .inspect import MaskGrid, RowView, SegmentView, inspect_row, row_mask_grid
from .instruct import InputShape, InstructEncoder, LossOn
from .merge import merge_units
from .order import epoch_order, rank_share
from .packing import Overflow, first_fit_decreasing, lower_bound_rows
from .pipeline import DocumentCounts, PackReport, pack
from .stats import CorpusStats, DatasetStats, PackingStats, corpus_stats, dataset_stats
from .tokenize import DocumentEncoder, HFTokenizer, SpecialTokens, Tokenizer, load_tokenizer
from .units import Unit, UnitResult, plan_units
from .verify import AgainstReport, Problem, VerifyReport, verify

__all__ = [
    "FORMAT_VERSION",
    "IGNORE_INDEX",
    "AgainstReport",
    "BadRecordError",
    "ChatTemplate",
    "ChatTemplateError",
    "CorpusStats",
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
    "verify",
]
