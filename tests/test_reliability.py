"""Nothing wrong is scored silently: content checked against the plan, a freeze chain that
guards itself, non-finite models refused, inputs validated before a model loads, outputs
written atomically, one-line messages (docs/reliability.md). Fast, unit-level: each test
plants one fault and calls the function that must refuse it; the Snakemake-level checks
are in tests/test_reliability_pipeline.py (slow)."""

from __future__ import annotations

import json
import re
import shutil
from argparse import Namespace
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import torch
import yaml

from kvcert.analysis.load import RecordRefused, score_shards
from kvcert.config.prereg import PreregError, freeze, freezes, parse_utc, verify
from kvcert.testing import frozen_copy, make_record, write_shard

REPO = Path(__file__).resolve().parents[1]


def configs_and_smoke_plan(tmp_path: Path, folder: Path):
    """A copy of the repository's configs in ``tmp_path`` (made once per test folder) and the smoke grid's plan
    under the pre-registration ``folder``."""
    from kvcert.generation.plan import build_plan, load_grid

    configs = tmp_path / "configs"
    if not configs.exists():
        shutil.copytree(REPO / "configs", configs)
    return configs, build_plan("smoke", load_grid(folder, "grids/smoke.yaml"))
PREREG = REPO / "preregistration"


@pytest.fixture(scope="module")
def prereg(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prereg") / "preregistration"
    return folder, frozen_copy(PREREG, folder)


def planned(records):
    from kvcert.analysis.load import PlannedShard
    from kvcert.generation.record import GenerationKey

    return PlannedShard({GenerationKey.of(r): r["config_hash"] for r in records})


def reseal(path: Path, records) -> Path:
    """Rewrite a shard with ``records`` and a seal recomputed as a plain SHA-256 (what anyone can do)."""
    return write_shard(records, path)


def built_manifest(path: Path, item, configs: Path, records=None) -> Path:
    """The manifest ``kvcert manifest`` builds for the plan's ``item`` (its records, or ``records`` given), sealed."""
    from kvcert.generation.jobs import config_file, manifest_config_hash
    from kvcert.generation.manifest import build_records, load_tokenizer, write_manifest

    if records is None:
        records = build_records(config_file(configs, "task", item.task),
                                load_tokenizer(config_file(configs, "model", item.model)), item.length, item.examples,
                                item.seed, item.sample)
    return write_manifest(records, path, item, manifest_config_hash(configs, item.model, item.task))


# --- 1. scoring checks content against the plan ----------------------------------------------------
def test_a_forged_answer_is_rescored_from_the_answer(prereg, tmp_path):
    """The bar: an answer replaced by a wrong one, its score kept, the seal recomputed: scoring
    rescores it as incorrect and says so in the provenance."""
    folder, fr = prereg
    good = make_record("a", prereg_hash=fr.prereg_hash, score=1.0)
    forged = dict(make_record("b", prereg_hash=fr.prereg_hash, score=1.0), answer="totally wrong")
    shard = reseal(tmp_path / "s.jsonl", [good, forged])
    df, prov = score_shards([shard], folder, expected={str(shard): planned([good, forged])})
    assert df["score"].tolist() == [1.0, 0.0] and df["correct"].tolist() == [1.0, 0.0]
    assert prov["rescored"] == 1 and df.attrs["rescored"][0][0] == f"{shard}:2"


def test_flipped_scores_are_undone(prereg, tmp_path):
    folder, fr = prereg
    records = [make_record(f"e{i}", prereg_hash=fr.prereg_hash, score=1.0) for i in range(11)]
    flipped = [dict(r, score=0.0) for r in records]
    shard = reseal(tmp_path / "s.jsonl", flipped)
    df, prov = score_shards([shard], folder)
    assert df["correct"].eq(1.0).all() and prov["rescored"] == 11


def test_a_record_under_an_invented_example_id_is_refused(prereg, tmp_path):
    folder, fr = prereg
    records = [make_record(f"e{i}", prereg_hash=fr.prereg_hash) for i in range(4)]
    plan = planned(records)
    records[2] = dict(records[2], example_id="invented")  # same count, seal recomputed
    shard = reseal(tmp_path / "s.jsonl", records)
    with pytest.raises(RecordRefused, match=r"s\.jsonl:3: record m/needle/512/invented/aware/snapkv-poisson/0\.25/0 "
                                             r"is not one the plan puts in this shard") as info:
        score_shards([shard], folder, expected={str(shard): plan})
    assert "\n" not in str(info.value) and "delete" in str(info.value)


def test_two_same_size_shards_swapped_between_cells_are_refused(prereg, tmp_path):
    folder, fr = prereg
    needle = [make_record(f"n{i}", prereg_hash=fr.prereg_hash, task="needle") for i in range(3)]
    multikey = [make_record(f"k{i}", prereg_hash=fr.prereg_hash, task="multikey") for i in range(3)]
    a, b = tmp_path / "needle" / "shard000.jsonl", tmp_path / "multikey" / "shard000.jsonl"
    reseal(a, multikey)  # swapped, seals too
    reseal(b, needle)
    with pytest.raises(RecordRefused, match=r"needle/shard000\.jsonl:1: record m/multikey/.* is not one the plan puts"):
        score_shards([a, b], folder, expected={str(a): planned(needle), str(b): planned(multikey)})


def test_a_config_hash_other_than_the_composed_one_is_refused_naming_both(prereg, tmp_path):
    from kvcert.analysis.load import PlannedShard
    from kvcert.generation.record import GenerationKey

    folder, fr = prereg
    records = [make_record("a", prereg_hash=fr.prereg_hash)]
    plan = PlannedShard({GenerationKey.of(records[0]): "b16fp32b16fp32aa"}, "configs/model/m.yaml")
    shard = reseal(tmp_path / "s.jsonl", records)
    with pytest.raises(RecordRefused, match=r"config_hash c0ffee differs from b16fp32b16fp32aa, the hash of the "
                                             r"config its job composes now \(configs/model/m\.yaml\).*delete"):
        score_shards([shard], folder, expected={str(shard): plan})


def test_a_missing_planned_record_is_refused(prereg, tmp_path):
    folder, fr = prereg
    records = [make_record(f"e{i}", prereg_hash=fr.prereg_hash) for i in range(3)]
    plan = planned(records)
    shard = reseal(tmp_path / "s.jsonl", [records[0], records[1], records[1]])  # a duplicate fills the gap
    with pytest.raises(RecordRefused, match=r"1 planned records missing \(e\.g\. m/needle/512/e2/"):
        score_shards([shard], folder, expected={str(shard): plan})


def test_the_plan_comes_from_the_manifest_and_the_configs_composed_now(prereg, tmp_path):
    """planned_shards: the examples of the manifest beside the shard, the config hashes of the runs
    composed from the configs as they are; a dtype edited after the run is refused, naming both."""
    from kvcert.analysis.steps import planned_shards
    from kvcert.generation.plan import build_plan, load_grid

    folder, fr = prereg
    configs, plan = configs_and_smoke_plan(tmp_path, folder)
    shard = plan.shards[0]
    results = tmp_path / "results" / "smoke"
    manifest = results / shard.manifest
    plan = build_plan("smoke", load_grid(folder, "grids/smoke.yaml"))
    built_manifest(manifest, plan.manifest(shard.model, shard.task, shard.length), configs)
    expected = plan.job(shard, configs, folder, manifest=manifest).planned_records()
    assert len(expected) == shard.generations
    from kvcert.tasks.records import load_records

    examples = {r.id: r for r in load_records(manifest)}  # a record's references are its example's
    records = [make_record(key[3], model=key[0], task=key[1], target_tokens=key[2], prereg_hash=fr.prereg_hash,
                           condition=key[4], sampler=None if key[4] == "full" else key[5].split("-")[1],
                           budget=key[6], config_hash=digest, method=key[5], answers=list(examples[key[3]].answers),
                           metadata=dict(examples[key[3]].metadata)) for key, digest in expected.items()]
    path = reseal(results / shard.path, records)
    plans = planned_shards([path], "smoke", folder, configs)
    df, prov = score_shards([path], folder, expected=plans)
    assert len(df) == shard.generations and prov["plan_checked"]

    # the references a score is derived from are the manifest's: an answer and its references edited
    # together (the seal recomputed) are refused, not scored as correct
    forged = [dict(r, answer="totally wrong", answers=["totally wrong"]) if i == 1 else r for i, r in enumerate(records)]
    reseal(path, forged)
    with pytest.raises(RecordRefused, match=r"shard000\.jsonl:2: record .*: its reference answers differ from the "
                                             r"manifest's \(.*512\.jsonl\), which its score is derived from"):
        score_shards([path], folder, expected=planned_shards([path], "smoke", folder, configs))
    reseal(path, records)

    model = configs / "model" / "embedded.yaml"
    model.write_text(model.read_text().replace("dtype: float32", "dtype: bfloat16"))
    with pytest.raises(RecordRefused, match=r"config_hash [0-9a-f]{16} differs from [0-9a-f]{16}, the hash of the "
                                             r"config its job composes now"):
        score_shards([path], folder, expected=planned_shards([path], "smoke", folder, configs))


def test_a_partial_holding_another_cells_records_is_set_aside_not_sealed(tmp_path, tiny_model, capsys):
    from kvcert.generation.runner import run_specs
    from kvcert.generation.shards import ShardWriter, read_records
    from kvcert.generation.spec import GenerationSpec
    from kvcert.tasks import generate as generate_task

    model, tokenizer = tiny_model
    needle = generate_task("needle", tokenizer, n_examples=2, target_tokens=200, seed=1)
    other = [replace(r, task="multikey") for r in needle]  # another cell's records under the same ids
    config = GenerationSpec.from_dict({"model": {"name": "tiny", "path": "unused"}, "method": {"name": "full"},
                                       "condition": "full", "max_new_tokens": 3})
    foreign = run_specs([config], other, tmp_path / "other.jsonl", "p", (model, tokenizer), progress=False)
    out = tmp_path / "shard.jsonl"
    out.with_name(out.name + ".partial").write_text(foreign.read_text())
    run_specs([config], needle, out, "p", (model, tokenizer), progress=False)
    assert {r["task"] for r in read_records(out)} == {"needle"}
    assert "a record of another shard" in capsys.readouterr().err
    # a partial that mixes its own records with foreign ones keeps its own, and sets aside only the others
    mixed = tmp_path / "mixed.jsonl"
    own = run_specs([config], needle[:1], tmp_path / "own.jsonl", "p", (model, tokenizer), progress=False)
    intruder = foreign.read_text().splitlines(keepends=True)[1]  # another cell's record of the second example
    mixed.with_name(mixed.name + ".partial").write_text(own.read_text() + intruder)
    run_specs([config], needle, mixed, "p", (model, tokenizer), progress=False)
    err = capsys.readouterr().err
    assert "1 records set aside as mixed.jsonl.partial.stale" in err and "the 1 records of this shard are kept" in err
    assert [r for r in read_records(mixed) if r["example_id"] == needle[0].id] == read_records(own)
    assert mixed.with_name(mixed.name + ".partial.stale").read_text() == intruder
    writer = ShardWriter(tmp_path / "extra.jsonl").open()
    writer.write(read_records(out)[0])
    with pytest.raises(RuntimeError, match="records this shard does not plan"):
        writer.finalize([])


# --- 2. a model's identity is an input -------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(word_model_dir):
    return word_model_dir


@pytest.fixture(scope="module")
def tiny_model(tiny_dir):
    from kvcert.method.models import ModelSpec, load_model

    return load_model(ModelSpec(name="tiny", path=str(tiny_dir)))


def nan_copy(source: Path, dest: Path, name: str = "mlp.down_proj") -> Path:
    """A copy of a model folder with one NaN weight (same file size, same safetensors header)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, dest)
    weights = load_file(dest / "model.safetensors")
    key = next(k for k in weights if name in k)
    weights[key][0, 0] = float("nan")
    save_file(weights, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


def test_model_digest_follows_the_weights_not_the_path_or_time(tiny_dir, tmp_path):
    import os

    from kvcert.config.digest import DigestCache, model_digest

    cache = DigestCache(tmp_path / "digests.json")
    first = model_digest(str(tiny_dir), cache)
    copy = tmp_path / "copy"
    shutil.copytree(tiny_dir, copy)  # new paths, new times, the same bytes
    assert model_digest(str(copy), DigestCache(tmp_path / "digests.json")) == first
    weights = copy / "model.safetensors"
    stat = weights.stat()
    nan_copy(tiny_dir, tmp_path / "nan")
    shutil.copyfile(tmp_path / "nan" / "model.safetensors", weights)  # replaced in place, same size
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert weights.stat().st_size == stat.st_size
    assert model_digest(str(copy), DigestCache(tmp_path / "digests.json")) != first


def test_the_snakefile_gives_generate_replay_and_manifest_the_model_digest():
    text = (REPO / "Snakefile").read_text()
    for rule in ("manifest", "replay", "generate"):
        body = text.split(f"rule {rule}:")[1].split("\nrule ")[0]
        assert "model=model_of" in body, rule


def test_nan_weights_are_refused_in_one_line_naming_the_folder(tiny_dir, tmp_path):
    from kvcert.generation.engine import Engine, ModelOutputError
    from kvcert.generation.forked import generate
    from kvcert.generation.spec import GenerationSpec
    from kvcert.method.models import ModelSpec, load_model
    from kvcert.tasks import generate as generate_task

    from kvcert.method.models import BrokenModelError

    broken = nan_copy(tiny_dir, tmp_path / "nan")
    with pytest.raises(BrokenModelError, match=rf"model {re.escape(str(broken))}: weight .*down_proj.weight holds NaN"):
        load_model(ModelSpec(name="nan", path=str(broken)))  # refused as it loads
    # weights that break after loading (or overflow in their dtype): the engine's own checks
    model, tokenizer = load_model(ModelSpec(name="nan", path=str(tiny_dir)))
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "mlp.down_proj" in n)[0, 0] = float("nan")
    record = generate_task("needle", tokenizer, n_examples=1, target_tokens=200, seed=1)[0]

    def spec(**kw):
        return GenerationSpec.from_dict({"model": {"name": "nan", "path": str(broken)}, "max_new_tokens": 3, **kw})

    full = spec(method={"name": "full"}, condition="full")
    poisson = spec(method={"name": "snapkv-poisson", "scorer": "snapkv", "sampler": "poisson"}, condition="aware",
                   budget=0.25)
    for run in (lambda: generate([Engine(model, tokenizer, full)], record)[0],
                lambda: generate([Engine(model, tokenizer, poisson)], record)[0],
                lambda: generate([Engine(model, tokenizer, full), Engine(model, tokenizer, poisson)], record)):
        with pytest.raises(ModelOutputError, match=rf"model {re.escape(str(broken))}: non-finite") as info:
            run()
        assert "\n" not in str(info.value)


def test_check_runs_one_token_and_refuses_nan_logits(tiny_dir, tmp_path):
    from kvcert.commands.check import check_forward

    assert check_forward("tiny", {"name": "tiny", "path": str(tiny_dir), "dtype": "float32", "device": "cpu"}) == []
    broken = nan_copy(tiny_dir, tmp_path / "nan")
    problems = check_forward("tiny", {"name": "tiny", "path": str(broken), "dtype": "float32", "device": "cpu"})
    assert len(problems) == 1 and str(broken) in problems[0] and "NaN" in problems[0]
    # NaN in a query projection: PyTorch's CPU attention can swallow it into finite (wrong) outputs, so the
    # weights themselves are checked when the model loads
    query = nan_copy(tiny_dir, tmp_path / "nan-q", name="self_attn.q_proj")
    [problem] = check_forward("tiny", {"name": "tiny", "path": str(query), "dtype": "float32", "device": "cpu"})
    assert problem.startswith(f"model tiny: {query}: weight model.layers.") and "q_proj.weight holds NaN" in problem


def test_check_refuses_what_every_job_would_refuse(tiny_dir, tmp_path):
    """The pre-flight's model check: a dtype that is no torch dtype name, a checkpoint without the chat template
    the grid's prompts go through, fewer positions than the grid's longest prompt and answer — each one line."""
    import json

    from kvcert.commands.check import check_model

    cfg = {"name": "tiny", "path": str(tiny_dir), "dtype": "float32", "device": "cpu"}
    assert check_model("tiny", cfg, chat=True, longest=(2048 + 16, "task needle at 2048 tokens")) == []
    [problem] = check_model("tiny", dict(cfg, dtype="bf16"))
    assert "dtype 'bf16' is not one of bfloat16, float16, float32" in problem
    plain = tmp_path / "no-template"
    shutil.copytree(tiny_dir, plain)
    settings = json.loads((plain / "tokenizer_config.json").read_text())
    settings.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(settings))
    for extra in plain.glob("chat_template.*"):
        extra.unlink()
    assert check_model("tiny", dict(cfg, path=str(plain)), chat=False) == []  # LongBench's no-chat data sets only
    [problem] = check_model("tiny", dict(cfg, path=str(plain)), chat=True)
    assert "has no chat template" in problem and str(plain) in problem
    [problem] = check_model("tiny", cfg, longest=(4096 + 16, "task needle at 4096 tokens with its answer"))
    assert "needs 4112 positions, the model has 4096" in problem


# --- 3. a freeze chain that guards itself ----------------------------------------------------------
def fresh(tmp_path: Path) -> Path:
    folder = tmp_path / "preregistration"
    shutil.copytree(PREREG, folder, ignore=shutil.ignore_patterns("freeze"))
    return folder


def amend(folder: Path, reason: str, **kw):
    grid = folder / "grids" / "smoke.yaml"
    grid.write_text(grid.read_text() + f"# {reason}\n")
    return freeze(folder, reason=reason, **kw)


def edit(path: Path, **changes) -> None:
    data = yaml.safe_load(path.read_text())
    data.update(changes)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_the_projects_freeze_records_verify_as_they_are():
    """The records from before the chain keep their hashes (the last one's is b4ac5a…); the newest is chained."""
    fr = verify(PREREG)
    records = freezes(PREREG)
    assert fr.path == records[-1].path and fr.chained
    legacy = {r.path.name: r for r in records if not r.chained}
    assert legacy["20261201T174323.839936Z.yaml"].prereg_hash == (
        "b4ac5aa5fc3422c2b79714d860e3512673ce216389463f7d3a09f63b3c4ff8ed")


def test_an_edited_frozen_utc_breaks_the_chain(tmp_path):
    folder = fresh(tmp_path)
    first = freeze(folder)
    second = amend(folder, "more examples")
    assert verify(folder).prereg_hash == second.prereg_hash != first.prereg_hash
    original = first.path.read_text()
    edit(first.path, frozen_utc="2001-01-01T00:00:00.000000+00:00")  # the earlier record, moved back
    with pytest.raises(PreregError, match=r"frozen_utc 2001-01-01.* is not the time of its file name") as info:
        verify(folder)
    assert "\n" not in str(info.value)
    renamed = first.path.with_name("20010101T000000.000000Z.yaml")  # renamed to match: the chain still sees it
    first.path.rename(renamed)
    with pytest.raises(PreregError, match="missing or out of order|does not match its content"):
        verify(folder)
    renamed.unlink()
    first.path.write_text(original)
    assert verify(folder).prereg_hash == second.prereg_hash
    edit(first.path, reason="an innocent-looking edit")
    with pytest.raises(PreregError, match="does not match its content and the records before it"):
        verify(folder)


def test_a_legacy_record_becomes_part_of_the_first_chained_hash(tmp_path):
    """Records from before the chain keep verifying as they are; once a chained record follows,
    editing an earlier one (any field, frozen_utc included, even with its file renamed) fails."""
    folder = tmp_path / "preregistration"
    shutil.copytree(PREREG, folder)
    for record in freezes(folder):  # the records from before the chain, as they were when it began
        if record.chained:
            record.path.unlink()
    legacy = freezes(folder)[-1]
    assert not legacy.chained
    chained = amend(folder, "first chained record")
    assert chained.chained and chained.amends == legacy.path.name
    oldest = freezes(folder)[0].path
    text = oldest.read_text()
    oldest.write_text(text.replace("initial freeze, before any result exists", "initial freeze"))
    with pytest.raises(PreregError, match=rf"{chained.path.name}: its prereg_hash .* does not match"):
        verify(folder)


def test_a_freeze_in_the_future_is_refused_and_no_amendment_may_predate_it(tmp_path):
    """Round 6 (issue 62, item 8): the slow-clock refusal's own command (a reason saying "wrong clock"), pasted on
    a slow machine, wrote a backdated amendment that verified. No reason lets an amendment predate what it amends
    now, and no message offers a command that would write one; a record made ahead verifies once its time has
    passed, or is taken out of the chain by hand."""
    folder = fresh(tmp_path)
    now = datetime.now(timezone.utc)
    freeze(folder)
    fast = amend(folder, "made on a clock six months fast", now=now + timedelta(days=182))
    with pytest.raises(PreregError, match=r"182\.0 days ahead of this machine's clock.*it verifies once "
                                          r".* has passed") as info:
        verify(folder)
    assert "\n" not in str(info.value) and "wrong clock" not in str(info.value)
    assert "kvcert prereg freeze" not in str(info.value)
    for reason in ("the previous freeze was made on a wrong clock", f"the freeze {fast.path.name} was made on a "
                   "wrong clock"):
        with pytest.raises(PreregError, match=r"182\.0 days before the newest freeze record .*whatever its reason") \
                as info:
            freeze(folder, reason=reason)
        assert "wrong clock" not in str(info.value) and "kvcert prereg" not in str(info.value)  # nothing to paste
    assert freezes(folder)[-1].path == fast.path  # nothing written
    assert verify(folder, now=now + timedelta(days=182, minutes=1)).path == fast.path  # its time has passed
    fast.path.unlink()  # taken out of the chain by hand
    later = amend(folder, "after the record made ahead was taken out")
    assert verify(folder).path == later.path and later.amends != fast.path.name


def test_a_declared_clock_correction_an_earlier_release_wrote_still_verifies(tmp_path, monkeypatch):
    """Existing chains keep verifying: a backdated record whose reason declares the clock correction (what
    `kvcert prereg freeze` wrote before it refused them) is accepted by verify, a plain backdated one is not."""
    import kvcert.config.prereg as prereg

    folder = fresh(tmp_path)
    now = datetime.now(timezone.utc)
    freeze(folder, now=now - timedelta(hours=2))
    fast = amend(folder, "made on a clock six months fast", now=now + timedelta(days=182))
    monkeypatch.setattr(prereg, "check_forward", lambda previous, now: None)  # the earlier release's freeze
    fixed = amend(folder, f"the freeze {fast.path.name} was made on a wrong clock")
    monkeypatch.undo()
    assert fixed.amends == fast.path.name and parse_utc(fixed.frozen_utc) < parse_utc(fast.frozen_utc)
    assert verify(folder).path == fixed.path


def test_a_forked_chain_is_refused(tmp_path):
    folder = fresh(tmp_path)
    freeze(folder)
    base = tmp_path / "base"
    shutil.copytree(folder, base)
    branch = amend(folder, "branch one")
    other = amend(base, "branch two")
    shutil.copy(other.path, folder / "freeze" / other.path.name)
    with pytest.raises(PreregError, match=r"both amend .*: the chain forks"):
        verify(folder)
    assert branch.path.exists()


def test_a_job_on_a_slow_clock_refuses_to_start():
    from kvcert.config.prereg import check_clock

    verified = "2026-12-02T10:00:00+00:00"
    check_clock("v.json", verified, now=datetime(2026, 12, 2, 10, 1, tzinfo=timezone.utc))
    with pytest.raises(PreregError, match=r"24\.0 h before the verification it read .*fix this machine's clock"):
        check_clock("v.json", verified, now=datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc))


def test_pre_freeze_needs_the_record_older_than_the_verification_too(prereg, tmp_path):
    """A record stamped before the freeze but after the verification its job read was made after
    the freeze (the freezing clock was fast): kept. One older than both is pre-freeze."""
    folder, fr = prereg
    frozen = datetime.fromisoformat(fr.frozen_utc)
    before = (frozen - timedelta(minutes=2)).isoformat(timespec="seconds")
    older = (frozen - timedelta(days=1)).isoformat(timespec="seconds")
    shard = write_shard([make_record("a", prereg_hash=fr.prereg_hash, started_utc=before),
                         make_record("b", prereg_hash=fr.prereg_hash, started_utc=older)], tmp_path / "s.jsonl")
    verified = tmp_path / "verified.json"
    verified.write_text(json.dumps({"prereg_hash": fr.prereg_hash,
                                    "verified_utc": (frozen - timedelta(minutes=3)).isoformat()}))
    df, prov = score_shards([shard], folder, verified)
    assert df["pre_freeze"].tolist() == [False, True] and prov["pre_freeze"] == 1


def test_claims_refuse_excluded_records_unless_accepted(prereg, tmp_path):
    from kvcert.analysis.load import write_table
    from kvcert.analysis.steps import check_exclusions, claims_step

    folder, fr = prereg
    records = [make_record(f"e{i}", prereg_hash=fr.prereg_hash, started_utc="2001-01-01T00:00:00+00:00")
               for i in range(3)]
    shard = write_shard(records, tmp_path / "generations" / "m" / "main" / "needle" / "512" / "shard000.jsonl")
    df, prov = score_shards([shard], folder)
    scores = write_table(df, tmp_path / "scores.parquet", prov)
    with pytest.raises(RecordRefused, match=r"3 records started before the freeze .*\(m/main/needle/512: 3\).*"
                                             r"--accept-excluded") as info:
        claims_step(scores, [], folder, "smoke", tmp_path / "claims.json", configs=REPO / "configs")
    assert "\n" not in str(info.value) and not (tmp_path / "claims.json").exists()
    check_exclusions(df[~df["pre_freeze"]], scores, fr.frozen_utc)  # nothing left out: passes


# --- 4. kvcert run validates before loading the model ----------------------------------------------
@pytest.fixture
def no_model_load(monkeypatch):
    import kvcert.method.models

    def refuse(*_, **__):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(kvcert.method.models, "load_model", refuse)


@pytest.mark.parametrize("override, message", [
    ("budget=abc", r"budget=abc: must be a number"),
    ("limit=abc", r"limit=abc: must be an integer"),
    ("seed=abc", r"seed=abc: must be an integer"),
    ("limt=2", r"limt=2: unknown key 'limt' \(did you mean 'limit'\?\)"),
    ("task.max_new_tokens=0", r"task\.max_new_tokens=0: must be an integer >= 1"),
    ("length=5000", r"length=5000: with the 16-token answer it exceeds the model's 4096 positions"),
    ("length=10000000", r"length=10000000: .*4096 positions"),
])
def test_kvcert_run_checks_its_inputs_before_loading_the_model(no_model_load, override, message):
    from kvcert.commands.oneoff import run_command

    args = Namespace(overrides=["task=needle", "method=snapkv-poisson", "budget=0.25", "limit=1", override],
                     configs=None, prereg=None, quiet=True)
    if override.startswith("budget="):
        args.overrides.remove("budget=0.25")
    with pytest.raises(ValueError, match=message) as info:
        run_command(args)
    assert "\n" not in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_a_cuda_device_without_a_gpu_is_one_line(no_model_load):
    from kvcert.commands.oneoff import run_command

    args = Namespace(overrides=["task=needle", "model.device=cuda", "limit=1"], configs=None, prereg=None, quiet=True)
    with pytest.raises(ValueError, match=r"model\.device=cuda: no CUDA GPU on this machine; use model\.device=cpu"):
        run_command(args)


@pytest.mark.parametrize("field, value, message", [
    ("context", None, r"field 'context' must be text, got NoneType None"),
    ("input", 3, r"field 'input' must be text, got int 3"),
    ("context", "abc \ud800 def", r"field 'context' holds '\\ud800' at character 4, a lone surrogate"),
])
def test_longbench_rows_hold_text_where_text_belongs(tmp_path, no_model_load, field, value, message):
    from kvcert.commands.oneoff import run_command

    row = {"input": "What is X?", "context": "X is y.", "answers": ["y"], "length": 10, "dataset": "hotpotqa",
           "language": "en", "all_classes": None, "_id": "a1", field: value}
    (tmp_path / "hotpotqa.jsonl").write_text(json.dumps(row) + "\n")
    args = Namespace(overrides=["task=longbench_hotpotqa", f"task.source={tmp_path}", "limit=1", "length=1024"],
                     configs=None, prereg=None, quiet=True)
    with pytest.raises(ValueError, match=rf"hotpotqa\.jsonl:1: {message}") as info:
        run_command(args)
    assert "\n" not in str(info.value)


def test_a_task_record_with_a_lone_surrogate_is_one_line():
    from kvcert.tasks.records import RecordError, TaskRecord

    with pytest.raises(RecordError, match=r"field 'question' holds '\\udc80'"):
        TaskRecord(id="x", task="needle", context="c", question="q\udc80", answers=["a"], metadata={"target_tokens": 0})


# --- 5. atomic outputs -----------------------------------------------------------------------------
PLAIN_WRITE = re.compile(r"\.write_text\(|\.write_bytes\(|open\([^)]*[\"'][wa]b?[\"']|\.savefig\(|\.to_csv\(|"
                         r"\.to_parquet\(|pq\.write_table\(")


def test_every_output_goes_through_the_atomic_helper():
    """A plain write is allowed only on the temporary path of kvcert.atomic.atomic_path (``tmp``), the
    shard's append-only partial file, and the lock file."""
    offenders = []
    for path in sorted((REPO / "src" / "kvcert").rglob("*.py")):
        if path.name == "atomic.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#", 1)[0]
            if PLAIN_WRITE.search(code) and "tmp" not in code and "self.partial, \"a\"" not in code \
                    and "lock_path, \"a\"" not in code:
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_a_write_that_fails_leaves_the_old_file(tmp_path):
    from kvcert.atomic import atomic_path, write_text

    target = write_text(tmp_path / "claims.json", "old\n")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert target.read_text() == "old\n" and list(tmp_path.iterdir()) == [target]


