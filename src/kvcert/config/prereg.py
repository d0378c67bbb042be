"""Pre-registration freeze and verification: a chain of freeze records that guards itself.

The pre-registration is the set of files ``claims.yaml`` and ``grids/*.yaml`` under a
pre-registration folder. ``kvcert prereg freeze`` writes a freeze record
``freeze/<UTC time>.yaml`` holding the UTC time, the git commit, the reason, and the
SHA-256 of every file; a later freeze is an amendment (it names the one it amends and
must give a reason) and earlier records are never overwritten.

**The chain.** A freeze record carries ``chain: 1`` and its ``prereg_hash`` is the
SHA-256 of the canonical JSON of (the full content of every earlier record, in chain
order; its own ``frozen_utc``, ``git_commit``, ``reason``, ``amends``, ``files`` and
``files_hash``). That hash is what every later file is stamped with, so editing,
removing or reordering any earlier record — its ``frozen_utc`` included — changes
the hash the chain should have, and :func:`verify` refuses it in one line. The order
is the chain's (each record names the one it amends), not the file names': a freeze
made on a clock that was wrong is amended like any other, and the amendment is the
newest record even when its name sorts first. Records written before the chain began
(no ``chain`` key) keep their own hash (the listing of file hashes), are ordered by
file name, and become part of the first chained record's hash.

:func:`verify` refuses, in one line each: a file edited since the newest freeze; a
record whose ``frozen_utc`` is not the time in its file name; a chained record whose
hash does not match the records before it; a chain that forks or has a gap; a chained
record dated before the record it amends (unless an earlier kvcert wrote it as a declared clock
correction, below); a newest freeze time ahead of this machine's clock (by more than
:data:`CLOCK_TOLERANCE`).
The hashes guard against accidents (an edit, a bad merge, a wrong clock), not against an
insider, who can recompute them (docs/reliability.md).

**Time only moves forward along the chain.** :func:`freeze` refuses, outright and whatever the
reason, to write a record dated before the newest one (this machine's clock reads earlier than
its ``frozen_utc``, :func:`check_forward`): from a machine whose clock is slow, an amendment would
claim to predate what it amends (and the results made in between). One machine cannot tell a
slow clock of its own from a record made on a clock that ran ahead, and nothing a reason says can
tell them apart either: the declared correction earlier releases accepted (a reason saying the
record it amends "was made on a wrong clock", :func:`corrects_clock`), pasted on a slow machine,
wrote a backdated amendment that verified. So no command writes one any more; a record made on a
clock that ran ahead is amended once its time has passed, or taken out of the chain by hand (its
results then refused). Chains holding such a declared correction, written before, still verify
(:func:`check_chain`).

Files whose names are not freeze records' are never read as records: the hidden
``.<name>.<pid>.tmp.yaml`` a killed freeze leaves (:mod:`kvcert.atomic`) is skipped by every
reader, and the next ``kvcert prereg freeze`` removes those of processes no longer alive.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml

from .analysis_plan import AnalysisPlan, check_schema
from ..atomic import remove_leftovers, write_text
from ..provenance import git_commit

FREEZE_DIR = "freeze"
CHAIN_VERSION = 1
#: a freeze time may be this far ahead of the verifying machine's clock (ordinary clock skew)
CLOCK_TOLERANCE = timedelta(minutes=5)
#: how a message tells the user to check a clock before trusting it (no host named: the site's own time server)
CLOCK_CHECK = ("check it against a time server first (`chronyc tracking`, `timedatectl timesync-status` or "
               "`ntpdate -q <your time server>` print the offset)")
#: a reason that declares the record it amends was made on a wrong clock (see the module docstring)
CLOCK_CORRECTION = re.compile(r"wrong clock", re.IGNORECASE)
#: what a chained record's own hash covers (besides every earlier record's full content)
CHAINED_FIELDS = ("frozen_utc", "git_commit", "reason", "amends", "chain", "files", "files_hash")


class PreregError(ValueError):
    """The pre-registration is not frozen, or changed after its freeze."""


def load_claims(folder: str | Path) -> dict:
    """The parsed ``claims.yaml`` of a pre-registration folder (the one reader of it: generation
    takes its design, δ and replay from ``analysis_plan``, the analysis its claims and plan), its
    ``analysis_plan`` built once into the typed :class:`~kvcert.config.analysis_plan.AnalysisPlan` (a
    malformed plan is refused in one line naming the key)."""
    path = Path(folder) / "claims.yaml"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no claims.yaml in the pre-registration folder")
    doc = yaml.safe_load(path.read_text())
    if isinstance(doc, dict) and "analysis_plan" in doc:
        try:
            doc["analysis_plan"] = AnalysisPlan.from_dict(doc["analysis_plan"])
        except ValueError as exc:
            raise PreregError(f"{path}: {exc}") from None
    return doc


def load_plan(folder: str | Path) -> AnalysisPlan:
    """The typed ``analysis_plan`` of a pre-registration folder's ``claims.yaml`` (:func:`load_claims`)."""
    doc = load_claims(folder)
    if not isinstance(doc, dict) or not isinstance(doc.get("analysis_plan"), AnalysisPlan):
        raise PreregError(f"{Path(folder) / 'claims.yaml'}: no analysis_plan")
    return doc["analysis_plan"]


