"""Multi-turn assistant recall on the model's own chat template: the ``multiturn`` records
(same conversation, facts, small talk, padding, question, answers and metadata for a seed
and index; :func:`kvcert.tasks.multiturn.conversation`) with every earlier turn a real chat
message pair — a user message and an assistant message — instead of a transcript inside
one user message. The question is the last user message, followed by the generation prompt.

The messages are the record's ``metadata["messages"]`` (its ``context`` is their plain
transcript, :func:`kvcert.tasks.prompting.transcript`, without ``multiturn``'s header), and
:func:`kvcert.tasks.prompting.build_prompt_ids` renders them through
``apply_chat_template``; its ``question_start`` is the first token of the final user turn,
so a streaming run compresses every earlier turn before it sees the question. Padding fills
the rendered prompt (template tokens and the template's own system message included) to
the target length, as in ``multiturn``. A tokenizer without a chat template is refused.
Scored by recall of the value.
"""

from __future__ import annotations

from typing import Any

from kvcert.tasks.multiturn import conversation, questions_for, record_id  # noqa: F401 (questions_for: the same questions)
from kvcert.tasks.lengths import fit_filler
from kvcert.tasks.prompting import build_prompt_ids, transcript, turns_prompt_length
from kvcert.tasks.records import TaskRecord

TASK = "multiturn_chat"

#: the same questions, answers and reference replies as ``multiturn`` (the facts are the same)


def messages_of(turns: list[tuple[str, str]]) -> list[dict[str, str]]:
    """A user message and an assistant message per (user, assistant) turn, in order."""
    return [message for user, assistant in turns
            for message in ({"role": "user", "content": user}, {"role": "assistant", "content": assistant})]


def make_record(
    tokenizer: Any,
    target_tokens: int,
    seed: int,
    index: int,
    num_turns: int | None = None,
    num_facts: int | None = None,
    turn_distance: int | None = None,
) -> TaskRecord:
    """One record of about ``target_tokens`` prompt tokens: ``multiturn``'s conversation of the
    same seed and index, its turns as chat messages (options as
    :func:`kvcert.tasks.multiturn.make_record`)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"task {TASK}: tokenizer {getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)!r} "
                         "has no chat template, and this task's turns are messages of one; use an instruct checkpoint")
    talk = conversation(target_tokens, seed, index, num_turns, num_facts, turn_distance)
    question = talk.question
    messages, _, _ = fit_filler(tokenizer, lambda n: messages_of(talk.padded(n)), question, target_tokens,
                                measure=lambda m: turns_prompt_length(tokenizer, m, question))
    record = TaskRecord(
        id=record_id(TASK, seed, target_tokens, talk.num_turns, index),
        task=TASK,
        context=transcript(messages),
        question=question,
        answers=talk.answers,
        metadata={**talk.metadata(target_tokens), "messages": messages},
    )
    record.length = len(build_prompt_ids(tokenizer, record)[0])
    return record


def generate(
    tokenizer: Any, n_examples: int, target_tokens: int, seed: int, **options: Any
) -> list[TaskRecord]:
    """``n_examples`` records (options: ``num_turns``, ``num_facts``, ``turn_distance``)."""
    return [make_record(tokenizer, target_tokens, seed, i, **options) for i in range(n_examples)]
