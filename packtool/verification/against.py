"""``verify --against``: the inputs re-read and re-tokenized as ``pack`` did (the options
the manifest records, the output's copy of the tokenizer), cut into the items ``pack``
stores by the pipeline's own cut (:func:`packtool.packing.cut_items`), and compared with
the rows through a digest per document, then the counts of every outcome with the
manifest's."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BadRecordError, ChatTemplateError, FieldError, FormatError, OptionError
from ..format import (
    CHAT_TEMPLATE_FILE,
    IGNORE_INDEX,
    MANIFEST_FILE,
    ChatTemplateRecord,
    Counts,
    LostChunks,
    Manifest,
    MixtureRecord,
    PackedReader,
    read_lost_chunks,
)
from ..fs import AnyPath, is_url
from ..instruct import InputPlan, InstructEncoder
from ..mixture import take_source
from ..options import RECORDED_ROWS, PackOptions
from ..packing import Overflow, cut_items, split_losses
from ..prepare import choose_tokenizer, prepare
from ..pretokenized import IdsEncoder, IdsTokenizer
from ..readers import InputFile, resolve_inputs
from ..reference import REFERENCES, transformers_encoder
from ..repack import is_pack
from ..tokenize import DocumentEncoder, Tokenizer
from .digest import Digests, digest_terms, group_sums
from .record import RecordCheck
from .report import AgainstReport, Problems, VerifyProgress, first_difference
from .rows import Segments

__all__ = [
    "AgainstPlan",
    "against_digests",
    "against_input_plan",
    "check_against",
    "prepare_against",
]


def _rows_tokens(
    reader: PackedReader, rows_of: np.ndarray, doc: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """The tokens (and labels) of document ``doc`` read back from ``rows_of`` (its rows),
    chunks joined."""
    pieces: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
    for r in sorted(set(rows_of.tolist())):
        row = reader.row(int(r))
        for seg in row.segments:
            if seg.doc_id == doc and seg.chunk_id is not None:
                labels = None if row.labels is None else row.labels[seg.start : seg.end]
                pieces[seg.chunk_id] = (row.input_ids[seg.start : seg.end], labels)
    if not pieces:
        return np.zeros(0, np.int32), None
    ids = np.concatenate([pieces[c][0] for c in sorted(pieces)])
    if any(p[1] is None for p in pieces.values()):
        return ids, None
    return ids, np.concatenate([pieces[c][1] for c in sorted(pieces)])  # type: ignore[misc]


def _resolve_tokenizer(
    reader: PackedReader, tokenizer: Tokenizer | str | os.PathLike[str] | None
) -> Tokenizer:
    from ..tokenize import SpecialTokens

    manifest = reader.manifest
    if tokenizer is None:
        try:
            return reader.load_tokenizer()
        except FormatError as e:
            raise OptionError(f"{e}: pass the tokenizer it was packed with (--tokenizer)") from None
    if isinstance(tokenizer, (str, os.PathLike)):
        tok = choose_tokenizer(PackOptions(tokenizer=str(tokenizer)), text=False)
        special = manifest.tokenizer.special_tokens
        if special is not None:
            own_pad = manifest.tokenizer.pad_from == "tokenizer"  # else the padding's
            tok.special = SpecialTokens(
                eos_id=special.eos_id,
                bos_id=special.bos_id,
                pad_id=special.pad_id if own_pad else tok.special.pad_id,
            )
        return tok
    return tokenizer


@dataclass
class _Expected:
    """One batch of re-tokenized documents after the overflow policy."""

    first: int  # document index of the batch's first record
    lane0: np.ndarray  # digest per record (0 for a record with nothing to pack)
    lane1: np.ndarray
    length: np.ndarray  # tokens packed per record
    tokens: Callable[[int], tuple[np.ndarray, np.ndarray | None]]  # packed ids, labels of i
    label0: np.ndarray | None = None  # digest of the labels per record (labelled ids)
    label1: np.ndarray | None = None
    lost: LostChunks | None = None  # what the repack record must hold of these documents


@dataclass
class AgainstPlan:
    """What re-tokenizing needs, found before any row is read (so mistakes fail fast)."""

    files: list[Any]
    options: PackOptions  # as recorded in the manifest
    overflow: Overflow
    encoder: DocumentEncoder | IdsEncoder | InputPlan  # the plan itself for instruction data
    read: Callable[..., Iterator[Any]]  # the plan's reader: texts, records or ids, as pack read
    labelled: bool = False  # labels (instruction data, pre-tokenized labels) compared too


def _recorded_options(
    reader: PackedReader, parse_special: bool | None, chat_template: AnyPath | None
) -> PackOptions:
    """The options ``pack`` recorded in the manifest, as a :class:`PackOptions`: what
    re-tokenizing needs (``parse_special``, when given, overrides the record). A chat
    template is ``chat_template``, else the file the manifest names if it is still there,
    else the tokenizer's own (checked against the recorded sha256 once loaded)."""
    where = reader.path / MANIFEST_FILE
    recorded = reader.manifest.options
    if any(k not in recorded for k in RECORDED_ROWS):
        raise FormatError(f"{where}: 'options' does not record how the data was packed")
    values = {k: v for k, v in recorded.items() if k != "chat_template"}  # a record, not a path
    if values.get("input_shape") == "chat":
        values["chat_template"] = chat_template or _recorded_template_file(
            reader.manifest.recorded_options.chat_template,
            reader.manifest.tokenizer.name,
            reader.path,
        )
    if values.get("loss_on") == "labels":  # pre-tokenized labels: read from a field
        values.pop("loss_on")
    values.setdefault("parse_special", True)  # packed before the option existed: parsed
    if parse_special is not None:
        values["parse_special"] = parse_special
    values["tokenizer_backend"] = "hf"  # the check stays independent of the fast path
    try:
        options = PackOptions.from_mapping(values)
    except OptionError as e:
        raise FormatError(f"{where}: 'options' are not options of pack: {e}") from None
    if options.overflow is None:
        raise FormatError(f"{where}: 'options' does not record the overflow policy")
    return options


