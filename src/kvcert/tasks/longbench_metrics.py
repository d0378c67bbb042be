"""The LongBench v1 metrics and its per-task score.

Source: Bai et al. 2023, "LongBench: A Bilingual, Multitask Benchmark for Long
Context Understanding" (ACL 2024); the behaviour follows the official ``metrics.py``
and ``eval.py`` of THUDM/LongBench (v1), re-implemented here.

Per-answer metrics, each ``(prediction, ground_truth, **kwargs) -> float`` in [0, 1]:

- :func:`qa_f1_score` — token-multiset F1 of the whitespace tokens after
  :func:`normalize_answer` (lower-case, then punctuation removed, then the words
  a/an/the removed, then whitespace collapsed — in that order, so "the-end" becomes
  "theend" and keeps its article).
- :func:`rouge_score` — ROUGE-L F of the ``rouge`` package (``Rouge().get_scores``
  with ``avg=True``); any failure of the package (empty hypothesis, ...) scores 0.
- :func:`classification_score` — the class names of ``all_classes`` found as
  substrings of the prediction, minus those that are strict substrings of the gold
  class; 1/|matches| when the gold class is among them, else 0. Two properties of
  the official code are kept on purpose so that scores stay comparable: (a) the
  removal pass deletes from the list it walks, so the element right after a removed
  one is never examined; (b) its fall-back to the most similar class
  (``difflib``) sits behind ``if em_match_list != 0``, a list compared with an int,
  which is always true — the fall-back never runs, and a prediction naming no class
  scores 0.
- :func:`retrieval_score` — the paragraph number of the gold ("Paragraph N") against
  every number in the prediction: the share of the prediction's numbers equal to N.
- :func:`count_score` — the share of the prediction's numbers equal to the gold count.
- :func:`code_sim_score` — ``fuzz.ratio / 100`` between the gold line and the first
  line of the prediction that contains none of "`", "#", "//".
- Chinese (multifieldqa_zh, dureader, vcsum, lsht, passage_retrieval_zh):
  :func:`qa_f1_zh_score` — token F1 over ``jieba.cut`` words, each passed through
  :func:`normalize_zh_answer` (lower-case, ASCII and Chinese punctuation dropped,
  whitespace dropped) and empty words discarded; :func:`rouge_zh_score` — ROUGE-L F of
  the jieba words joined by spaces; :func:`retrieval_zh_score` — as
  :func:`retrieval_score` with the gold written "段落N"; lsht uses
  :func:`classification_score`.

Aggregation (``eval.py``): for trec, triviaqa, samsum and lsht the prediction is first
cut to its first line (after dropping leading newlines); a sample scores the maximum
over its gold answers (starting from 0); a task scores ``round(100 * mean, 2)``.
``DATASET2METRIC`` covers all 21 datasets. The prediction is scored as generated:
``eval.py`` strips nothing (``" \\nParis"`` scores 0 on triviaqa, ``"x.\\n"`` 0.67 ROUGE-L
against ``"x"``), and neither do these functions or the generation engine.
"""

from __future__ import annotations

import math
import re
import string
import warnings
from collections import Counter
from typing import Callable, Sequence

from kvcert.tasks.metrics import normalize_answer

__all__ = [
    "DATASET2METRIC", "FIRST_LINE_DATASETS", "classification_score", "code_sim_score",
    "count_score", "first_line", "normalize_answer", "normalize_zh_answer", "qa_f1_score",
    "qa_f1_zh_score", "retrieval_score", "retrieval_zh_score", "rouge_score", "rouge_zh_score",
    "score_sample", "score_task", "token_f1",
]


def token_f1(prediction_tokens: Sequence[str], gold_tokens: Sequence[str]) -> float:
    """F1 of two token multisets; 0 when they share no token."""
    shared = sum((Counter(prediction_tokens) & Counter(gold_tokens)).values())
    if shared == 0:
        return 0.0
    precision = shared / len(prediction_tokens)
    recall = shared / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def qa_f1_score(prediction: str, ground_truth: str, **_: object) -> float:
    """Token F1 of the normalised prediction against one normalised gold answer."""
    return token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def rouge_score(prediction: str, ground_truth: str, **_: object) -> float:
    """ROUGE-L F (``rouge`` package); 0 when the package cannot score the pair."""
    from rouge import Rouge

    try:
        scores = Rouge().get_scores([prediction], [ground_truth], avg=True)
    except Exception:  # the official scorer maps every failure (e.g. empty text) to 0
        return 0.0
    return float(scores["rouge-l"]["f"])


