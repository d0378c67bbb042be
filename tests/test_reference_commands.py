"""`kvcert reference compare` and `update` (kvcert issue 62 items 5, 6, 7): every test's estimate and interval compared
with a tolerance derived from the statistic's own denominator, the exit status saying whether every claim is the
same; a reference made only from a run whose verdicts follow from its tests, at today's record code (or a reason),
swapped in whole."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from claims_fixture import finished_run, standard, write_run
from kvcert.commands.reference import DRAWS, FILES, compare_lines, update
from kvcert.commands.reference_compare import DIFFERS, NOTHING, SAME, compare
from kvcert.commands.revalidate import CHECKS, RUN, run_manifest
from kvcert.provenance import code_digest

LATER = 648000  # the real run's later-query draws: C8's later coverage is a share of them


def test_a_rerun_the_same_up_to_rounding_across_machines_is_the_same_and_each_line_says_by_how_much(tmp_path):
    """The AMD clone: C8's later coverage one robust draw lower (0.9903148 → 0.9903133), its tightness ~2e-6
    relative off: the same up to rounding, exit 0, each size in its units."""
    ref = write_run(tmp_path / "ref", standard(), ["d"])
    same = write_run(tmp_path / "same", standard(), ["d"])
    assert compare(same, ref) == (compare_lines(same, ref), SAME)
    run = write_run(tmp_path / "run", standard(coverage_robust_later=(0.9903148148148149 - 1 / LATER,
                                                                      0.9883533950617284, 0.9922407407407408),
                                               tightness_robust_later=(5.59124, 5.565576347162964,
                                                                       5.618094207095586)), ["e"])
    lines, status = compare(run, ref)
    assert status == SAME
    assert lines[0].startswith(f"kvcert: this run against the reference {ref}: 3 of 3 claims the same (up to rounding "
                               "across machines); records made by code ['e'] (the reference's: ['d'])")
    assert lines[1] == "  C1: same as the reference — holds, coverage = 0.964709; identical"
    assert lines[3] == ("  C8: same as the reference — inconclusive, coverage_robust_later = 0.990313; the largest "
                        "difference coverage_robust_later estimate 1.0 draws of 648,000 (tolerance 3 draws of 648,000)")
    tight = write_run(tmp_path / "tight", standard(tightness_robust_later=(5.59124, 5.565576347162964,
                                                                           5.618094207095586)), ["d"])
    assert compare(tight, ref)[0][3].endswith("the largest difference tightness_robust_later estimate 2.6e-06 relative "
                                              "(tolerance 1e-05 relative)")
    moved = write_run(tmp_path / "moved", standard(coverage_robust_later=(0.9903148148148149 + 2 / LATER,
                                                                          0.9883533950617284, 0.9922407407407408)),
                      ["d"])
    assert "coverage_robust_later estimate 2.0 draws of 648,000 (tolerance 3 draws of 648,000)" in compare(moved,
                                                                                                         ref)[0][3]


def test_a_difference_beyond_rounding_or_a_changed_verdict_differs_and_exits_1(tmp_path):
    ref = write_run(tmp_path / "ref", standard(), ["d"])
    far = write_run(tmp_path / "far", standard(coverage_robust_later=(0.9903148148148149 - 10 / LATER,
                                                                      0.9883533950617284, 0.9922407407407408)), ["d"])
    lines, status = compare(far, ref)
    assert status == DIFFERS and lines[0].endswith("2 of 3 claims the same (up to rounding across machines)")
    assert lines[3] == ("  C8: DIFFERS — coverage_robust_later estimate 0.990299 (reference 0.990315, -1.54e-05: "
                        "10.0 draws of 648,000, tolerance 3 draws of 648,000)")
    # C5's interval low end moved by 1e-4 of a share of 384 generations (0.04 generations): within rounding — but it
    # crosses the threshold, the verdict changes, and a changed verdict is never the same
    flipped = write_run(tmp_path / "flipped", standard(escalation_gain=(0.00390625, 0.0100001, 0.015625)), ["d"])
    lines, status = compare(flipped, ref)
    assert status == DIFFERS
    assert lines[2].startswith("  C5: DIFFERS — verdict holds (reference: inconclusive)")
    assert "escalation_gain interval low" in lines[2] and "generations of 384" in lines[2]


def test_a_missing_claim_differs_and_nothing_to_compare_exits_2(tmp_path):
    ref = write_run(tmp_path / "ref", standard(), ["d"])
    fewer = write_run(tmp_path / "fewer", standard()[:2], ["d"])
    lines, status = compare(fewer, ref)
    assert status == DIFFERS and lines[3] == "  C8: DIFFERS — not in this run"
    assert compare(tmp_path / "none", ref) == ([f"kvcert: no {tmp_path / 'none' / 'claims.json'} yet to compare with "
                                                f"the reference {ref}"], NOTHING)
    assert compare(fewer, tmp_path / "none") == ([], NOTHING)
    other = write_run(tmp_path / "other", standard(), ["d"])
    other_doc = json.loads((other / "claims.json").read_text())
    other_doc["provenance"]["prereg_hash"] = "b" * 64
    (other / "claims.json").write_text(json.dumps(other_doc))
    assert "(the reference was made under pre-registration aaaaaaaaaaaa, this run under bbbbbbbbbbbb" in compare(
        other, ref)[0][0]


def test_the_command_exits_0_1_and_2(tmp_path):
    """`kvcert reference compare`'s exit status: 0 every claim the same, 1 a claim differs, 2 nothing to compare."""
    ref = write_run(tmp_path / "reference", standard(), ["d"])
    write_run(tmp_path / "results" / "real", standard(), ["d"])

    from kvcert.cli import main

    args = ["reference", "compare", "--results", str(tmp_path / "results"), "--reference", str(ref)]
    assert main(args) == 0
    write_run(tmp_path / "results" / "real", standard()[:2], ["d"])
    assert main(args) == 1
    assert main([*args[:-1], str(tmp_path / "nowhere")]) == 2
    assert main(["reference", "compare", "--results", str(tmp_path / "nothing"), "--reference", str(ref)]) == 2


