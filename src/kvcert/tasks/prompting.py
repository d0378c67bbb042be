"""From a task record to the token ids a model sees.

The user message is ``context + separator + question`` (the record's ``separator``,
:data:`PROMPT_SEPARATOR` by default), rendered through the tokenizer's own chat
template with ``add_generation_prompt=True`` and followed by the record's
``answer_prefix`` (RULER's convention: the prefix comes after the template, and the
answer continues it), so the model's answer follows the returned ids directly. :func:`build_prompt_ids` also returns
``question_start``: the index of the first token of the question part. Everything
before it is the *context* part, which a streaming run prefills and compresses before
it sees the question; the question part holds the question text and the rest of the
template up to where the answer begins.

A record with ``metadata["chat_template"] = False`` (LongBench's few-shot and code tasks,
as ``pred.py`` feeds them) skips the chat template: its prompt is the user message and the
answer prefix as they are, tokenized with the tokenizer's special tokens (a Llama or
Mistral tokenizer's BOS), as ``tokenizer(prompt)`` in ``pred.py``.

The same code path serves the embedded word-level model and real chat models
(Qwen2.5, Llama-3.1, Mistral instruct). The split is found with a sentinel rendered
between the two parts, and checked: either tokenizing the two rendered pieces
separately gives exactly the ids of the whole prompt, or (fast tokenizers) the whole
prompt's character offsets have a token boundary exactly where the question begins.
If neither holds, a :class:`ValueError` says so.

A record with ``metadata["messages"]`` (``multiturn_chat``) is a conversation on the model's
own chat template: those messages (``{"role", "content"}``, user and assistant turns in
order) are the earlier turns, the question is the last user message, and the generation
prompt and the answer prefix follow it (:func:`render_turns`). ``question_start`` is then
the first token of that final user turn — its role header included — so every earlier
turn is the context part. The record's ``context`` is the messages' plain transcript
(:func:`transcript`), checked against them; the separator is unused.
"""

from __future__ import annotations

from typing import Any

PROMPT_SEPARATOR = "\n\n"
_SENTINEL = "@@KVCERT-QUESTION-STARTS-HERE@@"


def user_message(context: str, question: str, separator: str = PROMPT_SEPARATOR) -> str:
    """The text of the single user turn: context, separator, question."""
    return f"{context}{separator}{question}"


