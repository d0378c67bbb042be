"""vAttention beside kvcert's certificate on the same replay rows (no torch): a comparison reported beside the
claims, deciding nothing.

The replay (:mod:`kvcert.generation.replay`) writes, on its setting and later rows, vAttention's estimate at matched
density (the columns :data:`kvcert.generation.replay_table.VATTENTION_COLUMNS`; the method:
:mod:`kvcert.method.vattention`). What each side states, and what is measured against it:

* kvcert: ‖ô − o‖ ≤ ε_δ (plug-in) and ≤ ε_R (robust), each per query with probability ≈ 1 − δ — a bound on the
  **output**. Coverage = share of rows with error ≤ radius; tightness = radius / error (median).
* vAttention: |D̂ − D| ≤ ε·D with probability 1 − δ, ε = Φ⁻¹(1 − δ)·σ̂·n / (D̂·√b) — a bound on the softmax
  **denominator only**. Alone it implies nothing about ‖ô − o‖: since ô − o = (N̂ − N)/D̂ − o·(D̂ − D)/D̂, on its
  event ‖ô − o‖ ≤ ‖N̂ − N‖/D̂ + ‖o‖·ε/(1 − ε), and the numerator's term is bounded by nothing it states. So its output
  error is stated beside it, not against it: the realised ‖ô − o‖ / ‖o‖ of its Hansen–Hurwitz estimate and of the
  Horvitz–Thompson variant. Coverage = share of rows with |D̂ − D| / D ≤ ε, as coded (one-sided Φ⁻¹(1 − δ): ≈ 1 − 2δ
  under the CLT for this two-sided statement) and with the two-sided quantile Φ⁻¹(1 − δ/2) (ε rescaled by
  Φ⁻¹(1 − δ/2) / Φ⁻¹(1 − δ)); tightness = ε / realised denominator error (median).
* Tokens per query: kvcert reads and keeps resident its kept tokens (kept + the decode keys the query sees);
  vAttention reads as many (matched) but keeps the full cache resident and redraws for every query.

Intervals: the prompt-cluster bootstrap of the replay claims (``bootstrap.replay_unit`` = example: a prompt's every
row enters a resample together; ``bootstrap.resamples``, ``seed`` and ``level`` of the plan), means as weighted
ratios of per-prompt sums, medians by exact weighted quantiles (:class:`kvcert.analysis.stats.WeightedMedian`).
Rows with fewer than 2 vAttention draws (ε undefined) leave vAttention's coverage and ε; they are counted.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pandas as pd

from ..config.analysis_plan import BootstrapPart
from ..generation.replay_table import VATTENTION_COLUMNS
from .stats import WeightedMedian, bootstrap, encode_units

#: the query kinds vAttention is replayed on (it keeps the full cache resident: no compressed run of its own)
KINDS = ("setting", "later")
#: means: name → (numerator column, denominator column) of the per-row frame :func:`_per_row` builds
MEANS = {
    "coverage_plugin": ("covered", "one"), "coverage_robust": ("covered_robust", "one"),
    "coverage_vatt": ("covered_vatt_ok", "has_eps"), "coverage_vatt_two_sided": ("covered_vatt_two_ok", "has_eps"),
    "coverage_vatt_ht": ("covered_vatt_ht_ok", "has_eps"),
    "tokens_read_kvcert": ("tokens_kvcert", "one"), "tokens_read_vatt": ("tokens_read_vatt", "one"),
    "tokens_resident_kvcert": ("tokens_kvcert", "one"), "tokens_resident_vatt": ("resident_vatt", "one"),
}
#: medians: name → column of the per-row frame (finite values only)
MEDIANS = {
    "tightness_plugin": "tight_plugin", "tightness_robust": "tight_robust", "tightness_vatt": "tight_vatt",
    "relative_error_kvcert": "rel_err_kvcert", "relative_error_vatt": "rel_err_vatt",
    "relative_error_vatt_ht": "rel_err_vatt_ht", "relative_radius_plugin": "rel_radius_plugin",
    "relative_radius_robust": "rel_radius_robust", "epsilon_vatt": "epsilon_vatt",
    "denominator_error_vatt": "denominator_error_vatt",
}
NAMES = (*MEANS, *MEDIANS)


def available(draws: pd.DataFrame) -> bool:
    """Whether the table carries the vAttention arm (its columns, with values on some setting or later row)."""
    if draws.empty or any(c not in draws.columns for c in VATTENTION_COLUMNS):
        return False
    return bool(draws.loc[draws["query_kind"].isin(KINDS), "error_vatt"].notna().any())


def quantile_ratio(delta: float) -> float:
    """Φ⁻¹(1 − δ/2) / Φ⁻¹(1 − δ): the factor that turns the as-coded ε into the two-sided statement's."""
    z = NormalDist()
    return z.inv_cdf(1.0 - delta / 2.0) / z.inv_cdf(1.0 - delta)


def _ratio(num: pd.Series, den: pd.Series) -> np.ndarray:
    n, d = num.to_numpy(float), den.to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(d > 0, n / d, np.nan)


