"""The claim report: ``report.md``, a self-contained ``report.html`` and ``figures/*.png``.

Order: a banner on runs that are not the paper's models (the embedded miniature; a real
pretrained model kvcert fetches, ``path: fetch:NAME``; the rehearsal's random-weight
stand-ins), the "Model" table (what each model is, its parameters, layers, heads and head
size: :mod:`kvcert.analysis.model_info`), what the verdicts speak for (the weights that ran; per claim the
tasks, haystacks, prompts and data seeds its rows hold: :mod:`kvcert.analysis.scope`), the contents, the claims — our verdict beside the
paper's and other runs' under it (``kvcert report --beside LABEL=claims.json``: a line each
in the paper's column, so the table keeps seven columns at 800 px; "not run" while that file
is absent; their pre-registration hashes in the provenance), each claim's placebo and the
verdict's stability over bootstrap seeds — and its tests (the registered statistics, with
the paper's pooled statistic reported beside them), the plain accuracy table (condition ×
method × budget, with intervals) and the paired accuracy gap of top-k and the Poisson sampler
(:mod:`kvcert.analysis.paired_gap`), then the figures (accuracy by budget, induced failures by
budget × condition, prediction vs attribution AUC, replay coverage and tightness of the
plug-in and the robust certificate, recompute-gain curves, multi-turn recall), the replay,
impossibility, multi-turn (with the gate against random gating at its rate, paired by conversation:
:func:`kvcert.analysis.multiturn_recall.gate_versus_random`) and failure-label tables, the comparison signals
(:mod:`kvcert.analysis.report_signals`), the per-claim details (an embedded run's C1: why its
plug-in certificate under-covers; the secondary analyses beside C1 and C8), and the provenance block (pre-registration hash and
freeze time, git commits, config hashes, the models' config.json, the beside runs'
pre-registrations, generations started before the freeze — listed, and excluded from scoring).
``failure_labels.csv``, ``replay_cells.csv`` and ``generations_per_cell.csv`` hold the full
tables. The document model (:mod:`kvcert.analysis.document`) renders it twice; the sections read the typed
claims document (:class:`kvcert.analysis.claims_document.ClaimsDocument`, in :class:`kvcert.analysis.report_data.
ReportData`). The claims and tests tables are :mod:`kvcert.analysis.report_claims`'s, the claim details
:mod:`kvcert.analysis.report_details`'s; this module holds the other sections and assembles the page.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from ..atomic import atomic_path, write_text
from . import figures
from .claims_document import ClaimsDocument
from .document import Document, fmt
from .labels import failure_label_table, induced_failure_rates
from .leaderboard import accuracy_table
from .load import scored
from .model_info import MODEL_HEADER, ModelInfo, fetched_caveat, fetched_phrase
from .multiturn_recall import PAPER as MULTITURN_PAPER
from .multiturn_recall import multiturn_table
from .paired_gap import paired_gaps
from .replay_stats import replay_cells, summarize_replay
from .report_claims import claims_section
from .report_data import ReportData
from .report_details import details_section
from .report_signals import signals_section
from .report_vattention import vattention_section
from .scope import scope_section
from .verdict_check import check_verdicts


def replay_rows(summary: Mapping) -> list[list[str]]:
    """One row per group of the replay summary: both certificates' coverage (per step; anytime = every step of a
    draw's path), Spearman (pooled, within cell) and tightness."""
    rows = []
    for group, blocks in (("pooled", {"all": summary["pooled"]}), ("query kind", summary.get("by_kind", {})),
                          ("budget", summary.get("by_budget", {})), ("layer", summary.get("by_layer", {})),
                          ("model", summary.get("by_model", {}))):
        for name, b in blocks.items():
            r = b.get("robust") or {}
            rows.append([group, name, b["cells"], b["observations"], fmt(b["coverage"]), fmt(b.get("coverage_anytime")),
                         fmt(b["spearman"]), fmt(b.get("spearman_within_cell_median")), fmt(b["tightness_median"], 2),
                         fmt(r.get("coverage")), fmt(r.get("coverage_anytime")), fmt(r.get("tightness_median"), 2)])
    return rows


