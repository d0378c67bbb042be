"""Provenance stamped on every record: config hash, pre-registration hash, git commit.

The UTC start time is stamped per record by the engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

from .. import __version__


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
