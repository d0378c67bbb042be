"""Fused certified decode attention over the compacted KV cache (Triton).

One pass over the retained keys, values and per-token log π gives, for every query head
of a decode step: the Hájek-corrected output ô (attention with logits s_i − log π_i), the
log-sum-exp of those logits, the variance estimate V̂ and the one-pass range term b̂_c of
the certificate (DESIGN.md §1; ``OnlineCertificate`` in tests/online_certificate.py is
the same algorithm written in torch).

Per (batch, KV head, split) one program folds blocks of ``BLOCK_N`` keys into the
online-softmax state of all the query heads of its group at once (grouped-query
attention: the group is padded to ``G_PAD`` ≥ 16 rows so that ``tl.dot`` applies)::

    s_i  = (q·k_i·scale − log π_i)·log2(e)           base-2 logits
    m'   = max(m, max_i s_i),  α = 2^(m − m'),  p_i = 2^(s_i − m')
    l    ← α l + Σ p_i                 acc ← α acc + Σ p_i v_i
    r_i  = (1 − π_i) p_i²              (1 − π_i) = −expm1(log π_i), 0 for certain tokens
    A    ← α² A + Σ r_i                B ← α² B + Σ r_i (v_i − c)     C ← α² C + Σ r_i ‖v_i − c‖²
    M0   ← max(α M0, max_i (1 − π_i) p_i)
    M1   ← max(α M1, max_i (1 − π_i) p_i ‖v_i − c‖)

and at the end ô = acc/l, lse = (m + log2 l)·ln 2, V̂ = (C − 2 B·(ô − c) + A‖ô − c‖²)/l²
(combined in float64: the terms can nearly cancel) and b̂_c = (M1 + M0 ‖ô − c‖)/l. With
several splits (flash-decoding) each program writes
its partial state and a second kernel merges them exactly: m = max_j m_j,
ω_j = 2^(m_j − m), first moments (l, acc) weighted by ω_j, second moments (A, B, C) by
ω_j², the maxima (M0, M1) by ω_j.

``CERT=False`` compiles the same kernels without the certificate accumulators (the
baseline the certificate's overhead is measured against).

``ENTROPY`` adds the attention entropy H = −Σ p̂_i ln p̂_i (p̂_i = p_i / l) from one more
accumulator, kept relative to the running max like l (E ≤ 0, no cancellation)::

    E ← α (E − (m' − m) l) + Σ p_i (s_i − m')        H = ln 2 · (log₂ l − E / l)

(padding contributes 0; the merge re-centres each split's E_j by (m_j − m) l_j and weights
it by ω_j, as it does l_j).

With an eviction sketch (``SKETCH``; :mod:`kvcert.sketch`) the finalisation also bounds the
evicted summands of the r shadow tokens of the KV head (int8 keys k̃ = scale·codes, key
error e, value deviation d), with the final m and l of each query row::

    U_j = (q·k̃_j + ‖q‖ e_j)·scale·log2(e)        t_j = 2^(U_j − m − log2 l) · (d_j + ‖ô − c‖)
    shadow_sum = Σ_j t_j                     shadow_range = max_j t_j

(blocks of ``BLOCK_R`` shadow slots; slots ≥ the head's count are masked). It runs once per
(batch, KV head), after the pass over the cache: r ≪ L, so it adds r·(D + 16) bytes to
the L·(2D·dtype + 4) the pass reads.

On a CPU the kernels run in Triton's interpreter: ``TRITON_INTERPRET=1`` must be set
before triton is first imported (triton.language jits its own helpers at import).

Padding: slots with log π = +inf get weight zero (whatever their keys and values hold,
NaN included), and slots at or beyond ``lengths[b, h]`` are not read. A head with no valid slot
returns output 0, lse −inf, V̂ = b̂_c = 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SKETCH_BLOCK = 16  # shadow slots per block of the sketch epilogue


@triton.jit
def _round_bf16(x):
    """fp32 → nearest bf16 (ties to even), returned as fp32: the rounding a GPU's cvt.rn does.
    Used only under the interpreter, whose own fp32 → bf16 cast truncates."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _sketch_epilogue(
    Q, SK_C, SK_S, SK_E, SK_D, SK_N, SV, SR,
    b, h, srow, lse2, oc, scale_log2e, n_slots,
    stride_qb, stride_qh, stride_qd,
    stride_kcb, stride_kch, stride_kcr, stride_kcd,
    stride_ksb, stride_ksh, stride_ksr,
    stride_knb, stride_knh,
    GROUP: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
):
    """Σ t_j and max t_j of the KV head's shadow tokens for the group's query rows (see the module docstring)."""
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, BLOCK_D)
    offs_r = tl.arange(0, BLOCK_R)
    g_ok = offs_g < GROUP
    d_ok = offs_d < D
    q_ptrs = Q + b * stride_qb + (h * GROUP + offs_g)[:, None] * stride_qh + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    qn = tl.sqrt(tl.sum(q * q, 1))
    count = tl.load(SK_N + b * stride_knb + h * stride_knh).to(tl.int32)
    sv = tl.zeros([G_PAD], tl.float32)
    sr = tl.zeros([G_PAD], tl.float32)
    for r0 in range(0, n_slots, BLOCK_R):
        offs = r0 + offs_r
        r_ok = offs < count
        c_ptrs = SK_C + b * stride_kcb + h * stride_kch + offs[:, None] * stride_kcr + offs_d[None, :] * stride_kcd
        codes = tl.load(c_ptrs, mask=r_ok[:, None] & d_ok[None, :], other=0).to(tl.float32)
        sbase = b * stride_ksb + h * stride_ksh + offs * stride_ksr
        kscale = tl.load(SK_S + sbase, mask=r_ok, other=0.0)
        kerr = tl.load(SK_E + sbase, mask=r_ok, other=0.0)
        vdev = tl.load(SK_D + sbase, mask=r_ok, other=0.0)
        u = tl.dot(q, tl.trans(codes * kscale[:, None]), input_precision="ieee")  # [G_PAD, BLOCK_R]
        u = (u + qn[:, None] * kerr[None, :]) * scale_log2e
        t = tl.exp2(u - lse2[:, None]) * (vdev[None, :] + oc[:, None])
        t = tl.where(r_ok[None, :] & g_ok[:, None], t, 0.0)
        sv += tl.sum(t, 1)
        sr = tl.maximum(sr, tl.max(t, 1))
    tl.store(SV + srow, sv, mask=g_ok)
    tl.store(SR + srow, sr, mask=g_ok)


