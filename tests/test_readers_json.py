"""JSON Lines through its one reader: pyarrow's parser and ``json.loads`` give the same texts.

Texts of JSON Lines go through pyarrow's JSON parser wherever it takes a piece, and through
``json.loads`` line by line where it refuses one (and for instruction records). The text the
tokenizer gets must be exactly what ``json.loads`` gives, for any string: these properties
check that the two parsers agree, or that the difference is refused loudly (a bad record).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import packtool
from packtool.errors import BadRecordError
from packtool.readers import Want, read, read_records, read_texts, resolve_inputs

# Any code point, lone surrogates included (hypothesis leaves them out by default).
ANY_CHAR = st.characters(min_codepoint=0, max_codepoint=0x10FFFF, blacklist_categories=())


def _escaped(text: str, how: list[bool]) -> str:
    """``text`` as a JSON string, each character written raw or as a \\u escape (a code
    point above the BMP as its surrogate pair) as ``how`` says; what JSON must escape is."""
    out = ['"']
    for i, ch in enumerate(text):
        cp = ord(ch)
        if ch in '"\\' or cp < 0x20 or (how[i % len(how)] if how else False):
            if cp > 0xFFFF:
                cp -= 0x10000
                out.append(f"\\u{0xD800 + (cp >> 10):04x}\\u{0xDC00 + (cp & 0x3FF):04x}")
            else:
                out.append(f"\\u{cp:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _valid_unicode(text: str) -> bool:
    return not any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def _expected(line: bytes) -> str | None:
    """What ``json.loads`` makes of a line's text, or ``None`` where it is a bad record."""
    try:
        text = json.loads(line.decode("utf-8"))["text"]
    except (UnicodeDecodeError, ValueError):
        return None
    return text if _valid_unicode(text) else None


