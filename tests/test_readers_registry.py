"""The table of input formats: a new format is one reader and one line in the table.

The tab-separated format below is defined here, in the test, the way a built-in format is
defined (a reader on :class:`~packtool.readers.FieldReader`, registered through
:func:`~packtool.readers.register`), and packed end to end by ``packtool.pack`` with no
other change: its suffix names its files, the shape of its records is detected from its
header, and its texts and instruction records pack to the same rows as the same records
written as JSON Lines.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pytest

import packtool
from packtool.errors import InputError
from packtool.readers import (
    FORMATS,
    FieldReader,
    InputFile,
    Records,
    Request,
    Want,
    first_record_fields,
    read_texts,
    reader_for,
    register,
    resolve_inputs,
    supported,
)
from packtool.readers.files import open_binary
from packtool.readers.registry import BUILT_IN


class TsvReader(FieldReader):
    """Tab-separated values: a header line of field names, then one record a line."""

    kind = "tsv"
    suffixes = (".tsv",)
    gives = frozenset({Want.TEXT, Want.RECORDS})
    schema_first = True

    def _lines(self, inp: InputFile) -> list[list[str]]:
        stream, _ = open_binary(inp)
        with stream:
            return [line.split("\t") for line in stream.read().decode().splitlines()]

    def read(self, inp: InputFile, request: Request) -> Iterator[Records]:
        header, *rows = self._lines(inp)
        if request.check is not None:
            request.check(pa.schema([(name, pa.string()) for name in header]))
        for start in range(0, len(rows), request.batch_rows):
            part = rows[start : start + request.batch_rows]
            columns = {f: pa.array([r[header.index(f)] for r in part]) for f in request.fields}
            done = inp.size_bytes * (start + len(part)) // len(rows)
            yield Records(str(inp.path), done, pa.RecordBatch.from_pydict(columns), row0=start)

    def first_fields(self, inp: InputFile, split: str | None) -> list[str] | None:
        return self._lines(inp)[0]


@pytest.fixture
def tsv() -> Iterator[TsvReader]:
    reader = register(TsvReader())  # the table's line, as a built-in format has it
    try:
        yield reader
    finally:
        FORMATS.pop(reader.kind)


def _write(tmp_path: Path, name: str, header: Sequence[str], rows: list[list[str]]) -> Path:
    tsv = tmp_path / f"{name}.tsv"
    tsv.write_text("\n".join("\t".join(r) for r in [list(header), *rows]) + "\n")
    jsonl = tmp_path / f"{name}.jsonl"
    jsonl.write_text("".join(json.dumps(dict(zip(header, r, strict=True))) + "\n" for r in rows))
    return tsv


def _shards_sha(out: Path) -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(out.glob("data-*")))).hexdigest()


def test_every_built_in_format_is_in_the_one_table() -> None:
    assert [r.kind for r in BUILT_IN] == [
        "jsonl", "json", "parquet", "arrow", "csv", "txt", "megatron", "hf_dataset",
    ]  # fmt: skip
    assert all(reader_for(r.kind) is r for r in BUILT_IN)
    with pytest.raises(ValueError, match="unknown input kind 'tsv'"):
        reader_for("tsv")


def test_a_new_format_packs_end_to_end(tsv: TsvReader, tmp_path: Path) -> None:
    texts = [f"document {i}: " + "word " * (i % 17) for i in range(300)]
    src = _write(tmp_path, "docs", ["id", "text"], [[str(i), t] for i, t in enumerate(texts)])
    (inp,) = resolve_inputs([src])
    assert (inp.kind, inp.compression) == ("tsv", None)
    assert first_record_fields(inp) == ["id", "text"]
    assert [t for b in read_texts(inp, batch_docs=64) for t in b.texts] == texts
    assert ".tsv" in supported()

    report = packtool.pack([src], tmp_path / "out", max_len=256)
    again = packtool.pack([src.with_suffix(".jsonl")], tmp_path / "same", max_len=256)
    assert report.documents.packed == again.documents.packed == len(texts)
    assert _shards_sha(tmp_path / "out") == _shards_sha(tmp_path / "same")


def test_a_new_format_gives_instruction_records(tsv: TsvReader, tmp_path: Path) -> None:
    rows = [[f"Add {i} and 2.", f" {i + 2}"] for i in range(50)]
    src = _write(tmp_path, "pc", ["prompt", "completion"], rows)
    report = packtool.pack([src], tmp_path / "out", max_len=128)  # shape: from the header
    again = packtool.pack([src.with_suffix(".jsonl")], tmp_path / "same", max_len=128)
    assert report.documents.packed == again.documents.packed == len(rows)
    assert report.tokens_learned == again.tokens_learned > 0  # completions learned: labels
    assert _shards_sha(tmp_path / "out") == _shards_sha(tmp_path / "same")


def test_what_a_format_does_not_give_is_refused_by_its_reader(
    tsv: TsvReader, tmp_path: Path
) -> None:
    src = _write(tmp_path, "docs", ["text"], [["a"], ["b"]])
    with pytest.raises(InputError, match=r"docs\.tsv: a \.tsv input holds text, not token ids"):
        packtool.pack([src], tmp_path / "out", max_len=64, ids_field="text", pad_id=0)


def test_a_kind_or_suffix_is_claimed_once(tsv: TsvReader) -> None:
    with pytest.raises(ValueError, match="input kind 'tsv' has a reader already"):
        register(TsvReader())

    class Other(TsvReader):
        kind = "other"

    with pytest.raises(ValueError, match=r"\.tsv names 'tsv' inputs already"):
        register(Other())
    assert "other" not in FORMATS


def _megatron(prefix: Path, docs: list[list[int]]) -> None:
    """A Megatron-LM indexed dataset (int32 tokens), written by hand as its format says."""
    import struct

    import numpy as np

    lengths = np.array([len(d) for d in docs], "<i4")
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1]) * 4]).astype("<i8")
    prefix.with_suffix(".bin").write_bytes(np.array([t for d in docs for t in d], "<i4").tobytes())
    header = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 4, len(docs), len(docs) + 1)
    counts = np.arange(len(docs) + 1, dtype="<i8").tobytes()
    prefix.with_suffix(".idx").write_bytes(header + lengths.tobytes() + pointers.tobytes() + counts)


def test_the_megatron_reader_is_one_of_the_table(tmp_path: Path) -> None:
    _megatron(tmp_path / "m", [[5, 6, 7], [8, 9], [3, 4, 5, 6]])
    for named in ("m", "m.idx", "m.bin"):  # the prefix, the index, the data file
        (inp,) = resolve_inputs([str(tmp_path / named)])
        assert (inp.kind, inp.path) == ("megatron", tmp_path / "m.idx")
    assert reader_for("megatron").ids_field == "tokens"
    assert first_record_fields(inp) is None
    report = packtool.pack([str(tmp_path / "m")], tmp_path / "out", max_len=8, pad_id=0)
    assert report.documents.packed == 3 and report.tokens == 9
    with pytest.raises(
        InputError, match=r"m\.idx: a Megatron indexed dataset holds token ids, not text"
    ):
        next(iter(read_texts(inp)))
    jsonl = tmp_path / "pc.jsonl"
    jsonl.write_text('{"prompt": "a", "completion": "b"}\n')
    with pytest.raises(InputError, match="holds token ids, not prompt/completion or chat records"):
        packtool.pack(
            [str(tmp_path / "m"), jsonl],
            tmp_path / "o2",
            max_len=64,
            input_shape="prompt-completion",
        )
