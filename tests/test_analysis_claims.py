"""Known-answer tests of every claim of claims.yaml: synthetic records built so that the
statistic's value is known and each verdict — holds, killed, inconclusive, uninformative —
is reached; and the controls that keep a verdict honest: the stratified statistics a
stratum-level score cannot pass, the placebos scored by the same tests, the verdict's
stability over bootstrap seeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvcert.analysis.claims import evaluate_claim
from kvcert.analysis.load import score_shards
from kvcert.config.prereg import load_claims
from kvcert.testing import frozen_copy, make_record, replay_frame, write_shard

PREREG = Path(__file__).resolve().parents[1] / "preregistration"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prereg") / "preregistration"
    fr = frozen_copy(PREREG, folder, resamples=1000, stability_seeds=5)
    doc = load_claims(folder)
    return {"folder": folder, "hash": fr.prereg_hash, "plan": doc["analysis_plan"],
            "claims": {c["id"]: c for c in doc["claims"]}, "tmp": tmp_path_factory.mktemp("shards")}


def score(env, records):
    path = write_shard(records, env["tmp"] / f"s{np.random.default_rng().integers(1 << 30)}.jsonl")
    return score_shards([path], env["folder"])[0]


def run(env, cid, records=None, replay=None):
    df = score(env, records) if records is not None else None
    return evaluate_claim(env["claims"][cid], env["plan"], df, replay)


def stat_of(name, result):
    """The test result of statistic ``name`` in a claim result."""
    return {t.statistic: t for t in result.tests}[name]


# --- C3: induced-failure rate of question-aware eviction at 25-50 % ----------------------------
def c3_records(h, n_examples, failing):
    out = []
    for i in range(n_examples):
        eid = f"e{i}"
        out.append(make_record(eid, condition="full", score=1.0, prereg_hash=h))
        for b in (0.25, 0.5):
            for s in ("topk", "poisson"):
                out.append(make_record(eid, condition="aware", sampler=s, budget=b, signal=0.1,
                                       score=0.0 if i < failing else 1.0, prereg_hash=h))
    return out


def test_c3_holds(env):
    r = run(env, "C3", c3_records(env["hash"], 40, 20))
    assert stat_of("induced_failure_rate", r).estimate == pytest.approx(0.5)
    assert r.verdict == "holds" and r.cell["generations"] == 160


def test_c3_killed(env):
    r = run(env, "C3", c3_records(env["hash"], 40, 0))
    t = stat_of("induced_failure_rate", r)
    assert t.estimate == 0.0 and t.ci[1] == 0.0 and t.outcome == "fail"
    assert r.verdict == "killed"


def test_c3_inconclusive_when_interval_straddles(env):
    r = run(env, "C3", c3_records(env["hash"], 40, 4))
    t = stat_of("induced_failure_rate", r)
    assert t.estimate == pytest.approx(0.1) and t.ci[0] < 0.1 < t.ci[1]
    assert r.verdict == "inconclusive" and "straddles" in r.reasons[-1]


def test_c3_inconclusive_when_cell_too_small(env):
    r = run(env, "C3", c3_records(env["hash"], 5, 5))  # 20 runs < 30
    assert stat_of("induced_failure_rate", r).estimate == 1.0
    assert r.verdict == "inconclusive" and any("minimum 30" in x for x in r.reasons)


def test_c3_inconclusive_when_a_named_cell_is_missing(env):
    records = [x for x in c3_records(env["hash"], 40, 20) if x["sampler"] != "topk"]
    r = run(env, "C3", records)
    assert r.verdict == "inconclusive" and any("aware/0.25/topk" in x for x in r.reasons)


# --- C4: prediction AUC, certificate vs confidence -------------------------------------------------
def c4_records(h, n_examples, failing, informative=True, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_examples):
        eid = f"e{i}"
        out.append(make_record(eid, condition="full", score=1.0, prereg_hash=h))
        for c in ("aware", "streaming"):
            for b in (0.125, 0.25, 0.5):
                fail = i < failing
                sig = (0.9 if fail else 0.1) if informative else 0.5
                out.append(make_record(eid, condition=c, budget=b, signal=sig, score=0.0 if fail else 1.0,
                                       mean_logprob=float(rng.normal()), prereg_hash=h))
    return out


def test_c4_holds(env):
    r = run(env, "C4", c4_records(env["hash"], 40, 20))
    a, d = stat_of("auc_certificate_stratified", r), stat_of("auc_certificate_stratified_minus_confidence", r)
    assert a.estimate == 1.0 and a.outcome == "pass" and d.outcome == "pass"
    conf = r.details["statistics"]["auc_certificate_stratified_confidence"]["estimate"]
    assert d.estimate == pytest.approx(1.0 - conf)
    assert r.details["statistics"]["auc_certificate"]["estimate"] == 1.0  # the pooled figure, beside
    assert r.verdict == "holds" and r.cell["positives"] == 120 and r.cell["negatives"] == 120
    assert set(r.details["by_length"]) == {"512"}
    # the placebos, scored by the same tests, are killed: the stratum base rate is ½ in every stratum
    assert r.placebo.applicable and not r.placebo.passes and r.placebo.verdict == "killed"
    base = {b.kind: b for b in r.placebo.placebos}["stratum_base_rate"]
    assert base.statistic["auc_certificate_stratified"]["estimate"] == 0.5
    assert r.seed_stability.seeds == 5 and r.seed_stability.agree == 1.0


def test_c4_killed(env):
    r = run(env, "C4", c4_records(env["hash"], 40, 20, informative=False))
    a = stat_of("auc_certificate_stratified", r)
    assert a.estimate == 0.5 and a.ci[1] == 0.5 and a.outcome == "fail"
    assert r.verdict == "killed"


def test_c4_inconclusive_with_too_few_failures(env):
    r = run(env, "C4", c4_records(env["hash"], 40, 1))  # 6 failures < 10 positives
    assert stat_of("auc_certificate_stratified", r).estimate == 1.0
    assert r.verdict == "inconclusive" and any("positives: 6 <" in x for x in r.reasons)


def cell_only_records(h, n_examples, seed=0):
    """Failures concentrated in one cell (streaming at 12.5 %: every run fails there, none elsewhere bar a few),
    and a certificate that only knows the cell: high there, low elsewhere, with noise unrelated to the outcome."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_examples):
        eid = f"e{i}"
        out.append(make_record(eid, condition="full", score=1.0, prereg_hash=h))
        for c in ("aware", "streaming"):
            for b in (0.125, 0.25, 0.5):
                hard = c == "streaming" and b == 0.125
                fail = rng.random() < (0.8 if hard else 0.1)
                sig = (0.8 if hard else 0.1) + 0.01 * rng.random()
                out.append(make_record(eid, condition=c, budget=b, signal=sig, score=0.0 if fail else 1.0,
                                       mean_logprob=float(rng.normal()), prereg_hash=h))
    return out


