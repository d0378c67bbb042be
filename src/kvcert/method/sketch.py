"""The eviction sketch: what the robust certificate keeps of the evicted tokens.

The plug-in certificate (:mod:`kvcert.method.certificate`) sees only the retained tokens. Under a
later query — every decode step after the one that set π — the tokens that query weighs
may have been evicted: V̂ and b̂ then miss their share of the error, and no estimator
computable from the retained set can see it (docs/design.md §1; Theorem 1). The sketch keeps,
per (batch, KV head), a small record of the evicted tokens most at risk of being
attended later, so that their part of the error is bounded under *any* later query.

**Selection (the drift potential).** At eviction, every evicted token j gets the
potential

    ψ_j = max_w [ log a_wj + κ · scale · ‖q_w‖ · ‖k_j − k̄‖ / √d ],   log a_wj = s_wj − log Σ_i e^{s_wi},

the largest log attention weight any query w of the observation window (the last
``POTENTIAL_WINDOW`` prompt queries of the KV head's query heads; s_wj = scale · q_w·k_j,
normalised over the keys the query sees) gives it, plus an allowance for a later query that
has drifted from q_w: for a drift δq of the size of q_w in a random direction, δq·(k_j − k̄)
has standard deviation ‖q_w‖‖k_j − k̄‖/√d, and κ = ``DRIFT`` standard deviations of it are
added (k̄ = the mean key of the segment). The weight, not the raw logit, is what the shadow
term bounds (e^{s_j − log Z}), and it puts the query heads of a KV head on one scale: raw
logits let the head with the larger logits take every slot. Decoding moves forward — copy
and induction heads attend, step after step, to the successors of what they attended to — so
a token also inherits the potential of its ``SUCCESSOR_HORIZON`` predecessors, less
``SUCCESSOR_PENALTY`` nats: ψ̃_j = max(ψ_j, max_{1≤i≤H} ψ_{j−i} − γ) (:func:`sketch_potential`).
The r evicted tokens of largest ψ̃ form the *shadow* (r from the memory budget,
:func:`shadow_count`). κ, H and γ were chosen on the synthetic harness of
``kvcert bench coverage`` and on embedded-model prompts outside the pre-registered seeds;
the normalisation and the window (the last 4 queries: later queries resemble the latest
ones) on replays of training-range seeds (preregistration/claims.yaml, robust_certificate).

**What is stored per shadow token** (:class:`EvictionSketch`): its key quantised to int8
(symmetric, one fp32 scale per token: k̃_j = scale_j · codes_j), the exact quantisation
error e_j = ‖k_j − k̃_j‖, the value deviation d_j ≥ ‖v_j − c‖ from the layer's value centre
c, and ψ_j (to merge later compaction rounds). d + 16 bytes per shadow token.

**Use at decode** (:func:`sketch_terms`). For a query q with Hájek state (running max m of
the biased logits, l = Σ_S e^{s_i − log π_i − m}, ô), every shadow token's logit is bounded
by Cauchy–Schwarz, U_j = scale · (q·k̃_j + ‖q‖ e_j) ≥ s_j, so its evicted summand of the
linearised error, e^{s_j}‖v_j − o‖ / Z ≈ e^{s_j}‖v_j − ô‖ / Ẑ, is at most

    t_j = e^{U_j − m} · (d_j + ‖ô − c‖) / l .

A shadow token is evicted, so its summand is not random given the sample: it is a known
part of the error, bounded under any query. The robust certificate
(:func:`kvcert.method.certificate.robust_radius`) therefore adds Σ_j t_j to the plug-in radius
(triangle inequality) and floors the result at the output's resolution u·‖ô‖; max_j t_j is
returned too (the largest single evicted summand, a diagnostic). Evicted tokens outside the
shadow are left to the plug-in's Horvitz–Thompson logic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: sketch memory as a fraction of the *uncompressed* cache's key + value bytes: 0.5 %, i.e.
#: 2 % of a cache compressed to 25 %
SKETCH_FRACTION = 0.005
#: κ, the drift allowance of the potential (standard deviations of a random drift of ‖q‖)
DRIFT = 2.0
#: observation window of the potential: the last 4 prompt queries (later queries resemble the latest ones)
POTENTIAL_WINDOW = 4
#: H, how many predecessors a token inherits the potential of (decode steps moving forward)
SUCCESSOR_HORIZON = 8
#: γ, the nats a successor's inherited potential is lowered by
SUCCESSOR_PENALTY = 2.0
#: bytes per shadow token besides its int8 key: scale, key error, value deviation, potential (fp32)
SCALAR_BYTES = 16


#: the pre-registered parameters (``analysis_plan.robust_certificate``) this module implements
PLAN = {"sketch_fraction": SKETCH_FRACTION, "key_bits": 8, "drift": DRIFT, "window": POTENTIAL_WINDOW,
        "score": "log_attention_weight", "successor_horizon": SUCCESSOR_HORIZON,
        "successor_penalty": SUCCESSOR_PENALTY, "combination": "plugin_plus_shadow_sum", "floor": "unit_roundoff"}


def check_plan(section) -> None:
    """Refuse a pre-registered ``robust_certificate`` section that differs from what this module computes."""
    if not section:
        return
    for key, value in section.items():
        if key not in PLAN:
            raise ValueError(f"analysis_plan.robust_certificate.{key}: unknown; known: {', '.join(PLAN)}")
        same = value == PLAN[key] if isinstance(PLAN[key], str) else float(value) == float(PLAN[key])
        if not same:
            raise ValueError(f"analysis_plan.robust_certificate.{key}: {value} differs from kvcert.method.sketch's {PLAN[key]}; "
                             "the robust certificate is computed as kvcert.method.sketch states it (amend the plan or the code)")


def shadow_count(num_tokens: int, kv_bytes_per_token: int, key_dim: int, fraction: float = SKETCH_FRACTION) -> int:
    """r = ⌊fraction · N · (key + value bytes per token) / (d + 16)⌋: the shadow that fits the memory budget."""
    if fraction < 0:
        raise ValueError(f"fraction: must be >= 0, got {fraction}")
    return int(math.floor(fraction * num_tokens * kv_bytes_per_token / (key_dim + SCALAR_BYTES)))


@dataclass
class EvictionSketch:
    """Per (batch, KV head): the r shadow tokens (slots ≥ ``count`` are padding and never used).

    codes: int8 [B, Hkv, R, D]; scale, key_error, value_dev, potential: fp32 [B, Hkv, R];
    count: long [B, Hkv].
    """

    codes: torch.Tensor
    scale: torch.Tensor
    key_error: torch.Tensor
    value_dev: torch.Tensor
    potential: torch.Tensor
    count: torch.Tensor

    @property
    def slots(self) -> int:
        return self.codes.shape[-2]

    @property
    def valid(self) -> torch.Tensor:
        """Bool [B, Hkv, R]: real shadow tokens."""
        return torch.arange(self.slots, device=self.codes.device) < self.count.unsqueeze(-1)

    def keys(self, dtype=torch.float32) -> torch.Tensor:
        """Dequantised keys k̃ = scale · codes [B, Hkv, R, D]."""
        return self.codes.to(dtype) * self.scale.to(dtype).unsqueeze(-1)

    def nbytes(self) -> int:
        """Bytes of the shadow slots (int8 keys and four fp32 scalars each)."""
        b, h, r, d = self.codes.shape
        return b * h * r * (d + SCALAR_BYTES)

    def index_select(self, idx: torch.Tensor) -> "EvictionSketch":
        """The sketch of batch rows ``idx`` (beam reordering)."""
        return EvictionSketch(*(t.index_select(0, idx) for t in (self.codes, self.scale, self.key_error,
                                                                 self.value_dev, self.potential, self.count)))

    def recentre(self, shift: torch.Tensor) -> "EvictionSketch":
        """Value deviations after the centre moved by ``shift`` [B, Hkv] = ‖c_new − c_old‖ (triangle inequality)."""
        dev = torch.where(self.valid, self.value_dev + shift.to(self.value_dev.dtype).unsqueeze(-1), 0.0)
        return EvictionSketch(self.codes, self.scale, self.key_error, dev, self.potential, self.count)


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: codes = round(x / s), s = max|x| / 127; returns (codes, s, ‖x − s·codes‖).

    The error is computed in float64 from the dequantised row, so that U_j = scale·(q·k̃ + ‖q‖ e)
    bounds q·k for every q (Cauchy–Schwarz).
    """
    x64 = x.to(torch.float64)
    s = x64.abs().amax(-1) / 127.0
    safe = torch.where(s > 0, s, 1.0)
    codes = torch.round(x64 / safe.unsqueeze(-1)).clamp_(-127, 127)
    s32 = s.to(torch.float32)
    err = torch.linalg.vector_norm(x64 - codes * s32.to(torch.float64).unsqueeze(-1), dim=-1)
    # round the error up to fp32 so the stored bound is never below the float64 one
    err32 = err.to(torch.float32)
    err32 = torch.where(err32.to(torch.float64) < err, torch.nextafter(err32, torch.full_like(err32, math.inf)), err32)
    return codes.to(torch.int8), s32, err32