#: the impossibility table: one row per (model, layer, alteration), from the demonstration's fields
IMPOSSIBILITY_HEADER = ["model", "layer", "alteration", "budget", "retained hash before", "retained hash after",
                        "true error before", "true error after", "ratio"]


def impossibility_row(r: Mapping) -> list:
    """A row of :data:`IMPOSSIBILITY_HEADER` from a demonstration row (its structured fields, not its markdown)."""
    return [r["model"], r["layer"], r["mode"], f"{float(r['budget']):g}", str(r["retained_hash_before"])[:12],
            str(r["retained_hash_after"])[:12], f"{float(r['error_before']):.4g}", f"{float(r['error_after']):.4g}",
            f"{float(r['error_ratio']):.1f}x"]

REPLAY_HEADER = ["group", "value", "cells", "draws × queries", "plug-in coverage (per step)",
                 "plug-in anytime (all steps of a path)", "Spearman pooled", "Spearman within cell (median)",
                 "plug-in ε/err (median)", "robust coverage (per step)", "robust anytime (all steps of a path)",
                 "robust ε/err (median)"]


def generations_per_cell(scores: pd.DataFrame) -> list[list[str]]:
    keys = ["model", "target_tokens", "task", "condition", "method", "budget"]
    counts = scores.groupby(keys, dropna=False).size().reset_index(name="n")
    return [[*[str(r[k]) for k in keys], str(r["n"])] for _, r in counts.iterrows()]


def provenance_section(doc: Document, claims_doc: ClaimsDocument, scores: pd.DataFrame | None, scores_prov: Mapping,
                       replay_prov: Sequence[Mapping], out_dir: Path | None = None,
                       models: Sequence[ModelInfo] = (), beside: Sequence[Mapping] = ()) -> None:
    doc.heading("Provenance")
    prov = claims_doc.provenance
    lines = [
        f"pre-registration hash: {scores_prov.get('prereg_hash') or prov.prereg_hash}",
        f"frozen (UTC): {scores_prov.get('frozen_utc') or prov.frozen_utc}  record: {scores_prov.get('freeze_record', '–')}",
        f"freeze commit: {scores_prov.get('freeze_git_commit', '–')}",
        f"analysis commit: {prov.analysis_git_commit}",
        f"experiment: {claims_doc.experiment}",
        f"bootstrap: {prov.bootstrap}",
    ]
    if scores is not None and len(scores):
        for col, label in (("git_commit", "generation commits"), ("config_hash", "config hashes"),
                           ("kvcert_version", "kvcert versions"), ("model_digest", "model digests"),
                           ("code_digest", "record-code digests")):
            if col not in scores:  # a scores table of an earlier kvcert
                continue
            vc = scores[col].value_counts()
            shown = ", ".join(f"{k} ({v})" for k, v in vc.head(12).items())
            more = f" … and {len(vc) - 12} more" if len(vc) > 12 else ""
            lines.append(f"{label}: {len(vc)} distinct — {shown}{more}")
        if "uncertified" in scores:
            n = int(scores["uncertified"].sum())
            lines.append(f"uncertified randomized runs: {n} (tokens evicted with no random tail, e.g. sinks + window "
                         "above a short prompt's budget: no certificate, signals missing, never zero)")
        lines.append(f"records: {len(scores)}; only records made after the freeze are scored")
    for m in models:
        lines.append(f"model {m.name}: {m.kind}; architecture from {m.numbers_from or '–'}")
    own_hash = scores_prov.get("prereg_hash") or prov.prereg_hash
    for b in beside:
        if not b.get("run"):
            lines.append(f"beside {b['label']}: {b['path']} — not run")
            continue
        bp = b.get("provenance") or {}
        same = "the same as this run's" if b.get("prereg_hash") == own_hash else "another pre-registration"
        lines.append(f"beside {b['label']}: {b['path']} — experiment {b.get('experiment')}, pre-registration hash "
                     f"{b.get('prereg_hash')} ({same}), frozen (UTC) {bp.get('frozen_utc', '–')}, analysis commit "
                     f"{bp.get('analysis_git_commit', '–')}")
    for rp in replay_prov:
        lines.append(f"replay: model {rp.get('model')}, {rp.get('examples')} examples, budgets {rp.get('budgets')}, "
                     f"{rp.get('draws')} draws, {rp.get('later_queries')} later queries, layers {rp.get('layers')}, "
                     f"commit {rp.get('git_commit')}")
    doc.code("\n".join(lines))
    if scores is None or not len(scores):
        return
    pre = scores[scores["pre_freeze"]]
    doc.heading("Generations started before the freeze (excluded from scoring)", 3)
    if pre.empty:
        doc.paragraph("None.")
    else:
        doc.table(["shard:line", "model", "task", "example", "condition", "method", "budget", "started (UTC)"],
                  [[f"{r.shard}:{r.line}", r.model, r.task, r.example_id, r.condition, r.method, f"{r.budget:g}",
                    r.started_utc] for r in pre.itertuples()])
    doc.heading("Generations per setting", 3)
    per_cell = generations_per_cell(scores)
    header = ["model", "length", "task", "condition", "method", "budget", "generations"]
    if out_dir is not None:
        with atomic_path(Path(out_dir) / "generations_per_cell.csv") as tmp:
            pd.DataFrame(per_cell, columns=header).to_csv(tmp, index=False)
    settings = scores.groupby(["condition", "method", "budget"]).size().reset_index(name="n")
    doc.paragraph(f"{len(per_cell)} cells (model × length × task × setting) in `generations_per_cell.csv`; "
                  "per setting, over models, lengths and tasks:")
    doc.table(["condition", "method", "budget", "generations"],
              [[r.condition, r.method, f"{r.budget:g}", r.n] for r in settings.itertuples()])


