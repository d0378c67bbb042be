"""Package list and wheel contents for setuptools (everything else is in pyproject.toml).

Every ``kvcert*`` package found under ``src/``, plus ``kvcert_kernels``, which lives in
the top-level ``kernels/`` folder (mapped in pyproject's ``package-dir``). A find
directive in pyproject.toml cannot list a package under a name other than its folder's.

A wheel (a non-editable install) also carries copies of the repository's ``configs/``
and ``preregistration/`` folders as ``kvcert/_bundled/``, so that the CLI works outside
a checkout; run from a checkout, the working copy's folders win
(:mod:`kvcert.paths`). Editable installs read the checkout.
"""

import shutil
from pathlib import Path

from setuptools import find_packages, setup
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
    packages=find_packages("src", include=["kvcert", "kvcert.*"]) + ["kvcert_kernels"],
    cmdclass={"build_py": BuildWithBundledFolders},
)
