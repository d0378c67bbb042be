"""Needle retrieval in the RULER style (NVIDIA/RULER, ``niah``, noise haystack).

The conventions of RULER's own generator (``scripts/data/synthetic/niah.py`` and the
``niah`` entry of ``constants.py``), for one queried needle with one value:

- the instruction in RULER's single-needle wording (RULER rewrites its template to
  the singular whenever one key is queried for one value, distractor keys or not):
  "A special magic number is hidden within the following text. Make sure to memorize
  it. I will quiz you about the number afterwards.";
- the noise haystack: the whole string "The grass is green. The sky is blue. The sun
  is yellow. Here we go. There and back again." repeated, one repetition per line;
  needles "One of the special magic numbers for KEY is: VALUE." inserted between
  repetitions, on lines of their own (RULER places them at random lines; here the
  queried needle's line is set by a depth percentage, covered in balanced blocks, so
  that depth is a controlled variable);
- one newline between the text and the question ("What is the special magic number
  for KEY mentioned in the provided text?");
- RULER's answer prefix after the chat template's generation prompt (" The special
  magic number for KEY mentioned in the provided text is"): the answer continues it.

Scored with RULER's ``string_match_all``. Options: ``num_needles`` (the queried needle
plus distractor needles with other keys at random lines), ``depth`` (fix the queried
needle's depth; otherwise each block of examples covers ``depths`` once),
``value_digits`` (RULER uses 7-digit numbers).
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
    "A special magic number is hidden within the following text. Make sure to "
    "memorize it. I will quiz you about the number afterwards."
)
HAYSTACK = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. "
    "There and back again."
)
NEEDLE = "One of the special magic numbers for {key} is: {value}."
SEPARATOR = "\n"  # between the text and the question, as in RULER's template
QUESTION = "What is the special magic number for {key} mentioned in the provided text?"
ANSWER_PREFIX = " The special magic number for {key} mentioned in the provided text is"
# what the embedded model is trained to write after the answer prefix
RESPONSE = " {value}"
DEPTHS: tuple[int, ...] = tuple(range(0, 101, 10))


def haystack_lines(needles: Sequence[tuple[float, str]], n: int) -> list[str]:
    """``n`` repetitions of the noise haystack, one per line, with each needle inserted
    as a line of its own at its depth percentage (RULER's noise layout)."""
    lines = [HAYSTACK] * n
    inserts = sorted(
        ((round(depth / 100.0 * n), order, text) for order, (depth, text) in enumerate(needles)),
        key=lambda item: (item[0], item[1]),
    )
    out: list[str] = []
    cursor = 0
    for position, _, text in inserts:
        out.extend(lines[cursor:position])
        out.append(text)
        cursor = position
    out.extend(lines[cursor:])
    return out


def draw_values(rng: Any, count: int, digits: int) -> list[str]:
    """``count`` distinct random numbers of ``digits`` digits (RULER's needle values)."""
    if digits < 1:
        raise ValueError("value_digits must be positive")
    values: list[str] = []
    while len(values) < count:
        value = str(rng.randint(10 ** (digits - 1), 10**digits - 1))
        if value not in values:
            values.append(value)
    return values


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
    rng = example_rng(seed, TASK, index)
    keys = rng.sample(NEEDLE_KEYS, num_needles)
    values = draw_values(rng, num_needles, value_digits)
    query_depth = float(depth) if depth is not None else float(balanced_pick(depths, seed, TASK, index))
    needle_depths = [query_depth] + [rng.uniform(0.0, 100.0) for _ in range(num_needles - 1)]
    needles = [
        (d, NEEDLE.format(key=k, value=v)) for d, k, v in zip(needle_depths, keys, values)
    ]
    return needle_record(
        tokenizer, target_tokens, needles, keys[0], values[0],
        id=f"{TASK}-s{seed}-t{target_tokens}-n{num_needles}-{index}", task=TASK,
        metadata={
            "depth": query_depth,
            "num_needles": num_needles,
            "needles": [
                {"key": k, "value": v, "depth": d} for k, v, d in zip(keys, values, needle_depths)
            ],
        },
    )


def needle_record(tokenizer: Any, target_tokens: int, needles: Sequence[tuple[float, str]], key: str,
                  value: str, *, id: str, task: str, metadata: dict[str, Any]) -> TaskRecord:
    """The record of a RULER needle prompt: ``needles`` (depth, sentence) in a haystack
    fitted to ``target_tokens``, the question and answer prefix about ``key``."""
    question = QUESTION.format(key=key)
    prefix = ANSWER_PREFIX.format(key=key)

    def make_context(n: int) -> str:
        return "\n".join([INSTRUCTION, *haystack_lines(needles, n)])

    context, _, _ = fit_filler(tokenizer, make_context, question, target_tokens,
                               separator=SEPARATOR, answer_prefix=prefix)
    record = TaskRecord(id=id, task=task, context=context, question=question, answers=[value],
                        separator=SEPARATOR, answer_prefix=prefix,
                        metadata={"target_tokens": target_tokens, **metadata})
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
        QuestionAnswer(QUESTION.format(key=n["key"]), n["value"], RESPONSE.format(value=n["value"]),
                       n["key"], ANSWER_PREFIX.format(key=n["key"]),
                       NEEDLE.format(key=n["key"], value=n["value"]))
        for n in record.metadata["needles"]
    ]


def vocabulary_texts() -> list[str]:
    """Every string this task can put into a prompt, for building a word-level vocabulary."""
    return [INSTRUCTION, HAYSTACK, NEEDLE.format(key="", value=""), QUESTION.format(key=""),
            ANSWER_PREFIX.format(key=""), *NEEDLE_KEYS]
