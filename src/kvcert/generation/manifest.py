"""Task manifests: the records of one (model, task, length), in that model's tokens.

Each task builds its own records (the task registry, :mod:`kvcert.tasks`): synthetic tasks
are generated (seeded); LongBench and LoCoMo are read from the local paths (or hub ids) their
task config names — only here, when a manifest is built.

A manifest is *sealed* like a shard (:mod:`kvcert.generation.shards`): beside it,
``<name>.seal.json`` holds the SHA-256 of its bytes and what built it — the plan's
(task, length, examples, seed, sample) and the hash of the tokenizer and task config it read
(:func:`kvcert.generation.jobs.manifest_config_hash`). Generation and scoring take a manifest only
through :func:`check_manifest`: a manifest edited by hand (its references changed), copied in
from another seed or grid, or built under other configs is refused in one line that says to
rebuild it, never generated from or scored against. Like every seal it guards against
accidents, not against an insider who recomputes it (docs/reliability.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..atomic import write_text
from ..tasks.records import TaskRecord, write_jsonl
from .plan import Manifest


def load_tokenizer(model_cfg: dict):
    from transformers import AutoTokenizer

    from ..method.models import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path(model_cfg["path"]))


def build_records(task_cfg: dict, tokenizer, length: int, examples: int, seed: int,
                  sample: str = "first") -> list[TaskRecord]:
    """The records of one task config at ``length`` tokens, built by its task (:func:`kvcert.tasks.task_for_config`)."""
    from ..tasks import task_for_config

    return task_for_config(task_cfg).build(task_cfg, tokenizer, length, examples, seed, sample)


def write_manifest(records: list[TaskRecord], out: str | Path, item: Manifest | None = None,
                   data_hash: str | None = None) -> Path:
    """Write atomically (:func:`~kvcert.tasks.records.write_jsonl`), so an interrupted build never leaves
    a half manifest; with the plan's ``item`` (and the configs' ``data_hash``), seal it (:func:`seal_manifest`)."""
    write_jsonl(records, out)
    if item is not None:
        seal_manifest(out, item, data_hash, len(records))
    return Path(out)


def manifest_seal_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".seal.json")


def built_from(item: Manifest, data_hash: str | None) -> dict:
    """What a manifest is built from: the plan's registered (task, length, examples, seed, sample, set) and
    the hash of the configs read (:func:`kvcert.generation.jobs.manifest_config_hash`)."""
    return {"task": item.task, "length": int(item.length), "examples": int(item.examples), "seed": int(item.seed),
            "sample": item.sample, "set": item.set, "configs": data_hash}


def seal_manifest(path: str | Path, item: Manifest, data_hash: str | None, records: int) -> Path:
    """Write ``<manifest>.seal.json``: the SHA-256 of the manifest's bytes and :func:`built_from`."""
    from .shards import file_digest

    seal = {"records": int(records), "sha256": file_digest(path), "built_from": built_from(item, data_hash)}
    return write_text(manifest_seal_path(path), json.dumps(seal, indent=1, sort_keys=True) + "\n")


def check_manifest(path: str | Path, item: Manifest | None, data_hash: str | None, digest=None) -> None:
    """Refuse, in one line, a manifest that is not what ``kvcert manifest`` built for the plan's ``item``
    under the configs of ``data_hash``: no seal, bytes that differ from the seal (edited references), or a
    seal of another seed, grid or config (``item`` None: the bytes alone). ``digest``: the SHA-256 function
    (a :class:`~kvcert.config.digest.DigestCache`'s, which reads a file again only once it changed)."""
    from .shards import file_digest

    file_digest = digest or file_digest

    path, seal = Path(path), manifest_seal_path(path)
    rebuild = f"delete {path} and {seal.name} and rerun to rebuild it from its registered seed"
    if not seal.exists():
        raise ValueError(f"{path}: no seal ({seal.name}); it was not built by `kvcert manifest`; {rebuild}")
    try:
        data = json.loads(seal.read_text(encoding="utf-8"))
        digest, made = data["sha256"], data["built_from"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{seal}: the seal of {path.name} does not parse; {rebuild}") from None
    if file_digest(path) != digest:
        raise ValueError(f"{path}: its content differs from what `kvcert manifest` built (its seal {seal.name}): "
                         f"edited after it was built; {rebuild}")
    if item is None:
        return
    want = built_from(item, data_hash)
    diff = sorted(k for k in want if made.get(k) != want[k])
    if diff:
        raise ValueError(f"{path}: built from other inputs than the plan's ("
                         + ", ".join(f"{k} {made.get(k)!r} != {want[k]!r}" for k in diff) + f"); {rebuild}")
