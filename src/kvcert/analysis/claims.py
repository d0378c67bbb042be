"""The pre-registered claims (``preregistration/claims.yaml``: the paper's seven and this project's
C8), computed as stated.

Every claim is read from ``claims.yaml``: its cells, its tests (statistic, operator,
threshold) and the paper's outcome; the analysis choices from ``analysis_plan``. The
statistics (names as in ``claims.yaml``):

* ``coverage`` (C1) — fraction of replay draws × queries with ‖ô − o‖ ≤ ε_δ, pooled over
  the replay cells of the claim's budgets and query kinds (per kind reported beside it,
  and the anytime radius's coverage as what it claims: the share of draws whose every
  step of the path is covered, ``coverage_anytime``, beside its per-step mean).
* ``spearman`` (C2) — Spearman(ε_δ, ‖ô − o‖) over all those draws (the median within a
  cell — one example, layer, head, budget, kind and step, across draws — and within a
  head reported beside it). The point estimate uses every draw; beyond
  ``MAX_SPEARMAN_BOOTSTRAP_OBS`` draws × queries the bootstrap keeps every replay cell
  but only its first draws (draws are i.i.d.), which can only widen the interval.
* ``coverage_robust_<kind>``, ``tightness_robust_<kind>`` (C8, this project's claim) —
  the same coverage, and the median ε_R/‖ô − o‖, of the robust certificate
  (:func:`kvcert.certificate.robust_radius`) on the replay cells of one query kind.
* ``induced_failure_rate`` (C3) — among compressed runs whose full-cache run is
  correct, the fraction that fail.
* ``auc_certificate``, ``auc_certificate_minus_confidence`` (C4) — AUC of the
  certificate signal for failure (score < pass mark), and its paired difference with
  the AUC of −mean_logprob.
* ``escalation_gain`` (C5) — :class:`kvcert.analysis.gating.Escalation`.
* ``auc_attribution``, ``auc_attribution_minus_confidence`` (C6) — among failed
  compressed runs, AUC of the certificate signal for cache-induced vs inherent, and
  the paired difference with −mean_logprob's.
* ``gain_ratio_certificate_over_random``, ``gain_certificate_minus_confidence`` (C7) —
  :class:`kvcert.analysis.gating.RecomputeGate` at ``recompute.verdict_rate`` (the
  curve over ``gate_rates`` is reported beside it). A resample with no expected random
  gain (nothing recompute could fix) leaves the ratio undefined and is skipped.

Generation claims use the scored grid rows (:func:`kvcert.analysis.load.scored`) of the
experiment's main tasks (the grid's ``tasks``; the multi-turn and LoCoMo cells are
reported separately), restricted to the claim's conditions, budgets and methods (a
method name matches the record's ``sampler`` or ``method``). Intervals: the unit
bootstrap of :mod:`kvcert.analysis.stats` (examples; replay cells for C1, C2), paired
across the tests of a claim. Minimum cell (``analysis_plan.minimum_cell``): the claim's
rows must number at least ``generations`` (replay: that many replay cells), and for the
AUC claims the two classes (C4: failures / successes; C6: induced / inherent) at least
``positives`` / ``negatives``; every condition × budget × method named by the claim
must be present. Otherwise the claim is inconclusive whatever its interval says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product
from typing import Callable, Mapping

import numpy as np
import pandas as pd

from .gating import Escalation, RecomputeGate, random_gain
from .load import scored
from .replay_stats import (
    CELL_KEY, PATH_KEY, QUERY_KINDS, VARIANTS, _log_tightness, simultaneous_anytime, within_cell_spearman,
    within_head_spearman,
)
from .stats import (
    AUCIndex, BootstrapPlan, Estimate, SpearmanIndex, auc, bootstrap, claim_verdict, encode_units, spearman,
    test_outcome, weighted_mean,
)

#: draws used for the bootstrap of the replay Spearman (the point estimate uses all)
MAX_SPEARMAN_BOOTSTRAP_OBS = 50_000


@dataclass
class TestResult:
    statistic: str
    op: str
    threshold: float
    ours: bool
    estimate: Estimate
    outcome: str

    def to_dict(self) -> dict:
        return {"statistic": self.statistic, "op": self.op, "threshold": self.threshold, "ours": self.ours,
                **self.estimate.to_dict(), "skipped_fraction": self.estimate.skipped_fraction, "outcome": self.outcome}


@dataclass
class ClaimResult:
    id: str
    statement: str
    source: str
    metric: str
    kill: str
    tests: list[TestResult]
    verdict: str
    reasons: list[str]
    cell: dict
    paper: dict
    details: dict = field(default_factory=dict)
    beyond_paper: bool = False

    @property
    def primary(self) -> TestResult:
        return self.tests[0]

    def to_dict(self) -> dict:
        p = self.primary
        return {
            "id": self.id, "statement": self.statement, "source": self.source, "metric": self.metric,
            "kill": self.kill, "statistic": p.statistic, "value": p.estimate.to_dict()["estimate"],
            "ci": p.estimate.to_dict()["ci"], "ci_level": p.estimate.level, "op": p.op, "threshold": p.threshold,
            "verdict": self.verdict, "reasons": self.reasons, "tests": [t.to_dict() for t in self.tests],
            "cell": self.cell, "paper": self.paper, "details": self.details, "beyond_paper": self.beyond_paper,
        }


@dataclass
class Prepared:
    """A claim's data made ready: the statistic on weights, units, point estimates, cell counts."""

    statistic: Callable[[np.ndarray], Mapping[str, tuple[np.ndarray, np.ndarray]]]
    codes: np.ndarray
    n_units: int
    point: dict[str, float]
    counts: dict[str, int]
    details: dict = field(default_factory=dict)


