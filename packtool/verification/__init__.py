"""``verify``: check that a packed dataset is whole and right, row by row.

What is checked (docs/verify.md says the same for people):

- the manifest: its counts add up (``documents.read`` is the sum of the outcomes, rows and
  tokens agree with ``lower_bound_rows`` and the shards, the inputs' ``first_doc`` follow
  each other), and the files it names are there: every shard with the recorded ``bytes`` and
  ``sha256``, the tokenizer copy with its ``sha256``, ``state.json`` listing the same shards;
  no stray ``*.arrow`` file that ``load_dataset("arrow", data_files="out/*.arrow")`` would
  pick up;
- every row of every shard, vectorised with NumPy over blocks of rows::

      input_ids    b b b b b b b b b c c c c c c c a a a a a P P P
      position_ids 0 1 2 3 4 5 6 7 8 0 1 2 3 4 5 6 0 1 2 3 4 0 1 2   restart at every cu
      cu_seqlens   [0, 9, 16, 21, 24]    0 first, rising strictly, max_len last
      num_tokens   21                    == cu_seqlens[len(doc_ids)]; padding after it
      doc_ids      [1, 2, 0]             one per document segment (+1 cu for the padding)

  plus: padding holds ``pad_id`` (labels -100), token ids are inside the vocabulary, a
  document segment shorter than ``max_len`` ends with EOS (when EOS was added), a first
  chunk starts with BOS (under ``--bos``);
- over the whole dataset: every ``(doc_id, chunk_id)`` exactly once, the chunks of a split
  document numbered ``0..k-1`` and all but the last exactly ``max_len`` long, and the
  numbers of rows, segments, tokens and documents (whole, split, truncated) equal the
  manifest's;
- with ``against``: the inputs re-read and re-tokenized with the recorded options and the
  copy of the tokenizer; every document's tokens (after the overflow policy) are in the rows
  exactly once and in order, compared through a 128-bit digest per document, and the counts
  of read, dropped, truncated, empty and skipped documents match the manifest; a labelled
  split pack's repack record holds, chunk by chunk, what the re-read inputs give.

The package: :mod:`.rows` checks what needs only the pack (the manifest, the files, the
rows, the coverage and the counts); :mod:`.against` re-reads the inputs and compares them
with the rows, cutting documents with the pipeline's own cut; :mod:`.record` compares a
repack record with what the re-read inputs give; :mod:`.report` holds the
report and problem types; :mod:`.digest` the per-document digest both sides compute.
:func:`verify` composes them.

``verify`` returns a :class:`VerifyReport`; it raises only when there is nothing to verify
(no manifest, an unknown format version: :class:`~packtool.errors.FormatError`) or the
arguments are wrong. Everything else, a missing or damaged shard included, is a
:class:`Problem` in the report.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import OptionError
from ..format import MANIFEST_FILE, MERGE_STAGE, open_packed, stale_temporaries
from ..fs import as_path
from ..tokenize import Tokenizer
from .against import against_digests, check_against, prepare_against
from .report import AgainstReport, Problem, Problems, VerifyProgress, VerifyReport
from .rows import Rules, check_coverage, check_files, check_manifest, check_shards

__all__ = ["AgainstReport", "Problem", "VerifyProgress", "VerifyReport", "verify"]


def _leftovers(out: Any) -> list[str]:
    """Notes naming what killed runs left beside and inside the output (the next run of the
    command that wrote them removes them) and a merge's unfinished stage."""
    notes = []
    for entry in stale_temporaries(out):
        size = _disk_bytes(entry)
        notes.append(
            f"left by a killed run: {entry} ({size / 1e6:,.1f} MB); the next run writing "
            f"{out.name} removes it, or remove it yourself"
        )
    if isinstance(out, Path) and (out / MERGE_STAGE).is_dir():
        notes.append(
            f"an unfinished merge: {out / MERGE_STAGE} (a merge running now, or killed); "
            "merging again finishes it"
        )
    return notes


def _disk_bytes(entry: Path) -> int:
    if not entry.is_dir() or entry.is_symlink():
        return entry.lstat().st_size
    return sum(p.lstat().st_size for p in entry.rglob("*"))


