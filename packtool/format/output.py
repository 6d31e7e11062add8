"""The output directory of a packed dataset: the names in it, the checks before a run writes
it, the durable writes and renames that commit it, and its copy onto an object store.

A packed dataset is a directory::

    out/
      data-00000-of-00002.arrow    Arrow IPC stream shards, the rows (written first)
      data-00001-of-00002.arrow
      dataset_info.json            Hugging Face `datasets` metadata (features)
      state.json                   so that `datasets.load_from_disk("out")` works
      README.md                    the dataset card: how to train on the rows, and how not
      manifest.json                packtool's manifest, written last: its presence marks
                                   the output as complete

A run writes it as a hidden sibling (``.out.packtool-tmp-PID``) and renames that into place.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from ..errors import OutputExistsError
from ..fs import StorePath, check_writable, sha256_of, upload_file
from .manifest import MANIFEST_FILE

__all__ = [
    "CHAT_TEMPLATE_FILE",
    "MERGE_STAGE",
    "TOKENIZER_CONFIG_FILE",
    "check_output_dir",
    "check_store_output",
    "fsync_path",
    "move_into_place",
    "publish",
    "remove_stale_temporaries",
    "sha256_file",
    "shard_name",
    "staging_dir",
    "stale_temporaries",
    "write_error",
    "write_json",
]

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"  # kept beside the tokenizer copy, if any
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # kept too, if the chats were rendered with it

_SHARD_NAME = "data-{index:05d}-of-{count:05d}.arrow"
_SHARD_RE = re.compile(r"data-\d{5}-of-\d{5}\.arrow")
# What a packtool output holds besides its shards (the manifest last), and the folder of work
# units: on a store, the names a rerun or --overwrite may replace.
_OUTPUT_FILES = (
    "README.md",
    "dataset_info.json",
    "state.json",
    "tokenizer.json",
    TOKENIZER_CONFIG_FILE,
    CHAT_TEMPLATE_FILE,
    MANIFEST_FILE,
)
_UNITS_DIR = "units"
MERGE_STAGE = ".merge"  # a merge builds its dataset in OUT/.merge, then moves it up


def shard_name(index: int, count: int) -> str:
    """The file name of shard ``index`` of ``count``."""
    return _SHARD_NAME.format(index=index, count=count)


def staging_dir(out_dir: Path) -> Path:
    """Where a run writes ``out_dir`` before renaming it into place."""
    return out_dir.parent / f".{out_dir.name}.packtool-tmp-{os.getpid()}"


def sha256_file(path: Path) -> str:
    """The sha256 of a file (exports record one per file they write)."""
    return sha256_of(path)


def write_json(path: Path, obj: Any) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, sort_keys=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise write_error(e, path, f"cannot write {path.name}") from e


def fsync_path(path: Path) -> None:
    """Flush ``path`` (a file or a directory) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # some filesystems cannot fsync a directory; nothing to do then
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def write_error(error: OSError, path: Path, what: str) -> OSError:
    """``error`` (raised while writing ``path``) as an OSError with a message fit to print.

    pyarrow's and numpy's write errors do not name the file and bury the reason
    (``Error writing bytes to file. Detail: [errno 28] ...``). The CLI prints the result as
    ``Error: PATH: cannot write shard: No space left on device (free space ...)``.
    """
    code = error.errno
    reason = os.strerror(code) if code else str(error)
    if code in (errno.ENOSPC, errno.EDQUOT):
        reason += " (free space on that filesystem, or write the output elsewhere with --output)"
    return OSError(code or errno.EIO, f"{what}: {reason}", str(path))


def check_output_dir(out_dir: Path, overwrite: bool, resume: bool = False) -> None:
    """Refuse an existing ``out_dir`` unless ``overwrite`` (eagerly, before any work);
    ``resume``: the message says a finished output has nothing to resume.

    Even with ``overwrite``, only a packtool output (it has a manifest) or an empty directory
    is replaced: ``--overwrite`` must never delete a directory of other files by mistake.
    """
    if not out_dir.exists():
        above = next((p for p in out_dir.parents if p.exists()), None)
        if above is not None and not above.is_dir():  # -o corpus.jsonl/out
            raise OutputExistsError(
                f"output directory {out_dir} cannot be made: {above} is a file, not a "
                "directory; choose another --output"
            )
        return
    if not out_dir.is_dir():
        raise OutputExistsError(
            f"output path {out_dir} exists and is not a directory: choose another --output"
        )
    finished = (out_dir / MANIFEST_FILE).exists()
    if finished and resume and not overwrite:
        raise OutputExistsError(_FINISHED.format(out_dir))
    replaceable = finished or not any(out_dir.iterdir())
    if replaceable and not overwrite:
        raise OutputExistsError(
            f"output directory {out_dir} already exists (pass --overwrite to replace it)"
        )
    if replaceable:
        return
    raise OutputExistsError(
        f"output directory {out_dir} is not a packtool output (no {MANIFEST_FILE}) and not "
        "empty: --overwrite replaces only packtool outputs; choose another --output"
    )