def render_chat(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """Render ``messages`` as text through the tokenizer's chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)!r} has no chat "
            "template; kvcert renders every prompt through one"
        )
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    if not isinstance(text, str):
        raise ValueError("apply_chat_template(tokenize=False) did not return a string")
    return text


def render_prompt(tokenizer: Any, context: str, question: str, separator: str = PROMPT_SEPARATOR,
                  answer_prefix: str = "", chat: bool = True) -> str:
    """The complete prompt text (chat template applied, generation prompt added, then
    the answer prefix; ``chat=False``: the user message and the answer prefix alone)."""
    if not chat:
        return user_message(context, question, separator) + answer_prefix
    messages = [{"role": "user", "content": user_message(context, question, separator)}]
    return render_chat(tokenizer, messages) + answer_prefix


def encode_rendered(tokenizer: Any, text: str, chat: bool = True) -> list[int]:
    """Token ids of rendered text: a chat template supplies BOS, so none is added; text
    without one gets the tokenizer's special tokens."""
    ids = list(tokenizer(text, add_special_tokens=not chat)["input_ids"])
    _check_single_bos(tokenizer, ids)
    return ids


def prompt_length(tokenizer: Any, context: str, question: str, separator: str = PROMPT_SEPARATOR,
                  answer_prefix: str = "") -> int:
    """Number of tokens of the complete prompt (one rendering, one tokenization)."""
    text = render_prompt(tokenizer, context, question, separator, answer_prefix)
    return len(encode_rendered(tokenizer, text))


def transcript(messages: list[dict[str, str]]) -> str:
    """Chat messages as plain text, one ``Role: content`` line each (``User: ...``, ``Assistant: ...``):
    the ``context`` of a record whose earlier turns are chat messages."""
    return "\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in messages)


def render_turns(tokenizer: Any, messages: list[dict[str, str]], question: str,
                 answer_prefix: str = "") -> tuple[str, int]:
    """The prompt text of the earlier turns ``messages`` followed by ``question`` as the last user
    message (chat template applied, generation prompt added, then the answer prefix), and the
    character index where that final user turn begins: the end of the earlier turns rendered alone."""
    text = _turns_text(tokenizer, messages, question, answer_prefix)
    history = render_chat(tokenizer, messages, add_generation_prompt=False) if messages else ""
    if not text.startswith(history):
        raise ValueError("the chat template renders the earlier turns differently once a user turn follows "
                         "them; cannot locate where the final user turn begins")
    return text, len(history)


def turns_prompt_length(tokenizer: Any, messages: list[dict[str, str]], question: str,
                        answer_prefix: str = "") -> int:
    """Number of tokens of the complete prompt of earlier turns ``messages`` and ``question``."""
    return len(encode_rendered(tokenizer, _turns_text(tokenizer, messages, question, answer_prefix)))


def _turns_text(tokenizer: Any, messages: list[dict[str, str]], question: str, answer_prefix: str) -> str:
    return render_chat(tokenizer, [*messages, {"role": "user", "content": question}]) + answer_prefix


def build_prompt_ids(tokenizer: Any, record: Any) -> tuple[list[int], int]:
    """Return ``(input_ids, question_start)`` for ``record`` (see the module docstring)."""
    messages = getattr(record, "metadata", {}).get("messages")
    if messages is not None:
        return _build_turns_ids(tokenizer, record, messages)
    context, question = record.context, record.question
    separator = getattr(record, "separator", PROMPT_SEPARATOR)
    prefix = getattr(record, "answer_prefix", "")
    chat = getattr(record, "metadata", {}).get("chat_template", True) is not False
    if _SENTINEL in context or _SENTINEL in question:
        raise ValueError("record text contains kvcert's split sentinel")
    text = render_prompt(tokenizer, context, question, separator, prefix, chat)
    marked = render_prompt(tokenizer, context, _SENTINEL + question, separator, prefix, chat)
    if marked.count(_SENTINEL) != 1:
        raise ValueError(
            "the chat template does not render the user message verbatim (sentinel "
            f"found {marked.count(_SENTINEL)} times); cannot locate the question"
        )
    split = marked.index(_SENTINEL)
    if marked[:split] + marked[split + len(_SENTINEL):] != text:
        raise ValueError(
            "the chat template renders differently when the question changes; "
            "cannot split context from question"
        )
    return _split_ids(tokenizer, text, split, chat)


def measured(tokenizer: Any, record: Any) -> Any:
    """``record`` with its ``length`` set: its prompt's token count (:func:`build_prompt_ids`)."""
    record.length = len(build_prompt_ids(tokenizer, record)[0])
    return record


def _build_turns_ids(tokenizer: Any, record: Any, messages: list[dict[str, str]]) -> tuple[list[int], int]:
    """``build_prompt_ids`` of a record whose earlier turns are chat messages (``metadata["messages"]``,
    their form checked by :func:`kvcert.tasks.records.validate_record`)."""
    if record.context != transcript(messages):
        raise ValueError(f"record {getattr(record, 'id', '?')}: its context is not the transcript of its "
                         "metadata 'messages' (the prompt is built from the messages; edit both or neither)")
    text, split = render_turns(tokenizer, messages, record.question, getattr(record, "answer_prefix", ""))
    return _split_ids(tokenizer, text, split, True)


def _split_ids(tokenizer: Any, text: str, split: int, chat: bool) -> tuple[list[int], int]:
    """The ids of the rendered prompt ``text`` and the index of its first token at or after character
    ``split`` (checked: see the module docstring)."""
    ids = encode_rendered(tokenizer, text, chat)

    # 1) the two rendered pieces tokenize independently to exactly the whole prompt
    head = list(tokenizer(text[:split], add_special_tokens=not chat)["input_ids"])
    tail = list(tokenizer(text[split:], add_special_tokens=False)["input_ids"])
    if head + tail == ids:
        return ids, len(head)

    # 2) a token boundary of the whole prompt sits exactly at the split
    if getattr(tokenizer, "is_fast", False):
        offsets = tokenizer(text, add_special_tokens=not chat, return_offsets_mapping=True)[
            "offset_mapping"
        ]
        for index, (start, end) in enumerate(offsets):
            if end > split:
                if start >= split:
                    return ids, index
                break
    raise ValueError(
        f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r}: no token boundary where the "
        "question starts (a token spans the context/question junction); cannot split the prompt"
    )


def _check_single_bos(tokenizer: Any, ids: list[int]) -> None:
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
        raise ValueError("the rendered prompt starts with a doubled BOS token")