def test_c4_a_signal_that_only_knows_the_cell_is_killed_within_strata(env):
    """The pooled AUC rewards a score that tells the cells apart (here ≈ 0.9); the registered stratified
    AUC does not (≈ 0.5): the claim is killed, not held — the mix of cells is not a signal."""
    r = run(env, "C4", cell_only_records(env["hash"], 60))
    assert r.details["statistics"]["auc_certificate"]["estimate"] > 0.8  # what the pooled test would have passed
    t = stat_of("auc_certificate_stratified", r)
    assert abs(t.estimate - 0.5) < 0.1 and t.outcome == "fail"
    assert r.verdict == "killed"


def test_stratified_auc_is_the_pair_weighted_mean_of_sklearn_per_stratum():
    from sklearn.metrics import roc_auc_score

    from kvcert.analysis.stats import StratifiedAUCIndex, stratified_auc

    rng = np.random.default_rng(4)
    n = 400
    strata = rng.integers(0, 5, n)
    y = (rng.random(n) < 0.3 + 0.1 * strata).astype(float)
    y[strata == 4] = 1.0  # one stratum holds one class only: no pair
    score = np.round(rng.normal(size=n) + y * (strata % 2), 1)  # ties included
    num = den = 0.0
    for s in range(4):
        m = strata == s
        p, q = y[m].sum(), (1 - y[m]).sum()
        num += p * q * roc_auc_score(y[m], score[m])
        den += p * q
    value, used, dropped = stratified_auc(score, y, strata)
    assert value == pytest.approx(num / den, abs=1e-12) and (used, dropped) == (4, 1)
    got, ok = StratifiedAUCIndex(score, y, strata)(np.ones((1, n)))
    assert ok[0] and got[0] == pytest.approx(num / den, abs=1e-12)
    w = rng.integers(0, 3, (3, n)).astype(float)  # integer weights = the resampled data set
    got, ok = StratifiedAUCIndex(score, y, strata)(w)
    for row in range(3):
        rep = w[row].astype(int)
        want = stratified_auc(np.repeat(score, rep), np.repeat(y, rep), np.repeat(strata, rep))[0]
        assert got[row] == pytest.approx(want, abs=1e-12)


# --- C5: escalation vs fixed budget ----------------------------------------------------------------
def c5_records(h, n_examples, helpful=True):
    """A third of the examples are hard: at 12.5 % they fail with a high certificate and from 25 % they
    succeed with a low one; easy examples always succeed, their 12.5 % certificate spread below the hard ones."""
    out = []
    for i in range(n_examples):
        eid = f"e{i}"
        hard = i % 3 == 0
        out.append(make_record(eid, condition="full", score=1.0, prereg_hash=h))
        for c in ("aware", "streaming"):
            for b in (0.125, 0.25, 0.5):
                low = 0.05 if b > 0.125 else 0.1 + 0.001 * i
                if helpful:
                    sig, ok = (0.9 if b == 0.125 else 0.05, b > 0.125) if hard else (low, True)
                else:
                    sig, ok = (0.9 if hard else low), True
                out.append(make_record(eid, condition=c, budget=b, signal=sig, score=float(ok), prereg_hash=h))
    return out


def test_c5_holds_with_known_gain(env):
    r = run(env, "C5", c5_records(env["hash"], 48))
    st = r.details["statistics"]
    # 96 chains (32 hard). τ = the 48th smallest 12.5 % certificate = that of the 24th easy example (i = 35);
    # above it: 8 easy examples' and all 32 hard chains → 48 of 96 escalate to 25 %, where all succeed.
    # Policy: accuracy 1 at mean budget 0.1875; fixed: 2/3 at 12.5 %, 1 at 25 % → 5/6; gain 1/6.
    assert st["tau"]["estimate"] == pytest.approx(0.135)
    assert st["escalated_fraction"]["estimate"] == pytest.approx(0.5)
    assert st["mean_budget"]["estimate"] == pytest.approx(0.1875)
    assert st["matched_fixed_accuracy"]["estimate"] == pytest.approx(5 / 6)
    assert stat_of("escalation_gain", r).estimate == pytest.approx(1 / 6)
    assert r.verdict == "holds" and r.cell["generations"] == 96


