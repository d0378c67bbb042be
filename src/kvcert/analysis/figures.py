"""The report's figures, one function per figure, each saved as a PNG (matplotlib, Agg).

* :func:`accuracy_figure` — accuracy by budget × method × condition, one panel per task,
  the full cache as a line (the plain results everyone looks for first);
* :func:`induced_failure_figure` — induced-failure rate by budget × condition (the
  paper's Fig. 1), one panel per prompt length, with C3's kill line;
* :func:`auc_figure` — prediction (C4) vs attribution (C6) AUC of the certificate and
  of output confidence, with bootstrap intervals (the paper's Fig. 3);
* :func:`coverage_figure` — per-replay-cell coverage by query kind of the plug-in and the
  robust certificate, and the anytime radius's coverage of whole paths (C1, C8);
* :func:`tightness_figure` — the distribution (ECDF) of certificate / realised error per
  replay draw by query kind, plug-in and robust, with the share of misses (C2, C8);
* :func:`recompute_figure` — recomputation gain vs recompute rate for certificate,
  confidence and random gating (C7);
* :func:`multiturn_figure` — multi-turn recall by turn distance;
* :func:`signal_leaderboard_figure` — prediction and attribution AUC of every comparison
  signal per method, against chance and the paper's ranges (third amendment);
* :func:`turn_distance_figure` — attribution AUC of the certificate and log-probability
  per turn-distance bucket and method.

Every function returns the PNG path, or None when it has no data to draw. Every figure is
:data:`WIDTH` inches wide (panels wrap into rows), so that all of them show at one scale in
the report (its figures are at most 880 px wide) with text of at least 9 pt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ..atomic import atomic_path  # noqa: E402
from .claims_document import ClaimResult  # noqa: E402

COLORS = {"certificate": "#1f77b4", "confidence": "#d62728", "random": "#7f7f7f", "full": "#2ca02c",
          "topk": "#ff7f0e", "poisson": "#9467bd", "gated": "#1f77b4", "aware": "#1f77b4", "streaming": "#d62728"}
DPI = 130
#: the width of every figure (inches): at :data:`DPI` about 1,040 px, shown at ≤ 880 px in the report
WIDTH = 8.0
plt.rcParams.update({"font.size": 10, "legend.fontsize": 9, "axes.titlesize": 10.5, "axes.labelsize": 10})


def _grid(n: int, panel_height: float, columns: int = 2, **kw):
    """A figure of ``n`` panels in rows of at most ``columns``, :data:`WIDTH` wide; unused axes hidden."""
    cols = min(columns, n)
    rows = int(np.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(WIDTH, panel_height * rows), squeeze=False, **kw)
    flat = list(axes.ravel())
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _legend_below(fig, axes, ncol: int = 3) -> None:
    """One legend for the figure, under its panels (the union of the panels' labelled artists)."""
    seen = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, h)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="lower center", ncol=ncol, frameon=False,
                   bbox_to_anchor=(0.5, 0.0))
        # the legend's own height (rows of entries at ~0.25 in, plus a margin), not a share of a tall figure
        inches = 0.15 + 0.25 * int(np.ceil(len(seen) / ncol))
        fig.tight_layout(rect=(0, inches / fig.get_size_inches()[1], 1, 1))


def _save(fig, path: Path, layout: bool = True) -> Path:
    if layout:
        fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=DPI)
    plt.close(fig)
    return path


