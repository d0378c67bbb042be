"""Validation of the Snakemake configuration and the one loader of experiment settings.

The Snakefile's config goes through :func:`check_pipeline_config` alone: it fills the schema's
defaults and validates against ``configs/pipeline.schema.yaml``, in one line that says which key
is wrong, what it might have meant, and which keys exist. :func:`load_experiment` reads
``configs/experiment/<name>.yaml`` against ``configs/experiment.schema.yaml`` (defaults
in the schema), for the Snakefile, the CLI and the analysis alike; :func:`experiment_grid`
adds the pre-registered grid it names, read by :func:`load_grid` (its optional keys checked there:
:func:`check_grid`).
"""

from __future__ import annotations

import difflib
from pathlib import Path

import jsonschema
import yaml


class PipelineConfigError(ValueError):
    pass


def schema_defaults(data: dict, schema: dict) -> dict:
    """``data`` with every missing top-level property set to a copy of its schema ``default``."""
    out = dict(data)
    for key, prop in schema.get("properties", {}).items():
        if key not in out and "default" in prop:
            out[key] = yaml.safe_load(yaml.safe_dump(prop["default"]))  # a copy
    return out


def load_experiment(name: str, configs: str | Path) -> dict:
    """The settings of experiment ``name`` (``configs/experiment/<name>.yaml``), validated, with defaults."""
    folder = Path(configs)
    path = folder / "experiment" / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in (folder / "experiment").glob("*.yaml")))
        hint = f"choose one of {known}" if known else "give --configs the project's configs/ folder"
        raise PipelineConfigError(f"experiment {name!r}: no {path}; {hint}")
    schema = yaml.safe_load((folder / "experiment.schema.yaml").read_text())
    data = yaml.safe_load(path.read_text()) or {}
    try:
        jsonschema.validate(data, schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise PipelineConfigError(f"{path}: {where}: {exc.message}") from None
    return schema_defaults(data, schema)


def load_grid(prereg: str | Path, grid_file: str) -> dict:
    """The design grid ``grid_file`` of the pre-registration folder ``prereg``, checked (:func:`check_grid`)."""
    path = Path(prereg) / grid_file
    if not path.exists():
        raise FileNotFoundError(f"grid: {path} does not exist")
    return check_grid(yaml.safe_load(path.read_text()), path)


#: the keys of a grid's ``replay.stability``: the second data seed's prompts, read beside the deciding seed's
STABILITY_KEYS = ("seed", "examples")


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_grid(grid, where: str | Path = "grid") -> dict:
    """``grid`` as given, its replay's optional second data seed checked (``replay.stability: {seed, examples}``:
    the claims C1, C2 and C8 are decided on the prompts of ``replay.seed``; the same statistics are reported on
    ``examples`` prompts of ``stability.seed`` beside them, the data-seed stability). The stability seed must differ
    from ``replay.seed``: a generated task draws example ``i`` of seed ``s`` from its own stream (keyed by task,
    ``s`` and ``i``, :func:`kvcert.tasks.sampling.example_rng`) and names it by both, so two seeds give disjoint
    prompts; a task drawn from files could repeat an item, which the claims step refuses (two tables sharing a
    prompt). ``examples`` defaults to the replay's. A wrong entry is one line naming the key and the fix."""
    replay = grid.get("replay") if isinstance(grid, dict) else None
    if not isinstance(replay, dict) or "stability" not in replay:
        return grid
    stab, key = replay["stability"], f"{where}: replay.stability"
    if not isinstance(stab, dict):
        raise ValueError(f"{key}: must be a mapping {{seed: S, examples: N}} (the second data seed's prompts), "
                         f"got {stab!r}")
    unknown = sorted(set(stab) - set(STABILITY_KEYS))
    if unknown:
        raise ValueError(f"{key}.{unknown[0]}: unknown; a stability entry has {', '.join(STABILITY_KEYS)}")
    seed, examples = stab.get("seed"), stab.get("examples", replay.get("examples"))
    if not _count(seed) or seed < 0:
        raise ValueError(f"{key}.seed: must be an integer >= 0 (the second data seed), got {seed!r}")
    if seed == replay.get("seed", 0):
        raise ValueError(f"{key}.seed: {seed} is the replay's own data seed; give another seed (its prompts must "
                         "be disjoint from the deciding seed's)")
    if not _count(examples) or examples < 1:
        raise ValueError(f"{key}.examples: must be a positive integer (prompts of the stability seed), "
                         f"got {examples!r}")
    return grid


def replay_stability(grid) -> dict | None:
    """The grid's second replay data seed, ``{seed, examples}`` (examples defaulting to the replay's), or None where
    the grid registers none (:func:`check_grid`)."""
    replay = (grid or {}).get("replay") or {}
    stab = replay.get("stability")
    if not stab:
        return None
    return {"seed": int(stab["seed"]), "examples": int(stab.get("examples", replay.get("examples")))}


def experiment_grid(name: str, configs: str | Path, prereg: str | Path) -> tuple[dict, dict]:
    """(settings, design grid) of experiment ``name``: the grid is the pre-registered file it names."""
    exp = load_experiment(name, configs)
    return exp, load_grid(prereg, exp["grid"])


def check_pipeline_config(config: dict, schema_path: str | Path, configs_dir: str | Path) -> dict:
    """``config`` (Snakemake's, changed in place and returned) with the schema's defaults filled in, validated
    against the schema at ``schema_path``; a wrong one is refused in one line naming the key and the fix."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    allowed = schema["properties"]
    config.update({k: v for k, v in schema_defaults(config, schema).items() if k not in config})
    for key, value in config.items():
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PipelineConfigError(f"config key {key!r} is unknown{hint}; known keys: {', '.join(allowed)}")
        expected = allowed[key]["type"]
        if expected == "boolean" and isinstance(value, str) and value.lower() in ("true", "false"):
            config[key] = value.lower() == "true"  # --config retrain_model=true arrives as a string
        elif expected == "boolean" and not isinstance(value, bool):
            raise PipelineConfigError(f"config key {key!r} must be true or false, got {value!r}")
    try:
        jsonschema.validate(config, schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise PipelineConfigError(f"config key {where!r}: {exc.message}; give what {schema_path} describes") from None
    experiments = sorted(p.stem for p in (Path(configs_dir) / "experiment").glob("*.yaml"))
    if config["experiment"] not in experiments:
        raise PipelineConfigError(
            f"config key 'experiment': no configs/experiment/{config['experiment']}.yaml; choose one of {', '.join(experiments)}"
        )
    return config
