"""Generation engine: conditions, signals, resumable shards, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kvcert.generation.engine import Engine
from kvcert.generation.forked import generate
from kvcert.generation.record import GenerationRecord
from kvcert.generation.runner import run_job
from kvcert.generation.shards import (
    CorruptShardError,
    ShardWriter,
    read_records,
    record_key,
)
from kvcert.generation.spec import GenerationSpec
from kvcert.method.models import ModelSpec, load_model, resolve_model_path
from kvcert.tasks import generate as generate_task
from kvcert.tasks.records import write_jsonl
from kvcert.training.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model_dir(word_model_dir):
    return word_model_dir


@pytest.fixture(scope="module")
def loaded(model_dir):
    return load_model(ModelSpec(name="tiny", path=str(model_dir)))


@pytest.fixture(scope="module")
def records(tokenizer):
    # 300-token prompts (no answer reserve): long enough for a sampled tail at budget 0.25
    return generate_task("needle", tokenizer, n_examples=3, target_tokens=300, seed=123, answer_tokens=0)


def job(condition="aware", sampler="poisson", budget=0.25, **extra):
    method = {"name": "full"} if condition == "full" else {
        "name": f"snapkv-{sampler}", "scorer": "snapkv", "sampler": sampler, "allocation": "uniform",
    }
    return {
        "model": {"name": "tiny", "path": "unused"},
        "method": method, "condition": condition, "budget": 1.0 if condition == "full" else budget,
        "seed": 7, "max_new_tokens": 6, **extra,
    }


def engine(loaded, **kw):
    model, tok = loaded
    return Engine(model, tok, GenerationSpec.from_dict(job(**kw)), {"config_hash": "x", "prereg_hash": "p", "git_commit": "g"})


def test_full_cache_record_and_greedy_equivalence(loaded, records):
    model, tok = loaded
    out = generate([engine(loaded, condition="full")], records[0])[0]
    assert GenerationRecord.from_dict(out).to_dict() == out  # exactly the record type's fields
    assert out["attention_entropy_steps"] is None and out["evicted_mass"] is None  # nothing compressed
    assert len(out["output_entropy_steps"]) == len(out["top2_margin_steps"]) == out["decode_steps"]
    assert out["certificate"] is None and out["kept_fraction"] == [1.0, 1.0]
    from kvcert.tasks.prompting import build_prompt_ids

    ids, _ = build_prompt_ids(tok, records[0])
    ref = model.generate(torch.tensor([ids]), max_new_tokens=len(out["tokens"]), do_sample=False)[0, len(ids):]
    assert ref.tolist()[: len(out["tokens"])] == out["tokens"]
    assert len(out["token_logprobs"]) == len(out["tokens"]) and all(lp <= 0 for lp in out["token_logprobs"])


@pytest.mark.parametrize("condition", ["aware", "streaming"])
def test_randomized_conditions_record_certificates(loaded, records, condition):
    out = generate([engine(loaded, condition=condition)], records[1])[0]
    cert = out["certificate"]
    assert cert is not None
    assert len(cert["steps"]["mean"]) == len(out["tokens"])  # one certified step per generated token
    assert all(v > 0 for v in cert["steps"]["max"])
    assert all(a >= b for a, b in zip(cert["anytime_steps"]["mean"], cert["steps"]["mean"]))
    assert len(cert["first_step_layers"]["max"]) == 2
    assert all(0.15 < f < 0.45 for f in out["kept_fraction"])
    assert out["kv_bytes_final"] < out["kv_bytes_peak"]
    robust = out["certificate_robust"]  # the second certificate field: same layout, never below the plug-in
    assert set(robust) == set(cert) and len(robust["steps"]["mean"]) == len(cert["steps"]["mean"])
    for key in ("steps", "anytime_steps", "relative_steps"):
        assert all(r >= p - 1e-12 for r, p in zip(robust[key]["max"], cert[key]["max"]))
    assert 0 < out["sketch_bytes"] <= 0.02 * 0.25 * out["prompt_tokens"] * 2 * 2 * 2 * 16 * 4  # layers·heads·K+V·dim·fp32


def test_streaming_positions_continue_from_original_length(loaded, records):
    """Streaming at 100% budget gives the full cache's tokens: RoPE positions are preserved."""
    full = generate([engine(loaded, condition="full")], records[2])[0]
    streaming = generate([engine(loaded, condition="streaming", sampler="topk", budget=1.0)], records[2])[0]
    chunked = generate([engine(loaded, condition="streaming", sampler="topk", budget=1.0, chunk_tokens=64)], records[2])[0]
    assert streaming["tokens"] == full["tokens"] == chunked["tokens"]
    torch.testing.assert_close(torch.tensor(streaming["token_logprobs"]), torch.tensor(full["token_logprobs"]), atol=1e-4, rtol=0)