def test_a_report_killed_half_way_leaves_no_summary_that_disagrees(tmp_path, monkeypatch):
    import kvcert.analysis.report as report
    from kvcert.analysis.steps import report_step, write_json

    out = tmp_path / "report"
    write_json({"claims": "of the previous run"}, out / "summary.json")
    claims = shutil.copy(Path(__file__).resolve().parents[1] / "results" / "reference" / "real" / "claims.json",
                         tmp_path / "claims.json")

    def killed(doc, df, prov, rp, rows, out_dir, replay_prov, **what_and_beside):
        (Path(out_dir) / "report.md").write_text("the new report")
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "build_report", killed)
    with pytest.raises(KeyboardInterrupt):
        report_step(claims, None, [], [], out)
    assert not (out / "summary.json").exists()


# --- 6/7. messages ---------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["bench", "decode", "--steps", "0"], "--steps 0: must be at least 1"),
    (["bench", "coverage", "--sizes", "0"], "--sizes 0: must be at least 1"),
    (["bench", "generate", "--examples", "0"], "--examples 0: must be at least 1"),
    (["bench", "certificate", "--repeats", "0"], "--repeats 0: must be at least 1"),
    (["bench", "report", "--models", "0"], "--models 0: must be at least 1"),
])
def test_bench_counts_of_zero_are_one_line(capsys, argv, message):
    from kvcert.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_an_empty_seal_is_named_with_its_path(prereg, tmp_path):
    folder, fr = prereg
    shard = write_shard([make_record("a", prereg_hash=fr.prereg_hash)], tmp_path / "s.jsonl")
    seal = tmp_path / "s.jsonl.seal.json"
    seal.write_text("")
    with pytest.raises(RecordRefused, match=rf"{re.escape(str(seal))}: the seal of s\.jsonl is an empty file; delete"):
        score_shards([shard], folder)


