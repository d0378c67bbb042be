"""The multi-turn recall table: certificate-gated vs top-k vs full cache by turn distance.

The cell (docs/design.md §2; the grid's ``multiturn`` section): task ``multiturn``, the
streaming condition at one budget (10 %), the deterministic (``topk``) and the
randomized (``poisson``) sampler, plus the full cache. The *certificate-gated system*
is the Poisson run, recomputed with the full cache — i.e. it takes the full-cache
run's correctness — when the gate of ``analysis_plan.multiturn_gate`` fires
(``gate_signal`` > ``threshold``; the gate signal is computed per record by
:mod:`kvcert.analysis.load`). Recall = mean correctness, by turn-distance bins of
width 5 (1–5, 6–10, …) and overall, for full, top-k, Poisson ungated and gated, with
the fraction of runs the gate recomputed. The paper: 0.97 gated vs 0.09 top-k overall,
97 % vs 2 % for facts 26–30 turns back (arXiv 2607.21475, abstract).
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import pandas as pd

PAPER = {"overall": {"gated": 0.97, "topk": 0.09}, "26-30": {"gated": 0.97, "topk": 0.02}}
COLUMNS = ["bin", "n", "full", "topk", "poisson", "gated", "recomputed"]


def distance_bins(max_distance: int, width: int = 5) -> list[tuple[int, int]]:
    top = max(width, int(math.ceil(max_distance / width)) * width)
    return [(lo, lo + width - 1) for lo in range(1, top + 1, width)]


def multiturn_table(
    scores: pd.DataFrame, cell: Mapping, threshold: float, width: int = 5
) -> pd.DataFrame:
    """Recall by turn-distance bin (+ an ``overall`` row); empty when the cell has no runs.

    ``scores``: scored rows (:func:`kvcert.analysis.load.scored`); ``cell``: the grid's
    ``multiturn`` section (task, condition, budgets, methods).
    """
    task = cell.get("task", "multiturn")
    condition = cell.get("condition", "streaming")
    budgets = [float(b) for b in cell.get("budgets", [0.1])]
    rows = scores[(scores["task"] == task) & (scores["condition"] == condition) & scores["budget"].isin(budgets)]
    key = ["model", "target_tokens", "example_id", "seed", "budget"]
    topk = rows[rows["sampler"] == "topk"][key + ["correct"]].rename(columns={"correct": "topk"})
    pois = rows[rows["sampler"] == "poisson"][key + ["correct", "full_correct", "gate_signal", "turn_distance"]]
    if pois.empty or topk.empty:
        return pd.DataFrame(columns=COLUMNS)
    both = pois.merge(topk, on=key, how="inner").dropna(subset=["full_correct", "turn_distance"])
    if both.empty:
        return pd.DataFrame(columns=COLUMNS)
    fired = both["gate_signal"].fillna(0.0).to_numpy() > threshold
    both = both.assign(
        full=both["full_correct"], poisson=both["correct"],
        gated=np.where(fired, both["full_correct"], both["correct"]), recomputed=fired.astype(float),
    )
    out = []
    for lo, hi in distance_bins(int(both["turn_distance"].max()), width):
        part = both[(both["turn_distance"] >= lo) & (both["turn_distance"] <= hi)]
        out.append(_row(f"{lo}-{hi}", part))
    out.append(_row("overall", both))
    return pd.DataFrame(out, columns=COLUMNS)


def _row(name: str, part: pd.DataFrame) -> dict:
    if part.empty:
        return {"bin": name, "n": 0, **{c: float("nan") for c in COLUMNS[2:]}}
    return {"bin": name, "n": int(len(part)), **{c: float(part[c].mean()) for c in COLUMNS[2:]}}