def verify(
    path: str | os.PathLike[str],
    against: Sequence[str | os.PathLike[str]] | None = None,
    *,
    tokenizer: Tokenizer | str | os.PathLike[str] | None = None,
    max_problems: int = 20,
    progress: VerifyProgress | None = None,
    parse_special: bool | None = None,
    chat_template: str | os.PathLike[str] | None = None,
    reference: str = "file",
) -> VerifyReport:
    """Check the packed dataset at ``path``; with ``against``, also against its inputs.

    >>> report = verify("out/")
    >>> report.ok, report.rows_checked, report.problems[:1]
    (False, 1200, [Problem(shard='data-00001-of-00003.arrow', row=417,
                           what='position_ids[12] is 5, expected 0 ...', check='position_ids')])

    ``against`` lists the inputs given to ``pack`` (files, directories, globs), re-read with
    the options recorded in the manifest and re-tokenized with the copy of the tokenizer in
    the output (or ``tokenizer``: an object, or a path or name as for ``pack``). At most
    ``max_problems`` problems are kept; all are counted (``problems_total``,
    ``problem_counts``). Raises :class:`~packtool.errors.FormatError` when ``path`` is not a
    packtool output (no manifest, an unknown format version).

    Special-token strings in the inputs are re-tokenized as the manifest records
    (``options.parse_special``; a manifest from before that option parsed them); a
    ``parse_special`` given here overrides it.

    Chat records are rendered with ``chat_template``, else the template file the manifest
    names (if it is still there), else the tokenizer's; one whose sha256 is not the recorded
    one is refused. Their labels are compared with the rows', as are prompt/completion ones.

    ``reference="transformers"``: text documents are re-tokenized with transformers'
    ``AutoTokenizer`` for the tokenizer's directory (the ids a user's transformers code gets),
    not with its tokenizer.json; where its ``tokenizer_class`` rebuilds the pipeline they may
    differ (docs/tokenization.md).
    """
    if max_problems < 0:
        raise OptionError(f"--max-problems must be >= 0, got {max_problems}")
    started = time.perf_counter()
    before = _identity(path)
    reader = open_packed(path, strict=False)  # a damaged record: listed as problems
    try:
        report = _verify(reader, path, against, tokenizer, max_problems, progress,
                         parse_special, chat_template, reference, started)  # fmt: skip
    except Exception:
        if _identity(path) == before:
            raise
        report = VerifyReport(path=as_path(path))  # files gone or changed under the checks
    if _identity(path) != before:  # what was read is not one dataset: its problems are not
        report.problems = [Problem(None, None, _changed(path), "changed")]  # its own
        report.problems_total, report.problem_counts = 1, {"changed": 1}
        report.against = None
        report.seconds = time.perf_counter() - started
    return report


def _identity(path: str | os.PathLike[str]) -> tuple[Any, ...] | None:
    """What changes when an output directory is replaced or its manifest rewritten (a rerun
    with ``--overwrite`` renames a new directory into place): the directory's and the
    manifest's inode, the manifest's size and time. ``None`` for an output on a store."""
    local = as_path(path)
    if not isinstance(local, Path):
        return None
    marks: list[Any] = []
    for p in (local, local / MANIFEST_FILE):
        try:
            st = os.stat(p)
        except OSError:
            marks.append(None)
        else:
            marks.append(
                (st.st_dev, st.st_ino) + (() if p is local else (st.st_size, st.st_mtime_ns))
            )
    return tuple(marks)


def _changed(path: str | os.PathLike[str]) -> str:
    return (
        f"{path} changed while it was being verified (another run replaced it: pack or merge "
        "with --overwrite?); what was read is not one dataset, so nothing is reported from "
        "it: verify again once that run is done"
    )


def _verify(
    reader: Any,
    path: str | os.PathLike[str],
    against: Sequence[str | os.PathLike[str]] | None,
    tokenizer: Tokenizer | str | os.PathLike[str] | None,
    max_problems: int,
    progress: VerifyProgress | None,
    parse_special: bool | None,
    chat_template: str | os.PathLike[str] | None,
    reference: str,
    started: float,
) -> VerifyReport:
    manifest = reader.manifest
    report = VerifyReport(path=as_path(path))
    problems = Problems(report, max_problems)

    def shard_of(row: int) -> str | None:
        try:
            return manifest.shards[reader.locate(row)[0]].file
        except IndexError:
            return None

    problems.shard_of = shard_of
    check_manifest(reader, problems)
    check_files(reader.path, manifest, problems, report)
    rules = Rules.of(reader, report)
    plan, digests = None, None
    if against is not None:
        plan = prepare_against(reader, against, tokenizer, problems, parse_special,
                                chat_template, reference)  # fmt: skip
        digests = against_digests(reader, rules.documents_read, plan.labelled)
    segments, all_read = check_shards(reader, rules, problems, report, digests, progress)
    if all_read:
        check_coverage(segments, manifest, rules, problems, report)
    else:
        report.segments = sum(a.size for a in segments.doc)
        report.notes.append(
            "dataset-wide checks (coverage, totals) skipped: some shards could not be read"
        )
    if plan is not None and digests is not None:
        if all_read:
            report.against = check_against(reader, plan, digests, segments, problems, progress)
        else:
            report.notes.append("--against skipped: some shards could not be read")
    report.notes.extend(_leftovers(reader.path))
    report.problem_counts = dict(problems.counts)
    report.seconds = time.perf_counter() - started
    return report
