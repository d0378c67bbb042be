"""Pre-flight check of an experiment: what would fail on the cluster, found in seconds.

:func:`preflight` returns one line per problem (empty: ready):

- the pre-registration: frozen, and unchanged since its newest freeze;
- every model of the grid: its configured path is a local model directory with a
  config, weights and a tokenizer that load (``AutoConfig`` / ``AutoTokenizer`` only:
  no weights are read), or a Hub id ``hf:owner/name`` on a machine that may go online;
- every data set of the grid (LongBench folders, the LoCoMo file): present, with the
  files the loader looks for;
- a Snakemake profile, when one is given: no ``REPLACE_WITH_...`` placeholder left, and
  the GPU type it asks for among the cluster's GPU resources (when ``sinfo`` answers).

``kvcert check --experiment NAME [--profile DIR]`` prints the lines; the Snakefile runs
the same check when it is loaded, so ``snakemake -n`` fails on them at once.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from ..sources import SourceError, hub_id

PLACEHOLDER = re.compile(r"REPLACE_WITH_[A-Z_]+")
WEIGHTS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def check_model(name: str, path: str) -> list[str]:
    """Problems of one model config (``name``: its config, ``path``: the resolved path)."""
    from ..models import EMBEDDED, resolve_model_path

    try:
        resolved = resolve_model_path(path)
    except FileNotFoundError as exc:
        return [f"model {name}: {_strip(str(exc), 'model.path: ')}"]
    if path == EMBEDDED or hub_id(path) is not None:
        return []
    folder = Path(resolved)
    problems = []
    if not any(next(folder.glob(pattern), None) for pattern in WEIGHTS):
        problems.append(f"model {name}: {path} has no weights (*.safetensors or *.bin)")
    if not any((folder / f).exists() for f in TOKENIZER_FILES):
        problems.append(f"model {name}: {path} has no tokenizer files ({', '.join(TOKENIZER_FILES)})")
    if problems:
        return problems
    try:
        from transformers import AutoConfig, AutoTokenizer

        AutoConfig.from_pretrained(folder)
        AutoTokenizer.from_pretrained(folder)
    except Exception as exc:  # a broken folder: name the first line of the library's reason
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return [f"model {name}: {path} does not load ({type(exc).__name__}: {first})"]
    return []


def check_task(task_cfg: dict) -> list[str]:
    """Problems of one task config's data (synthetic tasks need none)."""
    kind = task_cfg.get("kind", "synthetic")
    name = task_cfg.get("name", "?")
    try:
        if kind == "longbench":
            from ..tasks.longbench import _local_files

            source = str(task_cfg["source"])
            if hub_id(source) is not None:
                return []
            folder = Path(source).expanduser()
            if folder.is_file():
                return []
            if not folder.is_dir():
                from ..sources import missing

                raise missing("longbench", source, "does not exist (a folder of LongBench v1 files was expected)")
            if not _local_files(folder, task_cfg["dataset"], "test"):
                return [f"task {name}: {source} has no {task_cfg['dataset']}.jsonl (nor Parquet files of it)"]
        elif kind == "locomo":
            source = str(task_cfg["source"])
            if not Path(source).expanduser().is_file():
                from ..sources import missing

                raise missing("locomo", source, "does not exist (LoCoMo's locomo10.json was expected)")
    except SourceError as exc:
        return [f"task {name}: {_strip(str(exc), kind + ': ')}"]
    return []


def _strip(message: str, prefix: str) -> str:
    return message[len(prefix):] if message.startswith(prefix) else message


def check_profile(profile: str | Path, experiment_rules: tuple[str, ...] = ("generate", "replay")) -> list[str]:
    """Problems of a Snakemake profile: placeholders left, a GPU type the cluster lacks."""
    folder = Path(profile)
    config = folder / "config.yaml" if folder.is_dir() else folder
    if not config.is_file():
        return [f"profile {profile}: no config.yaml"]
    text = config.read_text()
    problems = []
    for number, line in enumerate(text.splitlines(), start=1):
        code = line.split("#", 1)[0]
        for placeholder in PLACEHOLDER.findall(code):
            key = code.split(":", 1)[0].strip()
            problems.append(f"profile {config}:{number}: {key} is still {placeholder}; set it for your cluster "
                            "(see README, Running on a cluster)")
    data = yaml.safe_load(text) or {}
    wanted = {str(res["gpu_model"]) for rule, res in (data.get("set-resources") or {}).items()
              if rule in experiment_rules and isinstance(res, dict) and res.get("gpu_model")
              and not PLACEHOLDER.search(str(res["gpu_model"]))}
    known = cluster_gpu_types()
    for gpu in sorted(wanted):
        if known is not None and gpu not in known:
            problems.append(f"profile {config}: gpu_model {gpu!r} is not among this cluster's GPU types "
                            f"({', '.join(sorted(known)) or 'none'}; from sinfo -o %G)")
    return problems


def cluster_gpu_types() -> set[str] | None:
    """GPU types in the cluster's generic resources (``gpu:TYPE:N``); None without sinfo."""
    if shutil.which("sinfo") is None:
        return None
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%G"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    types = set()
    for gres in out.split():
        for item in gres.split(","):
            parts = item.split("(")[0].split(":")
            if parts[0] == "gpu" and len(parts) >= 3:
                types.add(parts[1])
    return types


def preflight(experiment: str, prereg: str | Path, configs: Path, profile: str | Path | None = None) -> list[str]:
    """Every problem of ``experiment`` that would stop a run, one line each."""
    from ..prereg import PreregError, verify
    from .compose import compose_config
    from .config import experiment_grid
    from .plan import build_plan

    problems: list[str] = []
    try:
        verify(prereg)
    except PreregError as exc:
        problems.append(f"pre-registration: {exc}")
    plan = build_plan(experiment, experiment_grid(experiment, configs, prereg)[1])
    models = sorted({m.model for m in plan.manifests + plan.replays})
    tasks = sorted({m.task for m in plan.manifests + plan.replays})
    for model in models:
        cfg = compose_config([f"experiment={experiment}", f"model={model}"], configs)["model"]
        problems += check_model(model, str(cfg["path"]))
    for task in tasks:
        cfg = compose_config([f"experiment={experiment}", f"task={task}"], configs)["task"]
        problems += check_task(cfg)
    if profile is not None:
        problems += check_profile(profile)
    return problems


def profile_from_argv(argv: list[str]) -> str | None:
    """The ``--profile`` a Snakemake command line names (``--profile X`` or ``--profile=X``)."""
    for index, arg in enumerate(argv):
        if arg == "--profile" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--profile="):
            return arg.split("=", 1)[1]
    return None