def test_an_empty_verification_file_is_named(prereg, tmp_path):
    folder, _ = prereg
    verified = tmp_path / "verified.json"
    verified.write_text("")
    with pytest.raises(PreregError, match=rf"{re.escape(str(verified))}: not a verification record \(an empty file\)"):
        score_shards([], folder, verified)


def test_an_unwritable_results_folder_is_caught_by_the_preflight(tmp_path):
    from kvcert.commands.check import check_results

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    problems = check_results(blocker / "results")
    assert len(problems) == 1 and "not writable" in problems[0] and "--config results=" in problems[0]
    assert check_results(tmp_path / "new" / "results") == []


@pytest.mark.parametrize("kwargs, message", [
    ({"key": "inf"}, r"key: contains an infinite value"),
    ({"query": "-inf"}, r"query: contains an infinite value"),
    ({"centre": torch.zeros(1, 4)}, r"centre: expected shape \[B, Hkv, D\]"),
    ({"centre": torch.zeros(1, 2, 4)}, r"centre: shape \(1, 2, 4\) does not match value"),
    ({"centre": torch.full((1, 1, 4), float("nan"))}, r"centre: contains NaN"),
])
def test_certified_attention_refuses_non_finite_inputs_and_a_bad_centre(kwargs, message):
    from kvcert.method.attention import certified_attention

    gen = torch.Generator().manual_seed(0)
    args = {"query": torch.randn(1, 2, 1, 4, generator=gen), "key": torch.randn(1, 1, 5, 4, generator=gen),
            "value": torch.randn(1, 1, 5, 4, generator=gen), "log_pi": None}
    for name, value in kwargs.items():
        if isinstance(value, str):
            args[name] = args[name].clone()
            args[name][0, 0, 0, 0] = float(value)
        else:
            args[name] = value
    with pytest.raises(ValueError, match=message):
        certified_attention(**args)


