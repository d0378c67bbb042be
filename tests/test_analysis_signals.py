"""Known-answer tests of the comparison signals (third amendment), through the whole
analysis path the CLI runs: shards → score_step → claims_step → report_step (summary.json).

Construction (the main grid, task needle): at 512 tokens 40 examples, the even ones answerable
(the full cache right); every compressed run (2 conditions × 3 budgets × top-k, Poisson) of an
unanswerable example fails (inherent), of an answerable one fails at budget 0.125 only
(cache-induced). Per method × condition at 512: 120 runs, 80 failed / 40 correct; 80 failures,
20 induced / 60 inherent. At 1024 tokens 4 examples: 12 runs per cell, below the minimum.

* ``output_entropy`` (failure: higher) and the certificate: correct 0.1, inherent 0.5, induced
  0.9; ``top2_margin`` (failure: lower): 0.9, 0.5, 0.1. Every failed run outranks every correct
  one and every induced failure every inherent one: AUC exactly 1 in every resample.
* ``attention_entropy``, ``evicted_mass``, ``evicted_mass_expected`` and ``mean_logprob`` are
  constant: every pair ties, AUC exactly ½.

The multi-turn cell: 40 examples per turn-distance bucket (1–5, 6–15, 16+), half answerable,
every compressed run failing (20 induced / 20 inherent per bucket and method). The certificate
and −log-probability put induced above inherent in the first bucket (AUC 1), below in the
second (AUC 0) and tie in the third (AUC ½), in every resample; pooled over the buckets every
induced value meets the same multiset of inherent values, so AUC ½ (a resample unbalances it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcert.analysis.load import SCORE_COLUMNS
from kvcert.config.prereg import load_claims
from kvcert.analysis.signals import failure_score, signal_column
from kvcert.analysis.steps import claims_step, report_step, score_step
from kvcert.testing import frozen_copy, make_record, write_shard

ROOT = Path(__file__).resolve().parents[1]
PERFECT = ("certificate", "output_entropy", "top2_margin")
CONSTANT = ("attention_entropy", "evicted_mass", "evicted_mass_expected", "mean_logprob")
LEVEL = {"correct": 0.1, "inherent": 0.5, "induced": 0.9}


def main_records(h: str, examples: int, length: int) -> list[dict]:
    out = []
    for i in range(examples):
        eid, answerable = f"e{length}-{i}", i % 2 == 0
        base = dict(task="needle", target_tokens=length, prereg_hash=h)
        out.append(make_record(eid, condition="full", score=float(answerable), **base))
        for cond in ("aware", "streaming"):
            for budget in (0.125, 0.25, 0.5):
                fails = not answerable or budget == 0.125
                label = "correct" if not fails else "induced" if answerable else "inherent"
                v = LEVEL[label]
                signals = {"output_entropy": v, "top2_margin": 1.0 - v, "attention_entropy": 2.0,
                           "evicted_mass": 0.3, "evicted_mass_expected": 0.3}
                for sampler in ("topk", "poisson"):
                    out.append(make_record(eid, condition=cond, sampler=sampler, budget=budget, score=float(not fails),
                                           signal=v if sampler == "poisson" else None, mean_logprob=-0.5,
                                           signals=signals, **base))
    return out


def multiturn_cell(h: str, per_bucket: int = 40) -> list[dict]:
    out = []
    for b, (start, width) in enumerate(((1, 5), (6, 10), (16, 15))):
        for j in range(per_bucket):
            eid, answerable = f"mt{b}-{j}", j % 2 == 0
            v = [0.9, 0.1, 0.5][b] if answerable else [0.1, 0.9, 0.5][b]
            base = dict(task="multiturn", target_tokens=2048, turn_distance=start + j % width, prereg_hash=h)
            out.append(make_record(eid, condition="full", score=float(answerable), **base))
            for sampler in ("topk", "poisson"):
                out.append(make_record(eid, condition="streaming", sampler=sampler, budget=0.1, score=0.0,
                                       signal=v if sampler == "poisson" else None, mean_logprob=-v, **base))
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("signals")
    prereg = tmp / "preregistration"
    h = frozen_copy(ROOT / "preregistration", prereg, resamples=1000, stability_seeds=2).prereg_hash
    records = main_records(h, 40, 512) + main_records(h, 4, 1024) + multiturn_cell(h)
    shards = [write_shard(records[i:i + 400], tmp / "shards" / f"s{i}.jsonl") for i in range(0, len(records), 400)]
    score_step(shards, prereg, tmp / "scores.parquet")
    content = claims_step(tmp / "scores.parquet", [], prereg, "smoke", tmp / "claims.json")
    paths = report_step(tmp / "claims.json", tmp / "scores.parquet", [], [], tmp / "report")
    plan = load_claims(prereg)["analysis_plan"]
    return {"block": content["comparison_signals"], "paths": paths, "plan": plan}


def rows(block, task, **where):
    return [r for r in block[task]["rows"] if all(r.get(k) == v for k, v in where.items())]


def one(block, task, **where):
    found = rows(block, task, **where)
    assert len(found) == 1, (where, found)
    return found[0]


@pytest.mark.parametrize("task", ["prediction", "attribution"])
def test_separating_signals_give_one_and_constant_signals_one_half(run, task):
    block = run["block"]
    for signal, spec in block["signals"].items():
        methods = [*spec["methods"], *(["+".join(spec["methods"])] if len(spec["methods"]) > 1 else [])]
        for method in methods:
            r = one(block, task, signal=signal, method=method, condition="all", target_tokens="all")
            want = 1.0 if signal in PERFECT else 0.5
            assert r["estimate"] == want and r["ci"] == [want, want], (signal, method, r)
            assert r["stratified"] == {"estimate": want, "ci": [want, want]}, (signal, method, r)  # within strata too
            assert r["below_minimum"] == [] and r["resamples"] == 1000 and r["skipped"] == 0
    # a "lower" signal read the wrong way round would score 0: the orientation is the plan's
    assert block["signals"]["top2_margin"]["failure"] == "lower" and block["signals"]["output_entropy"]["failure"] == "higher"


def test_cells_counts_and_methods(run):
    block = run["block"]
    for method in ("topk", "poisson"):
        for cond in ("aware", "streaming"):
            p = one(block, "prediction", signal="mean_logprob", method=method, condition=cond, target_tokens=512)
            a = one(block, "attribution", signal="mean_logprob", method=method, condition=cond, target_tokens=512)
            assert (p["generations"], p["positives"], p["negatives"]) == (120, 80, 40)
            assert (a["generations"], a["positives"], a["negatives"]) == (80, 20, 60)
        pooled = one(block, "prediction", signal="output_entropy", method=method, condition="all", target_tokens="all")
        assert pooled["generations"] == 2 * (120 + 12)  # the multi-turn runs are not in the main grid
    both = one(block, "prediction", signal="output_entropy", method="topk+poisson", condition="all", target_tokens="all")
    assert both["generations"] == 4 * (120 + 12)
    # certificate and the expected evicted mass: Poisson only; no top-k rows, no pooled-over-methods rows
    for signal in ("certificate", "evicted_mass_expected"):
        assert {r["method"] for r in rows(block, "prediction", signal=signal)} == {"poisson"}
    assert block["prediction"]["cells"] == "C4" and block["attribution"]["cells"] == "C6"
    assert block["prediction"]["missing"] == [] and block["attribution"]["missing"] == []


def test_cell_below_the_minimum_is_null_and_says_why(run):
    block = run["block"]
    for method in ("topk", "poisson"):
        r = one(block, "prediction", signal="output_entropy", method=method, condition="aware", target_tokens=1024)
        assert r["estimate"] is None and r["ci"] == [None, None]
        assert (r["generations"], r["positives"], r["negatives"]) == (12, 8, 4)  # 2 x 3 inherent + 2 induced; 4 correct
        assert any(m.startswith("generations: 12 < ") for m in r["below_minimum"])
        assert any(m.startswith("negatives: 4 < ") for m in r["below_minimum"])
    md = run["paths"]["markdown"].read_text()
    assert "– (generations: 12 < the pre-registered minimum 30" in md


def test_turn_distance_buckets_pick_their_rows(run):
    td = run["block"]["turn_distance"]
    assert td["buckets"] == [list(b) for b in run["plan"].comparison_signals.turn_distance.buckets]
    want = {"1-5": 1.0, "6-15": 0.0, "16-1000000": 0.5, "all": 0.5}
    got = {(r["signal"], r["method"], r["bucket"]): r for r in td["rows"]}
    assert set(got) == {(s, m, b) for s, m in (("certificate", "poisson"), ("mean_logprob", "topk"),
                                                ("mean_logprob", "poisson")) for b in want}
    for (signal, method, bucket), r in got.items():
        assert r["estimate"] == want[bucket], (signal, method, bucket)
        if bucket == "all":  # a resample unbalances the buckets: the interval only brackets the point
            assert r["ci"][0] < 0.5 < r["ci"][1]
        else:  # within a bucket every resample keeps the order (or the ties)
            assert r["ci"] == [want[bucket]] * 2, (signal, method, bucket)
        n = 120 if bucket == "all" else 40
        assert (r["generations"], r["positives"], r["negatives"]) == (n, n // 2, n // 2)


def test_summary_has_every_plan_signal(run):
    summary = json.loads(run["paths"]["summary"].read_text())
    assert set(summary["signal_auc"]) == set(run["plan"].comparison_signals.signals)
    for signal, aucs in summary["signal_auc"].items():
        want = 1.0 if signal in PERFECT else 0.5
        assert aucs == {"prediction": want, "attribution": want, "prediction_stratified": want,
                        "attribution_stratified": want}, signal
    assert set(summary["claims"]) == {f"C{i}" for i in range(1, 9)}


def test_report_section_table_and_figures(run):
    md = run["paths"]["markdown"].read_text()
    section = md.split("## Comparison signals (signal leaderboard)")[1].split("\n## ")[0]
    assert "Secondary analyses, not claims" in section and "third amendment" in section
    one_ = "1.000 [1.000, 1.000]"
    half = "0.500 [0.500, 0.500]"
    assert f"| certificate | higher | poisson | {one_} | {one_} | 0.555–0.572 | {one_} | {one_} | 0.65–0.75 |" in section
    assert f"| mean_logprob | lower | topk+poisson | {half} | {half} | 0.78–0.81 | {half} | {half} | 0.47–0.54 |" in section
    for name in ("output_entropy", "top2_margin", "attention_entropy"):
        assert f"| {name} | " in section and "0.43–0.51" in section
    assert "### By condition and prompt length" in section and "### Attribution by turn distance" in section
    for fig in ("signal_leaderboard", "turn_distance_attribution"):
        assert (run["paths"]["figures"] / f"{fig}.png").exists() and f"figures/{fig}.png" in section
    assert "[Comparison signals (signal leaderboard)](#comparison-signals-signal-leaderboard)" in md


def test_every_plan_signal_has_a_score_column():
    from kvcert.config.analysis_plan import ComparisonSignal

    plan = load_claims(ROOT / "preregistration")["analysis_plan"]
    for name, spec in plan.comparison_signals.signals.items():
        assert signal_column(name, spec, plan, SCORE_COLUMNS) in SCORE_COLUMNS
    with pytest.raises(ValueError, match="no score-table column"):
        signal_column("x", ComparisonSignal("nowhere", "higher", ("topk",)), plan, SCORE_COLUMNS)
    assert list(failure_score([1.0, 2.0], "lower")) == [-1.0, -2.0]
    with pytest.raises(ValueError, match="higher' or 'lower"):
        failure_score([1.0], "up")

