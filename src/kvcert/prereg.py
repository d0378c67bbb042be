"""Pre-registration freeze and verification.

The pre-registration is the set of files ``claims.yaml`` and ``grids/*.yaml`` under a
pre-registration folder. ``kvcert prereg freeze`` writes a freeze record
``freeze/<UTC time>.yaml`` holding the UTC time, the git commit, the reason, and the
SHA-256 of every file; a later freeze is an amendment (it names the one it amends and
must give a reason) and earlier records are never overwritten. ``kvcert prereg verify``
recomputes the hashes against the newest freeze: a file edited after it stops the
analysis with one line naming the file and how to amend. The pre-registration hash
stamped on records is the SHA-256 of the canonical listing of file hashes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

from .provenance import git_commit

FREEZE_DIR = "freeze"


class PreregError(ValueError):
    """The pre-registration is not frozen, or changed after its freeze."""


def load_claims(folder: str | Path) -> dict:
    """The parsed ``claims.yaml`` of a pre-registration folder (the one reader of it: generation
    takes its design and δ from ``analysis_plan``, the analysis its claims and plan)."""
    path = Path(folder) / "claims.yaml"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no claims.yaml in the pre-registration folder")
    return yaml.safe_load(path.read_text())


def prereg_files(folder: str | Path) -> dict[str, str]:
    """{relative path: SHA-256} of claims.yaml and grids/*.yaml."""
    folder = Path(folder)
    paths = [folder / "claims.yaml", *sorted((folder / "grids").glob("*.yaml"))]
    missing = [p for p in paths[:1] if not p.exists()]
    if missing:
        raise PreregError(f"{missing[0]}: no claims.yaml in the pre-registration folder {folder}")
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def hash_listing(files: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Freeze:
    path: Path
    frozen_utc: str
    git_commit: str
    reason: str
    files: dict[str, str]
    prereg_hash: str
    amends: str | None

    def to_dict(self) -> dict:
        return {
            "frozen_utc": self.frozen_utc, "git_commit": self.git_commit, "reason": self.reason,
            "files": self.files, "prereg_hash": self.prereg_hash, "amends": self.amends,
            "freeze_record": self.path.name,
        }


def freezes(folder: str | Path) -> list[Freeze]:
    """All freeze records, oldest first."""
    out = []
    for path in sorted((Path(folder) / FREEZE_DIR).glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        out.append(Freeze(path, data["frozen_utc"], data["git_commit"], data.get("reason", ""), data["files"],
                          data["prereg_hash"], data.get("amends")))
    return out


def freeze(folder: str | Path, reason: str = "", now: datetime | None = None) -> Freeze:
    """Write a new freeze record (an amendment if one exists: a reason is then required)."""
    folder = Path(folder)
    previous = freezes(folder)
    if previous and not reason.strip():
        raise PreregError("reason: an amendment of a frozen pre-registration must say why (--reason '...')")
    files = prereg_files(folder)
    if previous and previous[-1].files == files:
        raise PreregError(f"nothing to amend: the files match the freeze {previous[-1].path.name}")
    now = now or datetime.now(timezone.utc)
    stamp = now.strftime("%Y%m%dT%H%M%S") + f".{now.microsecond:06d}Z"
    target = folder / FREEZE_DIR / f"{stamp}.yaml"
    if target.exists():
        raise PreregError(f"{target}: a freeze record with this time exists already; try again in a second")
    record = {
        "frozen_utc": now.isoformat(timespec="microseconds"),
        "git_commit": git_commit(folder),
        "reason": reason.strip() or "initial freeze, before any result exists",
        "amends": previous[-1].path.name if previous else None,
        "files": files,
        "prereg_hash": hash_listing(files),
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(record, sort_keys=False))
    return freezes(folder)[-1]


def verify(folder: str | Path) -> Freeze:
    """The newest freeze if every file still matches it; else :class:`PreregError` in one line."""
    folder = Path(folder)
    records = freezes(folder)
    if not records:
        raise PreregError(f"{folder}: the pre-registration is not frozen; run `kvcert prereg freeze --folder {folder}`")
    latest = records[-1]
    current = prereg_files(folder)
    for name in sorted(set(current) | set(latest.files)):
        if current.get(name) != latest.files.get(name):
            what = "was added" if name not in latest.files else "is missing" if name not in current else "was edited"
            raise PreregError(
                f"{folder / name} {what} after the freeze of {latest.frozen_utc} ({latest.path.name}); restore it, "
                f"or amend with `kvcert prereg freeze --folder {folder} --reason '...'` (a new dated freeze; earlier ones are kept)"
            )
    return latest


def run(args) -> int:
    if args.action == "freeze":
        record = freeze(args.folder, args.reason or "")
        print(f"frozen {record.path} prereg_hash={record.prereg_hash}")
    else:
        record = verify(args.folder)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(record.to_dict(), indent=2, sort_keys=True) + "\n")
        print(f"verified against {record.path.name} (frozen {record.frozen_utc}) prereg_hash={record.prereg_hash}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("prereg", help="freeze or verify the pre-registration")
    p.add_argument("action", choices=["freeze", "verify"])
    p.add_argument("--folder", default="preregistration", help="pre-registration folder (default: preregistration)")
    p.add_argument("--reason", default=None, help="why this (amending) freeze is made")
    p.add_argument("--out", default=None, help="verify: write the verified freeze record as JSON here")
    p.set_defaults(func=run)
