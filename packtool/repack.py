"""A packed output as an input of ``pack``: its documents rebuilt from their chunks, to be
packed again (another ``--max-len``, ``--world-size``, ``--seed``) without a tokenizer.

A row stores segments: each a document, or chunk ``c`` of one (``doc_ids``, ``chunk_ids``,
``cu_seqlens``). Sorted by (document, chunk) and joined, the segments give back the
documents as the first pack stored them, EOS and BOS included, in ``doc_id`` order::

    row 0 | b0 b0 b0 b0 | a a a |         doc_ids [1, 0]   chunk_ids [0, 0]
    row 1 | b1 b1 | c c c c c |           doc_ids [1, 2]   chunk_ids [1, 0]

    record 0: a a a        record 1: b0 b0 b0 b0 b1 b1        record 2: c c c c c

A document number with no segment (an empty document, a bad record, one dropped by
``--overflow drop``) is an empty record, so the documents keep their numbers. The records
are read as pre-tokenized ids (``input_ids``, and ``labels`` for a labelled pack) with the
pad, EOS and BOS ids, the vocabulary and the overflow policy the manifest records
(:func:`packed_options`); nothing is appended again.

A labelled split pack stores the first token of every chunk after the first with no label (a
pack learns none at a segment start) and leaves out the chunks with nothing to learn; its
repack record (:mod:`packtool.format.chunks`) holds both, and they are joined back: the left-out
chunks as segments of one more block, the labels set on their chunks' first tokens. A mixture
(``pack --mix``) repacks with its sources (:func:`packed_mixture`); each copy of a document
(doc id ``d + c * stride``) gets the record's rows of ``d``.

What a pack never stored cannot come back (:func:`repack_notice` says it): tokens cut by
``--overflow truncate``, documents dropped by ``--overflow drop``, and, in a labelled split pack
made before the repack record, the chunks with nothing to learn and the chunks' first labels.

The reader registers itself in the table of formats (``readers.register``) when this module
is imported (by :mod:`packtool.prepare`, where every command that reads inputs starts): it
reads a packed output, a layer above the readers.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .errors import FormatError, InputError, OptionError
from .format import (
    IGNORE_INDEX,
    MANIFEST_FILE,
    InputRecord,
    LostChunks,
    Manifest,
    MixtureRecord,
    PackedReader,
    open_packed,
    read_lost_chunks,
)
from .fs import AnyPath, StorePath, user_cache_dir
from .options import PackOptions
from .readers import FieldReader, InputFile, Records, Request, Want, register

__all__ = [
    "IDS_FIELD",
    "LABELS_FIELD",
    "PackedDocuments",
    "is_pack",
    "is_packed_output",
    "packed_documents",
    "packed_mixture",
    "packed_options",
    "packed_tokenizer_name",
    "repack_notice",
]

IDS_FIELD = "input_ids"
"""The field a packed output's documents are read as (the column they are stored in)."""
LABELS_FIELD = "labels"
_BATCH_TOKENS = 1 << 22
_UNPADDED = "cu_seqlens_unpadded"  # the real boundaries, where segments are padded to align
_KIND = "packed"


def is_pack(entry: InputFile | InputRecord) -> bool:
    """Whether an input (as read, or as a manifest records it) is a packed output."""
    return entry.kind == _KIND


def is_packed_output(path: AnyPath) -> bool:
    """Whether the directory ``path`` holds a packtool output (its ``manifest.json``)."""
    try:
        return path.is_dir() and (path / MANIFEST_FILE).is_file()
    except OSError:
        return False


