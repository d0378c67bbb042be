"""`kvcert reference revalidate`: a rerun at new record code compared item by item with the run the reference was
made from, the fields that say when and by which code left out; the check recorded only when every item is equal."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kvcert.commands.revalidate import CHECKS, compare_runs, revalidate
from kvcert.provenance import code_digest
from kvcert.tables import write_table


def _run(folder: Path, digest: str, score: float = 1.0, commit: str = "a" * 40, rows: float = 0.5) -> Path:
    shard = folder / "generations" / "m" / "main" / "needle" / "1024"
    shard.mkdir(parents=True)
    records = [{"example_id": f"e{i}", "score": score if i == 1 else 0.0, "code_digest": digest, "git_commit": commit,
                "started_utc": f"2026-12-06T0{i}:00:00+00:00", "decode_seconds": 0.1 * i + len(commit) % 7,
                "certificate": {"radius": [0.25, i]}} for i in range(3)]
    (shard / "shard000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "replay" / "m").mkdir(parents=True)
    write_table(pd.DataFrame({"draw": [0, 1], "error": [rows, 0.25]}), folder / "replay" / "m" / "needle-1024.parquet",
                {"code_digest": digest, "git_commit": commit, "seconds": len(commit), "draws": 2})
    (folder / "claims.json").write_text(json.dumps({"claims": [{"id": "C1", "value": score}],
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


def test_the_check_is_recorded_only_when_every_item_is_equal(tmp_path):
    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "summary.json").write_text(json.dumps({"code_digests": ["0" * 16]}))
    before = _run(tmp_path / "before", "0" * 16)
    result, entry = revalidate(before, _run(tmp_path / "differs", code_digest(), score=0.0), reference, "cmd")
    assert entry is None and not (reference / CHECKS).exists() and result.equal < result.compared
    result, entry = revalidate(before, _run(tmp_path / "after", code_digest()), reference, "cmd")
    assert entry["code_digest"] == code_digest() and entry["reference_code_digests"] == ["0" * 16]
    assert entry["compared"] == entry["equal"] == 8
    assert json.loads((reference / CHECKS).read_text()) == [entry]


def test_runs_made_by_other_code_than_the_two_it_stands_between_are_refused(tmp_path):
    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "summary.json").write_text(json.dumps({"code_digests": ["0" * 16]}))
    with pytest.raises(ValueError, match=r"before: made by code \['1111111111111111'\], not the reference's"):
        revalidate(_run(tmp_path / "before", "1" * 16), _run(tmp_path / "after", code_digest()), reference, "cmd")
    with pytest.raises(ValueError, match=r"stale: made by code \['0000000000000000'\], not today's"):
        revalidate(_run(tmp_path / "b2", "0" * 16), _run(tmp_path / "stale", "0" * 16),
                   reference, "cmd")
