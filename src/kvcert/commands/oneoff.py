"""``kvcert run``: one-off generations from hydra-style overrides, outside the
pre-registration.

    kvcert run model.path=/ckpt task=longbench_hotpotqa method=snapkv-poisson budget=0.25 limit=20
    kvcert run task=needle,multikey method=snapkv-poisson,adakv-topk budget=0.125,0.25 limit=20
    kvcert run task=ruler model=smollm2-135m-instruct limit=20          # RULER's synthetic suite
    kvcert run task=ruler:niah_single_1,vt method=snapkv-poisson budget=0.25
    kvcert run --list

composes ``configs/config.yaml`` with the overrides (``model=…``, ``task=…``,
``method=…`` — a shipped config or any name of the method grammar, :mod:`kvcert.config.methods` —,
``condition=…``, ``seed=…``, or any dotted key such as ``model.path=…`` or
``model.dtype=…``), builds ``limit`` records of each task, and generates each with the full
cache and with every chosen setting into ``<out>/generations/<task>.jsonl`` (resumable, like a
shard). Comma-separated values of ``task``, ``method``, ``condition``, ``budget`` and
``compression_ratio`` sweep every combination (one full-cache baseline per task). It ends
with a table per (task, setting) — the share that passes (score ≥ the task's pass mark, as
the claims count it), the mean task score, the mean relative certificate ε/‖ô‖, each with a
90 % bootstrap interval over records, and the kept fraction — and writes
``<out>/results.json``: the command, the model and the content digest of its folder
(``model_digest``, as every record carries it; a fetched model's files are checked against their
pins before anything is built), the records' files, those metrics with their intervals,
and every composed generation config. ``task=ruler`` names RULER's synthetic suite (``task=ruler:a,b``
a part of it; :mod:`kvcert.tasks.ruler`), 4096 tokens unless ``length`` says otherwise; a run with
RULER's tasks also prints (and writes, ``ruler``) the table kvpress prints for RULER — each task's
string match × 100 and their average, per setting —, and a run with LongBench-E data sets
(``longbench_<name>_e``) their scores by LongBench-E's length buckets (0–4k, 4–8k, 8k+;
``longbench_e``), as LongBench's ``eval.py --e`` reports them. Keys of its own: ``budget`` (fraction
of the cache kept) or ``compression_ratio`` (kvpress's convention: the fraction *removed*; give exactly
one), ``limit``, ``length`` (prompt tokens: the task's default — 512 for synthetic tasks,
6144 for LongBench, LoCoMo's own), ``data_seed``, ``out``, ``threads`` (torch's threads; by default the CPUs
free now — those the process may use less the load average, :mod:`kvcert.threads` — which it names once
its inputs have passed their checks, before the model loads). Beside ``results.json`` it writes the same records as kvpress's evaluation writes a run
(``<out>/kvpress/<run>/``: ``predictions.csv``, ``metrics.json``, ``config.yaml``) and as lm-eval's
``--output_path … --log_samples`` does (``<out>/lm-eval/<setting>/<model>/``: ``results_<date>.json``,
``samples_<task>_<date>.jsonl``): :mod:`kvcert.commands.layouts`. ``results.json`` and the layouts are written
in a hidden folder of ``out`` and put in place together once all are complete, replacing an earlier run's into
the same ``out`` (:func:`kvcert.commands.layouts.publish`): a run killed before leaves nothing a reader takes
for a run.

The retention design and δ come from the pre-registration's analysis plan, as in the
pipeline. The records carry ``prereg_hash: null``: claim scoring refuses them — a
one-off run is exploration, not evidence.

Everything is checked before the model is loaded, one line each: every key (an unknown
one, or an unknown task, method or model, with the nearest known one; ``certificate.delta``,
which is the pre-registration's), every number (``budget``, ``limit``, ``seed``, …), the
``limit`` against the records each task offers (a data set's rows or items, a generated task's
registered maximum, :data:`kvcert.tasks.MAX_GENERATED`), the device, the length against the
model's positions (``max_position_embeddings`` of the folder's ``config.json``; :data:`LENGTH_CAP`
where it has none), each ``budget`` against the retention design's certainty set at that length
(:func:`check_budget`), the ``out`` folder (:func:`check_out`), and the tasks' data (built with
the tokenizer alone, a progress bar on stderr: UTF-8 files, text fields that are text, no lone
surrogate, prompts that fit); also ``threads`` (at most four times the machine's CPUs), a ``condition``
without a method, and a ``kvpress:<Press>`` scorer's press.
"""

