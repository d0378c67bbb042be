"""The claim report: ``report.md``, a self-contained ``report.html`` and ``figures/*.png``.

Order (issue "Claim scoring and the report"): a banner on runs of the embedded miniature,
the contents, the claim table — our verdict and number beside the paper's — the plain
accuracy table (condition × method × budget × task), then the figures (accuracy by
budget, (induced failures by budget × condition,
prediction vs attribution AUC, replay coverage (per step and anytime over whole paths) and
tightness of the plug-in and the robust certificate, recompute-gain curves,
multi-turn recall), the replay, impossibility, multi-turn and failure-label tables, the
comparison signals (the signal leaderboard, secondary analyses of the third amendment:
:mod:`kvcert.analysis.report_signals`), the per-claim details, and the provenance block (pre-registration hash and freeze time,
git commits, config hashes, generations per cell, generations started before the
freeze — listed, and excluded from scoring). ``failure_labels.csv`` holds the full
per-cell failure-label table, ``replay_cells.csv`` the coverage of every replay cell.

The report is assembled once as a list of blocks and rendered twice: Markdown (figures
linked as files) and HTML (figures embedded as base64 PNG, no external resource).
"""

from __future__ import annotations

import base64
import html
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from . import figures
from .labels import failure_label_table, induced_failure_rates
from .leaderboard import accuracy_table
from .load import scored
from .multiturn_recall import PAPER as MULTITURN_PAPER
from .multiturn_recall import multiturn_table
from .replay_stats import replay_cells, summarize_replay

MARK = {"pass": "✓", "fail": "✗", "unclear": "?"}
OP_TEXT = {">=": "≥", ">": ">", "<=": "≤", "<": "<"}


# --- a tiny document model --------------------------------------------------------------------
@dataclass
class Block:
    kind: str  # heading | paragraph | table | figure | code | note | contents
    text: str = ""
    level: int = 2
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    path: Path | None = None


class Document:
    """Blocks rendered to Markdown and HTML; figures are numbered in order of appearance,
    headings get anchors, and a ``contents`` block lists the level-2 headings."""

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.figures = 0

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(Block("heading", text, level))

    def note(self, text: str) -> None:
        self.blocks.append(Block("note", text))

    def contents(self) -> None:
        self.blocks.append(Block("contents"))

    def paragraph(self, text: str) -> None:
        self.blocks.append(Block("paragraph", text))

    def table(self, header: Sequence[str], rows: Sequence[Sequence]) -> None:
        self.blocks.append(Block("table", header=[str(h) for h in header], rows=[[str(c) for c in r] for r in rows]))

    def figure(self, path: Path | None, caption: str) -> None:
        if path is None:
            self.paragraph(f"*{caption}: no data.*")
        else:
            self.figures += 1
            self.blocks.append(Block("figure", f"Fig. {self.figures} — {caption}", path=path))

    def _toc(self) -> list[tuple[str, str]]:
        return [(b.text, slug(b.text)) for b in self.blocks if b.kind == "heading" and b.level == 2]

    def code(self, text: str) -> None:
        self.blocks.append(Block("code", text))

    def markdown(self, base: Path) -> str:
        out = []
        for b in self.blocks:
            if b.kind == "heading":
                out.append(f"{'#' * b.level} {b.text}\n")
            elif b.kind == "paragraph":
                out.append(b.text + "\n")
            elif b.kind == "table":
                cell = lambda s: s.replace("|", "\\|").replace("\n", " ")  # noqa: E731
                out.append("| " + " | ".join(cell(h) for h in b.header) + " |")
                out.append("|" + "---|" * len(b.header))
                out.extend("| " + " | ".join(cell(c) for c in r) + " |" for r in b.rows)
                out.append("")
            elif b.kind == "figure":
                out.append(f"![{b.text}]({b.path.relative_to(base).as_posix()})\n\n*{b.text}*\n")
            elif b.kind == "code":
                out.append("```\n" + b.text + "\n```\n")
            elif b.kind == "note":
                out.append("> " + b.text + "\n")
            elif b.kind == "contents":
                out.append("Contents: " + " · ".join(f"[{t}](#{a})" for t, a in self._toc()) + "\n")
        return "\n".join(out)

    def html(self, title: str) -> str:
        body = []
        for b in self.blocks:
            if b.kind == "heading":
                body.append(f'<h{b.level} id="{slug(b.text)}">{html.escape(b.text)}</h{b.level}>')
            elif b.kind == "paragraph":
                body.append(f"<p>{_inline(b.text)}</p>")
            elif b.kind == "table":
                head = "".join(f"<th>{html.escape(h)}</th>" for h in b.header)
                # long identifiers (auc_certificate_minus_confidence) may break after an underscore
                rows = "".join("<tr>" + "".join(f"<td>{_inline(c).replace('_', '_<wbr>')}</td>" for c in r) + "</tr>"
                               for r in b.rows)
                body.append(f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody>'
                            "</table></div>")
            elif b.kind == "figure":
                data = base64.b64encode(b.path.read_bytes()).decode()
                body.append(f'<figure><img alt="{html.escape(b.text)}" src="data:image/png;base64,{data}">'
                            f"<figcaption>{html.escape(b.text)}</figcaption></figure>")
            elif b.kind == "code":
                body.append(f"<pre>{html.escape(b.text)}</pre>")
            elif b.kind == "note":
                body.append(f'<div class="note">{_inline(b.text)}</div>')
            elif b.kind == "contents":
                links = "".join(f'<li><a href="#{a}">{html.escape(t)}</a></li>' for t, a in self._toc())
                body.append(f'<nav class="contents"><strong>Contents</strong><ol>{links}</ol></nav>')
        return (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
        )


CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.4}"
    ".scroll{overflow-x:auto;margin:0.5em 0 1.5em}"
    "table{border-collapse:collapse;font-size:0.88em}th,td{border:1px solid #ccc;padding:3px 7px;"
    "text-align:left;vertical-align:top;max-width:26em;overflow-wrap:break-word}th{background:#f0f0f0}"
    "figure{margin:1em 0}img{max-width:100%}"
    ".note{background:#fff8e1;border-left:4px solid #f0b400;padding:0.6em 0.9em;margin:1em 0}"
    "nav.contents{background:#f6f6f6;padding:0.4em 1em;margin:1em 0;font-size:0.92em}nav.contents ol{margin:0.3em 0;"
    "columns:2}code{background:#f0f0f0;padding:0 3px}"
    "figcaption{font-style:italic;font-size:0.9em}pre{background:#f6f6f6;padding:0.6em;overflow-x:auto;font-size:0.85em}"
    "strong.holds{color:#1a7f37}strong.killed{color:#b42318}strong.inconclusive{color:#9a6700}"
)


def _inline(text: str) -> str:
    """Escape, then render **bold** (verdict words get a colour class), *italics* and `code`."""
    parts = html.escape(text).split("**")
    out = []
    for i, p in enumerate(parts):
        if i % 2:
            cls = p if p in ("holds", "killed", "inconclusive") else ""
            out.append(f'<strong class="{cls}">{p}</strong>' if cls else f"<strong>{p}</strong>")
        else:
            p = re.sub(r"`([^`]+)`", r"<code>\1</code>", p)
            out.append(re.sub(r"(?<![\w*])\*([^*\s][^*]*?)\*(?![\w*])", r"<em>\1</em>", p))
    return "".join(out)


def slug(text: str) -> str:
    """A heading's anchor (GitHub's rule: lower case, punctuation dropped, spaces to dashes)."""
    return re.sub(r"[^\w\- ]", "", text.lower()).strip().replace(" ", "-")


def fmt(x, digits: int = 3) -> str:
    if x is None:
        return "–"
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(x):
        return "–"
    return f"{x:.{digits}f}"


def fmt_ci(stat: Mapping, digits: int = 3) -> str:
    lo, hi = (stat.get("ci") or [None, None])
    return f"{fmt(stat.get('estimate'), digits)} [{fmt(lo, digits)}, {fmt(hi, digits)}]"


# --- sections -----------------------------------------------------------------------------------
def claim_rows(claims: list[Mapping]) -> list[list[str]]:
    rows = []
    for c in claims:
        tests = "; ".join(f"{t['statistic']} = {fmt_ci(t)} {MARK[t['outcome']]}" for t in c["tests"])
        thresholds = "; ".join(f"{t['statistic']} {OP_TEXT.get(t['op'], t['op'])} {t['threshold']:g}"
                               f"{'†' if t.get('ours') else ''}" for t in c["tests"])
        paper = c.get("paper") or {}
        agree = "" if not paper.get("verdict") else ("same" if paper["verdict"] == c["verdict"] else "differs")
        statement = c["statement"] + (" (this project's claim, beyond the paper)" if c.get("beyond_paper") else "")
        rows.append([c["id"], statement, tests, thresholds, f"**{c['verdict']}**", str(paper.get("value", "–")),
                     str(paper.get("verdict", "–")), agree, "; ".join(c.get("reasons") or [])])
    return rows


