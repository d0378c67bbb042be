"""Pipeline commands: ``kvcert plan``, ``kvcert check``, ``kvcert manifest``, ``kvcert shard``.

The Snakefile runs ``kvcert manifest`` and ``kvcert shard`` for its jobs; both look
their job up in the plan of the experiment's pre-registered grid, whose runs become
generation specs straight from the config files (:mod:`kvcert.generation.jobs`).
"""

from __future__ import annotations

from pathlib import Path

from ..config.paths import configs_dir, prereg_dir
from ..config.compose import model_setting
from ..generation.jobs import task_answer_tokens
from ..config.experiment import experiment_grid
from ..generation.plan import build_plan, fork_factor, gpu_hours, seconds_per


def _folders(args) -> Path:
    """Fill in ``args.prereg`` where not given; the configs folder to compose from."""
    if args.prereg is None:
        args.prereg = str(prereg_dir())
    return Path(args.configs).resolve() if args.configs else configs_dir()


def _experiment(args) -> tuple[dict, object]:
    config_dir = _folders(args)
    exp, grid = experiment_grid(args.experiment, config_dir, args.prereg)
    return exp, build_plan(args.experiment, grid, config_dir)


def _efficiency(args) -> tuple[float, str | None]:
    """The roofline's decode efficiency: ``--efficiency``, the one measured in ``--gpu-check FILE``
    (:func:`kvcert.generation.roofline.read_gpu_check`), else the assumed one; with the line that says
    where a measured one comes from (None otherwise). The host's seconds per decode step go to
    ``args.host_step``: ``--host-us-per-step``, else the one the file measured, else the stated one."""
    from ..generation import roofline as rf

    stated_host = None if args.host_us_per_step is None else args.host_us_per_step / 1e6
    args.host_step = rf.HOST_SECONDS_PER_STEP if stated_host is None else stated_host
    args.host_source = "stated" if stated_host is None else "given"
    if args.gpu_check is None:
        return (rf.EFFICIENCY if args.efficiency is None else args.efficiency), None
    if args.efficiency is not None:
        raise ValueError("give --efficiency or --gpu-check, not both (--gpu-check's efficiency is measured)")
    m = rf.read_gpu_check(args.gpu_check)
    table = rf.gpu_of_device(m.gpu)
    other = "" if table is rf.GPUS[args.gpu] else (
        f"; the bound below is for the {rf.GPUS[args.gpu].name}"
        + (f" (--gpu {next(k for k, g in rf.GPUS.items() if g is table)} for the measured one)" if table else ""))
    line = (f"roofline: decode efficiency {m.efficiency:.3g} measured on {m.gpu} ({m.path}: the certified kernel's "
            f"achieved share of {m.basis} bandwidth where its device time dominates), replacing the assumed "
            f"{rf.EFFICIENCY:g}{other}")
    if m.host_step is not None and stated_host is None:
        args.host_step, args.host_source = m.host_step, f"measured on {m.gpu} (the real model's graph-replayed step)"
    return m.efficiency, line


def plan_command(args) -> int:
    gpu_options = _gpu_options_given(args)
    args.efficiency, args.measured_line = _efficiency(args)  # refuses a missing or malformed --gpu-check file first
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
    if exp["hardware"] == "cpu":
        print(cpu_plan_line(plan.experiment, hours, exp["threads_per_job"], gpu_options))
        print(f"generations={plan.generations} jobs={plan.job_count} gpu_hours=0 cpu_job_hours={hours:.3f}")
        return 0
    roof = _roofline_lines(args, exp, plan)
    print(f"generations={plan.generations} jobs={plan.job_count} gpu_hours={hours:.1f} gpu_hours_roofline={roof:.2f}")
    return 0


def _gpu_options_given(args) -> list[str]:
    """The roofline's options given on the command line (they do not apply to a CPU experiment)."""
    from ..generation.roofline import DEFAULT_GPU, EFFICIENCY

    given = [("--gpu", args.gpu != DEFAULT_GPU), ("--efficiency", args.efficiency is not None),
             ("--prefill-efficiency", args.prefill_efficiency != EFFICIENCY),
             ("--host-us-per-step", args.host_us_per_step is not None), ("--gpu-check", args.gpu_check is not None)]
    return [name for name, on in given if on]


def cpu_plan_line(experiment: str, hours: float, threads: int, ignored: list[str]) -> str:
    """What ``kvcert plan`` says of an experiment whose jobs run on CPUs: no GPU hours, the jobs' own hours."""
    line = (f"hardware: CPU (configs/experiment/{experiment}.yaml: hardware: cpu): it needs no GPU hours; its "
            f"generations take about {f'{hours:.1f} job-hours' if hours >= 1 else f'{max(1, round(60 * hours))} job-minutes'} "
            f"at {threads} thread{'s' if threads != 1 else ''} a job "
            "(seconds_per_generation), shared out among the cores Snakemake is given (--cores)")
    if ignored:
        line += f"; {', '.join(ignored)}: for a GPU experiment's roofline, not used here"
    return line