def test_deterministic_method_has_no_certificate_and_runs_repeat(loaded, records):
    a = generate([engine(loaded, condition="aware", sampler="topk")], records[0])[0]
    b = generate([engine(loaded, condition="aware", sampler="poisson")], records[0])[0]
    c = generate([engine(loaded, condition="aware", sampler="poisson")], records[0])[0]
    assert a["certificate"] is None and a["certificate_robust"] is None and a["sketch_bytes"] == 0
    assert b["certificate_robust"] == c["certificate_robust"]
    assert b["tokens"] == c["tokens"] and b["certificate"] == c["certificate"]  # same seed, same sample


def test_chunked_streaming_decides_each_token_once(loaded, records):
    out = generate([engine(loaded, condition="streaming", budget=0.25, chunk_tokens=64)], records[1])[0]
    assert out["certificate"] is not None
    assert all(f < 0.6 for f in out["kept_fraction"])
    # with no top slice and a uniform tail no π caps at 1: after every chunk, each KV head holds
    # exactly the sinks and the undecided recent window as certain tokens (a head that kept fewer
    # tokens must not let its recent tokens slip past the next round's segment undecided)
    from kvcert.method.cache import CertifiedCache
    from kvcert.method.design import RetentionDesign
    from kvcert.method.press import EvictionPress
    from kvcert.tasks.prompting import build_prompt_ids

    model, tok = loaded
    design = RetentionDesign(sinks=4, window=16, top_fraction=0.0, floor=1.0)
    press = EvictionPress(scorer="snapkv", budget=0.25, sampler="poisson", design=design, seed=3)
    ids, question_start = build_prompt_ids(tok, records[1])
    cache = CertifiedCache(record_certificates=False)
    with torch.inference_mode():
        for start in range(0, question_start, 64):
            cache.arm(press, keep_recent=design.window)
            model(input_ids=torch.tensor([ids[start : min(start + 64, question_start)]]), cache=cache, use_cache=True)
            for layer in cache.layers:
                lp = layer.log_pi[0]
                assert torch.equal(torch.isfinite(lp).sum(-1), layer.kept[0])  # real slots = kept count
                if layer.compactions:
                    assert (lp == 0).sum(-1).tolist() == [design.sinks + design.window] * lp.shape[0], start
                    assert bool(((lp[:, -design.window :]) == 0).all())  # the window: last, in every head


@pytest.mark.parametrize(
    "patch, match",
    [
        ({"budgett": 0.5}, "budgett: unknown .*did you mean 'budget'"),
        ({"budget": 1.5}, "budget"),
        ({"budget": 0.0}, "budget"),
        ({"condition": "sideways"}, "condition"),
        ({"method": {"name": "x", "scorer": "nope", "sampler": "poisson"}}, "method.scorer"),
        ({"method": {"name": "x", "scorer": "snapkv", "sampler": "poisson", "desing": {}}}, "method.desing"),
        ({"certificate": {"delta": 2.0}}, "certificate.delta"),
    ],
)
def test_bad_config_one_line(patch, match):
    cfg = job()
    cfg.update(patch)
    with pytest.raises(ValueError, match=match) as info:
        GenerationSpec.from_dict(cfg)
    assert "\n" not in str(info.value)


