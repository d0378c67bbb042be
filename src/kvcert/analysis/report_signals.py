"""The report's comparison-signal section (the signal leaderboard; third amendment).

Reads the ``comparison_signals`` block of claims.json (:mod:`kvcert.analysis.signals`) and
adds to a :class:`kvcert.analysis.document.Document`: the leaderboard table — each signal's
prediction and attribution AUC with its bootstrap interval per method and pooled over methods,
pooled over conditions and lengths, beside the paper's range — and its figure; the same
AUCs per condition × prompt length; and the attribution AUC by turn distance in the
multi-turn cell (table and figure). Secondary analyses: no verdict is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from . import figures
from .document import Document, fmt
from .signals import ALL, TASKS


BY_HEADER = {"target_tokens": "prompt length"}


def auc_text(row: Mapping | None) -> str:
    """'0.637 [0.612, 0.666]', or '–' with the reason when the row has no estimate."""
    if not row:
        return "–"
    if row.get("estimate") is None:
        why = "; ".join(row.get("below_minimum") or []) or "one class only"
        return f"– ({why})"
    lo, hi = row.get("ci") or [None, None]
    return f"{fmt(row['estimate'])} [{fmt(lo)}, {fmt(hi)}]"


def strat_text(row: Mapping | None) -> str:
    """The within-strata AUC of a row that spans several strata, else '–'."""
    st = (row or {}).get("stratified") or {}
    if st.get("estimate") is None:
        return "–"
    lo, hi = st.get("ci") or [None, None]
    return f"{fmt(st['estimate'])} [{fmt(lo)}, {fmt(hi)}]"


def count_text(row: Mapping | None) -> str:
    """'960 (472 / 488)': runs (positives / negatives)."""
    if not row:
        return "–"
    return f"{row['generations']} ({row['positives']} / {row['negatives']})"


def no_turn_distance_auc(rows: list[Mapping]) -> str:
    """One sentence in place of a turn-distance table without an estimate: why, from each method's failures pooled
    over the buckets (its ``all`` row)."""
    pooled: dict[str, Mapping] = {}
    for r in rows:
        if r.get("bucket") == "all":
            pooled.setdefault(r["method"], r)
    why = "; ".join(f"{method}: {r['generations']} failures ({r['positives']} cache-induced / {r['negatives']} "
                    f"inherent{', ' + ', '.join(r['below_minimum']) if r.get('below_minimum') else ''})"
                    for method, r in pooled.items())
    return ("*No attribution AUC by turn distance: no bucket reaches the pre-registered minimum cell, nor do the "
            f"buckets pooled{' — ' + why if why else ''}.*")


def joined(block: Mapping) -> list[dict]:
    """One entry per (signal, method, ``by`` values): its prediction and attribution rows side by side."""
    keys = ["signal", "method", *block.get("by", [])]
    out: dict[tuple, dict] = {}
    for task in TASKS:
        for r in block[task]["rows"]:
            k = tuple(r.get(c) for c in keys)
            out.setdefault(k, {**{c: r.get(c) for c in keys}, **{t: {} for t in TASKS}})[task] = r
    return list(out.values())


def leaderboard(block: Mapping) -> list[dict]:
    """The pooled entries (over conditions and lengths), in the plan's signal order, methods alone then pooled."""
    by = block.get("by", [])
    rows = [e for e in joined(block) if all(e[k] == ALL for k in by)]
    order = {s: i for i, s in enumerate(block["signals"])}
    return sorted(rows, key=lambda e: (order[e["signal"]], "+" in e["method"]))


def _paper(block: Mapping, signal: str, task: str) -> str:
    return (block.get("paper", {}).get(signal) or {}).get(task) or "–"


def _level(block: Mapping) -> str:
    """The bootstrap interval's level as the plan registers it, e.g. "90 %"."""
    return f"{100 * float(block['bootstrap']['level']):g} %"


