"""The pipeline: plan counts equal the Snakemake DAG's, config errors, pre-registration freeze."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvcert.config.compose import compose_config, generation_config, analysis_plan
from kvcert.config.experiment import PipelineConfigError, check_pipeline_config
from kvcert.generation.plan import Run, build_plan, load_grid
from kvcert.config.prereg import PreregError, freeze, verify

REPO = Path(__file__).resolve().parents[1]


def snakemake(*args, cwd=REPO, timeout=300, env=None):
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env,
    )


@pytest.fixture(scope="module")
def paper_env(tmp_path_factory):
    """The environment of a user who set the README's exports: stand-ins of the paper
    grid's models and data from `kvcert make-rehearsal` (one row per data set; a dry run
    reads no row)."""
    import os

    from kvcert.rehearsal import make_rehearsal

    sources = make_rehearsal(tmp_path_factory.mktemp("paper-sources"), "paper", rows=1, context_words=50)
    return {**os.environ, **sources.env}


def job_stats(output: str) -> dict[str, int]:
    block = output.split("Job stats:")[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", block, re.M)}


@pytest.mark.pipeline
def test_paper_plan_matches_dry_run(paper_env):
    plan = build_plan("paper", load_grid(REPO / "preregistration", "grids/paper.yaml"))
    main = sum(s.generations for s in plan.shards if s.cell == "main")
    assert main == 4 * 2 * (4 * 150 + 110) * 13  # 73,840: the paper's ~74k generations
    assert all(s.generations <= 200 for s in plan.shards)  # a few hundred per GPU job at most
    out = snakemake("-n", "--config", "experiment=paper", env=paper_env)
    assert out.returncode == 0, out.stderr[-2000:]
    stats = job_stats(out.stdout)
    expected = plan.jobs_per_rule()
    assert stats["total"] == plan.job_count
    for rule, count in expected.items():
        assert stats[rule] == count, rule
    plan_cli = subprocess.run([sys.executable, "-m", "kvcert.cli", "plan", "--experiment", "paper"],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
    last = plan_cli.stdout.strip().splitlines()[-1]
    assert last.startswith(f"generations={plan.generations} jobs={plan.job_count} gpu_hours=")
    fields = dict(f.split("=") for f in last.split())
    assert float(fields["gpu_hours"]) > float(fields["gpu_hours_roofline"]) > 0  # the roofline bounds the estimate


@pytest.mark.parametrize("experiment", ["real", "smoke", "rehearsal"])
def test_plan_of_a_cpu_experiment_needs_no_gpu_hours(experiment, capsys):
    from kvcert.cli import main
    from kvcert.config.experiment import experiment_grid

    exp, grid = experiment_grid(experiment, REPO / "configs", REPO / "preregistration")
    assert exp["hardware"] == "cpu"
    plan = build_plan(experiment, grid, REPO / "configs")
    assert main(["plan", "--experiment", experiment, "--gpu", "h200"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert not any(line.startswith("roofline") for line in lines)  # no H100 (or other GPU) bound
    assert lines[-2].startswith(f"hardware: CPU (configs/experiment/{experiment}.yaml: hardware: cpu): it needs no "
                                "GPU hours") and lines[-2].endswith("--gpu: for a GPU experiment's roofline, not used here")
    fields = dict(f.split("=") for f in lines[-1].split())
    assert fields["generations"] == str(plan.generations) and fields["jobs"] == str(plan.job_count)
    assert fields["gpu_hours"] == "0" and float(fields["cpu_job_hours"]) > 0


@pytest.mark.parametrize("experiment,examples,seed", [("smoke", 3, 4000), ("paper", 8, 0), ("real", 48, 9600)])
def test_the_replay_has_its_own_manifest(experiment, examples, seed):
    """The replay runs the examples and seed its grid entry registers, from a manifest of its own — never the
    larger manifest a generation cell keeps for the same model, task and length."""
    grid = load_grid(REPO / "preregistration", f"grids/{experiment}.yaml")
    plan = build_plan(experiment, grid)
    deciding = plan.replays_of("replay")
    assert deciding and all((r.examples, r.seed, r.set) == (examples, seed, "replay") for r in deciding)
    grid_paths = {m.path for m in plan.manifests}
    for r in deciding:
        assert r.path == f"manifests/{r.model}/replay/{r.task}/{r.length}.jsonl" and r.path not in grid_paths
        assert r.replay_table == f"replay/{r.model}/{r.task}-{r.length}.parquet"
        assert plan.manifest(r.model, r.task, r.length, "replay") == r
    assert plan.jobs_per_rule()["replay_manifest"] == len(deciding)
    assert set(plan.replays) - set(deciding) == set(plan.replays_of("stability"))
    second = {"real": (48, 9700)}.get(experiment)  # the grids with a second replay data seed (ninth amendment: real)
    assert [(r.examples, r.seed) for r in plan.replays_of("stability")] == ([second] * len(deciding) if second else [])


def _with_stability(grid: dict, **stability) -> dict:
    import copy

    grid = copy.deepcopy(grid)
    grid["replay"]["stability"] = stability
    return grid


def test_a_second_replay_data_seed_is_a_second_replay_job():
    """``replay.stability`` (a second data seed of the replay, its prompts reported beside the deciding seed's):
    accepted, planned as a manifest and a replay job of its own per model and length (set ``stability``, its table
    under replay/<model>/stability/), the deciding seed's paths unchanged; without it the plan is as before."""
    from kvcert.config.experiment import check_grid, replay_stability

    smoke = load_grid(REPO / "preregistration", "grids/smoke.yaml")
    before = build_plan("smoke", smoke)
    assert replay_stability(smoke) is None and not before.replays_of("stability")
    grid = _with_stability(smoke, seed=4100, examples=5)
    assert check_grid(grid) is grid and replay_stability(grid) == {"seed": 4100, "examples": 5}
    plan = build_plan("smoke", grid)
    assert plan.replays_of("replay") == before.replays and plan.manifests == before.manifests
    assert plan.shards == before.shards
    [second] = plan.replays_of("stability")
    first = before.replays[0]
    assert (second.model, second.task, second.length, second.examples, second.seed) == (
        first.model, first.task, first.length, 5, 4100)
    assert second.path == f"manifests/{first.model}/stability/{first.task}/{first.length}.jsonl"
    assert second.replay_table == f"replay/{first.model}/stability/{first.task}-{first.length}.parquet"
    assert second.impossibility == f"replay/{first.model}/stability/{first.task}-{first.length}.impossibility.json"
    assert plan.manifest(first.model, first.task, first.length, "stability") == second
    jobs = plan.jobs_per_rule()
    assert (jobs["replay"], jobs["replay_manifest"], jobs["stability_manifest"]) == (2, 1, 1)
    assert plan.job_count == before.job_count + 2 and "stability_manifest" not in before.jobs_per_rule()
    assert replay_stability(_with_stability(smoke, seed=4100)) == {"seed": 4100, "examples": 3}  # the replay's


@pytest.mark.parametrize("stability,match", [
    ({"seed": 4000, "examples": 3}, r"replay.stability.seed: 4000 is the replay's own data seed; give another seed"),
    ({"seed": -1}, r"replay.stability.seed: must be an integer >= 0"),
    ({"examples": 3}, r"replay.stability.seed: must be an integer >= 0 \(the second data seed\), got None"),
    ({"seed": 4100, "examples": 0}, r"replay.stability.examples: must be a positive integer"),
    ({"seed": 4100, "lengths": [512]}, r"replay.stability.lengths: unknown; a stability entry has seed, examples"),
    (4100, r"replay.stability: must be a mapping"),
])
def test_a_second_replay_data_seed_is_refused_in_one_line(stability, match, tmp_path):
    """The second data seed repeating the deciding one (its prompts would be the same), a missing or negative seed,
    no prompts, an unknown key: one line naming the key, where the grid is read and where it is planned."""
    from kvcert.config.experiment import check_grid

    smoke = load_grid(REPO / "preregistration", "grids/smoke.yaml")
    grid = _with_stability(smoke)
    grid["replay"]["stability"] = stability
    with pytest.raises(ValueError, match=f"^grid of experiment smoke: {match}"):
        build_plan("smoke", grid)
    with pytest.raises(ValueError, match=match):
        check_grid(grid)
    import yaml

    (tmp_path / "grids").mkdir()
    (tmp_path / "grids" / "smoke.yaml").write_text(yaml.safe_dump(grid))
    with pytest.raises(ValueError, match=f"grids/smoke.yaml: {match}"):
        load_grid(tmp_path, "grids/smoke.yaml")


@pytest.mark.pipeline
def test_a_second_replay_data_seed_runs_in_the_dag(tmp_path):
    """A grid with a second replay data seed: the dry run's jobs are the plan's, rule by rule (two manifests and two
    replay jobs), and the claims and report jobs read both seeds' tables."""
    import os

    import yaml

    from kvcert.config.experiment import experiment_grid

    prereg = tmp_path / "preregistration"
    shutil.copytree(REPO / "preregistration", prereg)
    path = prereg / "grids" / "smoke.yaml"
    grid = _with_stability(yaml.safe_load(path.read_text()), seed=4100, examples=3)
    path.write_text(yaml.safe_dump(grid, sort_keys=False))
    amend = subprocess.run([sys.executable, "-m", "kvcert.cli", "prereg", "freeze", "--folder", str(prereg),
                            "--reason", "a second replay data seed"], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "KVCERT_GIT_COMMIT": "test"})
    assert amend.returncode == 0, amend.stderr
    plan = build_plan("smoke", experiment_grid("smoke", REPO / "configs", prereg)[1], REPO / "configs")
    out = snakemake("-n", "-p", "--config", f"prereg={prereg}", f"results={tmp_path / 'results'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    stats = job_stats(out.stdout)
    assert stats.pop("total") == plan.job_count and stats == plan.jobs_per_rule()
    second = plan.replays_of("stability")[0]
    commands = [line.split("Shell command: ", 1)[1] for line in out.stdout.splitlines() if "Shell command: " in line]
    assert any(c.startswith("kvcert manifest") and "--set stability" in c for c in commands)
    table = str(tmp_path / "results" / "smoke" / second.replay_table)
    for step in ("claims", "report"):
        [command] = [c for c in commands if c.startswith(f"kvcert {step} ")]
        assert f"--stability-replay {table}" in command


def test_a_grid_spends_its_replay_draws_over_prompts():
    """A grid's replay.draws replaces the analysis plan's draws for its experiment (real: 12 prompts at 50 draws,
    no more draws than 3 prompts at the plan's 200); the other grids keep the plan's; a draw count that is not a
    positive integer is one line naming the key."""
    from kvcert.config.prereg import load_plan
    from kvcert.generation.replay_step import grid_replay_draws

    plan_draws = load_plan(REPO / "preregistration").replay.draws
    real = load_grid(REPO / "preregistration", "grids/real.yaml")
    assert grid_replay_draws(real, "real") * real["replay"]["examples"] <= plan_draws * 3
    assert real["replay"]["examples"] >= 12
    for name in ("smoke", "paper", "rehearsal"):
        assert grid_replay_draws(load_grid(REPO / "preregistration", f"grids/{name}.yaml"), name) is None
    for bad in (0, -3, 2.5, True, "50"):
        with pytest.raises(ValueError, match=r"^grid of experiment x: replay.draws must be a positive integer"):
            grid_replay_draws({"replay": {"draws": bad}}, "x")


@pytest.mark.pipeline
def test_dry_run_stops_on_missing_models_and_data():
    """Model folders and data the user has not set up: a dry run stops before any job,
    with one line per missing folder, no traceback and no Hub lookup."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("KVCERT_MODEL_DIR", "LONGBENCH_DIR", "LOCOMO_JSON")}
    out = snakemake("-n", "--config", "experiment=paper", env=env)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    grid = load_grid(REPO / "preregistration", "grids/paper.yaml")
    lines = [line for line in text.splitlines() if line.startswith("model ")]
    assert len(lines) == len(grid["models"])
    for model, line in zip(sorted(grid["models"]), lines):
        assert line.startswith(f"model {model}: models/{model} does not exist") and "KVCERT_MODEL_DIR" in line
    assert sum(line.startswith("task longbench_") for line in text.splitlines()) == 4
    assert "Traceback" not in text and "huggingface.co" not in text
    assert "problem(s) found before any job ran; `kvcert check --experiment paper` lists them again" in text


@pytest.mark.pipeline
def test_check_command(paper_env, tmp_path):
    """kvcert check: ready on complete sources; each broken piece named in one line."""
    def check(*args, env=paper_env):
        return subprocess.run([sys.executable, "-m", "kvcert.cli", "check", "--experiment", "paper", *args],
                              cwd=REPO, capture_output=True, text=True, timeout=120, env=env)

    ok = check()
    assert ok.returncode == 0 and "experiment paper: ready" in ok.stdout, ok.stdout + ok.stderr
    # the shipped Slurm profile still has its placeholders: one line each, with the line number
    placeholders = check("--profile", "profiles/slurm")
    assert placeholders.returncode == 1
    lines = [line for line in placeholders.stdout.splitlines() if line.startswith("profile ")]
    assert {line.split(": ")[1].split(" is still")[0] for line in lines} == {
        "slurm_account", "slurm_partition", "gpu_model"}
    assert all(re.match(r"profile profiles/slurm/config\.yaml:\d+: ", line) for line in lines)
    # a model folder without weights, a data folder without one data set
    models = Path(paper_env["KVCERT_MODEL_DIR"])
    broken = tmp_path / "models"
    shutil.copytree(models, broken)
    (broken / "llama-3.1-8b-instruct" / "model.safetensors").unlink()
    data = tmp_path / "longbench"
    shutil.copytree(paper_env["LONGBENCH_DIR"], data)
    (data / "qasper.jsonl").unlink()
    out = check(env={**paper_env, "KVCERT_MODEL_DIR": str(broken), "LONGBENCH_DIR": str(data)})
    assert out.returncode == 1
    assert out.stdout.splitlines()[:2] == [
        f"model llama-3.1-8b-instruct: {broken}/llama-3.1-8b-instruct has no weights (*.safetensors or *.bin)",
        f"task longbench_qasper: {data} has no qasper.jsonl (nor Parquet files of it)"]


@pytest.mark.pipeline
def test_lint_is_clean():
    out = snakemake("--lint")
    assert out.returncode == 0 and "Congratulations" in out.stdout + out.stderr


@pytest.mark.parametrize(
    "config, match",
    [
        ({"experimnt": "paper"}, "'experimnt' is unknown .*did you mean 'experiment'"),
        ({"experiment": "papr"}, "no configs/experiment/papr.yaml"),
        ({"retrain_model": "maybe"}, "must be true or false"),
        ({"results": 5}, "config key 'results': 5 is not of type 'string'; give what .*pipeline.schema.yaml"),
    ],
)
def test_config_errors_are_one_line(config, match):
    base = {"experiment": "smoke", "retrain_model": False, "train_recipe": "embedded", "results": "r", "prereg": "p"}
    base.update(config)
    with pytest.raises(PipelineConfigError, match=match) as info:
        check_pipeline_config(base, REPO / "configs" / "pipeline.schema.yaml", REPO / "configs")
    assert "\n" not in str(info.value)


@pytest.mark.pipeline
@pytest.mark.parametrize(
    "config, match",
    [
        ({"experimnt": "paper"}, "'experimnt' is unknown .*did you mean 'experiment'"),
        ({"retrain_model": "maybe"}, "must be true or false"),
    ],
)
def test_a_snakemake_run_stops_on_a_config_error_in_one_line(config, match):
    out = snakemake("-n", "--config", *[f"{k}={v}" for k, v in config.items()])
    assert out.returncode != 0 and re.search(match, out.stdout + out.stderr)


def test_a_job_config_takes_the_design_from_the_prereg():
    from kvcert.generation.jobs import run_config

    run = Run("streaming", "snapkv-poisson", 0.125, 0, 64)
    cfg = run_config(REPO / "configs", "embedded", "multiturn", run, analysis_plan(REPO / "preregistration"))
    assert cfg["budget"] == 0.125 and cfg["condition"] == "streaming" and cfg["chunk_tokens"] == 64
    assert cfg["method"]["design"] == {"sinks": 4, "window": 32, "top_fraction": 0.25, "floor": 0.1, "temper": 1.0,
                                       "dense_layers": 0}  # the sixth amendment registers the two knobs
    assert cfg["certificate"]["delta"] == 0.1
    with pytest.raises(ValueError, match="method=no-such-method"):
        compose_config(["method=no-such-method"])


def test_a_model_folder_moved_elsewhere_keeps_every_rerun_trigger():
    """A model's location is not its content: the same folder under another parent (another
    KVCERT_MODEL_DIR) gives the same shard config hash, data config hash and record config hashes;
    another model folder (or a Hub id) does not. The content is model_digest's (the model param)."""
    from kvcert.config.experiment import experiment_grid
    from kvcert.generation.jobs import manifest_config_hash

    configs, prereg = REPO / "configs", REPO / "preregistration"
    plan = build_plan("smoke", experiment_grid("smoke", configs, prereg)[1])
    shard = plan.shards[0]
    here, there = "/scratch/a/models/tiny", "/home/b/cache kvcert/models/tiny/"
    assert (plan.job(shard, configs, prereg, here).config_hash
            == plan.job(shard, configs, prereg, there).config_hash
            != plan.job(shard, configs, prereg, "/scratch/a/models/other").config_hash)
    assert manifest_config_hash(configs, "embedded", "needle", here) == manifest_config_hash(configs, "embedded", "needle", there)
    assert manifest_config_hash(configs, "embedded", "needle", here) != manifest_config_hash(configs, "embedded", "needle")