def test_poisson_sample_on_empty_input_is_a_value_error():
    from kvcert.method.design import poisson_sample

    with pytest.raises(ValueError, match=r"pi: empty \(shape \(0,\)\)"):
        poisson_sample(torch.empty(0))
    with pytest.raises(ValueError, match=r"pi: empty \(shape \(2, 0\)\)"):
        poisson_sample(torch.empty(2, 0))


def test_task_max_new_tokens_zero_is_refused_not_replaced():
    from kvcert.config.compose import answer_tokens

    assert answer_tokens({"max_new_tokens": None}) == 32 and answer_tokens({"max_new_tokens": 16}) == 16
    with pytest.raises(ValueError, match=r"task\.max_new_tokens=0: must be an integer >= 1"):
        answer_tokens({"max_new_tokens": 0})


def test_the_preflight_names_finished_shards_made_under_another_config(prereg, tmp_path, monkeypatch):
    """Results copied into a fresh clone (no Snakemake metadata) after a config change: the pre-flight, which every
    Snakemake run does first, names each finished shard whose records carry another config hash than its job's
    configs give now, with both hashes and the remedy; unchanged configs pass."""
    from kvcert.commands.check import check_finished_shards
    from kvcert.tasks.records import TaskRecord, write_jsonl

    folder, fr = prereg
    configs, plan = configs_and_smoke_plan(tmp_path, folder)
    shard = plan.shards[0]
    results = tmp_path / "results"
    manifest = results / "smoke" / shard.manifest
    write_jsonl([TaskRecord(id=f"{shard.task}-{i}", task=shard.task, context="c", question="q", answers=["x"],
                            metadata={"target_tokens": shard.length}) for i in range(shard.stop)], manifest)
    key, digest = next(iter(plan.job(shard, configs, folder, manifest=manifest).planned_records().items()))
    reseal(results / "smoke" / shard.path, [make_record(key[3], model=key[0], task=key[1], target_tokens=key[2],
                                                        prereg_hash=fr.prereg_hash, config_hash=digest)])
    assert check_finished_shards("smoke", plan, folder, configs, results) == []
    model = configs / "model" / "embedded.yaml"
    model.write_text(model.read_text().replace("dtype: float32", "dtype: bfloat16"))
    [problem] = check_finished_shards("smoke", plan, folder, configs, results)
    assert problem.startswith(f"{results / 'smoke' / shard.path}: made under config {digest}, but its job composes ")
    assert "delete the shard and its seal to regenerate it, or restore the configs" in problem
    # where Snakemake's metadata knows the shard, it reruns the job itself (its params changed): no problem
    from base64 import urlsafe_b64encode

    record = tmp_path / ".snakemake" / "metadata" / urlsafe_b64encode(f"{results}/smoke/{shard.path}".encode()).decode()
    record.parent.mkdir(parents=True)
    record.write_text("{}")
    monkeypatch.chdir(tmp_path)  # Snakemake's working directory
    assert check_finished_shards("smoke", plan, folder, configs, results) == []