# --- cell selection -------------------------------------------------------------------------
def _as_list(cells: Mapping, plural: str, singular: str) -> list | None:
    if plural in cells:
        return list(cells[plural])
    if singular in cells:
        return [cells[singular]]
    return None


def _method_mask(rows: pd.DataFrame, names: list[str]) -> pd.Series:
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
        rows = rows[_method_mask(rows, methods)]
    missing = []
    for c, b, m in product(conditions or [None], budgets or [None], methods or [None]):
        sub = rows
        if c is not None:
            sub = sub[sub["condition"] == c]
        if b is not None:
            sub = sub[sub["budget"] == float(b)]
        if m is not None:
            sub = sub[_method_mask(sub, [m])]
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


# --- the statistics ---------------------------------------------------------------------------
def _units(rows: pd.DataFrame) -> tuple[np.ndarray, int]:
    return encode_units(rows["unit"].to_numpy())


def _empty(rows: pd.DataFrame) -> Prepared | None:
    """A claim with no rows: nothing to bootstrap (its statistics are undefined, its cell too small)."""
    if len(rows):
        return None
    return Prepared(lambda w: {}, np.zeros(0, dtype=np.int64), 0, {}, {"generations": 0, "positives": 0, "negatives": 0})


#: bins of log10(ε / error) for the bootstrap of the median tightness (the point estimate uses every draw)
TIGHTNESS_BINS = np.linspace(-4.0, 6.0, 1001)


def _suffix(variant: str) -> str:
    return "" if variant == "plugin" else f"_{variant}"


def _tightness_hist(rows: pd.DataFrame, codes: np.ndarray, n_cells: int, radius: str) -> tuple[np.ndarray, np.ndarray]:
    """log10(ε/error) of every draw with a positive error, and its histogram per cell [cells, bins] (clipped to the bins)."""
    lr = _log_tightness(rows, radius)
    ok = np.isfinite(lr)
    idx = np.clip(np.searchsorted(TIGHTNESS_BINS, lr[ok]) - 1, 0, len(TIGHTNESS_BINS) - 2)
    hist = np.zeros((n_cells, len(TIGHTNESS_BINS) - 1))
    np.add.at(hist, (codes[ok], idx), 1.0)
    return lr, hist


