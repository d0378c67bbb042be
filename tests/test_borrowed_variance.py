"""The borrowed-strength study (kvcert.bench.borrowed_variance): its pooled variances by hand, its candidates'
radii the Bernstein radius of their variance, its rule as stated, and a pool that helps where it should."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from kvcert.bench import borrowed_variance as bv
from kvcert.config.prereg import load_plan

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _frame(variance, steps=3, heads=2, draws=1):
    """One example × layer × budget: ``heads`` query heads of KV head 0, ``steps`` steps (0 = setting), ``draws``."""
    rows = []
    it = iter(variance)
    for d in range(draws):
        for h in range(heads):
            for s in range(steps):
                rows.append({"model": "m", "example_id": "0", "layer": 0, "head": h, "kv_head": 0, "budget": 0.25,
                             "query_kind": "setting" if s == 0 else "later", "step": s, "draw": d,
                             "variance": next(it), "range_term": 0.0, "error": 0.1})
    return pd.DataFrame(rows)


def test_the_pools_by_hand():
    v = [1.0, 2.0, 6.0,   3.0, 4.0, 2.0]  # head 0's steps 0..2, then head 1's
    rows = _frame(v)
    pools = bv.pooled_variances(rows)
    assert pools["group mean"].tolist() == [2.0, 3.0, 4.0, 2.0, 3.0, 4.0]  # the two heads at each step
    assert pools["running mean"].tolist() == pytest.approx([1.0, 1.5, 3.0, 3.0, 3.5, 3.0], abs=1e-15)
    assert pools["group running mean"].tolist() == pytest.approx([2.0, 2.5, 3.0, 2.0, 2.5, 3.0], abs=1e-15)
    shuffled = rows.sample(frac=1.0, random_state=0)  # row order does not matter
    again = bv.pooled_variances(shuffled)
    assert again["running mean"].tolist() == pytest.approx(pools["running mean"][shuffled.index.to_numpy()], abs=1e-15)
    var = np.asarray(v)
    mix = bv.candidate_variance("mix 0.25 of group mean", var, pools)
    assert mix.tolist() == pytest.approx((0.25 * var + 0.75 * pools["group mean"]).tolist(), abs=1e-15)
    assert bv.candidate_variance("plug-in", var, pools) is var
    assert len(bv.CANDIDATES) == 13 and len(set(bv.CANDIDATES)) == 13


def test_the_bernstein_radius_is_the_certificates():
    import torch

    from kvcert.method.certificate import bernstein_radius

    v, b = np.array([0.0, 0.3, 2.5]), np.array([0.1, 0.0, 0.7])
    expected = bernstein_radius(torch.tensor(v), torch.tensor(b), 0.1).numpy()
    assert bv.bernstein(v, b, 0.1) == pytest.approx(expected, rel=1e-14, abs=1e-300)
    assert bv.bernstein(np.array([-1e-18]), np.array([0.0]), 0.1)[0] == 0.0  # a rounding-negative V̂: no radius


def test_a_group_pool_ranks_the_samples_errors_where_each_head_is_noisy():
    """A draw's error scales with its sample's factor f, shared by the KV group's heads; each head's V̂ is f² times
    a noise of its own. The group mean averages that noise away: its within-cell Spearman exceeds the plug-in's,
    and a candidate's figures follow from its radii."""
    rng = np.random.default_rng(3)
    heads, draws, steps = 8, 60, 3
    frames = []
    for example in range(3):
        f = rng.lognormal(0.0, 0.5, draws)
        for d in range(draws):
            for h in range(heads):
                for s in range(steps):
                    noise = rng.lognormal(0.0, 1.0)
                    frames.append({"model": "m", "example_id": str(example), "target_tokens": 1024, "layer": 0,
                                   "head": h, "kv_head": 0, "budget": 0.25, "query_kind": "setting" if s == 0 else "later",
                                   "step": s, "draw": d, "variance": (f[d] ** 2) * noise, "range_term": 0.0,
                                   "error": 0.5 * f[d] * rng.uniform(0.5, 1.0)})
    rows = pd.DataFrame(frames)
    plan = load_plan(ROOT / "preregistration")
    table = bv.evaluate(rows, 0.1, plan).set_index("candidate")
    assert table.loc["group mean", "spearman_within_cell"] > table.loc["plug-in", "spearman_within_cell"] + 0.2
    radius = bv.bernstein(rows["variance"].to_numpy(), rows["range_term"].to_numpy(), 0.1)
    assert table.loc["plug-in", "coverage"] == pytest.approx(np.mean(rows["error"].to_numpy() <= radius), abs=1e-15)
    assert table.loc["plug-in", "qualifies"] == bv.qualifies(table.loc["plug-in"])


def test_the_rule_as_stated():
    def row(name, ratio, rho, ok=True):
        return {"candidate": name, "matched_tightness_ratio": ratio, "spearman_within_cell": rho, "qualifies": ok}

    select = pd.DataFrame([row("plug-in", 1.3, 0.17, False), row("a", 0.95, 0.31), row("b", 0.955, 0.40),
                           row("c", 0.80, 0.50, False)])
    assert bv.choose(select, None) == {"chosen": "b", "confirmed": False, "why": "no confirmation replay yet"}
    confirm = select.assign(qualifies=[False, True, False, True])
    assert bv.choose(select, confirm)["confirmed"] is False
    assert bv.choose(select, select)["why"] == "qualifies on both seeds"
    assert bv.choose(select.assign(qualifies=False), None)["chosen"] is None
    figures = {"coverage": 0.91, "coverage_setting": 0.95, "coverage_later": 0.90, "bottom_radius_coverage": 0.90,
               "spearman_within_cell": 0.30, "matched_tightness_ratio": 1.0}
    assert bv.qualifies(figures)
    for key, worse in (("coverage_later", 0.8999), ("bottom_radius_coverage", 0.89), ("spearman_within_cell", 0.29),
                       ("matched_tightness_ratio", 1.01)):
        assert not bv.qualifies({**figures, key: worse}), key
    assert min(bv.SEEDS.values()) >= 1_300_000 and math.isclose(bv.COVERAGE, 0.90)
