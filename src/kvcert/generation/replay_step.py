"""The replay step (``kvcert replay``): model config + the replay cell's task records → replay draws (Parquet) and
the impossibility rows (JSON). The model side of claims C1, C2 and C8 (:mod:`kvcert.generation.replay` computes
the draws); the analysis reads the table (:mod:`kvcert.analysis.replay_stats`).

Everything it draws is registered: the budgets, draws, later queries, query kinds and the sampling seed come from
the typed plan's ``replay`` part (:class:`kvcert.config.analysis_plan.ReplayPart`; its ``seed`` is the schema default 0
until an amendment registers it), δ and the retention design from the plan too; the robust certificate's
registered parameters are checked against :mod:`kvcert.method.sketch`. The table's provenance records all of it, the
pre-registration hash and, run by the Snakefile (``--experiment``), the hash of the configs it is made under.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping

from ..config.paths import resolve_configs
from ..config.experiment import experiment_grid
from ..config.prereg import load_plan, verify
from ..provenance import code_digest, git_commit
from ..tables import write_json, write_table


def _model_section(config_path: str | Path) -> dict:
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(OmegaConf.load(str(config_path)), resolve=True)
    if not isinstance(data, dict):
        raise ValueError(f"{config_path}: not a mapping")
    model = data.get("model", data)
    if not isinstance(model, dict) or "path" not in model:
        raise ValueError(f"{config_path}: no model section (name, path, dtype, device) found")
    return model


def resolve_model(model_config: str | Path | None = None, model: str | None = None,
                  configs: str | Path | None = None, model_path: str | None = None) -> dict:
    """The model to replay: a model/job config file, or a model name looked up in ``configs/model/<name>.yaml``.

    ``model_path`` overrides the config's path (a retrained embedded model).
    """
    if model_config is not None:
        section = _model_section(model_config)
    elif model is not None:
        path = resolve_configs(configs) / "model" / f"{model}.yaml"
        if not path.exists():
            raise FileNotFoundError(f"{path}: no model config named {model!r}")
        section = _model_section(path)
    else:
        raise ValueError("give --model-config FILE or --model NAME (with --configs DIR)")
    section = dict(section)
    if model_path:
        section["path"] = str(model_path)
    return section


def replay_cell(experiment: str, records: str | Path, prereg: str | Path, configs: str | Path, model: str,
                model_path: str | None = None) -> tuple[str, str, int | None]:
    """(task, config hash, the grid's draws per budget or None) of the replay cell whose manifest is ``records``,
    after checking the manifest is what ``kvcert manifest`` builds for it
    (:func:`kvcert.generation.manifest.verify_manifest`). A grid's ``replay.draws`` replaces the analysis plan's
    ``replay.draws`` for its experiment: a grid that reads more prompts may spend fewer draws on each."""
    from .jobs import replay_config_hash
    from .manifest import verify_manifest
    from .plan import build_plan

    grid = experiment_grid(experiment, configs, prereg)[1]
    text = Path(records).as_posix()
    match = [m for m in build_plan(experiment, grid).replays if m.model == model and text.endswith("/" + m.path)]
    if len(match) != 1:
        raise ValueError(f"{records}: not a replay manifest of experiment {experiment}'s plan for model {model}")
    item = match[0]
    verify_manifest(records, item, configs, model_path)  # its seal, the plan's inputs, a rebuild
    return (item.task, replay_config_hash(configs, model, item.task, grid["replay"]["method"]),
            grid_replay_draws(grid, experiment))


def grid_replay_draws(grid: Mapping, experiment: str) -> int | None:
    """The draws per budget a design grid's replay registers (``replay.draws``), None where it leaves the analysis
    plan's; a positive integer or a one-line error naming the key."""
    draws = (grid.get("replay") or {}).get("draws")
    if draws is not None and (isinstance(draws, bool) or not isinstance(draws, int) or draws < 1):
        raise ValueError(f"grid of experiment {experiment}: replay.draws must be a positive integer (draws per budget "
                         f"and query), got {draws!r}")
    return draws


def replay_step(model: Mapping, records: str | Path, prereg: str | Path, out: str | Path,
                impossibility_out: str | Path, seed: int | None = None, max_layers: int | None = None,
                max_examples: int | None = None, threads: int | None = None, experiment: str | None = None,
                configs: str | Path | None = None, model_path: str | None = None) -> tuple[Path, Path]:
    """Replay every record of ``records`` with ``model`` (a model config mapping; settings from the typed
    ``analysis_plan``: its ``replay`` part, δ, the design, the robust certificate). ``seed``: the draws' sampling
    seed, the plan's ``replay.seed`` where None (what the Snakefile runs). With ``experiment`` (as the Snakefile
    runs it), the manifest is checked against the plan's and the table stamped with the hash of the configs it is
    made under, and the grid's ``replay.draws``, where it registers one, replaces the plan's (:func:`replay_cell`)."""
    from ..method.design import RetentionDesign
    from ..method.models import ModelSpec, load_model
    from ..tasks.records import read_jsonl
    from .replay import impossibility_for_model, replay_layers, replay_model

    if threads:
        import torch

        torch.set_num_threads(int(threads))
    from ..method.sketch import check_plan

    freeze = verify(prereg)
    plan = load_plan(prereg)
    rp, design = plan.replay, RetentionDesign(**plan.design)
    check_plan(plan.robust_certificate)
    kinds = list(rp.query_kinds)
    seed = rp.seed if seed is None else int(seed)
    spec = ModelSpec(**{k: v for k, v in model.items() if k in ModelSpec.__dataclass_fields__})
    task, made_under, grid_draws = (
        replay_cell(experiment, records, prereg, resolve_configs(configs), model["name"], model_path)
        if experiment else (None, None, None))
    n_draws = rp.draws if grid_draws is None else grid_draws
    rp = replace(rp, draws=n_draws, seed=seed)
    recs = read_jsonl(records)[:max_examples]
    if not recs:
        raise ValueError(f"{records}: no task records to replay")
    from ..config.digest import content_digest

    loaded, tokenizer = load_model(spec)  # a fetched model's folder is checked against its pins here
    digest = content_digest(spec.path)
    t0 = time.perf_counter()
    draws = replay_model(loaded, tokenizer, recs, rp, plan.delta, design, max_layers, model_name=spec.name,
                         progress=True)
    rows = impossibility_for_model(loaded, tokenizer, recs[0], design=design, seed=seed, model_name=spec.name)
    num_layers = loaded.config.get_text_config().num_hidden_layers
    provenance = {
        "model": spec.name, "model_path": Path(spec.path).name, "model_digest": digest, "experiment": experiment,
        "task": task,
        "config_hash": made_under, "examples": len(recs),
        "records": Path(records).name, "budgets": list(rp.budgets), "draws": n_draws,
        "later_queries": rp.later_queries, "query_kinds": kinds, "delta": plan.delta, "design": dict(plan.design),
        "robust_certificate": plan.robust_certificate, "seed": seed,
        "layers": replay_layers(num_layers, max_layers), "prereg_hash": freeze.prereg_hash,
        "frozen_utc": freeze.frozen_utc, "git_commit": git_commit(), "code_digest": code_digest(), "seconds": round(time.perf_counter() - t0, 2),
    }
    path = write_table(draws, out, provenance)
    imp = write_json({"model": spec.name, "prereg_hash": freeze.prereg_hash, "rows": rows}, impossibility_out)
    return path, imp