def test_c5_killed_without_headroom(env):
    r = run(env, "C5", c5_records(env["hash"], 48, helpful=False))
    t = stat_of("escalation_gain", r)
    assert t.estimate == 0.0 and t.ci[1] == 0.0 and r.verdict == "killed"


def test_c5_inconclusive_when_too_few_chains(env):
    r = run(env, "C5", c5_records(env["hash"], 10))  # 20 chains < 30
    assert stat_of("escalation_gain", r).estimate == pytest.approx(0.2)
    assert r.verdict == "inconclusive"


# --- C6: attribution among failures --------------------------------------------------------------
def c6_records(h, n_induced, n_inherent, informative=True, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_induced + n_inherent):
        eid = f"e{i}"
        induced = i < n_induced
        out.append(make_record(eid, condition="full", score=1.0 if induced else 0.0, prereg_hash=h))
        for c in ("aware", "streaming"):
            for b in (0.125, 0.25, 0.5):
                sig = (0.9 if induced else 0.1) if informative else 0.3
                out.append(make_record(eid, condition=c, budget=b, signal=sig, score=0.0,
                                       mean_logprob=float(rng.normal()), prereg_hash=h))
    return out


def test_c6_holds(env):
    r = run(env, "C6", c6_records(env["hash"], 20, 20))
    assert stat_of("auc_attribution_stratified", r).estimate == 1.0
    assert r.verdict == "holds" and r.cell["positives"] == 120 and r.cell["negatives"] == 120
    assert not r.placebo.passes


def test_c6_killed(env):
    r = run(env, "C6", c6_records(env["hash"], 20, 20, informative=False))
    assert stat_of("auc_attribution_stratified", r).estimate == 0.5 and r.verdict == "killed"


def test_c6_inconclusive_with_too_few_inherent_failures(env):
    r = run(env, "C6", c6_records(env["hash"], 20, 1))
    assert r.verdict == "inconclusive" and any("negatives: 6 <" in x for x in r.reasons)


# --- C7: recompute gating at matched rates -----------------------------------------------------------
def c7_records(h, n_examples, recoverable, cert_right=True):
    """The first ``recoverable`` examples fail compressed (full cache right) at both streaming budgets."""
    out = []
    for i in range(n_examples):
        eid = f"e{i}"
        rec_ = i < recoverable
        out.append(make_record(eid, condition="full", score=1.0, prereg_hash=h))
        for b in (0.125, 0.25):
            sig = (0.9 if rec_ else 0.1) if cert_right else (0.1 if rec_ else 0.9)
            # confidence points the wrong way: the recoverable runs look most confident
            out.append(make_record(eid, condition="streaming", budget=b, signal=sig, score=0.0 if rec_ else 1.0,
                                   mean_logprob=-0.1 if rec_ else -2.0 - 0.01 * i, prereg_hash=h))
    return out


def test_c7_holds_with_known_gains(env):
    r = run(env, "C7", c7_records(env["hash"], 50, 10))
    st = r.details["statistics"]
    # 100 runs, 20 recoverable (10 per stratum = budget); at rate 0.2 the certificate recomputes exactly them in
    # each stratum: +0.2; random: 0.2 × 0.2
    assert st["gain_certificate_stratified@0.2"]["estimate"] == pytest.approx(0.2)
    assert st["gain_certificate@0.2"]["estimate"] == pytest.approx(0.2)  # the pooled gate, beside
    assert st["gain_random@0.2"]["estimate"] == pytest.approx(0.04)
    assert st["gain_confidence_stratified@0.2"]["estimate"] == pytest.approx(0.0)
    assert stat_of("gain_ratio_certificate_over_random_stratified", r).estimate == pytest.approx(5.0)
    assert stat_of("gain_certificate_minus_confidence_stratified", r).estimate == pytest.approx(0.2)
    assert st["gain_certificate_stratified@0.05"]["estimate"] == pytest.approx(0.05)  # curve point
    assert r.verdict == "holds"
    base = {b.kind: b for b in r.placebo.placebos}["stratum_base_rate"]
    # a gate constant within strata recomputes a random share of each: exactly random gating's gain
    assert base.statistic["gain_ratio_certificate_over_random_stratified"]["estimate"] == pytest.approx(1.0)


def test_c7_a_gate_that_only_knows_the_cell_gains_what_random_gains(env):
    """Recoverable runs all sit at the 12.5 % budget, and the gate only knows the budget: pooled, it recomputes
    the 12.5 % runs first (ratio 2); within strata it recomputes a random share of each budget (ratio 1): killed."""
    out = []
    for i in range(50):
        eid = f"e{i}"
        out.append(make_record(eid, condition="full", score=1.0, prereg_hash=env["hash"]))
        for b in (0.125, 0.25):
            fail = b == 0.125 and i < 20
            out.append(make_record(eid, condition="streaming", budget=b, signal=0.9 if b == 0.125 else 0.1,
                                   score=0.0 if fail else 1.0, mean_logprob=-1.0, prereg_hash=env["hash"]))
    r = run(env, "C7", out)
    # pooled, the gate's ties recompute 20 of the 50 runs at 12.5 %: gain 0.08, twice random's 0.04
    assert r.details["statistics"]["gain_ratio_certificate_over_random"]["estimate"] == pytest.approx(2.0)
    assert stat_of("gain_ratio_certificate_over_random_stratified", r).estimate == pytest.approx(1.0)
    assert r.verdict == "killed"


