"""The analysis steps end to end on synthetic records: claims.json, report.md, a
self-contained report.html, figures, provenance (pre-freeze generations listed), and
refusal of inputs from another pre-registration."""

from __future__ import annotations

import json
import re
import runpy
import sys
from pathlib import Path
from unittest.mock import patch

import pytest
import torch

from kvcert.analysis.load import RecordRefused, write_table
from kvcert.analysis.steps import claims_step, report_step, score_step, write_json
from kvcert.testing import frozen_copy, multiturn_records, paper_records, replay_frame, write_shard
from kvcert.impossibility import impossibility_demo
from kvcert.scorers.base import LayerObservation

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    prereg = tmp / "preregistration"
    fr = frozen_copy(ROOT / "preregistration", prereg, resamples=1000, stability_seeds=4)
    h, started = fr.prereg_hash, "2030-01-01T00:00:00+00:00"
    records = list(paper_records(["embedded"], [512, 2048], {"needle": 16, "multikey": 16}, h, started,
                                 decode_steps=4, layers=4))
    records += list(multiturn_records("embedded", 40, h, started))
    records[1]["started_utc"] = "1999-12-31T23:59:59+00:00"  # an aware run started before the freeze
    shards = [write_shard(records[:300], tmp / "shards" / "a.jsonl"), write_shard(records[300:], tmp / "shards" / "b.jsonl")]
    # the score step through its entry-point script, as the workflow runs it
    argv = [str(ROOT / "analysis" / "score.py"), "--shards", *map(str, shards), "--prereg", str(prereg),
            "--out", str(tmp / "scores.parquet")]
    with patch.object(sys, "argv", argv):
        runpy.run_path(argv[0], run_name="__main__")
    replay = write_table(replay_frame(24, 20, 4, seed=0, layers=2, heads=2, sample_dependent=True), tmp / "replay.parquet",
                         {"prereg_hash": h, "model": "synthetic", "examples": 2, "budgets": [0.125, 0.25, 0.5]})
    gen = torch.Generator().manual_seed(0)
    obs = LayerObservation(torch.randn(1, 4, 40, 16, generator=gen, dtype=torch.float64),
                           torch.randn(1, 2, 200, 16, generator=gen, dtype=torch.float64),
                           torch.randn(1, 2, 200, 16, generator=gen, dtype=torch.float64), None, 0.25)
    res = impossibility_demo(obs, budget=0.25, mode="shift")
    imp = write_json({"model": "synthetic", "prereg_hash": h, "rows": [{
        "model": "synthetic", "layer": 0, "mode": res.mode, "budget": res.budget,
        "retained_hash_before": res.retained_hash_before, "retained_hash_after": res.retained_hash_after,
        "error_before": res.error_before, "error_after": res.error_after, "error_ratio": res.error_ratio,
        "identical_retained_state": res.identical_retained_state}]}, tmp / "imp.json")
    # the planted pre-freeze record is left out knowingly (claims refuse that by default)
    content = claims_step(tmp / "scores.parquet", [replay], prereg, "smoke", tmp / "claims.json", accept_excluded=True)
    paths = report_step(tmp / "claims.json", tmp / "scores.parquet", [replay], [imp], tmp / "report")
    return {"tmp": tmp, "prereg": prereg, "hash": h, "content": content, "paths": paths, "shards": shards,
            "replay": replay, "frozen": fr.frozen_utc}


def test_claims_json(run):
    doc = json.loads((run["tmp"] / "claims.json").read_text())
    assert [c["id"] for c in doc["claims"]] == [f"C{i}" for i in range(1, 9)]
    for c in doc["claims"]:
        assert {"id", "statement", "value", "ci", "threshold", "verdict", "paper", "tests"} <= set(c)
        assert c["verdict"] in ("holds", "killed", "inconclusive", "uninformative") and (c["paper"]["verdict"] or c["beyond_paper"])
    c8 = doc["claims"][7]
    assert c8["beyond_paper"] and c8["cell"]["generations"] == 72  # 24 groups × 3 query kinds
    assert [t["statistic"] for t in c8["tests"]] == ["coverage_robust_later", "coverage_robust_later_worst_cell",
                                                     "coverage_robust_diverged", "tightness_robust_later"]
    for c in doc["claims"]:  # every claim carries its placebo and the verdict's stability over seeds
        assert {"applicable", "verdict", "statistic", "passes"} <= set(c["placebo"]), c["id"]
        assert c["seed_stability"]["seeds"] == 4 and 0.0 <= c["seed_stability"]["agree"] <= 1.0
    assert not doc["claims"][2]["placebo"]["applicable"]  # C3 reads no signal
    c4 = doc["claims"][3]
    assert [t["statistic"] for t in c4["tests"]] == ["auc_certificate_stratified",
                                                     "auc_certificate_stratified_minus_confidence"]
    assert doc["provenance"]["prereg_hash"] == run["hash"]
    assert doc["claims"][0]["cell"]["generations"] == 48  # replay cells: 24 groups × 2 query kinds