EMBEDDED_CAVEAT = "a miniature (the embedded 2-layer model), not the paper's models: not evidence about them"


def caveat(experiment: str | None, grid: Mapping, models: Sequence[ModelInfo] = ()) -> str | None:
    """One line for a run that is not evidence about the paper's models (the banner's lead, ``summary.json``'s
    ``caveat``, the console's last words); None for the paper profile. ``models`` (:func:`run_models`) tells a
    real pretrained model kvcert fetched (``path: fetch:NAME``) by its config."""
    if experiment == "rehearsal":
        return "a rehearsal on stand-in models with random weights: its verdicts mean nothing"
    parts = []
    if "embedded" in (grid.get("models") or []):
        parts.append(EMBEDDED_CAVEAT)
    fetched = fetched_caveat(models)
    if fetched:
        parts.append(fetched)
    return "; ".join(parts) or None


def banner(doc: Document, experiment: str | None, grid: Mapping, models: Sequence[ModelInfo] = ()) -> None:
    """What a run that is not the paper's says on its first screen."""
    if experiment == "rehearsal":
        doc.note("**A rehearsal on stand-in models with random weights: its verdicts mean nothing.** This run "
                 "exercises the paper profile's code path — its architectures, tokenizers, data formats, lengths and "
                 "jobs — on small checkpoints with random weights and generated data (`kvcert make-rehearsal`), so "
                 "that a cluster run fails here first if it would fail at all. The answers are noise; no claim is "
                 "tested. The paper profile is `snakemake --profile profiles/slurm --config experiment=paper`.")
        return
    if "embedded" in (grid.get("models") or []):
        doc.note("**A miniature, not the paper's models.** This run uses the embedded model: a 2-layer model this "
                 "project trained on synthetic tasks, built to sit in the paper's regime (question-aware eviction "
                 "nearly free, streaming eviction harmful, inherent failures present) so that every claim can be "
                 "decided on a CPU. Its verdicts exercise the method on a faithful miniature; they are not evidence "
                 "about the paper's 1.5–8B models — a verdict that \"differs\" from the paper's is not a failed "
                 "reproduction (docs/embedded.md, what the embedded world was designed to show). The paper profile "
                 "is `snakemake --profile profiles/slurm --config experiment=paper`.")
    fetched = fetched_phrase(models)
    if fetched:
        names = ", ".join(m.name for m in models if m.kind == "fetched")
        doc.note(f"**A real pretrained model, not the paper's models.** This run uses {names}, {fetched}. It runs "
                 "through the same attention path, certificates and claims as the paper profile; a verdict that "
                 "\"differs\" from the paper's is a finding at this scale, not a failed reproduction. The paper "
                 "profile is `snakemake --profile profiles/slurm --config experiment=paper`.")


