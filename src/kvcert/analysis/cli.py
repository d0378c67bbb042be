"""``kvcert score | claims | report``: the analysis steps, one command each (``kvcert replay``, the model side
of C1, C2 and C8, is a generation step: :mod:`kvcert.generation.cli`).

The Snakefile runs them, and the scripts in ``analysis/`` are these commands under
another name (``python analysis/score.py …`` = ``kvcert score …``), so each step has one
way to run and one argument list. The logic is :mod:`kvcert.analysis.steps`; it is
imported when a command runs, so ``kvcert --help`` loads none of it.
"""

from __future__ import annotations

from ..config.paths import resolve_configs, resolve_prereg


def _folders(a) -> None:
    """``--prereg`` / ``--configs`` not given: the folders every command finds (:mod:`kvcert.config.paths`:
    ``$KVCERT_PREREG`` / ``$KVCERT_CONFIGS``, the working directory, the checkout, the wheel's copy)."""
    if hasattr(a, "prereg"):
        a.prereg = str(resolve_prereg(a.prereg))
    if hasattr(a, "configs"):
        try:
            a.configs = str(resolve_configs(a.configs))
        except FileNotFoundError:  # only --experiment and --model read it; they say so where they do
            pass


def _score(a) -> int:
    _folders(a)
    from .steps import planned_shards, score_step

    expected = planned_shards(a.shards, a.experiment, a.prereg, a.configs, dict(a.model_path)) if a.experiment else None
    print(score_step(a.shards, a.prereg, a.out, a.verified, a.jobs, expected))
    return 0


def _claims(a) -> int:
    _folders(a)
    from .steps import claims_step

    content = claims_step(a.scores, a.replay, a.prereg, a.experiment, a.out, a.verified, a.configs,
                          a.accept_excluded, a.stability_replay)
    print(claims_line(content["claims"], a.out))
    return 0


def claims_line(claims: list[dict], out) -> str:
    """The claims step's one line: how many claims, their verdicts counted, where they are. The verdicts with
    their values, rounded, are printed once, at the end of a pipeline run (``kvcert.commands.console``), and
    stand in report.md."""
    counts: dict[str, int] = {}
    for c in claims:
        counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
    return (f"{out}: {len(claims)} claims ({', '.join(f'{n} {v}' for v, n in counts.items())}); each verdict "
            "with its value: the pipeline's last lines and report.md")


def _report(a) -> int:
    _folders(a)
    from .steps import report_step

    paths = report_step(a.claims, a.scores, a.replay, a.impossibility, a.out_dir, a.verified, a.beside, a.configs,
                        dict(a.model_path), a.stability_replay)
    for key in ("markdown", "html", "summary"):
        print(paths[key])
    return 0


def _model_path(text: str) -> tuple[str, str]:
    import argparse

    model, sep, path = text.partition("=")
    if not sep or not model or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: give MODEL=PATH (e.g. embedded=results/smoke/model/embedded)")
    return model, path


def _beside(text: str) -> tuple[str, str]:
    import argparse

    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: give LABEL=PATH, PATH another run's claims.json "
                                         "(e.g. miniature=results/smoke/claims.json)")
    return label, path


def register(subparsers) -> None:
    verified_help = "`kvcert prereg verify --out` JSON; must match the folder"
    p = subparsers.add_parser("score", help="generation shards → one scored row per generation (Parquet)",
                              description="Generation shards → one scored row per generation. Refuses records "
                              "missing a field or stamped with another pre-registration hash, and shards that differ "
                              "from their seal, and (with --experiment) records the plan does not put in their shard, planned records "
                              "missing, and records whose config_hash differs from the config their job composes now. "
                              "Every record is rescored from its answer with its task's metric.")
    p.add_argument("--shards", nargs="+", required=True, help="finished generation shards (JSONL)")
    p.add_argument("--prereg", default=None, help="pre-registration folder (frozen; default: $KVCERT_PREREG, else ./preregistration)")
    p.add_argument("--experiment", default=None, help="experiment whose plan gives each shard's records")
    p.add_argument("--configs", default=None, help="hydra configs folder (with --experiment; default: $KVCERT_CONFIGS, else ./configs)")
    p.add_argument("--model-path", action="append", default=[], type=_model_path, metavar="MODEL=PATH",
                   help="a model's path as its generate jobs were given it (kvcert shard --model-path); repeatable")
    p.add_argument("--verified", default=None, help=verified_help)
    p.add_argument("--out", required=True, help="scores table (Parquet)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes parsing shards (default 1)")
    p.set_defaults(func=_score)

    p = subparsers.add_parser("claims", help="scores + replay → claims.json (the pre-registered claims, verdicts)",
                              description="Scores + replay → claims.json: the pre-registered claims with their "
                              "verdicts. The design grid is the one the experiment's settings name "
                              "(configs/experiment/<name>.yaml, its `grid` inside the pre-registration folder).")
    p.add_argument("--scores", required=True, help="scores table from kvcert score")
    p.add_argument("--replay", nargs="*", default=[], help="replay tables from kvcert replay (one per model)")
    p.add_argument("--stability-replay", nargs="*", default=[],
                   help="replay tables of the grid's second data seed (replay.stability; one per model): the replay "
                   "claims' tests computed on them too, reported beside the verdict (data-seed stability)")
    p.add_argument("--prereg", default=None, help="pre-registration folder (frozen; default: $KVCERT_PREREG, else ./preregistration)")
    p.add_argument("--verified", default=None, help=verified_help)
    p.add_argument("--experiment", required=True, help="experiment name (its design grid)")
    p.add_argument("--configs", default=None, help="configs folder holding experiment/<name>.yaml (default: $KVCERT_CONFIGS, else ./configs)")
    p.add_argument("--out", required=True, help="claims JSON")
    p.add_argument("--accept-excluded", action="store_true",
                   help="evaluate the claims even when records are left out as pre-freeze (default: refuse, "
                   "saying how many per cell)")
    p.set_defaults(func=_claims)

    p = subparsers.add_parser("report", help="claims + scores + replay → report.md, report.html, summary.json",
                              description="claims.json + scores + replay + impossibility → report.md, a "
                              "self-contained report.html, summary.json and figures/*.png.")
    p.add_argument("--claims", required=True, help="claims JSON from kvcert claims")
    p.add_argument("--scores", default=None, help="scores table from kvcert score")
    p.add_argument("--replay", nargs="*", default=[], help="replay tables (one per model)")
    p.add_argument("--stability-replay", nargs="*", default=[],
                   help="replay tables of the second data seed (checked against the claims' pre-registration)")
    p.add_argument("--impossibility", nargs="*", default=[], help="impossibility JSON files (one per model)")
    p.add_argument("--verified", default=None, help="`kvcert prereg verify --out` JSON; must match the claims")
    p.add_argument("--out-dir", required=True, help="report folder")
    p.add_argument("--beside", action="append", default=[], type=_beside, metavar="LABEL=PATH",
                   help="another run's claims.json whose verdicts the claims table shows beside this run's, in a "
                   "column LABEL (an absent file: 'not run'); repeatable")
    p.add_argument("--configs", default=None, help="configs folder whose model/<name>.yaml say what each model is "
                   "(default: $KVCERT_CONFIGS, else ./configs)")
    p.add_argument("--model-path", action="append", default=[], type=_model_path, metavar="MODEL=PATH",
                   help="a model's path as its generate jobs were given it (kvcert shard --model-path); repeatable")
    p.set_defaults(func=_report)
