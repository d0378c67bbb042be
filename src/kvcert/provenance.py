"""Provenance stamped on every record: config hash, pre-registration hash, git commit, the digest of the code that
makes records (:func:`code_digest`); and the one check that a stamped pre-registration hash is the verified
freeze's.

The bottom of the package: every stage may import it, it imports no stage. The UTC start
time is stamped per record by the engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from functools import lru_cache
from pathlib import Path

from . import __version__

#: the code that makes records — generation, the method, the tasks, the kernels — as package folders
#: (``kvcert_kernels`` is its own top-level package); its digest changes when any of their Python files does
RECORD_CODE = ("kvcert.generation", "kvcert.method", "kvcert.tasks", "kvcert_kernels")


def config_hash(config: dict) -> str:
    """SHA-256 (first 16 hex digits) of the canonical JSON of a job config."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def git_commit(start: str | Path | None = None) -> str:
    """The commit of the checkout (``KVCERT_GIT_COMMIT`` overrides; "unknown" outside git)."""
    if os.environ.get("KVCERT_GIT_COMMIT"):
        return os.environ["KVCERT_GIT_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=start or Path(__file__).parent, capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@lru_cache(maxsize=1)
def code_digest() -> str:
    """SHA-256 (first 16 hex digits) of the code that makes records (:data:`RECORD_CODE`): every ``*.py`` file of
    those packages, by its path inside the package and its bytes, in sorted order. The same source gives the same
    digest in a checkout, an editable install and a wheel; a record's digest beside the current one says whether
    the code that made it has changed since (tests/test_reference_results.py)."""
    import importlib.util

    h = hashlib.sha256()
    for name in RECORD_CODE:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            h.update(f"{name}:absent\n".encode())
            continue
        root = Path(next(iter(spec.submodule_search_locations)))
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            h.update(f"{name}/{path.relative_to(root).as_posix()}\n".encode())
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:16]


def provenance(config: dict, prereg_hash: str | None) -> dict:
    return {
        "config_hash": config_hash(config),
        "prereg_hash": prereg_hash,
        "git_commit": git_commit(),
        "kvcert_version": __version__,
        "code_digest": code_digest(),
    }


def check_prereg_hash(where: str, found: str | None, expected: str, remedy: str, error: type[Exception] = ValueError) -> None:
    """Refuse ``where`` (a file, a record) stamped with pre-registration hash ``found`` unless it is ``expected``
    (the verified freeze's): one line naming both and ``remedy`` (how to get a matching file)."""
    if found != expected:
        raise error(f"{where}: prereg_hash {found} differs from the verified freeze's {expected}; {remedy}")