from __future__ import annotations

import difflib
import json
import math
import sys
from datetime import datetime, timezone
from pathlib import Path

from .oneoff_summary import (BOOTSTRAP, format_table, longbench_e_buckets, longbench_e_tables, ruler_summary,
                             ruler_tables, summary_rows)

OWN_KEYS = ("budget", "compression_ratio", "limit", "length", "data_seed", "out", "threads")
#: keys whose comma-separated values sweep (every combination runs; one full-cache baseline per task)
SWEEP_KEYS = ("task", "method", "condition", "budget", "compression_ratio")
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
    """The kept fraction from ``budget`` or ``compression_ratio`` (one of the two), converted and checked as
    every generation's budget is (:func:`kvcert.generation.spec.generation_budget`); the full cache keeps 1."""
    from ..budget import kept_budget
    from ..generation.spec import generation_budget

    budget, ratio = _number(own.get("budget")), _number(own.get("compression_ratio"), "compression_ratio")
    if method_name == "full":
        kept_budget(budget, ratio)  # refuses both given; the full cache keeps everything whatever was given
        return 1.0
    if budget is None and ratio is None:
        raise ValueError("budget=<fraction kept> (or compression_ratio=<fraction removed>) is needed with a method")
    return float(generation_budget(budget, ratio))


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
    from ..config.digest import model_folder

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


def check_limit(limit: int, task_cfg: dict, built: int | None = None, given: bool = True) -> int:
    """The records to run: a ``limit`` the command named above the records the task offers (its rows, its
    items, a generated task's registered maximum: :meth:`kvcert.tasks.Task.capacity`) is refused in one line
    with the maximum; the default limit (``given`` False) is bounded by it instead. ``built``: the records a
    build gave, where the task could not tell beforehand (a Hub data set)."""
    from ..tasks import task_for_config

    name = task_cfg["name"]
    offer = task_for_config(task_cfg).capacity(task_cfg) if built is None else (built, "what its build gave")
    if offer is not None and limit > offer[0]:
        if not given:
            return offer[0]
        raise ValueError(f"limit={limit}: task {name} offers at most {offer[0]} records ({offer[1]}); "
                         f"give limit={offer[0]} or less")
    return limit


def check_out(out: Path) -> None:
    """Refuse, in one line naming it, an ``out`` folder the run cannot write: a file, a path under a file,
    a place where no folder can be made (read-only; probed by making and removing one in the nearest
    existing folder, so nothing is left behind)."""
    import os
    import tempfile

    remedy = "give out= a folder you can write, new or an earlier run's (e.g. out=results/runs/<name>)"
    for path in (out / "generations", out, *out.parents):
        if path.exists() and not path.is_dir():
            raise ValueError(f"out={out}: {path} is a file, not a folder; {remedy}")
    existing = next((p for p in (out, *out.parents) if p.is_dir()), Path("."))
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".kvcert-write-check-", dir=existing))
    except OSError as exc:
        raise ValueError(f"out={out}: cannot write in {existing} ({exc.strerror or exc}); {remedy}") from None


def _at_least(x: float, digits: int = 3) -> float:
    """``x`` rounded up to ``digits`` significant digits (a budget at least ``x``)."""
    scale = 10 ** (digits - 1 - math.floor(math.log10(x)))
    return math.ceil(x * scale - 1e-9) / scale


