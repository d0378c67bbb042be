"""The typed claims document (:mod:`kvcert.analysis.claims_document`): claims.json read and written back is the
same file, byte for byte; a key missing or unknown, a document without its analysis plan, a claim whose top-level
figures are not its first test's are refused in one line naming the key and the file."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kvcert.analysis.claims_document import ClaimsDocument, ClaimsDocumentError
from kvcert.tables import write_json

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "reference" / "real" / "claims.json"


def round_trip_bytes(path: Path, tmp_path: Path) -> None:
    data = json.loads(path.read_text())
    doc = ClaimsDocument.read(path)
    assert doc.to_dict() == data
    assert list(doc.to_dict()) == list(data)  # key order too
    again = write_json(doc.to_dict(), tmp_path / "claims.json")
    assert again.read_bytes() == path.read_bytes()


def test_the_reference_claims_round_trip_byte_for_byte(tmp_path):
    round_trip_bytes(REFERENCE, tmp_path)
    doc = ClaimsDocument.read(REFERENCE)
    assert [c.id for c in doc.claims] == [f"C{i}" for i in range(1, 9)]
    assert doc.plan.delta == doc.analysis_plan["delta"]
    assert all(c.value == c.tests[0].estimate and c.statistic == c.tests[0].statistic for c in doc.claims)


@pytest.fixture(scope="module")
def reference():
    return json.loads(REFERENCE.read_text())


def refused(data: dict, tmp_path: Path) -> str:
    path = tmp_path / "claims.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ClaimsDocumentError) as info:
        ClaimsDocument.read(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(path.as_posix() + ": ")
    return message


def test_an_unknown_key_is_refused_naming_it_and_the_file(reference, tmp_path):
    data = copy.deepcopy(reference)
    data["claims"][3]["tests"][1]["p_value"] = 0.01
    assert "unknown key 'p_value' in claim C4, test 2" in refused(data, tmp_path)
    data = copy.deepcopy(reference)
    data["claims"][0]["placebo"]["placebos"][0]["note"] = "x"
    assert "unknown key 'note' in claim C1's placebo, placebo 1" in refused(data, tmp_path)
    data = copy.deepcopy(reference)
    data["summary"] = {}
    assert "unknown key 'summary' in the claims document" in refused(data, tmp_path)


def test_a_missing_key_and_a_document_without_its_plan_are_refused(reference, tmp_path):
    data = copy.deepcopy(reference)
    del data["provenance"]["frozen_utc"]
    assert "provenance lacks the key 'frozen_utc'" in refused(data, tmp_path)
    data = copy.deepcopy(reference)
    data["analysis_plan"] = {}
    assert "no analysis_plan" in refused(data, tmp_path)  # no δ to fall back on: the report needs the registered one


def test_a_claims_top_level_figures_are_its_first_tests(reference, tmp_path):
    data = copy.deepcopy(reference)
    data["claims"][2]["threshold"] = 123.0
    assert "claim C3's threshold 123.0 is not its first test's" in refused(data, tmp_path)
