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

The prompt ends with an answer prefix (:data:`ANSWER_PREFIX`, "Your locker code is": the start of
``multiturn``'s reference reply, :data:`kvcert.tasks.multiturn.RESPONSE`) after the generation prompt,
so the model's reply continues it with the code; the prefix names the item, not its value, so the
value must still come from the earlier turn. Without it, SmolLM2-135M-Instruct with the full cache
answered 0/20 at 1024 tokens (training seed 1100010): it copied its own earlier assistant replies
(the padding sentences, "Noted, I will remember that.") or refused. Chosen on training seeds only
(full cache, 20 records at 1024 tokens, greedy): 12/20 on seed 1100010 and 12/20 on seed
1100011, every miss another code stated in the conversation. Tried on seed 1100010 and not kept: the padding in the user turns instead of the
assistant's (0/20), a fact-turn reply naming the item ("Noted: your locker code.", 1/20), a more
directive question ("What is my locker code? Reply with the number only.", 1/20). With streaming
SnapKV at budget 0.1 (64-token chunks) on seed 1100011 it fell to 1/20 (top-k and Poisson alike).
:func:`questions_for` gives ``multiturn``'s questions with this answer prefix.
"""

from __future__ import annotations

from typing import Any

from kvcert.tasks.lengths import fit_filler
from kvcert.tasks.multiturn import FACT_USER, QUESTION, RESPONSE, conversation, record_id
from kvcert.tasks.prompting import measured, transcript, turns_prompt_length
from kvcert.tasks.records import QuestionAnswer, TaskRecord
from kvcert.tasks.sampling import generator

TASK = "multiturn_chat"
#: the text after the generation prompt: ``multiturn``'s reference reply up to the value
ANSWER_PREFIX = RESPONSE.split("{value}")[0].rstrip()  # "Your {item} code is"
#: what follows the answer prefix in the reference reply
ANSWER_RESPONSE = " {value}"


def messages_of(turns: list[tuple[str, str]]) -> list[dict[str, str]]:
    """A user message and an assistant message per (user, assistant) turn, in order."""
    return [message for user, assistant in turns
            for message in ({"role": "user", "content": user}, {"role": "assistant", "content": assistant})]


def make_record(tokenizer: Any, target_tokens: int, seed: int, index: int, **options: Any) -> TaskRecord:
    """One record of about ``target_tokens`` prompt tokens: ``multiturn``'s conversation of the
    same seed and index, its turns as chat messages (options as
    :func:`kvcert.tasks.multiturn.make_record`)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"task {TASK}: tokenizer {getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)!r} "
                         "has no chat template, and this task's turns are messages of one; use an instruct checkpoint")
    talk = conversation(target_tokens, seed, index, **options)
    question = talk.question
    prefix = ANSWER_PREFIX.format(item=talk.facts[0]["item"])
    messages, _, _ = fit_filler(tokenizer, lambda n: messages_of(talk.padded(n)), question, target_tokens,
                                measure=lambda m: turns_prompt_length(tokenizer, m, question, prefix))
    record = TaskRecord(
        id=record_id(TASK, seed, target_tokens, talk.num_turns, index),
        task=TASK,
        context=transcript(messages),
        question=question,
        answers=talk.answers,
        answer_prefix=prefix,
        metadata={**talk.metadata(target_tokens), "messages": messages},
    )
    return measured(tokenizer, record)


#: ``n_examples`` records (options: ``num_turns``, ``num_facts``, ``turn_distance``).
generate = generator(make_record)


def questions_for(record: TaskRecord) -> list[QuestionAnswer]:
    """``multiturn``'s question and answer per stated code (the queried one first), with this task's
    answer prefix; the reference response is what follows the prefix."""
    return [QuestionAnswer(QUESTION.format(item=f["item"]), f["value"], ANSWER_RESPONSE.format(value=f["value"]),
                           f["item"], ANSWER_PREFIX.format(item=f["item"]),
                           FACT_USER.format(item=f["item"], value=f["value"]))
            for f in record.metadata["facts"]]
