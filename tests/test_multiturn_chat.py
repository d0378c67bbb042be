"""Tests of ``multiturn_chat``: ``multiturn``'s records on the model's own chat template (every earlier
turn a user and an assistant message, the question the last user message, the reply begun by the answer
prefix "Your <item> code is"), and that every other task's prompts stayed byte for byte what they were
before it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from kvcert.tasks import TASKS, TaskRecord, build_prompt_ids, score, task_for_config
from kvcert.tasks import multiturn, multiturn_chat
from kvcert.tasks.records import RecordError, read_jsonl, write_jsonl
from kvcert.training.tokenizer import build_tokenizer

REPO = Path(__file__).resolve().parents[1]
LENGTH_TOLERANCE = 24  # tokens: less than one padding sentence
SEED = 1100010

# sha256 of 3 records at 600 tokens, seed 5, on the embedded tokenizer: their JSON lines, then their
# (ids, question_start); computed on the code before multiturn_chat existed.
GOLDEN = {
    "needle": "63f4bcc59747448fc3b90e12a0bcd55fb2b631f546eb9eb6fd7e7a9057fd805b",
    "multikey": "9f73dddbaf66cba312fcc130be6121a36943e68ac9f60a322dd81e82fe6170e8",
    "multiturn": "4f1ad68fafcb65015640e07b3aa0fc75077f9c22eac3c052ca73b0cc8be704c1",
    "lookalike": "4d54ec6d1da8aaeb6c6308bd8d7148babe6088459bd8a851839ac311b36c5ba1",
}


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _marker(tok, role: str) -> int:
    return tok.convert_tokens_to_ids(f"<|{role}|>")


def _digest(tok, task: str) -> str:
    records = TASKS[task].generate(tok, 3, 600, seed=5)
    text = "\n".join(json.dumps(r.to_dict(), ensure_ascii=False) for r in records)
    text += "\n" + json.dumps([build_prompt_ids(tok, r) for r in records])
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("task", sorted(GOLDEN))
def test_other_tasks_records_and_prompts_are_unchanged(tok, task):
    assert _digest(tok, task) == GOLDEN[task]


def test_single_message_and_plain_prompts_are_unchanged(tok):
    record = TaskRecord(id="x", task="needle", context="Where is the key ?", question="What is it ?", answers=["it"],
                        metadata={"target_tokens": 10}, answer_prefix=" Answer :")
    assert build_prompt_ids(tok, record) == ([2, 5, 182, 512, 830, 1, 11, 181, 512, 514, 11, 3, 6, 19, 10], 7)
    record.metadata["chat_template"] = False
    assert build_prompt_ids(tok, record) == ([182, 512, 830, 1, 11, 181, 512, 514, 11, 19, 10], 5)


@pytest.mark.parametrize("target", [300, 1024])
def test_turns_are_separate_chat_messages(tok, target):
    for record in multiturn_chat.generate(tok, 3, target, seed=SEED):
        ids, _ = build_prompt_ids(tok, record)
        turns = record.metadata["num_turns"]
        messages = record.metadata["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant"] * turns
        # one user marker per turn and the question's; one assistant marker per turn and the generation prompt's
        assert ids.count(_marker(tok, "user")) == turns + 1
        assert ids.count(_marker(tok, "assistant")) == turns + 1
        whole = tok.apply_chat_template([*messages, {"role": "user", "content": record.question}], tokenize=False,
                                        add_generation_prompt=True)
        assert ids == tok(whole + record.answer_prefix, add_special_tokens=False)["input_ids"]
        # the generation prompt, then the answer prefix: the reply continues "Your <item> code is"
        prefix = tok(record.answer_prefix, add_special_tokens=False)["input_ids"]
        assert prefix and ids[-len(prefix) - 1:] == [_marker(tok, "assistant"), *prefix]
    plain = multiturn.make_record(tok, target, SEED, 0)  # the transcript task: one user message
    assert build_prompt_ids(tok, plain)[0].count(_marker(tok, "user")) == 1


@pytest.mark.parametrize("target", [300, 1024])
def test_question_start_is_where_the_final_user_turn_begins(tok, target):
    for record in multiturn_chat.generate(tok, 3, target, seed=SEED):
        ids, start = build_prompt_ids(tok, record)
        history = tok.apply_chat_template(record.metadata["messages"], tokenize=False, add_generation_prompt=False)
        assert ids[:start] == tok(history, add_special_tokens=False)["input_ids"]  # every earlier turn, no more
        assert ids[start] == _marker(tok, "user") and _marker(tok, "user") not in ids[start + 1:]
        question = tok(record.question, add_special_tokens=False)["input_ids"]
        assert ids[start + 1:start + 1 + len(question)] == question
        assert ids[:start].count(_marker(tok, "user")) == record.metadata["num_turns"]


@pytest.mark.parametrize("target", [300, 512, 1024])
def test_the_rendered_prompt_fills_the_target_length(tok, target):
    for record in multiturn_chat.generate(tok, 3, target, seed=SEED):
        ids, _ = build_prompt_ids(tok, record)
        assert record.length == len(ids)
        assert target - LENGTH_TOLERANCE <= record.length <= target
        assert record.metadata["target_tokens"] == target
        assert tok.unk_token_id not in ids
    with pytest.raises(ValueError, match="too small"):
        multiturn_chat.make_record(tok, 40, SEED, 0)


@pytest.mark.parametrize("target", [512, 1024])
def test_same_conversation_answers_and_metadata_as_multiturn(tok, target):
    n = multiturn.default_num_turns(target)
    for chat, plain in zip(multiturn_chat.generate(tok, n, target, seed=SEED), multiturn.generate(tok, n, target, seed=SEED)):
        assert chat.answers == plain.answers and chat.question == plain.question
        item = plain.metadata["facts"][0]["item"]
        assert chat.answer_prefix == f"Your {item} code is" and plain.answer_prefix == ""
        assert plain.answers[0] not in chat.answer_prefix  # names the item, not its code
        meta = dict(chat.metadata)
        messages = meta.pop("messages")
        assert meta == plain.metadata  # facts, turns, turn distance: the same draw
        assert chat.id == plain.id.replace("multiturn-", "multiturn_chat-", 1) and chat.task == "multiturn_chat"
        users = [line.removeprefix("User: ") for line in plain.context.split("\n") if line.startswith("User: ")]
        assert [m["content"] for m in messages if m["role"] == "user"] == users
        fact = meta["facts"][0]
        assert messages[2 * (meta["fact_turn"] - 1)]["content"] == multiturn.FACT_USER.format(**fact)
        chat_qas, plain_qas = multiturn_chat.questions_for(chat), multiturn.questions_for(plain)
        assert [(q.question, q.answer, q.key, q.fact) for q in chat_qas] == [(q.question, q.answer, q.key, q.fact)
                                                                            for q in plain_qas]
        # the chat reference reply is multiturn's, split at the answer prefix
        assert [q.answer_prefix + q.response for q in chat_qas] == [q.response for q in plain_qas]
        assert chat_qas[0].answer_prefix == chat.answer_prefix
        for prediction in (plain.answers[0], "I do not know", plain.answers[0][:2]):
            assert score("multiturn_chat", prediction, chat.answers) == score("multiturn", prediction, plain.answers)


def test_a_tokenizer_without_a_chat_template_is_refused_in_one_line():
    plain = build_tokenizer()
    plain.chat_template = None
    with pytest.raises(ValueError, match=r"^task multiturn_chat: tokenizer .* has no chat template") as info:
        TASKS["multiturn_chat"].generate(plain, 1, 512, seed=SEED)
    assert "\n" not in str(info.value)


def test_records_round_trip_and_the_context_is_the_messages_transcript(tok, tmp_path):
    records = multiturn_chat.generate(tok, 2, 512, seed=SEED)
    path = tmp_path / "r.jsonl"
    write_jsonl(records, path)
    again = read_jsonl(path)
    assert [r.to_dict() for r in again] == [r.to_dict() for r in records]
    assert [build_prompt_ids(tok, r) for r in again] == [build_prompt_ids(tok, r) for r in records]
    broken = records[0].to_dict()
    broken["metadata"] = {**broken["metadata"], "messages": [{"role": "user"}]}
    with pytest.raises(RecordError, match="metadata 'messages' must be a list"):
        TaskRecord.from_dict(broken)
    record = records[0]
    assert record.context.split("\n")[0] == "User: " + record.metadata["messages"][0]["content"]
    record.context += " edited"
    with pytest.raises(ValueError, match="not the transcript of its metadata 'messages'"):
        build_prompt_ids(tok, record)


def test_registered_listed_and_composed_for_kvcert_run():
    from kvcert.config.paths import configs_dir, prereg_dir
    from kvcert.commands.check import _uses_chat, check_task
    from kvcert.commands.oneoff import compose_run, listing

    cfg = yaml.safe_load((REPO / "configs" / "task" / "multiturn_chat.yaml").read_text())
    assert cfg == {"name": "multiturn_chat", "kind": "synthetic", "max_new_tokens": 16}
    assert task_for_config(cfg) is TASKS["multiturn_chat"] and _uses_chat(cfg) and check_task(cfg) == []
    assert "multiturn_chat (synthetic)" in listing(configs_dir())
    [(task, [full, setting])], _ = compose_run(
        ["task=multiturn_chat", "condition=streaming", "method=snapkv-poisson", "budget=0.1", "chunk_tokens=64"],
        configs_dir(), prereg_dir())
    assert task["name"] == "multiturn_chat" and setting["condition"] == "streaming" and setting["chunk_tokens"] == 64
    assert full["max_new_tokens"] == setting["max_new_tokens"] == 16


def test_streaming_prefills_the_earlier_turns_then_the_final_user_turn(word_model_dir):
    from kvcert.generation.engine import Engine
    from kvcert.generation.forked import generate
    from kvcert.generation.spec import GenerationSpec
    from kvcert.method.models import ModelSpec, load_model

    model, tok = load_model(ModelSpec(name="tiny", path=str(word_model_dir)))
    record = multiturn_chat.make_record(tok, 300, SEED, 0)
    ids, start = build_prompt_ids(tok, record)
    method = {"name": "snapkv-poisson", "scorer": "snapkv", "sampler": "poisson", "allocation": "uniform"}
    base = {"model": {"name": "tiny", "path": str(word_model_dir)}, "seed": 7, "max_new_tokens": 4}
    specs = [{**base, "method": {"name": "full"}, "condition": "full", "budget": 1.0},
             {**base, "method": method, "condition": "streaming", "budget": 0.25, "chunk_tokens": 64}]
    full, streamed = generate([Engine(model, tok, GenerationSpec.from_dict(s), {}) for s in specs], record)
    for out in (full, streamed):
        assert out["task"] == "multiturn_chat" and out["prompt_tokens"] == len(ids)
        assert out["question_tokens"] == len(ids) - start
    assert max(streamed["kept_fraction"]) < 1.0 == min(full["kept_fraction"])