def classification_score(prediction: str, ground_truth: str,
                         all_classes: Sequence[str] | None = None, **_: object) -> float:
    """LongBench's class-name matching (see the module docstring for its two quirks)."""
    if not all_classes:
        raise ValueError("classification_score needs the dataset's all_classes")
    matches = [name for name in all_classes if name in prediction]
    # Walk the list by position while deleting from it, as a Python for-loop over a
    # list that is being shortened does: after a deletion the next element is skipped.
    position = 0
    while position < len(matches):
        name = matches[position]
        position += 1
        if name in ground_truth and name != ground_truth:
            matches.remove(name)
    # The official fall-back to the most similar class is unreachable (see above).
    if ground_truth in matches:
        return 1.0 / len(matches)
    return 0.0


def _numbers(text: str) -> list[str]:
    return re.findall(r"\d+", text)


def _share_equal(numbers: list[str], target: str) -> float:
    if not numbers:
        return 0.0
    return sum(1 for number in numbers if number == target) / len(numbers)


def retrieval_score(prediction: str, ground_truth: str, **_: object) -> float:
    """Share of the prediction's numbers that equal the gold paragraph number."""
    found = re.findall(r"Paragraph (\d+)", ground_truth)
    if not found:
        raise ValueError(f"retrieval gold answer {ground_truth!r} names no 'Paragraph N'")
    return _share_equal(_numbers(prediction), found[0])


def count_score(prediction: str, ground_truth: str, **_: object) -> float:
    """Share of the prediction's numbers that equal the gold count."""
    return _share_equal(_numbers(prediction), str(ground_truth))


def code_sim_score(prediction: str, ground_truth: str, **_: object) -> float:
    """``fuzz.ratio / 100`` of the first code-like line of the prediction and the gold line."""
    with warnings.catch_warnings():
        # fuzzywuzzy warns at import when python-Levenshtein is absent; both backends
        # are what LongBench users run, the warning is noise here.
        warnings.simplefilter("ignore", UserWarning)
        from fuzzywuzzy import fuzz

    line = ""
    for candidate in prediction.lstrip("\n").split("\n"):
        if "`" not in candidate and "#" not in candidate and "//" not in candidate:
            line = candidate
            break
    return fuzz.ratio(line, ground_truth) / 100


# ------------------------------------------------------------------ Chinese

#: the Chinese punctuation ``normalize_zh_answer`` drops besides ASCII's (metrics.py's list)
CN_PUNCTUATION = ("！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿"
                  "–—‘’‛“”„‟…‧﹏.")
_ZH_PUNCTUATION = frozenset(string.punctuation + CN_PUNCTUATION)


def _jieba_words(text: str) -> list[str]:
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)  # its dictionary-loading banner is noise in logs
    return list(jieba.cut(text, cut_all=False))


def normalize_zh_answer(text: str) -> str:
    """Lower-case, drop ASCII and Chinese punctuation, drop every whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _ZH_PUNCTUATION)
    return "".join(text.split())


def qa_f1_zh_score(prediction: str, ground_truth: str, **_: object) -> float:
    """Token F1 over jieba words, each normalised, empty ones dropped."""
    def words(text: str) -> list[str]:
        return [w for w in (normalize_zh_answer(t) for t in _jieba_words(text)) if w]

    return token_f1(words(prediction), words(ground_truth))


def rouge_zh_score(prediction: str, ground_truth: str, **_: object) -> float:
    """ROUGE-L F of the jieba words joined by spaces."""
    return rouge_score(" ".join(_jieba_words(prediction)), " ".join(_jieba_words(ground_truth)))


def retrieval_zh_score(prediction: str, ground_truth: str, **_: object) -> float:
    """Share of the prediction's numbers that equal the gold paragraph number ("段落N")."""
    found = re.findall(r"段落(\d+)", ground_truth)
    if not found:
        raise ValueError(f"retrieval gold answer {ground_truth!r} names no '段落N'")
    return _share_equal(_numbers(prediction), found[0])


Metric = Callable[..., float]

