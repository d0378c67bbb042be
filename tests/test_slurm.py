"""The cluster path, on a real (one-node, local) Slurm: submission, accounting, retries.

``scripts/local_slurm.sh`` installs (apt-get, when missing) and starts munge, MariaDB,
slurmdbd, slurmctld and slurmd on loopback; the tests skip with one line where that is
impossible. The reduced smoke experiment of :mod:`smoke_pipeline` is submitted with
``snakemake --profile <profiles/slurm, made local>`` through
snakemake-executor-plugin-slurm (``executor: slurm``): the profile is the shipped one
with its placeholders filled (account and partitions of the local cluster, no GPU)
and the resources cut to fit one small node.

Faults are injected by a stand-in ``kvcert`` put first on PATH (no product code knows
about it): it kills one shard's first attempt after three records, or fails a shard on
every attempt, and otherwise runs the real command.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml

from smoke_pipeline import (
    GENERATE_LOG, MANIFEST, MODEL, REPO, SHARDS, VERIFIED, assert_same_records, complete_lines, reference,
    run_env, seed_workdir, snakemake,
)

pytestmark = [pytest.mark.pipeline, pytest.mark.slurm, pytest.mark.slow]

SCRIPT = REPO / "scripts" / "local_slurm.sh"
ACCOUNT, PARTITION = "kvcert", "debug"

FAULTY_KVCERT = """#!/usr/bin/env bash
# Stand-in for `kvcert` (tests/test_slurm.py), first on PATH: injects a fault into
# `kvcert shard --out ...{shard}`, runs the real kvcert for everything else.
set -u
real={real}
faults={faults}
out="" prev=""
for arg in "$@"; do [[ $prev == --out ]] && out=$arg; prev=$arg; done
if [[ ${{1:-}} == shard && $out == *{shard} ]]; then
    if [[ -e $faults/always ]]; then
        echo "injected failure: $out keeps failing" >&2
        exit 3
    fi
    if [[ ! -e $faults/failed-once ]]; then  # first attempt: the job dies after 3 records
        touch "$faults/failed-once"
        "$real" "$@" &
        pid=$!
        for _ in $(seq 1 3000); do
            [[ -e $out.partial ]] && (( $(grep -c '' "$out.partial") > 3 )) && break
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null
        wait "$pid"
        cp "$out.partial" "$faults/partial-at-failure"
        echo "injected failure: $out killed in the middle of the shard" >&2
        exit 1
    fi
fi
exec "$real" "$@"
"""


def _script(action: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), action], env=env, capture_output=True, text=True, timeout=timeout)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A running one-node cluster (its SLURM_CONF); stopped, every daemon, when the module ends."""
    env = dict(os.environ, KVCERT_SLURM_DIR=str(tmp_path_factory.mktemp("slurm") / "cluster"),
               KVCERT_SLURM_ACCOUNT=ACCOUNT, KVCERT_SLURM_PARTITION=PARTITION)
    if shutil.which("bash") is None:
        pytest.skip("no bash to run scripts/local_slurm.sh")
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root (slurmd launches the jobs; /run/slurm/conf)")
    installed = _script("install", env, timeout=1200)
    if installed.returncode != 0:
        pytest.skip(f"Slurm cannot be installed here: {_last_line(installed.stderr)}")
    try:
        started = _script("start", env)
        assert started.returncode == 0, started.stderr[-3000:]
        env["SLURM_CONF"] = started.stdout.strip().split("SLURM_CONF=", 1)[1]
        yield env
    finally:
        stopped = _script("stop", env)
        assert stopped.returncode == 0, stopped.stderr


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return reference(tmp_path_factory)


def local_profile(folder: Path) -> Path:
    """profiles/slurm with its placeholders set for the local cluster (no GPU) and small resources."""
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    assert profile["executor"] == "slurm"
    # GPUs and shard runtimes come from the Snakefile (the plan's cost model), not the profile
    assert not {"gpu", "runtime"} & set(profile["set-resources"]["generate"])
    profile["default-resources"].update(slurm_account=ACCOUNT, slurm_partition=PARTITION, mem_mb=2000, cpus_per_task=1)
    for resources in profile["set-resources"].values():
        resources.pop("gpu", None)
        resources.pop("gpu_model", None)
        resources.update(mem_mb=2000, cpus_per_task=1)
        if "slurm_partition" in resources:  # the CPU jobs' partition: the one local partition
            resources["slurm_partition"] = PARTITION
    profile["set-threads"] = {rule: 1 for rule in profile["set-threads"]}  # threads of the local reference run
    profile["slurm-init-seconds-before-status-checks"] = 2  # the plugin's default waits 40 s
    text = yaml.safe_dump(profile, sort_keys=False)
    assert "REPLACE_WITH" not in text
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(text)
    return folder


def faulty_kvcert(folder: Path, shard: str, faults: Path) -> Path:
    real = shutil.which("kvcert")
    assert real, "kvcert is not on PATH"
    folder.mkdir(parents=True)
    faults.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "kvcert"
    wrapper.write_text(FAULTY_KVCERT.format(real=real, faults=faults, shard=shard))
    wrapper.chmod(0o755)
    return folder


