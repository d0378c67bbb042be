"""`kvcert reference revalidate`: a rerun at new record code compared item by item with the run the reference was
made from, the fields that say when and by which code left out; the check recorded only when every item is equal."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kvcert.commands.revalidate import CHECKS, RUN, compare_runs, revalidate, run_manifest
from kvcert.provenance import code_digest
from kvcert.tables import write_table


def _run(folder: Path, digest: str, score: float = 1.0, commit: str = "a" * 40, rows: float = 0.5,
         experiment: str = "real") -> Path:
    shard = folder / "generations" / "m" / "main" / "needle" / "1024"
    shard.mkdir(parents=True)
    records = [{"example_id": f"e{i}", "score": score if i == 1 else 0.0, "code_digest": digest, "git_commit": commit,
                "started_utc": f"2026-12-06T0{i}:00:00+00:00", "decode_seconds": 0.1 * i + len(commit) % 7,
                "certificate": {"radius": [0.25, i]}} for i in range(3)]
    (shard / "shard000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "replay" / "m").mkdir(parents=True)
    write_table(pd.DataFrame({"draw": [0, 1], "error": [rows, 0.25]}), folder / "replay" / "m" / "needle-1024.parquet",
                {"code_digest": digest, "git_commit": commit, "seconds": len(commit), "draws": 2})
    (folder / "claims.json").write_text(json.dumps({"experiment": experiment, "claims": [{"id": "C1", "value": score}],
                                                    "provenance": {"analysis_git_commit": commit, "seconds": 3.0}}))
    (folder / "summary.json").write_text(json.dumps({"code_digests": [digest], "claims": {"C1": {"value": score}}}))
    tally = f"1 distinct — {commit} (3)" if commit == "a" * 40 else f"2 distinct — {commit} (2), {'c' * 40} (1)"
    (folder / "report.md").write_text(f"C1 holds: {score:.3f}\n\nanalysis commit: {commit}\ngeneration commits: {tally}\n"
                                      f"record-code digests: {digest}\n")
    return folder


def test_two_runs_of_the_same_code_are_equal_apart_from_when_and_by_which_commit(tmp_path):
    before = _run(tmp_path / "before", "0" * 16)
    after = _run(tmp_path / "after", code_digest(), commit="b" * 40)
    result = compare_runs(before, after)
    # 3 records, 2 replay rows, claims.json, summary.json, report.md (its commit and code digest masked)
    assert (result.compared, result.equal, result.differences) == (8, 8, [])
    assert result.made_by == {code_digest()} and result.made_before_by == {"0" * 16}


def test_a_changed_field_a_changed_row_and_a_missing_file_are_each_named(tmp_path):
    before = _run(tmp_path / "before", "0" * 16)
    after = _run(tmp_path / "after", code_digest(), score=0.5, rows=0.5000001)
    (after / "summary.json").unlink()
    result = compare_runs(before, after)
    assert result.equal == result.compared - 1 - 2 - 1 - 1 - 1
    assert "report.md: line 1 differs" in result.differences
    assert "generations/m/main/needle/1024/shard000.jsonl:2: score differ" in result.differences
    assert any(d.startswith("replay/m/needle-1024.parquet: rows differ") for d in result.differences)
    assert "claims.json: claims differ" in result.differences
    assert "summary.json: only in the run before" in result.differences


def _reference(folder: Path, run: Path, experiment: str = "real") -> Path:
    """A reference made from ``run`` as `kvcert reference update` lists it (its summary and run.json)."""
    folder.mkdir()
    (folder / "summary.json").write_text((run / "summary.json").read_text())
    (folder / RUN).write_text(json.dumps({"experiment": experiment, **run_manifest(run)}))
    return folder


def test_the_check_is_recorded_only_when_every_item_is_equal_and_once(tmp_path):
    before = _run(tmp_path / "before", "0" * 16)
    reference = _reference(tmp_path / "reference", before)
    result, entry, appended = revalidate(before, _run(tmp_path / "differs", code_digest(), score=0.0), reference, "cmd",
                                         "real")
    assert entry is None and not appended and not (reference / CHECKS).exists() and result.equal < result.compared
    result, entry, appended = revalidate(before, _run(tmp_path / "after", code_digest()), reference, "cmd", "real")
    assert appended and entry["code_digest"] == code_digest() and entry["reference_code_digests"] == ["0" * 16]
    assert entry["compared"] == entry["equal"] == 8 and entry["run_sha256"] == run_manifest(before)["sha256"]
    assert json.loads((reference / CHECKS).read_text()) == [entry]
    # the same check again: nothing appended, the entry there returned
    _, again, appended = revalidate(before, tmp_path / "after", reference, "cmd", "real")
    assert not appended and again == entry and json.loads((reference / CHECKS).read_text()) == [entry]


def test_runs_made_by_other_code_than_the_two_it_stands_between_are_refused(tmp_path):
    stale_before = _run(tmp_path / "before", "1" * 16)
    reference = _reference(tmp_path / "reference", stale_before)
    (reference / "summary.json").write_text(json.dumps({"code_digests": ["0" * 16]}))
    with pytest.raises(ValueError, match=r"before: made by code \['1111111111111111'\], not the reference's"):
        revalidate(stale_before, _run(tmp_path / "after", code_digest()), reference, "cmd", "real")
    before = _run(tmp_path / "b2", "0" * 16)
    reference = _reference(tmp_path / "reference2", before)
    with pytest.raises(ValueError, match=r"stale: made by code \['0000000000000000'\], not today's"):
        revalidate(before, _run(tmp_path / "stale", "0" * 16), reference, "cmd", "real")


def test_a_before_that_is_not_the_references_own_run_is_refused(tmp_path):
    """Issue 62 item 3: two one-line fake runs, a run of another experiment, a copy with one record changed or one
    file more or less than the reference lists: each refused in one line, nothing appended."""
    before = _run(tmp_path / "before", "0" * 16)
    reference = _reference(tmp_path / "reference", before)
    after = _run(tmp_path / "after", code_digest())
    fake_before, fake_after = tmp_path / "fake_before", tmp_path / "fake_after"
    for fake, digest in ((fake_before, "0" * 16), (fake_after, code_digest())):
        (fake / "generations").mkdir(parents=True)
        (fake / "generations" / "s.jsonl").write_text(json.dumps({"x": 1, "code_digest": digest}) + "\n")
        (fake / "claims.json").write_text(json.dumps({"experiment": "real"}))
    with pytest.raises(ValueError, match=r"fake_before: claims.json: holds another .*give a copy of the run"):
        revalidate(fake_before, fake_after, reference, "cmd", "real")
    edited = _run(tmp_path / "edited", "0" * 16)
    shard = next((edited / "generations").rglob("*.jsonl"))
    shard.write_text(shard.read_text().replace('"score": 1.0', '"score": 0.0'))
    with pytest.raises(ValueError, match=r"edited: generations/.*shard000.jsonl: holds another"):
        revalidate(edited, after, reference, "cmd", "real")
    fewer = _run(tmp_path / "fewer", "0" * 16)
    (fewer / "report.md").unlink()
    with pytest.raises(ValueError, match=r"fewer: report.md: lacks it"):
        revalidate(fewer, after, reference, "cmd", "real")
    with pytest.raises(ValueError, match=r"the reference of experiment 'real', not 'smoke'; give --experiment real"):
        revalidate(before, after, reference, "cmd", "smoke")
    smoke_after = _run(tmp_path / "smoke_after", code_digest(), experiment="smoke")
    with pytest.raises(ValueError, match=r"smoke_after: a run of experiment 'smoke', not 'real'"):
        revalidate(before, smoke_after, reference, "cmd", "real")
    (reference / RUN).unlink()
    with pytest.raises(ValueError, match=r"lists no run \(run.json"):
        revalidate(before, after, reference, "cmd", "real")
    assert not (reference / CHECKS).exists()
