"""``kvcert bench borrowed-variance``: a plug-in certificate that borrows strength — an exploratory study.

The plug-in certificate's variance estimate V̂ comes from one Poisson draw, and on the real model it is too
noisy to rank a step's errors across draws (C2). A step cell's constant radius — its median radius over the
draws, a radius that knows the cell and not the draw — covers as well and is tighter at matched coverage. This
study asks whether a variance estimate that borrows from what a decode step already holds does better. Every
candidate (:data:`CANDIDATES`) replaces V̂ in the Bernstein radius ε = √(2 Ṽ L) + (2/3) b̂ L (L = log 2/δ, the
range term b̂ unchanged), using only what the step knows at decode time:

* **group mean** — Ṽ = the mean of V̂ over the query heads of the same KV head at the same step (they share the
  draw: one Poisson sample per KV head), which averages the queries' noise and keeps the sample's;
* **running mean** — Ṽ_t = the mean of V̂ over the path's steps s ≤ t of the same head and draw (the setting query
  at step 0, then the decode steps): earlier steps of the same sample;
* **group running mean** — both;
* **mix λ of X** — Ṽ = λ V̂ + (1 − λ) X for λ ∈ {0.25, 0.5, 0.75} and X each of the three (λ = 1: the plug-in).

**The rule** (:data:`RULE`, stated in code and committed before the study ran; :func:`choose` applies it): on the
real model's replays (C1's query kinds: setting and later) of a **selection** seed, a candidate *qualifies* when
its per-step coverage is at least 0.90 overall and in each query kind, its coverage in the bottom radius quartile
of each step cell is at least 0.90, its median within-cell Spearman (C2's statistic) is at least 0.30, and its
radius / error at matched coverage (1 − δ) is no larger than its own step-cell constant's (ratio ≤ 1; the
definitions are :mod:`kvcert.analysis.claims_stats.secondary`'s). Among qualifying candidates the smallest
matched-tightness ratio is chosen, ties within 0.01 to the higher Spearman. The choice is **confirmed** when it
also qualifies on a second, **confirmation** seed. A confirmed choice may be registered by amendment as an
additional certificate (a new claim) before a rerun; otherwise the study reports the frontier — every candidate's
figures on both seeds — and the plug-in stays as it is. Records come from seeds of the training range
(:data:`SEEDS`), never from the smoke, paper or real seeds.

Subcommands: ``replay`` (the real model's replays of both seeds, into the work folder, resumable per seed),
``table`` (no model: every candidate's figures, the rule's choice; last line ``chosen=… confirmed=…``), ``all``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..atomic import atomic_path, write_text
from ..tables import read_table, write_table as save_table

#: the study's seeds (training range, ≥ 1,300,000; never an experiment's): the selection's and the confirmation's
SEEDS = {"select": 1_310_001, "confirm": 1_310_002}
MODEL, TASK, LENGTH = "smollm2-135m-instruct", "needle", 1024
#: C1's query kinds (the path: the setting query, then the decode steps of the full run)
KINDS = ("setting", "later")
POOLS = ("group mean", "running mean", "group running mean")
LAMBDAS = (0.25, 0.5, 0.75)
CANDIDATES = ("plug-in", *POOLS, *(f"mix {lam:g} of {pool}" for pool in POOLS for lam in LAMBDAS))
RULE = ("qualifies (selection seed, C1's kinds): per-step coverage >= 0.90 overall and per query kind, bottom radius "
        "quartile coverage >= 0.90, median within-cell Spearman >= 0.30, matched-tightness ratio to its own step-cell "
        "constant <= 1; choose the smallest ratio among qualifying candidates (ties within 0.01 to the higher "
        "Spearman); confirmed when the choice also qualifies on the confirmation seed; none: report the frontier")
COVERAGE, BOTTOM, SPEARMAN, RATIO, TIE = 0.90, 0.90, 0.30, 1.0, 0.01
#: the group of a V̂ (one Poisson sample: a KV head of a layer, budget, draw and step) and a head's path
GROUP_KEY = ["model", "example_id", "layer", "kv_head", "budget", "query_kind", "step", "draw"]
PATH_KEY = ["model", "example_id", "layer", "head", "budget", "draw"]


def bernstein(variance: np.ndarray, range_term: np.ndarray, delta: float) -> np.ndarray:
    """ε = √(2 Ṽ L) + (2/3) b̂ L, L = log(2/δ) (:func:`kvcert.method.certificate.bernstein_radius`, in numpy)."""
    big_l = math.log(2.0 / delta)
    return np.sqrt(2.0 * np.clip(variance, 0.0, None) * big_l) + (2.0 / 3.0) * range_term * big_l


def pooled_variances(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    """Each pool of :data:`POOLS` at every row of ``rows`` (C1's kinds of one replay table)."""
    v = rows["variance"].to_numpy(float)
    group = rows.groupby(GROUP_KEY, observed=True, sort=False)["variance"].transform("mean").to_numpy(float)

    def running(values: np.ndarray) -> np.ndarray:
        frame = rows[PATH_KEY].assign(_v=values, _order=rows["step"].to_numpy())
        frame = frame.sort_values([*PATH_KEY, "_order"], kind="stable")
        grouped = frame.groupby(PATH_KEY, observed=True, sort=False)["_v"]
        out = (grouped.cumsum() / (grouped.cumcount() + 1)).reindex(rows.index)
        return out.to_numpy(float)

    return {"group mean": group, "running mean": running(v), "group running mean": running(group)}


def candidate_variance(name: str, variance: np.ndarray, pools: dict[str, np.ndarray]) -> np.ndarray:
    if name == "plug-in":
        return variance
    if name in pools:
        return pools[name]
    lam, _, pool = name.removeprefix("mix ").partition(" of ")
    return float(lam) * variance + (1.0 - float(lam)) * pools[pool]


def evaluate(rows: pd.DataFrame, delta: float, plan) -> pd.DataFrame:
    """Every candidate's figures on one replay table's rows of C1's kinds: coverage (overall, per kind), bottom
    radius quartile and top error decile coverage (and the constant's), median within-cell Spearman, matched
    tightness and its ratio to the step-cell constant's."""
    from ..analysis.claims_stats.secondary import prepare as secondary
    from ..analysis.replay_stats import step_cell_spearman

    rows = rows[rows["query_kind"].isin(KINDS)].reset_index(drop=True)
    pools = pooled_variances(rows)
    variance, range_term, error = (rows[c].to_numpy(float) for c in ("variance", "range_term", "error"))
    out = []
    for name in CANDIDATES:
        radius = bernstein(candidate_variance(name, variance, pools), range_term, delta)
        frame = rows.assign(radius=radius, covered=error <= radius)
        sec = secondary(frame, plan, "plugin").point
        rho, _ = step_cell_spearman(frame)
        row = {"candidate": name, "coverage": float(frame["covered"].mean()),
               **{f"coverage_{k}": float(frame.loc[frame["query_kind"] == k, "covered"].mean()) for k in KINDS},
               "bottom_radius_coverage": sec["bottom_radius_coverage"],
               "bottom_radius_coverage_constant": sec["bottom_radius_coverage_constant"],
               "top_error_coverage": sec["top_error_coverage"],
               "top_error_coverage_constant": sec["top_error_coverage_constant"],
               "spearman_within_cell": float(np.median(rho)) if rho.size else float("nan"),
               "matched_tightness": sec["matched_tightness"],
               "matched_tightness_constant": sec["matched_tightness_constant"],
               "matched_tightness_ratio": sec["matched_tightness_ratio"],
               "tightness_median": float(np.median(radius[error > 0] / error[error > 0]))}
        row["qualifies"] = qualifies(row)
        out.append(row)
    return pd.DataFrame(out)


def qualifies(row) -> bool:
    """:data:`RULE`'s qualification of one candidate's figures."""
    return bool(row["coverage"] >= COVERAGE and all(row[f"coverage_{k}"] >= COVERAGE for k in KINDS)
                and row["bottom_radius_coverage"] >= BOTTOM and row["spearman_within_cell"] >= SPEARMAN
                and row["matched_tightness_ratio"] <= RATIO)


def choose(select: pd.DataFrame, confirm: pd.DataFrame | None) -> dict:
    """:data:`RULE` applied: the chosen candidate on the selection seed's figures, and whether the confirmation
    seed's figures qualify it too."""
    ok = select[select["qualifies"]]
    if ok.empty:
        return {"chosen": None, "confirmed": False, "why": "no candidate qualifies on the selection seed"}
    best = ok["matched_tightness_ratio"].min()
    tied = ok[ok["matched_tightness_ratio"] <= best + TIE]
    chosen = str(tied.sort_values("spearman_within_cell", ascending=False, kind="stable").iloc[0]["candidate"])
    if confirm is None:
        return {"chosen": chosen, "confirmed": False, "why": "no confirmation replay yet"}
    again = bool(confirm.set_index("candidate").loc[chosen, "qualifies"])
    return {"chosen": chosen, "confirmed": again,
            "why": "qualifies on both seeds" if again else "qualifies on the selection seed only"}


def _replay_path(work: Path, part: str) -> Path:
    return work / f"replay-{part}-{SEEDS[part]}.parquet"


def run_replay(part: str, examples: int, draws: int, layers: int, work: Path, prereg, configs, threads: int) -> Path:
    """The real model's replay (C1's kinds) of ``examples`` needle prompts of the part's seed; skipped where done."""
    from ..config.compose import analysis_plan
    from ..generation.replay import replay_model
    from ..method.design import RetentionDesign
    from ..tasks import TASKS
    from .design import _load

    out = _replay_path(work, part)
    if out.exists():
        return out
    plan = analysis_plan(prereg)
    loaded, tokenizer = _load(MODEL, configs, threads)
    records = TASKS[TASK].generate(tokenizer, n_examples=examples, target_tokens=LENGTH, seed=SEEDS[part])
    t0 = time.perf_counter()
    df = replay_model(loaded, tokenizer, records, replace(plan.replay, draws=draws, query_kinds=KINDS), plan.delta,
                      RetentionDesign(**plan.design), layers, model_name=MODEL, progress=True)
    work.mkdir(parents=True, exist_ok=True)
    save_table(df, out, {"part": part, "seed": SEEDS[part], "examples": examples, "draws": draws, "layers": layers,
                          "seconds": round(time.perf_counter() - t0, 1)})
    return out


def write_table(work: Path, out: Path, prereg) -> dict:
    from ..config.compose import analysis_plan

    plan = analysis_plan(prereg)
    tables = {}
    for part in SEEDS:
        path = _replay_path(work, part)
        if path.exists():
            df, _ = read_table(path)
            recomputed = bernstein(df["variance"].to_numpy(float), df["range_term"].to_numpy(float), plan.delta)
            if not np.allclose(recomputed, df["radius"].to_numpy(float), rtol=1e-6, atol=1e-12):
                raise ValueError(f"{path}: its radius is not the Bernstein radius of its variance and range term")
            tables[part] = evaluate(df, plan.delta, plan).assign(part=part, seed=SEEDS[part])
    if "select" not in tables:
        raise FileNotFoundError(f"{_replay_path(work, 'select')}: run `kvcert bench borrowed-variance replay` first")
    decision = choose(tables["select"], tables.get("confirm"))
    table = pd.concat(tables.values(), ignore_index=True)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "borrowed-variance.csv") as tmp:
        table.to_csv(tmp, index=False, float_format="%.4f")
    write_text(out / "borrowed-variance-choice.json",
               json.dumps({"rule": RULE, "seeds": SEEDS, **decision}, indent=2, sort_keys=True) + "\n")
    cols = ["part", "candidate", "coverage", "coverage_later", "bottom_radius_coverage", "spearman_within_cell",
            "matched_tightness", "matched_tightness_ratio", "qualifies"]
    print(table[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    return decision


def run(args) -> int:
    from ..config.paths import resolve_configs, resolve_prereg

    prereg, configs = resolve_prereg(args.prereg), resolve_configs(args.configs)
    work = Path(args.work)
    if args.action in ("replay", "all"):
        for part in SEEDS:
            print(run_replay(part, args.examples, args.draws, args.layers, work, prereg, configs, args.threads))
    if args.action in ("table", "all"):
        d = write_table(work, Path(args.out), prereg)
        print(f"rule: {RULE}")
        print(f"chosen={(d['chosen'] or 'none').replace(' ', '_')} confirmed={d['confirmed']}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("borrowed-variance", help="exploratory: a plug-in variance that borrows strength, "
                                                        "against its step cell's constant (training seeds)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("action", nargs="?", default="all", choices=["all", "replay", "table"])
    p.add_argument("--examples", type=int, default=12, help="needle prompts per seed (default 12, as the real grid)")
    p.add_argument("--draws", type=int, default=50, help="Poisson draws per budget and query (default 50)")
    p.add_argument("--layers", type=int, default=10, help="replayed layers, evenly spaced (default 10)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", default="results/bench-borrowed-variance", help="the study's working folder")
    p.add_argument("--out", default="docs/figures", help="where borrowed-variance.csv and its choice go")
    p.add_argument("--prereg", default=None)
    p.add_argument("--configs", default=None)
    p.set_defaults(func=run)
