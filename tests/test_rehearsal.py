"""The rehearsal: the paper profile's code path end to end, on stand-ins.

The README's steps, as a cluster user follows them: ``kvcert make-rehearsal --out DIR``
(tiny Qwen2, Llama and Mistral checkpoints with BPE tokenizers and chat templates,
LongBench files as jsonl and Parquet, a LoCoMo file), the three exports of its
``env.sh``, then ``snakemake --cores all --config experiment=rehearsal`` from a fresh
working folder. Every rule of the paper profile runs, on every architecture: manifests,
the main, multi-turn and LoCoMo cells, the replay on longbench_hotpotqa, score, claims,
report.

The run uses the registered rehearsal grid made smaller (:data:`REDUCTION`: one length, and
of its five main-cell tasks only the LongBench task the replay reads — the synthetic needle is every
smoke run's task — frozen in a temporary pre-registration beside the project's claims.yaml): the same
rules and the same three architectures in 29 jobs instead of 89, each job's start (torch and transformers imported, a model loaded) being most of the
rehearsal's time. The registered grid itself is checked by a dry run against its plan
(:func:`test_the_registered_grid_plans_every_job`).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import yaml

from kvcert.generation.plan import build_plan, load_grid
from kvcert.config.prereg import freeze
from kvcert.tasks.records import read_jsonl

from longbench_official import OFFICIAL_PROMPT_SHA256, official_truncation

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = "rehearsal"
ARCHITECTURES = {"Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"}
JUNCTION_SLACK = 2  # re-encoding the joined halves may differ by a token or two at the cut
#: the registered grid made smaller for the run (every rule, every architecture; fewer cells)
REDUCTION = {"lengths": [1536], "tasks": ["longbench_hotpotqa"], "replay_lengths": [1536]}

pytestmark = [pytest.mark.pipeline, pytest.mark.slow]


def reduced_grid() -> dict:
    """The registered rehearsal grid with :data:`REDUCTION` applied."""
    grid = yaml.safe_load((REPO / "preregistration" / "grids" / "rehearsal.yaml").read_text())
    grid["lengths"] = REDUCTION["lengths"]
    grid["tasks"] = {task: grid["tasks"][task] for task in REDUCTION["tasks"]}
    grid["replay"]["lengths"] = REDUCTION["replay_lengths"]
    return grid


@pytest.fixture(scope="module")
def prereg(tmp_path_factory):
    """A frozen pre-registration: the project's claims.yaml and the reduced rehearsal grid."""
    folder = tmp_path_factory.mktemp("rehearsal-prereg")
    (folder / "grids").mkdir()
    (folder / "claims.yaml").write_text((REPO / "preregistration" / "claims.yaml").read_text())
    (folder / "grids" / "rehearsal.yaml").write_text(yaml.safe_dump(reduced_grid(), sort_keys=False))
    freeze(folder, reason="")
    return folder


@pytest.fixture(scope="module")
def plan(prereg):
    return build_plan(EXPERIMENT, load_grid(prereg, "grids/rehearsal.yaml"))


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory, prereg):
    """The stand-ins, the environment they need, and the finished run's results folder."""
    root = tmp_path_factory.mktemp("rehearsal")
    made = subprocess.run([sys.executable, "-m", "kvcert.cli", "make-rehearsal", "--out", str(root / "sources")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stdout + made.stderr
    env = dict(os.environ)
    for line in (root / "sources" / "env.sh").read_text().splitlines():
        key, value = line.removeprefix("export ").split("=", 1)
        env[key] = value.strip("'")
    env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    work = root / "work"
    work.mkdir()
    t0 = time.time()
    run = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--cores", "all",
                          "--config", f"experiment={EXPERIMENT}", f"prereg={prereg}"],
                         cwd=work, capture_output=True, text=True, timeout=1500, env=env)
    print(f"rehearsal: snakemake took {time.time() - t0:.0f} s")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return {"sources": root / "sources", "out": work / "results" / EXPERIMENT, "env": env}


def test_every_rule_ran_and_every_shard_holds_its_planned_generations(rehearsal, plan):
    out = rehearsal["out"]
    for manifest in plan.manifests:
        assert len(read_jsonl(out / manifest.path)) == manifest.examples, manifest.path
    per_cell: dict[str, int] = {}
    for shard in plan.shards:
        lines = [json.loads(line) for line in (out / shard.path).read_text().splitlines()]
        assert len(lines) == shard.generations, shard.path
        keys = {(r["example_id"], r["condition"], r["method"], r["budget"]) for r in lines}
        assert len(keys) == shard.generations
        per_cell[shard.cell] = per_cell.get(shard.cell, 0) + len(lines)
    assert per_cell == {"main": 78, "multiturn": 18, "locomo": 75}  # main: 3 models x 1 task x 2 examples x 13 runs
    assert sum(per_cell.values()) == plan.generations
    for replay in plan.replays:
        assert replay.task == "longbench_hotpotqa"
        stem = out / "replay" / replay.model / f"{replay.task}-{replay.length}"
        assert Path(f"{stem}.parquet").stat().st_size > 0
        assert json.loads(Path(f"{stem}.impossibility.json").read_text())
    assert {r.length for r in plan.replays} == {1536}


