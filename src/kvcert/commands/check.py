"""Pre-flight check of an experiment: what would fail on the cluster, found in seconds.

:func:`preflight` returns one line per problem (empty: ready):

- the pre-registration: frozen, and unchanged since its newest freeze;
- every model of the grid: its configured path is a local model directory with a
  config, weights and a tokenizer that load (``AutoConfig`` / ``AutoTokenizer`` only:
  no weights are read), or a Hub id ``hf:owner/name`` on a machine that may go online;
  with ``forward=True`` (``kvcert check``; not the Snakefile's check at every start) each
  model is also loaded once and runs one token, and NaN or ±inf logits are refused;
- the results folder: writable (a Snakemake ``OSError`` half a minute in otherwise);
- every data set of the grid (LongBench folders, the LoCoMo file): present, with the
  files the loader looks for;
- a Snakemake profile, when one is given: no ``REPLACE_WITH_...`` placeholder left, and
  the GPU type it asks for among the cluster's GPU resources (when ``sinfo`` answers).

``kvcert check --experiment NAME [--profile DIR]`` prints the lines; the Snakefile runs
the same check when it is loaded, so ``snakemake -n`` fails on them at once.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from ..config.sources import fetched_name, hub_id

PLACEHOLDER = re.compile(r"REPLACE_WITH_[A-Z_]+")
WEIGHTS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def check_model(name: str, cfg: dict, chat: bool = False, longest: tuple[int, str] | None = None) -> list[str]:
    """Problems of one model config (``name``; ``cfg``: its composed ``model`` section) that would stop its
    jobs: a dtype that is not a torch dtype name, a missing or broken folder (config, weights, a tokenizer
    that loads), no chat template where the grid's prompts go through one (``chat``), and fewer positions
    than the grid's longest prompt with its answer (``longest``: (tokens, what needs them))."""
    from ..config.sources import DTYPE_NAMES as DTYPES, EMBEDDED, resolve_model_path
    from .oneoff import max_positions

    path = str(cfg["path"])
    problems = []
    dtype = cfg.get("dtype", "float32")
    if dtype not in DTYPES:
        problems.append(f"model {name}: dtype {dtype!r} is not one of {', '.join(sorted(DTYPES))} "
                        f"(configs/model/{name}.yaml)")
    fetched = fetched_name(path)
    if fetched is not None:  # a model the pipeline's fetch_model rule makes (kvcert model fetch)
        from ..config.model_store import FetchError, fetchable, fetched_folder, folder_problem
        from ..config.digest import DigestCache

        try:
            fetchable(fetched)
        except FetchError as exc:
            return problems + [f"model {name}: {path}: {exc} (configs/model/{name}.yaml)"]
        if not fetched_folder(fetched).is_dir():
            return problems  # not fetched yet: the fetch_model rule fetches it before any job loads it
        # every file against its pin in the repository's model config (not the receipt, which the fetch wrote)
        digests = DigestCache(Path(".snakemake") / "kvcert" / "file-digests.json")
        problem = folder_problem(fetched, full=True, cache=digests)
        if problem is not None:
            return problems + [f"model {name}: {problem}"]
    try:
        resolved = resolve_model_path(path)
    except FileNotFoundError as exc:
        return problems + [f"model {name}: {_strip(str(exc), 'model.path: ')}"]
    if hub_id(path) is not None:
        return problems
    folder = Path(resolved)
    if path != EMBEDDED:
        if not any(next(folder.glob(pattern), None) for pattern in WEIGHTS):
            problems.append(f"model {name}: {path} has no weights (*.safetensors or *.bin)")
        if not any((folder / f).exists() for f in TOKENIZER_FILES):
            problems.append(f"model {name}: {path} has no tokenizer files ({', '.join(TOKENIZER_FILES)})")
        if problems:
            return problems
    passed = PassedChecks(Path(".snakemake") / "kvcert" / "checked-models.json")
    key = passed.key(folder, chat)
    if key not in passed:
        loads = check_loads(name, path, folder, chat)
        problems += loads
        if not loads:
            passed.add(key)
    positions = max_positions(str(folder))
    if longest is not None and positions is not None and longest[0] > positions:
        problems.append(f"model {name}: {longest[1]} needs {longest[0]} positions, the model has {positions} "
                        "(max_position_embeddings): shorten the grid's lengths for it")
    return problems