@triton.jit
def _entropy(l_i, e_i):
    """H = ln 2 · (log₂ l − Σ p (s − m) / l) in nats, from the base-2 state: two non-negative
    terms (l ≥ 1, s ≤ m), so nothing cancels; 0 for a head with no valid slot (l = 0)."""
    nonempty = l_i > 0.0
    l_safe = tl.where(nonempty, l_i, 1.0)
    return tl.where(nonempty, (tl.log2(l_safe) - e_i / l_safe) * 0.6931471805599453, 0.0)


@triton.jit
def _variance(c_i, b_acc, a_i, out_c, l_safe):
    """V̂ = (C − 2 B·(ô − c) + A‖ô − c‖²)/l², clamped at 0, combined in float64 (as the torch path
    does): the terms nearly cancel when the r-weighted values sit far from c, and fp32 here would
    add its rounding, amplified by that cancellation, to the sums' own. [G_PAD] rows: cheap."""
    oc64 = out_c.to(tl.float64)
    l64 = l_safe.to(tl.float64)
    var = c_i.to(tl.float64) - 2.0 * tl.sum(b_acc.to(tl.float64) * oc64, 1) + a_i.to(tl.float64) * tl.sum(oc64 * oc64, 1)
    return tl.maximum(var / (l64 * l64), 0.0).to(tl.float32)