CLAIM_HEADER = ["claim", "statement", "ours: statistic = estimate [90 % CI] (test)", "passes when", "our verdict",
                "paper", "paper's verdict", "agreement", "why inconclusive / notes"]


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
                       replay_prov: Sequence[Mapping]) -> None:
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
                           ("kvcert_version", "kvcert versions")):
            vc = scores[col].value_counts()
            shown = ", ".join(f"{k} ({v})" for k, v in vc.head(12).items())
            more = f" … and {len(vc) - 12} more" if len(vc) > 12 else ""
            lines.append(f"{label}: {len(vc)} distinct — {shown}{more}")
        if "uncertified" in scores:
            n = int(scores["uncertified"].sum())
            lines.append(f"uncertified randomized runs: {n} (tokens evicted with no random tail, e.g. sinks + window "
                         "above a short prompt's budget: no certificate, signals missing, never zero)")
        lines.append(f"records: {len(scores)}; only records made after the freeze are scored")
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
    doc.heading("Generations per cell", 3)
    doc.table(["model", "length", "task", "condition", "method", "budget", "generations"], generations_per_cell(scores))


def build_report(
    claims_doc: Mapping, scores: pd.DataFrame | None, scores_provenance: Mapping | None, replay: pd.DataFrame | None,
    impossibility: Sequence[Mapping], out_dir: str | Path, replay_provenance: Sequence[Mapping] = (),
) -> dict[str, Path]:
    """Write report.md, report.html, failure_labels.csv and figures/*.png under ``out_dir``."""
    out = Path(out_dir)
    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    claims = list(claims_doc.get("claims", []))
    plan = claims_doc.get("analysis_plan", {})
    grid = claims_doc.get("grid") or {}
    delta = float(plan.get("delta", 0.1))
    by_stat = {t["statistic"]: c for c in claims for t in c["tests"]}
    scores_ok = scored(scores) if scores is not None and len(scores) else None
    replay = replay if replay is not None else pd.DataFrame()
    tasks = list(grid["tasks"]) if grid.get("tasks") else None

    doc = Document()
    title = f"kvcert claim report — {claims_doc.get('experiment', 'experiment')}"
    doc.heading(title, 1)
    verdicts = pd.Series([c["verdict"] for c in claims]).value_counts().to_dict()
    n_gen = 0 if scores_ok is None else len(scores_ok)
    doc.paragraph(
        f"Reproduction of the pre-registered claims of Xie, *Error Certificates for KV-Cache Eviction via Randomized "
        f"Design* (arXiv 2607.21475). {n_gen} scored generations, {len(replay)} replay draws × queries. Verdicts: "
        + ", ".join(f"{v} {k}" for k, v in verdicts.items()) + ". Tests use 90 % bootstrap percentile intervals "
        "(✓ pass, ✗ fail, ? unclear); † marks thresholds set by this project before any run."
    )
    if "embedded" in (grid.get("models") or []):
        doc.note("**A miniature, not the paper's models.** This run uses the embedded model: a 2-layer model this "
                 "project trained on synthetic tasks, built to sit in the paper's regime (question-aware eviction "
                 "nearly free, streaming eviction harmful, inherent failures present) so that every claim can be "
                 "decided on a CPU. Its verdicts exercise the method on a faithful miniature; they are not evidence "
                 "about the paper's 1.5–8B models — a verdict that \"differs\" from the paper's is not a failed "
                 "reproduction (README, What the embedded world was designed to show). The paper profile is "
                 "`snakemake --profile profiles/slurm --config experiment=paper`.")
    doc.contents()
    doc.heading("Claims")
    doc.table(CLAIM_HEADER, claim_rows(claims))

    doc.heading("Accuracy by setting")
    board = accuracy_table(scores_ok, tasks) if scores_ok is not None else pd.DataFrame()
    if len(board):
        task_cols = [c for c in board.columns if c not in ("condition", "method", "budget", "compression_ratio",
                                                             "runs", "pooled")]
        doc.paragraph("Share of correct answers (score ≥ the task's pass mark) of every setting of the main grid, "
                      "per task and pooled over tasks and lengths. `budget` is the fraction of the cache kept; "
                      "`compression_ratio` (kvpress's convention) the fraction removed.")
        doc.table(["condition", "method", "budget", "compression_ratio", "runs", *task_cols, "pooled"],
                  [[r["condition"], r["method"], f"{r['budget']:g}", f"{r['compression_ratio']:g}", r["runs"],
                    *[fmt(r[t]) for t in task_cols], fmt(r["pooled"])] for _, r in board.iterrows()])
        doc.figure(figures.accuracy_figure(board, task_cols, fig_dir / "accuracy.png"),
                   "accuracy by KV budget, condition and method, per task (the full cache as a line)")
    else:
        doc.paragraph("No generations.")

    # figures
    doc.heading("Figures")
    c3 = by_stat.get("induced_failure_rate")
    rates = induced_failure_rates(scores_ok, tasks) if scores_ok is not None else pd.DataFrame()
    thr3 = next((t["threshold"] for t in c3["tests"]), None) if c3 else None
    doc.figure(figures.induced_failure_figure(rates, fig_dir / "induced_failure.png", thr3) if len(rates) else None,
               "induced-failure rate (among examples the full cache answers correctly) by KV budget, "
               "condition and sampler (the paper's Fig. 1)")
    doc.figure(figures.auc_figure(claims, fig_dir / "auc_prediction_attribution.png"),
               "certificate vs output confidence: failure prediction (C4) and attribution of failures to "
               "the cache (C6), ROC AUC with 90 % bootstrap intervals (the paper's Fig. 3)")
    cells = replay_cells(replay) if len(replay) else pd.DataFrame()
    if len(cells):
        cells.to_csv(out / "replay_cells.csv", index=False)
    c1 = by_stat.get("coverage")
    doc.figure(figures.coverage_figure(cells, fig_dir / "coverage.png", delta,
                                       c1["tests"][0]["threshold"] if c1 else None) if len(cells) else None,
               f"coverage at δ = {delta:g} per replay cell by query kind, plug-in and robust certificate, and the "
               "anytime radius's coverage of whole paths (every step of a draw's decoding covered)")
    doc.figure(figures.tightness_figure(replay, fig_dir / "tightness.png") if len(replay) else None,
               "tightness: the distribution of certificate radius over realised attention error per replay draw, "
               "plug-in and robust; the curve's height at 1 is the share of draws missed")
    doc.figure(figures.recompute_figure(by_stat.get("gain_ratio_certificate_over_random"), fig_dir / "recompute_gain.png"),
               "recomputation gain vs recompute rate (C7): certificate, confidence and random gating at matched rates")
    mt_cell = grid.get("multiturn") or {}
    gate = plan.get("multiturn_gate") or {}
    table = (multiturn_table(scores_ok, mt_cell, float(gate.get("threshold", 0.1)))
             if scores_ok is not None and mt_cell else pd.DataFrame())
    budget_txt = ", ".join(f"{100 * float(b):g} %" for b in mt_cell.get("budgets", []))
    doc.figure(figures.multiturn_figure(table, fig_dir / "multiturn_recall.png", budget_txt) if len(table) else None,
               "multi-turn recall by turn distance: full cache, top-k, Poisson and certificate-gated")

    # tables
    doc.heading("Attention-level replay (C1, C2, C8)")
    if len(replay):
        summary = claims_doc.get("replay_summary") or summarize_replay(replay, delta)
        doc.paragraph(f"Coverage at δ = {delta:g} (nominal {1 - delta:g}); per replay cell (model × example × layer × "
                      "query head × budget × query kind) in `replay_cells.csv`. Setting query = the last prompt query, "
                      "which set π; later = decode-step queries of the full-cache run over the same sample (stale π); "
                      "sample-dependent = decode-step queries of each draw's own compressed run. The anytime radius "
                      "claims every step of a draw's path (the setting query and the decode steps of one run) at "
                      "once: its coverage is the share of paths whose every step is covered, not the per-step mean. "
                      "Spearman within cell = the median over cells of one step (example × layer × head × budget × "
                      "step, across draws) — the pooled figure mixes cells of very different scale. The robust "
                      "certificate (this project's, claim C8) adds the eviction sketch's shadow terms.")
        doc.table(REPLAY_HEADER, replay_rows(summary))
    else:
        doc.paragraph("No replay draws.")
    doc.heading("Impossibility demonstration (Theorem 1)")
    if impossibility:
        doc.paragraph("Deterministic top-k on one real layer: the evicted values are altered; everything retained "
                      "(positions, keys, values, scores) hashes identically while the true error moves. Paper: "
                      "permuting evicted values moved the true error 64×.")
        doc.table(IMPOSSIBILITY_HEADER, [impossibility_row(r) for r in impossibility])
    else:
        doc.paragraph("Not run.")
    doc.heading("Multi-turn recall")
    if len(table):
        doc.paragraph(f"Certificate-gated = the Poisson run, recomputed with the full cache when the gate fires "
                      f"({gate.get('field')} {gate.get('aggregation')} over heads, {gate.get('over_steps')} over steps "
                      f"> {gate.get('threshold')}). Paper: gated {MULTITURN_PAPER['overall']['gated']} vs top-k "
                      f"{MULTITURN_PAPER['overall']['topk']} overall; {MULTITURN_PAPER['26-30']['gated']} vs "
                      f"{MULTITURN_PAPER['26-30']['topk']} at 26–30 turns.")
        doc.table(["turn distance", "runs", "full cache", "top-k", "Poisson", "certificate-gated", "recomputed"],
                  [[r["bin"], r["n"], fmt(r["full"]), fmt(r["topk"]), fmt(r["poisson"]), fmt(r["gated"]),
                    fmt(r["recomputed"])] for _, r in table.iterrows()])
    else:
        doc.paragraph("No multi-turn runs.")
    doc.heading("Failure labels")
    if scores_ok is not None:
        labels = failure_label_table(scores_ok)
        labels.to_csv(out / "failure_labels.csv", index=False)
        pooled = failure_label_table(scores_ok if tasks is None else scores_ok[scores_ok["task"].isin(tasks)],
                                     by=["condition", "budget", "method"])
        doc.paragraph("Pooled over models, lengths and the main tasks; per model × length × task × condition × budget "
                      "× method in `failure_labels.csv`.")
        doc.table(["condition", "budget", "method", "runs", "correct", "cache-induced", "inherent", "no full run",
                   "induced-failure rate", "induced share of failures"],
                  [[r["condition"], f"{r['budget']:g}", r["method"], r["runs"], r["correct"], r["induced"],
                    r["inherent"], r["unknown"], fmt(r["induced_failure_rate"]), fmt(r["induced_share_of_failures"])]
                   for _, r in pooled.iterrows()])
    else:
        doc.paragraph("No generations.")

    from .report_signals import signals_section  # it builds on this module's Document

    signals_section(doc, claims_doc.get("comparison_signals"), fig_dir)

    doc.heading("Claim details")
    for c in claims:
        doc.heading(f"{c['id']} — {c['statement']}", 3)
        doc.paragraph(f"Metric: {c['metric']} Kill: {c['kill']}. Verdict: **{c['verdict']}**"
                      + (f" ({'; '.join(c['reasons'])})" if c.get("reasons") else "") + ".")
        cell = c.get("cell", {})
        names = {"generations": "replay cells" if c.get("source") == "replay" else "generations"}
        doc.paragraph("Cell: " + ", ".join(f"{names.get(k, k)} {v}" for k, v in cell.items() if k != "minimum")
                      + " (pre-registered minimum: "
                      + ", ".join(f"{names.get(k, k)} {v}" for k, v in (cell.get("minimum") or {}).items()) + ").")
        det = c.get("details", {})
        if det.get("within_cell_median") is not None:
            doc.paragraph(f"Spearman within a cell (one example × layer × head × budget × step, across draws): median "
                          f"{fmt(det['within_cell_median'])} over {det.get('step_cells')} cells (interquartile "
                          f"{fmt((det.get('within_cell_q25_q75') or [None])[0])}–"
                          f"{fmt((det.get('within_cell_q25_q75') or [None, None])[1])}); within a head "
                          f"{fmt(det.get('within_head_median'))}. The pre-registered statistic is the pooled one.")
        if det.get("paths"):
            doc.paragraph(f"Anytime coverage = the share of {det['paths']} paths (a draw's setting query and the decode "
                          "steps of one run) whose every step is covered; coverage_anytime_step is the per-step mean.")
        stats = det.get("statistics", {})
        if stats:
            doc.table(["statistic", "estimate [90 % CI]", "resamples", "skipped"],
                      [[n, fmt_ci(s, 4), s["resamples"], s["skipped"]] for n, s in stats.items()])
        breakdown = c.get("details", {}).get("by_model_length") or []
        if breakdown:
            keys = [k for k in breakdown[0] if k not in ("model", "target_tokens")]
            doc.table(["model", "length", *keys],
                      [[b["model"], b["target_tokens"], *[fmt(b.get(k)) if isinstance(b.get(k), float) else b.get(k, "–")
                                                         for k in keys]] for b in breakdown])

    provenance_section(doc, claims_doc, scores, scores_provenance or {}, replay_provenance)

    md = out / "report.md"
    md.write_text(doc.markdown(out))
    page = out / "report.html"
    page.write_text(doc.html(title))
    return {"markdown": md, "html": page, "figures": fig_dir}
