"""Package list for setuptools (everything else is in pyproject.toml).

Every ``kvcert*`` package found under ``src/``, plus ``kvcert_kernels``, which lives in
the top-level ``kernels/`` folder (mapped in pyproject's ``package-dir``). A find
directive in pyproject.toml cannot list a package under a name other than its folder's.
"""

from setuptools import find_packages, setup

setup(packages=find_packages("src", include=["kvcert", "kvcert.*"]) + ["kvcert_kernels"])
