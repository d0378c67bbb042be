"""``kvcert bench design``: the retention design's knobs, measured jointly on training-range seeds.

A certificate that costs accuracy will not be used: the randomized design must keep what top-k
keeps where it matters, and its plug-in certificate must still cover. For each setting of
:data:`SETTINGS` (one knob, or a pair, moved away from the registered design of
``analysis_plan.design``) and each model, this benchmark measures jointly

* **accuracy** against top-k: greedy answers of every example under the full cache, top-k and
  the setting's randomized sampler at the budgets 12.5 / 25 / 50 %, question-aware and
  streaming (one prefill per example, every variant forked from it: :mod:`kvcert.generation.forked`);
  the gap is top-k's accuracy minus the setting's, per condition and budget;
* **coverage** of the plug-in certificate on the model's real attention (the replay of
  :mod:`kvcert.generation.replay`: setting and later queries): per step, in the worst
  layer × budget cell of the later queries, over whole anytime paths; the robust
  certificate's coverage; tightness (median radius / error).

Top-k's accuracy depends only on what the setting changes for every sampler (the scorer's
pooling, per-layer budgets); those settings are paired with their own top-k.

**The rule** (:data:`RULE`, stated before the study ran and applied by :func:`choose`): on the
real model's records, a setting is *eligible* when its plug-in coverage of later queries in the
worst layer × budget cell is at least 0.90; among eligible settings the one with the smallest
worst question-aware accuracy gap to top-k (the largest gap over the three budgets, the model's
tasks pooled) is chosen, ties (within 0.01) going to the higher worst-cell coverage. If no
setting is eligible, the chosen one is the highest worst-cell coverage among the settings whose
worst question-aware gap is no larger than the registered design's. Records come from seeds of
the training range (:data:`SEED_BASE` + offsets), never from the smoke or paper seeds.

Subcommands: ``generate`` (one model × task: its generations, appended to a JSONL in the work
folder, resumable per example), ``replay`` (one model × task: coverage per setting, JSON),
``table`` (no model: the table, the Pareto figure and the rule's choice; last line
``chosen=<setting> gap_aware_max=… worst_cell=… eligible=…``); ``all`` runs the default study.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from ..config.analysis_plan import ReplayPart
from ..atomic import atomic_path, write_text

BUDGETS = (0.125, 0.25, 0.5)
CONDITIONS = ("aware", "streaming")
#: training-range seeds (the training data start at 1,000,000): records of this study only
SEED_BASE = 1_200_000
#: setting name -> {"sampler", "design" (overrides of the registered design), "scorer" (SnapKV options)}
SETTINGS: dict[str, dict] = {
    "registered": {},
    "top 0.5": {"design": {"top_fraction": 0.5}},
    "top 0.75": {"design": {"top_fraction": 0.75}},
    "top 0.9": {"design": {"top_fraction": 0.9}},
    "floor 0.02": {"design": {"floor": 0.02}},
    "floor 0.3": {"design": {"floor": 0.3}},
    "temper 0.5": {"design": {"temper": 0.5}},
    "temper 2": {"design": {"temper": 2.0}},
    "priority": {"sampler": "priority"},
    "dense layer 0": {"design": {"dense_layers": 1}},
    "head max": {"scorer": {"pooling": "max"}},
    "top 0.75, floor 0.3": {"design": {"top_fraction": 0.75, "floor": 0.3}},
    "top 0.5, temper 2": {"design": {"top_fraction": 0.5, "temper": 2.0}},
    "head max, floor 0.3": {"design": {"floor": 0.3}, "scorer": {"pooling": "max"}},
}
#: the default study: model -> (generation tasks as (task, length), replay task)
STUDY: dict[str, tuple[tuple[tuple[str, int], ...], tuple[str, int]]] = {
    "smollm2-135m-instruct": ((("needle", 2048), ("multikey", 1024)), ("needle", 1024)),
    "embedded": ((("needle", 512), ("lookalike", 512)), ("needle", 512)),
}
RULE = ("eligible: plug-in coverage of later queries >= 0.90 in the worst layer x budget cell (real model, "
        "training seeds); choose the smallest worst question-aware accuracy gap to top-k over the budgets "
        "(tasks pooled), ties within 0.01 to the higher worst-cell coverage; none eligible: the highest "
        "worst-cell coverage among settings whose worst aware gap is no larger than the registered design's")
ELIGIBLE_COVERAGE = 0.90
TIE = 0.01
REAL_MODEL = "smollm2-135m-instruct"


def setting_parts(name: str, registered: dict) -> tuple[str, dict, dict]:
    """(sampler, full design mapping, SnapKV options) of a setting over the registered design."""
    s = SETTINGS[name]
    return s.get("sampler", "poisson"), {**registered, **s.get("design", {})}, dict(s.get("scorer", {}))


def baseline_key(name: str) -> str:
    """Which top-k a setting is compared with: the settings that change what every sampler sees (per-layer
    budgets, the scorer's pooling) have their own."""
    s = SETTINGS[name]
    return json.dumps({"dense_layers": s.get("design", {}).get("dense_layers", 0), "scorer": s.get("scorer", {})},
                      sort_keys=True)


def _spec(model: str, path: str, condition: str, sampler: str | None, budget: float, design: dict, scorer: dict,
          max_new_tokens: int):
    from ..generation.spec import GenerationSpec

    method = {"name": "full"} if condition == "full" else {
        "name": f"snapkv-{sampler}", "scorer": "snapkv", "sampler": sampler, "design": design,
        "scorer_options": scorer}
    return GenerationSpec.from_dict({"model": {"name": model, "path": path}, "method": method, "condition": condition,
                                     "budget": budget, "max_new_tokens": max_new_tokens})


def variants(model: str, path: str, registered: dict, max_new_tokens: int) -> list[tuple[str, object]]:
    """(label, spec) of every generation per example: the full cache, each top-k baseline and each setting at
    every condition × budget (label ``<setting>|<condition>|<budget>``, top-k ``topk:<baseline key>|…``)."""
    out = [("full", _spec(model, path, "full", None, 1.0, registered, {}, max_new_tokens))]
    baselines = {}
    for name in SETTINGS:
        baselines.setdefault(baseline_key(name), name)
    for key, name in baselines.items():
        _, design, scorer = setting_parts(name, registered)
        base = {**registered, "dense_layers": design.get("dense_layers", 0)}
        for c in CONDITIONS:
            for b in BUDGETS:
                out.append((f"topk:{key}|{c}|{b:g}", _spec(model, path, c, "topk", b, base, scorer, max_new_tokens)))
    for name in SETTINGS:
        sampler, design, scorer = setting_parts(name, registered)
        for c in CONDITIONS:
            for b in BUDGETS:
                out.append((f"{name}|{c}|{b:g}", _spec(model, path, c, sampler, b, design, scorer, max_new_tokens)))
    return out


def _registered(prereg) -> tuple[dict, float, ReplayPart]:
    from ..config.compose import analysis_plan

    plan = analysis_plan(prereg)
    return dict(plan.design), plan.delta, plan.replay


def _model_path(model: str, configs) -> str:
    from ..generation.jobs import config_file

    return str(config_file(configs, "model", model)["path"])


def _load(model: str, configs, threads: int):
    import torch

    from ..method.models import ModelSpec, load_model

    torch.set_num_threads(threads)
    return load_model(ModelSpec(model, _model_path(model, configs)))


def task_seed(task: str, length: int, part: str) -> int:
    """The study's seed of one (task, length, part): training range, fixed by the names alone."""
    import zlib

    return SEED_BASE + zlib.crc32(f"{part}:{task}:{length}".encode()) % 90_000


def run_generations(model: str, task: str, length: int, examples: int, work: Path, prereg, configs,
                    threads: int = 1) -> Path:
    """Every variant of :func:`variants` on ``examples`` records of (task, length); one JSONL line per example
    (the score of every variant), appended, so an interrupted run resumes at the next example."""
    from ..progress import progress
    from ..tasks import TASKS
    from ..generation.engine import Engine
    from ..generation.forked import generate
    from ..generation.jobs import task_answer_tokens

    registered, _, _ = _registered(prereg)
    out = work / f"generations-{model}-{task}-{length}.jsonl"
    lines = [line for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    done = {json.loads(line)["example_id"] for line in lines}
    loaded, tokenizer = _load(model, configs, threads)
    records = TASKS[task].generate(tokenizer, n_examples=examples, target_tokens=length,
                                   seed=task_seed(task, length, "generate"))
    labelled = variants(model, _model_path(model, configs), registered, task_answer_tokens(configs, task))
    engines = [Engine(loaded, tokenizer, spec) for _, spec in labelled]
    bar = progress(len(records), f"design {model} {task}-{length}", "examples", True)
    for record in records:
        if record.id not in done:
            results = generate(engines, record)
            lines.append(json.dumps({"example_id": record.id, "model": model, "task": task, "length": length,
                                     "scores": {label: r["score"] for (label, _), r in zip(labelled, results)}}))
            write_text(out, "\n".join(lines) + "\n")  # after every example: an interruption loses one at most
        bar.update(1)
    bar.close()
    return out


def run_replay(model: str, task: str, length: int, examples: int, draws: int, layers: int, work: Path, prereg,
               configs, threads: int = 1) -> Path:
    """The plug-in and robust certificates' coverage of every setting on the model's attention (setting and
    later queries of ``examples`` records, ``layers`` evenly spaced layers, ``draws`` Poisson draws)."""
    from ..analysis.replay_stats import CELL_KEY, simultaneous_anytime
    from ..method.design import RetentionDesign
    from ..generation.replay import replay_model
    from ..method.scorers import get_scorer
    from ..tasks import TASKS

    registered, delta, rp = _registered(prereg)
    replay = replace(rp, budgets=BUDGETS, draws=draws, query_kinds=("setting", "later"))
    loaded, tokenizer = _load(model, configs, threads)
    records = TASKS[task].generate(tokenizer, n_examples=examples, target_tokens=length,
                                   seed=task_seed(task, length, "replay"))
    out = work / f"replay-{model}-{task}-{length}.json"
    found = json.loads(out.read_text()) if out.exists() else {}
    for name in SETTINGS:
        if name in found:
            continue
        sampler, design, scorer = setting_parts(name, registered)
        if sampler != "poisson":  # the replay draws Poisson samples: priority sampling has no closed-form π
            found[name] = None
            continue
        t0 = time.perf_counter()
        df = replay_model(loaded, tokenizer, records, replay, delta, RetentionDesign(**design), layers,
                          model_name=model, scorer=get_scorer("snapkv", **scorer))
        df = df[df["layer"] >= int(design.get("dense_layers", 0))]  # a dense layer samples nothing: exact
        later = df[df["query_kind"] == "later"]
        cells = later.groupby(["layer", "budget"])["covered"].mean()
        paths = simultaneous_anytime(df, "covered_anytime")
        ratio = (later["radius"] / later["error"]).replace([float("inf")], float("nan")).dropna()
        robust = (later["radius_robust"] / later["error"]).replace([float("inf")], float("nan")).dropna()
        found[name] = {
            "coverage_setting": float(df.loc[df["query_kind"] == "setting", "covered"].mean()),
            "coverage_later": float(later["covered"].mean()),
            "coverage_worst_cell": float(cells.min()),
            "worst_cell": f"layer {int(cells.idxmin()[0])} at {cells.idxmin()[1]:g}",
            "coverage_later_by_budget": {f"{b:g}": float(v) for b, v in later.groupby("budget")["covered"].mean().items()},
            "coverage_anytime_paths": float(paths["covered"].mean()),
            "coverage_robust_later": float(later["covered_robust"].mean()),
            "tightness_median": float(ratio.median()),
            "tightness_robust_median": float(robust.median()),
            "cells": int(later.groupby(CELL_KEY).ngroups), "seconds": round(time.perf_counter() - t0, 1),
        }
        print(f"replay {model} {name}: later {found[name]['coverage_later']:.3f}, worst cell "
              f"{found[name]['coverage_worst_cell']:.3f} ({found[name]['worst_cell']})", file=sys.stderr)
        write_text(out, json.dumps(found, indent=2, sort_keys=True) + "\n")
    return out


def accuracy_table(work: Path):
    """One row per (model, setting): accuracy per condition × budget, the top-k baseline's, and the gaps."""
    import pandas as pd

    rows = []
    for path in sorted(work.glob("generations-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    out = []
    for model in sorted({r["model"] for r in rows}):
        mine = [r for r in rows if r["model"] == model]
        n = len(mine)

        def acc(label: str) -> float:
            return sum(float(r["scores"][label] or 0.0) >= 1.0 for r in mine) / n

        for name in SETTINGS:
            row = {"model": model, "setting": name, "examples": n,
                   "tasks": ", ".join(sorted({f"{r['task']}@{r['length']}" for r in mine})),
                   "full": acc("full")}
            for c in CONDITIONS:
                gaps = []
                for b in BUDGETS:
                    ours, base = acc(f"{name}|{c}|{b:g}"), acc(f"topk:{baseline_key(name)}|{c}|{b:g}")
                    row[f"{c}_{b:g}"], row[f"topk_{c}_{b:g}"] = ours, base
                    gaps.append(base - ours)
                row[f"gap_{c}_max"], row[f"gap_{c}_mean"] = max(gaps), sum(gaps) / len(gaps)
            out.append(row)
    return pd.DataFrame(out)


def study_table(work: Path):
    """The accuracy table joined with every replay's coverage (one row per model × setting)."""
    import pandas as pd

    acc = accuracy_table(work)
    cov = []
    for path in sorted(work.glob("replay-*.json")):
        model = path.stem.split("-", 1)[1].rsplit("-", 2)[0]
        for name, stats in json.loads(path.read_text()).items():
            if stats:
                cov.append({"model": model, "setting": name, **{k: v for k, v in stats.items()
                                                                  if not isinstance(v, dict)}})
    if not cov:
        return acc
    return acc.merge(pd.DataFrame(cov), on=["model", "setting"], how="left")


def choose(table, model: str = REAL_MODEL) -> dict:
    """:data:`RULE` applied to ``model``'s rows: the chosen setting and why."""
    rows = table[table["model"] == model].dropna(subset=["gap_aware_max"])
    if rows.empty:
        return {"chosen": None, "reason": f"no study rows for {model}"}
    cov = rows["coverage_worst_cell"] if "coverage_worst_cell" in rows else None
    eligible = rows[cov >= ELIGIBLE_COVERAGE] if cov is not None else rows.iloc[0:0]
    if len(eligible):
        best = eligible["gap_aware_max"].min()
        tied = eligible[eligible["gap_aware_max"] <= best + TIE]
        pick = tied.sort_values(["coverage_worst_cell", "gap_aware_max"], ascending=[False, True]).iloc[0]
        why = "smallest worst aware gap among settings with worst-cell coverage >= 0.90"
    else:
        reg = rows[rows["setting"] == "registered"]["gap_aware_max"]
        limit = float(reg.iloc[0]) if len(reg) else float("inf")
        pool = rows[(rows["gap_aware_max"] <= limit + 1e-12) & rows["coverage_worst_cell"].notna()]
        pick = pool.sort_values(["coverage_worst_cell", "gap_aware_max"], ascending=[False, True]).iloc[0]
        why = ("no setting reaches worst-cell coverage 0.90: the highest worst-cell coverage among settings "
               "no worse than the registered design in worst aware gap")
    return {"chosen": pick["setting"], "reason": why, "eligible": int(len(eligible)),
            "gap_aware_max": float(pick["gap_aware_max"]), "coverage_worst_cell": float(pick["coverage_worst_cell"]),
            "design": setting_parts(pick["setting"], {})[1], "sampler": setting_parts(pick["setting"], {})[0],
            "scorer": setting_parts(pick["setting"], {})[2]}


def pareto_figure(table, path: Path, chosen: str | None = None) -> Path:
    """Worst question-aware accuracy gap to top-k (x) against the plug-in's worst-cell coverage (y), one panel
    per model; the non-dominated settings joined and named (the others are in the table), the registered
    design in red, the rule's choice circled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m for m in STUDY if m in set(table["model"])]
    fig, axes = plt.subplots(1, len(models), figsize=(5.4 * len(models), 4.4), squeeze=False)
    for ax, model in zip(axes[0], models):
        rows = table[(table["model"] == model) & table["coverage_worst_cell"].notna()]
        ax.axhline(ELIGIBLE_COVERAGE, color="0.6", lw=0.8, ls="--")
        ax.axvline(0.03, color="0.6", lw=0.8, ls=":")
        front = rows.sort_values(["gap_aware_max", "coverage_worst_cell"], ascending=[True, False])
        best, frontier = -1.0, []
        for r in front.itertuples():
            if r.coverage_worst_cell > best:
                best = r.coverage_worst_cell
                frontier.append(r)
        ax.plot([r.gap_aware_max for r in frontier], [r.coverage_worst_cell for r in frontier], color="C2", lw=1,
                zorder=2, label="frontier (non-dominated settings)")
        named = {r.setting for r in frontier} | {"registered"}
        for r in rows.itertuples():
            reg = r.setting == "registered"
            ax.scatter(r.gap_aware_max, r.coverage_worst_cell, s=40 if reg else 18, zorder=3,
                       color="C3" if reg else ("C0" if r.setting in named else "0.55"))
            if model == REAL_MODEL and r.setting == chosen:
                ax.scatter(r.gap_aware_max, r.coverage_worst_cell, s=160, facecolors="none", edgecolors="k", zorder=4,
                           label=f"the rule's choice: {chosen}")
            if r.setting in named:
                ax.annotate(r.setting, (r.gap_aware_max, r.coverage_worst_cell), fontsize=7, xytext=(4, 4),
                            textcoords="offset points")
        ax.set_xlabel("worst question-aware accuracy gap to top-k\n(largest over budgets 12.5 / 25 / 50 %)")
        ax.set_ylabel("plug-in coverage, worst layer x budget cell")
        n = int(rows["examples"].iloc[0]) if len(rows) else 0
        ax.set_title(f"{model}: {n} examples per budget, {len(rows)} settings (grey: dominated)", fontsize=9)
        ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=130, format="png")
    plt.close(fig)
    return path


def write_table(work: Path, out: Path) -> dict:
    table = study_table(work)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "design.csv") as tmp:
        table.to_csv(tmp, index=False, float_format="%.4f")
    decision = choose(table)
    if "coverage_worst_cell" in table:
        pareto_figure(table, out / "design.png", decision.get("chosen"))
    write_text(out / "design-choice.json", json.dumps({"rule": RULE, **decision}, indent=2, sort_keys=True) + "\n")
    cols = [c for c in ("model", "setting", "gap_aware_max", "gap_aware_mean", "gap_streaming_max",
                        "coverage_later", "coverage_worst_cell", "coverage_anytime_paths", "coverage_robust_later",
                        "tightness_median") if c in table]
    print(table[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    return decision


def run(args) -> int:
    from ..config.paths import resolve_configs, resolve_prereg

    prereg, configs = resolve_prereg(args.prereg), resolve_configs(args.configs)
    work = Path(args.work)
    models = args.model or list(STUDY)
    if args.action in ("generate", "all"):
        for model in models:
            for task, length in ([_task(t) for t in args.task] if args.task else STUDY[model][0]):
                print(run_generations(model, task, length, args.examples, work, prereg, configs, args.threads))
    if args.action in ("replay", "all"):
        for model in models:
            for task, length in ([_task(t) for t in args.task] if args.task else [STUDY[model][1]]):
                print(run_replay(model, task, length, args.replay_examples, args.draws, args.layers, work, prereg,
                                 configs, args.threads))
    if args.action in ("table", "all"):
        d = write_table(work, Path(args.out))
        print(f"rule: {RULE}")
        print(f"chosen={(d.get('chosen') or 'none').replace(' ', '_')} gap_aware_max={d.get('gap_aware_max')} "
              f"worst_cell={d.get('coverage_worst_cell')} eligible={d.get('eligible')}")
    return 0


def _task(text: str) -> tuple[str, int]:
    task, _, length = text.partition(":")
    if not length.isdigit():
        raise ValueError(f"--task {text}: write TASK:LENGTH, e.g. needle:2048")
    return task, int(length)


def register(subparsers) -> None:
    p = subparsers.add_parser("design", help="the retention design's knobs: accuracy vs top-k and coverage, jointly",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("action", nargs="?", default="all", choices=["all", "generate", "replay", "table"])
    p.add_argument("--model", action="append", help=f"configs/model name (repeatable; default: {', '.join(STUDY)})")
    p.add_argument("--task", action="append", help="TASK:LENGTH (repeatable; default: the study's for the model)")
    p.add_argument("--examples", type=int, default=24, help="generation examples per task (default 24)")
    p.add_argument("--replay-examples", type=int, default=3)
    p.add_argument("--draws", type=int, default=100)
    p.add_argument("--layers", type=int, default=10, help="replayed layers, evenly spaced (default 10)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", default="results/bench-design", help="the study's working folder (resumable)")
    p.add_argument("--out", default="docs/figures", help="where design.csv, design.png and design-choice.json go")
    p.add_argument("--prereg", default=None)
    p.add_argument("--configs", default=None)
    p.set_defaults(func=run)
