"""Needle retrieval in the RULER style (NVIDIA/RULER, ``niah``, noise haystack).

The conventions of RULER's own generator (``scripts/data/synthetic/niah.py`` and the
``niah`` entry of ``constants.py``), for one queried needle with one value:

- the instruction in RULER's single-needle wording (RULER rewrites its template to
  the singular whenever one key is queried for one value, distractor keys or not):
  "A special magic number is hidden within the following text. Make sure to memorize
  it. I will quiz you about the number afterwards.";
- the length: RULER counts the whole prompt plus the answer's reserve
  (``tokens_to_generate``, 128 for its needle tasks) against the nominal length, so the
  prompt here (chat template and answer prefix included) is fitted to ``target_tokens``
  minus ``answer_tokens`` (:data:`ANSWER_TOKENS` = 128 by default);
- the haystack, one sentence per line: ``haystack="noise"`` (RULER's ``repeat``, the
  default) repeats the whole string "The grass is green. The sky is blue. The sun is
  yellow. Here we go. There and back again."; ``haystack="needle"`` (RULER's ``needle``)
  puts a needle with a random key and value on every line. RULER's ``essay`` haystack
  (Paul Graham's essays, downloaded text kvcert does not ship) is replaced by
  ``haystack="prose"``: the language reference's text that Python ships
  (:mod:`kvcert.tasks.prose`), one sentence per line, a passage of its own per prompt from
  an offset drawn from the example's generator (the task ``needle_prose``: its records'
  ids and task name ``needle_prose``, their keys, values and depths those of ``needle``'s
  record of the same seed and index);
- the needles "One of the special magic numbers for KEY is: VALUE." inserted on lines of
  their own, each before a haystack line, never after the last one, as RULER's insertion
  indexes (drawn from ``range(lines)``) place them (RULER picks the lines at random; here
  the queried needle's line is set by a depth percentage, covered in balanced blocks, so
  that depth is a controlled variable: depth 100 is the line before the last);
- one newline between the text and the question ("What is the special magic number
  for KEY mentioned in the provided text?");
- RULER's answer prefix after the chat template's generation prompt (" The special
  magic number for KEY mentioned in the provided text is"): the answer continues it.

Scored with RULER's ``string_match_all``. Options: ``num_needles`` (the queried needle
plus distractor needles with other keys at random lines), ``depth`` (fix the queried
needle's depth; otherwise each block of examples covers ``depths`` once),
``value_digits`` (RULER uses 7-digit numbers), ``haystack`` and ``answer_tokens``.
"""

from __future__ import annotations

from typing import Any, Sequence

from kvcert.tasks.lengths import LengthTooShort, fit_filler
from kvcert.tasks.prompting import measured
from kvcert.tasks.prose import ProseHaystack
from kvcert.tasks.records import QuestionAnswer, TaskRecord
from kvcert.tasks.sampling import example_rng, generator, placement_depths
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
ANSWER_TOKENS = 128  # RULER's tokens_to_generate of its needle tasks, reserved from the length
HAYSTACKS = ("noise", "needle", "prose")
#: the task a prose haystack makes of each task: its name, its records' ids and task name
PROSE_SUFFIX = "_prose"


