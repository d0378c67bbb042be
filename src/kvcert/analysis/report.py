"""The claim report: ``report.md``, a self-contained ``report.html`` and ``figures/*.png``.

Order: a banner on runs that are not the paper's models (the embedded miniature; a real
pretrained model kvcert fetches, ``path: fetch:NAME``; the rehearsal's random-weight
stand-ins), the "Model" table (what each model is, its parameters, layers, heads and head
size: :mod:`kvcert.analysis.model_info`), the contents, the claims — our verdict beside the
paper's and other runs' under it (``kvcert report --beside LABEL=claims.json``: a line each
in the paper's column, so the table keeps seven columns at 800 px; "not run" while that file
is absent; their pre-registration hashes in the provenance), each claim's placebo and the
verdict's stability over bootstrap seeds — and its tests (the registered statistics, with
the paper's pooled statistic reported beside them), the plain accuracy table (condition ×
method × budget, with intervals) and the paired accuracy gap of top-k and the Poisson sampler
(:mod:`kvcert.analysis.paired_gap`), then the figures (accuracy by budget, induced failures by
budget × condition, prediction vs attribution AUC, replay coverage and tightness of the
plug-in and the robust certificate, recompute-gain curves, multi-turn recall), the replay,
impossibility, multi-turn and failure-label tables, the comparison signals
(:mod:`kvcert.analysis.report_signals`), the per-claim details (an embedded run's C1: why its
plug-in certificate under-covers; the secondary analyses beside C1 and C8), and the provenance block (pre-registration hash and
freeze time, git commits, config hashes, the models' config.json, the beside runs'
pre-registrations, generations started before the freeze — listed, and excluded from scoring).
``failure_labels.csv``, ``replay_cells.csv`` and ``generations_per_cell.csv`` hold the full
tables. The document model (:mod:`kvcert.analysis.document`) renders it twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from ..config.analysis_plan import AnalysisPlan
from ..atomic import atomic_path, write_text
from . import figures
from .document import BR, Document, fmt, fmt_ci
from .labels import failure_label_table, induced_failure_rates
from .leaderboard import accuracy_table
from .load import scored
from .model_info import MODEL_HEADER, ModelInfo, fetched_caveat, fetched_phrase
from .multiturn_recall import PAPER as MULTITURN_PAPER
from .multiturn_recall import multiturn_table
from .paired_gap import paired_gaps
from .stats import BootstrapPlan
from .replay_stats import replay_cells, summarize_replay

MARK = {"pass": "✓", "fail": "✗", "unclear": "?", "unexercised": "–"}
OP_TEXT = {">=": "≥", ">": ">", "<=": "≤", "<": "<"}


# --- sections -----------------------------------------------------------------------------------
def agreement(ours: str, paper: str | None) -> str:
    """'same' / 'differs' against the paper's verdict; '–' where the paper states none (a claim beyond it)."""
    if not paper:
        return "–"
    return "same" if paper == ours else "differs"


def placebo_text(c: Mapping) -> str:
    """The claim's placebo in a few words: which one leads, its verdict under the same tests."""
    p = c.get("placebo") or {}
    if not p.get("applicable"):
        return "not applicable"
    text = f"{p['kind'].replace('_', ' ')}: {p['verdict']}"
    return f"**{text} — passes**" if p.get("passes") else text


def stability_text(c: Mapping) -> str:
    st = c.get("seed_stability") or {}
    if not st.get("seeds"):
        return "–"
    return f"{100 * st['agree']:.0f} % of {st['seeds']} seeds"


def beside_line(run: Mapping, claim_id: str) -> str:
    """A beside run's verdict and value for one claim, under the paper's in the claims table; what it is when
    that run is absent (the command that makes it is in the paragraph above the table) or lacks the claim."""
    label = f"*{run['label']}* — "
    if not run.get("run"):
        return label + "not run"
    theirs = (run.get("claims") or {}).get(claim_id)
    if not theirs:
        return label + "no such claim"
    return label + f"{theirs['verdict']}: {fmt(theirs.get('value'))}"


