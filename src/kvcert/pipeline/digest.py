"""Content digests that decide when a pipeline job reruns.

Snakemake reruns a job when its inputs are newer than its outputs or its params change.
File times are the wrong signal for files that can be rewritten unchanged (a restored
pre-registration, a re-checked-out config) and say nothing about a config edited in
place. So the Snakefile gives each job, as params, the digests of what it depends on:

- the pre-registration hash of the newest freeze (:func:`kvcert.prereg.verify`): the
  same after an edit is restored, new after an amendment;
- :func:`config_digest` of the hydra config files the job composes (its model, task,
  methods, budgets, the experiment and the primary config), by content: a comment or
  key order changes nothing, a changed ``path``, ``dtype`` or ``max_new_tokens`` reruns
  the jobs that read it, and no others.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import yaml

from .compose import budget_option


@lru_cache(maxsize=None)
def _file_digest(path: str, mtime_ns: int) -> str:
    data = yaml.safe_load(Path(path).read_text()) if Path(path).exists() else None
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def config_digest(configs: Path, files: Iterable[str]) -> str:
    """SHA-256 (16 hex digits) of the parsed content of ``files`` (relative to ``configs``)."""
    parts = []
    for name in sorted(set(files)):
        path = Path(configs) / name
        stamp = path.stat().st_mtime_ns if path.exists() else 0
        parts.append(f"{name}:{_file_digest(str(path), stamp)}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def job_config_files(experiment: str, model: str, task: str, methods: Iterable[str] = (),
                     budgets: Iterable[float] = ()) -> list[str]:
    """The config files one job composes (see :mod:`kvcert.pipeline.compose`)."""
    files = ["config.yaml", f"experiment/{experiment}.yaml", f"model/{model}.yaml", f"task/{task}.yaml"]
    files += [f"method/{m}.yaml" for m in methods]
    files += [f"budget/{budget_option(b)}.yaml" for b in budgets]
    return files
