"""The typed analysis plan (:class:`kvcert.config.analysis_plan.AnalysisPlan`): every committed freeze's plan loads as it
was analysed, an unknown key or a value out of range is refused in one line naming it, and ``kvcert prereg freeze``
refuses a plan its JSON schema refuses."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import yaml

from kvcert.config.analysis_plan import AnalysisPlan, AnalysisPlanError, check_schema
from kvcert.config.prereg import PreregError, freeze, freezes, load_claims, load_plan

ROOT = Path(__file__).resolve().parents[1]
PREREG = ROOT / "preregistration"
#: the analysis_plan of every claims.yaml a committed freeze record froze (its header names the records)
PLANS = ROOT / "tests" / "fixtures" / "analysis_plans"


def registered() -> dict:
    return yaml.safe_load((PREREG / "claims.yaml").read_text())["analysis_plan"]


@pytest.mark.parametrize("path", sorted(PLANS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_committed_freezes_plan_loads_and_satisfies_the_schema(path):
    data = yaml.safe_load(path.read_text())
    check_schema(data, path.name)
    plan = AnalysisPlan.from_dict(data)
    assert plan.to_dict() == data  # what claims.json records: the registered mapping itself
    assert 0 < plan.delta < 1 and plan.replay.budgets and plan.bootstrap.resamples >= 1


def test_every_freeze_record_has_its_plan_here():
    """Each freeze record's claims.yaml is either the current one or has its analysis_plan in tests/fixtures/
    analysis_plans/ (named in the file's first line): an amendment adds the plan it replaces there."""
    current = hashlib.sha256((PREREG / "claims.yaml").read_bytes()).hexdigest()
    named = " ".join(p.read_text().splitlines()[0] for p in PLANS.glob("*.yaml"))
    missing = [r.path.name for r in freezes(PREREG)
               if r.files["claims.yaml"] != current and r.path.name not in named]
    assert not missing, (f"the analysis_plan frozen by {missing} has no copy in {PLANS}: add the amended "
                         "claims.yaml's analysis_plan there (git show <commit>:preregistration/claims.yaml)")


def test_the_loader_builds_the_typed_plan():
    doc = load_claims(PREREG)
    plan = doc["analysis_plan"]
    assert isinstance(plan, AnalysisPlan) and plan is not None and load_plan(PREREG) == plan
    assert plan.to_dict() == registered()
    b = registered()["bootstrap"]
    assert plan.bootstrap.other_seeds == [b["seed"] + k for k in range(1, b["stability_seeds"] + 1)]
    assert plan.placebos.seed == registered()["placebos"]["seed"]
    assert plan.placebos.names("replay") == registered()["placebos"]["replay"]
    assert plan.escalation.budgets == tuple(sorted(registered()["escalation"]["budgets"]))
    assert plan.minimum_cell.to_dict() == registered()["minimum_cell"]


def test_the_replay_seed_is_the_schema_default_until_registered():
    """No freeze registers replay.seed: its default, 0, is what every replay so far drew with."""
    data = registered()
    assert "seed" not in data["replay"] and AnalysisPlan.from_dict(data).replay.seed == 0
    data["replay"]["seed"] = 7
    check_schema(data)
    assert AnalysisPlan.from_dict(data).replay.seed == 7


def test_kvcert_replay_reads_its_seed_from_the_plan():
    from kvcert.cli import build_parser

    args = build_parser().parse_args(["replay", "--model", "embedded", "--records", "r.jsonl", "--out", "o.parquet",
                                      "--impossibility-out", "i.json"])
    assert args.seed is None  # replay_step then takes analysis_plan.replay.seed


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(replays={}), "analysis_plan.replays: unknown (did you mean 'replay'?)"),
    (lambda d: d["bootstrap"].update(seeds=3), "analysis_plan.bootstrap.seeds: unknown"),
    (lambda d: d["comparison_signals"]["signals"]["certificate"].update(weight=1), "weight: unknown"),
    (lambda d: d["design"].update(sink=4), "analysis_plan.design.sink: unknown (did you mean 'sinks'?)"),
    (lambda d: d["robust_certificate"].update(bits=8), "analysis_plan.robust_certificate.bits: unknown"),
    (lambda d: d.update(delta=1.5), "analysis_plan.delta: must lie in (0, 1)"),
    (lambda d: d["replay"].update(budgets=[0.0]), "analysis_plan.replay.budgets: must lie in (0, 1]"),
    (lambda d: d.pop("delta"), "analysis_plan.delta: missing"),
])
def test_a_malformed_plan_is_refused_in_one_line_naming_the_key(edit, message):
    data = registered()
    edit(data)
    with pytest.raises(AnalysisPlanError) as err:
        AnalysisPlan.from_dict(data)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["certificate_signal"].update(field="steps_max"),
     "analysis_plan.certificate_signal.field: 'steps_max' is not one of steps, anytime_steps, relative_steps"),
    (lambda d: d["certificate_signal"].update(aggregation="median"),
     "analysis_plan.certificate_signal.aggregation: 'median' is not one of max, mean, rms"),
    (lambda d: d["certificate_signal"].update(over_steps="sum"),
     "analysis_plan.certificate_signal.over_steps: 'sum' is not one of mean, max, min, last, first"),
    (lambda d: d["multiturn_gate"].update(field="radius"), "analysis_plan.multiturn_gate.field: 'radius' is not one of"),
    (lambda d: d["comparison_signals"].update(over_steps="median"),
     "analysis_plan.comparison_signals.over_steps: 'median' is not one of"),
    (lambda d: d["comparison_signals"].update(aggregation="sum"),
     "analysis_plan.comparison_signals.aggregation: 'sum' is not one of"),
    (lambda d: d["comparison_signals"]["turn_distance"].update(signals=["certificate", "entropy"]),
     "analysis_plan.comparison_signals.turn_distance.signals: 'entropy' is not a signal"),
    (lambda d: d["robust_certificate"].update(window="four"),
     "analysis_plan.robust_certificate.window: must be a number, got 'four'"),
    (lambda d: d["robust_certificate"].update(key_bits=0), "analysis_plan.robust_certificate.key_bits: must be >= 1"),
    (lambda d: d["robust_certificate"].update(score=1), "analysis_plan.robust_certificate.score: must be a name"),
    (lambda d: d["design"].update(sinks=-1), "analysis_plan.design.sinks: must be >= 0, got -1"),
    (lambda d: d["design"].update(temper=0), "analysis_plan.design.temper: must lie in (0, 8]"),
    (lambda d: d["design"].update(top_fraction=1.5), "analysis_plan.design.top_fraction: must lie in [0, 1]"),
    (lambda d: d["bootstrap"].update(unit="prompt"), "analysis_plan.bootstrap.unit: 'prompt' is not one of example"),
    (lambda d: d["placebos"].update(generations=["oracle"]),
     "analysis_plan.placebos.generations: 'oracle' is not one of stratum_base_rate, random_score"),
    (lambda d: d["placebos"].update(replay=["random_score"]),
     "analysis_plan.placebos.replay: 'random_score' is not one of step_cell_median_radius"),
    (lambda d: d["replay"].update(query_kinds=["setting", "stale"]),
     "analysis_plan.replay.query_kinds: 'stale' is not one of setting, later, sample_dependent"),
    (lambda d: d["replay"].update(draws=-1), "analysis_plan.replay.draws: must be an integer >= 0, got -1"),
    (lambda d: d["replay"].update(later_queries=1.5), "analysis_plan.replay.later_queries: must be an integer >= 0"),
    (lambda d: d["minimum_cell"].update(positives=-2), "analysis_plan.minimum_cell.positives: must be an integer >= 0"),
    (lambda d: d["recompute"].update(gate_rates=[0.1, 1.5]), "analysis_plan.recompute.gate_rates: must lie in (0, 1]"),
    (lambda d: d["recompute"].update(verdict_rate=0), "analysis_plan.recompute.verdict_rate: must lie in (0, 1]"),
    (lambda d: d["escalation"].update(threshold_quantile=1.0),
     "analysis_plan.escalation.threshold_quantile: must lie in (0, 1)"),
])
def test_every_field_is_checked_at_load(edit, message):
    """A value the analysis or the replay could not use is refused when the plan is built, in one line naming its
    key — not later, where the scoring or the replay reads it."""
    data = registered()
    edit(data)
    with pytest.raises(AnalysisPlanError) as err:
        AnalysisPlan.from_dict(data)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_plans_allowed_values_are_the_later_stages():
    """The query kinds the plan accepts are the replay table's; the certificate fields and aggregations, a record's
    certificate's; the robust certificate's keys, :mod:`kvcert.method.sketch`'s."""
    from kvcert.config.analysis_plan import CERT_FIELDS, QUERY_KINDS
    from kvcert.config.names import AGGREGATIONS
    from kvcert.generation.replay_table import QUERY_KINDS as TABLE_KINDS
    from kvcert.testing import AGGREGATIONS as RECORD_AGGREGATIONS, make_record

    assert QUERY_KINDS == TABLE_KINDS and AGGREGATIONS == RECORD_AGGREGATIONS
    certificate = make_record("e0", condition="aware", sampler="poisson", signal=0.1)["certificate"]
    assert set(CERT_FIELDS) <= set(certificate) and all(set(certificate[f]) == set(AGGREGATIONS) for f in CERT_FIELDS)


