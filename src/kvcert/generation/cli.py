"""``kvcert generate``: one job (a JSON/YAML config) over a records manifest into one shard; ``kvcert replay``: the
replay step (:mod:`kvcert.generation.replay_step`)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def load_config(path: str) -> dict:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"config: {path} does not exist")
    text = p.read_text()
    data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"config: {path} does not hold a mapping")
    return data


def run(args) -> int:
    from .runner import run_job

    out = run_job(load_config(args.config), args.records, args.out, prereg_hash=args.prereg_hash, progress=not args.quiet)
    print(out)
    return 0


def run_replay(a) -> int:
    from ..config.paths import resolve_configs, resolve_prereg
    from .replay_step import replay_step, resolve_model

    a.prereg = str(resolve_prereg(a.prereg))
    try:
        a.configs = str(resolve_configs(a.configs))
    except FileNotFoundError:  # only --experiment and --model read it; they say so where they do
        pass
    model = resolve_model(a.model_config, a.model, a.configs, a.model_path)
    out, imp = replay_step(model, a.records, a.prereg, a.out, a.impossibility_out, a.seed, a.max_layers,
                           a.max_examples, a.threads, a.experiment, a.configs, a.model_path)
    print(out)
    print(imp)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="run one generation job into a resumable JSONL shard")
    p.add_argument("--config", required=True, help="job config (JSON or YAML): model, method, condition, budget, ...")
    p.add_argument("--records", required=True, help="task records manifest (JSONL)")
    p.add_argument("--out", required=True, help="output shard (JSONL); resumes <out>.partial if present")
    p.add_argument("--prereg-hash", default=None, help="pre-registration hash stamped on every record")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)

    p = subparsers.add_parser("replay", help="attention-level replay (C1, C2, C8) and Theorem 1 for one model",
                              description="Attention-level replay (claims C1, C2, C8) and the impossibility "
                              "demonstration for one model. The model is configs/model/NAME.yaml (--model-path "
                              "overrides its path) or a model/job config file; budgets, draws, later queries, δ and "
                              "the retention design come from the frozen analysis_plan.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="model name: configs/model/<name>.yaml")
    which.add_argument("--model-config", help="a model config (name, path, dtype, device) or a job config with one")
    p.add_argument("--model-path", default=None, help="override the model config's path")
    p.add_argument("--configs", default=None, help="hydra configs folder (for --model; default: as every command finds it)")
    p.add_argument("--experiment", default=None, help="experiment whose plan the records manifest is checked against "
                   "(recorded in the provenance, with the hash of the configs the table is made under)")
    p.add_argument("--records", required=True, help="task records manifest (JSONL) of the replay cell")
    p.add_argument("--prereg", default=None, help="pre-registration folder (frozen; default: $KVCERT_PREREG, else ./preregistration)")
    p.add_argument("--out", required=True, help="replay draws (Parquet)")
    p.add_argument("--impossibility-out", required=True, help="impossibility rows (JSON)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed of the replay draws (default: the frozen "
                   "analysis_plan.replay.seed, 0 until an amendment registers it; another seed is a run off the plan)")
    p.add_argument("--max-layers", type=int, default=None, help="replay this many evenly spaced layers (default: all)")
    p.add_argument("--max-examples", type=int, default=None, help="replay only the first N records")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.set_defaults(func=run_replay)
