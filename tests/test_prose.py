"""The prose haystack (kvcert.tasks.prose): Python's own language-reference text as a clean sentence stream, a
passage per prompt, the ``*_prose`` tasks built on it, the digest a manifest's seal records and refuses when it
differs; the noise tasks' records unchanged."""

from __future__ import annotations

import hashlib
import json
import random
import re
import sys

import pytest

from kvcert.generation.manifest import check_manifest, manifest_seal_path, source_digests, write_manifest
from kvcert.generation.plan import Manifest
from kvcert.tasks import PROSE_TASKS, TASKS, build_prompt_ids, lookalike, multikey, needle, prose
from kvcert.training.tokenizer import build_tokenizer

SEED = 1300000  # a training-range data seed
LENGTH_TOLERANCE = 40  # tokens: about one prose sentence (the embedded tokenizer: a word or a sign a token)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _passage_of(lines: list[str]) -> bool:
    """Whether ``lines`` are consecutive sentences of the stream (wrapping around its end)."""
    stream = prose.sentences()
    return any(lines == [stream[(start + i) % len(stream)] for i in range(len(lines))]
               for start, sentence in enumerate(stream) if sentence == lines[0])


def _text_is_a_passage(text: str) -> bool:
    """Whether ``text`` is consecutive sentences of the stream joined by spaces (wrapping around its end)."""
    stream = prose.sentences()
    for start, sentence in enumerate(stream):
        position, i = 0, start
        while text.startswith(stream[i % len(stream)], position):
            position += len(stream[i % len(stream)]) + 1
            i += 1
        if position >= len(text) and i > start:
            return True
    return False


# ---------------------------------------------------------------- the stream

def test_the_stream_is_prose():
    stream = prose.sentences()
    assert len(stream) > 2000  # about 45 k words: a passage per prompt up to about 60 k tokens
    for sentence in stream:
        assert re.search(r"[.!?][\"'”’)\]]*$", sentence), sentence  # a sentence end
        assert sentence == " ".join(sentence.split())  # whitespace normalised, one line
        assert not any(mark in sentence for mark in ("::=", ">>>", "#", "{", "\\"))
        assert "magic number" not in sentence.lower()
        assert prose.MIN_WORDS <= len(sentence.split()) <= prose.MAX_WORDS
    from pydoc_data.topics import topics

    assert stream == prose.clean_sentences(topics)


def test_code_grammar_tables_and_headings_are_dropped():
    topics = {"b": ("The \"with\" statement\n"
                    "*********************\n\n"
                    "A statement is executed. It runs, e.g. Twice here.\n\n"
                    "   with_stmt ::= \"with\" ( \"(\" with_stmt_contents \")\" )\n\n"
                    "   >>> print(1)\n   1\n\n"
                    "   if x:\n       return y\n\n"
                    "+-------+-------+\n| a     | b     |\n+-------+-------+\n\n"
                    "* A bullet item that reads as a sentence.\n\n"
                    "Too short.\n"),
              "a": "The first topic comes first.  Its second sentence\nspans two lines."}
    assert prose.clean_sentences(topics) == (
        "The first topic comes first.", "Its second sentence spans two lines.",
        "A statement is executed.", "It runs, e.g. Twice here.", "A bullet item that reads as a sentence.")


def test_the_source_names_the_python_and_the_digest():
    source = prose.source()
    stream = prose.sentences()
    assert source.name == "pydoc_data.topics" and source.python == prose.SNAPSHOT_PYTHON
    assert source.sha256 == hashlib.sha256("".join(s + "\n" for s in stream).encode()).hexdigest()
    assert source.seal_entry() == {"python": source.python, "sha256": source.sha256, "sentences": len(stream)}
    for name in (*PROSE_TASKS, "ruler_niah_single_2", "ruler_niah_multiquery"):
        assert TASKS[name].sources({}) == [source]
    assert TASKS["needle"].sources({}) == [] and TASKS["ruler_niah_single_1"].sources({}) == []


def test_the_haystack_wraps_and_a_longer_extends_a_shorter():
    stream = ("One a.", "Two b.", "Three c.")
    hay = prose.ProseHaystack(random.Random(1), per_line=2, stream=stream)
    hay.offset = 2
    assert hay[:3] == ["Three c. One a.", "Two b. Three c.", "One a. Two b."]
    assert hay[:5][:3] == hay[:3] == hay.take(3)
    with pytest.raises(TypeError):
        hay[3]
    with pytest.raises(ValueError, match="at least one sentence"):
        prose.ProseHaystack(random.Random(1), per_line=0, stream=stream)


