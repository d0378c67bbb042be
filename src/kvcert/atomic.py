"""Atomic output files: a reader sees the old file or the new one, never half of one.

Every output kvcert writes (scores, claims, summary, report, tables, figures, freeze
records, seals, manifests) goes through :func:`atomic_path`: the writer fills a
temporary file beside the target, flushed to disk, and :func:`os.replace` renames it
over the target in one step (POSIX rename is atomic within a file system). A writer that
fails removes its temporary file; one killed outright (SIGKILL) leaves the target as it was
and a hidden ``.<name>.<pid>.tmp<suffix>`` beside it, which nothing reads. The next atomic
write of the same target removes such leftovers whose process is no longer alive on this
machine (:func:`remove_leftovers`; ``kvcert prereg freeze`` sweeps its whole ``freeze/``
folder, whose record names change with every freeze); deleting one by hand is safe too.

A write that fails (a full disk, a read-only folder, a folder where the file should be)
raises :class:`WriteError`, an :class:`OSError` whose message names the target, the
operating system's reason and a remedy, in one line.

The bottom of the package, like :mod:`kvcert.provenance`: every stage may import it.
"""

from __future__ import annotations

import errno
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

#: the name of a temporary file of :func:`atomic_path`: ``.<stem>.<pid>.tmp<suffix>``
LEFTOVER = re.compile(r"^\.(?P<stem>.+)\.(?P<pid>\d+)\.tmp(?P<suffix>\.[^.]+)?$")

_REMEDIES = {
    errno.ENOSPC: "free space or write elsewhere",
    errno.EDQUOT: "free space (or raise the quota) or write elsewhere",
    errno.EFBIG: "write elsewhere (the file system refuses a file this large)",
    errno.EACCES: "make its folder writable or write elsewhere",
    errno.EPERM: "make its folder writable or write elsewhere",
    errno.EROFS: "the file system is read-only: write elsewhere",
    errno.EISDIR: "a folder is in the way: remove or rename it, or write elsewhere",
    errno.ENOTDIR: "a file is in the way of its folder: remove or rename it, or write elsewhere",
    errno.EEXIST: "a file is in the way of its folder: remove or rename it, or write elsewhere",
    errno.ENAMETOOLONG: "use a shorter path",
}


class WriteError(OSError):
    """An output could not be written; ``str()`` is one line naming the target, the reason and a
    remedy. The target is left as it was and no temporary file remains."""

    def __init__(self, path: Path, exc: BaseException):
        reason = getattr(exc, "strerror", None) or " ".join(str(exc).split()) or type(exc).__name__
        code = getattr(exc, "errno", None)
        super().__init__(code, reason, str(path))
        remedy = _REMEDIES.get(code, "fix that or write elsewhere")
        self.message = f"{path}: cannot write it ({reason}); it is left as it was: {remedy}"

    def __str__(self) -> str:
        return self.message


def _tmp_for(path: Path) -> Path:
    # the suffix is kept last, so writers that pick a format from it (savefig, to_csv) still do
    return path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")


def is_leftover(path: str | Path) -> bool:
    """Whether ``path``'s name is that of a temporary file of :func:`atomic_path` (never an output)."""
    return LEFTOVER.match(Path(path).name) is not None


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (our own process counts as alive)."""
    if pid == os.getpid():
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except (OverflowError, ValueError):
        return False
    except OSError:  # cannot tell: keep it
        return True
    return True


def leftovers(where: str | Path, *, folder: bool = False) -> list[Path]:
    """Temporary files of :func:`atomic_path` left by writers no longer alive on this machine:
    those of the target ``where`` (``.<stem>.<pid>.tmp<suffix>`` beside it), or, ``folder=True``,
    every one in the folder ``where``."""
    where = Path(where)
    parent = where if folder else where.parent
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    found = []
    for name in sorted(names):
        match = LEFTOVER.match(name)
        if match is None:
            continue
        if not folder and (match["stem"] != where.stem or (match["suffix"] or "") != where.suffix):
            continue
        if not _alive(int(match["pid"])):
            found.append(parent / name)
    return found


def remove_leftovers(where: str | Path, *, folder: bool = False) -> list[Path]:
    """Remove :func:`leftovers` (see there); returns those removed. Never raises: a leftover that
    cannot be removed stays (nothing reads it)."""
    removed = []
    for path in leftovers(where, folder=folder):
        try:
            path.unlink()
        except OSError:  # gone already (another sweep), or not ours to remove
            continue
        removed.append(path)
    return removed


def _about(exc: OSError, *paths: Path) -> bool:
    """Whether ``exc`` is about one of ``paths`` (or names no file: a write's ENOSPC names none)."""
    if exc.filename is None:
        return True
    try:
        named = {os.fspath(exc.filename), os.fspath(exc.filename2 or "")}
    except TypeError:
        return False
    return any(str(p) in named or os.path.abspath(p) in {os.path.abspath(n) for n in named if n} for p in paths)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path to write ``path``'s new content to; renamed over ``path`` on success,
    removed on failure. Parent folders are created; leftovers of killed writers of ``path`` are
    removed (:func:`remove_leftovers`). A failure to write (to the temporary file, or to publish
    it) raises :class:`WriteError` naming ``path``; other errors of the writer pass unchanged."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteError(path, exc) from exc
    remove_leftovers(path)
    tmp = _tmp_for(path)
    try:
        try:
            yield tmp
        except OSError as exc:
            if isinstance(exc, WriteError) or not _about(exc, tmp, path):
                raise  # e.g. an input the writer reads is missing: its own message names it
            raise WriteError(path, exc) from exc
        try:
            with open(tmp, "rb+") as fh:  # the bytes reach the disk before the rename publishes them
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            raise WriteError(path, exc) from exc
    finally:
        try:
            if tmp.exists():
                tmp.unlink()
        except OSError:
            pass


def write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding=encoding)
    return Path(path)


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)