def _per_row(draws: pd.DataFrame, delta: float) -> pd.DataFrame:
    """The setting and later rows with the arm, in the columns :data:`MEANS` and :data:`MEDIANS` read."""
    d = draws[draws["query_kind"].isin(KINDS) & draws["error_vatt"].notna()]
    eps = d["epsilon_vatt"].to_numpy(float)
    has = np.isfinite(eps)
    den_err = d["denominator_error_vatt"].to_numpy(float)
    den_err_ht = d["denominator_error_vatt_ht"].to_numpy(float)
    two = eps * quantile_ratio(delta)
    return pd.DataFrame({
        "model": d["model"].to_numpy(), "example_id": d["example_id"].to_numpy(), "budget": d["budget"].to_numpy(float),
        "query_kind": d["query_kind"].to_numpy(), "one": 1.0,
        "covered": d["covered"].to_numpy(float), "covered_robust": d["covered_robust"].to_numpy(float),
        "has_eps": has.astype(float), "covered_vatt_ok": (has & (den_err <= eps)).astype(float),
        "covered_vatt_two_ok": (has & (den_err <= two)).astype(float),
        "covered_vatt_ht_ok": (has & (den_err_ht <= eps)).astype(float),
        "tokens_kvcert": (d["kept"] + d["step"]).to_numpy(float),
        "tokens_read_vatt": d["tokens_read_vatt"].to_numpy(float),
        "resident_vatt": d["resident_vatt"].to_numpy(float),
        "tight_plugin": _ratio(d["radius"], d["error"]), "tight_robust": _ratio(d["radius_robust"], d["error"]),
        "tight_vatt": np.where(has & (den_err > 0), eps / np.where(den_err > 0, den_err, 1.0), np.nan),
        "rel_err_kvcert": _ratio(d["error"], d["exact_norm"]), "rel_err_vatt": _ratio(d["error_vatt"], d["exact_norm"]),
        "rel_err_vatt_ht": _ratio(d["error_vatt_ht"], d["exact_norm"]),
        "rel_radius_plugin": _ratio(d["radius"], d["exact_norm"]),
        "rel_radius_robust": _ratio(d["radius_robust"], d["exact_norm"]),
        "epsilon_vatt": np.where(has, eps, np.nan), "denominator_error_vatt": den_err,
    })


def _block(rows: pd.DataFrame, plan: BootstrapPart | None) -> dict:
    """Every statistic of one group of rows: its point estimate and, with ``plan``, its prompt-cluster interval."""
    codes, n_units = encode_units(rows["model"].astype(str) + "\x1f" + rows["example_id"].astype(str))
    cols = sorted({c for pair in MEANS.values() for c in pair})
    sums = np.zeros((n_units, len(cols)))
    np.add.at(sums, codes, rows[cols].to_numpy(float))
    index = {c: i for i, c in enumerate(cols)}
    medians = {}
    for name, col in MEDIANS.items():
        v = rows[col].to_numpy(float)
        ok = np.isfinite(v)
        medians[name] = WeightedMedian(v[ok], codes[ok]) if ok.any() else None

    def statistic(w: np.ndarray) -> dict:
        out = {}
        for name, (num, den) in MEANS.items():
            d = w @ sums[:, index[den]]
            ok = d > 0
            out[name] = (np.where(ok, (w @ sums[:, index[num]]) / np.where(ok, d, 1.0), np.nan), ok)
        for name, med in medians.items():
            out[name] = med(w) if med is not None else (np.full(w.shape[0], np.nan), np.zeros(w.shape[0], bool))
        return out

    block = {"rows": int(len(rows)), "prompts": int(n_units), "rows_without_epsilon": int((rows["has_eps"] == 0).sum())}
    if plan is None:
        point = statistic(np.ones((1, n_units)))
        block.update({name: {"estimate": float(v[0]) if bool(ok[0]) else None} for name, (v, ok) in point.items()})
        return block
    est = bootstrap(statistic, np.arange(n_units), n_units, plan)
    block.update({name: e.to_dict() for name, e in est.items()})
    return block


def summarize_vattention(draws: pd.DataFrame, delta: float, plan: BootstrapPart | None = None) -> dict:
    """vAttention beside kvcert's certificate, pooled, per query kind, per budget and per budget × kind (see the
    module docstring); ``plan`` (``analysis_plan.bootstrap``) adds the prompt-cluster intervals.
    ``{"available": False}`` where the table has no vAttention arm (a table made before it)."""
    if not available(draws):
        return {"available": False}
    rows = _per_row(draws, delta)
    groups = {"pooled": rows}
    for kind in KINDS:
        groups[f"kind={kind}"] = rows[rows["query_kind"] == kind]
    for b in sorted(rows["budget"].unique()):
        groups[f"budget={b:g}"] = rows[rows["budget"] == b]
        for kind in KINDS:
            groups[f"budget={b:g}/kind={kind}"] = rows[(rows["budget"] == b) & (rows["query_kind"] == kind)]
    return {
        "available": True, "delta": float(delta), "target_coverage": 1.0 - float(delta),
        "target_coverage_vatt_as_coded": 1.0 - 2.0 * float(delta), "quantile_ratio": quantile_ratio(delta),
        "unit": "example", "resamples": plan.resamples if plan else 0, "level": plan.level if plan else None,
        "bounds": {"kvcert": "output: ||o_hat - o|| <= radius",
                   "vattention": "denominator only: |D_hat - D| <= eps * D"},
        "groups": {name: _block(g, plan) for name, g in groups.items() if len(g)},
    }
