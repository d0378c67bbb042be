"""Attention-level replay of the certificate on real prefills (claims C1, C2) and the
impossibility demonstration (Theorem 1) on a real model.

Procedure (DESIGN.md §1, "Across decode steps"; ``analysis_plan.replay``), per task
record:

1. Prefill the prompt (:func:`kvcert.tasks.prompting.build_prompt_ids`) with kvcert
   attention, capturing every replayed layer's post-RoPE q, K, V; then greedy-decode
   ``later_queries`` tokens over the full cache, capturing each step's query. The
   captured state of the last step holds the prompt keys followed by the decode keys.
2. Importance = the SnapKV scorer on the prompt observation (its observation window is
   the end of the prompt): the *setting* query — the one that set π — is the last
   prompt query. π = :func:`kvcert.design.inclusion_probabilities` at each budget.
3. Per (layer, KV head, budget) draw ``draws`` Poisson samples **once** (a generator
   seeded from ``(seed, example, layer, budget)``) and evaluate every query of that
   head group on the same samples: the setting query (over the kept prompt keys) and
   the ``later_queries`` decode-step queries (over the kept prompt keys plus the decode
   keys, which are certain, π = 1) — the stale-π case. Draws are vectorised as the
   batch dimension (rows padded with log π = +inf).
4. ô and the certificate (V̂, the one-pass range bound b̂_c, ε_δ) are those of
   :func:`kvcert.attention.certified_attention` — computed by the same
   :func:`~kvcert.attention.hajek_attention` in float64, with a causal mask so each
   later query sees only the decode keys before it, and the per-head value centre the
   cache uses (the mean of the kept values); o = exact attention over every key the
   query sees, float64; error = ‖ô − o‖. The radius
   is ε_δ; the anytime radius uses δ_t = δ/(t(t+1)) with t = 1 for the setting query
   and t = 1 + i for the i-th later query (the decode steps after it).

One output row per (example, layer, query head, budget, step, draw), ``step`` 0 being
the setting query and 1..later_queries the later ones (``query_kind`` says which);
coverage is decided in float64 before anything is stored (``covered``,
``covered_anytime``). A *replay cell* — the unit of C1/C2's bootstrap — is
(model, example, layer, query head, budget, query kind).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from ..attention import hajek_attention
from ..cache import CertifiedCache
from ..certificate import anytime_radius, bernstein_radius
from ..design import DEFAULT_DESIGN, RetentionDesign, inclusion_probabilities, poisson_sample
from ..impossibility import TABLE_HEADER, impossibility_demo
from ..integration import ATTENTION_NAME
from ..scorers import get_scorer
from ..scorers.base import LayerObservation
from ..tasks.prompting import build_prompt_ids
from .stats import spearman

CELL_KEY = ["model", "example_id", "layer", "head", "budget", "query_kind"]
FLOAT_COLUMNS = ["error", "radius", "anytime_radius", "variance", "range_term", "output_norm"]
#: keys × draws × head-dim elements evaluated at once (bounds replay memory on big models)
MAX_ELEMENTS = 2**25


@dataclass
class Capture:
    """Prefill observation per layer, later-step queries [Hq, D], all keys/values [Hkv, N+J, D]."""

    prompt: dict[int, LayerObservation]
    later: dict[int, list[torch.Tensor]]
    keys: dict[int, torch.Tensor]
    values: dict[int, torch.Tensor]
    prompt_tokens: int


def _check_model(model) -> None:
    if getattr(model.config, "_attn_implementation", None) != ATTENTION_NAME:
        raise ValueError("model: call kvcert.enable_certified_attention(model) before replay")


def replay_layers(num_layers: int, max_layers: int | None) -> list[int]:
    """All layers, or ``max_layers`` evenly spaced ones (first and last included)."""
    if max_layers is None or max_layers >= num_layers:
        return list(range(num_layers))
    if max_layers < 1:
        raise ValueError(f"max_layers: must be >= 1, got {max_layers}")
    return sorted({int(round(x)) for x in np.linspace(0, num_layers - 1, max_layers)})


@torch.no_grad()
def capture(model, input_ids: list[int], layers: Sequence[int], later_queries: int) -> Capture:
    """Prefill ``input_ids`` and greedy-decode ``later_queries`` tokens, capturing ``layers``."""
    _check_model(model)
    device = next(model.parameters()).device
    cache = CertifiedCache(capture_layers=layers, record_certificates=False)
    x = torch.tensor([input_ids], dtype=torch.long, device=device)
    logits = model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
    missing = set(layers) - set(cache.captured)
    if missing:
        raise ValueError(f"layers: no attention layer with index {sorted(missing)} in this model")
    prompt = dict(cache.captured)
    later: dict[int, list[torch.Tensor]] = {i: [] for i in layers}
    for _ in range(later_queries):
        tok = int(logits.float().argmax())
        x = torch.tensor([[tok]], dtype=torch.long, device=device)
        logits = model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
        for i in layers:
            later[i].append(cache.captured[i].query[0, :, -1])
    last = cache.captured
    return Capture(
        prompt=prompt, later=later,
        keys={i: last[i].key[0] for i in layers}, values={i: last[i].value[0] for i in layers},
        prompt_tokens=len(input_ids),
    )


def _seed(seed: int, example_id: str, layer: int, budget: float) -> int:
    digest = hashlib.sha256(f"{seed}:{example_id}:{layer}:{budget!r}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % (2**62)


def _exact(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float) -> torch.Tensor:
    """Full attention, float64: q [Hq, D], k/v [Hkv, L, D] → [Hq, D]."""
    hq, hkv = q.shape[0], k.shape[0]
    g = hq // hkv
    logits = torch.einsum("hgd,hld->hgl", q.reshape(hkv, g, -1), k) * scaling
    return torch.einsum("hgl,hld->hgd", torch.softmax(logits, dim=-1), v).reshape(hq, -1)


def replay_layer(
    cap: Capture, layer: int, budgets: Sequence[float], draws: int, delta: float, design: RetentionDesign,
    seed: int, example_id: str, scorer: str = "snapkv",
) -> dict[str, np.ndarray]:
    """Every (budget, step, draw, query head) of one layer: columns as numpy arrays.

    All queries of a head group are evaluated in one call of the Hájek attention with
    its certificate (:func:`kvcert.attention.hajek_attention`, the computation behind
    :func:`~kvcert.attention.certified_attention`) over the keys [kept prompt keys,
    decode keys]: with ``causal=True`` the setting query sees the kept prompt keys only
    and the i-th later query also the first i decode keys — the state of the cache at
    that decode step.
    """
    obs = cap.prompt[layer]
    n = cap.prompt_tokens
    scaling = float(obs.scaling)
    f64 = torch.float64
    k_all, v_all = cap.keys[layer].to(f64), cap.values[layer].to(f64)  # [Hkv, N+J, D]
    queries = torch.stack([obs.query[0, :, -1]] + list(cap.later[layer]), dim=1).to(f64)  # [Hq, Q], step 0 = setting
    n_q = queries.shape[1]
    hkv, hq = k_all.shape[0], queries.shape[0]
    group = hq // hkv
    exact = torch.stack(
        [_exact(queries[:, s], k_all[:, : n + s], v_all[:, : n + s], scaling) for s in range(n_q)], dim=1
    )  # [Hq, Q, D]
    steps = torch.arange(1, n_q + 1, dtype=f64, device=k_all.device)  # anytime step t: 1 for the setting query, 1 + i for later query i
    importance = get_scorer(scorer)(obs)[0]  # [Hkv, N]
    decode_idx = torch.arange(n, n + n_q - 1, device=k_all.device).expand(1, hkv, -1)
    cols: dict[str, list[np.ndarray]] = {c: [] for c in ["budget", "step", "draw", "head", "kept", *FLOAT_COLUMNS,
                                                          "covered", "covered_anytime"]}
    for budget in budgets:
        pi = inclusion_probabilities(importance, float(budget), design)  # [Hkv, N] float64
        gen = torch.Generator(device=pi.device).manual_seed(_seed(seed, example_id, layer, float(budget)))
        sample = poisson_sample(pi.unsqueeze(0).expand(draws, -1, -1).contiguous(), gen)  # [draws, Hkv, K]
        width = sample.indices.shape[-1]
        kept_mask = sample.kept_mask()
        chunk = max(1, min(draws, MAX_ELEMENTS // max(1, hkv * (width + n_q) * k_all.shape[-1])))
        for d0 in range(0, draws, chunk):
            d1 = min(draws, d0 + chunk)
            nd = d1 - d0
            # kept prompt slots then the decode slots, gathered in one pass (padding: index 0, log π = +inf)
            idx = torch.cat([sample.indices[d0:d1], decode_idx.expand(nd, -1, -1)], 2).unsqueeze(-1)
            ks = k_all.unsqueeze(0).expand(nd, -1, -1, -1).gather(2, idx.expand(-1, -1, -1, k_all.shape[-1]))
            vs = v_all.unsqueeze(0).expand(nd, -1, -1, -1).gather(2, idx.expand(-1, -1, -1, v_all.shape[-1]))
            lps = torch.cat([sample.log_pi[d0:d1].to(f64), torch.zeros(nd, hkv, n_q - 1, dtype=f64, device=ks.device)], 2)
            mask = kept_mask[d0:d1].to(f64)  # [nd, Hkv, N]
            centre = torch.matmul(mask.transpose(0, 1), v_all[:, :n]).transpose(0, 1)  # the cache's centre: mean kept value
            centre = centre / mask.sum(-1, keepdim=True).clamp(min=1)
            qq = queries.unsqueeze(0).expand(nd, -1, -1, -1)  # [nd, Hq, Q, D]
            res = hajek_attention(qq, ks, vs, lps, scaling, causal=True, certificate=True, centre=centre)
            err = torch.linalg.vector_norm(res.output - exact.unsqueeze(0), dim=-1)  # [nd, Hq, Q]
            var, rng = res.variance, res.range_term
            rad = bernstein_radius(var, rng, delta)
            anyr = anytime_radius(var, rng, delta, steps)
            kept = sample.lengths[d0:d1].repeat_interleave(group, dim=1)  # [nd, Hq]
            shape = (nd, hq, n_q)
            cols["budget"].append(np.full(nd * hq * n_q, float(budget)))
            cols["draw"].append(np.broadcast_to(np.arange(d0, d1, dtype=np.int32)[:, None, None], shape).reshape(-1))
            cols["head"].append(np.broadcast_to(np.arange(hq, dtype=np.int16)[None, :, None], shape).reshape(-1))
            cols["step"].append(np.broadcast_to(np.arange(n_q, dtype=np.int16)[None, None, :], shape).reshape(-1))
            cols["kept"].append(kept.unsqueeze(-1).expand(shape).reshape(-1).cpu().numpy().astype(np.int32))
            for name, t in (("error", err), ("radius", rad), ("anytime_radius", anyr), ("variance", var),
                            ("range_term", rng), ("output_norm", torch.linalg.vector_norm(res.output, dim=-1))):
                cols[name].append(t.reshape(-1).cpu().numpy())
            cols["covered"].append((err <= rad).reshape(-1).cpu().numpy())
            cols["covered_anytime"].append((err <= anyr).reshape(-1).cpu().numpy())
    return {c: np.concatenate(v) for c, v in cols.items()}


def replay_model(
    model, tokenizer, records, budgets: Sequence[float], draws: int, later_queries: int, delta: float,
    design: RetentionDesign = DEFAULT_DESIGN, seed: int = 0, max_layers: int | None = None,
    model_name: str | None = None, scorer: str = "snapkv",
) -> pd.DataFrame:
    """Replay draws of every record (see the module docstring); one row per (example, layer, head, budget, step, draw)."""
    _check_model(model)
    if draws < 1 or later_queries < 0:
        raise ValueError("draws must be >= 1 and later_queries >= 0")
    name = model_name or getattr(model.config, "name_or_path", None) or type(model).__name__
    num_layers = model.config.get_text_config().num_hidden_layers
    layers = replay_layers(num_layers, max_layers)
    parts = []
    for record in records:
        ids, _ = build_prompt_ids(tokenizer, record)
        cap = capture(model, ids, layers, later_queries)
        for layer in layers:
            cols = replay_layer(cap, layer, budgets, draws, delta, design, seed, record.id, scorer)
            part = pd.DataFrame(cols)
            part.insert(0, "layer", np.int16(layer))
            part.insert(0, "target_tokens", int(record.metadata.get("target_tokens", -1)))
            part.insert(0, "example_id", record.id)
            part.insert(0, "model", name)
            parts.append(part)
    if not parts:
        return empty_replay()
    df = pd.concat(parts, ignore_index=True)
    group = model.config.get_text_config().num_attention_heads // model.config.get_text_config().num_key_value_heads
    df["kv_head"] = (df["head"] // group).astype(np.int16)
    df["query_kind"] = np.where(df["step"] == 0, "setting", "later")
    return df[REPLAY_COLUMNS]


REPLAY_COLUMNS = [
    "model", "example_id", "target_tokens", "layer", "head", "kv_head", "budget", "query_kind", "step", "draw", "kept",
    *FLOAT_COLUMNS, "covered", "covered_anytime",
]


def empty_replay() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=float if c in FLOAT_COLUMNS else object) for c in REPLAY_COLUMNS})


# --- impossibility ----------------------------------------------------------------------
@torch.no_grad()
def impossibility_for_model(
    model, tokenizer, record, budget: float = 0.25, modes: Sequence[str] = ("permute", "shift"),
    design: RetentionDesign = DEFAULT_DESIGN, seed: int = 0, layer: int | None = None, model_name: str | None = None,
) -> list[dict]:
    """Theorem 1 on one captured layer (the middle one by default) of ``record``'s prefill."""
    _check_model(model)
    num_layers = model.config.get_text_config().num_hidden_layers
    layer = num_layers // 2 if layer is None else layer
    ids, _ = build_prompt_ids(tokenizer, record)
    obs = capture(model, ids, [layer], 0).prompt[layer]
    obs = LayerObservation(obs.query.double(), obs.key.double(), obs.value.double(), None, obs.scaling, layer, num_layers)
    name = model_name or getattr(model.config, "name_or_path", None) or type(model).__name__
    rows = []
    for mode in modes:
        res = impossibility_demo(obs, budget=budget, mode=mode, design=design, seed=seed)
        rows.append({
            "model": name, "example_id": record.id, "layer": layer, "mode": mode, "budget": float(budget),
            "retained_hash_before": res.retained_hash_before, "retained_hash_after": res.retained_hash_after,
            "identical_retained_state": res.identical_retained_state,
            "error_before": res.error_before, "error_after": res.error_after, "error_ratio": res.error_ratio,
            "table_row": res.table_row(),
        })
    return rows