def drift_potential(window_queries: torch.Tensor, keys: torch.Tensor, scaling: float, drift: float = DRIFT,
                    context: torch.Tensor | None = None) -> torch.Tensor:
    """ψ [..., N] = max_w (log a_wj + κ scale ‖q_w‖ ‖k_j − k̄‖/√d) (see the module docstring).

    window_queries [..., W, D] (the observation window of every query head of the KV head,
    flattened), keys [..., N, D] (the tokens to score), context [..., M, D] the keys each
    window query attends over, whose log-sum-exp normalises its logits (default: ``keys``).
    Float32 at least.
    """
    dtype = torch.promote_types(keys.dtype, torch.float32)
    q = window_queries.to(dtype) * scaling
    k = keys.to(dtype)
    spread = torch.linalg.vector_norm(k - k.mean(-2, keepdim=True), dim=-1)  # ‖k_j − k̄‖ [..., N]
    logits = q @ k.transpose(-1, -2)  # [..., W, N]
    full = logits if context is None else q @ context.to(dtype).transpose(-1, -2)
    logits = logits - torch.logsumexp(full, -1, keepdim=True)  # log attention weights
    qn = torch.linalg.vector_norm(q, dim=-1, keepdim=True)  # [..., W, 1]
    return (logits + (drift / math.sqrt(k.shape[-1])) * qn * spread.unsqueeze(-2)).amax(-2)


