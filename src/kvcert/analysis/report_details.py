"""The report's claim details: per claim, its verdict's reasons, its cell counts against the pre-registered
minimum, what its statistic's details hold (Spearman within cells, later-query coverage, strata), each placebo's
tests, the statistics beside the tests, the secondary analyses (:func:`secondary_table`, :func:`worst_later_text`),
the tests on a second replay data seed (:func:`data_seed_table`) and the per model × length breakdown
(:func:`breakdown_tables`); an embedded run's C1 says why its plug-in certificate under-covers."""

from __future__ import annotations

from typing import Mapping, Sequence

from .document import Document, fmt, fmt_ci
from .report_claims import MARK, OP_TEXT, UNIT_WORDS
from .report_data import ReportData

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


def details_section(doc: Document, run: ReportData) -> None:
    """Per claim: its verdict's reasons, cell counts, the statistics beside the tests, placebos, breakdowns."""
    doc.heading("Claim details")
    grid = run.grid
    for c in run.claims:
        doc.heading(f"{c.id} — {c.statement}", 3)
        doc.paragraph(f"Metric: {c.metric} Kill: {c.kill}. Verdict: **{c.verdict}**"
                      + (f" ({'; '.join(c.reasons)})" if c.reasons else "") + ".")
        if c.id == "C1" and "embedded" in (grid.get("models") or []):
            doc.paragraph(EMBEDDED_C1)
        cell, det = c.cell, c.details
        names = {"generations": "replay cells" if c.source == "replay" else "generations"}
        strata = det.get("strata")  # a stratified AUC's counts: the strata holding both outcomes
        counted = (f"positives and negatives counted in the {strata['strata_used']} strata that hold both outcomes; "
                   if isinstance(strata, Mapping) else "")
        doc.paragraph("Cell: " + ", ".join(f"{names.get(k, k)} {v}" for k, v in cell.items() if k != "minimum")
                      + f" ({counted}pre-registered minimum: "
                      + ", ".join(f"{names.get(k, k)} {v}" for k, v in (cell.get("minimum") or {}).items()) + ").")
        if det.get("within_cell_median") is not None:
            doc.paragraph(f"Spearman within a cell (one example × layer × head × budget × step, across draws): median "
                          f"{fmt(det['within_cell_median'])} over {det.get('step_cells')} cells (interquartile "
                          f"{fmt((det.get('within_cell_q25_q75') or [None])[0])}–"
                          f"{fmt((det.get('within_cell_q25_q75') or [None, None])[1])}); within a head "
                          f"{fmt(det.get('within_head_median'))}. The registered test is the within-cell median; "
                          "the pooled figure, which mixes cells of very different scale, is reported beside it.")
        kinds = c.cells.get("query_kinds")
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
        for pb in c.placebo.placebos:
            doc.paragraph(f"Placebo *{pb.kind.replace('_', ' ')}* ({pb.description}): **{pb.verdict}** — "
                          + "; ".join(f"`{n}` {fmt_ci(v)} {MARK.get(v['outcome'], '')}"
                                      for n, v in pb.statistic.items()) + ".")
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
        if det.get("worst_later_cell"):
            doc.paragraph(worst_later_text(det["worst_later_cell"], run.pct))
        if c.data_seed_stability is not None:
            data_seed_table(doc, c, run.pct)
        breakdown_tables(doc, det.get("by_model_length") or [])


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



def worst_later_text(block: Mapping, pct: str = "90 %") -> str:
    """A replay claim's worst later-query cell (``analysis_plan.secondary.worst_later_cell``) in one paragraph: the
    budget × layer cell of lowest coverage, its coverage with the interval of the minimum over the cells (taken in
    each resample) and of that cell's own; reported, deciding nothing."""
    name = CERTIFICATE_WORDS.get(block["certificate"], block["certificate"])
    head = (f"Worst later-query cell (registered secondary analysis; reported, deciding nothing): the {name} "
            "certificate's lowest coverage over the budget × layer cells of the later queries")
    if block.get("cell") is None:
        return head + " — no later queries in this claim's cells."
    st = block.get("statistics") or {}
    lowest, fixed = st.get("worst_later_cell_coverage"), st.get("worst_later_cell_coverage_fixed")
    unit = UNIT_WORDS.get(block.get("unit"), block.get("unit"))
    return (head + f" is budget {block['cell'].replace('/', ', ')}: {fmt_ci(lowest, 4) if lowest else '–'} ({pct} "
            f"interval over {unit} of the lowest cell's coverage, the minimum taken in each resample; that cell's own "
            f"{fmt_ci(fixed, 4) if fixed else '–'}); {block.get('cells_below_nominal', 0)} of "
            f"{len(block.get('cells') or {})} cells below the nominal {fmt(block.get('nominal'))}.")


def data_seed_table(doc: Document, c, pct: str = "90 %") -> None:
    """A replay claim's tests on the second data seed's prompts (``data_seed_stability``): what they are, the verdict
    the same rules give there beside the claim's, and one row per test; reported, deciding nothing."""
    d = c.data_seed_stability
    unit = UNIT_WORDS.get(d.tests[0].unit, d.tests[0].unit) if d.tests else "prompts"
    doc.paragraph(f"Data-seed stability (reported, deciding nothing): the same tests on {d.prompts} prompts of the "
                  f"second data seed {d.seed}, disjoint from the deciding seed's, {pct} intervals over {unit}, placebos "
                  f"included: **{d.verdict}** ({'agrees with' if d.agree else 'differs from'} the deciding seed's "
                  f"{c.verdict})" + (f"; {'; '.join(d.reasons)}" if d.reasons else "") + ".")
    doc.table(["test (passes when)", f"data seed {d.seed} [{pct} CI]", "outcome", f"deciding seed [{pct} CI]"],
              [[f"`{t.statistic}` {OP_TEXT.get(t.op, t.op)} {t.threshold:g}", fmt_ci(t, 4),
                f"{MARK.get(t.outcome, '')} {t.outcome}", fmt_ci(mine, 4)]
               for t, mine in zip(d.tests, c.tests)])
