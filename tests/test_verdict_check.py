"""A claims document's verdicts re-derived from its own tests (kvcert issue 62 item 7): a verdict, an outcome or a
placebo's verdict the registered rules do not give is named, and the report refuses the document in one line."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from claims_fixture import claim, document, standard
from kvcert.analysis.claims_document import ClaimsDocument
from kvcert.analysis.verdict_check import VerdictContradicted, check_verdicts, contradictions

#: C7 of the real run: the ratio fails, the difference is unclear: killed
C7 = [("gain_ratio_certificate_over_random_stratified", ">=", 1.5, 1.0956, 0.9556, 1.2469),
      ("gain_certificate_minus_confidence_stratified", ">", 0.0, 0.0026, -0.0219, 0.0255)]


def _doc(claims) -> ClaimsDocument:
    return ClaimsDocument.from_dict(document(claims))


def test_verdicts_made_by_the_rules_pass():
    doc = _doc([*standard(), claim("C7", C7, source="generations")])
    assert [c.verdict for c in doc.claims] == ["holds", "inconclusive", "inconclusive", "killed"]
    assert contradictions(doc) == []
    check_verdicts(doc, "claims.json")


def test_a_verdict_edited_beside_its_failing_test_is_refused_in_one_line():
    c7 = claim("C7", C7, source="generations")
    doc = _doc([replace(c7, verdict="holds")])
    assert contradictions(doc) == [
        "C7: verdict 'holds', but its tests give 'killed' (gain_ratio_certificate_over_random_stratified "
        "[0.9556, 1.247] >= 1.5: fail; gain_certificate_minus_confidence_stratified [-0.0219, 0.0255] > 0: unclear)"]
    with pytest.raises(VerdictContradicted) as err:
        check_verdicts(doc, "results/real/claims.json")
    assert "\n" not in str(err.value) and str(err.value).startswith("results/real/claims.json: C7: verdict 'holds'")
    assert str(err.value).endswith("rerun the claims step (`kvcert claims`)")


def test_an_outcome_edited_beside_its_interval_is_named():
    c7 = claim("C7", C7, source="generations")
    tests = [replace(c7.tests[0], outcome="pass"), replace(c7.tests[1], outcome="pass")]
    (line,) = contradictions(_doc([replace(c7, tests=tests, verdict="holds")]))
    assert line.startswith("C7: verdict 'holds', but its tests give 'killed'")
    assert "test gain_ratio_certificate_over_random_stratified [0.9556, 1.247] >= 1.5 recorded 'pass', its interval " \
           "gives 'fail'" in line
    assert "recorded 'pass', its interval gives 'unclear'" in line


def test_a_cell_below_its_minimum_cannot_hold():
    c1 = standard()[0]
    small = replace(c1, cell={"generations": 12, "minimum": {"generations": 30}})
    (line,) = contradictions(_doc([small]))
    assert line.startswith("C1: verdict 'holds', but its tests give 'inconclusive'") and "below its minimum" in line
    no_data = replace(c1, reasons=["no data for cell 0.5/later"])
    assert contradictions(_doc([no_data]))[0].startswith("C1: verdict 'holds', but its tests give 'inconclusive'")


def test_a_placebo_that_holds_makes_the_claim_uninformative_and_an_edited_placebo_is_named():
    tests = [("coverage", ">=", 0.85, 0.9647, 0.9634, 0.9660)]
    placebo = [[("coverage", ">=", 0.85, 0.9757, 0.9744, 0.9770)]]
    c1 = claim("C1", tests, placebo=placebo)
    assert c1.verdict == "uninformative" and contradictions(_doc([c1])) == []
    edited = replace(c1, verdict="holds")
    assert contradictions(_doc([edited]))[0].startswith("C1: verdict 'holds', but its tests give 'uninformative' "
                                                        "(coverage [0.9634, 0.966] >= 0.85: pass, a placebo holds)")
    run = replace(c1.placebo.placebos[0], verdict="killed")
    hidden = replace(c1, verdict="holds", placebo=replace(c1.placebo, passes=False, verdict="killed", placebos=[run]))
    (line,) = contradictions(_doc([hidden]))
    assert "placebo placebo0 recorded 'killed', its tests give 'holds'" in line
    assert "the placebo block says passes=False, its placebos say True" in line


def test_the_report_refuses_a_contradicted_verdict_before_writing_anything(tmp_path):
    from kvcert.analysis.report import build_report

    data = document([replace(claim("C7", C7, source="generations"), verdict="holds")])
    (tmp_path / "claims.json").write_text(json.dumps(data))
    with pytest.raises(VerdictContradicted, match=r"^claims.json \(experiment real\): C7: verdict 'holds', but its "
                                                  r"tests give 'killed'"):
        build_report(ClaimsDocument.read(tmp_path / "claims.json"), None, None, None, [], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_data_seed_verdict_edited_beside_its_tests_is_named():
    """A replay claim's verdict on the grid's second data seed (where the claims document records one) follows from
    its tests as far as they are recorded: an edited verdict or outcome is named."""
    from kvcert.analysis import claims_document

    block = getattr(claims_document, "DataSeedStability", None)
    if block is None:
        pytest.skip("this claims document has no second data seed's block")
    c8 = standard()[2]
    kept = replace(c8, data_seed_stability=block(9501, 12, c8.tests, "inconclusive", [], True))
    assert contradictions(_doc([kept])) == []
    edited = replace(kept, data_seed_stability=block(9501, 12, c8.tests, "holds", [], False))
    (line,) = contradictions(_doc([edited]))
    assert line == "C8: data seed 9501: verdict 'holds', its tests give inconclusive"
