"""Evaluation tasks, one registry: every task — the synthetic ones and the LongBench and LoCoMo
families — is a :class:`Task` in :data:`TASKS`, registered with :func:`register_task`.

A task provides what the rest of the pipeline asks of it, so no other module dispatches on a
task's kind or name:

* ``build(task_cfg, tokenizer, length, examples, seed, sample)`` — its records
  (:class:`TaskRecord`) from its config (``configs/task/<name>.yaml``): generated, seeded, for
  the synthetic tasks; read from the official files for LongBench and LoCoMo;
* ``score_record(record, prediction)`` — the record's score in [0, 1] with the benchmark's own
  metric and post-processing (:func:`score_record`);
* ``check(task_cfg)`` — the pre-flight: one line per problem of its data (none to check for a
  generated task);
* ``default_length`` — ``kvcert run``'s prompt length when none is given (0: the data's own);
* ``answer_tokens(task_cfg)`` — its answer budget where the config leaves it null (LongBench's
  per data set), else None;
* ``uses_chat(task_cfg)`` — whether its prompts go through the tokenizer's chat template (the
  pre-flight refuses a model without one where they do);
* ``capacity(task_cfg)`` — the most records a build offers and why (``kvcert run`` refuses a larger
  ``limit``): a data set's rows or items; for a generated task, whose examples are drawn per index
  without end, the registered maximum :data:`MAX_GENERATED`;
* ``sources(task_cfg)`` — the local files a build reads (a manifest's seal records their SHA-256,
  :mod:`kvcert.generation.manifest`): none for a generated task, None where the data are a Hub id; a
  task on Python's prose (``*_prose``, RULER's essay tasks) names the prose (:func:`kvcert.tasks.prose.source`:
  its Python version and digest, which the seal records).

A synthetic task is registered under its name; a family (``longbench`` for every
``longbench_<dataset>``, ``locomo``) under its kind, and :func:`task_of` finds it from a
record's task name or a config.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Mapping

from kvcert.tasks import (locomo, longbench, lookalike, metrics, multikey, multiturn, multiturn_chat, needle, prose,
                          ruler)
from kvcert.tasks.lengths import LENGTH_SETTING, LengthError, LengthTooShort
from kvcert.tasks.metrics import AnswerMetric
from kvcert.tasks.prompting import build_prompt_ids
from kvcert.tasks.records import RecordError, TaskRecord, progress_of, read_jsonl, write_jsonl
from kvcert.tasks.sampling import generator

Generator = Callable[..., list[TaskRecord]]

#: the most records one build of a generated task offers (``kvcert run``'s ``limit``). Its examples are
#: drawn per (seed, index) without end, so the bound is registered: 25 times the largest cell of the paper's
#: grid (400 examples); another seed gives other records.
MAX_GENERATED = 10_000


def _no_data(task_cfg: Mapping) -> list[str]:
    return []


def _no_answer_budget(task_cfg: Mapping) -> int | None:
    return None


def _chat(task_cfg: Mapping) -> bool:
    return True


def _no_sources(task_cfg: Mapping) -> list:
    return []


def too_short(task: str, length: int, exc: LengthTooShort) -> LengthError:
    """A generator's :class:`LengthTooShort` (in the terms of the target it was given) in the user's terms: the
    task, the length given and the length to give."""
    needed = int(length) + exc.needed - exc.target
    kept = int(length) - exc.target
    why = exc.why + (f", and {kept} more tokens of the length are kept for the answer" if kept > 0
                     and "answer" not in exc.why else "")
    return LengthError(f"task {task}: length={length} is too small: {why}",
                       f"give length={needed} or more ({LENGTH_SETTING})", needed)


def _generated(task_cfg: Mapping) -> tuple[int, str]:
    return MAX_GENERATED, ("the registered maximum of a generated task, kvcert.tasks.MAX_GENERATED; another "
                           "data_seed= gives other records")


@dataclass(frozen=True)
class Task:
    """One task of the registry (see the module docstring).

    ``kind`` is the ``kind`` of its configs (``synthetic``, ``longbench``, ``locomo``; ``free`` for
    the free-text records of :func:`kvcert.generate_answer`); ``prefix``: the task names the family
    covers start with it (``longbench_``); ``generate`` and ``metric``: a synthetic task's seeded
    generator ``generate(tokenizer, n_examples, target_tokens, seed, **options)`` and its answer
    metric ``metric(prediction, answers)``; ``make_record(tokenizer, target_tokens, seed, index)``: its
    one example ``index`` (what ``generate`` builds one by one; a build shows its progress through it);
    ``questions_for(record)``: every fact of a synthetic record asked as a question (the embedded model's
    training data, :mod:`kvcert.training.data`); ``loader``: a family's ``build``; ``sources(task_cfg)``: the
    local files its build reads (none for a generated task; None for a Hub id)."""

    name: str
    kind: str
    default_length: int = 512
    generate: Generator | None = None
    metric: AnswerMetric | None = None
    loader: Callable[..., list[TaskRecord]] | None = None
    scorer: Callable[[TaskRecord, str], float] | None = None
    check: Callable[[Mapping], list[str]] = _no_data
    answer_tokens: Callable[[Mapping], int | None] = _no_answer_budget
    uses_chat: Callable[[Mapping], bool] = _chat
    capacity: Callable[[Mapping], tuple[int, str] | None] = _generated
    sources: Callable[[Mapping], list | None] = _no_sources
    make_record: Callable[..., TaskRecord] | None = None
    questions_for: Callable[[TaskRecord], list] | None = None
    prefix: str | None = None

    def build(self, task_cfg: Mapping, tokenizer: Any, length: int, examples: int, seed: int,
              sample: str = "first", progress: Callable[[int], Any] | None = None) -> list[TaskRecord]:
        """The records of one (task config, length): ``examples`` of them, seeded by ``seed``; ``sample``
        (``first`` | ``spread``) where the data are a fixed file (LoCoMo); ``progress(total)``: a progress
        display (``update``, ``close``) told of every record built. A length too short for the task's prompts
        is one line naming the task, the length and the length to give (:class:`~kvcert.tasks.lengths.LengthError`)."""
        try:
            if self.loader is not None:
                return self.loader(task_cfg, tokenizer, length, examples, seed, sample,
                                   **({} if progress is None else {"progress": progress}))
            if self.make_record is not None:
                return self._generate_each(tokenizer, length, examples, seed, progress_of(progress, examples))
            if self.generate is None:
                raise ValueError(f"task {self.name}: builds no records")
            return self.generate(tokenizer, n_examples=examples, target_tokens=length, seed=seed)
        except LengthTooShort as exc:
            raise too_short(str(task_cfg.get("name") or self.name), length, exc) from None

    def _generate_each(self, tokenizer: Any, length: int, examples: int, seed: int, bar: Any) -> list[TaskRecord]:
        """``generate``'s records, one by one, each shown on ``bar``."""
        records = []
        try:
            for index in range(examples):
                records.append(self.make_record(tokenizer, length, seed, index))
                bar.update(1)
        finally:
            bar.close()
        return records

    def score_record(self, record: TaskRecord, prediction: str) -> float:
        """``prediction``'s score for ``record`` in [0, 1] (NaN for free text without answers)."""
        if self.scorer is not None:
            return float(self.scorer(record, prediction))
        return self.score(prediction, list(record.answers))

    def score(self, prediction: str, answers: list[str]) -> float:
        """The answer metric alone (a synthetic task's; a family scores records, :meth:`score_record`)."""
        if self.metric is None:
            raise ValueError(f"task {self.name}: scores records (its metric needs the record's metadata)")
        return float(self.metric(prediction, answers))