def _read(path: Path, **kwargs) -> tuple[list[str | None], list[BadRecordError]]:
    (inp,) = resolve_inputs([path])
    texts: list[str | None] = []
    bad: list[BadRecordError] = []
    for batch in read_texts(inp, skip_bad_records=True, **kwargs):
        texts.extend(batch.texts)
        bad.extend(batch.bad)
    return texts, bad


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(st.text(ANY_CHAR, max_size=40), min_size=1, max_size=4),
    how=st.lists(st.booleans(), max_size=7),
    extra=st.booleans(),
)
@example(texts=["\x00", "\ud83d\ude00", "\ud800", "\udc80x\ud800"], how=[True], extra=False)
@example(texts=["\u2028\u2029\ufeff\uffff", "a\r\nb"], how=[False], extra=True)
def test_arrow_and_json_loads_give_the_same_texts(
    texts: list[str], how: list[bool], extra: bool
) -> None:
    """Every line's text is json.loads' text exactly, or the line is a bad record (named)."""
    lines = []
    for i, text in enumerate(texts):
        other = f', "id": {i}, "meta": {{"n": [1, 2.5, null]}}' if extra else ""
        line = '{"text": ' + _escaped(text, how) + other + "}"
        lines.append(line.encode("utf-8", "surrogatepass"))  # a raw lone surrogate: bad UTF-8
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        path.write_bytes(b"\n".join(lines) + b"\n")
        got, bad = _read(path)
    expected = [_expected(line) for line in lines]
    assert got == expected
    assert len(bad) == expected.count(None)
    for error in bad:
        assert str(error).startswith(f"{path}:"), error  # named by its line


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(st.text(ANY_CHAR, max_size=40), min_size=1, max_size=4),
    how=st.lists(st.booleans(), max_size=7),
    gaps=st.lists(st.sampled_from(["", " ", "\n", "\n  ", "\r\n\t"]), min_size=1, max_size=5),
)
@example(texts=["\x00", "\ud83d\ude00", "\ud800", 'x]},{["\\'], how=[True, False], gaps=["\n"])
def test_a_json_array_streamed_gives_json_loads_texts(
    texts: list[str], how: list[bool], gaps: list[str]
) -> None:
    """A JSON array's texts stream through pyarrow (its elements cut by a NumPy scan): each
    is what ``json.load`` gives (which decodes bytes with "surrogatepass": a surrogate
    written as raw UTF-8 becomes a lone surrogate), or a named bad element."""
    elements = ['{"text": ' + _escaped(t, how) + "}" for t in texts]
    body = "[" + gaps[0] + ("," + gaps[-1]).join(elements) + gaps[len(gaps) // 2] + "]"
    data = body.encode("utf-8", "surrogatepass")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "a.json"
        path.write_bytes(data)
        loaded = json.loads(data)  # bytes, as json.load reads them
        got, bad = _read(path)
    expected = [t if _valid_unicode(t) else None for t in (e["text"] for e in loaded)]
    assert got == expected
    assert [str(e).split(": ")[1] for e in bad] == [
        f"element {i}" for i, t in enumerate(expected) if t is None
    ]


@settings(max_examples=50, deadline=None)
@given(texts=st.lists(st.text(ANY_CHAR, max_size=30), min_size=1, max_size=4))
def test_records_are_json_loads_values(texts: list[str]) -> None:
    """Instruction records are the values json.loads gives (or bad records, loudly)."""
    lines = [json.dumps({"prompt": t, "completion": t[::-1]}) for t in texts]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        (inp,) = resolve_inputs([path])
        got = [
            r
            for batch in read_records(inp, fields=["prompt", "completion"], check=lambda r, loc: r)
            for r in batch.records
        ]
    assert got == [json.loads(line) for line in lines]


def test_the_texts_of_good_pieces_come_from_pyarrow(tmp_path: Path) -> None:
    """The property above tests pyarrow's path, not only the line-by-line one: a piece with
    nothing irregular is parsed by pyarrow (Arrow columns), one with a bad line is not."""
    good = tmp_path / "good.jsonl"
    good.write_text('{"text": "a\\u00e9\\ud83d\\ude00\\u0000"}\n', encoding="utf-8")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "\\ud800"}\n', encoding="utf-8")
    (part,) = read(resolve_inputs([good])[0], ["text"], Want.TEXT)
    assert part.table is not None and part.table.column(0).to_pylist() == ["aé😀\x00"]
    (part,) = read(resolve_inputs([bad])[0], ["text"], Want.TEXT)
    assert part.table is None and part.values == [{"text": "\ud800"}]
    array = tmp_path / "array.json"
    array.write_text('[{"text": "a"},\n {"text": "b\\n", "id": 2}]', encoding="utf-8")
    (part,) = read(resolve_inputs([array])[0], ["text"], Want.TEXT)
    assert part.table is not None and part.table.column(0).to_pylist() == ["a", "b\n"]


def test_a_text_longer_than_a_piece(tmp_path: Path) -> None:
    """A line longer than the 8 MB pieces, full of escapes, is read whole and exactly."""
    text = ('\u00e9\\"\n\t\U0001f600\x00 ' * 800_000)[:9_000_000]
    line = json.dumps({"text": text})
    path = tmp_path / "long.jsonl"
    path.write_text('{"text": "short"}\n' + line + "\n" + '{"text": "end"}\n', encoding="utf-8")
    got, bad = _read(path)
    assert got == ["short", text, "end"] and not bad


def test_two_objects_on_a_line_are_a_bad_record(tmp_path: Path) -> None:
    """pyarrow's parser reads ``{..}{..}`` on one line as two records; json.loads refuses it.
    The reader counts records per line, so the line is a bad record, not two documents."""
    path = tmp_path / "two.jsonl"
    path.write_text('{"text": "a"}{"text": "b"}\n{"text": "c"}\n', encoding="utf-8")
    with pytest.raises(BadRecordError, match=r"two\.jsonl:1: malformed JSON: Extra data"):
        _read_all(path)
    assert _read(path)[0] == [None, "c"]


def _read_all(path: Path) -> list[str | None]:
    (inp,) = resolve_inputs([path])
    return [t for batch in read_texts(inp) for t in batch.texts]