class PassedChecks:
    """The model folders whose loading checks (:func:`check_loads`) passed, by content: a key is the folder's
    :func:`~kvcert.config.digest.model_digest` (every file's SHA-256, through the working folder's digest
    cache), whether a chat template was asked for, and the transformers version that loaded it. The same bytes
    loaded by the same library pass again, so a later pre-flight in the working folder neither imports
    transformers and torch nor reads the weights; a changed file changes the key. Kept in
    ``.snakemake/kvcert/checked-models.json``; a read-only working folder checks again each time."""

    def __init__(self, file: Path) -> None:
        import json

        self.file = file
        try:
            self.keys = set(json.loads(file.read_text()))
        except (OSError, ValueError, TypeError):
            self.keys = set()

    @staticmethod
    def key(folder: Path, chat: bool) -> str:
        from importlib.metadata import PackageNotFoundError, version

        from ..config.digest import DigestCache, model_digest

        try:
            library = version("transformers")
        except PackageNotFoundError:
            library = "none"
        digest = model_digest(str(folder), DigestCache(Path(".snakemake") / "kvcert" / "file-digests.json"))
        return f"{digest}:chat={int(chat)}:transformers={library}"

    def __contains__(self, key: str) -> bool:
        return key in self.keys

    def add(self, key: str) -> None:
        import json

        from ..atomic import write_text

        try:
            write_text(self.file, json.dumps(sorted(self.keys | {key})))
        except OSError:  # a read-only working folder: check again next time
            pass


def check_loads(name: str, path: str, folder: Path, chat: bool) -> list[str]:
    """Problems of a model folder that only loading it shows: a config or tokenizer transformers cannot
    load, no chat template where the grid's prompts go through one (``chat``), a weight that is NaN or ±inf
    (:func:`check_weights`)."""
    problems = []
    try:
        from transformers import AutoConfig, AutoTokenizer

        AutoConfig.from_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as exc:  # a broken folder: name the first line of the library's reason
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return [f"model {name}: {path} does not load ({type(exc).__name__}: {first})"]
    if chat and not getattr(tokenizer, "chat_template", None):
        problems.append(f"model {name}: {path} has no chat template (tokenizer_config.json's chat_template, or "
                        "chat_template.jinja), and the grid's prompts are rendered through it: use the instruct "
                        "checkpoint, or add its template")
    problems += check_weights(name, folder)
    return problems


def check_weights(name: str, folder: Path) -> list[str]:
    """A problem for a weight holding NaN or ±inf in a model folder's ``*.safetensors`` (read tensor by
    tensor, without building the model), so that weights replaced in place stop a run before any job
    starts, not at its first generate job after the manifests were rebuilt. A folder whose content
    (:func:`~kvcert.config.digest.model_digest`) passed once is not read again: the digests passed are kept
    in ``.snakemake/kvcert/finite-weights.json``."""
    import json

    import torch
    from safetensors import safe_open

    from ..config.digest import DigestCache, model_digest

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return []
    digests = DigestCache(Path(".snakemake") / "kvcert" / "file-digests.json")
    digest = model_digest(str(folder), digests)
    passed_file = Path(".snakemake") / "kvcert" / "finite-weights.json"
    try:
        passed = set(json.loads(passed_file.read_text()))
    except (OSError, ValueError):
        passed = set()
    if digest in passed:
        return []
    for file in files:
        with safe_open(str(file), framework="pt") as weights:
            for key in weights.keys():
                tensor = weights.get_tensor(key)
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    return [f"model {name}: {file}: weight {key} holds NaN or ±inf; its weights are broken: "
                            "replace the weights in that folder"]
    from ..atomic import write_text

    try:
        write_text(passed_file, json.dumps(sorted(passed | {digest})))
    except OSError:  # a read-only working folder: read again next time
        pass
    return []


def unfetched(path: str) -> bool:
    """Whether ``path`` names a model ``kvcert model fetch`` has not fetched yet (the fetch_model rule will)."""
    name = fetched_name(path)
    if name is None:
        return False
    from ..config.model_store import FETCHABLE, fetched_folder

    return name in FETCHABLE and not fetched_folder(name).is_dir()


