"""Scores + replay → claims.json: the seven pre-registered claims with their verdicts.

    python analysis/claims.py --scores scores.parquet [--replay replay.parquet ...] \
        --prereg preregistration --experiment smoke --out claims.json

Logic: :func:`kvcert.analysis.steps.claims_step`.
"""

import argparse

from kvcert.analysis.steps import claims_step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scores", required=True, help="scores table from analysis/score.py")
    p.add_argument("--replay", nargs="*", default=[], help="replay tables from analysis/replay.py (one per model)")
    p.add_argument("--prereg", default="preregistration", help="pre-registration folder (frozen)")
    p.add_argument("--experiment", required=True, help="design grid name (preregistration/grids/<name>.yaml)")
    p.add_argument("--out", required=True, help="claims JSON")
    a = p.parse_args()
    content = claims_step(a.scores, a.replay, a.prereg, a.experiment, a.out)
    for c in content["claims"]:
        print(f"{c['id']}: {c['verdict']} ({c['statistic']} = {c['value']}, CI {c['ci']})")


if __name__ == "__main__":
    main()