def test_report_markdown_order_and_provenance(run):
    md = run["paths"]["markdown"].read_text()
    assert md.index("## Claims") < md.index("## Figures") < md.index("## Provenance")
    assert "| C1 |" in md and "| C7 |" in md
    assert run["hash"] in md and run["frozen"] in md
    assert "a.jsonl:2" in md  # the pre-freeze generation is listed
    assert "Generations per setting" in md and (run["tmp"] / "report" / "generations_per_cell.csv").exists()
    assert "## Claims" in md and "### Tests" in md and "(the paper's pooled statistic; reported, not tested)" in md
    for name in ("accuracy", "induced_failure", "auc_prediction_attribution", "coverage", "tightness",
                 "recompute_gain", "multiturn_recall", "signal_leaderboard"):
        assert (run["paths"]["figures"] / f"{name}.png").exists(), name
        assert f"figures/{name}.png" in md
    assert (run["tmp"] / "report" / "failure_labels.csv").exists()
    summary = json.loads(run["paths"]["summary"].read_text())
    assert set(summary["claims"]) == {f"C{i}" for i in range(1, 9)} and summary["prereg_hash"] == run["hash"]
    assert "beyond the paper" in md and "anytime (all steps of a path)" in md
    # figures numbered in order of appearance, a contents list, the miniature banner
    numbers = [int(n) for n in re.findall(r"^\*Fig\. (\d+) — ", md, re.M)]
    # 8: the signal leaderboard joins the seven; the turn-distance figure is left out (every bucket below the minimum)
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) == 8
    assert "no bucket reaches the pre-registered minimum cell" in md
    assert md.index("Contents: [Claims](#claims)") < md.index("## Claims")
    assert "[Accuracy by setting](#accuracy-by-setting)" in md
    assert md.startswith("# kvcert claim report") and "> **A miniature, not the paper's models.**" in md


def test_accuracy_table_is_the_plain_results(run):
    """The leaderboard: the full cache first, every setting's accuracy per task and pooled,
    compression_ratio = 1 - budget, computed from the scored records."""
    import pandas as pd

    from kvcert.analysis.leaderboard import accuracy_table
    from kvcert.analysis.load import read_table, scored

    scores = scored(read_table(run["tmp"] / "scores.parquet")[0])
    board = accuracy_table(scores, ["needle"])
    assert board.iloc[0]["condition"] == "full" and board.iloc[0]["budget"] == 1.0
    for _, row in board.iterrows():
        cell = scores[(scores.condition == row.condition) & (scores.method == row.method)
                      & (scores.budget == row.budget) & (scores.task == "needle")]
        assert row["needle"] == pytest.approx(cell["correct"].astype(float).mean())
        assert row["runs"] == len(cell) and row["compression_ratio"] == pytest.approx(1 - row["budget"])
        assert row["needle_low"] <= row["needle"] <= row["needle_high"]  # each task's interval beside its share
    md = run["paths"]["markdown"].read_text()
    assert "| condition | method | budget | compression_ratio | runs | needle | multikey | pooled |" in md
    assert board["pooled_low"].le(board["pooled"]).all() and board["pooled_high"].ge(board["pooled"]).all()
    assert isinstance(board, pd.DataFrame)