def test_the_preflight_reads_weights_once_per_content_and_names_a_nan(tiny_dir, tmp_path, monkeypatch):
    """NaN weights replaced in place stop the pre-flight (every Snakemake run's first step) in one line naming the
    file and the weight, before any manifest is rebuilt; a folder whose content passed once is not read again."""
    from kvcert.commands import check

    monkeypatch.chdir(tmp_path)  # the .snakemake/kvcert cache of this test
    copy = tmp_path / "copy"
    shutil.copytree(tiny_dir, copy)
    assert check.check_weights("tiny", copy) == []
    assert (tmp_path / ".snakemake" / "kvcert" / "finite-weights.json").is_file()
    reads = []
    monkeypatch.setattr("safetensors.safe_open", lambda *a, **k: reads.append(a) or (_ for _ in ()).throw(AssertionError))
    assert check.check_weights("tiny", copy) == [] and reads == []  # passed once: not read again
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    nan_copy(tiny_dir, tmp_path / "nan")
    shutil.copyfile(tmp_path / "nan" / "model.safetensors", copy / "model.safetensors")  # replaced in place
    [problem] = check.check_weights("tiny", copy)
    assert re.fullmatch(rf"model tiny: {re.escape(str(copy))}/model\.safetensors: weight .*mlp\.down_proj\.weight "
                        r"holds NaN or ±inf; its weights are broken: replace the weights in that folder", problem)