TASKS: dict[str, Task] = {}


def register_task(task: Task | str, generate: Generator | None = None, metric: AnswerMetric | None = None) -> Task:
    """Add ``task`` to :data:`TASKS` (or a synthetic task from its name, generator and metric)."""
    if isinstance(task, str):
        task = Task(task, "synthetic", generate=generate, metric=metric)
    TASKS[task.name] = task
    return task


def task_of(name: str) -> Task:
    """The task a record's or a config's task name belongs to: its own entry, or the family whose prefix
    it carries (``longbench_qasper`` → ``longbench``)."""
    if name in TASKS:
        return TASKS[name]
    for task in TASKS.values():
        if task.prefix and name.startswith(task.prefix):
            return task
    raise KeyError(f"unknown task {name!r}; known: {', '.join(sorted(known_names()))}")


def task_for_config(task_cfg: Mapping) -> Task:
    """The task of a task config (``configs/task/<name>.yaml``: ``name``, ``kind``); a kind that does not
    match the task's is refused."""
    name = str(task_cfg.get("name", "?"))
    kind = str(task_cfg.get("kind", "synthetic"))
    task = TASKS.get(kind) if kind != "synthetic" else None
    if task is None:
        task = task_of(name)
    if task.kind != kind:
        kinds = sorted({t.kind for t in TASKS.values()} - {"free"})
        raise ValueError(f"task {name}: kind {kind!r} is not this task's ({task.kind!r}); the kinds are {', '.join(kinds)}")
    return task