def model_section(doc: Document, models: Sequence[ModelInfo]) -> None:
    """The run's models in a few lines, on the first screen: what each is and its architecture's numbers."""
    if not models:
        return
    doc.heading("Model" if len(models) == 1 else "Models", 3)
    doc.table(MODEL_HEADER, [m.row() for m in models])


def build_report(
    claims_doc: ClaimsDocument, scores: pd.DataFrame | None, scores_provenance: Mapping | None, replay: pd.DataFrame | None,
    impossibility: Sequence[Mapping], out_dir: str | Path, replay_provenance: Sequence[Mapping] = (),
    models: Sequence[ModelInfo] = (), beside: Sequence[Mapping] = (),
) -> dict[str, Path]:
    """Write report.md, report.html, failure_labels.csv and figures/*.png under ``out_dir``. ``models``: what
    each model of the run is (:func:`kvcert.analysis.model_info.run_models`); ``beside``: other runs' verdicts
    shown beside this run's (:func:`kvcert.analysis.steps.beside_run`). One section function each, in order; a verdict
    its own tests do not give is refused first (:func:`kvcert.analysis.verdict_check.check_verdicts`)."""
    check_verdicts(claims_doc, f"claims.json (experiment {claims_doc.experiment})")
    out = Path(out_dir)
    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    grid = claims_doc.grid
    run = ReportData(claims_doc, out, fig_dir, grid, scored(scores) if scores is not None and len(scores) else None,
                     replay if replay is not None else pd.DataFrame(),
                     list(grid["tasks"]) if grid.get("tasks") else None)
    doc = Document()
    title = f"kvcert claim report — {claims_doc.experiment}"
    doc.heading(title, 1)
    banner(doc, claims_doc.experiment, grid, models)
    model_section(doc, models)
    scope_section(doc, run.claims, run.scores_ok, run.replay, run.tasks, run.multiturn_cell, models)
    claims_section(doc, run, beside)
    accuracy_section(doc, run)
    multiturn = figures_section(doc, run)
    replay_section(doc, run)
    vattention_section(doc, run)
    impossibility_section(doc, impossibility)
    multiturn_section(doc, run, multiturn)
    failure_labels_section(doc, run)
    signals_section(doc, claims_doc.comparison_signals, fig_dir)
    details_section(doc, run)
    provenance_section(doc, claims_doc, scores, scores_provenance or {}, replay_provenance, out, models, beside)

    md = out / "report.md"
    write_text(md, doc.markdown(out))
    page = out / "report.html"
    write_text(page, doc.html(title))
    return {"markdown": md, "html": page, "figures": fig_dir}