def test_missing_model_path_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("KVCERT_MODEL_DIR", raising=False)
    with pytest.raises(FileNotFoundError, match="model.path: .*no-such-model does not exist") as info:
        resolve_model_path(str(tmp_path / "no-such-model"))
    # an explicit path is the user's own: neither the shipped configs' variable nor the Hub syntax is named
    assert "\n" not in str(info.value) and "KVCERT_MODEL_DIR" not in str(info.value) and "Hub" not in str(info.value)
    # a path the shipped configs built from the variable names it, and a bare owner/name the Hub syntax
    monkeypatch.setenv("KVCERT_MODEL_DIR", str(tmp_path / "models"))
    with pytest.raises(FileNotFoundError, match=r"KVCERT_MODEL_DIR \(the folder holding one folder per model; now "):
        resolve_model_path(str(tmp_path / "models" / "qwen2.5-7b-instruct"))
    with pytest.raises(FileNotFoundError, match="a Hub id is written hf:Qwen/Qwen2.5-7B-Instruct"):
        resolve_model_path("Qwen/Qwen2.5-7B-Instruct")
    monkeypatch.delenv("KVCERT_MODEL_DIR")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model_path(str(tmp_path / "empty"))
    # the shipped paper configs' default: a relative local path, never taken for a Hub id
    with pytest.raises(FileNotFoundError, match="models/qwen2.5-7b-instruct does not exist"):
        resolve_model_path("models/qwen2.5-7b-instruct")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert resolve_model_path("hf:Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE is set"):
        resolve_model_path("hf:Qwen/Qwen2.5-7B-Instruct")
    with pytest.raises(FileNotFoundError, match="written hf:owner/name"):
        resolve_model_path("hf:not-an-id")


def test_runner_resumes_without_loss_or_duplicates(tmp_path, loaded, records):
    manifest = tmp_path / "records.jsonl"
    write_jsonl(records, manifest)
    out = tmp_path / "shard.jsonl"
    cfg = job(condition="aware")
    reference = run_job(cfg, manifest, tmp_path / "reference.jsonl", model_and_tokenizer=loaded, progress=False)
    ref_records = read_records(reference)
    # simulate a kill in the middle of the second record's line
    partial = out.with_name(out.name + ".partial")
    first_line = json.dumps(ref_records[0], sort_keys=True) + "\n"
    partial.write_text(first_line + json.dumps(ref_records[1], sort_keys=True)[:50])
    final = run_job(cfg, manifest, out, model_and_tokenizer=loaded, progress=False)
    got = read_records(final)
    assert [r["example_id"] for r in got] == [r.id for r in records]
    assert got[0] == ref_records[0]  # the finished record was kept, not recomputed
    strip = lambda r: {k: v for k, v in r.items() if not k.endswith("seconds") and k != "started_utc"}
    assert [strip(r) for r in got] == [strip(r) for r in ref_records]
    assert not partial.exists()
    # a rerun of a finished shard does nothing
    assert run_job(cfg, manifest, out, model_and_tokenizer=loaded, progress=False) == final
    assert read_records(final) == got


def test_corrupt_shards_are_named_with_line(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"example_id": "a"}\n{not json}\n{"example_id": "c"}\n')
    with pytest.raises(CorruptShardError, match=r"s.jsonl:2: line does not parse"):
        read_records(path)
    path.write_text('{"example_id": "a"}\n{"example_id": "b"')
    with pytest.raises(CorruptShardError, match=r"s.jsonl:2: truncated line"):
        read_records(path)
    writer = ShardWriter(tmp_path / "t.jsonl")
    a = {"example_id": "a", "condition": "aware", "method": "m", "budget": 0.25, "seed": 0}
    b = dict(a, example_id="b")
    writer.partial.write_text(json.dumps(a) + "\n" + json.dumps(b)[:20])
    writer.open()
    assert writer.recovered_tail and writer.is_done(record_key(a)) and not writer.is_done(record_key(b))
    writer.write(b)
    with pytest.raises(ValueError, match="already written"):
        writer.write(b)
    done = read_records(writer.finalize([record_key(a), record_key(b)]))
    assert [r["example_id"] for r in done] == ["a", "b"]


