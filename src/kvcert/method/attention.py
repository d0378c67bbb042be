"""Hájek-corrected attention over a retained (compacted) KV cache, with its certificate.

Attention over the retained set S with logits s_i − log π_i is exactly the Hájek ratio
estimator ô = Σ_S (e^{s_i}/π_i) v_i / Σ_S e^{s_i}/π_i (Xie, arXiv 2607.21475; docs/design.md
§1): the per-key bias −log π_i is the whole correction. This module computes it for
grouped-query attention without repeating keys (query heads are grouped per KV head),
and, when asked, the certificate's variance V̂ and range term b̂_c in the same pass
(see :mod:`kvcert.method.certificate` for the formulas) — with an eviction sketch
(:mod:`kvcert.method.sketch`) also the robust certificate's shadow terms Σ t_j and max t_j.

Layout: query [B, Hq, Q, D]; key/value [B, Hkv, L, D]; log_pi [B, Hkv, L] (fp32; 0 for
certain tokens, +inf on padding). With ``causal=True`` the last Q keys are the queries'
own tokens (appended to the cache just before): query i sees keys j ≤ L − Q + i, and
every older (retained) key.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .certificate import bernstein_radius, robust_radius, unit_roundoff
from ..checks import check_delta, check_finite, check_ndim
from .sketch import EvictionSketch, sketch_terms


@dataclass
class AttentionResult:
    """Output [B, Hq, Q, D]; with a certificate also V̂ and b̂_c [B, Hq, Q] (fp32), with a
    sketch the shadow terms Σ_j t_j and max_j t_j [B, Hq, Q], and when asked the entropy of
    each query's attention weights [B, Hq, Q] (fp32, nats; see :func:`hajek_attention`)."""

    output: torch.Tensor
    variance: torch.Tensor | None = None
    range_term: torch.Tensor | None = None
    shadow_sum: torch.Tensor | None = None
    shadow_range: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    #: with ``defer``: the sums of a decode step whose certificate :func:`combine_pending` computes later
    pending: "PendingCertificate | None" = None


@dataclass
class PendingCertificate:
    """A decode step's certificate sums, normalised by l (:func:`_certified_decode` with ``defer``), not yet
    combined, with the batch and KV heads in one leading dimension (B·Hkv): num = [ô; B̃] [B·Hkv, 2G, D];
    Ã, C̃ [B·Hkv, G]; m = [m0; m1] [B·Hkv, 2G] (the maxima of (1 − π) p̃ and of (1 − π) p̃ ‖v − c‖); centre
    [B, Hkv, D]; r̃ [B·Hkv, G, L] and the values [B, Hkv, L, D] for :func:`_variance`'s recomputation of a
    shaky row."""

    num: torch.Tensor
    a: torch.Tensor
    c_term: torch.Tensor
    m: torch.Tensor
    centre: torch.Tensor
    r: torch.Tensor
    value: torch.Tensor


