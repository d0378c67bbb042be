"""Needle retrieval in the RULER style.

Needles "One of the special magic numbers for KEY is: VALUE." sit at pre-set depth
percentages of RULER's noise haystack ("The grass is green. The sky is blue. ..."
repeated sentence by sentence); the question asks for the value of one key. Scored
with RULER's ``string_match_all``.

Options: ``num_needles`` (the queried needle plus distractor needles at random depths),
``depth`` (fix the queried needle's depth; otherwise each block of examples covers
``depths`` once), ``value_digits`` (RULER uses 7-digit numbers).
"""

from __future__ import annotations

from typing import Any, Sequence

from kvcert.tasks.lengths import fit_filler
from kvcert.tasks.prompting import build_prompt_ids
from kvcert.tasks.records import QuestionAnswer, TaskRecord
from kvcert.tasks.sampling import balanced_pick, example_rng
from kvcert.tasks.wordlists import NEEDLE_KEYS

TASK = "needle"
INSTRUCTION = (
    "Some special magic numbers are hidden within the following text. Make sure to "
    "memorize it. I will quiz you about the numbers afterwards."
)
HAYSTACK = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. "
    "There and back again."
)
HAYSTACK_SENTENCES: tuple[str, ...] = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
)
NEEDLE = "One of the special magic numbers for {key} is: {value}."
QUESTION = "What is the special magic number for {key} mentioned in the provided text?"
# RULER's answer prefix for the needle task, completed with the value
RESPONSE = "The special magic number for {key} is: {value}"
DEPTHS: tuple[int, ...] = tuple(range(0, 101, 10))


def _haystack_with(needles: list[tuple[float, str]], n: int) -> str:
    """``n`` haystack sentences with each needle inserted at its depth percentage."""
    pieces = [HAYSTACK_SENTENCES[i % len(HAYSTACK_SENTENCES)] for i in range(n)]
    inserts = sorted(
        ((round(depth / 100.0 * n), order, text) for order, (depth, text) in enumerate(needles)),
        key=lambda item: (item[0], item[1]),
    )
    out: list[str] = []
    cursor = 0
    for position, _, text in inserts:
        out.extend(pieces[cursor:position])
        out.append(text)
        cursor = position
    out.extend(pieces[cursor:])
    return " ".join(out)


def make_record(
    tokenizer: Any,
    target_tokens: int,
    seed: int,
    index: int,
    num_needles: int = 1,
    depth: float | None = None,
    depths: Sequence[float] = DEPTHS,
    value_digits: int = 7,
) -> TaskRecord:
    """One needle record of about ``target_tokens`` prompt tokens."""
    if num_needles < 1 or num_needles > len(NEEDLE_KEYS):
        raise ValueError(f"num_needles must be in 1..{len(NEEDLE_KEYS)}, got {num_needles}")
    if value_digits < 1:
        raise ValueError("value_digits must be positive")
    rng = example_rng(seed, TASK, index)
    keys = rng.sample(NEEDLE_KEYS, num_needles)
    values: list[str] = []
    while len(values) < num_needles:
        value = str(rng.randint(10 ** (value_digits - 1), 10**value_digits - 1))
        if value not in values:
            values.append(value)
    query_depth = float(depth) if depth is not None else float(balanced_pick(depths, seed, TASK, index))
    needle_depths = [query_depth] + [rng.uniform(0.0, 100.0) for _ in range(num_needles - 1)]
    needles = [
        (d, NEEDLE.format(key=k, value=v)) for d, k, v in zip(needle_depths, keys, values)
    ]
    question = QUESTION.format(key=keys[0])

    def make_context(n: int) -> str:
        return f"{INSTRUCTION}\n{_haystack_with(needles, n)}"

    context, _, _ = fit_filler(tokenizer, make_context, question, target_tokens)
    record = TaskRecord(
        id=f"{TASK}-s{seed}-t{target_tokens}-n{num_needles}-{index}",
        task=TASK,
        context=context,
        question=question,
        answers=[values[0]],
        metadata={
            "target_tokens": target_tokens,
            "depth": query_depth,
            "num_needles": num_needles,
            "needles": [
                {"key": k, "value": v, "depth": d} for k, v, d in zip(keys, values, needle_depths)
            ],
        },
    )
    record.length = len(build_prompt_ids(tokenizer, record)[0])
    return record


def generate(
    tokenizer: Any, n_examples: int, target_tokens: int, seed: int, **options: Any
) -> list[TaskRecord]:
    """``n_examples`` needle records (see the module docstring for ``options``)."""
    return [make_record(tokenizer, target_tokens, seed, i, **options) for i in range(n_examples)]


def questions_for(record: TaskRecord) -> list[QuestionAnswer]:
    """A question, answer and reference response per needle; the queried needle first."""
    return [
        QuestionAnswer(QUESTION.format(key=n["key"]), n["value"],
                       RESPONSE.format(key=n["key"], value=n["value"]), n["key"])
        for n in record.metadata["needles"]
    ]


def vocabulary_texts() -> list[str]:
    """Every string this task can put into a prompt, for building a word-level vocabulary."""
    return [INSTRUCTION, HAYSTACK, NEEDLE.format(key="", value=""), QUESTION.format(key=""),
            RESPONSE.format(key="", value=""), *NEEDLE_KEYS]
