"""Instruction data: prompt/completion and chat records packed with exact loss labels.

The expected tokens and labels are built here by hand (ChatML by string operations, pieces
tokenized apart), not through packtool's template code, and compared with the rows read back
with pyarrow.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO, CharTokenizer, write_jsonl
from helpers import assert_row_invariants, read_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli import assert_one_line_error, run

import packtool
from packtool.chat import ChatTemplate, load_chat_template
from packtool.errors import BadRecordError, ChatTemplateError, InputError, OptionError
from packtool.instruct import InputShape, InstructEncoder, LossOn
from packtool.readers import read_records, resolve_inputs

CHAT = REPO / "sample_data" / "chat.jsonl"
PROMPT_COMPLETION = REPO / "sample_data" / "prompt_completion.jsonl"
CHATML = REPO / "sample_data" / "chatml.jinja"
IGNORE = -100


def load_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def learned_runs(ids: list[int], labels: list[int]) -> list[list[int]]:
    """The maximal runs of learned tokens, in order."""
    runs: list[list[int]] = []
    current: list[int] = []
    for t, label in zip(ids, labels, strict=True):
        if label != IGNORE:
            assert label == t, "a label is the token at its own position"
            current.append(t)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def segments(row: dict):
    """(doc_id, chunk_id, ids, labels) of every document segment of a row."""
    cu = row["cu_seqlens"]
    for k, (doc, chunk) in enumerate(zip(row["doc_ids"], row["chunk_ids"], strict=True)):
        yield doc, chunk, row["input_ids"][cu[k] : cu[k + 1]], row["labels"][cu[k] : cu[k + 1]]


def assert_label_invariants(row: dict, max_len: int, pad_id: int) -> None:
    assert_row_invariants(row, max_len, pad_id)
    n = row["num_tokens"]
    assert len(row["labels"]) == max_len
    assert all(label == IGNORE for label in row["labels"][n:]), "padding is never learned"
    for start in row["cu_seqlens"][:-1]:
        assert row["labels"][start] == IGNORE, "the first token of a segment is never learned"
    for t, label in zip(row["input_ids"], row["labels"], strict=True):
        assert label in (IGNORE, t)


def chatml_expected(tok, messages: list[dict], learn_all: bool = False) -> tuple[list, list]:
    """Ids and labels of a ChatML conversation, built by hand: each assistant content is
    tokenized apart from the text around it, and it and its <|im_end|> are learned."""
    pieces: list[tuple[str, bool]] = []
    context = ""
    for m in messages:
        head = f"<|im_start|>{m['role']}\n"
        if m["role"] == "assistant":
            pieces += [(context + head, False), (m["content"], True), ("<|im_end|>", True)]
            context = "\n"
        else:
            context += head + m["content"] + "<|im_end|>\n"
    pieces.append((context, False))
    ids: list[int] = []
    labels: list[int] = []
    for text, learned in pieces:
        if not text:
            continue
        piece = tok.encode_batch([text], add_special_tokens=False, parse_special=True)[0]
        ids += piece
        labels += piece if (learned or learn_all) else [IGNORE] * len(piece)
    if labels:
        labels[0] = IGNORE
    return ids, labels


# -- the check: every row of a packed chat sample ------------------------------------


def test_chat_sample_learned_tokens_are_the_assistant_contents(tmp_path: Path) -> None:
    """On every row: the learned tokens of each segment decode to exactly the assistant
    contents, each followed by its end-of-turn token, in order, and nothing else."""
    out = tmp_path / "out"
    report = packtool.pack([CHAT], out, max_len=2048, chat_template=CHATML)
    manifest, rows = read_rows(out)
    tok = packtool.load_tokenizer()
    conversations = [r["messages"] for r in load_jsonl(CHAT)]
    seen: set[int] = set()
    learned_total = 0
    for row in rows:
        assert_label_invariants(row, 2048, tok.special.pad_id)
        for doc, chunk, ids, labels in segments(row):
            assert chunk == 0 and doc not in seen
            seen.add(doc)
            messages = conversations[doc]
            want = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
            got = [tok.decode(run) for run in learned_runs(ids, labels)]
            assert got == want, f"conversation {doc}"
            # The tokens themselves, and the labels, against a construction by hand.
            assert (ids, labels) == chatml_expected(tok, messages), f"conversation {doc}"
            learned_total += sum(label != IGNORE for label in labels)
    # Conversations that do not fit max-len are dropped (the default for chats) and counted.
    lengths = {i: len(chatml_expected(tok, m)[0]) for i, m in enumerate(conversations)}
    too_long = {i for i, n in lengths.items() if n > 2048}
    assert too_long, "the sample has conversations longer than 2048 tokens"
    assert seen == set(lengths) - too_long
    docs = manifest["documents"]
    assert docs["dropped"] == len(too_long) == report.documents.dropped
    assert docs["read"] == 300 == docs["packed"] + docs["dropped"]
    assert manifest["tokens"]["dropped"] == sum(lengths[i] for i in too_long)
    assert manifest["tokens"]["learned"] == learned_total == report.tokens_learned
    assert manifest["columns"][-1] == "labels"
    options = manifest["options"]
    assert options["input_shape"] == "chat" and options["input_shape_auto"] is True
    assert options["loss_on"] == "assistant" and options["overflow"] == "drop"
    assert options["add_eos"] is False
    assert (
        options["chat_template"]["sha256"]
        == __import__("hashlib").sha256(CHATML.read_bytes()).hexdigest()
    )
    assert manifest["labels"]["piece_encoding"] == "plain"
    assert report.learned_share == pytest.approx(learned_total / (len(rows) * 2048))
    # packtool's own reader and datasets see the labels too.
    reader = packtool.open_packed(out)
    assert reader.has_labels and reader[0].labels.tolist() == rows[0]["labels"]


def test_prompt_completion_sample(tmp_path: Path) -> None:
    """The completion and the EOS that closes it are learned; the prompt is not."""
    out = tmp_path / "out"
    packtool.pack([PROMPT_COMPLETION], out, max_len=1024)
    manifest, rows = read_rows(out)
    tok = packtool.load_tokenizer()
    records = load_jsonl(PROMPT_COMPLETION)
    eos = tok.special.eos_id
    expected = {}
    for i, r in enumerate(records):
        prompt, completion = tok.encode_batch([r["prompt"], r["completion"]], False)
        ids = prompt + completion + [eos]
        labels = [IGNORE] * len(prompt) + completion + [eos]
        labels[0] = IGNORE
        expected[i] = (ids, labels)
    seen = set()
    for row in rows:
        assert_label_invariants(row, 1024, tok.special.pad_id)
        for doc, _chunk, ids, labels in segments(row):
            seen.add(doc)
            assert (ids, labels) == expected[doc], f"record {doc}"
            runs = learned_runs(ids, labels)
            assert len(runs) == 1
            assert tok.decode(runs[0]) == records[doc]["completion"] + "<|endoftext|>"
    too_long = {i for i, (ids, _) in expected.items() if len(ids) > 1024}
    assert seen == set(expected) - too_long
    assert manifest["documents"]["dropped"] == len(too_long) > 0
    assert manifest["options"]["input_shape"] == "prompt-completion"
    assert manifest["options"]["loss_on"] == "completion"
    assert manifest["options"]["chat_template"] is None


def test_loss_on_all(tmp_path: Path) -> None:
    packtool.pack([CHAT], tmp_path / "c", max_len=4096, chat_template=CHATML, loss_on="all")
    manifest, rows = read_rows(tmp_path / "c")
    tok = packtool.load_tokenizer()
    conversations = [r["messages"] for r in load_jsonl(CHAT)]
    for row in rows:
        assert_label_invariants(row, 4096, tok.special.pad_id)
        for doc, _chunk, ids, labels in segments(row):
            assert labels == [IGNORE, *ids[1:]]
            assert (ids, labels) == chatml_expected(tok, conversations[doc], learn_all=True)
    assert manifest["tokens"]["learned"] == manifest["tokens"]["packed"] - manifest["segments"]


def test_text_with_loss_on_all(tmp_path: Path, docs_jsonl: Path) -> None:
    """Plain text can get a labels column too: every token learned but segment starts."""
    packtool.pack(
        [docs_jsonl], tmp_path / "o", max_len=16, tokenizer=CharTokenizer(), loss_on="all"
    )
    manifest, rows = read_rows(tmp_path / "o")
    for row in rows:
        assert_label_invariants(row, 16, 1)
        for _doc, _chunk, ids, labels in segments(row):
            assert labels == [IGNORE, *ids[1:]]
    assert manifest["tokens"]["learned"] == manifest["tokens"]["packed"] - manifest["segments"]
    assert manifest["options"]["input_shape"] == "text" and manifest["labels"]["loss_on"] == "all"


def test_text_corpus_unchanged_by_auto_detection(tmp_path: Path, docs_jsonl: Path) -> None:
    report = packtool.pack([docs_jsonl], tmp_path / "o", max_len=16, tokenizer=CharTokenizer())
    manifest, rows = read_rows(tmp_path / "o")
    assert "labels" not in manifest["columns"] and "labels" not in rows[0]
    assert manifest["options"]["input_shape"] == "text"
    assert manifest["options"]["loss_on"] is None and "labels" not in manifest
    assert "learned" not in manifest["tokens"] and report.tokens_learned is None


# -- exact boundaries with a tokenizer that merges across them ------------------------------


@pytest.fixture(scope="module")
def merging_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """A byte-level BPE without pre-tokenizer splits, trained so that its merges cross the
    boundaries of the examples below ("\\nYes", ": yes", "]yes[")."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [
        "assistant\nYes, sure. user\nDo it. ",
        "Answer: yes. Answer: no. ",
        "[assistant]yes[/assistant][user]ok[/user]",
    ]
    tok.train_from_iterator([t * 40 for t in texts] * 20, trainer)
    path = tmp_path_factory.mktemp("merging") / "tokenizer.json"
    tok.save(str(path))
    return packtool.load_tokenizer(path)


