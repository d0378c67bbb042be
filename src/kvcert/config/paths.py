"""Where the repository folders a command reads are: ``configs/`` (the hydra groups and
``pipeline.yaml``) and ``preregistration/`` (claims, grids, freeze records).

Every command finds them here, the same way: the environment variable
(``KVCERT_CONFIGS`` / ``KVCERT_PREREG``) if set; else the folder of that name in the
working directory (the checkout a command is run from); else the source checkout of an
editable install; else the copy bundled into a wheel (:func:`bundled`). An explicit
``--configs`` / ``--prereg`` argument wins over all of them (:func:`resolve_configs`,
:func:`resolve_prereg`).
"""

from __future__ import annotations

import os
from pathlib import Path


def configs_dir() -> Path:
    """The hydra ``configs/`` folder: ``$KVCERT_CONFIGS``; else ``./configs`` (the working
    copy a command is run from); else the source checkout of an editable install; else
    the copy bundled into a wheel (:func:`bundled`)."""
    return _located("configs", "KVCERT_CONFIGS", "config.yaml")


def prereg_dir() -> Path:
    """The pre-registration folder, located as :func:`configs_dir` locates ``configs/``
    (``$KVCERT_PREREG``, ``./preregistration``, the checkout, the wheel's copy)."""
    return _located("preregistration", "KVCERT_PREREG", "claims.yaml")


def bundled(name: str) -> Path:
    """Where a wheel install keeps its copy of the repository folder ``name``."""
    return Path(__file__).resolve().parents[1] / "_bundled" / name


def _located(name: str, variable: str, marker: str) -> Path:
    if os.environ.get(variable):
        return Path(os.environ[variable]).resolve()
    for candidate in (Path.cwd() / name, Path(__file__).resolve().parents[3] / name, bundled(name)):
        if (candidate / marker).is_file():
            return candidate.resolve()
    raise FileNotFoundError(
        f"no {name}/ folder found (looked in the working directory, the source checkout and the "
        f"installed package); run from a kvcert checkout or set {variable}"
    )


def resolve_configs(given: str | Path | None) -> Path:
    """``given`` (a ``--configs`` argument) if set, else :func:`configs_dir`."""
    return Path(given).resolve() if given else configs_dir()


def resolve_prereg(given: str | Path | None) -> Path:
    """``given`` (a ``--prereg`` / ``--folder`` argument) if set, else :func:`prereg_dir`."""
    return Path(given) if given else prereg_dir()