# --- manifests rebuilt, not trusted; a model's bytes checked; the replay in the config's identity ----------
def _smoke_manifest(prereg, tmp_path, length=512):
    """(configs, results, plan, item, path): the real smoke manifest of needle at ``length``, as `kvcert manifest`
    builds it, in a results folder of ``tmp_path`` (the working folder, so its rebuild memory is this test's)."""

    folder, _ = prereg
    configs, plan = configs_and_smoke_plan(tmp_path, folder)
    item = plan.manifest("embedded", "needle", length)
    results = tmp_path / "results"
    path = built_manifest(results / "smoke" / item.path, item, configs)
    return configs, results, plan, item, path


def _reseal(path: Path, records) -> None:
    """Rewrite a manifest with ``records`` and recompute its seal (SHA-256 and count), as anyone can."""
    from kvcert.tasks.records import write_jsonl

    seal = path.with_name(path.name + ".seal.json")
    data = json.loads(seal.read_text())
    write_jsonl(records, path)
    data["sha256"], data["records"] = __import__("hashlib").sha256(path.read_bytes()).hexdigest(), len(records)
    seal.write_text(json.dumps(data))


def test_a_manifest_edited_and_resealed_is_rebuilt_and_refused(prereg, tmp_path, monkeypatch):
    """The answers of one needle/512 example changed to ["1111111"], the seal's SHA-256 and count
    recomputed. The seal passes; the rebuild from what the plan registers does not: the shard job, the score step
    and the pre-flight (before any job deletes anything) refuse it, naming the record and the field."""
    from kvcert.commands.check import check_finished_manifests
    from kvcert.generation import manifest as manifest_module
    from kvcert.generation.manifest import check_manifest, verify_manifest
    from kvcert.tasks.records import load_records

    monkeypatch.chdir(tmp_path)
    configs, results, plan, item, path = _smoke_manifest(prereg, tmp_path)
    verify_manifest(path, item, configs)  # as built: passes (and is remembered)
    records = load_records(path)
    records[3] = replace(records[3], answers=["1111111"])
    _reseal(path, records)
    from kvcert.generation.jobs import manifest_config_hash

    check_manifest(path, item, manifest_config_hash(configs, "embedded", "needle"))  # the seal alone is fooled
    with pytest.raises(ValueError, match=rf"512\.jsonl: not what `kvcert manifest` builds .*record "
                                         rf"'{re.escape(records[3].id)}' differs in answers — edited after it was "
                                         r"built \(its seal recomputed\)") as info:
        verify_manifest(path, item, configs)
    assert "\n" not in str(info.value)
    problems = check_finished_manifests("smoke", plan, configs, results)
    assert len(problems) == 1 and "differs in answers" in problems[0]
    # a manifest that matched once is not rebuilt again: what a job's start costs
    built_manifest(path, item, configs)
    monkeypatch.setattr(manifest_module, "build_records", lambda *a, **k: pytest.fail("rebuilt again"))
    verify_manifest(path, item, configs)