def _recorded_template_file(
    record: ChatTemplateRecord | None,
    tokenizer_name: str | None = None,
    out: AnyPath | None = None,
) -> str | None:
    """The chat template file the manifest names, if it was a file and is still there; for
    a template that came with the tokenizer (its ``tokenizer_config.json`` or
    ``chat_template.jinja``), that file of the tokenizer pack was given, if it is still
    there; else ``None``: the tokenizer's own, of which the output keeps a copy beside its
    ``tokenizer.json`` (its sha256 is checked once loaded)."""
    if record is None:
        return None
    source = record.source
    if source == "file":
        name = record.name
        if isinstance(name, str) and (is_url(name) or Path(name).is_file()):
            return name
    elif source in ("tokenizer_config.json", "chat_template.jinja") and tokenizer_name:
        where = Path(tokenizer_name).expanduser()
        candidate = (where if where.is_dir() else where.parent) / str(source)
        if not is_url(tokenizer_name) and candidate.is_file():
            return str(candidate)
    if source != "tokenizer_config.json" and out is not None:  # the output's copy of it
        copy = out / CHAT_TEMPLATE_FILE
        if copy.is_file():
            return str(copy)
    return None


def _check_template(plan: InputPlan, record: ChatTemplateRecord | None) -> None:
    """Refuse a chat template other than the one the data was packed with: every label
    would differ."""
    if plan.template is None or record is None:
        return
    packed_with = record.sha256
    if packed_with and plan.template.sha256 != packed_with:
        raise OptionError(
            f"--against: the chat template {plan.template.name} (sha256 "
            f"{plan.template.sha256[:12]}...) is not the one the data was packed with "
            f"({record.name}, sha256 {str(packed_with)[:12]}...): pass that one "
            "with --chat-template"
        )


_NOT_ITS_INPUT = (
    "is it an input {} was packed from, unchanged? --against re-reads the inputs given to "
    "pack, in order, as its manifest records them"
)


