"""Task manifests: the records of one (model, task, length), in that model's tokens.

Each task builds its own records (the task registry, :mod:`kvcert.tasks`): synthetic tasks
are generated (seeded); LongBench and LoCoMo are read from the local paths (or hub ids) their
task config names — only here, when a manifest is built.

A manifest is *sealed* like a shard (:mod:`kvcert.generation.shards`): beside it,
``<name>.seal.json`` holds the SHA-256 of its bytes and what built it — the plan's
(task, length, examples, seed, sample) and the hash of the tokenizer and task config it read
(:func:`kvcert.generation.jobs.manifest_config_hash`). Generation and scoring take a manifest only
through :func:`verify_manifest`: a manifest edited by hand (its references changed), copied in
from another seed or grid, or built under other configs is refused in one line that says to
rebuild it, never generated from or scored against.

A seal alone guards against accidents, not against an insider who recomputes it
(docs/reliability.md), so a manifest is **rebuilt, not trusted**: :func:`verify_manifest` builds
the records again from what the plan registers for it (task, length, examples, seed, sample, with
the model's tokenizer and the task config as they are now) and compares the bytes
(:func:`check_rebuilt`). A manifest built from files (LongBench, LoCoMo) is rebuilt from them the
same way, and its seal also records each source file's SHA-256 (``sources``), so a data file
changed since is named as such. A manifest built on Python's prose (:mod:`kvcert.tasks.prose`) records the
prose the same way (the Python version its snapshot was taken from and the SHA-256 of its sentences), and one
built on another text is refused in one line that says to rebuild it. A
rebuild that matched is remembered by content (``.snakemake/kvcert/rebuilt-manifests.json`` of the working
folder: the manifest's SHA-256, what it was built from and the tokenizer folder's content digest), and
``kvcert manifest`` remembers what it has just built: a job that takes an unchanged manifest rebuilds nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..atomic import write_text
from ..tasks.records import TaskRecord, write_jsonl
from .plan import Manifest

#: the rebuilds that matched, by content (:class:`RebuiltManifests`), in the working folder
REBUILT = Path(".snakemake") / "kvcert" / "rebuilt-manifests.json"


def load_tokenizer(model_cfg: dict):
    from transformers import AutoTokenizer

    from ..method.models import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path(model_cfg["path"]))


def build_records(task_cfg: dict, tokenizer, length: int, examples: int, seed: int,
                  sample: str = "first") -> list[TaskRecord]:
    """The records of one task config at ``length`` tokens, built by its task (:func:`kvcert.tasks.task_for_config`)."""
    from ..tasks import task_for_config

    return task_for_config(task_cfg).build(task_cfg, tokenizer, length, examples, seed, sample)


def write_manifest(records: list[TaskRecord], out: str | Path, item: Manifest | None = None,
                   data_hash: str | None = None, sources: dict | None = None) -> Path:
    """Write atomically (:func:`~kvcert.tasks.records.write_jsonl`), so an interrupted build never leaves
    a half manifest; with the plan's ``item`` (and the configs' ``data_hash``, the source files' digests
    ``sources``), seal it (:func:`seal_manifest`)."""
    write_jsonl(records, out)
    if item is not None:
        seal_manifest(out, item, data_hash, len(records), sources)
    return Path(out)


def manifest_text(records: list[TaskRecord]) -> bytes:
    """The bytes :func:`write_manifest` writes for ``records``."""
    return "".join(json.dumps(r.to_dict(), ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def source_digests(task_cfg: dict, sha256=None) -> dict | None:
    """{file name: SHA-256} of the local files a build of ``task_cfg`` reads (its task's ``sources``); None for a
    generated task (nothing to read) or a Hub id (not a local file). A source that is not a file carries its own
    identity (``seal_entry()``: Python's prose, :class:`kvcert.tasks.prose.ProseSource` — {name: its Python version,
    SHA-256 of its sentences}). ``sha256``: a function of a path (a :class:`~kvcert.config.digest.DigestCache`'s)."""
    from ..config.digest import file_sha256
    from ..tasks import task_for_config

    try:
        files = task_for_config(task_cfg).sources(task_cfg)
    except (FileNotFoundError, ValueError):
        return None  # a missing source: the pre-flight's task check names it
    if not files:
        return None
    return {f.name: f.seal_entry() if hasattr(f, "seal_entry") else (sha256 or file_sha256)(Path(f))
            for f in files}


def manifest_seal_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".seal.json")


def built_from(item: Manifest, data_hash: str | None) -> dict:
    """What a manifest is built from: the plan's registered (task, length, examples, seed, sample, set) and
    the hash of the configs read (:func:`kvcert.generation.jobs.manifest_config_hash`)."""
    return {"task": item.task, "length": int(item.length), "examples": int(item.examples), "seed": int(item.seed),
            "sample": item.sample, "set": item.set, "configs": data_hash}