def test_missing_records_file_and_field(tmp_path, loaded):
    with pytest.raises(FileNotFoundError, match="records"):
        run_job(job(), tmp_path / "none.jsonl", tmp_path / "o.jsonl", model_and_tokenizer=loaded)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "task": "needle", "context": "c", "answers": ["1"], "metadata": {}, "length": 3}) + "\n")
    with pytest.raises(ValueError, match="question"):
        run_job(job(), bad, tmp_path / "o.jsonl", model_and_tokenizer=loaded)
    assert not (tmp_path / "o.jsonl.partial").exists() or (tmp_path / "o.jsonl.partial").read_text() == ""


def test_records_are_scored_with_their_metadata():
    from kvcert.tasks import score_record
    from kvcert.tasks.records import TaskRecord

    lb = TaskRecord(id="x", task="longbench_hotpotqa", context="c", question="q", answers=["The Cat sat"],
                    metadata={"dataset": "hotpotqa", "all_classes": None, "target_tokens": 10}, length=5)
    assert score_record(lb, "cat sat down") == pytest.approx(0.8)
    needle = TaskRecord(id="y", task="needle", context="c", question="q", answers=["123", "456"],
                        metadata={"target_tokens": 10}, length=5)
    assert score_record(needle, "123 and 456") == 1.0 and score_record(needle, "123") == 0.5


def test_two_writers_on_one_shard_are_refused(tmp_path):
    first = ShardWriter(tmp_path / "s.jsonl").open()
    with pytest.raises(RuntimeError, match="another process is writing this shard"):
        ShardWriter(tmp_path / "s.jsonl").open()
    first.close()
    ShardWriter(tmp_path / "s.jsonl").open().close()  # free again once the first writer is done


def test_compression_ratio_is_kvpress_fraction_removed():
    """Wherever a budget (fraction kept) is taken, kvpress's compression_ratio (fraction
    removed) is accepted instead — one of the two."""
    from kvcert import EvictionPress

    cfg = job()
    del cfg["budget"]
    assert GenerationSpec.from_dict({**cfg, "compression_ratio": 0.75}).budget == pytest.approx(0.25)
    with pytest.raises(ValueError, match="not both"):
        GenerationSpec.from_dict({**cfg, "budget": 0.25, "compression_ratio": 0.75})
    with pytest.raises(ValueError, match=r"compression_ratio: .*\[0, 1\)"):
        GenerationSpec.from_dict({**cfg, "compression_ratio": 1.0})
    assert EvictionPress(compression_ratio=0.875).budget == pytest.approx(0.125)
    assert EvictionPress().budget == 0.25 and EvictionPress(budget=64).budget == 64
    with pytest.raises(ValueError, match="not both"):
        EvictionPress(budget=0.5, compression_ratio=0.5)


def test_the_budget_is_checked_once_where_it_enters():
    """generation_budget is the one conversion from compression_ratio and the one range check of a
    generation's budget: a spec, kvcert run's budget= / compression_ratio= and generate_answer all go through
    it, with the same message."""
    from kvcert.generation.spec import generation_budget
    from kvcert.commands.oneoff import budget_of

    assert generation_budget(0.25) == 0.25 and generation_budget(compression_ratio=0.75) == pytest.approx(0.25)
    assert generation_budget(default=0.5) == 0.5 and generation_budget(1) == 1  # as given: a spec's hash keeps it
    for bad in (0.0, 1.5, -0.1, True, "0.5", None):
        with pytest.raises(ValueError, match=r"budget: must be a fraction in \(0, 1\]"):
            generation_budget(bad)
    with pytest.raises(ValueError, match=r"budget: must be a fraction in \(0, 1\], got 1.5"):
        GenerationSpec.from_dict({**job(), "budget": 1.5})
    with pytest.raises(ValueError, match=r"budget: must be a fraction in \(0, 1\], got 1.5"):
        budget_of({"budget": "1.5"}, "snapkv-poisson")
    assert budget_of({"compression_ratio": "0.75"}, "snapkv-poisson") == pytest.approx(0.25)
    assert budget_of({"budget": "0.5"}, "full") == 1.0
    with pytest.raises(ValueError, match="not both"):
        budget_of({"budget": "0.5", "compression_ratio": "0.5"}, "full")


