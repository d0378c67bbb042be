"""C5: the escalation gain (:class:`kvcert.analysis.gating.Escalation`). A chain is one run's settings at every
budget b₁ < … < b_K of ``analysis_plan.escalation.budgets``; τ = the ``threshold_quantile`` of the certificate signal
at b₁; a run starts at b₁ and moves to the next budget's logged run while its signal exceeds τ. Then

    escalation_gain = acc(policy) − acc_fixed(b̄)

with b̄ the policy's mean final budget and acc_fixed interpolated linearly between the fixed budgets (τ re-estimated
in every resample). Its placebo score is the failure outcome (:mod:`.prediction`). Statistic names written out:
:data:`NAMES`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...config.analysis_plan import AnalysisPlan
from ..gating import Escalation
from ..stats import encode_units
from .base import Kind, Prepared, empty
from .prediction import outcome as prediction_outcome

def prepare(rows: pd.DataFrame, plan: AnalysisPlan) -> Prepared:
    """The complete chains (a run at every registered budget) and the escalation policy on them."""
    esc = plan.escalation
    budgets = list(esc.budgets)
    chain = ["unit", "model", "task", "target_tokens", "example_id", "condition", "method", "seed"]
    rows = rows[rows["budget"].isin(budgets) & rows["cert_signal"].notna()]
    if (e := empty(rows)) is not None:
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
        return empty(rows.iloc[0:0])
    policy = Escalation(cert, corr, budgets, esc.threshold_quantile)
    codes, n_units = encode_units(unit)
    fixed = {f"{b:g}": float(corr[:, j].mean()) for j, b in enumerate(budgets)}
    details = {"budgets": budgets, "chains": int(len(cert)), "incomplete_chains": int((~complete).sum()),
               "fixed_accuracy": fixed}
    return Prepared(policy.evaluate, codes, n_units, {}, {"generations": int(len(cert))}, details)


#: the placebo's outcome: the run failed
outcome = prediction_outcome
NAMES = ("escalation_gain",)
KIND = Kind("generations", prepare, ("generations",), outcome)
