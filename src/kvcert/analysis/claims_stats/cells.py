"""The rows of a claim's registered cells (``claims.yaml``: conditions, budgets, methods; replay budgets and query
kinds), and the cells that have none."""

from __future__ import annotations

from itertools import product
from typing import Mapping

import pandas as pd

from ..load import scored
from ..replay_stats import CELL_KEY


def _as_list(cells: Mapping, plural: str, singular: str) -> list | None:
    if plural in cells:
        return list(cells[plural])
    if singular in cells:
        return [cells[singular]]
    return None


def method_mask(rows: pd.DataFrame, names: list[str]) -> pd.Series:
    return rows["sampler"].isin(names) | rows["method"].isin(names)


def select_generations(scores: pd.DataFrame, cells: Mapping, tasks: list[str] | None) -> tuple[pd.DataFrame, list[str]]:
    """Scored rows of a claim's cells, and the names of the cells that have no rows."""
    rows = scored(scores)
    rows = rows[rows["condition"] != "full"]
    if tasks is not None:
        rows = rows[rows["task"].isin(tasks)]
    conditions = _as_list(cells, "conditions", "condition")
    budgets = _as_list(cells, "budgets", "budget")
    methods = _as_list(cells, "methods", "method")
    if conditions is not None:
        rows = rows[rows["condition"].isin(conditions)]
    if budgets is not None:
        rows = rows[rows["budget"].isin([float(b) for b in budgets])]
    if methods is not None:
        rows = rows[method_mask(rows, methods)]
    missing = []
    for c, b, m in product(conditions or [None], budgets or [None], methods or [None]):
        sub = rows
        if c is not None:
            sub = sub[sub["condition"] == c]
        if b is not None:
            sub = sub[sub["budget"] == float(b)]
        if m is not None:
            sub = sub[method_mask(sub, [m])]
        if sub.empty:
            missing.append("/".join(str(x) for x in (c, b, m) if x is not None))
    return rows, missing


def select_replay(replay: pd.DataFrame | None, cells: Mapping) -> tuple[pd.DataFrame, list[str]]:
    if replay is None or replay.empty:
        return pd.DataFrame(columns=[*CELL_KEY]), ["replay (no replay draws)"]
    budgets = [float(b) for b in (_as_list(cells, "budgets", "budget") or sorted(replay["budget"].unique()))]
    kinds = _as_list(cells, "query_kinds", "query_kind") or sorted(replay["query_kind"].unique())
    rows = replay[replay["budget"].isin(budgets) & replay["query_kind"].isin(kinds)]
    missing = [f"{b:g}/{k}" for b, k in product(budgets, kinds)
               if rows[(rows["budget"] == b) & (rows["query_kind"] == k)].empty]
    return rows, missing