#: LongBench v1's 21 datasets -> metric (as in the official eval.py).
DATASET2METRIC: dict[str, Metric] = {
    "narrativeqa": qa_f1_score,
    "qasper": qa_f1_score,
    "multifieldqa_en": qa_f1_score,
    "multifieldqa_zh": qa_f1_zh_score,
    "hotpotqa": qa_f1_score,
    "2wikimqa": qa_f1_score,
    "musique": qa_f1_score,
    "dureader": rouge_zh_score,
    "gov_report": rouge_score,
    "qmsum": rouge_score,
    "multi_news": rouge_score,
    "vcsum": rouge_zh_score,
    "trec": classification_score,
    "triviaqa": qa_f1_score,
    "samsum": rouge_score,
    "lsht": classification_score,
    "passage_count": count_score,
    "passage_retrieval_en": retrieval_score,
    "passage_retrieval_zh": retrieval_zh_score,
    "lcc": code_sim_score,
    "repobench-p": code_sim_score,
}

#: datasets whose prediction eval.py cuts to its first line before scoring.
FIRST_LINE_DATASETS = frozenset({"trec", "triviaqa", "samsum", "lsht"})


def metric_for(dataset: str) -> Metric:
    try:
        return DATASET2METRIC[dataset]
    except KeyError:
        raise KeyError(
            f"no LongBench metric for dataset {dataset!r}; known: {', '.join(sorted(DATASET2METRIC))}"
        ) from None


def first_line(prediction: str) -> str:
    """The prediction without leading newlines, up to its first newline."""
    return prediction.lstrip("\n").split("\n")[0]


def score_sample(dataset: str, prediction: str, answers: Sequence[str],
                 all_classes: Sequence[str] | None = None) -> float:
    """One sample: the best score over the gold answers (0 with no answer)."""
    metric = metric_for(dataset)
    if dataset in FIRST_LINE_DATASETS:
        prediction = first_line(prediction)
    best = 0.0
    for answer in answers:
        best = max(best, float(metric(prediction, answer, all_classes=all_classes)))
    return best


def score_task(dataset: str, predictions: Sequence[str], answers_list: Sequence[Sequence[str]],
               all_classes: Sequence[str] | None = None) -> float:
    """A task: ``round(100 * mean of the sample scores, 2)``."""
    if len(predictions) != len(answers_list):
        raise ValueError(
            f"{len(predictions)} predictions but {len(answers_list)} answer lists for {dataset!r}"
        )
    if not predictions:
        raise ValueError(f"no predictions to score for {dataset!r}")
    total = sum(score_sample(dataset, p, a, all_classes) for p, a in zip(predictions, answers_list))
    return round(100 * total / len(predictions), 2)


# ------------------------------------------------------------------ LongBench-E: scored by length

#: eval.py --e's buckets of a row's ``length`` field (its words; characters for the Chinese sets)
LENGTH_BUCKETS: tuple[tuple[str, float], ...] = (("0-4k", 4000), ("4-8k", 8000), ("8k+", math.inf))


def length_bucket(length: float) -> str:
    """The LongBench-E bucket of a row's ``length``: below 4000, below 8000, else 8k+."""
    for name, below in LENGTH_BUCKETS:
        if length < below:
            return name
    raise ValueError(f"length {length!r} is not a number")


def bucket_scores(scores: Sequence[float], lengths: Sequence[float]) -> dict[str, float]:
    """eval.py ``scorer_e``'s summary of per-sample scores in [0, 1]: per bucket ``round(100 · mean, 2)``
    (NaN for an empty bucket, as ``np.mean([])`` gives), the buckets in order."""
    if len(scores) != len(lengths):
        raise ValueError(f"{len(scores)} scores but {len(lengths)} lengths")
    groups: dict[str, list[float]] = {name: [] for name, _ in LENGTH_BUCKETS}
    for score, length in zip(scores, lengths):
        groups[length_bucket(length)].append(float(score))
    return {name: round(100 * sum(v) / len(v), 2) if v else math.nan for name, v in groups.items()}


def score_task_e(dataset: str, predictions: Sequence[str], answers_list: Sequence[Sequence[str]],
                 lengths: Sequence[float], all_classes: Sequence[str] | None = None) -> dict[str, float]:
    """A LongBench-E data set as ``eval.py --e`` scores it (``scorer_e``): each sample's best score over its
    answers (the first-line cut where eval.py makes it), then :func:`bucket_scores` by the rows' ``length``."""
    if len(predictions) != len(answers_list):
        raise ValueError(f"{len(predictions)} predictions but {len(answers_list)} answer lists for {dataset!r}")
    return bucket_scores([score_sample(dataset, p, a, all_classes) for p, a in zip(predictions, answers_list)], lengths)
