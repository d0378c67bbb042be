"""The one-pass certificate in torch: the algorithm the fused decode kernel runs, a test oracle
(tests/test_certificate.py checks it against :func:`kvcert.method.certificate.certificate_reference`)."""

from __future__ import annotations

import torch


class OnlineCertificate:
    """One-pass (online-softmax) accumulators for ô, V̂ and b̂_c over key blocks.

    The state per query is (m, l, acc, A, B, C, M0, M1) on values centred at ``centre``;
    :meth:`update` folds in one block of keys, :meth:`merge` combines two partial states
    (split-K): with m = max(m₁, m₂) and ω_j = e^{m_j − m}, first moments scale by ω_j and
    second moments (A, B, C) by ω_j². This is the algorithm the fused kernel
    (``kernels/kvcert_kernels/certified_decode.py``) runs; here it is written in torch, a test oracle and
    executable documentation (the library computes the certificate with
    :func:`kvcert.method.attention.hajek_attention`).
    """

    def __init__(self, lead_shape: tuple[int, ...], dim: int, centre: torch.Tensor | None = None, dtype=None):
        device = centre.device if centre is not None else None
        if dtype is None:
            dtype = centre.dtype if centre is not None else torch.float32
        self.centre = torch.zeros(*lead_shape, dim, dtype=dtype, device=device) if centre is None else centre.to(dtype)
        self.m = torch.full(lead_shape, float("-inf"), dtype=dtype, device=device)
        self.l = torch.zeros(lead_shape, dtype=dtype, device=device)
        self.acc = torch.zeros(*lead_shape, dim, dtype=dtype, device=device)
        self.a = torch.zeros(lead_shape, dtype=dtype, device=device)
        self.b = torch.zeros(*lead_shape, dim, dtype=dtype, device=device)
        self.c = torch.zeros(lead_shape, dtype=dtype, device=device)
        self.m0 = torch.zeros(lead_shape, dtype=dtype, device=device)
        self.m1 = torch.zeros(lead_shape, dtype=dtype, device=device)

    def update(self, logits: torch.Tensor, log_pi: torch.Tensor, values: torch.Tensor) -> None:
        """Fold in a block: logits [..., n] (already q·k·scale), log_pi [..., n], values [..., n, D]."""
        s = logits.to(self.m.dtype) - log_pi.to(self.m.dtype)
        m_new = torch.maximum(self.m, s.amax(-1))
        finite = torch.isfinite(m_new)
        alpha = torch.where(finite, torch.exp(self.m - torch.where(finite, m_new, 0)), torch.zeros_like(m_new))
        p = torch.where(finite.unsqueeze(-1), torch.exp(s - torch.where(finite, m_new, 0).unsqueeze(-1)), 0)
        one_minus = (-torch.expm1(log_pi.to(self.m.dtype))).clamp(min=0)
        vc = values.to(self.m.dtype) - self.centre.unsqueeze(-2)
        sq = vc.pow(2).sum(-1)
        r = one_minus * p * p
        self.l = self.l * alpha + p.sum(-1)
        self.acc = self.acc * alpha.unsqueeze(-1) + (p.unsqueeze(-2) @ vc).squeeze(-2)
        a2 = alpha * alpha
        self.a = self.a * a2 + r.sum(-1)
        self.b = self.b * a2.unsqueeze(-1) + (r.unsqueeze(-2) @ vc).squeeze(-2)
        self.c = self.c * a2 + (r * sq).sum(-1)
        self.m0 = torch.maximum(self.m0 * alpha, (one_minus * p).amax(-1))
        self.m1 = torch.maximum(self.m1 * alpha, (one_minus * p * sq.sqrt()).amax(-1))
        self.m = m_new

    def merge(self, other: "OnlineCertificate") -> None:
        """Combine with another partial state over a disjoint block of keys (split-K)."""
        m_new = torch.maximum(self.m, other.m)
        safe = torch.where(torch.isfinite(m_new), m_new, 0)
        w1 = torch.where(torch.isfinite(self.m), torch.exp(self.m - safe), 0)
        w2 = torch.where(torch.isfinite(other.m), torch.exp(other.m - safe), 0)
        self.l = self.l * w1 + other.l * w2
        self.acc = self.acc * w1.unsqueeze(-1) + other.acc * w2.unsqueeze(-1)
        self.a = self.a * w1 * w1 + other.a * w2 * w2
        self.b = self.b * (w1 * w1).unsqueeze(-1) + other.b * (w2 * w2).unsqueeze(-1)
        self.c = self.c * w1 * w1 + other.c * w2 * w2
        self.m0 = torch.maximum(self.m0 * w1, other.m0 * w2)
        self.m1 = torch.maximum(self.m1 * w1, other.m1 * w2)
        self.m = m_new

    def finalize(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ô, V̂, b̂_c, log-sum-exp of the biased logits)."""
        out_c = self.acc / self.l.unsqueeze(-1)
        variance = (self.c - 2.0 * (self.b * out_c).sum(-1) + self.a * out_c.pow(2).sum(-1)) / self.l.pow(2)
        range_bound = (self.m1 + self.m0 * torch.linalg.vector_norm(out_c, dim=-1)) / self.l
        return out_c + self.centre, variance.clamp(min=0), range_bound, self.m + torch.log(self.l)
