"""The accuracy a certificate costs: top-k's accuracy minus the Poisson sampler's on the same examples, paired.

Per condition and budget (tasks pooled, the grid's main tasks), over the examples i that ran under both
methods, with c_m,i ∈ {0, 1} whether method m answered example i correctly:

    gap = (1/n) Σ_i (c_topk,i − c_poisson,i),

its interval by the registered bootstrap over examples (task, example_id; the plan's seed, resamples and level:
:func:`kvcert.analysis.stats.bootstrap`), and McNemar's exact two-sided test on the discordant pairs — b examples
that only top-k answered, c that only the Poisson sampler answered:

    p = min(1, 2 · Σ_{k ≤ min(b, c)} C(b + c, k) / 2^(b + c))     (1 where b + c = 0).

A positive gap is what randomized retention costs in accuracy. Reported (the report's accuracy section, the design
study's page), deciding no claim. Statistics only: no torch.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from ..config.analysis_plan import BootstrapPart
from .stats import bootstrap, encode_units

#: the pair compared: (deterministic, randomized)
PAIR = ("snapkv-topk", "snapkv-poisson")
COLUMNS = ["condition", "budget", "examples", "topk", "poisson", "gap", "ci_low", "ci_high", "only_topk",
           "only_poisson", "mcnemar_p"]


def mcnemar_exact(b: int, c: int) -> float:
    """McNemar's exact two-sided p-value from the discordant counts (the binomial test of b against Bin(b + c, ½))."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1))
    return min(1.0, 2.0 * tail / 2.0 ** n)


def paired_gaps(scores: pd.DataFrame, plan: BootstrapPart, tasks: Sequence[str] | None = None,
                pair: tuple[str, str] = PAIR) -> pd.DataFrame:
    """One row per (condition, budget) where both methods of ``pair`` ran (:data:`COLUMNS`); ``tasks``: the grid's
    main tasks (None: every task). An example's key is (model, task, target length, example_id, seed)."""
    df = scores[scores["method"].isin(pair)]
    if tasks is not None:
        df = df[df["task"].isin(list(tasks))]
    key = ["model", "task", "target_tokens", "example_id", "seed"]
    rows = []
    for (condition, budget), part in df.groupby(["condition", "budget"], sort=True):
        wide = part.pivot_table(index=key, columns="method", values="correct", aggfunc="first")
        if not all(m in wide for m in pair):
            continue
        wide = wide.dropna(subset=list(pair))
        if wide.empty:
            continue
        a = wide[pair[0]].to_numpy(float)
        p = wide[pair[1]].to_numpy(float)
        diff = a - p
        codes, n_units = encode_units(list(zip(wide.index.get_level_values("task"),
                                               wide.index.get_level_values("example_id"))))

        def statistic(w: np.ndarray, diff=diff):
            total = w.sum(axis=1)
            return {"gap": ((w @ diff) / np.where(total > 0, total, 1.0), total > 0)}

        est = bootstrap(statistic, codes, n_units, plan)["gap"]
        b, c = int(((a == 1) & (p == 0)).sum()), int(((a == 0) & (p == 1)).sum())
        rows.append([condition, float(budget), len(wide), float(a.mean()), float(p.mean()), float(diff.mean()),
                     est.ci_low, est.ci_high, b, c, mcnemar_exact(b, c)])
    return pd.DataFrame(rows, columns=COLUMNS)
