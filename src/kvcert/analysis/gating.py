"""Recomputation gating (claim C7) and budget escalation (claim C5) replayed on logged runs.

Both policies act on generations that were all logged (docs/design.md §2, "Gating"): a recomputed run
takes the correctness of the full-cache run of the same example (recomputing with the
full cache regenerates exactly that run), an escalated
run takes the logged run at the next budget. Every function takes a weight matrix
[resamples, runs] (see :mod:`kvcert.analysis.stats`) and returns one value per row, so
the same code gives the point estimate (unit weights) and the bootstrap.

* **Recompute gain at rate r** (``claims.yaml`` C7): recompute the fraction r of runs
  with the highest gate score; gain = accuracy after − accuracy before
  = Σ_recomputed w·(full_correct − correct) / Σ w. Runs tied at the cut are recomputed
  in proportion (the expectation under random tie-breaking), so every gate recomputes
  exactly the fraction r — matched recompute rates. Random gating's gain is its
  expectation, r · mean(full_correct − correct).
* **Escalation** (C5): τ = the pre-registered quantile (inverted CDF) of the
  certificate signal at the smallest budget; every run starts at the smallest budget
  and moves to the next budget's logged run while its signal exceeds τ (the largest
  budget is final). Gain = accuracy of the policy − accuracy of a fixed budget at the
  policy's mean (final) budget, by linear interpolation between the fixed budgets. τ is
  re-estimated in every resample, so its uncertainty is in the interval.
"""

from __future__ import annotations

import numpy as np

from .stats import RankIndex, weighted_mean, weighted_quantile


class RecomputeGate:
    """Gain of recomputing the top fraction of runs by ``gate`` (higher = recompute first)."""

    def __init__(self, gate: np.ndarray, benefit: np.ndarray):
        gate = np.asarray(gate, dtype=np.float64)
        self.index = RankIndex(-gate)  # ascending in −gate = descending in gate; ties grouped
        self.benefit = np.asarray(benefit, dtype=np.float64)

    def gains(self, w: np.ndarray, rates) -> dict[float, tuple[np.ndarray, np.ndarray]]:
        """Gain per rate (one sort of the gate, shared by all rates): {rate: (values [b], valid [b])}."""
        rates = [float(r) for r in rates]
        if any(not 0.0 <= r <= 1.0 for r in rates):
            raise ValueError(f"rate: must lie in [0, 1], got {rates}")
        wg = self.index.group_sums(w)
        dg = self.index.group_sums(w * self.benefit)
        cum_w = np.cumsum(wg, axis=1)  # groups in recompute order (highest gate first)
        cum_d = np.cumsum(dg, axis=1)
        total = cum_w[:, -1]
        ok = total > 0
        rows = np.arange(w.shape[0])
        out = {}
        for r in rates:
            target = r * total
            # k = the group the cut falls in: every earlier group is recomputed whole, k in proportion
            # (searchsorted(side="right") per row: the number of cumulative weights <= the target)
            k = (cum_w <= target[:, None]).sum(axis=1)
            inside = k < wg.shape[1]
            kk = np.minimum(k, wg.shape[1] - 1)
            done_w = np.where(k > 0, cum_w[rows, np.maximum(k - 1, 0)], 0.0)
            done_d = np.where(k > 0, cum_d[rows, np.maximum(k - 1, 0)], 0.0)
            wk = wg[rows, kk]
            share = np.where(inside & (wk > 0), (target - done_w) / np.where(wk > 0, wk, 1.0), 0.0)
            gain = done_d + share * np.where(inside, dg[rows, kk], 0.0)
            out[r] = (np.where(ok, gain / np.where(ok, total, 1.0), np.nan), ok)
        return out

    def gain(self, w: np.ndarray, rate: float) -> tuple[np.ndarray, np.ndarray]:
        return self.gains(w, [rate])[float(rate)]