def combine_pending(pending: list[PendingCertificate]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(V̂, b̂_c, ‖ô‖) [B, Hq, 1] of each pending decode step (:class:`PendingCertificate`), combined as
    :func:`_certified_decode` combines one (V̂ as :func:`_variance` does, in the sums' dtype), but with
    the steps of one forward's layers stacked: the combination is some twenty operations on [G]-sized
    arrays, each costing its dispatch on a CPU, so one forward pays them once instead of once per layer.
    Steps of different shapes or dtypes are combined apart."""
    results: list = [None] * len(pending)
    for idx, var, rng, norm in combine_pending_stacked(pending):
        for j, i in enumerate(idx):
            results[i] = (var[j], rng[j], norm[j])
    return results


def combine_pending_stacked(pending: list[PendingCertificate]) -> list[tuple[list[int], torch.Tensor, torch.Tensor,
                                                                             torch.Tensor]]:
    """:func:`combine_pending`'s results as they are computed: per group of steps of one shape and dtype, their
    indices in ``pending`` and V̂, b̂_c, ‖ô‖ stacked [n, B, Hq, 1] (what a recorder writes in one copy each)."""
    with torch.no_grad():  # a certificate is a measurement, never part of a graph
        return _combine_pending(pending)


def _combine_pending(pending: list[PendingCertificate]) -> list:
    out = []
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(pending):
        groups.setdefault((tuple(p.num.shape), tuple(p.centre.shape), p.num.dtype, p.num.device), []).append(i)
    for idx in groups.values():
        ps = [pending[i] for i in idx]
        n, (bh, rows, d), (b, hkv) = len(ps), ps[0].num.shape, ps[0].centre.shape[:2]
        group = rows // 2
        stack = torch.stack if n > 1 else (lambda ts: ts[0].unsqueeze(0))
        num, m = stack([p.num for p in ps]), stack([p.m for p in ps])  # [n, B·Hkv, 2G, D], [n, B·Hkv, 2G]
        a, c_term = stack([p.a for p in ps]).unsqueeze(-1), stack([p.c_term for p in ps]).unsqueeze(-1)
        centre = _as(stack([p.centre for p in ps]), num.dtype).reshape(n, bh, 1, d)
        out_, bv = num[..., :group, :], num[..., group:, :]
        out_c = out_ - centre
        out_dev = torch.linalg.vector_norm(out_c, dim=-1)
        size = c_term + a * torch.linalg.vecdot(out_c, out_c).unsqueeze(-1)
        var = size - 2.0 * torch.linalg.vecdot(bv - a * centre, out_c).unsqueeze(-1)
        shaky = (var < SHAKY_VARIANCE * size).flatten(1).any(1).tolist()
        var = var.clamp_(min=0)
        rng = m[..., group:] + m[..., :group] * out_dev
        norm = torch.linalg.vector_norm(out_, dim=-1)
        shape = (n, b, hkv * group, 1)
        var, rng, norm = var.reshape(shape), rng.reshape(shape), norm.reshape(shape)
        for j, p in enumerate(ps):
            if shaky[j]:  # a row of this step is shaky: the general combination, with its recomputation
                var[j] = _variance(c_term[j], bv[j], out_[j], a[j], None, centre[j], p.r,
                                   p.value.reshape(bh, -1, p.value.shape[-1]), combine=num.dtype).reshape(var[j].shape)
        out.append((idx, var, rng, norm))
    return out


def squared_deviation(value: torch.Tensor, centre: torch.Tensor | None) -> torch.Tensor:
    """‖v_i − c‖² per token [B, Hkv, L], fp32 (fp64 for fp64 values; c = 0 when ``centre`` is None)."""
    v = value.to(torch.promote_types(value.dtype, torch.float32))
    if centre is not None:
        v = v - centre.to(v.dtype).unsqueeze(-2)
    return v.pow(2).sum(-1)


def _causal_allowed(n_queries: int, q_start: int, q_total: int, length: int, device) -> torch.Tensor:
    """Bool [n_queries, L]: query (q_start + i) of q_total sees keys j ≤ L − q_total + q_start + i."""
    last = length - q_total + q_start + torch.arange(n_queries, device=device)
    return torch.arange(length, device=device).unsqueeze(0) <= last.unsqueeze(1)


_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_kernel_fn = None
_kernel_module = None
#: the fused kernel serves every device, not only CUDA (:func:`kernel_on_every_device`)
_KERNEL_EVERYWHERE = False


def _on_kernel_device(t: torch.Tensor) -> bool:
    """Whether the fused Triton decode kernel serves tensors on ``t``'s device (CUDA)."""
    return t.is_cuda or _KERNEL_EVERYWHERE


@contextlib.contextmanager
def kernel_on_every_device():
    """Take the fused kernel's path on any device (a CPU too): with ``kvcert_kernels.launch.emulating`` it is
    how ``kvcert bench host`` runs a GPU's host path on a CPU, and under ``TRITON_INTERPRET=1`` how the tests
    run the kernel path through the whole model."""
    global _KERNEL_EVERYWHERE
    previous, _KERNEL_EVERYWHERE = _KERNEL_EVERYWHERE, True
    try:
        yield
    finally:
        _KERNEL_EVERYWHERE = previous


def _decode_kernel():
    """``kvcert_kernels.certified_decode``, imported on first use (None if Triton is unusable)."""
    global _kernel_fn, _kernel_module
    if _kernel_fn is None:
        try:
            import importlib

            module = importlib.import_module("kvcert_kernels.certified_decode")
        except Exception as exc:  # noqa: BLE001 - any import failure means: use the torch path
            warnings.warn(f"kvcert: fused decode kernel unavailable ({exc}); using the torch path", stacklevel=3)
            _kernel_fn = False
        else:
            _kernel_fn, _kernel_module = module.certified_decode, module
    return _kernel_fn or None


def decode_kernel_module():
    """The module ``kvcert_kernels.certified_decode`` (its plans, :func:`decode_plan`), imported on first use."""
    _decode_kernel()
    return _kernel_module


def use_decode_kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, extra_mask) -> bool:
    """Dispatch rule: a decode step (one query per head, no extra mask) on a CUDA device.

    ``KVCERT_DECODE_KERNEL=0`` in the environment forces the torch path.
    """
    if not _on_kernel_device(query) or extra_mask is not None or query.shape[2] != 1 or key.shape[2] == 0:
        return False
    if query.dtype not in _KERNEL_DTYPES or key.dtype not in _KERNEL_DTYPES or key.dtype != value.dtype:
        return False
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
        return False
    if os.environ.get("KVCERT_DECODE_KERNEL", "1") == "0":
        return False
    return _decode_kernel() is not None


#: decode steps with a certificate take :func:`_certified_decode` (KVCERT_FAST_DECODE=0: the general path)
_FAST_DECODE = os.environ.get("KVCERT_FAST_DECODE", "1") != "0"

#: a one-pass V̂ that keeps less than this share of the terms it cancels is recomputed directly
SHAKY_VARIANCE = 1e-2


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype``, without a dispatch when it already is (a decode step makes dozens of these)."""
    return t if t.dtype == dtype else t.to(dtype)


def _variance(c_term, bv, out, a, l, centre, r, value, combine: torch.dtype = torch.float64) -> torch.Tensor:
    """V̂ = (C − 2 B_c·(ô − c) + A‖ô − c‖²)/l², clamped at 0, from the pass's sums (C = Σ r‖v − c‖²,
    bv = Σ r v, A = Σ r; [..., rows, 1] and [..., rows, D]; ``l`` None: sums already divided by l², as
    :func:`_certified_decode` makes them), combined in float64: the terms nearly
    cancel when the r-weighted values sit far from c, and fp32 here would add its rounding,
    amplified by that cancellation, to the sums' own.

    Where V̂ keeps less than :data:`SHAKY_VARIANCE` of C + A‖ô − c‖² (the r-weight sits on
    values next to ô, e.g. one tail token holding the attention: V̂ ≈ 0 beside a large
    range term) even exact sums leave it at the fp32 rounding of those terms, u·S, and the
    radius's √V̂ at √u relative: those rows (r [..., rows, L], value [..., L, D]) get
    Σ r_i ‖v_i − ô‖² / l² directly, a second pass over their values only.

    ``combine``: the dtype of the combination. A decode step on the torch path
    (:func:`_certified_decode`) combines in fp32: a row it keeps holds V̂ ≥ 10⁻² (C + A‖ô − c‖²),
    so fp32 adds at most 10² u ≈ 1.2·10⁻⁵ of V̂, below the sums' own rounding and the tests'
    tolerance; the shaky rows are recomputed in float64 either way."""
    f64 = combine
    centre, out64, a = _as(centre, f64), _as(out, f64), _as(a, f64)
    out_c = out64 - centre
    b_c = _as(bv, f64) - a * centre
    size = _as(c_term, f64) + a * torch.linalg.vecdot(out_c, out_c).unsqueeze(-1)
    var = size - 2.0 * torch.linalg.vecdot(b_c, out_c).unsqueeze(-1)
    shaky = (var < SHAKY_VARIANCE * size).squeeze(-1).nonzero(as_tuple=True)
    if shaky[0].numel():
        step = max(1, (1 << 24) // max(1, value.shape[-2] * value.shape[-1]))  # bound the [n, L, D] deviations
        for i in range(0, shaky[0].numel(), step):
            idx = tuple(t[i : i + step] for t in shaky)
            dev2 = (value[idx[:-1]].to(out.dtype) - out[idx].unsqueeze(-2)).pow(2).sum(-1)
            var[idx] = (r[idx].to(torch.float64) * dev2.to(torch.float64)).sum(-1, keepdim=True).to(f64)
    if l is not None:
        l = _as(l, f64)
        var = var / (l * l)
    return var.clamp_(min=0)


def _certified_decode(query, key, value, log_pi, one_minus, dev, centre, scaling, acc_dtype, sketch,
                      defer: bool = False, entropy: bool = False) -> AttentionResult:
    """One query per head with the certificate (a decode step over a cache with a sampled tail), in as
    few tensor operations as the certificate allows — on a CPU a decode step's attention is a few dozen
    small operations beside its two products, and their count, not their arithmetic, is its cost. The
    general path's sums (module docstring), normalised by l: with the weights p̃ = softmax(z) =
    e^{z − m}/l (one fused kernel for the max, exponential, sum and division) and r̃ = (1 − π) p̃² = r/l²,
    one product [p̃; r̃]·V gives ô and B̃ = B/l², and Ã = Σ r̃, C̃ = Σ r̃ ‖v − c‖² are A/l², C/l², so V̂ =
    C̃ − 2 B̃_c·(ô − c) + Ã ‖ô − c‖² (:func:`_variance` with l = 1) and b̂_c = max (1 − π) p̃ ‖v − c‖ +
    max (1 − π) p̃ · ‖ô − c‖ need no division. The scaling rides on the logits' product
    (z = scaling · q·K − log π, one ``baddbmm``). query [B, Hq, 1, D] unscaled; log_pi / one_minus / dev
    [B, Hkv, L]; batch and KV heads are one leading dimension throughout (B·Hkv).

    ``defer`` (without a sketch): return the output with the sums (``pending``) instead of V̂ and b̂_c, for
    :func:`combine_pending` to combine with the other layers' of the same forward. ``entropy``: also the
    entropy of the weights, H = −Σ_j p̃_j log p̃_j, the general path's log l − Σ_j p_j (z_j − m) / l."""
    b, hq, _, d = query.shape
    hkv, length = key.shape[1], key.shape[2]
    group, bh = hq // hkv, b * hkv
    q3, kt = query.reshape(bh, group, d), key.reshape(bh, length, d).transpose(1, 2)
    if key.dtype == acc_dtype and log_pi.dtype == acc_dtype and query.dtype == acc_dtype:
        z = torch.baddbmm(log_pi.reshape(bh, 1, length), q3, kt, beta=-1, alpha=scaling)
    else:
        z = _as(torch.bmm(q3 * scaling, kt), acc_dtype)  # [B·Hkv, G, L]
        z.sub_(_as(log_pi, acc_dtype).reshape(bh, 1, length))
    p = torch.softmax(z, -1)
    buf = p.new_empty(bh, 4 * group, length)  # [p̃; r̃] for the one product, then [(1 − π) p̃; (1 − π) p̃ ‖v − c‖]
    pr, w = buf.narrow(1, 0, 2 * group), buf.narrow(1, 2 * group, 2 * group)  # (narrow: cheaper than indexing)
    r, wp, wpd = pr.narrow(1, group, group), w.narrow(1, 0, group), w.narrow(1, group, group)
    torch.mul(p, _as(one_minus, acc_dtype).reshape(bh, 1, length), out=wp)
    torch.mul(wp, p, out=r)
    pr.narrow(1, 0, group).copy_(p)
    num = _as(torch.bmm(_as(pr, value.dtype), value.reshape(bh, length, -1)), acc_dtype)  # [ô; B̃]
    dv = _as(dev, acc_dtype).reshape(bh, 1, length)
    torch.mul(wp, dv, out=wpd)
    m = w.amax(-1)  # [max (1 − π) p̃; max (1 − π) p̃ ‖v − c‖]
    a = r.sum(-1)
    c_term = torch.linalg.vecdot(wpd, p * dv)  # Σ r̃ ‖v − c‖²
    out = num.narrow(1, 0, group)
    output = (out if query.dtype == acc_dtype else out.to(query.dtype)).reshape(b, hq, 1, -1)
    ent = None
    if entropy:
        ent = torch.special.xlogy(p, p).sum(-1).neg_().to(torch.float32).reshape(b, hq, 1)
    if defer and sketch is None:
        return AttentionResult(output, entropy=ent, pending=PendingCertificate(num, a, c_term, m, centre, r, value))
    centre3 = _as(centre, acc_dtype).reshape(bh, 1, -1)
    out_dev = torch.linalg.vector_norm(out - centre3, dim=-1)
    var = _variance(c_term.unsqueeze(-1), num[:, group:], out, a.unsqueeze(-1), None, centre3, r,
                    value.reshape(bh, length, -1), combine=acc_dtype)
    rng = m[:, group:] + m[:, :group] * out_dev
    variance, range_term = var.reshape(b, hq, 1), rng.reshape(b, hq, 1)
    if sketch is None:
        return AttentionResult(output, variance, range_term, entropy=ent)
    # lse = m − log max p̃ (the largest weight is e^{m − lse}): the sketch's normaliser without a second pass
    lse = (z.amax(-1) - torch.log(p.amax(-1))).reshape(b, hq, 1)
    sv, sr = sketch_terms((query * scaling).to(acc_dtype), sketch, 1.0, lse, out_dev.reshape(b, hq, 1))
    return AttentionResult(output, variance, range_term, sv, sr, entropy=ent)