def check_claims(folder: str | Path) -> None:
    """Refuse, before a freeze, a ``claims.yaml`` whose ``analysis_plan`` does not satisfy its JSON schema
    (:func:`kvcert.config.analysis_plan.check_schema`) or the typed plan's checks, in one line naming the key."""
    path = Path(folder) / "claims.yaml"
    doc = yaml.safe_load(path.read_text()) if path.exists() else None
    if not isinstance(doc, dict) or "analysis_plan" not in doc:
        raise PreregError(f"{path}: no analysis_plan to freeze")
    try:
        check_schema(doc["analysis_plan"])
    except ValueError as exc:
        raise PreregError(f"{path}: {exc}; fix claims.yaml before freezing") from None


def prereg_files(folder: str | Path) -> dict[str, str]:
    """{relative path: SHA-256} of claims.yaml and grids/*.yaml."""
    folder = Path(folder)
    paths = [folder / "claims.yaml", *sorted((folder / "grids").glob("*.yaml"))]
    missing = [p for p in paths[:1] if not p.exists()]
    if missing:
        raise PreregError(f"{missing[0]}: no claims.yaml in the pre-registration folder {folder}")
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def uncommitted(folder: str | Path, files: dict[str, str]) -> list[str]:
    """The files of ``files`` (``{relative path: SHA-256}`` of the pre-registration folder) whose bytes are not those
    of the git commit the freeze would record (``HEAD``): changed, or not in that commit. Empty outside a git work
    tree (the freeze then records no commit it could differ from)."""
    import subprocess

    folder = Path(folder)
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=folder, capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    if top.returncode != 0 or not top.stdout.strip():
        return []
    root = Path(top.stdout.strip()).resolve()
    differ = []
    for name, digest in files.items():
        path = (folder / name).resolve().relative_to(root).as_posix()
        shown = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=root, capture_output=True, timeout=10)
        if shown.returncode != 0 or hashlib.sha256(shown.stdout).hexdigest() != digest:
            differ.append(name)
    return differ


