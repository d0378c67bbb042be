"""Small claims documents for the tests of the verdict check and the reference commands (not a test module).

:func:`claim` builds one claim whose outcomes and verdict follow from its tests by the registered rules (as the
claims step records them); :func:`document` wraps claims into a ``claims.json`` mapping with a replay summary of the
real experiment's shape (162,000 setting, 648,000 later and 648,000 sample-dependent draws over three budgets);
:func:`finished_run` writes a run folder that `kvcert reference update` accepts.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvcert.analysis.claims_document import (ClaimResult, ClaimsDocument, ClaimTest, PaperOutcome, PlaceboBlock,
                                             PlaceboRun)
from kvcert.analysis.stats import claim_verdict
from kvcert.analysis.verdict_check import outcome

ROWS = {"setting": 162000, "later": 648000, "sample_dependent": 648000}
BUDGETS = [0.125, 0.25, 0.5]


def make_test(statistic: str, op: str, threshold: float, estimate: float, low: float, high: float) -> ClaimTest:
    return ClaimTest(statistic, op, threshold, False, estimate, [low, high], 0.9, 4000, 0, 0.0,
                     outcome([low, high], op, threshold, 4000, 0))


def claim(cid: str, tests: list[tuple], source: str = "replay", counts: dict | None = None,
          placebo: list[tuple] | None = None, kinds: tuple = ("setting", "later")) -> ClaimResult:
    """A claim of ``tests`` ((statistic, op, threshold, estimate, low, high)), its verdict the rules' (``placebo``:
    each placebo's tests, the same shape, on the same statistics)."""
    made = [make_test(*t) for t in tests]
    counts = counts or ({"generations": 9720} if source == "replay" else {"generations": 384})
    cell = {**counts, "minimum": {"generations": 30}}
    runs = []
    for i, ptests in enumerate(placebo or []):
        pt = [make_test(*t) for t in ptests]
        runs.append(PlaceboRun(f"placebo{i}", "a placebo", claim_verdict([t.outcome for t in pt], True),
                               {t.statistic: {"estimate": t.estimate, "ci": t.ci, "level": 0.9, "resamples": 4000,
                                              "skipped": 0, "outcome": t.outcome} for t in pt}, []))
    holds = any(r.verdict == "holds" for r in runs)
    block = (PlaceboBlock(True, None, runs[0].verdict, holds, runs, kind=runs[0].kind) if runs else
             PlaceboBlock(False, None, None, False, [], reason="no signal"))
    verdict = claim_verdict([t.outcome for t in made], True, holds)
    details = {"observations": sum(ROWS[k] for k in kinds), "diverged_rows": 14490, "paths": 324000,
               "later_coverage_by_budget_layer": {f"{b:g}/layer {layer}": 0.95 for b in BUDGETS for layer in range(10)}}
    return ClaimResult(cid, f"claim {cid}", source, "", "", made, verdict, [], cell, PaperOutcome(None, None), block,
                       None, {"budgets": BUDGETS, "query_kinds": list(kinds)} if source == "replay" else {},
                       details if source == "replay" else {})


def document(claims: list[ClaimResult], experiment: str = "real", prereg: str = "a" * 64) -> dict:
    """A claims.json mapping of ``claims``."""
    summary = {"by_kind": {k: {"observations": n} for k, n in ROWS.items()},
               "by_budget": {f"{b:g}": {} for b in BUDGETS}}
    provenance = {"prereg_hash": prereg, "frozen_utc": "2026-12-01T00:00:00+00:00", "freeze_record": "f",
                  "analysis_git_commit": "c" * 40, "bootstrap": {}, "scores": {}, "replay": [], "seconds": 1.0}
    out = {"experiment": experiment, "paper": {}, "verdict_rules": None, "analysis_plan": {"delta": 0.1}, "grid": {},
           "provenance": provenance, "replay_summary": summary, "claims": [c.to_dict() for c in claims],
           "comparison_signals": None}
    ClaimsDocument.from_dict(out)  # what the claims step writes
    return out


def standard(**moved) -> list[ClaimResult]:
    """C1 (replay coverage), C5 (a generation share) and C8 (robust later coverage and tightness) as the real run
    had them; ``moved``: {name: (estimate, low, high)} replacing a test's numbers (its outcome and the verdict
    follow)."""
    def t(name, op, threshold, est, lo, hi):
        return (name, op, threshold, *moved.get(name, (est, lo, hi)))

    return [claim("C1", [t("coverage", ">=", 0.85, 0.96470864, 0.96338265, 0.96598920)]),
            claim("C5", [t("escalation_gain", ">=", 0.01, 0.00390625, -0.01302083, 0.015625)], source="generations"),
            claim("C8", [t("coverage_robust_later", ">=", 0.9, 0.9903148148148149, 0.9883533950617284,
                           0.9922407407407408),
                         t("coverage_robust_later_worst_cell", ">=", 0.9, 0.9118981481481482, 0.8795833333333334,
                           0.9437523148148148),
                         t("tightness_robust_later", "<=", 6.0, 5.5912544868578635, 5.565576347162964,
                           5.618094207095586)], kinds=("setting", "later", "sample_dependent"))]


def write_run(folder: Path, claims: list[ClaimResult] | dict, code_digests: list[str], experiment: str = "real",
              prereg: str = "a" * 64) -> Path:
    """A run folder's claims.json and the summary.json the report step writes beside it (verdicts and values)."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = claims if isinstance(claims, dict) else document(claims, experiment, prereg)
    (folder / "claims.json").write_text(json.dumps(doc))
    summary = {"experiment": doc["experiment"], "prereg_hash": doc["provenance"]["prereg_hash"],
               "code_digests": code_digests,
               "claims": {c["id"]: {"verdict": c["verdict"], "statistic": c["statistic"], "value": c["value"],
                                    "ci": c["ci"]} for c in doc["claims"]}}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def finished_run(folder: Path, code_digests: list[str], claims: list[ClaimResult] | None = None,
                 experiment: str = "real") -> Path:
    """A finished run `kvcert reference update` accepts: claims, summary, stub report, scores and cells, a figure,
    a small replay table and one generation shard."""
    from kvcert.tables import write_table
    from kvcert.testing import replay_frame

    write_run(folder, claims or standard(), code_digests, experiment)
    for name in ("report.md", "report.html", "replay_cells.csv"):
        (folder / name).write_text(name)
    import pandas as pd

    write_table(pd.DataFrame({"score": [1.0, 0.0]}), folder / "scores.parquet", {"prereg_hash": "a" * 64})
    (folder / "figures").mkdir(exist_ok=True)
    (folder / "figures" / "coverage.png").write_bytes(b"png")
    (folder / "replay" / "m").mkdir(parents=True, exist_ok=True)
    write_table(replay_frame(cells=6, draws=4, later=2, layers=2, heads=1, sample_dependent=True),
                folder / "replay" / "m" / "needle-1024.parquet", {"prereg_hash": "a" * 64, "code_digest": "d"})
    (folder / "generations" / "m").mkdir(parents=True, exist_ok=True)
    (folder / "generations" / "m" / "shard000.jsonl").write_text(json.dumps({"id": 1}) + "\n")
    return folder