def sketch_potential(window_queries: torch.Tensor, keys: torch.Tensor, scaling: float,
                     context: torch.Tensor | None = None) -> torch.Tensor:
    """ψ̃ [..., N]: the drift potential with the successor allowance — the eviction sketch's selection score.

    window_queries [..., W, D], keys [..., N, D] in position order, context as for
    :func:`drift_potential` (see the module docstring).
    """
    return successor_potential(drift_potential(window_queries, keys, scaling, context=context), SUCCESSOR_HORIZON,
                               SUCCESSOR_PENALTY)


def successor_potential(potential: torch.Tensor, horizon: int, penalty: float) -> torch.Tensor:
    """ψ̃_j = max(ψ_j, max_{1≤i≤horizon} ψ_{j−i} − penalty) along the last (position) axis."""
    out = potential.clone()
    for i in range(1, min(int(horizon), potential.shape[-1] - 1) + 1):
        out[..., i:] = torch.maximum(out[..., i:], potential[..., :-i] - penalty)
    return out


def select_shadow(potential: torch.Tensor, candidates: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (up to) r candidates of largest potential per row: (indices [..., r], count [...]).

    potential [..., N], candidates bool [..., N]; indices of rows with fewer candidates are
    padded (their count says how many are real), real ones come first.
    """
    n = potential.shape[-1]
    r = max(0, min(int(r), n))
    score = torch.where(candidates, potential.to(torch.float32), float("-inf"))
    top = score.topk(r, dim=-1) if r else None
    count = candidates.sum(-1).clamp(max=r)
    if top is None:
        return torch.zeros(*potential.shape[:-1], 0, dtype=torch.long, device=potential.device), count
    return top.indices, count


def build_sketch(
    keys: torch.Tensor, values: torch.Tensor, evicted: torch.Tensor, potential: torch.Tensor, centre: torch.Tensor,
    r: int, previous: EvictionSketch | None = None,
) -> EvictionSketch:
    """The sketch after an eviction: the r tokens of largest potential among ``evicted`` (and ``previous``'s shadow).

    keys, values [B, H, N, D] (the tokens the eviction decided on), evicted bool [B, H, N],
    potential [B, H, N], centre [B, H, Dv] (the layer's value centre after the eviction).
    A previous sketch (an earlier compaction round) competes slot for slot by potential;
    its value deviations must already refer to ``centre`` (:meth:`EvictionSketch.recentre`).
    """
    b, h, n, d = keys.shape
    idx, count = select_shadow(potential, evicted, r)
    k_sel = keys.gather(2, idx.unsqueeze(-1).expand(-1, -1, -1, d))
    v_sel = values.gather(2, idx.unsqueeze(-1).expand(-1, -1, -1, values.shape[-1]))
    codes, scale, err = quantize_int8(k_sel)
    dev = torch.linalg.vector_norm(v_sel.to(torch.float64) - centre.to(torch.float64).unsqueeze(-2), dim=-1)
    dev32 = dev.to(torch.float32)
    dev32 = torch.where(dev32.to(torch.float64) < dev, torch.nextafter(dev32, torch.full_like(dev32, math.inf)), dev32)
    pot = potential.gather(-1, idx).to(torch.float32)
    valid = torch.arange(idx.shape[-1], device=keys.device) < count.unsqueeze(-1)
    new = EvictionSketch(codes, scale, err, torch.where(valid, dev32, 0.0), torch.where(valid, pot, float("-inf")),
                         count)
    if previous is None or previous.slots == 0:
        return new
    return merge_sketches(previous, new, r)


def merge_sketches(a: EvictionSketch, b: EvictionSketch, r: int) -> EvictionSketch:
    """Keep the r shadow tokens of largest potential of two sketches (same batch and heads)."""
    cat = [torch.cat([x, y], 2) for x, y in ((a.codes, b.codes), (a.scale, b.scale), (a.key_error, b.key_error),
                                            (a.value_dev, b.value_dev), (a.potential, b.potential))]
    valid = torch.cat([a.valid, b.valid], 2)
    idx, count = select_shadow(cat[4], valid, r)
    g = lambda t: t.gather(2, idx)  # noqa: E731
    codes = cat[0].gather(2, idx.unsqueeze(-1).expand(-1, -1, -1, cat[0].shape[-1]))
    keep = torch.arange(idx.shape[-1], device=idx.device) < count.unsqueeze(-1)
    return EvictionSketch(codes, g(cat[1]), g(cat[2]), torch.where(keep, g(cat[3]), 0.0),
                          torch.where(keep, g(cat[4]), float("-inf")), count)


def sketch_terms(
    query: torch.Tensor, sketch: EvictionSketch, scaling: float, lse: torch.Tensor, out_dev: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ_j t_j, max_j t_j) per query, t_j = e^{U_j − lse} (d_j + ‖ô − c‖), U_j = scale (q·k̃_j + ‖q‖ e_j).

    query [B, Hq, Q, D] (unscaled), lse = m + log l of the biased logits [B, Hq, Q]
    (e^{U − m}/l = e^{U − lse}), out_dev = ‖ô − c‖ [B, Hq, Q]. Computed in the dtype of
    ``lse`` (float64 gives the reference). Padding slots contribute 0.
    """
    dtype = lse.dtype
    b, hq, nq, d = query.shape
    hkv = sketch.codes.shape[1]
    g = hq // hkv
    q = query.to(dtype).reshape(b, hkv, g * nq, d) * scaling
    # q·k̃_j = (q·codes_j)·scale_j: the int8 codes are read once, the scale applied per slot
    u = torch.matmul(q, sketch.codes.to(dtype).transpose(-1, -2)).mul_(sketch.scale.to(dtype).unsqueeze(-2))
    u.addcmul_(torch.linalg.vector_norm(q, dim=-1, keepdim=True), sketch.key_error.to(dtype).unsqueeze(-2))
    u.sub_(lse.reshape(b, hkv, g * nq, 1)).exp_()
    dev = sketch.value_dev.to(dtype).unsqueeze(-2) + out_dev.to(dtype).reshape(b, hkv, g * nq, 1)
    t = torch.where(sketch.valid.unsqueeze(-2), u.mul_(dev), 0.0)  # padding slots: 0 even where e^{U − lse} overflows
    if t.shape[-1] == 0:
        zero = torch.zeros(b, hq, nq, dtype=dtype, device=query.device)
        return zero, zero.clone()
    return t.sum(-1).reshape(b, hq, nq), t.amax(-1).reshape(b, hq, nq)
