"""Task manifests: the records of one (model, task, length), in that model's tokens.

Each task builds its own records (the task registry, :mod:`kvcert.tasks`): synthetic tasks
are generated (seeded); LongBench and LoCoMo are read from the local paths (or hub ids) their
task config names — only here, when a manifest is built.
"""

from __future__ import annotations

from pathlib import Path

from ..tasks.records import TaskRecord, write_jsonl


def load_tokenizer(model_cfg: dict):
    from transformers import AutoTokenizer

    from ..models import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path(model_cfg["path"]))


def build_records(task_cfg: dict, tokenizer, length: int, examples: int, seed: int,
                  sample: str = "first") -> list[TaskRecord]:
    """The records of one task config at ``length`` tokens, built by its task (:func:`kvcert.tasks.task_for_config`)."""
    from ..tasks import task_for_config

    return task_for_config(task_cfg).build(task_cfg, tokenizer, length, examples, seed, sample)


def write_manifest(records: list[TaskRecord], out: str | Path) -> Path:
    """Write atomically (:func:`~kvcert.tasks.records.write_jsonl`), so an interrupted build never leaves
    a half manifest."""
    write_jsonl(records, out)
    return Path(out)