def test_a_generation_has_one_key(tmp_path, loaded, records):
    """GenerationKey is a generation's one identity: the key the runner plans from a spec and a task record
    is the key of the record written (GenerationKey.of, also the loader's), the shard writer's key, and equal to
    the plain tuple of its values; run_specs takes GenerationSpecs, not mappings."""
    from kvcert.generation.record import GenerationKey
    from kvcert.generation.runner import run_specs
    from kvcert.generation.shards import record_key

    specs = [GenerationSpec.from_dict(job("full")), GenerationSpec.from_dict(job())]
    out = run_specs(specs, records[:1], tmp_path / "s.jsonl", model_and_tokenizer=loaded, progress=False)
    written = read_records(out)
    planned = [GenerationKey.planned(s, records[0]) for s in specs]
    assert [GenerationKey.of(r) for r in written] == [record_key(r) for r in written] == planned
    assert tuple(planned[1]) == planned[1] and hash(tuple(planned[1])) == hash(planned[1])
    assert planned[1].budget == 0.25 and isinstance(planned[1].seed, int)
    assert str(planned[1]) == f"tiny/needle/{records[0].metadata['target_tokens']}/{records[0].id}/aware/snapkv-poisson/0.25/7"
    with pytest.raises(TypeError, match="GenerationSpec"):
        run_specs([job()], records[:1], tmp_path / "t.jsonl", model_and_tokenizer=loaded, progress=False)


def test_resume_never_mixes_preregistrations(tmp_path, loaded, records, capsys):
    """A partial shard left from before an amendment is set aside, not resumed: the shard
    ends with records of the current pre-registration only, and a line says so."""
    manifest = tmp_path / "records.jsonl"
    write_jsonl(records, manifest)
    out = tmp_path / "shard.jsonl"
    old = run_job(job(condition="aware"), manifest, tmp_path / "old.jsonl", prereg_hash="a" * 64,
                  model_and_tokenizer=loaded, progress=False)
    partial = out.with_name(out.name + ".partial")
    partial.write_text(old.read_text().splitlines(keepends=True)[0])  # one record from the old freeze
    final = run_job(job(condition="aware"), manifest, out, prereg_hash="b" * 64, model_and_tokenizer=loaded,
                    progress=False)
    assert {r["prereg_hash"] for r in read_records(final)} == {"b" * 64}
    assert len(read_records(final)) == len(records)
    assert partial.with_name(partial.name + ".stale").exists()
    assert f"made under pre-registration {'a' * 64}, not {'b' * 64}" in capsys.readouterr().err
    from kvcert.generation.shards import check_seal

    check_seal(final, len(records), len(records))  # sealed when finished


def test_short_prompt_without_a_random_tail_is_uncertified_not_exact(loaded, tokenizer):
    """100 prompt tokens at a 25 % budget: sinks + window (36) exceed the budget, the rest is
    evicted with no random tail. The record says "uncertified", and scoring gives it no
    signal (NaN), where it used to read as exact (0)."""
    import math

    from kvcert.analysis.load import ScoringPlan, flatten
    from kvcert.config.paths import prereg_dir
    from kvcert.config.compose import analysis_plan
    from kvcert.tasks import TaskRecord

    record = TaskRecord(id="short-0", task="needle", context=" ".join(["The grass is green."] * 18),
                        question="What is the special magic number for pocket?", answers=["1234567"],
                        metadata={"target_tokens": 100})
    out = generate([engine(loaded, condition="aware")], record)[0]
    assert out["prompt_tokens"] <= 120 and out["certificate"] is None
    assert out["certificate_status"] == "uncertified" and min(out["kept_fraction"]) < 1.0
    plan = ScoringPlan.from_plan(analysis_plan(prereg_dir()))
    row = flatten({**out, "kvcert_version": "x"}, plan)
    assert math.isnan(row["cert_signal"]) and row["uncertified"]
    long = generate([engine(loaded, condition="aware")], generate_task("needle", tokenizer, 1, 300, seed=5)[0])[0]
    assert long["certificate_status"] == "certified"
    assert generate([engine(loaded, condition="aware", sampler="topk")], record)[0]["certificate_status"] is None