def check_budget(spec, length: int, at: str | None = None) -> None:
    """Refuse (``kvcert run``'s input check only) a budget that keeps fewer tokens at the run's prompt
    length than the retention design's certainty set — its sinks and recent window, kept whatever the
    budget — in one line with the set's size and the smallest budget that means anything at that length
    (``at``: how the message names the length; default ``length=<length>``)."""
    from ..checks import resolve_budget

    design = spec.method.design
    certain = design.sinks + design.window
    if spec.method.is_full or not length or not certain:
        return
    kept = resolve_budget(spec.budget, length, spec.method.rounding)
    if kept >= min(certain, length):
        return
    setting, at = f"budget={spec.budget:g} ({spec.method.name})", at or f"length={length}"
    certainty = (f"the retention design's certainty set ({certain} tokens: {design.sinks} sinks + "
                 f"{design.window} recent)")
    if certain >= length:
        raise ValueError(f"{setting}: at {at} {certainty} holds the whole prompt, so no budget "
                         f"compresses it; give length={certain + 1} or more")
    smallest = _at_least(certain / length)
    tokens = f"{kept} token{'s' if kept != 1 else ''}"
    raise ValueError(f"{setting}: at {at} it keeps {tokens}, fewer than {certainty}, which is "
                     f"always kept, so the budget means nothing; the smallest meaningful budget at {at} "
                     f"is {smallest:g}: give budget={smallest:g} or more (compression_ratio={1 - smallest:.6g} or "
                     "less), or a longer length")


def sweep(items: list[str]) -> list[list[str]]:
    """The override lists of every combination of the comma-separated values of :data:`SWEEP_KEYS`
    (``task=needle,multikey method=snapkv-poisson,h2o-topk budget=0.25,0.5``: 8 lists), in the
    order given; other items are kept as they are in each."""
    import itertools

    axes = []
    for item in items:
        key, sep, value = item.partition("=")
        if sep and key in SWEEP_KEYS and "," in value:
            values = [v.strip() for v in value.split(",")]
            if not all(values):
                raise ValueError(f"{item}: an empty value in the list (write {key}=a,b)")
            axes.append([f"{key}={v}" for v in values])
        else:
            axes.append([item])
    return [list(combo) for combo in itertools.product(*axes)]


def expand_tasks(items: list[str]) -> list[str]:
    """The override list with RULER's suite spelled out: ``task=ruler`` → every RULER task, ``task=ruler:a,b``
    → ``ruler_a``, ``ruler_b`` (:func:`kvcert.tasks.ruler.expand`); other items as they are."""
    from ..tasks.ruler import expand

    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if sep and key == "task" and "ruler" in value:
            item = "task=" + ",".join(expand([v.strip() for v in value.split(",")]))
        out.append(item)
    return out


def compose_setting(items: list[str], configs: Path) -> tuple[dict, dict]:
    """(the composed config of one setting, its own keys) from one override list (no sweep)."""
    from ..config.compose import compose_config

    hydra, own = parse_overrides(items)
    composed = compose_config(hydra, configs)
    seed = composed.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed={seed}: must be an integer (e.g. seed=0)")
    method = composed["method"]["name"]
    changed = [o.split("=", 1)[0].lstrip("+~") for o in hydra]
    if method != "full" and "method.name" not in changed and \
            any(k in changed for k in ("method.scorer", "method.sampler", "method.allocation")):
        from ..config.methods import method_name  # a method whose parts were overridden is named for what it is

        m = composed["method"]
        composed["method"]["name"] = method = method_name(str(m.get("scorer")), str(m.get("sampler")),
                                                          str(m.get("allocation", "uniform")))
    if method != "full" and not any(o.startswith("condition=") for o in hydra):
        composed["condition"] = "aware"  # a method without a condition: question-aware
    composed["budget"] = budget_of(own, method)
    if method == "full":
        composed["condition"] = "full"
    if any(o.startswith("model.path=") for o in hydra) and not any(o.startswith("model.name=") for o in hydra):
        composed["model"]["name"] = Path(str(composed["model"]["path"])).name or composed["model"]["name"]
    return composed, own


def check_registered_keys(items: list[str], plan, prereg: Path) -> None:
    """Refuse an override of the certificate level δ in one line: a run reads δ from the pre-registration
    (``analysis_plan.delta`` of its ``claims.yaml``, :func:`~kvcert.config.compose.generation_config`),
    as the pipeline does, so another δ is an amendment, not an override."""
    for item in items:
        key, _, value = item.partition("=")
        key = key.lstrip("+~")
        if key == "certificate.delta" or (key == "certificate" and "delta" in value):
            raise ValueError(
                f"{item}: δ is fixed by the pre-registration (analysis_plan.delta = {plan.delta} in "
                f"{Path(prereg) / 'claims.yaml'}, frozen with it), which generation and the analysis read; "
                "another δ is an amendment: edit analysis_plan.delta there and run "
                "`kvcert prereg freeze --reason '...'` (or give --prereg another pre-registration folder)")