def known_names() -> list[str]:
    return [t.prefix + "<dataset>" if t.prefix else t.name for t in TASKS.values() if t.kind != "free"]


def get_task(name: str) -> Task:
    """The registered task ``name`` (a synthetic task's or a family's name)."""
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; known: {', '.join(sorted(TASKS))}") from None


def generate(task_name: str, tokenizer: Any, n_examples: int, target_tokens: int, seed: int,
             **options: Any) -> list[TaskRecord]:
    """Records of the synthetic task ``task_name`` (see each generator for its options)."""
    return get_task(task_name).generate(tokenizer, n_examples, target_tokens, seed, **options)


def score(task_name: str, prediction: str, answers: list[str]) -> float:
    """Score ``prediction`` against ``answers`` with the answer metric of ``task_name``; a float in [0, 1]."""
    return task_of(task_name).score(prediction, answers)


def is_correct(task_name: str, prediction: str, answers: list[str]) -> bool:
    """True when the score reaches :data:`kvcert.tasks.metrics.CORRECT_THRESHOLD`."""
    return score(task_name, prediction, answers) >= metrics.CORRECT_THRESHOLD


def score_record(record: TaskRecord, prediction: str) -> float:
    """The record's task score of ``prediction`` (its task's :meth:`Task.score_record`)."""
    return task_of(record.task).score_record(record, prediction)


for _module, _metric in ((needle, metrics.string_match_all), (multikey, metrics.recall), (multiturn, metrics.recall),
                         (multiturn_chat, metrics.recall), (lookalike, metrics.string_match_all)):
    register_task(Task(_module.TASK, "synthetic", generate=_module.generate, metric=_metric,
                       make_record=_module.make_record, questions_for=_module.questions_for))
for _module, _metric in ((needle, metrics.string_match_all), (multikey, metrics.recall),
                         (lookalike, metrics.string_match_all)):  # the same on Python's prose (kvcert.tasks.prose)
    _make = partial(_module.make_record, haystack="prose")
    register_task(Task(needle.task_name(_module.TASK, "prose"), "synthetic", generate=generator(_make),
                       metric=_metric, make_record=_make, questions_for=_module.questions_for,
                       sources=prose.task_sources))
for _spec in ruler.RULER_TASKS.values():  # RULER's synthetic tasks, ruler_<name> (kvcert.tasks.ruler)
    register_task(Task(_spec.registered, "synthetic", default_length=ruler.DEFAULT_LENGTH,
                       generate=ruler.generator(_spec.name), metric=metrics.string_match_all,
                       make_record=ruler.record_maker(_spec.name),
                       sources=prose.task_sources if _spec.args.get("type_haystack") == "essay" else _no_sources))
register_task(Task("longbench", "longbench", default_length=6144, loader=longbench.build_records,
                   scorer=longbench.score_longbench_record, check=longbench.check_config,
                   answer_tokens=longbench.config_answer_tokens, uses_chat=longbench.config_uses_chat,
                   capacity=longbench.capacity, sources=longbench.config_sources, prefix="longbench_"))
register_task(Task("locomo", "locomo", default_length=0, loader=locomo.build_records,
                   scorer=locomo.score_locomo_record, check=locomo.check_config, capacity=locomo.capacity,
                   sources=locomo.config_sources))
register_task(Task("unscored", "free", metric=metrics.unscored))  # generate_answer's free question about a context

#: the synthetic tasks (generated, no data needed) — the embedded default runs these (not
#: ``multiturn_chat``: ``multiturn``'s records on the model's chat template, a task for chat models).
SYNTHETIC_TASKS: tuple[str, ...] = ("needle", "multikey", "multiturn", "lookalike")
#: the synthetic tasks on Python's prose haystack (kvcert.tasks.prose), the noise tasks' records in another haystack
PROSE_TASKS: tuple[str, ...] = ("needle_prose", "multikey_prose", "lookalike_prose")
#: RULER's synthetic tasks as registered (``kvcert run task=ruler`` runs them all; kvcert.tasks.ruler)
RULER_TASKS: tuple[str, ...] = tuple(spec.registered for spec in ruler.RULER_TASKS.values())

__all__ = [
    "MAX_GENERATED", "PROSE_TASKS", "RULER_TASKS", "RecordError", "SYNTHETIC_TASKS", "TASKS", "Task", "TaskRecord",
    "build_prompt_ids", "generate", "get_task", "is_correct", "read_jsonl",
    "register_task", "score", "score_record", "task_for_config", "task_of", "write_jsonl",
]