def _weighted_median_ratio(w: np.ndarray, hist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """10^(median log10 ε/err) per resample row from per-cell histograms (bin centres)."""
    h = w @ hist  # [b, bins]
    total = h.sum(axis=1)
    ok = total > 0
    cum = np.cumsum(h, axis=1)
    k = np.argmax(cum >= 0.5 * total[:, None], axis=1)
    centres = 0.5 * (TIGHTNESS_BINS[1:] + TIGHTNESS_BINS[:-1])
    return np.where(ok, 10.0 ** centres[k], np.nan), ok


def prepare_coverage(rows: pd.DataFrame, plan: Mapping, variant: str = "plugin") -> Prepared:
    """Coverage of one certificate (``variant``: "plugin" or "robust", :data:`kvcert.analysis.replay_stats.VARIANTS`).

    Per step (``coverage``, by kind), anytime = simultaneous over a draw's path
    (``coverage_anytime``: each path is counted in the cell of its decode kind), the
    per-step mean of the anytime radius (``coverage_anytime_step``) and the median
    ε/error (``tightness``), by kind too; robust names carry ``_robust``.
    """
    if (e := _empty(rows)) is not None:
        return e
    radius, _, covered, covered_any = VARIANTS[variant]
    sfx = _suffix(variant)
    grouped = rows.groupby(CELL_KEY, observed=True, sort=True)
    codes = grouped.ngroup().to_numpy()
    cell = grouped.agg(n=(covered, "size"), hits=(covered, "sum"), hits_any=(covered_any, "sum")).reset_index()
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
    path_n, path_hits = cell["path_n"].to_numpy(float), cell["path_hits"].to_numpy(float)
    kinds = cell["query_kind"].to_numpy()
    lr, hist = _tightness_hist(rows, codes, len(cell), radius)

    def ratio(w, num, den):
        d = w @ den
        ok = d > 0
        return np.where(ok, (w @ num) / np.where(ok, d, 1.0), np.nan), ok

    def statistic(w):
        out = {f"coverage{sfx}": ratio(w, hits, n), f"coverage_anytime{sfx}": ratio(w, path_hits, path_n),
               f"coverage_anytime_step{sfx}": ratio(w, hits_any, n), f"tightness{sfx}": _weighted_median_ratio(w, hist)}
        for k in np.unique(kinds):
            m = (kinds == k).astype(float)
            out[f"coverage{sfx}_{k}"] = ratio(w, hits * m, n * m)
            out[f"coverage_anytime_step{sfx}_{k}"] = ratio(w, hits_any * m, n * m)
            out[f"tightness{sfx}_{k}"] = _weighted_median_ratio(w * m, hist)
            if path_n[kinds == k].sum() > 0:
                out[f"coverage_anytime{sfx}_{k}"] = ratio(w, path_hits * m, path_n * m)
        return out

    row_kinds = rows["query_kind"].to_numpy()
    point = {f"tightness{sfx}": float(10 ** np.nanmedian(lr)) if np.isfinite(lr).any() else float("nan")}
    for k in np.unique(kinds):
        sel = lr[(row_kinds == k) & np.isfinite(lr)]
        point[f"tightness{sfx}_{k}"] = float(10 ** np.median(sel)) if sel.size else float("nan")
    per_cell = hits / np.where(n > 0, n, 1)
    nominal = 1.0 - float(plan["delta"])
    details = {
        "variant": variant, "cells": int(len(cell)), "observations": int(n.sum()), "paths": int(path_n.sum()),
        "cell_coverage_quantiles": {q: float(np.quantile(per_cell, float(q))) for q in ("0.05", "0.25", "0.5")},
        "cells_below_nominal_fraction": float((per_cell < nominal).mean()), "nominal": nominal,
    }
    return Prepared(statistic, np.arange(len(cell)), len(cell), point, {"generations": int(len(cell))}, details)


def prepare_coverage_robust(rows: pd.DataFrame, plan: Mapping) -> Prepared:
    """:func:`prepare_coverage` of the robust certificate (claim C8)."""
    return prepare_coverage(rows, plan, "robust")


def prepare_spearman(rows: pd.DataFrame, plan: Mapping) -> Prepared:
    if (e := _empty(rows)) is not None:
        return e
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

    def statistic(w):
        return {"spearman": index(w)}

    point = {"spearman": spearman(rows["radius"], rows["error"])}
    heads = within_head_spearman(rows)
    cells = within_cell_spearman(rows)
    details = {
        "spearman_anytime": spearman(rows["anytime_radius"], rows["error"]),
        "by_kind": {k: spearman(d["radius"], d["error"]) for k, d in rows.groupby("query_kind", observed=True)},
        "within_cell_median": float(np.median(cells)) if cells.size else None,
        "within_cell_q25_q75": [float(np.quantile(cells, 0.25)), float(np.quantile(cells, 0.75))] if cells.size else None,
        "step_cells": int(cells.size),
        "within_head_median": float(np.median(heads)) if heads.size else None,
        "within_head_mean": float(np.mean(heads)) if heads.size else None,
        "heads": int(heads.size), "observations": int(len(rows)), "bootstrap_subsample": subsample,
    }
    return Prepared(statistic, codes, n_cells, point, {"generations": int(n_cells)}, details)


def prepare_induced(rows: pd.DataFrame, plan: Mapping) -> Prepared:
    rows = rows[rows["full_correct"] == 1.0]
    if (e := _empty(rows)) is not None:
        return e
    fail = 1.0 - rows["correct"].to_numpy(float)
    codes, n_units = _units(rows)

    def statistic(w):
        return {"induced_failure_rate": weighted_mean(fail, w)}

    counts = {"generations": int(len(rows)), "positives": int(fail.sum()), "negatives": int(len(rows) - fail.sum())}
    return Prepared(statistic, codes, n_units, {}, counts)


def _signal_rows(rows: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    ok = rows["cert_signal"].notna() & rows["confidence"].notna()
    return rows[ok], int((~ok).sum())


def _auc_pair(rows: pd.DataFrame, y: np.ndarray, prefix: str) -> tuple[Callable, dict]:
    cert = rows["cert_signal"].to_numpy(float)
    conf = -rows["confidence"].to_numpy(float)
    a, c = AUCIndex(cert, y), AUCIndex(conf, y)

    def statistic(w):
        va, oka = a(w)
        vc, okc = c(w)
        return {f"auc_{prefix}": (va, oka), f"auc_{prefix}_confidence": (vc, okc),
                f"auc_{prefix}_minus_confidence": (va - vc, oka & okc)}

    pa, pc = auc(cert, y), auc(conf, y)
    point = {f"auc_{prefix}": pa, f"auc_{prefix}_confidence": pc, f"auc_{prefix}_minus_confidence": pa - pc}
    return statistic, point


def prepare_prediction(rows: pd.DataFrame, plan: Mapping) -> Prepared:
    rows, dropped = _signal_rows(rows)
    if (e := _empty(rows)) is not None:
        return e
    y = 1.0 - rows["correct"].to_numpy(float)
    statistic, point = _auc_pair(rows, y, "certificate")
    codes, n_units = _units(rows)
    sec = rows["confidence_secondary"].notna()
    details = {"auc_secondary_confidence": auc(-rows.loc[sec, "confidence_secondary"].to_numpy(float), y[sec.to_numpy()]),
               "dropped_missing_signal": dropped}
    counts = {"generations": int(len(rows)), "positives": int(y.sum()), "negatives": int(len(y) - y.sum())}
    return Prepared(statistic, codes, n_units, point, counts, details)


def prepare_attribution(rows: pd.DataFrame, plan: Mapping) -> Prepared:
    rows, dropped = _signal_rows(rows[rows["label"].isin(["induced", "inherent"])])
    if (e := _empty(rows)) is not None:
        return e
    y = (rows["label"] == "induced").to_numpy(float)
    statistic, point = _auc_pair(rows, y, "attribution")
    codes, n_units = _units(rows)
    counts = {"generations": int(len(rows)), "positives": int(y.sum()), "negatives": int(len(y) - y.sum())}
    return Prepared(statistic, codes, n_units, point, counts, {"dropped_missing_signal": dropped})


def prepare_escalation(rows: pd.DataFrame, plan: Mapping) -> Prepared:
    esc = plan["escalation"]
    budgets = sorted(float(b) for b in esc["budgets"])
    chain = ["unit", "model", "task", "target_tokens", "example_id", "condition", "method", "seed"]
    rows = rows[rows["budget"].isin(budgets) & rows["cert_signal"].notna()]
    if (e := _empty(rows)) is not None:
        return e
    chain_id = rows.groupby(chain, sort=True).ngroup().to_numpy()
    n_chains = int(chain_id.max()) + 1
    col = np.searchsorted(budgets, rows["budget"].to_numpy(float))
    cert = np.full((n_chains, len(budgets)), np.nan)
    corr = np.full((n_chains, len(budgets)), np.nan)
    cert[chain_id, col] = rows["cert_signal"].to_numpy(float)
    corr[chain_id, col] = rows["correct"].to_numpy(float)
    unit = np.empty(n_chains, dtype=object)
    unit[chain_id] = rows["unit"].to_numpy()
    complete = ~(np.isnan(cert).any(axis=1) | np.isnan(corr).any(axis=1))
    cert, corr, unit = cert[complete], corr[complete], unit[complete]
    if not len(cert):
        return _empty(rows.iloc[0:0])
    policy = Escalation(cert, corr, budgets, float(esc["threshold_quantile"]))
    codes, n_units = encode_units(unit)
    fixed = {f"{b:g}": float(corr[:, j].mean()) for j, b in enumerate(budgets)}
    details = {"budgets": budgets, "chains": int(len(cert)), "incomplete_chains": int((~complete).sum()),
               "fixed_accuracy": fixed}
    return Prepared(policy.evaluate, codes, n_units, {}, {"generations": int(len(cert))}, details)


def prepare_recompute(rows: pd.DataFrame, plan: Mapping) -> Prepared:
    rec = plan["recompute"]
    rate = float(rec["verdict_rate"])
    rates = sorted({float(r) for r in rec["gate_rates"]} | {rate})
    rows, dropped = _signal_rows(rows[rows["full_correct"].notna()])
    if (e := _empty(rows)) is not None:
        return e
    benefit = (rows["full_correct"] - rows["correct"]).to_numpy(float)
    gates = {"certificate": RecomputeGate(rows["cert_signal"].to_numpy(float), benefit),
             "confidence": RecomputeGate(-rows["confidence"].to_numpy(float), benefit)}
    codes, n_units = _units(rows)

    def statistic(w):
        out = {}
        cert, conf = gates["certificate"].gains(w, rates), gates["confidence"].gains(w, rates)
        for r in rates:
            gc, okc = cert[r]
            gf, okf = conf[r]
            gr, okr = random_gain(benefit, w, r)
            out[f"gain_certificate@{r:g}"] = (gc, okc)
            out[f"gain_confidence@{r:g}"] = (gf, okf)
            out[f"gain_random@{r:g}"] = (gr, okr)
            if r == rate:
                pos = okr & (gr > 0)
                out["gain_ratio_certificate_over_random"] = (np.where(pos, gc / np.where(pos, gr, 1.0), np.nan), pos)
                out["gain_certificate_minus_confidence"] = (gc - gf, okc & okf)
        return out

    counts = {"generations": int(len(rows)), "positives": int((benefit > 0).sum()), "negatives": int((benefit <= 0).sum())}
    details = {"rate": rate, "rates": rates, "dropped_missing_signal": dropped,
               "recoverable_fraction": float((benefit > 0).mean()) if len(rows) else None}
    return Prepared(statistic, codes, n_units, {}, counts, details)


#: statistic name → (source, preparation, which minimum counts apply)
STATISTICS: dict[str, tuple[str, Callable[[pd.DataFrame, Mapping], Prepared], tuple[str, ...]]] = {
    "coverage": ("replay", prepare_coverage, ("generations",)),
    **{f"{stat}_robust{k}": ("replay", prepare_coverage_robust, ("generations",))
       for stat in ("coverage", "coverage_anytime", "tightness") for k in ("", *(f"_{q}" for q in QUERY_KINDS))},
    "spearman": ("replay", prepare_spearman, ("generations",)),
    "induced_failure_rate": ("generations", prepare_induced, ("generations",)),
    "auc_certificate": ("generations", prepare_prediction, ("generations", "positives", "negatives")),
    "auc_certificate_minus_confidence": ("generations", prepare_prediction, ("generations", "positives", "negatives")),
    "escalation_gain": ("generations", prepare_escalation, ("generations",)),
    "auc_attribution": ("generations", prepare_attribution, ("generations", "positives", "negatives")),
    "auc_attribution_minus_confidence": ("generations", prepare_attribution, ("generations", "positives", "negatives")),
    "gain_ratio_certificate_over_random": ("generations", prepare_recompute, ("generations",)),
    "gain_certificate_minus_confidence": ("generations", prepare_recompute, ("generations",)),
}


def _preparation(spec: Mapping) -> tuple[str, Callable, tuple[str, ...]]:
    names = [t["statistic"] for t in spec["tests"]]
    unknown = [n for n in names if n not in STATISTICS]
    if unknown:
        raise ValueError(f"claims.yaml {spec['id']}: unknown statistic {unknown[0]!r}; known: {', '.join(STATISTICS)}")
    preps = {STATISTICS[n][1] for n in names}
    if len(preps) != 1:
        raise ValueError(f"claims.yaml {spec['id']}: the tests of one claim must come from one data set")
    return STATISTICS[names[0]]


def _bootstrap(prep: Prepared, plan: BootstrapPlan, names: list[str] = ()) -> dict[str, Estimate]:
    """The bootstrap of a prepared claim; statistics without data (no claim rows, or none of a named query kind)
    are NaN (every resample skipped)."""
    nan = float("nan")
    out = {} if prep.n_units == 0 else bootstrap(prep.statistic, prep.codes, prep.n_units, plan, point=prep.point)
    for n in names:
        out.setdefault(n, Estimate(n, nan, nan, nan, plan.level, plan.resamples, plan.resamples))
    return out


def evaluate_claim(
    spec: Mapping, analysis_plan: Mapping, scores: pd.DataFrame | None, replay: pd.DataFrame | None,
    tasks: list[str] | None = None,
) -> ClaimResult:
    """One claim of ``claims.yaml``: select its cells, bootstrap its tests, apply the verdict rules."""
    source, prepare, minimum_keys = _preparation(spec)
    plan = BootstrapPlan.from_plan(analysis_plan)
    minimum = analysis_plan.get("minimum_cell") or {}
    cells = spec.get("cells") or {}
    if source == "replay":
        rows, missing = select_replay(replay, cells)
    else:
        rows, missing = select_generations(scores if scores is not None else pd.DataFrame(), cells, tasks)
    reasons = [f"no data for cell {m}" for m in missing]
    prep = prepare(rows, analysis_plan)
    estimates = _bootstrap(prep, plan, [t["statistic"] for t in spec["tests"]])
    for key in minimum_keys:
        need = int(minimum.get(key, 0))
        have = int(prep.counts.get(key, 0))
        if have < need:
            what = "replay cells" if source == "replay" and key == "generations" else key
            reasons.append(f"{what}: {have} < the pre-registered minimum {need}")
    cells_ok = not reasons
    tests = []
    for t in spec["tests"]:
        est = estimates[t["statistic"]]
        outcome = test_outcome(est.ci_low, est.ci_high, t["op"], float(t["threshold"]), est.skipped_fraction)
        if est.skipped_fraction > 0.10 and prep.n_units:
            reasons.append(f"{t['statistic']}: {est.skipped}/{est.resamples} resamples undefined (> 10 %)")
        tests.append(TestResult(t["statistic"], t["op"], float(t["threshold"]), bool(t.get("ours", False)), est, outcome))
    verdict = claim_verdict([t.outcome for t in tests], cells_ok)
    if verdict == "inconclusive" and cells_ok and any(t.outcome == "unclear" for t in tests):
        reasons.append("an interval straddles its threshold" if not reasons else "a test is unclear")
    details = dict(prep.details)
    details["statistics"] = {name: e.to_dict() for name, e in estimates.items()}
    if source == "generations" and prep.n_units:
        details["by_model_length"] = _breakdown(rows, prepare, analysis_plan)
        if prepare in (prepare_prediction, prepare_attribution):
            names = list(estimates)
            details["by_length"] = {
                str(length): {n: e.to_dict() for n, e in _bootstrap(prepare(part, analysis_plan), plan, names).items()}
                for length, part in rows.groupby("target_tokens")
            }
    return ClaimResult(
        id=str(spec["id"]), statement=str(spec["statement"]), source=source, metric=str(spec.get("metric", "")),
        kill=str(spec.get("kill", "")), tests=tests, verdict=verdict, reasons=reasons,
        cell={**prep.counts, "minimum": {k: minimum.get(k) for k in minimum_keys}},
        paper=dict(spec.get("paper") or {}), details=details, beyond_paper=bool(spec.get("beyond_paper", False)),
    )


def _breakdown(rows: pd.DataFrame, prepare: Callable, analysis_plan: Mapping) -> list[dict]:
    """Point estimates per (model, target_tokens): the paper reports ranges over these."""
    out = []
    for (model, length), part in rows.groupby(["model", "target_tokens"]):
        prep = prepare(part, analysis_plan)
        if not prep.n_units:
            out.append({"model": model, "target_tokens": int(length), **prep.counts})
            continue
        at_one = prep.statistic(np.ones((1, len(prep.codes))))
        values = {n: (prep.point[n] if n in prep.point else (float(v[0]) if bool(ok[0]) else None))
                  for n, (v, ok) in at_one.items()}
        out.append({"model": model, "target_tokens": int(length), **prep.counts,
                    **{n: (None if v is None or not np.isfinite(v) else float(v)) for n, v in values.items()}})
    return out


def evaluate_claims(
    claims_doc: Mapping, scores: pd.DataFrame | None, replay: pd.DataFrame | None, tasks: list[str] | None = None
) -> list[ClaimResult]:
    """Every claim of a parsed ``claims.yaml``, in order."""
    plan = claims_doc["analysis_plan"]
    return [evaluate_claim(spec, plan, scores, replay, tasks) for spec in claims_doc["claims"]]


def main_tasks(grid: Mapping | None) -> list[str] | None:
    """The tasks of a design grid's main cell (its ``tasks`` keys); None = every task."""
    if not grid or "tasks" not in grid:
        return None
    return list(grid["tasks"])
