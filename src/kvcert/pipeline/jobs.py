"""The plan's jobs, typed: what one generate job runs and writes, computed without running it.

``Experiment → Plan → Job → GenerationSpec → GenerationRecord → scores → ClaimResult``: the plan
(:mod:`kvcert.pipeline.plan`) lists each shard's runs (condition, method, budget, seed); here
each run becomes the :class:`~kvcert.generation.spec.GenerationSpec` its job runs, built from
the config files themselves — the model's, the task's, the method's (or the method grammar's,
:mod:`kvcert.methods`), the certificate's aggregations of ``configs/config.yaml`` — and the
frozen analysis plan's retention design and δ. No hydra composition happens on this path
(``kvcert run`` composes with hydra for its overrides; a test checks the two give the same
spec for every run), so a job's specs cost milliseconds, and each value is validated once,
where it enters (:meth:`GenerationSpec.from_dict`).

* :func:`shard_specs` — the specs of one planned shard: what ``kvcert shard`` runs;
* :func:`shard_config_hash` — one hash of a shard's runs (the hash of the config hashes its
  records carry): the Snakefile's rerun trigger, so a job reruns exactly when what its records
  would carry changes (a model's dtype or source, a task's answer budget, a method), and an
  operational setting (a planning estimate) reruns nothing;
* :func:`planned_records` — what the job writes: for each example of the shard's slice of its
  manifest and each run, the record's generation key and the config hash stamped on it; scoring
  compares every shard with it (:class:`kvcert.analysis.load.PlannedShard`);
* :func:`replay_config_hash` — the configs a replay table is made under (stamped in it, checked by the claims);
* :func:`manifest_references` — the manifest's reference answers and metadata per example, which
  a record's score is derived from.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from ..analysis_plan import AnalysisPlan
from .compose import analysis_plan, generation_config
from .plan import Run, Shard


@lru_cache(maxsize=None)
def _parsed(path: str, stamp: int):
    """A config file parsed (once per version); its interpolations are resolved per read, by :func:`_load`."""
    from omegaconf import OmegaConf

    return OmegaConf.load(path)


def _load(path: str, stamp: int) -> dict:
    """A config file's content with its interpolations (``${oc.env:...}``) resolved now: an environment
    variable set or changed since the file was first read (``KVCERT_MODEL_DIR``) is the one used."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(_parsed(path, stamp), resolve=True) or {}


def config_file(config_dir: str | Path, group: str, name: str) -> dict:
    """``configs/<group>/<name>.yaml`` (``group`` "" for the primary ``config.yaml``), read once per version;
    a missing one is refused in one line naming the file."""
    path = Path(config_dir) / group / f"{name}.yaml" if group else Path(config_dir) / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"{path}: no such config file")
    return dict(_load(str(path), path.stat().st_mtime_ns))


def task_answer_tokens(config_dir: str | Path, task: str) -> int:
    """A task's answer budget from its config file: ``max_new_tokens``, else its task's where that is null
    (LongBench's dataset2maxlen), else 32 (:func:`kvcert.pipeline.compose.answer_tokens`'s fallback)."""
    from ..tasks import task_for_config

    cfg = config_file(config_dir, "task", task)
    if cfg.get("max_new_tokens"):
        return int(cfg["max_new_tokens"])
    return int(task_for_config(cfg).answer_tokens(cfg) or 32)


def run_config(config_dir: str | Path, model: str, task: str, run: Run, plan: AnalysisPlan,
               model_path: str | None = None) -> dict:
    """The generation config (:meth:`GenerationSpec.from_dict`'s mapping) of one planned run of ``model`` on
    ``task``: the model's, task's and method's config files, the run's condition, budget, seed and chunking,
    the certificate's aggregations of ``config.yaml``, and the analysis plan's design and δ (``plan``).
    ``model_path`` overrides the model's path (a retrained embedded model)."""
    from ..methods import method_config

    primary = config_file(config_dir, "", "config")
    model_cfg = config_file(config_dir, "model", model)
    if model_path:
        model_cfg["path"] = model_path
    composed = {
        "model": model_cfg,
        "task": config_file(config_dir, "task", task),
        "method": method_config(run.method, config_dir),
        "condition": run.condition,
        "budget": float(run.budget),
        "seed": int(run.seed),
        "chunk_tokens": run.chunk_tokens,
        "certificate": dict(primary.get("certificate") or {}),
    }
    return generation_config(composed, plan, None)