def prepare_against(
    reader: PackedReader,
    inputs: Sequence[str | os.PathLike[str]],
    tokenizer: Tokenizer | str | os.PathLike[str] | None,
    problems: Problems,
    parse_special: bool | None = None,
    chat_template: AnyPath | None = None,
    reference: str = "file",
) -> AgainstPlan:
    """What re-reading ``inputs`` needs (the recorded options, the files, the tokenizer and
    the input plan), checked against what the manifest recorded before any row is read.
    ``reference="transformers"``: text documents are re-tokenized with transformers'
    ``AutoTokenizer`` for the tokenizer's directory instead of its tokenizer.json."""
    if reference not in REFERENCES:
        raise OptionError(f"--reference must be one of {', '.join(REFERENCES)}; got {reference!r}")
    manifest = reader.manifest
    options = _recorded_options(reader, parse_special, chat_template)
    if _sampled_here(manifest):
        assert manifest.mixture is not None
        files = _mixture_files(manifest, manifest.mixture, inputs)
    else:
        if not inputs:
            inputs = [i.path for i in manifest.inputs]
            if not inputs:
                raise OptionError("--against: no inputs given and none recorded in the manifest")
        files = resolve_inputs(inputs)
        packs = [str(i.path) for i in manifest.inputs if is_pack(i)]
        other = next((f for f in files if not is_pack(f)), None)
        if packs and other is not None:
            raise OptionError(
                f"--against: {reader.path} was repacked from {', '.join(packs)} (a packtool "
                f"output), not from {other.path}: give that pack (or no inputs), and verify "
                "it against its own inputs"
            )
    try:
        input_plan = against_input_plan(reader, files, options, tokenizer, problems)
    except FieldError as e:  # the field the pack read is not there: another input?
        raise FieldError(f"{e} ({_NOT_ITS_INPUT.format(reader.path)})") from None
    instruct = isinstance(input_plan.encoder, InstructEncoder)
    encoder = input_plan if instruct else input_plan.encoder
    if reference == "transformers":
        encoder = transformers_encoder(getattr(encoder, "tokenizer", None), encoder)
    assert isinstance(encoder, (DocumentEncoder, IdsEncoder, InputPlan))
    recorded = [(i.path, i.size_bytes) for i in manifest.inputs]
    if len(files) != len(recorded):
        problems.add(
            "against", f"{len(files)} inputs given, the data was packed from {len(recorded)}"
        )
    for i, (inp, (rec_path, rec_size)) in enumerate(zip(files, recorded, strict=False)):
        if rec_size not in (None, inp.size_bytes):
            problems.add(
                "against",
                f"input {i} ({inp.path}) has {inp.size_bytes} bytes; the manifest recorded "
                f"{rec_size} bytes for {rec_path}: not the same file",
            )
    labelled = (options.ids_field is not None or instruct) and input_plan.labelled
    labelled = labelled and reader.has_labels
    overflow = Overflow(options.overflow)
    return AgainstPlan(files, options, overflow, encoder, input_plan.read, labelled)


def _sampled_here(manifest: Manifest) -> bool:
    """Whether ``manifest`` is of a mixture sampled from its inputs (``pack --mix``), not
    a mixed pack repacked: a repack's input is the pack, whose records are the documents the
    mixture took, each copy under its own doc id, so it is compared record by record."""
    return manifest.mixture is not None and not any(is_pack(i) for i in manifest.inputs)


def _mixture_files(
    manifest: Manifest, mixture: MixtureRecord, inputs: Sequence[str | os.PathLike[str]]
) -> list[InputFile]:
    """The files of a mixture's sources, from ``inputs``: one per source, in the order of
    the sources (none given: the sources as packed). Each input's files are checked, by name
    and size, against those its source was packed from, before any document is read: a
    source given in another's place, or left out, is refused in one line (its documents
    would be numbered as another source's)."""
    sources = mixture.sources
    order = " ".join(s.path for s in sources)
    if not inputs:
        inputs = [s.path for s in sources]
    if len(inputs) != len(sources):
        raise OptionError(
            f"--against: {len(inputs)} input{'s' if len(inputs) != 1 else ''} given for a "
            f"mixture of {len(sources)} sources: give each source, in the order they were "
            f"packed: {order}"
        )
    recorded = list(manifest.inputs)
    bounds = np.cumsum([0, *(s.files for s in sources)]).tolist()
    packed = [
        [(Path(str(r.path)).name, r.size_bytes) for r in recorded[a:b]]
        for a, b in itertools.pairwise(bounds)
    ]
    found = [resolve_inputs([spec]) for spec in inputs]
    for i, (spec, group) in enumerate(zip(inputs, found, strict=True)):
        given = [(Path(str(f.path)).name, f.size_bytes) for f in group]
        if given == packed[i]:
            continue
        other = next((j for j, p in enumerate(packed) if p == given and j != i), None)
        if other is not None:
            raise OptionError(
                f"--against: {spec} is source {other} of the mixture ({sources[other].path}), "
                f"given in the place of source {i} ({sources[i].path}): give the sources in "
                f"the order they were packed: {order}"
            )
        if len(group) != sources[i].files:
            raise OptionError(
                f"--against: {spec} gives {len(group)} file{'s' if len(group) != 1 else ''}, "
                f"source {i} ({sources[i].path}) was packed from {sources[i].files}: give "
                f"the sources in the order they were packed: {order}"
            )
    return [f for group in found for f in group]


