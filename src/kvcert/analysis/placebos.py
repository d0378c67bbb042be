"""The placebos of the claims (``analysis_plan.placebos``): each claim's tests are run again, by the same code, on its
rows with the signal replaced by one that carries no draw- or run-level information — the stratum's base rate of the
claim's outcome and a random score for the generation claims, each step cell's median radius and the radii permuted
within each step cell for the replay claims (:data:`PLACEBOS`). A claim whose tests pass is *uninformative* when a
placebo's tests all pass too (:func:`kvcert.analysis.stats.claim_verdict`).

The random placebos are functions of each row's key (:func:`keyed_uniforms`) and of the registered seed
(``placebos.seed``), never of the row's position.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..config.analysis_plan import AnalysisPlan
from .claims_stats.base import Kind, strata_codes
from .replay_stats import STEP_CELL_KEY

#: the radius columns a replay placebo replaces, each with the coverage column decided from it
RADIUS_COLUMNS = (("radius", "covered"), ("anytime_radius", "covered_anytime"), ("radius_robust", "covered_robust"),
                  ("anytime_radius_robust", "covered_anytime_robust"))

#: placebo name → what it is (the report's words)
PLACEBOS = {
    "stratum_base_rate": "the signal replaced by the claim's outcome rate in the run's stratum "
                         "(model × task × condition × budget × length × method): it knows the cell, not the run",
    "random_score": "the signal replaced by a uniform random number per run",
    "step_cell_median_radius": "every radius replaced by the median radius of its step cell "
                               "(example × layer × head × budget × kind × step): it knows the cell, not the draw",
    "step_cell_permuted_radius": "the radii permuted among the draws of each step cell (a draw keeps a radius "
                                 "of its cell, not its own)",
}


def placebo_rng(plan: AnalysisPlan, claim: str, name: str) -> np.random.Generator:
    """The generator of placebo ``name`` of claim ``claim``: seeded by (``placebos.seed``, the claim, the placebo)."""
    return np.random.default_rng([plan.placebos.seed, sum(map(ord, claim)), sum(map(ord, name))])


#: what names one row of a claim, whichever stage made it: a generation record's key (a multi-turn
#: unit included) or a replay draw at one step; the columns a table lacks are left out
ROW_KEY = ["model", "task", "target_tokens", "example_id", "unit", "condition", "method", "scorer", "sampler",
           "allocation", "budget", "seed", "layer", "head", "query_kind", "step", "draw"]


def keyed_uniforms(rows: pd.DataFrame, rng: np.random.Generator) -> np.ndarray:
    """One uniform in [0, 1) per row, a function of the row's key (:data:`ROW_KEY`) and one draw of
    ``rng`` (the placebo's registered seed), not of the row's position: the placebos come out the
    same whatever order the shards or replay tables were read in."""
    key = [c for c in ROW_KEY if c in rows.columns]
    hashed = pd.util.hash_pandas_object(rows[key].astype(str), index=False).to_numpy(np.uint64)
    x = hashed ^ np.uint64(rng.integers(0, 2**63))
    with np.errstate(over="ignore"):  # splitmix64's finaliser: the key's hash spread over all 64 bits
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53


def placebo_rows(rows: pd.DataFrame, name: str, kind: Kind, analysis_plan: AnalysisPlan,
                 rng: np.random.Generator) -> pd.DataFrame:
    """The claim's rows with its signal replaced by placebo ``name`` (:data:`PLACEBOS`)."""
    out = rows.copy()
    if name in ("stratum_base_rate", "random_score"):
        present = rows["cert_signal"].notna().to_numpy()
        if name == "random_score":
            score = keyed_uniforms(rows, rng)
        else:
            y, defined = kind.outcome(rows)
            strata = strata_codes(rows, analysis_plan)
            rate = pd.Series(np.where(defined & present, y, np.nan)).groupby(strata).mean()
            score = rate.reindex(strata).fillna(0.0).to_numpy()
        out["cert_signal"] = np.where(present, score, np.nan)
        return out
    if name not in ("step_cell_median_radius", "step_cell_permuted_radius"):
        raise ValueError(f"analysis_plan.placebos: unknown placebo {name!r}; known: {', '.join(PLACEBOS)}")
    if rows.empty:
        return out
    cells = rows.groupby(STEP_CELL_KEY, observed=True, sort=False).ngroup().to_numpy()
    error = rows["error"].to_numpy(float)
    if name == "step_cell_permuted_radius":
        # within each cell, the draws in one keyed order receive the radii of the draws in another
        by_cell = np.lexsort((keyed_uniforms(rows, rng), cells))
        shuffled = np.lexsort((keyed_uniforms(rows, rng), cells))
    for radius, covered in RADIUS_COLUMNS:
        values = rows[radius].to_numpy(float)
        if name == "step_cell_median_radius":
            new = pd.Series(values).groupby(cells).transform("median").to_numpy()
        else:
            new = np.empty_like(values)
            new[by_cell] = values[shuffled]
        out[radius] = new
        out[covered] = error <= new
    return out


def placebo_names(kind: Kind, plan: AnalysisPlan) -> list[str]:
    """The placebos a claim is scored with (``analysis_plan.placebos.<source>``; none for a statistic that reads
    no signal, e.g. the induced-failure rate)."""
    if kind.source == "generations" and kind.outcome is None:
        return []
    return plan.placebos.names(kind.source)
