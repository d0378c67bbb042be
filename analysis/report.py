"""claims.json + scores + replay + impossibility → report.md, report.html, summary.json, figures/*.png.

    python analysis/report.py --claims claims.json --scores scores.parquet \
        [--replay replay.parquet ...] [--stability-replay replay.parquet ...] \
        [--impossibility impossibility.json ...] \
        [--verified verified.json] [--beside miniature=results/smoke/claims.json ...] --out-dir results/real

The same as ``kvcert report …`` (:mod:`kvcert.analysis.cli`); logic: :func:`kvcert.analysis.steps.report_step`.
"""

import sys

from kvcert.cli import main

if __name__ == "__main__":
    status = main(["report", *sys.argv[1:]])
    if status:
        sys.exit(status)
