"""The one generation path (:func:`kvcert.generation.forked.generate`): one prefill per example, every
variant forked from it and decoded together; a run that shares no prefill decoded alone in the same loop.

Every record must be what the spec alone writes (the oracle, ``tests/batch1_oracle.py``: its own cache,
its own greedy loop), on every condition: the same greedy tokens and scores, the same kept fractions and
byte counts, certificates within 1e-4 relative, each value, a step's mean V̂ included (fp32; batched
matmuls round differently in the last bit, and V̂'s one-pass sums are combined in float64, or recomputed
directly where they cancel) — and, for a run decoded alone (chunked streaming; a run by itself), every
field equal. A shard killed (SIGKILL) in the middle of an example resumes to the shard an uninterrupted
run writes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from kvcert.method.attention import hajek_attention
from kvcert.method.cache import CompactLayer
from kvcert.method.batched import BatchedLayer
from kvcert.method.fork import width_buckets
from kvcert.generation.engine import Engine
from kvcert.generation.forked import generate
from kvcert.generation.runner import run_specs
from kvcert.generation.shards import read_records
from kvcert.generation.spec import GenerationSpec
from kvcert.method.models import ModelSpec, load_model
from kvcert.tasks import generate as generate_task
from kvcert.tasks.records import write_jsonl

TIMING = ("prefill_seconds", "decode_seconds", "started_utc")
RTOL = 1e-4
#: fields whose values are differences of O(1) numbers, so near 0 their fp32 rounding is absolute, not relative:
#: a log-probability log p = z - logsumexp(z) carries about ε_fp32 · |z| (logits up to ~80: 1e-5), and the
#: margin between the top two probabilities about ε_fp32 · p (1e-6)
ABSOLUTE = {"token_logprobs": 1e-5, "top2_margin_steps": 1e-6}


from batch1_oracle import run_alone  # noqa: E402 - the test oracle: one spec, its own cache and loop
from test_generation import model_dir, tokenizer  # noqa: E402,F401 - the random-init Llama and its tokenizer


def job(condition="aware", sampler="poisson", budget=0.25, model=None, max_new_tokens=6):
    method = {"name": "full"} if condition == "full" else {
        "name": f"snapkv-{sampler}", "scorer": "snapkv", "sampler": sampler, "allocation": "uniform",
    }
    return {
        "model": model or {"name": "tiny", "path": "unused"},
        "method": method, "condition": condition, "budget": 1.0 if condition == "full" else budget,
        "seed": 7, "max_new_tokens": max_new_tokens,
    }


def grid_jobs(**kw) -> list[dict]:
    """The main grid's shape: the full cache and {aware, streaming} × {top-k, Poisson} × 3 budgets."""
    return [job("full", **kw)] + [job(c, s, b, **kw) for c in ("aware", "streaming") for s in ("topk", "poisson")
                                  for b in (0.125, 0.25, 0.5)]


def specs_of(configs: list[dict]) -> list[GenerationSpec]:
    """What run_specs takes: each config as a GenerationSpec (validated where it enters)."""
    return [GenerationSpec.from_dict(c) for c in configs]


