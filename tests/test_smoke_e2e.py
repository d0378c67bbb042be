"""End to end: the smoke DAG on a reduced pre-registration, to the claim report.

The grid is the smoke grid made small (needle + multi-key at 512 tokens, a multi-turn
cell, the replay), frozen in a temporary folder; the model is the shipped embedded
model. The test checks the outputs' schema, that every claim got a verdict, that a
second run does nothing, and that deleting one shard redoes only that shard and what
depends on it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvcert.config.prereg import freeze

REPO = Path(__file__).resolve().parents[1]
GRID = """\
experiment: smoke
models: [embedded]
lengths: [512]
tasks:
  needle:   {examples: 4, seed: 1000}
  multikey: {examples: 4, seed: 2000}
conditions: [aware, streaming]
budgets: [0.125, 0.5]
methods: [snapkv-topk, snapkv-poisson]
seeds: [0]
multiturn:
  task: multiturn
  lengths: [512]
  examples: 4
  seed: 3000
  condition: streaming
  chunk_tokens: 64
  budgets: [0.1]
  methods: [snapkv-topk, snapkv-poisson]
replay:
  task: needle
  lengths: [512]
  examples: 1
  seed: 4000
  method: snapkv-poisson
generations_per_shard: 40
"""
CLAIM_FIELDS = {"id", "statement", "verdict", "statistic", "value", "ci", "threshold", "tests", "paper"}

pytestmark = [pytest.mark.pipeline, pytest.mark.slow]


def snakemake(workdir: Path, *args: str, timeout: int = 1200):
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--cores", "2",
           "--config", "prereg=preregistration", *args]
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    from kvcert.embedded import embedded_model_path

    if not (embedded_model_path() / "config.json").exists():
        pytest.fail("the shipped embedded model is missing (kvcert/embedded/model); run `kvcert train-model --install`")
    work = tmp_path_factory.mktemp("smoke")
    prereg = work / "preregistration"
    (prereg / "grids").mkdir(parents=True)
    (prereg / "claims.yaml").write_text((REPO / "preregistration" / "claims.yaml").read_text())
    (prereg / "grids" / "smoke.yaml").write_text(GRID)
    freeze(prereg)
    run = snakemake(work)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return work


def test_outputs_and_every_claim_has_a_verdict(finished):
    out = finished / "results" / "smoke"
    for name in ("report.md", "report.html", "claims.json", "summary.json", "scores.parquet"):
        assert (out / name).stat().st_size > 0, name
    claims = json.loads((out / "claims.json").read_text())["claims"]
    assert [c["id"] for c in claims] == [f"C{i}" for i in range(1, 9)]  # the paper's seven and this project's C8
    for claim in claims:
        assert CLAIM_FIELDS <= set(claim), claim["id"]
        assert claim["verdict"] in {"holds", "killed", "inconclusive", "uninformative"}
        assert claim["paper"]["verdict"] in {"holds", "killed"} or claim["beyond_paper"]
        assert {"placebo", "seed_stability"} <= set(claim), claim["id"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["generations"]["grid"] == 2 * 4 * 9 + 4 * 3  # main: 2 tasks x 4 examples x 9 runs; multiturn 4 x 3
    accuracy = summary["full_cache_accuracy"]
    assert set(accuracy) == {"needle", "multikey", "multiturn"}
    assert all(0.0 <= a <= 1.0 for per_len in accuracy.values() for a in per_len.values())
    assert summary["wall_time_seconds"] > 0
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and not re.search(r'<img[^>]+src="(?!data:)', html)
    assert "C1" in (out / "report.md").read_text().split("## Figures")[0]


def test_the_replay_reads_its_own_registered_examples(finished):
    """The grid registers the replay as 1 example of seed 4000; the main grid's needle cell (4 examples, seed 1000)
    at the same length must not be what it replays."""
    import pandas as pd

    from kvcert.tasks.records import read_jsonl

    out = finished / "results" / "smoke"
    replayed = set(pd.read_parquet(out / "replay/embedded/needle-512.parquet", columns=["example_id"])["example_id"])
    own = [r.id for r in read_jsonl(out / "manifests/embedded/replay/needle/512.jsonl")]
    main = [r.id for r in read_jsonl(out / "manifests/embedded/needle/512.jsonl")]
    assert len(own) == 1 and replayed == set(own) and not set(own) & set(main)


def test_second_run_does_nothing_and_a_deleted_shard_is_redone_alone(finished):
    again = snakemake(finished, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr
    shard = finished / "results/smoke/generations/embedded/main/needle/512/shard000.jsonl"
    before = shard.read_text()
    shard.unlink()
    plan = snakemake(finished, "-n")
    stats = dict(re.findall(r"^(\w+)\s+(\d+)$", (plan.stdout + plan.stderr).split("Job stats:")[1], re.M))
    assert stats == {"generate": "1", "score": "1", "claims": "1", "report": "1", "all": "1", "total": "5"}
    redo = snakemake(finished)
    assert redo.returncode == 0, redo.stderr[-2000:]
    strip = lambda text: [{k: v for k, v in json.loads(line).items() if k not in ("prefill_seconds", "decode_seconds", "started_utc")}
                          for line in text.splitlines()]
    assert strip(shard.read_text()) == strip(before)