def haystack_lines(needles: Sequence[tuple[float, str]], n: int, lines: Sequence[str] | None = None) -> list[str]:
    """``n`` haystack lines (``lines``' first ``n``; default the noise sentence on each) with
    each needle inserted as a line of its own at its depth percentage, before haystack line
    ``min(round(depth · n / 100), n − 1)``: never after the last one (RULER's insertion)."""
    lines = [HAYSTACK] * n if lines is None else list(lines[:n])
    last = max(n - 1, 0)
    inserts = sorted(
        ((min(round(depth / 100.0 * n), last), order, text) for order, (depth, text) in enumerate(needles)),
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
    haystack: str = "noise",
    answer_tokens: int = ANSWER_TOKENS,
) -> TaskRecord:
    """One needle record of about ``target_tokens − answer_tokens`` prompt tokens."""
    if num_needles < 1 or num_needles > len(NEEDLE_KEYS):
        raise ValueError(f"num_needles must be in 1..{len(NEEDLE_KEYS)}, got {num_needles}")
    rng = example_rng(seed, TASK, index)
    keys = rng.sample(NEEDLE_KEYS, num_needles)
    values = draw_values(rng, num_needles, value_digits)
    needle_depths = placement_depths(rng, num_needles, depth, depths, seed, TASK, index)
    query_depth = needle_depths[0]
    needles = [
        (d, NEEDLE.format(key=k, value=v)) for d, k, v in zip(needle_depths, keys, values)
    ]
    if haystack not in HAYSTACKS:
        raise ValueError(f"haystack: {haystack!r} is not one of {HAYSTACKS}")
    lines = None if haystack == "noise" else prose_lines(TASK, seed, index) if haystack == "prose" else \
        NeedleHaystack(example_rng(seed, f"{TASK}-haystack", index), keys, value_digits)
    name = task_name(TASK, haystack)
    return needle_record(
        tokenizer, target_tokens, needles, keys[0], values[0], lines=lines, answer_tokens=answer_tokens,
        id=f"{name}-s{seed}-t{target_tokens}-n{num_needles}-{index}", task=name,
        metadata={
            "depth": query_depth,
            "num_needles": num_needles,
            "haystack": haystack,
            "needles": [
                {"key": k, "value": v, "depth": d} for k, v, d in zip(keys, values, needle_depths)
            ],
        },
    )


def task_name(task: str, haystack: str) -> str:
    """The registered task of ``task`` on ``haystack``: ``task`` itself, ``<task>_prose`` on the prose haystack."""
    return task + PROSE_SUFFIX if haystack == "prose" else task


def prose_lines(task: str, seed: int, index: int) -> ProseHaystack:
    """The prose haystack of example ``index`` of ``task``: its passage's offset drawn from the example's own
    ``prose`` stream (:func:`~kvcert.tasks.sampling.example_rng`), so each prompt takes its own passage and the
    task's other draws are those of its noise records."""
    return ProseHaystack(example_rng(seed, task, index, stream="prose"))


class NeedleHaystack:
    """RULER's ``needle`` haystack: line ``i`` is a needle with a random key (none of
    ``exclude``) and a random value, drawn once, in order (a longer haystack extends a shorter)."""

    def __init__(self, rng: Any, exclude: Sequence[str], digits: int):
        self.rng, self.keys, self.digits = rng, [k for k in NEEDLE_KEYS if k not in set(exclude)], digits
        self.lines: list[str] = []

    def __getitem__(self, part: slice) -> list[str]:
        while len(self.lines) < (part.stop or 0):
            key = self.rng.choice(self.keys)
            self.lines.append(NEEDLE.format(key=key, value=draw_values(self.rng, 1, self.digits)[0]))
        return self.lines[part]


def needle_record(tokenizer: Any, target_tokens: int, needles: Sequence[tuple[float, str]], key: str,
                  value: str, *, id: str, task: str, metadata: dict[str, Any], lines: Any = None,
                  answer_tokens: int = ANSWER_TOKENS) -> TaskRecord:
    """The record of a RULER needle prompt: ``needles`` (depth, sentence) in a haystack
    (``lines``; default the noise sentence) fitted to ``target_tokens − answer_tokens``, the
    question and answer prefix about ``key``."""
    question = QUESTION.format(key=key)
    prefix = ANSWER_PREFIX.format(key=key)
    if answer_tokens < 0:
        raise ValueError(f"answer_tokens: must be >= 0, got {answer_tokens}")
    if answer_tokens >= target_tokens:
        raise LengthTooShort(f"RULER keeps {answer_tokens} tokens of the length for the answer", answer_tokens + 1,
                             target_tokens)

    def make_context(n: int) -> str:
        return "\n".join([INSTRUCTION, *haystack_lines(needles, n, lines)])

    context, _, _ = fit_filler(tokenizer, make_context, question, target_tokens - answer_tokens,
                               separator=SEPARATOR, answer_prefix=prefix)
    record = TaskRecord(id=id, task=task, context=context, question=question, answers=[value],
                        separator=SEPARATOR, answer_prefix=prefix,
                        metadata={"target_tokens": target_tokens, "answer_tokens": answer_tokens, **metadata})
    return measured(tokenizer, record)


#: ``n_examples`` needle records (see the module docstring for ``options``).
generate = generator(make_record)


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
