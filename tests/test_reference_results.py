"""The real model's reference results in the repository (``results/reference/real/``) are those of the current
freeze and of the current code that makes records: an amendment, or a change to that code
(:data:`kvcert.provenance.RECORD_CODE`), without a new reference run fails here, so a reference cannot go stale
silently. Regenerate with ``snakemake --cores all --config experiment=real`` and ``kvcert reference update``
(docs/pipeline.md); a code change that cannot change a record may instead be re-validated: a committed equality
check (``revalidations.json`` in the reference folder, written by ``kvcert reference revalidate``,
:mod:`kvcert.commands.revalidate`) that regenerated the records at the new code and found them equal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcert.commands.reference import FILES
from kvcert.config.prereg import verify

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "reference" / "real"
REGENERATE = ("rerun `snakemake --cores all --config experiment=real`, then `kvcert reference update` and commit "
              "results/reference/real/")


@pytest.fixture(scope="module")
def claims():
    return json.loads((REFERENCE / "claims.json").read_text())


def test_every_reference_file_is_there():
    missing = [name for name in FILES if not (REFERENCE / name).is_file()]
    assert not missing, f"results/reference/real/ lacks {missing}: {REGENERATE}"


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
    from kvcert.provenance import RECORD_CODE, code_digest

    made = json.loads((REFERENCE / "summary.json").read_text()).get("code_digests")
    current = code_digest()
    if made == [current]:
        return
    checks = REFERENCE / "revalidations.json"
    found = [c for c in (json.loads(checks.read_text()) if checks.exists() else [])
             if c.get("code_digest") == current and c.get("compared", 0) > 0 and c.get("equal") == c.get("compared")
             and set(c.get("reference_code_digests") or []) == set(made or [])]
    assert found, (
        f"results/reference/real/ was made by record code of digest {made}, and the code that makes records "
        f"({', '.join(RECORD_CODE)}) is now {current}: {REGENERATE}; or, for a change that cannot alter a record, "
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


def _run(folder: Path, prereg: str, claims: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps({"prereg_hash": prereg, "claims": {
        cid: {"verdict": v, "statistic": "coverage", "value": x} for cid, (v, x) in claims.items()}}))
    return folder


def test_a_rerun_says_claim_by_claim_whether_it_reproduced_the_reference(tmp_path):
    """One line per claim: the same verdict and value (to the last digits a CPU may round differently), or what
    differs and by how much; a reference of another freeze is named; no reference, no lines."""
    from kvcert.commands.reference import SAME, compare_lines

    ref = _run(tmp_path / "ref", "a" * 64, {"C1": ("holds", 0.964), "C2": ("killed", 0.167), "C3": ("holds", None)})
    run = _run(tmp_path / "run", "a" * 64, {"C1": ("holds", 0.964 + SAME / 2), "C2": ("inconclusive", 0.2101),
                                           "C3": ("holds", None)})
    lines = compare_lines(run, ref)
    assert lines[0] == f"kvcert: this run against the reference {ref}: 2 of 3 claims the same"
    assert lines[1] == "  C1: same as the reference — holds, coverage = 0.9640"
    assert lines[2] == ("  C2: DIFFERS — verdict inconclusive (reference: killed); coverage = 0.2101 (reference 0.1670, "
                        "+0.0431)")
    assert lines[3] == "  C3: same as the reference — holds, coverage = –"
    moved = _run(tmp_path / "moved", "b" * 64, {"C1": ("holds", 0.95), "C2": ("killed", 0.167), "C3": ("holds", None)})
    lines = compare_lines(moved, ref)
    assert "2 of 3 claims the same (the reference was made under pre-registration aaaaaaaaaaaa" in lines[0]
    assert lines[1] == "  C1: DIFFERS — same verdict holds; coverage = 0.9500 (reference 0.9640, -0.0140)"
    assert compare_lines(run, tmp_path / "none") == []
    assert compare_lines(tmp_path / "none", ref) == [f"kvcert: no {tmp_path / 'none' / 'summary.json'} yet to compare "
                                                     f"with the reference {ref}"]


def test_the_reference_is_updated_from_a_finished_run_only(tmp_path):
    from kvcert.commands.reference import update

    run = _run(tmp_path / "run", "a" * 64, {"C1": ("holds", 0.9)})
    with pytest.raises(FileNotFoundError, match=r"lacks claims.json, report.md, .*; finish the run first"):
        update(run, tmp_path / "ref")
    for name in FILES:
        if not (run / name).exists():
            (run / name).write_text(name)
    (run / "figures").mkdir()
    (run / "figures" / "coverage.png").write_bytes(b"png")
    (tmp_path / "ref" / "figures").mkdir(parents=True)
    (tmp_path / "ref" / "figures" / "stale.png").write_bytes(b"old")
    update(run, tmp_path / "ref")
    assert sorted(p.name for p in (tmp_path / "ref").iterdir()) == sorted([*FILES, "figures"])
    assert [p.name for p in (tmp_path / "ref" / "figures").iterdir()] == ["coverage.png"]
