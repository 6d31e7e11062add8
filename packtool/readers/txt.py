"""Plain text inputs: a document a line, a paragraph or the whole file (no fields: the reader
gives the texts itself)."""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import BadRecordError, InputError
from ..limits import max_record_bytes, record_too_long
from .base import FieldReader, TextRequest
from .batches import TextBatch, Want
from .files import InputFile, open_binary


def read_texts(inp: InputFile, unit: str, skip_bad: bool, batch_docs: int) -> Iterator[TextBatch]:
    stream, counter = open_binary(inp)
    with stream:
        limit = max_record_bytes()
        if unit == "document":
            data = stream.read(limit + 1)
            if len(data) > limit:
                raise InputError(record_too_long(str(inp.path), limit, "document"))
            try:
                yield TextBatch([data.decode("utf-8")], bytes_done=inp.size_bytes)
            except UnicodeDecodeError as e:
                error = BadRecordError(str(inp.path), f"invalid UTF-8 at byte {e.start}")
                if not skip_bad:
                    raise error.with_skip_hint() from None
                yield TextBatch([None], bad=[error], bytes_done=inp.size_bytes)
            return
        batch = TextBatch([])
        paragraph: list[str] = []
        paragraph_size = 0
        lineno = 0
        while raw_line := stream.readline(limit + 1):
            lineno += 1
            if len(raw_line) > limit:
                raise InputError(record_too_long(f"{inp.path}:{lineno}", limit))
            try:
                line = raw_line.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                error = BadRecordError(f"{inp.path}:{lineno}", f"invalid UTF-8 ({e.reason})")
                if not skip_bad:
                    raise error.with_skip_hint() from None
                batch.texts.append(None)
                batch.bad.append(error)
                continue
            if unit == "line":
                batch.texts.append(line)
            elif line.strip():
                paragraph.append(line)
                paragraph_size += len(raw_line)
                if paragraph_size > limit:
                    raise InputError(record_too_long(f"{inp.path}:{lineno}", limit, "paragraph"))
            elif paragraph:
                batch.texts.append("\n".join(paragraph))
                paragraph, paragraph_size = [], 0
            if len(batch.texts) >= batch_docs:
                batch.bytes_done = counter.count
                yield batch
                batch = TextBatch([])
        if paragraph:
            batch.texts.append("\n".join(paragraph))
        batch.bytes_done = inp.size_bytes
        if batch.texts:
            yield batch


class TextReader(FieldReader):
    """Plain text: texts only, no fields."""

    kind = "txt"
    suffixes = (".txt",)
    compressible = True
    gives = frozenset({Want.TEXT})

    def texts(self, inp: InputFile, request: TextRequest) -> Iterator[TextBatch]:
        return read_texts(inp, request.txt_unit, request.skip_bad_records, request.batch_docs)

    def refusal(self, inp: InputFile, want: Want) -> Exception:
        if want is Want.RECORDS:
            return InputError(
                f"{inp.path}: a .txt input holds plain text, not prompt/completion or chat "
                "records: use JSON Lines, JSON, Parquet, Arrow or CSV, or --input-shape text"
            )
        return super().refusal(inp, want)


READER = TextReader()
