"""Wheel contents for setuptools beyond pyproject.toml (which lists the packages: ``kvcert``
under ``src/``, ``kvcert_kernels`` under ``kernels/``).

A wheel (a non-editable install) also carries copies of the repository's ``configs/``
and ``preregistration/`` folders as ``kvcert/_bundled/``, so that the CLI works outside
a checkout; run from a checkout, the working copy's folders win
(:mod:`kvcert.config.paths`). Editable installs read the checkout.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
BUNDLED = ("configs", "preregistration")


class BuildWithBundledFolders(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for name in BUNDLED:
            target = Path(self.build_lib) / "kvcert" / "_bundled" / name
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(ROOT / name, target, ignore=shutil.ignore_patterns("__pycache__"))


setup(
    cmdclass={"build_py": BuildWithBundledFolders},
)
