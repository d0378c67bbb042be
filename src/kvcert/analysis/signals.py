"""The comparison signals: prediction and attribution AUC of every signal a run can carry.

Secondary analyses, not claims (``preregistration/claims.yaml``, "Amendment of
2026-12-01, third"; ``analysis_plan.comparison_signals``). Each signal of the plan has a
source (a score-table column: the loader's ``sig_<name>``, else ``cert_signal`` for the
certificate and ``confidence`` for the primary confidence signal), a failure direction and
the methods (samplers) that can compute it. For a run with raw value x its *failure
score* is

    f = x   (failure: higher)        f = −x   (failure: lower).

* **Prediction** (C4's cells: its conditions and budgets, one method at a time): among
  the compressed runs of the main tasks, y = 1 when the run fails (score < pass mark);
  AUC = P(f₊ > f₋) + ½ P(f₊ = f₋) over failed (₊) × correct (₋) runs.
* **Attribution** (C6's cells): among failed runs, y = 1 when cache-induced (the full
  cache answers correctly), 0 when inherent; the same AUC.
* **Turn distance**: attribution in the multi-turn cell (the grid's ``multiturn``
  block), per method and per bucket ``lo ≤ turn_distance ≤ hi`` (inclusive, the plan's
  ``turn_distance.buckets``; an ``all`` row pools them), for ``turn_distance.signals``.

Rows: per method × the plan's ``by`` keys (condition, target_tokens), pooled over them
per method, and pooled over methods for a signal several methods compute. A row that spans
several strata (``analysis_plan.strata``) carries, beside its pooled AUC, the stratified
one (``stratified``: over the pairs of one stratum, as C4 and C6 test it), which a score
that knows only the run's stratum cannot raise above ½. Every AUC
has the unit bootstrap of C4/C6 (:mod:`kvcert.analysis.stats`: ``analysis_plan.bootstrap``
resamples, seed and level, unit = example), paired across the signals of one row set.
A run without the signal (NaN) is left out of that signal's AUC. A row below
``minimum_cell`` (its generations, positives or negatives) has a null AUC and says why.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from ..config.analysis_plan import AnalysisPlan, BootstrapPart, ComparisonSignal
from .claims import method_mask, main_tasks, select_generations, strata_codes
from .load import scored
from .stats import AUCIndex, StratifiedAUCIndex, auc, bootstrap, encode_units, stratified_auc

#: the paper's AUC ranges (arXiv 2607.21475, abstract) per signal and task; the entropy/margin family's and the
#: evicted-score-mass heuristic's single ranges are the paper's figures "for cache-induced failure" (attribution)
PAPER_RANGES: dict[str, dict[str, str | None]] = {
    "certificate": {"prediction": "0.555–0.572", "attribution": "0.65–0.75"},
    "mean_logprob": {"prediction": "0.78–0.81", "attribution": "0.47–0.54"},
    **{name: {"prediction": None, "attribution": "0.43–0.51"}
       for name in ("output_entropy", "top2_margin", "attention_entropy")},
    "evicted_mass": {"prediction": None, "attribution": "0.59–0.73"},
}
TASKS = ("prediction", "attribution")
ALL = "all"
COUNT_KEYS = ("generations", "positives", "negatives")


def signal_column(name: str, spec: ComparisonSignal, analysis_plan: AnalysisPlan, columns: Sequence[str]) -> str:
    """The score-table column holding signal ``name``'s raw value (see the module docstring)."""
    if f"sig_{name}" in columns:
        return f"sig_{name}"
    conf = analysis_plan.confidence_signal
    by_source = {"certificate_signal": "cert_signal", conf.primary: "confidence", conf.secondary: "confidence_secondary"}
    if spec.source in by_source:
        return by_source[spec.source]
    raise ValueError(f"comparison_signals.{name}: no score-table column for source {spec.source!r}")


def failure_score(values: np.ndarray, failure: str) -> np.ndarray:
    """f = x where higher means failure, −x where lower does."""
    if failure not in ("higher", "lower"):
        raise ValueError(f"comparison_signals: failure must be 'higher' or 'lower', got {failure!r}")
    values = np.asarray(values, dtype=np.float64)
    return values if failure == "higher" else -values


