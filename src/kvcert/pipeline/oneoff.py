"""``kvcert run``: one-off generations from hydra-style overrides, outside the
pre-registration.

    kvcert run model.path=/ckpt task=longbench_hotpotqa method=snapkv-poisson budget=0.25 limit=20

composes ``configs/config.yaml`` with the overrides (``model=…``, ``task=…``,
``method=…``, ``condition=…``, ``seed=…``, or any dotted key such as ``model.path=…``
or ``model.dtype=…``), builds ``limit`` records of the task, and generates each with
the full cache and with the chosen setting into ``<out>/generations.jsonl``
(resumable, like a shard). It ends with a table: accuracy, mean score, mean relative
certificate, kept fraction. Keys of its own: ``budget`` (fraction of the cache kept)
or ``compression_ratio`` (kvpress's convention: the fraction *removed*; give exactly
one), ``limit``, ``length`` (prompt tokens: synthetic tasks' target, LongBench's
truncation; default 512 and 6144), ``data_seed``, ``out``, ``threads``.

The retention design and δ come from the pre-registration's analysis plan, as in the
pipeline. The records carry ``prereg_hash: null``: claim scoring refuses them — a
one-off run is exploration, not evidence.

Everything is checked before the model is loaded, one line each: every key (an unknown
one with the nearest known key), every number (``budget``, ``limit``, ``seed``, …), the
device, the length against the model's positions (``max_position_embeddings`` of the
folder's ``config.json``; :data:`LENGTH_CAP` where it has none), and the task's data
(text fields that are text, no lone surrogate).
"""

from __future__ import annotations

import difflib
import json
import math
from datetime import datetime, timezone
from pathlib import Path

OWN_KEYS = ("budget", "compression_ratio", "limit", "length", "data_seed", "out", "threads")
#: the config's own top-level keys and groups (configs/config.yaml)
CONFIG_KEYS = ("experiment", "model", "task", "method", "condition", "seed", "chunk_tokens", "certificate")
#: the longest prompt accepted where the model's config names no position limit
LENGTH_CAP = 1 << 20


def parse_overrides(items: list[str]) -> tuple[list[str], dict[str, str]]:
    """Split ``key=value`` items into hydra overrides and this command's own keys."""
    hydra, own = [], {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"{item!r}: overrides are key=value (e.g. task=needle budget=0.25)")
        key, value = item.split("=", 1)
        if key in OWN_KEYS:
            own[key] = value
            continue
        root = key.lstrip("+~").split(".", 1)[0]
        if root not in CONFIG_KEYS:
            known = sorted(OWN_KEYS + CONFIG_KEYS)
            close = difflib.get_close_matches(root, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{item}: unknown key {root!r}{hint}; keys: {', '.join(known)} "
                             "(and dotted keys of the groups, e.g. model.path=...)")
        hydra.append(item)
    return hydra, own


def budget_of(own: dict[str, str], method_name: str) -> float:
    """The kept fraction from ``budget`` or ``compression_ratio`` (one of the two)."""
    from ..checks import kept_budget

    if method_name == "full":
        if "budget" in own or "compression_ratio" in own:
            kept_budget(_number(own.get("budget")), _number(own.get("compression_ratio"), "compression_ratio"))
        return 1.0
    budget = kept_budget(_number(own.get("budget")), _number(own.get("compression_ratio"), "compression_ratio"))
    if budget is None:
        raise ValueError("budget=<fraction kept> (or compression_ratio=<fraction removed>) is needed with a method")
    if not 0.0 < budget <= 1.0:
        raise ValueError(f"budget: the fraction kept must lie in (0, 1], got {budget}")
    return budget


def _number(text: str | None, name: str = "budget") -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name}={text}: must be a number (e.g. {name}=0.25)") from None


def integer(own: dict[str, str], name: str, default: int | None, minimum: int) -> int | None:
    """``own[name]`` as an integer ≥ ``minimum`` (``default`` when not given), refused in one line naming it."""
    text = own.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name}={text}: must be an integer (e.g. {name}={max(minimum, 1)})") from None
    if value < minimum:
        raise ValueError(f"{name}={text}: must be at least {minimum}")
    return value


def max_positions(model_path: str) -> int | None:
    """The model's position limit from its folder's ``config.json`` (its text config's
    ``max_position_embeddings``, or ``n_positions`` / ``max_sequence_length`` / ``seq_length``);
    None where it names none (a Hub id, another layout). Reads no weights."""
    from .digest import model_folder

    folder = model_folder(model_path)
    if folder is None or not (folder / "config.json").is_file():
        return None
    try:
        config = json.loads((folder / "config.json").read_text())
    except ValueError:
        return None
    for section in (config.get("text_config") or {}, config):
        for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
            if isinstance(section.get(key), int) and not isinstance(section.get(key), bool):
                return int(section[key])
    return None


def check_length(length: int, answer_tokens: int, model_path: str) -> None:
    """Refuse a prompt length the model cannot hold with its answer (before anything is built)."""
    limit = max_positions(model_path)
    if limit is None:
        if length > LENGTH_CAP:
            raise ValueError(f"length={length}: above {LENGTH_CAP} tokens, and {model_path} names no position "
                             "limit to allow it; give a shorter length")
        return
    if length + answer_tokens > limit:
        raise ValueError(f"length={length}: with the {answer_tokens}-token answer it exceeds the model's "
                         f"{limit} positions (max_position_embeddings of {model_path}); give length="
                         f"{max(limit - answer_tokens, 0)} or less")