def seal_manifest(path: str | Path, item: Manifest, data_hash: str | None, records: int,
                  sources: dict | None = None) -> Path:
    """Write ``<manifest>.seal.json``: the SHA-256 of the manifest's bytes, :func:`built_from` and, for a manifest
    built from files, their SHA-256 (``sources``, :func:`source_digests`)."""
    from .shards import file_digest

    seal = {"records": int(records), "sha256": file_digest(path), "built_from": built_from(item, data_hash)}
    if sources:
        seal["sources"] = dict(sources)
    return write_text(manifest_seal_path(path), json.dumps(seal, indent=1, sort_keys=True) + "\n")


#: what the plan registers for a manifest (:func:`built_from` but the configs' hash)
REGISTERED = ("task", "length", "examples", "seed", "sample", "set")


def check_manifest(path: str | Path, item: Manifest | None, data_hash: str | None, digest=None,
                   sources: dict | None = None, registered_only: bool = False) -> dict:
    """Refuse, in one line, a manifest that is not what ``kvcert manifest`` built for the plan's ``item``
    under the configs of ``data_hash``: no seal, bytes that differ from the seal (edited references), a
    seal of another task, length, seed, grid or config (``item`` None: the bytes alone; ``registered_only``:
    what the plan registers, not the configs' hash — a Snakemake run that knows the manifest rebuilds it
    when its configs changed), or, where both are known, source files (``sources``,
    :func:`source_digests`) that changed since it was built. ``digest``: the SHA-256 function (a
    :class:`~kvcert.config.digest.DigestCache`'s, which reads a file again only once it changed). Returns
    the seal."""
    from .shards import file_digest

    file_digest = digest or file_digest

    path, seal = Path(path), manifest_seal_path(path)
    rebuild = f"delete {path} and {seal.name} and rerun to rebuild it from its registered seed"
    if not seal.exists():
        raise ValueError(f"{path}: no seal ({seal.name}); it was not built by `kvcert manifest`; {rebuild}")
    try:
        data = json.loads(seal.read_text(encoding="utf-8"))
        digest, made = data["sha256"], data["built_from"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{seal}: the seal of {path.name} does not parse; {rebuild}") from None
    if file_digest(path) != digest:
        raise ValueError(f"{path}: its content differs from what `kvcert manifest` built (its seal {seal.name}): "
                         f"edited after it was built; {rebuild}")
    if item is None:
        return data
    want = built_from(item, data_hash)
    diff = sorted(k for k in want if made.get(k) != want[k] and (k in REGISTERED or not registered_only))
    if diff:
        raise ValueError(f"{path}: built from other inputs than the plan's ("
                         + ", ".join(f"{k} {made.get(k)!r} != {want[k]!r}" for k in diff) + f"); {rebuild}")
    recorded = data.get("sources")
    if sources is not None and isinstance(recorded, dict):
        changed = sorted(name for name in set(sources) | set(recorded) if sources.get(name) != recorded.get(name))
        then, now = (recorded.get(changed[0]), sources.get(changed[0])) if changed else (None, None)
        if isinstance(then, dict) or isinstance(now, dict):
            python = [(d or {}).get("python", "?") if isinstance(d, dict) else "?" for d in (then, now)]
            digests = [str((d or {}).get("sha256") if isinstance(d, dict) else d)[:16] for d in (then, now)]
            raise ValueError(f"{path}: built from another prose text ({changed[0]} of Python {python[0]}, SHA-256 "
                             f"{digests[0]}…; kvcert's snapshot now is that of Python {python[1]}, {digests[1]}…); "
                             f"{rebuild}")
        if changed:
            raise ValueError(f"{path}: its source file {changed[0]} changed since the manifest was built (SHA-256 "
                             f"{str(recorded.get(changed[0]))[:16]}… then, {str(sources.get(changed[0]))[:16]}… now); "
                             f"{rebuild}")
    return data


class RebuiltManifests:
    """The manifests a rebuild matched, by content: keys of :func:`rebuild_key`, kept in ``file`` (default
    :data:`REBUILT`, in the working folder); a read-only or missing file: an empty set, rebuilt again next time."""

    def __init__(self, file: str | Path | None = None) -> None:
        self.file = Path(file) if file is not None else REBUILT
        try:
            self.keys = set(json.loads(self.file.read_text()))
        except (OSError, ValueError, TypeError):
            self.keys = set()

    def __contains__(self, key: str) -> bool:
        return key in self.keys

    def add(self, key: str) -> None:
        self.keys.add(key)
        try:
            current = set(json.loads(self.file.read_text())) if self.file.exists() else set()
        except (OSError, ValueError, TypeError):
            current = set()
        try:
            write_text(self.file, json.dumps(sorted(current | self.keys)))
        except OSError:  # a read-only working folder: rebuilt again next time
            pass


def rebuild_key(content: bytes, item: Manifest, data_hash: str | None, sources: dict | None,
                tokenizer_digest: str | None) -> str:
    """What a matched rebuild vouches for: the manifest's bytes, what it was built from (the plan's item, the
    configs' hash, the source files' digests) and the content digest of the tokenizer's model folder."""
    made = json.dumps({"built_from": built_from(item, data_hash), "sources": sources or None,
                       "tokenizer": tokenizer_digest}, sort_keys=True)
    return hashlib.sha256(content).hexdigest() + ":" + hashlib.sha256(made.encode()).hexdigest()[:32]


def remember_built(path: str | Path, item: Manifest, configs: str | Path, model_path: str | None = None,
                   sources: dict | None = None) -> None:
    """Remember a manifest ``kvcert manifest`` has just built as matching its rebuild (it is one)."""
    from .jobs import config_file, manifest_config_hash

    model_cfg = config_file(configs, "model", item.model)
    if model_path:
        model_cfg["path"] = model_path
    data_hash = manifest_config_hash(configs, item.model, item.task, model_path)
    RebuiltManifests().add(rebuild_key(Path(path).read_bytes(), item, data_hash, sources, _tokenizer_digest(model_cfg)))


def _tokenizer_digest(model_cfg: dict) -> str | None:
    from ..config.digest import content_digest

    return content_digest(str(model_cfg["path"]))


def _first_difference(path: Path, have: bytes, want: bytes) -> str:
    """Where a manifest (``have``) differs from its rebuild (``want``): the first record, and which of its fields."""
    lines, again = have.decode("utf-8", "replace").splitlines(), want.decode("utf-8").splitlines()
    if len(lines) != len(again):
        return f"it holds {len(lines)} records, a rebuild {len(again)}"
    for old, new in zip(lines, again):
        if old != new:
            try:
                a, b = json.loads(old), json.loads(new)
            except ValueError:
                return "a line does not parse"
            fields = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            return f"record {b.get('id')!r} differs in {', '.join(fields) or 'its layout'}"
    return "its bytes differ"


def check_rebuilt(path: str | Path, item: Manifest, configs: str | Path, model_path: str | None = None,
                  data_hash: str | None = None, sources: dict | None = None,
                  rebuilt: RebuiltManifests | None = None) -> bool:
    """Refuse, in one line, a manifest whose bytes are not what ``kvcert manifest`` builds now for the plan's
    ``item`` (the task config and the model's tokenizer of ``configs``; ``model_path``: a retrained model's
    folder): an edit whose seal was recomputed, a copy from another cell, a manifest built by another kvcert.
    Skipped (False) where the tokenizer cannot be had here (a model not fetched yet, a Hub id, a folder not
    trained yet): the job that needs it checks again. A match is remembered (``rebuilt``,
    :class:`RebuiltManifests`); True once checked."""
    from ..config.sources import HUB_PREFIX, fetched_name
    from .jobs import config_file

    path = Path(path)
    model_cfg = config_file(configs, "model", item.model)
    if model_path:
        model_cfg["path"] = model_path
    where = str(model_cfg["path"])
    if where.startswith(HUB_PREFIX) or (fetched_name(where) is None and where != "embedded"
                                        and not os.path.isdir(os.path.expanduser(where))):
        return False
    if fetched_name(where) is not None:
        from ..config.model_store import FETCHABLE, fetched_folder

        if fetched_name(where) in FETCHABLE and not fetched_folder(fetched_name(where)).is_dir():
            return False
    rebuilt = RebuiltManifests() if rebuilt is None else rebuilt
    content = path.read_bytes()
    key = rebuild_key(content, item, data_hash, sources, _tokenizer_digest(model_cfg))
    if key in rebuilt:
        return True
    records = build_records(config_file(configs, "task", item.task), load_tokenizer(model_cfg), item.length,
                            item.examples, item.seed, item.sample)
    again = manifest_text(records)
    if again != content:
        raise ValueError(
            f"{path}: not what `kvcert manifest` builds from what the plan registers for it (task {item.task}, "
            f"length {item.length}, {item.examples} examples, seed {item.seed}) with the configs and tokenizer as "
            f"they are now: {_first_difference(path, content, again)} — edited after it was built (its seal "
            f"recomputed), copied from another cell, or built by another kvcert; delete {path} and "
            f"{manifest_seal_path(path).name} and rerun to rebuild it")
    rebuilt.add(key)
    return True


def verify_manifest(path: str | Path, item: Manifest, configs: str | Path, model_path: str | None = None, *,
                    digest=None, registered_only: bool = False, rebuilt: RebuiltManifests | None = None) -> None:
    """Everything a manifest must be before anything is generated from it or scored against it, one line per
    refusal: its seal (:func:`check_manifest`: bytes, what the plan registers, the configs' hash unless
    ``registered_only``, the source files), then a rebuild (:func:`check_rebuilt`) where the seal says it was
    built under the configs as they are now (``registered_only`` and other configs: Snakemake rebuilds it)."""
    from .jobs import config_file, manifest_config_hash

    data_hash = manifest_config_hash(configs, item.model, item.task, model_path)
    sources = source_digests(config_file(configs, "task", item.task), digest)
    seal = check_manifest(path, item, data_hash, digest, sources, registered_only)
    if seal["built_from"].get("configs") != data_hash:
        return  # built under other configs, which a Snakemake run that knows it rebuilds (registered_only)
    check_rebuilt(path, item, configs, model_path, data_hash, sources, rebuilt)