def test_the_plan_hands_out_typed_jobs(tmp_path):
    """Plan.job: a shard's Job — its runs' GenerationSpecs (validated where they enter), their config hash (the
    hash of the record hashes: the Snakefile's rerun trigger), and its planned records keyed by GenerationKey,
    read from the manifest it is given."""
    from kvcert.generation.record import GenerationKey
    from kvcert.generation.spec import GenerationSpec
    from kvcert.config.experiment import experiment_grid
    from kvcert.generation.jobs import specs_hash
    from kvcert.provenance import config_hash
    from kvcert.tasks.records import TaskRecord, write_jsonl

    configs, prereg = REPO / "configs", REPO / "preregistration"
    plan = build_plan("smoke", experiment_grid("smoke", configs, prereg)[1])
    for shard in plan.shards:  # a stand-in manifest per (task, length): the plan's examples, their ids
        examples = plan.manifest(shard.model, shard.task, shard.length).examples
        write_jsonl([TaskRecord(id=f"{shard.task}-{i}", task=shard.task, context="c", question="q", answers=["a"],
                                metadata={"target_tokens": shard.length or None}) for i in range(examples)],
                    tmp_path / shard.manifest)
    cache = {}  # the analysis plan and each manifest read once across the jobs
    for shard in plan.shards:
        job = plan.job(shard, configs, prereg, manifest=tmp_path / shard.manifest, cache=cache)
        assert job.shard is shard
        assert len(job.specs) == len(job.shard.runs) and all(isinstance(s, GenerationSpec) for s in job.specs)
        assert [float(s.budget) for s in job.specs] == [r.budget for r in job.shard.runs]
        assert job.config_hash == specs_hash(job.specs) == plan.job(job.shard, configs, prereg).config_hash
        planned = job.planned_records()
        assert len(planned) == job.shard.generations and all(type(k) is GenerationKey for k in planned)
        assert set(planned.values()) == {config_hash(s.hashed_dict()) for s in job.specs}
        assert set(job.references()) == {e.id for e in job.examples()}
    with pytest.raises(ValueError, match="no manifest"):
        plan.job(plan.shards[0], configs, prereg).planned_records()