class StratifiedRecomputeGate:
    """Recompute the fraction r of runs with the highest gate score *within each stratum*; gain =
    Σ_s W_s gain_s / Σ_s W_s (W_s the stratum's weight), i.e. the accuracy change of the pooled runs.

    A scheduler knows a run's stratum (model, task, condition, budget, length) without any
    certificate; giving every stratum the same recompute share leaves the gate only its
    within-stratum information, so a score constant within strata gains exactly what random
    gating gains (its expectation, r · mean benefit, is the same whether drawn per stratum or not).
    """

    def __init__(self, gate: np.ndarray, benefit: np.ndarray, strata: np.ndarray):
        gate, benefit, strata = np.asarray(gate, float), np.asarray(benefit, float), np.asarray(strata)
        self.parts = [(np.flatnonzero(strata == s), RecomputeGate(gate[strata == s], benefit[strata == s]))
                      for s in np.unique(strata)]

    def gains(self, w: np.ndarray, rates) -> dict[float, tuple[np.ndarray, np.ndarray]]:
        rates = [float(r) for r in rates]
        total = w.sum(axis=1)
        num = {r: np.zeros(w.shape[0]) for r in rates}
        for idx, gate in self.parts:
            ws = w[:, idx]
            weight = ws.sum(axis=1)
            for r, (g, ok) in gate.gains(ws, rates).items():
                num[r] += np.where(ok, g * weight, 0.0)
        ok = total > 0
        return {r: (np.where(ok, num[r] / np.where(ok, total, 1.0), np.nan), ok) for r in rates}


def random_gain(benefit: np.ndarray, w: np.ndarray, rate: float) -> tuple[np.ndarray, np.ndarray]:
    """Expected gain of recomputing a uniformly random fraction ``rate`` of the runs."""
    mean, ok = weighted_mean(benefit, w)
    return rate * mean, ok


class Escalation:
    """Certificate-gated budget escalation over chains of logged runs.

    certificates, correct: [chains, budgets] (ascending budgets); quantile: τ's level.
    """

    def __init__(self, certificates: np.ndarray, correct: np.ndarray, budgets, quantile: float):
        self.cert = np.asarray(certificates, dtype=np.float64)
        self.correct = np.asarray(correct, dtype=np.float64)
        self.budgets = np.asarray(budgets, dtype=np.float64)
        if self.cert.ndim != 2 or self.cert.shape != self.correct.shape or self.cert.shape[1] != self.budgets.size:
            raise ValueError("escalation: certificates and correct must be [chains, budgets] with one column per budget")
        if self.budgets.size < 2 or np.any(np.diff(self.budgets) <= 0):
            raise ValueError(f"escalation.budgets: need at least two ascending budgets, got {self.budgets.tolist()}")
        if np.isnan(self.cert).any():
            raise ValueError("escalation: a chain has no certificate signal at some budget; drop it first")
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"escalation.threshold_quantile: must lie in (0, 1), got {quantile}")
        self.quantile = quantile

    def levels(self, tau: np.ndarray) -> np.ndarray:
        """Index of the final budget per (resample, chain) for thresholds tau [b]."""
        exceed = self.cert[None, :, :-1] > tau[:, None, None]
        return np.cumprod(exceed, axis=2).sum(axis=2)

    def evaluate(self, w: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        tau = weighted_quantile(self.cert[:, 0], self.quantile, w)
        level = self.levels(tau)
        final_correct = np.take_along_axis(np.broadcast_to(self.correct, (w.shape[0], *self.correct.shape)),
                                           level[..., None], axis=2)[..., 0]
        total = w.sum(axis=1)
        ok = total > 0
        safe = np.where(ok, total, 1.0)
        acc_policy = (w * final_correct).sum(axis=1) / safe
        mean_budget = (w * self.budgets[level]).sum(axis=1) / safe
        acc_fixed = (w @ self.correct) / safe[:, None]  # [b, budgets]
        j = np.clip(np.searchsorted(self.budgets, mean_budget, side="right") - 1, 0, self.budgets.size - 2)
        b0, b1 = self.budgets[j], self.budgets[j + 1]
        t = np.clip((mean_budget - b0) / (b1 - b0), 0.0, 1.0)
        rows = np.arange(w.shape[0])
        matched = acc_fixed[rows, j] + t * (acc_fixed[rows, j + 1] - acc_fixed[rows, j])
        escalated = (w * (level > 0)).sum(axis=1) / safe
        return {
            "escalation_gain": (acc_policy - matched, ok),
            "tau": (tau, ok),
            "policy_accuracy": (acc_policy, ok),
            "matched_fixed_accuracy": (matched, ok),
            "mean_budget": (mean_budget, ok),
            "escalated_fraction": (escalated, ok),
        }