IMPOSSIBILITY_HEADER = TABLE_HEADER


# --- summaries ----------------------------------------------------------------------------
def replay_cells(draws: pd.DataFrame) -> pd.DataFrame:
    """Per replay cell: observations, coverage (per-step and anytime), median tightness, Spearman across draws."""
    if draws.empty:
        return pd.DataFrame(columns=[*CELL_KEY, "n", "coverage", "coverage_anytime", "tightness", "spearman"])
    d = draws.assign(log_ratio=_log_tightness(draws))
    g = d.groupby(CELL_KEY, sort=True, observed=True)
    out = g.agg(n=("covered", "size"), coverage=("covered", "mean"), coverage_anytime=("covered_anytime", "mean"),
                tightness=("log_ratio", "median")).reset_index()
    out["tightness"] = 10.0 ** out["tightness"]
    return out


def _log_tightness(draws: pd.DataFrame) -> np.ndarray:
    """log10(radius / error); NaN where the error is 0 (nothing to be tight about)."""
    err = draws["error"].to_numpy(dtype=np.float64)
    rad = draws["radius"].to_numpy(dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(err > 0, np.log10(rad / err), np.nan)


HEAD_KEY = ["model", "example_id", "layer", "head"]


def within_head_spearman(draws: pd.DataFrame, x: str = "radius", y: str = "error") -> np.ndarray:
    """Spearman(x, y) within each head (model, example, layer, query head), vectorised; finite values only."""
    if draws.empty:
        return np.empty(0)
    codes = draws.groupby(HEAD_KEY, observed=True, sort=False).ngroup().to_numpy()
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


def summarize_replay(draws: pd.DataFrame, delta: float) -> dict:
    """Coverage, Spearman (pooled and within head), tightness and anytime coverage; pooled, by kind, by budget."""
    if draws.empty:
        return {"observations": 0}

    def block(d: pd.DataFrame, full: bool) -> dict:
        lr = _log_tightness(d)
        lr = lr[np.isfinite(lr)]
        within = within_head_spearman(d)
        out = {
            "observations": int(len(d)),
            "cells": int(d.groupby(CELL_KEY, observed=True).ngroups),
            "coverage": float(d["covered"].mean()),
            "coverage_anytime": float(d["covered_anytime"].mean()),
            "spearman": spearman(d["radius"].to_numpy(), d["error"].to_numpy()),
            "spearman_within_head_median": float(np.median(within)) if within.size else None,
            "spearman_within_head_mean": float(np.mean(within)) if within.size else None,
            "tightness_median": float(10 ** np.median(lr)) if lr.size else None,
            "tightness_q10": float(10 ** np.quantile(lr, 0.1)) if lr.size else None,
            "tightness_q90": float(10 ** np.quantile(lr, 0.9)) if lr.size else None,
            "zero_error": int((d["error"] <= 0).sum()),
        }
        if full:
            out["spearman_anytime"] = spearman(d["anytime_radius"].to_numpy(), d["error"].to_numpy())
        return out

    out = {"delta": delta, "target_coverage": 1.0 - delta, "pooled": block(draws, True)}
    out["by_kind"] = {k: block(d, False) for k, d in draws.groupby("query_kind", observed=True)}
    out["by_budget"] = {f"{b:g}": block(d, False) for b, d in draws.groupby("budget", observed=True)}
    models = draws["model"].unique()
    out["by_model"] = {m: block(d, False) for m, d in draws.groupby("model", observed=True)} if len(models) > 1 else {}
    return out