@pytest.mark.parametrize("experiment", ["smoke", "rehearsal", "paper", "real"])
def test_the_typed_jobs_equal_hydras_composition_of_every_run(experiment):
    """The pipeline's jobs read the config files directly (kvcert.generation.jobs); hydra composes them for
    kvcert run. For a third of the runs (a different third each) of one shard per cell and model of each
    experiment, the two give the same generation config, so the records' config hashes do not depend on
    the path."""
    from kvcert.config.experiment import experiment_grid
    from kvcert.generation.jobs import run_config

    configs, prereg = REPO / "configs", REPO / "preregistration"
    plan_ = analysis_plan(prereg)
    shards = build_plan(experiment, experiment_grid(experiment, configs, prereg)[1]).shards
    seen = set()
    for shard in shards:  # the first shard of each cell and model: every model config, every kind of run
        if (shard.cell, shard.model) in seen:
            continue
        seen.add((shard.cell, shard.model))
        for run in shard.runs[len(seen) % 3::3]:
            overrides = [f"experiment={experiment}", f"model={shard.model}", f"task={shard.task}",
                         f"method={run.method}", f"condition={run.condition}", f"seed={run.seed}",
                         f"budget={run.budget}"] + ([f"chunk_tokens={run.chunk_tokens}"] if run.chunk_tokens else [])
            composed = generation_config(compose_config(overrides, configs), plan_, None)
            assert run_config(configs, shard.model, shard.task, run, plan_) == composed, (shard.path, run)


