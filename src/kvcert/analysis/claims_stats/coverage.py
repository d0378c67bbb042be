"""Coverage of a certificate on the replay draws (C1: the plug-in certificate; C8: the robust one).

For a replay cell c (model × example × layer × query head × budget × query kind) with n_c draws × queries,
the per-step coverage is the share with ‖ô − o‖ ≤ ε_δ, pooled over cells by the resample weights w:

    coverage = Σ_c w_c · hits_c / Σ_c w_c · n_c        (C1 tests coverage ≥ its threshold in claims.yaml)

``coverage_anytime``: the share of draws whose every step of the path is covered by the anytime radius
(:func:`kvcert.analysis.replay_stats.simultaneous_anytime`); ``coverage_anytime_step`` its per-step mean;
``tightness`` the median of ε/‖ô − o‖ (its resamples the exact weighted median of every draw's log10 ε/error,
:class:`kvcert.analysis.stats.WeightedMedian`); each by query kind too (``coverage_<kind>``, …). Beside them the smallest
later-query coverage of a budget × layer cell (``coverage_later_worst_cell``) and the coverage on the
sample-dependent rows whose compressed run diverged from the full run (``coverage_diverged``; unexercised
below ``analysis_plan.replay.minimum_diverged_decodes`` such decodes). The robust certificate's names carry
``_robust`` (:mod:`.robust_coverage`). Statistic names written out: :data:`NAMES`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...config.analysis_plan import AnalysisPlan
from ..replay_stats import CELL_KEY, PATH_KEY, QUERY_KINDS, VARIANTS, log_tightness, simultaneous_anytime
from ..stats import WeightedMedian
from .base import Kind, Prepared, empty, ratio, replay_units

def _suffix(variant: str) -> str:
    return "" if variant == "plugin" else f"_{variant}"


def _tightness(rows: pd.DataFrame, codes: np.ndarray, radius: str) -> tuple[np.ndarray, WeightedMedian, np.ndarray]:
    """log10(ε/error) of every draw (NaN where the error is 0), the exact weighted median of the finite ones (their
    replay cell the unit of each: :class:`kvcert.analysis.stats.WeightedMedian`), and which draws are finite."""
    lr = log_tightness(rows, radius)
    ok = np.isfinite(lr)
    return lr, WeightedMedian(lr[ok], codes[ok]), ok


def _ratio_of(median: WeightedMedian, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """10^(weighted median of log10 ε/error) per resample row."""
    value, ok = median(w)
    return np.where(ok, 10.0 ** value, np.nan), ok


def diverged_decodes(rows: pd.DataFrame) -> int:
    """How many compressed decodes (model × example × budget × draw) fed another token than the full run."""
    d = rows[(rows["query_kind"] == "sample_dependent") & rows["diverged"].astype(bool)]
    return int(d.groupby(["model", "example_id", "budget", "draw"], observed=True).ngroups) if len(d) else 0


def prepare(rows: pd.DataFrame, plan: AnalysisPlan, variant: str = "plugin") -> Prepared:
    """Coverage of one certificate (``variant``: "plugin" or "robust", :data:`kvcert.analysis.replay_stats.VARIANTS`).

    Per step (``coverage``, by kind), anytime = simultaneous over a draw's path
    (``coverage_anytime``: each path is counted in the cell of its decode kind), the
    per-step mean of the anytime radius (``coverage_anytime_step``) and the median
    ε/error (``tightness``), by kind too; robust names carry ``_robust``. Beside them the
    smallest later-query coverage of a budget × layer cell (``coverage_later_worst_cell``)
    and the coverage on the sample-dependent rows whose compressed run diverged from the
    full run (``coverage_diverged``; unexercised below ``replay.minimum_diverged_decodes``).
    """
    if (e := empty(rows)) is not None:
        return e
    radius, _, covered, covered_any = VARIANTS[variant]
    sfx = _suffix(variant)
    grouped = rows.groupby(CELL_KEY, observed=True, sort=True)
    codes = grouped.ngroup().to_numpy()
    div_rows = rows["diverged"].astype(bool) & (rows["query_kind"] == "sample_dependent")
    work = rows.assign(_div=div_rows, _div_hits=div_rows & rows[covered].astype(bool))
    cell = (work.groupby(CELL_KEY, observed=True, sort=True)
            .agg(n=(covered, "size"), hits=(covered, "sum"), hits_any=(covered_any, "sum"), n_div=("_div", "sum"),
                 hits_div=("_div_hits", "sum")).reset_index())
    paths = simultaneous_anytime(rows, covered_any)
    if len(paths):
        per = paths.groupby([*PATH_KEY[:-1], "path"], observed=True).agg(path_n=("covered", "size"),
                                                                         path_hits=("covered", "sum")).reset_index()
        per = per.rename(columns={"path": "query_kind"})
        cell = cell.merge(per, on=CELL_KEY, how="left")
    else:
        cell = cell.assign(path_n=np.nan, path_hits=np.nan)
    cell[["path_n", "path_hits"]] = cell[["path_n", "path_hits"]].fillna(0.0)
    n = cell["n"].to_numpy(float)
    hits, hits_any = cell["hits"].to_numpy(float), cell["hits_any"].to_numpy(float)
    n_div, hits_div = cell["n_div"].to_numpy(float), cell["hits_div"].to_numpy(float)
    path_n, path_hits = cell["path_n"].to_numpy(float), cell["path_hits"].to_numpy(float)
    kinds = cell["query_kind"].to_numpy()
    row_kinds = rows["query_kind"].to_numpy()
    later_cells = cell.loc[kinds == "later", ["budget", "layer"]]
    worst_groups = [((cell["budget"] == b) & (cell["layer"] == layer) & (kinds == "later")).to_numpy(float)
                    for b, layer in later_cells.drop_duplicates().itertuples(index=False)]
    groups = np.stack(worst_groups, 1) if worst_groups else np.zeros((len(cell), 0))  # [cells, budget × layer]
    group_hits, group_n = hits[:, None] * groups, n[:, None] * groups
    lr, median, finite = _tightness(rows, codes, radius)

    def worst(w):
        """The smallest budget × layer cell's coverage per resample (every group's ratio in one product)."""
        den = w @ group_n
        each_ok = den > 0
        vals = np.where(each_ok, (w @ group_hits) / np.where(each_ok, den, 1.0), np.inf).min(axis=1)
        ok = each_ok.all(axis=1)
        return np.where(ok, vals, np.nan), ok

    # name → how to compute it from the resample weights (evaluated only when asked for)
    recipes = {f"coverage{sfx}": lambda w: ratio(w, hits, n),
               f"coverage_anytime{sfx}": lambda w: ratio(w, path_hits, path_n),
               f"coverage_anytime_step{sfx}": lambda w: ratio(w, hits_any, n),
               f"tightness{sfx}": lambda w: _ratio_of(median, w),
               f"coverage{sfx}_diverged": lambda w: ratio(w, hits_div, n_div)}
    for k in np.unique(kinds):
        m = (kinds == k).astype(float)
        recipes[f"coverage{sfx}_{k}"] = lambda w, m=m: ratio(w, hits * m, n * m)
        recipes[f"coverage_anytime_step{sfx}_{k}"] = lambda w, m=m: ratio(w, hits_any * m, n * m)
        kind_median = WeightedMedian(lr[finite & (row_kinds == k)], codes[finite & (row_kinds == k)])
        recipes[f"tightness{sfx}_{k}"] = lambda w, km=kind_median: _ratio_of(km, w)
        if path_n[kinds == k].sum() > 0:
            recipes[f"coverage_anytime{sfx}_{k}"] = lambda w, m=m: ratio(w, path_hits * m, path_n * m)
    if worst_groups:
        recipes[f"coverage{sfx}_later_worst_cell"] = worst

    def statistic(w, only=None):
        return {name: f(w) for name, f in recipes.items() if only is None or name in only}

    point = {f"tightness{sfx}": float(10 ** np.nanmedian(lr)) if np.isfinite(lr).any() else float("nan")}
    for k in np.unique(kinds):
        sel = lr[(row_kinds == k) & np.isfinite(lr)]
        point[f"tightness{sfx}_{k}"] = float(10 ** np.median(sel)) if sel.size else float("nan")
    per_cell = hits / np.where(n > 0, n, 1)
    nominal = 1.0 - plan.delta
    decodes = diverged_decodes(rows)
    need = plan.replay.minimum_diverged_decodes
    unexercised = {}
    if decodes < need:
        unexercised[f"coverage{sfx}_diverged"] = (f"{decodes} compressed decodes diverged from the full run's tokens "
                                                  f"< the pre-registered minimum {need}")
    worst = {}
    if worst_groups:
        for g, (b, layer) in zip(worst_groups, later_cells.drop_duplicates().itertuples(index=False)):
            worst[f"{b:g}/layer {int(layer)}"] = float(hits[g > 0].sum() / max(1.0, n[g > 0].sum()))
    details = {
        "variant": variant, "cells": int(len(cell)), "observations": int(n.sum()), "paths": int(path_n.sum()),
        "cell_coverage_quantiles": {q: float(np.quantile(per_cell, float(q))) for q in ("0.05", "0.25", "0.5")},
        "cells_below_nominal_fraction": float((per_cell < nominal).mean()), "nominal": nominal,
        "later_coverage_by_budget_layer": worst, "diverged_decodes": decodes,
        "diverged_rows": int(n_div.sum()),
        "sample_dependent_rows": int((row_kinds == "sample_dependent").sum()),
    }
    return Prepared(statistic, np.arange(len(cell)), len(cell), point, {"generations": int(len(cell))}, details,
                    unexercised, selective=True, units=replay_units(cell))


#: the statistics this preparation computes for the plug-in certificate (claims.yaml's tests may name these)
NAMES = ("coverage", "coverage_later_worst_cell", "coverage_diverged", *(f"coverage_{q}" for q in QUERY_KINDS))
#: C1's statistics: replay cells, the minimum number of them; no outcome (its placebos replace the radii)
KIND = Kind("replay", prepare, ("generations",))