def test_generate_answer_is_one_call(loaded):
    """kvcert.generate_answer: context + question → the engine's record (answer, tokens,
    certificates, kept fraction), for a compressed and a full cache; compression_ratio is
    kvpress's fraction removed."""
    from kvcert import generate_answer

    model, tok = loaded
    context = " ".join(["The grass is green. The sky is blue."] * 30) + " One of the special magic numbers for pocket is: 1234567."
    question = "What is the special magic number for pocket?"
    out = generate_answer(model, tok, context, question, method="snapkv-poisson", compression_ratio=0.75,
                          max_new_tokens=4)
    assert out["condition"] == "aware" and out["budget"] == pytest.approx(0.25) and out["method"] == "snapkv-poisson"
    assert isinstance(out["answer"], str) and 1 <= len(out["tokens"]) <= 4
    assert out["certificate_status"] == "certified" and out["certificate"]["steps"]["mean"]
    assert 0.2 < sum(out["kept_fraction"]) / len(out["kept_fraction"]) < 0.35 and "score" not in out
    full = generate_answer(model, tok, context, question, condition="full", max_new_tokens=4)
    assert full["certificate"] is None and full["condition"] == "full"
    assert full["tokens"] == generate([Engine(model, tok, GenerationSpec.from_dict(job(condition="full", max_new_tokens=4)))],
                                      _record(context, question))[0]["tokens"]
    with pytest.raises(ValueError, match="method"):
        generate_answer(model, tok, context, question, method="snapkv")
    # every shipped method name works, and the grammar's names without a file
    for name in ("adakv-poisson", "pyramidkv-topk", "snapkv-kvpress", "tova-priority"):
        out = generate_answer(model, tok, context, question, method=name, budget=0.25, max_new_tokens=2)
        assert out["method"] == name and out["allocation"] == {"adakv": "adakv", "pyramidkv": "pyramid"}.get(
            name.split("-")[0], "uniform")


def _record(context, question):
    from kvcert.tasks import TaskRecord

    return TaskRecord(id="x", task="unscored", context=context, question=question, answers=["-"],
                      metadata={"target_tokens": 0})


def test_the_shipped_configs_build_paths_from_the_variables_the_errors_name():
    """kvcert.config.sources names a variable only for a path built from it: its defaults are the configs' (the
    files' and the task configs derived from the benchmark tables, kvcert.config.task_table)."""
    from kvcert.config.sources import CONFIG_DEFAULTS, ENV_VARS
    from kvcert.config.task_table import TASK_CONFIGS

    configs = Path(__file__).resolve().parents[1] / "configs"
    expected = {"model.path": ("model", "path"), "longbench": ("task", "source"), "locomo": ("task", "source")}
    for what, (group, key) in expected.items():
        variable = ENV_VARS[what][0]
        written = [line.split(":", 1)[1].strip() for p in (configs / group).glob("*.yaml")
                   for line in p.read_text().splitlines() if line.startswith(f"{key}:") and variable in line]
        written += [cfg[key] for cfg in TASK_CONFIGS.values() if group == "task" and variable in str(cfg.get(key))]
        assert written and all(w.startswith(f"${{oc.env:{variable},{CONFIG_DEFAULTS[what]}}}") for w in written), what