def shard_configs(experiment: str, shard: Shard, config_dir: str | Path, prereg: str | Path,
                  model_path: str | None = None, cache: dict | None = None) -> list[dict]:
    """The generation config of every run of ``shard`` (``model_path`` overrides the model's path).
    ``cache``: a dict kept across the shards of one call (the analysis plan is read once)."""
    cache = {} if cache is None else cache
    if ("plan", str(prereg)) not in cache:
        cache[("plan", str(prereg))] = analysis_plan(prereg)
    plan = cache[("plan", str(prereg))]
    return [run_config(config_dir, shard.model, shard.task, run, plan, model_path) for run in shard.runs]


def shard_specs(experiment: str, shard: Shard, config_dir: str | Path, prereg: str | Path,
                model_path: str | None = None, cache: dict | None = None) -> list:
    """The :class:`~kvcert.generation.spec.GenerationSpec` of every run of ``shard``: what its job runs."""
    from ..generation.spec import GenerationSpec

    return [GenerationSpec.from_dict(c) for c in shard_configs(experiment, shard, config_dir, prereg, model_path, cache)]


def shard_config_hash(experiment: str, shard: Shard, config_dir: str | Path, prereg: str | Path,
                      model_path: str | None = None, cache: dict | None = None) -> str:
    """One hash (16 hex digits) of the config hashes the shard's records carry: the job's rerun trigger."""
    from ..provenance import config_hash

    hashes = [config_hash(s.hashed_dict()) for s in shard_specs(experiment, shard, config_dir, prereg, model_path, cache)]
    return hashlib.sha256("\n".join(hashes).encode()).hexdigest()[:16]


def manifest_config_hash(config_dir: str | Path, model: str, task: str, model_path: str | None = None) -> str:
    """One hash (16 hex digits) of what a manifest job reads from the configs: the model's tokenizer (its
    source, :func:`kvcert.sources.path_identity`; a dtype does not change a manifest) and the task's config
    (its data, answer budget, chat rule). The manifest job's rerun trigger, and what its seal records
    (:func:`kvcert.pipeline.manifest.check_manifest`)."""
    from ..sources import path_identity

    model_cfg = config_file(config_dir, "model", model)
    content = {"tokenizer": path_identity(model_path or model_cfg["path"]), "task": config_file(config_dir, "task", task)}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]


def replay_config_hash(config_dir: str | Path, model: str, task: str, method: str) -> str:
    """One hash (16 hex digits) of the configs a replay table is made under: the model's config but its
    path (its dtype, device; the folder's content is :func:`~kvcert.pipeline.digest.model_digest`'s), the
    task's and the replay's method. The replay job's rerun trigger, stamped in the table's provenance and
    compared with the configs as they are now before any claim reads the table."""
    from ..methods import method_config

    model_cfg = {k: v for k, v in config_file(config_dir, "model", model).items() if k != "path"}
    content = {"model": model_cfg, "task": config_file(config_dir, "task", task),
               "method": method_config(method, config_dir)}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _manifest_records(manifest: str | Path, cache: dict) -> list:
    from ..generation.runner import load_records

    if ("manifest", str(manifest)) not in cache:  # every shard of a manifest reads it: once
        cache[("manifest", str(manifest))] = load_records(manifest)
    return cache[("manifest", str(manifest))]


def planned_records(experiment: str, shard: Shard, manifest: str | Path, config_dir: str | Path,
                    prereg: str | Path, model_path: str | None = None, cache: dict | None = None) -> dict[tuple, str]:
    """{generation key (as :func:`kvcert.analysis.load.generation_key` normalises it): config hash}
    of every record the job of ``shard`` writes, from the examples of ``manifest``."""
    from ..provenance import config_hash

    cache = {} if cache is None else cache
    records = _manifest_records(manifest, cache)[shard.start:shard.stop]
    specs = shard_specs(experiment, shard, config_dir, prereg, model_path, cache)
    hashes = [config_hash(s.hashed_dict()) for s in specs]
    planned = {}
    for record in records:
        tokens = record.metadata.get("target_tokens")
        for spec, digest in zip(specs, hashes):
            key = (spec.model.name, record.task, None if tokens is None else int(tokens), record.id, spec.condition,
                   spec.method.name, float(spec.budget), int(spec.seed))
            planned[key] = digest
    return planned


def manifest_references(manifest: str | Path, shard: Shard, cache: dict | None = None) -> dict[str, tuple[list, dict]]:
    """{example id: (its reference answers, its metadata)} of the manifest records of ``shard``: what a record's
    score is derived from, taken from the manifest (the plan's data), not from the record."""
    cache = {} if cache is None else cache
    return {r.id: (list(r.answers), dict(r.metadata)) for r in _manifest_records(manifest, cache)[shard.start:shard.stop]}
