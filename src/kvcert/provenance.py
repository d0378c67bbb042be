"""Provenance stamped on every record: config hash, pre-registration hash, git commit; and the
one check that a stamped pre-registration hash is the verified freeze's.

The bottom of the package: every stage may import it, it imports no stage. The UTC start
time is stamped per record by the engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

from . import __version__


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


def provenance(config: dict, prereg_hash: str | None) -> dict:
    return {
        "config_hash": config_hash(config),
        "prereg_hash": prereg_hash,
        "git_commit": git_commit(),
        "kvcert_version": __version__,
    }


def check_prereg_hash(where: str, found: str | None, expected: str, remedy: str, error: type[Exception] = ValueError) -> None:
    """Refuse ``where`` (a file, a record) stamped with pre-registration hash ``found`` unless it is ``expected``
    (the verified freeze's): one line naming both and ``remedy`` (how to get a matching file)."""
    if found != expected:
        raise error(f"{where}: prereg_hash {found} differs from the verified freeze's {expected}; {remedy}")