def _roofline_lines(args, exp: dict, plan) -> float:
    """Print the roofline model's assumptions and its bound beside the estimate; its GPU hours."""
    from ..generation import roofline as rf
    from ..config.digest import model_folder

    config_dir = _folders(args)
    gpu = rf.GPUS[args.gpu]
    archs, unknown = {}, []
    if getattr(args, "measured_line", None):
        print(args.measured_line)
    print(f"roofline: {gpu.name}, {gpu.bandwidth / 1e12:.2f} TB/s HBM, {gpu.flops / 1e12:.0f} TFLOP/s dense bf16; "
          f"decode at {args.efficiency:g} of the bandwidth, prefill at {args.prefill_efficiency:g} of the FLOPs, "
          f"host {args.host_step * 1e6:.0f} µs per decode step ({args.host_source}); a task of native length at "
          f"{rf.NATIVE_TOKENS} tokens")
    print("  prefill 2·P·T + 2·layers·heads·head_dim·T² FLOPs once per example (shared by its forked runs); "
          "decode per step: the weights once per forked batch, each row's kept cache (budget·T + A/2 tokens, "
          "log π) and sketch, and the host's step time shared by the batch's rows")
    print(f"  {'model':<24} {'params':>8} {'layers':>6} {'heads':>5} {'kv':>3} {'head':>4} {'bytes':>5}  source")
    for model in plan.grid["models"]:
        setting = model_setting(config_dir, model)
        arch = rf.model_architecture(model, setting.get("path"), setting.get("dtype"))
        archs[model] = arch
        if arch is None:
            unknown.append(model)
            continue
        path = setting.get("path")
        folder = model_folder(str(path)) if path else None  # the shipped, a fetched or a local checkpoint
        source = "config.json" if folder is not None and (folder / "config.json").is_file() else "built-in table"
        print(f"  {model:<24} {arch.params:>8.3g} {arch.layers:>6} {arch.heads:>5} {arch.kv_heads:>3} "
              f"{arch.head_dim:>4} {arch.dtype_bytes:>5}  {source}")
    answers = {s.task: task_answer_tokens(config_dir, s.task) for s in plan.shards}
    print("  answer tokens: " + ", ".join(f"{t} {a}" for t, a in sorted(answers.items())))
    cost = rf.plan_roofline(plan, archs, answers, gpu, args.efficiency, prefill_efficiency=args.prefill_efficiency,
                            host_step=args.host_step)
    print(f"  {'model':<24} {'length':>6} {'estimate s/gen':>14} {'roofline s/gen':>14} {'ratio':>6}")
    for (model, length), (sec, gens) in cost.items():
        est = seconds_per(exp["seconds_per_generation"], model, length) * fork_factor(exp["fork_speedup"], model, length)
        per = sec / max(gens, 1)
        print(f"  {model:<24} {length or 'native':>6} {est:>14.3f} {per:>14.3f} {est / per if per else float('nan'):>6.1f}")
    for model in unknown:
        print(f"  {model}: no architecture (no config.json in its model folder, not in the built-in table); "
              "left out of gpu_hours_roofline")
    return sum(sec for sec, _ in cost.values()) / 3600.0


def check_command(args) -> int:
    from .check import preflight

    config_dir = _folders(args)
    problems = preflight(args.experiment, args.prereg, config_dir, args.profile, forward=not args.no_forward,
                         results=args.results)
    for line in problems:
        print(line)
    if problems:
        print(f"experiment {args.experiment}: {len(problems)} problem(s) to fix before a run")
        return 1
    print(f"experiment {args.experiment}: ready (pre-registration, models, data"
          + (f", profile {args.profile})" if args.profile else ")"))
    return 0


def manifest_command(args) -> int:
    from ..generation.jobs import config_file, manifest_config_hash
    from ..generation.manifest import build_records, load_tokenizer, remember_built, source_digests, write_manifest

    config_dir = _folders(args)
    _, plan = _experiment(args)
    item = plan.manifest(args.model, args.task, args.length, args.set)
    model = config_file(config_dir, "model", args.model)
    if args.model_path:
        model["path"] = args.model_path
    tokenizer = load_tokenizer(model)
    task_cfg = config_file(config_dir, "task", args.task)
    sources = source_digests(task_cfg)  # the files it is built from, before they are read
    records = build_records(task_cfg, tokenizer, item.length, item.examples, item.seed, item.sample)
    if len(records) < item.examples:
        raise ValueError(f"task {args.task}: only {len(records)} examples, the grid asks for {item.examples}")
    write_manifest(records, args.out, item, manifest_config_hash(config_dir, args.model, args.task, args.model_path),
                   sources)
    remember_built(args.out, item, config_dir, args.model_path, sources)  # what it was built from, as a rebuild is
    print(f"{args.out}: {len(records)} records")
    return 0


