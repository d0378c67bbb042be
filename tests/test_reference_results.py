"""The real model's reference results in the repository (``results/reference/real/``) are those of the current
freeze and of the current code that makes records: an amendment, or a change to that code
(:func:`kvcert.provenance.record_modules`), without a new reference run fails here, so a reference cannot go stale
silently. Regenerate with ``snakemake --cores all --config experiment=real`` and ``kvcert reference update``
(docs/pipeline.md); a code change that cannot change a record may instead be re-validated: a committed equality
check (``revalidations.json`` in the reference folder, written by ``kvcert reference revalidate``,
:mod:`kvcert.commands.revalidate`) that regenerated the records at the new code and found them equal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcert.commands.reference import DRAWS, FILES
from kvcert.commands.revalidate import RUN
from kvcert.config.prereg import verify

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "reference" / "real"
REGENERATE = ("rerun `snakemake --cores all --config experiment=real`, then `kvcert reference update` and commit "
              "results/reference/real/")


@pytest.fixture(scope="module")
def claims():
    return json.loads((REFERENCE / "claims.json").read_text())


def test_every_reference_file_is_there():
    """Its files; a reference made by today's `kvcert reference update` (it lists its run, run.json) also its
    per-draw replay table."""
    made_now = (REFERENCE / RUN).is_file()
    missing = [name for name in (*FILES, *((DRAWS,) if made_now else ())) if not (REFERENCE / name).is_file()]
    assert not missing, f"results/reference/real/ lacks {missing}: {REGENERATE}"


def test_the_reference_verdicts_follow_from_their_tests(claims):
    """Every verdict of the committed claims.json is what the registered rules give from its own tests, placebos
    and cell counts (:mod:`kvcert.analysis.verdict_check`)."""
    from kvcert.analysis.claims_document import ClaimsDocument
    from kvcert.analysis.verdict_check import contradictions

    assert contradictions(ClaimsDocument.from_dict(claims)) == []


@pytest.mark.skipif(not (REFERENCE / RUN).is_file(), reason="the reference predates run.json (kvcert reference "
                    "update writes it); runs once the regenerated reference is committed")
def test_the_reference_files_are_those_of_the_run_it_lists():
    """The reference's claims, summary, scores and report are byte for byte the files its run.json lists (the
    run `kvcert reference revalidate --before` must be a copy of)."""
    from kvcert.config.hashing import file_sha256

    listed = json.loads((REFERENCE / RUN).read_text())
    assert listed["experiment"] == "real" and listed["items"] == sum(f["items"] for f in listed["files"].values())
    for name in ("claims.json", "summary.json", "scores.parquet", "report.md", "report.html"):
        assert file_sha256(REFERENCE / name) == listed["files"][name]["sha256"], name


def test_the_reference_is_scored_under_the_current_freeze(claims):
    current = verify(ROOT / "preregistration").prereg_hash
    assert claims["experiment"] == "real"
    assert claims["provenance"]["prereg_hash"] == current, (
        f"results/reference/real/ was made under another freeze: {REGENERATE}")
    summary = json.loads((REFERENCE / "summary.json").read_text())
    assert summary["prereg_hash"] == current
    from kvcert.analysis.steps import read_table

    _, provenance = read_table(REFERENCE / "scores.parquet")
    assert provenance["prereg_hash"] == current
    assert current in (REFERENCE / "report.md").read_text()


def test_the_reference_was_made_by_the_current_record_code():
    """Every record and replay table of the reference carries the digest of the code that made it
    (:func:`kvcert.provenance.code_digest`); it is today's, or a committed equality check re-validated the
    reference at today's digest: records regenerated at that code, compared field by field, all equal."""
    from kvcert.provenance import code_digest

    made = json.loads((REFERENCE / "summary.json").read_text()).get("code_digests")
    current = code_digest()
    if made == [current]:
        return
    checks = REFERENCE / "revalidations.json"
    run = json.loads((REFERENCE / RUN).read_text()) if (REFERENCE / RUN).is_file() else None
    found = [c for c in (json.loads(checks.read_text()) if checks.exists() else [])
             if c.get("code_digest") == current and c.get("compared", 0) > 0 and c.get("equal") == c.get("compared")
             and set(c.get("reference_code_digests") or []) == set(made or [])
             and (run is None or (c.get("run_sha256") == run["sha256"] and c["compared"] >= run["items"]))]
    assert found, (
        f"results/reference/real/ was made by record code of digest {made}, and the code that makes records "
        f"(kvcert.provenance.code_digest) is now {current}: {REGENERATE}; or, for a change that cannot alter a record, "
        "rerun at this code and `kvcert reference revalidate --before <a copy of the reference's run>`, and commit "
        "results/reference/real/revalidations.json")