def _plain_decode(qc, key, value, acc_dtype, entropy: bool, out_dtype) -> AttentionResult:
    """One query per head over keys that are all certain and all visible (a top-k cache's decode
    step, asked for its entropy): p = e^{z − lse}, ô = p·V and H = lse − Σ_j p_j z_j with
    lse = log Σ_j e^{z_j} — a fused logsumexp instead of the general path's separate max, shift,
    exp and sum (every z_j is finite here, so the dot product needs no masking)."""
    b, hkv, group, _ = qc.shape
    z = torch.matmul(qc, key.transpose(-1, -2)).to(acc_dtype)  # [B, Hkv, group, L]
    lse = torch.logsumexp(z, -1, keepdim=True)
    p = torch.exp(z - lse)
    out = torch.matmul(p.to(value.dtype), value).to(out_dtype).reshape(b, hkv * group, 1, -1)
    if not entropy:
        return AttentionResult(out)
    ent = (lse.squeeze(-1) - torch.linalg.vecdot(p, z)).to(torch.float32).reshape(b, hkv * group, 1)
    return AttentionResult(out, entropy=ent)


def hajek_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    log_pi: torch.Tensor | None,
    scaling: float,
    *,
    causal: bool = True,
    certificate: bool = False,
    sq_dev: torch.Tensor | None = None,
    centre: torch.Tensor | None = None,
    extra_mask: torch.Tensor | None = None,
    query_block: int = 256,
    one_minus: torch.Tensor | None = None,
    dev: torch.Tensor | None = None,
    sketch: EvictionSketch | None = None,
    entropy: bool = False,
    defer: bool = False,
) -> AttentionResult:
    """Grouped Hájek attention (and optionally V̂, b̂_c); see the module docstring for layouts.

    Certificate inputs a cache can keep per token so no extra pass is needed: one_minus
    [B, Hkv, L] = 1 − π_i (from log_pi when None), dev [B, Hkv, L] = ‖v_i − c‖ (or
    sq_dev = its square; computed from the values when both are None); centre [B, Hkv, D].
    extra_mask: an additive float or boolean mask broadcastable to [B, Hq, Q, L].
    Queries are processed in blocks of ``query_block`` to bound memory. A decode step on a
    CUDA device runs the fused Triton kernel instead (:func:`use_decode_kernel`); it
    recomputes ‖v_i − c‖ from the values, so ``sq_dev`` is not read there. ``sketch``
    (with ``certificate``): the eviction sketch of this layer; its shadow terms are returned
    too (:func:`kvcert.method.sketch.sketch_terms`). ``entropy``: also return the Shannon entropy of
    the attention weights each query uses, H = −Σ_j p_j log p_j with p = softmax(s − log π)
    over the keys it sees (padding excluded) — the H2O-style cache-side comparison signal —
    computed in the same pass as H = log l − Σ_j e^{z_j − m} (z_j − m) / l (z = s − log π,
    m = max_j z_j, l = Σ_j e^{z_j − m}); on the kernel path, the kernel's. ``defer``: a decode step of the
    torch path without a sketch may return its certificate's sums (``pending``, V̂ and b̂_c None) for
    :func:`combine_pending`.
    """
    use_sketch = certificate and sketch is not None
    if use_decode_kernel(query, key, value, extra_mask):
        res = _decode_kernel()(
            query, key, value, log_pi, centre if certificate else None, scaling, certificate=certificate,
            sketch=sketch if use_sketch else None, entropy=entropy,
        )
        ent, res = (res[-1], res[:-1]) if entropy else (None, res)  # the kernel appends the entropy last
        return AttentionResult(res[0], *res[2:], entropy=ent)
    b, hq, n_q, d = query.shape
    hkv, length, dv = key.shape[1], key.shape[2], value.shape[-1]
    if hq % hkv:
        raise ValueError(f"query: {hq} query heads are not a multiple of {hkv} KV heads")
    group = hq // hkv
    acc_dtype = torch.promote_types(query.dtype, torch.float32)  # fp32 accumulation, fp64 if given fp64
    if (n_q == 1 and certificate and log_pi is not None and one_minus is not None and dev is not None
            and centre is not None and extra_mask is None and _FAST_DECODE):
        return _certified_decode(query, key, value, log_pi, one_minus, dev, centre, scaling, acc_dtype,
                                 sketch if use_sketch else None, defer, entropy)
    qg = (query * scaling).reshape(b, hkv, group, n_q, d)
    if n_q == 1 and log_pi is None and extra_mask is None and not certificate:
        return _plain_decode(qg.reshape(b, hkv, group, d), key, value, acc_dtype, entropy, query.dtype)
    bias = None if log_pi is None else log_pi.to(acc_dtype).unsqueeze(-2)
    if certificate:
        if one_minus is None:
            lp = torch.zeros(b, hkv, length, device=key.device, dtype=acc_dtype) if log_pi is None else log_pi
            one_minus = torch.expm1(lp.to(acc_dtype)).neg_().clamp_(min=0)
        one_minus = one_minus.to(acc_dtype).unsqueeze(-2)
        if dev is None:
            dev = (squared_deviation(value, centre) if sq_dev is None else sq_dev).sqrt()
        dev = dev.to(acc_dtype)
        centre32 = (
            torch.zeros(b, hkv, dv, device=key.device, dtype=acc_dtype) if centre is None else centre.to(acc_dtype)
        ).unsqueeze(-2)
    outs, variances, ranges, shadow_v, shadow_r, entropies = [], [], [], [], [], []
    for q0 in range(0, n_q, query_block):
        q1 = min(n_q, q0 + query_block)
        nq = q1 - q0
        qc = qg[:, :, :, q0:q1].reshape(b, hkv, group * nq, d)
        rows = group * nq
        if certificate:  # p and r share one buffer, so a single matmul reads the values once
            buf = torch.empty(b, hkv, 2 * rows, length, dtype=acc_dtype, device=key.device)
            logits = buf[:, :, :rows]
            logits.copy_(torch.matmul(qc, key.transpose(-1, -2)))
        else:
            logits = torch.matmul(qc, key.transpose(-1, -2)).to(acc_dtype)
        if bias is not None:
            logits.sub_(bias)
        if extra_mask is not None:
            em = extra_mask[..., q0:q1, :]
            em = em.expand(b, hq, nq, length).reshape(b, hkv, group * nq, length)
            logits = logits.masked_fill(~em, float("-inf")) if em.dtype == torch.bool else logits + em.to(acc_dtype)
        if causal and (n_q > 1 or length < n_q):
            allowed = _causal_allowed(nq, q0, n_q, length, key.device).repeat(group, 1)
            logits.masked_fill_(~allowed, float("-inf"))
        m = logits.amax(-1, keepdim=True)
        logits.sub_(m)
        # z − m, with masked keys (−inf) at a finite floor so that e^{z−m}(z−m) is 0 there, not NaN
        shifted = logits.clamp(min=-1e30) if entropy else None
        p = logits.exp_()  # in place: the logits are not needed again
        l = p.sum(-1, keepdim=True)
        if entropy:  # Σ_j p_j (z_j − m) as a row-wise dot product (no [rows, L] temporary; a bmm is 10x slower)
            h = torch.log(l) - torch.linalg.vecdot(p, shifted).unsqueeze(-1) / l
            entropies.append(h.squeeze(-1).reshape(b, hkv, group, nq).to(torch.float32))
        if certificate:
            wp = p * one_minus  # (1 − π_i) p_i
            m0 = wp.amax(-1)
            r = torch.mul(wp, p, out=buf[:, :, rows:])  # r_i = (1 − π_i) p_i²
            a = r.sum(-1, keepdim=True)
            both = torch.matmul(buf.to(value.dtype), value).to(acc_dtype)
            out, bv = both[:, :, :rows].div_(l), both[:, :, rows:]
            wpd = wp.mul_(dev.unsqueeze(-2))  # (1 − π_i) p_i ‖v_i − c‖
            m1 = wpd.amax(-1)
            c_term = torch.matmul(wpd.mul_(p), dev.unsqueeze(-1))  # Σ r_i ‖v_i − c‖²
            out_c = out - centre32
            out_dev = torch.linalg.vector_norm(out_c, dim=-1)
            var = _variance(c_term, bv, out, a, l, centre32, r, value).to(acc_dtype).squeeze(-1)
            rng = (m1 + m0 * out_dev) / l.squeeze(-1)
            variances.append(var.reshape(b, hkv, group, nq))
            ranges.append(rng.reshape(b, hkv, group, nq))
            if use_sketch:
                lse = (m + torch.log(l)).squeeze(-1).reshape(b, hkv * group, nq)  # rows are (group, query)
                qrows = qc.reshape(b, hkv * group, nq, d)
                sv, sr = sketch_terms(qrows, sketch, 1.0, lse, out_dev.reshape(b, hkv * group, nq))
                shadow_v.append(sv.reshape(b, hkv, group, nq))
                shadow_r.append(sr.reshape(b, hkv, group, nq))
        else:
            out = torch.matmul(p.to(value.dtype), value).to(acc_dtype).div_(l)
        outs.append(out.to(query.dtype).reshape(b, hkv, group, nq, dv))
    output = torch.cat(outs, dim=3).reshape(b, hq, n_q, dv)
    ent = torch.cat(entropies, dim=3).reshape(b, hq, n_q) if entropy else None
    if not certificate:
        return AttentionResult(output, entropy=ent)
    variance = torch.cat(variances, dim=3).reshape(b, hq, n_q)
    range_term = torch.cat(ranges, dim=3).reshape(b, hq, n_q)
    if not use_sketch:
        return AttentionResult(output, variance, range_term, entropy=ent)
    return AttentionResult(output, variance, range_term, torch.cat(shadow_v, dim=3).reshape(b, hq, n_q),
                           torch.cat(shadow_r, dim=3).reshape(b, hq, n_q), entropy=ent)


