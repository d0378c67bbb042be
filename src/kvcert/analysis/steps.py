"""The three analysis steps the workflow runs, each file in → file out (the replay step, the model side of
C1, C2 and C8, is :mod:`kvcert.generation.replay_step`).

The thin scripts in the top-level ``analysis/`` folder only parse arguments and call
these; the report benchmark calls them too.

* :func:`score_step` — generation shards → one row per generation (Parquet, with the
  freeze it was verified against in the file's metadata).
* :func:`claims_step` — scores + replay → ``claims.json`` (every claim of
  ``claims.yaml`` with its tests, intervals, verdict and the paper's outcome; the
  comparison signals' AUCs, :mod:`kvcert.analysis.signals`, beside them).
* :func:`report_step` — claims + scores + replay + impossibility → report.md,
  report.html, figures/*.png.

Every step verifies the pre-registration first (:func:`kvcert.config.prereg.verify`) and
refuses inputs stamped with another pre-registration hash.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from ..config.analysis_plan import AnalysisPlan
from ..config.paths import resolve_configs
from ..config.experiment import experiment_grid, replay_stability
from ..config.prereg import load_claims, read_verified
from ..provenance import check_prereg_hash, git_commit
from ..tables import jsonable, write_json  # noqa: F401  (claims.json and summary.json are plain JSON)
from .claims import evaluate_claims, main_tasks
from .claims_document import ClaimsDocument, Provenance
from .load import PlannedShard, RecordRefused, read_table, score_shards, verified_freeze, write_table
from .replay_stats import empty_replay, summarize_replay
from .signals import evaluate_signals, headline


# --- score ----------------------------------------------------------------------------------------
def planned_shards(shards: Sequence[str | Path], experiment: str, prereg: str | Path,
                   configs: str | Path | None = None, model_paths: Mapping[str, str] | None = None,
                   ) -> dict[str, PlannedShard]:
    """{shard path: what the experiment's plan puts in it} for the given shard paths (matched on
    the plan's relative shard path; the examples from the manifest beside them, the config
    hashes from the configs composed now, ``model_paths`` {model: path} overriding a model's
    path as ``kvcert shard --model-path`` does: each shard's :class:`~kvcert.generation.jobs.Job`, its
    :meth:`~kvcert.generation.jobs.Job.planned_records` and :meth:`~kvcert.generation.jobs.Job.references`);
    a shard the plan does not know is refused."""
    from ..generation.manifest import verify_manifest
    from ..generation.plan import build_plan

    configs = resolve_configs(configs)
    plan = build_plan(experiment, experiment_grid(experiment, configs, prereg)[1])
    out, cache, checked = {}, {}, set()
    for path in shards:
        text = Path(path).as_posix()
        match = [s for s in plan.shards if text.endswith("/" + s.path) or text == s.path]
        if len(match) != 1:
            raise RecordRefused(f"{path}: not a shard of experiment {experiment}'s plan; remove it from --shards")
        shard = match[0]
        manifest = Path(text[: len(text) - len(shard.path)] + shard.manifest)
        if not manifest.exists():
            raise RecordRefused(f"{path}: its manifest {manifest} is missing; rerun the manifest step "
                                "(the plan's examples come from it)")
        try:
            if str(manifest) not in checked:  # the plan's examples and references, as `kvcert manifest` builds them:
                # its seal, then a rebuild compared byte for byte (remembered by content once it matched: the
                # generate jobs' rebuilds mean the score step normally rebuilds nothing)
                verify_manifest(manifest, plan.manifest(shard.model, shard.task, shard.length), configs,
                                (model_paths or {}).get(shard.model))
                checked.add(str(manifest))
            job = plan.job(shard, configs, prereg, (model_paths or {}).get(shard.model), manifest=manifest, cache=cache)
            records, references = job.planned_records(), job.references()
        except ValueError as exc:
            raise RecordRefused(f"{path}: {exc}") from None
        out[str(path)] = PlannedShard(records, f"{configs}, experiment {experiment}, model {shard.model}, task "
                                               f"{shard.task}", references, str(manifest))
    return out


#: the outputs made from the scores, in the order the steps make them (the report's tables and
#: figures with it: a report killed half-way leaves none of the previous run's beside the new claims)
DOWNSTREAM = ("claims.json", "report.md", "report.html", "summary.json", "failure_labels.csv", "replay_cells.csv",
              "generations_per_cell.csv", "figures")


def remove_stale(folder: Path, names: Sequence[str], why: str) -> None:
    """Remove earlier outputs that the step about to run makes stale (a run killed half-way then
    leaves nothing that disagrees with the new files); a folder (``figures``) goes with its files."""
    import shutil

    for name in names:
        stale = folder / name
        if stale.is_dir():
            shutil.rmtree(stale)
            print(f"{stale}/: removed ({why})")
        elif stale.exists():
            stale.unlink()
            print(f"{stale}: removed ({why})")


def score_step(shards: Sequence[str | Path], prereg: str | Path, out: str | Path,
               verified: str | Path | None = None, jobs: int = 1,
               expected: Mapping[str, "int | PlannedShard"] | None = None) -> Path:
    """Score the shards into ``out``. The claims, report and summary of an earlier run in the
    same folder are removed first: once the scores are redone they describe other data."""
    remove_stale(Path(out).parent, DOWNSTREAM, "stale until the claims and report steps rebuild it from these scores")
    df, provenance = score_shards(shards, prereg, verified, jobs, expected)
    rescored = df.attrs.pop("rescored", [])
    if rescored:
        where, stored, derived = rescored[0]
        print(f"{len(rescored)} record(s) carry a stored score that differs from their answer's under the task's "
              f"metric (e.g. {where}: stored {stored}, derived {derived}); the derived score is used")
    if not provenance.get("plan_checked"):
        print("shards not compared with the plan (give --experiment): record keys and config hashes unchecked")
    return write_table(df, out, provenance)


# --- claims ---------------------------------------------------------------------------------------
def _read_replays(paths: Sequence[str | Path], prereg_hash: str, configs: Path | None = None,
                  method: str | None = None) -> tuple[pd.DataFrame, list[dict]]:
    """The replay tables, refused in one line when made under another pre-registration or (given the
    ``configs`` and the grid's replay ``method``) under other configs than they compose now."""
    from ..generation.jobs import replay_config_hash

    frames, provs = [], []
    for p in paths:
        df, prov = read_table(p)
        check_prereg_hash(f"{p} (replay)", prov.get("prereg_hash"), prereg_hash, "rerun the replay step", RecordRefused)
        if configs is not None and method is not None:
            made = prov.get("config_hash")
            want = replay_config_hash(configs, prov["model"], prov["task"], method) if made else None
            if not made or made != want:
                raise RecordRefused(
                    f"{p}: replay made under config {made}, but the configs compose {want} now (a model's dtype, "
                    "the task or the replay method changed); delete it and rerun the replay step" if made else
                    f"{p}: the replay table carries no config hash (made by an earlier kvcert or without "
                    "--experiment); delete it and rerun the replay step")
        frames.append(df)
        provs.append(prov)
    return (pd.concat(frames, ignore_index=True) if frames else empty_replay()), provs


def _read_scores(path: str | Path, prereg_hash: str) -> tuple[pd.DataFrame, dict]:
    df, prov = read_table(path)
    check_prereg_hash(f"{path} (scores)", prov.get("prereg_hash"), prereg_hash, "rerun the score step", RecordRefused)
    return df, prov


def excluded_cells(df: pd.DataFrame) -> dict[str, int]:
    """{cell: records} of the records the claims leave out as pre-freeze; a cell is a shard's folder
    (``<model>/<cell>/<task>/<length>`` of ``generations/``), else model/task/length."""
    gone = df[df["pre_freeze"]] if len(df) else df
    counts: dict[str, int] = {}
    for shard, model, task, length in zip(gone["shard"], gone["model"], gone["task"], gone["target_tokens"]):
        parts = Path(str(shard)).parts
        cell = "/".join(parts[-5:-1]) if len(parts) >= 6 and parts[-6] == "generations" else f"{model}/{task}/{length}"
        counts[cell] = counts.get(cell, 0) + 1
    return counts


def check_exclusions(df: pd.DataFrame, scores: str | Path, frozen_utc: str) -> None:
    """Refuse, in one line, scores whose planned records the claims would leave out as pre-freeze."""
    cells = excluded_cells(df)
    if cells:
        listing = ", ".join(f"{cell}: {n}" for cell, n in sorted(cells.items()))
        raise RecordRefused(
            f"{scores}: {sum(cells.values())} records started before the freeze of {frozen_utc} and would be left "
            f"out of the claims ({listing}); regenerate them (a generation machine's clock may be wrong), or pass "
            "--accept-excluded to evaluate the claims without them")


def stability_tables(stability: Mapping | None, deciding: pd.DataFrame, tables: pd.DataFrame | None,
                     paths: Sequence[str | Path]) -> None:
    """Refuse, in one line, second-data-seed replay tables (``kvcert claims --stability-replay``) that do not fit the
    grid's ``replay.stability`` (``stability``; None: it registers none): given without one, missing where it
    registers one, or sharing a prompt with the deciding seed's tables (a task drawn from files can repeat an item
    under another seed; a generated task cannot, :func:`kvcert.config.experiment.check_grid`)."""
    if stability is None:
        if paths:
            raise RecordRefused(f"{paths[0]}: --stability-replay given, but the experiment's grid registers no second "
                                "replay data seed (replay.stability); leave it out")
        return
    if not paths:
        raise RecordRefused(f"the grid registers a second replay data seed (replay.stability: seed "
                            f"{stability['seed']}); give its replay tables with --stability-replay")
    shared = sorted(set(deciding["example_id"]) & set(tables["example_id"])) if len(deciding) and len(tables) else []
    if shared:
        raise RecordRefused(f"{paths[0]}: the stability seed's prompts share {len(shared)} with the deciding seed's "
                            f"(e.g. {shared[0]}); register a stability seed whose prompts are disjoint")


def claims_step(scores: str | Path, replay: Sequence[str | Path], prereg: str | Path, experiment: str,
                out: str | Path, verified_json: str | Path | None = None, configs: str | Path | None = None,
                accept_excluded: bool = False, stability_replay: Sequence[str | Path] = ()) -> dict:
    """Evaluate every claim and write ``claims.json``; returns its content. Records excluded as
    pre-freeze stop it (:func:`check_exclusions`) unless ``accept_excluded``. ``stability_replay``: the replay tables
    of the grid's second data seed (``replay.stability``): the replay claims are decided on ``replay``'s, and their
    tests computed on these too, beside them (``data_seed_stability``)."""
    remove_stale(Path(out).parent, DOWNSTREAM[1:], "stale until the report step rebuilds it from these claims")
    freeze = verified_freeze(prereg, verified_json)
    doc = load_claims(prereg)
    grid = experiment_grid(experiment, resolve_configs(configs), prereg)[1]
    df, scores_prov = _read_scores(scores, freeze.prereg_hash)
    rp, replay_prov = _read_replays(replay, freeze.prereg_hash, resolve_configs(configs),
                                    (grid.get("replay") or {}).get("method"))
    stability = replay_stability(grid)
    srp, stability_prov = (_read_replays(stability_replay, freeze.prereg_hash, resolve_configs(configs),
                                         (grid.get("replay") or {}).get("method")) if stability_replay else (None, []))
    stability_tables(stability, rp, srp, list(stability_replay))
    if not accept_excluded:
        check_exclusions(df, scores, freeze.frozen_utc)
    t0 = time.perf_counter()
    results = evaluate_claims(doc, df, rp, main_tasks(grid),
                              (stability["seed"], srp) if stability is not None else None)
    signals = evaluate_signals(doc, df, grid)
    plan = AnalysisPlan.of_document(doc)  # typed by kvcert.config.prereg.load_claims; claims.json records it as registered
    content = ClaimsDocument(
        experiment=experiment, paper=doc.get("paper", {}), verdict_rules=doc.get("verdict_rules"),
        analysis_plan=plan.to_dict(), grid=grid,
        provenance=Provenance(
            prereg_hash=freeze.prereg_hash, frozen_utc=freeze.frozen_utc, freeze_record=freeze.path.name,
            analysis_git_commit=git_commit(), bootstrap=plan.bootstrap.to_dict(), scores=scores_prov,
            replay=replay_prov, seconds=round(time.perf_counter() - t0, 2), stability_replay=stability_prov),
        replay_summary=summarize_replay(rp, plan.delta) if len(rp) else None, claims=results,
        comparison_signals=signals,
    ).to_dict()
    write_json(content, out)
    return jsonable(content)


# --- report ---------------------------------------------------------------------------------------
def run_command(experiment: str | None) -> str:
    """The command that makes an experiment's results (a beside run's hint when it has not run)."""
    if experiment == "smoke":
        return "snakemake --cores all"
    if experiment == "paper":
        return "snakemake --profile profiles/slurm --config experiment=paper"
    return f"snakemake --cores all --config experiment={experiment}"


def beside_run(label: str, path: str | Path) -> dict:
    """Another run's verdicts to show beside this one's (``kvcert report --beside LABEL=PATH``, PATH its
    ``claims.json``): its experiment, pre-registration hash (another one is fine: it is another run; the
    report's provenance shows it) and each claim's verdict and value. An absent file is a run not made yet
    (``run`` false, ``command`` the one that makes it, from the experiment folder holding PATH)."""
    path = Path(path)
    out: dict[str, Any] = {"label": label, "path": path.as_posix()}
    if not path.exists():
        print(f"{path}: absent; the report says {label!r} was not run")
        return {**out, "run": False, "command": run_command(path.parent.name)}
    try:
        doc = ClaimsDocument.read(path)
    except (ValueError, TypeError) as exc:  # not JSON, or not a document the claims step writes
        raise RecordRefused(f"{path} (--beside {label}): not a claims.json of kvcert claims ({exc}); give the "
                            "claims.json of another experiment's run") from None
    claims = {c.id: {"verdict": c.verdict, "value": c.value, "statistic": c.statistic} for c in doc.claims}
    return {**out, "run": True, "command": run_command(doc.experiment), "experiment": doc.experiment,
            "prereg_hash": doc.provenance.prereg_hash, "grid": {"models": doc.grid.get("models") or []},
            "provenance": {k: getattr(doc.provenance, k) for k in ("frozen_utc", "freeze_record", "analysis_git_commit")},
            "claims": claims}


def report_step(claims: str | Path, scores: str | Path | None, replay: Sequence[str | Path],
                impossibility: Sequence[str | Path], out_dir: str | Path,
                verified_json: str | Path | None = None, beside: Sequence[tuple[str, str | Path]] = (),
                configs: str | Path | None = None, model_paths: Mapping[str, str] | None = None,
                stability_replay: Sequence[str | Path] = ()) -> dict[str, Path]:
    """Write the report; ``summary.json`` beside it holds the verdicts in a few lines. ``beside``: (label,
    claims.json) of other runs whose verdicts the claims table shows beside this run's; ``configs``: the
    configs folder whose model configs say what each model is (default: as every command finds it; none
    found: the models are named only); ``model_paths`` {model: path} as the generate jobs were given them;
    ``stability_replay``: the second data seed's replay tables, checked against the claims' pre-registration (their
    statistics are in the claims' ``data_seed_stability``)."""
    from ..config.paths import configs_dir
    from .model_info import run_models
    from .report import build_report

    labels = [label for label, _ in beside]
    if len(set(labels)) < len(labels):
        raise ValueError(f"--beside: each label once (given {', '.join(labels)})")
    remove_stale(Path(out_dir), DOWNSTREAM[1:], "rebuilt now from these claims")
    doc = ClaimsDocument.read(claims)
    prereg_hash = doc.provenance.prereg_hash
    if verified_json is not None:
        stamped = read_verified(verified_json).get("prereg_hash")
        check_prereg_hash(f"{claims} (claims, verified by {verified_json})", prereg_hash, stamped,
                          "rerun the claims step", RecordRefused)
    df, scores_prov = _read_scores(scores, prereg_hash) if scores else (None, {})
    rp, replay_prov = _read_replays(replay, prereg_hash)
    _read_replays(stability_replay, prereg_hash)  # made under the claims' pre-registration, or refused
    rows = []
    for p in impossibility:
        data = json.loads(Path(p).read_text())
        check_prereg_hash(f"{p} (impossibility)", data.get("prereg_hash"), prereg_hash, "rerun the replay step",
                          RecordRefused)
        rows.extend(data.get("rows", []))
    others = [beside_run(label, path) for label, path in beside]
    if configs is None:
        try:
            configs = configs_dir()
        except FileNotFoundError:
            configs = None
    grid_models = doc.grid.get("models") or (sorted(df["model"].unique()) if df is not None else [])
    models = run_models(grid_models, configs, doc.experiment, model_paths)
    paths = build_report(doc, df, scores_prov, rp, rows, out_dir, replay_prov, models=models, beside=others)
    paths["summary"] = write_json(summary(doc, df, models, others), Path(out_dir) / "summary.json")
    return paths


def run_summary(df) -> dict:
    """Generation counts, full-cache accuracy {task: {length: accuracy}} and wall time of the runs."""
    if df is None or df.empty:
        return {"generations": {"total": 0, "by_cell": {}}, "full_cache_accuracy": {}, "wall_time_seconds": None}
    by_cell = df.groupby(["condition", "method", "budget"]).size()
    cells = {f"{c}/{m}/{b:g}": int(n) for (c, m, b), n in by_cell.items()}
    full = df[df["condition"] == "full"]
    accuracy: dict[str, dict[str, float]] = {}
    for (task, length), part in full.groupby(["task", "target_tokens"]):
        accuracy.setdefault(str(task), {})[str(int(length))] = float(part["correct"].mean())
    started = pd.to_datetime(df["started_utc"], utc=True)
    finished = started + pd.to_timedelta(df["prefill_seconds"] + df["decode_seconds"], unit="s")
    return {
        "generations": {"total": int(len(df)), "grid": int(len(df)), "by_cell": cells},
        "full_cache_accuracy": accuracy,
        "wall_time_seconds": float((finished.max() - started.min()).total_seconds()),
        "generation_seconds": float((df["prefill_seconds"] + df["decode_seconds"]).sum()),
    }


def code_digests(doc: ClaimsDocument, df=None) -> list[str]:
    """The digests of the code that made the run's records and replay tables
    (:func:`kvcert.provenance.code_digest`), each once, sorted; "unknown" for those made before kvcert stamped it."""
    found = set()
    if df is not None and len(df):
        found |= {str(d) if isinstance(d, str) else "unknown"
                  for d in (df["code_digest"] if "code_digest" in df else [None])}
    found |= {p.get("code_digest") or "unknown" for p in doc.provenance.replay}
    return sorted(found)


def summary(doc: ClaimsDocument, df=None, models: Sequence = (), beside: Sequence[Mapping] = ()) -> dict:
    """The verdicts beside the paper's, in a few lines (machine-readable), with the run's counts, and each
    comparison signal's prediction and attribution AUC pooled over the main grid (``signal_auc``). ``models``
    (:class:`kvcert.analysis.model_info.ModelInfo`): what each model is; ``beside``: other runs'
    (:func:`beside_run`) — ``beside`` {label: that run}, and each claim's ``beside`` {label: its verdict and
    value, None where that run was not made}."""
    from .report import caveat

    def theirs(b: Mapping, cid: str):
        c = (b.get("claims") or {}).get(cid) if b.get("run") else None
        return {"verdict": c["verdict"], "value": c.get("value")} if c else None

    prereg_hash = doc.provenance.prereg_hash
    return {
        "experiment": doc.experiment, "prereg_hash": prereg_hash, "frozen_utc": doc.provenance.frozen_utc,
        "caveat": caveat(doc.experiment, doc.grid, models),
        "models": [m.to_dict() for m in models],
        "beside": {b["label"]: {"path": b["path"], "run": b["run"], "experiment": b.get("experiment"),
                                "prereg_hash": b.get("prereg_hash"),
                                "same_preregistration": b.get("prereg_hash") == prereg_hash if b["run"] else None,
                                "command": b["command"]} for b in beside},
        **run_summary(df),
        "code_digests": code_digests(doc, df),
        "claims": {c.id: {"verdict": c.verdict, "statistic": c.statistic, "value": c.value, "ci": c.primary.ci,
                          "paper_value": c.paper.value, "paper_verdict": c.paper.verdict,
                          "placebo_passes": c.placebo.passes,
                          "seed_stability": c.seed_stability.agree if c.seed_stability else None,
                          "beside": {b["label"]: theirs(b, c.id) for b in beside}}
                   for c in doc.claims},
        "signal_auc": headline(doc.comparison_signals),
    }
