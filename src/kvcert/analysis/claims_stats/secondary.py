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


def _in_step_cell_tail(rows: pd.DataFrame, values: np.ndarray, q: float, upper: bool) -> np.ndarray:
    """Whether each draw's value is at least (``upper``) / at most its step cell's q quantile of the values."""
    cells = rows.groupby(STEP_CELL_KEY, observed=True, sort=False).ngroup().to_numpy()
    cut = pd.Series(values).groupby(cells).transform(lambda v: np.quantile(v, q)).to_numpy()
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