def test_an_edited_verdict_is_refused_by_compare_and_update_in_one_line(tmp_path, capsys):
    """Issue 62 item 7: C7-like — a verdict edited to "holds" beside its own failing test."""
    from kvcert.cli import main

    run = finished_run(tmp_path / "results" / "real", [code_digest()])
    doc = json.loads((run / "claims.json").read_text())
    doc["claims"][0]["verdict"] = "killed"  # C1 holds by its tests
    (run / "claims.json").write_text(json.dumps(doc))
    summary = json.loads((run / "summary.json").read_text())
    summary["claims"]["C1"]["verdict"] = "killed"
    (run / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"claims.json: C1: verdict 'killed', but its tests give 'holds' \(coverage "
                                         r"\[0.9634, 0.966\] >= 0.85: pass\): not what the registered rules give"):
        update(run, tmp_path / "ref", "real")
    assert not (tmp_path / "ref").exists()
    ref = write_run(tmp_path / "ref", standard(), ["d"])
    assert main(["reference", "compare", "--results", str(tmp_path / "results"), "--reference", str(ref)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "C1: verdict 'killed', but its tests give 'holds'" in err


def test_a_summary_that_disagrees_with_its_claims_is_refused(tmp_path):
    run = finished_run(tmp_path / "run", [code_digest()])
    summary = json.loads((run / "summary.json").read_text())
    summary["claims"]["C8"]["verdict"] = "holds"
    (run / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"summary.json: claim C8 is 'holds' .* 'inconclusive' .* in claims.json "
                                         r"beside it; rerun the report step"):
        update(run, tmp_path / "ref", "real")


def test_update_refuses_other_record_code_unless_a_reason_is_given_and_another_experiment(tmp_path):
    run = finished_run(tmp_path / "run", ["0" * 16])
    with pytest.raises(ValueError, match=r"records made by record code \['0000000000000000'\], today's is "
                                         rf"{code_digest()}: rerun the experiment at this code, or give --reason"):
        update(run, tmp_path / "ref", "real")
    with pytest.raises(ValueError, match=r"a run of experiment 'real', not 'smoke'"):
        update(run, tmp_path / "ref", "smoke", reason="any")
    assert not (tmp_path / "ref").exists()
    update(run, tmp_path / "ref", "real", reason="the code change since renames a module only")
    listed = json.loads((tmp_path / "ref" / RUN).read_text())
    assert listed["reason"] == "the code change since renames a module only"
    assert listed["code_digests"] == ["0" * 16] and listed["current_code_digest"] == code_digest()


def test_update_writes_the_whole_reference_and_swaps_it_in(tmp_path):
    """The files, figures, the run's listing and the per-draw table; the old reference's stale figure gone, its
    re-validation history kept (each entry names the run it re-validated)."""
    import pandas as pd

    from kvcert.tables import write_table

    run = finished_run(tmp_path / "run", [code_digest()])
    deciding = len(pd.read_parquet(run / "replay" / "m" / "needle-1024.parquet"))
    (run / "replay" / "m" / "stability").mkdir()  # the second data seed's table: decides nothing, not in the draws
    write_table(pd.read_parquet(run / "replay" / "m" / "needle-1024.parquet"),
                run / "replay" / "m" / "stability" / "needle-1024.parquet", {})
    ref = tmp_path / "ref"
    (ref / "figures").mkdir(parents=True)
    (ref / "figures" / "stale.png").write_bytes(b"old")
    (ref / CHECKS).write_text(json.dumps([{"code_digest": "x", "run_sha256": "old run"}]))
    update(run, ref, "real")
    assert sorted(p.name for p in ref.iterdir()) == sorted([*FILES, "figures", RUN, DRAWS, CHECKS])
    assert [p.name for p in (ref / "figures").iterdir()] == ["coverage.png"]
    assert json.loads((ref / CHECKS).read_text()) == [{"code_digest": "x", "run_sha256": "old run"}]
    listed = json.loads((ref / RUN).read_text())
    assert {k: listed[k] for k in ("files", "items", "sha256")} == run_manifest(run)
    assert "generations/m/shard000.jsonl" in listed["files"] and listed["reason"] is None
    assert "replay/m/stability/needle-1024.parquet" in listed["files"]
    draws = pd.read_parquet(ref / DRAWS)
    assert len(draws) == deciding and str(draws["error"].dtype) == "float32"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref", "run"]  # no sibling left


def test_an_update_that_fails_half_way_leaves_the_old_reference_whole(tmp_path, monkeypatch):
    from kvcert.commands import reference

    run = finished_run(tmp_path / "run", [code_digest()])
    ref = tmp_path / "ref"
    update(run, ref, "real")
    before = {p.relative_to(ref).as_posix(): p.read_bytes() for p in ref.rglob("*") if p.is_file()}

    def killed(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(reference, "replay_draws", killed)
    doc = json.loads((run / "claims.json").read_text())
    with pytest.raises(KeyboardInterrupt):
        update(run, ref, "real")
    assert {p.relative_to(ref).as_posix(): p.read_bytes() for p in ref.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref", "run"]
    assert json.loads((run / "claims.json").read_text()) == doc


def test_a_reference_set_aside_by_an_update_killed_between_its_renames_is_restored(tmp_path):
    """Killed between renaming the old reference aside and the new one in: the next update puts the old one back
    before anything else (never a mix, never none); a half-written sibling is removed."""
    from kvcert.commands.reference import _leftovers

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    ref = tmp_path / "ref"
    (tmp_path / f".ref.old-{dead}").mkdir()
    (tmp_path / f".ref.old-{dead}" / "claims.json").write_text("old")
    (tmp_path / f".ref.new-{dead}").mkdir()
    _leftovers(ref)
    assert (ref / "claims.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref"]


def test_a_rank_correlation_is_compared_in_rank_steps_of_its_draws(tmp_path):
    """C2's median within-cell Spearman over 50 draws moves in steps of 6/(50·2499): two steps are rounding, five
    are a difference."""
    from dataclasses import replace

    from claims_fixture import claim

    def c2(estimate):
        made = claim("C2", [("spearman_within_cell", ">=", 0.3, estimate, 0.1734933973589436, 0.18127250900360145)])
        return [replace(made, details={**made.details, "observations": 810000, "step_cells": 16200})]

    step = 6 / (50 * 2499)
    ref = write_run(tmp_path / "ref", c2(0.17695078031212486), ["d"])
    lines, status = compare(write_run(tmp_path / "near", c2(0.17695078031212486 + 2 * step), ["d"]), ref)
    assert status == SAME and lines[1].endswith("spearman_within_cell estimate 2.0 rank steps of 6/(n(n²−1)), n = 50 "
                                                "draws (tolerance 3 rank steps of 6/(n(n²−1)), n = 50 draws)")
    lines, status = compare(write_run(tmp_path / "far", c2(0.17695078031212486 + 5 * step), ["d"]), ref)
    assert status == DIFFERS and "5.0 rank steps" in lines[1]