def _store_members(url: StorePath) -> dict[str, StorePath]:
    if not url.is_dir():
        return {}
    return {p.name: p for p in url.iterdir()}


_FINISHED = (
    "output {} is finished (it has its manifest.json): --resume continues only an "
    "interrupted run; pass --overwrite to pack it again"
)


def check_store_output(url: StorePath, overwrite: bool, resume: bool = False) -> None:
    """Check an output prefix on a store before any work (the store's :func:`check_output_dir`).

    A probe object is written and deleted first: a missing bucket, missing credentials or a
    denied write fail here. A finished output (it has a manifest) is replaced only with
    ``overwrite``; a prefix holding what a failed or killed run left (shards, no manifest) is
    written over; a prefix holding other objects is refused, with or without ``overwrite``.
    """
    check_writable(url)
    members = _store_members(url)
    if MANIFEST_FILE in members and not overwrite:
        if resume:
            raise OutputExistsError(_FINISHED.format(url))
        raise OutputExistsError(f"output {url} already exists (pass --overwrite to replace it)")
    foreign = sorted(n for n in members if not _ours(n))
    if foreign:
        raise OutputExistsError(
            f"output {url} holds objects that are not a packtool output ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}): choose another --output"
        )


def _ours(name: str) -> bool:
    return bool(_SHARD_RE.fullmatch(name)) or name in (*_OUTPUT_FILES, _UNITS_DIR)


def publish(local: Path, url: StorePath) -> None:
    """Copy the finished output ``local`` to the prefix ``url``: shards first, manifest last.

    Object stores have no atomic rename, so the order is the commit: an old manifest is
    deleted before anything else (the prefix no longer reads as finished), then the shards
    and metadata are uploaded, then objects of an older output that this one does not hold
    are deleted, and the manifest is uploaded last. A run killed at any point leaves a
    prefix without a manifest, which readers refuse and a rerun writes over.
    """
    names = sorted(p.name for p in local.iterdir() if p.is_file())
    members = _store_members(url)
    if MANIFEST_FILE in members:
        members.pop(MANIFEST_FILE).unlink(missing_ok=True)
    for name in names:
        if name != MANIFEST_FILE:
            upload_file(local / name, url / name)
    for name, member in members.items():
        if name not in names and name != _UNITS_DIR and _ours(name):
            member.unlink(missing_ok=True)
    upload_file(local / MANIFEST_FILE, url / MANIFEST_FILE)


_TEMPORARY = re.compile(r"\.(?P<name>.+)\.packtool-(?:tmp|store|old)-(?P<pid>\d+)")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    except (OverflowError, OSError):  # not a possible pid
        return False
    return True


def stale_temporaries(out_dir: str | os.PathLike[str] | StorePath) -> list[Path]:
    """What killed runs left beside and inside ``out_dir``, of processes that no longer exist.

    A run killed by SIGKILL (or the OOM killer, or a power cut) cannot clean up its hidden
    temporaries: beside the output, ``.OUT.packtool-tmp-PID`` (the dataset being written),
    ``.OUT.packtool-old-PID`` (the one being replaced); inside it, ``.NAME.packtool-tmp-PID``
    (a merge's staging ``..merge.packtool-tmp-PID``, a manifest being replaced). Those of a
    live process (another run writing the same output) are not listed. The work store
    ``.OUT.packtool-work`` is not one: the next run resets it, or ``--resume`` continues it.
    """
    if isinstance(out_dir, StorePath):
        return []  # a store has no staging directories (unfinished uploads: fs)
    out_dir = Path(out_dir)
    parent = out_dir.parent if str(out_dir.parent) else Path(".")
    found: list[Path] = []
    for folder, own in ((parent, True), (out_dir, False)):
        if not folder.is_dir() or folder.is_symlink():
            continue
        for entry in folder.iterdir():
            match = _TEMPORARY.fullmatch(entry.name)
            if match is None or (own and match["name"] != out_dir.name):
                continue
            pid = int(match["pid"])
            if pid != os.getpid() and not _process_alive(pid):
                found.append(entry)
    return sorted(found)


def remove_stale_temporaries(out_dir: str | os.PathLike[str]) -> list[Path]:
    """Remove what killed runs left beside and inside ``out_dir`` (:func:`stale_temporaries`);
    return the paths removed. Every command that writes ``out_dir`` calls it first."""
    removed = stale_temporaries(out_dir)
    for entry in removed:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
    return removed


def move_into_place(staging: Path, out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists():
        check_output_dir(out_dir, overwrite)
        trash = out_dir.parent / f".{out_dir.name}.packtool-old-{os.getpid()}"
        os.rename(out_dir, trash)
        os.rename(staging, out_dir)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(staging, out_dir)
    fsync_path(out_dir.parent)  # make the rename itself durable
