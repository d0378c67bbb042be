"""The plain results table: accuracy by condition × method × budget × task.

What kvpress and lm-evaluation-harness users look for first, before any verdict: the
share of correct answers (score ≥ the task's pass mark) of every setting of the main
grid, per task and pooled, with the full cache as the first row. ``budget`` is the
fraction of the cache kept; ``compression_ratio`` (kvpress's convention, the fraction
removed) is shown beside it.
"""

from __future__ import annotations

import pandas as pd

SETTING = ["condition", "method", "budget"]


def accuracy_table(scores: pd.DataFrame, tasks: list[str] | None = None) -> pd.DataFrame:
    """One row per setting (the full cache first): ``runs``, accuracy per task and
    ``pooled`` (over every run of the setting), and ``compression_ratio``."""
    rows = scores if tasks is None else scores[scores["task"].isin(tasks)]
    if rows.empty:
        return pd.DataFrame(columns=[*SETTING, "compression_ratio", "runs", "pooled"])
    correct = rows.assign(correct=rows["correct"].astype(float))
    per_task = correct.pivot_table(index=SETTING, columns="task", values="correct", aggfunc="mean")
    per_task.columns.name = None
    pooled = correct.groupby(SETTING)["correct"].agg(["mean", "size"]).rename(columns={"mean": "pooled", "size": "runs"})
    table = per_task.join(pooled).reset_index()
    table["compression_ratio"] = 1.0 - table["budget"]
    order = table["condition"].map({"full": 0, "aware": 1, "streaming": 2}).fillna(3)
    table = table.assign(_order=order).sort_values(["_order", "method", "budget"]).drop(columns="_order")
    task_cols = [t for t in (tasks or sorted(per_task.columns)) if t in table.columns]
    return table[[*SETTING, "compression_ratio", "runs", *task_cols, "pooled"]].reset_index(drop=True)