def causal_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float) -> torch.Tensor:
    """Plain causal attention for a fresh prefill (Q == L, nothing evicted): PyTorch SDPA."""
    return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=True)


def plain_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float) -> torch.Tensor:
    """Queries that see every key (one decode step over an uncompressed cache): PyTorch SDPA."""
    return F.scaled_dot_product_attention(query, key, value, is_causal=False, scale=scaling, enable_gqa=True)


@dataclass
class CertifiedAttention:
    """Public result of :func:`certified_attention`: output ô, variance V̂, range b̂_c and radius ε_δ;
    with a sketch also the shadow terms and the robust radius ε_R (None without one)."""

    output: torch.Tensor
    variance: torch.Tensor
    range_term: torch.Tensor
    radius: torch.Tensor
    shadow_sum: torch.Tensor | None = None
    shadow_range: torch.Tensor | None = None
    robust_radius: torch.Tensor | None = None


def kept_value_mean(value: torch.Tensor, log_pi: torch.Tensor | None) -> torch.Tensor:
    """The mean of the kept (non-padding) values per head [B, Hkv, D], fp32 at least: the default value centre."""
    v = value.to(torch.promote_types(value.dtype, torch.float32))
    if log_pi is None:
        return v.mean(2)
    valid = torch.isfinite(log_pi).unsqueeze(-1).to(v.dtype)
    return (torch.where(valid > 0, v, 0.0) * valid).sum(2) / valid.sum(2).clamp(min=1)


