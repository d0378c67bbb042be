"""Sharded JSONL output that survives interruption.

A shard is written to ``<name>.partial`` one record per line, each line flushed as it
is written. A rerun reads the partial file, keeps every complete record, recovers from
a truncated last line (a kill in the middle of a write) by cutting it off, and skips
the generations already done (keyed by their :class:`~kvcert.generation.record.GenerationKey`),
so no record is lost, duplicated or recomputed. Only when every expected record is present
is the shard declared done, by an atomic rename to its final name. :func:`read_records` reads a finished shard and names the file and line of
anything that does not parse.

A finished shard is *sealed*: beside it, ``<name>.seal.json`` holds its record count and
the SHA-256 of its bytes, written just before the rename. :func:`check_seal` compares a
shard with its seal (and with the record count the plan expects): a shard that lost
lines, or whose records were edited after it was finished, is refused in one line
instead of being scored.

A shard is the records of one code: a partial file begun at another record-code digest
(:func:`kvcert.provenance.code_digest`, every record's ``code_digest``) is not resumed
(:func:`check_one_code`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Iterable

from ..atomic import write_text
from .record import GenerationKey


def record_key(record: dict) -> GenerationKey:
    """What identifies a generation inside a shard: its :class:`~kvcert.generation.record.GenerationKey`."""
    return GenerationKey.of(record)


class CorruptShardError(ValueError):
    """A shard line that does not parse, named by path and line number."""


def partial_path(final: Path) -> Path:
    return final.with_name(final.name + ".partial")


def seal_path(final: str | Path) -> Path:
    final = Path(final)
    return final.with_name(final.name + ".seal.json")


def file_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_seal(final: str | Path, content: str | Path, records: int) -> Path:
    """Seal the shard ``final`` whose bytes are in ``content`` (the partial about to become it)."""
    return write_text(seal_path(final), json.dumps({"records": records, "sha256": file_digest(content)},
                                                   sort_keys=True) + "\n")


class ShardSealError(ValueError):
    """A finished shard that does not match its seal or the plan; the message says how to fix it."""


def check_seal(path: str | Path, records: int, expected: int | None = None) -> None:
    """Refuse a finished shard of ``records`` records that has no seal, differs from its
    seal, or holds another number of records than the plan's ``expected``."""
    path = Path(path)
    seal = seal_path(path)
    regenerate = f"delete {path} and {seal.name} and rerun to regenerate it"
    if not seal.exists():
        raise ShardSealError(f"{path}: no seal ({seal.name}); it was not finished by kvcert's shard writer; {regenerate}")
    try:
        data = json.loads(seal.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        reason = "an empty file" if not seal.read_text().strip() else f"does not parse: {exc}"
        raise ShardSealError(f"{seal}: the seal of {path.name} is {reason}; {regenerate}") from None
    if data.get("sha256") != file_digest(path) or data.get("records") != records:
        raise ShardSealError(
            f"{path}: its content differs from its seal ({records} records now, {data.get('records')} when finished): "
            f"it was edited or cut after it was finished; {regenerate}"
        )
    if expected is not None and records != expected:
        raise ShardSealError(f"{path}: {records} records, the plan expects {expected}; {regenerate}")


def _scan(path: Path, allow_truncated_tail: bool) -> tuple[list[dict], int]:
    """Records of a JSONL file and the byte length of its complete prefix."""
    records: list[dict] = []
    good_bytes = 0
    lines = path.read_bytes().split(b"\n")
    for number, raw in enumerate(lines, start=1):
        if number == len(lines):  # the text after the last newline
            if raw == b"" or allow_truncated_tail:
                break  # nothing, or a truncated tail that resuming recomputes
            raise CorruptShardError(
                f"{path}:{number}: truncated line (no newline at end); rename the file to "
                f"{partial_path(path).name} and rerun: the shard resumes from its last complete line"
            )
        try:
            record = json.loads(raw)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            fix = "delete that line"
            if not allow_truncated_tail:  # a finished shard is never rerun while it exists: back to .partial
                fix += f", rename the file to {partial_path(path).name}"
            raise CorruptShardError(
                f"{path}:{number}: line does not parse ({exc}); {fix} and rerun to recompute it"
            ) from None
        records.append(record)
        good_bytes += len(raw) + 1
    return records, good_bytes


def read_records(path: str | Path) -> list[dict]:
    """All records of a finished shard; a corrupt line raises :class:`CorruptShardError`."""
    records, _ = _scan(Path(path), allow_truncated_tail=False)
    return records


class ShardCodeError(ValueError):
    """A partial shard whose records were made at another record-code digest than this code's."""


def check_one_code(partial: Path, records: Iterable[dict], code: str) -> None:
    """Refuse to resume ``partial`` when a record of it was made at another record-code digest than ``code``
    (:func:`kvcert.provenance.code_digest`; ``None``: written before kvcert stamped it): a shard holds the records
    of one code, or a finished shard would mix two codes' records and be scored as one run. One line naming both
    digests (and the commit the other was made at) and the two ways out. Refused, not restarted: a restart would
    discard finished work in silence, and the code changing under a half-written shard is itself news (an edit
    while a run was going, a checkout of another branch) that its owner decides on."""
    records = list(records)
    other = [r for r in records if r.get("code_digest") != code]
    if not other:
        return
    found = other[0].get("code_digest") or "none (written before records carried it)"
    raise ShardCodeError(
        f"{partial}: {len(other)} of its {len(records)} records were made at record code {found} (git commit "
        f"{other[0].get('git_commit')}), this code is {code}: a shard holds one code's records; delete {partial.name} "
        f"to regenerate the shard at {code}, or resume it at the code it was begun at")


class ShardWriter:
    """Resumable writer for one shard (see the module docstring)."""

    def __init__(self, final_path: str | Path):
        self.final = Path(final_path)
        self.partial = partial_path(self.final)
        self.done: dict[GenerationKey, dict] = {}
        self.recovered_tail = False
        self._fh = None
        self._lock = None

    def _acquire(self) -> None:
        """One writer per shard: an advisory lock the OS drops if the writer dies."""
        lock_path = self.final.with_name(self.final.name + ".lock")
        self._lock = open(lock_path, "a")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            self._lock = None
            raise RuntimeError(
                f"{self.final}: another process is writing this shard (lock {lock_path}); "
                "wait for it to finish or stop it (scancel / kill), then rerun"
            ) from None

    def open(self) -> "ShardWriter":
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self._acquire()
        if self.partial.exists():
            records, good = _scan(self.partial, allow_truncated_tail=True)
            if good < self.partial.stat().st_size:
                self.recovered_tail = True
                with open(self.partial, "r+b") as fh:
                    fh.truncate(good)
            for record in records:
                self.done.setdefault(record_key(record), record)
            if len(self.done) != len(records):  # duplicates from an older writer: rewrite once, first wins
                write_text(self.partial, "".join(json.dumps(r, sort_keys=True) + "\n" for r in self.done.values()))
        self._fh = open(self.partial, "a", buffering=1)
        return self

    def __enter__(self) -> "ShardWriter":
        return self.open() if self._fh is None else self

    def __exit__(self, *exc) -> None:
        self.close()

    def set_aside(self, keys: Iterable[GenerationKey] | None = None) -> Path:
        """Move the records of ``keys`` (default: all) out of the partial file into ``<partial>.stale``
        (kept, never read), and go on with the others: a partial file that mixes this shard's own records
        with foreign ones keeps its own."""
        if self._fh is not None:
            self._fh.close()
        aside = self.partial.with_name(self.partial.name + ".stale")
        moved = set(self.done) if keys is None else set(keys) & set(self.done)
        write_text(aside, "".join(json.dumps(self.done[k], sort_keys=True) + "\n" for k in moved))
        self.done = {k: r for k, r in self.done.items() if k not in moved}
        write_text(self.partial, "".join(json.dumps(r, sort_keys=True) + "\n" for r in self.done.values()))
        self._fh = open(self.partial, "a", buffering=1)
        return aside

    def is_done(self, key: GenerationKey) -> bool:
        return key in self.done

    def write(self, record: dict) -> None:
        key = record_key(record)
        if key in self.done:
            raise ValueError(f"{self.partial}: record {key} already written")
        self._fh.write(json.dumps(record, sort_keys=True) + "\n")
        self._fh.flush()
        self.done[key] = record

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._lock is not None:
            Path(self._lock.name).unlink(missing_ok=True)
            self._lock.close()  # closing drops the flock
            self._lock = None

    def finalize(self, expected_keys: Iterable[GenerationKey]) -> Path:
        """Atomically publish the shard once every expected record key is present."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        try:
            expected = set(expected_keys)
            missing = [i for i in expected if i not in self.done]
            if missing:
                raise RuntimeError(f"{self.partial}: {len(missing)} records missing (e.g. {missing[0]}); rerun to resume")
            extra = [k for k in self.done if k not in expected]
            if extra:  # never sealed into the shard: records of another shard or cell
                raise RuntimeError(f"{self.partial}: {len(extra)} records this shard does not plan (e.g. {extra[0]}); "
                                   "delete the file and rerun")
            write_seal(self.final, self.partial, len(self.done))
            os.replace(self.partial, self.final)
        finally:
            self.close()  # the lock is released only after the rename
        return self.final