def check_forward(name: str, cfg: dict) -> list[str]:
    """Load the model of config ``cfg`` once and run one token: a problem for NaN or ±inf logits
    (broken weights a folder check cannot see), or for a model that does not load or run."""
    import torch

    from ..method.cache import CertifiedCache
    from ..generation.engine import model_folder_label
    from ..method.models import BrokenModelError, ModelSpec, load_model

    spec = ModelSpec(**{k: cfg[k] for k in ("name", "path", "dtype", "device") if k in cfg})
    if spec.device.startswith("cuda") and not torch.cuda.is_available():
        spec = ModelSpec(spec.name, spec.path, spec.dtype, "cpu")  # the check runs where the login node can
    try:
        model, tokenizer = load_model(spec)
        token = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else 0
        with torch.inference_mode():
            x = torch.tensor([[token]], dtype=torch.long, device=next(model.parameters()).device)
            logits = model(input_ids=x, cache=CertifiedCache(record_certificates=False), use_cache=True,
                           logits_to_keep=1).logits
    except BrokenModelError as exc:
        return [f"model {name}: {str(exc).removeprefix('model ')}"]
    except (OSError, ValueError, RuntimeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return [f"model {name}: {spec.path} does not run one token ({type(exc).__name__}: {first})"]
    if not bool(torch.isfinite(logits).all()):
        return [f"model {name}: {model_folder_label(spec.path)} gives NaN or ±inf logits on one token: its weights "
                "(or dtype) are broken; replace the weights in that folder"]
    return []


def check_results(results: str | Path) -> list[str]:
    """A problem when the results folder cannot be created or written."""
    import tempfile

    folder = Path(results)
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if folder.exists():
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".kvcert-write-check-"):
                pass
        elif not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise PermissionError(f"{existing} is not a writable folder")
    except OSError as exc:
        reason = exc.strerror or str(exc)
        return [f"results folder {folder}: not writable ({reason}); give a writable one with "
                "`--config results=DIR` (or fix its permissions)"]
    return []


def snakemake_knows(output: str, metadata: Path = Path(".snakemake") / "metadata") -> bool:
    """Whether Snakemake's metadata (in the working directory's ``.snakemake``) holds a record of ``output`` (the
    path as the Snakefile names it): then it reruns the job itself when the job's params change. The record's name
    is Snakemake's: the path's URL-safe base64, cut into parts of at most 254 characters, all but the last
    prefixed with ``@``."""
    from base64 import urlsafe_b64encode

    b64 = urlsafe_b64encode(output.encode()).decode()
    parts = [b64[i:i + 254] for i in range(0, len(b64), 254)]
    return metadata.joinpath(*["@" + s for s in parts[:-1]], parts[-1]).is_file()


def check_finished_shards(experiment: str, plan, prereg: str | Path, configs: Path, results: str | Path,
                          model_paths: dict | None = None) -> list[str]:
    """Finished shards (``<results>/<experiment>/generations/...``) whose records were made under another config
    than their job composes now, where Snakemake has no record of them (results copied into a fresh clone, or
    shared with ``--config results=…``), so that it would leave them standing: one line per shard naming both
    hashes and the remedy. Where its metadata knows a shard, Snakemake reruns the job itself (its params, the
    config hash, changed)."""
    import json

    from ..provenance import config_hash

    problems, cache = [], {}
    for shard in plan.shards:
        path = Path(results) / experiment / shard.path
        if not path.is_file() or snakemake_knows(f"{results}/{experiment}/{shard.path}"):
            continue
        with open(path, encoding="utf-8") as fh:
            first = fh.readline()
        try:
            made = json.loads(first).get("config_hash") if first.strip() else None
        except ValueError:
            continue  # a damaged shard: scoring names it
        specs = plan.job(shard, configs, prereg, (model_paths or {}).get(shard.model), cache=cache).specs
        planned = sorted({config_hash(s.hashed_dict()) for s in specs})
        if made is not None and made not in planned:
            problems.append(f"{path}: made under config {made}, but its job composes {planned[0]}"
                            f"{' (and others)' if len(planned) > 1 else ''} now (a model, task or method config "
                            "changed since), and Snakemake has no record of it to rerun it by: delete the shard and "
                            "its seal to regenerate it, or restore the configs")
    return problems


def table_provenance(path: Path) -> dict | None:
    """The provenance a Parquet table of :func:`kvcert.tables.write_table` carries, read from its footer alone
    (no rows, no pandas); None where it holds none or does not parse."""
    import json

    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(path).metadata or {}
        return json.loads(meta[b"kvcert"]) if b"kvcert" in meta else None
    except (OSError, ValueError, KeyError):
        return None


