"""Megatron-LM indexed datasets (``PREFIX.idx`` beside ``PREFIX.bin``): token ids only, one
sequence a record, read memory-mapped (from a store: in ranged reads of a few MB a batch);
pieces by sequences.

The input is named by its ``.idx``, its ``.bin``, or the prefix; its records are named
``PREFIX: row n``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from ..errors import InputError, OptionError
from ..fs import AnyPath, StorePath, as_path
from .base import Cuts, FieldReader, Request
from .batches import Records, Want
from .files import InputFile, part_of

# The dtype codes of megatron-core's indexed datasets (``DType``), and its index header.
MEGATRON_DTYPES = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
_MEGATRON_HEADER = b"MMIDIDX\x00\x00"
_BATCH_TOKENS = 1 << 22


def _whole_file(path: AnyPath) -> np.ndarray:
    """The bytes of ``path``: memory-mapped on a local disk, read whole from a store."""
    if isinstance(path, StorePath):
        return np.frombuffer(path.read_bytes(), np.uint8)
    return np.memmap(path, np.uint8, mode="r")


class _TokenFile:
    """Tokens ``[a, b)`` of a Megatron data file: a slice of its map on a local disk, a ranged
    read (one per batch of sequences, a few MB) from a store."""

    def __init__(self, path: AnyPath, dtype: np.dtype, size: int) -> None:
        self.dtype, self.file = dtype, None
        if isinstance(path, StorePath):
            self.file = path.open("rb")
        else:
            self.map = np.memmap(path, dtype, mode="r") if size else np.zeros(0, dtype)

    def read(self, a: int, b: int) -> np.ndarray:
        if self.file is None:
            return np.asarray(self.map[a:b])
        self.file.seek(a * self.dtype.itemsize)
        return np.frombuffer(self.file.read((b - a) * self.dtype.itemsize), self.dtype)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def megatron_index(inp: InputFile) -> tuple[np.ndarray, np.ndarray, np.dtype]:
    """The index of a Megatron-LM indexed dataset (``PREFIX.idx``), checked against its data
    file: each sequence's length (tokens) and byte offset in ``PREFIX.bin`` (memory-mapped),
    and the tokens' dtype."""
    index = _whole_file(inp.path)
    if index.size < 34 or bytes(index[:9]) != _MEGATRON_HEADER:
        raise InputError(f"{inp.path}: not a Megatron-LM index (no MMIDIDX header)")
    version, code, count = (
        int(np.frombuffer(index[9:17], "<u8")[0]),
        int(index[17]),
        int(np.frombuffer(index[18:26], "<u8")[0]),
    )
    if version != 1 or code not in MEGATRON_DTYPES:
        raise InputError(f"{inp.path}: Megatron index version {version}, dtype code {code}")
    dtype = np.dtype(MEGATRON_DTYPES[code])
    if index.size < 34 + 12 * count:
        raise InputError(f"{inp.path}: the index ends early ({count:,} sequences announced)")
    lengths = np.frombuffer(index, "<i4", count, 34).astype(np.int64)
    pointers = np.frombuffer(index, "<i8", count, 34 + 4 * count)
    if count and int(lengths.min()) < 0:
        bad = int(np.argmax(lengths < 0))
        raise InputError(
            f"{inp.path}: sequence {bad:,} has length {int(lengths[bad]):,}: a length is never "
            "negative (the index is damaged)"
        )
    data_path = inp.path.with_suffix(".bin")
    data_bytes = data_path.stat().st_size
    if count and (
        pointers[0] != 0 or (pointers[1:] != pointers[:-1] + lengths[:-1] * dtype.itemsize).any()
    ):
        raise InputError(f"{inp.path}: sequences not stored one after another in {data_path}")
    need = int(lengths.sum()) * dtype.itemsize
    if need > data_bytes:
        raise InputError(
            f"{data_path}: {data_bytes:,} bytes, the index needs {need:,}: the file ends early"
        )
    return lengths, pointers, dtype


