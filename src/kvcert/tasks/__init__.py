"""Evaluation tasks: generators and loaders that emit :class:`TaskRecord` objects,
their scorers, and the rendering of a record into prompt token ids.

``TASKS`` maps a task name to a :class:`Task`: its ``generate(tokenizer, n_examples,
target_tokens, seed, **options) -> list[TaskRecord]`` and its answer metric. The synthetic
tasks (``needle``, ``lookalike``, ``multikey``, ``multiturn``) serve both the embedded model and the
real models; further tasks (LongBench, LoCoMo loaders) register with
:func:`register_task`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from kvcert.tasks import lookalike, metrics, multikey, multiturn, needle
from kvcert.tasks.metrics import ANSWER_METRICS, AnswerMetric, is_correct, register_metric, score
from kvcert.tasks.prompting import build_prompt_ids
from kvcert.tasks.records import RecordError, TaskRecord, read_jsonl, write_jsonl

Generator = Callable[..., list[TaskRecord]]


@dataclass(frozen=True)
class Task:
    """A task name with its record generator (or loader) and its answer metric."""

    name: str
    generate: Generator
    metric: AnswerMetric

    def score(self, prediction: str, answers: list[str]) -> float:
        return float(self.metric(prediction, answers))


TASKS: dict[str, Task] = {}


def register_task(name: str, generate: Generator, metric: AnswerMetric) -> Task:
    """Add a task to ``TASKS`` and its answer metric to :data:`kvcert.tasks.metrics.ANSWER_METRICS`."""
    task = Task(name, generate, metric)
    TASKS[name] = task
    register_metric(name, metric)
    return task


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; known: {', '.join(sorted(TASKS))}") from None


def generate(task_name: str, tokenizer: Any, n_examples: int, target_tokens: int, seed: int,
             **options: Any) -> list[TaskRecord]:
    """Records of ``task_name`` (see each generator for its options)."""
    return get_task(task_name).generate(tokenizer, n_examples, target_tokens, seed, **options)


register_task("needle", needle.generate, metrics.string_match_all)
register_task("multikey", multikey.generate, metrics.recall)
register_task("multiturn", multiturn.generate, metrics.recall)
register_task("lookalike", lookalike.generate, metrics.string_match_all)

#: the synthetic tasks (generated, no data needed) — the embedded default runs these.
SYNTHETIC_TASKS: tuple[str, ...] = ("needle", "multikey", "multiturn", "lookalike")

__all__ = [
    "RecordError", "ANSWER_METRICS", "SYNTHETIC_TASKS", "TASKS", "Task", "TaskRecord",
    "build_prompt_ids", "generate", "get_task", "is_correct", "read_jsonl",
    "register_task", "score", "write_jsonl",
]
