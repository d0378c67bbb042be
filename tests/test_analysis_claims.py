"""Known-answer tests of every claim of claims.yaml: synthetic records built so that the
statistic's value is known and each verdict — holds, killed, inconclusive — is reached."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvcert.analysis.claims import evaluate_claim
from kvcert.analysis.load import score_shards
from kvcert.prereg import load_claims
from kvcert.testing import frozen_copy, make_record, replay_frame, write_shard

PREREG = Path(__file__).resolve().parents[1] / "preregistration"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prereg") / "preregistration"
    fr = frozen_copy(PREREG, folder)
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
    assert stat_of("induced_failure_rate", r).estimate.estimate == pytest.approx(0.5)
    assert r.verdict == "holds" and r.cell["generations"] == 160


def test_c3_killed(env):
    r = run(env, "C3", c3_records(env["hash"], 40, 0))
    t = stat_of("induced_failure_rate", r)
    assert t.estimate.estimate == 0.0 and t.estimate.ci_high == 0.0 and t.outcome == "fail"
    assert r.verdict == "killed"


def test_c3_inconclusive_when_interval_straddles(env):
    r = run(env, "C3", c3_records(env["hash"], 40, 4))
    t = stat_of("induced_failure_rate", r)
    assert t.estimate.estimate == pytest.approx(0.1) and t.estimate.ci_low < 0.1 < t.estimate.ci_high
    assert r.verdict == "inconclusive" and "straddles" in r.reasons[-1]


def test_c3_inconclusive_when_cell_too_small(env):
    r = run(env, "C3", c3_records(env["hash"], 5, 5))  # 20 runs < 30
    assert stat_of("induced_failure_rate", r).estimate.estimate == 1.0
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
    a, d = stat_of("auc_certificate", r), stat_of("auc_certificate_minus_confidence", r)
    assert a.estimate.estimate == 1.0 and a.outcome == "pass" and d.outcome == "pass"
    conf = r.details["statistics"]["auc_certificate_confidence"]["estimate"]
    assert d.estimate.estimate == pytest.approx(1.0 - conf)
    assert r.verdict == "holds" and r.cell["positives"] == 120 and r.cell["negatives"] == 120
    assert set(r.details["by_length"]) == {"512"}


def test_c4_killed(env):
    r = run(env, "C4", c4_records(env["hash"], 40, 20, informative=False))
    a = stat_of("auc_certificate", r)
    assert a.estimate.estimate == 0.5 and a.estimate.ci_high == 0.5 and a.outcome == "fail"
    assert r.verdict == "killed"


def test_c4_inconclusive_with_too_few_failures(env):
    r = run(env, "C4", c4_records(env["hash"], 40, 1))  # 6 failures < 10 positives
    assert stat_of("auc_certificate", r).estimate.estimate == 1.0
    assert r.verdict == "inconclusive" and any("positives: 6 <" in x for x in r.reasons)


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
    assert stat_of("escalation_gain", r).estimate.estimate == pytest.approx(1 / 6)
    assert r.verdict == "holds" and r.cell["generations"] == 96


def test_c5_killed_without_headroom(env):
    r = run(env, "C5", c5_records(env["hash"], 48, helpful=False))
    t = stat_of("escalation_gain", r)
    assert t.estimate.estimate == 0.0 and t.estimate.ci_high == 0.0 and r.verdict == "killed"


def test_c5_inconclusive_when_too_few_chains(env):
    r = run(env, "C5", c5_records(env["hash"], 10))  # 20 chains < 30
    assert stat_of("escalation_gain", r).estimate.estimate == pytest.approx(0.2)
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
    assert stat_of("auc_attribution", r).estimate.estimate == 1.0
    assert r.verdict == "holds" and r.cell["positives"] == 120 and r.cell["negatives"] == 120


def test_c6_killed(env):
    r = run(env, "C6", c6_records(env["hash"], 20, 20, informative=False))
    assert stat_of("auc_attribution", r).estimate.estimate == 0.5 and r.verdict == "killed"


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
    # 100 runs, 20 recoverable; at rate 0.2 the certificate recomputes exactly them: +0.2; random: 0.2 × 0.2
    assert st["gain_certificate@0.2"]["estimate"] == pytest.approx(0.2)
    assert st["gain_random@0.2"]["estimate"] == pytest.approx(0.04)
    assert st["gain_confidence@0.2"]["estimate"] == pytest.approx(0.0)
    assert stat_of("gain_ratio_certificate_over_random", r).estimate.estimate == pytest.approx(5.0)
    assert stat_of("gain_certificate_minus_confidence", r).estimate.estimate == pytest.approx(0.2)
    assert st["gain_certificate@0.05"]["estimate"] == pytest.approx(0.05)  # curve point
    assert r.verdict == "holds"


def test_c7_killed_when_the_certificate_points_away(env):
    r = run(env, "C7", c7_records(env["hash"], 50, 10, cert_right=False))
    assert stat_of("gain_ratio_certificate_over_random", r).estimate.estimate == 0.0 and r.verdict == "killed"


def test_c7_inconclusive_when_cell_too_small(env):
    r = run(env, "C7", c7_records(env["hash"], 10, 2))  # 20 runs < 30
    assert stat_of("gain_ratio_certificate_over_random", r).estimate.estimate == pytest.approx(5.0)
    assert r.verdict == "inconclusive" and any("minimum 30" in x for x in r.reasons)


def test_c7_without_recoverable_runs_ratio_is_undefined(env):
    r = run(env, "C7", c7_records(env["hash"], 50, 0))
    t = stat_of("gain_ratio_certificate_over_random", r)
    assert t.estimate.skipped == t.estimate.resamples and t.outcome == "unclear"
    assert any("resamples undefined" in x for x in r.reasons)
    # the paired difference is exactly 0, which fails "> 0": by the verdict rules a failed test kills
    assert stat_of("gain_certificate_minus_confidence", r).outcome == "fail" and r.verdict == "killed"


# --- C1, C2: replay --------------------------------------------------------------------------------
def test_c1_holds_and_reports_kinds(env):
    replay = replay_frame(24, 40, 4, seed=1, layers=2, heads=2, overshoot=1.0)  # every draw covered
    r = run(env, "C1", replay=replay)
    t = stat_of("coverage", r)
    assert t.estimate.estimate == pytest.approx(replay["covered"].mean()) and t.outcome == "pass"
    st = r.details["statistics"]
    assert "coverage_setting" in st and "coverage_later" in st
    assert r.verdict == "holds" and r.cell["generations"] == 48  # replay cells: 24 groups × 2 kinds


def test_c1_killed(env):
    replay = replay_frame(24, 40, 4, seed=1, layers=2, heads=2, overshoot=2.0)  # coverage 0.95/1.95
    r = run(env, "C1", replay=replay)
    assert stat_of("coverage", r).estimate.estimate == pytest.approx(0.95 / 1.95, abs=0.03) and r.verdict == "killed"


def test_c1_inconclusive_small_and_missing(env):
    small = replay_frame(6, 40, 4, seed=1, layers=2, heads=2, overshoot=1.0)  # 12 cells < 30
    assert run(env, "C1", replay=small).verdict == "inconclusive"
    setting_only = replay_frame(24, 40, 0, seed=1, layers=2, heads=2, overshoot=1.0)
    r = run(env, "C1", replay=setting_only)
    assert r.verdict == "inconclusive" and any("0.125/later" in x for x in r.reasons)
    assert run(env, "C1", replay=None).verdict == "inconclusive"


def test_c2_holds_and_killed(env):
    good = run(env, "C2", replay=replay_frame(24, 40, 4, seed=2, layers=2, heads=2))
    assert stat_of("spearman", good).estimate.estimate > 0.6 and good.verdict == "holds"
    bad = run(env, "C2", replay=replay_frame(24, 40, 4, seed=2, layers=2, heads=2, informative=False))
    assert abs(stat_of("spearman", bad).estimate.estimate) < 0.1 and bad.verdict == "killed"
