"""One entry point from a record and a prediction to its score in [0, 1].

Synthetic tasks score from the gold answers alone (:func:`kvcert.tasks.metrics.score`);
LongBench needs the dataset and its classes, LoCoMo the QA category and the adversarial
choices, both kept in the record's metadata — so the engine scores records, not answers.
"""

from __future__ import annotations

from .metrics import score as score_answer
from .records import TaskRecord


def score_record(record: TaskRecord, prediction: str) -> float:
    """The record's task score of ``prediction``."""
    if record.task.startswith("longbench_"):
        from .longbench import score_longbench_record as longbench_score

        return float(longbench_score(record, prediction))
    if record.task == "locomo":
        from .locomo import score_locomo_record as locomo_score

        return float(locomo_score(record, prediction))
    return float(score_answer(record.task, prediction, record.answers))
