"""Failure labels per cell: cache-induced versus inherent (docs/design.md §2, "Failure labels").

Among compressed runs, a failure is *cache-induced* when the full-cache run of the same
example answers correctly and *inherent* when it fails too (``label`` from
:mod:`kvcert.analysis.load`). :func:`failure_label_table` counts them per model ×
length × task × condition × budget × method; :func:`induced_failure_rates` gives the
induced-failure rate — among examples the full cache answers correctly, the fraction
of compressed runs that fail (the paper's Fig. 1) — by condition × budget × sampler.
"""

from __future__ import annotations

import pandas as pd

CELL = ["model", "target_tokens", "task", "condition", "budget", "method"]


def failure_label_table(scores: pd.DataFrame, by: list[str] = CELL) -> pd.DataFrame:
    """Counts of correct / induced / inherent / unknown runs per cell, with the rates."""
    rows = scores[scores["condition"] != "full"]
    if rows.empty:
        return pd.DataFrame(columns=[*by, "runs", "correct", "induced", "inherent", "unknown",
                                     "induced_failure_rate", "induced_share_of_failures"])
    counts = pd.crosstab([rows[c] for c in by], rows["label"])
    for name in ("correct", "induced", "inherent", "unknown"):
        if name not in counts:
            counts[name] = 0
    out = counts[["correct", "induced", "inherent", "unknown"]].reset_index()
    out.columns.name = None
    out["runs"] = out[["correct", "induced", "inherent", "unknown"]].sum(axis=1)
    full_right = out["correct"] + out["induced"]
    failures = out["induced"] + out["inherent"]
    out["induced_failure_rate"] = (out["induced"] / full_right).where(full_right > 0)
    out["induced_share_of_failures"] = (out["induced"] / failures).where(failures > 0)
    return out[[*by, "runs", "correct", "induced", "inherent", "unknown", "induced_failure_rate",
                "induced_share_of_failures"]]


def induced_failure_rates(scores: pd.DataFrame, tasks: list[str] | None = None) -> pd.DataFrame:
    """Induced-failure rate by target_tokens × condition × budget × sampler (Fig. 1), pooled over models and tasks."""
    rows = scores if tasks is None else scores[scores["task"].isin(tasks)]
    return failure_label_table(rows, by=["target_tokens", "condition", "budget", "sampler"])
