"""The on-disk format of a packed dataset: the one package that knows how it is laid out.

``pack`` writes through :class:`ShardWriter`; ``stats``, ``inspect``, ``verify``, the exports
and the training side read through :func:`open_packed`; every other module reads the
manifest through :class:`Manifest`'s typed fields. ``docs/format.md`` describes the same
thing for people. One job per module:

- :mod:`.schema`: the table of the packed columns (``COLUMNS``), and what is derived from it:
  the Arrow schema, the `datasets` features, the bytes of a row, the schema check;
- :mod:`.counts`: what a run records: its counts (:class:`Counts`), the run's figures;
- :mod:`.manifest`: :class:`Manifest`, the record parsed into typed fields,
  :func:`read_manifest` and checks;
- :mod:`.records`: the manifest's sub-records as frozen dataclasses (the tokenizer, the
  inputs, the shards, labels, a unit's record, a merge's units...) and the one loader that
  builds them from JSON, strict or lenient;
- :mod:`.output`: the output directory: its names, the checks before writing, durable writes,
  the commit by rename, the copy onto a store, the temporaries of killed runs;
- :mod:`.metadata`: the `datasets` metadata beside the shards, and the files' check;
- :mod:`.writer`: :class:`PackedBatch`, :class:`ShardWriter`, :func:`write_dataset`,
  :func:`commit_in_place`;
- :mod:`.chunks`: the repack record of a labelled pack with split documents (what its rows
  cannot hold: the chunks' first labels, the chunks with nothing to learn);
- :mod:`.cache`: the local cache of shards of an output on a store;
- :mod:`.reader`: :class:`PackedReader`, :func:`open_packed`.
"""

from __future__ import annotations

from .chunks import REPACK_FILE, LostChunks, read_lost_chunks
from .counts import Counts, DocumentCounts, LabelFigures, RunFigures, TokenCounts
from .manifest import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_FILE,
    Manifest,
    ShardEntry,
    read_manifest,
)
from .metadata import CARD_FILE, dataset_card, layout_problems, trainer_cache_files
from .output import (
    CHAT_TEMPLATE_FILE,
    MERGE_STAGE,
    TOKENIZER_CONFIG_FILE,
    check_output_dir,
    check_store_output,
    publish,
    remove_stale_temporaries,
    sha256_file,
    stale_temporaries,
    write_error,
)
from .reader import PackedReader, PackedRow, Segment, open_packed
from .records import (
    BackendRecord,
    BalanceRecord,
    ChatTemplateRecord,
    InputRecord,
    LabelCounts,
    MergedUnits,
    MixtureRecord,
    OptionsRecord,
    PieceRecord,
    SourceRecord,
    SpecialIds,
    TokenizerRecord,
    UnitRecord,
)
from .schema import (
    COLUMNS,
    IGNORE_INDEX,
    Column,
    Per,
    column_names,
    columns,
    hf_features,
    packed_schema,
    row_bytes,
    schema_problem,
    seq_lengths,
)
from .writer import PackedBatch, ShardWriter, commit_in_place, write_dataset

__all__ = [
    "CARD_FILE",
    "CHAT_TEMPLATE_FILE",
    "COLUMNS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "IGNORE_INDEX",
    "MANIFEST_FILE",
    "MERGE_STAGE",
    "REPACK_FILE",
    "TOKENIZER_CONFIG_FILE",
    "BackendRecord",
    "BalanceRecord",
    "ChatTemplateRecord",
    "Column",
    "Counts",
    "DocumentCounts",
    "InputRecord",
    "LabelCounts",
    "LabelFigures",
    "LostChunks",
    "Manifest",
    "MergedUnits",
    "MixtureRecord",
    "OptionsRecord",
    "PackedBatch",
    "PackedReader",
    "PackedRow",
    "Per",
    "PieceRecord",
    "RunFigures",
    "Segment",
    "ShardEntry",
    "ShardWriter",
    "SourceRecord",
    "SpecialIds",
    "TokenCounts",
    "TokenizerRecord",
    "UnitRecord",
    "check_output_dir",
    "check_store_output",
    "column_names",
    "columns",
    "commit_in_place",
    "dataset_card",
    "hf_features",
    "layout_problems",
    "open_packed",
    "packed_schema",
    "publish",
    "read_lost_chunks",
    "read_manifest",
    "remove_stale_temporaries",
    "row_bytes",
    "schema_problem",
    "seq_lengths",
    "sha256_file",
    "stale_temporaries",
    "trainer_cache_files",
    "write_dataset",
    "write_error",
]