def compose_run(items: list[str], configs: Path, prereg: Path) -> tuple[list[dict], dict, dict]:
    """(generation configs: full cache + the chosen setting, task config, own keys)."""
    from .compose import analysis_plan, compose_config, generation_config

    hydra, own = parse_overrides(items)
    composed = compose_config(hydra, configs)
    seed = composed.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed={seed}: must be an integer (e.g. seed=0)")
    method = composed["method"]["name"]
    if method != "full" and not any(o.startswith("condition=") for o in hydra):
        composed["condition"] = "aware"  # a method without a condition: question-aware
    composed["budget"] = budget_of(own, method)
    if method == "full":
        composed["condition"] = "full"
    if any(o.startswith("model.path=") for o in hydra) and not any(o.startswith("model.name=") for o in hydra):
        composed["model"]["name"] = Path(str(composed["model"]["path"])).name or composed["model"]["name"]
    plan = analysis_plan(prereg)
    setting = generation_config(composed, plan, None)
    configs_out = [setting]
    if method != "full":
        full = dict(composed, condition="full", budget=1.0, method={"name": "full"}, chunk_tokens=None)
        configs_out.insert(0, generation_config(full, plan, None))
    return configs_out, composed["task"], own


def summary_rows(records: list[dict]) -> list[dict]:
    """Per setting: records, accuracy (score ≥ the synthetic pass mark), mean score, mean
    relative certificate (over steps, mean over heads), kept fraction."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["condition"], r["method"], r["budget"]), []).append(r)
    rows = []
    for (condition, method, budget), group in groups.items():
        scores = [r["score"] for r in group if r["score"] is not None]
        certs = []
        for r in group:
            steps = (r.get("certificate") or {}).get("relative_steps", {}).get("mean") or []
            if steps:
                certs.append(sum(steps) / len(steps))
        rows.append({
            "condition": condition, "method": method, "budget": budget, "records": len(group),
            "accuracy": sum(s >= 1.0 for s in scores) / len(scores) if scores else math.nan,
            "score": sum(scores) / len(scores) if scores else math.nan,
            "certificate": sum(certs) / len(certs) if certs else math.nan,
            "kept": sum(_mean(r["kept_fraction"]) for r in group) / len(group),
        })
    return rows


def _mean(per_layer) -> float:
    """A record's kept fraction (per layer) as one number: the mean over layers."""
    if isinstance(per_layer, (int, float)):
        return float(per_layer)
    return sum(per_layer) / len(per_layer) if per_layer else 1.0


def format_table(rows: list[dict]) -> str:
    head = f"{'condition':<10} {'method':<18} {'budget':>6} {'records':>7} {'accuracy':>8} {'score':>6} " \
           f"{'certificate':>11} {'kept':>6}"
    lines = [head]
    for r in rows:
        cert = "-" if math.isnan(r["certificate"]) else f"{r['certificate']:.4f}"
        lines.append(f"{r['condition']:<10} {r['method']:<18} {r['budget']:>6.3g} {r['records']:>7} "
                     f"{r['accuracy']:>8.3f} {r['score']:>6.3f} {cert:>11} {r['kept']:>6.3f}")
    return "\n".join(lines)


def run_command(args) -> int:
    from ..generation.runner import run_specs
    from ..generation.shards import read_records
    from ..generation.spec import GenerationSpec
    from ..models import ModelSpec, load_model, pick_device
    from ..paths import configs_dir, prereg_dir
    from ..tasks import task_for_config
    from .manifest import build_records, load_tokenizer

    configs = Path(args.configs).resolve() if args.configs else configs_dir()
    prereg = Path(args.prereg) if args.prereg else prereg_dir()
    gen_configs, task_cfg, own = compose_run(args.overrides, configs, prereg)
    task = task_for_config(task_cfg)
    length = integer(own, "length", None, 0)
    limit = integer(own, "limit", 10, 1)
    data_seed = integer(own, "data_seed", 0, 0)
    threads = integer(own, "threads", None, 1)
    specs = [GenerationSpec.from_dict(c) for c in gen_configs]  # every config error before anything loads
    setting = gen_configs[-1]
    model_spec = ModelSpec(**{k: setting["model"][k] for k in ("name", "path", "dtype", "device")})
    pick_device(model_spec.device)
    answer = max(s.max_new_tokens for s in specs)
    if length is None:  # the default, within the model's positions
        positions = max_positions(model_spec.path)
        length = task.default_length
        length = length if positions is None or not length else max(1, min(length, positions - answer))
    check_length(length, answer, model_spec.path)
    if threads:
        import torch

        torch.set_num_threads(threads)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(own.get("out") or f"results/runs/{stamp}-{task_cfg['name']}-{setting['method']['name']}-"
               f"{setting['condition']}-b{setting['budget']:g}")
    records = build_records(task_cfg, load_tokenizer(setting["model"]), length, limit, data_seed)
    if not records:
        raise ValueError(f"task {task_cfg['name']}: no records")
    positions = max_positions(model_spec.path)
    for r in records:  # the built prompt (chat template included) and its own answer budget must fit
        need = r.length + int(r.metadata.get("max_new_tokens") or answer)
        if positions is not None and need > positions:
            raise ValueError(f"length={length}: record {r.id} needs {need} positions (prompt {r.length} + answer), "
                             f"the model has {positions}; give a shorter length")
    model, tokenizer = load_model(model_spec)
    shard = run_specs(gen_configs, records, out / "generations.jsonl", prereg_hash=None,
                      model_and_tokenizer=(model, tokenizer), progress=not args.quiet)
    rows = summary_rows(read_records(shard))
    print(f"{len(records)} records of {task_cfg['name']} ({length or 'native'} tokens), model "
          f"{setting['model']['name']}; one-off run outside the pre-registration (claims never score it)")
    print(format_table(rows))
    print(f"records: {shard}")
    return 0
