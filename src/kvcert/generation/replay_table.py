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


#: ``diverged``: a sample-dependent row whose compressed run fed, by that step, a token the full-cache run did not
#: (False for the setting and later queries, whose history is the full run's)
BOOL_COLUMNS = [*COVERED_COLUMNS, "diverged"]


def empty_replay() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=float if c in FLOAT_COLUMNS else bool if c in BOOL_COLUMNS else object)
                         for c in REPLAY_COLUMNS})