def sacct_jobs(run_id: str, env: dict) -> dict[str, list[tuple[str, str]]]:
    """{rule comment: [(state, account), ...] in submission order} of one Snakemake run."""
    jobs = sacct_fields(run_id, env, "JobIDRaw,State,Account")
    return {c: [(state, account) for _, state, account in sorted(v, key=lambda row: int(row[0]))]
            for c, v in jobs.items()}


def sacct_fields(run_id: str, env: dict, fields: str) -> dict[str, list[tuple[str, ...]]]:
    """{rule comment: [(field values...), ...]} of one Snakemake run's jobs."""
    since = (datetime.now() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    out = subprocess.run(
        ["sacct", "-X", "--parsable2", "--noheader", "--name", run_id, "--starttime", since,
         f"--format=Comment%300,{fields}"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    jobs: dict[str, list[tuple[str, ...]]] = defaultdict(list)
    for line in out.stdout.strip().splitlines():
        comment, *values = line.split("|")
        jobs[comment].append(tuple(values))
    return dict(jobs)


def test_smoke_experiment_on_slurm_equals_local_run(cluster, ref, tmp_path):
    """Every job but the local freeze check (``localrules``) goes through sbatch, shows in sacct as
    COMPLETED, and the records equal the local run's.

    The first attempt of shard001 dies after three records (injected): Slurm marks it
    FAILED, Snakemake resubmits it, and the retry resumes from the records written.
    """
    prereg, refdir = ref
    run = seed_workdir(tmp_path / "run", refdir, MODEL)
    faults = tmp_path / "faults"
    bin_dir = faulty_kvcert(tmp_path / "bin", "shard001.jsonl", faults)
    env = run_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SLURM_CONF=cluster["SLURM_CONF"])
    out = snakemake(run, prereg, "--profile", str(local_profile(tmp_path / "profile")), "--", *SHARDS,
                    env=env, timeout=1200)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-5000:]
    assert "has been submitted with SLURM jobid" in text

    run_id = re.search(r"SLURM run ID: (\S+)", text).group(1)
    jobs = sacct_jobs(run_id, cluster)
    shard = "rule_generate_wildcards_embedded_main_needle_512_{}"
    assert "rule_verify_prereg" not in jobs and "localrule verify_prereg" in text  # where Snakemake runs
    assert jobs == {
        "rule_manifest_wildcards_embedded_needle_512": [("COMPLETED", ACCOUNT)],
        shard.format("000"): [("COMPLETED", ACCOUNT)],
        shard.format("001"): [("FAILED", ACCOUNT), ("COMPLETED", ACCOUNT)],
    }, f"{jobs}\n{text[-4000:]}"

    # each shard's time limit is the plan's estimate, not a flat 6 h; the embedded model asks for no GPU
    from kvcert.generation.plan import build_plan, load_grid, shard_minutes

    plan = build_plan("smoke", load_grid(prereg, "grids/smoke.yaml"))
    experiment = yaml.safe_load((REPO / "configs" / "experiment" / "smoke.yaml").read_text())
    seconds, fork = experiment["seconds_per_generation"], experiment.get("fork_speedup")
    limits = sacct_fields(run_id, cluster, "Timelimit,ReqTRES")
    for index in ("000", "001"):
        minutes = shard_minutes(plan.shard("embedded", "main", "needle", 512, int(index)), seconds, fork)
        for timelimit, tres in limits[shard.format(index)]:
            assert timelimit == f"{minutes // 60:02d}:{minutes % 60:02d}:00" and "gpu" not in tres

    assert (run / MANIFEST).read_bytes() == (refdir / MANIFEST).read_bytes()
    assert_same_records(run, refdir)
    before = complete_lines(faults / "partial-at-failure")
    assert len(before) >= 3
    assert complete_lines(run / SHARDS[1])[: len(before)] == before, "the retry recomputed records it had"


def test_job_that_keeps_failing_stops_the_run_naming_rule_shard_and_log(cluster, ref, tmp_path):
    prereg, refdir = ref
    run = seed_workdir(tmp_path / "run", refdir, MODEL, VERIFIED, MANIFEST)
    faults = tmp_path / "faults"
    bin_dir = faulty_kvcert(tmp_path / "bin", "shard000.jsonl", faults)
    (faults / "always").touch()
    env = run_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SLURM_CONF=cluster["SLURM_CONF"])
    # --retries 1 instead of the profile's 2 keeps the test short: the retries run out either way.
    out = snakemake(run, prereg, "--profile", str(local_profile(tmp_path / "profile")), "--retries", "1",
                    "--", SHARDS[0], env=env, timeout=900)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    log = GENERATE_LOG.format(name="shard000")
    error = re.search(r"Error in rule generate:.*?\n(?:\s+.*\n)*", text)
    assert error, text[-5000:]
    block = error.group(0)
    assert f"output: {SHARDS[0]}" in block
    assert re.search(rf"log: {re.escape(log)}, \S+/slurm-logs/rule_generate/embedded_main_needle_512_000/\d+\.log", block)
    assert "injected failure: " + SHARDS[0] + " keeps failing" in text  # the failed job's log, shown
    assert "Exiting because a job execution failed" in text
    jobs = sacct_jobs(re.search(r"SLURM run ID: (\S+)", text).group(1), cluster)
    assert jobs == {"rule_generate_wildcards_embedded_main_needle_512_000": [("FAILED", ACCOUNT)] * 2}
    assert not (run / SHARDS[0]).exists()
