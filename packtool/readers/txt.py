"""Plain text inputs: a document a line, a paragraph or the whole file."""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import BadRecordError
from .batches import (
    TextBatch,
)
from .files import (
    InputFile,
    open_binary,
)


def read_texts(inp: InputFile, unit: str, skip_bad: bool, batch_docs: int) -> Iterator[TextBatch]:
    stream, counter = open_binary(inp)
    with stream:
        if unit == "document":
            data = stream.read()
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
        lineno = 0
        for raw_line in stream:
            lineno += 1
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
            elif paragraph:
                batch.texts.append("\n".join(paragraph))
                paragraph = []
            if len(batch.texts) >= batch_docs:
                batch.bytes_done = counter.count
                yield batch
                batch = TextBatch([])
        if paragraph:
            batch.texts.append("\n".join(paragraph))
        batch.bytes_done = inp.size_bytes
        if batch.texts:
            yield batch