def test_a_manifest_and_seal_copied_from_another_cell_are_refused_where_snakemake_knows_them(prereg, tmp_path,
                                                                                            monkeypatch):
    """Needle/2048's manifest and seal copied over needle/512's, in a working folder whose
    Snakemake metadata knows the manifest: the pre-flight compares every manifest's registered inputs with the plan
    (not only where Snakemake does not know it), so no generate job deletes a finished shard and then refuses."""
    from base64 import urlsafe_b64encode

    from kvcert.commands.check import check_finished_manifests

    monkeypatch.chdir(tmp_path)
    configs, results, plan, item, path = _smoke_manifest(prereg, tmp_path, 2048)
    target = results / "smoke" / plan.manifest("embedded", "needle", 512).path
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, target)
    shutil.copyfile(path.with_name(path.name + ".seal.json"), target.with_name(target.name + ".seal.json"))
    record = tmp_path / ".snakemake" / "metadata" / urlsafe_b64encode(f"{results}/smoke/{item.path}".replace(
        "2048", "512").encode()).decode()
    record.parent.mkdir(parents=True)
    record.write_text("{}")  # Snakemake knows needle/512's manifest
    problems = check_finished_manifests("smoke", plan, configs, results)
    [copied] = [p for p in problems if p.startswith(str(target))]
    assert "built from other inputs than the plan's (length 2048 != 512)" in copied


def test_a_file_manifest_names_its_changed_source_file(tmp_path, monkeypatch):
    """A LongBench manifest's seal records its source file's SHA-256: the file changed since is named as such (and a
    manifest resealed over another source is rebuilt from the file and refused)."""
    from kvcert.generation.jobs import config_file, manifest_config_hash
    from kvcert.generation.manifest import (build_records, load_tokenizer, source_digests, verify_manifest,
                                            write_manifest)
    from kvcert.generation.plan import Manifest

    monkeypatch.chdir(tmp_path)
    configs = tmp_path / "configs"
    shutil.copytree(REPO / "configs", configs)
    data = tmp_path / "lb"
    data.mkdir()
    row = {"input": "Who wrote it?", "context": "X wrote it. " * 20, "answers": ["X"], "length": 10,
           "dataset": "hotpotqa", "language": "en", "all_classes": None, "_id": "a1"}
    (data / "hotpotqa.jsonl").write_text(json.dumps(row) + "\n")
    monkeypatch.setenv("LONGBENCH_DIR", str(data))  # longbench_hotpotqa's source (kvcert.config.task_table)
    item = Manifest("embedded", "longbench_hotpotqa", 512, 1, 0)
    cfg = config_file(configs, "task", item.task)
    sources = source_digests(cfg)
    assert list(sources) == ["hotpotqa.jsonl"]
    records = build_records(cfg, load_tokenizer(config_file(configs, "model", "embedded")), 512, 1, 0)
    path = write_manifest(records, tmp_path / "m.jsonl", item, manifest_config_hash(configs, "embedded", item.task),
                          sources)
    verify_manifest(path, item, configs)
    (data / "hotpotqa.jsonl").write_text(json.dumps(dict(row, answers=["Y"])) + "\n")
    with pytest.raises(ValueError, match=r"m\.jsonl: its source file hotpotqa\.jsonl changed since the manifest was "
                                         r"built \(SHA-256 [0-9a-f]{16}… then, [0-9a-f]{16}… now\)"):
        verify_manifest(path, item, configs)


def test_the_preflight_names_a_stale_replay_beside_the_stale_shards(prereg, tmp_path, monkeypatch):
    """After a dtype change in a fresh clone (no Snakemake metadata) the pre-flight names the
    replay table made under the old configs with the stale shards, so it is rerun with them (not refused by the
    claims step after the whole grid was regenerated); where Snakemake knows the table it reruns it itself."""
    import pandas as pd
    from base64 import urlsafe_b64encode

    from kvcert.commands.check import check_finished_replays
    from kvcert.generation.jobs import replay_config_hash
    from kvcert.tables import write_table

    monkeypatch.chdir(tmp_path)
    folder, _ = prereg
    configs, plan = configs_and_smoke_plan(tmp_path, folder)
    r = plan.replays[0]
    results = tmp_path / "results"
    table = results / "smoke" / "replay" / r.model / f"{r.task}-{r.length}.parquet"
    made = replay_config_hash(configs, r.model, r.task, plan.grid["replay"]["method"])
    write_table(pd.DataFrame({"x": [1]}), table, {"config_hash": made, "model": r.model, "task": r.task})
    assert check_finished_replays("smoke", plan, configs, results) == []
    model = configs / "model" / "embedded.yaml"
    model.write_text(model.read_text().replace("dtype: float32", "dtype: bfloat16"))
    [problem] = check_finished_replays("smoke", plan, configs, results)
    assert problem.startswith(f"{table}: replay table made under config {made}, but its job composes ")
    assert f"delete it and {r.task}-{r.length}.impossibility.json to rerun the replay" in problem
    from kvcert.commands import check

    monkeypatch.setattr(check, "check_model", lambda *a, **k: [])  # the models' own checks are tested elsewhere
    assert problem in check.preflight("smoke", folder, configs, results=results)  # what every Snakemake run does
    write_table(pd.DataFrame({"x": [1]}), table, {"model": r.model})  # an earlier kvcert's: no hash
    assert "carries no config hash" in check_finished_replays("smoke", plan, configs, results)[0]
    record = tmp_path / ".snakemake" / "metadata" / urlsafe_b64encode(
        f"{results}/smoke/replay/{r.model}/{r.task}-{r.length}.parquet".encode()).decode()
    record.parent.mkdir(parents=True)
    record.write_text("{}")
    assert check_finished_replays("smoke", plan, configs, results) == []


def test_every_record_carries_its_model_folders_digest_and_a_partial_of_other_weights_is_set_aside(
        tiny_dir, tmp_path, capsys):
    """A record carries the content digest of the folder it was made from; resuming a partial shard, records made
    from another folder's content (weights replaced between the kill and the rerun) are set aside, not kept."""
    from kvcert.config.digest import content_digest
    from kvcert.generation.runner import run_specs
    from kvcert.generation.shards import read_records
    from kvcert.generation.spec import GenerationSpec
    from kvcert.tasks import TASKS
    from kvcert.generation.manifest import load_tokenizer

    spec = GenerationSpec.from_dict({"model": {"name": "tiny", "path": str(tiny_dir)}, "method": {"name": "full"},
                                     "condition": "full", "max_new_tokens": 2})
    examples = TASKS["needle"].generate(load_tokenizer({"path": str(tiny_dir)}), n_examples=2, target_tokens=256,
                                        seed=3)
    out = run_specs([spec], examples, tmp_path / "s.jsonl", progress=False)
    records = read_records(out)
    digest = content_digest(str(tiny_dir))
    assert len(digest) == 16 and {r["model_digest"] for r in records} == {digest}
    partial = tmp_path / "t.jsonl.partial"
    partial.write_text(json.dumps(dict(records[0], model_digest="0" * 16)) + "\n")
    run_specs([spec], examples, tmp_path / "t.jsonl", progress=False)
    assert "made from the model folder of digest 0000000000000000, not " + digest in capsys.readouterr().err
    assert {r["model_digest"] for r in read_records(tmp_path / "t.jsonl")} == {digest}


