"""The replay table's layout (torch-free): the columns :mod:`kvcert.generation.replay` writes, one row per
(example, layer, query head, budget, query kind, step, draw), and :mod:`kvcert.analysis.replay_stats` reads."""

from __future__ import annotations

import pandas as pd

from ..config.analysis_plan import QUERY_KINDS  # noqa: F401  (the query kinds, the plan's: replay.query_kinds)
FLOAT_COLUMNS = ["error", "radius", "anytime_radius", "variance", "range_term", "output_norm",
                 "radius_robust", "anytime_radius_robust", "shadow_sum", "shadow_range"]
COVERED_COLUMNS = ["covered", "covered_anytime", "covered_robust", "covered_anytime_robust"]

REPLAY_COLUMNS = [
    "model", "example_id", "target_tokens", "layer", "head", "kv_head", "budget", "query_kind", "step", "draw", "kept",
    "diverged",
    *FLOAT_COLUMNS, *COVERED_COLUMNS,
]

#: the vAttention arm (:mod:`kvcert.method.vattention`), after the certificate's columns in the same rows; float64,
#: NaN on the sample-dependent rows (vAttention keeps the full cache resident: it has no compressed run) and on every
#: row of a table made without the arm. ``exact_norm`` ‖o‖ (every row); ``error_vatt`` / ``error_vatt_ht`` ‖ô − o‖ of
#: its output (Hansen–Hurwitz; Horvitz–Thompson variant); ``epsilon_vatt`` the relative denominator error its
#: (ε, δ) statement gives at the matched budget; ``denominator_error_vatt`` / ``…_ht`` the realised |D̂ − D| / D;
#: ``covered_vatt`` / ``…_ht`` 1.0 where that error ≤ ε (NaN where ε is: fewer than 2 draws); ``sampled_vatt`` its
#: draws b; ``tokens_read_vatt`` the tokens it reads for the query (deterministic part + b draws);
#: ``resident_vatt`` the tokens it keeps resident for the query (every key the query sees: the full cache).
VATTENTION_COLUMNS = ["exact_norm", "error_vatt", "error_vatt_ht", "epsilon_vatt", "denominator_error_vatt",
                      "denominator_error_vatt_ht", "covered_vatt", "covered_vatt_ht", "sampled_vatt",
                      "tokens_read_vatt", "resident_vatt"]
#: what :func:`kvcert.generation.replay.replay_model` writes: the certificate's columns, then the vAttention arm's
TABLE_COLUMNS = [*REPLAY_COLUMNS, *VATTENTION_COLUMNS]


#: ``diverged``: a sample-dependent row whose compressed run fed, by that step, a token the full-cache run did not
#: (False for the setting and later queries, whose history is the full run's)
BOOL_COLUMNS = [*COVERED_COLUMNS, "diverged"]


def empty_replay() -> pd.DataFrame:
    floats = {*FLOAT_COLUMNS, *VATTENTION_COLUMNS}
    return pd.DataFrame({c: pd.Series(dtype=float if c in floats else bool if c in BOOL_COLUMNS else object)
                         for c in TABLE_COLUMNS})