# ---------------------------------------------------------------- the prose tasks

@pytest.mark.parametrize("task", PROSE_TASKS)
def test_a_seed_and_index_give_one_prompt_and_two_prompts_two_passages(tok, task):
    first = TASKS[task].generate(tok, 4, 1024, seed=SEED)
    again = TASKS[task].make_record(tok, 1024, SEED, 2)
    assert again.to_dict() == first[2].to_dict()
    assert [r.to_dict() for r in first] == [r.to_dict() for r in TASKS[task].generate(tok, 4, 1024, seed=SEED)]
    assert all(r.id.startswith(f"{task}-s{SEED}-") and r.task == task for r in first)
    assert len({r.id for r in first}) == 4
    passages = [_haystack(r) for r in first]
    assert len({p[:80] for p in passages}) == 4  # each prompt its own span
    assert all(_text_is_a_passage(p) for p in passages)


def _haystack(record) -> str:
    """The prose of a record, its needles or facts taken out: its haystack lines (needle tasks) or its text
    (multikey), joined by spaces."""
    if record.task == "multikey_prose":
        text = record.context.split("\n\n", 1)[1]
        for fact in record.metadata["facts"]:
            text = text.replace(multikey._fact_text(fact), "", 1)
        return " ".join(text.split())
    return " ".join(line for line in record.context.split("\n")[1:] if not line.startswith("One of the special magic"))


@pytest.mark.parametrize("task", PROSE_TASKS)
@pytest.mark.parametrize("target", [512, 2048])
def test_a_prompt_fits_its_target_length(tok, task, target):
    for record in TASKS[task].generate(tok, 3, target, seed=SEED):
        ids, question_start = build_prompt_ids(tok, record)
        assert record.length == len(ids) and 0 < question_start < len(ids)
        room = target - record.metadata.get("answer_tokens", 0)
        assert room - LENGTH_TOLERANCE <= record.length <= room


@pytest.mark.parametrize("depth", [0, 30, 50, 100])
def test_the_needle_is_in_the_prompt_at_its_depth(tok, depth):
    for maker in (needle.make_record, lookalike.make_record):
        record = maker(tok, 1024, SEED, 1, depth=depth, haystack="prose")
        lines = record.context.split("\n")[1:]
        queried = needle.NEEDLE.format(key=record.metadata["needles"][0]["key"], value=record.answers[0])
        assert lines.count(queried) == 1
        others = record.metadata["needles"][1:]
        haystack = [line for line in lines if not line.startswith("One of the special magic")]
        n = len(haystack)
        before = [line for line in lines[:lines.index(queried)] if not line.startswith("One of the special magic")]
        assert len(before) == min(round(depth / 100 * n), n - 1)  # RULER's insertion, before that haystack line
        assert _passage_of(haystack) and len(lines) == n + 1 + len(others)
        assert record.metadata["depth"] == depth and record.metadata["haystack"] == "prose"


def test_prose_records_pair_with_the_noise_records(tok):
    """The same keys, values and depths as the noise task's record of the same seed and index, another haystack."""
    for task in ("needle", "lookalike", "multikey"):
        noise = TASKS[task].make_record(tok, 1024, SEED, 3)
        text = TASKS[task + "_prose"].make_record(tok, 1024, SEED, 3)
        assert text.answers == noise.answers and text.question == noise.question
        key = "facts" if task == "multikey" else "needles"
        assert text.metadata[key] == noise.metadata[key]
        assert text.context != noise.context and text.id == noise.id.replace(task, task + "_prose", 1)
    with pytest.raises(ValueError, match="haystack: 'essay'"):
        lookalike.make_record(tok, 1024, SEED, 0, haystack="essay")
    with pytest.raises(ValueError, match="haystack: 'noise'"):
        multikey.make_record(tok, 1024, SEED, 0, haystack="noise")