def test_c7_killed_when_the_certificate_points_away(env):
    r = run(env, "C7", c7_records(env["hash"], 50, 10, cert_right=False))
    assert stat_of("gain_ratio_certificate_over_random_stratified", r).estimate == 0.0
    assert r.verdict == "killed"


def test_c7_inconclusive_when_cell_too_small(env):
    r = run(env, "C7", c7_records(env["hash"], 10, 2))  # 20 runs < 30
    assert stat_of("gain_ratio_certificate_over_random_stratified", r).estimate == pytest.approx(5.0)
    assert r.verdict == "inconclusive" and any("minimum 30" in x for x in r.reasons)


def test_c7_without_recoverable_runs_ratio_is_undefined(env):
    r = run(env, "C7", c7_records(env["hash"], 50, 0))
    t = stat_of("gain_ratio_certificate_over_random_stratified", r)
    assert t.skipped == t.resamples and t.outcome == "unclear"
    assert any("resamples undefined" in x for x in r.reasons)
    # the paired difference is exactly 0, which fails "> 0": by the verdict rules a failed test kills
    assert stat_of("gain_certificate_minus_confidence_stratified", r).outcome == "fail" and r.verdict == "killed"


# --- C1, C2: replay --------------------------------------------------------------------------------
def test_c1_holds_and_reports_kinds(env):
    # every draw covered, tightly: error = radius × U(0.9, 1.0), the radius varying ×e^{±1} between draws, so
    # the cell's median radius (the placebo) misses about half of every cell's draws
    replay = replay_frame(24, 40, 4, seed=1, layers=2, heads=2, overshoot=1.0, floor=0.9, spread=1.0)
    r = run(env, "C1", replay=replay)
    t = stat_of("coverage", r)
    assert t.estimate == pytest.approx(replay["covered"].mean()) and t.outcome == "pass"
    st = r.details["statistics"]
    assert "coverage_setting" in st and "coverage_later" in st
    assert r.verdict == "holds" and r.cell["generations"] == 48  # replay cells: 24 groups × 2 kinds
    median = {b.kind: b for b in r.placebo.placebos}["step_cell_median_radius"]
    assert median.statistic["coverage"]["estimate"] < 0.7 and median.verdict == "killed"


def test_c1_uninformative_when_a_cell_constant_radius_covers_as_well(env):
    """A radius far above every error and nearly constant within cells: the certificate covers, and so does its
    cells' median radius — the coverage test cannot tell the certificate from the placebo."""
    replay = replay_frame(24, 40, 4, seed=1, layers=2, heads=2, overshoot=0.3, spread=0.05)
    r = run(env, "C1", replay=replay)
    assert stat_of("coverage", r).outcome == "pass"
    assert r.placebo.passes and r.placebo.kind == "step_cell_median_radius"
    assert r.verdict == "uninformative" and any("placebo" in x for x in r.reasons)
    assert r.seed_stability.agree == 1.0 and r.seed_stability.verdicts == {"uninformative": 5}


def test_replay_claims_resample_the_registered_unit_and_report_the_others_beside(env):
    """``bootstrap.replay_unit: example`` resamples the prompts (the cells of one prompt are not independent): where
    the prompts differ in coverage, the example interval is wider than the cell one, which is reported beside it
    with the example × layer one; ``cell`` (every freeze before it) decides as before and reports nothing beside."""
    import dataclasses

    from kvcert.config.analysis_plan import AnalysisPlanError

    frames = []
    for i, overshoot in enumerate((1.0, 1.0, 1.0, 1.6, 1.6, 1.6)):  # three prompts covered, three at 0.95/1.55
        f = replay_frame(8, 30, 2, seed=10 + i, layers=2, heads=2, overshoot=overshoot)
        frames.append(f.assign(example_id=f"p{i}"))
    replay = pd.concat(frames, ignore_index=True)
    registered = env["plan"]
    plan = dataclasses.replace(registered, bootstrap=dataclasses.replace(  # every freeze before the eighth amendment
        registered.bootstrap, replay_unit="cell", replay_beside=()))
    cluster = dataclasses.replace(plan, bootstrap=dataclasses.replace(
        plan.bootstrap, replay_unit="example", replay_beside=("example_layer", "cell")))
    by_cell = evaluate_claim(env["claims"]["C1"], plan, None, replay, stability=False)
    by_prompt = evaluate_claim(env["claims"]["C1"], cluster, None, replay, stability=False)
    cell_t, prompt_t = stat_of("coverage", by_cell), stat_of("coverage", by_prompt)
    assert cell_t.estimate == prompt_t.estimate  # the point estimate does not depend on the unit
    cell_width = cell_t.ci[1] - cell_t.ci[0]
    prompt_width = prompt_t.ci[1] - prompt_t.ci[0]
    assert prompt_width > 2 * cell_width
    assert prompt_t.unit == "example" and set(prompt_t.beside) == {"example_layer", "cell"}
    assert prompt_t.beside["cell"]["ci"] == pytest.approx([cell_t.ci[0], cell_t.ci[1]])
    assert cell_t.to_dict()["unit"] == "cell" and cell_t.beside == {}
    with pytest.raises(AnalysisPlanError, match="replay_unit: 'prompt' is not a replay unit"):
        dataclasses.replace(plan.bootstrap, replay_unit="prompt")


