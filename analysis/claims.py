"""Scores + replay → claims.json: the seven pre-registered claims with their verdicts.

    python analysis/claims.py --scores scores.parquet [--replay replay.parquet ...] \
        --prereg preregistration [--verified verified.json] --experiment smoke [--configs configs] \
        --out claims.json

The experiment's design grid (its main tasks and multi-turn cell) is the ``grid`` of
``configs/experiment/<experiment>.yaml``, else ``grids/<experiment>.yaml`` in the
pre-registration folder. Logic: :func:`kvcert.analysis.steps.claims_step`.
"""

import argparse

from kvcert.analysis.steps import claims_step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scores", required=True, help="scores table from analysis/score.py")
    p.add_argument("--replay", nargs="*", default=[], help="replay tables from analysis/replay.py (one per model)")
    p.add_argument("--prereg", default="preregistration", help="pre-registration folder (frozen)")
    p.add_argument("--verified", default=None, help="`kvcert prereg verify --out` JSON; must match the folder")
    p.add_argument("--experiment", required=True, help="experiment name (its design grid)")
    p.add_argument("--configs", default="configs", help="configs folder holding experiment/<name>.yaml")
    p.add_argument("--out", required=True, help="claims JSON")
    a = p.parse_args()
    content = claims_step(a.scores, a.replay, a.prereg, a.experiment, a.out, a.verified, a.configs)
    for c in content["claims"]:
        print(f"{c['id']}: {c['verdict']} ({c['statistic']} = {c['value']}, CI {c['ci']})")


if __name__ == "__main__":
    main()
