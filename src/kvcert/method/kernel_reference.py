"""Float64 torch reference for :func:`kvcert_kernels.certified_decode` (the kernel tests and
``kvcert bench kernel``'s spot check compare with it; it lives in kvcert so that the kernels
package imports nothing of kvcert).

A thin layer over :func:`kvcert.method.certificate.certificate_reference` (the library's
two-pass definition of ô, V̂ and b̂_c) that adds what the kernel's interface has and
that function lacks: grouped-query heads, per-head lengths, padding slots whose keys and
values may hold anything, the log-sum-exp, and the convention for a head with no valid
slot (output 0, lse −inf, V̂ = b̂_c = 0).
"""

from __future__ import annotations

import torch

from .certificate import certificate_reference


def _valid_inputs(query, key, value, log_pi, lengths):
    """Float64 (q [B, Hq, D], k, v [B, Hkv, L, D] zeroed on invalid slots — v None without a value —,
    log π with +inf on invalid slots, valid [B, Hkv, L]): a slot is valid when its log π is finite
    and it lies below ``lengths``."""
    q = (query[:, :, 0] if query.ndim == 4 else query).to(torch.float64)
    bsz, hkv, seq_len = key.shape[0], key.shape[1], key.shape[2]
    k = key.to(torch.float64)
    lp = torch.zeros(bsz, hkv, seq_len, dtype=torch.float64) if log_pi is None else log_pi.to(torch.float64).cpu()
    lp = lp.to(k.device)
    valid = torch.isfinite(lp)
    if lengths is not None:
        valid &= torch.arange(seq_len, device=k.device) < lengths.to(k.device).unsqueeze(-1)
    lp = torch.where(valid, lp, torch.inf)
    k = torch.where(valid.unsqueeze(-1), k, 0.0)
    v = None if value is None else torch.where(valid.unsqueeze(-1), value.to(torch.float64), 0.0)
    return q, k, v, lp, valid


def _grouped_logits(q, k, lp, scaling):
    """(queries grouped [B, Hkv, G, D], logits q·k·scale − log π [B, Hkv, G, L]; −inf on invalid slots)."""
    bsz, hq, d = q.shape
    qg = q.reshape(bsz, k.shape[1], hq // k.shape[1], d)
    return qg, qg @ k.transpose(-1, -2) * scaling - lp.unsqueeze(-2)


def _decode(q, k, v, lp, valid, centre, scaling):
    """Grouped float64 (output [B, Hkv, G, Dv], lse, V̂, b̂_c [B, Hkv, G], logits) of prepared inputs."""
    qg, logits = _grouped_logits(q, k, lp, scaling)
    c = None if centre is None else centre.to(torch.float64)
    ref = certificate_reference(qg, k, v, lp, scaling, centre=c)
    empty = ~valid.any(-1, keepdim=True).expand(logits.shape[:3])
    output = torch.where(empty.unsqueeze(-1), 0.0, ref.output)
    variance = torch.where(empty, 0.0, ref.variance)
    range_term = torch.where(empty, 0.0, ref.range_bound)
    lse = torch.where(empty, -torch.inf, torch.logsumexp(logits, dim=-1))
    return output, lse, variance, range_term, logits


def decode_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    log_pi: torch.Tensor | None,
    centre: torch.Tensor | None,
    scaling: float,
    lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output [B, Hq, D], lse, V̂, b̂_c [B, Hq]) in float64; layouts as the kernel's."""
    q, k, v, lp, valid = _valid_inputs(query, key, value, log_pi, lengths)
    output, lse, variance, range_term, _ = _decode(q, k, v, lp, valid, centre, scaling)
    bsz, hq = q.shape[:2]
    return (
        output.reshape(bsz, hq, -1),
        lse.reshape(bsz, hq),
        variance.reshape(bsz, hq),
        range_term.reshape(bsz, hq),
    )


def variance_scale(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    log_pi: torch.Tensor | None,
    centre: torch.Tensor | None,
    scaling: float,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """S = Σ (1 − π_i) w_i² (‖v_i − c‖² + ‖ô − c‖²) [B, Hq], float64.

    The size of the terms the one-pass formula V̂ = (C − 2 B·(ô − c) + A‖ô − c‖²)/l²
    cancels, hence the scale at which its fp32 rounding acts: the natural denominator of
    V̂'s error where V̂ itself is (near) 0, e.g. for a head whose only tail token is
    also its only token.
    """
    q, k, v, lp, valid = _valid_inputs(query, key, value, log_pi, lengths)
    out, _, _, _, logits = _decode(q, k, v, lp, valid, centre, scaling)
    bsz, hq = q.shape[:2]
    c = torch.zeros(bsz, k.shape[1], v.shape[-1], dtype=torch.float64, device=k.device) if centre is None else centre.to(torch.float64)
    w = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    one_minus = (-torch.expm1(lp)).clamp(min=0).unsqueeze(-2)
    dev2 = (v - c.unsqueeze(-2)).pow(2).sum(-1).unsqueeze(-2)
    out2 = (out - c.unsqueeze(-2)).pow(2).sum(-1, keepdim=True)
    return (one_minus * w.pow(2) * (dev2 + out2)).sum(-1).reshape(bsz, hq)


def sketch_reference(query: torch.Tensor, sketch, centre: torch.Tensor, scaling: float,
                     ref: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 shadow terms (Σ t_j, max t_j) [B, Hq] of an eviction sketch, from :func:`decode_reference`'s
    output and lse (``ref``); a head with no valid slot (lse −inf) gets 0, as the kernel."""
    from .sketch import sketch_terms

    q = (query[:, :, 0] if query.ndim == 4 else query).to(torch.float64)
    out, lse = ref[0].to(torch.float64), ref[1].to(torch.float64)
    group = q.shape[1] // centre.shape[1]
    c = centre.to(torch.float64).repeat_interleave(group, dim=1)
    out_dev = torch.linalg.vector_norm(out.to(c.device) - c, dim=-1)
    empty = torch.isneginf(lse)
    sv, sr = sketch_terms(q.unsqueeze(2), sketch, scaling, torch.where(empty, torch.inf, lse).unsqueeze(-1),
                          out_dev.unsqueeze(-1))
    return sv[..., 0], sr[..., 0]


def entropy_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    log_pi: torch.Tensor | None,
    scaling: float,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """H = −Σ p_i ln p_i [B, Hq], float64, p = softmax(q·k_i·scale − log π_i) over the valid slots
    (finite log π, below ``lengths``); 0 for a head with no valid slot."""
    q, k, _, lp, valid = _valid_inputs(query, key, None, log_pi, lengths)
    bsz, hq = q.shape[:2]
    _, z = _grouped_logits(q, k, lp, scaling)  # −inf on invalid slots
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    p = torch.exp(z - lse)
    h = (lse.squeeze(-1) - torch.where(p > 0, p * z, 0.0).sum(-1))
    empty = ~valid.any(-1, keepdim=True)
    return torch.where(empty, 0.0, h).reshape(bsz, hq)
