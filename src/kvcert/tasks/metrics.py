"""Scoring of predictions against gold answers.

- :func:`string_match_all` — RULER's needle metric: the fraction of the references
  found (as substrings) in the lower-cased prediction.
- :func:`string_match_part` — RULER's QA metric: 1 if any reference is found (as a
  substring) in the lower-cased prediction.
- :func:`recall` — token recall of the best gold answer: the fraction of its
  normalised tokens that occur in the normalised prediction.
- :func:`normalize_answer` — LongBench's normalisation: lower-case, drop punctuation,
  drop the articles a/an/the, collapse whitespace (in that order).

All scores lie in [0, 1]. A prediction counts as *correct* when its score is at least
:data:`CORRECT_THRESHOLD` (= 1): every reference found (needle) or every token of one
gold answer recalled (multi-key QA, multi-turn recall); see :func:`kvcert.tasks.is_correct`.
Each task names its metric in the task registry (:mod:`kvcert.tasks`).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Callable

CORRECT_THRESHOLD = 1.0

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower-case, remove punctuation, remove articles, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def string_match_all(prediction: str, references: list[str]) -> float:
    """RULER ``string_match_all`` for one sample: share of references in the prediction."""
    if not references:
        raise ValueError("string_match_all needs at least one reference")
    lowered = prediction.lower()
    return sum(1.0 for ref in references if ref.lower() in lowered) / len(references)


def string_match_part(prediction: str, references: list[str]) -> float:
    """RULER ``string_match_part`` for one sample: 1 if any reference is in the prediction."""
    if not references:
        raise ValueError("string_match_part needs at least one reference")
    lowered = prediction.lower()
    return max(1.0 if ref.lower() in lowered else 0.0 for ref in references)


def recall(prediction: str, answers: list[str]) -> float:
    """Best token recall over the gold answers (normalised, multiset counts)."""
    if not answers:
        raise ValueError("recall needs at least one gold answer")
    predicted = Counter(normalize_answer(prediction).split())
    best = 0.0
    for answer in answers:
        gold = Counter(normalize_answer(answer).split())
        total = sum(gold.values())
        if total == 0:
            continue
        found = sum((gold & predicted).values())
        best = max(best, found / total)
    return best


AnswerMetric = Callable[[str, list[str]], float]


def unscored(prediction: str, answers: list[str]) -> float:
    """Free text without gold answers (``kvcert.generate_answer``): no score (NaN)."""
    return float("nan")
