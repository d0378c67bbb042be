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


def _multiturn_rows(fired_benefit, rng=None):
    """Poisson runs (with their top-k twins) of conversations e0, e1, …: (gate fires, full correct, Poisson correct)."""
    rows = []
    for i, (fires, full, pois) in enumerate(fired_benefit):
        base = {"model": "m", "target_tokens": 1024, "example_id": f"e{i}", "seed": 0, "budget": 0.1,
                "task": "multiturn", "condition": "streaming", "turn_distance": float(1 + i % 15),
                "full_correct": float(full), "unit": f"e{i}"}
        rows.append({**base, "sampler": "topk", "correct": 0.0, "gate_signal": np.nan})
        rows.append({**base, "sampler": "poisson", "correct": float(pois), "gate_signal": 0.9 if fires else 0.1})
    return pd.DataFrame(rows)


CELL = {"task": "multiturn", "condition": "streaming", "budgets": [0.1]}


def test_gate_versus_random_by_hand_matches_the_tables_columns():
    """The paired difference is the table's gated minus random recall; the permutation P is the exact hypergeometric
    tail; the influence sd is the sd of (f − r)(b − b̄)."""
    from math import comb

    from kvcert.analysis.multiturn_recall import gate_versus_random, multiturn_table
    from kvcert.config.analysis_plan import BootstrapPart

    cases = [(1, 1, 0), (1, 1, 0), (1, 0, 0), (0, 1, 0), (0, 1, 1), (0, 0, 1), (0, 1, 0), (0, 0, 0)]
    df = _multiturn_rows(cases)
    plan = BootstrapPart(resamples=400, seed=3, level=0.9)
    v = gate_versus_random(df, CELL, 0.5, plan)
    t = multiturn_table(df, CELL, 0.5).set_index("bin").loc["overall"]
    assert v.conversations == v.runs == 8 and v.rate == pytest.approx(3 / 8)
    assert v.difference == pytest.approx(t["gated"] - t["random"]) and v.gated == pytest.approx(t["gated"])
    assert v.random == pytest.approx(t["random"]) and v.ci_low <= v.difference <= v.ci_high
    assert (v.level, v.resamples) == (0.9, 400)
    # benefit b = full − Poisson: fired (1, 1, 0), not fired (1, 0, −1, 1, 0): n₊ = 4, n₋ = 1, n₀ = 3, K = 3, s = 2
    p = sum(comb(4, kp) * comb(1, km) * comb(3, 3 - kp - km) for kp in range(4) for km in range(2)
            if kp + km <= 3 and kp - km >= 2) / comb(8, 3)
    assert v.permutation_p == pytest.approx(p)
    f = np.array([c[0] for c in cases], float)
    b = np.array([c[1] - c[2] for c in cases], float)
    assert v.sd == pytest.approx(np.std((f - f.mean()) * (b - b.mean()), ddof=1))


def test_the_permutation_p_against_monte_carlo_permutations():
    """The exact P equals the share of random placements of the gate's firings that gain at least as much, within
    the Monte-Carlo error of the draws (4 sd of a proportion)."""
    from kvcert.analysis.multiturn_recall import permutation_p

    rng = np.random.default_rng(7)
    benefit = rng.choice([-1.0, 0.0, 1.0], size=30, p=[0.1, 0.3, 0.6])
    fired = rng.random(30) < 0.4
    exact = permutation_p(fired, benefit)
    draws = 20000
    observed = benefit[fired].sum()
    hits = sum(benefit[rng.permutation(fired)].sum() >= observed - 1e-9 for _ in range(draws))
    assert abs(hits / draws - exact) < 4 * np.sqrt(exact * (1 - exact) / draws) + 1e-9
    with pytest.raises(ValueError, match="binary recalls"):
        permutation_p(fired, benefit * 0.5 + 0.25)