def read(
    inp: InputFile, fields: Sequence[str], batch_tokens: int = _BATCH_TOKENS
) -> Iterator[Records]:
    """The sequences of ``inp`` (of a piece: its sequences), as one list column named
    ``fields[0]`` (the ids field), about ``batch_tokens`` tokens a batch."""
    where = str(inp.path.with_suffix(""))
    if len(fields) > 1:
        raise OptionError(
            f"{where}: a Megatron indexed dataset holds ids only: leave out --labels-field "
            "and --loss-mask-field"
        )
    lengths, _, dtype = megatron_index(inp)
    data_path = inp.path.with_suffix(".bin")
    tokens = _TokenFile(data_path, dtype, data_path.stat().st_size)
    try:
        yield from _batches(inp, fields[0], lengths, tokens, where, batch_tokens)
    finally:
        tokens.close()


def _batches(
    inp: InputFile,
    name: str,
    lengths: np.ndarray,
    tokens: _TokenFile,
    where: str,
    batch_tokens: int,
) -> Iterator[Records]:
    ends = np.cumsum(lengths)
    starts = ends - lengths
    first, stop = part_of(inp, "sequences") or (0, int(lengths.size))
    i = first
    while i < stop:
        j = max(i + 1, int(np.searchsorted(ends, starts[i] + batch_tokens, "right")))
        j = min(j, stop)
        values = pa.array(tokens.read(int(starts[i]), int(ends[j - 1])))
        offsets = pa.array(np.concatenate([[0], ends[i:j] - starts[i]]).astype(np.int64))
        column = pa.LargeListArray.from_arrays(offsets, values)
        batch = pa.RecordBatch.from_arrays([column], names=[name])
        yield Records(where, inp.size_bytes * (j - first) // (stop - first), batch, row0=i)
        i = j


class MegatronReader(FieldReader):
    """A Megatron-LM indexed dataset: token ids only (shown as ``tokens``)."""

    kind = "megatron"
    suffixes = (".idx",)
    gives = frozenset({Want.IDS})
    ids_field = "tokens"

    def read(self, inp: InputFile, request: Request) -> Iterator[Records]:
        if request.want is not Want.IDS:
            raise self.refusal(inp, request.want)
        return read(inp, request.fields)  # one column, named as asked: no schema to check

    def first_row(self, inp: InputFile) -> int:
        return (part_of(inp, "sequences") or (0, 0))[0]

    def cuts(self, inp: InputFile) -> Cuts | None:
        lengths, pointers, _ = megatron_index(inp)
        if lengths.size > 1:  # offsets in the .bin, after the .idx: memory-mapped, not copied
            return Cuts("sequences", pointers, inp.path.stat().st_size)
        return None

    def refusal(self, inp: InputFile, want: Want) -> Exception:
        if want is Want.TEXT:
            return InputError(f"{inp.path}: a Megatron indexed dataset holds token ids, not text")
        return InputError(
            f"{inp.path}: a Megatron indexed dataset holds token ids, not prompt/completion "
            "or chat records"
        )

    def input_file(self, path: AnyPath, compression: str | None) -> InputFile:
        data = path.with_suffix(".bin")
        if not data.is_file():
            raise InputError(f"{path}: a Megatron index without its data file {data.name}")
        return InputFile(path, self.kind, None, path.stat().st_size + data.stat().st_size)

    def companions(self, path: AnyPath) -> list[AnyPath]:
        return [path.with_suffix(".bin")]

    def entry_of(self, path: AnyPath) -> AnyPath | None:
        if path.suffix == ".bin" and path.with_suffix(".idx").is_file():
            return path.with_suffix(".idx")  # the data file of a Megatron indexed dataset
        return None

    def by_prefix(self, spec: str) -> AnyPath | None:
        index = as_path(f"{spec}.idx")
        return index if index.is_file() else None


READER = MegatronReader()
