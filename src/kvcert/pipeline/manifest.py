"""Task manifests: the records of one (model, task, length), in that model's tokens.

Synthetic tasks are generated (seeded); LongBench and LoCoMo are read from the local
paths (or hub ids) their task config names — only here, when a manifest is built.
"""

from __future__ import annotations

from pathlib import Path

from ..tasks.records import TaskRecord, write_jsonl


def load_tokenizer(model_cfg: dict):
    from transformers import AutoTokenizer

    from ..models import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path(model_cfg["path"]))


def spread_over_conversations(records: list[TaskRecord], examples: int) -> list[TaskRecord]:
    """``examples`` QA items spread over every conversation: each conversation gets a share proportional to its
    items (largest remainder), taken at evenly spaced positions of its QA list (so its categories, which the
    released file lists in runs, are all represented); records stay in file order."""
    by_conv: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        by_conv.setdefault(str(r.metadata.get("sample_id")), []).append(i)
    examples = min(examples, len(records))
    exact = {c: examples * len(idx) / len(records) for c, idx in by_conv.items()}
    take = {c: int(v) for c, v in exact.items()}
    for c in sorted(exact, key=lambda c: (take[c] - exact[c], c))[: examples - sum(take.values())]:
        take[c] += 1
    chosen = []
    for c, idx in by_conv.items():
        k = take[c]
        chosen += [idx[int((j + 0.5) * len(idx) / k)] for j in range(k)] if k else []
    return [records[i] for i in sorted(chosen)]


def build_records(task_cfg: dict, tokenizer, length: int, examples: int, seed: int,
                  sample: str = "first") -> list[TaskRecord]:
    kind = task_cfg.get("kind", "synthetic")
    if kind == "synthetic":
        from ..tasks import generate

        return generate(task_cfg["name"], tokenizer, n_examples=examples, target_tokens=length, seed=seed)
    if kind == "longbench":
        from ..tasks.longbench import load_longbench, longbench_records

        rows = load_longbench(task_cfg["source"], task_cfg["dataset"], limit=examples)
        return longbench_records(rows, task_cfg["dataset"], tokenizer, max_length=length,
                                 chat_template=task_cfg.get("chat_template") or "official")
    if kind == "locomo":
        from ..tasks.locomo import load_locomo, locomo_records

        samples = load_locomo(task_cfg["source"])
        records = locomo_records(samples, tokenizer, seed=seed)
        if sample == "spread":
            return spread_over_conversations(records, examples)
        if sample != "first":
            raise ValueError(f"locomo: sample must be 'first' or 'spread', got {sample!r}")
        return records[:examples]
    raise ValueError(f"task.kind: unknown kind {kind!r} (synthetic | longbench | locomo)")


def write_manifest(records: list[TaskRecord], out: str | Path) -> Path:
    """Write atomically (:func:`~kvcert.tasks.records.write_jsonl`), so an interrupted build never leaves
    a half manifest."""
    write_jsonl(records, out)
    return Path(out)