def test_c1_killed(env):
    replay = replay_frame(24, 40, 4, seed=1, layers=2, heads=2, overshoot=2.0)  # coverage 0.95/1.95
    r = run(env, "C1", replay=replay)
    assert stat_of("coverage", r).estimate == pytest.approx(0.95 / 1.95, abs=0.03) and r.verdict == "killed"


def test_c1_inconclusive_small_and_missing(env):
    small = replay_frame(6, 40, 4, seed=1, layers=2, heads=2, overshoot=1.0)  # 12 cells < 30
    assert run(env, "C1", replay=small).verdict == "inconclusive"
    setting_only = replay_frame(24, 40, 0, seed=1, layers=2, heads=2, overshoot=1.0)
    r = run(env, "C1", replay=setting_only)
    assert r.verdict == "inconclusive" and any("0.125/later" in x for x in r.reasons)
    assert run(env, "C1", replay=None).verdict == "inconclusive"


def test_c2_holds_and_killed(env):
    good = run(env, "C2", replay=replay_frame(24, 40, 4, seed=2, layers=2, heads=2, spread=1.0))
    assert stat_of("spearman_within_cell", good).estimate > 0.6 and good.verdict == "holds"
    assert not good.placebo.passes
    bad = run(env, "C2", replay=replay_frame(24, 40, 4, seed=2, layers=2, heads=2, informative=False))
    assert abs(stat_of("spearman_within_cell", bad).estimate) < 0.1 and bad.verdict == "killed"


def test_c2_a_radius_that_only_knows_the_cell_is_killed_within_cells(env):
    """Cells whose scales differ by orders of magnitude and a radius that knows the scale, not the draw: the pooled
    Spearman is high (what the paper's statistic would pass), the within-cell median is ≈ 0: killed."""
    replay = replay_frame(24, 40, 4, seed=2, layers=2, heads=2, spread=0.3, informative_within=False)
    r = run(env, "C2", replay=replay)
    assert r.details["statistics"]["spearman"]["estimate"] > 0.6
    t = stat_of("spearman_within_cell", r)
    assert abs(t.estimate) < 0.1 and t.outcome == "fail" and r.verdict == "killed"


def test_step_cell_spearman_rules():
    """A cell whose error does not vary is left out; one whose radius does not vary scores 0."""
    from kvcert.analysis.replay_stats import step_cell_spearman

    base = replay_frame(3, 10, 0, seed=5, layers=1, heads=1, budgets=(0.25,), spread=1.0)
    d = base.copy()
    d.loc[d["example_id"] == "0", "error"] = 1.0  # cell 0: constant error, left out
    d.loc[d["example_id"] == "1", "radius"] = 2.0  # cell 1: constant radius, 0
    values, first = step_cell_spearman(d)
    assert len(values) == 2 and values[0] == 0.0 and values[1] > 0.5
    assert d["example_id"].to_numpy()[first].tolist() == ["1", "2"]


# --- C8: the robust certificate on later and sample-dependent queries ------------------------------------------
def test_c8_worst_budget_layer_cell_and_diverged_rows(env):
    replay = replay_frame(24, 40, 4, seed=3, layers=2, heads=2, overshoot=1.0, sample_dependent=True)
    # layer 1 at 12.5 %: its robust radius shrunk to a fifth, so that cell misses most draws while the pooled
    # later coverage stays high
    bad = (replay["layer"] == 1) & (replay["budget"] == 0.125) & (replay["query_kind"] == "later")
    replay.loc[bad, "radius_robust"] *= 0.2
    replay.loc[bad, "covered_robust"] = replay.loc[bad, "error"] <= replay.loc[bad, "radius_robust"]
    r = run(env, "C8", replay=replay)
    worst = stat_of("coverage_robust_later_worst_cell", r)
    assert worst.estimate == pytest.approx(replay.loc[bad, "covered_robust"].mean())
    assert worst.outcome == "fail" and r.verdict == "killed"
    assert r.details["later_coverage_by_budget_layer"]["0.125/layer 1"] == pytest.approx(worst.estimate)
    assert stat_of("coverage_robust_diverged", r).outcome == "pass"  # steps ≥ 2 of the sample-dependent rows
    # every draw of every example × budget diverges from its second decode step on
    assert r.details["diverged_decodes"] == replay.groupby(["example_id", "budget"]).ngroups * 40


def test_c8_unexercised_without_diverged_decodes(env):
    replay = replay_frame(24, 40, 4, seed=3, layers=2, heads=2, overshoot=1.0, sample_dependent=True, diverged=False)
    r = run(env, "C8", replay=replay)
    t = stat_of("coverage_robust_diverged", r)
    assert t.outcome == "unexercised" and r.details["diverged_decodes"] == 0
    assert r.verdict == "inconclusive" and any("unexercised" in x for x in r.reasons)