def signals_section(doc: Document, block: Mapping | None, fig_dir: Path) -> None:
    doc.heading("Comparison signals (signal leaderboard)")
    if not block:
        doc.paragraph("Not computed (no scores, or a pre-registration without `comparison_signals`).")
        return
    pct = _level(block)
    doc.note("**Secondary analyses, not claims** (third amendment of 2026-12-01): no verdict is drawn "
             "from these AUCs and no threshold was registered for them.")
    minimum = block.get("minimum") or {}
    doc.paragraph(
        "ROC AUC of each signal's failure score (the value where higher means failure, else its negative) for "
        f"*prediction* — failure among the compressed runs of {block['prediction']['cells']}'s cells (conditions × "
        "budgets), per method — and *attribution* — cache-induced vs inherent among the failed runs of "
        f"{block['attribution']['cells']}'s cells. Pooled over conditions and prompt lengths; {pct} bootstrap "
        "intervals over examples. A row below the pre-registered minimum cell ("
        + ", ".join(f"{k} {v}" for k, v in minimum.items()) + ") has no estimate. The paper gives one range "
        "for the entropy/margin family and one for the evicted-score-mass heuristic, both for cache-induced "
        "failure: they are shown in the attribution column. *Within strata* is the same AUC over the pairs of runs "
        "that share a stratum (model × task × condition × budget × length × method), as C4 and C6 test the "
        "certificate: a signal that only tells the cells apart scores ½ there.")
    board = leaderboard(block)
    doc.table(["signal", "failure when", "method", f"prediction AUC [{pct} CI]", "within strata",
               "paper (prediction)", f"attribution AUC [{pct} CI]", "within strata", "paper (attribution)",
               "runs (failed / correct)", "failures (induced / inherent)"],
              [[e["signal"], block["signals"][e["signal"]]["failure"], e["method"], auc_text(e["prediction"]),
                strat_text(e["prediction"]), _paper(block, e["signal"], "prediction"), auc_text(e["attribution"]),
                strat_text(e["attribution"]), _paper(block, e["signal"], "attribution"), count_text(e["prediction"]),
                count_text(e["attribution"])]
               for e in board])
    missing = sorted(set(block["prediction"].get("missing", [])) | set(block["attribution"].get("missing", [])))
    if missing:
        doc.paragraph("Cells without runs: " + ", ".join(missing) + ".")
    doc.figure(figures.signal_leaderboard_figure(board, block.get("paper", {}), fig_dir / "signal_leaderboard.png"),
               "signal leaderboard: prediction and attribution AUC per signal and method (diamonds: pooled over "
               f"methods) with {pct} bootstrap intervals, the within-strata AUC as a bar; dotted line chance, shaded "
               "the paper's range")
    by = block.get("by", [])
    order = {s: i for i, s in enumerate(block["signals"])}
    detail = sorted((e for e in joined(block) if not all(e[k] == ALL for k in by)),
                    key=lambda e: (order[e["signal"]], e["method"], *[e[k] for k in by]))
    doc.heading("By condition and prompt length", 3)
    doc.table(["signal", "method", *[BY_HEADER.get(k, k) for k in by], f"prediction AUC [{pct} CI]",
               "runs (failed / correct)",
               f"attribution AUC [{pct} CI]", "failures (induced / inherent)"],
              [[e["signal"], e["method"], *[e[k] for k in by], auc_text(e["prediction"]), count_text(e["prediction"]),
                auc_text(e["attribution"]), count_text(e["attribution"])] for e in detail])
    turn_distance_section(doc, block.get("turn_distance"), fig_dir, pct)


def turn_distance_section(doc: Document, td: Mapping | None, fig_dir: Path, pct: str = "90 %") -> None:
    doc.heading("Attribution by turn distance (multi-turn cell)", 3)
    if not td or not td["rows"]:
        doc.paragraph("No multi-turn runs.")
        return
    budgets = ", ".join(f"{100 * float(b):g} %" for b in td.get("budgets") or [])
    doc.paragraph(f"Task `{td['task']}`, {td.get('condition')} at {budgets}: attribution AUC (cache-induced vs "
                  "inherent among failed runs) per method and per bucket of turns between the question and its fact "
                  "(inclusive ranges; `all` pools the buckets).")
    if all(r.get("estimate") is None for r in td["rows"]):  # a table of "–" says nothing: say why instead
        doc.paragraph(no_turn_distance_auc(td["rows"]))
        return
    doc.table(["signal", "method", "turn distance", f"attribution AUC [{pct} CI]", "failures (induced / inherent)"],
              [[r["signal"], r["method"], figures.bucket_label(r), auc_text(r), count_text(r)] for r in td["rows"]])
    path = figures.turn_distance_figure(td["rows"], fig_dir / "turn_distance_attribution.png")
    if path is None:
        doc.paragraph("*Attribution by turn distance: no bucket reaches the pre-registered minimum cell.*")
    else:
        doc.figure(path, f"attribution AUC by turn distance: certificate and −log-probability per method, with {pct} "
                   "bootstrap intervals (dotted: chance)")
