"""Recompute gating, escalation, failure labels and the multi-turn table on hand-computed cases."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvcert.analysis.gating import Escalation, RecomputeGate, random_gain
from kvcert.analysis.labels import failure_label_table
from kvcert.analysis.multiturn_recall import distance_bins, multiturn_table


def test_recompute_gain_by_hand_with_a_tie_at_the_cut():
    gate = np.array([3.0, 2.0, 2.0, 1.0])
    benefit = np.array([1.0, 1.0, 0.0, 0.0])  # full_correct − correct
    g = RecomputeGate(gate, benefit)
    w = np.ones((1, 4))
    # rate 0.5 → 2 of 4 runs: the top one, and half of the tied pair (expected value of a random tie-break)
    assert g.gain(w, 0.5)[0][0] == pytest.approx((1.0 + 0.5 * (1.0 + 0.0)) / 4)
    assert g.gain(w, 0.25)[0][0] == pytest.approx(0.25)
    assert g.gain(w, 1.0)[0][0] == pytest.approx(0.5)  # everything recomputed: accuracy of the full cache
    assert g.gain(w, 0.0)[0][0] == 0.0
    assert random_gain(benefit, w, 0.5)[0][0] == pytest.approx(0.25)
    # weights: duplicating the first run twice (a resample) = gain on the replicated data
    w2 = np.array([[3.0, 1.0, 1.0, 1.0]])
    replicated = RecomputeGate(np.array([3, 3, 3, 2, 2, 1.0]), np.array([1, 1, 1, 1, 0, 0.0]))
    assert g.gain(w2, 0.5)[0][0] == pytest.approx(replicated.gain(np.ones((1, 6)), 0.5)[0][0])
    with pytest.raises(ValueError, match="rate"):
        g.gain(w, 1.5)


def test_escalation_by_hand():
    budgets = [0.125, 0.25, 0.5]
    cert = np.array([[0.9, 0.8, 0.1], [0.2, 0.1, 0.1], [0.05, 0.9, 0.9], [0.6, 0.1, 0.1]])
    correct = np.array([[0, 0, 1], [1, 1, 1], [1, 0, 0], [0, 1, 1]], dtype=float)
    esc = Escalation(cert, correct, budgets, 0.5)
    out = esc.evaluate(np.ones((1, 4)))
    # τ = inverted-CDF median of (0.9, 0.2, 0.05, 0.6) = 0.2; chain 0 → 0.5 (0.8 > τ), chain 3 → 0.25, others stay
    assert out["tau"][0][0] == pytest.approx(0.2)
    assert out["policy_accuracy"][0][0] == pytest.approx(1.0)
    mean_budget = (0.5 + 0.125 + 0.125 + 0.25) / 4
    assert out["mean_budget"][0][0] == pytest.approx(mean_budget)
    fixed = correct.mean(axis=0)  # 0.5, 0.5, 0.75
    matched = np.interp(mean_budget, budgets, fixed)
    assert out["escalation_gain"][0][0] == pytest.approx(1.0 - matched)
    with pytest.raises(ValueError, match="ascending"):
        Escalation(cert, correct, [0.5, 0.25, 0.125], 0.5)


def test_failure_label_table_counts():
    rows = pd.DataFrame({
        "model": "m", "target_tokens": 512, "task": "needle", "condition": ["aware"] * 4 + ["full"],
        "budget": [0.25] * 4 + [1.0], "method": ["snapkv-poisson"] * 4 + ["full"],
        "label": ["correct", "induced", "induced", "inherent", "full"],
    })
    t = failure_label_table(rows)
    assert len(t) == 1
    r = t.iloc[0]
    assert (r["runs"], r["correct"], r["induced"], r["inherent"]) == (4, 1, 2, 1)
    assert r["induced_failure_rate"] == pytest.approx(2 / 3) and r["induced_share_of_failures"] == pytest.approx(2 / 3)


def test_multiturn_table_by_hand():
    rows = []
    for i, (d, full, topk, pois, gate) in enumerate([
        (1, 1, 1, 1, 0.01), (3, 1, 0, 0, 0.5), (7, 1, 0, 1, 0.02), (28, 1, 0, 0, 0.3), (29, 0, 0, 0, 0.4),
    ]):
        base = {"model": "m", "target_tokens": 2048, "example_id": f"e{i}", "seed": 0, "budget": 0.1,
                "task": "multiturn", "condition": "streaming", "turn_distance": float(d), "full_correct": float(full)}
        rows.append({**base, "sampler": "topk", "correct": float(topk), "gate_signal": np.nan})
        rows.append({**base, "sampler": "poisson", "correct": float(pois), "gate_signal": gate})
    t = multiturn_table(pd.DataFrame(rows), {"task": "multiturn", "condition": "streaming", "budgets": [0.1]}, 0.1)
    assert list(t["bin"]) == ["1-5", "6-10", "11-15", "16-20", "21-25", "26-30", "overall"]
    overall = t.set_index("bin").loc["overall"]
    assert overall["n"] == 5 and overall["full"] == pytest.approx(0.8) and overall["topk"] == pytest.approx(0.2)
    assert overall["poisson"] == pytest.approx(0.4)
    # the gate fires on e1, e3, e4 (> 0.1): they take the full cache's answer (1, 1, 0)
    assert overall["gated"] == pytest.approx((1 + 1 + 1 + 1 + 0) / 5) and overall["recomputed"] == pytest.approx(0.6)
    far = t.set_index("bin").loc["26-30"]
    assert far["n"] == 2 and far["gated"] == pytest.approx(0.5) and far["topk"] == 0.0
    assert t.set_index("bin").loc["11-15", "n"] == 0
    assert distance_bins(30) == [(1, 5), (6, 10), (11, 15), (16, 20), (21, 25), (26, 30)]
    # at the gate's rate 0.6: random gating's expectation is 0.4 + 0.6 · mean(full − Poisson) = 0.4 + 0.6 · 0.4;
    # confidence gating recomputes the three least confident runs (e2, e3, e4: benefit 0, 1, 0)
    assert overall["random"] == pytest.approx(0.4 + 0.6 * 0.4)
    confident = pd.DataFrame(rows).assign(confidence=[c for c in (-0.1, -0.1, -0.2, -0.2, -3.0, -3.0, -2.0, -2.0,
                                                                   -1.0, -1.0)])
    c = multiturn_table(confident, {"task": "multiturn", "condition": "streaming", "budgets": [0.1]}, 0.1)
    assert c.set_index("bin").loc["overall", "confidence"] == pytest.approx((1 + 0 + 1 + 1 + 0) / 5)


def test_the_multiturn_baselines_carry_intervals_over_examples():
    """The overall row's gated, random and confidence recall each come with a bootstrap interval over examples that
    holds its estimate; a gate that fires on the runs the full cache rescues beats random gating at its rate."""
    from kvcert.config.analysis_plan import BootstrapPart

    rng = np.random.default_rng(0)
    rows = []
    for i in range(60):
        rescued = i % 3 == 0  # the full cache answers, the Poisson run does not: the gate sees it
        base = {"model": "m", "target_tokens": 1024, "example_id": f"e{i}", "seed": 0, "budget": 0.1,
                "task": "multiturn", "condition": "streaming", "turn_distance": float(1 + i % 20), "full_correct": 1.0,
                "unit": f"e{i}"}
        rows.append({**base, "sampler": "topk", "correct": 0.0, "gate_signal": np.nan, "confidence": -1.0})
        rows.append({**base, "sampler": "poisson", "correct": 0.0 if rescued else 1.0,
                     "gate_signal": 0.9 if rescued else 0.1 * rng.random(), "confidence": -rng.random()})
    t = multiturn_table(pd.DataFrame(rows), {"task": "multiturn", "condition": "streaming", "budgets": [0.1]}, 0.5,
                        bootstrap_plan=BootstrapPart(resamples=300, seed=1))
    overall = t.set_index("bin").loc["overall"]
    assert overall["gated"] == 1.0 and overall["recomputed"] == pytest.approx(1 / 3)
    for col in ("gated", "random", "confidence"):
        lo, hi = overall[f"{col}_ci"]
        assert lo <= overall[col] <= hi
    assert overall["random"] == pytest.approx(2 / 3 + 1 / 3 * 1 / 3)
    assert overall["random_ci"][1] < overall["gated"]
