"""The error certificate: variance estimator, range term and Bernstein radius.

Notation (docs/design.md §1), per (layer, head, query): logits s_i = q·k_i·scale, retained
set S with inclusion probabilities π_i, Hájek weights w_i = e^{s_i}/π_i / Σ_S e^{s_j}/π_j
(one logit offset −log π_i inside the softmax), Hájek output ô = Σ_S w_i v_i.

* Variance estimator for the Poisson design by linearisation (Särndal, Swensson &
  Wretman 1992, §5.5–5.6)::

      V̂ = Σ_{i∈S} (1 − π_i) · w_i² · ‖v_i − ô‖²

  It estimates E‖ô − o‖² to first order; certain tokens (π_i = 1) contribute 0.
  One pass suffices: with p_i = e^{s_i − m} (running max m), l = Σ p_i and
  r_i = (1 − π_i) p_i², accumulate A = Σ r_i, B = Σ r_i v_i, C = Σ r_i ‖v_i‖² next to
  the online-softmax sums (scaled by α² when m moves), then
  V̂ = (C − 2 B·ô + A ‖ô‖²) / l². Values are centred on a per-head centre c first
  (v − c, ô − c), which leaves V̂ unchanged and keeps fp32 cancellation small.

* Range term. The plug-in Bernstein bound uses b̂ = max_{i∈S, π_i<1} (1 − π_i) w_i ‖v_i − ô‖.
  ô is only known at the end of the pass, so the served certificate uses the one-pass
  upper bound (triangle inequality, then the max of a sum ≤ the sum of the maxima)::

      b̂_c = max_i (1 − π_i) w_i ‖v_i − c‖ + ‖ô − c‖ · max_i (1 − π_i) w_i  ≥ b̂

  Both maxima are running maxima (rescaled by α like l), so b̂_c needs no second pass;
  a larger range term only widens the radius, so the bound stays valid. The exact b̂ is
  computed by :func:`certificate_reference`.

* Radius at level δ (vector Bernstein inequality, Pinelis 1994, plug-in)::

      ε_δ = sqrt(2 · V̂ · L) + (2/3) · b̂ · L,   L = log(2/δ)

  Assumptions: the sample is Poisson (or priority, whose conditional inclusion
  probabilities play the same role) and independent of the query; the linearised error
  dominates (tails of many small terms). Under these, P(‖ô − o‖ > ε_δ) ≲ δ per step.

* Anytime variant across decode steps t = 1, 2, …: the same radius at
  δ_t = δ / (t (t + 1)), so that Σ_t δ_t = δ (union bound). It inherits validity only
  from valid per-step bounds, and what it claims is simultaneous: its coverage is the
  share of draws whose *every* step is covered, not the per-step average (the sample is
  drawn once; later queries are not the ones that set π).

* Robust variant (this project's, beyond the paper). The plug-in sums run over the kept
  tokens only: the evicted summands of the linearised error, e^{s_j}(v_j − o)/Z, enter
  neither V̂ nor b̂, which is harmless for the query that set π (its heavy tokens have
  large π) and not for a later query that weighs tokens π did not favour. The eviction
  sketch (:mod:`kvcert.method.sketch`) bounds the evicted summands of its r shadow tokens under
  any query, t_j ≥ e^{s_j}‖v_j − ô‖/Ẑ. A shadow token is evicted, so given the sample its
  summand is a fixed part of the error, not a random one; the robust radius adds the
  bounds to the plug-in radius by the triangle inequality::

      ε_R = max( sqrt(2 · V̂ · L) + (2/3) · b̂_c · L + Σ_j t_j ,  u · ‖ô‖ )

  (:func:`robust_radius`; anytime: the plug-in part at δ_t). The second term is the resolution of
  the output itself: ô is computed and stored in the cache's dtype, whose unit roundoff u
  (:data:`UNIT_ROUNDOFF`: 2⁻²⁴ fp32, 2⁻¹¹ fp16, 2⁻⁸ bf16) bounds how finely it can be
  resolved, so the robust certificate claims nothing below u·‖ô‖. Evicted tokens outside the shadow
  are left to the plug-in's Horvitz–Thompson logic, so ε_R is not valid for every query:
  its coverage is measured (``kvcert bench coverage``, the replay's claim C8). Entering the t_j
  into the Bernstein bound as extra summands instead (V̂ + Σ t_j², max(b̂_c, max t_j)) would give
  about 4.5 t_j for one dominant evicted token where the error is t_j (docs/robust-certificate.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..checks import check_delta
from ..config.names import AGGREGATIONS


def log_term(delta: float) -> float:
    """L = log(2/δ)."""
    return math.log(2.0 / check_delta(delta))


def bernstein_radius(variance: torch.Tensor, range_term: torch.Tensor, delta: float) -> torch.Tensor:
    """ε_δ = sqrt(2 V̂ L) + (2/3) b̂ L with L = log(2/δ)."""
    big_l = log_term(delta)
    return torch.sqrt(2.0 * variance.clamp(min=0) * big_l) + (2.0 / 3.0) * range_term * big_l


def anytime_delta(delta: float, step: int | torch.Tensor) -> float | torch.Tensor:
    """δ_t = δ / (t (t+1)) for decode step t ≥ 1 (Σ_t δ_t = δ)."""
    check_delta(delta)
    if isinstance(step, torch.Tensor):
        if (step < 1).any():
            raise ValueError("step: decode steps are counted from 1")
        return delta / (step.to(torch.float64) * (step.to(torch.float64) + 1.0))
    if step < 1:
        raise ValueError(f"step: decode steps are counted from 1, got {step}")
    return delta / (step * (step + 1.0))


def anytime_radius(
    variance: torch.Tensor, range_term: torch.Tensor, delta: float, step: int | torch.Tensor
) -> torch.Tensor:
    """Radius valid simultaneously over all decode steps (union bound δ_t = δ/(t(t+1)))."""
    d_t = anytime_delta(delta, step)
    big_l = torch.log(2.0 / torch.as_tensor(d_t, dtype=torch.float64)).to(variance.dtype)
    return torch.sqrt(2.0 * variance.clamp(min=0) * big_l) + (2.0 / 3.0) * range_term * big_l


#: unit roundoff u of each dtype (round to nearest): the finest relative resolution of a value stored in it
UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def unit_roundoff(dtype: torch.dtype) -> float:
    """u of ``dtype`` (:data:`UNIT_ROUNDOFF`)."""
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype: no unit roundoff for {dtype}; one of {', '.join(map(str, UNIT_ROUNDOFF))}")
    return UNIT_ROUNDOFF[dtype]


def robust_radius(
    variance: torch.Tensor, range_term: torch.Tensor, shadow_sum: torch.Tensor,
    delta: float, step: int | torch.Tensor | None = None, floor: torch.Tensor | None = None,
) -> torch.Tensor:
    """ε_R = max(sqrt(2 V̂ L) + (2/3) b̂_c L + Σ_j t_j, floor) at δ (or at δ_t for decode ``step`` t ≥ 1).

    ``shadow_sum``: Σ_j t_j, the eviction sketch's bound on its evicted summands
    (:func:`kvcert.method.sketch.sketch_terms`); ``floor``: the output's resolution u·‖ô‖
    (:func:`unit_roundoff` of the cache dtype), None = 0.
    """
    plugin = bernstein_radius(variance, range_term, delta) if step is None else anytime_radius(
        variance, range_term, delta, step)
    radius = plugin + shadow_sum.to(plugin.dtype)
    return radius if floor is None else torch.maximum(radius, floor.to(radius.dtype))


def aggregate(values: torch.Tensor, how: str, dims: tuple[int, ...]) -> torch.Tensor:
    """Aggregate per-head / per-layer certificates: "max", "mean" or "rms" over ``dims``."""
    if how == "max":
        return values.amax(dim=dims)
    if how == "mean":
        return values.mean(dim=dims)
    if how == "rms":
        return values.pow(2).mean(dim=dims).sqrt()
    raise ValueError(f"aggregation: must be one of {AGGREGATIONS}, got {how!r}")


@dataclass
class ReferenceCertificate:
    """Float64 two-pass result: output ô, V̂, exact b̂ and the one-pass bound b̂_c."""

    output: torch.Tensor
    variance: torch.Tensor
    range_exact: torch.Tensor
    range_bound: torch.Tensor


def certificate_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    log_pi: torch.Tensor | None,
    scaling: float,
    centre: torch.Tensor | None = None,
) -> ReferenceCertificate:
    """Two-pass float64 reference for one or many heads.

    query [..., Q, D], key/value [..., L, D], log_pi [..., L] (None = all certain;
    +inf marks padding), centre [..., D] (None = 0). Every query sees every key.
    """
    q, k, v = (t.to(torch.float64) for t in (query, key, value))
    lp = torch.zeros(k.shape[:-1], dtype=torch.float64) if log_pi is None else log_pi.to(torch.float64)
    logits = q @ k.transpose(-1, -2) * scaling - lp.unsqueeze(-2)
    w = torch.softmax(logits, dim=-1)
    out = w @ v
    one_minus = (-torch.expm1(lp)).clamp(min=0).unsqueeze(-2)
    dist = torch.linalg.vector_norm(v.unsqueeze(-3) - out.unsqueeze(-2), dim=-1)
    variance = (one_minus * w.pow(2) * dist.pow(2)).sum(-1)
    range_exact = (one_minus * w * dist).amax(-1)
    c = torch.zeros_like(v[..., 0, :]) if centre is None else centre.to(torch.float64)
    dev = torch.linalg.vector_norm(v - c.unsqueeze(-2), dim=-1).unsqueeze(-2)
    out_dev = torch.linalg.vector_norm(out - c.unsqueeze(-2), dim=-1)
    range_bound = (one_minus * w * dev).amax(-1) + out_dev * (one_minus * w).amax(-1)
    return ReferenceCertificate(out, variance, range_exact, range_bound)
