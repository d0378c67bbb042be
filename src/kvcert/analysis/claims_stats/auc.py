"""The AUC pair of C4 and C6: the certificate signal's and the confidence's AUC for a binary label y, pooled and
within strata, and their paired difference. For scores s and labels y,

    AUC = P(s₊ > s₋) + ½ P(s₊ = s₋)    over the (y = 1, y = 0) pairs

pooled over every pair (the paper's ``auc_<prefix>``) or over the pairs of one stratum
(``auc_<prefix>_stratified``, :class:`kvcert.analysis.stats.StratifiedAUCIndex`; ``analysis_plan.strata``: model ×
task × condition × budget × length × method), with ``…_confidence`` (the score −confidence) and
``…_minus_confidence`` (the paired difference) beside each. :mod:`.prediction` and :mod:`.attribution` give y."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from ...config.analysis_plan import AnalysisPlan
from ..stats import AUCIndex, StratifiedAUCIndex, auc, stratified_auc
from .base import Prepared, strata_codes, units


def names(prefix: str) -> tuple[str, ...]:
    """The tested names of one AUC family: ``auc_<prefix>[_stratified][_minus_confidence]``."""
    return tuple(f"auc_{prefix}{s}{d}" for s in ("", "_stratified") for d in ("", "_minus_confidence"))


def auc_pair(rows: pd.DataFrame, y: np.ndarray, prefix: str, strata: np.ndarray) -> tuple[Callable, dict, dict]:
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


def by_stratum(rows: pd.DataFrame, y: np.ndarray, strata: np.ndarray, plan: AnalysisPlan) -> list[dict]:
    """Per stratum: its key, class counts and the certificate's and the confidence's AUC (where both classes occur)."""
    cols = list(plan.strata)
    cert, conf = rows["cert_signal"].to_numpy(float), -rows["confidence"].to_numpy(float)
    out = []
    for code in np.unique(strata):
        m = strata == code
        first = rows.iloc[int(np.flatnonzero(m)[0])]
        out.append({**{c: (first[c].item() if hasattr(first[c], "item") else first[c]) for c in cols},
                    "n": int(m.sum()), "positives": int(y[m].sum()), "auc": auc(cert[m], y[m]),
                    "auc_confidence": auc(conf[m], y[m])})
    return out


def prepare_auc(rows: pd.DataFrame, y: np.ndarray, prefix: str, plan: AnalysisPlan, dropped: int) -> Prepared:
    """The AUC pair of labels ``y`` over ``rows`` (:func:`auc_pair`), bootstrapped over units, with its strata."""
    strata = strata_codes(rows, plan)
    statistic, point, info = auc_pair(rows, y, prefix, strata)
    codes, n_units = units(rows)
    counts = {"generations": int(len(rows)), **info["counts"]}
    details = {"dropped_missing_signal": dropped, "strata": info["strata"],
               "by_stratum": by_stratum(rows, y, strata, plan)}
    return Prepared(statistic, codes, n_units, point, counts, details, selective=True)

