"""C3: the induced-failure rate — among compressed runs whose full-cache run is correct, the fraction that fail:

    induced_failure_rate = Σ_i w_i · (1 − correct_i) / Σ_i w_i      over runs i with full_correct_i = 1

(weights: the unit bootstrap). It reads no signal, so no placebo applies (``outcome`` is None).
Statistic names written out: :data:`NAMES`.
"""

from __future__ import annotations

import pandas as pd

from ...config.analysis_plan import AnalysisPlan
from ..stats import weighted_mean
from .base import Kind, Prepared, empty, units

def prepare(rows: pd.DataFrame, plan: AnalysisPlan) -> Prepared:
    """The compressed runs whose full-cache run is correct, and their failure indicator."""
    rows = rows[rows["full_correct"] == 1.0]
    if (e := empty(rows)) is not None:
        return e
    fail = 1.0 - rows["correct"].to_numpy(float)
    codes, n_units = units(rows)

    def statistic(w):
        return {"induced_failure_rate": weighted_mean(fail, w)}

    counts = {"generations": int(len(rows)), "positives": int(fail.sum()), "negatives": int(len(rows) - fail.sum())}
    return Prepared(statistic, codes, n_units, {}, counts)


#: no signal read: nothing for a placebo to replace
outcome = None
NAMES = ("induced_failure_rate",)
KIND = Kind("generations", prepare, ("generations",))
