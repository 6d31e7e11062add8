"""The file-system seam: local paths, and fsspec URLs (``s3://``, ``gs://``, ``az://``, ...).

Every path packtool reads or writes goes through :func:`as_path`: a local path stays a
:class:`pathlib.Path` (the fast path: memory-mapped reads, rename-based atomic output), and a
URL becomes a :class:`StorePath`, which offers the small part of ``pathlib`` that packtool uses
(``/``, ``name``, ``suffixes``, ``exists``, ``is_file``, ``is_dir``, ``stat``, ``iterdir``,
``rglob``, ``read_bytes``, ``open``) over the URL's fsspec file system. Files on a store are
read in bounded blocks (:data:`BLOCK_SIZE`), never downloaded whole.

``fsspec`` is imported only when a URL is given, and its file system package (``s3fs`` for
``s3://``: ``pip install 'packtool[s3]'``) only for that protocol. Credentials and endpoints
come from where the package looks (``AWS_*`` variables, ``AWS_ENDPOINT_URL``, config files,
fsspec configuration); packtool records and prints URLs only. ``file://`` URLs are local paths.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any, NamedTuple, TypeVar

from .errors import InputError, StoreError

__all__ = [
    "BLOCK_SIZE",
    "STORE_TIMEOUT",
    "AnyPath",
    "StorePath",
    "abort_incomplete_uploads",
    "arrow_input",
    "arrow_source",
    "as_path",
    "check_writable",
    "download_tree",
    "is_url",
    "local_copy",
    "open_input",
    "remove_tree",
    "scratch_dir",
    "upload_file",
    "user_cache_dir",
]

BLOCK_SIZE = 8 << 20  # bytes a store read fetches at a time (fsspec's read-ahead cache)
_URL = re.compile(r"^(?P<protocol>[a-zA-Z][a-zA-Z0-9+.-]*)://")
_PACKAGES = {"s3": "packtool[s3]", "s3a": "packtool[s3]", "gs": "gcsfs", "gcs": "gcsfs"}
_PACKAGES.update({"az": "adlfs", "abfs": "adlfs", "abfss": "adlfs"})
_T = TypeVar("_T")


def user_cache_dir() -> Path:
    """``$PACKTOOL_CACHE_DIR``, else ``$XDG_CACHE_HOME/packtool``, else ``~/.cache/packtool``:
    where packtool keeps what it may compute again (token lengths, tokenizer verdicts)."""
    env = os.environ.get("PACKTOOL_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "packtool"


def is_url(spec: str | os.PathLike[str] | StorePath) -> bool:
    """Whether ``spec`` names a file on a store (an fsspec URL other than ``file://``)."""
    if isinstance(spec, StorePath):
        return True
    if isinstance(spec, os.PathLike):
        return False
    m = _URL.match(spec)
    return m is not None and m["protocol"].lower() not in ("file", "local")


def as_path(spec: str | os.PathLike[str] | StorePath) -> AnyPath:
    """``spec`` as a local :class:`~pathlib.Path` (``file://`` URLs too) or a :class:`StorePath`."""
    if isinstance(spec, (Path, StorePath)):
        return spec
    text = os.fspath(spec)
    if is_url(text):
        return StorePath(text)
    m = _URL.match(text)
    return Path(text[m.end() :] if m else text)


def _filesystem(protocol: str) -> Any:
    try:
        import fsspec
    except ImportError:  # pragma: no cover - fsspec comes with datasets
        raise StoreError(f"{protocol}:// URLs need fsspec: pip install 'packtool[s3]'") from None
    try:
        fs = fsspec.filesystem(protocol, **_store_options(protocol))
    except ImportError:
        package = _PACKAGES.get(protocol.lower(), f"the fsspec package for {protocol}://")
        raise StoreError(
            f"{protocol}:// URLs need a package that is not installed: pip install '{package}'"
        ) from None
    except ValueError:
        raise StoreError(
            f"{protocol}:// is not a protocol fsspec knows (s3://, gs://, az://, memory://, ...)"
        ) from None
    if protocol.lower() in ("s3", "s3a"):
        fs.retries = S3_OWN_RETRIES  # s3fs retries again around botocore's attempts
        fs.set_session = functools.partial(_session_without_expect, fs.set_session)
    return fs


async def _session_without_expect(set_session: Any, *args: Any, **kwargs: Any) -> Any:
    """s3fs's ``set_session``, then no ``Expect: 100-continue`` on the client's uploads:
    aiohttp waits for the ``100 Continue`` with no timeout (a store that stops answering hung
    a ``PutObject`` for good, whatever ``read_timeout`` says); the body is sent at once."""
    client = await set_session(*args, **kwargs)
    events = client.meta.events
    if not getattr(events, "_packtool_no_expect", False):
        events.register("before-call.s3", _no_expect_header)
        events._packtool_no_expect = True
    return client


def _no_expect_header(params: dict[str, Any], **_: Any) -> None:
    params.get("headers", {}).pop("Expect", None)


STORE_TIMEOUT = 20.0
"""Seconds an S3 request may wait for the store's answer (botocore's ``read_timeout``; the
connection: at most 5 s), ``PACKTOOL_STORE_TIMEOUT`` to change it. A request is tried
:data:`S3_ATTEMPTS` times (botocore's standard retries), and not again by s3fs: a store that
stops answering fails the run in one line after about ``3 x 20`` seconds, not hangs."""
S3_ATTEMPTS = 3
S3_OWN_RETRIES = 1  # s3fs's loop around botocore's: one pass


def _store_options(protocol: str) -> dict[str, Any]:
    """The options packtool gives the store's file system: S3's timeouts and retries."""
    if protocol.lower() not in ("s3", "s3a"):
        return {}
    seconds = _store_timeout()
    config = {
        "connect_timeout": min(5.0, seconds),
        "read_timeout": seconds,
        "retries": {"total_max_attempts": S3_ATTEMPTS, "mode": "standard"},
    }
    return {"config_kwargs": config}


def _store_timeout() -> float:
    text = os.environ.get("PACKTOOL_STORE_TIMEOUT", "").strip()
    try:
        seconds = float(text) if text else STORE_TIMEOUT
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 3600:
        raise StoreError(f"PACKTOOL_STORE_TIMEOUT must be seconds in (0, 3600], got {text!r}")
    return seconds


_FILESYSTEMS: dict[str, Any] = {}


def _store_problem(error: BaseException, url: str, doing: str) -> StoreError | None:
    """A one-line :class:`StoreError` for the store's own failures (no credentials, denied,
    no such bucket), or None for a plain missing file (the caller says what it needed)."""
    name = type(error).__name__
    text = str(error)
    if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
        return StoreError(
            f"{url}: no credentials to {doing} (set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, a profile, or the store's own configuration)"
        )
    if isinstance(error, PermissionError) or "AccessDenied" in text or "Forbidden" in text:
        return StoreError(f"{url}: access denied to {doing} (check the credentials' permissions)")
    if "NoSuchBucket" in text or "bucket does not exist" in text.lower():
        return StoreError(f"{url}: no such bucket (create it, or check the URL)")
    if name in ("ReadTimeoutError", "FSTimeoutError", "ServerTimeoutError"):
        return StoreError(
            f"{url}: the store did not answer within {_store_timeout():g} s ({S3_ATTEMPTS} "
            f"tries) to {doing}: is it up? (PACKTOOL_STORE_TIMEOUT sets the wait)"
        )
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError"):
        return StoreError(f"{url}: cannot reach the store to {doing} ({text.splitlines()[0]})")
    if isinstance(error, FileNotFoundError):
        return None
    if isinstance(error, OSError) or "botocore" in type(error).__module__:
        return StoreError(f"{url}: cannot {doing}: {text.splitlines()[0] if text else name}")
    return None


class StoreStat(NamedTuple):
    """What :meth:`StorePath.stat` tells (the fields of ``os.stat_result`` packtool reads)."""

    st_size: int
    st_mtime_ns: int


class StorePath:
    """A file or prefix on an fsspec store, used like a :class:`pathlib.Path`."""

    __slots__ = ("_info_cache", "_key", "protocol")

    def __init__(self, url: str, info: dict[str, Any] | None = None) -> None:
        m = _URL.match(url)
        if m is None:
            raise ValueError(f"not a URL: {url!r}")
        self.protocol = m["protocol"].lower()
        self._key = url[m.end() :].strip("/")
        self._info_cache = info  # what a listing said of this file (saves one request)

    # -- naming ----------------------------------------------------------------------------
    def __str__(self) -> str:
        return f"{self.protocol}://{self._key}"

    def __repr__(self) -> str:
        return f"StorePath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StorePath) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __lt__(self, other: StorePath) -> bool:
        return str(self) < str(other)

    def __truediv__(self, name: str) -> StorePath:
        return StorePath(f"{self}/{str(name).strip('/')}")

    @property
    def _pure(self) -> PurePosixPath:
        return PurePosixPath("/" + self._key)

    @property
    def name(self) -> str:
        return self._pure.name

    @property
    def suffix(self) -> str:
        return self._pure.suffix

    @property
    def suffixes(self) -> list[str]:
        return self._pure.suffixes

    @property
    def stem(self) -> str:
        return self._pure.stem

    @property
    def parent(self) -> StorePath:
        parent = self._key.rsplit("/", 1)[0] if "/" in self._key else self._key
        return StorePath(f"{self.protocol}://{parent}")

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self._key.split("/"))

    def with_suffix(self, suffix: str) -> StorePath:
        return self.parent / self._pure.with_suffix(suffix).name

    def with_name(self, name: str) -> StorePath:
        return self.parent / name

    def relative_to(self, other: StorePath) -> PurePosixPath:
        return PurePosixPath(self._key).relative_to(other._key)

    def resolve(self) -> StorePath:
        return self

    def absolute(self) -> StorePath:
        return self

    # -- the file system -------------------------------------------------------------------
    @property
    def fs(self) -> Any:
        fs = _FILESYSTEMS.get(self.protocol)
        if fs is None:
            fs = _FILESYSTEMS[self.protocol] = _filesystem(self.protocol)
        return fs

    def _call(self, doing: str, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except StoreError:
            raise
        except Exception as e:
            problem = _store_problem(e, str(self), doing)
            if problem is None:
                raise
            raise problem from None

    def _info(self) -> dict[str, Any] | None:
        if self._info_cache is not None:
            return self._info_cache

        def info() -> dict[str, Any] | None:
            try:
                return self.fs.info(self._key)  # type: ignore[no-any-return]
            except FileNotFoundError:
                return None

        return self._call("read it", info)

    def exists(self) -> bool:
        return self._info() is not None

    def is_file(self) -> bool:
        info = self._info()
        return info is not None and info.get("type") == "file"

    def is_dir(self) -> bool:
        info = self._info()
        return info is not None and info.get("type") == "directory"

    def is_symlink(self) -> bool:
        return False

    def stat(self) -> StoreStat:
        info = self._info()
        if info is None:
            raise FileNotFoundError(2, "no such file", str(self))
        return StoreStat(int(info.get("size") or 0), _mtime_ns(info))

    def iterdir(self) -> Iterator[StorePath]:
        def listing() -> list[str]:
            return sorted(self.fs.ls(self._key, detail=False))

        for key in self._call("list it", listing):
            key = key.rstrip("/")
            if key != self._key:
                yield StorePath(f"{self.protocol}://{key}")

    def rglob(self, pattern: str = "*") -> Iterator[StorePath]:
        """Every file below this prefix (``pattern`` must be ``*``: all of them)."""
        if pattern != "*":
            raise ValueError("StorePath.rglob takes only '*'")

        def find() -> dict[str, Any]:
            return self.fs.find(self._key, detail=True)  # type: ignore[no-any-return]

        found = self._call("list it", find)
        for key in sorted(found):
            yield StorePath(f"{self.protocol}://{key}", found[key])

    def glob(self, pattern: str | None = None) -> list[StorePath]:
        """The files ``pattern`` matches below this prefix (without it, those this URL matches
        as a pattern itself), sorted."""
        key = self._key if pattern is None else f"{self._key}/{pattern}"
        found = self._call("list it", lambda: self.fs.glob(key, detail=True))
        return sorted(StorePath(f"{self.protocol}://{k}", v) for k, v in found.items())

    def open(self, mode: str = "rb", **kwargs: Any) -> IO[Any]:
        doing = "read it" if "r" in mode else "write it"
        if "r" in mode:
            kwargs.setdefault("block_size", BLOCK_SIZE)
            kwargs.setdefault("cache_type", "readahead")

        def opened() -> IO[Any]:
            return self.fs.open(self._key, mode, **kwargs)  # type: ignore[no-any-return]

        return self._call(doing, opened)

    def read_bytes(self) -> bytes:
        with self.open("rb") as f:
            return f.read()  # type: ignore[no-any-return]

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> int:
        self._call("write it", lambda: self.fs.pipe_file(self._key, data))
        return len(data)

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self._call("delete it", lambda: self.fs.rm_file(self._key))
        except FileNotFoundError:
            if not missing_ok:
                raise

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Object stores have no directories: nothing to do."""


AnyPath = Path | StorePath


def _mtime_ns(info: dict[str, Any]) -> int:
    value = info.get("LastModified", info.get("mtime", info.get("created")))
    if value is None:
        return 0
    if hasattr(value, "timestamp"):
        return int(value.timestamp() * 1e9)
    try:
        return int(float(value) * 1e9)
    except (TypeError, ValueError):
        return 0


def open_input(path: AnyPath, buffering: int = 1 << 20) -> IO[bytes]:
    """A binary file open for reading: a local file, or a store's in bounded blocks."""
    if isinstance(path, StorePath):
        try:
            return path.open("rb")
        except FileNotFoundError:
            raise InputError(f"{path}: no such file") from None
    return open(path, "rb", buffering=buffering)


def sha256_of(
    path: AnyPath,
    *,
    copy_to: Path | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> str:
    """The sha256 of a file, local or on a store, read in blocks; with ``copy_to``, its bytes
    are written there as they are hashed (a store's file downloaded and hashed at once);
    ``on_bytes`` gets the size of each block read."""
    import hashlib

    digest = hashlib.sha256()
    with (
        open_input(path) as source,
        open(copy_to, "wb") if copy_to is not None else contextlib.nullcontext() as sink,
    ):
        while block := source.read(1 << 22):
            digest.update(block)
            if sink is not None:
                sink.write(block)
            if on_bytes is not None:
                on_bytes(len(block))
    return digest.hexdigest()


def arrow_input(path: AnyPath) -> Any:
    """A ``pyarrow`` readable file: ``pa.OSFile`` locally, a store's file wrapped for Arrow."""
    import pyarrow as pa

    if isinstance(path, StorePath):
        return pa.PythonFile(open_input(path), mode="r")
    return pa.OSFile(str(path), "rb")


def check_writable(url: StorePath) -> None:
    """Write and delete a small probe object under ``url``: a missing bucket, missing
    credentials or a denied write fail here, in one line, before any work is done."""
    probe = url / f".packtool-probe-{uuid.uuid4().hex[:12]}"
    url._call("write there", lambda: url.fs.pipe_file(probe._key, b"packtool probe\n"))
    url._call("delete there", lambda: url.fs.rm_file(probe._key))
    abort_incomplete_uploads(url)


def abort_incomplete_uploads(url: StorePath) -> int:
    """Abort the multipart uploads left unfinished under the prefix ``url`` by a killed run
    (S3 keeps their parts, and bills them, until they are aborted); return how many. Called
    before a run writes ``url``: two runs writing one output at once are not supported."""
    if url.protocol.lower() not in ("s3", "s3a"):
        return 0
    bucket, _, key = url._key.partition("/")
    prefix = key.rstrip("/") + "/" if key else ""
    call = url.fs.call_s3
    aborted = 0
    markers: dict[str, str] = {}
    while True:
        page = url._call(
            "list its unfinished uploads",
            lambda m=markers: call("list_multipart_uploads", Bucket=bucket, Prefix=prefix, **m),
        )
        for upload in page.get("Uploads", []):
            url._call(
                "abort an unfinished upload",
                lambda u=upload: call("abort_multipart_upload", Bucket=bucket, Key=u["Key"],
                                      UploadId=u["UploadId"]),
            )  # fmt: skip
            aborted += 1
        if not page.get("IsTruncated"):
            return aborted
        markers = {"KeyMarker": page["NextKeyMarker"],
                   "UploadIdMarker": page["NextUploadIdMarker"]}  # fmt: skip


def upload_file(local: Path, url: StorePath) -> None:
    """Copy the local file ``local`` to ``url`` (streamed by the store's package)."""
    url._call("write it", lambda: url.fs.put_file(str(local), url._key))


def local_copy(url: StorePath, directory: Path, names: list[str] | None = None) -> Path:
    """Copy the small file ``url`` (or, with ``names``, those files of the prefix ``url``
    that exist) into ``directory``; return the local file (or ``directory``)."""
    directory.mkdir(parents=True, exist_ok=True)
    if names is None:
        target = directory / url.name
        target.write_bytes(url.read_bytes())
        return target
    for name in names:
        member = url / name
        if member.is_file():
            (directory / name).write_bytes(member.read_bytes())
    return directory


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A local temporary directory (``$TMPDIR``), removed afterwards: what a store's output
    or tokenizer is staged in."""
    path = Path(tempfile.mkdtemp(prefix=f"packtool-{prefix}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def arrow_source(where: str | AnyPath) -> Any:
    """What ``pyarrow`` readers take for ``where``: the path itself when local (pyarrow opens
    it), a readable Arrow file over the store otherwise."""
    path = as_path(where)
    return arrow_input(path) if isinstance(path, StorePath) else str(path)


def remove_tree(path: AnyPath) -> None:
    """Remove the directory (or prefix) ``path`` and everything below it; nothing if absent."""
    if isinstance(path, StorePath):
        with contextlib.suppress(FileNotFoundError):
            path._call("delete it", lambda: path.fs.rm(path._key, recursive=True))
        return
    shutil.rmtree(path, ignore_errors=True)


def download_tree(
    url: StorePath,
    directory: Path,
    *,
    skip_suffix: str | None = None,
    only_suffix: str | None = None,
) -> None:
    """Copy the objects below ``url`` into ``directory`` (same relative names): all of them,
    or all but those ending in ``skip_suffix``, or only those ending in ``only_suffix``."""
    for member in url.rglob("*"):
        if skip_suffix is not None and member.name.endswith(skip_suffix):
            continue
        if only_suffix is not None and not member.name.endswith(only_suffix):
            continue
        target = directory.joinpath(*member.relative_to(url).parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        url._call("read it", lambda m=member, t=target: m.fs.get_file(m._key, str(t)))