def straddles(tok, text: str, boundary: int) -> bool:
    """Whether tokenizing ``text`` whole puts a token across character ``boundary``."""
    enc = tok.tokenizer.encode(text, add_special_tokens=False)
    return any(a < boundary < b for a, b in enc.offsets)


CHATML_MARKED = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\\n' }}{% else %}{{ m.content + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
)


def hf_reference(tok, messages: list[dict], marked: str) -> tuple[list[int], list[int]]:
    """transformers' ids and assistant mask of ``messages`` with the ``marked`` template."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tok.tokenizer)
    out = hf.apply_chat_template(
        messages,
        chat_template=marked,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    return list(out["input_ids"]), list(out["assistant_masks"])


def test_chat_boundaries_with_merging_tokenizer(tmp_path: Path, merging_tokenizer) -> None:
    """A token across the start of an assistant content (this tokenizer merges "\\nYes"): the
    chat holds the ids of the whole rendering, and the token is learned (it overlaps the
    assistant's text: the rule of transformers' assistant mask)."""
    tok = merging_tokenizer
    messages = [
        {"role": "user", "content": "Do it."},
        {"role": "assistant", "content": "Yes, sure."},
        {"role": "user", "content": "Do it."},
        {"role": "assistant", "content": "Yes"},
    ]
    template = load_chat_template(CHATML, tok)
    rendered = template.render(messages)
    assert ChatTemplate.from_string(CHATML_MARKED).render(messages) == rendered
    boundary = rendered.index("Yes, sure.")
    assert straddles(tok, rendered, boundary), "the test needs a merge across the boundary"
    src = write_jsonl(tmp_path / "c.jsonl", [{"messages": messages}])
    packtool.pack([src], tmp_path / "o", max_len=64, tokenizer=tok, chat_template=CHATML)
    _, rows = read_rows(tmp_path / "o")
    ((_, _, ids, labels),) = segments(rows[0])
    want_ids, mask = hf_reference(tok, messages, CHATML_MARKED)
    assert ids == want_ids
    assert [int(label != IGNORE) for label in labels] == mask
    assert tok.decode(ids) == rendered
    runs = [tok.decode(r) for r in learned_runs(ids, labels)]
    assert len(runs) == 2 and runs[0].endswith("Yes, sure.<|im_end|>")
    assert runs[0] != "Yes, sure.<|im_end|>", "the straddling token is learned"


def test_boundaries_without_special_tokens(tmp_path: Path, merging_tokenizer) -> None:
    """A template that closes turns with plain text: merges on both sides of the content;
    the tokens overlapping the content are learned, and nothing after them (the turn has no
    control token)."""
    tok = merging_tokenizer
    text = (
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}[/{{ m.role }}]{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    marked = (
        "{% for m in messages %}[{{ m.role }}]{% if m.role == 'assistant' %}{% generation %}"
        "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}"
        "[/{{ m.role }}]{% endfor %}"
    )
    (tmp_path / "t.jinja").write_text(text)
    messages = [{"role": "user", "content": "ok"}, {"role": "assistant", "content": "yes"}]
    rendered = "[user]ok[/user][assistant]yes[/assistant]"
    assert ChatTemplate.from_string(text).render(messages) == rendered
    at = rendered.index("yes")
    assert straddles(tok, rendered, at) and straddles(tok, rendered, at + 3)
    src = write_jsonl(tmp_path / "c.jsonl", [{"messages": messages}])
    packtool.pack(
        [src], tmp_path / "o", max_len=64, tokenizer=tok, chat_template=tmp_path / "t.jinja"
    )
    _, rows = read_rows(tmp_path / "o")
    ((_, _, ids, labels),) = segments(rows[0])
    want_ids, mask = hf_reference(tok, messages, marked)
    assert ids == want_ids
    assert [int(label != IGNORE) for label in labels] == mask
    assert tok.decode(ids) == rendered


def test_prompt_completion_boundary_with_merging_tokenizer(
    tmp_path: Path, merging_tokenizer
) -> None:
    tok = merging_tokenizer
    assert straddles(tok, "Answer: yes", len("Answer:"))
    src = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Answer:", "completion": " yes"}])
    packtool.pack([src], tmp_path / "o", max_len=32, tokenizer=tok)
    _, rows = read_rows(tmp_path / "o")
    ((_, _, ids, labels),) = segments(rows[0])
    assert [tok.decode(r) for r in learned_runs(ids, labels)] == [" yes<|endoftext|>"]
    assert tok.decode(ids) == "Answer: yes<|endoftext|>"


def test_metaspace_tokenizer_pieces_are_anchored(tmp_path: Path) -> None:
    """Llama/Mistral-style Metaspace(prepend_scheme="first") marks the start of every encoded
    text as a word start; pieces tokenized apart would gain spaces. packtool tokenizes them
    behind a special token instead, and the conversation decodes back exactly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=list(string.ascii_letters + string.punctuation + "\n"),
        show_progress=False,
    )
    tok.train_from_iterator(
        ["hello world, this is a test.\nAnother line: yes it is!"] * 50, trainer
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    hf = packtool.load_tokenizer(tmp_path / "tokenizer.json")
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "yes it is"}]
    template = load_chat_template(CHATML, hf)
    encoder = InstructEncoder(
        hf, shape=InputShape.CHAT, loss_on=LossOn.ASSISTANT, template=template, add_eos=False
    )
    assert encoder.piece_encoding == "anchored"
    encoded = encoder.encode([messages])
    ids, labels = encoded.ids.tolist(), encoded.labels.tolist()
    assert hf.decode(ids) == template.render(messages)
    (run,) = learned_runs(ids, labels)
    assert run[-1] == hf.token_to_id("<|im_end|>")
    assert hf.decode(run[:-1]) == "yes it is"
    # A special-token string in a content is text, re-encoded behind the anchor: no space
    # appears in front of it.
    messages[1]["content"] = "yes <|im_end|> it is"
    encoded = encoder.encode([messages])
    ids = encoded.ids.tolist()
    assert hf.decode(ids) == template.render(messages)
    assert ids.count(hf.token_to_id("<|im_end|>")) == 2


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["system", "user", "assistant", "tool"]),
            st.one_of(
                st.text(alphabet="Yes, sure.\n aé文🎉", max_size=12),
                st.sampled_from(["bos", "eos", "assistant", "\n", " ", "user\n"]),
            ),
        ),
        min_size=1,
        max_size=7,
    )
)
def test_property_learned_runs_are_assistant_contents(merging_tokenizer, turns) -> None:
    tok = merging_tokenizer
    template = load_chat_template(CHATML, tok)
    messages = [{"role": r, "content": c} for r, c in turns]
    encoder = InstructEncoder(
        tok, shape=InputShape.CHAT, loss_on=LossOn.ASSISTANT, template=template, add_eos=False
    )
    encoded = encoder.encode([messages])
    ids, labels = encoded.ids.tolist(), encoded.labels.tolist()
    assert tok.decode(ids) == template.render(messages)
    learned = [t for t, label in zip(ids, labels, strict=True) if label != IGNORE]
    want = "".join(m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant")
    assert tok.decode(learned) == want
    # Each assistant content is its own run when it has tokens (runs never merge: context
    # separates them).
    runs = [tok.decode(r) for r in learned_runs(ids, labels)]
    assert runs == [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]


# -- overflow --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_chat(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[dict]]]:
    """The first 60 conversations of the sample, plus one without an assistant message and
    one whose first 200 tokens hold no assistant content."""
    conversations = [r["messages"] for r in load_jsonl(CHAT)[:60]]
    conversations.append([{"role": "user", "content": "Nobody answers."}])
    conversations.append(
        [
            {"role": "user", "content": "word " * 400},
            {"role": "assistant", "content": "Done."},
        ]
    )
    path = tmp_path_factory.mktemp("small") / "chat.jsonl"
    write_jsonl(path, [{"messages": m} for m in conversations])
    return path, conversations


@pytest.mark.parametrize("policy", ["drop", "truncate", "split"])
def test_chat_overflow(tmp_path: Path, small_chat, policy: str) -> None:
    src, conversations = small_chat
    L = 200
    tok = packtool.load_tokenizer()
    report = packtool.pack([src], tmp_path / "o", max_len=L, chat_template=CHATML, overflow=policy)
    manifest, rows = read_rows(tmp_path / "o")
    # Brute force: every conversation's ids and labels, then each policy by hand.
    want: dict[tuple[int, int], tuple[list, list]] = {}
    counts = dict.fromkeys(["packed", "split", "truncated", "dropped", "empty"], 0)
    no_labels = chunks_dropped = 0
    for d, messages in enumerate(conversations):
        ids, labels = chatml_expected(tok, messages)
        n = len(ids)
        if policy == "truncate":
            ids, labels = ids[:L], labels[:L]
        if policy == "split":
            chunks = []
            for k in range(0, len(ids), L):
                lab = [IGNORE, *labels[k + 1 : k + L]]
                chunks.append((ids[k : k + L], lab))
        else:
            chunks = [(ids, labels)]
        if all(label == IGNORE for _, lab in chunks for label in lab):
            counts["empty"] += 1
            no_labels += 1
            continue
        if n <= L:
            counts["packed"] += 1
        elif policy == "drop":
            counts["dropped"] += 1
            continue
        else:
            counts["split" if policy == "split" else "truncated"] += 1
        for k, (ids_k, lab_k) in enumerate(chunks):
            if all(label == IGNORE for label in lab_k):
                chunks_dropped += 1
                continue
            want[(d, k)] = (ids_k, lab_k)
    got = {}
    for row in rows:
        assert_label_invariants(row, L, tok.special.pad_id)
        for doc, chunk, ids, labels in segments(row):
            assert any(label != IGNORE for label in labels), "every segment has learned tokens"
            got[(doc, chunk)] = (ids, labels)
    assert got == want
    assert manifest["documents"] == {**counts, "read": 62, "bad_records_skipped": 0}
    assert counts["empty"] == no_labels >= 1
    assert manifest["labels"]["documents_without_labels"] == no_labels
    assert manifest["labels"]["chunks_without_labels_dropped"] == chunks_dropped
    assert (chunks_dropped > 0) == (policy == "split")
    learned = sum(label != IGNORE for _, lab in want.values() for label in lab)
    assert manifest["tokens"]["learned"] == learned == report.tokens_learned


def test_overflow_default_differs_by_shape(tmp_path: Path, small_chat, docs_jsonl: Path) -> None:
    src, _ = small_chat
    chat = packtool.pack([src], tmp_path / "c", max_len=200, chat_template=CHATML)
    assert chat.manifest["options"]["overflow"] == "drop" and chat.documents.dropped > 0
    text = packtool.pack([docs_jsonl], tmp_path / "t", max_len=16, tokenizer=CharTokenizer())
    assert text.manifest["options"]["overflow"] == "split" and text.documents.split == 1


# -- options and their checks ---------------------------------------------------------------


def test_bos_and_eos_on_chats(tmp_path: Path) -> None:
    src = write_jsonl(
        tmp_path / "c.jsonl",
        [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}],
    )
    tok = packtool.load_tokenizer()
    packtool.pack([src], tmp_path / "o", max_len=64, chat_template=CHATML, bos=True, add_eos=True)
    _, rows = read_rows(tmp_path / "o")
    ((_, _, ids, labels),) = segments(rows[0])
    base_ids, base_labels = chatml_expected(tok, json.loads(src.read_text())["messages"])
    assert ids == [tok.special.bos_id, *base_ids, tok.special.eos_id]
    assert labels == [IGNORE, *base_labels, IGNORE]  # EOS after a chat is context
    # A template that writes the BOS itself gets no second one.
    (tmp_path / "b.jinja").write_text("{{ bos_token }}" + CHATML.read_text())
    packtool.pack([src], tmp_path / "o2", max_len=64, chat_template=tmp_path / "b.jinja", bos=True)
    _, rows = read_rows(tmp_path / "o2")
    ((_, _, ids2, _),) = segments(rows[0])
    assert ids2 == [tok.special.bos_id, *base_ids]