def hash_listing(files: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def chain_hash(earlier: list[dict], record: dict) -> str:
    """SHA-256 of the canonical JSON of every earlier record's full content (chain order) and
    ``record``'s :data:`CHAINED_FIELDS`."""
    payload = {"earlier": earlier, "record": {k: record.get(k) for k in CHAINED_FIELDS}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def parse_utc(text: str) -> datetime:
    """An ISO time (``Z`` or an offset; naive = UTC) as an aware datetime."""
    t = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def stamp(moment: datetime) -> str:
    """The file name (stem) of a freeze record made at ``moment``."""
    moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y%m%dT%H%M%S") + f".{moment.microsecond:06d}Z"


@dataclass(frozen=True)
class Freeze:
    path: Path
    frozen_utc: str
    git_commit: str
    reason: str
    files: dict[str, str]
    prereg_hash: str
    amends: str | None
    content: dict = field(default_factory=dict, compare=False, repr=False)  # the record as parsed

    @property
    def chained(self) -> bool:
        return "chain" in self.content

    def to_dict(self) -> dict:
        return {
            "frozen_utc": self.frozen_utc, "git_commit": self.git_commit, "reason": self.reason,
            "files": self.files, "prereg_hash": self.prereg_hash, "amends": self.amends,
            "freeze_record": self.path.name,
        }


def _read(path: Path) -> Freeze:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise PreregError(f"{path}: not a freeze record (a YAML mapping); restore it from git "
                          f"(git checkout -- {path})")
    try:
        return Freeze(path, str(data["frozen_utc"]), data["git_commit"], data.get("reason", ""), data["files"],
                      data["prereg_hash"], data.get("amends"), data)
    except KeyError as exc:
        raise PreregError(f"{path}: freeze record lacks {exc.args[0]!r}; restore it from git "
                          f"(git checkout -- {path})") from None


def _restore(folder: Path) -> str:
    return f"restore the records from git (git checkout -- {folder / FREEZE_DIR})"


def record_paths(folder: str | Path) -> list[Path]:
    """The freeze record files of a pre-registration folder, by name: ``freeze/*.yaml`` but hidden
    files (the temporary files of a writer, alive or killed: never records)."""
    return [path for path in sorted((Path(folder) / FREEZE_DIR).glob("*.yaml")) if not path.name.startswith(".")]


def freezes(folder: str | Path) -> list[Freeze]:
    """All freeze records in chain order, oldest first (see the module docstring); a chain that
    forks or has a gap raises :class:`PreregError`."""
    folder = Path(folder)
    records = [_read(path) for path in record_paths(folder)]
    order = [r for r in records if not r.chained]
    chained = {r.path.name: r for r in records if r.chained}
    previous = order[-1].path.name if order else None
    while chained:
        following = sorted(name for name, r in chained.items() if r.amends == previous)
        if len(following) > 1:
            raise PreregError(
                f"{folder / FREEZE_DIR}: {' and '.join(following)} both amend {previous}: the chain forks "
                "(amendments made on parallel branches); remove all but one (git rm) and amend again with "
                f"`kvcert prereg freeze --folder {folder} --reason '...'`")
        if not following:
            stray = sorted(chained)[0]
            raise PreregError(
                f"{folder / FREEZE_DIR / stray}: amends {chained[stray].amends}, but the chain ends with "
                f"{previous}: a record is missing or out of order; {_restore(folder)}")
        record = chained.pop(following[0])
        order.append(record)
        previous = record.path.name
    return order


def corrects_clock(record: Freeze | dict) -> bool:
    """Whether a record's reason declares that the record it amends was made on a wrong clock
    (:data:`CLOCK_CORRECTION`): the one record an existing chain may hold dated before its predecessor (written by
    a kvcert before :func:`freeze` refused every backdated record; :func:`check_chain` still accepts it)."""
    reason = record.reason if isinstance(record, Freeze) else record.get("reason", "")
    return bool(CLOCK_CORRECTION.search(str(reason or "")))


def check_chain(folder: str | Path, records: list[Freeze]) -> None:
    """Refuse a record whose ``frozen_utc`` is not the time in its file name, a record whose hash
    does not match its content (and, chained, the records before it), a chained record dated
    before its predecessor in the chain unless it corrects that one's clock (:func:`corrects_clock`)."""
    folder = Path(folder)
    for index, record in enumerate(records):
        try:
            named = stamp(parse_utc(record.frozen_utc))
        except ValueError:
            named = None
        if named != record.path.stem:
            raise PreregError(
                f"{record.path}: frozen_utc {record.frozen_utc} is not the time of its file name: the record "
                f"was edited after it was written; {_restore(folder)}")
        if record.chained:
            expected = chain_hash([r.content for r in records[:index]], record.content)
        else:
            expected = hash_listing(record.files)
        if record.prereg_hash != expected:
            raise PreregError(
                f"{record.path}: its prereg_hash {record.prereg_hash} does not match its content"
                + (" and the records before it" if record.chained else "")
                + f" ({expected}): a freeze record was edited, removed or reordered after it was written; "
                + _restore(folder))
        if record.chained and index and not corrects_clock(record):
            before = records[index - 1]
            earlier = parse_utc(before.frozen_utc) - parse_utc(record.frozen_utc)
            if earlier > timedelta(0):
                raise PreregError(
                    f"{record.path}: frozen {record.frozen_utc}, {_span(earlier)} before the record it amends "
                    f"({before.path.name}, frozen {before.frozen_utc}): it was made on a clock that was behind; "
                    f"remove it (git rm {record.path}) and amend again from a machine whose clock is right: "
                    f"`kvcert prereg freeze --folder {folder} --reason '...'`")


def _span(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds < 120:  # ordinary clock skew: "0.0 h" would hide it
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    hours = seconds / 3600
    return f"{hours:.1f} h" if hours < 48 else f"{hours / 24:.1f} days"


def _ahead(record: Freeze, now: datetime) -> timedelta:
    return parse_utc(record.frozen_utc) - now


def check_forward(previous: list[Freeze], now: datetime) -> None:
    """Refuse, outright, a freeze at ``now`` earlier than the newest record's ``frozen_utc`` (newest in chain order):
    an amendment never predates what it amends, whatever its reason says. One line, with no command that would
    write one: fix this clock, or (a clock checked to be right) wait until the newest record's time."""
    if not previous or _ahead(previous[-1], now) <= timedelta(0):
        return
    newest = previous[-1]
    raise PreregError(
        f"this machine's clock reads {now.astimezone(timezone.utc).isoformat(timespec='seconds')}, "
        f"{_span(_ahead(newest, now))} before the newest freeze record {newest.path.name} (frozen "
        f"{newest.frozen_utc}): an amendment cannot predate the record it amends, whatever its reason; freeze "
        f"from a machine whose clock is right (NTP). This clock is the likelier one to be wrong: {CLOCK_CHECK}; if "
        f"it is behind, fix it and freeze again. Only if a clock so checked is right was {newest.path.name} made "
        f"on a clock that ran ahead: amend it once {newest.frozen_utc} has passed, or take it out of the chain by "
        "hand (the results stamped with its hash are then refused) and freeze again from that clock")


def freeze(folder: str | Path, reason: str = "", now: datetime | None = None) -> Freeze:
    """Write a new freeze record (an amendment if one exists: a reason is then required).

    Refused when this machine's clock (``now``) reads earlier than the newest record's
    ``frozen_utc`` (:func:`check_forward`, whatever the reason: an amendment never predates what
    it amends, so a slow clock is fixed, or the freeze made elsewhere, rather than recorded).
    Leftover temporary files of killed freezes (``freeze/.<name>.<pid>.tmp.yaml``) are removed
    first."""
    folder = Path(folder)
    remove_leftovers(folder / FREEZE_DIR, folder=True)
    previous = freezes(folder)
    check_chain(folder, previous)
    if previous and not reason.strip():
        raise PreregError("reason: an amendment of a frozen pre-registration must say why (--reason '...')")
    files = prereg_files(folder)
    check_claims(folder)
    differ = uncommitted(folder, files)
    if differ:  # the record names a commit: it must hold the files frozen
        raise PreregError(f"{', '.join(differ)} differ from the commit the freeze would record ({git_commit(folder)[:12]}): "
                          f"commit them first (git commit {' '.join(str(Path(folder) / d) for d in differ)}), then freeze")
    now = now or datetime.now(timezone.utc)
    check_forward(previous, now)
    if previous and previous[-1].files == files and _ahead(previous[-1], now) <= CLOCK_TOLERANCE:
        raise PreregError(f"nothing to amend: the files match the freeze {previous[-1].path.name}")
    target = folder / FREEZE_DIR / f"{stamp(now)}.yaml"
    if target.exists():
        raise PreregError(f"{target}: a freeze record with this time exists already; try again in a second")
    record = {
        "frozen_utc": now.astimezone(timezone.utc).isoformat(timespec="microseconds"),
        "git_commit": git_commit(folder),
        "reason": reason.strip() or "initial freeze, before any result exists",
        "amends": previous[-1].path.name if previous else None,
        "chain": CHAIN_VERSION,
        "files": files,
        "files_hash": hash_listing(files),
    }
    record["prereg_hash"] = chain_hash([r.content for r in previous], record)
    write_text(target, yaml.safe_dump(record, sort_keys=False))
    return freezes(folder)[-1]


def verify(folder: str | Path, now: datetime | None = None) -> Freeze:
    """The newest freeze if the chain is intact, its time not ahead of this clock and every file
    still matches it; else :class:`PreregError` in one line."""
    folder = Path(folder)
    records = freezes(folder)
    if not records:
        raise PreregError(f"{folder}: the pre-registration is not frozen; run `kvcert prereg freeze --folder {folder}`")
    check_chain(folder, records)
    latest = records[-1]
    now = now or datetime.now(timezone.utc)
    ahead = _ahead(latest, now)
    if ahead > CLOCK_TOLERANCE:
        raise PreregError(
            f"{latest.path}: frozen {latest.frozen_utc}, {_span(ahead)} ahead of this "
            f"machine's clock ({now.isoformat(timespec='seconds')}): it was made on a clock that ran ahead, or this "
            f"one is behind; {CLOCK_CHECK}: if this clock is wrong, fix it (NTP) and rerun; only if it is right, "
            f"it verifies once {latest.frozen_utc} has passed, or take it out of the chain by hand (the results "
            "stamped with its hash are then refused) and freeze again from that clock; no amendment may predate it")
    current = prereg_files(folder)
    for name in sorted(set(current) | set(latest.files)):
        if current.get(name) != latest.files.get(name):
            what = "was added" if name not in latest.files else "is missing" if name not in current else "was edited"
            raise PreregError(
                f"{folder / name} {what} after the freeze of {latest.frozen_utc} ({latest.path.name}); restore it, "
                f"or amend with `kvcert prereg freeze --folder {folder} --reason '...'` (a new dated freeze; earlier ones are kept)"
            )
    return latest


def read_verified(path: str | Path) -> dict:
    """The content of a ``kvcert prereg verify --out`` file; a missing, empty or unreadable one is
    refused in one line naming it."""
    path = Path(path)
    redo = f"rerun `kvcert prereg verify --out {path}`"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise PreregError(f"{path}: no such verification file; {redo}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PreregError(f"{path}: not a verification record ({'an empty file' if not text.strip() else exc}); "
                          f"{redo}") from None
    if not isinstance(data, dict) or "prereg_hash" not in data:
        raise PreregError(f"{path}: not a verification record (no prereg_hash); {redo}")
    return data


def check_clock(verified: str | Path, verified_utc: str | None, now: datetime | None = None) -> None:
    """Refuse to start a job on a machine whose clock reads earlier than the verification it read
    (by more than :data:`CLOCK_TOLERANCE`): its records would be stamped before the freeze."""
    if verified_utc is None:
        return
    now = now or datetime.now(timezone.utc)
    behind = parse_utc(verified_utc) - now
    if behind > CLOCK_TOLERANCE:
        raise PreregError(
            f"this machine's clock reads {now.isoformat(timespec='seconds')}, {_span(behind)} "
            f"before the verification it read ({verified}, {verified_utc}); a job cannot start before it: fix this "
            "machine's clock (NTP) and rerun")


def run(args) -> int:
    from .paths import resolve_prereg

    args.folder = resolve_prereg(args.folder)
    if args.action == "freeze":
        record = freeze(args.folder, args.reason or "")
        print(f"frozen {record.path} prereg_hash={record.prereg_hash}")
    else:
        record = verify(args.folder)
        if args.out:  # the time of the verification: no job that reads it can start before it
            data = record.to_dict() | {"verified_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            write_text(args.out, json.dumps(data, indent=2, sort_keys=True) + "\n")
        print(f"verified against {record.path.name} (frozen {record.frozen_utc}) prereg_hash={record.prereg_hash}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("prereg", help="freeze or verify the pre-registration")
    p.add_argument("action", choices=["freeze", "verify"])
    p.add_argument("--folder", default=None, help="pre-registration folder (default: $KVCERT_PREREG, else ./preregistration)")
    p.add_argument("--reason", default=None, help="why this (amending) freeze is made")
    p.add_argument("--out", default=None, help="verify: write the verified freeze record as JSON here")
    p.set_defaults(func=run)