def accuracy_section(doc: Document, run: ReportData) -> None:
    """Accuracy by setting: every setting of the main grid, per task and pooled, with intervals; its figure."""
    doc.heading("Accuracy by setting")
    board = accuracy_table(run.scores_ok, run.tasks, run.plan) if run.scores_ok is not None else pd.DataFrame()
    if not len(board):
        doc.paragraph("No generations.")
        return
    task_cols = [c for c in board.columns if c not in ("condition", "method", "budget", "compression_ratio",
                                                         "runs", "pooled", "pooled_low", "pooled_high")
                 and not c.endswith(("_low", "_high"))]
    doc.paragraph("Share of correct answers (score ≥ the task's pass mark) of every setting of the main grid, "
                  f"per task and pooled over tasks and lengths, each with its {run.pct} bootstrap interval over "
                  "examples. `budget` is the fraction of the cache kept; `compression_ratio` (kvpress's "
                  "convention) the fraction removed.")
    doc.table(["condition", "method", "budget", "compression_ratio", "runs", *task_cols, "pooled"],
              [[r["condition"], r["method"], f"{r['budget']:g}", f"{r['compression_ratio']:g}", r["runs"],
                *[f"{fmt(r[t])} [{fmt(r[t + '_low'])}, {fmt(r[t + '_high'])}]" for t in task_cols],
                f"{fmt(r['pooled'])} [{fmt(r['pooled_low'])}, {fmt(r['pooled_high'])}]"]
               for _, r in board.iterrows()])
    doc.figure(figures.accuracy_figure(board, task_cols, run.fig_dir / "accuracy.png"),
               "accuracy by KV budget, condition and method, per task (the full cache as a line)")
    gaps = paired_gaps(run.scores_ok, run.plan.bootstrap, run.tasks)
    if len(gaps):
        doc.paragraph("What randomized retention costs in accuracy: top-k's accuracy minus the Poisson sampler's on "
                      f"the same examples (tasks pooled), with its {run.pct} bootstrap interval over examples and "
                      "McNemar's exact test on the examples only one of them answered (a positive gap: the Poisson "
                      "sampler answers fewer). Reported; no claim tests it.")
        doc.table(["condition", "budget", "examples", "top-k", "Poisson", f"gap [{run.pct} CI]", "only top-k",
                   "only Poisson", "McNemar p"],
                  [[r["condition"], f"{r['budget']:g}", r["examples"], fmt(r["topk"]), fmt(r["poisson"]),
                    f"{r['gap']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]", r["only_topk"], r["only_poisson"],
                    f"{r['mcnemar_p']:.3g}"] for _, r in gaps.iterrows()])


def figures_section(doc: Document, run: ReportData) -> pd.DataFrame:
    """The figures (induced failures, AUCs, replay coverage and tightness, recompute gain, multi-turn recall) and
    ``replay_cells.csv``; returns the multi-turn table (the multi-turn section's)."""
    fig_dir, by_stat, scores_ok, replay, delta = run.fig_dir, run.by_stat, run.scores_ok, run.replay, run.delta
    doc.heading("Figures")
    c3 = by_stat.get("induced_failure_rate")
    rates = induced_failure_rates(scores_ok, run.tasks) if scores_ok is not None else pd.DataFrame()
    thr3 = c3.tests[0].threshold if c3 else None
    doc.figure(figures.induced_failure_figure(rates, fig_dir / "induced_failure.png", thr3) if len(rates) else None,
               "induced-failure rate (among examples the full cache answers correctly) by KV budget, "
               "condition and sampler (the paper's Fig. 1)")
    doc.figure(figures.auc_figure(run.claims, fig_dir / "auc_prediction_attribution.png"),
               "certificate vs output confidence: failure prediction (C4) and attribution of failures to "
               f"the cache (C6), ROC AUC with {run.pct} bootstrap intervals — within strata (the registered test) and "
               "pooled (the paper's Fig. 3)")
    cells = replay_cells(replay) if len(replay) else pd.DataFrame()
    if len(cells):
        with atomic_path(run.out / "replay_cells.csv") as tmp:
            cells.to_csv(tmp, index=False)
    c1 = by_stat.get("coverage")
    doc.figure(figures.coverage_figure(cells, fig_dir / "coverage.png", delta,
                                       c1.tests[0].threshold if c1 else None) if len(cells) else None,
               f"coverage at δ = {delta:g} per replay cell by query kind, plug-in and robust certificate, and the "
               "anytime radius's coverage of whole paths (every step of a draw's decoding covered)")
    doc.figure(figures.tightness_figure(replay, fig_dir / "tightness.png") if len(replay) else None,
               "tightness: the distribution of certificate radius over realised attention error per replay draw, "
               "plug-in and robust; the curve's height at 1 is the share of draws missed")
    c7 = by_stat.get("gain_ratio_certificate_over_random_stratified") or by_stat.get("gain_ratio_certificate_over_random")
    doc.figure(figures.recompute_figure(c7, fig_dir / "recompute_gain.png"),
               "recomputation gain vs recompute rate (C7): certificate, confidence and random gating at matched rates, "
               "every stratum recomputing the same share (the registered gate)")
    mt_cell, threshold = run.multiturn_cell, run.gate_threshold
    table = (multiturn_table(scores_ok, mt_cell, threshold, bootstrap_plan=run.plan.bootstrap)
             if scores_ok is not None and mt_cell else pd.DataFrame())
    budget_txt = ", ".join(f"{100 * float(b):g} %" for b in mt_cell.get("budgets", []))
    recomputed = float(table.loc[table["bin"] == "overall", "recomputed"].iloc[0]) if len(table) else float("nan")
    doc.figure(figures.multiturn_figure(table, fig_dir / "multiturn_recall.png", budget_txt) if len(table) else None,
               f"multi-turn recall by turn distance: full cache, top-k, Poisson and certificate-gated (gate: the "
               f"largest step's relative radius above {threshold:g}), and random and confidence gating recomputing "
               "as many runs"
               + (f" — the gate recomputed {100 * recomputed:.0f} % of the runs"
                  + (" (every run: the gated line is the full cache, not the certificate rescuing the compressed "
                     "run)" if recomputed >= 0.999 else "") if recomputed == recomputed else ""))
    return table