def against_input_plan(
    reader: PackedReader,
    files: Sequence[InputFile],
    options: PackOptions,
    tokenizer: Tokenizer | str | os.PathLike[str] | None,
    problems: Problems,
) -> InputPlan:
    """The tokenizer and the input plan the inputs are re-read with, as ``pack`` built them:
    the output's copy of the tokenizer (or ``tokenizer``; for pre-tokenized data packed
    without one, the ids' own), checked against the recorded one, and
    :func:`~packtool.prepare.prepare` over the recorded ``options``, the chat template
    checked against the recorded one. The one place ``--against`` decides how to tokenize."""
    manifest = reader.manifest
    tok: Tokenizer
    if (
        options.ids_field is not None
        and tokenizer is None
        and manifest.tokenizer.name == IdsTokenizer.name
    ):
        eos, bos = manifest.tokenizer.special.eos_id, manifest.tokenizer.special.bos_id
        tok = choose_tokenizer(  # the ids' own stand-in, with the recorded EOS/BOS ids
            options.replace(
                tokenizer=None,
                eos_token=None if eos is None else str(eos),
                bos_token=None if bos is None else str(bos),
            )
        )
    else:
        tok = _resolve_tokenizer(reader, tokenizer)
    _check_tokenizer(tok, manifest, problems)
    try:
        input_plan = prepare(files, options, tokenizer=tok).plan  # as pack built it
    except ChatTemplateError as e:
        recorded = manifest.recorded_options.chat_template
        if options.chat_template is not None or recorded is None:
            raise
        raise ChatTemplateError(
            f"--against: {reader.path} was packed with the chat template {recorded.name}, "
            "which is not found from here (nor a copy in the output): pass it with "
            "--chat-template FILE (a .jinja, or the tokenizer's tokenizer_config.json)"
        ) from e
    _check_template(input_plan, manifest.recorded_options.chat_template)
    return input_plan


def check_against(
    reader: PackedReader,
    plan: AgainstPlan,
    digests: Digests,
    segments: Segments,
    problems: Problems,
    progress: VerifyProgress | None,
) -> AgainstReport:
    """Re-read and re-tokenize the inputs as ``pack`` did; compare digests and counts."""
    started = time.perf_counter()
    files, options = plan.files, plan.options
    doc_seg, _, _, seg_rows, _ = segments.arrays()
    by_doc = np.argsort(doc_seg, kind="stable")
    where = _DocumentRows(doc_seg[by_doc], seg_rows[by_doc])
    counts = Counts()
    labelled = digests.label0 is not None
    compared = 0
    total_bytes = sum(f.size_bytes for f in files)
    bytes_before = 0
    mixture, seed = reader.manifest.mixture, reader.manifest.recorded_options.seed or 0
    mix = _MixtureCheck(mixture, seed) if mixture and _sampled_here(reader.manifest) else None
    record = _record_check(reader, plan, problems)
    try:
        for inp in files:
            for batch in plan.read(
                inp,
                skip_bad_records=options.skip_bad_records,
                split=options.split,
                txt_unit=options.txt_unit,
            ):
                first = counts.documents.read
                expected, c = _expect_batch(
                    batch, first, plan, reader.max_len, labelled, record=record is not None
                )
                counts += c
                n = len(batch.records)
                if record is not None and expected.lost is not None:
                    lost = expected.lost
                    if mixture is not None and mix is None:  # a repacked mixture: its copies'
                        lost = _first_copies(lost, mixture.doc_id_stride)  # record rows once
                    record.compare(lost, first, first + n, problems)
                if mix is None:
                    compared += _compare_batch(reader, plan, digests, expected, n, where, problems)
                else:
                    compared += mix.compare(reader, plan, digests, expected, n, where, problems)
                if progress:
                    progress("against", bytes_before + batch.bytes_done, total_bytes)
            bytes_before += inp.size_bytes
            if mix is not None:
                mix.file_ends.append(counts.documents.read)
    except BadRecordError as e:  # pack read these records without one: another input?
        raise BadRecordError(e.location, e.problem, _NOT_ITS_INPUT.format(reader.path)) from None
    if mix is not None:
        mix.check_plan(digests, problems)
    if record is not None:
        record.finish(counts.documents.read, problems)
    _compare_counts(reader.manifest, digests, counts, problems)
    said = counts.to_record()
    return AgainstReport(
        inputs=[str(f.path) for f in files],
        documents=said["documents"],
        tokens=said["tokens"],
        documents_compared=compared,
        seconds=time.perf_counter() - started,
    )


def _first_copies(lost: LostChunks, stride: int) -> LostChunks:
    """The chunks of ``lost`` (sorted by document) of the documents read, not of their
    copies (doc ids from ``stride`` on): a mixture's repack record holds each document read
    once, its rows going with every copy (docs/format.md)."""
    k = int(np.searchsorted(lost.doc_id, max(1, stride), side="left"))
    end = int(lost.offsets[k])
    return LostChunks(
        lost.doc_id[:k], lost.chunk_id[:k], lost.label[:k], lost.offsets[: k + 1],
        lost.tokens[:end],
    )  # fmt: skip


