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

#: where the jobs that make records start: ``kvcert shard`` / ``kvcert generate`` (one generation shard), ``kvcert
#: manifest`` (the task records they read), ``kvcert run`` (a one-off run's shard) and ``kvcert replay`` (the replay
#: table). The record code is every module these import, found by :func:`record_modules`, not listed
RECORD_ROOTS = ("kvcert.cli", "kvcert.commands.cli", "kvcert.commands.oneoff", "kvcert.generation.cli", "kvcert.generation.runner",
                "kvcert.generation.replay_step", "kvcert.generation.manifest")
#: stages that never make a record, left out of the closure (a root among them is read for its imports only): the
#: analysis (scores, claims, report), the commands (orchestration) and the benchmarks; the embedded model's training and
#: the rehearsal's stand-in data files make inputs, which a record carries by their content (the model's and the
#: manifest's source digests), and ``kvcert.cli`` loads their command registrations only
RECORD_EXCLUDED = ("kvcert.analysis", "kvcert.commands", "kvcert.bench", "kvcert.training", "kvcert.rehearsal")
#: the packages whose modules can be record code (``kvcert_kernels`` is its own top-level package)
RECORD_PACKAGES = ("kvcert", "kvcert_kernels")


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


def _package_root(package: str) -> Path | None:
    """The folder of a top-level package, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _module_file(name: str, roots: dict[str, Path | None]) -> Path | None:
    """The source file of module ``name`` of :data:`RECORD_PACKAGES` (a package's ``__init__.py``), or None."""
    top, _, rest = name.partition(".")
    root = roots.get(top)
    if root is None:
        return None
    base = root.joinpath(*rest.split(".")) if rest else root
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    file = base.with_suffix(".py")
    return file if rest and file.is_file() else None


def _imported_names(path: Path, name: str) -> set[str]:
    """Every module name the source of module ``name`` (at ``path``) imports anywhere in its body — at the top, inside
    functions, or as ``importlib.import_module("literal")`` — absolute, with each imported name also tried as a
    submodule (``from .x import y`` may import module ``x.y``)."""
    import ast

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and not node.args[0].value.startswith(".")):
            found.add(node.args[0].value)
    out = set()
    for module in found:  # a module's import runs its parent packages' __init__ too
        parts = module.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


def _excluded(name: str) -> bool:
    return any(name == stage or name.startswith(stage + ".") for stage in RECORD_EXCLUDED)


@lru_cache(maxsize=1)
def record_modules() -> dict[str, Path]:
    """The code that makes records, found rather than listed: the import closure of :data:`RECORD_ROOTS` within
    :data:`RECORD_PACKAGES` — every module their source imports (top-level, inside functions, or by
    ``importlib.import_module`` of a literal name), and every module those import, transitively, with their parent
    packages — less the stages of :data:`RECORD_EXCLUDED`, which are neither followed nor hashed (a root among them
    is read for its imports only). Read from the source, so a module imported only on some path (a lazy import)
    is in it too: a superset of what one run imports (tests/test_provenance.py checks that nothing a generation or
    replay job imports is outside it). Module name → source file."""
    roots = {package: _package_root(package) for package in RECORD_PACKAGES}
    found: dict[str, Path] = {}
    todo = list(RECORD_ROOTS)
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_file(name, roots)
        if path is None:
            continue
        if not _excluded(name) or name in RECORD_ROOTS:
            if not _excluded(name):
                found[name] = path
            todo.extend(m for m in _imported_names(path, name) if m.partition(".")[0] in roots and m not in seen
                        and not _excluded(m))
    return dict(sorted(found.items()))


@lru_cache(maxsize=1)
def code_digest() -> str:
    """SHA-256 (first 16 hex digits) of the code that makes records (:func:`record_modules`): each module's name and
    the SHA-256 of its source bytes, in sorted order. The same source gives the same digest in a checkout, an
    editable install and a wheel; a record's digest beside the current one says whether the code that made it has
    changed since (tests/test_reference_results.py). Records made before the closure was found (the digest of four
    listed package folders) keep the digests they carry."""
    h = hashlib.sha256()
    for name, path in record_modules().items():
        h.update(f"{name}\n".encode())
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
