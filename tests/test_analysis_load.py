"""Generation records → scored rows: refusals with clear messages, pre-freeze flags,
pass marks, certificate signals and failure labels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvcert.analysis.load import RecordRefused, load_shards, score_shards, scored
from kvcert.testing import certificate_block, frozen_copy, make_record, write_shard
from kvcert.generation.shards import CorruptShardError

from conftest import model_for

PREREG = Path(__file__).resolve().parents[1] / "preregistration"


@pytest.fixture(scope="module")
def prereg(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prereg") / "preregistration"
    return folder, frozen_copy(PREREG, folder)


def rec(eid, prereg_hash, **kw):
    return make_record(eid, prereg_hash=prereg_hash, **kw)


def test_missing_field_is_refused_naming_field_file_and_line(prereg, tmp_path):
    folder, fr = prereg
    bad = rec("b", fr.prereg_hash)
    del bad["certificate"]
    shard = write_shard([rec("a", fr.prereg_hash), bad], tmp_path / "shard-01.jsonl")
    with pytest.raises(RecordRefused, match=r"shard-01\.jsonl:2: .*required field 'certificate'"):
        score_shards([shard], folder)


def test_foreign_prereg_hash_is_refused_naming_file_and_both_hashes(prereg, tmp_path):
    folder, fr = prereg
    shard = write_shard([rec("a", "f" * 64)], tmp_path / "other.jsonl")
    with pytest.raises(RecordRefused) as err:
        score_shards([shard], folder)
    msg = str(err.value)
    assert "other.jsonl:1" in msg and "f" * 64 in msg and fr.prereg_hash in msg


def test_verified_json_from_another_freeze_is_refused(prereg, tmp_path):
    folder, fr = prereg
    shard = write_shard([rec("a", fr.prereg_hash)], tmp_path / "s.jsonl")
    verified = tmp_path / "verified.json"
    verified.write_text(json.dumps({"prereg_hash": "0" * 64}))
    with pytest.raises(RecordRefused, match="verified.json"):
        score_shards([shard], folder, verified)
    verified.write_text(json.dumps({"prereg_hash": fr.prereg_hash}))
    df, prov = score_shards([shard], folder, verified)
    assert prov["prereg_hash"] == fr.prereg_hash and len(df) == 1


def test_edited_prereg_is_refused(tmp_path):
    folder = tmp_path / "preregistration"
    frozen_copy(PREREG, folder)
    (folder / "claims.yaml").write_text((folder / "claims.yaml").read_text() + "\n# edited\n")
    with pytest.raises(ValueError, match="was edited after the freeze"):
        score_shards([], folder)


def test_duplicate_generation_is_refused(prereg, tmp_path):
    folder, fr = prereg
    a = write_shard([rec("a", fr.prereg_hash)], tmp_path / "x" / "shard000.jsonl")
    b = write_shard([rec("a", fr.prereg_hash)], tmp_path / "y" / "shard000.jsonl")
    with pytest.raises(RecordRefused, match="appears twice") as info:
        score_shards([a, b], folder)
    assert f"{a}:1" in str(info.value) and f"{b}:1" in str(info.value)  # whole paths: basenames repeat


def test_shards_are_checked_against_their_seal_and_the_plan(prereg, tmp_path):
    """A finished shard that lost lines, whose records were edited (still valid JSON), that
    has no seal, or that holds another count than the plan, is refused in one line."""
    folder, fr = prereg
    records = [rec(f"e{i}", fr.prereg_hash) for i in range(5)]
    shard = write_shard(records, tmp_path / "s.jsonl")
    df, _ = score_shards([shard], folder, expected={str(shard): 5})
    assert len(df) == 5
    with pytest.raises(RecordRefused, match=r"s\.jsonl: 5 records, the plan expects 6; delete .*and rerun"):
        score_shards([shard], folder, expected={str(shard): 6})
    lines = shard.read_text().splitlines(keepends=True)
    shard.write_text("".join(lines[:3]))  # head -n 3
    with pytest.raises(RecordRefused, match=r"content differs from its seal \(3 records now, 5 when finished\)") as info:
        score_shards([shard], folder)
    assert "\n" not in str(info.value) and "s.jsonl.seal.json and rerun" in str(info.value)
    shard = write_shard(records, tmp_path / "t.jsonl")
    edited = json.loads(shard.read_text().splitlines()[2])
    edited["score"] = 0.0
    text = shard.read_text().splitlines(keepends=True)
    text[2] = json.dumps(edited, sort_keys=True) + "\n"
    shard.write_text("".join(text))
    with pytest.raises(RecordRefused, match="edited or cut after it was finished"):
        score_shards([shard], folder)
    (tmp_path / "u.jsonl").write_text(json.dumps(records[0], sort_keys=True) + "\n")
    with pytest.raises(RecordRefused, match=r"u\.jsonl: no seal"):
        score_shards([tmp_path / "u.jsonl"], folder)


def test_corrupt_line_names_path_and_line(prereg, tmp_path):
    folder, fr = prereg
    shard = write_shard([rec("a", fr.prereg_hash)], tmp_path / "c.jsonl")
    shard.write_text(shard.read_text() + "{not json\n")
    with pytest.raises(CorruptShardError, match=r"c\.jsonl:2"):
        score_shards([shard], folder)


def test_pre_freeze_records_are_flagged_and_not_scored(prereg, tmp_path):
    folder, fr = prereg
    shard = write_shard([
        rec("a", fr.prereg_hash, condition="full", started_utc="2001-01-01T00:00:00+00:00"),
        rec("a", fr.prereg_hash, started_utc="2030-01-01T00:00:00Z"),
    ], tmp_path / "s.jsonl")
    df, prov = score_shards([shard], folder)
    assert df["pre_freeze"].tolist() == [True, False] and prov["pre_freeze"] == 1
    assert len(scored(df)) == 1
    # the pre-freeze full run does not label the compressed run
    assert df.loc[1, "label"] == "unknown" and np.isnan(df.loc[1, "full_correct"])


def test_correctness_labels_and_pass_marks(prereg, tmp_path):
    folder, fr = prereg
    h = fr.prereg_hash
    records = [
        rec("q1", h, task="longbench_qasper", condition="full", score=0.5),
        rec("q1", h, task="longbench_qasper", score=0.49),           # full right, compressed wrong: induced
        rec("q2", h, task="longbench_qasper", condition="full", score=0.2),
        rec("q2", h, task="longbench_qasper", score=0.3),            # both wrong: inherent
        rec("n1", h, task="needle", condition="full", score=1.0),
        rec("n1", h, task="needle", score=0.99),                     # default pass mark 1.0: induced
        rec("n2", h, task="needle", condition="full", score=1.0),
        rec("n2", h, task="needle", score=1.0),                      # correct
        rec("n3", h, task="needle", score=1.0, seed=1),              # no full run for seed 1: unknown
    ]
    df, _ = score_shards([write_shard(records, tmp_path / "s.jsonl")], folder)
    assert df["correct"].tolist() == [1, 0, 0, 0, 1, 0, 1, 1, 1]
    assert df["label"].tolist() == ["full", "induced", "full", "inherent", "full", "induced", "full", "correct", "unknown"]
    assert df["unit"].iloc[1] == "m|longbench_qasper|512|q1"


def test_certificate_signals(prereg, tmp_path):
    folder, fr = prereg
    h = fr.prereg_hash
    varying = rec("v", h, signal=0.0, decode_steps=3)
    varying["certificate"]["relative_steps"]["mean"] = [0.1, 0.4, 0.1]  # signal: mean over steps; gate: max
    exact = rec("n", h, signal=None)
    exact["kept_fraction"] = [1.0] * len(exact["kept_fraction"])  # nothing evicted
    records = [varying, rec("t", h, sampler="topk"), exact, rec("f", h, condition="full"), rec("u", h, signal=None)]
    df, _ = score_shards([write_shard(records, tmp_path / "s.jsonl")], folder)
    assert df.loc[0, "cert_signal"] == pytest.approx(0.2) and df.loc[0, "gate_signal"] == pytest.approx(0.4)
    assert np.isnan(df.loc[1, "cert_signal"]) and np.isnan(df.loc[3, "cert_signal"])  # top-k, full: no certificate
    assert df.loc[2, "cert_signal"] == 0.0 and not df.loc[2, "uncertified"]  # no tail, nothing evicted: exact
    # no tail but tokens evicted (a prompt shorter than sinks + window + budget): no signal, never zero
    assert np.isnan(df.loc[4, "cert_signal"]) and df.loc[4, "uncertified"]
    assert df.loc[0, "confidence"] == -0.5 and df.loc[0, "confidence_secondary"] == -1.5


def test_unknown_field_is_refused_naming_it(prereg, tmp_path):
    folder, fr = prereg
    records = [rec("a", fr.prereg_hash, condition="full"), rec("b", fr.prereg_hash, recompute_of={"method": "x"})]
    with pytest.raises(RecordRefused, match=r"s\.jsonl:2: generation record has unknown field\(s\) 'recompute_of'"):
        score_shards([write_shard(records, tmp_path / "s.jsonl")], folder)


def test_parallel_load_equals_serial(prereg, tmp_path):
    folder, fr = prereg
    from kvcert.analysis.load import ScoringPlan
    from kvcert.config.prereg import load_claims

    plan = ScoringPlan.from_plan(load_claims(folder)["analysis_plan"])
    shards = [write_shard([rec(f"e{i}", fr.prereg_hash, signal=0.1 * i)], tmp_path / f"s{i}.jsonl") for i in range(6)]
    serial = load_shards(shards, plan, fr, jobs=1)
    parallel = load_shards(shards, plan, fr, jobs=2)
    assert serial.equals(parallel)


def test_certificate_block_is_constant():
    block = certificate_block(0.3, steps=2, layers=3)
    assert block["relative_steps"]["mean"] == [0.3, 0.3] and len(block["first_step_layers"]["max"]) == 3


def test_records_of_the_generation_engine_load(prereg, tmp_path):
    """Records written by the real engine (random-init model) carry every field the analysis needs."""

    from kvcert import enable_certified_attention
    from kvcert.generation.engine import Engine
    from kvcert.generation.forked import generate as generate_runs
    from kvcert.provenance import provenance
    from kvcert.generation.spec import GenerationSpec
    from kvcert.tasks import generate
    from kvcert.training.tokenizer import build_tokenizer

    folder, fr = prereg
    tok = build_tokenizer()
    model = enable_certified_attention(model_for(tok))
    task = generate("needle", tok, n_examples=1, target_tokens=300, seed=1)[0]
    out = []
    for condition, sampler in (("full", None), ("aware", "poisson"), ("streaming", "topk")):
        method = {"name": "full"} if sampler is None else {
            "name": f"snapkv-{sampler}", "scorer": "snapkv", "sampler": sampler, "allocation": "uniform"}
        spec = GenerationSpec.from_dict({"model": {"name": "tiny", "path": "unused"}, "method": method,
                                         "condition": condition, "budget": 1.0 if sampler is None else 0.25,
                                         "max_new_tokens": 3})
        out.append(generate_runs([Engine(model, tok, spec, provenance(spec.to_dict(), fr.prereg_hash))], task)[0])
    df, _ = score_shards([write_shard(out, tmp_path / "engine.jsonl")], folder)
    assert df["condition"].tolist() == ["full", "aware", "streaming"]
    assert np.isfinite(df.loc[1, "cert_signal"]) and df.loc[1, "cert_signal"] > 0
    assert np.isnan(df.loc[2, "cert_signal"]) and np.isnan(df.loc[0, "cert_signal"])
    assert df.loc[0, "label"] == "full" and df.loc[1, "label"] in ("correct", "induced", "inherent")
    assert not df["pre_freeze"].any()


def test_scoring_removes_the_claims_and_report_it_makes_stale(prereg, tmp_path):
    """Scores redone (or failing) in a results folder: the old claims.json, report.* and
    summary.json there described other scores, so they are removed before anything else."""
    from kvcert.analysis.steps import score_step

    folder, fr = prereg
    out = tmp_path / "results"
    out.mkdir()
    for name in ("claims.json", "report.md", "report.html", "summary.json"):
        (out / name).write_text("old")
    bad = write_shard([rec("a", "f" * 64)], tmp_path / "foreign.jsonl")
    with pytest.raises(RecordRefused):
        score_step([bad], folder, out / "scores.parquet")
    assert not any((out / n).exists() for n in ("claims.json", "report.md", "report.html", "summary.json"))