def mismatches(a, b, path="") -> list[str]:
    """Where two records differ: exact for everything but floats, which agree within RTOL."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [m for k in a for m in mismatches(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        return [m for x, y in zip(a, b) for m in mismatches(x, y, path)]
    if isinstance(a, float) and isinstance(b, float):
        floor = next((t for field, t in ABSOLUTE.items() if path.endswith(field)), 0.0)
        if a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= max(floor, RTOL * max(abs(a), abs(b))):
            return []
        return [f"{path}: {a} != {b}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def strip(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMING}


def assert_same(reference: list[dict], forked: list[dict]) -> None:
    assert len(reference) == len(forked)
    for a, b in zip(reference, forked):
        assert a["tokens"] == b["tokens"], (a["condition"], a["method"], a["budget"])
        problems = mismatches(strip(a), strip(b), f"{a['condition']}/{a['method']}/{a['budget']}")
        assert not problems, problems[:5]
        for key in ("kept_fraction", "kv_bytes_peak", "kv_bytes_final", "sketch_bytes", "score", "certificate_status"):
            assert a[key] == b[key], key


def test_forked_records_equal_batch1_on_every_condition(model_dir, tokenizer):
    model, tok = load_model(ModelSpec(name="tiny", path=str(model_dir)))
    records = generate_task("needle", tok, n_examples=2, target_tokens=300, seed=123)
    engines = [Engine(model, tok, GenerationSpec.from_dict(j), {"config_hash": "x"}) for j in grid_jobs()]
    for record in records:
        reference = [run_alone(e, record) for e in engines]
        forked = generate(engines, record)
        assert_same(reference, forked)
        assert {r["certificate_status"] for r in forked} >= {None, "certified"}
        assert forked[0]["prefill_seconds"] > 0 and forked[0]["decode_seconds"] > 0


def test_a_run_alone_is_the_one_row_case_field_for_field(model_dir, tokenizer):
    """Runs that share no prefill — chunked streaming (the multi-turn cell), any run by itself — go through
    the same path as a batch of one row on their own cache: every field but the timings equals the oracle's,
    with the forked runs of the same call beside them."""
    model, tok = load_model(ModelSpec(name="tiny", path=str(model_dir)))
    records = generate_task("needle", tok, n_examples=2, target_tokens=300, seed=321)
    chunked = [dict(job("streaming", s, b), chunk_tokens=64) for s in ("topk", "poisson") for b in (0.125, 0.5)]
    engines = [Engine(model, tok, GenerationSpec.from_dict(j), {}) for j in [job("full")] + chunked + grid_jobs()[1:3]]
    for record in records:
        together = generate(engines, record)
        for e, got in zip(engines, together):
            if e.spec.chunk_tokens is not None:  # decoded alone beside the forked rows
                assert strip(got) == strip(run_alone(e, record)), (e.spec.method.name, e.spec.budget)
        for e in engines[:3]:  # each by itself: the one-row case
            assert strip(generate([e], record)[0]) == strip(run_alone(e, record))


def test_forked_rows_finish_apart_on_the_embedded_model():
    """The shipped model answers in a few tokens and stops (EOS) at different steps per variant:
    finished rows leave the batch, the others' records are unchanged."""
    model, tok = load_model(ModelSpec(name="embedded", path="embedded"))
    # the records fill their 512 tokens (no answer reserve): these two finish at different steps
    records = generate_task("lookalike", tok, n_examples=2, target_tokens=512, seed=5000, answer_tokens=0)
    spec = {"name": "embedded", "path": "embedded"}
    engines = [Engine(model, tok, GenerationSpec.from_dict(j), {}) for j in grid_jobs(model=spec, max_new_tokens=24)]
    lengths = set()
    for record in records:
        reference = [run_alone(e, record) for e in engines]
        assert_same(reference, generate(engines, record))
        lengths |= {len(r["tokens"]) for r in reference}
    assert len(lengths) > 1  # rows did finish at different steps


def test_stacked_rows_attend_as_alone_and_survive_dropping_a_row():
    torch.manual_seed(1)
    short = CompactLayer(reserve=4)
    short.update(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8))
    long = CompactLayer(reserve=4)
    long.update(torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8))
    short.seen = long.seen = 9  # the same prompt, fewer tokens kept
    stacked = BatchedLayer.stack([long, short])
    assert stacked.length == 9 and stacked.has_padding and not stacked.has_tail
    assert stacked.row_nbytes(1) == short.nbytes() and stacked.row_nbytes(0) == long.nbytes()
    q = torch.randn(2, 4, 1, 8)
    out = hajek_attention(q, stacked.keys, stacked.values, stacked.log_pi, 0.3).output
    alone = hajek_attention(q[1:], short.keys, short.values, None, 0.3).output
    torch.testing.assert_close(out[1:], alone)
    kept = stacked.take([1])
    assert kept.length == 5 and not kept.has_padding  # the long row's width went with it
    torch.testing.assert_close(hajek_attention(q[1:], kept.keys, kept.values, kept.log_pi, 0.3).output, alone)


def test_width_buckets_pay_an_extra_forward_only_for_padding_it_saves():
    assert width_buckets([100, 90, 120], forward_slots=1000) == [[0, 1, 2]]
    assert width_buckets([8000, 1000, 1100, 900], forward_slots=1000) == [[1, 2, 3], [0]]


