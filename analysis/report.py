"""claims.json + scores + replay + impossibility → report.md, report.html, summary.json, figures/*.png.

    python analysis/report.py --claims claims.json --scores scores.parquet \
        [--replay replay.parquet ...] [--impossibility impossibility.json ...] \
        [--verified verified.json] --out-dir results/smoke

Logic: :func:`kvcert.analysis.steps.report_step`.
"""

import argparse

from kvcert.analysis.steps import report_step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--claims", required=True, help="claims JSON from analysis/claims.py")
    p.add_argument("--scores", default=None, help="scores table from analysis/score.py")
    p.add_argument("--replay", nargs="*", default=[], help="replay tables (one per model)")
    p.add_argument("--impossibility", nargs="*", default=[], help="impossibility JSON files (one per model)")
    p.add_argument("--verified", default=None, help="`kvcert prereg verify --out` JSON; must match the claims")
    p.add_argument("--out-dir", required=True, help="report folder")
    a = p.parse_args()
    paths = report_step(a.claims, a.scores, a.replay, a.impossibility, a.out_dir, a.verified)
    for key in ("markdown", "html", "summary"):
        print(paths[key])


if __name__ == "__main__":
    main()