def test_the_sentence_flips_when_a_planted_gate_beats_random():
    """A gate that fires exactly on the runs the full cache rescues beats random (interval above 0, small P); a gate
    that fires on random runs is no better than random gating at the same rate."""
    from kvcert.analysis.multiturn_recall import gate_versus_random
    from kvcert.config.analysis_plan import BootstrapPart

    rng = np.random.default_rng(11)
    plan = BootstrapPart(resamples=500, seed=5, level=0.9)
    rescued = rng.random(60) < 0.4
    planted = gate_versus_random(_multiturn_rows([(r, 1, 0 if r else 1) for r in rescued]), CELL, 0.5, plan)
    assert planted.ci_low > 0 and planted.beats_random and planted.sentence() == "the gate beats random"
    assert planted.permutation_p < 0.01
    blind = gate_versus_random(_multiturn_rows([(f, 1, 0 if r else 1) for f, r in zip(rng.random(60) < 0.4, rescued)]),
                               CELL, 0.5, plan)
    assert not blind.beats_random
    assert blind.sentence().startswith("the gate is no better than random gating at the same rate")
    assert gate_versus_random(_multiturn_rows([(1, 1, 0)]), {**CELL, "task": "multiturn_chat"}, 0.5, plan) is None


def test_detectable_difference_closed_form_and_simulation():
    """Δ* = (z_{0.95} + z_{power}) σ / √n at level 0.90 (one-sided α = 0.05); a paired test on n draws of N(Δ*, σ²)
    whose one-sided 0.05 bound clears 0 rejects in a share `power` of the simulations (4 Monte-Carlo sd)."""
    from kvcert.analysis.power import detectable_difference, one_sided_alpha, paired_sd, power_at

    assert one_sided_alpha(0.90) == pytest.approx(0.05)
    assert detectable_difference(100, 0.90, 0.80, 1.0) == pytest.approx((1.6448536269514722 + 0.8416212335729143) / 10)
    assert detectable_difference(150, 0.90, 0.80, 0.5) == pytest.approx(
        detectable_difference(150, 0.90, 0.80, 1.0) / 2)
    assert power_at(120, 0.90, detectable_difference(120, 0.90, 0.8, 0.3), 0.3) == pytest.approx(0.8)
    rng = np.random.default_rng(2)
    n, sd, sims = 120, 0.4, 4000
    delta = detectable_difference(n, 0.90, 0.80, sd)
    d = rng.normal(delta, sd, size=(sims, n))
    rejected = (d.mean(axis=1) - 1.6448536269514722 * sd / np.sqrt(n)) > 0
    assert abs(rejected.mean() - 0.80) < 4 * np.sqrt(0.8 * 0.2 / sims)
    assert paired_sd([0.0, 1.0, 0.0, 1.0]) == pytest.approx(np.std([0, 1, 0, 1], ddof=1))
    for bad in ({"n": 0}, {"power": 1.0}, {"sd": 0.0}, {"level": 1.0}):
        with pytest.raises(ValueError):
            detectable_difference(**{"n": 10, "level": 0.9, "power": 0.8, "sd": 1.0, **bad})


def test_the_power_statement_holds_for_binary_recalls_by_simulation():
    """On conversations whose gate adds Δ* to random gating's recall, the report's own test (the bootstrap interval's
    lower end above 0, with σ the influence sd of the data-generating process) finds it in about `power` of the
    simulations: the normal approximation is not far off at n = 120 (within 0.08 of 0.8)."""
    from kvcert.analysis.multiturn_recall import gate_versus_random
    from kvcert.analysis.power import detectable_difference
    from kvcert.config.analysis_plan import BootstrapPart

    rng = np.random.default_rng(4)
    n, rate, rescue, sims = 120, 0.4, 0.6, 80
    # every run's Poisson answer is wrong and the full cache's right with prob `rescue`; the gate fires on a rescued
    # run with prob q1, on another with prob q0 (rate = rescue q1 + (1 − rescue) q0); gain over random:
    # E[(f − r) b] = rescue (q1 − rate)
    plan = BootstrapPart(resamples=300, seed=9)
    # the influence sd of this process at no effect: sqrt(rate (1 − rate) rescue (1 − rescue))
    sd_pop = np.sqrt(rate * (1 - rate) * rescue * (1 - rescue))
    delta = detectable_difference(n, 0.90, 0.80, sd_pop)
    q1 = rate + delta / rescue
    q0 = (rate - rescue * q1) / (1 - rescue)
    found = 0
    for _ in range(sims):
        b = rng.random(n) < rescue
        f = np.where(b, rng.random(n) < q1, rng.random(n) < q0)
        found += gate_versus_random(_multiturn_rows([(fi, int(bi), 0) for fi, bi in zip(f, b)]), CELL, 0.5,
                                    plan).beats_random
    assert abs(found / sims - 0.80) < 4 * np.sqrt(0.8 * 0.2 / sims)
