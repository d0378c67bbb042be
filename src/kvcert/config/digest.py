"""Content digests that decide when a pipeline job reruns.

Snakemake reruns a job when its inputs are newer than its outputs or its params change.
File times are the wrong signal for files that can be rewritten unchanged (a restored
pre-registration, a re-checked-out config) and say nothing about a config edited in
place. So the Snakefile gives each job, as params, the digests of what it depends on:

- the pre-registration hash of the newest freeze (:func:`kvcert.config.prereg.verify`): the
  same after an edit is restored, new after an amendment;
- the config hash its records carry (:attr:`kvcert.generation.jobs.Job.config_hash`: the
  typed specs of a generate job's runs) and, for a manifest or replay job, the hash of the
  configs it reads (:func:`kvcert.generation.jobs.manifest_config_hash`,
  :func:`kvcert.generation.jobs.replay_config_hash`): a changed ``dtype`` or
  ``max_new_tokens`` reruns the jobs whose records would change, a comment, key order, a
  planning estimate or the folder a model lives in reruns nothing;
- :func:`model_digest` of the model folder a manifest / generate / replay job loads:
  every file's name, size and SHA-256 (the safetensors headers and weights included),
  so weights replaced in place rerun the jobs of that model and a copy of the folder
  (new paths, new times, the same bytes) reruns nothing. A file is read whole only when
  it is new to the digest cache or its size, inode or status-change time changed
  (:class:`DigestCache`; every write, and every time set back, changes the status-change
  time); otherwise its recorded SHA-256 is used, so a 16 GB folder is read once (a cold
  start of the paper profile reads every model's weights once: minutes), not at every
  workflow start. The digest itself holds no time.

Inputs over Snakemake's checksum limit (1 MB by default) would be compared by file time
(a restored shard, a touched manifest); the default profile raises that limit so that its
own recorded checksums decide.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .hashing import (DigestCache, WORKDIR_CACHE, canonical_json_sha256, digest_cache,  # noqa: F401 (re-exported)
                      file_sha256, user_cache_dir)


def model_folder(path: str) -> Path | None:
    """The local folder a model config's ``path`` names ("embedded": the shipped model); None for
    a Hub id or a folder that does not exist."""
    from .sources import hub_id

    if path == "embedded":
        from ..embedded import embedded_model_path

        return embedded_model_path()
    if hub_id(path) is not None:
        return None
    from .sources import fetched_name

    if fetched_name(path) is not None:
        from .model_store import FETCHABLE, fetched_folder

        name = fetched_name(path)
        folder = fetched_folder(name) if name in FETCHABLE else None
        return folder if folder is not None and folder.is_dir() else None
    folder = Path(path).expanduser()
    return folder if folder.is_dir() else None


def model_digest(path: str, cache: DigestCache | None = None) -> str:
    """SHA-256 (16 hex digits) of a model folder's content: every file (hidden ones aside) by
    relative name, size and SHA-256; a Hub id or a missing folder by its name alone. A model that
    ``kvcert model fetch`` makes (``fetch:NAME``) by its pinned source (the same before and after the
    fetch rule has run); the pre-flight compares its folder with the fetch's receipt instead."""
    from .sources import fetched_name

    name = fetched_name(path)
    if name is not None:
        from .model_store import FETCHABLE

        return FETCHABLE[name].identity if name in FETCHABLE else f"unknown:{path}"
    folder = model_folder(path)
    if folder is None:
        return hashlib.sha256(f"unresolved:{path}".encode()).hexdigest()[:16]
    cache = cache or DigestCache()
    parts = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith("."):
                continue
            file = Path(root) / name
            parts.append(f"{file.relative_to(folder).as_posix()}:{file.stat().st_size}:{cache.sha256(file)}")
    cache.save()
    return hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()[:16]


def folder_content(folder: Path, cache: DigestCache | None = None) -> str:
    """The content digest (16 hex digits) of a model folder, from its bytes alone (never from the name it is
    given by): every file a loader may read — hidden files and a fetch's receipt (``kvcert-fetch.json``, what
    the fetch says of itself) aside — as ``name:pin``, a pin being ``json:`` + :func:`canonical_json_sha256` of a
    ``*.json`` file (its settings, whichever library release wrote them) and ``sha256:`` + the SHA-256 of any
    other file's bytes (or of a ``*.json`` file that does not parse), and :func:`kvcert.config.model_store.pins_digest`
    of them. A fetched folder's files are exactly its pins (:func:`kvcert.config.model_store.folder_problem`), so its
    digest is its pins' whether it is named ``fetch:NAME`` or a copy of it is named by its path."""
    from .model_store import RECEIPT, pins_digest

    cache = cache or DigestCache()
    pins = {}
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            file = Path(root) / name
            rel = file.relative_to(folder).as_posix()
            if name.startswith(".") or rel == RECEIPT:
                continue
            pin = None
            if name.endswith(".json"):
                try:
                    pin = "json:" + cache.json_sha256(file)
                except ValueError:  # not JSON after all: its bytes
                    pin = None
            pins[rel] = pin or "sha256:" + cache.sha256(file)
    cache.save()
    return pins_digest(pins)


def content_digest(path: str) -> str | None:
    """The content digest (16 hex digits) of the model a config's ``path`` names, as a command loads it (what
    its records, results and tables carry): :func:`folder_content` of the folder it resolves to — a fetched
    model's once the folder is checked against its pins (:func:`kvcert.config.sources.resolve_model_path`), a
    local folder's, the embedded model's — through the digest cache, so the same bytes give the same digest
    however the model is named (``model=NAME`` or ``model.path=`` a copy); None for a Hub id (its files are
    the Hub's)."""
    from .sources import HUB_PREFIX, fetched_name, resolve_model_path

    name = fetched_name(path)
    if name is not None:
        from .model_store import fetched_folder

        resolve_model_path(path)  # refused unless the folder's files are its pins, each matching
        return folder_content(fetched_folder(name), digest_cache())
    if str(path).startswith(HUB_PREFIX):
        return None
    folder = model_folder(str(path))
    if folder is None:
        resolve_model_path(str(path))  # a missing folder: its one-line error
        return None
    return folder_content(folder, digest_cache())