def compose_run(items: list[str], configs: Path, prereg: Path) -> tuple[list[tuple[dict, list[dict]]], dict]:
    """(per task of the sweep (:func:`sweep`): its task config and its generation configs — the full cache
    first, then every setting of the sweep once —, the command's own keys); every setting is composed and
    checked before anything runs."""
    from ..config.compose import analysis_plan, generation_config

    plan = analysis_plan(prereg)
    items = expand_tasks(items)
    check_registered_keys(items, plan, prereg)
    tasks: dict[str, tuple[dict, list[dict]]] = {}
    own_keys: dict = {}
    for combo in sweep(items):
        composed, own = compose_setting(combo, configs)
        own_keys = {k: v for k, v in own.items() if k not in ("budget", "compression_ratio")}
        task_cfg = composed["task"]
        if task_cfg["name"] not in tasks:
            full = dict(composed, condition="full", budget=1.0, method={"name": "full"}, chunk_tokens=None)
            tasks[task_cfg["name"]] = (task_cfg, [generation_config(full, plan, None)])
        runs = tasks[task_cfg["name"]][1]
        setting = generation_config(composed, plan, None)
        if setting not in runs:
            runs.append(setting)
    check_condition_has_a_method(items, [c for _, runs in tasks.values() for c in runs])
    return list(tasks.values()), own_keys


def check_condition_has_a_method(items: list[str], settings: list[dict]) -> None:
    """Refuse, in one line, a ``condition`` other than ``full`` given where no setting has a method: the full cache
    alone has no condition, and ``condition=streaming`` would run it unchanged (it used to, rc 0)."""
    given = [v.strip() for item in items if item.lstrip("+~").startswith("condition=")
             for v in item.partition("=")[2].split(",")]
    asked = [c for c in given if c != "full"]
    if asked and all(c["method"]["name"] == "full" for c in settings):
        raise ValueError(f"condition={','.join(asked)}: no method to compress with, and the full cache alone has "
                         "no condition (it would run unchanged); give a method with it (e.g. method=snapkv-poisson "
                         "budget=0.25), or leave condition out")


def check_presses(specs) -> None:
    """Refuse, in one line, a ``kvpress:<Press>`` scorer that names no kvpress ScorerPress (a mistyped press), or
    kvpress missing, before the model loads (the scorer is otherwise built only with the model)."""
    from ..config.names import KVPRESS_PREFIX

    for spec in specs:
        scorer = spec.method.scorer
        if isinstance(scorer, str) and scorer.startswith(KVPRESS_PREFIX):
            from ..method.scorers.kvpress_scorer import press_class

            press_class(scorer)


def listing(configs: Path) -> str:
    """``kvcert run --list``: the tasks, methods, models and conditions a run can name."""
    from ..config.methods import GRAMMAR, shipped_methods
    from ..config.task_table import group_options
    from ..generation.jobs import config_file
    from ..tasks.ruler import RULER_TASKS

    tasks = [f"{name} ({config_file(configs, 'task', name).get('kind', 'synthetic')})"
             for name in group_options(configs, "task")]
    return "\n".join([
        f"tasks ({configs / 'task'}): " + ", ".join(tasks),
        f"methods ({configs / 'method'}): " + ", ".join(shipped_methods(configs)),
        f"  any other method name of the grammar {GRAMMAR}",
        f"models ({configs / 'model'}): " + ", ".join(group_options(configs, "model")) + "; or model.path=<a local checkpoint folder>",
        "conditions: aware (compressed after the question; the default with a method), streaming "
        "(compressed before it: kvpress's order), full",
        "sweeps: comma-separated values of " + ", ".join(SWEEP_KEYS) + " run every combination",
        "RULER: task=ruler runs RULER's synthetic suite (" + ", ".join(RULER_TASKS) + "; at 4096 tokens unless "
        "length= says otherwise), task=ruler:niah_single_1,vt a part of it; each task is also ruler_<name>",
    ])


