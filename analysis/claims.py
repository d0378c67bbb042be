"""Scores + replay → claims.json: the seven pre-registered claims with their verdicts.

    python analysis/claims.py --scores scores.parquet [--replay replay.parquet ...] \
        [--stability-replay replay.parquet ...] \
        --prereg preregistration [--verified verified.json] --experiment smoke [--configs configs] \
        --out claims.json

The experiment's design grid (its main tasks and multi-turn cell) is the ``grid`` of
``configs/experiment/<experiment>.yaml``, else ``grids/<experiment>.yaml`` in the
pre-registration folder. The same as ``kvcert claims …`` (:mod:`kvcert.analysis.cli`); logic: :func:`kvcert.analysis.steps.claims_step`.
"""

import sys

from kvcert.cli import main

if __name__ == "__main__":
    status = main(["claims", *sys.argv[1:]])
    if status:
        sys.exit(status)