@dataclass(frozen=True)
class _DocumentRows:
    """The rows of each document: segment document ids (sorted) and the row of each."""

    doc_sorted: np.ndarray
    rows: np.ndarray

    def of(self, doc: int) -> np.ndarray:
        lo = np.searchsorted(self.doc_sorted, doc)
        return self.rows[lo : np.searchsorted(self.doc_sorted, doc, side="right")]


def _compare_batch(
    reader: PackedReader,
    plan: AgainstPlan,
    digests: Digests,
    expected: Any,
    n_records: int,
    where: _DocumentRows,
    problems: Problems,
) -> int:
    """Compare one batch of re-read documents with the rows' digests; returns how many
    documents were compared (those with tokens on either side)."""
    known = digests.length.size  # documents.read of the manifest
    lo, hi = expected.first, min(expected.first + n_records, known)
    if hi <= lo:
        return 0
    w = hi - lo
    wrong = (
        (digests.length[lo:hi] != expected.length[:w])
        | (digests.lane0[lo:hi] != expected.lane0[:w])
        | (digests.lane1[lo:hi] != expected.lane1[:w])
    )
    if digests.label0 is not None and expected.label0 is not None:
        wrong |= digests.label0[lo:hi] != expected.label0[:w]
        wrong |= digests.label1[lo:hi] != expected.label1[:w]  # type: ignore[index]
    bad = np.flatnonzero(wrong)
    problems.count("against", int(bad.size))
    for i in bad[: problems.room()]:
        d = lo + int(i)
        rows_of = where.of(d)
        problems.keep(
            "against",
            _describe_mismatch(reader, d, rows_of, expected.tokens(int(i)), plan.overflow),
            None,
            int(rows_of.min()) if rows_of.size else None,
        )
    return int(np.count_nonzero((expected.length[:w] > 0) | (digests.length[lo:hi] > 0)))


class _MixtureCheck:
    """``--against`` of a mixture: every document the rows hold (each copy under its doc id
    ``d + c * doc_id_stride``) against the tokens document ``d`` of its source gives now;
    then, for each source whose documents all matched, the documents it took against those
    its plan takes from the re-read documents' tokens (:func:`~packtool.mixture.take_source`,
    the recorded seed and target): the sample is the seeded one."""

    def __init__(self, mixture: MixtureRecord, seed: int) -> None:
        self.mixture = mixture
        self.seed = seed
        self.stride = max(1, mixture.doc_id_stride)
        self.lengths: list[np.ndarray] = []  # each re-read document's tokens, batch by batch
        self.file_ends: list[int] = []  # the documents re-read at the end of each input
        self.differ: set[int] = set()  # the sources with a document that differs

    def source_of(self, doc: int) -> Any:
        return next((s for s in self.mixture.sources if s.first_doc <= doc < s.first_doc
                     + s.documents_read), None)  # fmt: skip

    def compare(
        self,
        reader: PackedReader,
        plan: AgainstPlan,
        digests: Digests,
        expected: Any,
        n_records: int,
        where: _DocumentRows,
        problems: Problems,
    ) -> int:
        """Compare the copies of one batch's documents in the rows with the re-read ones;
        returns how many were compared (the copies in the rows)."""
        self.lengths.append(expected.length[:n_records])
        lo, hi = expected.first, min(expected.first + n_records, self.stride)
        if hi <= lo:
            return 0
        compared = 0
        for copy in range(max(1, self.mixture.copies)):
            a = lo + copy * self.stride
            b = min(hi + copy * self.stride, digests.length.size)
            if b <= a:
                break
            w = b - a
            present = digests.length[a:b] > 0  # copies not taken are not in the rows
            wrong = (
                (digests.length[a:b] != expected.length[:w])
                | (digests.lane0[a:b] != expected.lane0[:w])
                | (digests.lane1[a:b] != expected.lane1[:w])
            )
            if digests.label0 is not None and expected.label0 is not None:
                wrong |= digests.label0[a:b] != expected.label0[:w]
                wrong |= digests.label1[a:b] != expected.label1[:w]  # type: ignore[index]
            bad = np.flatnonzero(present & wrong)
            problems.count("against", int(bad.size))
            for i in bad.tolist():
                src = self.source_of(lo + i)
                self.differ.add(-1 if src is None else src.index)
            for i in bad[: problems.room()].tolist():
                doc_id = a + i
                rows_of = where.of(doc_id)
                src = self.source_of(lo + i)
                name = "no source" if src is None else f"source {src.index} ({src.path})"
                copy_of = f"; copy {copy}, doc id {doc_id}" if copy else ""
                problems.keep(
                    "against",
                    f"{name}: "
                    + _describe_mismatch(reader, lo + i, rows_of, expected.tokens(i),
                                         plan.overflow, doc_id=doc_id, copy=copy_of),
                    None,
                    int(rows_of.min()) if rows_of.size else None,
                )  # fmt: skip
            compared += int(np.count_nonzero(present))
        return compared

    def check_plan(self, digests: Digests, problems: Problems) -> None:
        """Each source's documents in the rows (copies counted) against those its plan takes
        from the re-read documents (for the sources whose documents all matched)."""
        in_rows = np.flatnonzero(digests.length > 0)
        packed = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)
        ends = [0, *self.file_ends]
        bounds = np.cumsum([0, *(s.files for s in self.mixture.sources)]).tolist()
        for src, (first_file, end_file) in zip(
            self.mixture.sources, itertools.pairwise(bounds), strict=True
        ):
            if src.index in self.differ or -1 in self.differ or end_file >= len(ends):
                continue
            start, end = ends[first_file], ends[end_file]  # its documents, re-read
            ids = np.flatnonzero(packed[start:end] > 0) + start
            take = take_source(packed[ids], src.target_tokens, seed=self.seed,
                               index=src.index)  # fmt: skip
            lo, hi = src.first_doc, src.first_doc + src.documents_read
            want = ids[take]
            copy = np.arange(want.size) - np.searchsorted(want, want, side="left")
            want = np.sort(want + copy * self.stride)
            read_doc = in_rows % self.stride
            have = in_rows[(read_doc >= lo) & (read_doc < hi)]
            if np.array_equal(want, have):
                continue
            extra = np.setdiff1d(have, want)
            missing = np.setdiff1d(want, have)
            said = []
            if extra.size:
                said.append(f"{extra.size} in the rows that it does not take (the first: "
                            f"{_doc_name(int(extra[0]), self.stride)})")  # fmt: skip
            if missing.size:
                said.append(f"{missing.size} it takes missing from the rows (the first: "
                            f"{_doc_name(int(missing[0]), self.stride)})")  # fmt: skip
            problems.add(
                "against",
                f"source {src.index} ({src.path}): its documents in the rows are not those "
                f"its plan takes from the re-read inputs (seed {self.seed}, "
                f"{src.target_tokens:,} tokens): " + "; ".join(said),
            )


