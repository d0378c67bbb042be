"""Generation shards → one scored row per generation (Parquet).

    python analysis/score.py --shards SHARD.jsonl ... --prereg preregistration \
        [--experiment smoke --configs configs] [--verified verified.json] [--jobs N] --out scores.parquet

Refuses records missing a field or stamped with another pre-registration hash, and
shards that differ from their seal or (with ``--experiment``) hold another number of
records than the plan; flags records started before the freeze. The same as ``kvcert score …`` (:mod:`kvcert.analysis.cli`); logic:
:func:`kvcert.analysis.steps.score_step`.
"""

import sys

from kvcert.cli import main

if __name__ == "__main__":
    status = main(["score", *sys.argv[1:]])
    if status:
        sys.exit(status)
