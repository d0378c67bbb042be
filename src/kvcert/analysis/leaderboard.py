"""The plain results table: accuracy by condition × method × budget × task.

What kvpress and lm-evaluation-harness users look for first, before any verdict: the
share of correct answers (score ≥ the task's pass mark) of every setting of the main
grid, per task and pooled, with the full cache as the first row. ``budget`` is the
fraction of the cache kept; ``compression_ratio`` (kvpress's convention, the fraction
removed) is shown beside it.
"""

from __future__ import annotations

import pandas as pd

from ..config.analysis_plan import AnalysisPlan, BootstrapPart
from .stats import bootstrap, encode_units, weighted_mean

SETTING = ["condition", "method", "budget"]


def pooled_interval(rows: pd.DataFrame, plan: BootstrapPart) -> tuple[float, float]:
    """The percentile interval of a setting's pooled accuracy, resampling examples (the claims' unit)."""
    codes, n_units = encode_units(rows["unit"].to_numpy())
    correct = rows["correct"].to_numpy(float)
    est = bootstrap(lambda w: {"acc": weighted_mean(correct, w)}, codes, n_units, plan)["acc"]
    return est.ci_low, est.ci_high


def accuracy_table(scores: pd.DataFrame, tasks: list[str] | None = None,
                   analysis_plan: AnalysisPlan | None = None) -> pd.DataFrame:
    """One row per setting (the full cache first): ``runs``, accuracy per task and
    ``pooled`` (over every run of the setting), each with its bootstrap interval over examples
    (``<task>_low`` / ``<task>_high``, ``pooled_low`` / ``pooled_high``: ``analysis_plan.bootstrap``, its
    resamples too),
    and ``compression_ratio``."""
    rows = scores if tasks is None else scores[scores["task"].isin(tasks)]
    if rows.empty:
        return pd.DataFrame(columns=[*SETTING, "compression_ratio", "runs", "pooled", "pooled_low", "pooled_high"])
    correct = rows.assign(correct=rows["correct"].astype(float))
    per_task = correct.pivot_table(index=SETTING, columns="task", values="correct", aggfunc="mean")
    per_task.columns.name = None
    pooled = correct.groupby(SETTING)["correct"].agg(["mean", "size"]).rename(columns={"mean": "pooled", "size": "runs"})
    table = per_task.join(pooled).reset_index()
    table["compression_ratio"] = 1.0 - table["budget"]
    order = table["condition"].map({"full": 0, "aware": 1, "streaming": 2}).fillna(3)
    table = table.assign(_order=order).sort_values(["_order", "method", "budget"]).drop(columns="_order")
    task_cols = [t for t in (tasks or sorted(per_task.columns)) if t in table.columns]
    plan = analysis_plan.bootstrap if analysis_plan is not None else BootstrapPart()  # its resamples, as every interval
    bounds = {key: pooled_interval(part, plan) for key, part in correct.groupby(SETTING)}
    table["pooled_low"] = [bounds[tuple(k)][0] for k in table[SETTING].itertuples(index=False)]
    table["pooled_high"] = [bounds[tuple(k)][1] for k in table[SETTING].itertuples(index=False)]
    per = {(*key[:-1], key[-1]): pooled_interval(part, plan) for key, part in correct.groupby([*SETTING, "task"])}
    for task in task_cols:
        for end, name in ((0, "low"), (1, "high")):
            table[f"{task}_{name}"] = [per.get((*k, task), (float("nan"), float("nan")))[end]
                                       for k in table[SETTING].itertuples(index=False)]
    return table[[*SETTING, "compression_ratio", "runs", *task_cols, "pooled", "pooled_low", "pooled_high",
                  *(f"{t}_{e}" for t in task_cols for e in ("low", "high"))]].reset_index(drop=True)