def test_blank_lines_keep_line_numbers(tmp_path: Path) -> None:
    """Blank lines are no records, and later lines keep their own numbers in errors."""
    path = tmp_path / "blank.jsonl"
    path.write_text('{"text": "a"}\n\n   \n{"text": "b"}\n{"text": 3}\n', encoding="utf-8")
    assert _read(path)[0] == ["a", "b", None]
    with pytest.raises(BadRecordError, match=r"blank\.jsonl:5: field 'text' is int"):
        _read_all(path)


@pytest.mark.parametrize("where", [0, 1, 500, 1000])
def test_a_null_line_anywhere_is_a_bad_record(tmp_path: Path, where: int) -> None:
    """pyarrow's JSON reader crashes the process on a ``null`` line at the start of one of
    its blocks; texts are parsed as one block (only the first line is checked), token ids in
    blocks (every line is). Either way the line is a bad record, named, and nothing crashes."""
    from packtool.readers import column_batches

    lines = [json.dumps({"text": f"t{i}", "ids": [i, i + 1]}) for i in range(1000)]
    lines.insert(where, "null")
    path = tmp_path / "n.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(BadRecordError, match=rf"n\.jsonl:{where + 1}: expected a JSON object"):
        _read_all(path)
    texts, bad = _read(path)
    assert texts[where] is None and len(bad) == 1 and texts.count(None) == 1
    problems = {}
    row = 0
    for part in column_batches(resolve_inputs([path])[0], ["ids"]):
        problems.update({row + r: (p, part.locate(r)) for r, p in part.problems.items()})
        row += part.batch.num_rows
    assert problems == {where: ("expected a JSON object, found null", f"{path}:{where + 1}")}


def test_a_byte_order_mark_at_the_start_is_not_part_of_the_first_record(tmp_path: Path) -> None:
    """A JSON Lines file a Windows tool wrote with a UTF-8 BOM: texts, records and the shape
    detection read it as without one (json.loads refused its first line: the first chat or
    prompt/completion record was a bad record, while pyarrow read the texts), also where a
    bad line makes the piece be re-read line by line."""
    from packtool.readers import first_record_fields

    rows = [{"prompt": f"p{i}", "completion": f"c{i}", "text": f"t{i}"} for i in range(3)]
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    plain, bom = tmp_path / "plain.jsonl", tmp_path / "bom.jsonl"
    plain.write_bytes(body)
    bom.write_bytes(b"\xef\xbb\xbf" + body)
    fields = ["prompt", "completion"]

    def records(path: Path) -> list:
        inp = resolve_inputs([path])[0]
        out = []
        for b in read_records(inp, fields=fields, check=lambda r, loc: r):
            assert not b.bad
            out += b.records
        return out

    def texts(path: Path) -> list:  # a skipped bad record is None
        inp = resolve_inputs([path])[0]
        return [t for b in read_texts(inp, text_field="text", skip_bad_records=True)
                for t in b.texts]  # fmt: skip

    assert records(bom) == records(plain) == rows
    assert texts(bom) == texts(plain) == ["t0", "t1", "t2"]
    assert first_record_fields(resolve_inputs([bom])[0]) == ["prompt", "completion", "text"]
    broken = tmp_path / "broken.jsonl"  # a bad line: the piece is parsed line by line
    broken.write_bytes(b"\xef\xbb\xbf" + body + b"{not json\n")
    assert texts(broken) == ["t0", "t1", "t2", None]  # only the last line is bad


def test_a_file_of_a_byte_order_mark_alone_holds_no_record(tmp_path: Path) -> None:
    """Three bytes, the mark and nothing after it (found by tests/test_faults.py's fuzzing):
    no record, the one-line "nothing to pack" of an empty file, not an IndexError."""
    from packtool.errors import NothingToPackError

    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf")
    inp = resolve_inputs([path])[0]
    assert [t for b in read_texts(inp, text_field="text") for t in b.texts] == []
    with pytest.raises(NothingToPackError, match="no documents"):
        packtool.pack([path], tmp_path / "out", max_len=64)