def test_prompt_completion_post_processor_bos(tmp_path: Path) -> None:
    tok = CharTokenizer(bos_in_post_processor=True)
    src = write_jsonl(tmp_path / "p.jsonl", [{"q": "ab", "a": "c"}])
    packtool.pack(
        [src], tmp_path / "o", max_len=16, tokenizer=tok, prompt_field="q", completion_field="a"
    )
    manifest, rows = read_rows(tmp_path / "o")
    a, b, c = (ord(x) + 3 for x in "abc")
    n = rows[0]["num_tokens"]
    assert rows[0]["input_ids"][:n] == [2, a, b, c, 0]
    assert rows[0]["labels"][:n] == [IGNORE, IGNORE, IGNORE, c, 0]
    assert manifest["options"]["prompt_field"] == "q"


def test_option_errors(tmp_path: Path, docs_jsonl: Path) -> None:
    # each --loss-on names the records it is for (not "completion" for chats)
    with pytest.raises(OptionError, match=r"--loss-on assistant needs chat records, but .* text"):
        packtool.pack([docs_jsonl], tmp_path / "o", max_len=16, loss_on="assistant")
    with pytest.raises(OptionError, match=r"--loss-on completion needs prompt/completion records,"):
        packtool.pack([docs_jsonl], tmp_path / "o", max_len=16, loss_on="completion")
    with pytest.raises(OptionError, match=r"--loss-on completion does not apply to chat"):
        packtool.pack(
            [CHAT], tmp_path / "o", max_len=16, chat_template=CHATML, loss_on="completion"
        )
    with pytest.raises(OptionError, match=r"--loss-on must be one of"):
        packtool.pack([CHAT], tmp_path / "o", max_len=16, chat_template=CHATML, loss_on="answers")
    with pytest.raises(
        OptionError,
        match=r"--chat-template is for chat records.*text \(detected from the first record of "
        + re.escape(str(docs_jsonl)),
    ):
        packtool.pack([docs_jsonl], tmp_path / "o", max_len=16, chat_template=CHATML)
    with pytest.raises(ChatTemplateError, match=r"nope\.jinja: no such chat template file"):
        packtool.pack(
            [docs_jsonl], tmp_path / "o", max_len=16, chat_template=tmp_path / "nope.jinja"
        )
    with pytest.raises(OptionError, match=r"--input-shape must be one of"):
        packtool.pack([docs_jsonl], tmp_path / "o", max_len=16, input_shape="dialogue")
    # the input whose first record made the run one of chats is named: a directory of several
    # kinds of records (sample_data/ itself) is detected by its first file
    with pytest.raises(
        ChatTemplateError,
        match=r"^chat records \(detected from the first record of .*chat\.jsonl\) need a chat "
        r"template.*--chat-template",
    ):
        packtool.pack([CHAT.parent], tmp_path / "o", max_len=16)
    with pytest.raises(ChatTemplateError, match=r"^chat records need a chat template"):
        packtool.pack([CHAT], tmp_path / "o", max_len=16, input_shape="chat")
    with pytest.raises(ChatTemplateError, match=r"nope\.jinja: no such chat template file"):
        packtool.pack([CHAT], tmp_path / "o", max_len=16, chat_template=tmp_path / "nope.jinja")
    # A shape forced on records that lack its fields: the record is named.
    with pytest.raises(BadRecordError, match=r"docs\.jsonl:1: no field 'messages'.*--messages"):
        packtool.pack(
            [docs_jsonl], tmp_path / "o", max_len=16, input_shape="chat", chat_template=CHATML
        )
    assert not (tmp_path / "o").exists()


