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
import json
import os
from pathlib import Path


class DigestCache:
    """{absolute path: (size, inode, ctime_ns, SHA-256)} of files already read, kept in a JSON file
    (written atomically; a missing or unreadable one is an empty cache). The status-change time
    cannot be set back (``touch -d`` and ``os.utime`` move it forward too), so a file rewritten
    in place with its modification time restored is read again."""

    def __init__(self, path: str | Path | None = None):
        self.path = None if path is None else Path(path)
        self.entries: dict[str, list] = {}
        if self.path is not None and self.path.exists():
            try:
                self.entries = json.loads(self.path.read_text())
            except ValueError:
                self.entries = {}
        self.changed = False

    def sha256(self, file: Path) -> str:
        st = file.stat()
        key = str(file.resolve())
        stamp = [st.st_size, st.st_ino, st.st_ctime_ns]
        entry = self.entries.get(key)
        if entry is not None and entry[:3] == stamp:
            return entry[3]
        h = hashlib.sha256()
        with open(file, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
        self.entries[key] = [*stamp, h.hexdigest()]
        self.changed = True
        return h.hexdigest()

    def save(self) -> None:
        if self.path is not None and self.changed:
            from ..atomic import write_text

            try:
                write_text(self.path, json.dumps(self.entries, sort_keys=True))
            except OSError:  # a read-only working folder: the hashes are computed again next time
                return
            self.changed = False


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