@triton.jit
def _stage1(
    Q, K, V, LP, CEN, LEN,
    OUT, LSE, VAR, RNG,
    P_M, P_L, P_ACC, P_A, P_B, P_C, P_M0, P_M1,
    SK_C, SK_S, SK_E, SK_D, SK_N, SV, SR, ENT, P_E,
    scale_log2e, seq_len, chunk, n_splits, n_slots,
    stride_qb, stride_qh, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_lb, stride_lh, stride_ln,
    stride_cb, stride_ch, stride_cd,
    stride_nb, stride_nh,
    stride_ob, stride_oh, stride_od,
    stride_kcb, stride_kch, stride_kcr, stride_kcd,
    stride_ksb, stride_ksh, stride_ksr,
    stride_knb, stride_knh,
    HKV: tl.constexpr, GROUP: tl.constexpr, G_PAD: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
    CERT: tl.constexpr, HAS_LP: tl.constexpr, HAS_LEN: tl.constexpr, SPLIT: tl.constexpr,
    SKETCH: tl.constexpr, BLOCK_R: tl.constexpr,
    DOT_PREC: tl.constexpr, CERT_PREC: tl.constexpr, INTERP_BF16: tl.constexpr, INTERP_OUT_BF16: tl.constexpr,
    ENTROPY: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    b = (pid_bh // HKV).to(tl.int64)  # 64-bit batch offsets: B·Hkv·L·D can pass 2³¹
    h = pid_bh % HKV

    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_n = tl.arange(0, BLOCK_N)
    g_ok = offs_g < GROUP
    d_ok = offs_d < D
    dv_ok = offs_dv < DV

    # the group's queries [G_PAD, BLOCK_D], in the cache's dtype for the tensor-core dot
    q_ptrs = Q + b * stride_qb + (h * GROUP + offs_g)[:, None] * stride_qh + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(K.dtype.element_ty)

    length = seq_len
    if HAS_LEN:
        length = tl.minimum(tl.load(LEN + b * stride_nb + h * stride_nh).to(tl.int32), seq_len)
    start = split * chunk
    end = tl.minimum(start + chunk, length)

    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    lp_base = LP + b * stride_lb + h * stride_lh

    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, BLOCK_DV], tl.float32)
    if ENTROPY:
        e_i = tl.zeros([G_PAD], tl.float32)  # Σ p_i (s_i − m): ≤ 0, relative to the running max
    if CERT:
        c_vec = tl.load(CEN + b * stride_cb + h * stride_ch + offs_dv * stride_cd, mask=dv_ok, other=0.0).to(tl.float32)
        a_i = tl.zeros([G_PAD], tl.float32)
        b_acc = tl.zeros([G_PAD, BLOCK_DV], tl.float32)
        c_i = tl.zeros([G_PAD], tl.float32)
        m0_i = tl.zeros([G_PAD], tl.float32)
        m1_i = tl.zeros([G_PAD], tl.float32)

    for n0 in range(start, end, BLOCK_N):
        offs = n0 + offs_n
        in_range = offs < end
        if HAS_LP:
            lp = tl.load(lp_base + offs * stride_ln, mask=in_range, other=float("inf"))
            valid = in_range & (lp < float("inf"))
        else:
            lp = tl.zeros([BLOCK_N], tl.float32)
            valid = in_range
        # K/V loads depend on the position only (not on log π), so they pipeline freely;
        # padding slots (whatever they hold, NaN included) are masked out after the load
        if D == BLOCK_D:
            k_mask = in_range[:, None]
        else:
            k_mask = in_range[:, None] & d_ok[None, :]
        if DV == BLOCK_DV:
            v_mask = in_range[:, None]
        else:
            v_mask = in_range[:, None] & dv_ok[None, :]
        k = tl.load(k_base + offs[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=k_mask, other=0.0)
        v = tl.load(v_base + offs[:, None] * stride_vn + offs_dv[None, :] * stride_vd, mask=v_mask, other=0.0)
        if HAS_LP:
            v = tl.where(valid[:, None], v, 0.0)
        if INTERP_BF16:  # the interpreter cannot multiply bf16 tiles: the same products in fp32
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        s = s * scale_log2e
        if HAS_LP:
            s = s - (tl.where(valid, lp, 0.0) * 1.4426950408889634)[None, :]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        if ENTROPY:  # re-centre on the new max (Σ p (s − m') = α (Σ p (s − m) − (m' − m) l)), padding adds 0
            shift = (m_safe - tl.where(l_i > 0.0, m_i, m_safe)) * l_i  # no inf · 0 before the first valid slot
            e_i = (e_i - shift) * alpha + tl.sum(p * tl.where(p > 0.0, s - m_safe[:, None], 0.0), 1)
        l_i = l_i * alpha + tl.sum(p, 1)
        if INTERP_BF16:
            pv = tl.dot(_round_bf16(p), v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(V.dtype.element_ty), v, input_precision=DOT_PREC)
        acc = acc * alpha[:, None] + pv
        if CERT:
            # (1 − π) = −expm1(log π): a Taylor series near 0 keeps its relative accuracy there
            x = tl.where(valid, lp, 0.0)
            series = -x * (1.0 + x * (0.5 + x * (0.16666666666666666 + x * (0.041666666666666664
                                                                             + x * 0.008333333333333333))))
            om = tl.where(x > -0.125, series, 1.0 - tl.exp(x))
            om = tl.where(valid, tl.maximum(om, 0.0), 0.0)
            vc = tl.where(valid[:, None] & dv_ok[None, :], v.to(tl.float32) - c_vec[None, :], 0.0)
            sq = tl.sum(vc * vc, 1)
            wp = p * om[None, :]
            r = wp * p
            a2 = alpha * alpha
            a_i = a_i * a2 + tl.sum(r, 1)
            b_acc = b_acc * a2[:, None] + tl.dot(r, vc, input_precision=CERT_PREC)
            c_i = c_i * a2 + tl.sum(r * sq[None, :], 1)
            m0_i = tl.maximum(m0_i * alpha, tl.max(wp, 1))
            m1_i = tl.maximum(m1_i * alpha, tl.max(wp * tl.sqrt(sq)[None, :], 1))
        m_i = m_new

    if SPLIT:
        # partial state [B, HKV, n_splits, GROUP(, DV)], contiguous
        row = (pid_bh * n_splits + split) * GROUP + offs_g
        tl.store(P_M + row, m_i, mask=g_ok)
        tl.store(P_L + row, l_i, mask=g_ok)
        vec = row[:, None] * DV + offs_dv[None, :]
        vmask = g_ok[:, None] & dv_ok[None, :]
        tl.store(P_ACC + vec, acc, mask=vmask)
        if ENTROPY:
            tl.store(P_E + row, e_i, mask=g_ok)
        if CERT:
            tl.store(P_A + row, a_i, mask=g_ok)
            tl.store(P_B + vec, b_acc, mask=vmask)
            tl.store(P_C + row, c_i, mask=g_ok)
            tl.store(P_M0 + row, m0_i, mask=g_ok)
            tl.store(P_M1 + row, m1_i, mask=g_ok)
    else:
        nonempty = l_i > 0.0
        l_safe = tl.where(nonempty, l_i, 1.0)
        out = acc / l_safe[:, None]
        hq = h * GROUP + offs_g
        o_ptrs = OUT + b * stride_ob + hq[:, None] * stride_oh + offs_dv[None, :] * stride_od
        if INTERP_OUT_BF16:
            tl.store(o_ptrs, _round_bf16(out).to(OUT.dtype.element_ty), mask=g_ok[:, None] & dv_ok[None, :])
        else:
            tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=g_ok[:, None] & dv_ok[None, :])
        srow = b * (HKV * GROUP) + hq
        lse = tl.where(nonempty, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        tl.store(LSE + srow, lse, mask=g_ok)
        if ENTROPY:
            tl.store(ENT + srow, _entropy(l_i, e_i), mask=g_ok)
        if CERT:
            out_c = tl.where(dv_ok[None, :], out - c_vec[None, :], 0.0)
            var = _variance(c_i, b_acc, a_i, out_c, l_safe)
            oc = tl.sqrt(tl.sum(out_c * out_c, 1))
            rng = (m1_i + m0_i * oc) / l_safe
            tl.store(VAR + srow, var, mask=g_ok)
            tl.store(RNG + srow, rng, mask=g_ok)
            if SKETCH:
                _sketch_epilogue(
                    Q, SK_C, SK_S, SK_E, SK_D, SK_N, SV, SR, b, h, srow, tl.where(nonempty, m_i + tl.log2(l_safe), float("inf")), oc,
                    scale_log2e, n_slots, stride_qb, stride_qh, stride_qd,
                    stride_kcb, stride_kch, stride_kcr, stride_kcd, stride_ksb, stride_ksh, stride_ksr,
                    stride_knb, stride_knh, GROUP=GROUP, G_PAD=G_PAD, D=D, BLOCK_D=BLOCK_D, BLOCK_R=BLOCK_R,
                )


@triton.jit
def _merge(
    Q, CEN, OUT, LSE, VAR, RNG,
    P_M, P_L, P_ACC, P_A, P_B, P_C, P_M0, P_M1,
    SK_C, SK_S, SK_E, SK_D, SK_N, SV, SR, ENT, P_E,
    n_splits, scale_log2e, n_slots,
    stride_qb, stride_qh, stride_qd,
    stride_cb, stride_ch, stride_cd,
    stride_ob, stride_oh, stride_od,
    stride_kcb, stride_kch, stride_kcr, stride_kcd,
    stride_ksb, stride_ksh, stride_ksr,
    stride_knb, stride_knh,
    HKV: tl.constexpr, GROUP: tl.constexpr, G_PAD: tl.constexpr, DV: tl.constexpr, BLOCK_DV: tl.constexpr,
    CERT: tl.constexpr, INTERP_OUT_BF16: tl.constexpr,
    SKETCH: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
    ENTROPY: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    b = (pid_bh // HKV).to(tl.int64)
    h = pid_bh % HKV
    offs_g = tl.arange(0, G_PAD)
    offs_dv = tl.arange(0, BLOCK_DV)
    g_ok = offs_g < GROUP
    dv_ok = offs_dv < DV
    vmask = g_ok[:, None] & dv_ok[None, :]

    m = tl.full([G_PAD], float("-inf"), tl.float32)
    for j in range(0, n_splits):
        row = (pid_bh * n_splits + j) * GROUP + offs_g
        m = tl.maximum(m, tl.load(P_M + row, mask=g_ok, other=float("-inf")))
    m_safe = tl.where(m == float("-inf"), 0.0, m)

    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, BLOCK_DV], tl.float32)
    if ENTROPY:
        e_i = tl.zeros([G_PAD], tl.float32)
    if CERT:
        a_i = tl.zeros([G_PAD], tl.float32)
        b_acc = tl.zeros([G_PAD, BLOCK_DV], tl.float32)
        c_i = tl.zeros([G_PAD], tl.float32)
        m0_i = tl.zeros([G_PAD], tl.float32)
        m1_i = tl.zeros([G_PAD], tl.float32)
    for j in range(0, n_splits):
        row = (pid_bh * n_splits + j) * GROUP + offs_g
        vec = row[:, None] * DV + offs_dv[None, :]
        m_j = tl.load(P_M + row, mask=g_ok, other=float("-inf"))
        w = tl.exp2(m_j - m_safe)  # ω_j; 0 for an empty split (m_j = −inf)
        l_j = tl.load(P_L + row, mask=g_ok, other=0.0)
        l_i += w * l_j
        if ENTROPY:  # the split's Σ p (s − m_j), re-centred on the merged max; an empty split adds 0
            e_j = tl.load(P_E + row, mask=g_ok, other=0.0) + (tl.where(l_j > 0.0, m_j, m_safe) - m_safe) * l_j
            e_i += tl.where(l_j > 0.0, w * e_j, 0.0)
        acc += w[:, None] * tl.load(P_ACC + vec, mask=vmask, other=0.0)
        if CERT:
            w2 = w * w
            a_i += w2 * tl.load(P_A + row, mask=g_ok, other=0.0)
            b_acc += w2[:, None] * tl.load(P_B + vec, mask=vmask, other=0.0)
            c_i += w2 * tl.load(P_C + row, mask=g_ok, other=0.0)
            m0_i = tl.maximum(m0_i, w * tl.load(P_M0 + row, mask=g_ok, other=0.0))
            m1_i = tl.maximum(m1_i, w * tl.load(P_M1 + row, mask=g_ok, other=0.0))

    nonempty = l_i > 0.0
    l_safe = tl.where(nonempty, l_i, 1.0)
    out = acc / l_safe[:, None]
    hq = h * GROUP + offs_g
    o_ptrs = OUT + b * stride_ob + hq[:, None] * stride_oh + offs_dv[None, :] * stride_od
    if INTERP_OUT_BF16:
        tl.store(o_ptrs, _round_bf16(out).to(OUT.dtype.element_ty), mask=vmask)
    else:
        tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=vmask)
    srow = b * (HKV * GROUP) + hq
    lse = tl.where(nonempty, (m + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    tl.store(LSE + srow, lse, mask=g_ok)
    if ENTROPY:
        tl.store(ENT + srow, _entropy(l_i, e_i), mask=g_ok)
    if CERT:
        c_vec = tl.load(CEN + b * stride_cb + h * stride_ch + offs_dv * stride_cd, mask=dv_ok, other=0.0).to(tl.float32)
        out_c = tl.where(dv_ok[None, :], out - c_vec[None, :], 0.0)
        var = _variance(c_i, b_acc, a_i, out_c, l_safe)
        oc = tl.sqrt(tl.sum(out_c * out_c, 1))
        rng = (m1_i + m0_i * oc) / l_safe
        tl.store(VAR + srow, var, mask=g_ok)
        tl.store(RNG + srow, rng, mask=g_ok)
        if SKETCH:
            _sketch_epilogue(
                Q, SK_C, SK_S, SK_E, SK_D, SK_N, SV, SR, b, h, srow, tl.where(nonempty, m + tl.log2(l_safe), float("inf")), oc,
                scale_log2e, n_slots, stride_qb, stride_qh, stride_qd,
                stride_kcb, stride_kch, stride_kcr, stride_kcd, stride_ksb, stride_ksh, stride_ksr,
                stride_knb, stride_knh, GROUP=GROUP, G_PAD=G_PAD, D=D, BLOCK_D=BLOCK_D, BLOCK_R=BLOCK_R,
            )


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return bool(triton.knobs.runtime.interpret)


def _check_mode() -> None:
    """The interpreter needs ``TRITON_INTERPRET=1`` before ``triton.language`` is imported
    (its own helpers, tl.zeros, tl.sum..., are jitted at import); fail clearly otherwise."""
    from triton.runtime.interpreter import InterpretedFunction

    lang = isinstance(tl.zeros, InterpretedFunction)
    mine = isinstance(_stage1, InterpretedFunction)
    if lang != mine or (interpreting() and not mine):
        raise RuntimeError(
            "certified_decode: TRITON_INTERPRET was changed after triton (or kvcert_kernels) was imported; "
            "set it before the first import of triton"
        )


def _next_pow2(n: int, floor: int = 16) -> int:
    return max(floor, 1 << max(0, (int(n) - 1).bit_length()))


def default_num_splits(batch: int, kv_heads: int, length: int, device: torch.device, block_n: int) -> int:
    """Split-K policy: about four programs per streaming multiprocessor, ≥ 4 key blocks per split."""
    if device.type != "cuda" or interpreting():
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = -(-4 * sms // max(1, batch * kv_heads))
    most = max(1, -(-length // (4 * block_n)))
    return int(max(1, min(want, most, 256)))


def _check(query, key, value, log_pi, centre, lengths):
    if query.ndim == 4:
        if query.shape[2] != 1:
            raise ValueError(f"query: one decode query per head expected, got shape {tuple(query.shape)}")
    elif query.ndim != 3:
        raise ValueError(f"query: expected [B, Hq, 1, D] or [B, Hq, D], got shape {tuple(query.shape)}")
    if key.ndim != 4 or value.ndim != 4 or key.shape[:3] != value.shape[:3]:
        raise ValueError(f"key/value: expected [B, Hkv, L, D] each, got {tuple(key.shape)} and {tuple(value.shape)}")
    b, hq, d = query.shape[0], query.shape[1], query.shape[-1]
    if key.shape[0] != b or key.shape[-1] != d:
        raise ValueError(f"query: shape {tuple(query.shape)} does not match key {tuple(key.shape)} (batch, head dim)")
    if hq % key.shape[1]:
        raise ValueError(f"query: {hq} query heads are not a multiple of {key.shape[1]} KV heads")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name}: dtype {t.dtype} not supported (fp16, bf16 or fp32)")
    if key.dtype != value.dtype:
        raise ValueError(f"key/value: dtypes differ ({key.dtype}, {value.dtype})")
    if log_pi is not None and tuple(log_pi.shape) != tuple(key.shape[:3]):
        raise ValueError(f"log_pi: shape {tuple(log_pi.shape)} does not match key {tuple(key.shape[:3])}")
    if centre is not None and tuple(centre.shape) != (b, key.shape[1], value.shape[-1]):
        raise ValueError(f"centre: expected shape {(b, key.shape[1], value.shape[-1])}, got {tuple(centre.shape)}")
    if lengths is not None and tuple(lengths.shape) != tuple(key.shape[:2]):
        raise ValueError(f"lengths: shape {tuple(lengths.shape)} does not match key {tuple(key.shape[:2])}")


def certified_decode(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    log_pi: torch.Tensor | None,
    centre: torch.Tensor | None,
    scaling: float,
    lengths: torch.Tensor | None = None,
    certificate: bool = True,
    num_splits: int | None = None,
    *,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    poison: bool = False,
    out: tuple | None = None,
    sketch=None,
    entropy: bool = False,
):
    """Hájek decode attention with its certificate in one pass over the compacted cache.

    query [B, Hq, 1, D] or [B, Hq, D] (Hq a multiple of Hkv); key/value [B, Hkv, L, D]
    (fp16, bf16 or fp32; any strides); log_pi [B, Hkv, L] (log π, 0 for certain tokens,
    +inf on padding slots; None = every token certain); centre [B, Hkv, D] (None = 0);
    lengths [B, Hkv] int (slots ≥ lengths[b, h] are ignored; None = all L).

    Returns (output, lse, variance, range_term): output in the query's layout and dtype,
    the natural-log log-sum-exp of the biased logits, V̂ and b̂_c, fp32, shaped
    [B, Hq, 1] for a 4-d query and [B, Hq] for a 3-d one; variance and range_term are None
    with ``certificate=False``. ``num_splits`` fixes the split-K factor (None: a policy
    that fills the GPU). ``poison`` fills every output and workspace buffer with NaN
    before the launch (tests); ``out`` takes preallocated (output, lse, variance,
    range_term) buffers of the returned shapes.

    ``sketch`` (a :class:`kvcert.sketch.EvictionSketch` of the same batch and KV heads, with
    the certificate): the shadow terms are computed too, and two more tensors are returned,
    shadow_sum and shadow_range (fp32, the stat shape).

    ``entropy``: also the Shannon entropy (nats) of the attention distribution each query uses,
    p_i ∝ exp(s_i − log π_i) over the valid slots (0 for a head with none), fp32, the stat
    shape, appended as the last returned tensor (with or without the certificate). The
    other outputs are the same bits either way.
    """
    _check(query, key, value, log_pi, centre, lengths)
    if sketch is not None and not certificate:
        raise ValueError("sketch: the shadow terms belong to the certificate; pass certificate=True")
    if sketch is not None and (tuple(sketch.codes.shape[:2]) != tuple(key.shape[:2]) or sketch.codes.shape[-1] != key.shape[-1]):
        raise ValueError(f"sketch: codes of shape {tuple(sketch.codes.shape)} do not fit key {tuple(key.shape)}")
    q3 = query[:, :, 0] if query.ndim == 4 else query
    bsz, hq, d = q3.shape
    hkv, seq_len, dv = key.shape[1], key.shape[2], value.shape[-1]
    group = hq // hkv
    dev = query.device
    g_pad = _next_pow2(group)
    block_d, block_dv = _next_pow2(d), _next_pow2(dv)
    if block_n is None:
        block_n = 64 if max(block_d, block_dv) <= 128 else 32
    if num_splits is None:
        num_splits = default_num_splits(bsz, hkv, seq_len, dev, block_n)
    num_splits = max(1, int(num_splits))
    chunk = -(-max(seq_len, 1) // num_splits)
    chunk = -(-chunk // block_n) * block_n
    num_splits = max(1, -(-seq_len // chunk))
    split = num_splits > 1

    stat_shape = (bsz, hq, 1) if query.ndim == 4 else (bsz, hq)
    if out is not None:
        output, lse, variance, range_term = out
    else:
        output = torch.empty(query.shape[:-1] + (dv,), device=dev, dtype=query.dtype)
        lse = torch.empty(stat_shape, device=dev, dtype=torch.float32)
        variance = torch.empty(stat_shape, device=dev, dtype=torch.float32) if certificate else None
        range_term = torch.empty(stat_shape, device=dev, dtype=torch.float32) if certificate else None
    o3 = output[:, :, 0] if output.ndim == 4 else output
    for t in (lse, variance, range_term):
        if t is not None and not t.is_contiguous():
            raise ValueError("out: lse, variance and range_term must be contiguous")
    if centre is None:
        centre_t = torch.zeros(bsz, hkv, dv, device=dev, dtype=torch.float32)
    else:
        centre_t = centre.to(torch.float32)
    lp = log_pi if log_pi is not None else torch.zeros(1, 1, 1, device=dev, dtype=torch.float32)
    if lp.dtype != torch.float32:
        lp = lp.to(torch.float32)
    len_t = lengths if lengths is not None else torch.zeros(1, 1, device=dev, dtype=torch.int32)
    if len_t.dtype not in (torch.int32, torch.int64):
        len_t = len_t.to(torch.int32)

    if split:
        rows = bsz * hkv * num_splits * group
        ws = lambda *shape: (torch.full if poison else torch.empty)(  # noqa: E731
            shape, *((float("nan"),) if poison else ()), device=dev, dtype=torch.float32
        )
        p_m, p_l, p_acc = ws(rows), ws(rows), ws(rows, dv)
        if certificate:
            p_a, p_b, p_c, p_m0, p_m1 = ws(rows), ws(rows, dv), ws(rows), ws(rows), ws(rows)
        else:
            p_a = p_b = p_c = p_m0 = p_m1 = p_m
        p_e = ws(rows) if entropy else p_m
    else:
        p_m = p_l = p_acc = p_a = p_b = p_c = p_m0 = p_m1 = p_e = lse
    ent = torch.empty(stat_shape, device=dev, dtype=torch.float32) if entropy else None
    if poison:
        for t in (output, lse, variance, range_term, ent):
            if t is not None:
                t.fill_(float("nan"))
    var_arg = variance if variance is not None else lse
    rng_arg = range_term if range_term is not None else lse
    use_sketch = sketch is not None and sketch.slots > 0
    if sketch is not None:
        shadow_v = torch.zeros(stat_shape, device=dev, dtype=torch.float32)
        shadow_r = torch.zeros(stat_shape, device=dev, dtype=torch.float32)
    if use_sketch:
        sk_c, sk_s, sk_e, sk_d = sketch.codes, sketch.scale, sketch.key_error, sketch.value_dev
        sk_n = sketch.count
        sk_strides = (*sk_c.stride(), *sk_s.stride(), *sk_n.stride())
        if sk_e.stride() != sk_s.stride() or sk_d.stride() != sk_s.stride():
            sk_e, sk_d, sk_s = sk_e.contiguous(), sk_d.contiguous(), sk_s.contiguous()
            sk_strides = (*sk_c.stride(), *sk_s.stride(), *sk_n.stride())
        n_slots = sketch.slots
    else:
        sk_c = sk_s = sk_e = sk_d = sk_n = lse
        sk_strides = (0,) * 9
        n_slots = 0
    sv_arg = shadow_v if use_sketch else lse
    sr_arg = shadow_r if use_sketch else lse

    interp = interpreting()  # the interpreter's fp32 → bf16 cast truncates: round explicitly there
    interp_out = interp and output.dtype == torch.bfloat16
    fp32 = key.dtype == torch.float32
    dot_prec = "ieee" if fp32 else "tf32"
    cert_prec = "ieee" if fp32 else "tf32"
    launch = {}
    if num_warps is not None:
        launch["num_warps"] = num_warps
    if num_stages is not None:
        launch["num_stages"] = num_stages
    consts = dict(HKV=hkv, GROUP=group, G_PAD=g_pad)
    _check_mode()
    _stage1[(bsz * hkv, num_splits)](
        q3, key, value, lp, centre_t, len_t,
        o3, lse, var_arg, rng_arg,
        p_m, p_l, p_acc, p_a, p_b, p_c, p_m0, p_m1,
        sk_c, sk_s, sk_e, sk_d, sk_n, sv_arg, sr_arg, ent if entropy else lse, p_e,
        float(scaling) * LOG2E, seq_len, chunk, num_splits, n_slots,
        q3.stride(0), q3.stride(1), q3.stride(2),
        key.stride(0), key.stride(1), key.stride(2), key.stride(3),
        value.stride(0), value.stride(1), value.stride(2), value.stride(3),
        lp.stride(0), lp.stride(1), lp.stride(2),
        centre_t.stride(0), centre_t.stride(1), centre_t.stride(2),
        len_t.stride(0), len_t.stride(1),
        o3.stride(0), o3.stride(1), o3.stride(2),
        *sk_strides,
        **consts, D=d, DV=dv, BLOCK_D=block_d, BLOCK_DV=block_dv, BLOCK_N=block_n,
        CERT=bool(certificate), HAS_LP=log_pi is not None, HAS_LEN=lengths is not None, SPLIT=split,
        SKETCH=use_sketch and not split, BLOCK_R=SKETCH_BLOCK,
        DOT_PREC=dot_prec, CERT_PREC=cert_prec,
        INTERP_BF16=interp and key.dtype == torch.bfloat16, INTERP_OUT_BF16=interp_out,
        ENTROPY=bool(entropy), **launch,
    )
    if split:
        _merge[(bsz * hkv,)](
            q3, centre_t, o3, lse, var_arg, rng_arg,
            p_m, p_l, p_acc, p_a, p_b, p_c, p_m0, p_m1,
            sk_c, sk_s, sk_e, sk_d, sk_n, sv_arg, sr_arg, ent if entropy else lse, p_e,
            num_splits, float(scaling) * LOG2E, n_slots,
            q3.stride(0), q3.stride(1), q3.stride(2),
            centre_t.stride(0), centre_t.stride(1), centre_t.stride(2),
            o3.stride(0), o3.stride(1), o3.stride(2),
            *sk_strides,
            **consts, DV=dv, BLOCK_DV=block_dv, CERT=bool(certificate), INTERP_OUT_BF16=interp_out,
            SKETCH=use_sketch, D=d, BLOCK_D=block_d, BLOCK_R=SKETCH_BLOCK, ENTROPY=bool(entropy),
        )
    res = (output, lse, variance, range_term) + ((shadow_v, shadow_r) if sketch is not None else ())
    return res + (ent,) if entropy else res


def decode_bytes(key: torch.Tensor, value: torch.Tensor, log_pi: torch.Tensor | None, lengths=None) -> int:
    """Bytes of cache one decode step reads (keys, values, log π of the valid slots)."""
    b, h, seq_len = key.shape[:3]
    tokens = b * h * seq_len if lengths is None else int(lengths.clamp(max=seq_len).sum())
    per = key.shape[-1] * key.element_size() + value.shape[-1] * value.element_size()
    per += 4 if log_pi is not None else 0
    return tokens * per


__all__ = ["certified_decode", "decode_bytes", "default_num_splits", "interpreting"]