@dataclass(frozen=True)
class PackedDocuments:
    """The documents of a packed output, as stored: where each segment lies, sorted by
    (document, chunk).

    Segment ``s`` is tokens ``[pos[s], pos[s] + length[s])`` of block ``block[s]`` (the
    flat ``input_ids`` of one record batch of a shard, memory-mapped). ``starts[d]`` is the
    first segment of the ``d``-th document kept, ``docs[d]`` its number; documents with a
    chunk missing (a labelled split pack leaves out chunks with nothing to learn) are not
    kept: ``gapped`` of them.
    """

    reader: PackedReader
    blocks: list[np.ndarray]
    label_blocks: list[np.ndarray] | None
    block: np.ndarray
    pos: np.ndarray
    length: np.ndarray
    docs: np.ndarray
    starts: np.ndarray
    split_docs: int  # documents stored in more than one chunk (kept ones)
    inner_cuts: np.ndarray  # each kept split document's chunk starts after the first (offsets)
    gapped: int
    first_label: np.ndarray | None = None  # each segment's first label, from the repack record
    exact: bool = False  # the pack's repack record gave back what its rows do not hold

    @property
    def manifest(self) -> Manifest:
        return self.reader.manifest

    @property
    def records(self) -> int:
        """The records read: a number for every document the first pack read (its count,
        else up to the last kept one)."""
        last = int(self.docs[-1]) + 1 if self.docs.size else 0
        return max(last, self.manifest.counts.documents.read)

    @property
    def lengths(self) -> np.ndarray:
        """Each kept document's tokens."""
        return np.add.reduceat(self.length, self.starts[:-1]) if self.docs.size else self.length

    def batches(self, fields: Sequence[str], where: str, size_bytes: int) -> Iterator[Records]:
        """The records, about ``_BATCH_TOKENS`` tokens a batch, as list columns named
        ``fields`` (ids, then labels if asked)."""
        labelled = len(fields) > 1
        if labelled and self.label_blocks is None:
            raise InputError(f"{where}: the pack has no labels column to read labels from")
        total = max(1, self.records)
        doc_len = self.lengths
        ends = np.cumsum(doc_len)
        k = 0  # kept documents done
        record = 0
        while record < self.records:
            if k == self.docs.size:  # documents after the last kept one: empty records
                offsets = pa.array(np.zeros(self.records - record + 1, np.int64))
                empty = pa.array(np.zeros(0, np.int32))
                column = pa.LargeListArray.from_arrays(offsets, empty)
                batch = pa.RecordBatch.from_arrays([column] * len(fields[:2]), list(fields[:2]))
                yield Records(where, size_bytes, batch, row0=record)
                return
            done = int(ends[k - 1]) if k else 0
            stop_k = max(k + 1, int(np.searchsorted(ends, done + _BATCH_TOKENS)))
            stop_k = min(stop_k, self.docs.size)
            stop_record = int(self.docs[stop_k - 1]) + 1
            per_record = np.zeros(stop_record - record, np.int64)
            per_record[self.docs[k:stop_k] - record] = doc_len[k:stop_k]
            offsets = pa.array(np.concatenate([[0], np.cumsum(per_record)]))
            seg = slice(int(self.starts[k]), int(self.starts[stop_k]))
            columns = [pa.LargeListArray.from_arrays(offsets, self._gather(self.blocks, seg))]
            if labelled:
                assert self.label_blocks is not None
                labels = self._gather(self.label_blocks, seg, self.first_label)
                columns.append(pa.LargeListArray.from_arrays(offsets, labels))
            batch = pa.RecordBatch.from_arrays(columns, names=list(fields[:2]))
            yield Records(where, size_bytes * stop_record // total, batch, row0=record)
            k, record = stop_k, stop_record

    def _gather(
        self, blocks: list[np.ndarray], seg: slice, first: np.ndarray | None = None
    ) -> pa.Array:
        """The tokens of segments ``seg`` (consecutive in the sorted order), joined; with
        ``first``, each segment's first value is ``first``'s (a chunk's first label)."""
        block, pos, length = self.block[seg], self.pos[seg], self.length[seg]
        dest = np.concatenate([[0], np.cumsum(length)])
        out = np.empty(int(dest[-1]), np.int32)
        order = np.argsort(block, kind="stable")
        cuts = np.flatnonzero(np.diff(block[order])) + 1
        for group in np.split(order, cuts):
            if not group.size:
                continue
            n = length[group]
            at = np.repeat(dest[group] - np.cumsum(n) + n, n) + np.arange(int(n.sum()))
            shift = np.repeat(pos[group] - dest[group], n)
            out[at] = blocks[int(block[group[0]])][at + shift]
        if first is not None:
            set_first = np.flatnonzero((first[seg] != IGNORE_INDEX) & (length > 0))
            out[dest[set_first]] = first[seg][set_first]
        return pa.array(out)


def _flat(column: pa.Array) -> np.ndarray:
    return np.asarray(column.flatten().to_numpy(zero_copy_only=False))


def _index_batch(
    batch: pa.RecordBatch, max_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(doc, chunk, start in the batch's flat tokens, length) of each document segment."""
    import pyarrow.compute as pc  # 16-25 ms to import: only a repack needs it

    cu = batch.column("cu_seqlens")
    docs = batch.column("doc_ids")
    n_docs = np.asarray(pc.list_value_length(docs).to_numpy(zero_copy_only=False), np.int64)
    n_cu = np.asarray(pc.list_value_length(cu).to_numpy(zero_copy_only=False), np.int64)
    cu_values = _flat(cu).astype(np.int64)
    total = int(n_docs.sum())
    row = np.repeat(np.arange(n_docs.size, dtype=np.int64), n_docs)
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(n_docs) - n_docs, n_docs)
    at = np.repeat(np.cumsum(n_cu) - n_cu, n_docs) + within
    if total and (int(at.max()) + 1 >= cu_values.size or (n_docs >= n_cu).any()):
        raise FormatError("a row holds more doc_ids than segments (run `packtool verify`)")
    start, end = cu_values[at], cu_values[at + 1] if total else cu_values[at]
    if _UNPADDED in batch.schema.names:  # segments padded to a multiple: the real lengths
        column = batch.column(_UNPADDED)
        n_real = np.asarray(pc.list_value_length(column).to_numpy(zero_copy_only=False), np.int64)
        real = _flat(column).astype(np.int64)
        at = np.repeat(np.cumsum(n_real) - n_real, n_docs) + within
        end = start + (real[at + 1] - real[at] if total else real[at])
    doc = _flat(docs).astype(np.int64)
    chunk = _flat(batch.column("chunk_ids")).astype(np.int32)
    return doc, chunk, row * max_len + start, (end - start).astype(np.int32)


def _segments(reader: PackedReader) -> PackedDocuments:
    """Every document segment of ``reader``'s shards, sorted by (document, chunk)."""
    max_len = reader.max_len
    blocks: list[np.ndarray] = []
    label_blocks: list[np.ndarray] | None = [] if reader.has_labels else None
    parts: list[tuple[np.ndarray, ...]] = []
    for shard in range(len(reader.shard_paths)):
        table = reader.shard_table(shard)  # missing, or of another size: one line
        _check_digest(reader, shard)
        for batch in table.to_batches():
            doc, chunk, pos, length = _index_batch(batch, max_len)
            parts.append((doc, chunk, pos, length, np.full(doc.size, len(blocks), np.int32)))
            blocks.append(_flat(batch.column("input_ids")))
            if label_blocks is not None:
                label_blocks.append(_flat(batch.column("labels")))
    lost = _lost_chunks(reader, parts)
    if lost is not None and lost.size:  # the chunks the rows do not hold: one block more
        missing = lost.lengths > 0
        n = int(missing.sum())
        pos = lost.offsets[:-1][missing]
        parts.append((lost.doc_id[missing], lost.chunk_id[missing], pos,
                      lost.lengths[missing], np.full(n, len(blocks), np.int32)))  # fmt: skip
        blocks.append(lost.tokens)
        if label_blocks is not None:
            label_blocks.append(np.full(lost.tokens.size, IGNORE_INDEX, np.int32))
    doc, chunk, pos, length, block = (
        np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, np.int64) for i in range(5)
    )
    order = np.lexsort((chunk, doc))
    doc, chunk, pos, length, block = (a[order] for a in (doc, chunk, pos, length, block))
    first_label = None
    if lost is not None and lost.size and label_blocks is not None:
        width = int(max(chunk.max(initial=0), lost.chunk_id.max(initial=0))) + 1
        key = doc.astype(np.int64) * width + chunk
        at = np.searchsorted(key, lost.doc_id * width + lost.chunk_id)
        found = at < key.size
        found[found] = key[at[found]] == (lost.doc_id * width + lost.chunk_id)[found]
        first_label = np.full(doc.size, IGNORE_INDEX, np.int32)
        first_label[at[found]] = lost.label[found]
    same = (np.diff(doc) == 0) & (np.diff(chunk) == 0)
    if same.any():
        i = int(np.flatnonzero(same)[0])
        raise FormatError(
            f"{reader.path}: document {int(doc[i])} chunk {int(chunk[i])} is stored twice "
            "(run `packtool verify`)"
        )
    first = np.concatenate([[True], np.diff(doc) != 0]) if doc.size else np.zeros(0, bool)
    starts = np.flatnonzero(first)
    rank = np.arange(doc.size) - np.repeat(starts, np.diff(np.append(starts, doc.size)))
    whole = np.ones(starts.size, bool)
    whole[np.unique(np.searchsorted(starts, np.flatnonzero(chunk != rank), "right") - 1)] = False
    if not whole.all():  # a chunk is missing: the document cannot be joined back
        keep_seg = np.repeat(whole, np.diff(np.append(starts, doc.size)))
        doc, chunk, pos, length, block = (a[keep_seg] for a in (doc, chunk, pos, length, block))
        first = first[keep_seg]
        starts = np.flatnonzero(first)
        first_label = first_label[keep_seg] if first_label is not None else None
    n_chunks = np.diff(np.append(starts, doc.size))
    inner = chunk > 0
    doc_start = np.cumsum(length) - length
    inner_cuts = (doc_start - np.repeat(doc_start[starts], n_chunks))[inner]
    return PackedDocuments(
        reader=reader,
        blocks=blocks,
        label_blocks=label_blocks,
        block=block,
        pos=pos,
        length=length,
        docs=doc[starts],
        starts=np.append(starts, doc.size).astype(np.int64),
        split_docs=int(np.count_nonzero(n_chunks > 1)),
        inner_cuts=inner_cuts,
        gapped=int((~whole).sum()),
        first_label=first_label,
        exact=lost is not None,
    )


def _check_digest(reader: PackedReader, shard: int) -> None:
    """A local shard's bytes against the sha256 its manifest records (a store's are checked
    as they are cached): reading a pack for training leaves hashing to ``verify``, but a
    repack writes a new pack, hashed anew, which would pass ``verify`` with whatever changed
    in the shard carried into its rows."""
    from .fs import sha256_of

    path, entry = reader.shard_paths[shard], reader.manifest.shards[shard]
    if isinstance(path, StorePath) or not entry.sha256:
        return
    digest = sha256_of(path)
    if digest != entry.sha256:
        raise FormatError(
            f"{path}: the shard's sha256 is {digest[:12]}..., the manifest records "
            f"{entry.sha256[:12]}...: it was altered since it was packed, and its repack would "
            f"carry what changed; it is a shard of {reader.path} (run `packtool verify`)"
        )


def _lost_chunks(reader: PackedReader, parts: list[tuple[np.ndarray, ...]]) -> LostChunks | None:
    """The pack's repack record (None: it has none), as the rows number documents: in a
    mixture, a document's records go with each copy of it the rows hold (doc ids ``d + c *
    stride``), and those of a document the mixture did not take are not read."""
    m = reader.manifest
    if not m.repack_files:
        return None
    lost = read_lost_chunks(reader.path, m.repack_files)
    if m.mixture is None or not lost.size:
        return lost
    stride = m.mixture.doc_id_stride
    in_rows = np.unique(np.concatenate([p[0] for p in parts])) if parts else np.zeros(0, np.int64)
    read_doc = in_rows % stride
    order = np.argsort(read_doc, kind="stable")
    read_doc, in_rows = read_doc[order], in_rows[order]
    lo = np.searchsorted(read_doc, lost.doc_id, "left")
    n = np.searchsorted(read_doc, lost.doc_id, "right") - lo  # copies of each record's doc
    row = np.repeat(np.arange(lost.size), n)
    copy = np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
    lengths = lost.lengths[row].astype(np.int64)
    starts = lost.offsets[:-1][row]
    at = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return LostChunks(
        in_rows[copy],
        lost.chunk_id[row],
        lost.label[row],
        np.concatenate([[0], np.cumsum(lengths)]),
        lost.tokens[at + np.arange(int(lengths.sum()), dtype=np.int64)],
    ).sorted()


@functools.lru_cache(maxsize=4)
def _documents(where: str, shards: tuple[str, ...]) -> PackedDocuments:
    return _segments(_open(where))


def _open(where: str) -> PackedReader:
    from .fs import as_path

    path = as_path(where)
    cache = user_cache_dir() / "shards" if isinstance(path, StorePath) else None
    return open_packed(path, cache_dir=cache)


def packed_documents(path: AnyPath) -> PackedDocuments:
    """The documents of the packed output at ``path`` (indexed once per process and
    manifest: the options, the notice and the read share it)."""
    manifest = _open(str(path)).manifest
    files = [*manifest.shards, *manifest.repack_files]
    return _documents(str(path), tuple(s.sha256 or s.file for s in files))


class PackedInput(FieldReader):
    """A packtool output (a directory, or a store prefix, holding ``manifest.json``): its
    documents rebuilt from their chunks, as token ids (and labels)."""

    kind = _KIND
    suffixes = ()
    gives = frozenset({Want.IDS})
    ids_field = IDS_FIELD

    def claims(self, path: AnyPath) -> bool:
        return is_packed_output(path)

    def read(self, inp: InputFile, request: Request) -> Iterator[Records]:
        if request.want is not Want.IDS:
            raise self.refusal(inp, request.want)
        return packed_documents(inp.path).batches(request.fields, str(inp.path), inp.size_bytes)

    def first_fields(self, inp: InputFile, split: str | None) -> list[str] | None:
        labelled = _open(str(inp.path)).has_labels
        return [IDS_FIELD, LABELS_FIELD] if labelled else [IDS_FIELD]

    def refusal(self, inp: InputFile, want: Want) -> Exception:
        return InputError(
            f"{inp.path}: a packtool output holds token ids: it is repacked as they are "
            "(no text or records to read)"
        )

    def input_file(self, path: AnyPath, compression: str | None) -> InputFile:
        size = sum(s.bytes or 0 for s in _open(str(path)).manifest.shards)
        return InputFile(path, self.kind, None, size)


READER = register(PackedInput())


def _packs(files: Sequence[InputFile]) -> list[InputFile]:
    packs = [f for f in files if f.kind == _KIND]
    if packs and len(packs) != len(files):
        other = next(f for f in files if f.kind != _KIND)
        raise OptionError(
            f"{packs[0].path} is a packed output and {other.path} is not: repack packed "
            "outputs alone (their documents are token ids, numbered as they were packed)"
        )
    return packs


def packed_mixture(files: Sequence[InputFile]) -> MixtureRecord | None:
    """The mixture of a mixed pack (``pack --mix``) being repacked, carried to the repack
    (its ``source_ids`` and ``mixture`` record), or None. A mixture repacks alone: its doc
    ids (copies ``d + c * stride``) and source ids number its own documents."""
    packs = _packs(files)
    mixtures = [_open(str(f.path)).manifest.mixture for f in packs]
    mixed = [f for f, m in zip(packs, mixtures, strict=True) if m is not None]
    if mixed and len(packs) > 1:
        raise OptionError(
            f"{mixed[0].path} is a mixture (pack --mix): repack it alone (its doc ids and "
            "source ids number its own documents)"
        )
    return mixtures[0] if mixed else None


def packed_options(files: Sequence[InputFile], options: PackOptions) -> PackOptions:
    """``options`` for repacking ``files`` when they are packed outputs (else as given): their
    ids (and labels) read as pre-tokenized records, with the pad, EOS and BOS ids, the
    vocabulary and the overflow policy their manifests record; nothing appended again."""
    packs = _packs(files)
    if not packs or options.ids_field == IDS_FIELD:  # none, or resolved already
        return options
    manifests = [_open(str(f.path)).manifest for f in packs]
    first = manifests[0]

    def same(what: str, values: list[object]) -> object:
        if len(set(values)) > 1:
            raise OptionError(
                f"{packs[0].path} and {packs[values.index(values[-1])].path} differ in {what}: "
                "repack packed outputs that were packed alike"
            )
        return values[0]

    labelled = same("labels", [m.has_labels for m in manifests])
    same("tokenizer", [m.tokenizer.sha256 for m in manifests])
    given = options.changed(
        "tokenizer", "ids_field", "labels_field", "loss_mask_field", "split_on_eos", "loss_on",
        # how records are read and rendered: a pack's documents are ids already (these were
        # ignored, silently)
        "input_shape", "text_field", "prompt_field", "completion_field", "messages_field",
        "chat_template", "chat_turns", "learn_reasoning", "parse_special",
    )  # fmt: skip
    if given:
        raise OptionError(
            f"{given[0]} does not apply to a packed output: its documents are token ids "
            f"(and labels) as {packs[0].path} stores them"
        )
    if options.add_eos or options.bos:
        raise OptionError(
            f"{'--eos' if options.add_eos else '--bos'}: the documents of {packs[0].path} hold "
            "the EOS and BOS they were packed with already"
        )
    overflow = same("--overflow", [m.recorded_options.overflow for m in manifests])
    special, vocab = first.tokenizer.special, first.tokenizer.vocab_size
    eos, bos = special.eos_id, special.bos_id
    # the pack's copy of its tokenizer (if it kept one): the repack keeps it too, as
    # `pack --ids-field --tokenizer` does, so that it decodes and loads as the pack did
    kept = _tokenizer_copy(packs[0].path, first)
    return options.replace(
        input_shape="auto",
        ids_field=IDS_FIELD,
        labels_field=LABELS_FIELD if labelled else None,
        add_eos=False,
        bos=False,
        eos_token=options.eos_token if options.eos_token is not None else _str(eos),
        bos_token=options.bos_token if options.bos_token is not None else _str(bos),
        pad_id=options.pad_id if options.pad_id is not None else special.pad_id,
        tokenizer=kept,
        vocab_size=None if kept else (options.vocab_size if options.vocab_size else vocab),
        overflow=options.overflow if options.overflow is not None else overflow,
    )


def packed_tokenizer_name(files: Sequence[InputFile]) -> str | None:
    """The name of the tokenizer the packed outputs among ``files`` were packed with, which
    their repack keeps with the copy (not the directory it is read from); None: no packs."""
    packs = _packs(files)
    return _open(str(packs[0].path)).manifest.tokenizer.name if packs else None


def _tokenizer_copy(path: AnyPath, manifest: Manifest) -> str | None:
    """The directory holding the copy of the tokenizer the pack at ``path`` keeps (itself),
    if it keeps one and the copy is the one it was packed with; else None."""
    from .fs import sha256_of

    name = manifest.tokenizer.file
    if name is None or manifest.tokenizer.sha256 is None:
        return None
    try:
        digest = sha256_of(path / name)
    except OSError:
        return None
    return str(path) if digest == manifest.tokenizer.sha256 else None


def _label_notes(path: AnyPath, docs: PackedDocuments, max_len: int, overflow: str) -> list[str]:
    """What a labelled pack lost of its labels that a repack at ``max_len`` would learn."""
    m = docs.manifest
    counts = m.labels
    if docs.label_blocks is None or counts is None or docs.exact:
        return []
    old, without = m.max_len, counts.documents_without_labels or 0
    said = []
    if m.recorded_options.overflow == "split":
        cuts = docs.inner_cuts
        if overflow != "split":  # only the first max_len tokens of a document are kept
            cuts = cuts[cuts < max_len]
        unknown = int(np.count_nonzero(cuts % max_len))
        moved = old % max_len != 0  # some old chunk starts are inside new segments
        if unknown or (moved and without):
            also = (
                f"; of the {_n(without, 'document')} it left out with nothing to learn, any "
                "whose learned tokens were only such first tokens is not in it"
                if moved and without
                else ""
            )
            said.append(
                f"{path} was packed with --overflow split and labels, and a chunk's first token "
                f"keeps no label (a pack learns none at a segment start): at --max-len "
                f"{max_len}, {_n(unknown, 'such token')} of its "
                f"{_n(docs.split_docs, 'split document')} are inside a segment, and the "
                f"repack learns them not{also}"
            )
    elif m.recorded_options.overflow == "truncate" and max_len > old and without:
        said.append(
            f"{path} left out {_n(without, 'document')} with nothing to learn in their first "
            f"{old} tokens (--overflow truncate): any with learned tokens after those is not "
            "in it"
        )
    return said


def _n(count: int, what: str) -> str:
    return f"{count:,} {what}{'' if count == 1 else 's'}"


def _str(value: int | None) -> str | None:
    return None if value is None else str(value)


def repack_notice(
    files: Sequence[InputFile], max_len: int, overflow: str, alignment: int = 1
) -> str | None:
    """What a repack of ``files`` at ``max_len`` cannot give back of the original
    documents, or of their layout (an aligned pack repacked without ``alignment``), in one
    line (``None``: nothing; the repack equals a fresh pack of them)."""
    said: list[str] = []
    for f in _packs(files):
        docs = packed_documents(f.path)
        m = docs.manifest
        old, counts = m.max_len, m.counts.documents
        if m.pad_to_multiple_of > 1 and alignment == 1:
            said.append(
                f"{f.path} was packed with --pad-to-multiple-of {m.pad_to_multiple_of}; this "
                "repack's segments are not aligned (pass --pad-to-multiple-of "
                f"{m.pad_to_multiple_of} again for context parallelism or FP8)"
            )
        if max_len > old and counts.truncated:
            said.append(
                f"{f.path} cut {counts.truncated:,} documents to --max-len {old} when it was "
                f"packed (--overflow truncate): their {m.counts.tokens.truncated_away:,} cut "
                f"tokens are not in it, so they stay cut at --max-len {max_len}"
            )
        if max_len > old and counts.dropped:
            said.append(
                f"{f.path} dropped {counts.dropped:,} documents longer than --max-len {old} "
                f"when it was packed (--overflow drop): they are not in it, so the repack "
                "cannot pack them"
            )
        # (a pack with a repack record gives back what its rows do not hold: nothing to say)
        if not docs.exact and m.dropped_label_chunks and (docs.gapped or old % max_len):
            # (at a divisor of the old max_len, the fresh pack drops those chunks too)
            gapped = (
                f"the {docs.gapped:,} missing one before their last are left out, the others "
                "are repacked without their last chunks"
                if docs.gapped
                else "they are repacked without their last chunks"
            )
            said.append(
                f"{f.path} left out {_n(m.dropped_label_chunks, 'chunk')} with nothing to "
                f"learn when it was packed (--overflow split with labels), so the documents "
                f"they were cut from are not whole: {gapped}"
            )
        said += _label_notes(f.path, docs, max_len, overflow)
    return "; ".join(said) or None
