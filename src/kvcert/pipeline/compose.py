"""Hydra composition of one run's generation config.

Each run of a shard composes ``configs/config.yaml`` with overrides derived from the
Snakemake wildcards — ``experiment=…, model=…, task=…, method=…, budget=…,
condition=…, seed=…`` — through hydra's compose API with an absolute config
directory (no working-directory change, no output folders). The retention design
and the certificate level δ are then taken from the frozen pre-registration's
analysis plan, so generation and analysis cannot disagree about them; a method config
that names ``design`` keys itself (the kvpress-matched ones, outside the
pre-registration) overrides those keys only.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from ..paths import configs_dir
from .plan import Run


def budget_option(budget: float) -> str:
    return "full" if float(budget) == 1.0 else f"b{float(budget):g}"


def run_overrides(experiment: str, model: str, task: str, run: Run) -> list[str]:
    overrides = [
        f"experiment={experiment}", f"model={model}", f"task={task}", f"method={run.method}",
        f"budget={budget_option(run.budget)}", f"condition={run.condition}", f"seed={run.seed}",
    ]
    if run.chunk_tokens is not None:
        overrides.append(f"chunk_tokens={run.chunk_tokens}")
    return overrides


def model_setting(config_dir: Path, name: str) -> dict:
    """configs/model/<name>.yaml with its interpolations (the model folder) resolved; {} if absent."""
    path = config_dir / "model" / f"{name}.yaml"
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True) if path.exists() else {}


def compose_config(overrides: list[str], config_dir: Path | None = None) -> dict:
    """The composed config as a plain dict (interpolations resolved)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    directory = str((config_dir or configs_dir()).resolve())
    try:
        with initialize_config_dir(config_dir=directory, version_base=None):
            cfg = compose(config_name="config", overrides=overrides)
    except HydraException as exc:
        raise ValueError(f"config: {str(exc).splitlines()[0]}") from None
    return OmegaConf.to_container(cfg, resolve=True)


def answer_tokens(task: dict, max_new_tokens: int | None = None) -> int:
    """The answer budget: ``max_new_tokens`` if given, else the task's (null: 32; a record's own,
    LongBench's per data set, still wins at generation). 0, a negative or a non-integer is refused."""
    value = max_new_tokens if max_new_tokens is not None else task.get("max_new_tokens")
    if value is None:
        return 32
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"task.max_new_tokens={value}: must be an integer >= 1 (or null: the task's default)")
    return value


def generation_config(composed: dict, analysis_plan: dict, max_new_tokens: int | None) -> dict:
    """The :class:`~kvcert.generation.spec.GenerationSpec` mapping of one composed run."""
    method = dict(composed["method"])
    if method.get("name") != "full":
        # the pre-registered design; a method config may override some of its keys (the
        # kvpress-matched configs protect what kvpress protects: no sinks, its own window)
        method["design"] = {**analysis_plan["design"], **dict(method.get("design") or {})}
    return {
        "model": dict(composed["model"]),
        "method": method,
        "condition": composed["condition"],
        "budget": float(composed["budget"]),
        "seed": int(composed["seed"]),
        "max_new_tokens": answer_tokens(composed["task"], max_new_tokens),
        "chunk_tokens": composed.get("chunk_tokens"),
        "certificate": {"delta": float(analysis_plan["delta"]),
                        "aggregations": list(composed["certificate"]["aggregations"])},
    }


def analysis_plan(prereg: str | Path) -> dict:
    """The frozen pre-registration's ``analysis_plan`` (:func:`kvcert.prereg.load_claims`)."""
    from ..prereg import load_claims

    return load_claims(prereg)["analysis_plan"]
