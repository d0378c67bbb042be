"""Task manifests: the records of one (model, task, length), in that model's tokens.

Synthetic tasks are generated (seeded); LongBench and LoCoMo are read from the local
paths (or hub ids) their task config names — only here, when a manifest is built.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..tasks.records import TaskRecord, write_jsonl


def load_tokenizer(model_cfg: dict):
    from transformers import AutoTokenizer

    from ..models import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path(model_cfg["path"]))


def build_records(task_cfg: dict, tokenizer, length: int, examples: int, seed: int) -> list[TaskRecord]:
    kind = task_cfg.get("kind", "synthetic")
    if kind == "synthetic":
        from ..tasks import generate

        return generate(task_cfg["name"], tokenizer, n_examples=examples, target_tokens=length, seed=seed)
    if kind == "longbench":
        from ..tasks.longbench import load_longbench, longbench_records

        rows = load_longbench(task_cfg["source"], task_cfg["dataset"], limit=examples)
        return longbench_records(rows, task_cfg["dataset"], tokenizer, max_length=length)
    if kind == "locomo":
        from ..tasks.locomo import load_locomo, locomo_records

        samples = load_locomo(task_cfg["source"])
        return locomo_records(samples, tokenizer, seed=seed)[:examples]
    raise ValueError(f"task.kind: unknown kind {kind!r} (synthetic | longbench | locomo)")


def write_manifest(records: list[TaskRecord], out: str | Path) -> Path:
    """Write atomically, so an interrupted build never leaves a half manifest."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    write_jsonl(records, tmp)
    os.replace(tmp, out)
    return out