def _finish(fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> Path:
    """A one-panel figure's labels, title, grid and legend, then saved."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def accuracy_figure(table: pd.DataFrame, tasks: list[str], path: Path) -> Path | None:
    """``table``: :func:`kvcert.analysis.leaderboard.accuracy_table`; one panel per task and one pooled, two a row."""
    compressed = table[table["condition"] != "full"]
    tasks = [t for t in tasks if t in table.columns]
    if compressed.empty or not tasks:
        return None
    panels = [*tasks, "pooled"]
    fig, axes = _grid(len(panels), 3.0, sharey=True)
    full = table[table["condition"] == "full"]
    for ax, task in zip(axes, panels):
        for (cond, method), d in compressed.groupby(["condition", "method"]):
            d = d.sort_values("budget")
            poisson = "topk" not in method
            ax.plot(100 * d["budget"], 100 * d[task], marker="o" if poisson else "s", ls="-" if poisson else "--",
                    color=COLORS.get(cond), label=f"{cond}, {method}")
        if len(full) and task in full:
            ax.axhline(100 * float(full[task].iloc[0]), color=COLORS["full"], lw=2, alpha=0.6, label="full cache")
        ax.set_xscale("log", base=2)
        budgets = sorted(compressed["budget"].unique())
        ax.set_xticks([100 * b for b in budgets], [f"{100 * b:g}" for b in budgets])
        ax.set_ylim(-3, 103)
        ax.set_title(task)
        ax.set_xlabel("KV budget (% kept)")
        ax.set_ylabel("accuracy (% correct)")
        ax.grid(alpha=0.3)
    _legend_below(fig, axes)
    return _save(fig, path, layout=False)


def induced_failure_figure(rates: pd.DataFrame, path: Path, threshold: float | None = None) -> Path | None:
    """``rates``: :func:`kvcert.analysis.labels.induced_failure_rates`."""
    rates = rates.dropna(subset=["induced_failure_rate"])
    if rates.empty:
        return None
    lengths = sorted(rates["target_tokens"].unique())
    fig, axes = _grid(len(lengths), 3.4, sharey=True)
    for ax, length in zip(axes, lengths):
        part = rates[rates["target_tokens"] == length]
        for (cond, sampler), d in part.groupby(["condition", "sampler"]):
            d = d.sort_values("budget")
            ax.plot(100 * d["budget"], 100 * d["induced_failure_rate"], marker="o" if sampler == "poisson" else "s",
                    ls="-" if sampler == "poisson" else "--", color=COLORS.get(cond, None), label=f"{cond}, {sampler}")
        if threshold is not None:
            ax.axhline(100 * threshold, color="k", lw=0.8, ls=":", label=f"C3 kill line ({100 * threshold:g} %)")
        ax.set_xscale("log", base=2)
        budgets = sorted(part["budget"].unique())
        ax.set_xticks([100 * b for b in budgets], [f"{100 * b:g}" for b in budgets])
        ax.set_xlabel("KV budget (% of prompt tokens kept)")
        ax.set_title(f"prompt length {length} tokens" if length > 0 else "all lengths")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("induced-failure rate\n(% of full-cache-correct)")
    _legend_below(fig, axes)
    return _save(fig, path, layout=False)


def _ci(stat: Mapping) -> tuple[float, float, float]:
    est = stat.get("estimate")
    lo, hi = stat.get("ci", [None, None])
    nan = float("nan")
    return (nan if est is None else est, nan if lo is None else lo, nan if hi is None else hi)


def auc_figure(claims: list[ClaimResult], path: Path) -> Path | None:
    """Bars from 0: certificate vs confidence AUC for C4 and C6 — within strata (the registered test) and pooled
    (the paper's Fig. 3), then within strata per prompt length. A claim whose AUC cannot be estimated gets its
    panel all the same, with the reason written in it."""
    panels = []
    for claim in claims:
        stats = claim.details.get("statistics", {})
        tests = {t.statistic for t in claim.tests}
        for prefix, title in (("certificate", "failure prediction"), ("attribution", "attribution: induced vs inherent")):
            if any(k in stats or k in tests for k in (f"auc_{prefix}", f"auc_{prefix}_stratified")):
                panels.append((claim, prefix, f"{claim.id}: {title}"))
    if not panels:
        return None
    fig, axes = _grid(len(panels), 3.6, sharey=True)
    for ax, (claim, prefix, title) in zip(axes, panels):
        stats = claim.details.get("statistics", {})
        strat = f"auc_{prefix}_stratified"
        thr = next((t.threshold for t in claim.tests if t.statistic in (strat, f"auc_{prefix}")), None)
        ax.axhline(0.5, color="k", lw=0.8, ls=":", label="chance (0.5)")
        if thr is not None:
            ax.axhline(thr, color="#b42318", lw=1.0, ls="--", label=f"{claim.id} kill line ({thr:g})")
        ax.set_ylim(0.0, 1.22)  # bars from 0; the band above 1 holds the legend
        ax.set_yticks(np.linspace(0, 1, 6))
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
        estimate = (stats.get(strat) or stats.get(f"auc_{prefix}") or {}).get("estimate")
        if estimate is None or estimate != estimate:
            cell = claim.cell
            why = "; ".join(claim.reasons) or "no estimate"
            ax.text(0.5, 0.62, f"not estimable\n{why}\n(cell: {cell.get('positives', '?')} positives, "
                    f"{cell.get('negatives', '?')} negatives)", ha="center", va="center", fontsize=9,
                    transform=ax.transAxes, wrap=True)
            ax.set_xticks([])
            ax.legend(loc="upper left", ncol=2, fontsize=8)
            continue
        groups = [("within\nstrata", stats, strat), ("pooled\n(paper)", stats, f"auc_{prefix}")]
        groups += [(f"{k} tok\n(strata)", v, strat)
                   for k, v in sorted(claim.details.get("by_length", {}).items(), key=lambda kv: int(kv[0]))]
        x = np.arange(len(groups))
        for offset, name in zip((-0.18, 0.18), ("certificate", "confidence")):
            vals = [_ci(g.get(key if name == "certificate" else f"{key}_confidence", {})) for _, g, key in groups]
            est = np.array([v[0] for v in vals], dtype=float)
            err = np.array([[max(0.0, v[0] - v[1]) for v in vals], [max(0.0, v[2] - v[0]) for v in vals]], dtype=float)
            ax.bar(x + offset, est, width=0.34, color=COLORS[name],
                   label="certificate" if name == "certificate" else "−mean log-prob", yerr=np.nan_to_num(err),
                   capsize=3)
        ax.set_xticks(x, [g[0] for g in groups], fontsize=8.5)
        ax.set_ylabel("ROC AUC (bootstrap interval)")
        ax.legend(loc="upper left", ncol=2, fontsize=8)
    return _save(fig, path)


KIND_STYLE = {"setting": ("-", "certificate"), "later": ("--", "confidence"), "sample_dependent": (":", "random")}


def coverage_figure(cells: pd.DataFrame, path: Path, delta: float, kill: float | None = None) -> Path | None:
    """``cells``: :func:`kvcert.analysis.replay_stats.replay_cells`. Per-step coverage per cell by kind (plug-in, robust),
    and the anytime coverage of whole paths (simultaneous) of both; the x axis starts near the lowest cells (the
    2nd percentile), cells below it counted in its first bin and said in the title."""
    if cells.empty:
        return None
    # two per-step panels side by side, the anytime panel under them across the width (no empty quadrant)
    fig = plt.figure(figsize=(WIDTH, 3.1 * 2))
    grid = fig.add_gridspec(2, 2)
    top = fig.add_subplot(grid[0, 0])
    axes = [top, fig.add_subplot(grid[0, 1], sharey=top), fig.add_subplot(grid[1, :])]
    cols = ["coverage", "coverage_robust", "coverage_anytime", "coverage_anytime_robust"]
    values = pd.concat([cells[c] for c in cols]).dropna()
    low = max(0.0, min(1 - delta - 0.1, (kill or 1.0) - 0.05, float(values.quantile(0.02)) - 0.02))
    bins = np.linspace(low, 1.0, 41)
    below = int((values < low).sum())
    for ax, col, title in ((axes[0], "coverage", "plug-in ε_δ, per step"), (axes[1], "coverage_robust", "robust ε_R, per step")):
        for kind, d in cells.groupby("query_kind"):
            ls, color = KIND_STYLE.get(kind, ("-", "full"))
            ax.hist(d[col].clip(lower=bins[0]), bins=bins, histtype="step", lw=1.8, ls=ls, color=COLORS[color],
                    label=f"{kind} ({len(d)} cells, pooled {np.average(d[col], weights=d['n']):.3f})")
        ax.set_title(title)
    for col, ls, label in (("coverage_anytime", "-", "plug-in"), ("coverage_anytime_robust", "--", "robust")):
        d = cells.dropna(subset=[col])
        if len(d):
            axes[2].hist(d[col].clip(lower=bins[0]), bins=bins, histtype="step", lw=1.8, ls=ls,
                         color=COLORS["certificate" if label == "plug-in" else "confidence"],
                         label=f"anytime {label} ({len(d)} path cells, pooled {d[col].mean():.3f})")
    axes[2].set_title("anytime radius: every step of a path covered")
    for ax in axes:
        ax.axvline(1 - delta, color="k", lw=0.9, ls="--", label=f"nominal {1 - delta:g}")
        if kill is not None:
            ax.axvline(kill, color="k", lw=0.9, ls=":", label=f"C1 kill line {kill:g}")
        ax.set_xlabel("coverage per replay cell" + (f" (≤ {low:.2f}: first bin)" if below else ""))
        ax.set_ylabel("replay cells (count)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7.5, loc="upper left")
    return _save(fig, path)


def tightness_figure(replay: pd.DataFrame, path: Path) -> Path | None:
    """ECDF of ε / ‖ô − o‖ per draw (log x) by query kind, plug-in and robust: the curve's
    height at 1 is the share of draws the certificate misses (1 − coverage)."""
    if replay.empty:
        return None
    err = replay["error"].to_numpy(float)
    ratios = {}
    for col in ("radius", "radius_robust"):
        if col not in replay:
            continue
        r = np.where(err > 0, replay[col].to_numpy(float) / np.where(err > 0, err, 1.0), np.nan)
        ratios[col] = np.where(np.isfinite(r) & (r > 0), r, np.nan)
    every = np.concatenate([r[np.isfinite(r)] for r in ratios.values()]) if ratios else np.array([])
    if not every.size:
        return None
    lo, hi = np.quantile(every, [0.001, 0.999])
    fig, axes = _grid(len(ratios), 3.6, sharey=True)
    kinds = replay["query_kind"].to_numpy()
    titles = {"radius": "plug-in ε_δ", "radius_robust": "robust ε_R"}
    for ax, col in zip(axes, ratios):
        for kind in KIND_STYLE:
            m = np.isfinite(ratios[col]) & (kinds == kind)
            if m.any():
                ls, color = KIND_STYLE[kind]
                values = np.sort(ratios[col][m])
                ax.plot(values, np.arange(1, values.size + 1) / values.size, lw=1.8, ls=ls, color=COLORS[color],
                        label=f"{kind}: misses {np.mean(values < 1.0):.1%}, median {np.median(values):.2f}")
        ax.axvline(1.0, color="k", lw=0.9, ls="--", label="radius = error (left of it: a miss)")
        ax.set_xscale("log")
        ax.set_xlim(max(lo, 1e-3), max(hi, lo * 1.01))
        ax.set_ylim(0, 1)
        ax.set_xlabel("certificate / realised error (log scale)")
        ax.set_title(titles[col])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7.5, loc="lower right")
    axes[0].set_ylabel("share of draws with ratio ≤ x")
    return _save(fig, path)


def recompute_figure(claim: ClaimResult | None, path: Path) -> Path | None:
    """Gain vs recompute rate per gate from C7's statistics ``gain_<gate>@<rate>``."""
    if not claim:
        return None
    stats = claim.details.get("statistics", {})
    rates = claim.details.get("rates") or []
    if not rates or f"gain_certificate@{rates[0]:g}" not in stats:
        return None
    fig, ax = plt.subplots(figsize=(WIDTH, 4.2))
    r = 100 * np.array(rates)
    sfx = "_stratified" if f"gain_certificate_stratified@{rates[0]:g}" in stats else ""
    for gate in ("certificate", "confidence", "random"):
        vals = [_ci(stats[f"gain_{gate}{'' if gate == 'random' else sfx}@{x:g}"]) for x in rates]
        est = 100 * np.array([v[0] for v in vals])
        lo = 100 * np.array([v[1] for v in vals])
        hi = 100 * np.array([v[2] for v in vals])
        label = {"certificate": "certificate gate", "confidence": "confidence gate (−mean log-prob)",
                 "random": "random gate (expected)"}[gate]
        ax.plot(r, est, marker="o", color=COLORS[gate], label=label)
        ax.fill_between(r, lo, hi, color=COLORS[gate], alpha=0.15)
    rate = claim.details.get("rate")
    if rate is not None:
        ax.axvline(100 * rate, color="k", lw=0.8, ls=":", label=f"pre-registered rate {100 * rate:g} %")
    return _finish(fig, ax, path, "recompute rate (% of runs regenerated with the full cache)",
                   "accuracy gain (percentage points)", f"{claim.id}: recomputation gain at matched rates")


def multiturn_figure(table: pd.DataFrame, path: Path, budget: str = "") -> Path | None:
    """Recall by turn-distance bin for full, top-k, Poisson and certificate-gated, and (where the table has them)
    random and confidence gating at the certificate gate's rate."""
    bins = table[table["bin"] != "overall"].dropna(subset=["full"]) if not table.empty else table
    if bins.empty:
        return None
    fig, ax = plt.subplots(figsize=(WIDTH, 4.2))
    x = np.arange(len(bins))
    share = float(np.average(bins["recomputed"], weights=bins["n"])) if bins["n"].sum() else float("nan")
    gated = f"certificate-gated (recomputed {100 * share:.0f} % of runs)"
    if share >= 0.999:
        gated += " = full cache"
    lines = [("full", "full cache", dict(ls="-", lw=4, alpha=0.45, marker="s", ms=9)),
             ("topk", "top-k", dict(ls="--", marker="v")),
             ("poisson", "Poisson, ungated", dict(ls=":", marker="^")),
             ("gated", gated, dict(ls="-", marker="o"))]
    if "random" in bins:  # the baselines at the gate's own rate
        lines += [("random", "random gating, same rate", dict(ls="-.", lw=1.2, marker=".")),
                  ("confidence", "confidence gating, same rate", dict(ls="--", lw=1.2, marker="x"))]
    for col, label, style in lines:
        ax.plot(x, 100 * bins[col].to_numpy(float), color=COLORS[col], label=label, **style)
    ax.set_xticks(x, bins["bin"])
    ax.set_ylim(-3, 103)
    return _finish(fig, ax, path, "turn distance (turns between the fact and the question)",
                   "recall (% of questions answered)",
                   f"Multi-turn recall (streaming{', budget ' + budget if budget else ''})")


SIGNAL_TASKS = (("prediction", "failure prediction (C4's cells)"),
                ("attribution", "attribution: induced vs inherent (C6's cells)"))


def _band(text: str | None) -> tuple[float, float] | None:
    """'0.43–0.51' → (0.43, 0.51)."""
    if not text:
        return None
    lo, hi = text.replace("-", "–").split("–")
    return float(lo), float(hi)


def _method_colour(method: str) -> str:
    return COLORS.get(method, "#333333")


def signal_leaderboard_figure(rows: list[Mapping], paper: Mapping, path: Path) -> Path | None:
    """Dot-and-interval plot of the comparison signals (rows of :func:`kvcert.analysis.report_signals.leaderboard`):
    one line per signal, a dot per method (pooled over methods in black) with the within-strata AUC as a bar,
    prediction above attribution, the axis from 0, the chance line at 0.5 and the paper's range shaded."""
    signals = list(dict.fromkeys(r["signal"] for r in rows))
    if not signals or all(r[t].get("estimate") is None for r in rows for t, _ in SIGNAL_TASKS):
        return None
    methods = list(dict.fromkeys(r["method"] for r in rows))
    offsets = dict(zip(methods, np.linspace(-0.22, 0.22, len(methods)) if len(methods) > 1 else [0.0]))
    fig, axes = plt.subplots(2, 1, figsize=(WIDTH, 2 * (0.42 * len(signals) + 1.2) + 0.8), sharex=True)
    y_of = {s: len(signals) - 1 - i for i, s in enumerate(signals)}
    for ax, (task, title) in zip(axes, SIGNAL_TASKS):
        label = "paper's range"
        for s in signals:
            band = _band((paper.get(s) or {}).get(task))
            if band:
                ax.fill_betweenx([y_of[s] - 0.4, y_of[s] + 0.4], *band, color="#f0b400", alpha=0.3, lw=0, label=label)
                label = None
        for m in methods:
            mine = [r for r in rows if r["method"] == m and r[task].get("estimate") is not None]
            if not mine:
                continue
            est = np.array([r[task]["estimate"] for r in mine], dtype=float)
            lo = np.array([r[task]["ci"][0] if r[task]["ci"][0] is not None else np.nan for r in mine], dtype=float)
            hi = np.array([r[task]["ci"][1] if r[task]["ci"][1] is not None else np.nan for r in mine], dtype=float)
            y = np.array([y_of[r["signal"]] + offsets[m] for r in mine])
            pooled = "+" in m
            ax.errorbar(est, y, xerr=np.nan_to_num([est - lo, hi - est]), fmt="D" if pooled else "o", capsize=3,
                        color="k" if pooled else _method_colour(m), label=m.replace("+", " + ") + (" (pooled)" if pooled else ""))
            strat = np.array([(r[task].get("stratified") or {}).get("estimate") or np.nan for r in mine], dtype=float)
            if np.isfinite(strat).any():
                ax.scatter(strat, y, marker="|", s=160, lw=2.2, color="k" if pooled else _method_colour(m),
                           label="within strata (bar)")
        for r in rows:
            if r[task].get("estimate") is None:
                ax.text(0.01, y_of[r["signal"]] + offsets[r["method"]], f"{r['method']}: n/a", fontsize=6,
                        va="center", color="#777777")
        ax.axvline(0.5, color="k", lw=0.9, ls=":", label="chance (0.5)")
        ax.set_xlim(0.0, 1.0)
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="x")
        ax.set_yticks(list(y_of.values()), list(y_of))
        ax.set_ylim(-0.6, len(signals) - 0.4)
    axes[1].set_xlabel("ROC AUC (bootstrap interval)")
    _legend_below(fig, list(axes), ncol=3)
    return _save(fig, path, layout=False)


def bucket_label(row: Mapping) -> str:
    """A turn-distance bucket as read: '1–5', '≥ 16' for an open-ended one, 'all'."""
    if row["bucket"] == "all":
        return "all"
    return f"≥ {row['low']}" if int(row["high"]) >= 1000 else f"{row['low']}–{row['high']}"


def turn_distance_figure(rows: list[Mapping], path: Path) -> Path | None:
    """Attribution AUC per turn-distance bucket (``turn_distance`` rows of the comparison signals), one line per
    signal × method with its interval; None when no bucket has an estimate."""
    rows = [r for r in rows if r["bucket"] != "all"]
    if not any(r.get("estimate") is not None for r in rows):
        return None
    buckets = list(dict.fromkeys(r["bucket"] for r in rows))
    labels = {r["bucket"]: bucket_label(r) for r in rows}
    fig, ax = plt.subplots(figsize=(WIDTH, 4.2))
    series = list(dict.fromkeys((r["signal"], r["method"]) for r in rows))
    width = 0.3 / max(1, len(series) - 1) if len(series) > 1 else 0.0
    for i, (signal, method) in enumerate(series):
        mine = {r["bucket"]: r for r in rows if (r["signal"], r["method"]) == (signal, method)}
        x = np.arange(len(buckets)) + (i - (len(series) - 1) / 2) * width
        est = np.array([_ci(mine.get(b, {}))[0] for b in buckets], dtype=float)
        lo = np.array([_ci(mine.get(b, {}))[1] for b in buckets], dtype=float)
        hi = np.array([_ci(mine.get(b, {}))[2] for b in buckets], dtype=float)
        colour = COLORS["certificate" if signal == "certificate" else "confidence"]
        ax.errorbar(x, est, yerr=np.nan_to_num([est - lo, hi - est]), marker="o" if method == "poisson" else "s",
                    ls="-" if method == "poisson" else "--", color=colour, alpha=1.0 if method == "poisson" else 0.6,
                    capsize=3, label=f"{signal}, {method}")
    ax.axhline(0.5, color="k", lw=0.9, ls=":", label="chance (0.5)")
    ax.set_xticks(np.arange(len(buckets)), [labels[b] for b in buckets])
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("turn distance (turns between the question and its fact)")
    ax.set_ylabel("attribution AUC (bootstrap interval)")
    ax.set_title("Attribution by turn distance (multi-turn cell)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
