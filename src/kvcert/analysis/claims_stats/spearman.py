"""C2: does the radius rank the draws' errors? The registered statistic is the median, over the cells of one
step s (example × layer × head × budget × kind × step), of the within-cell Spearman correlation across draws,

    spearman_within_cell = median_s ρ_S(ε_δ, ‖ô − o‖ | s)

(:func:`kvcert.analysis.replay_stats.step_cell_spearman`), bootstrapped over replay cells (a step cell weighs what
its replay cell draws). The paper's pooled ``spearman`` over every draw (it mixes cells whose scales differ by orders
of magnitude) is reported beside it. Statistic names written out: :data:`NAMES`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...config.analysis_plan import AnalysisPlan
from ..replay_stats import CELL_KEY, step_cell_spearman, within_cell_spearman, within_head_spearman
from ..stats import SpearmanIndex, WeightedQuantile, spearman
from .base import Kind, Prepared, empty, replay_units

#: draws used for the bootstrap of the replay Spearman (the point estimate uses all)
MAX_SPEARMAN_BOOTSTRAP_OBS = 50_000


def pooled(rows: pd.DataFrame) -> Prepared:
    """The pooled Spearman over every draw (the paper's C2 statistic, reported beside the test). The point
    estimate uses every draw; beyond ``MAX_SPEARMAN_BOOTSTRAP_OBS`` draws × queries the bootstrap keeps every
    replay cell but only its first draws (draws are i.i.d.), which can only widen the interval."""
    codes = rows.groupby(CELL_KEY, sort=True, observed=True).ngroup().to_numpy()
    n_cells = int(codes.max()) + 1
    boot = rows
    subsample = None
    if len(rows) > MAX_SPEARMAN_BOOTSTRAP_OBS:  # keep every cell, fewer draws per cell (draws are i.i.d.)
        per_draw = len(rows) / max(1, rows["draw"].nunique())
        keep = max(1, int(MAX_SPEARMAN_BOOTSTRAP_OBS // per_draw))
        mask = (rows["draw"] < keep).to_numpy()
        boot, codes = rows[mask], codes[mask]
        subsample = {"draws_per_cell": keep, "observations": int(mask.sum())}
    index = SpearmanIndex(boot["radius"].to_numpy(float), boot["error"].to_numpy(float))
    point = {"spearman": spearman(rows["radius"], rows["error"])}
    cells = _cells(rows)
    return Prepared(lambda w: {"spearman": index(w)}, codes, n_cells, point, {}, {"bootstrap_subsample": subsample},
                    units={name: c[codes] for name, c in replay_units(cells).items()})


def _cells(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per replay cell (:data:`CELL_KEY`), in the order of the rows' cell codes."""
    return rows.groupby(CELL_KEY, sort=True, observed=True).size().reset_index()[CELL_KEY]


def prepare(rows: pd.DataFrame, plan: AnalysisPlan) -> Prepared:
    """C2: the median over step cells of the within-cell Spearman (:func:`step_cell_spearman`), bootstrapped over
    replay cells (a step cell weighs what its replay cell draws); the pooled Spearman beside it."""
    if (e := empty(rows)) is not None:
        return e
    codes = rows.groupby(CELL_KEY, sort=True, observed=True).ngroup().to_numpy()
    n_cells = int(codes.max()) + 1
    values, first = step_cell_spearman(rows)
    cell_of = codes[first]  # the records of this statistic are the step cells, each in its replay cell's unit

    median = WeightedQuantile(values, np.arange(values.size), 0.5, method="inverted_cdf")  # sorted once

    def statistic(w):
        if not values.size:
            return {"spearman_within_cell": (np.full(w.shape[0], np.nan), np.zeros(w.shape[0], dtype=bool))}
        return {"spearman_within_cell": (median(w)[0], w.sum(axis=1) > 0)}

    heads = within_head_spearman(rows)
    finite_cells = within_cell_spearman(rows)
    details = {
        "spearman_anytime": spearman(rows["anytime_radius"], rows["error"]),
        "by_kind": {k: spearman(d["radius"], d["error"]) for k, d in rows.groupby("query_kind", observed=True)},
        "within_cell_median": float(np.median(values)) if values.size else None,
        "within_cell_q25_q75": [float(np.quantile(values, 0.25)), float(np.quantile(values, 0.75))]
        if values.size else None,
        "step_cells": int(values.size), "step_cells_constant_radius": int(values.size - finite_cells.size),
        "within_head_median": float(np.median(heads)) if heads.size else None,
        "within_head_mean": float(np.mean(heads)) if heads.size else None,
        "heads": int(heads.size), "observations": int(len(rows)),
    }
    return Prepared(statistic, cell_of, n_cells, {}, {"generations": int(n_cells)}, details,
                    beside=pooled(rows), units={name: c[cell_of] for name, c in replay_units(_cells(rows)).items()})


NAMES = ("spearman_within_cell",)
KIND = Kind("replay", prepare, ("generations",))
