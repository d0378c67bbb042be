"""The statistics of the claims, one module per kind (kvpress style): each has ``prepare(rows, plan)`` (the claim's
rows → :class:`~kvcert.analysis.claims_stats.base.Prepared`: the statistic on bootstrap weights, units, point
estimates, cell counts), ``outcome`` (the run-level outcome a generation placebo's stratum base rate is made of;
None where the statistic reads no signal), ``NAMES`` (the statistic names ``claims.yaml``'s tests may use) and
``KIND``. The formulas are in each module's docstring:

* :mod:`.coverage` — C1: coverage of the plug-in radius ε_δ (per step, anytime, by query kind) and tightness;
* :mod:`.spearman` — C2: the median within-step-cell Spearman(ε_δ, ‖ô − o‖);
* :mod:`.induced` — C3: the induced-failure rate;
* :mod:`.prediction` — C4: the certificate's stratified AUC for failure (:mod:`.auc`);
* :mod:`.escalation` — C5: the escalation gain;
* :mod:`.attribution` — C6: the stratified AUC for cache-induced vs inherent failure (:mod:`.auc`);
* :mod:`.recompute` — C7: the recompute gain at matched rates;
* :mod:`.robust_coverage` — C8: coverage and tightness of the robust radius ε_R.

:mod:`.cells` selects a claim's rows; :data:`STATISTICS` maps every name to its kind.
"""

from __future__ import annotations

from . import attribution, coverage, escalation, induced, prediction, recompute, robust_coverage, spearman
from .base import Kind, Prepared

#: the statistic modules, in the order of the claims
MODULES = (coverage, spearman, induced, prediction, escalation, attribution, recompute, robust_coverage)

#: statistic name → how it is computed (claims.yaml's tests may name any of these)
STATISTICS: dict[str, Kind] = {name: module.KIND for module in MODULES for name in module.NAMES}

__all__ = ["Kind", "MODULES", "Prepared", "STATISTICS"]