def auc_rows(rows: pd.DataFrame, y: np.ndarray, scores: Mapping[str, np.ndarray], plan: BootstrapPart,
             minimum: Mapping, strata: np.ndarray | None = None) -> dict[str, dict]:
    """{signal: counts, AUC and interval} of each failure score in ``scores`` for labels ``y`` over ``rows``;
    one bootstrap over the rows' examples, paired across signals; null below the minimum cell. With
    ``strata`` spanning several strata, also the stratified AUC (``stratified``: estimate and interval)."""
    out, index, point = {}, {}, {}
    several = strata is not None and np.unique(strata).size > 1
    for name, s in scores.items():
        ok = np.isfinite(s)
        counts = {"generations": int(ok.sum()), "positives": int(y[ok].sum())}
        counts["negatives"] = counts["generations"] - counts["positives"]
        short = [f"{k}: {counts[k]} < the pre-registered minimum {int(minimum.get(k, 0))}"
                 for k in COUNT_KEYS if counts[k] < int(minimum.get(k, 0))]
        out[name] = {**counts, "below_minimum": short, "estimate": None, "ci": [None, None], "level": plan.level}
        if not short and counts["positives"] and counts["negatives"]:
            index[name] = (ok, AUCIndex(s[ok], y[ok]))
            point[name] = auc(s[ok], y[ok])
            if several:
                index[f"{name}{STRATIFIED}"] = (ok, StratifiedAUCIndex(s[ok], y[ok], strata[ok]))
                point[f"{name}{STRATIFIED}"] = stratified_auc(s[ok], y[ok], strata[ok])[0]
    if not index:
        return out
    codes, n_units = encode_units(rows["unit"].to_numpy())

    def statistic(w):
        return {name: idx(w if ok.all() else w[:, ok]) for name, (ok, idx) in index.items()}

    for name, est in bootstrap(statistic, codes, n_units, plan, point).items():
        d = est.to_dict()
        if name.endswith(STRATIFIED):
            out[name[: -len(STRATIFIED)]]["stratified"] = {"estimate": d["estimate"], "ci": d["ci"]}
        else:
            out[name].update(estimate=d["estimate"], ci=d["ci"], resamples=est.resamples, skipped=est.skipped)
    return out


#: the key suffix of a signal's stratified AUC inside :func:`auc_rows`'s bootstrap
STRATIFIED = "::stratified"


def _labelled(rows: pd.DataFrame, task: str) -> tuple[pd.DataFrame, np.ndarray]:
    """The task's rows and labels: failure among runs (prediction), induced among failures (attribution)."""
    if task == "prediction":
        return rows, 1.0 - rows["correct"].to_numpy(float)
    rows = rows[rows["label"].isin(["induced", "inherent"])]
    return rows, (rows["label"] == "induced").to_numpy(float)


class SignalPlan:
    """``analysis_plan.comparison_signals`` resolved against a score table: columns, orientations, methods."""

    def __init__(self, analysis_plan: AnalysisPlan, columns: Sequence[str]):
        self.block = analysis_plan.comparison_signals
        self.signals = dict(self.block.signals)
        self.columns = {n: signal_column(n, s, analysis_plan, columns) for n, s in self.signals.items()}
        self.bootstrap = analysis_plan.bootstrap
        self.analysis_plan = analysis_plan
        self.minimum = analysis_plan.minimum_cell.to_dict()
        self.by = [k for k in self.block.by if k != "method"]

    def methods(self, name: str) -> list[str]:
        return list(self.signals[name].methods)

    def method_groups(self, names: Sequence[str]) -> list[tuple[str, ...]]:
        """Each method alone, then every signal's method set that has several (the pooled rows)."""
        widest_first = sorted(names, key=lambda n: -len(self.methods(n)))  # the plan's method order
        singles = list(dict.fromkeys(m for n in widest_first for m in self.methods(n)))
        pooled = list(dict.fromkeys(tuple(self.methods(n)) for n in names if len(self.methods(n)) > 1))
        return [(m,) for m in singles] + pooled

    def scores(self, rows: pd.DataFrame, names: Sequence[str]) -> dict[str, np.ndarray]:
        return {n: failure_score(rows[self.columns[n]].to_numpy(float), self.signals[n].failure) for n in names}

    def applicable(self, names: Sequence[str], group: tuple[str, ...]) -> list[str]:
        """Signals every method of ``group`` computes (a pooled group: the signals with exactly that method set)."""
        if len(group) == 1:
            return [n for n in names if group[0] in self.methods(n)]
        return [n for n in names if tuple(self.methods(n)) == group]

    def table(self, rows: pd.DataFrame, y: np.ndarray, names: Sequence[str], keys: Mapping) -> list[dict]:
        strata = strata_codes(rows, self.analysis_plan) if len(rows) else None
        res = auc_rows(rows, y, self.scores(rows, names), self.bootstrap, self.minimum, strata)
        return [{"signal": n, **keys, **res[n]} for n in names]


def _cells(claims_doc: Mapping, claim_id: str) -> dict:
    for c in claims_doc["claims"]:
        if c["id"] == claim_id:
            return dict(c.get("cells") or {})
    raise ValueError(f"comparison_signals: cells {claim_id!r} name no claim of claims.yaml")