@pytest.mark.parametrize("name", ["random_score", "step_cell_permuted_radius"])
def test_a_placebo_is_seeded_by_each_rows_key_not_its_position(env, name):
    """The random placebos follow the rows' keys: the same rows read in reverse order (shards given to
    ``kvcert score`` in another order) get the same placebo values, row by row."""
    from kvcert.analysis.claims import _kind, placebo_rows
    from kvcert.analysis.placebos import placebo_rng

    if name == "random_score":
        rows = score(env, c3_records(env["hash"], 6, 2))
        key = ["example_id", "condition", "sampler", "budget"]
        columns = ["cert_signal"]
    else:
        rows = replay_frame(cells=3, draws=5, later=2, seed=1, layers=2, heads=2)
        key = ["model", "example_id", "layer", "head", "budget", "query_kind", "step", "draw"]
        columns = ["radius", "covered", "radius_robust"]
    kind = _kind(env["claims"]["C1"])
    forward = placebo_rows(rows, name, kind, env["plan"], placebo_rng(env["plan"], "C1", name))
    backward = placebo_rows(rows.iloc[::-1].reset_index(drop=True), name, kind, env["plan"],
                            placebo_rng(env["plan"], "C1", name))
    merged = forward.merge(backward, on=key, suffixes=("", "_reversed"))
    assert len(merged) == len(rows)
    for column in columns:
        assert np.array_equal(merged[column].to_numpy(), merged[f"{column}_reversed"].to_numpy(), equal_nan=True), column
    assert not np.array_equal(forward[columns[0]].to_numpy(), rows[columns[0]].to_numpy(), equal_nan=True)


# --- secondary analyses: the certificate against its step cell's constant ------------------------------------
def _with_secondary(plan, claims):
    import dataclasses

    from kvcert.config.analysis_plan import SecondaryPart

    return dataclasses.replace(plan, secondary=SecondaryPart(claims=claims))


def test_secondary_analyses_by_hand():
    """One step cell of ten draws: the top error decile is the draw of largest error, the bottom radius quartile
    the draws at or below numpy's 0.25 quantile of the radius; the constant is the cell's median radius; at
    matched coverage (0.9) each radius is scaled by the averaged-inverted-CDF 0.9 quantile of e/r, and the
    tightness is its median on the log scale (numpy's median of log r/e)."""
    from kvcert.analysis.claims_stats.secondary import prepare
    from kvcert.config.analysis_plan import AnalysisPlan

    error = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 3.0])
    radius = np.array([0.05, 0.5, 0.2, 1.0, 0.6, 0.3, 1.4, 1.6, 1.0, 2.0])
    rows = replay_frame(1, 10, 0, layers=1, heads=1, budgets=[0.25]).assign(error=error, radius=radius)
    rows["covered"] = rows["error"] <= rows["radius"]
    plan = _with_secondary(AnalysisPlan.from_dict({"delta": 0.1}), {"C1": "plugin"})
    point = prepare(rows, plan, "plugin").point
    c = np.median(radius)  # 0.8
    assert point["top_error_coverage"] == 0.0 and point["top_error_coverage_constant"] == float(3.0 <= c)
    low = radius <= np.quantile(radius, 0.25)
    assert point["bottom_radius_coverage"] == pytest.approx(np.mean(error[low] <= radius[low]))
    assert point["bottom_radius_coverage_constant"] == pytest.approx(np.mean(error[low] <= c))
    for r, name in ((radius, "matched_tightness"), (np.full(10, c), "matched_tightness_constant")):
        k = np.quantile(error / r, 0.9, method="averaged_inverted_cdf")
        assert point[name] == pytest.approx(k * np.exp(np.median(np.log(r / error))), rel=1e-12)
    assert point["matched_tightness_ratio"] == pytest.approx(point["matched_tightness"]
                                                             / point["matched_tightness_constant"], rel=1e-12)


def test_secondary_analyses_tell_a_draw_aware_certificate_from_its_cell_constant(env):
    """A radius proportional to its draw's error (1.5 e) covers every draw of largest error and, at matched
    coverage, is exactly as tight as an oracle (tightness 1), where its cell's median radius misses them and is
    looser; the block sits in the claim's details, beside the tests, over the registered unit, and its intervals
    hold their estimates. A plan without ``secondary`` (every freeze before it) reports none."""
    replay = replay_frame(24, 40, 4, seed=4, layers=2, heads=2, overshoot=1.0, spread=1.0)
    replay["radius"] = 1.5 * replay["error"]
    replay["covered"] = True
    plan = _with_secondary(env["plan"], {"C1": "plugin"})
    r = evaluate_claim(env["claims"]["C1"], plan, None, replay, stability=False)
    block = r.details["secondary"]
    st = {k: v for k, v in block["statistics"].items()}
    assert block["certificate"] == "plugin" and block["against"] == "step_cell_median_radius"
    assert st["top_error_coverage"]["estimate"] == 1.0 and st["top_error_coverage_constant"]["estimate"] < 0.2
    assert st["matched_tightness"]["estimate"] == pytest.approx(1.0, rel=1e-12)
    assert st["matched_tightness_constant"]["estimate"] > 1.5 and st["matched_tightness_ratio"]["estimate"] < 0.7
    for name, s in st.items():
        lo, hi = s["ci"]
        assert lo <= s["estimate"] <= hi, name
    without = _with_secondary(env["plan"], {})
    assert "secondary" not in evaluate_claim(env["claims"]["C1"], without, None, replay, stability=False).details