def replay_section(doc: Document, run: ReportData) -> None:
    """The attention-level replay (C1, C2, C8): coverage, Spearman and tightness per query kind."""
    doc.heading("Attention-level replay (C1, C2, C8)")
    if not len(run.replay):
        doc.paragraph("No replay draws.")
        return
    delta = run.delta
    summary = run.claims_doc.replay_summary or summarize_replay(run.replay, delta)
    doc.paragraph(f"Coverage at δ = {delta:g} (nominal {1 - delta:g}); per replay cell (model × example × layer × "
                  "query head × budget × query kind) in `replay_cells.csv`. Setting query = the last prompt query "
                  "(the last of the observation window whose attention set π: SnapKV pools the window's queries "
                  "over a KV head's query heads, so no single query set π); later = decode-step queries of the "
                  "full-cache run over the same sample (stale π); sample-dependent = decode-step queries of each "
                  "draw's own compressed run (diverged: those whose run had by then fed other tokens than the "
                  "full run). The `all` row pools the three kinds; C1 pools setting and later (its registered "
                  "kinds), so its figure differs from that row. The anytime radius "
                  "claims every step of a draw's path (the setting query and the decode steps of one run) at "
                  "once: its coverage is the share of paths whose every step is covered, not the per-step mean. "
                  "Spearman within cell = the median over cells of one step (example × layer × head × budget × "
                  "step, across draws) — the pooled figure mixes cells of very different scale. The robust "
                  "certificate (this project's, claim C8) adds the eviction sketch's shadow terms.")
    doc.table(REPLAY_HEADER, replay_rows(summary))


def impossibility_section(doc: Document, impossibility: Sequence[Mapping]) -> None:
    """Theorem 1 on one real layer: the retained state hashes identically while the true error moves."""
    doc.heading("Impossibility demonstration (Theorem 1)")
    if not impossibility:
        doc.paragraph("Not run.")
        return
    doc.paragraph("Deterministic top-k on one real layer: the evicted values are altered; everything retained "
                  "(positions, keys, values, scores) hashes identically while the true error moves. Paper: "
                  "permuting evicted values moved the true error 64×.")
    doc.table(IMPOSSIBILITY_HEADER, [impossibility_row(r) for r in impossibility])
    flat = [r for r in impossibility if r["mode"] == "permute" and 0.8 <= float(r["error_ratio"]) <= 1.25]
    if flat:
        doc.paragraph("Permuting the evicted values moves the error only as far as the evicted tokens' attention "
                      "weights differ: where they are nearly equal (as in this layer, ratio "
                      f"{float(flat[0]['error_ratio']):.2f}×) the permuted sum barely changes. The point of the "
                      "theorem is that nothing retained changes either way; the shift alteration shows the error "
                      "moving under an identical retained state.")


