"""Needles among look-alike keys: RULER's needle task where the distractor needles'
keys differ from the queried key in one word.

Keys are RULER's word keys, "adjective-noun" pairs ("grumpy-pocket"). Besides the
queried needle, the haystack holds ``lookalikes`` distractor needles whose keys share
its noun ("sleepy-pocket", "rusty-pocket") and ``others`` whose keys share its
adjective ("grumpy-lantern"); every needle has its own 7-digit value. Prompt, haystack
layout, question, answer prefix and metric are those of :mod:`kvcert.tasks.needle`
(RULER's ``niah`` conventions), with the key in place of the single word.

This is the embedded world's task with *inherent* difficulty, the counterpart of
LongBench's multi-hop and distractor-heavy items: a question-aware cache keeps every
needle the question's key points to (each shares a word with it), so eviction costs
little, but telling the right needle from its look-alikes is up to the model, and the
small embedded model does it only part of the time (its measured accuracy is in
docs/embedded.md). ``lookalikes`` defaults to a balanced cover of :data:`LOOKALIKES` (so the
difficulty varies from item to item); the queried needle's depth covers ``depths``.
``haystack="prose"`` (the task ``lookalike_prose``) puts the needles into Python's own prose
instead of the noise sentence (:mod:`kvcert.tasks.prose`; :func:`kvcert.tasks.needle.prose_lines`).
"""

from __future__ import annotations

from typing import Any, Sequence

from kvcert.tasks.needle import ANSWER_TOKENS, DEPTHS, NEEDLE, draw_values, needle_record, prose_lines, task_name
from kvcert.tasks.needle import questions_for  # noqa: F401  (the task's: a question per needle, as the needle task's)
from kvcert.tasks.records import TaskRecord
from kvcert.tasks.sampling import balanced_pick, example_rng, generator, placement_depths
from kvcert.tasks.wordlists import KEY_ADJECTIVES, NEEDLE_KEYS

TASK = "lookalike"
LOOKALIKES: tuple[int, ...] = (0, 1, 2, 3)  # same-noun distractors per item, covered in blocks
OTHERS = 1  # same-adjective distractors per item


def key_text(adjective: str, noun: str) -> str:
    """A RULER word key: ``adjective-noun``."""
    return f"{adjective}-{noun}"


def make_record(
    tokenizer: Any,
    target_tokens: int,
    seed: int,
    index: int,
    lookalikes: int | None = None,
    others: int = OTHERS,
    depth: float | None = None,
    depths: Sequence[float] = DEPTHS,
    value_digits: int = 7,
    answer_tokens: int = ANSWER_TOKENS,
    haystack: str = "noise",
) -> TaskRecord:
    """One record of about ``target_tokens − answer_tokens`` prompt tokens (see the module
    docstring; RULER's answer reserve as in :mod:`kvcert.tasks.needle`)."""
    if haystack not in ("noise", "prose"):
        raise ValueError(f"haystack: {haystack!r} is not one of ('noise', 'prose')")
    if lookalikes is None:
        lookalikes = int(balanced_pick(LOOKALIKES, seed, TASK, index))
    if not 0 <= lookalikes < len(KEY_ADJECTIVES):
        raise ValueError(f"lookalikes must be in 0..{len(KEY_ADJECTIVES) - 1}, got {lookalikes}")
    if not 0 <= others < len(NEEDLE_KEYS):
        raise ValueError(f"others must be in 0..{len(NEEDLE_KEYS) - 1}, got {others}")
    rng = example_rng(seed, TASK, index)
    noun = rng.choice(NEEDLE_KEYS)
    adjectives = rng.sample(KEY_ADJECTIVES, 1 + lookalikes)
    other_nouns = rng.sample([n for n in NEEDLE_KEYS if n != noun], others)
    keys = [key_text(a, noun) for a in adjectives] + [key_text(adjectives[0], n) for n in other_nouns]
    kinds = ["query"] + ["lookalike"] * lookalikes + ["other"] * others
    values = draw_values(rng, len(keys), value_digits)
    needle_depths = placement_depths(rng, len(keys), depth, depths, seed, TASK, index)
    query_depth = needle_depths[0]
    needles = [(d, NEEDLE.format(key=k, value=v)) for d, k, v in zip(needle_depths, keys, values)]
    name = task_name(TASK, haystack)
    extra = {} if haystack == "noise" else {"haystack": haystack}  # the noise records as they were
    return needle_record(
        tokenizer, target_tokens, needles, keys[0], values[0], answer_tokens=answer_tokens,
        lines=prose_lines(TASK, seed, index) if haystack == "prose" else None,
        id=f"{name}-s{seed}-t{target_tokens}-l{lookalikes}-{index}", task=name,
        metadata={
            **extra,
            "depth": query_depth,
            "lookalikes": lookalikes,
            "others": others,
            "needles": [{"key": k, "value": v, "depth": d, "kind": kind}
                        for k, v, d, kind in zip(keys, values, needle_depths, kinds)],
        },
    )


#: ``n_examples`` records (options: ``lookalikes``, ``others``, ``depth``, ``depths``, ``value_digits``,
#: ``answer_tokens``, ``haystack``).
generate = generator(make_record)


def vocabulary_texts() -> list[str]:
    """Every string this task can put into a prompt, for building a word-level vocabulary."""
    return [key_text("", ""), *KEY_ADJECTIVES]
