"""The pre-registered claims (``preregistration/claims.yaml``: the paper's seven and this project's
C8), computed as stated.

Every claim is read from ``claims.yaml``: its cells, its tests (statistic, operator,
threshold), its placebos and the paper's outcome; the analysis choices from
``analysis_plan``. The statistics (names as in ``claims.yaml``; the method is described
in ``docs/design.md``, "The claims and their tests"):

* ``coverage`` (C1) — fraction of replay draws × queries with ‖ô − o‖ ≤ ε_δ, pooled over
  the replay cells of the claim's budgets and query kinds (per kind reported beside it,
  and the anytime radius's coverage as what it claims: the share of draws whose every
  step of the path is covered, ``coverage_anytime``, beside its per-step mean).
* ``spearman_within_cell`` (C2) — the median, over cells of one step (example, layer,
  head, budget, kind, step), of Spearman(ε_δ, ‖ô − o‖) across the cell's draws
  (:func:`kvcert.analysis.replay_stats.step_cell_spearman`): does the radius rank the
  draws' errors? The pooled ``spearman`` over all draws (the paper's statistic: it mixes
  cells whose scales differ by orders of magnitude) is reported beside it.
* ``coverage_robust_<kind>``, ``tightness_robust_<kind>`` (C8, this project's claim) —
  the same coverage, and the median ε_R/‖ô − o‖, of the robust certificate
  (:func:`kvcert.certificate.robust_radius`) on the replay cells of one query kind;
  ``coverage_robust_later_worst_cell`` the smallest later-query coverage of a budget ×
  layer cell; ``coverage_robust_diverged`` the coverage on sample-dependent rows whose
  compressed run fed other tokens than the full run (``unexercised`` below
  ``analysis_plan.replay.minimum_diverged_decodes`` such decodes).
* ``induced_failure_rate`` (C3) — among compressed runs whose full-cache run is
  correct, the fraction that fail.
* ``auc_certificate_stratified`` and ``…_minus_confidence`` (C4) — the AUC of the
  certificate signal for failure (score < pass mark) over the (failed, correct) pairs of
  one stratum (``analysis_plan.strata``: model × task × condition × budget × length ×
  method; :class:`kvcert.analysis.stats.StratifiedAUCIndex`), and its paired difference
  with −mean_logprob's on the same pairs. The pooled ``auc_certificate`` (the paper's
  statistic) is reported beside it.
* ``escalation_gain`` (C5) — :class:`kvcert.analysis.gating.Escalation`.
* ``auc_attribution_stratified`` and ``…_minus_confidence`` (C6) — among failed
  compressed runs, the same stratified AUC for cache-induced vs inherent; pooled beside.
* ``gain_ratio_certificate_over_random_stratified``, ``gain_certificate_minus_confidence_stratified``
  (C7) — :class:`kvcert.analysis.gating.StratifiedRecomputeGate` at
  ``recompute.verdict_rate``: every stratum recomputes the same share of its runs (the
  pooled gate and the curve over ``gate_rates`` are reported beside it). A resample with
  no expected random gain leaves the ratio undefined and is skipped.

**Placebos** (``analysis_plan.placebos``): each claim's tests are run again, by this very
code, on its data with the signal replaced by one that carries no draw- or run-level
information — the stratum's base rate of the claim's outcome and a random score for the
generation claims, each step cell's median radius and the radii permuted within each step
cell for the replay claims. A claim whose tests pass is *uninformative* when a placebo's
tests all pass too (:func:`kvcert.analysis.stats.claim_verdict`).

**Monte-Carlo stability**: the verdict (placebos included) is recomputed under
``bootstrap.stability_seeds`` other bootstrap seeds; ``seed_stability`` reports the share
that agrees with the registered seed's verdict.

Generation claims use the scored grid rows (:func:`kvcert.analysis.load.scored`) of the
experiment's main tasks (the grid's ``tasks``; the multi-turn and LoCoMo cells are
reported separately), restricted to the claim's conditions, budgets and methods (a
method name matches the record's ``sampler`` or ``method``). Intervals: the unit
bootstrap of :mod:`kvcert.analysis.stats` (examples; replay cells for C1, C2, C8), paired
across the tests of a claim. Minimum cell (``analysis_plan.minimum_cell``): the claim's
rows must number at least ``generations`` (replay: that many replay cells), and for the
AUC claims the two classes (C4: failures / successes; C6: induced / inherent) in the
strata that hold both at least ``positives`` / ``negatives``; every condition × budget ×
method named by the claim must be present. Otherwise the claim is inconclusive whatever
its interval says.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import product
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from .gating import Escalation, RecomputeGate, StratifiedRecomputeGate, random_gain
from .load import scored
from .replay_stats import (
    CELL_KEY, PATH_KEY, QUERY_KINDS, STEP_CELL_KEY, VARIANTS, log_tightness, simultaneous_anytime,
    step_cell_spearman, within_cell_spearman, within_head_spearman,
)
from .stats import (
    AUCIndex, BootstrapPlan, Estimate, SpearmanIndex, StratifiedAUCIndex, auc, bootstrap, claim_verdict, encode_units,
    spearman, stratified_auc, test_outcome, weighted_mean, weighted_quantile,
)

#: draws used for the bootstrap of the replay Spearman (the point estimate uses all)
MAX_SPEARMAN_BOOTSTRAP_OBS = 50_000
#: resamples of the statistics reported beside the tests (at most; the tests use ``bootstrap.resamples``)
BESIDE_RESAMPLES = 1000


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

    placebo: dict = field(default_factory=dict)
    seed_stability: dict = field(default_factory=dict)
    cells: dict = field(default_factory=dict)  # the registered cells (claims.yaml) the claim's rows come from

    def to_dict(self) -> dict:
        p = self.primary
        return {
            "id": self.id, "statement": self.statement, "source": self.source, "metric": self.metric,
            "kill": self.kill, "statistic": p.statistic, "value": p.estimate.to_dict()["estimate"],
            "ci": p.estimate.to_dict()["ci"], "ci_level": p.estimate.level, "op": p.op, "threshold": p.threshold,
            "verdict": self.verdict, "reasons": self.reasons, "tests": [t.to_dict() for t in self.tests],
            "placebo": self.placebo, "seed_stability": self.seed_stability,
            "cell": self.cell, "cells": self.cells, "paper": self.paper, "details": self.details,
            "beyond_paper": self.beyond_paper,
        }


@dataclass
class Prepared:
    """A claim's data made ready: the statistic on weights, units, point estimates, cell counts.

    ``unexercised``: {statistic: why} for tests whose data lack the rows they need.
    ``beside``: statistics reported beside the tests (not tested), bootstrapped once at the
    registered seed on units of their own (e.g. the pooled Spearman over every draw).
    ``selective``: ``statistic(w, only)`` computes only the statistics named in ``only`` (the
    tests, for the placebos and the stability seeds; None = all).
    """

    statistic: Callable[[np.ndarray], Mapping[str, tuple[np.ndarray, np.ndarray]]]
    codes: np.ndarray
    n_units: int
    point: dict[str, float]
    counts: dict[str, int]
    details: dict = field(default_factory=dict)
    unexercised: dict[str, str] = field(default_factory=dict)
    beside: "Prepared | None" = None
    selective: bool = False


# --- cell selection -------------------------------------------------------------------------
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
    lr = log_tightness(rows, radius)
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


def _ratio(w: np.ndarray, num: np.ndarray, den: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = w @ den
    ok = d > 0
    return np.where(ok, (w @ num) / np.where(ok, d, 1.0), np.nan), ok


def diverged_decodes(rows: pd.DataFrame) -> int:
    """How many compressed decodes (model × example × budget × draw) fed another token than the full run."""
    d = rows[(rows["query_kind"] == "sample_dependent") & rows["diverged"].astype(bool)]
    return int(d.groupby(["model", "example_id", "budget", "draw"], observed=True).ngroups) if len(d) else 0


def prepare_coverage(rows: pd.DataFrame, plan: Mapping, variant: str = "plugin") -> Prepared:
    """Coverage of one certificate (``variant``: "plugin" or "robust", :data:`kvcert.analysis.replay_stats.VARIANTS`).

    Per step (``coverage``, by kind), anytime = simultaneous over a draw's path
    (``coverage_anytime``: each path is counted in the cell of its decode kind), the
    per-step mean of the anytime radius (``coverage_anytime_step``) and the median
    ε/error (``tightness``), by kind too; robust names carry ``_robust``. Beside them the
    smallest later-query coverage of a budget × layer cell (``coverage_later_worst_cell``)
    and the coverage on the sample-dependent rows whose compressed run diverged from the
    full run (``coverage_diverged``; unexercised below ``replay.minimum_diverged_decodes``).
    """
    if (e := _empty(rows)) is not None:
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
    later_cells = cell.loc[kinds == "later", ["budget", "layer"]]
    worst_groups = [((cell["budget"] == b) & (cell["layer"] == layer) & (kinds == "later")).to_numpy(float)
                    for b, layer in later_cells.drop_duplicates().itertuples(index=False)]
    lr, hist = _tightness_hist(rows, codes, len(cell), radius)

    def worst(w):
        per = [_ratio(w, hits * g, n * g) for g in worst_groups]
        ok = np.stack([o for _, o in per], 1).all(axis=1)
        vals = np.stack([np.where(o, v, np.inf) for v, o in per], 1).min(axis=1)
        return np.where(ok, vals, np.nan), ok

    # name → how to compute it from the resample weights (evaluated only when asked for)
    recipes = {f"coverage{sfx}": lambda w: _ratio(w, hits, n),
               f"coverage_anytime{sfx}": lambda w: _ratio(w, path_hits, path_n),
               f"coverage_anytime_step{sfx}": lambda w: _ratio(w, hits_any, n),
               f"tightness{sfx}": lambda w: _weighted_median_ratio(w, hist),
               f"coverage{sfx}_diverged": lambda w: _ratio(w, hits_div, n_div)}
    for k in np.unique(kinds):
        m = (kinds == k).astype(float)
        recipes[f"coverage{sfx}_{k}"] = lambda w, m=m: _ratio(w, hits * m, n * m)
        recipes[f"coverage_anytime_step{sfx}_{k}"] = lambda w, m=m: _ratio(w, hits_any * m, n * m)
        recipes[f"tightness{sfx}_{k}"] = lambda w, m=m: _weighted_median_ratio(w * m, hist)
        if path_n[kinds == k].sum() > 0:
            recipes[f"coverage_anytime{sfx}_{k}"] = lambda w, m=m: _ratio(w, path_hits * m, path_n * m)
    if worst_groups:
        recipes[f"coverage{sfx}_later_worst_cell"] = worst

    def statistic(w, only=None):
        return {name: f(w) for name, f in recipes.items() if only is None or name in only}

    row_kinds = rows["query_kind"].to_numpy()
    point = {f"tightness{sfx}": float(10 ** np.nanmedian(lr)) if np.isfinite(lr).any() else float("nan")}
    for k in np.unique(kinds):
        sel = lr[(row_kinds == k) & np.isfinite(lr)]
        point[f"tightness{sfx}_{k}"] = float(10 ** np.median(sel)) if sel.size else float("nan")
    per_cell = hits / np.where(n > 0, n, 1)
    nominal = 1.0 - float(plan["delta"])
    decodes = diverged_decodes(rows)
    need = int((plan.get("replay") or {}).get("minimum_diverged_decodes", 0))
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
                    unexercised, selective=True)


def prepare_coverage_robust(rows: pd.DataFrame, plan: Mapping) -> Prepared:
    """:func:`prepare_coverage` of the robust certificate (claim C8)."""
    return prepare_coverage(rows, plan, "robust")


def _pooled_spearman(rows: pd.DataFrame) -> Prepared:
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
    return Prepared(lambda w: {"spearman": index(w)}, codes, n_cells, point, {}, {"bootstrap_subsample": subsample})


def prepare_spearman(rows: pd.DataFrame, plan: Mapping) -> Prepared:
    """C2: the median over step cells of the within-cell Spearman (:func:`step_cell_spearman`), bootstrapped over
    replay cells (a step cell weighs what its replay cell draws); the pooled Spearman beside it."""
    if (e := _empty(rows)) is not None:
        return e
    codes = rows.groupby(CELL_KEY, sort=True, observed=True).ngroup().to_numpy()
    n_cells = int(codes.max()) + 1
    values, first = step_cell_spearman(rows)
    cell_of = codes[first]  # the records of this statistic are the step cells, each in its replay cell's unit

    def statistic(w):
        if not values.size:
            return {"spearman_within_cell": (np.full(w.shape[0], np.nan), np.zeros(w.shape[0], dtype=bool))}
        return {"spearman_within_cell": (weighted_quantile(values, 0.5, w), w.sum(axis=1) > 0)}

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
                    beside=_pooled_spearman(rows))


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


#: the strata of the stratified statistics when ``analysis_plan.strata`` names none
DEFAULT_STRATA = ("model", "task", "condition", "budget", "target_tokens", "method")


def strata_codes(rows: pd.DataFrame, plan: Mapping) -> np.ndarray:
    """The stratum of every row (``analysis_plan.strata``: the columns a run's stratum is made of)."""
    cols = list(plan.get("strata") or DEFAULT_STRATA)
    missing = [c for c in cols if c not in rows.columns]
    if missing:
        raise ValueError(f"analysis_plan.strata: the scores have no column {missing[0]!r}")
    if rows.empty:
        return np.zeros(0, dtype=np.int64)
    return rows.groupby(cols, sort=True, observed=True, dropna=False).ngroup().to_numpy().astype(np.int64)


def _auc_pair(rows: pd.DataFrame, y: np.ndarray, prefix: str, strata: np.ndarray) -> tuple[Callable, dict, dict]:
    """The certificate's and the confidence's AUC, pooled and within strata, and their paired differences."""
    cert = rows["cert_signal"].to_numpy(float)
    conf = -rows["confidence"].to_numpy(float)
    a, c = AUCIndex(cert, y), AUCIndex(conf, y)
    sa, sc = StratifiedAUCIndex(cert, y, strata), StratifiedAUCIndex(conf, y, strata)
    strat = f"{prefix}_stratified"

    def statistic(w, only=None):
        out = {}
        for name, (ic, io) in ((prefix, (a, c)), (strat, (sa, sc))):
            if only is not None and not any(n.startswith(f"auc_{name}") and (name == strat or "stratified" not in n)
                                            for n in only):
                continue
            va, oka = ic(w)
            vc, okc = io(w)
            out[f"auc_{name}"] = (va, oka)
            out[f"auc_{name}_confidence"] = (vc, okc)
            out[f"auc_{name}_minus_confidence"] = (va - vc, oka & okc)
        return out

    pa, pc = auc(cert, y), auc(conf, y)
    (qa, used, dropped), (qc, _, _) = stratified_auc(cert, y, strata), stratified_auc(conf, y, strata)
    point = {f"auc_{prefix}": pa, f"auc_{prefix}_confidence": pc, f"auc_{prefix}_minus_confidence": pa - pc,
             f"auc_{strat}": qa, f"auc_{strat}_confidence": qc, f"auc_{strat}_minus_confidence": qa - qc}
    both = pd.Series(y).groupby(strata).agg(["sum", "size"])
    informative = (both["sum"] > 0) & (both["sum"] < both["size"])
    counts = {"positives": int(both.loc[informative, "sum"].sum()),
              "negatives": int((both.loc[informative, "size"] - both.loc[informative, "sum"]).sum())}
    info = {"strata_used": used, "strata_dropped": dropped, "pooled_positives": int(y.sum()),
            "pooled_negatives": int(len(y) - y.sum())}
    return statistic, point, {"counts": counts, "strata": info}


def _by_stratum(rows: pd.DataFrame, y: np.ndarray, strata: np.ndarray, plan: Mapping) -> list[dict]:
    """Per stratum: its key, class counts and the certificate's and the confidence's AUC (where both classes occur)."""
    cols = list(plan.get("strata") or DEFAULT_STRATA)
    cert, conf = rows["cert_signal"].to_numpy(float), -rows["confidence"].to_numpy(float)
    out = []
    for code in np.unique(strata):
        m = strata == code
        first = rows.iloc[int(np.flatnonzero(m)[0])]
        out.append({**{c: (first[c].item() if hasattr(first[c], "item") else first[c]) for c in cols},
                    "n": int(m.sum()), "positives": int(y[m].sum()), "auc": auc(cert[m], y[m]),
                    "auc_confidence": auc(conf[m], y[m])})
    return out


def _prepare_auc(rows: pd.DataFrame, y: np.ndarray, prefix: str, plan: Mapping, dropped: int) -> Prepared:
    strata = strata_codes(rows, plan)
    statistic, point, info = _auc_pair(rows, y, prefix, strata)
    codes, n_units = _units(rows)
    counts = {"generations": int(len(rows)), **info["counts"]}
    details = {"dropped_missing_signal": dropped, "strata": info["strata"],
               "by_stratum": _by_stratum(rows, y, strata, plan)}
    return Prepared(statistic, codes, n_units, point, counts, details, selective=True)


def prepare_prediction(rows: pd.DataFrame, plan: Mapping) -> Prepared:
    rows, dropped = _signal_rows(rows)
    if (e := _empty(rows)) is not None:
        return e
    y = 1.0 - rows["correct"].to_numpy(float)
    prep = _prepare_auc(rows, y, "certificate", plan, dropped)
    sec = rows["confidence_secondary"].notna()
    prep.details["auc_secondary_confidence"] = auc(-rows.loc[sec, "confidence_secondary"].to_numpy(float),
                                                   y[sec.to_numpy()])
    return prep


def prepare_attribution(rows: pd.DataFrame, plan: Mapping) -> Prepared:
    rows, dropped = _signal_rows(rows[rows["label"].isin(["induced", "inherent"])])
    if (e := _empty(rows)) is not None:
        return e
    y = (rows["label"] == "induced").to_numpy(float)
    return _prepare_auc(rows, y, "attribution", plan, dropped)


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
    """C7 at matched recompute rates: the stratified gates (every stratum recomputes the same share, the tests),
    and the pooled gates beside them (the paper's)."""
    rec = plan["recompute"]
    rate = float(rec["verdict_rate"])
    rates = sorted({float(r) for r in rec["gate_rates"]} | {rate})
    rows, dropped = _signal_rows(rows[rows["full_correct"].notna()])
    if (e := _empty(rows)) is not None:
        return e
    benefit = (rows["full_correct"] - rows["correct"]).to_numpy(float)
    strata = strata_codes(rows, plan)
    cert, conf = rows["cert_signal"].to_numpy(float), -rows["confidence"].to_numpy(float)
    gates = {"": (RecomputeGate(cert, benefit), RecomputeGate(conf, benefit)),
             "_stratified": (StratifiedRecomputeGate(cert, benefit, strata),
                             StratifiedRecomputeGate(conf, benefit, strata))}
    codes, n_units = _units(rows)

    def statistic(w, only=None):
        out = {}
        for sfx, (gc_, gf_) in gates.items():
            if only is not None and not any(n.endswith(sfx) and (sfx or not n.endswith("_stratified")) for n in only):
                continue
            at = rates if only is None else [rate]
            cert_g, conf_g = gc_.gains(w, at), gf_.gains(w, at)
            for r in at:
                gc, okc = cert_g[r]
                gf, okf = conf_g[r]
                gr, okr = random_gain(benefit, w, r)
                out[f"gain_certificate{sfx}@{r:g}"] = (gc, okc)
                out[f"gain_confidence{sfx}@{r:g}"] = (gf, okf)
                if not sfx:
                    out[f"gain_random@{r:g}"] = (gr, okr)
                if r == rate:
                    pos = okr & (gr > 0)
                    out[f"gain_ratio_certificate_over_random{sfx}"] = (np.where(pos, gc / np.where(pos, gr, 1.0),
                                                                                np.nan), pos)
                    out[f"gain_certificate_minus_confidence{sfx}"] = (gc - gf, okc & okf)
        return out

    counts = {"generations": int(len(rows)), "positives": int((benefit > 0).sum()), "negatives": int((benefit <= 0).sum())}
    details = {"rate": rate, "rates": rates, "dropped_missing_signal": dropped, "strata_count": int(np.unique(strata).size),
               "recoverable_fraction": float((benefit > 0).mean()) if len(rows) else None}
    return Prepared(statistic, codes, n_units, {}, counts, details, selective=True)


# --- what a claim's tests are computed from ------------------------------------------------------
def _prediction_outcome(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    return 1.0 - rows["correct"].to_numpy(float), np.ones(len(rows), dtype=bool)


def _attribution_outcome(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    return (rows["label"] == "induced").to_numpy(float), rows["label"].isin(["induced", "inherent"]).to_numpy()


def _recompute_outcome(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    return (rows["full_correct"] - rows["correct"]).to_numpy(float), rows["full_correct"].notna().to_numpy()


@dataclass(frozen=True)
class Kind:
    """How a family of statistics is computed: its data set, its preparation, the minimum counts that apply,
    and, for the generation claims, the outcome whose stratum base rate is its placebo score (None: the
    statistic reads no signal, so no placebo applies)."""

    source: str
    prepare: Callable[[pd.DataFrame, Mapping], Prepared]
    minimum: tuple[str, ...]
    outcome: Callable[[pd.DataFrame], tuple[np.ndarray, np.ndarray]] | None = None


_COVERAGE = Kind("replay", prepare_coverage, ("generations",))
_COVERAGE_ROBUST = Kind("replay", prepare_coverage_robust, ("generations",))
_SPEARMAN = Kind("replay", prepare_spearman, ("generations",))
_AUC_COUNTS = ("generations", "positives", "negatives")
_PREDICTION = Kind("generations", prepare_prediction, _AUC_COUNTS, _prediction_outcome)
_ATTRIBUTION = Kind("generations", prepare_attribution, _AUC_COUNTS, _attribution_outcome)
_RECOMPUTE = Kind("generations", prepare_recompute, ("generations",), _recompute_outcome)

#: statistic name → how it is computed (claims.yaml's tests may name any of these)
STATISTICS: dict[str, Kind] = {
    **{f"coverage{k}": _COVERAGE for k in ("", "_later_worst_cell", "_diverged", *(f"_{q}" for q in QUERY_KINDS))},
    **{f"{stat}_robust{k}": _COVERAGE_ROBUST
       for stat in ("coverage", "coverage_anytime", "tightness") for k in ("", *(f"_{q}" for q in QUERY_KINDS))},
    "coverage_robust_later_worst_cell": _COVERAGE_ROBUST,
    "coverage_robust_diverged": _COVERAGE_ROBUST,
    "spearman_within_cell": _SPEARMAN,
    "induced_failure_rate": Kind("generations", prepare_induced, ("generations",)),
    **{f"auc_certificate{s}{d}": _PREDICTION for s in ("", "_stratified") for d in ("", "_minus_confidence")},
    "escalation_gain": Kind("generations", prepare_escalation, ("generations",), _prediction_outcome),
    **{f"auc_attribution{s}{d}": _ATTRIBUTION for s in ("", "_stratified") for d in ("", "_minus_confidence")},
    **{f"{name}{s}": _RECOMPUTE for s in ("", "_stratified")
       for name in ("gain_ratio_certificate_over_random", "gain_certificate_minus_confidence")},
}


def _kind(spec: Mapping) -> Kind:
    names = [t["statistic"] for t in spec["tests"]]
    unknown = [n for n in names if n not in STATISTICS]
    if unknown:
        raise ValueError(f"claims.yaml {spec['id']}: unknown statistic {unknown[0]!r}; known: {', '.join(STATISTICS)}")
    kinds = {STATISTICS[n] for n in names}
    if len(kinds) != 1:
        raise ValueError(f"claims.yaml {spec['id']}: the tests of one claim must come from one data set")
    return kinds.pop()


def _bootstrap(prep: Prepared, plan: BootstrapPlan, names: list[str] = (), only: bool = False) -> dict[str, Estimate]:
    """The bootstrap of a prepared claim; statistics without data (no claim rows, or none of a named query kind)
    are NaN (every resample skipped). ``only``: compute just ``names`` where the preparation can."""
    nan = float("nan")
    fn = (lambda w: prep.statistic(w, set(names))) if only and prep.selective else prep.statistic
    out = {} if prep.n_units == 0 else bootstrap(fn, prep.codes, prep.n_units, plan, point=prep.point)
    for n in names:
        out.setdefault(n, Estimate(n, nan, nan, nan, plan.level, plan.resamples, plan.resamples))
    return out


# --- placebos ------------------------------------------------------------------------------------
#: the radius columns a replay placebo replaces, each with the coverage column decided from it
RADIUS_COLUMNS = (("radius", "covered"), ("anytime_radius", "covered_anytime"), ("radius_robust", "covered_robust"),
                  ("anytime_radius_robust", "covered_anytime_robust"))

#: placebo name → what it is (the report's words)
PLACEBOS = {
    "stratum_base_rate": "the signal replaced by the claim's outcome rate in the run's stratum "
                         "(model × task × condition × budget × length × method): it knows the cell, not the run",
    "random_score": "the signal replaced by a uniform random number per run",
    "step_cell_median_radius": "every radius replaced by the median radius of its step cell "
                               "(example × layer × head × budget × kind × step): it knows the cell, not the draw",
    "step_cell_permuted_radius": "the radii permuted among the draws of each step cell (a draw keeps a radius "
                                 "of its cell, not its own)",
}
DEFAULT_PLACEBOS = {"generations": ["stratum_base_rate", "random_score"],
                    "replay": ["step_cell_median_radius", "step_cell_permuted_radius"]}


def _placebo_rng(analysis_plan: Mapping, claim: str, name: str) -> np.random.Generator:
    seed = int((analysis_plan.get("placebos") or {}).get("seed", 0))
    return np.random.default_rng([seed, sum(map(ord, claim)), sum(map(ord, name))])


#: what names one row of a claim, whichever stage made it: a generation record's key (a multi-turn
#: unit included) or a replay draw at one step; the columns a table lacks are left out
ROW_KEY = ["model", "task", "target_tokens", "example_id", "unit", "condition", "method", "scorer", "sampler",
           "allocation", "budget", "seed", "layer", "head", "query_kind", "step", "draw"]


def keyed_uniforms(rows: pd.DataFrame, rng: np.random.Generator) -> np.ndarray:
    """One uniform in [0, 1) per row, a function of the row's key (:data:`ROW_KEY`) and one draw of
    ``rng`` (the placebo's registered seed), not of the row's position: the placebos come out the
    same whatever order the shards or replay tables were read in."""
    key = [c for c in ROW_KEY if c in rows.columns]
    hashed = pd.util.hash_pandas_object(rows[key].astype(str), index=False).to_numpy(np.uint64)
    x = hashed ^ np.uint64(rng.integers(0, 2**63))
    with np.errstate(over="ignore"):  # splitmix64's finaliser: the key's hash spread over all 64 bits
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53


def placebo_rows(rows: pd.DataFrame, name: str, kind: Kind, analysis_plan: Mapping,
                 rng: np.random.Generator) -> pd.DataFrame:
    """The claim's rows with its signal replaced by placebo ``name`` (:data:`PLACEBOS`)."""
    out = rows.copy()
    if name in ("stratum_base_rate", "random_score"):
        present = rows["cert_signal"].notna().to_numpy()
        if name == "random_score":
            score = keyed_uniforms(rows, rng)
        else:
            y, defined = kind.outcome(rows)
            strata = strata_codes(rows, analysis_plan)
            rate = pd.Series(np.where(defined & present, y, np.nan)).groupby(strata).mean()
            score = rate.reindex(strata).fillna(0.0).to_numpy()
        out["cert_signal"] = np.where(present, score, np.nan)
        return out
    if name not in ("step_cell_median_radius", "step_cell_permuted_radius"):
        raise ValueError(f"analysis_plan.placebos: unknown placebo {name!r}; known: {', '.join(PLACEBOS)}")
    if rows.empty:
        return out
    cells = rows.groupby(STEP_CELL_KEY, observed=True, sort=False).ngroup().to_numpy()
    error = rows["error"].to_numpy(float)
    if name == "step_cell_permuted_radius":
        # within each cell, the draws in one keyed order receive the radii of the draws in another
        by_cell = np.lexsort((keyed_uniforms(rows, rng), cells))
        shuffled = np.lexsort((keyed_uniforms(rows, rng), cells))
    for radius, covered in RADIUS_COLUMNS:
        values = rows[radius].to_numpy(float)
        if name == "step_cell_median_radius":
            new = pd.Series(values).groupby(cells).transform("median").to_numpy()
        else:
            new = np.empty_like(values)
            new[by_cell] = values[shuffled]
        out[radius] = new
        out[covered] = error <= new
    return out


# --- verdicts ------------------------------------------------------------------------------------
@dataclass
class Decision:
    """A claim's tests decided at one bootstrap seed."""

    tests: list[TestResult]
    cells_ok: bool
    reasons: list[str]
    estimates: dict[str, Estimate]

    @property
    def outcomes(self) -> list[str]:
        return [t.outcome for t in self.tests]

    def verdict(self, placebo_holds: bool = False) -> str:
        return claim_verdict(self.outcomes, self.cells_ok, placebo_holds)


def decide(spec: Mapping, kind: Kind, prep: Prepared, plan: BootstrapPlan, minimum: Mapping,
           missing: Sequence[str] = (), tests_only: bool = False) -> Decision:
    """Bootstrap a prepared claim's tests at ``plan``'s seed and apply the verdict rules (without placebos);
    ``tests_only``: compute the tests' statistics alone (the placebos, the stability seeds)."""
    reasons = [f"no data for cell {m}" for m in missing]
    estimates = _bootstrap(prep, plan, [t["statistic"] for t in spec["tests"]], only=tests_only)
    for key in kind.minimum:
        need = int(minimum.get(key, 0))
        have = int(prep.counts.get(key, 0))
        if have < need:
            what = "replay cells" if kind.source == "replay" and key == "generations" else key
            reasons.append(f"{what}: {have} < the pre-registered minimum {need}")
    cells_ok = not reasons
    tests = []
    for t in spec["tests"]:
        est = estimates[t["statistic"]]
        if t["statistic"] in prep.unexercised:
            outcome = "unexercised"
            reasons.append(f"{t['statistic']}: unexercised ({prep.unexercised[t['statistic']]})")
        else:
            outcome = test_outcome(est.ci_low, est.ci_high, t["op"], float(t["threshold"]), est.skipped_fraction)
        if est.skipped_fraction > 0.10 and prep.n_units and outcome != "unexercised":
            reasons.append(f"{t['statistic']}: {est.skipped}/{est.resamples} resamples undefined (> 10 %)")
        tests.append(TestResult(t["statistic"], t["op"], float(t["threshold"]), bool(t.get("ours", False)), est, outcome))
    decision = Decision(tests, cells_ok, reasons, estimates)
    if decision.verdict() == "inconclusive" and cells_ok and "unclear" in decision.outcomes:
        reasons.append("an interval straddles its threshold" if len(reasons) == 0 else "a test is unclear")
    return decision


def placebo_names(spec: Mapping, kind: Kind, analysis_plan: Mapping) -> list[str]:
    """The placebos a claim is scored with (``analysis_plan.placebos.<source>``; none for a statistic that reads
    no signal, e.g. the induced-failure rate)."""
    if kind.source == "generations" and kind.outcome is None:
        return []
    registered = (analysis_plan.get("placebos") or {}).get(kind.source)
    return list(DEFAULT_PLACEBOS[kind.source] if registered is None else registered)


def _placebo_block(spec: Mapping, names: Sequence[str], decisions: Mapping[str, Decision], kind: Kind) -> dict:
    if not names:
        return {"applicable": False, "statistic": None, "verdict": None, "passes": False,
                "reason": "the statistic reads no signal (it measures the damage of eviction itself): nothing to "
                          "replace by a placebo", "placebos": []}
    blocks = []
    for name in names:
        d = decisions[name]
        blocks.append({
            "kind": name, "description": PLACEBOS[name], "verdict": d.verdict(),
            "statistic": {t.statistic: {**t.estimate.to_dict(), "outcome": t.outcome} for t in d.tests},
            "reasons": d.reasons,
        })
    held = [b for b in blocks if b["verdict"] == "holds"]
    lead = held[0] if held else blocks[0]
    return {"applicable": True, "kind": lead["kind"], "statistic": lead["statistic"], "verdict": lead["verdict"],
            "passes": bool(held), "placebos": blocks}


def evaluate_claim(
    spec: Mapping, analysis_plan: Mapping, scores: pd.DataFrame | None, replay: pd.DataFrame | None,
    tasks: list[str] | None = None, stability: bool = True,
) -> ClaimResult:
    """One claim of ``claims.yaml``: select its cells, bootstrap its tests, score its placebos with the same
    tests, apply the verdict rules, and (``stability``) redo all of it under the registered other seeds."""
    kind = _kind(spec)
    plan = BootstrapPlan.from_plan(analysis_plan)
    minimum = analysis_plan.get("minimum_cell") or {}
    cells = spec.get("cells") or {}
    if kind.source == "replay":
        rows, missing = select_replay(replay, cells)
    else:
        rows, missing = select_generations(scores if scores is not None else pd.DataFrame(), cells, tasks)
    prep = kind.prepare(rows, analysis_plan)
    main = decide(spec, kind, prep, plan, minimum, missing)
    names = placebo_names(spec, kind, analysis_plan)
    placebo_preps = {n: kind.prepare(placebo_rows(rows, n, kind, analysis_plan, _placebo_rng(analysis_plan, spec["id"], n)),
                                     analysis_plan) for n in names}
    placebo_decisions = {n: decide(spec, kind, p, plan, minimum, missing, True) for n, p in placebo_preps.items()}
    placebo = _placebo_block(spec, names, placebo_decisions, kind)
    verdict = main.verdict(placebo["passes"])
    reasons = list(main.reasons)
    if verdict == "uninformative":
        reasons.append(f"a placebo ({placebo['kind']}: {PLACEBOS[placebo['kind']]}) passes the same tests")
    seed_stability = _seed_stability(spec, kind, prep, placebo_preps, plan, minimum, missing, verdict,
                                     analysis_plan) if stability else {}
    estimates = dict(main.estimates)
    if prep.beside is not None:  # reported, not tested: a coarser interval is enough
        estimates.update(_bootstrap(prep.beside, replace(plan, resamples=min(plan.resamples, BESIDE_RESAMPLES))))
    details = dict(prep.details)
    details["statistics"] = {name: e.to_dict() for name, e in estimates.items()}
    if kind.source == "generations" and prep.n_units:
        details["by_model_length"] = _breakdown(rows, kind.prepare, analysis_plan)
        if kind.prepare in (prepare_prediction, prepare_attribution):
            names_ = list(main.estimates)
            details["by_length"] = {
                str(length): {n: e.to_dict() for n, e in _bootstrap(kind.prepare(part, analysis_plan), plan,
                                                                    names_).items()}
                for length, part in rows.groupby("target_tokens")
            }
    return ClaimResult(
        id=str(spec["id"]), statement=str(spec["statement"]), source=kind.source, metric=str(spec.get("metric", "")),
        kill=str(spec.get("kill", "")), tests=main.tests, verdict=verdict, reasons=reasons,
        cell={**prep.counts, "minimum": {k: minimum.get(k) for k in kind.minimum}},
        paper=dict(spec.get("paper") or {}), details=details, beyond_paper=bool(spec.get("beyond_paper", False)),
        placebo=placebo, seed_stability=seed_stability, cells=dict(cells),
    )


def stability_seeds(analysis_plan: Mapping) -> list[int]:
    """The other bootstrap seeds of the stability check: the registered seed + 1, …, + ``stability_seeds``."""
    b = analysis_plan.get("bootstrap") or {}
    return [int(b.get("seed", 0)) + k for k in range(1, int(b.get("stability_seeds", 0)) + 1)]


def _seed_stability(spec, kind, prep, placebo_preps, plan, minimum, missing, verdict, analysis_plan) -> dict:
    """The verdict, placebos included, under each of :func:`stability_seeds`: the share that agrees."""
    seeds = stability_seeds(analysis_plan)
    if not seeds:
        return {"seeds": 0, "agree": None, "verdicts": {}}
    seen = []
    for sd in seeds:
        bp = replace(plan, seed=sd)
        holds = any(decide(spec, kind, p, bp, minimum, missing, True).verdict() == "holds"
                    for p in placebo_preps.values())
        seen.append(decide(spec, kind, prep, bp, minimum, missing, True).verdict(holds))
    counts = pd.Series(seen).value_counts().to_dict()
    return {"seeds": len(seeds), "agree": float(np.mean([v == verdict for v in seen])),
            "verdicts": {str(k): int(v) for k, v in counts.items()}, "first_seed": seeds[0]}


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
    """Every claim of a parsed ``claims.yaml``, in order (progress on stderr: each claim's tests, placebos and
    stability seeds are most of the step's time)."""
    from ..progress import progress

    plan = claims_doc["analysis_plan"]
    bar = progress(len(claims_doc["claims"]), "claims (tests, placebos, stability seeds)", unit="claims")
    results = []
    for spec in claims_doc["claims"]:
        results.append(evaluate_claim(spec, plan, scores, replay, tasks))
        bar.update(1)
    bar.close()
    return results


def main_tasks(grid: Mapping | None) -> list[str] | None:
    """The tasks of a design grid's main cell (its ``tasks`` keys); None = every task."""
    if not grid or "tasks" not in grid:
        return None
    return list(grid["tasks"])