def test_records_of_one_model_from_two_folders_are_refused_and_old_records_without_a_digest_are_read(prereg, tmp_path):
    folder, fr = prereg
    one = write_shard([make_record("a", prereg_hash=fr.prereg_hash)], tmp_path / "one.jsonl")
    other = write_shard([make_record("b", prereg_hash=fr.prereg_hash, model_digest="0123456789abcdef")],
                        tmp_path / "two.jsonl")
    with pytest.raises(RecordRefused, match=r"one\.jsonl:1 and .*two\.jsonl:1: records of model .* made from different "
                                            r"model folders \(model digests f1c7ed16e57d16e5 and 0123456789abcdef"):
        score_shards([one, other], folder)
    old = make_record("b", prereg_hash=fr.prereg_hash)
    del old["model_digest"]  # a record written before the digest was stamped (results/real's)
    df, _ = score_shards([one, write_shard([old], tmp_path / "two.jsonl")], folder)
    assert len(df) == 2 and set(df["model_digest"].dropna()) == {"f1c7ed16e57d16e5"}


def test_a_partial_shard_begun_at_another_record_code_is_refused_naming_both_digests(tiny_dir, tmp_path):
    """Round 6 (issue 62, item 4): a shard killed at 91 of 312 records and resumed after a record-code change held
    records of two code digests, scored together. Resuming at another code is refused (before the model loads),
    naming both digests; the partial file is left as it was."""
    from kvcert.generation.manifest import load_tokenizer
    from kvcert.generation.runner import run_specs
    from kvcert.generation.shards import ShardCodeError, read_records
    from kvcert.generation.spec import GenerationSpec
    from kvcert.provenance import code_digest
    from kvcert.tasks import TASKS

    spec = GenerationSpec.from_dict({"model": {"name": "tiny", "path": str(tiny_dir)}, "method": {"name": "full"},
                                     "condition": "full", "max_new_tokens": 2})
    examples = TASKS["needle"].generate(load_tokenizer({"path": str(tiny_dir)}), n_examples=2, target_tokens=256,
                                        seed=3)
    records = read_records(run_specs([spec], examples, tmp_path / "s.jsonl", progress=False))
    assert {r["code_digest"] for r in records} == {code_digest()}
    partial = tmp_path / "t.jsonl.partial"
    partial.write_text(json.dumps(dict(records[0], code_digest="0123456789abcdef"), sort_keys=True) + "\n")
    before = partial.read_bytes()
    with pytest.raises(ShardCodeError, match=rf"t\.jsonl\.partial: 1 of its 1 records were made at record code "
                                             rf"0123456789abcdef .*this code is {code_digest()}: a shard holds one "
                                             r"code's records; delete t\.jsonl\.partial") as e:
        run_specs([spec], examples, tmp_path / "t.jsonl", progress=False,
                  model_and_tokenizer=(None, None))  # nothing is generated: the model is never touched
    assert "\n" not in str(e.value)
    assert partial.read_bytes() == before and not (tmp_path / "t.jsonl").exists()
    assert not (tmp_path / "t.jsonl.lock").exists()


def test_a_shard_holding_records_of_two_record_codes_is_refused_by_scoring(prereg, tmp_path):
    """Round 6 (issue 62, item 4): the loader refuses a shard whose records carry two code digests, in one line."""
    folder, fr = prereg
    shard = write_shard([make_record("a", prereg_hash=fr.prereg_hash, code_digest="aaaaaaaaaaaaaaaa"),
                         make_record("b", prereg_hash=fr.prereg_hash, code_digest="bbbbbbbbbbbbbbbb")],
                        tmp_path / "mixed.jsonl")
    with pytest.raises(RecordRefused, match=r"mixed\.jsonl:1 and :2: records made at two record codes "
                                            r"\(aaaaaaaaaaaaaaaa and bbbbbbbbbbbbbbbb\)") as e:
        score_shards([shard], folder)
    assert "\n" not in str(e.value)
    one = write_shard([make_record("a", prereg_hash=fr.prereg_hash, code_digest="aaaaaaaaaaaaaaaa")],
                      tmp_path / "one.jsonl")
    other = write_shard([make_record("b", prereg_hash=fr.prereg_hash, code_digest="bbbbbbbbbbbbbbbb")],
                        tmp_path / "other.jsonl")
    df, _ = score_shards([one, other], folder)  # two shards, each of one code: read (a re-validation's case)
    assert len(df) == 2


def test_kvcert_decode_graph_is_0_or_1_and_ignored_once_said_without_cuda(tiny_dir, tmp_path, monkeypatch, capsys):
    """Round 6 (issue 62, item 8): KVCERT_DECODE_GRAPH=1 on a CPU, and =yes anywhere, were silently off. Another
    value than 0 or 1 is refused in one line (by the shard writer before the model loads); 1 without a CUDA device
    is said once per process and ignored."""
    from kvcert.generation import decode_step
    from kvcert.generation.runner import run_specs
    from kvcert.generation.spec import GenerationSpec

    monkeypatch.setattr(decode_step, "_said_no_cuda", False)
    for value in ("yes", "true", "2", "on"):
        monkeypatch.setenv("KVCERT_DECODE_GRAPH", value)
        with pytest.raises(ValueError, match=rf"^KVCERT_DECODE_GRAPH={value}: must be 1 \(decode steps replayed from "
                                             r"a CUDA graph on a GPU\) or 0 \(every step eager, the default\); give "
                                             r"KVCERT_DECODE_GRAPH=1 or unset it$"):
            decode_step.decode_graph("cpu")
    spec = GenerationSpec.from_dict({"model": {"name": "tiny", "path": str(tiny_dir)}, "method": {"name": "full"},
                                     "condition": "full", "max_new_tokens": 2})
    with pytest.raises(ValueError, match=r"^KVCERT_DECODE_GRAPH=on: must be 1"):
        run_specs([spec], [], tmp_path / "s.jsonl", progress=False, model_and_tokenizer=(None, None))
    for value in ("0", ""):
        monkeypatch.setenv("KVCERT_DECODE_GRAPH", value)
        assert decode_step.decode_graph("cpu") is False
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("KVCERT_DECODE_GRAPH", "1")
    assert decode_step.decode_graph("cpu") is False and decode_step.decode_graph("cpu") is False
    assert capsys.readouterr().err == ("KVCERT_DECODE_GRAPH=1 ignored: no CUDA device (the decode steps run eagerly "
                                       "on cpu)\n")


def test_every_probe_of_every_round_is_a_test_that_exists():
    """docs/reliability.md lists every probe of every round with the tests that check it: each test it names is
    defined where it says, and every round's table names at least one per probe."""
    text = (REPO / "docs" / "reliability.md").read_text()
    section = text[text.index("## The hostile probes, every round"):]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| probe")
            and not line.startswith("| #") and not line.startswith("|---")]
    assert len(rows) >= 35  # rounds 1–3: 16, round 4: 10, round 5: 9
    for row in rows:
        named = re.findall(r"tests/(test_\w+\.py)::(test_\w+)", row)
        assert named, f"a probe without a test: {row[:100]}"
        for module, test in named:
            source = (REPO / "tests" / module).read_text()
            assert re.search(rf"^def {test}\(", source, re.M), f"{module}::{test} is named in docs/reliability.md"
    assert re.search(r"\*\*Round 5\.\*\*.*\n(.*\n)*\| 8 \|", section)