def claim_rows(claims: list[Mapping], stand_ins: bool = False, beside: Sequence[Mapping] = ()) -> list[list[str]]:
    """The claims table: one row per claim (its tests are in :func:`test_rows`); the paper's verdict and value
    in one column, whether ours is the same beside it (``stand_ins``, a rehearsal: no agreement is claimed),
    and under it, a line per beside run (``kvcert report --beside``: its verdict and value) — folded into the
    paper's column, so that the table keeps its seven columns at 800 px."""
    rows = []
    for c in claims:
        paper = c.get("paper") or {}
        statement = c["statement"] + (" (this project's claim, beyond the paper)" if c.get("beyond_paper") else "")
        verdict = paper.get("verdict")
        if not verdict:
            theirs = str(paper.get("value") or "–")
        elif stand_ins:
            theirs = f"{verdict}: {paper.get('value') or '–'}"
        else:
            theirs = f"{verdict}: {paper.get('value') or '–'} ({agreement(c['verdict'], verdict)})"
        theirs += "".join(BR + beside_line(b, c["id"]) for b in beside)
        rows.append([c["id"], statement, f"**{c['verdict']}**", theirs, placebo_text(c), stability_text(c),
                     "; ".join(c.get("reasons") or [])])
    return rows


CLAIM_HEADER = ["claim", "statement", "our verdict", "paper's verdict: value (ours same?)", "placebo (same tests)",
                "stable over seeds", "notes"]


def claim_header(beside: Sequence[Mapping] = ()) -> list[str]:
    """:data:`CLAIM_HEADER`; with beside runs, the paper's column names them too (a line each under the paper's)."""
    if not beside:
        return list(CLAIM_HEADER)
    return [*CLAIM_HEADER[:3], CLAIM_HEADER[3] + ", then " + ", ".join(f"{b['label']}'s" for b in beside),
            *CLAIM_HEADER[4:]]


def pooled_counterpart(statistic: str) -> str | None:
    """The paper's pooled statistic reported beside a registered one (None where the test is the paper's own)."""
    if statistic == "spearman_within_cell":
        return "spearman"
    return statistic.replace("_stratified", "") if "_stratified" in statistic else None


def test_rows(claims: list[Mapping]) -> list[list[str]]:
    """One row per registered test — statistic, threshold, estimate, outcome, the leading placebo's estimate —
    then, marked, the paper's pooled statistic reported beside it (not tested)."""
    rows = []
    for c in claims:
        stats = (c.get("details") or {}).get("statistics") or {}
        placebo = (c.get("placebo") or {}).get("statistic") or {}
        for t in c["tests"]:
            p = placebo.get(t["statistic"])
            rows.append([c["id"], f"`{t['statistic']}` {OP_TEXT.get(t['op'], t['op'])} {t['threshold']:g}"
                         f"{'†' if t.get('ours') else ''}", fmt_ci(t) + unit_text(t),
                         f"{MARK[t['outcome']]} {t['outcome']}", fmt_ci(p) if p else "–"])
            beside = pooled_counterpart(t["statistic"])
            if beside and beside in stats:
                rows.append([c["id"], f"`{beside}` (the paper's pooled statistic; reported, not tested)",
                             fmt_ci(stats[beside]), "–", "–"])
    return rows


TEST_HEADER = ["claim", "test (passes when)", "estimate [90 % CI]", "outcome", "leading placebo [90 % CI]"]
#: a replay test's bootstrap unit, in words (``bootstrap.replay_unit`` / ``replay_beside``)
UNIT_WORDS = {"cell": "replay cells", "example_layer": "prompt × layer", "example": "prompts"}


def unit_text(test: Mapping) -> str:
    """A replay test's unit and, where registered, the intervals over the other units beside it (not deciding):
    " (over prompts; prompt × layer [a, b], replay cells [c, d])"; empty for a generation test."""
    unit = test.get("unit")
    if not unit:
        return ""
    beside = test.get("beside") or {}
    others = "; ".join(f"{UNIT_WORDS.get(u, u)} [{fmt(b['ci'][0])}, {fmt(b['ci'][1])}]" for u, b in beside.items())
    return f" (over {UNIT_WORDS.get(unit, unit)}" + (f"; beside: {others}" if others else "") + ")"


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