KILL_AFTER = 3  # records: the kill lands inside the first example (13 runs each)

_KILLER = textwrap.dedent("""
    import os, signal, sys, json
    import kvcert.generation.shards as shards
    from kvcert.generation.runner import run_specs, load_records
    from kvcert.generation.spec import GenerationSpec
    write, count = shards.ShardWriter.write, [0]
    def killing_write(self, record):
        count[0] += 1
        if count[0] > {kill}:
            self._fh.write(json.dumps(record)[:40])  # half a line, as a kill in the middle of a write leaves
            self._fh.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        write(self, record)
    shards.ShardWriter.write = killing_write
    run_specs([GenerationSpec.from_dict(c) for c in json.loads(sys.argv[1])], load_records(sys.argv[2]), sys.argv[3],
              progress=False)
""")


@pytest.mark.pipeline
def test_sigkill_mid_example_resumes_to_the_uninterrupted_shard(model_dir, tokenizer, tmp_path):
    records = generate_task("needle", tokenizer, n_examples=2, target_tokens=200, seed=9)
    manifest = tmp_path / "records.jsonl"
    write_jsonl(records, manifest)
    model_spec = {"name": "tiny", "path": str(model_dir)}
    configs = grid_jobs(model=model_spec, max_new_tokens=4)
    uninterrupted = run_specs(specs_of(configs), records, tmp_path / "ref.jsonl", progress=False)

    out = tmp_path / "killed.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", _KILLER.format(kill=KILL_AFTER), json.dumps(configs), str(manifest),
                           str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stderr[-2000:]
    partial = out.with_name(out.name + ".partial")
    assert not out.exists() and len(partial.read_text().split("\n")) == KILL_AFTER + 1  # 3 lines and a cut one
    resumed = run_specs(specs_of(configs), records, out, progress=False)
    ref, got = read_records(uninterrupted), read_records(resumed)
    assert [r["example_id"] + r["condition"] + r["method"] for r in got] == \
        [r["example_id"] + r["condition"] + r["method"] for r in ref]
    assert [strip(r) for r in got] == [strip(r) for r in ref]  # the recomputed example: the same records, bit for bit


def test_shard_forked_and_batch1_agree(model_dir, tokenizer, tmp_path):
    records = generate_task("needle", tokenizer, n_examples=1, target_tokens=200, seed=11)
    configs = grid_jobs(model={"name": "tiny", "path": str(model_dir)}, max_new_tokens=3)
    configs.append({**job("streaming", "poisson", 0.25, model={"name": "tiny", "path": str(model_dir)},
                          max_new_tokens=3), "chunk_tokens": 64, "seed": 8})  # chunked: the batch-1 path
    forked = read_records(run_specs(specs_of(configs), records, tmp_path / "forked.jsonl", progress=False))
    batch1 = read_records(run_specs(specs_of(configs), records, tmp_path / "batch1.jsonl", progress=False, forked=False))
    assert_same(batch1, forked)


def test_plan_counts_forkable_runs_at_the_measured_speedup():
    from kvcert.generation.plan import Run, Shard, gpu_hours, shard_seconds

    main = Shard("main", "m", "t", 512, 0, 0, 10, (Run("full", "full", 1.0),) + tuple(
        Run("aware", "x", b) for b in (0.25, 0.5)))
    chunked = Shard("multiturn", "m", "t", 512, 0, 0, 10, (Run("full", "full", 1.0), Run("streaming", "x", 0.1,
                                                                                           chunk_tokens=64)))
    per = {"m": {512: 2.0}}
    assert shard_seconds(main, per) == 2.0 * 10 * 3  # nothing measured: batch-1 cost
    assert shard_seconds(main, per, {"m": {512: 4.0}}) == 2.0 * 10 * 3 / 4.0
    assert shard_seconds(chunked, per, {"m": {"512": 4.0}}) == 2.0 * 10 * (1 + 1)  # a lone forkable run shares nothing
    plan = type("P", (), {"shards": [main, chunked]})()
    assert gpu_hours(plan, per, {"m": {512: 4.0}}) == (15.0 + 40.0) / 3600.0