def shard_command(args) -> int:
    from ..config.prereg import check_clock, read_verified
    from ..generation.runner import run_specs
    from ..generation.manifest import verify_manifest

    config_dir = _folders(args)
    _, plan = _experiment(args)
    shard = plan.shard(args.model, args.cell, args.task, args.length, args.index)
    # its seal, the plan's registered inputs, and a rebuild compared byte for byte (remembered once it matched)
    verify_manifest(args.manifest, plan.manifest(shard.model, shard.task, shard.length), config_dir, args.model_path)
    job = plan.job(shard, config_dir, args.prereg, args.model_path, args.manifest)
    records = job.examples()
    prereg_hash = None
    if args.verified:
        verified = read_verified(args.verified)
        prereg_hash = verified.get("prereg_hash")
        check_clock(args.verified, verified.get("verified_utc"))
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    run_specs(job.specs, records, args.out, prereg_hash=prereg_hash, progress=not args.quiet,
              forked=args.forked)
    print(f"{args.out}: {shard.generations} generations")
    return 0


def _common(p) -> None:
    p.add_argument("--experiment", default="smoke")
    p.add_argument("--prereg", default=None,
                   help="pre-registration folder (default: ./preregistration, else the installed copy)")
    p.add_argument("--configs", default=None,
                   help="hydra configs folder (default: ./configs, else the installed copy; or $KVCERT_CONFIGS)")


def register(subparsers) -> None:
    p = subparsers.add_parser("plan", help="generations, jobs per rule and expected GPU hours of an experiment "
                                              "(job hours, no GPU hours, for a CPU experiment)")
    _common(p)
    from ..generation.roofline import DEFAULT_GPU, EFFICIENCY, GPUS, HOST_SECONDS_PER_STEP

    p.add_argument("--gpu", choices=sorted(GPUS), default=DEFAULT_GPU, help="GPU of the roofline bound")
    p.add_argument("--efficiency", type=float, default=None,
                   help=f"share of peak bandwidth a decode attains (roofline; default {EFFICIENCY:g})")
    p.add_argument("--prefill-efficiency", type=float, default=EFFICIENCY,
                   help=f"share of peak FLOPs a prefill attains (roofline; default {EFFICIENCY:g})")
    p.add_argument("--host-us-per-step", type=float, default=None,
                   help="the host's µs per decode step of a forked batch (default: measured by --gpu-check, else "
                        f"{HOST_SECONDS_PER_STEP * 1e6:.0f})")
    p.add_argument("--gpu-check", metavar="FILE", default=None,
                   help="gpu_check.json written by kernels/gpu_check.sh on a GPU: its measured decode efficiency "
                   "(and host time per step) replace the assumed ones")
    p.set_defaults(func=plan_command)

    p = subparsers.add_parser("check", help="pre-flight: pre-registration, model folders, data, profile placeholders")
    _common(p)
    p.add_argument("--profile", default=None, help="a Snakemake profile folder to check too (e.g. profiles/slurm)")
    p.add_argument("--results", default="results", help="the results folder a run writes to (checked writable)")
    p.add_argument("--no-forward", action="store_true",
                   help="skip loading each model and running one token (checks the folders only)")
    p.set_defaults(func=check_command)

    p = subparsers.add_parser(
        "run", help="one-off generations from overrides (outside the pre-registration), with a summary table",
        description=__import__("kvcert.commands.oneoff", fromlist=["x"]).__doc__,
        formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="model=… model.path=… task=… method=… budget=… | compression_ratio=… condition=… limit=… "
                   "(comma-separated task, method, condition, budget: a sweep)")
    p.add_argument("--prereg", default=None, help="pre-registration folder whose analysis plan sets the design")
    p.add_argument("--configs", default=None, help="hydra configs folder (default: ./configs, else the installed copy)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--list", action="store_true", help="list the tasks, methods, models and conditions a run can name")
    p.set_defaults(func=lambda args: __import__("kvcert.commands.oneoff", fromlist=["x"]).run_command(args))

    p = subparsers.add_parser("manifest", help="build the task records of one (model, task, length)")
    _common(p)
    p.add_argument("--model", required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--length", type=int, required=True)
    p.add_argument("--set", choices=["grid", "replay", "stability"], default="grid",
                   help="grid: the generation cells' manifest; replay: the replay's own (its registered examples, seed); "
                   "stability: the replay's second data seed (the grid's replay.stability)")
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