def certified_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    log_pi: torch.Tensor | None,
    delta: float = 0.1,
    scaling: float | None = None,
    centre: torch.Tensor | None = None,
    sketch: EvictionSketch | None = None,
) -> CertifiedAttention:
    """Hájek-corrected attention of queries over a retained set, with the error certificate.

    query [B, Hq, Q, D]; key, value [B, Hkv, K, D] (the kept tokens only); log_pi [B, Hkv, K]
    (log inclusion probability of each kept token, +inf on padding; None = all certain).
    Every query sees every kept key. ``centre`` [B, Hkv, D]: the value centre of the
    one-pass sums (default: the mean of the kept values, as the cache uses — it leaves
    V̂ unchanged in exact arithmetic and keeps the fp32 cancellation small). ``sketch``:
    an eviction sketch (:mod:`kvcert.method.sketch`) whose value deviations refer to that centre.
    Returns ô [B, Hq, Q, D], V̂ and b̂_c [B, Hq, Q], the radius
    ε_δ = sqrt(2 V̂ L) + (2/3) b̂_c L with L = log(2/δ), and with a sketch the robust radius
    (:func:`kvcert.method.certificate.robust_radius`, floored at the values' dtype's u·‖ô‖).
    """
    check_ndim("query", query, 4, "[B, Hq, Q, D]")
    check_ndim("key", key, 4, "[B, Hkv, K, D]")
    check_ndim("value", value, 4, "[B, Hkv, K, D]")
    if key.shape[:3] != value.shape[:3]:
        raise ValueError(f"value: shape {tuple(value.shape)} does not match key {tuple(key.shape)} (batch, heads, tokens)")
    if query.shape[0] != key.shape[0] or query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query: shape {tuple(query.shape)} does not match key {tuple(key.shape)} (batch, head dim)")
    if query.shape[1] % key.shape[1]:
        raise ValueError(f"query: {query.shape[1]} query heads are not a multiple of {key.shape[1]} KV heads")
    if key.shape[2] == 0:
        raise ValueError("key: the cache holds no token (K = 0); attention over an empty set has no output")
    if len({query.dtype, key.dtype, value.dtype}) != 1:
        raise ValueError(f"query, key, value: dtypes differ ({query.dtype}, {key.dtype}, {value.dtype}); "
                         "cast them to one dtype")
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        check_finite(name, tensor)
    if scaling is not None and not math.isfinite(float(scaling)):
        raise ValueError(f"scaling: must be a finite number, got {scaling!r}")
    if log_pi is not None:
        check_ndim("log_pi", log_pi, 3, "[B, Hkv, K]")
        if tuple(log_pi.shape) != tuple(key.shape[:3]):
            raise ValueError(f"log_pi: shape {tuple(log_pi.shape)} does not match key {tuple(key.shape[:3])}")
        if torch.isnan(log_pi).any():
            raise ValueError("log_pi: contains NaN")
        if ((log_pi > 0) & ~torch.isinf(log_pi)).any():
            raise ValueError("log_pi: log inclusion probabilities must be <= 0 (or +inf for padding)")
        if (log_pi == float("-inf")).any():
            raise ValueError("log_pi: -inf (π = 0) marks a token that cannot have been kept; drop it, or +inf for padding")
        if torch.isinf(log_pi).all(dim=-1).any():
            raise ValueError("log_pi: a (batch, KV head) row holds only padding (+inf); it has no kept token to attend to")
    if sketch is not None and (tuple(sketch.codes.shape[:2]) != tuple(key.shape[:2]) or sketch.codes.shape[-1] != key.shape[-1]):
        raise ValueError(f"sketch: codes of shape {tuple(sketch.codes.shape)} do not fit key {tuple(key.shape)} "
                         "(batch, KV heads, head dim)")
    delta = check_delta(delta)
    scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    if centre is None:
        centre = kept_value_mean(value, log_pi)
    else:
        check_ndim("centre", centre, 3, "[B, Hkv, D]")
        if tuple(centre.shape) != (key.shape[0], key.shape[1], value.shape[-1]):
            raise ValueError(f"centre: shape {tuple(centre.shape)} does not match value {tuple(value.shape)}; give "
                             f"[B, Hkv, D] = {(key.shape[0], key.shape[1], value.shape[-1])} (or None: the kept values' mean)")
        check_finite("centre", centre)
    res = hajek_attention(query, key, value, log_pi, scale, causal=False, certificate=True, centre=centre, sketch=sketch)
    radius = bernstein_radius(res.variance, res.range_term, delta)
    if sketch is None:
        return CertifiedAttention(res.output, res.variance, res.range_term, radius)
    floor = unit_roundoff(value.dtype) * torch.linalg.vector_norm(res.output.to(res.variance.dtype), dim=-1)
    robust = robust_radius(res.variance, res.range_term, res.shadow_sum, delta, floor=floor)
    return CertifiedAttention(res.output, res.variance, res.range_term, radius, res.shadow_sum,
                              res.shadow_range, robust)