def test_template_from_tokenizer_config(tmp_path: Path) -> None:
    from packtool.tokenize import _DATA

    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_bytes((_DATA / "tokenizer.json").read_bytes())
    config = json.loads((_DATA / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": CHATML.read_text()}]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    report = packtool.pack([CHAT], tmp_path / "o", max_len=2048, tokenizer=model)
    template = report.manifest["options"]["chat_template"]
    assert template["source"] == "tokenizer_config.json"
    reference = packtool.pack([CHAT], tmp_path / "r", max_len=2048, chat_template=CHATML)
    assert read_rows(tmp_path / "o")[1] == read_rows(tmp_path / "r")[1]
    assert template["sha256"] == reference.manifest["options"]["chat_template"]["sha256"]
    # A chat_template.jinja next to the tokenizer, as recent transformers saves it.
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    (model / "chat_template.jinja").write_text(CHATML.read_text())
    report = packtool.pack([CHAT], tmp_path / "j", max_len=2048, tokenizer=model)
    assert report.manifest["options"]["chat_template"]["source"] == "chat_template.jinja"


def test_chat_template_given_as_a_tokenizer_config(tmp_path: Path) -> None:
    """`--chat-template tokenizer_config.json` takes its chat_template (the JSON text itself
    was rendered as the template, and every chat was "not prefix-consistent"); a directory
    or a JSON file without one is one line saying what --chat-template takes."""
    from packtool.tokenize import _DATA

    config = json.loads((_DATA / "tokenizer_config.json").read_text())
    config["chat_template"] = CHATML.read_text()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    report = packtool.pack(
        [CHAT], tmp_path / "o", max_len=2048, chat_template=tmp_path / "tokenizer_config.json"
    )
    reference = packtool.pack([CHAT], tmp_path / "r", max_len=2048, chat_template=CHATML)
    assert read_rows(tmp_path / "o")[1] == read_rows(tmp_path / "r")[1]
    template = report.manifest["options"]["chat_template"]
    assert template["sha256"] == reference.manifest["options"]["chat_template"]["sha256"]
    (tmp_path / "plain.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(ChatTemplateError, match=r"plain\.json: a JSON file without a chat_t"):
        packtool.pack([CHAT], tmp_path / "x", max_len=2048, chat_template=tmp_path / "plain.json")
    with pytest.raises(ChatTemplateError, match=r": a directory; --chat-template takes a Jinja"):
        packtool.pack([CHAT], tmp_path / "x", max_len=2048, chat_template=tmp_path)
    assert not (tmp_path / "x").exists()


def test_records_from_parquet_arrow_csv_and_json_array(tmp_path: Path) -> None:
    chats = [r["messages"] for r in load_jsonl(CHAT)[:20]]
    table = pa.table({"id": list(range(20)), "messages": chats})
    pq.write_table(table, tmp_path / "c.parquet")
    with pa.OSFile(str(tmp_path / "c.arrow"), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    (tmp_path / "c.json").write_text(json.dumps([{"messages": m} for m in chats]))
    write_jsonl(tmp_path / "c.jsonl", [{"messages": m} for m in chats])
    outs = {}
    for name in ("c.parquet", "c.arrow", "c.json", "c.jsonl"):
        report = packtool.pack(
            [tmp_path / name], tmp_path / name.replace(".", "_"), max_len=4096, chat_template=CHATML
        )
        assert report.manifest["options"]["input_shape"] == "chat", name
        outs[name] = read_rows(tmp_path / name.replace(".", "_"))[1]
    assert outs["c.parquet"] == outs["c.arrow"] == outs["c.json"] == outs["c.jsonl"]
    import pyarrow.csv as pc

    pairs = load_jsonl(PROMPT_COMPLETION)[:20]
    pc.write_csv(pa.Table.from_pylist(pairs), tmp_path / "p.csv")
    write_jsonl(tmp_path / "p.jsonl", pairs)
    packtool.pack([tmp_path / "p.csv"], tmp_path / "pc", max_len=4096)
    packtool.pack([tmp_path / "p.jsonl"], tmp_path / "pj", max_len=4096)
    assert read_rows(tmp_path / "pc")[1] == read_rows(tmp_path / "pj")[1]
    (tmp_path / "t.txt").write_text("a line\n")
    with pytest.raises(InputError, match=r"t\.txt: a \.txt input holds plain text"):
        packtool.pack(
            [tmp_path / "t.txt"],
            tmp_path / "x",
            max_len=64,
            input_shape="chat",
            chat_template=CHATML,
        )
    with pytest.raises(InputError, match=r"c\.parquet: no column 'conversation'"):
        packtool.pack(
            [tmp_path / "c.parquet"],
            tmp_path / "x",
            max_len=64,
            input_shape="chat",
            messages_field="conversation",
            chat_template=CHATML,
        )


def test_read_records_locations(tmp_path: Path) -> None:
    (tmp_path / "r.jsonl").write_text('{"a": 1}\n\n[1]\n{"a": 2}\n')
    (inp,) = resolve_inputs([tmp_path / "r.jsonl"])
    batches = list(
        read_records(inp, fields=["a"], check=lambda r, loc: r["a"], skip_bad_records=True)
    )
    (batch,) = batches
    assert batch.records == [1, None, 2]
    assert [Path(loc.split(":")[0]).name + ":" + loc.split(":")[1] for loc in batch.locations] == [
        "r.jsonl:1",
        "r.jsonl:3",
        "r.jsonl:4",
    ]
    assert "expected a JSON object, found array" in str(batch.bad[0])


# -- bad input -------------------------------------------------------------------------------

GOOD = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
BAD_CHATS = [
    ([{"content": "hi"}], r"message 0 has no 'role'"),
    ([{"role": "user"}], r"message 0 has no 'content'"),
    ([{"role": "user", "content": None}], r"message 0 has no 'content'"),
    ([{"role": "wizard", "content": "hi"}], r"message 0 has an unknown role 'wizard'"),
    ([{"role": "user", "content": 3}], r"message 0: 'content' is int, not a string"),
    ("just text", r"field 'messages' is string, not a list of messages"),
    (
        [GOOD[0], {"role": "assistant", "content": "FORBIDDEN"}],
        r"the chat template raised an error: no forbidden words",
    ),
]


@pytest.fixture
def strict_template(tmp_path: Path) -> Path:
    path = tmp_path / "strict.jinja"
    guard = (
        "{% for m in messages %}{% if 'FORBIDDEN' in m['content'] %}"
        "{{ raise_exception('no forbidden words') }}{% endif %}{% endfor %}"
    )
    path.write_text(guard + CHATML.read_text())
    return path


@pytest.mark.parametrize(("messages", "pattern"), BAD_CHATS)
def test_bad_chat_record_one_line_error(
    tmp_path: Path, strict_template: Path, messages, pattern: str
) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", [{"messages": GOOD}, {"messages": messages}])
    result = run("pack", src, "-L", "64", "-o", tmp_path / "o", "--chat-template", strict_template)
    assert_one_line_error(result, r"c\.jsonl:2: " + pattern + r".*--skip-bad-records")
    assert not (tmp_path / "o").exists()


def test_bad_records_skipped_and_counted(tmp_path: Path, strict_template: Path) -> None:
    records = [{"messages": GOOD}]
    for messages, _ in BAD_CHATS:
        records += [{"messages": messages}, {"messages": GOOD}]
    src = write_jsonl(tmp_path / "c.jsonl", records)
    result = run(
        "pack",
        src,
        "-L",
        "64",
        "-o",
        tmp_path / "o",
        "--chat-template",
        strict_template,
        "--skip-bad-records",
        "--no-shuffle",
    )
    assert result.exit_code == 0, result.stderr
    manifest, rows = read_rows(tmp_path / "o")
    docs = manifest["documents"]
    assert docs["bad_records_skipped"] == len(BAD_CHATS)
    assert docs["read"] == len(records) and docs["packed"] == len(BAD_CHATS) + 1
    lines = sorted(int(re.search(r"c\.jsonl:(\d+)", b).group(1)) for b in manifest["bad_records"])
    assert lines == list(range(2, 2 * len(BAD_CHATS) + 1, 2))
    # Skipped records keep their place in the numbering: the good ones are the even indices.
    packed = sorted(d for r in rows for d in r["doc_ids"])
    assert packed == list(range(0, len(records), 2))
    assert "skipped:" in result.stderr


def test_bad_prompt_completion_records(tmp_path: Path) -> None:
    src = write_jsonl(
        tmp_path / "p.jsonl",
        [{"prompt": "a", "completion": "b"}, {"prompt": "a", "completion": 1}, {"prompt": "x"}],
    )
    assert_one_line_error(
        run("pack", src, "-L", "64", "-o", tmp_path / "o", "--input-shape", "prompt-completion"),
        r"p\.jsonl:2: field 'completion' is int, not a string",
    )
    result = run("pack", src, "-L", "64", "-o", tmp_path / "o", "--skip-bad-records", "-q")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["documents"]["bad_records_skipped"] == 2
    assert "p.jsonl:3: no field 'completion'" in manifest["bad_records"][1]


def test_template_that_changes_or_drops_content(tmp_path: Path) -> None:
    """A template that rewrites assistant contents: what it renders for the assistant is
    learned; one that drops a message's text cannot be located: the record is named."""
    upper = "{% for m in messages %}{{ m.role }}: {{ m.content | upper }}\n{% endfor %}"
    last_only = (
        "{% for m in messages %}{% if loop.last %}{{ m.role }}: {{ m.content }}\n{% endif %}"
        "{% endfor %}"
    )
    more = [{"role": "user", "content": "again"}, {"role": "assistant", "content": "bye"}]
    src = write_jsonl(tmp_path / "c.jsonl", [{"messages": GOOD + more}])
    for name, text in (("upper", upper), ("last", last_only)):
        (tmp_path / f"{name}.jinja").write_text(text)
    tok = packtool.load_tokenizer()
    packtool.pack([src], tmp_path / "u", max_len=64, chat_template=tmp_path / "upper.jinja")
    _, rows = read_rows(tmp_path / "u")
    ((_, _, ids, labels),) = segments(rows[0])
    # " HELLO" is one token: it overlaps the content, so it is learned
    want = [" " + m["content"].upper() for m in GOOD + more if m["role"] == "assistant"]
    assert [tok.decode(r) for r in learned_runs(ids, labels)] == want
    result = run(
        "pack", src, "-L", "64", "-o", tmp_path / "o", "--chat-template", tmp_path / "last.jinja"
    )
    assert_one_line_error(
        result, r"c\.jsonl:1: message 1 \(assistant\): the chat template does not render its text"
    )


# -- the sandbox -----------------------------------------------------------------------------

ESCAPES = [
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", r"unsafe operation refused.*__class__"),
    ("{{ cycler.__init__.__globals__.os.popen('id').read() }}", r"unsafe.*__init__"),
    ("{{ messages.append({'role': 'user'}) }}", r"unsafe.*'append'"),
    ("{{ messages[0].update(role='x') }}", r"unsafe.*'update'"),
    ("{% include '/etc/passwd' %}", r"cannot include or import '/etc/passwd'"),
    ("{% import 'os' as os %}", r"cannot include or import 'os'"),
    ("{% if %}", r"\.jinja:1: chat template syntax error"),
]


@pytest.mark.parametrize(("template", "pattern"), ESCAPES)
def test_sandbox_refuses_escapes(tmp_path: Path, template: str, pattern: str) -> None:
    (tmp_path / "evil.jinja").write_text(template)
    src = write_jsonl(tmp_path / "c.jsonl", [{"messages": GOOD}])
    with pytest.raises(ChatTemplateError, match=pattern):
        packtool.pack([src], tmp_path / "o", max_len=64, chat_template=tmp_path / "evil.jinja")
    # Through the CLI: one line, and --skip-bad-records does not hide a template problem.
    result = run(
        "pack",
        src,
        "-L",
        "64",
        "-o",
        tmp_path / "o",
        "--chat-template",
        tmp_path / "evil.jinja",
        "--skip-bad-records",
    )
    assert_one_line_error(result, pattern)
    assert not (tmp_path / "o").exists()


def test_sandbox_gives_nothing_away() -> None:
    """Attributes the sandbox does not raise on render as nothing (no object, no file)."""
    for text in ("{{ self.__init__ }}", "{{ lipsum.__globals__ }}", "{{ range.__self__ }}"):
        assert ChatTemplate.from_string(text).render(GOOD) == ""


def test_cli_chat_and_json_summary(tmp_path: Path) -> None:
    result = run("pack", CHAT, "-L", "2048", "-o", tmp_path / "o", "--chat-template", CHATML)
    assert result.exit_code == 0, result.stderr
    assert "learned (assistant)" in result.stdout and "of slots" in result.stdout
    result = run("pack", PROMPT_COMPLETION, "-L", "1024", "-o", tmp_path / "p", "--json")
    data = json.loads(result.stdout)
    assert data["tokens"]["learned"] > 0 and data["labels"]["loss_on"] == "completion"


def test_conversations_without_assistant_or_empty(tmp_path: Path) -> None:
    src = write_jsonl(
        tmp_path / "c.jsonl",
        [{"messages": []}, {"messages": [{"role": "user", "content": "x"}]}, {"messages": GOOD}],
    )
    report = packtool.pack([src], tmp_path / "o", max_len=64, chat_template=CHATML)
    assert report.documents.empty == 2 and report.documents.packed == 1
    assert report.manifest["labels"]["documents_without_labels"] == 1


def test_sample_generator_is_deterministic(tmp_path: Path) -> None:
    import subprocess
    import sys

    subprocess.run(
        [
            sys.executable,
            str(REPO / "sample_data" / "make_instruct.py"),
            "--out-dir",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    for name in ("chat.jsonl", "prompt_completion.jsonl"):
        assert (tmp_path / name).read_bytes() == (REPO / "sample_data" / name).read_bytes()
    chats = load_jsonl(CHAT)
    assert len(chats) == 300 and len(load_jsonl(PROMPT_COMPLETION)) == 300
    assert any(m["role"] == "system" for c in chats for m in c["messages"])
    assert any(len(c["messages"]) > 4 for c in chats)


def test_documented_commands_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `packtool pack` commands of docs/instruct.md and sample_data/README.md work."""
    import shlex

    commands = []
    for doc in (REPO / "docs" / "instruct.md", REPO / "sample_data" / "README.md"):
        for block in re.findall(r"```(?:bash|sh)\n(.*?)```", doc.read_text(), flags=re.S):
            commands += [line for line in block.splitlines() if line.startswith("packtool pack")]
    assert len(commands) >= 4
    monkeypatch.chdir(REPO)
    for i, command in enumerate(commands):
        args = shlex.split(command.split("#")[0])[1:]
        args[args.index("-o") + 1] = str(tmp_path / f"out{i}")
        result = run(*args, "-q")
        assert result.exit_code == 0, (command, result.stderr)
        assert "labels" in json.loads((tmp_path / f"out{i}" / "manifest.json").read_text())


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.booleans(), max_size=30), max_size=8),
    st.integers(2, 12),
    st.sampled_from(["split", "truncate", "drop"]),
)
def test_property_cutting_labelled_examples(docs, max_len: int, policy: str) -> None:
    """Items, counts and stored labels of a batch of examples, against a plain-loop oracle."""
    from packtool.packing import Overflow, segment_labelled_items

    lengths = np.array([len(d) for d in docs], np.int64)
    learned = np.array([x for d in docs for x in d], bool)
    ids = np.arange(learned.size, dtype=np.int32) + 10
    offsets = np.cumsum(lengths) - lengths
    doc, chunk, item_len, counts, labels = segment_labelled_items(
        lengths, lengths == 0, np.where(learned, ids, IGNORE), max_len, Overflow(policy),
        ignore=IGNORE,
    )  # fmt: skip
    want_items, want_labels = [], []
    want = dict.fromkeys(["packed", "split", "truncated", "dropped", "empty"], 0)
    chunks_dropped = 0
    for d, flags in enumerate(docs):
        n = len(flags)
        starts = range(0, n, max_len) if policy == "split" else range(min(n, 1))
        flags = [f and i not in starts for i, f in enumerate(flags)]
        want_labels += flags
        kept = min(n, max_len) if policy == "truncate" else n
        if n == 0 or not any(flags[:kept]):
            want["empty"] += 1
        elif n <= max_len:
            want["packed"] += 1
            want_items.append((d, 0, n))
        elif policy == "drop":
            want["dropped"] += 1
        elif policy == "truncate":
            want["truncated"] += 1
            want_items.append((d, 0, max_len))
        else:
            want["split"] += 1
            for k in range(0, n, max_len):
                if any(flags[k : k + max_len]):
                    want_items.append((d, k // max_len, min(max_len, n - k)))
                else:
                    chunks_dropped += 1
    got_items = list(zip(doc.tolist(), chunk.tolist(), item_len.tolist(), strict=True))
    assert got_items == want_items
    assert {k: getattr(counts.documents, k) for k in want} == want
    assert counts.labels.chunks_without_labels_dropped == chunks_dropped
    assert (labels != IGNORE).tolist() == want_labels
    assert counts.tokens.learned == sum(
        sum(want_labels[int(offsets[d]) + c * max_len :][:n]) for d, c, n in want_items
    )


def test_stats_and_inspect_show_learned_tokens(tmp_path: Path) -> None:
    """stats reports the learned tokens; inspect --decode styles learned and context apart."""
    import json as _json

    from typer.testing import CliRunner

    from packtool.cli import app
    from packtool.inspect import inspect_row

    out = tmp_path / "out"
    packtool.pack([CHAT], out, max_len=2048, chat_template=CHATML)
    _, rows = read_rows(out)
    learned = sum(label != IGNORE for r in rows for label in r["labels"])
    result = CliRunner().invoke(app, ["stats", str(out), "--json"])
    assert result.exit_code == 0, result.output
    data = _json.loads(result.stdout)
    assert data["learned_tokens"] == learned
    assert data["learned_share_of_slots"] == pytest.approx(learned / (len(rows) * 2048), abs=1e-6)
    table = CliRunner().invoke(app, ["stats", str(out)], env={"COLUMNS": "120"})
    assert "learned tokens (labels)" in table.stdout and f"{learned:,}" in table.stdout

    reader = packtool.open_packed(out)
    view = inspect_row(reader, 0, reader.load_tokenizer())
    conversations = [r["messages"] for r in load_jsonl(CHAT)]
    for seg in view.segments:
        if seg.is_padding:
            assert seg.pieces is None
            continue
        learned_text = [text for text, is_learned in seg.pieces if is_learned]
        want = [
            m["content"] + "<|im_end|>"
            for m in conversations[seg.doc_id]
            if m["role"] == "assistant"
        ]
        assert learned_text == want
        assert "".join(text for text, _ in seg.pieces) == seg.text
    shown = CliRunner().invoke(app, ["inspect", str(out), "--decode"], env={"COLUMNS": "120"})
    assert shown.exit_code == 0, shown.output
    assert "learned tokens (labels)" in shown.stdout


def test_chat_with_a_tokenizer_without_offsets(char_tokenizer) -> None:
    """A tokenizer that is not a Hugging Face one (no character offsets) encodes a chat in
    pieces cut at the learned spans: the same labels."""
    template = ChatTemplate.from_string(
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}\n{% endfor %}"
    )
    encoder = InstructEncoder(
        char_tokenizer,
        shape=InputShape.CHAT,
        loss_on=LossOn.ASSISTANT,
        template=template,
        add_eos=False,
    )
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    encoded = encoder.encode([messages])
    ids, labels = encoded.ids.tolist(), encoded.labels.tolist()
    assert char_tokenizer.decode(ids) == template.render(messages)
    assert [char_tokenizer.decode(r) for r in learned_runs(ids, labels)] == ["yo"]


def test_turn_without_control_token_before_a_header_with_one(tmp_path: Path) -> None:
    """A template that closes assistant turns with no control token, where the next message's
    header starts with one: that header is not learned."""
    text = (
        "{% for m in messages %}{% if m.role == 'assistant' %}A: {{ m.content }}\n{% else %}"
        "<|im_start|>{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}"
    )
    template = ChatTemplate.from_string(text)
    tok = packtool.load_tokenizer()
    messages = [*GOOD, {"role": "user", "content": "more"}, {"role": "assistant", "content": "ok"}]
    encoder = InstructEncoder(
        tok, shape=InputShape.CHAT, loss_on=LossOn.ASSISTANT, template=template, add_eos=False
    )
    encoded = encoder.encode([messages])
    ids, labels = encoded.ids.tolist(), encoded.labels.tolist()
    assert tok.decode(ids) == template.render(messages)
    runs = [tok.decode(r) for r in learned_runs(ids, labels)]
    assert [r.strip() for r in runs] == ["hello", "ok"]
    assert not any("<|im_start|>" in r for r in runs)
