"""The real model's reference results in the repository (``results/real/``) are those of the current freeze:
an amendment without a new reference run fails here, so a reference cannot go stale silently. Regenerate
with ``snakemake --cores all --config experiment=real`` (docs/pipeline.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcert.config.prereg import verify

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "real"
FILES = ("claims.json", "summary.json", "report.md", "report.html", "scores.parquet", "replay_cells.csv")


@pytest.fixture(scope="module")
def claims():
    return json.loads((REFERENCE / "claims.json").read_text())


def test_every_reference_file_is_there():
    missing = [name for name in FILES if not (REFERENCE / name).is_file()]
    assert not missing, f"results/real/ lacks {missing}: rerun `snakemake --cores all --config experiment=real`"


def test_the_reference_is_scored_under_the_current_freeze(claims):
    current = verify(ROOT / "preregistration").prereg_hash
    assert claims["experiment"] == "real"
    assert claims["provenance"]["prereg_hash"] == current, (
        "results/real/ was made under another freeze: rerun `snakemake --cores all --config experiment=real` "
        "and commit results/real/")
    summary = json.loads((REFERENCE / "summary.json").read_text())
    assert summary["prereg_hash"] == current
    from kvcert.analysis.steps import read_table

    _, provenance = read_table(REFERENCE / "scores.parquet")
    assert provenance["prereg_hash"] == current
    assert current in (REFERENCE / "report.md").read_text()


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
