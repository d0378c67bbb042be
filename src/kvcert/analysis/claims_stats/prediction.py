"""C4: failure prediction. Among the compressed runs of the claim's cells, y = 1 when the run fails (score < its
task's pass mark); the certificate's AUC for y within strata (``auc_certificate_stratified``, the registered test)
and its paired difference with −mean_logprob's (``auc_certificate_stratified_minus_confidence``), pooled beside
(:mod:`.auc`). The secondary confidence's pooled AUC is a detail. Statistic names written out: :data:`NAMES`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...config.analysis_plan import AnalysisPlan
from ..stats import auc
from .auc import names, prepare_auc
from .base import AUC_COUNTS, Kind, Prepared, empty, signal_rows


def prepare(rows: pd.DataFrame, plan: AnalysisPlan) -> Prepared:
    """y = failed, over the runs that carry both signals."""
    rows, dropped = signal_rows(rows)
    if (e := empty(rows)) is not None:
        return e
    y = 1.0 - rows["correct"].to_numpy(float)
    prep = prepare_auc(rows, y, "certificate", plan, dropped)
    sec = rows["confidence_secondary"].notna()
    prep.details["auc_secondary_confidence"] = auc(-rows.loc[sec, "confidence_secondary"].to_numpy(float),
                                                   y[sec.to_numpy()])
    return prep


def outcome(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """y = 1 − correct: the run failed (defined for every run)."""
    return 1.0 - rows["correct"].to_numpy(float), np.ones(len(rows), dtype=bool)


NAMES = names("certificate")
KIND = Kind("generations", prepare, AUC_COUNTS, outcome)
