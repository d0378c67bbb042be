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

Every function returns the PNG path, or None when it has no data to draw.
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

COLORS = {"certificate": "#1f77b4", "confidence": "#d62728", "random": "#7f7f7f", "full": "#2ca02c",
          "topk": "#ff7f0e", "poisson": "#9467bd", "gated": "#1f77b4", "aware": "#1f77b4", "streaming": "#d62728"}
DPI = 130


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def accuracy_figure(table: pd.DataFrame, tasks: list[str], path: Path) -> Path | None:
    """``table``: :func:`kvcert.analysis.leaderboard.accuracy_table`."""
    compressed = table[table["condition"] != "full"]
    tasks = [t for t in tasks if t in table.columns]
    if compressed.empty or not tasks:
        return None
    panels = [*tasks, "pooled"]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.6), sharey=True, squeeze=False)
    full = table[table["condition"] == "full"]
    for ax, task in zip(axes[0], panels):
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
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy (% correct)")
    axes[0][-1].legend(fontsize=7)
    return _save(fig, path)


def induced_failure_figure(rates: pd.DataFrame, path: Path, threshold: float | None = None) -> Path | None:
    """``rates``: :func:`kvcert.analysis.labels.induced_failure_rates`."""
    rates = rates.dropna(subset=["induced_failure_rate"])
    if rates.empty:
        return None
    lengths = sorted(rates["target_tokens"].unique())
    fig, axes = plt.subplots(1, len(lengths), figsize=(5.2 * len(lengths), 4.0), sharey=True, squeeze=False)
    for ax, length in zip(axes[0], lengths):
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
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("induced-failure rate (% of full-cache-correct)")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle("Cache-induced failures by budget and condition")
    return _save(fig, path)


def _ci(stat: Mapping) -> tuple[float, float, float]:
    est = stat.get("estimate")
    lo, hi = stat.get("ci", [None, None])
    nan = float("nan")
    return (nan if est is None else est, nan if lo is None else lo, nan if hi is None else hi)


def auc_figure(claims: list[Mapping], path: Path) -> Path | None:
    """Bars: certificate vs confidence AUC, pooled and per length, for C4 and C6 (by statistic name).
    A claim whose AUC cannot be estimated gets its panel all the same, with the reason written in it."""
    panels = []
    for claim in claims:
        stats = claim.get("details", {}).get("statistics", {})
        tests = {t["statistic"] for t in claim.get("tests", [])}
        for prefix, title in (("certificate", "failure prediction"), ("attribution", "attribution: induced vs inherent")):
            if f"auc_{prefix}" in stats or f"auc_{prefix}" in tests:
                panels.append((claim, prefix, f"{claim['id']}: {title}"))
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.0), sharey=True, squeeze=False)
    for ax, (claim, prefix, title) in zip(axes[0], panels):
        stats = claim.get("details", {}).get("statistics", {})
        thr = next((t["threshold"] for t in claim["tests"] if t["statistic"] == f"auc_{prefix}"), None)
        ax.axhline(0.5, color="k", lw=0.8, ls=":", label="chance")
        if thr is not None:
            ax.axhline(thr, color="k", lw=0.8, ls="--", label=f"kill line {thr:g}")
        ax.set_ylim(0.3, 1.0)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        estimate = (stats.get(f"auc_{prefix}") or {}).get("estimate")
        if estimate is None or estimate != estimate:
            cell = claim.get("cell") or {}
            why = "; ".join(claim.get("reasons") or []) or "no estimate"
            ax.text(0.5, 0.62, f"not estimable\n{why}\n(cell: {cell.get('positives', '?')} positives, "
                    f"{cell.get('negatives', '?')} negatives)", ha="center", va="center", fontsize=9,
                    transform=ax.transAxes, wrap=True)
            ax.set_xticks([])
            continue
        groups = [("pooled", stats)]
        groups += [(f"{k} tok", v) for k, v in sorted(claim["details"].get("by_length", {}).items(), key=lambda kv: int(kv[0]))]
        x = np.arange(len(groups))
        for offset, (name, key) in zip((-0.18, 0.18), (("certificate", f"auc_{prefix}"), ("confidence", f"auc_{prefix}_confidence"))):
            vals = [_ci(g.get(key, {})) for _, g in groups]
            est = np.array([v[0] for v in vals], dtype=float)
            err = np.array([[max(0.0, v[0] - v[1]) for v in vals], [max(0.0, v[2] - v[0]) for v in vals]], dtype=float)
            ax.bar(x + offset, est, width=0.34, color=COLORS[name], label=name if name == "certificate" else "−mean log-prob",
                   yerr=np.nan_to_num(err), capsize=3)
        ax.set_xticks(x, [g[0] for g in groups])
        ax.set_xlabel("prompt length")
    axes[0][0].set_ylabel("ROC AUC (90 % bootstrap interval)")
    axes[0][-1].legend(fontsize=8, loc="upper right")
    return _save(fig, path)


KIND_STYLE = {"setting": ("-", "certificate"), "later": ("--", "confidence"), "sample_dependent": (":", "random")}


