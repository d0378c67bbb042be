"""C7: the recomputation gain at matched recompute rates. With benefit b_i = full_correct_i − correct_i of run i,
a gate recomputing the share r of runs with the highest score gains

    gain(r) = Σ_{i recomputed} w_i · b_i / Σ_i w_i

(:class:`kvcert.analysis.gating.RecomputeGate`); the registered tests compare, at ``recompute.verdict_rate``, the
certificate's gain with a random gate's, r · mean(b) (``gain_ratio_certificate_over_random_stratified``), and with the
confidence's (``gain_certificate_minus_confidence_stratified``), every stratum recomputing the same share
(:class:`~kvcert.analysis.gating.StratifiedRecomputeGate`); the pooled gates and the curve over ``gate_rates`` are
reported beside them. A resample with no expected random gain leaves the ratio undefined and is skipped.
Statistic names written out: :data:`NAMES`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...config.analysis_plan import AnalysisPlan
from ..gating import RecomputeGate, StratifiedRecomputeGate, random_gain
from .base import Kind, Prepared, empty, signal_rows, strata_codes, units

def prepare(rows: pd.DataFrame, plan: AnalysisPlan) -> Prepared:
    """C7 at matched recompute rates: the stratified gates (every stratum recomputes the same share, the tests),
    and the pooled gates beside them (the paper's)."""
    rate, rates = plan.recompute.verdict_rate, plan.recompute.rates
    rows, dropped = signal_rows(rows[rows["full_correct"].notna()])
    if (e := empty(rows)) is not None:
        return e
    benefit = (rows["full_correct"] - rows["correct"]).to_numpy(float)
    strata = strata_codes(rows, plan)
    cert, conf = rows["cert_signal"].to_numpy(float), -rows["confidence"].to_numpy(float)
    gates = {"": (RecomputeGate(cert, benefit), RecomputeGate(conf, benefit)),
             "_stratified": (StratifiedRecomputeGate(cert, benefit, strata),
                             StratifiedRecomputeGate(conf, benefit, strata))}
    codes, n_units = units(rows)

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


def outcome(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The benefit full_correct − correct, defined where the full run was scored."""
    return (rows["full_correct"] - rows["correct"]).to_numpy(float), rows["full_correct"].notna().to_numpy()


NAMES = tuple(f"{name}{s}" for s in ("", "_stratified")
              for name in ("gain_ratio_certificate_over_random", "gain_certificate_minus_confidence"))
KIND = Kind("generations", prepare, ("generations",), outcome)
