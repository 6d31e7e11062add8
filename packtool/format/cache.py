"""The local cache of shards of an output on an object store (``open_packed(...,
cache_dir=...)``): each shard fetched once, checked against its recorded sha256 and kept under
that hash, so a copy is never stale and a shuffled epoch reads each shard from the store once.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from ..errors import FormatError
from ..fs import StorePath, sha256_of
from .manifest import ShardEntry, is_count

__all__ = ["cached_shard"]


def cached_shard(path: StorePath, entry: ShardEntry, cache_dir: Path) -> Path:
    """The local copy in ``cache_dir`` of the shard at ``path`` (listed as ``entry``),
    fetched first if it is not there, its bytes hashed as they arrive."""
    if not entry.sha256:
        raise FormatError(f"{path}: the manifest records no sha256 to cache the shard by")
    local = cache_dir / f"{entry.sha256}.arrow"
    if local.is_file() and (not is_count(entry.bytes) or local.stat().st_size == entry.bytes):
        return local
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        part = local.with_name(f".{local.name}.{os.getpid()}-{threading.get_ident()}")
        digest = sha256_of(path, copy_to=part)
    except OSError as e:
        raise FormatError(f"{path}: cannot copy the shard into {cache_dir}: {e}") from e
    if digest != entry.sha256:
        part.unlink(missing_ok=True)
        raise FormatError(
            f"{path}: the shard's sha256 is {digest[:12]}..., the manifest "
            f"records {entry.sha256[:12]}... (run `packtool verify`)"
        )
    os.replace(part, local)
    return local
