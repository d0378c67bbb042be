"""The paired accuracy gap (kvcert.analysis.paired_gap): the mean paired difference, an interval over examples, and
McNemar's exact test, checked by hand and against the binomial distribution."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from kvcert.analysis.paired_gap import mcnemar_exact, paired_gaps
from kvcert.config.analysis_plan import BootstrapPart


def _scores(topk, poisson, condition="aware", budget=0.25, task="needle"):
    rows = []
    for method, correct in (("snapkv-topk", topk), ("snapkv-poisson", poisson)):
        for i, c in enumerate(correct):
            rows.append({"model": "m", "task": task, "target_tokens": 1024, "example_id": str(i), "seed": 0,
                         "condition": condition, "budget": budget, "method": method, "correct": bool(c)})
    return pd.DataFrame(rows)


def test_mcnemar_exact_is_the_two_sided_binomial_test():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(5, 5) == 1.0
    assert mcnemar_exact(6, 0) == pytest.approx(2 / 64, abs=1e-15)  # both tails of Bin(6, ½) at 0 and 6
    # 28 against 8: 2 P(X ≤ 8), X ~ Bin(36, ½), summed exactly
    assert mcnemar_exact(28, 8) == pytest.approx(2 * sum(math.comb(36, k) for k in range(9)) / 2 ** 36, rel=1e-12)
    assert mcnemar_exact(8, 28) == mcnemar_exact(28, 8)


def test_the_gap_is_paired_by_example_and_its_interval_holds_it():
    rng = np.random.default_rng(0)
    topk = rng.random(200) < 0.6
    poisson = topk & (rng.random(200) < 0.8)  # the sampler loses a fifth of top-k's answers, gains none
    df = pd.concat([_scores(topk, poisson), _scores(topk, topk, condition="streaming"),
                    _scores(topk, poisson, task="multikey").assign(method="other")])  # another method: not paired
    plan = BootstrapPart(resamples=2000, seed=1)
    out = paired_gaps(df, plan, tasks=["needle"]).set_index("condition")
    aware = out.loc["aware"]
    b = int((topk & ~poisson).sum())
    assert aware["examples"] == 200 and aware["only_topk"] == b and aware["only_poisson"] == 0
    assert aware["gap"] == pytest.approx(b / 200, abs=1e-15)
    assert aware["ci_low"] > 0 and aware["ci_low"] <= aware["gap"] <= aware["ci_high"]
    # the interval's half-width is about z · sd / √n of the paired differences (a binomial, here), not binned
    sd = np.std(topk.astype(float) - poisson, ddof=1)
    assert (aware["ci_high"] - aware["ci_low"]) / 2 == pytest.approx(1.645 * sd / math.sqrt(200), rel=0.15)
    assert aware["mcnemar_p"] == pytest.approx(mcnemar_exact(b, 0), rel=1e-12) and aware["mcnemar_p"] < 1e-6
    same = out.loc["streaming"]
    assert same["gap"] == 0 and same["ci_low"] == same["ci_high"] == 0 and same["mcnemar_p"] == 1.0


def test_examples_missing_one_method_are_left_out():
    df = _scores([1, 1, 0, 1], [1, 0, 0, 0])
    df = df[~((df["method"] == "snapkv-poisson") & (df["example_id"] == "3"))]
    row = paired_gaps(df, BootstrapPart(resamples=200, seed=0)).iloc[0]
    assert row["examples"] == 3 and row["gap"] == pytest.approx(1 / 3, abs=1e-15)
    assert paired_gaps(df[df["method"] == "snapkv-topk"], BootstrapPart(resamples=10)).empty
