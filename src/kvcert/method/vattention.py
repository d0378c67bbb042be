"""vAttention (Desai et al., "vAttention: Verified Sparse Attention", 2025): a deterministic part read exactly and
a uniform with-replacement sample of the rest, with a CLT budget rule for an (ε, δ) statement on the softmax
denominator. Our own code, written to compare with kvcert's certificate on the same heads (the replay's vAttention
arm, :mod:`kvcert.generation.replay`); read beside the authors' sparse-attention-hub (``AdaptiveSamplingMasker``),
never copied from it.

Per query row, logits s_i = q·k_i·scale over the L keys it sees, e_i = exp(s_i − m) (m the row's maximum: every
ratio below is invariant to it), exact denominator D = Σ_i e_i, numerator N = Σ_i e_i v_i, output o = N / D.

* Deterministic part 𝒟 (:func:`deterministic_set`): the first ``lo`` keys (sinks), every key from ``hi`` on (the
  local window; in the replay also the decode keys), and the ``heavy`` largest logits in [lo, hi) (top-k heavy
  hitters, here the query's own logits: vAttention's oracle top-k). Read exactly.
* Residual ℛ = the visible keys outside 𝒟, n = |ℛ|. b draws I_1..I_b uniform on ℛ **with replacement**
  (:func:`uniform_draws`; c_i = how often i was drawn, Σ c_i = b).
* Estimator (Hansen–Hurwitz, :func:`vattention_attention`; "the sampled part scaled by n/b")::

      D̂ = Σ_𝒟 e_i + (n/b) Σ_ℛ c_i e_i,   N̂ = Σ_𝒟 e_i v_i + (n/b) Σ_ℛ c_i e_i v_i,   ô = N̂ / D̂

  E[c_i] = b/n, so D̂ and N̂ are unbiased (ô is a ratio: consistent, not unbiased). The authors' code collapses a
  token drawn twice into one mask entry (its weight n/b once): that version is biased low once b is not ≪ n, which
  is what the Horvitz–Thompson variant repairs.
* Horvitz–Thompson variant: the distinct drawn tokens, each with its inclusion probability under b uniform draws
  on n tokens (p = 1/n per draw, m = b draws), π = 1 − (1 − 1/n)^b (:func:`ht_inclusion`)::

      D̂_HT = Σ_𝒟 e_i + Σ_{i∈ℛ, c_i>0} e_i / π,   N̂_HT likewise,   ô_HT = N̂_HT / D̂_HT

  (the variant is not in the repository snapshot read for this module; it follows the description p = 1/n, m = b).
* Budget rule for (ε, δ), σ̂ the sample standard deviation (n − 1 divisor, over the b draws with multiplicity) of
  the drawn e_i, D̂ the estimated denominator (:func:`budget_rule`)::

      b = (Φ⁻¹(1 − δ) · σ̂ · n / (ε · D̂))²

  so at a given b the statement it makes is (:func:`stated_epsilon`, the rule inverted)::

      ε = Φ⁻¹(1 − δ) · σ̂ · n / (D̂ · √b)

  and the bound (:func:`denominator_bound`): |D̂ − D| ≤ ε · D with probability ≈ 1 − δ by the central limit theorem
  (σ̂ and D̂ estimated from the same draws). Only the denominator is bounded: nothing is said about N̂ or ô.
  The authors' code takes the one-sided quantile Φ⁻¹(1 − δ) for this two-sided statement, so under the CLT the
  statement covers ≈ 1 − 2δ; ``two_sided=True`` uses Φ⁻¹(1 − δ/2), which covers ≈ 1 − δ.

How the authors' code splits the budget: sinks, a local window and top-k heavy hitters (oracle or HashAttention
scores) as separate maskers, then the adaptive sampler: a pilot sample (``base_rate_sampling`` of the range, at least
2) estimates σ̂ and D̂, the budget rule sets b (clamped to [pilot size, range]), and b draws follow over the range
between the sinks and the window — heavy hitters included, their weight clamped back to 1. Here the residual leaves
the deterministic part out, σ̂ and D̂ come from the b draws themselves, and b is the caller's (the replay matches it to
kvcert's density): ε is then what the rule states at that b, not a target it meets.

Conventions: ε = 0 where n = 0 (nothing sampled, D̂ = D exactly), NaN where b < 2 and n > 0 (σ̂ undefined); with
b = 0 the residual is estimated as 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import torch


def normal_quantile(delta: float, two_sided: bool = False) -> float:
    """Φ⁻¹(1 − δ) (the authors' code), or Φ⁻¹(1 − δ/2) with ``two_sided``."""
    if not 0.0 < float(delta) < 1.0:
        raise ValueError(f"delta: must lie in (0, 1), got {delta}")
    return NormalDist().inv_cdf(1.0 - (float(delta) / 2.0 if two_sided else float(delta)))


def budget_rule(sigma: torch.Tensor, denominator: torch.Tensor, n, epsilon: float, delta: float,
                two_sided: bool = False) -> torch.Tensor:
    """b = (Φ⁻¹(1 − δ) · σ̂ · n / (ε · D̂))² (real-valued; the authors round it down and clamp it to [1, n])."""
    if not float(epsilon) > 0.0:
        raise ValueError(f"epsilon: must be > 0, got {epsilon}")
    z = normal_quantile(delta, two_sided)
    return (z * sigma * n / (float(epsilon) * denominator)) ** 2


def stated_epsilon(sigma: torch.Tensor, denominator: torch.Tensor, n, b, delta: float,
                   two_sided: bool = False) -> torch.Tensor:
    """The relative denominator error ε the rule states at b draws: Φ⁻¹(1 − δ) · σ̂ · n / (D̂ · √b)
    (0 where n = 0; NaN where b < 2 and n > 0)."""
    z = normal_quantile(delta, two_sided)
    sigma, denominator = torch.as_tensor(sigma), torch.as_tensor(denominator)
    n = torch.as_tensor(n, dtype=sigma.dtype, device=sigma.device)
    b = torch.as_tensor(b, dtype=sigma.dtype, device=sigma.device)
    eps = z * sigma * n / (denominator * b.clamp(min=1).sqrt())
    eps = torch.where(b < 2, torch.full_like(eps, float("nan")), eps)
    return torch.where(n == 0, torch.zeros_like(eps), eps)


def ht_inclusion(n, b) -> torch.Tensor:
    """π = 1 − (1 − 1/n)^b: the chance a given token of n is among b uniform draws with replacement (0 where b = 0
    or n = 0)."""
    n = torch.as_tensor(n, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    pi = -torch.expm1(b * torch.log1p(-1.0 / n.clamp(min=1)))
    return torch.where((n > 0) & (b > 0), pi, torch.zeros_like(pi))


def deterministic_set(logits: torch.Tensor, lo: int, hi: int, heavy: torch.Tensor | int,
                      visible: torch.Tensor | None = None) -> torch.Tensor:
    """Bool [..., L]: positions [0, lo) (sinks), [hi, L) (local window, decode keys) and the ``heavy`` largest logits
    in [lo, hi) per row (``heavy`` an int or a LongTensor broadcastable to the rows), intersected with ``visible``."""
    length = logits.shape[-1]
    lo, hi = min(int(lo), length), max(min(int(hi), length), min(int(lo), length))
    pos = torch.arange(length, device=logits.device)
    det = ((pos < lo) | (pos >= hi)).expand(logits.shape).clone()
    heavy = torch.as_tensor(heavy, dtype=torch.long, device=logits.device)
    kmax = int(heavy.max()) if heavy.numel() else 0
    kmax = min(kmax, hi - lo)
    if kmax > 0:
        middle = logits[..., lo:hi]
        if visible is not None:
            middle = middle.masked_fill(~visible[..., lo:hi], float("-inf"))
        top = middle.topk(kmax, dim=-1).indices + lo  # sorted: the first heavy of each row are its heavy largest
        keep = torch.arange(kmax, device=logits.device) < heavy.unsqueeze(-1)
        det.scatter_(-1, top, keep.expand(top.shape) | det.gather(-1, top))
    return det if visible is None else det & visible


def residual_order(residual: torch.Tensor) -> torch.Tensor:
    """Per row, the positions of ``residual`` [..., L] first, ascending, then the others (what
    :func:`uniform_draws` indexes)."""
    return torch.argsort((~residual).to(torch.int8), dim=-1, stable=True)


def uniform_draws(residual: torch.Tensor, b: torch.Tensor, uniforms: torch.Tensor,
                  order: torch.Tensor | None = None) -> torch.Tensor:
    """Counts c [..., L] (float64) of b uniform draws with replacement from the True positions of ``residual``
    [..., L] per row (the j-th draw: the ⌊U_j·n⌋-th residual position, ascending); ``uniforms`` [..., B] U[0, 1)
    (B ≥ max b; draw j < b of a row uses its j-th uniform), so a caller draws them once on
    :func:`kvcert.method.design.cpu_generator` and gets the same draws on any device. ``order``: the rows'
    :func:`residual_order`, where the caller keeps it."""
    n = residual.sum(-1, keepdim=True)
    order = residual_order(residual) if order is None else order
    pick = (uniforms * n.to(uniforms.dtype)).floor().long().clamp(max=residual.shape[-1] - 1)
    pick = torch.minimum(pick, (n - 1).clamp(min=0))
    pos = order.expand(*pick.shape[:-1], order.shape[-1]).gather(-1, pick)
    valid = (torch.arange(uniforms.shape[-1], device=uniforms.device) < b.unsqueeze(-1)) & (n > 0)
    counts = torch.zeros(*pick.shape[:-1], residual.shape[-1], dtype=torch.float64, device=residual.device)
    return counts.scatter_add_(-1, pos, valid.to(torch.float64))


@dataclass
class VAttentionEstimate:
    """One sample's estimates per row (float64, in units of e^m, m the row's maximum logit): ``output`` ô [..., D],
    ``denominator`` D̂, the HT variant's ``output_ht`` and ``denominator_ht``, σ̂ ``sigma``, the residual size n
    ``residual``, the draws b ``draws`` and the exact ``true_denominator`` D."""

    output: torch.Tensor
    denominator: torch.Tensor
    output_ht: torch.Tensor
    denominator_ht: torch.Tensor
    sigma: torch.Tensor
    residual: torch.Tensor
    draws: torch.Tensor
    true_denominator: torch.Tensor

    def epsilon(self, delta: float, two_sided: bool = False) -> torch.Tensor:
        """The ε the budget rule states at these draws (:func:`stated_epsilon`)."""
        return stated_epsilon(self.sigma, self.denominator, self.residual, self.draws, delta, two_sided)

    def denominator_error(self, ht: bool = False) -> torch.Tensor:
        """Realised |D̂ − D| / D."""
        est = self.denominator_ht if ht else self.denominator
        return (est - self.true_denominator).abs() / self.true_denominator


def _weighted_sum(we: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Σ_l we[..., q, l] · values[l] per row: values [L, D], or [H, L, D] with rows [..., H, Q, L] (each head its own
    values, not expanded over the leading dims)."""
    if values.dim() == 2:
        return torch.matmul(we, values)
    lead, (h, q, length) = we.shape[:-3], we.shape[-3:]
    out = torch.bmm(we.movedim(-3, 0).reshape(h, -1, length), values)  # one product per head over every row of it
    return out.reshape(h, *lead, q, values.shape[-1]).movedim(0, -3)


def vattention_attention(logits: torch.Tensor, values: torch.Tensor, deterministic: torch.Tensor,
                         counts: torch.Tensor, b: torch.Tensor) -> VAttentionEstimate:
    """ô and D̂ (and the HT variant) from the draws ``counts`` [..., Q, L] of ``b`` [..., Q] draws.

    ``logits`` [..., Q, L] (−inf where a key is not visible) and ``deterministic`` (bool, visible keys only count)
    broadcast against ``counts``' leading dims (the draws of one query share them: computed once); ``values`` [L, D],
    or [H, L, D] with rows [..., H, Q, L].
    """
    f64 = torch.float64
    logits = logits.to(f64)
    visible = torch.isfinite(logits)
    e = torch.exp(logits - logits.amax(-1, keepdim=True)).masked_fill(~visible, 0.0)
    det = deterministic & visible
    residual = visible & ~det
    n = residual.sum(-1).to(f64)
    d_det = torch.where(det, e, 0.0)
    n, b = torch.broadcast_tensors(n, torch.as_tensor(b, device=logits.device).to(f64))
    b = torch.where(n > 0, b, torch.zeros_like(b))
    counts = counts.to(f64).masked_fill(~residual, 0.0)
    v = values.to(f64)
    scale = torch.where(b > 0, n / b.clamp(min=1), torch.zeros_like(n))
    ce = counts * e  # the drawn e_i, with multiplicity
    base_den, base_num = d_det.sum(-1), _weighted_sum(d_det, v)  # the deterministic part, once per query
    den = base_den + ce.sum(-1) * scale
    out = (base_num + _weighted_sum(ce, v) * scale.unsqueeze(-1)) / den.unsqueeze(-1)
    pi = ht_inclusion(n, b).to(logits.device)
    inv = torch.where(b > 0, 1.0 / pi.clamp(min=1e-300), torch.zeros_like(pi))
    de = torch.where(counts > 0, e, 0.0)  # the distinct drawn e_i
    den_ht = base_den + de.sum(-1) * inv
    out_ht = (base_num + _weighted_sum(de, v) * inv.unsqueeze(-1)) / den_ht.unsqueeze(-1)
    s1 = ce.sum(-1)
    s2 = (ce * e).sum(-1)
    var = (s2 - s1 * s1 / b.clamp(min=1)) / (b - 1).clamp(min=1)
    sigma = torch.where(b >= 2, var.clamp(min=0).sqrt(), torch.full_like(var, float("nan")))
    return VAttentionEstimate(out, den, out_ht, den_ht, sigma, n, b, e.sum(-1).expand(b.shape))


def denominator_bound(estimate: VAttentionEstimate, delta: float, two_sided: bool = False) -> torch.Tensor:
    """The (ε, δ) statement's absolute half-width on the denominator: ε·D̂ = Φ⁻¹(1 − δ)·σ̂·n/√b, the CLT interval
    D̂ ± ε·D̂ the budget rule sizes (the rule's allowance is ε·D̂; the replay scores the relative form
    |D̂ − D|/D ≤ ε, the same to first order)."""
    return estimate.epsilon(delta, two_sided) * estimate.denominator