def check_finished_replays(experiment: str, plan, configs: Path, results: str | Path) -> list[str]:
    """Finished replay tables (``<results>/<experiment>/replay/<model>/<task>-<length>.parquet``; a second data
    seed's under ``replay/<model>/stability/``) made under other
    configs than the replay job composes now (:func:`kvcert.generation.jobs.replay_config_hash`: the model's dtype
    and device, the task, the replay method), or carrying no config hash, where Snakemake has no record of them
    to rerun them by: named beside the stale shards (:func:`check_finished_shards`), so that the replay is
    rerun with them rather than refused by the claims step after the whole grid was regenerated."""
    from ..generation.jobs import replay_config_hash

    problems = []
    method = (plan.grid.get("replay") or {}).get("method")
    for item in plan.replays:
        rel = item.replay_table
        path = Path(results) / experiment / rel
        if not path.is_file() or snakemake_knows(f"{results}/{experiment}/{rel}"):
            continue
        made = (table_provenance(path) or {}).get("config_hash")
        want = replay_config_hash(configs, item.model, item.task, method)
        if made != want:
            what = f"made under config {made}" if made else "carries no config hash (an earlier kvcert's)"
            problems.append(f"{path}: replay table {what}, but its job composes {want} now (a model's dtype, the "
                            "task or the replay method changed since), and Snakemake has no record of it to rerun "
                            f"it by: delete it and {path.with_suffix('').name}.impossibility.json to rerun the "
                            "replay, or restore the configs")
    return problems


def check_finished_manifests(experiment: str, plan, configs: Path, results: str | Path,
                             model_paths: dict | None = None) -> list[str]:
    """Finished manifests (``<results>/<experiment>/manifests/...``) that are not what ``kvcert manifest``
    builds for the plan (:func:`kvcert.generation.manifest.verify_manifest`): edited by hand, resealed or not
    (a rebuild is compared byte for byte, remembered by content once it matched), copied from another cell (the
    plan's task, length, examples and seed are compared whether or not Snakemake knows the manifest), built
    from another seed, grid or config where Snakemake has no record of it to rerun it by (a copied results
    folder), or from source files that changed since. Checked here, before any job runs, so that no generate
    or replay job whose outputs Snakemake deletes first refuses its manifest after that. One line each, with
    the remedy."""
    from ..config.digest import DigestCache
    from ..generation.manifest import RebuiltManifests, manifest_seal_path, verify_manifest

    digests = DigestCache(Path(".snakemake") / "kvcert" / "file-digests.json")
    rebuilt = RebuiltManifests()
    problems = []
    for item in plan.manifests + plan.replays:
        path = Path(results) / experiment / item.path
        if not path.is_file():
            continue
        known = snakemake_knows(f"{results}/{experiment}/{item.path}")
        if known and not manifest_seal_path(path).exists():
            continue  # built by an earlier kvcert: its job's command changed since, so Snakemake rebuilds it
        try:
            verify_manifest(path, item, configs, (model_paths or {}).get(item.model), digest=digests.sha256,
                            registered_only=known, rebuilt=rebuilt)
        except ValueError as exc:
            problems.append(str(exc))
        except (OSError, RuntimeError) as exc:  # a tokenizer that does not load: the model check names it
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            problems.append(f"{path}: could not be rebuilt to compare ({type(exc).__name__}: {first})")
    digests.save()
    return problems


def _uses_chat(task_cfg: dict) -> bool:
    from ..tasks import task_for_config

    try:
        return task_for_config(task_cfg).uses_chat(task_cfg)
    except (KeyError, ValueError):  # an unknown task: check_task names it
        return False


def check_task(task_cfg: dict) -> list[str]:
    """Problems of one task config's data (its task's pre-flight; synthetic tasks need none)."""
    from ..tasks import task_for_config

    try:
        task = task_for_config(task_cfg)
    except (KeyError, ValueError) as exc:
        return [f"task {task_cfg.get('name', '?')}: {exc.args[0] if exc.args else exc}"]
    return task.check(task_cfg)


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
                            "(see docs/cluster.md)")
    data = yaml.safe_load(text) or {}
    wanted = {str(res["gpu_model"]) for rule, res in (data.get("set-resources") or {}).items()
              if rule in experiment_rules and isinstance(res, dict) and res.get("gpu_model")
              and not PLACEHOLDER.search(str(res["gpu_model"]))}
    known = cluster_gpu_types()
    for gpu in sorted(wanted):
        if known is not None and gpu not in known:
            problems.append(f"profile {config}: gpu_model {gpu!r} is not among this cluster's GPU types "
                            f"({', '.join(sorted(known)) or 'none'}; from sinfo -o %G)")
    qos_set = any(isinstance(res, dict) and res.get("qos")
                  for res in [data.get("default-resources") or {}, *(data.get("set-resources") or {}).values()])
    account = (data.get("default-resources") or {}).get("slurm_account")
    needed = qos_required(str(account)) if account and not PLACEHOLDER.search(str(account)) else None
    if needed and not qos_set:
        problems.append(f"profile {config}: account {account!r} has no default QoS on this cluster (allowed: "
                        f"{', '.join(needed)}); set `qos: <one of them>` under default-resources")
    return problems


