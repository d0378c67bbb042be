"""What one generate job composes and writes, computed without running it.

:func:`shard_configs` is the generation configs of one planned shard (its runs composed
with hydra, :mod:`kvcert.pipeline.compose`) — what ``kvcert shard`` runs.
:func:`planned_records` is what that job writes: for each example of the shard's slice
of its manifest and each run, the record's generation key and the config hash stamped
on it (:func:`kvcert.provenance.config_hash` of the run's
:class:`~kvcert.generation.spec.GenerationSpec`). Scoring compares every shard with
it (:class:`kvcert.analysis.load.PlannedShard`): a record the plan does not put there,
or one made under another config, is refused.
"""

from __future__ import annotations

from pathlib import Path

from .compose import analysis_plan, compose_config, generation_config, run_overrides
from .plan import Shard


def shard_configs(experiment: str, shard: Shard, config_dir: str | Path, prereg: str | Path,
                  model_path: str | None = None, cache: dict | None = None) -> list[dict]:
    """The generation config of every run of ``shard`` (``model_path`` overrides the model's path).
    ``cache``: a dict kept across the shards of one call (runs repeat across shards)."""
    cache = {} if cache is None else cache
    configs = []
    for run in shard.runs:
        key = (experiment, shard.model, shard.task, run, str(config_dir), str(prereg), model_path)
        if key not in cache:
            composed = compose_config(run_overrides(experiment, shard.model, shard.task, run), Path(config_dir))
            if model_path:
                composed["model"]["path"] = model_path
            cache[key] = generation_config(composed, analysis_plan(prereg), None)
        configs.append(dict(cache[key]))
    return configs


def planned_records(experiment: str, shard: Shard, manifest: str | Path, config_dir: str | Path,
                    prereg: str | Path, model_path: str | None = None, cache: dict | None = None) -> dict[tuple, str]:
    """{generation key (as :func:`kvcert.analysis.load.generation_key` normalises it): config hash}
    of every record the job of ``shard`` writes, from the examples of ``manifest``."""
    from ..generation.runner import load_records
    from ..generation.spec import GenerationSpec
    from ..provenance import config_hash

    cache = {} if cache is None else cache
    if ("manifest", str(manifest)) not in cache:  # every shard of a manifest reads it: once
        cache[("manifest", str(manifest))] = load_records(manifest)
    records = cache[("manifest", str(manifest))][shard.start:shard.stop]
    specs = [GenerationSpec.from_dict(c) for c in shard_configs(experiment, shard, config_dir, prereg, model_path, cache)]
    hashes = [config_hash(s.to_dict()) for s in specs]
    planned = {}
    for record in records:
        tokens = record.metadata.get("target_tokens")
        for spec, digest in zip(specs, hashes):
            key = (spec.model.name, record.task, None if tokens is None else int(tokens), record.id, spec.condition,
                   spec.method.name, float(spec.budget), int(spec.seed))
            planned[key] = digest
    return planned
