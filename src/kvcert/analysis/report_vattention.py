"""The report's section "vAttention beside the certificate": vAttention's (ε, δ) statement and kvcert's certificate on
the same replay rows (:mod:`kvcert.analysis.vattention_stats`), a comparison beside the claims that decides nothing;
its numbers also go to ``vattention.json`` beside the report."""

from __future__ import annotations

from typing import Mapping

from ..tables import write_json
from .document import Document, fmt, fmt_ci
from .report_data import ReportData
from .vattention_stats import summarize_vattention

COVERAGE_HEADER = ["group", "rows", "prompts", "kvcert plug-in", "kvcert robust", "vAttention (as coded)",
                   "vAttention (two-sided)", "vAttention HT"]
ERROR_HEADER = ["group", "kvcert ‖ô − o‖/‖o‖", "kvcert ε_δ/‖o‖", "kvcert ε_R/‖o‖", "kvcert ε_δ / error",
                "vAttention ‖ô − o‖/‖o‖", "vAttention HT ‖ô − o‖/‖o‖", "vAttention ε (denominator)",
                "vAttention |D̂ − D|/D", "vAttention ε / |D̂ − D|/D"]
TOKENS_HEADER = ["group", "kvcert read = resident", "vAttention read", "vAttention resident", "rows without ε"]


def _label(name: str) -> str:
    return name.replace("budget=", "budget ").replace("/kind=", ", ").replace("kind=", "")


def coverage_rows(summary: Mapping) -> list[list[str]]:
    return [[_label(g), str(b["rows"]), str(b["prompts"]), fmt_ci(b["coverage_plugin"]), fmt_ci(b["coverage_robust"]),
             fmt_ci(b["coverage_vatt"]), fmt_ci(b["coverage_vatt_two_sided"]), fmt_ci(b["coverage_vatt_ht"])]
            for g, b in summary["groups"].items()]


def error_rows(summary: Mapping) -> list[list[str]]:
    return [[_label(g), *(fmt_ci(b[k], 4) for k in ("relative_error_kvcert", "relative_radius_plugin",
                                                    "relative_radius_robust", "tightness_plugin",
                                                    "relative_error_vatt", "relative_error_vatt_ht", "epsilon_vatt",
                                                    "denominator_error_vatt", "tightness_vatt"))]
            for g, b in summary["groups"].items()]


def token_rows(summary: Mapping) -> list[list[str]]:
    return [[_label(g), fmt(b["tokens_read_kvcert"]["estimate"], 1), fmt(b["tokens_read_vatt"]["estimate"], 1),
             fmt(b["tokens_resident_vatt"]["estimate"], 1), str(b["rows_without_epsilon"])]
            for g, b in summary["groups"].items()]


def vattention_section(doc: Document, run: ReportData) -> dict:
    """vAttention beside the certificate: coverage of each statement, errors and radii, tokens per query; the
    summary (also written to ``vattention.json`` in the report's folder) is returned."""
    doc.heading("vAttention beside the certificate")
    summary = (summarize_vattention(run.replay, run.delta, run.plan.bootstrap) if len(run.replay)
               else {"available": False})
    write_json(summary, run.out / "vattention.json")
    if not summary.get("available"):
        doc.paragraph("No vAttention arm in the replay tables (made before it, or without it).")
        return summary
    delta = run.delta
    doc.paragraph(
        f"vAttention (Desai et al. 2025; `kvcert.method.vattention`) on the same prompts, layers, query heads, budgets "
        f"and setting and later queries as the replay, at matched density: for each kvcert draw, vAttention reads per "
        f"query head as many tokens as kvcert keeps for that row — its deterministic part as many as kvcert's certain "
        f"set (the same sinks and window, top-k heavy hitters by the query's own logits) plus the decode keys the "
        f"query sees, and as many uniform draws with replacement over the rest as kvcert kept tail tokens — redrawn "
        f"for every query, one vAttention draw per kvcert draw. The two statements differ in what they bound: "
        f"kvcert's radius bounds the output error ‖ô − o‖; vAttention's (ε, δ) statement bounds only the softmax "
        f"denominator, |D̂ − D| ≤ ε·D, and implies nothing about its output — its output error is stated beside it. "
        f"Coverage at δ = {delta:g}: the nominal is {1 - delta:g}; vAttention's as-coded statement uses the one-sided "
        f"Φ⁻¹(1 − δ) for a two-sided bound (≈ {1 - 2 * delta:g} under the CLT); the two-sided column uses "
        f"Φ⁻¹(1 − δ/2). HT = the Horvitz–Thompson variant (distinct drawn tokens, π = 1 − (1 − 1/n)^b). "
        f"{run.pct} intervals: the prompt-cluster bootstrap of the replay claims ({summary['resamples']} resamples). "
        "A comparison beside the claims: it decides no verdict.")
    doc.table(COVERAGE_HEADER, coverage_rows(summary))
    doc.paragraph("Errors and radii (medians over rows; relative to ‖o‖, the exact output's norm). kvcert ε_δ / error "
                  "is its tightness on the output; vAttention's ε / realised denominator error is its tightness on "
                  "what it bounds (the denominator).")
    doc.table(ERROR_HEADER, error_rows(summary))
    doc.paragraph("Tokens per query (means): kvcert reads its kept tokens and keeps only them resident; vAttention "
                  "reads as many (matched) but keeps the whole cache resident and redraws for every query. Rows "
                  "without ε: fewer than 2 vAttention draws (its σ̂ undefined), left out of its coverage.")
    doc.table(TOKENS_HEADER, token_rows(summary))
    return summary
