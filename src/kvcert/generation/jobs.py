"""The plan's jobs, typed: what one generate job runs and writes, computed without running it.

``Experiment → Plan → Job → GenerationSpec → GenerationRecord → scores → ClaimResult``: the plan
(:mod:`kvcert.generation.plan`) lists each shard's runs (condition, method, budget, seed) and hands out
its jobs (:meth:`Plan.job <kvcert.generation.plan.Plan.job>`): a :class:`Job` is a shard with the
:class:`~kvcert.generation.spec.GenerationSpec` of each of its runs, built from the config files
themselves — the model's, the task's, the method's (or the method grammar's,
:mod:`kvcert.config.methods`), the certificate's aggregations of ``configs/config.yaml`` — and the
frozen analysis plan's retention design and δ. No hydra composition happens on this path
(``kvcert run`` composes with hydra for its overrides; a test checks the two give the same
spec for every run), so a job's specs cost milliseconds, and each value is validated once,
where it enters (:meth:`GenerationSpec.from_dict`).

A job carries

* ``specs`` — what ``kvcert shard`` runs (:func:`kvcert.generation.runner.run_specs`);
* ``config_hash`` — one hash of its runs (the hash of the config hashes its records carry): the
  Snakefile's rerun trigger, so a job reruns exactly when what its records would carry changes (a
  model's dtype or source, a task's answer budget, a method), and an operational setting (a planning
  estimate) reruns nothing;
* :meth:`Job.planned_records` — what it writes: for each example of the shard's slice of its manifest
  and each run, the record's :class:`~kvcert.generation.record.GenerationKey` and the config hash
  stamped on it; scoring compares every shard with it (:class:`kvcert.analysis.load.PlannedShard`);
* :meth:`Job.references` — the manifest's reference answers and metadata per example, which a
  record's score is derived from.

Beside the jobs: :func:`replay_config_hash` — the configs a replay table is made under (stamped in
it, checked by the claims); :func:`manifest_config_hash` — what a manifest job reads.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..config.analysis_plan import AnalysisPlan
from ..config.compose import analysis_plan, generation_config


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
    without the file, the config derived from the benchmark tables (:func:`kvcert.config.task_table.derived_config`:
    ``ruler_<name>``, ``longbench_<dataset>``); a missing one is refused in one line naming the file."""
    from ..config.task_table import derived_config

    path = Path(config_dir) / group / f"{name}.yaml" if group else Path(config_dir) / f"{name}.yaml"
    if not path.is_file():
        derived = derived_config(group, name)
        if derived is not None:
            return derived
        raise ValueError(f"{path}: no such config file")
    return dict(_load(str(path), path.stat().st_mtime_ns))


def task_answer_tokens(config_dir: str | Path, task: str) -> int:
    """A task's answer budget from its config file: ``max_new_tokens``, else its task's where that is null
    (LongBench's dataset2maxlen), else 32 (:func:`kvcert.config.compose.answer_tokens`'s fallback)."""
    from ..tasks import task_for_config

    cfg = config_file(config_dir, "task", task)
    if cfg.get("max_new_tokens"):
        return int(cfg["max_new_tokens"])
    return int(task_for_config(cfg).answer_tokens(cfg) or 32)


def run_config(config_dir: str | Path, model: str, task: str, run: Any, plan: AnalysisPlan,
               model_path: str | None = None) -> dict:
    """The generation config (:meth:`GenerationSpec.from_dict`'s mapping) of one planned run of ``model`` on
    ``task``: the model's, task's and method's config files, the run's condition, budget, seed and chunking,
    the certificate's aggregations of ``config.yaml``, and the analysis plan's design and δ (``plan``).
    ``model_path`` overrides the model's path (a retrained embedded model). ``run``: a
    :class:`kvcert.generation.plan.Run`."""
    from ..config.methods import method_config

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


def _analysis_plan(prereg: str | Path, cache: dict) -> AnalysisPlan:
    if ("plan", str(prereg)) not in cache:  # every job of a call reads it: once
        cache[("plan", str(prereg))] = analysis_plan(prereg)
    return cache[("plan", str(prereg))]


def specs_hash(specs) -> str:
    """One hash (16 hex digits) of the config hashes the records of ``specs`` carry: a job's rerun trigger."""
    from ..provenance import config_hash

    hashes = [config_hash(s.hashed_dict()) for s in specs]
    return hashlib.sha256("\n".join(hashes).encode()).hexdigest()[:16]


