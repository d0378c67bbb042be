"""A run's generation config: hydra composition for ``kvcert run``'s overrides, and the one mapping
from a composed config to a generation config that the pipeline's typed jobs share.

:func:`compose_config` composes ``configs/config.yaml`` with overrides (``model=…, task=…,
method=…, condition=…, seed=…`` and dotted keys) through hydra's compose API with an absolute
config directory (no working-directory change, no output folders); a group option that does not
exist is refused with its group's options, and a method name without a file is read by the method
grammar (:mod:`kvcert.config.methods`). :func:`generation_config` turns a composed config (or the pipeline's
own reading of the same files, :mod:`kvcert.generation.jobs`) into a generation config: the retention
design and the certificate level δ are taken from the frozen pre-registration's analysis plan, so
generation and analysis cannot disagree about them; a method config that names ``design`` keys
itself (the kvpress-matched ones, outside the pre-registration) overrides those keys only.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from .analysis_plan import AnalysisPlan
from .paths import configs_dir


def model_setting(config_dir: Path, name: str) -> dict:
    """configs/model/<name>.yaml with its interpolations (the model folder) resolved; {} if absent."""
    path = config_dir / "model" / f"{name}.yaml"
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True) if path.exists() else {}


#: the config groups a run composes (configs/<group>/<option>.yaml)
GROUPS = ("experiment", "model", "task", "method")


def check_group_options(overrides: list[str], config_dir: Path) -> None:
    """Refuse an option no file of its group provides, in one line with the nearest ones and the list; a
    method name without a file is read by the method grammar (:mod:`kvcert.config.methods`) instead."""
    import difflib

    from .methods import GRAMMAR, parse_method_name

    for item in overrides:
        group, sep, option = item.partition("=")
        if not sep or group not in GROUPS or (config_dir / group / f"{option}.yaml").is_file():
            continue
        options = sorted(p.stem for p in (config_dir / group).glob("*.yaml"))
        if group == "method":
            try:
                parse_method_name(option)
                continue
            except ValueError as exc:
                reason = f"{exc}; shipped: {', '.join(options)}"
        else:
            reason = f"no {group} config named {option!r}; the {group}s: {', '.join(options)}"
        close = difflib.get_close_matches(option, options, n=1)
        hint = f" (did you mean {group}={close[0]}?)" if close else ""
        raise ValueError(f"{item}:{hint} {reason}")


def _store_named_methods(overrides: list[str], config_dir: Path) -> None:
    """Give hydra the grammar's method config of every ``method=<name>`` that has no file (hydra's config
    store, group ``method``), so a grammar name composes like a shipped one."""
    from hydra.core.config_store import ConfigStore

    from .methods import method_config

    for item in overrides:
        group, sep, option = item.partition("=")
        if group == "method" and sep and not (config_dir / "method" / f"{option}.yaml").is_file():
            ConfigStore.instance().store(group="method", name=option, node=method_config(option, config_dir))


def compose_config(overrides: list[str], config_dir: Path | None = None) -> dict:
    """The composed config as a plain dict (interpolations resolved). A group option that does not exist
    is refused with the group's options (:func:`check_group_options`)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    config_dir = (config_dir or configs_dir()).resolve()
    check_group_options(overrides, config_dir)
    _store_named_methods(overrides, config_dir)
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
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


def generation_config(composed: dict, analysis_plan: "AnalysisPlan", max_new_tokens: int | None) -> dict:
    """The :class:`~kvcert.generation.spec.GenerationSpec` mapping of one composed run (the design and δ of the
    typed ``analysis_plan``, :class:`kvcert.config.analysis_plan.AnalysisPlan`)."""
    analysis_plan = AnalysisPlan.of(analysis_plan)
    method = dict(composed["method"])
    if method.get("name") != "full":
        # the pre-registered design; a method config may override some of its keys (the
        # kvpress-matched configs protect what kvpress protects: no sinks, its own window)
        method["design"] = {**analysis_plan.design, **dict(method.get("design") or {})}
    from .sources import model_run_settings

    return {
        "model": model_run_settings(composed["model"]),  # a fetched model's pins (files:) are its content's
        "method": method,
        "condition": composed["condition"],
        "budget": float(composed["budget"]),
        "seed": int(composed["seed"]),
        "max_new_tokens": answer_tokens(composed["task"], max_new_tokens),
        "chunk_tokens": composed.get("chunk_tokens"),
        "certificate": {"delta": analysis_plan.delta,
                        "aggregations": list(composed["certificate"]["aggregations"])},
    }


def analysis_plan(prereg: str | Path) -> AnalysisPlan:
    """The frozen pre-registration's typed ``analysis_plan`` (:func:`kvcert.config.prereg.load_plan`)."""
    from .prereg import load_plan

    return load_plan(prereg)