# --- the worst later-query cell, the second data seed, the resamples (ninth amendment's machinery) -------------
def _with_worst_later(plan, claims):
    import dataclasses

    return dataclasses.replace(plan, secondary=dataclasses.replace(plan.secondary, worst_later_cell=claims))


def _planted(seed=3, factor=0.2):
    """A covered replay (coverage 1 in every cell) whose plug-in radius at 12.5 %, layer 1, later queries is shrunk
    to ``factor``: that budget × layer cell misses most of its draws, the pooled coverage stays high."""
    replay = replay_frame(24, 40, 4, seed=seed, layers=2, heads=2, overshoot=1.0)
    bad = (replay["layer"] == 1) & (replay["budget"] == 0.125) & (replay["query_kind"] == "later")
    replay.loc[bad, "radius"] *= factor
    replay.loc[bad, "covered"] = replay.loc[bad, "error"] <= replay.loc[bad, "radius"]
    return replay, bad


def test_the_worst_later_cell_is_found_where_it_was_planted(env):
    """C1's secondary ``worst_later_cell``: over the budget × layer cells of the later queries, the lowest plug-in
    coverage is the planted cell's (its share of covered draws, by hand), named, with its interval over the
    registered unit (the minimum taken in each resample, as C8's test; and that cell's own), each holding its
    estimate; the same minimum as C1's ``coverage_later_worst_cell``; it decides nothing (the verdict is the one
    without it), and a plan without the key (every freeze before the ninth amendment) reports none."""
    replay, bad = _planted()
    plan = _with_worst_later(env["plan"], {"C1": "plugin"})
    with_block = evaluate_claim(env["claims"]["C1"], plan, None, replay, stability=False)
    block = with_block.details["worst_later_cell"]
    assert block["cell"] == "0.125/layer 1" and (block["budget"], block["layer"]) == (0.125, 1)
    assert block["certificate"] == "plugin" and block["unit"] == "example" and block["query_kind"] == "later"
    want = replay.loc[bad, "covered"].mean()
    assert want < 0.5 and block["cells"]["0.125/layer 1"] == pytest.approx(want, rel=1e-12)
    others = [v for k, v in block["cells"].items() if k != "0.125/layer 1"]
    assert len(others) == 5 and min(others) == 1.0 and block["cells_below_nominal"] == 1
    st = block["statistics"]
    for name in ("worst_later_cell_coverage", "worst_later_cell_coverage_fixed"):
        assert st[name]["estimate"] == pytest.approx(want, rel=1e-12)
        lo, hi = st[name]["ci"]
        assert lo <= st[name]["estimate"] <= hi and st[name]["resamples"] == plan.bootstrap.resamples
    assert with_block.details["statistics"]["coverage_later_worst_cell"]["estimate"] == pytest.approx(want, rel=1e-12)
    without = evaluate_claim(env["claims"]["C1"], _with_worst_later(env["plan"], ()), None, replay, stability=False)
    assert "worst_later_cell" not in without.details
    assert without.verdict == with_block.verdict and [t.to_dict() for t in without.tests] == [
        t.to_dict() for t in with_block.tests]


def test_the_worst_later_cell_by_hand():
    """Two budget × layer cells of later queries, of two replay cells each: the cell's coverage is its replay cells'
    covered draws over their draws (pooled, not averaged), the worst the smaller; setting queries do not count."""
    from kvcert.analysis.claims_stats.secondary import prepare_worst_later
    from kvcert.config.analysis_plan import AnalysisPlan

    rows = replay_frame(4, 10, 1, layers=2, heads=2, budgets=[0.25], overshoot=1.0)
    assert sorted(rows.groupby(["layer", "head"]).groups) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    later = rows["query_kind"] == "later"
    rows.loc[later & (rows["layer"] == 1) & (rows["head"] == 0) & (rows["draw"] < 3), "covered"] = False
    rows.loc[later & (rows["layer"] == 0) & (rows["head"] == 1) & (rows["draw"] < 1), "covered"] = False
    rows.loc[~later & (rows["layer"] == 0), "covered"] = False  # setting queries: not a later cell
    prep = prepare_worst_later(rows, AnalysisPlan.from_dict({"delta": 0.1}), "plugin")
    assert prep.details["cells"] == {"0.25/layer 0": pytest.approx(19 / 20), "0.25/layer 1": pytest.approx(17 / 20)}
    assert prep.details["cell"] == "0.25/layer 1" and prep.point["worst_later_cell_coverage"] == pytest.approx(0.85)
    empty = prepare_worst_later(rows[~later], AnalysisPlan.from_dict({"delta": 0.1}), "plugin")
    assert empty.n_units == 0 and empty.details["cell"] is None