@dataclass(frozen=True, eq=False)
class Job:
    """One generate job (the module docstring): ``shard`` (a :class:`kvcert.generation.plan.Shard`), the
    :class:`~kvcert.generation.spec.GenerationSpec` of each of its runs (in the shard's order), their
    ``config_hash``, and the ``manifest`` its examples are read from (None: not known here; then
    :meth:`planned_records` and :meth:`references` need it given)."""

    shard: Any
    specs: tuple
    config_hash: str
    manifest: Path | None = None
    cache: dict = field(default_factory=dict, repr=False)  # manifests read once across the jobs of one call

    def examples(self, manifest: str | Path | None = None) -> list:
        """The shard's slice of its manifest: the task records its job generates."""
        where = manifest if manifest is not None else self.manifest
        if where is None:
            raise ValueError(f"{self.shard.path}: no manifest given to read its examples from")
        return _manifest_records(where, self.cache)[self.shard.start:self.shard.stop]

    def planned_records(self, manifest: str | Path | None = None) -> dict:
        """{:class:`~kvcert.generation.record.GenerationKey`: config hash} of every record the job writes."""
        from .record import GenerationKey
        from ..provenance import config_hash

        hashes = [config_hash(s.hashed_dict()) for s in self.specs]
        return {GenerationKey.planned(spec, example): digest
                for example in self.examples(manifest) for spec, digest in zip(self.specs, hashes)}

    def references(self, manifest: str | Path | None = None) -> dict[str, tuple[list, dict]]:
        """{example id: (its reference answers, its metadata)} of the job's examples: what a record's score is
        derived from, taken from the manifest (the plan's data), not from the record."""
        return {r.id: (list(r.answers), dict(r.metadata)) for r in self.examples(manifest)}


def make_job(shard: Any, config_dir: str | Path, prereg: str | Path, model_path: str | None = None,
             manifest: str | Path | None = None, cache: dict | None = None) -> Job:
    """The :class:`Job` of a planned ``shard`` (:meth:`kvcert.generation.plan.Plan.job` calls it): its specs from
    the config files and the analysis plan of ``prereg`` (``model_path`` overrides the model's path: a
    retrained embedded model). ``cache``: a dict kept across the jobs of one call (the analysis plan and each
    manifest are read once)."""
    from .spec import GenerationSpec

    cache = {} if cache is None else cache
    plan = _analysis_plan(prereg, cache)
    specs = tuple(GenerationSpec.from_dict(run_config(config_dir, shard.model, shard.task, run, plan, model_path))
                  for run in shard.runs)
    return Job(shard, specs, specs_hash(specs), None if manifest is None else Path(manifest), cache)


def manifest_config_hash(config_dir: str | Path, model: str, task: str, model_path: str | None = None) -> str:
    """One hash (16 hex digits) of what a manifest job reads from the configs: the model's tokenizer (its
    source, :func:`kvcert.config.sources.path_identity`; a dtype does not change a manifest) and the task's config
    (its data, answer budget, chat rule). The manifest job's rerun trigger, and what its seal records
    (:func:`kvcert.generation.manifest.check_manifest`)."""
    from ..config.sources import path_identity

    model_cfg = config_file(config_dir, "model", model)
    content = {"tokenizer": path_identity(model_path or model_cfg["path"]), "task": config_file(config_dir, "task", task)}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]


def replay_config_hash(config_dir: str | Path, model: str, task: str, method: str) -> str:
    """One hash (16 hex digits) of the configs a replay table is made under: the model's config but its
    path and its pins (its dtype, device; the folder's content is :func:`~kvcert.config.digest.model_digest`'s), the
    task's and the replay's method. The replay job's rerun trigger, stamped in the table's provenance and
    compared with the configs as they are now before any claim reads the table."""
    from ..config.methods import method_config
    from ..config.sources import model_run_settings

    model_cfg = {k: v for k, v in model_run_settings(config_file(config_dir, "model", model)).items() if k != "path"}
    content = {"model": model_cfg, "task": config_file(config_dir, "task", task),
               "method": method_config(method, config_dir)}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _manifest_records(manifest: str | Path, cache: dict) -> list:
    from ..tasks.records import load_records

    if ("manifest", str(manifest)) not in cache:  # every shard of a manifest reads it: once
        cache[("manifest", str(manifest))] = load_records(manifest)
    return cache[("manifest", str(manifest))]