def multiturn_section(doc: Document, run: ReportData, table: pd.DataFrame) -> None:
    """Multi-turn recall by turn distance: full cache, top-k, Poisson and certificate-gated."""
    doc.heading("Multi-turn recall")
    if not len(table):
        doc.paragraph("No multi-turn runs.")
        return
    gate = run.plan.multiturn_gate
    doc.paragraph(f"Certificate-gated = the Poisson run, recomputed with the full cache when the gate fires "
                  f"({gate.field} {gate.aggregation} over heads, {gate.over_steps} over steps "
                  f"> {run.gate_threshold:g}). Paper: gated {MULTITURN_PAPER['overall']['gated']} vs top-k "
                  f"{MULTITURN_PAPER['overall']['topk']} overall; {MULTITURN_PAPER['26-30']['gated']} vs "
                  f"{MULTITURN_PAPER['26-30']['topk']} at 26–30 turns.")
    doc.paragraph(f"Beside it, at the same recompute rate: random gating (the expected recall of recomputing a random "
                  f"share of the runs as large as the gate's) and confidence gating (recomputing that share with the "
                  f"lowest mean token log-probability). The overall row's intervals are {run.pct} bootstrap intervals "
                  f"over examples, the rate re-measured in each resample.")

    def with_ci(r, col):
        ci = r.get(f"{col}_ci") if f"{col}_ci" in table else None
        return fmt(r[col]) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if isinstance(ci, list) else "")

    doc.table(["turn distance", "runs", "full cache", "top-k", "Poisson", "certificate-gated", "random, same rate",
               "confidence, same rate", "recomputed"],
              [[r["bin"], r["n"], fmt(r["full"]), fmt(r["topk"]), fmt(r["poisson"]), with_ci(r, "gated"),
                with_ci(r, "random"), with_ci(r, "confidence"), fmt(r["recomputed"])] for _, r in table.iterrows()])
    versus = run.gate_versus_random
    if versus is not None:
        doc.paragraph(gate_versus_random_text(versus, run.pct))


def gate_versus_random_text(v, pct: str) -> str:
    """The gate against random gating at its rate, paired by conversation, and what it means in plain words
    (:class:`kvcert.analysis.multiturn_recall.GateVersusRandom`)."""
    return (f"**Gate versus random, paired by conversation:** gated minus random recall at the gate's rate "
            f"({100 * v.rate:.0f} % recomputed) = {v.difference:+.3f} [{v.ci_low:+.3f}, {v.ci_high:+.3f}] ({pct} "
            f"bootstrap interval over {v.conversations} conversations, {v.resamples} resamples, the rate re-measured "
            f"in each), exact permutation P = {v.permutation_p:.2g} (one-sided: the gate's firings placed on random "
            f"runs recompute at least its gain). On these {v.conversations} conversations, {v.sentence()}.")


def failure_labels_section(doc: Document, run: ReportData) -> None:
    """Failure labels pooled over models, lengths and the main tasks; the full table in ``failure_labels.csv``."""
    doc.heading("Failure labels")
    scores_ok, tasks = run.scores_ok, run.tasks
    if scores_ok is None:
        doc.paragraph("No generations.")
        return
    labels = failure_label_table(scores_ok)
    with atomic_path(run.out / "failure_labels.csv") as tmp:
        labels.to_csv(tmp, index=False)
    pooled = failure_label_table(scores_ok if tasks is None else scores_ok[scores_ok["task"].isin(tasks)],
                                 by=["condition", "budget", "method"])
    doc.paragraph("Pooled over models, lengths and the main tasks; per model × length × task × condition × budget "
                  "× method in `failure_labels.csv`.")
    doc.table(["condition", "budget", "method", "runs", "correct", "cache-induced", "inherent", "no full run",
               "induced-failure rate", "induced share of failures"],
              [[r["condition"], f"{r['budget']:g}", r["method"], r["runs"], r["correct"], r["induced"],
                r["inherent"], r["unknown"], fmt(r["induced_failure_rate"]), fmt(r["induced_share_of_failures"])]
               for _, r in pooled.iterrows()])