def test_a_second_data_seed_is_reported_beside_the_verdict(env):
    """``data_seed``: the replay claim is decided on the deciding seed's table alone (tests, verdict, placebos,
    stability the same as without it); the second seed's table gets the same tests — each test's value and
    interval those of the claim evaluated on that table alone, over the same unit — and the verdict the same rules
    give there, with whether it agrees. Here the deciding seed's prompts are covered (holds) and the second's are
    not (killed): reported, not deciding."""
    deciding = replay_frame(24, 40, 4, seed=1, layers=2, heads=2, overshoot=1.0, floor=0.9, spread=1.0)
    second = replay_frame(24, 40, 4, seed=7, layers=2, heads=2, overshoot=2.0, spread=1.0)
    second["example_id"] = "s9700-" + second["example_id"]
    spec = env["claims"]["C1"]
    alone = evaluate_claim(spec, env["plan"], None, deciding, stability=False)
    r = evaluate_claim(spec, env["plan"], None, deciding, stability=False, data_seed=(9700, second))
    assert r.verdict == alone.verdict == "holds" and [t.to_dict() for t in r.tests] == [t.to_dict() for t in alone.tests]
    assert r.placebo == alone.placebo and r.details == alone.details and alone.data_seed_stability is None
    block = r.data_seed_stability
    other = evaluate_claim(spec, env["plan"], None, second, stability=False)
    assert (block.seed, block.prompts, block.verdict, block.agree) == (9700, 2, other.verdict, False)
    assert other.verdict == "killed" and block.reasons == other.reasons
    assert [{**t.to_dict(), "beside": {}} for t in other.tests] == [t.to_dict() for t in block.tests]  # no beside
    assert block.tests[0].unit == "example" and block.tests[0].estimate == pytest.approx(second["covered"].mean())
    same = evaluate_claim(spec, env["plan"], None, deciding, stability=False, data_seed=(9700, deciding))
    assert same.data_seed_stability.agree and same.data_seed_stability.verdict == "holds"
    c2 = evaluate_claim(env["claims"]["C2"], env["plan"], None, deciding, stability=False, data_seed=(9700, second))
    assert c2.data_seed_stability.tests[0].statistic == "spearman_within_cell"
    c3 = run(env, "C3", records=c3_records(env["hash"], 40, 10))
    assert c3.data_seed_stability is None  # a generation claim has no replay data seed


def test_every_interval_takes_its_resamples_from_the_plan(env):
    """A plan with 50 resamples gives intervals of 50 resamples everywhere: the tests, the statistics reported
    beside them (C2's pooled Spearman), the secondary analyses, the worst later cell and the second data seed's
    tests; no interval is capped or raised by a constant of the code."""
    import dataclasses

    plan = _with_worst_later(_with_secondary(env["plan"], {"C1": "plugin", "C2": "plugin"}), {"C1": "plugin"})
    plan = dataclasses.replace(plan, bootstrap=dataclasses.replace(plan.bootstrap, resamples=50))
    replay, _ = _planted()
    second = replay.assign(example_id="s" + replay["example_id"])
    seen = []
    for cid in ("C1", "C2"):
        r = evaluate_claim(env["claims"][cid], plan, None, replay, stability=False, data_seed=(9700, second))
        seen += [t.resamples for t in r.tests] + [t.resamples for t in r.data_seed_stability.tests]
        seen += [s["resamples"] for s in r.details["statistics"].values()]
        for block in ("secondary", "worst_later_cell"):
            seen += [s["resamples"] for s in r.details.get(block, {}).get("statistics", {}).values()]
        if cid == "C2":
            assert "spearman" in r.details["statistics"]  # the pooled Spearman, reported beside the test
    assert len(seen) > 30 and set(seen) == {50}


def test_the_accuracy_table_takes_its_resamples_from_the_plan(env):
    """The leaderboard's intervals: the plan's resamples (no cap), the same as a bootstrap made with them."""
    import dataclasses

    from kvcert.analysis.leaderboard import accuracy_table, pooled_interval

    df = score(env, c3_records(env["hash"], 40, 10))
    for resamples in (50, 1500):
        plan = dataclasses.replace(env["plan"], bootstrap=dataclasses.replace(env["plan"].bootstrap,
                                                                              resamples=resamples))
        table = accuracy_table(df, analysis_plan=plan)
        row = table[(table["condition"] == "aware") & (table["budget"] == 0.25) & (table["method"] == table["method"])]
        part = df[(df["condition"] == "aware") & (df["budget"] == 0.25) & (df["method"] == row["method"].iloc[0])]
        want = pooled_interval(part.assign(correct=part["correct"].astype(float)), plan.bootstrap)
        assert (row["pooled_low"].iloc[0], row["pooled_high"].iloc[0]) == pytest.approx(want)


def test_the_step_cells_quantiles_are_numpys_per_cell():
    """The secondary analyses' step-cell quantiles, computed for every cell at once (cells of equal size: one
    ``numpy.quantile`` over the rows; unequal: one call per cell), are exactly numpy's quantile of each cell, ties
    and all."""
    from kvcert.analysis.claims_stats.secondary import group_quantile

    rng = np.random.default_rng(0)
    for trial in range(40):
        k, m = int(rng.integers(1, 30)), int(rng.integers(1, 50))
        groups = rng.permutation(np.repeat(np.arange(k), m) if trial % 2 == 0 else rng.integers(0, k, k * m))
        values = rng.lognormal(0.0, 2.0, groups.size)
        values = np.round(values, 1) if trial % 4 == 0 else values  # ties
        for q in (0.1, 0.25, 0.5, 0.9):
            want = pd.Series(values).groupby(groups).transform(lambda v: np.quantile(v, q)).to_numpy()
            assert np.array_equal(group_quantile(values, groups, q), want), (trial, q)
