"""A run's generation config: hydra composition for ``kvcert run``'s overrides, and the one mapping
from a composed config to a generation config that the pipeline's typed jobs share.

:func:`compose_config` composes ``configs/config.yaml`` with overrides (``model=…, task=…,
method=…, condition=…, seed=…`` and dotted keys) through hydra's compose API with an absolute
config directory (no working-directory change, no output folders); a group option that does not
exist is refused with its group's options, a method name without a file is read by the method
grammar (:mod:`kvcert.config.methods`) and a RULER or LongBench task without one is the benchmark tables'
(:mod:`kvcert.config.task_table`). :func:`generation_config` turns a composed config (or the pipeline's
own reading of the same files, :mod:`kvcert.generation.jobs`) into a generation config: the retention
design and the certificate level δ are taken from the frozen pre-registration's analysis plan, so
generation and analysis cannot disagree about them; a method config that names ``design`` keys
itself (the kvpress-matched ones, outside the pre-registration) overrides those keys only.
"""

from __future__ import annotations

from contextlib import contextmanager
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
    """Refuse an option that neither a file of its group nor the benchmark tables provide
    (:func:`kvcert.config.task_table.group_options`), in one line with the nearest ones and the list; a
    method name without a file is read by the method grammar (:mod:`kvcert.config.methods`) instead."""
    import difflib

    from .methods import parse_method_name
    from .task_table import group_options

    for item in overrides:
        group, sep, option = item.partition("=")
        if not sep or group not in GROUPS:
            continue
        options = group_options(config_dir, group)
        if option in options:
            continue
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


@contextmanager
def _unfiled_nodes(overrides: list[str], config_dir: Path):
    """Give hydra (its config store), for one composition, the config of every ``method=<name>`` and
    ``task=<name>`` that has no file: the method grammar's (:func:`kvcert.config.methods.method_config`) and the
    benchmark tables' task config (:data:`kvcert.config.task_table.TASK_CONFIGS`, its interpolations resolved at
    composition), so these compose like a shipped file. They are taken out again afterwards: a node left in the
    store would be merged, as its schema, into a file of the same name that a later composition reads."""
    from hydra.core.config_store import ConfigStore

    from .methods import method_config
    from .task_table import TASK_CONFIGS

    store = ConfigStore.instance()
    stored = []
    for item in overrides:
        group, sep, option = item.partition("=")
        if not sep or group not in ("method", "task") or (config_dir / group / f"{option}.yaml").is_file():
            continue
        node = method_config(option, config_dir) if group == "method" else TASK_CONFIGS[option]
        store.store(group=group, name=option, node=node)
        stored.append((group, f"{option}.yaml"))
    try:
        yield
    finally:
        for group, name in stored:
            store.repo[group].pop(name, None)


def compose_config(overrides: list[str], config_dir: Path | None = None) -> dict:
    """The composed config as a plain dict (interpolations resolved). A group option that does not exist
    is refused with the group's options (:func:`check_group_options`)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    config_dir = (config_dir or configs_dir()).resolve()
    check_group_options(overrides, config_dir)
    try:
        with _unfiled_nodes(overrides, config_dir), \
                initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = compose(config_name="config", overrides=overrides)
            return OmegaConf.to_container(cfg, resolve=True)
    except HydraException as exc:
        raise ValueError(f"config: {str(exc).splitlines()[0]}") from None


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