def test_freeze_verify_and_amend(tmp_path):
    prereg = tmp_path / "preregistration"
    shutil.copytree(REPO / "preregistration", prereg, ignore=shutil.ignore_patterns("freeze"))
    with pytest.raises(PreregError, match="not frozen"):
        verify(prereg)
    first = freeze(prereg)
    assert verify(prereg).prereg_hash == first.prereg_hash
    (prereg / "grids" / "smoke.yaml").write_text((prereg / "grids" / "smoke.yaml").read_text() + "# edit\n")
    with pytest.raises(PreregError, match=r"grids/smoke.yaml was edited after the freeze of .*amend with") as info:
        verify(prereg)
    assert "\n" not in str(info.value)
    with pytest.raises(PreregError, match="reason"):
        freeze(prereg)
    second = freeze(prereg, reason="more examples")
    assert second.amends == first.path.name and second.prereg_hash != first.prereg_hash
    assert first.path.exists()  # amendments never overwrite
    assert verify(prereg).path == second.path


@pytest.mark.pipeline
def test_tampered_preregistration_stops_the_dag(tmp_path):
    prereg = tmp_path / "preregistration"
    shutil.copytree(REPO / "preregistration", prereg, ignore=shutil.ignore_patterns("freeze"))
    freeze(prereg)
    claims = prereg / "claims.yaml"
    claims.write_text(claims.read_text().replace("threshold: 0.85", "threshold: 0.80"))
    out = snakemake("--cores", "1", "--config", f"prereg={prereg}", f"results={tmp_path / 'results'}",
                    "--", str(tmp_path / "results" / "smoke" / "prereg" / "verified.json"), cwd=tmp_path)
    assert out.returncode != 0
    assert "claims.yaml was edited after the freeze" in out.stdout + out.stderr


