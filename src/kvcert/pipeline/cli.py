"""Pipeline commands: ``kvcert plan``, ``kvcert check``, ``kvcert manifest``, ``kvcert shard``.

The Snakefile runs ``kvcert manifest`` and ``kvcert shard`` for its jobs; both look
their job up in the plan of the experiment's pre-registered grid and compose the run
configs with hydra (:mod:`kvcert.pipeline.compose`).
"""

from __future__ import annotations

import json
from pathlib import Path

from .compose import analysis_plan, compose_config, configs_dir, generation_config, prereg_dir, run_overrides
from .config import experiment_grid
from .plan import build_plan, gpu_hours


def _folders(args) -> Path:
    """Fill in ``args.prereg`` where not given; the configs folder to compose from."""
    if args.prereg is None:
        args.prereg = str(prereg_dir())
    return Path(args.configs).resolve() if args.configs else configs_dir()


def _experiment(args) -> tuple[dict, object]:
    config_dir = _folders(args)
    exp, grid = experiment_grid(args.experiment, config_dir, args.prereg)
    return exp, build_plan(args.experiment, grid)


def plan_command(args) -> int:
    exp, plan = _experiment(args)
    jobs = plan.jobs_per_rule()
    print(f"experiment {plan.experiment}: {len(plan.grid['models'])} models, {plan.generations} generations")
    print(f"{'rule':<15} {'jobs':>6} {'generations':>12}")
    for rule, n in jobs.items():
        gens = plan.generations if rule == "generate" else 0
        print(f"{rule:<15} {n:>6} {gens:>12}")
    cells: dict[str, int] = {}
    for s in plan.shards:
        cells[s.cell] = cells.get(s.cell, 0) + s.generations
    for cell, n in cells.items():
        print(f"  cell {cell:<10} {n:>8} generations")
    hours = gpu_hours(plan, exp["seconds_per_generation"], exp["fork_speedup"])
    print(f"generations={plan.generations} jobs={plan.jobs} gpu_hours={hours:.1f}")
    return 0


def check_command(args) -> int:
    from .check import preflight

    config_dir = _folders(args)
    problems = preflight(args.experiment, args.prereg, config_dir, args.profile)
    for line in problems:
        print(line)
    if problems:
        print(f"experiment {args.experiment}: {len(problems)} problem(s) to fix before a run")
        return 1
    print(f"experiment {args.experiment}: ready (pre-registration, models, data"
          + (f", profile {args.profile})" if args.profile else ")"))
    return 0


def manifest_command(args) -> int:
    from .manifest import build_records, load_tokenizer, write_manifest

    config_dir = _folders(args)
    _, plan = _experiment(args)
    item = plan.manifest(args.model, args.task, args.length)
    composed = compose_config([f"experiment={args.experiment}", f"model={args.model}", f"task={args.task}"], config_dir)
    if args.model_path:
        composed["model"]["path"] = args.model_path
    tokenizer = load_tokenizer(composed["model"])
    records = build_records(composed["task"], tokenizer, item.length, item.examples, item.seed)
    if len(records) < item.examples:
        raise ValueError(f"task {args.task}: only {len(records)} examples, the grid asks for {item.examples}")
    write_manifest(records, args.out)
    print(f"{args.out}: {len(records)} records")
    return 0


def shard_command(args) -> int:
    from ..generation.runner import load_records, run_specs

    config_dir = _folders(args)
    _, plan = _experiment(args)
    shard = plan.shard(args.model, args.cell, args.task, args.length, args.index)
    aplan = analysis_plan(args.prereg)
    records = load_records(args.manifest, shard.start, shard.stop)
    configs = []
    for run in shard.runs:
        composed = compose_config(run_overrides(args.experiment, args.model, args.task, run), config_dir)
        if args.model_path:
            composed["model"]["path"] = args.model_path
        configs.append(generation_config(composed, aplan, None))
    prereg_hash = json.loads(Path(args.verified).read_text())["prereg_hash"] if args.verified else None
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    run_specs(configs, records, args.out, prereg_hash=prereg_hash, progress=not args.quiet,
              forked=getattr(args, "forked", True))
    print(f"{args.out}: {shard.generations} generations")
    return 0


def _common(p) -> None:
    p.add_argument("--experiment", default="smoke")
    p.add_argument("--prereg", default=None,
                   help="pre-registration folder (default: ./preregistration, else the installed copy)")
    p.add_argument("--configs", default=None,
                   help="hydra configs folder (default: ./configs, else the installed copy; or $KVCERT_CONFIGS)")


def register(subparsers) -> None:
    p = subparsers.add_parser("plan", help="generations, jobs per rule and expected GPU hours of an experiment")
    _common(p)
    p.set_defaults(func=plan_command)

    p = subparsers.add_parser("check", help="pre-flight: pre-registration, model folders, data, profile placeholders")
    _common(p)
    p.add_argument("--profile", default=None, help="a Snakemake profile folder to check too (e.g. profiles/slurm)")
    p.set_defaults(func=check_command)

    p = subparsers.add_parser(
        "run", help="one-off generations from overrides (outside the pre-registration), with a summary table",
        description=__import__("kvcert.pipeline.oneoff", fromlist=["x"]).__doc__,
        formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="model=… model.path=… task=… method=… budget=… | compression_ratio=… condition=… limit=…")
    p.add_argument("--prereg", default=None, help="pre-registration folder whose analysis plan sets the design")
    p.add_argument("--configs", default=None, help="hydra configs folder (default: ./configs, else the installed copy)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=lambda args: __import__("kvcert.pipeline.oneoff", fromlist=["x"]).run_command(args))

    p = subparsers.add_parser("manifest", help="build the task records of one (model, task, length)")
    _common(p)
    p.add_argument("--model", required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--length", type=int, required=True)
    p.add_argument("--model-path", default=None, help="override the model config's path (a retrained model)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=manifest_command)

    p = subparsers.add_parser("shard", help="run every planned generation of one shard (resumable)")
    _common(p)
    for name in ("model", "cell", "task"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--length", type=int, required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--manifest", required=True)
    p.add_argument("--verified", default=None, help="verified freeze record (JSON) whose prereg_hash is stamped")
    p.add_argument("--model-path", default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--batch-1", dest="forked", action="store_false",
                   help="run every generation alone (the reference path) instead of forking each example's prefill")
    p.set_defaults(func=shard_command)