def test_the_schema_refuses_what_the_types_would_coerce():
    data = registered()
    data["bootstrap"]["resamples"] = "4000"
    with pytest.raises(AnalysisPlanError, match=r"analysis_plan.bootstrap.resamples: '4000' is not of type 'integer'"):
        check_schema(data)


def test_freeze_refuses_a_plan_the_schema_refuses(tmp_path):
    folder = tmp_path / "preregistration"
    shutil.copytree(PREREG, folder, ignore=shutil.ignore_patterns("freeze"))
    doc = yaml.safe_load((folder / "claims.yaml").read_text())
    doc["analysis_plan"]["placebos"]["generations"].append("oracle")
    (folder / "claims.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    with pytest.raises(PreregError) as err:
        freeze(folder)
    assert "analysis_plan.placebos.generations.2: 'oracle' is not one of" in str(err.value)
    assert "\n" not in str(err.value) and not list((folder / "freeze").glob("*.yaml"))
    doc["analysis_plan"]["placebos"]["generations"].pop()
    (folder / "claims.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    assert freeze(folder).prereg_hash


def test_the_plans_key_lists_are_the_model_stages():
    """The design and robust-certificate keys the plan accepts are the fields the model stage builds from them."""
    from kvcert.config.analysis_plan import DESIGN_KEYS, ROBUST_KEYS, SCHEMA
    from kvcert.method.design import RetentionDesign
    from kvcert.method.sketch import PLAN

    assert DESIGN_KEYS == tuple(RetentionDesign.__dataclass_fields__) and ROBUST_KEYS == tuple(PLAN)
    schema = yaml.safe_load(SCHEMA.read_text())["properties"]
    assert set(schema["design"]["properties"]) == set(DESIGN_KEYS)
    assert set(schema["robust_certificate"]["properties"]) == set(ROBUST_KEYS)
    assert set(schema) == {f for f in AnalysisPlan.__dataclass_fields__ if not f.startswith("_")}



def test_the_worst_later_cell_key_is_typed_and_checked():
    """``secondary.worst_later_cell`` (ninth amendment: C1's worst later-query cell, beside its tests): claim →
    certificate, typed; absent (every freeze before it), none is reported; a certificate that is not one is refused
    in one line by the types and by the schema, a claim name that is not one by the schema."""
    data = registered()
    data["secondary"] = {**data.get("secondary", {"claims": {}}), "worst_later_cell": {"C1": "plugin"}}
    check_schema(data)
    plan = AnalysisPlan.from_dict(data)
    assert plan.secondary.worst_later("C1") == "plugin" and plan.secondary.worst_later("C8") is None
    assert plan.to_dict()["secondary"]["worst_later_cell"] == {"C1": "plugin"}
    without = registered()
    without.get("secondary", {}).pop("worst_later_cell", None)
    assert AnalysisPlan.from_dict(without).secondary.worst_later("C1") is None
    data["secondary"]["worst_later_cell"] = {"C1": "oracle"}
    with pytest.raises(AnalysisPlanError) as err:
        AnalysisPlan.from_dict(data)
    assert "analysis_plan.secondary.worst_later_cell.C1: 'oracle' is not a certificate" in str(err.value)
    with pytest.raises(AnalysisPlanError, match=r"analysis_plan.secondary.worst_later_cell.C1: 'oracle' is not one of"):
        check_schema(data)
    data["secondary"]["worst_later_cell"] = {"first": "plugin"}
    with pytest.raises(AnalysisPlanError, match=r"analysis_plan.secondary.worst_later_cell: 'first' does not match"):
        check_schema(data)