@pytest.mark.pipeline
@pytest.mark.slow
def test_wheel_install_finds_its_configs_and_preregistration(tmp_path):
    """A non-editable install carries configs/ and preregistration/; run outside any
    checkout, `kvcert plan` and `kvcert check` use them."""
    import os
    import zipfile

    wheels = tmp_path / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(REPO)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next(wheels.glob("kvcert-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"kvcert/_bundled/configs/config.yaml", "kvcert/_bundled/preregistration/claims.yaml",
            "kvcert/_bundled/configs/experiment/paper.yaml"} <= names
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=600)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("KVCERT_CONFIGS", None)
    plan = subprocess.run([sys.executable, "-m", "kvcert.cli", "plan", "--experiment", "paper"], cwd=elsewhere,
                          capture_output=True, text=True, timeout=120, env=env)
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.strip().splitlines()[-1].startswith("generations=84240 jobs=669")  # 661 + the replay manifests
    where = subprocess.run([sys.executable, "-c", "import kvcert.config.paths as c; print(c.configs_dir())"],
                           cwd=elsewhere, capture_output=True, text=True, timeout=60, env=env)
    assert where.stdout.strip() == str(site / "kvcert" / "_bundled" / "configs")
    check = subprocess.run([sys.executable, "-m", "kvcert.cli", "check", "--experiment", "smoke"], cwd=elsewhere,
                           capture_output=True, text=True, timeout=120, env=env)
    assert check.returncode == 0 and "ready" in check.stdout, check.stdout + check.stderr