def build_progress(task: str, enabled: bool):
    """The progress display's factory of one task's build (:meth:`kvcert.tasks.Task.build`): a bar on
    stderr while its prompts are built (the tokenizer fits each to its length), or None when quiet."""
    from ..progress import progress

    return (lambda total: progress(total, f"build {task} prompts", "records")) if enabled else None


def run_command(args) -> int:
    from ..analysis.load import ScoringPlan
    from ..atomic import write_text
    from ..generation.runner import run_specs
    from ..generation.shards import read_records
    from ..generation.spec import GenerationSpec
    from ..method.models import ModelSpec, load_model, pick_device
    from ..config.paths import resolve_configs, resolve_prereg
    from ..tasks import task_for_config
    from ..config.compose import analysis_plan
    from ..generation.manifest import load_tokenizer
    from ..tasks.lengths import LengthError
    from .. import __version__
    from ..provenance import git_commit
    from .layouts import publish, staging_folder, write_layouts

    configs = resolve_configs(args.configs)
    if getattr(args, "list", False):
        print(listing(configs))
        return 0
    prereg = resolve_prereg(args.prereg)
    per_task, own = compose_run(args.overrides, configs, prereg)
    length_given = integer(own, "length", None, 0)
    limit = integer(own, "limit", 10, 1)
    data_seed = integer(own, "data_seed", 0, 0)
    threads = integer(own, "threads", None, 1)
    if threads is not None:
        from ..threads import choose_threads

        choose_threads(threads)  # at most four times the machine's CPUs (kvcert.threads.most_threads), refused here
    plan = []  # (task config, its specs, its length), every config error before anything loads
    limits = {}  # the records each task runs: the limit, bounded by what the task offers
    for task_cfg, gen_configs in per_task:
        specs = [GenerationSpec.from_dict(c) for c in gen_configs]
        check_presses(specs)
        plan.append((task_cfg, gen_configs, specs))
        limits[task_cfg["name"]] = check_limit(limit, task_cfg, given="limit" in own)
    first = plan[0][1][-1]
    model_spec = ModelSpec(**{k: first["model"][k] for k in ("name", "path", "dtype", "device")})
    device = pick_device(model_spec.device)
    positions = max_positions(model_spec.path)
    lengths = {}
    for task_cfg, _, specs in plan:
        answer = max(s.max_new_tokens for s in specs)
        length = length_given
        if length is None:  # the task's default, within the model's positions
            length = task_for_config(task_cfg).default_length
            length = length if positions is None or not length else max(1, min(length, positions - answer))
        check_length(length, answer, model_spec.path)
        for spec in specs if task_for_config(task_cfg).default_length else []:  # a native-length task: once built
            check_budget(spec, length)
        lengths[task_cfg["name"]] = (length, answer)
    from ..threads import set_threads

    choice = set_threads(threads)  # the CPUs free now, unless threads= says (kvcert.threads)
    started = datetime.now(timezone.utc)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    names = [t["name"] for t, _, _ in plan]
    methods = sorted({c["method"]["name"] for _, cs, _ in plan for c in cs[1:]}) or ["full"]
    out = Path(own.get("out") or f"results/runs/{stamp}-{'+'.join(names)}-{'+'.join(methods)}")
    check_out(out)
    tokenizer = load_tokenizer(first["model"])
    built = {}
    for task_cfg, _, specs in plan:  # the data of every task, checked before the model loads
        length, answer = lengths[task_cfg["name"]]
        try:
            records = task_for_config(task_cfg).build(
                task_cfg, tokenizer, length, limits[task_cfg["name"]], data_seed,
                progress=build_progress(task_cfg["name"], not args.quiet))
        except LengthError as exc:  # the length it advises must fit the model, or the advice is another one
            if positions is not None and exc.needed + answer > positions:
                raise ValueError(exc.beyond(positions, answer, model_spec.path)) from None
            raise
        if not records:
            raise ValueError(f"task {task_cfg['name']}: no records")
        check_limit(limits[task_cfg["name"]], task_cfg, built=len(records), given="limit" in own)
        longest = max(r.length for r in records)
        for spec in specs if not task_for_config(task_cfg).default_length else []:  # the prompts' own length
            check_budget(spec, longest, f"the longest prompt ({longest} tokens)")
        for r in records:  # the built prompt (chat template included) and its own answer budget must fit
            need = r.length + int(r.metadata.get("max_new_tokens") or answer)
            if positions is not None and need > positions:
                raise ValueError(f"length={length}: record {r.id} needs {need} positions (prompt {r.length} + answer), "
                                 f"the model has {positions}; give a shorter length")
        built[task_cfg["name"]] = records
    if not args.quiet:  # named once every input has passed its checks: a refused run prints its one-line error alone
        print(f"kvcert run: {choice.line}", file=sys.stderr, flush=True)
        print(f"loading the model {model_spec.path}", file=sys.stderr, flush=True)
    model, tokenizer = load_model(model_spec)  # a fetched model's folder is checked against its pins here
    from ..config.digest import content_digest

    digest = content_digest(model_spec.path)
    shards, records_out = {}, []
    for task_cfg, _, specs in plan:
        name = task_cfg["name"]
        shard = run_specs(specs, built[name], out / "generations" / f"{name}.jsonl", prereg_hash=None,
                          model_and_tokenizer=(model, tokenizer), progress=not args.quiet)
        shards[name] = str(shard)
        records_out += read_records(shard)
    marks = ScoringPlan.from_plan(analysis_plan(prereg))
    rows = summary_rows(records_out, marks.pass_mark)
    results = {
        "command": "kvcert run " + " ".join(args.overrides),
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "outside_preregistration": True,
        "model": first["model"],
        "model_digest": digest,
        "tasks": {name: {"length": lengths[name][0], "records": len(built[name]), "generations": shards[name]}
                  for name in names},
        "bootstrap": BOOTSTRAP,
        "metrics": rows,
        **({"ruler": ruler} if (ruler := ruler_summary(records_out)) else {}),
        **({"longbench_e": by_length} if (by_length := longbench_e_buckets(records_out)) else {}),
        "configs": [c for _, cs, _ in plan for c in cs],
    }
    staging = staging_folder(out)  # results.json and the layouts, put in place together once all are written
    layouts = write_layouts(
        out, records_out,
        {name: {"records": {r.id: r for r in built[name]}, "length": lengths[name][0], "max_new_tokens": lengths[name][1],
                "offered": len(built[name])} for name in names},
        first["model"]["name"], str(first["model"]["path"]), marks.pass_mark,
        {"command": results["command"], "device": str(device), "output_dir": str(out / "kvpress"),
         "limit": limit, "data_seed": data_seed, "threads": choice.threads, "created_utc": results["created_utc"],
         "model_digest": digest, "kvcert_version": __version__, "git_commit": git_commit(),
         "outside_preregistration": True, "results": str(out / "results.json")},
        started, into=staging)
    results["threads"] = {"count": choice.threads, "why": choice.line}
    results["layouts"] = layouts
    write_text(staging / "results.json", json.dumps(results, indent=2, sort_keys=False, default=str) + "\n")
    publish(out, staging)
    print(f"model {first['model']['name']}; " + "; ".join(
        f"{name}: {len(built[name])} records at {lengths[name][0] or 'native'} tokens" for name in names)
        + f"; {choice.threads} thread{'s' if choice.threads != 1 else ''}"
        + "; one-off run outside the pre-registration (claims never score it)")
    print(format_table(rows))
    for table in (ruler_tables(records_out), longbench_e_tables(records_out)):
        if table:
            print(table)
    took = int((datetime.now(timezone.utc) - started).total_seconds())
    settings = len({Path(p).parent.parent for p in layouts["lm_eval"]})
    print(f"results ({took // 60} min {took % 60} s): {out / 'results.json'} (records, metrics with intervals, the "
          f"composed configs)\n  as kvpress's evaluation writes them: {out / 'kvpress'}/ ({len(layouts['kvpress'])} "
          f"folders: predictions.csv, metrics.json, config.yaml)\n  as lm-eval's --output_path --log_samples writes "
          f"them: {out / 'lm-eval'}/ ({settings} settings: results_<date>.json, samples_<task>_<date>.jsonl)")
    return 0