def _doc_name(doc_id: int, stride: int) -> str:
    copy = doc_id // stride
    return f"document {doc_id % stride}" + (f" copy {copy} (doc id {doc_id})" if copy else "")


_DIFFER = {
    "documents": "the inputs give {} documents {}, the manifest says {}",
    "labels": "the inputs give {} {}, the manifest says {}",
    "tokens": "re-reading the inputs gives {} tokens {}, the manifest says {}",
}


def _compare_counts(
    manifest: Manifest, digests: Digests, counts: Counts, problems: Problems
) -> None:
    """The inputs' counts (documents, tokens, labels) against the manifest's, each section
    by its names; documents in the rows beyond the end of the inputs."""
    read = counts.documents.read
    mixture = manifest.mixture
    stride = max(1, mixture.doc_id_stride) if mixture is not None else None
    if stride is None:
        beyond = np.flatnonzero(digests.length[read:] > 0) + read
    else:  # a mixture's copies are numbered past the documents read
        in_rows = np.flatnonzero(digests.length > 0)
        beyond = in_rows[in_rows % stride >= read]
    problems.count("against", int(beyond.size))
    for d in beyond[: problems.room()]:
        doc = int(d) if stride is None else int(d) % stride
        problems.keep(
            "against",
            f"document {doc} ({manifest.locate_document(doc)}) is in the rows, but "
            f"the inputs end after {read} documents",
            None,
            None,
        )
    recorded = {
        "documents": manifest.documents,  # None unless recorded whole
        "labels": manifest.labels,
        "tokens": manifest.tokens,
    }
    for section, ours in counts.to_record().items():
        theirs = recorded[section]
        if section == "documents" and theirs is None:
            continue  # not recorded: the manifest's own check says so
        if section == "tokens" and mixture is not None:
            # a mixture's rows hold the documents taken, each compared above: their tokens
            # are not those of every document read
            ours = {k: v for k, v in ours.items() if k not in ("packed", "learned")}
        for key, value in ours.items():
            said = getattr(theirs, key, None)
            if said != value and (section == "documents" or said is not None):
                what = key.replace("_", " ")
                problems.add("against", _DIFFER[section].format(value, what, said))