def provenance_section(doc: Document, claims_doc: Mapping, scores: pd.DataFrame | None, scores_prov: Mapping,
                       replay_prov: Sequence[Mapping], out_dir: Path | None = None,
                       models: Sequence[ModelInfo] = (), beside: Sequence[Mapping] = ()) -> None:
    doc.heading("Provenance")
    prov = claims_doc.get("provenance", {})
    lines = [
        f"pre-registration hash: {scores_prov.get('prereg_hash') or prov.get('prereg_hash')}",
        f"frozen (UTC): {scores_prov.get('frozen_utc') or prov.get('frozen_utc')}  record: {scores_prov.get('freeze_record', '–')}",
        f"freeze commit: {scores_prov.get('freeze_git_commit', '–')}",
        f"analysis commit: {prov.get('analysis_git_commit', '–')}",
        f"experiment: {claims_doc.get('experiment', '–')}",
        f"bootstrap: {prov.get('bootstrap', '–')}",
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
    own_hash = scores_prov.get("prereg_hash") or prov.get("prereg_hash")
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


#: why the embedded miniature's plug-in certificate under-covers (claim C1); the numbers come from an
#: independent check of the replay, not from this run's statistics (docs/embedded.md, the same text)
EMBEDDED_C1 = (
    "*Why the plug-in certificate under-covers on the embedded miniature* (numbers measured by an independent "
    "check of the replay, not by this run's statistics; docs/embedded.md): its coverage was 0.70 (0.75 on the "
    "query that set π). The radius computed with the *true* design variance covers 0.976, and the variance "
    "estimator is unbiased on average, but in a typical draw it is 0.20 of the truth: π comes from SnapKV's score "
    "pooled over the observation window and the query heads of a group, not from each query's own attention, so "
    "one tail token with π 0.03–0.3 carries 50–76 % of the variance, and in most draws it is not sampled — the "
    "estimate cannot count what it never sees. On a real model, SmolLM2-135M-Instruct, the same replay code "
    "covers 0.96–0.99 per step.")


def beside_paragraph(beside: Sequence[Mapping], prereg_hash: str | None) -> str:
    """The beside runs in one sentence: which experiment each line under the paper's verdict is, and whether it
    ran (the command that makes it where it did not)."""
    parts = []
    for b in beside:
        if not b.get("run"):
            parts.append(f"**{b['label']}** — not run (`{b['command']}`): {b['path']} is absent")
            continue
        models = ", ".join((b.get("grid") or {}).get("models") or []) or "–"
        same = ("the same pre-registration" if b.get("prereg_hash") == prereg_hash
                else "another pre-registration, see Provenance")
        parts.append(f"**{b['label']}**: experiment {b.get('experiment')} (models {models}; {same})")
    return "Under the paper's verdict, each claim's verdict: value in another run — " + "; ".join(parts) + "."


@dataclass
class ReportData:
    """What every section of the report reads: the claims document and the tables it was made from."""

    claims_doc: Mapping
    out: Path
    fig_dir: Path
    claims: list
    plan: AnalysisPlan
    grid: Mapping
    scores_ok: pd.DataFrame | None
    replay: pd.DataFrame
    tasks: list[str] | None
    by_stat: dict = field(default_factory=dict)

    @property
    def delta(self) -> float:
        return self.plan.delta

    @property
    def pct(self) -> str:
        """The bootstrap intervals' level as text ("90 %")."""
        return f"{100 * self.plan.bootstrap.level:g} %"

    @property
    def multiturn_cell(self) -> Mapping:
        return self.grid.get("multiturn") or {}

    @property
    def gate_threshold(self) -> float:
        """The multi-turn gate's threshold: the grid's cell may register its own (a model's radii have their own
        scale), else the plan's ``multiturn_gate.threshold`` (0.1 where none)."""
        gate = self.plan.multiturn_gate.threshold
        return float(self.multiturn_cell.get("gate_threshold", 0.1 if gate is None else gate))


def build_report(
    claims_doc: Mapping, scores: pd.DataFrame | None, scores_provenance: Mapping | None, replay: pd.DataFrame | None,
    impossibility: Sequence[Mapping], out_dir: str | Path, replay_provenance: Sequence[Mapping] = (),
    models: Sequence[ModelInfo] = (), beside: Sequence[Mapping] = (),
) -> dict[str, Path]:
    """Write report.md, report.html, failure_labels.csv and figures/*.png under ``out_dir``. ``models``: what
    each model of the run is (:func:`kvcert.analysis.model_info.run_models`); ``beside``: other runs' verdicts
    shown beside this run's (:func:`kvcert.analysis.steps.beside_run`). One section function each, in order."""
    out = Path(out_dir)
    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    claims = list(claims_doc.get("claims", []))
    grid = claims_doc.get("grid") or {}
    # the plan a claims.json records (δ 0.1 and the defaults for a document without one)
    run = ReportData(claims_doc, out, fig_dir, claims, AnalysisPlan.of_document(claims_doc, 0.1), grid,
              scored(scores) if scores is not None and len(scores) else None,
              replay if replay is not None else pd.DataFrame(), list(grid["tasks"]) if grid.get("tasks") else None,
              {t["statistic"]: c for c in claims for t in c["tests"]})
    doc = Document()
    title = f"kvcert claim report — {claims_doc.get('experiment', 'experiment')}"
    doc.heading(title, 1)
    banner(doc, claims_doc.get("experiment"), grid, models)
    model_section(doc, models)
    claims_section(doc, run, beside)
    accuracy_section(doc, run)
    multiturn = figures_section(doc, run)
    replay_section(doc, run)
    impossibility_section(doc, impossibility)
    multiturn_section(doc, run, multiturn)
    failure_labels_section(doc, run)

    from .report_signals import signals_section  # it builds on this module's Document

    signals_section(doc, claims_doc.get("comparison_signals"), fig_dir)
    details_section(doc, run)
    provenance_section(doc, claims_doc, scores, scores_provenance or {}, replay_provenance, out, models, beside)

    md = out / "report.md"
    write_text(md, doc.markdown(out))
    page = out / "report.html"
    write_text(page, doc.html(title))
    return {"markdown": md, "html": page, "figures": fig_dir}


def claims_section(doc: Document, run: ReportData, beside: Sequence[Mapping]) -> None:
    """The run in one paragraph, the contents, the claims table (our verdict beside the paper's and the beside
    runs') and the tests table."""
    claims, claims_doc = run.claims, run.claims_doc
    verdicts = pd.Series([c["verdict"] for c in claims]).value_counts().to_dict()
    n_gen = 0 if run.scores_ok is None else len(run.scores_ok)
    doc.paragraph(
        f"Reproduction of the pre-registered claims of Xie, *Error Certificates for KV-Cache Eviction via Randomized "
        f"Design* (arXiv 2607.21475). {n_gen} scored generations, {len(run.replay)} replay draws × queries. Verdicts: "
        + ", ".join(f"{v} {k}" for k, v in verdicts.items()) + f". Tests use {run.pct} bootstrap percentile intervals "
        "(✓ pass, ✗ fail, ? unclear, – unexercised); † marks thresholds set by this project before any run."
    )
    doc.contents()
    doc.heading("Claims")
    doc.paragraph(
        "The registered statistics are computed where the claim's information lives: C4's and C6's AUCs over the "
        "pairs of runs that share a stratum (model × task × condition × budget × length × method), C7's gate "
        "recomputing the same share of every stratum, C2's Spearman within the cells of one step — so that a score "
        "knowing only a run's cell cannot pass. The paper's pooled statistics are reported beside them. Each "
        "claim's tests are run again on **placebos** (a signal with no draw- or run-level information: the "
        "stratum's base rate, a random score; a step cell's median radius, radii permuted among a cell's draws): "
        "a claim whose tests pass while a placebo's pass too is **uninformative**, not held. Every verdict, "
        f"placebos included, is redone under {((claims[0].get('seed_stability') or {}).get('seeds') if claims else 0) or 'no'} "
        "other bootstrap seeds; the share that agrees is shown.")
    if beside:
        doc.paragraph(beside_paragraph(beside, (claims_doc.get("provenance") or {}).get("prereg_hash")))
    doc.table(claim_header(beside), claim_rows(claims, stand_ins=claims_doc.get("experiment") == "rehearsal",
                                               beside=beside), css_class="claims")
    doc.heading("Tests", 3)
    doc.table([h.replace("90 %", run.pct) for h in TEST_HEADER], test_rows(claims))


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
    gaps = paired_gaps(run.scores_ok, BootstrapPlan.from_plan(run.plan), run.tasks)
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
    thr3 = next((t["threshold"] for t in c3["tests"]), None) if c3 else None
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
                                       c1["tests"][0]["threshold"] if c1 else None) if len(cells) else None,
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
    table = (multiturn_table(scores_ok, mt_cell, threshold, bootstrap_plan=BootstrapPlan.from_plan(run.plan))
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
    summary = run.claims_doc.get("replay_summary") or summarize_replay(run.replay, delta)
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


def details_section(doc: Document, run: ReportData) -> None:
    """Per claim: its verdict's reasons, cell counts, the statistics beside the tests, placebos, breakdowns."""
    doc.heading("Claim details")
    grid = run.grid
    for c in run.claims:
        doc.heading(f"{c['id']} — {c['statement']}", 3)
        doc.paragraph(f"Metric: {c['metric']} Kill: {c['kill']}. Verdict: **{c['verdict']}**"
                      + (f" ({'; '.join(c['reasons'])})" if c.get("reasons") else "") + ".")
        if c["id"] == "C1" and "embedded" in (grid.get("models") or []):
            doc.paragraph(EMBEDDED_C1)
        cell = c.get("cell", {})
        names = {"generations": "replay cells" if c.get("source") == "replay" else "generations"}
        strata = (c.get("details") or {}).get("strata")  # a stratified AUC's counts: the strata holding both outcomes
        counted = (f"positives and negatives counted in the {strata['strata_used']} strata that hold both outcomes; "
                   if isinstance(strata, Mapping) else "")
        doc.paragraph("Cell: " + ", ".join(f"{names.get(k, k)} {v}" for k, v in cell.items() if k != "minimum")
                      + f" ({counted}pre-registered minimum: "
                      + ", ".join(f"{names.get(k, k)} {v}" for k, v in (cell.get("minimum") or {}).items()) + ").")
        det = c.get("details", {})
        if det.get("within_cell_median") is not None:
            doc.paragraph(f"Spearman within a cell (one example × layer × head × budget × step, across draws): median "
                          f"{fmt(det['within_cell_median'])} over {det.get('step_cells')} cells (interquartile "
                          f"{fmt((det.get('within_cell_q25_q75') or [None])[0])}–"
                          f"{fmt((det.get('within_cell_q25_q75') or [None, None])[1])}); within a head "
                          f"{fmt(det.get('within_head_median'))}. The registered test is the within-cell median; "
                          "the pooled figure, which mixes cells of very different scale, is reported beside it.")
        kinds = (c.get("cells") or {}).get("query_kinds") if isinstance(c.get("cells"), Mapping) else None
        if det.get("later_coverage_by_budget_layer"):
            text = "Later-query coverage per budget × layer cell: " + ", ".join(
                f"{k} {fmt(v)}" for k, v in det["later_coverage_by_budget_layer"].items())
            if kinds is None or "sample_dependent" in kinds:  # only where the claim's cells hold those rows
                text += (f"; sample-dependent rows {det.get('sample_dependent_rows')}, of which diverged "
                         f"{det.get('diverged_rows')} ({det.get('diverged_decodes')} compressed decodes left the full "
                         "run's tokens)")
            if kinds:
                text += f". The claim's cells hold the {' and '.join(kinds)} queries; its figures pool those"
            doc.paragraph(text + ".")
        if isinstance(det.get("strata"), Mapping):
            st = det["strata"]
            doc.paragraph(f"Strata: {st['strata_used']} hold both outcomes, {st['strata_dropped']} lack one and add no "
                          f"pair; every run of the cell, those strata included: {st['pooled_positives']} positives / "
                          f"{st['pooled_negatives']} negatives.")
        placebo = c.get("placebo") or {}
        for pb in placebo.get("placebos", []):
            doc.paragraph(f"Placebo *{pb['kind'].replace('_', ' ')}* ({pb['description']}): **{pb['verdict']}** — "
                          + "; ".join(f"`{n}` {fmt_ci(v)} {MARK.get(v['outcome'], '')}"
                                      for n, v in pb["statistic"].items()) + ".")
        if det.get("paths"):
            doc.paragraph(f"Anytime coverage = the share of {det['paths']} paths (a draw's setting query and the decode "
                          "steps of one run) whose every step is covered; coverage_anytime_step is the per-step mean.")
        # statistics without data in this claim's cells (every resample skipped) are left out
        stats = {n: s for n, s in det.get("statistics", {}).items() if s["skipped"] < s["resamples"]}
        if stats:
            doc.table(["statistic", f"estimate [{run.pct} CI]", "resamples", "skipped"],
                      [[n, fmt_ci(s, 4), s["resamples"], s["skipped"]] for n, s in stats.items()])
        if det.get("secondary"):
            secondary_table(doc, det["secondary"], run.pct)
        breakdown_tables(doc, c.get("details", {}).get("by_model_length") or [])


#: model × length columns of a claim's breakdown per table (each a column: the tables fit 800 px)
BREAKDOWN_COLUMNS = 4


def breakdown_tables(doc: Document, breakdown: Sequence[Mapping]) -> None:
    """A claim's statistics per model × length, one row a statistic and one column a model × length, at most
    :data:`BREAKDOWN_COLUMNS` columns a table (a claim with many statistics, C7's gains at every rate, stays
    narrow)."""
    if not breakdown:
        return
    keys = list(dict.fromkeys(k for b in breakdown for k in b if k not in ("model", "target_tokens")))
    for start in range(0, len(breakdown), BREAKDOWN_COLUMNS):
        part = breakdown[start:start + BREAKDOWN_COLUMNS]
        doc.table(["per model, length", *(f"{b['model']}, {b['target_tokens']}" for b in part)],
                  [[k, *(fmt(b.get(k)) if isinstance(b.get(k), float) else b.get(k, "–") for b in part)]
                   for k in keys])


#: a replay certificate's name in prose
CERTIFICATE_WORDS = {"plugin": "plug-in", "robust": "robust"}
#: the secondary analyses' rows: (statistic stem, what it is, how the two compare)
SECONDARY_ROWS = (
    ("top_error_coverage", "coverage on the draws of largest error (top {top} of their step cell)", "difference"),
    ("bottom_radius_coverage", "coverage on the draws of smallest radius (bottom {bottom} of their step cell)",
     "difference"),
    ("matched_tightness", "radius / error at matched coverage {matched} (lower is tighter)", "ratio"),
)


def secondary_table(doc: Document, sec: Mapping, pct: str = "90 %") -> None:
    """A replay claim's secondary analyses (``analysis_plan.secondary``): its certificate beside its step cell's
    constant radius, paired on the same draws, with intervals; reported, deciding nothing."""
    stats = {n: v for n, v in (sec.get("statistics") or {}).items() if v.get("estimate") is not None}
    if not stats:
        doc.paragraph(f"Secondary analyses (registered; deciding nothing): the "
                      f"{CERTIFICATE_WORDS.get(sec['certificate'], sec['certificate'])} certificate against "
                      "its step cell's constant — no draws in this claim's cells to compare them on.")
        return
    words = {"top": f"{100 * sec['top_error']:g} %", "bottom": f"{100 * sec['bottom_radius']:g} %",
             "matched": f"{sec['matched_coverage']:g}"}
    rows = []
    for stem, what, cmp in SECONDARY_ROWS:
        if not all(n in stats for n in (stem, f"{stem}_constant", f"{stem}_{cmp}")):
            continue
        rows.append([what.format(**words), fmt_ci(stats[stem], 4), fmt_ci(stats[f"{stem}_constant"], 4),
                     f"{'certificate − constant' if cmp == 'difference' else 'certificate / constant'} "
                     f"{fmt_ci(stats[f'{stem}_{cmp}'], 4)}", (sec.get("draws") or {}).get(stem, "–")])
    name = CERTIFICATE_WORDS.get(sec["certificate"], sec["certificate"])
    doc.paragraph(f"Secondary analyses (registered in the analysis plan; reported, deciding nothing): the {name} "
                  f"certificate (`{sec['radius']}`) against its step cell's constant — every radius replaced by the "
                  "median radius of its step cell, a radius that knows the cell and not the draw — paired on the "
                  f"same draws; {pct} intervals over {UNIT_WORDS.get(sec.get('unit'), sec.get('unit'))}.")
    doc.table(["analysis", *(f"{h} [{pct} CI]" for h in ("certificate", "constant", "comparison")), "draws"], rows)

