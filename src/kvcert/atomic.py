"""Atomic output files: a reader sees the old file or the new one, never half of one.

Every output kvcert writes (scores, claims, summary, report, tables, figures, freeze
records, seals, manifests) goes through :func:`atomic_path`: the writer fills a
temporary file beside the target, flushed to disk, and :func:`os.replace` renames it
over the target in one step (POSIX rename is atomic within a file system). A writer that
fails removes its temporary file; one killed outright (SIGKILL) leaves the target as it was
and a hidden ``.<name>.<pid>.tmp<suffix>`` beside it, which nothing reads (delete it at will).

The bottom of the package, like :mod:`kvcert.provenance`: every stage may import it.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def _tmp_for(path: Path) -> Path:
    # the suffix is kept last, so writers that pick a format from it (savefig, to_csv) still do
    return path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path to write ``path``'s new content to; renamed over ``path`` on success,
    removed on failure. Parent folders are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_for(path)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:  # the bytes reach the disk before the rename publishes them
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


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
