"""The secondary analyses of a replay claim (``analysis_plan.secondary``): its certificate against its step cell's
constant — every radius replaced by the median radius of its step cell (example × layer × head × budget × kind ×
step: the ``step_cell_median_radius`` placebo), a radius that knows the cell and not the draw — paired on the same
draws. Reported beside the claim's tests; they decide no verdict.

With r the certificate's radius, c the constant's, e = ‖ô − o‖ and a step cell's draws s:

* **top error** (``top_error_coverage``, ``…_constant``, ``…_difference`` = certificate − constant): coverage
  #{e ≤ r} / n and #{e ≤ c} / n on the draws whose error is at least their step cell's (1 − ``top_error``) quantile
  of e — the draws where the cache lost most, where a certificate that sees the draw should widen;
* **bottom radius** (``bottom_radius_coverage``, …): the same on the draws whose radius r is at most their step
  cell's ``bottom_radius`` quantile of r — where the certificate claims most precision;
* **matched coverage** (``matched_tightness``, ``…_constant``, ``…_ratio`` = certificate / constant): each radius
  scaled by the k that makes it cover the nominal 1 − δ of the draws, k = Q_{1−δ}(e / r), and its tightness
  k · exp(median log(r / e)) over the draws with e > 0 (the median on the log scale, so that an even count's two
  middle ratios meet at their geometric mean) — which radius is tighter at the same coverage, whatever their own
  levels.

Beside them, :func:`prepare_worst_later` (``secondary.worst_later_cell``): the certificate's lowest coverage over
the budget × layer cells of the later queries, the cell it is, and its interval.

The step cells' quantiles (``numpy.quantile``'s default, linear) fix the draws of the first two once; the bootstrap
resamples replay cells (:func:`kvcert.analysis.claims_stats.base.replay_units`: the cell, its example × layer, its
example), k and the median by exact weighted quantiles (:class:`kvcert.analysis.stats.WeightedQuantile`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from ...config.analysis_plan import AnalysisPlan
from ..replay_stats import CELL_KEY, STEP_CELL_KEY, VARIANTS
from ..stats import WeightedQuantile
from .base import Prepared, empty, ratio, replay_units

#: the analyses, each with its statistics: the certificate's, the constant's, and how they compare
ANALYSES = {"top_error_coverage": "difference", "bottom_radius_coverage": "difference", "matched_tightness": "ratio"}
#: every statistic a secondary block reports
NAMES = tuple(f"{a}{s}" for a, cmp in ANALYSES.items() for s in ("", "_constant", f"_{cmp}"))


def constant_radius(rows: pd.DataFrame, radius: str) -> np.ndarray:
    """Every draw's radius replaced by its step cell's median radius (the ``step_cell_median_radius`` placebo's)."""
    cells = rows.groupby(STEP_CELL_KEY, observed=True, sort=False).ngroup().to_numpy()
    return pd.Series(rows[radius].to_numpy(float)).groupby(cells).transform("median").to_numpy()


def group_quantile(values: np.ndarray, groups: np.ndarray, q: float) -> np.ndarray:
    """Each value's group's ``numpy.quantile(·, q)`` (its default, linear), for every value at once: where every
    group holds as many values (a replay's step cells: one value per draw), one ``numpy.quantile`` over the rows of
    the values arranged [group, member] — the same numbers as one call per group; else one call per group."""
    values = np.asarray(values, dtype=np.float64)
    if not values.size:
        return values.copy()
    order = np.argsort(groups, kind="stable")
    sizes = np.bincount(groups)
    sizes = sizes[sizes > 0]
    if np.all(sizes == sizes[0]):
        cut = np.quantile(values[order].reshape(len(sizes), int(sizes[0])), q, axis=1)
        out = np.empty_like(values)
        out[order] = np.repeat(cut, int(sizes[0]))
        return out
    return pd.Series(values).groupby(groups).transform(lambda v: np.quantile(v, q)).to_numpy()


def _in_step_cell_tail(rows: pd.DataFrame, values: np.ndarray, q: float, upper: bool) -> np.ndarray:
    """Whether each draw's value is at least (``upper``) / at most its step cell's q quantile of the values."""
    cells = rows.groupby(STEP_CELL_KEY, observed=True, sort=False).ngroup().to_numpy()
    cut = group_quantile(values, cells, q)
    return values >= cut if upper else values <= cut


def _matched(error: np.ndarray, radius: np.ndarray, codes: np.ndarray, coverage: float):
    """(k, median r/e) as weighted quantiles: k = Q_coverage(e / r) over the draws (e / r = +inf where r = 0 < e),
    the median of log r/e over the draws with 0 < e and 0 < r < inf."""
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(error > 0, error / radius, 0.0)
        log_tight = np.log(radius / error)
    k_ok = ~np.isnan(scale)
    t_ok = np.isfinite(log_tight)
    return WeightedQuantile(scale[k_ok], codes[k_ok], coverage), WeightedQuantile(log_tight[t_ok], codes[t_ok], 0.5)


def _tightness(k: np.ndarray, log_median: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return k * np.exp(log_median)


def _details(plan: AnalysisPlan, certificate: str, draws: dict) -> dict:
    """What the analyses compared, with which parameters, on how many draws each."""
    part = plan.secondary
    return {"certificate": certificate, "radius": VARIANTS[certificate][0], "against": "step_cell_median_radius",
            "top_error": part.top_error, "bottom_radius": part.bottom_radius, "matched_coverage": 1.0 - plan.delta,
            "draws": draws}


def prepare(rows: pd.DataFrame, plan: AnalysisPlan, certificate: str) -> Prepared:
    """The secondary analyses of ``certificate``'s radius (``plugin`` or ``robust``) on a replay claim's rows."""
    if (e := empty(rows)) is not None:  # no draws: the parameters alone, every statistic undefined
        return replace(e, details=_details(plan, certificate, {}))
    part = plan.secondary
    radius_col = VARIANTS[certificate][0]
    error = rows["error"].to_numpy(float)
    radius = rows[radius_col].to_numpy(float)
    constant = constant_radius(rows, radius_col)
    top = _in_step_cell_tail(rows, error, 1.0 - part.top_error, upper=True)
    bottom = _in_step_cell_tail(rows, radius, part.bottom_radius, upper=False)
    hit, hit_c = rows[VARIANTS[certificate][2]].to_numpy(bool), error <= constant  # the claim's own coverage
    grouped = rows.groupby(CELL_KEY, observed=True, sort=True)
    codes = grouped.ngroup().to_numpy()
    cells = grouped.size().reset_index()[CELL_KEY]
    n_cells = len(cells)

    def per_cell(mask: np.ndarray) -> np.ndarray:
        return np.bincount(codes, weights=mask.astype(float), minlength=n_cells)

    sums = {name: (per_cell(sel), per_cell(sel & hit), per_cell(sel & hit_c))
            for name, sel in (("top_error_coverage", top), ("bottom_radius_coverage", bottom))}
    nominal = 1.0 - plan.delta
    k_cert, t_cert = _matched(error, radius, codes, nominal)
    k_const, t_const = _matched(error, constant, codes, nominal)

    def coverage(name):
        n, h, hc = sums[name]

        def pair(w):
            (a, ok_a), (b, ok_b) = ratio(w, h, n), ratio(w, hc, n)
            return a, b, ok_a & ok_b
        return pair

    def matched(k_q, t_q):
        def value(w):
            (k, ok_k), (t, ok_t) = k_q(w), t_q(w)
            return _tightness(k, t), ok_k & ok_t
        return value

    def statistic(w, only=None):
        out = {}
        for name in ("top_error_coverage", "bottom_radius_coverage"):
            a, b, ok = coverage(name)(w)
            out[name], out[f"{name}_constant"] = (a, ok), (b, ok)
            out[f"{name}_difference"] = (a - b, ok)
        (a, ok_a), (b, ok_b) = matched(k_cert, t_cert)(w), matched(k_const, t_const)(w)
        ok = ok_a & ok_b & (b > 0)
        out["matched_tightness"], out["matched_tightness_constant"] = (a, ok_a), (b, ok_b)
        with np.errstate(invalid="ignore", divide="ignore"):
            out["matched_tightness_ratio"] = (np.where(ok, a / np.where(ok, b, 1.0), np.nan), ok)
        return {n: v for n, v in out.items() if only is None or n in only}

    ones = np.ones((1, n_cells))
    point = {name: float(v[0]) for name, (v, _) in statistic(ones).items()}
    details = _details(plan, certificate, {"top_error_coverage": int(top.sum()),
                                           "bottom_radius_coverage": int(bottom.sum()),
                                           "matched_tightness": int(len(rows))})
    return Prepared(statistic, np.arange(n_cells), n_cells, point, {"generations": n_cells}, details,
                    selective=True, units=replay_units(cells))


# --- the worst later-query cell ------------------------------------------------------------------
#: the statistics of the worst later-query cell (``secondary.worst_later_cell``): the smallest budget × layer cell's
#: coverage, the minimum taken in each resample (as C8's ``coverage_robust_later_worst_cell``), and the coverage of
#: the cell that is smallest on the data, resampled as it is
WORST_NAMES = ("worst_later_cell_coverage", "worst_later_cell_coverage_fixed")


def prepare_worst_later(rows: pd.DataFrame, plan: AnalysisPlan, certificate: str) -> Prepared:
    """A certificate's worst later-query cell on a replay claim's rows: over the budget × layer cells g of the
    draws of query kind ``later``, with c the replay cells (:data:`~kvcert.analysis.replay_stats.CELL_KEY`), h_c
    the covered draws (``covered`` of ``certificate``, the claim's own per-step coverage) and n_c the draws of
    replay cell c, and w the resample weights,

        coverage_g(w) = Σ_{c ∈ g} w_c · h_c / Σ_{c ∈ g} w_c · n_c,
        worst_later_cell_coverage(w) = min_g coverage_g(w)       (undefined where a cell g has no weight),
        worst_later_cell_coverage_fixed(w) = coverage_{g*}(w),    g* = argmin_g coverage_g(1) on the data.

    ``details``: the certificate, the cell g* (its budget and layer), every cell's coverage on the data, the nominal
    1 − δ and how many cells lie below it. The same minimum as :mod:`.coverage`'s ``coverage_later_worst_cell``."""
    later = rows[rows["query_kind"] == "later"] if len(rows) else rows
    nominal = 1.0 - plan.delta
    base = {"certificate": certificate, "covered": VARIANTS[certificate][2], "query_kind": "later",
            "nominal": nominal}
    if (e := empty(later)) is not None:  # no later queries: nothing to find, every statistic undefined
        return replace(e, details={**base, "cell": None, "budget": None, "layer": None, "cells": {},
                                   "cells_below_nominal": 0})
    covered = later[VARIANTS[certificate][2]].to_numpy(bool)
    grouped = later.groupby(CELL_KEY, observed=True, sort=True)
    codes = grouped.ngroup().to_numpy()
    cells = grouped.size().reset_index()[CELL_KEY]
    n_cells = len(cells)
    n = np.bincount(codes, minlength=n_cells).astype(float)
    hits = np.bincount(codes, weights=covered.astype(float), minlength=n_cells)
    groups = cells.groupby(["budget", "layer"], observed=True, sort=True).ngroup().to_numpy()
    keys = cells[["budget", "layer"]].drop_duplicates().sort_values(["budget", "layer"]).itertuples(index=False)
    keys = list(keys)
    member = np.zeros((n_cells, len(keys)))
    member[np.arange(n_cells), groups] = 1.0  # [replay cells, budget × layer cells]
    group_hits, group_n = hits[:, None] * member, n[:, None] * member
    on_data = group_hits.sum(0) / group_n.sum(0)
    worst = int(np.argmin(on_data))

    def statistic(w, only=None):
        den = w @ group_n
        each_ok = den > 0
        values = np.where(each_ok, (w @ group_hits) / np.where(each_ok, den, 1.0), np.inf)
        ok = each_ok.all(axis=1)
        out = {"worst_later_cell_coverage": (np.where(ok, values.min(axis=1), np.nan), ok),
               "worst_later_cell_coverage_fixed": (np.where(each_ok[:, worst], values[:, worst], np.nan),
                                                   each_ok[:, worst])}
        return {k: v for k, v in out.items() if only is None or k in only}

    budget, layer = keys[worst]
    point = {WORST_NAMES[0]: float(on_data[worst]), WORST_NAMES[1]: float(on_data[worst])}
    details = {**base, "cell": f"{budget:g}/layer {int(layer)}", "budget": float(budget), "layer": int(layer),
               "cells": {f"{b:g}/layer {int(la)}": float(v) for (b, la), v in zip(keys, on_data)},
               "cells_below_nominal": int((on_data < nominal).sum())}
    return Prepared(statistic, np.arange(n_cells), n_cells, point, {"generations": n_cells}, details,
                    selective=True, units=replay_units(cells))