def task_table(sp: SignalPlan, claims_doc: Mapping, scores: pd.DataFrame, tasks: list[str] | None, task: str) -> dict:
    """One task's rows (module docstring): per method × ``by`` keys, per method, pooled over methods."""
    claim_id = sp.block.cells(task)
    cells = _cells(claims_doc, claim_id)
    names = list(sp.signals)
    out, missing = [], []
    for group in sp.method_groups(names):
        selected, gaps = select_generations(scores, {**cells, "methods": list(group)}, tasks)
        missing += [g for g in gaps if g not in missing]
        rows, y = _labelled(selected, task)
        use = sp.applicable(names, group)
        method = "+".join(group)
        out += sp.table(rows, y, use, {"method": method, **{k: ALL for k in sp.by}})
        if len(group) > 1 or not len(rows):
            continue
        for values, part in rows.groupby(sp.by, sort=True):
            values = values if isinstance(values, tuple) else (values,)
            keys = {k: (int(v) if k == "target_tokens" else v) for k, v in zip(sp.by, values)}
            out += sp.table(part, _labelled(part, task)[1], use, {"method": method, **keys})
    cell = {k: v for k, v in cells.items() if k not in ("methods", "method")}
    return {"cells": claim_id, "cell": cell, "missing": missing, "rows": out}


def turn_distance_table(sp: SignalPlan, scores: pd.DataFrame, grid: Mapping) -> dict | None:
    """Attribution AUC per method and turn-distance bucket in the grid's multi-turn cell; None without one."""
    td = sp.block.turn_distance
    cell = grid.get("multiturn") or {}
    if td is None or not cell:
        return None
    names = list(td.signals)
    buckets = list(td.buckets)
    rows = scored(scores)
    rows = rows[(rows["task"] == cell.get("task", "multiturn")) & (rows["condition"] == cell.get("condition", "streaming"))
                & rows["budget"].isin([float(b) for b in cell.get("budgets", [])]) & rows["turn_distance"].notna()]
    rows, _ = _labelled(rows, "attribution")
    out = []
    for (method,) in [g for g in sp.method_groups(names) if len(g) == 1]:
        sub = rows[method_mask(rows, [method])]
        use = sp.applicable(names, (method,))
        dist = sub["turn_distance"].to_numpy(float)
        named = [(f"{lo}-{hi}", lo, hi) for lo, hi in buckets] + [(ALL, buckets[0][0], buckets[-1][1])]
        for bucket, lo, hi in named:
            part = sub[(dist >= lo) & (dist <= hi)]
            y = (part["label"] == "induced").to_numpy(float)
            out += sp.table(part, y, use, {"method": method, "bucket": bucket, "low": lo, "high": hi})
    return {"task": cell.get("task", "multiturn"), "condition": cell.get("condition"), "budgets": cell.get("budgets"),
            "signals": names, "buckets": [list(b) for b in buckets], "rows": out}


def evaluate_signals(claims_doc: Mapping, scores: pd.DataFrame | None, grid: Mapping | None) -> dict | None:
    """The ``comparison_signals`` block of claims.json; None when the plan registers no signals."""
    plan = AnalysisPlan.of_document(claims_doc)
    if plan.comparison_signals is None or scores is None:
        return None
    sp = SignalPlan(plan, list(scores.columns))
    tasks = main_tasks(grid)
    return {
        "amendment": "third amendment of 2026-12-01: secondary analyses, not claims (stratified AUCs: fifth)",
        "signals": {n: {**s.to_dict(), "column": sp.columns[n]} for n, s in sp.signals.items()},
        "paper": PAPER_RANGES, "by": sp.by, "minimum": dict(sp.minimum), "bootstrap": plan.bootstrap.to_dict(),
        **{task: task_table(sp, claims_doc, scores, tasks, task) for task in TASKS},
        "turn_distance": turn_distance_table(sp, scores, grid or {}),
    }


def pooled_row(block: Mapping, task: str, signal: str) -> dict | None:
    """A signal's headline row of one task: pooled over conditions and lengths and over all its methods."""
    method = "+".join(str(m) for m in block["signals"][signal]["methods"])
    for r in block[task]["rows"]:
        if r["signal"] == signal and r["method"] == method and all(r.get(k) == ALL for k in block["by"]):
            return r
    return None


def headline(block: Mapping | None) -> dict:
    """``{signal: {"prediction": auc, "attribution": auc, "prediction_stratified": …, "attribution_stratified": …}}``
    pooled over the main grid (null below the minimum)."""
    if not block:
        return {}
    out = {}
    for s in block["signals"]:
        rows = {t: pooled_row(block, t, s) or {} for t in TASKS}
        out[s] = {**{t: rows[t].get("estimate") for t in TASKS},
                  **{f"{t}_stratified": (rows[t].get("stratified") or {}).get("estimate") for t in TASKS}}
    return out