def test_report_html_reads_in_a_browser(run):
    """Tables scroll inside their own box instead of overflowing the page, statistic names are code that
    does not wrap (each named once per row), italics and code render, headings have anchors."""
    page = run["paths"]["html"].read_text()
    assert page.count('<div class="scroll"><table>') == page.count("<table>")
    assert "<code>auc_certificate_stratified</code>" in page and "td code{white-space:nowrap}" in page
    assert "<em>Error Certificates for KV-Cache Eviction via Randomized Design</em>" in page
    assert '<h2 id="claims">Claims</h2>' in page and '<a href="#claims">Claims</a>' in page
    assert '<div class="note"><strong>A miniature' in page


def test_auc_panel_without_an_estimate_says_why(tmp_path):
    from kvcert.analysis.figures import auc_figure

    claim = {"id": "C6", "tests": [{"statistic": "auc_attribution", "threshold": 0.65}],
             "details": {"statistics": {}}, "reasons": ["cell below the minimum (0 negatives < 10)"],
             "cell": {"positives": 40, "negatives": 0}}
    path = auc_figure([claim], tmp_path / "auc.png")
    assert path is not None and path.exists()  # the panel is drawn, with its reason, not left out


def test_report_html_is_self_contained(run):
    page = run["paths"]["html"].read_text()
    assert page.count("data:image/png;base64,") == 8
    assert "src=\"http" not in page and "<link" not in page and "figures/" not in page.split("<body>")[1].split("<pre>")[0]
    assert '<strong class="' in page


def test_inputs_from_another_preregistration_are_refused(run, tmp_path):
    bad = write_table(replay_frame(2, 2, 0), tmp_path / "bad.parquet", {"prereg_hash": "0" * 64})
    with pytest.raises(RecordRefused, match="bad.parquet"):
        claims_step(run["tmp"] / "scores.parquet", [bad], run["prereg"], "smoke", tmp_path / "c.json")
    other = tmp_path / "other"
    frozen_copy(ROOT / "preregistration", other)
    (other / "grids" / "smoke.yaml").write_text((other / "grids" / "smoke.yaml").read_text() + "# amended\n")
    from kvcert.prereg import freeze

    freeze(other, reason="test amendment")
    with pytest.raises(RecordRefused, match="rerun the score step"):
        claims_step(run["tmp"] / "scores.parquet", [], other, "smoke", tmp_path / "c.json")
    with pytest.raises(RecordRefused, match="differs from the verified freeze"):
        score_step(run["shards"], other, tmp_path / "s.parquet")
    stale = write_json({"prereg_hash": "1" * 64}, tmp_path / "verified.json")
    with pytest.raises(RecordRefused, match="rerun the claims step"):
        report_step(run["tmp"] / "claims.json", None, [], [], tmp_path / "r", verified_json=stale)


def test_the_run_ends_with_every_verdict_its_caveat_and_the_report(tmp_path):
    """The console's last words (the Snakefile's onsuccess): one line per claim beside the paper's verdict, the
    run's caveat (a rehearsal's stand-ins, the embedded miniature), the report's paths."""
    import json

    from kvcert.analysis.report import caveat
    from kvcert.pipeline.console import verdict_lines

    assert verdict_lines(tmp_path) == [f"kvcert: no {tmp_path / 'summary.json'} yet (the report step has not run)"]
    summary = {"experiment": "rehearsal", "prereg_hash": "ab" * 32, "caveat": caveat("rehearsal", {}),
               "claims": {"C1": {"verdict": "holds", "statistic": "coverage", "value": 0.91, "ci": [0.9, 0.92],
                                 "paper_verdict": "holds", "seed_stability": 1.0},
                          "C8": {"verdict": "killed", "statistic": "coverage_robust_later", "value": None,
                                 "ci": [None, None], "paper_verdict": None, "seed_stability": 0.95}}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "report.html").write_text("<html></html>")
    lines = verdict_lines(tmp_path)
    assert lines[1] == "  C1: holds         coverage = 0.910 [0.900, 0.920]; paper: holds; same verdict on 100 % of other bootstrap seeds"
    assert lines[2].startswith("  C8: killed        coverage_robust_later = –; paper: none (beyond the paper)")
    assert lines[3] == "kvcert: a rehearsal on stand-in models with random weights: its verdicts mean nothing"
    assert lines[4] == f"kvcert: report {(tmp_path / 'report.html').resolve()}"
    assert caveat("smoke", {"models": ["embedded"]}).startswith("a miniature") and caveat("paper", {"models": ["x"]}) is None