@pytest.mark.pipeline
def test_adding_a_model_to_the_paper_grid(paper_env, tmp_path):
    """The README's path: a model config, the grid and its planning estimate, an amendment;
    then the plan has the new model's jobs and the pre-flight finds its folder."""
    import os

    from kvcert.rehearsal import checkpoints, tokenizer_corpus

    configs, prereg = tmp_path / "configs", tmp_path / "preregistration"
    shutil.copytree(REPO / "configs", configs)
    shutil.copytree(REPO / "preregistration", prereg)
    (configs / "model" / "my-model.yaml").write_text(
        "name: my-model\npath: ${oc.env:KVCERT_MODEL_DIR,models}/my-model\ndtype: bfloat16\ndevice: auto\n")
    grid = prereg / "grids" / "paper.yaml"
    grid.write_text(grid.read_text().replace("models: [", "models: [my-model, "))
    experiment = configs / "experiment" / "paper.yaml"
    experiment.write_text(experiment.read_text() + "  my-model: {6144: 2.0, 16384: 4.5, 0: 2.8}\n")
    models = tmp_path / "models"
    shutil.copytree(paper_env["KVCERT_MODEL_DIR"], models)
    checkpoints.save_checkpoint(models / "my-model", checkpoints.architecture_of("llama"), tokenizer_corpus([]))
    env = {**paper_env, "KVCERT_MODEL_DIR": str(models)}

    def kvcert(*args):
        return subprocess.run([sys.executable, "-m", "kvcert.cli", *args, "--experiment", "paper",
                               "--configs", str(configs), "--prereg", str(prereg)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)

    refused = kvcert("check")
    assert refused.returncode == 1 and "grids/paper.yaml was edited after the freeze" in refused.stdout
    amend = subprocess.run([sys.executable, "-m", "kvcert.cli", "prereg", "freeze", "--folder", str(prereg),
                            "--reason", "add my-model to the paper grid"], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "KVCERT_GIT_COMMIT": "test"})
    assert amend.returncode == 0, amend.stderr
    assert kvcert("check").returncode == 0
    plan = kvcert("plan")
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.strip().splitlines()[-1].startswith("generations=105300 ")  # 84,240 × 5 / 4


