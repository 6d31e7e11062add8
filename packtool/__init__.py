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

from .errors import (
    BadRecordError,
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
from .packing import Overflow, first_fit_decreasing, lower_bound_rows
from .pipeline import DocumentCounts, PackReport, pack
from .tokenize import DocumentEncoder, HFTokenizer, SpecialTokens, Tokenizer, load_tokenizer
from .verify import AgainstReport, Problem, VerifyReport, verify

__all__ = [
    "FORMAT_VERSION",
    "IGNORE_INDEX",
    "AgainstReport",
    "BadRecordError",
    "DocumentCounts",
    "DocumentEncoder",
    "FormatError",
    "HFTokenizer",
    "InputError",
    "OptionError",
    "OutputExistsError",
    "Overflow",
    "PackReport",
    "PackedReader",
    "PackedRow",
    "PacktoolError",
    "Problem",
    "Segment",
    "SpecialTokens",
    "Tokenizer",
    "TokenizerError",
    "VerifyReport",
    "__version__",
    "first_fit_decreasing",
    "load_tokenizer",
    "lower_bound_rows",
    "open_packed",
    "pack",
    "verify",
]