def coverage_figure(cells: pd.DataFrame, path: Path, delta: float, kill: float | None = None) -> Path | None:
    """``cells``: :func:`kvcert.analysis.replay_stats.replay_cells`. Per-step coverage per cell by kind (plug-in, robust),
    and the anytime coverage of whole paths (simultaneous) of both."""
    if cells.empty:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(15.0, 3.9), sharey=True)
    cols = ["coverage", "coverage_robust", "coverage_anytime", "coverage_anytime_robust"]
    low = min(0.5, float(cells[cols].min().min()) - 0.02, (kill or 1.0) - 0.05)
    bins = np.linspace(max(0.0, low), 1.0, 41)
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
                         label=f"{label} ({len(d)} path cells, pooled {d[col].mean():.3f})")
    axes[2].set_title("anytime radius: every step of a path covered")
    for ax in axes:
        ax.axvline(1 - delta, color="k", lw=0.9, ls="--", label=f"nominal {1 - delta:g}")
        if kill is not None:
            ax.axvline(kill, color="k", lw=0.9, ls=":", label=f"C1 kill line {kill:g}")
        ax.set_xlabel("coverage per replay cell")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("replay cells (count)")
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
    fig, axes = plt.subplots(1, len(ratios), figsize=(5.5 * len(ratios), 3.8), sharey=True, squeeze=False)
    kinds = replay["query_kind"].to_numpy()
    titles = {"radius": "plug-in ε_δ", "radius_robust": "robust ε_R"}
    for ax, col in zip(axes[0], ratios):
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
        ax.legend(fontsize=7, loc="lower right")
    axes[0][0].set_ylabel("share of draws with ratio ≤ x")
    return _save(fig, path)


def recompute_figure(claim: Mapping | None, path: Path) -> Path | None:
    """Gain vs recompute rate per gate from C7's statistics ``gain_<gate>@<rate>``."""
    if not claim:
        return None
    stats = claim.get("details", {}).get("statistics", {})
    rates = claim.get("details", {}).get("rates") or []
    if not rates or f"gain_certificate@{rates[0]:g}" not in stats:
        return None
    fig, ax = plt.subplots(figsize=(6.2, 4.0))
    r = 100 * np.array(rates)
    for gate in ("certificate", "confidence", "random"):
        vals = [_ci(stats[f"gain_{gate}@{x:g}"]) for x in rates]
        est = 100 * np.array([v[0] for v in vals])
        lo = 100 * np.array([v[1] for v in vals])
        hi = 100 * np.array([v[2] for v in vals])
        label = {"certificate": "certificate gate", "confidence": "confidence gate (−mean log-prob)",
                 "random": "random gate (expected)"}[gate]
        ax.plot(r, est, marker="o", color=COLORS[gate], label=label)
        ax.fill_between(r, lo, hi, color=COLORS[gate], alpha=0.15)
    rate = claim["details"].get("rate")
    if rate is not None:
        ax.axvline(100 * rate, color="k", lw=0.8, ls=":", label=f"pre-registered rate {100 * rate:g} %")
    ax.set_xlabel("recompute rate (% of runs regenerated with the full cache)")
    ax.set_ylabel("accuracy gain (percentage points)")
    ax.set_title(f"{claim['id']}: recomputation gain at matched rates")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def multiturn_figure(table: pd.DataFrame, path: Path, budget: str = "") -> Path | None:
    """Recall by turn-distance bin for full, top-k, Poisson and certificate-gated."""
    bins = table[table["bin"] != "overall"].dropna(subset=["full"]) if not table.empty else table
    if bins.empty:
        return None
    fig, ax = plt.subplots(figsize=(6.6, 4.0))
    x = np.arange(len(bins))
    for col, label, style in (("full", "full cache", dict(ls="-", lw=4, alpha=0.45, marker="s", ms=9)),
                              ("topk", "top-k", dict(ls="--", marker="v")),
                              ("poisson", "Poisson, ungated", dict(ls=":", marker="^")),
                              ("gated", "certificate-gated", dict(ls="-", marker="o"))):
        ax.plot(x, 100 * bins[col].to_numpy(float), color=COLORS[col], label=label, **style)
    ax.set_xticks(x, bins["bin"])
    ax.set_ylim(-3, 103)
    ax.set_xlabel("turn distance (turns between the fact and the question)")
    ax.set_ylabel("recall (% of questions answered)")
    ax.set_title(f"Multi-turn recall (streaming{', budget ' + budget if budget else ''})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


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
    one line per signal, a dot per method (pooled over methods in black), prediction and attribution side by
    side, the chance line at 0.5 and the paper's range as a shaded band."""
    signals = list(dict.fromkeys(r["signal"] for r in rows))
    if not signals or all(r[t].get("estimate") is None for r in rows for t, _ in SIGNAL_TASKS):
        return None
    methods = list(dict.fromkeys(r["method"] for r in rows))
    offsets = dict(zip(methods, np.linspace(-0.22, 0.22, len(methods)) if len(methods) > 1 else [0.0]))
    fig, axes = plt.subplots(1, 2, figsize=(12.0, 0.55 * len(signals) + 1.8), sharey=True)
    y_of = {s: len(signals) - 1 - i for i, s in enumerate(signals)}
    lows = [r[t]["ci"][0] for r in rows for t, _ in SIGNAL_TASKS if (r[t].get("ci") or [None])[0] is not None]
    left = min([0.3, *[lo - 0.02 for lo in lows]])
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
        for r in rows:
            if r[task].get("estimate") is None:
                ax.text(left + 0.01, y_of[r["signal"]] + offsets[r["method"]], f"{r['method']}: n/a", fontsize=6,
                        va="center", color="#777777")
        ax.axvline(0.5, color="k", lw=0.9, ls=":", label="chance (0.5)")
        ax.set_xlim(left, 1.0)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("ROC AUC (90 % bootstrap interval)")
        ax.grid(alpha=0.3, axis="x")
    axes[0].set_yticks(list(y_of.values()), list(y_of))
    axes[0].set_ylim(-0.6, len(signals) - 0.4)
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return _save(fig, path)


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
    fig, ax = plt.subplots(figsize=(6.8, 4.0))
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
    ax.set_ylabel("attribution AUC (90 % bootstrap interval)")
    ax.set_title("Attribution by turn distance (multi-turn cell)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