def test_profile_check_asks_for_a_qos_where_the_account_has_no_default(tmp_path, monkeypatch):
    """A site where Slurm picks no QoS for a job without --qos refuses it: the pre-flight says so in one
    line, naming the allowed ones; with a default QoS, or with qos set in the profile, it says nothing."""
    import yaml

    from kvcert.commands import check

    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    profile["default-resources"]["slurm_account"] = "lab"
    answers = {"out": "gpu,long|\n"}

    class Done:
        def __init__(self, stdout):
            self.stdout = stdout

    monkeypatch.setattr(check.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(check.subprocess, "run", lambda cmd, **kw: Done(answers["out"] if cmd[0] == "sacctmgr" else ""))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(profile))
    lines = [p for p in check.check_profile(path) if "QoS" in p]
    assert len(lines) == 1 and "gpu, long" in lines[0] and "default-resources" in lines[0]
    # Slurm picks a QoS itself: the association's default, its only one, or "normal" where allowed
    for picks in ("gpu,long|gpu\n", "gpu|\n", "normal,long|\n"):
        answers["out"] = picks
        assert not [p for p in check.check_profile(path) if "QoS" in p], picks
    answers["out"] = "gpu,long|\n"
    profile["default-resources"]["qos"] = "gpu"
    path.write_text(yaml.safe_dump(profile))
    assert not [p for p in check.check_profile(path) if "QoS" in p]


def test_a_config_file_follows_the_environment_it_is_read_in(monkeypatch, tmp_path):
    """A config's ${oc.env:...} is resolved at each read: a process whose KVCERT_MODEL_DIR changes (a test, a
    notebook) never gets the path of an earlier read."""
    from kvcert.generation.jobs import config_file

    monkeypatch.setenv("KVCERT_MODEL_DIR", str(tmp_path / "a"))
    assert config_file(REPO / "configs", "model", "qwen2.5-7b-instruct")["path"] == str(tmp_path / "a" / "qwen2.5-7b-instruct")
    monkeypatch.setenv("KVCERT_MODEL_DIR", str(tmp_path / "b"))
    assert config_file(REPO / "configs", "model", "qwen2.5-7b-instruct")["path"] == str(tmp_path / "b" / "qwen2.5-7b-instruct")
