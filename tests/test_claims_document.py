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


def _without_data_seed(reference: dict) -> dict:
    """The reference document as a run without a second data seed writes it (every run before the ninth
    amendment): no ``data_seed_stability`` blocks, no ``stability_replay`` in the provenance."""
    data = copy.deepcopy(reference)
    for claim in data["claims"]:
        claim.pop("data_seed_stability", None)
    data["provenance"].pop("stability_replay", None)
    return data


def _with_data_seed(reference: dict) -> dict:
    """The reference document with a second data seed's block on its replay claims (the grid's replay.stability),
    placed after ``seed_stability`` as the claims step writes it, and that seed's tables in the provenance."""
    data = _without_data_seed(reference)
    for claim in data["claims"]:
        if claim["source"] != "replay":
            continue
        block = {"seed": 9700, "prompts": 48, "tests": [dict(t, ci=[0.5, 0.6]) for t in claim["tests"]],
                 "verdict": "killed", "reasons": ["coverage: below its threshold"], "agree": False}
        items = list(claim.items())
        at = [k for k, _ in items].index("seed_stability") + 1
        claim.clear()
        claim.update(items[:at] + [("data_seed_stability", block)] + items[at:])
    data["provenance"]["stability_replay"] = [dict(p, examples=48) for p in data["provenance"]["replay"]]
    return data


def test_a_second_data_seeds_block_round_trips_and_is_absent_without_one(reference, tmp_path):
    """``data_seed_stability`` (per replay claim) and the provenance's ``stability_replay``: typed, read and written
    back byte for byte, key order included; a document without them (every run before the ninth amendment, the
    reference) loads with neither and writes neither; a block lacking a key or with an unknown one is refused."""
    from kvcert.analysis.claims_document import DataSeedStability

    path = tmp_path / "with.json"
    write_json(_with_data_seed(reference), path)
    round_trip_bytes(path, tmp_path)
    doc = ClaimsDocument.read(path)
    blocks = {c.id: c.data_seed_stability for c in doc.claims}
    assert {cid for cid, b in blocks.items() if b is not None} == {c["id"] for c in reference["claims"]
                                                                   if c["source"] == "replay"}
    c1 = blocks["C1"]
    assert isinstance(c1, DataSeedStability) and (c1.seed, c1.prompts, c1.verdict, c1.agree) == (9700, 48, "killed", False)
    assert c1.tests[0].ci == [0.5, 0.6] and c1.tests[0].statistic == doc.claims[0].statistic
    assert doc.provenance.stability_replay[0]["examples"] == 48
    old = ClaimsDocument.from_dict(_without_data_seed(reference))
    assert all(c.data_seed_stability is None for c in old.claims) and old.provenance.stability_replay == []
    assert "data_seed_stability" not in json.dumps(old.to_dict()) and "stability_replay" not in old.to_dict()["provenance"]
    data = _with_data_seed(reference)
    del data["claims"][0]["data_seed_stability"]["agree"]
    assert "claim C1's data_seed_stability lacks the key 'agree'" in refused(data, tmp_path)
    data = _with_data_seed(reference)
    data["claims"][0]["data_seed_stability"]["tests"][0]["p_value"] = 0.1
    assert "unknown key 'p_value' in claim C1's data_seed_stability, test 1" in refused(data, tmp_path)


def test_the_report_shows_the_second_data_seed_and_the_worst_later_cell(reference):
    """The report reads the typed blocks: the claims table's stability column has the data seed's verdict under the
    bootstrap seeds' share (a claim without one: the share alone); the claim details show the data seed's tests
    beside the deciding seed's and the worst later-query cell's paragraph."""
    from kvcert.analysis.document import Document
    from kvcert.analysis.report_claims import BR, data_seed_sentence, stability_text
    from kvcert.analysis.report_details import data_seed_table, worst_later_text

    doc = ClaimsDocument.from_dict(_with_data_seed(reference))
    c1, c3 = doc.claims[0], doc.claims[2]
    share = f"{100 * c1.seed_stability.agree:.0f} % of {c1.seed_stability.seeds} seeds"
    assert stability_text(c1) == share + BR + "data seed 9700 (48 prompts): killed (differs)"
    assert BR not in stability_text(c3) and stability_text(ClaimsDocument.from_dict(_without_data_seed(reference)).claims[0]) == share
    assert "48 prompts of a second, disjoint data seed (9700)" in data_seed_sentence(doc.claims)
    assert data_seed_sentence(ClaimsDocument.from_dict(_without_data_seed(reference)).claims) == ""
    page = Document()
    data_seed_table(page, c1)
    paragraph, table = page.blocks
    assert "on 48 prompts of the second data seed 9700" in paragraph.text and "**killed** (differs from" in paragraph.text
    assert table.header[1] == "data seed 9700 [90 % CI]" and table.rows[0][0] == "`coverage` ≥ 0.85"
    assert table.rows[0][1].endswith("[0.5000, 0.6000]") and table.rows[0][3].startswith(f"{c1.value:.4f}")
    block = {"certificate": "plugin", "cell": "0.125/layer 6", "nominal": 0.9, "unit": "example",
             "cells": {"0.125/layer 6": 0.847, "0.25/layer 6": 0.95}, "cells_below_nominal": 1,
             "statistics": {"worst_later_cell_coverage": {"estimate": 0.847, "ci": [0.80, 0.88]},
                            "worst_later_cell_coverage_fixed": {"estimate": 0.847, "ci": [0.81, 0.89]}}}
    text = worst_later_text(block)
    assert "plug-in certificate's lowest coverage" in text and "is budget 0.125, layer 6: 0.8470 [0.8000, 0.8800]" in text
    assert "that cell's own 0.8470 [0.8100, 0.8900]" in text and "1 of 2 cells below the nominal 0.9" in text
    assert "no later queries" in worst_later_text({**block, "cell": None})