def _check_tokenizer(tok: Tokenizer, manifest: Manifest, problems: Problems) -> None:
    if manifest.tokenizer.sha256 not in (None, tok.sha256):
        problems.add(
            "against",
            f"the tokenizer {tok.name} (sha256 {tok.sha256[:12]}...) is not the one the data "
            f"was packed with (sha256 {str(manifest.tokenizer.sha256)[:12]}...)",
        )
    special = manifest.tokenizer.special_tokens
    if special is not None:
        for key, value, recorded in (
            ("eos_id", tok.special.eos_id, special.eos_id),
            ("bos_id", tok.special.bos_id, special.bos_id),
        ):
            if recorded != value:
                problems.add(
                    "against",
                    f"the tokenizer's {key} is {value}, the data was packed with {recorded}",
                )


def _expect_batch(
    batch: Any, first: int, plan: AgainstPlan, max_len: int, labelled: bool, record: bool = False
) -> tuple[_Expected, Counts]:
    """Encode one batch as ``pack`` does, cut it into the items ``pack`` stores (the
    pipeline's own cut, :func:`~packtool.packing.cut_items`), count the outcomes, and digest
    what would be packed (``first``: the number of its first document; ``labelled``: the
    labels too, they are compared; ``record``: what the repack record holds of the batch
    too, derived as ``pack`` derives it)."""
    encoder = plan.encoder
    if isinstance(encoder, InputPlan):  # instruction records: rendered, tokenized
        encoded = encoder.finish(encoder.tokenize(batch, plan.options.skip_bad_records))
        good = np.array([i for i, r in enumerate(batch.records) if r is not None], np.int64)
    elif isinstance(encoder, IdsEncoder):  # pre-tokenized: the ids as read, compared directly
        encoded, good = encoder.finish(batch), batch.good
    else:
        good = np.array([i for i, t in enumerate(batch.texts) if t is not None], np.int64)
        encoded = encoder.encode([batch.texts[i] for i in good])
    n = len(batch.records)  # after tokenizing: --chat-turns each makes a chat one per turn
    doc, chunk, item_len, counts, labels = cut_items(
        encoded.lengths, encoded.empty, encoded.labels, max_len, plan.overflow, ignore=IGNORE_INDEX
    )
    # the records a template failed on are bad records, with those the reader skipped
    counts = counts.add_documents(n - good.size, len(batch.bad))
    items = _Items(encoded.ids, encoded.offsets, doc, chunk, item_len, max_len)
    expected = _digest_items(items, labels if labelled else None, good, first, n)
    if record and encoded.labels is not None and plan.overflow is Overflow.SPLIT:
        expected.lost = _lost_of(encoded, max_len, doc, chunk, first + good)
    return expected, counts


def _lost_of(
    encoded: Any, max_len: int, doc: np.ndarray, chunk: np.ndarray, doc_ids: np.ndarray
) -> LostChunks:
    """What a labelled split pack's repack record holds of one encoded batch (its items
    ``doc``, ``chunk``; ``doc_ids``: each encoded document's number), as the pipeline's sink
    derives it (:func:`~packtool.packing.split_losses`, from the labels as read)."""
    l_doc, l_chunk, l_start, l_len, l_label = split_losses(
        encoded.lengths, encoded.empty, encoded.labels, max_len, doc, chunk, ignore=IGNORE_INDEX
    )
    lengths = l_len.astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    at = np.repeat(l_start - offsets[:-1], lengths) + np.arange(int(offsets[-1]), dtype=np.int64)
    return LostChunks(
        doc_ids[l_doc].astype(np.int64), l_chunk, l_label, offsets, encoded.ids[at]
    ).sorted()


def _record_check(
    reader: PackedReader, plan: AgainstPlan, problems: Problems
) -> RecordCheck | None:
    """The check of a labelled split pack's repack record, if it has one that can be read
    (one that cannot is the files check's problem, :mod:`.rows`)."""
    manifest = reader.manifest
    if plan.overflow is not Overflow.SPLIT or not reader.has_labels:
        return None
    if not manifest.repack_files:
        problems.report.notes.append(
            "no repack record (a labelled split pack made before it): the chunks' first "
            "labels and the chunks with nothing to learn are not compared"
        )
        return None
    try:
        record = read_lost_chunks(reader.path, manifest.repack_files)
    except FormatError:
        problems.report.notes.append(
            "--against: the repack record was not compared with the inputs (it cannot be read)"
        )
        return None
    return RecordCheck(manifest, record, manifest.repack_files)