def test_every_claim_is_decided_on_data(claims):
    """No claim short of data (a cell below analysis_plan.minimum_cell, or a test without rows), and the
    replay summary is part of the claims."""
    ids = [c["id"] for c in claims["claims"]]
    assert ids == [f"C{i}" for i in range(1, 9)]
    for c in claims["claims"]:
        reasons = " ".join(map(str, c.get("reasons") or []))
        assert "pre-registered minimum" not in reasons and "no data for cell" not in reasons, (c["id"], reasons)
        assert all(t["outcome"] != "unexercised" for t in c["tests"]), c["id"]
    assert claims["replay_summary"]["pooled"]["observations"] > 0
    assert {m for m in claims["grid"]["models"]} == {"smollm2-135m-instruct"}



# --- every number of C1, C2 and C8 from the committed files ------------------------------------------------------
def recompute(draws, cells, claims: dict) -> dict[str, float]:
    """C1's, C2's and C8's point values from the per-draw replay table (``replay_draws.parquet``) and the cell table
    (``replay_cells.csv``), by their formulas (kvcert.analysis.claims_stats: coverage, spearman, robust_coverage),
    each claim's rows its registered cells (claims.json's ``cells``)."""
    import numpy as np

    from kvcert.analysis.replay_stats import step_cell_spearman

    spec = {c["id"]: c["cells"] for c in claims["claims"]}

    def rows(table, cid):
        c = spec[cid]
        return table[table["budget"].astype(float).isin([float(b) for b in c["budgets"]])
                     & table["query_kind"].astype(str).isin(c["query_kinds"])]

    def pooled(part, column):  # Σ hits / Σ n over replay cells
        return float((part["n"] * part[column]).sum() / part["n"].sum())

    c1, c8 = rows(cells, "C1"), rows(cells, "C8")
    later = c8[c8["query_kind"] == "later"]
    worst = later.assign(hits=later["n"] * later["coverage_robust"]).groupby(["budget", "layer"])[["hits", "n"]].sum()
    spearman, _ = step_cell_spearman(rows(draws, "C2"))
    d8 = rows(draws, "C8")
    div = d8[(d8["query_kind"] == "sample_dependent") & d8["diverged"]]
    late = d8[d8["query_kind"] == "later"]
    err, rad = late["error"].to_numpy("float64"), late["radius_robust"].to_numpy("float64")
    ok = err > 0
    return {
        "C1 coverage": pooled(c1, "coverage"),
        "C2 spearman_within_cell": float(np.quantile(spearman, 0.5, method="inverted_cdf")),
        "C8 coverage_robust_later": pooled(later, "coverage_robust"),
        "C8 coverage_robust_later_worst_cell": float((worst["hits"] / worst["n"]).min()),
        "C8 coverage_robust_diverged": float(div["covered_robust"].mean()),
        "C8 tightness_robust_later": float(10 ** np.median(np.log10(rad[ok] / err[ok]))),
        # the cell table and the draws agree where both say it: the share of covered draws
        "draws: C1 coverage": float(rows(draws, "C1")["covered"].mean()),
    }


