"""The replay table's statistics (claims C1, C2, C8): no torch, no model.

:mod:`kvcert.generation.replay` runs the model side — prefills, draws, the Hájek attention
with both certificates — and writes one row per (example, layer, query head, budget,
query kind, step, draw) in the columns of :mod:`kvcert.generation.replay_table` (the
layout, torch-free). This module holds what the claims and the report compute from it:
replay cells (the unit of the claims' bootstrap), paths and their simultaneous (anytime)
coverage, tightness, and the pooled, within-head and within-cell Spearman correlations
(see :mod:`kvcert.generation.replay` for the procedure).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

# the layout (torch-free), also importable from here
from ..generation.replay_table import (  # noqa: F401
    COVERED_COLUMNS, FLOAT_COLUMNS, QUERY_KINDS, REPLAY_COLUMNS, empty_replay,
)
from .stats import spearman

CELL_KEY = ["model", "example_id", "layer", "head", "budget", "query_kind"]
#: a draw's path: the kinds whose steps one decoding run visits (the setting query starts both)
PATHS = {"later": ("setting", "later"), "sample_dependent": ("setting", "sample_dependent")}
#: the two certificates of the replay: name → (radius, anytime radius, covered, covered anytime) columns
VARIANTS = {
    "plugin": ("radius", "anytime_radius", "covered", "covered_anytime"),
    "robust": ("radius_robust", "anytime_radius_robust", "covered_robust", "covered_anytime_robust"),
}

PATH_KEY = ["model", "example_id", "layer", "head", "budget", "draw"]
#: a cell of the within-cell Spearman: one (example, layer, head, budget, kind, step), across draws
STEP_CELL_KEY = [*CELL_KEY, "step"]


def simultaneous_anytime(draws: pd.DataFrame, covered: str = "covered_anytime") -> pd.DataFrame:
    """One row per path (:data:`PATH_KEY` × path kind): ``covered`` — every step of the path covered.

    A path is the setting query followed by the decode steps of one decoding run
    (:data:`PATHS`); the anytime radius claims all of them at once, so this — not the
    per-step mean — is its coverage.
    """
    if draws.empty:
        return pd.DataFrame(columns=[*PATH_KEY, "path", "steps", "covered"])
    out = []
    for path, kinds in PATHS.items():
        d = draws[draws["query_kind"].isin(kinds)]
        if not (d["query_kind"] == path).any():
            continue
        g = d.groupby(PATH_KEY, observed=True, sort=True)[covered].agg(["all", "size"]).reset_index()
        out.append(g.rename(columns={"all": "covered", "size": "steps"}).assign(path=path))
    if not out:
        return pd.DataFrame(columns=[*PATH_KEY, "path", "steps", "covered"])
    return pd.concat(out, ignore_index=True)[[*PATH_KEY, "path", "steps", "covered"]]


def replay_cells(draws: pd.DataFrame) -> pd.DataFrame:
    """Per replay cell: observations, per-step coverage, the anytime coverage (simultaneous over the paths of a decode
    kind's cell — NaN for the setting cell, whose query starts every path — and the per-step mean of the anytime
    radius) and the median tightness, of both certificates (``*_robust``)."""
    cols = [*CELL_KEY, "n"]
    for v in VARIANTS:
        sfx = "" if v == "plugin" else "_robust"
        cols += [f"coverage{sfx}", f"coverage_anytime{sfx}", f"coverage_anytime_step{sfx}", f"tightness{sfx}"]
    if draws.empty:
        return pd.DataFrame(columns=cols)
    d = draws.assign(log_ratio=log_tightness(draws), log_ratio_robust=log_tightness(draws, "radius_robust"))
    g = d.groupby(CELL_KEY, sort=True, observed=True)
    out = g.agg(n=("covered", "size"), coverage=("covered", "mean"), coverage_anytime_step=("covered_anytime", "mean"),
                tightness=("log_ratio", "median"), coverage_robust=("covered_robust", "mean"),
                coverage_anytime_step_robust=("covered_anytime_robust", "mean"),
                tightness_robust=("log_ratio_robust", "median")).reset_index()
    out["tightness"] = 10.0 ** out["tightness"]
    out["tightness_robust"] = 10.0 ** out["tightness_robust"]
    for v, (_, _, _, cov_any) in VARIANTS.items():
        sfx = "" if v == "plugin" else "_robust"
        paths = simultaneous_anytime(draws, cov_any)
        per = (paths.groupby([*PATH_KEY[:-1], "path"], observed=True)["covered"].mean().rename(f"coverage_anytime{sfx}")
               .reset_index().rename(columns={"path": "query_kind"}))
        out = out.merge(per, on=CELL_KEY, how="left") if len(per) else out.assign(**{f"coverage_anytime{sfx}": np.nan})
    return out[cols]


def log_tightness(draws: pd.DataFrame, radius: str = "radius") -> np.ndarray:
    """log10(radius / error); NaN where the error is 0 (nothing to be tight about)."""
    err = draws["error"].to_numpy(dtype=np.float64)
    rad = draws[radius].to_numpy(dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(err > 0, np.log10(rad / err), np.nan)


HEAD_KEY = ["model", "example_id", "layer", "head"]


def within_head_spearman(draws: pd.DataFrame, x: str = "radius", y: str = "error",
                         key: Sequence[str] = tuple(HEAD_KEY)) -> np.ndarray:
    """Spearman(x, y) within each group of ``key`` (default: a head — model, example, layer, query head), vectorised;
    finite values only. With ``key=STEP_CELL_KEY``: within a cell (one example, layer, head, budget, kind, step,
    across draws)."""
    if draws.empty:
        return np.empty(0)
    codes = draws.groupby(list(key), observed=True, sort=False).ngroup().to_numpy()
    frame = pd.DataFrame({"g": codes, "x": draws[x].to_numpy(float), "y": draws[y].to_numpy(float)})
    grouped = frame.groupby("g", sort=False)
    rx = grouped["x"].rank().to_numpy()
    ry = grouped["y"].rank().to_numpy()
    k = int(codes.max()) + 1
    n = np.bincount(codes, minlength=k).astype(float)
    sx, sy = np.bincount(codes, rx, k), np.bincount(codes, ry, k)
    sxx, syy, sxy = np.bincount(codes, rx * rx, k), np.bincount(codes, ry * ry, k), np.bincount(codes, rx * ry, k)
    with np.errstate(divide="ignore", invalid="ignore"):
        cov = sxy - sx * sy / n
        r = cov / np.sqrt((sxx - sx * sx / n) * (syy - sy * sy / n))
    return r[np.isfinite(r)]


def within_cell_spearman(draws: pd.DataFrame, x: str = "radius", y: str = "error") -> np.ndarray:
    """Spearman(x, y) within each cell of one step (:data:`STEP_CELL_KEY`), across its draws."""
    return within_head_spearman(draws, x, y, STEP_CELL_KEY)


def step_cell_spearman(draws: pd.DataFrame, x: str = "radius", y: str = "error") -> tuple[np.ndarray, np.ndarray]:
    """The tested form of C2's within-cell Spearman: per cell of one step (:data:`STEP_CELL_KEY`), across its
    draws, Spearman(x, y) — and the position in ``draws`` of each cell's first row (its replay cell, for the
    bootstrap's weights). A cell whose error does not vary has nothing to rank and is left out; a cell whose
    error varies while the radius does not ranks nothing: its correlation is 0 (a radius constant within cells
    — no draw-level information — scores 0, not "undefined")."""
    if draws.empty:
        return np.empty(0), np.empty(0, dtype=np.int64)
    codes = draws.groupby(STEP_CELL_KEY, observed=True, sort=False).ngroup().to_numpy()
    frame = pd.DataFrame({"g": codes, "x": draws[x].to_numpy(float), "y": draws[y].to_numpy(float)})
    grouped = frame.groupby("g", sort=False)
    rx, ry = grouped["x"].rank().to_numpy(), grouped["y"].rank().to_numpy()
    k = int(codes.max()) + 1
    n = np.bincount(codes, minlength=k).astype(float)
    sx, sy = np.bincount(codes, rx, k), np.bincount(codes, ry, k)
    sxx, syy, sxy = np.bincount(codes, rx * rx, k), np.bincount(codes, ry * ry, k), np.bincount(codes, rx * ry, k)
    vx, vy, cov = sxx - sx * sx / n, syy - sy * sy / n, sxy - sx * sy / n
    tol = 1e-9 * n * n  # rank sums are exact small integers / halves: anything below is rounding
    ranked = vy > tol
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(vx > tol, cov / np.sqrt(vx * vy), 0.0)
    first = np.unique(codes, return_index=True)[1]  # codes are 0..k-1: the first row of each cell
    return r[ranked], first[ranked].astype(np.int64)


def _median(values: np.ndarray) -> float | None:
    return float(np.median(values)) if values.size else None


def variant_block(d: pd.DataFrame, variant: str, paths: pd.DataFrame | None = None, within: bool = True) -> dict:
    """Coverage (per step, and simultaneous anytime over paths), Spearman and tightness of one certificate
    (the within-cell and within-head Spearman only with ``within``: they rank every group)."""
    rad, anyr, cov, cov_any = VARIANTS[variant]
    lr = log_tightness(d, rad)
    lr = lr[np.isfinite(lr)]
    paths = simultaneous_anytime(d, cov_any) if paths is None else paths
    within_cell = within_cell_spearman(d, rad) if within else np.empty(0)
    return {
        "coverage": float(d[cov].mean()),
        "coverage_anytime": float(paths["covered"].mean()) if len(paths) else None,
        "coverage_anytime_step": float(d[cov_any].mean()),
        "paths": int(len(paths)),
        "spearman": spearman(d[rad].to_numpy(), d["error"].to_numpy()),
        "spearman_within_cell_median": _median(within_cell),
        "spearman_within_head_median": _median(within_head_spearman(d, rad)) if within else None,
        "tightness_median": float(10 ** np.median(lr)) if lr.size else None,
        "tightness_q10": float(10 ** np.quantile(lr, 0.1)) if lr.size else None,
        "tightness_q90": float(10 ** np.quantile(lr, 0.9)) if lr.size else None,
    }


def summarize_replay(draws: pd.DataFrame, delta: float) -> dict:
    """Both certificates' coverage (per step; anytime = simultaneous over a draw's path), Spearman (pooled; within
    cell and within head for the pooled and per-kind blocks) and tightness; pooled, by query kind, by budget, by layer
    (and by model when several).

    The plug-in's fields keep their names (``coverage``, ``spearman``, ...); the robust
    certificate's are under ``robust``. The anytime coverage of a query kind is that of its
    path (the setting query followed by the kind's decode steps); the setting query alone
    has no path of its own (None).
    """
    if draws.empty:
        return {"observations": 0}
    paths = {v: simultaneous_anytime(draws, VARIANTS[v][3]) for v in VARIANTS}

    def block(d: pd.DataFrame, pick, within: bool = False) -> dict:
        out = {"observations": int(len(d)), "cells": int(d.groupby(CELL_KEY, observed=True).ngroups),
               "zero_error": int((d["error"] <= 0).sum())}
        for variant in VARIANTS:
            v = variant_block(d, variant, pick(paths[variant]), within)
            if variant == "plugin":
                out.update(v)
            else:
                out["robust"] = v
        return out

    out = {"delta": delta, "target_coverage": 1.0 - delta, "pooled": block(draws, lambda p: p, True)}
    out["pooled"]["spearman_anytime"] = spearman(draws["anytime_radius"].to_numpy(), draws["error"].to_numpy())
    out["by_kind"] = {k: block(draws[draws["query_kind"] == k], lambda p, k=k: p[p["path"] == k], True)
                      for k in QUERY_KINDS if (draws["query_kind"] == k).any()}
    out["by_budget"] = {f"{b:g}": block(d, lambda p, b=b: p[p["budget"] == b])
                        for b, d in draws.groupby("budget", observed=True)}
    out["by_layer"] = {str(int(i)): block(d, lambda p, i=i: p[p["layer"] == i])
                       for i, d in draws.groupby("layer", observed=True)}
    models = draws["model"].unique()
    out["by_model"] = ({m: block(d, lambda p, m=m: p[p["model"] == m]) for m, d in draws.groupby("model", observed=True)}
                       if len(models) > 1 else {})
    return out
