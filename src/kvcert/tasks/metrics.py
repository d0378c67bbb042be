"""Scoring of predictions against gold answers.

- :func:`string_match_all` — RULER's needle metric: the fraction of the references
  found (as substrings) in the lower-cased prediction.
- :func:`recall` — token recall of the best gold answer: the fraction of its
  normalised tokens that occur in the normalised prediction.
- :func:`normalize_answer` — LongBench's normalisation: lower-case, drop punctuation,
  drop the articles a/an/the, collapse whitespace (in that order).
- :func:`score` — dispatch by task name (``ANSWER_METRICS``).

All scores lie in [0, 1]. A prediction counts as *correct* when its score is at least
:data:`CORRECT_THRESHOLD` (= 1): every reference found (needle) or every token of one
gold answer recalled (multi-key QA, multi-turn recall); see :func:`is_correct`.
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

#: task name -> answer metric; loaders that add tasks register their metric here.
ANSWER_METRICS: dict[str, AnswerMetric] = {
    "needle": string_match_all,
    "lookalike": string_match_all,
    "multikey": recall,
    "multiturn": recall,
    "unscored": unscored,
}


def register_metric(task_name: str, scorer: AnswerMetric) -> None:
    """Add (or replace) the answer metric of a task."""
    ANSWER_METRICS[task_name] = scorer


def score(task_name: str, prediction: str, answers: list[str]) -> float:
    """Score ``prediction`` with the answer metric of ``task_name``; a float in [0, 1]."""
    try:
        metric = ANSWER_METRICS[task_name]
    except KeyError:
        raise KeyError(
            f"no answer metric for task {task_name!r}; known: {', '.join(sorted(ANSWER_METRICS))}"
        ) from None
    return float(metric(prediction, answers))


def is_correct(task_name: str, prediction: str, answers: list[str]) -> bool:
    """True when the score reaches :data:`CORRECT_THRESHOLD`."""
    return score(task_name, prediction, answers) >= CORRECT_THRESHOLD