def qos_required(account: str) -> list[str] | None:
    """The QoS names ``account`` may use where Slurm would refuse its jobs without ``--qos``; None where
    that cannot be asked (no sacctmgr) or Slurm picks one itself. A job without ``--qos`` gets, in
    slurmctld's order: the association's default QoS, else its only allowed QoS, else the root
    association's default, else ``normal`` where it is allowed; only past all four is ``--qos`` needed."""

    def rows(*fields: str, account: str) -> list[tuple[str, str]]:
        try:
            out = subprocess.run(["sacctmgr", "-nP", "show", "assoc", f"account={account}",
                                  "format=" + ",".join(fields)], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return []
        return [tuple((line.split("|") + [""])[:2]) for line in out.splitlines() if line.strip()]

    if shutil.which("sacctmgr") is None:
        return None
    allowed, defaults = set(), set()
    for qos, default in rows("qos", "defaultqos", account=account):
        allowed |= {q for q in qos.split(",") if q}
        defaults |= {default} if default else set()
    if not allowed or defaults or len(allowed) == 1 or "normal" in allowed:
        return None
    if any(user == "" and default for user, default in rows("user", "defaultqos", account="root")):
        return None
    return sorted(allowed)


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


def preflight(experiment: str, prereg: str | Path, configs: Path, profile: str | Path | None = None,
              forward: bool = False, results: str | Path | None = None, model_paths: dict | None = None) -> list[str]:
    """Every problem of ``experiment`` that would stop a run, one line each (``forward``: also run one
    token per model; ``results``: the results folder, checked writable, and its finished shards checked
    against the configs now, :func:`check_finished_shards`; ``model_paths`` {model: path} as the jobs are
    given them, a retrained embedded model)."""
    from ..config.prereg import PreregError, verify
    from ..config.experiment import experiment_grid
    from ..generation.jobs import config_file, task_answer_tokens
    from ..generation.plan import build_plan

    problems: list[str] = []
    try:
        verify(prereg)
    except PreregError as exc:
        problems.append(f"pre-registration: {exc}")
    plan = build_plan(experiment, experiment_grid(experiment, configs, prereg)[1])
    models = sorted({m.model for m in plan.manifests + plan.replays})
    tasks = sorted({m.task for m in plan.manifests + plan.replays})
    task_cfgs = {task: config_file(configs, "task", task) for task in tasks}
    for model in models:
        cfg = config_file(configs, "model", model)
        cells = [(m.task, m.length) for m in plan.manifests + plan.replays if m.model == model]
        chat = any(_uses_chat(task_cfgs[t]) for t, _ in cells)
        needs = [(length + task_answer_tokens(configs, t), f"task {t} at {length} tokens with its answer")
                 for t, length in cells if length]
        found = check_model(model, cfg, chat=chat, longest=max(needs) if needs else None)
        problems += found
        if forward and not found and not unfetched(str(cfg["path"])):
            problems += check_forward(model, cfg)
    for cfg in task_cfgs.values():
        problems += check_task(cfg)
    if profile is not None:
        problems += check_profile(profile)
    if results is not None:
        problems += check_results(results)
        problems += check_finished_manifests(experiment, plan, configs, results, model_paths)
        problems += check_finished_shards(experiment, plan, prereg, configs, results, model_paths)
        problems += check_finished_replays(experiment, plan, configs, results)
    return problems


def profile_from_argv(argv: list[str]) -> str | None:
    """The ``--profile`` a Snakemake command line names (``--profile X`` or ``--profile=X``)."""
    for index, arg in enumerate(argv):
        if arg == "--profile" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--profile="):
            return arg.split("=", 1)[1]
    return None
