"""C6: attribution. Among the failed compressed runs of the claim's cells, y = 1 when the failure is cache-induced
(the full cache answers correctly), 0 when inherent; the certificate's AUC for y within strata
(``auc_attribution_stratified``) and its paired difference with −mean_logprob's, pooled beside (:mod:`.auc`).
Statistic names written out: :data:`NAMES`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...config.analysis_plan import AnalysisPlan
from .auc import names, prepare_auc
from .base import AUC_COUNTS, Kind, Prepared, empty, signal_rows


def prepare(rows: pd.DataFrame, plan: AnalysisPlan) -> Prepared:
    """y = induced among the failures labelled induced or inherent."""
    rows, dropped = signal_rows(rows[rows["label"].isin(["induced", "inherent"])])
    if (e := empty(rows)) is not None:
        return e
    y = (rows["label"] == "induced").to_numpy(float)
    return prepare_auc(rows, y, "attribution", plan, dropped)


def outcome(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """y = induced, defined where the failure is labelled induced or inherent."""
    return (rows["label"] == "induced").to_numpy(float), rows["label"].isin(["induced", "inherent"]).to_numpy()


NAMES = names("attribution")
KIND = Kind("generations", prepare, AUC_COUNTS, outcome)
