"""Generation shards → one scored row per generation (Parquet).

    python analysis/score.py --shards SHARD.jsonl ... --prereg preregistration \
        [--experiment smoke --configs configs] [--verified verified.json] [--jobs N] --out scores.parquet

Refuses records missing a field or stamped with another pre-registration hash, and
shards that differ from their seal or (with ``--experiment``) hold another number of
records than the plan; flags records started before the freeze. Logic:
:func:`kvcert.analysis.steps.score_step`.
"""

import argparse

from kvcert.analysis.steps import planned_counts, score_step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", nargs="+", required=True, help="finished generation shards (JSONL)")
    p.add_argument("--prereg", default="preregistration", help="pre-registration folder (frozen)")
    p.add_argument("--experiment", default=None, help="experiment whose plan gives each shard's record count")
    p.add_argument("--configs", default=None, help="hydra configs folder (with --experiment)")
    p.add_argument("--verified", default=None, help="`kvcert prereg verify --out` JSON; must match the folder")
    p.add_argument("--out", required=True, help="scores table (Parquet)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes parsing shards (default 1)")
    a = p.parse_args()
    expected = planned_counts(a.shards, a.experiment, a.prereg, a.configs) if a.experiment else None
    print(score_step(a.shards, a.prereg, a.out, a.verified, a.jobs, expected))


if __name__ == "__main__":
    main()
