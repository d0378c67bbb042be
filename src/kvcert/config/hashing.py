"""File digests kept by content: the SHA-256 of a file (or of a JSON file's settings) read once per content, and
the digest caches the commands read model folders through. The bottom of the config stage's digests:
:mod:`kvcert.config.digest` (what reruns a job, what a record carries) and :mod:`kvcert.config.model_store`
(a fetched model's pins) both read files through it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


#: the suffix of a JSON file's settings digest in the cache (its path, then this)
JSON_KIND = "#json"


class DigestCache:
    """{absolute path: (size, inode, ctime_ns, SHA-256)} of files already read, kept in a JSON file
    (written atomically; a missing or unreadable one is an empty cache). The status-change time
    cannot be set back (``touch -d`` and ``os.utime`` move it forward too), so a file rewritten
    in place with its modification time restored is read again. :meth:`json_sha256` (a JSON file's
    content, :func:`canonical_json_sha256`) is kept the same way, under ``<path>#json``."""

    def __init__(self, path: str | Path | None = None):
        self.path = None if path is None else Path(path)
        self.entries: dict[str, list] = {}
        if self.path is not None and self.path.exists():
            try:
                self.entries = json.loads(self.path.read_text())
            except (OSError, ValueError):
                self.entries = {}
            if not isinstance(self.entries, dict):
                self.entries = {}
        self.changed = False

    def _cached(self, file: Path, kind: str, compute) -> str:
        st = file.stat()
        key = str(file.resolve()) + kind
        stamp = [st.st_size, st.st_ino, st.st_ctime_ns]
        entry = self.entries.get(key)
        if isinstance(entry, list) and entry[:3] == stamp:
            return entry[3]
        value = compute(file)
        self.entries[key] = [*stamp, value]
        self.changed = True
        return value

    def sha256(self, file: Path) -> str:
        return self._cached(Path(file), "", file_sha256)

    def json_sha256(self, file: Path) -> str:
        """:func:`canonical_json_sha256` of a JSON file, read again only once the file changed."""
        return self._cached(Path(file), JSON_KIND, canonical_json_sha256)

    def save(self) -> None:
        if self.path is not None and self.changed:
            from ..atomic import write_text

            # entries of files that are gone (a test's temporary folder, a deleted model) are dropped
            kept = {k: v for k, v in self.entries.items() if os.path.exists(k.removesuffix(JSON_KIND))}
            try:
                write_text(self.path, json.dumps(kept, sort_keys=True))
            except OSError:  # a read-only working folder: the hashes are computed again next time
                return
            self.entries, self.changed = kept, False


def file_sha256(file: Path) -> str:
    """The SHA-256 of a file's bytes (hex)."""
    h = hashlib.sha256()
    with open(file, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


#: top-level keys of a JSON file that say which library version wrote it, not what it holds
VOLATILE_JSON_KEYS = ("transformers_version",)


def canonical_json_sha256(file: Path) -> str:
    """The SHA-256 (hex) of a JSON file's content: its keys sorted, no whitespace, the writer's version
    (:data:`VOLATILE_JSON_KEYS`) left out, so that the same settings written by another release of the
    library give the same digest. A file that is not JSON is refused (ValueError naming it)."""
    try:
        data = json.loads(Path(file).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{file}: not a JSON file ({exc})") from None
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in VOLATILE_JSON_KEYS}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/kvcert`` (default ``~/.cache/kvcert``): what kvcert keeps per user."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "kvcert"


#: the working folder's digest cache (a Snakemake run's: the pre-flight fills it before any job starts)
WORKDIR_CACHE = Path(".snakemake") / "kvcert" / "file-digests.json"
_CACHES: dict[str, DigestCache] = {}


def digest_cache() -> DigestCache:
    """The digest cache a command reads a model folder through (one per process and file):
    ``$KVCERT_DIGEST_CACHE`` when set; else the working folder's :data:`WORKDIR_CACHE` where the
    working folder is a Snakemake run's (its jobs find the hashes the pre-flight computed); else
    ``<user cache>/file-digests.json`` (:func:`user_cache_dir`). A 16 GB model is read once per
    content, not at every start."""
    if os.environ.get("KVCERT_DIGEST_CACHE"):
        path = Path(os.environ["KVCERT_DIGEST_CACHE"]).expanduser()
    elif WORKDIR_CACHE.parent.parent.is_dir():
        path = WORKDIR_CACHE
    else:
        path = user_cache_dir() / "file-digests.json"
    key = str(path.resolve()) if path.parent.exists() else str(path.absolute())
    if key not in _CACHES:
        _CACHES[key] = DigestCache(path)
    return _CACHES[key]