@dataclass(frozen=True)
class _Items:
    """The items of one encoded batch, as ``pack`` stores them: item ``k`` is chunk
    ``chunk[k]`` of encoded document ``doc[k]``, ``length[k]`` tokens of ``ids`` from
    ``offsets[doc[k]] + chunk[k] * max_len``."""

    ids: np.ndarray
    offsets: np.ndarray
    doc: np.ndarray
    chunk: np.ndarray
    length: np.ndarray
    max_len: int

    def at(self, keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(index in ``ids``, position in its document) of every token of the items (of the
        items ``keep``), item by item."""
        doc, chunk, length = self.doc, self.chunk, self.length
        if keep is not None:
            doc, chunk, length = doc[keep], chunk[keep], length[keep]
        starts = np.cumsum(length) - length
        inner = np.arange(int(length.sum())) - np.repeat(starts, length)
        position = np.repeat(chunk.astype(np.int64) * self.max_len, length) + inner
        return np.repeat(self.offsets[doc], length) + position, position


def _digest_items(
    items: _Items, labels: np.ndarray | None, good: np.ndarray, first: int, n: int
) -> _Expected:
    """The digests and token counts per record of a batch of ``n`` records (``good``: those
    encoded, in order) from its items; ids and, given ``labels``, labels."""
    at, position = items.at()
    lanes = [*digest_terms(items.ids[at], position)]
    if labels is not None:
        lanes += digest_terms(labels[at], position)
    sums = [np.zeros(n, np.uint64) for _ in lanes]
    length = np.zeros(n, np.int64)
    doc, item_len = items.doc, items.length
    if doc.size:
        starts = np.cumsum(item_len) - item_len
        opens = np.concatenate([[True], doc[1:] != doc[:-1]]) & (item_len > 0)
        for target, terms in zip(sums, lanes, strict=True):
            target[good[doc[opens]]] = group_sums(terms, starts[opens])
        length[good] = np.bincount(doc, weights=item_len, minlength=good.size).astype(np.int64)
    where = np.full(n, -1, np.int64)
    where[good] = np.arange(good.size)

    def packed(i: int) -> tuple[np.ndarray, np.ndarray | None]:
        take = doc == where[i] if where[i] >= 0 else np.zeros(doc.size, bool)
        if not take.any():
            return np.zeros(0, np.int32), None
        idx, _ = items.at(take)
        return items.ids[idx], None if labels is None else labels[idx]

    label0, label1 = (sums[2], sums[3]) if labels is not None else (None, None)
    return _Expected(first, sums[0], sums[1], length, packed, label0, label1)


def _describe_mismatch(
    reader: PackedReader,
    doc: int,
    rows_of: np.ndarray,
    wanted: tuple[np.ndarray, np.ndarray | None],
    overflow: Overflow,
    *,
    doc_id: int | None = None,
    copy: str = "",
) -> str:
    """What differs between document ``doc`` in the rows (under ``doc_id``: a mixture's copy,
    named by ``copy``) and its re-read tokens."""
    where = f"document {doc} ({reader.manifest.locate_document(doc)}{copy})"
    doc = doc if doc_id is None else doc_id
    expected, expected_labels = wanted
    if expected.size == 0:
        return f"{where} is in the rows, but re-reading the inputs gives nothing to pack for it"
    if rows_of.size == 0:
        return f"{where} is missing from the rows ({expected.size} tokens expected)"
    try:
        actual, actual_labels = _rows_tokens(reader, rows_of, doc)
    except FormatError:
        return f"{where}: its tokens differ from the re-tokenized input"
    if actual.size != expected.size:
        return (
            f"{where} has {actual.size} tokens in the rows, {expected.size} after "
            f"re-tokenizing the input (overflow {overflow.value})"
        )
    compared = [("token", actual, expected, "after re-tokenizing")]
    if expected_labels is not None and actual_labels is not None:
        compared.append(("label", actual_labels, expected_labels, "from the input"))
    for what, ours, theirs, how in compared:
        problem = first_difference(what, ours, "the rows", theirs, how)
        if problem:
            return f"{where}: {problem}"
    return f"{where}: its chunks are numbered or placed differently from a split of the input"


def against_digests(reader: PackedReader, read: int | None, labelled: bool) -> Digests:
    """Empty digests of the ``read`` documents, filled from the rows, then compared."""
    if read is None:
        raise FormatError(
            f"{reader.path / MANIFEST_FILE}: no documents.read count: cannot compare with the "
            "inputs"
        )
    digests = Digests(
        np.zeros(read, np.uint64), np.zeros(read, np.uint64), np.zeros(read, np.int64)
    )
    if labelled:
        digests.label0, digests.label1 = np.zeros(read, np.uint64), np.zeros(read, np.uint64)
    return digests
