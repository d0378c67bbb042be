"""C8: the coverage and tightness of the robust certificate ε_R (:func:`kvcert.method.certificate.robust_radius`: the
plug-in radius plus the eviction sketch's shadow terms), computed as :mod:`.coverage` computes the plug-in's:

    coverage_robust = Σ_c w_c · #{‖ô − o‖ ≤ ε_R}_c / Σ_c w_c · n_c,    tightness_robust = median ε_R / ‖ô − o‖

per query kind (``coverage_robust_<kind>``, ``tightness_robust_<kind>``; ``coverage_anytime_robust_<kind>`` for
the kinds that decode a path),
the worst later-query budget × layer cell (``coverage_robust_later_worst_cell``) and the diverged decodes
(``coverage_robust_diverged``). Statistic names written out: :data:`NAMES`.
"""

from __future__ import annotations

import pandas as pd

from ...config.analysis_plan import AnalysisPlan
from ..replay_stats import QUERY_KINDS
from .coverage import prepare as prepare_coverage
from .base import Kind, Prepared


def prepare(rows: pd.DataFrame, plan: AnalysisPlan) -> Prepared:
    """:func:`kvcert.analysis.claims_stats.coverage.prepare` of the robust certificate (claim C8)."""
    return prepare_coverage(rows, plan, "robust")


#: the anytime coverage per query kind exists for the kinds with decode paths: not ``setting`` (one query, no path)
NAMES = (*(f"{stat}_robust{k}" for stat in ("coverage", "tightness") for k in ("", *(f"_{q}" for q in QUERY_KINDS))),
         "coverage_anytime_robust", *(f"coverage_anytime_robust_{q}" for q in QUERY_KINDS if q != "setting"),
         "coverage_robust_later_worst_cell", "coverage_robust_diverged")
KIND = Kind("replay", prepare, ("generations",))
