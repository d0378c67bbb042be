"""Fitting a generated prompt to a target length in tokens of a given tokenizer.

A generator describes its context as a function of a filler count ``n`` (more filler,
longer prompt); :func:`fit_filler` finds the largest ``n`` whose complete prompt
(chat template included) has at most ``target_tokens`` tokens. It guesses ``n`` from
the tokens per filler unit, then gallops and bisects around the guess, so a record
costs a handful of tokenizations. The result is shorter than the target by less than
one filler unit. A task whose earlier turns are chat messages (``multiturn_chat``) has
``make_context`` return those messages and measures them with its own ``measure``.
"""

from __future__ import annotations

from typing import Any, Callable

from kvcert.tasks.prompting import PROMPT_SEPARATOR, prompt_length

_PROBE_UNITS = 8

#: where the length a message names is set
LENGTH_SETTING = "kvcert run's length=; in a grid, its lengths"


class LengthTooShort(ValueError):
    """A target too short for a generated prompt, in the target's own terms (what :func:`fit_filler` or a
    generator was given): ``needed`` the least target that would do, ``why`` in words. :meth:`Task.build
    <kvcert.tasks.Task.build>` turns it into a :class:`LengthError` in terms of the user's length."""

    def __init__(self, why: str, needed: int, target: int) -> None:
        super().__init__(f"target_tokens={target} is too small: {why}")
        self.why, self.needed, self.target = why, int(needed), int(target)


class LengthError(ValueError):
    """A prompt length (``kvcert run``'s ``length=``, a grid's ``lengths``) too short for a task's prompts, in one
    line: ``what`` went wrong, the ``fix`` (the length to give), ``needed`` (that length), and ``instead``: what
    to do where ``needed`` is more than the model's positions (``kvcert run`` knows them; :meth:`beyond`)."""

    def __init__(self, what: str, fix: str, needed: int, instead: str = "use a model with more positions") -> None:
        super().__init__(f"{what}; {fix}")
        self.what, self.fix, self.needed, self.instead = what, fix, int(needed), instead

    def beyond(self, positions: int, answer: int, model: str) -> str:
        """The message where the length it needs, with the answer, exceeds ``positions``."""
        return (f"{self.what}; it needs length={self.needed} or more, and with its {answer}-token answer that exceeds "
                f"the model's {positions} positions (max_position_embeddings of {model}): {self.instead}")


def fit_filler(
    tokenizer: Any,
    make_context: Callable[[int], str],
    question: str,
    target_tokens: int,
    max_units: int = 1 << 20,
    separator: str = PROMPT_SEPARATOR,
    answer_prefix: str = "",
    measure: Callable[[Any], int] | None = None,
) -> tuple[Any, int, int]:
    """Return ``(context, n, length)`` with the largest ``n`` such that the prompt fits.

    ``make_context(n)`` must grow (weakly) in length with ``n``; ``separator`` and
    ``answer_prefix`` are the record's (see :mod:`kvcert.tasks.prompting`). ``measure(context)``
    is the complete prompt's length in tokens of what ``make_context`` returns; by default the
    single user message of context and question
    (:func:`~kvcert.tasks.prompting.prompt_length`).
    """
    cache: dict[int, int] = {}
    if measure is None:
        def measure(context: str) -> int:
            return prompt_length(tokenizer, context, question, separator, answer_prefix)

    def length_of(n: int) -> int:
        if n not in cache:
            cache[n] = measure(make_context(n))
        return cache[n]

    base = length_of(0)
    if base > target_tokens:
        raise LengthTooShort(f"the prompt without filler already has {base} tokens", base, target_tokens)
    per_unit = max((length_of(_PROBE_UNITS) - base) / _PROBE_UNITS, 1e-9)
    guess = int(min(max_units, max(0, (target_tokens - base) / per_unit)))

    # Bracket: low fits, high does not.
    step = max(1, guess // 64)
    if length_of(guess) <= target_tokens:
        low, high = guess, guess + step
        while length_of(high) <= target_tokens:
            low = high
            step *= 2
            high = low + step
            if high > max_units:
                raise ValueError(
                    f"could not reach {target_tokens} tokens with {max_units} filler units"
                )
    else:
        high, low = guess, max(0, guess - step)
        while length_of(low) > target_tokens:
            high = low
            step *= 2
            low = max(0, low - step)
    while high - low > 1:
        middle = (low + high) // 2
        if length_of(middle) <= target_tokens:
            low = middle
        else:
            high = middle
    return make_context(low), low, length_of(low)