def test_prose_tasks_have_configs_and_score_as_their_noise_tasks():
    from pathlib import Path

    from kvcert.generation.jobs import config_file

    configs = Path(__file__).resolve().parents[1] / "configs"
    for task in PROSE_TASKS:
        cfg = config_file(configs, "task", task)
        assert cfg["name"] == task and cfg["kind"] == "synthetic"
        noise = TASKS[task[: -len("_prose")]]
        assert TASKS[task].metric is noise.metric and TASKS[task].questions_for is noise.questions_for


# ---------------------------------------------------------------- the seal

def test_the_seal_carries_the_digest_and_another_text_is_refused(tok, tmp_path):
    records = TASKS["needle_prose"].generate(tok, 2, 512, seed=SEED)
    item = Manifest("m", "needle_prose", 512, 2, SEED)
    sources = source_digests({"name": "needle_prose", "kind": "synthetic"})
    source = prose.source()
    assert sources == {"pydoc_data.topics": source.seal_entry()}
    out = write_manifest(records, tmp_path / "512.jsonl", item, None, sources)
    seal = json.loads(manifest_seal_path(out).read_text())
    assert seal["sources"]["pydoc_data.topics"]["sha256"] == source.sha256
    assert seal["sources"]["pydoc_data.topics"]["python"] == source.python
    check_manifest(out, item, None, sources=sources)  # this Python's text: taken
    seal["sources"]["pydoc_data.topics"] = {"python": "3.10.0", "sha256": "0" * 64, "sentences": 1}
    manifest_seal_path(out).write_text(json.dumps(seal))
    with pytest.raises(ValueError) as refused:
        check_manifest(out, item, None, sources=sources)
    message = str(refused.value)
    assert "\n" not in message and "another prose text" in message and "Python 3.10.0" in message
    assert f"that of Python {source.python}" in message and "rebuild it" in message


# ---------------------------------------------------------------- the noise tasks unchanged

#: SHA-256 (first 16 hex) of four records at 1024 tokens, data seed 11, the embedded tokenizer, computed at the
#: code before the prose haystack existed: the noise tasks' records did not change
NOISE_GOLDEN = {"needle": "c9349749f327fd68", "multikey": "beda9081e31d40fc", "lookalike": "1088c9044f2815dc",
                "ruler_niah_single_1": "04e103dd6d0b210d", "ruler_niah_multikey_2": "53a44ded09ef144d",
                "ruler_vt": "9d0c2e0aead7cc19"}


def _digest(records) -> str:
    text = "".join(json.dumps(r.to_dict(), sort_keys=True) + "\n" for r in records)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def test_the_noise_tasks_are_unchanged(tok):
    assert {name: _digest(TASKS[name].generate(tok, 4, 1024, seed=11)) for name in NOISE_GOLDEN} == NOISE_GOLDEN


# ---------------------------------------------------------------- the snapshot

def test_the_snapshot_is_pinned_and_an_edit_is_refused(monkeypatch, tmp_path):
    """Every Python reads the same prose: the snapshot's bytes are pinned; an edited copy is refused in one line."""
    assert hashlib.sha256(prose.SNAPSHOT.read_bytes()).hexdigest() == prose.SNAPSHOT_SHA256
    edited = tmp_path / "prose_sentences.txt"
    edited.write_bytes(prose.SNAPSHOT.read_bytes() + b"An added sentence.\n")
    monkeypatch.setattr(prose, "SNAPSHOT", edited)
    prose.sentences.cache_clear()
    try:
        with pytest.raises(ValueError) as refused:
            prose.sentences()
        assert "\n" not in str(refused.value) and "git checkout" in str(refused.value)
    finally:
        monkeypatch.undo()
        prose.sentences.cache_clear()


@pytest.mark.skipif(".".join(map(str, sys.version_info[:3])) != prose.SNAPSHOT_PYTHON,
                    reason="the snapshot is of one Python's text; another Python ships another")
def test_the_snapshot_is_this_pythons_cleaned_text():
    """On the Python it was taken from, the snapshot is exactly the cleaning of the interpreter's text."""
    assert prose.interpreter_sentences() == prose.sentences()


def test_the_cleaning_keeps_prose_on_this_pythons_own_text():
    """On any Python, its own pydoc text cleans to a prose stream of the same kind (most sentences shared)."""
    own = prose.interpreter_sentences()
    assert len(own) > 1000 and all(prose.keep_sentence(s) for s in own[:200])