def _recorded(claims: dict) -> dict[str, float]:
    out = {f"{c['id']} {t['statistic']}": t["estimate"] for c in claims["claims"] if c["id"] in ("C1", "C2", "C8")
           for t in c["tests"]}
    return {**out, "draws: C1 coverage": out["C1 coverage"]}


#: float32 rounding of the draws' radii and errors: a ratio moves by ~1e-7 relative; a rank only through a tie
FLOAT32 = 1e-6


@pytest.mark.skipif(not (REFERENCE / RUN).is_file(), reason="the reference predates replay_draws.parquet (kvcert "
                    "reference update writes it); runs once the regenerated reference is committed")
def test_c1_c2_and_c8_are_recomputed_from_the_committed_draws(claims):
    """Issue 58 item 4: every test statistic of the replay claims follows from committed files: the per-draw table
    (float32) and the cell table give claims.json's point values within float32 rounding."""
    import pandas as pd

    assert (REFERENCE / DRAWS).is_file(), f"results/reference/real/ lists its run but lacks {DRAWS}: {REGENERATE}"
    draws = pd.read_parquet(REFERENCE / DRAWS)
    cells = pd.read_csv(REFERENCE / "replay_cells.csv")
    got, want = recompute(draws, cells, claims), _recorded(claims)
    assert got == pytest.approx(want, rel=FLOAT32, abs=FLOAT32)


def test_the_draw_table_gives_what_the_claims_code_computes(tmp_path):
    """The recomputation above, on a synthetic run: the table `kvcert reference update` writes (float32, the claims'
    columns) gives the point values the claims code computes from the full float64 replay table."""
    import numpy as np
    import yaml

    from kvcert.analysis.claims import select_replay
    from kvcert.analysis.claims_stats import coverage, robust_coverage, spearman
    from kvcert.analysis.replay_stats import replay_cells
    from kvcert.commands.reference import replay_draws
    from kvcert.config.analysis_plan import AnalysisPlan
    from kvcert.tables import write_table
    from kvcert.testing import replay_frame

    registered = yaml.safe_load((ROOT / "preregistration" / "claims.yaml").read_text())
    plan = AnalysisPlan.of_document(registered)
    full = replay_frame(cells=48, draws=12, later=3, layers=4, heads=2, sample_dependent=True, seed=3)
    full.loc[full.index % 7 == 0, "diverged"] = False
    (tmp_path / "replay" / "m").mkdir(parents=True)
    write_table(full, tmp_path / "replay" / "m" / "needle-1024.parquet", {"prereg_hash": "x"})
    assert replay_draws(tmp_path, tmp_path / "draws.parquet") == len(full)
    import pandas as pd

    draws = pd.read_parquet(tmp_path / "draws.parquet")
    assert draws["radius"].dtype == np.float32 and len(draws.columns) == 16
    claims = {"claims": [{"id": c["id"], "cells": c["cells"]} for c in registered["claims"]]}
    spec = {c["id"]: c["cells"] for c in claims["claims"]}

    def point(module, cid, name):
        prep = module.prepare(select_replay(full, spec[cid])[0], plan)
        if name in prep.point:
            return prep.point[name]
        value, _ = prep.statistic(np.ones((1, len(prep.codes))))[name]
        return float(value[0])

    want = {"C1 coverage": point(coverage, "C1", "coverage"),
            "C2 spearman_within_cell": point(spearman, "C2", "spearman_within_cell"),
            **{f"C8 {n}": point(robust_coverage, "C8", n) for n in (
                "coverage_robust_later", "coverage_robust_later_worst_cell", "coverage_robust_diverged",
                "tightness_robust_later")}}
    want["draws: C1 coverage"] = want["C1 coverage"]
    got = recompute(draws, replay_cells(full), claims)
    assert got == pytest.approx(want, rel=FLOAT32, abs=FLOAT32)