def test_records_come_from_every_architecture(rehearsal, plan):
    out, sources = rehearsal["out"], rehearsal["sources"]
    seen = set()
    for model in plan.grid["models"]:
        config = json.loads((sources / "models" / model / "config.json").read_text())
        assert config["dtype"] == "bfloat16"
        seen.update(config["architectures"])
        shards = [s for s in plan.shards if s.model == model]
        first = json.loads((out / shards[0].path).read_text().splitlines()[0])
        assert first["model"] == model
    assert seen == ARCHITECTURES


def test_every_prompt_is_within_its_length(rehearsal, plan):
    from transformers import AutoTokenizer

    out, sources = rehearsal["out"], rehearsal["sources"]
    for manifest in plan.manifests:
        tokenizer = AutoTokenizer.from_pretrained(sources / "models" / manifest.model)
        records = {r.id: r for r in read_jsonl(out / manifest.path)}
        for record in records.values():
            if record.task.startswith("longbench_"):
                # pred.py's budget bounds the filled template; the chat template comes on top
                user = record.context + record.separator + record.question
                assert record.metadata["truncated"], record.id  # both lengths force the middle cut
                assert len(tokenizer(user).input_ids) <= manifest.length + JUNCTION_SLACK, record.id
            elif record.task == "locomo":
                assert record.metadata["target_tokens"] == record.length
            else:
                assert record.length <= manifest.length, record.id
        for shard in (s for s in plan.shards if (s.model, s.task, s.length) == (manifest.model, manifest.task, manifest.length)):
            for line in (out / shard.path).read_text().splitlines():
                generation = json.loads(line)
                assert generation["prompt_tokens"] == records[generation["example_id"]].length


def test_longbench_prompts_are_the_official_templates(rehearsal, plan):
    from transformers import AutoTokenizer

    from kvcert.tasks.longbench import DATASET2PROMPT, load_longbench

    out, sources = rehearsal["out"], rehearsal["sources"]
    checked = 0
    for manifest in plan.manifests:
        if not manifest.task.startswith("longbench_"):
            continue
        dataset = manifest.task.removeprefix("longbench_")
        template = DATASET2PROMPT[dataset]
        assert hashlib.sha256(template.encode()).hexdigest()[:16] == OFFICIAL_PROMPT_SHA256[dataset]
        tokenizer = AutoTokenizer.from_pretrained(sources / "models" / manifest.model)
        rows = {row["_id"]: row for row in load_longbench(rehearsal["env"]["LONGBENCH_DIR"], dataset)}
        for record in read_jsonl(out / manifest.path):
            expected = official_truncation(tokenizer, template.format(**rows[record.metadata["_id"]]), manifest.length)
            assert record.context + record.separator + record.question == expected, record.id
            checked += 1
    assert checked == 3 * 1 * 1 * 2  # models x lengths x tasks x examples


def test_the_report_has_a_verdict_per_claim(rehearsal):
    """The paper's seven claims and this project's C8 (the robust certificate)."""
    out = rehearsal["out"]
    claims = json.loads((out / "claims.json").read_text())["claims"]
    assert [c["id"] for c in claims] == [f"C{i}" for i in range(1, 9)]
    assert all(c["verdict"] in {"holds", "killed", "inconclusive", "uninformative"} for c in claims)  # random weights: any
    report = (out / "report.md").read_text()
    assert all(f"| C{i} |" in report for i in range(1, 9))
    # its first screen says what it is: stand-ins with random weights, verdicts that mean nothing
    assert "**A rehearsal on stand-in models with random weights: its verdicts mean nothing.**" in report[:1500]
    assert (out / "report.html").stat().st_size > 0


def test_the_registered_grid_plans_every_job(rehearsal, tmp_path):
    """The registered rehearsal grid (the README's command, the repository's freeze): Snakemake's dry run
    plans the jobs its plan counts, rule by rule, with the stand-ins' environment."""
    registered = build_plan(EXPERIMENT, load_grid(REPO / "preregistration", "grids/rehearsal.yaml"))
    assert sum(s.generations for s in registered.shards if s.cell == "main") == 780
    run = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-n",
                          "--config", f"experiment={EXPERIMENT}", f"prereg={REPO / 'preregistration'}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600, env=rehearsal["env"])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    block = run.stdout.split("Job stats:")[1]
    stats = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", block, re.M)}
    assert stats.pop("total") == registered.job_count
    assert stats == registered.jobs_per_rule()
