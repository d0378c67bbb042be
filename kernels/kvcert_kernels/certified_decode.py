"""Fused certified decode attention over the compacted KV cache (Triton).

One pass over the retained keys, values and per-token log π gives, for every query head
of a decode step: the Hájek-corrected output ô (attention with logits s_i − log π_i), the
log-sum-exp of those logits, the variance estimate V̂ and the one-pass range term b̂_c of
the certificate (docs/design.md §1; ``OnlineCertificate`` in tests/online_certificate.py is
the same algorithm written in torch).

Per (batch, KV head, split) one program folds blocks of ``BLOCK_N`` keys into the
online-softmax state of all the query heads of its group at once (grouped-query
attention: the group is padded to ``G_PAD`` ≥ 16 rows so that ``tl.dot`` applies; the group
itself is a runtime argument, so every group that pads alike shares one compiled kernel)::

    s_i  = (q·k_i·scale − log π_i)·log2(e)           base-2 logits
    m'   = max(m, max_i s_i),  α = 2^(m − m'),  p_i = 2^(s_i − m')
    l    ← α l + Σ p_i                 acc ← α acc + Σ p_i v_i
    r_i  = (1 − π_i) p_i²              (1 − π_i) = −expm1(log π_i), 0 for certain tokens
    A    ← α² A + Σ r_i                B ← α² B + Σ r_i v_i           C ← α² C + Σ r_i ‖v_i − c‖²
    M0   ← max(α M0, max_i (1 − π_i) p_i)
    M1   ← max(α M1, max_i (1 − π_i) p_i ‖v_i − c‖)

and at the end ô = acc/l, lse = (m + log2 l)·ln 2, V̂ = (C − 2 (B − A c)·(ô − c) + A‖ô − c‖²)/l²
(combined in float64: the terms can nearly cancel) and b̂_c = (M1 + M0 ‖ô − c‖)/l. B sums the
values as loaded, on the tensor cores of a 16-bit cache with r split in two 16-bit terms,
r ≈ 2^e (r_hi + r_lo), so no fp32 copy of the value tile is formed; the centring B − A c is
exact in float64 at the end, as in the torch path.

**Packed rows** (``PACKED``, :func:`packs`: with the certificate, when the group's rows times 3 — 2 for an fp32
cache — fit 16): the padded rows of the one p·V product carry the certificate. Row i of the tile is query row
i mod G of kind i // G — kind 0 carries p, kind 1 r_hi (fp32: r itself), kind 2 r_lo — so the query tile
repeats the group's queries (the q·K product and the softmax of the replicas are the same rows again, at no
cost below 16 rows) and [p; r_hi; r_lo]·V is one MMA; each row of the one fp32 accumulator is rescaled by its own
factor (α for p, α² for r) and B of query row g is the sum of rows G + g and 2G + g, taken once at the end by an
exact 0/1 selection product (:func:`_packed_b`). Otherwise (``PACKED=False``: groups of 6 or more; the
ablation) B accumulates in a second [G_PAD, DV] fp32 tile from separate products (:func:`_raw_moment`).

With several splits (flash-decoding) each program writes its partial state
([B, Hkv, G, S(, DV)]) and a second kernel merges them exactly, **one program per query row**
(batch, query head; :func:`_merge`): m = max_j m_j, ω_j = 2^(m_j − m), first moments (l, acc)
weighted by ω_j, second moments (A, B, C) by ω_j², the maxima (M0, M1) by max_j ω_j M_j — each
statistic of ``BLOCK_S`` splits loaded as one vector, the splits' acc and B as [BLOCK_S, DV]
tiles, reduced across the splits at once.

``CERT=False`` compiles the same kernels without the certificate accumulators (the
baseline the certificate's overhead is measured against).

``ENTROPY`` adds the attention entropy H = −Σ p̂_i ln p̂_i (p̂_i = p_i / l) from one more
accumulator, kept relative to the running max like l (E ≤ 0, no cancellation)::

    E ← α (E − (m' − m) l) + Σ p_i (s_i − m')        H = ln 2 · (log₂ l − E / l)

(padding contributes 0; the merge re-centres each split's E_j by (m_j − m) l_j and weights
it by ω_j, as it does l_j).

With an eviction sketch (``SKETCH``; :mod:`kvcert.method.sketch`) the finalisation also bounds the
evicted summands of the r shadow tokens of the KV head (int8 keys k̃ = scale·codes, key
error e, value deviation d), with the final m and l of each query row::

    U_j = (q·k̃_j + ‖q‖ e_j)·scale·log2(e)        t_j = 2^(U_j − m − log2 l) · (d_j + ‖ô − c‖)
    shadow_sum = Σ_j t_j                     shadow_range = max_j t_j

(blocks of ``BLOCK_R`` shadow slots; slots ≥ the head's count are masked). With one split it runs
once per (batch, KV head) after the pass over the cache (q·k̃ on the tensor cores); with several, in
the merge's program of each query row (q·k̃ as fp32 products and sums: exact products, as there).
r ≪ L, so it adds r·(D + 16) bytes (per query row: from L2) to the L·(2D·dtype + 4) the pass reads.

On a CPU the kernels run in Triton's interpreter: ``TRITON_INTERPRET=1`` must be set
before triton is first imported (triton.language jits its own helpers at import).

Padding: slots with log π = +inf get weight zero (whatever their keys and values hold,
NaN included), and slots at or beyond ``lengths[b, h]`` are not read. A head with no valid slot
returns output 0, lse −inf, V̂ = b̂_c = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .launch import DecodePlan, Launch, QueryMismatch, emulation

LOG2E = 1.4426950408889634

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
    b, h, srow, lse2, oc, scale_log2e, n_slots, group,
    stride_qb, stride_qh, stride_qd,
    stride_kcb, stride_kch, stride_kcr, stride_kcd,
    stride_ksb, stride_ksh, stride_ksr,
    stride_knb, stride_knh,
    G_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, DOT16: tl.constexpr,
):
    """Σ t_j and max t_j of the KV head's shadow tokens for the group's query rows (see the module docstring).
    q·codes is exact in a 16-bit query's dtype (int8 codes are): with ``DOT16`` on the tensor cores
    (fp32 sums), else an fp32 dot; the per-slot scale multiplies afterwards."""
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, BLOCK_D)
    offs_r = tl.arange(0, BLOCK_R)
    g_ok = offs_g < group
    d_ok = offs_d < D
    q_ptrs = Q + b * stride_qb + (h * group + offs_g)[:, None] * stride_qh + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=g_ok[:, None] & d_ok[None, :], other=0.0)
    qf = q.to(tl.float32)
    qn = tl.sqrt(tl.sum(qf * qf, 1))
    count = tl.load(SK_N + b * stride_knb + h * stride_knh).to(tl.int32)
    sv = tl.zeros([G_PAD], tl.float32)
    sr = tl.zeros([G_PAD], tl.float32)
    for r0 in range(0, n_slots, BLOCK_R):
        offs = r0 + offs_r
        r_ok = offs < count
        c_ptrs = SK_C + b * stride_kcb + h * stride_kch + offs[:, None] * stride_kcr + offs_d[None, :] * stride_kcd
        codes = tl.load(c_ptrs, mask=r_ok[:, None] & d_ok[None, :], other=0)
        sbase = b * stride_ksb + h * stride_ksh + offs * stride_ksr
        kscale = tl.load(SK_S + sbase, mask=r_ok, other=0.0)
        kerr = tl.load(SK_E + sbase, mask=r_ok, other=0.0)
        vdev = tl.load(SK_D + sbase, mask=r_ok, other=0.0)
        if DOT16:
            u = tl.dot(q, tl.trans(codes.to(q.dtype)))  # [G_PAD, BLOCK_R]
        else:
            u = tl.dot(qf, tl.trans(codes.to(tl.float32)), input_precision="ieee")
        u = (u * kscale[None, :] + qn[:, None] * kerr[None, :]) * scale_log2e
        t = tl.exp2(u - lse2[:, None]) * (vdev[None, :] + oc[:, None])
        t = tl.where(r_ok[None, :] & g_ok[:, None], t, 0.0)
        sv += tl.sum(t, 1)
        sr = tl.maximum(sr, tl.max(t, 1))
    tl.store(SV + srow, sv, mask=g_ok)
    tl.store(SR + srow, sr, mask=g_ok)


@triton.jit
def _raw_moment(r, v, SPLIT_R: tl.constexpr, INTERP_BF16: tl.constexpr, CERT_PREC: tl.constexpr):
    """Σ_i r_i v_i [G_PAD, BLOCK_DV] in fp32 from the value tile as loaded (the unpacked path, ``PACKED=False``).
    A 16-bit cache (``SPLIT_R``) multiplies on the tensor cores in the tile's own dtype with r in two terms,
    r ≈ 2^e (hi + lo), hi = r/2^e rounded to the dtype, lo = the remainder rounded again (2^e per row: the
    largest r/2^e is in [½, 1], so fp16 neither overflows nor loses the row's leading terms): r's relative
    rounding 2^-16 (bf16) / 2^-22 (fp16), the values exact; fp32 takes one ``CERT_PREC`` dot."""
    if SPLIT_R:
        e = _row_exponent(r)
        rs = r * tl.exp2(-e)[:, None]
        hi = rs.to(v.dtype)
        lo = (rs - hi.to(tl.float32)).to(v.dtype)
        if INTERP_BF16:  # the interpreter cannot multiply bf16 tiles: the same products in fp32
            vf = v.to(tl.float32)
            part = tl.dot(hi.to(tl.float32), vf, input_precision="ieee") + tl.dot(lo.to(tl.float32), vf, input_precision="ieee")
        else:
            part = tl.dot(lo, v, tl.dot(hi, v))
        return part * tl.exp2(e)[:, None]
    else:
        return tl.dot(r, v, input_precision=CERT_PREC)


@triton.jit
def _row_exponent(r):
    """e per row with the row's largest r/2^e in [½, 1] (0 for a row of zeros; ≥ −126: 2^e stays normal)."""
    r_max = tl.max(r, 1)
    return tl.maximum(tl.where(r_max > 0.0, tl.ceil(tl.log2(tl.where(r_max > 0.0, r_max, 1.0))), 0.0), -126.0)


@triton.jit
def _packed_operand(p, r, kind, v, SPLIT_R: tl.constexpr, INTERP_BF16: tl.constexpr):
    """The left operand [G_PAD, BLOCK_N] of the one p·V product when the certificate rides in its padded rows
    (``PACKED``): row i of kind 0 holds p of query row i, kind 1 (and 2) the r of query row i − kind·group. A
    16-bit cache splits r as :func:`_raw_moment` does, r ≈ 2^e (hi + lo), hi on the kind-1 rows and lo on the
    kind-2 rows, in the tile's dtype (the values exact); returns the operand (in the dtype the dot takes: the
    tile's, or fp32 holding bf16 values under the interpreter) and 2^e per row (1 on the p rows). An fp32 cache
    puts r itself on the kind-1 rows (no split, the ``CERT_PREC`` dot)."""
    k2 = kind[:, None]
    if SPLIT_R:
        e = _row_exponent(r)
        rs = r * tl.exp2(-e)[:, None]
        if INTERP_BF16:  # the interpreter's fp32 → bf16 cast truncates: round to nearest explicitly
            hi = _round_bf16(rs)
            op = tl.where(k2 == 0, _round_bf16(p), tl.where(k2 == 1, hi, _round_bf16(rs - hi)))
        else:
            hi = rs.to(v.dtype).to(tl.float32)
            op = tl.where(k2 == 0, p, tl.where(k2 == 1, hi, rs - hi)).to(v.dtype)
        return op, tl.where(kind == 0, 1.0, tl.exp2(e))
    else:
        return tl.where(k2 == 0, p, r), tl.where(kind == 0, 1.0, 1.0)


@triton.jit
def _packed_b(acc, offs_g, group, SPLIT_R: tl.constexpr, G_PAD: tl.constexpr):
    """B of each query row g < group from the packed accumulator: the sum of its rows g + group (and
    g + 2·group: hi and lo), by an fp32 product with a 0/1 selection matrix — exact (two terms and zeros)."""
    cols = tl.arange(0, G_PAD)
    sel = cols[None, :] == (offs_g + group)[:, None]
    if SPLIT_R:
        sel = sel | (cols[None, :] == (offs_g + 2 * group)[:, None])
    sel = sel & (offs_g < group)[:, None]
    return tl.dot(sel.to(tl.float32), acc, input_precision="ieee")


@triton.jit
def _entropy(l_i, e_i):
    """H = ln 2 · (log₂ l − Σ p (s − m) / l) in nats, from the base-2 state: two non-negative
    terms (l ≥ 1, s ≤ m), so nothing cancels; 0 for a head with no valid slot (l = 0)."""
    nonempty = l_i > 0.0
    l_safe = tl.where(nonempty, l_i, 1.0)
    return tl.where(nonempty, (tl.log2(l_safe) - e_i / l_safe) * 0.6931471805599453, 0.0)


@triton.jit
def _variance(c_i, b_raw, a_i, c_vec, out_c, l_safe):
    """V̂ = (C − 2 B_c·(ô − c) + A‖ô − c‖²)/l² with B_c = B − A c (B = Σ r v, as the pass sums it),
    clamped at 0, combined in float64 (as the torch path does): the terms nearly cancel when
    the r-weighted values sit far from c, and fp32 here would add its rounding, amplified by
    that cancellation, to the sums' own."""
    l64 = l_safe.to(tl.float64)
    a64 = a_i.to(tl.float64)[:, None]
    oc64 = out_c.to(tl.float64)
    # Σ_d (A (ô − c)_d − 2 (B_d − A c_d)) (ô − c)_d: one float64 expression per element and one row sum
    b_c = b_raw.to(tl.float64) - a64 * c_vec.to(tl.float64)[None, :]
    var = c_i.to(tl.float64) + tl.sum((a64 * oc64 - 2.0 * b_c) * oc64, 1)
    return tl.maximum(var / (l64 * l64), 0.0).to(tl.float32)


@triton.jit(do_not_specialize=["stride_step"])  # a recorder's buffer of any shape: one compile
def _stage1(
    Q, K, V, LP, CEN, LEN,
    OUT, LSE, VAR, RNG,
    P_M, P_L, P_ACC, P_A, P_B, P_C, P_M0, P_M1,
    SK_C, SK_S, SK_E, SK_D, SK_N, SV, SR, ENT, P_E,
    OM, DEV, NORM, STEP,
    scale_log2e, seq_len, chunk, n_splits, n_slots, group, stride_step,
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
    HKV: tl.constexpr, G_PAD: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
    CERT: tl.constexpr, HAS_LP: tl.constexpr, HAS_LEN: tl.constexpr, SPLIT: tl.constexpr,
    SKETCH: tl.constexpr, BLOCK_R: tl.constexpr, SK_DOT16: tl.constexpr,
    DOT_PREC: tl.constexpr, CERT_PREC: tl.constexpr, SPLIT_R: tl.constexpr, INTERP_BF16: tl.constexpr, INTERP_OUT_BF16: tl.constexpr,
    ENTROPY: tl.constexpr, HAS_AUX: tl.constexpr, HAS_NORM: tl.constexpr, PACKED: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    b = (pid_bh // HKV).to(tl.int64)  # 64-bit batch offsets: B·Hkv·L·D can pass 2³¹
    h = pid_bh % HKV

    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_n = tl.arange(0, BLOCK_N)
    g_ok = offs_g < group  # the rows whose results are stored: query row g of the group
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    if PACKED:
        # row i is query row i mod group, of kind i // group: 0 carries p (the output), 1 (and 2) carry r
        # (hi and lo with a 16-bit cache) for B = Σ r v on the same MMA as p·V; the rows past them are padding
        kind = offs_g // group
        q_row = offs_g - kind * group
        if SPLIT_R:
            q_ok = kind < 3
        else:
            q_ok = kind < 2
    else:
        q_row = offs_g
        q_ok = g_ok

    # the group's queries [G_PAD, BLOCK_D], in the cache's dtype for the tensor-core dot
    q_ptrs = Q + b * stride_qb + (h * group + q_row)[:, None] * stride_qh + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=q_ok[:, None] & d_ok[None, :], other=0.0).to(K.dtype.element_ty)

    length = seq_len
    if HAS_LEN:
        length = tl.minimum(tl.load(LEN + b * stride_nb + h * stride_nh).to(tl.int32), seq_len)
    start = split * chunk
    end = tl.minimum(start + chunk, length)

    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    lp_base = LP + b * stride_lb + h * stride_lh
    om_base = OM + b * stride_lb + h * stride_lh  # the cache's 1 − π and ‖v − c‖: log π's layout
    dev_base = DEV + b * stride_lb + h * stride_lh

    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, BLOCK_DV], tl.float32)  # packed: Σ p v on the p rows, Σ r v (hi, lo) on the others
    if ENTROPY:
        e_i = tl.zeros([G_PAD], tl.float32)  # Σ p_i (s_i − m): ≤ 0, relative to the running max
    if CERT:
        c_vec = tl.load(CEN + b * stride_cb + h * stride_ch + offs_dv * stride_cd, mask=dv_ok, other=0.0).to(tl.float32)
        a_i = tl.zeros([G_PAD], tl.float32)
        if not PACKED:
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
        if CERT:
            if HAS_AUX:  # the cache's own 1 − π and ‖v − c‖ of each slot (0 for certain tokens and padding)
                om = tl.load(om_base + offs * stride_ln, mask=valid, other=0.0)
                dn = tl.load(dev_base + offs * stride_ln, mask=valid, other=0.0)
                sq = dn * dn
            else:
                # (1 − π) = −expm1(log π): a Taylor series near 0 keeps its relative accuracy there
                x = tl.where(valid, lp, 0.0)
                series = -x * (1.0 + x * (0.5 + x * (0.16666666666666666 + x * (0.041666666666666664
                                                                                 + x * 0.008333333333333333))))
                om = tl.where(x > -0.125, series, 1.0 - tl.exp(x))
                om = tl.where(valid, tl.maximum(om, 0.0), 0.0)
                vc = tl.where(valid[:, None] & dv_ok[None, :], v.to(tl.float32) - c_vec[None, :], 0.0)
                sq = tl.sum(vc * vc, 1)
                dn = tl.sqrt(sq)
            wp = p * om[None, :]
            r = wp * p
            a2 = alpha * alpha
            a_i = a_i * a2 + tl.sum(r, 1)
            c_i = c_i * a2 + tl.sum(r * sq[None, :], 1)
            m0_i = tl.maximum(m0_i * alpha, tl.max(wp, 1))
            m1_i = tl.maximum(m1_i * alpha, tl.max(wp * dn[None, :], 1))
            if PACKED:  # one MMA: [p; r_hi; r_lo] · V, each row rescaled by its own factor (α or α²)
                op, factor = _packed_operand(p, r, kind, v, SPLIT_R, INTERP_BF16)
                if INTERP_BF16:
                    pv = tl.dot(op, v.to(tl.float32), input_precision="ieee")
                else:
                    pv = tl.dot(op, v, input_precision=DOT_PREC)
                acc = acc * tl.where(kind == 0, alpha, a2)[:, None] + pv * factor[:, None]
            else:
                if INTERP_BF16:
                    pv = tl.dot(_round_bf16(p), v.to(tl.float32), input_precision="ieee")
                else:
                    pv = tl.dot(p.to(V.dtype.element_ty), v, input_precision=DOT_PREC)
                acc = acc * alpha[:, None] + pv
                b_acc = b_acc * a2[:, None] + _raw_moment(r, v, SPLIT_R, INTERP_BF16, CERT_PREC)
        else:
            if INTERP_BF16:
                pv = tl.dot(_round_bf16(p), v.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(p.to(V.dtype.element_ty), v, input_precision=DOT_PREC)
            acc = acc * alpha[:, None] + pv
        m_i = m_new

    if CERT and PACKED:
        b_acc = _packed_b(acc, offs_g, group, SPLIT_R, G_PAD)  # B of query row g on row g, as unpacked

    if SPLIT:
        # partial state [B, HKV, group, n_splits(, DV)], contiguous: the merge's program of one query row
        # reads its splits' state as contiguous vectors
        row = (pid_bh * group + offs_g) * n_splits + split
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
        hq = h * group + offs_g
        o_ptrs = OUT + b * stride_ob + hq[:, None] * stride_oh + offs_dv[None, :] * stride_od
        if INTERP_OUT_BF16:
            tl.store(o_ptrs, _round_bf16(out).to(OUT.dtype.element_ty), mask=g_ok[:, None] & dv_ok[None, :])
        else:
            tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=g_ok[:, None] & dv_ok[None, :])
        srow = b * (HKV * group) + hq
        lse = tl.where(nonempty, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        tl.store(LSE + srow, lse, mask=g_ok)
        trow = tl.load(STEP).to(tl.int64) * stride_step + srow  # the statistics' row at the device step index
        if ENTROPY:
            tl.store(ENT + trow, _entropy(l_i, e_i), mask=g_ok)
        if CERT:
            out_c = tl.where(dv_ok[None, :], out - c_vec[None, :], 0.0)
            var = _variance(c_i, b_acc, a_i, c_vec, out_c, l_safe)
            oc = tl.sqrt(tl.sum(out_c * out_c, 1))
            rng = (m1_i + m0_i * oc) / l_safe
            tl.store(VAR + trow, var, mask=g_ok)
            tl.store(RNG + trow, rng, mask=g_ok)
            if HAS_NORM:
                tl.store(NORM + trow, tl.sqrt(tl.sum(out * out, 1)), mask=g_ok)
            if SKETCH:
                _sketch_epilogue(
                    Q, SK_C, SK_S, SK_E, SK_D, SK_N, SV, SR, b, h, trow, tl.where(nonempty, m_i + tl.log2(l_safe), float("inf")), oc,
                    scale_log2e, n_slots, group, stride_qb, stride_qh, stride_qd,
                    stride_kcb, stride_kch, stride_kcr, stride_kcd, stride_ksb, stride_ksh, stride_ksr,
                    stride_knb, stride_knh, G_PAD=G_PAD, D=D, BLOCK_D=BLOCK_D, BLOCK_R=BLOCK_R, DOT16=SK_DOT16,
                )


@triton.jit
def _sketch_row(
    Q, SK_C, SK_S, SK_E, SK_D, SK_N, SV, SR,
    b, h, hq, trow, lse2, oc, scale_log2e, n_slots,
    stride_qb, stride_qh, stride_qd,
    stride_kcb, stride_kch, stride_kcr, stride_kcd,
    stride_ksb, stride_ksh, stride_ksr,
    stride_knb, stride_knh,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
):
    """:func:`_sketch_epilogue` for one query row (the merge's program): Σ t_j and max t_j of its KV head's
    shadow tokens. q·codes as fp32 products and sums (the products of int8 codes and a 16-bit query are exact in
    fp32, as on the tensor cores; an fp32 query's round as in the ieee dot), the per-slot scale after."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_r = tl.arange(0, BLOCK_R)
    d_ok = offs_d < D
    q = tl.load(Q + b * stride_qb + hq * stride_qh + offs_d * stride_qd, mask=d_ok, other=0.0).to(tl.float32)
    qn = tl.sqrt(tl.sum(q * q, 0, keep_dims=True))  # [1]
    count = tl.load(SK_N + b * stride_knb + h * stride_knh).to(tl.int32)
    sv = tl.zeros([1], tl.float32)
    sr = tl.zeros([1], tl.float32)
    for r0 in range(0, n_slots, BLOCK_R):
        offs = r0 + offs_r
        r_ok = offs < count
        c_ptrs = SK_C + b * stride_kcb + h * stride_kch + offs[:, None] * stride_kcr + offs_d[None, :] * stride_kcd
        codes = tl.load(c_ptrs, mask=r_ok[:, None] & d_ok[None, :], other=0)
        sbase = b * stride_ksb + h * stride_ksh + offs * stride_ksr
        kscale = tl.load(SK_S + sbase, mask=r_ok, other=0.0)
        kerr = tl.load(SK_E + sbase, mask=r_ok, other=0.0)
        vdev = tl.load(SK_D + sbase, mask=r_ok, other=0.0)
        u = tl.sum(codes.to(tl.float32) * q[None, :], 1)  # [BLOCK_R]
        u = (u * kscale + qn * kerr) * scale_log2e
        t = tl.exp2(u - lse2) * (vdev + oc)
        t = tl.where(r_ok, t, 0.0)
        sv += tl.sum(t, 0, keep_dims=True)
        sr = tl.maximum(sr, tl.max(t, 0, keep_dims=True))
    tl.store(SV + trow, sv)
    tl.store(SR + trow, sr)


@triton.jit(do_not_specialize=["stride_step"])
def _merge(
    Q, CEN, OUT, LSE, VAR, RNG,
    P_M, P_L, P_ACC, P_A, P_B, P_C, P_M0, P_M1,
    SK_C, SK_S, SK_E, SK_D, SK_N, SV, SR, ENT, P_E,
    NORM, STEP,
    n_splits, scale_log2e, n_slots, group, stride_step,
    stride_qb, stride_qh, stride_qd,
    stride_cb, stride_ch, stride_cd,
    stride_ob, stride_oh, stride_od,
    stride_kcb, stride_kch, stride_kcr, stride_kcd,
    stride_ksb, stride_ksh, stride_ksr,
    stride_knb, stride_knh,
    HKV: tl.constexpr, DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_S: tl.constexpr,
    CERT: tl.constexpr, INTERP_OUT_BF16: tl.constexpr,
    SKETCH: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
    ENTROPY: tl.constexpr, HAS_NORM: tl.constexpr,
):
    # One program per query row (batch, query head), not per (batch, KV head, value block): everything the
    # finalisation needs is one row's — V̂ sums B_c·(ô − c) and ‖ô − c‖² over the whole value vector, the
    # sketch needs the row's final m and l and its whole ‖ô − c‖ — so a row's program finishes it alone, where a
    # value-block split would need a second reduction across programs; and B·Hq programs (32 at batch 1 on the
    # paper's 32-head models) are 4-7× the B·Hkv of a group's program. Each program reads its splits' partial
    # state as vectors, BLOCK_S splits at a time (contiguous: the workspace is [B, HKV, group, n_splits(, DV)]).
    # Rows are all shown as [1] / [1, BLOCK_DV] tiles, so the finalisation is the stage-1 kernel's.
    pid = tl.program_id(0)
    rows_b = HKV * group
    b = (pid // rows_b).to(tl.int64)
    hq = pid % rows_b
    h = hq // group
    base = pid.to(tl.int64) * n_splits  # (b·HKV + h)·group + g = pid
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < DV

    # pass 1: m = max_j m_j
    m_vec = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        j = s0 + offs_s
        m_vec = tl.maximum(m_vec, tl.load(P_M + base + j, mask=j < n_splits, other=float("-inf")))
    m = tl.max(m_vec, 0, keep_dims=True)  # [1]
    m_safe = tl.where(m == float("-inf"), 0.0, m)

    # pass 2: first moments weighted by ω_j = 2^(m_j − m), second moments by ω_j², maxima by max ω_j M_j
    l_i = tl.zeros([1], tl.float32)
    acc = tl.zeros([1, BLOCK_DV], tl.float32)
    if ENTROPY:
        e_i = tl.zeros([1], tl.float32)
    if CERT:
        a_i = tl.zeros([1], tl.float32)
        b_acc = tl.zeros([1, BLOCK_DV], tl.float32)
        c_i = tl.zeros([1], tl.float32)
        m0_i = tl.zeros([1], tl.float32)
        m1_i = tl.zeros([1], tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        j = s0 + offs_s
        ok = j < n_splits
        row = base + j
        vec = row[:, None] * DV + offs_dv[None, :]
        vmask = ok[:, None] & dv_ok[None, :]
        m_j = tl.load(P_M + row, mask=ok, other=float("-inf"))
        w = tl.exp2(m_j - m_safe)  # ω_j; 0 for an empty split (m_j = −inf) and past the last split
        l_j = tl.load(P_L + row, mask=ok, other=0.0)
        l_i += tl.sum(w * l_j, 0, keep_dims=True)
        if ENTROPY:  # the split's Σ p (s − m_j), re-centred on the merged max; an empty split adds 0
            e_j = tl.load(P_E + row, mask=ok, other=0.0) + (tl.where(l_j > 0.0, m_j, m_safe) - m_safe) * l_j
            e_i += tl.sum(tl.where(l_j > 0.0, w * e_j, 0.0), 0, keep_dims=True)
        acc += tl.sum(w[:, None] * tl.load(P_ACC + vec, mask=vmask, other=0.0), 0, keep_dims=True)
        if CERT:
            w2 = w * w
            a_i += tl.sum(w2 * tl.load(P_A + row, mask=ok, other=0.0), 0, keep_dims=True)
            b_acc += tl.sum(w2[:, None] * tl.load(P_B + vec, mask=vmask, other=0.0), 0, keep_dims=True)
            c_i += tl.sum(w2 * tl.load(P_C + row, mask=ok, other=0.0), 0, keep_dims=True)
            m0_i = tl.maximum(m0_i, tl.max(w * tl.load(P_M0 + row, mask=ok, other=0.0), 0, keep_dims=True))
            m1_i = tl.maximum(m1_i, tl.max(w * tl.load(P_M1 + row, mask=ok, other=0.0), 0, keep_dims=True))

    nonempty = l_i > 0.0
    l_safe = tl.where(nonempty, l_i, 1.0)
    out = acc / l_safe[:, None]
    o_ptrs = OUT + b * stride_ob + hq * stride_oh + offs_dv[None, :] * stride_od
    omask = dv_ok[None, :]
    if INTERP_OUT_BF16:
        tl.store(o_ptrs, _round_bf16(out).to(OUT.dtype.element_ty), mask=omask)
    else:
        tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=omask)
    srow = b * rows_b + hq + tl.zeros([1], tl.int64)
    lse = tl.where(nonempty, (m + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    tl.store(LSE + srow, lse)
    trow = tl.load(STEP).to(tl.int64) * stride_step + srow  # the statistics' row at the device step index
    if ENTROPY:
        tl.store(ENT + trow, _entropy(l_i, e_i))
    if CERT:
        c_vec = tl.load(CEN + b * stride_cb + h * stride_ch + offs_dv * stride_cd, mask=dv_ok, other=0.0).to(tl.float32)
        out_c = tl.where(dv_ok[None, :], out - c_vec[None, :], 0.0)
        var = _variance(c_i, b_acc, a_i, c_vec, out_c, l_safe)
        oc = tl.sqrt(tl.sum(out_c * out_c, 1))
        rng = (m1_i + m0_i * oc) / l_safe
        tl.store(VAR + trow, var)
        tl.store(RNG + trow, rng)
        if HAS_NORM:
            tl.store(NORM + trow, tl.sqrt(tl.sum(out * out, 1)))
        if SKETCH:
            _sketch_row(
                Q, SK_C, SK_S, SK_E, SK_D, SK_N, SV, SR, b, h, hq, trow,
                tl.where(nonempty, m + tl.log2(l_safe), float("inf")), oc, scale_log2e, n_slots,
                stride_qb, stride_qh, stride_qd, stride_kcb, stride_kch, stride_kcr, stride_kcd,
                stride_ksb, stride_ksh, stride_ksr, stride_knb, stride_knh, D=D, BLOCK_D=BLOCK_D, BLOCK_R=BLOCK_R,
            )


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return bool(triton.knobs.runtime.interpret)


_MODE_CHECKED = False


def _check_mode() -> None:
    """The interpreter needs ``TRITON_INTERPRET=1`` before ``triton.language`` is imported
    (its own helpers, tl.zeros, tl.sum..., are jitted at import); fail clearly otherwise.
    Checked once per process: neither the imports nor the variable's effect can change after."""
    global _MODE_CHECKED
    if _MODE_CHECKED:
        return
    from triton.runtime.interpreter import InterpretedFunction

    lang = isinstance(tl.zeros, InterpretedFunction)
    mine = isinstance(_stage1, InterpretedFunction)
    if lang != mine or (interpreting() and not mine):
        raise RuntimeError(
            "certified_decode: TRITON_INTERPRET was changed after triton (or kvcert_kernels) was imported; "
            "set it before the first import of triton"
        )
    _MODE_CHECKED = True


def _next_pow2(n: int, floor: int = 16) -> int:
    return max(floor, 1 << max(0, (int(n) - 1).bit_length()))


@dataclass(frozen=True)
class LaunchConfig:
    """Launch parameters of one kernel: keys per block (stage 1; the merge: splits per block, ``BLOCK_S``),
    warps, software-pipeline stages, ptxas's register cap (None: ptxas chooses), and the resident programs per
    SM the configuration is sized for (the split policy's program slots: SMs × this)."""

    block_n: int
    num_warps: int
    num_stages: int
    maxnreg: int | None = None
    ctas_per_sm: int = 4


def packs(group: int, dtype: torch.dtype, certificate: bool) -> bool:
    """Whether the stage-1 kernel packs the certificate into the padded rows of its p·V product (``PACKED``): the
    default of :func:`plan_decode` for a group of ``group`` query heads per KV head. With the certificate, when
    the group's rows times the kinds it needs (p, r_hi, r_lo: 3 with a 16-bit cache; p, r: 2 with fp32) fit in
    :data:`PACKED_ROWS` rows."""
    return bool(certificate) and packed_kinds(dtype) * int(group) <= PACKED_ROWS


#: the most rows a packed stage-1 tile takes (groups ≤ 5 pack into 16 rows, 6 to 10 into 32, in a 16-bit cache)
PACKED_ROWS = 16


def packed_kinds(dtype: torch.dtype) -> int:
    """Rows per query row in a packed tile: p, r_hi, r_lo (16-bit cache) or p, r (fp32: r is not split)."""
    return 2 if dtype == torch.float32 else 3


def tile_rows(group: int, dtype: torch.dtype, packed: bool) -> int:
    """``G_PAD``, the stage-1 tile's rows: the group (or its packed rows) padded to a power of two ≥ 16."""
    return _next_pow2(packed_kinds(dtype) * group if packed else group)


def launch_config(head_dim: int, value_dim: int, group: int, dtype: torch.dtype, *, certificate: bool,
                  sketch: bool, entropy: bool, arch: int | None, packed: bool | None = None) -> LaunchConfig:
    """The stage-1 kernel's launch parameters for a head size, query-per-KV group, cache dtype, the
    compiled-in options, the target's compute capability (None: the interpreter, where only correctness
    matters) and whether the certificate is packed into the p·V rows (None: :func:`packs`' choice).

    A decode step is memory-bound: each program streams its split's keys and values once, so what the
    configuration must buy is bytes in flight per SM. By Little's law an SM must keep bandwidth × latency / SMs
    in flight: 4.8 TB/s × ~0.8 µs / 132 ≈ 29 KB on an H200 (20 KB on an H100, 15 KB on an A100). A 16-bit cache
    at head size ≤ 128 takes **64-key tiles, 4 warps, a register cap of 255, 2 resident programs per SM**, 3
    pipeline stages on sm_90 and 2 on sm_80 (shared memory: 2 × 87.5 KB fit sm_90's 228 KB, 2 × 54.8 KB sm_80's
    164 KB): a tile is 64·(D + DV)·2 = 32 KB at D = 128, so 2 programs keep 131 KB (sm_90) / 66 KB (sm_80) in
    flight, 2.3–4.5× the H200's need, with a quarter of the 16-key tile's per-tile fixed work (row maxima and
    sums across the tile, barriers, loop overhead) per key. The candidates, compiled for sm_80 and sm_90 (bf16,
    head 128, the paper profile; ``kvcert bench kernel --compile-only``):

    * 16-key tiles (the earlier default; 3 stages, cap 168, 3 programs): no spill;
    * 32-key tiles (3 stages, no cap; packed, group 4): 142–150 registers on sm_90, 152–168 on sm_80 with
      8 bytes of stack in one variant (certificate + entropy), 3 programs;
    * **64-key tiles**, 4 warps, cap 255: packed certificate 199–224 registers, separate products (groups
      6, 7) 240–255, plain 163–187, no spill anywhere, 2 programs (shared memory and registers both allow 2);
      with ptxas's own choice (no cap) the packed certificate spills 8–16 bytes on sm_90 at 2 stages;
    * 64-key tiles at 8 warps (cap 128, 2 programs): 8–24 bytes of stack on sm_90 (groups 4 and 7).

    A packed group of 6 or more (32 rows, only when asked: :func:`packs` does not choose it) spills in the
    finalisation at every tile and warp count tried (16/32/64 keys, 4/8 warps: 8–296 bytes of stack): it runs
    16-key tiles of 8 warps, 1 program per SM, outside the compile tier. fp32 caches (double the tile bytes; the
    embedded model's) keep 16-key tiles: 32 keys spill (8–40 bytes of stack at head size 64 and 128); at head
    size ≤ 64 the certificate takes a cap of 255 (ptxas's own choice spills 8 bytes on sm_80, a cap of 168 on
    sm_90), at 128 8 warps and a cap of 255 (its own choice spills 8 bytes, a cap of 128 up to 120). The
    compile tier (tests/test_kernel_compile.py) fails on a spill anywhere or fewer resident programs than
    ``ctas_per_sm`` in the paper profile. Nothing here is measured on a GPU."""
    packed = packs(group, dtype, certificate) if packed is None else bool(packed) and bool(certificate)
    block = max(_next_pow2(head_dim), _next_pow2(value_dim))
    rows = tile_rows(group, dtype, packed)
    stages = 3 if arch is not None and arch >= 90 else 2  # sm_90's 228 KB of shared memory hold 2 × 3 stages
    if block <= 128 and dtype != torch.float32:
        if rows > 16:  # a packed group of 6 or more: 32 rows spill in the finalisation at every tile tried
            return LaunchConfig(16, 8, 2, ctas_per_sm=1)
        return LaunchConfig(64, 4, stages, maxnreg=255, ctas_per_sm=2)
    if block <= 64:  # fp32: the certificate spills 8 bytes under ptxas's own choice (sm_80) and a cap of 168 (sm_90)
        if certificate:
            return LaunchConfig(16, 4, 3, maxnreg=255, ctas_per_sm=2)
        return LaunchConfig(16, 4, 3, ctas_per_sm=4)
    if block <= 128:  # fp32: ptxas's own choice spills the packed certificate (8 bytes), as does a cap of 128
        return LaunchConfig(16, 8, 3, maxnreg=255, ctas_per_sm=1)
    return LaunchConfig(16, 8, 2, ctas_per_sm=1)


#: splits the merge reads per step of its loop (``BLOCK_S``): one vector load per statistic, one [32, DV] tile
MERGE_BLOCK_S = 32


def merge_config(value_dim: int, group: int, dtype: torch.dtype, *, certificate: bool, sketch: bool,
                 entropy: bool, arch: int | None) -> LaunchConfig:
    """The merge kernel's launch parameters: ``block_n`` is its ``BLOCK_S``, the splits it folds per step (one
    program per query row, :data:`MERGE_BLOCK_S` splits a step: vectors of the row statistics and a
    [BLOCK_S, DV] tile of each of acc and B; 113–122 registers under the cap of 128 at DV = 128)."""
    return LaunchConfig(MERGE_BLOCK_S, 4, 2, maxnreg=128)  # ptxas's own choice spills 8 bytes (sketch, D = 64, sm_80)


def device_arch(device: torch.device) -> int | None:
    """Compute capability of a CUDA device as major·10 + minor (90 for sm_90); None elsewhere or in the interpreter;
    the emulated GPU's under :func:`kvcert_kernels.launch.emulating`."""
    if emulation() is not None:
        return emulation().arch
    if device.type != "cuda" or interpreting():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def _regs(maxnreg: int | None) -> dict:
    """The ``maxnreg`` launch option (ptxas's register cap), where the configuration sets one."""
    return {} if maxnreg is None else {"maxnreg": int(maxnreg)}


_SMS: dict = {}


def _multiprocessors(device: torch.device) -> int:
    """The device's streaming multiprocessors (asked once per device; the emulated GPU's under
    :func:`kvcert_kernels.launch.emulating`)."""
    if emulation() is not None:
        return emulation().sms
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


# --- the per-call host work ------------------------------------------------------------------------------
# On a GPU a decode step's kernel time at batch 1 is tens of microseconds, and what the wrapper does on the
# host each call — buffer allocations through the caching allocator (a few µs each), argument checks, the two
# launches — was most of the measured time (docs/gpu.md, "Measured on an H200": 0.15 ms flat from 4k to 32k
# tokens, where SDPA takes 0.017–0.05 ms). So the split-K partial state, which never leaves one call, lives in
# one workspace per (device, stream, shape) that later calls reuse (calls on one stream run in order, so a
# later call's stage 1 cannot overwrite a partial state an earlier merge still reads); the three fp32
# statistics come from one allocation; the stand-ins for absent arguments are made once per device.
_WORKSPACES: dict = {}
_WORKSPACE_SLOTS = 16  # distinct (device, stream, shape) workspaces kept; the oldest goes first
_CONSTANTS: dict = {}


def _stream_key(dev: torch.device):
    """The stream later launches on ``dev`` are queued on (None off CUDA, where a call runs to its end)."""
    if dev.type != "cuda" or interpreting():
        return None
    return torch.cuda.current_stream(dev).cuda_stream


def _workspace(dev: torch.device, rows: int, dv: int, certificate: bool, entropy: bool, poison: bool):
    """The split-K partial state of one call: (m, l, acc, A, B, C, M0, M1, E) fp32, [rows] each but acc and B
    [rows, dv]; without the certificate A…M1 alias m, without the entropy E does. Each part starts on a
    128-byte boundary of one allocation (the kernels are compiled for 16-byte aligned pointers). ``poison``:
    fresh buffers full of NaN (tests), never the shared ones."""
    names = ["m", "l", "acc"] + (["a", "b", "c", "m0", "m1"] if certificate else []) + (["e"] if entropy else [])
    sizes = {name: rows * dv if name in ("acc", "b") else rows for name in names}
    padded = {name: -(-n // 32) * 32 for name, n in sizes.items()}
    if poison:
        flat = torch.full((sum(padded.values()),), float("nan"), device=dev, dtype=torch.float32)
    else:
        key = (dev, _stream_key(dev), rows, dv, certificate, entropy)
        found = _WORKSPACES.get(key)
        if found is not None:
            return found
        flat = torch.empty(sum(padded.values()), device=dev, dtype=torch.float32)
    parts, offset = {}, 0
    for name in names:
        part = flat.narrow(0, offset, sizes[name])
        parts[name] = part.view(rows, dv) if name in ("acc", "b") else part
        offset += padded[name]
    m = parts["m"]
    found = tuple(parts.get(name, m) for name in ("m", "l", "acc", "a", "b", "c", "m0", "m1", "e"))
    if not poison:
        if len(_WORKSPACES) >= _WORKSPACE_SLOTS:
            _WORKSPACES.pop(next(iter(_WORKSPACES)))
        _WORKSPACES[key] = found
    return found


def _constant(dev: torch.device, name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor the kernels only read (an absent log π, lengths or centre), made once per device and shape."""
    key = (dev, name, shape, dtype)
    t = _CONSTANTS.get(key)
    if t is None:
        if len(_CONSTANTS) >= 64:
            _CONSTANTS.clear()
        t = _CONSTANTS[key] = torch.zeros(shape, device=dev, dtype=dtype)
    return t


#: the split policy's margin: the fewest splits whose wave efficiency is within this factor of the best
WAVE_MARGIN = 0.95
MAX_SPLITS = 256  # splits per (batch, KV head) at most
MIN_BLOCKS_PER_SPLIT = 4  # key blocks per split at least


def chunking(seq_len: int, num_splits: int, block_n: int) -> tuple[int, int]:
    """(keys per split, splits) of ``num_splits`` requested over ``seq_len`` keys: whole ``block_n`` blocks a
    split, so the splits actually launched can be fewer than requested (what :func:`plan_decode` launches)."""
    chunk = -(-max(int(seq_len), 1) // max(1, int(num_splits)))
    chunk = -(-chunk // block_n) * block_n
    return chunk, max(1, -(-int(seq_len) // chunk))


def max_splits(seq_len: int, block_n: int) -> int:
    """The most splits the policy considers: ≥ :data:`MIN_BLOCKS_PER_SPLIT` key blocks each, ≤ :data:`MAX_SPLITS`."""
    return int(max(1, min(MAX_SPLITS, -(-int(seq_len) // (MIN_BLOCKS_PER_SPLIT * block_n)))))


def _efficiency(programs: int, slots: int) -> float:
    return programs / (-(-programs // slots) * slots)


def split_policy(batch: int, kv_heads: int, seq_len: int, block_n: int, slots: int) -> int:
    """Split-K count by wave efficiency (FlashAttention's ``num_splits_heuristic``): over the split counts the
    chunking can launch (1 to :func:`max_splits`), the efficiency of B·Hkv·splits programs on ``slots`` resident
    program slots (SMs × resident programs per SM) — programs / (waves × slots) — and the fewest splits within
    :data:`WAVE_MARGIN` of the best (fewer splits: less partial state, a shorter merge)."""
    bh = max(1, int(batch) * int(kv_heads))
    slots = max(1, int(slots))
    effs = {}
    for want in range(1, max_splits(seq_len, block_n) + 1):
        splits = chunking(seq_len, want, block_n)[1]
        effs.setdefault(splits, _efficiency(bh * splits, slots))
    best = max(effs.values())
    return min(n for n, e in effs.items() if e >= WAVE_MARGIN * best)


def default_num_splits(batch: int, kv_heads: int, length: int, device: torch.device, block_n: int,
                       ctas_per_sm: int = 4) -> int:
    """Split-K policy (:func:`split_policy`) for ``device``'s multiprocessors × ``ctas_per_sm`` resident programs
    (the launch configuration's): 1 off CUDA (the interpreter) unless a GPU is emulated."""
    if emulation() is None and (device.type != "cuda" or interpreting()):
        return 1
    return split_policy(batch, kv_heads, length, block_n, _multiprocessors(device) * max(1, int(ctas_per_sm)))


def wave_efficiency(batch: int, kv_heads: int, seq_len: int, cfg: LaunchConfig, sms: int,
                    num_splits: int | None = None) -> float:
    """Programs / (waves × resident program slots) of the stage-1 grid on ``sms`` multiprocessors with ``cfg``
    (slots = sms × ``cfg.ctas_per_sm``): ``num_splits`` requested (None: :func:`split_policy`'s), chunked as
    :func:`plan_decode` chunks it."""
    slots = max(1, int(sms) * max(1, int(cfg.ctas_per_sm)))
    if num_splits is None:
        num_splits = split_policy(batch, kv_heads, seq_len, cfg.block_n, slots)
    splits = chunking(seq_len, num_splits, cfg.block_n)[1]
    return _efficiency(max(1, int(batch) * int(kv_heads)) * splits, slots)


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


#: the per-step statistics a plan can write at a device step index (``plan_decode(stats=..., step=...)``)
STAT_NAMES = ("variance", "range_term", "output_norm", "shadow_sum", "shadow_range", "entropy")


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
    one_minus: torch.Tensor | None = None,
    dev: torch.Tensor | None = None,
    packed: bool | None = None,
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

    ``sketch`` (a :class:`kvcert.method.sketch.EvictionSketch` of the same batch and KV heads, with
    the certificate): the shadow terms are computed too, and two more tensors are returned,
    shadow_sum and shadow_range (fp32, the stat shape).

    ``entropy``: also the Shannon entropy (nats) of the attention distribution each query uses,
    p_i ∝ exp(s_i − log π_i) over the valid slots (0 for a head with none), fp32, the stat
    shape, appended as the last returned tensor (with or without the certificate). The
    other outputs are the same bits either way.

    ``one_minus``, ``dev`` [B, Hkv, L] fp32, log π's layout (both or neither): the cache's own 1 − π and
    ‖v − c‖ of each slot, read instead of recomputed from log π and the values.

    One call plans and launches (:func:`plan_decode`); a caller that decodes the same layer again keeps the
    plan (:class:`kvcert_kernels.launch.DecodePlan`) and runs it.
    """
    _check_mode()
    launches, results = plan_decode(
        query, key, value, log_pi, centre, scaling, lengths, certificate, num_splits, block_n=block_n,
        num_warps=num_warps, num_stages=num_stages, poison=poison, out=out, sketch=sketch, entropy=entropy,
        one_minus=one_minus, dev=dev, arch=device_arch(query.device), packed=packed,
    )
    for launch in launches:
        launch()
    return results


def decode_plan(query, key, value, log_pi, centre, scaling, lengths=None, certificate=True, **kwargs) -> DecodePlan:
    """:func:`plan_decode`'s launches and buffers as a :class:`~kvcert_kernels.launch.DecodePlan` (same arguments,
    the target's compute capability taken from the query's device): made once, run every decode step."""
    _check_mode()
    launches, results = plan_decode(query, key, value, log_pi, centre, scaling, lengths, certificate,
                                    arch=device_arch(query.device), **kwargs)
    return DecodePlan(launches, results)


def plan_decode(
    query, key, value, log_pi, centre, scaling, lengths=None, certificate=True, num_splits=None, *,
    block_n=None, num_warps=None, num_stages=None, poison=False, out=None, sketch=None, entropy=False, arch=None,
    one_minus=None, dev=None, stats=None, step=None, packed=None,
):
    """The launches of :func:`certified_decode` (same arguments, plus the target's compute
    capability ``arch``, e.g. 90; None: the interpreter's defaults) without running them:
    ``(launches, results)``, ``results`` the buffers the launches fill. The launch parameters
    come from :func:`launch_config` and :func:`merge_config` unless given;
    :mod:`kvcert_kernels.compile_check` compiles these same launches for a GPU it does not have.

    ``stats`` (with ``step``): the per-step statistics are written into these buffers instead of fresh ones,
    at the row a device step index says — a mapping from names of :data:`STAT_NAMES` to fp32 tensors
    [T, B, Hq] whose last two dimensions are contiguous, all with one stride between steps, and ``step`` an
    int32 tensor whose first element is the step (read by the kernels at launch). ``variance`` and
    ``range_term`` are needed with the certificate, ``shadow_sum`` and ``shadow_range`` with a sketch,
    ``entropy`` with the entropy; ``output_norm`` (‖ô‖ of each query row) is written where given. The
    results then hold these buffers in place of the per-call statistics."""
    _check(query, key, value, log_pi, centre, lengths)
    if sketch is not None and not certificate:
        raise ValueError("sketch: the shadow terms belong to the certificate; pass certificate=True")
    if sketch is not None and (tuple(sketch.codes.shape[:2]) != tuple(key.shape[:2]) or sketch.codes.shape[-1] != key.shape[-1]):
        raise ValueError(f"sketch: codes of shape {tuple(sketch.codes.shape)} do not fit key {tuple(key.shape)}")
    if (one_minus is None) != (dev is None):
        raise ValueError("one_minus, dev: give both (the cache's 1 − π and ‖v − c‖) or neither")
    if one_minus is not None:
        if log_pi is None:
            raise ValueError("one_minus, dev: they come with log π (a cache with no log π has no tail to certify)")
        for name, t in (("one_minus", one_minus), ("dev", dev)):
            if tuple(t.shape) != tuple(log_pi.shape) or t.stride() != log_pi.stride() or t.dtype != torch.float32:
                raise ValueError(f"{name}: expected fp32 of log π's shape {tuple(log_pi.shape)} and strides "
                                 f"{log_pi.stride()}, got {t.dtype} {tuple(t.shape)} {t.stride()}")
    if log_pi is not None and log_pi.dtype != torch.float32 and one_minus is not None:
        raise ValueError("log_pi: fp32 with one_minus and dev (the three share one layout)")
    q3 = query[:, :, 0] if query.ndim == 4 else query
    bsz, hq, d = q3.shape
    hkv, seq_len, dv = key.shape[1], key.shape[2], value.shape[-1]
    group = hq // hkv
    dev_ = query.device
    if (stats is None) != (step is None):
        raise ValueError("stats, step: give both (the statistics buffers and the device step index) or neither")
    if stats is not None:
        _check_stats(stats, step, bsz, hq, certificate, sketch is not None, entropy)
    packed = packs(group, key.dtype, certificate) if packed is None else bool(packed) and bool(certificate)
    g_pad = tile_rows(group, key.dtype, packed)
    block_d, block_dv = _next_pow2(d), _next_pow2(dv)
    cfg = launch_config(d, dv, group, key.dtype, certificate=certificate, sketch=sketch is not None,
                        entropy=entropy, arch=arch, packed=packed)
    # the register cap belongs to the configuration as a whole: a caller's own block size, warps or stages drop it
    maxnreg = cfg.maxnreg if (block_n, num_warps, num_stages) == (None, None, None) else None
    block_n = cfg.block_n if block_n is None else block_n
    num_warps = cfg.num_warps if num_warps is None else num_warps
    num_stages = cfg.num_stages if num_stages is None else num_stages
    if num_splits is None:
        num_splits = default_num_splits(bsz, hkv, seq_len, dev_, block_n, cfg.ctas_per_sm)
    chunk, num_splits = chunking(seq_len, num_splits, block_n)
    split = num_splits > 1

    stat_shape = (bsz, hq, 1) if query.ndim == 4 else (bsz, hq)
    # an emulated GPU computes nothing: its launches leave the buffers as made, zeros (finite outputs downstream)
    empty = torch.zeros if emulation() is not None else torch.empty
    if out is not None:
        output, lse, variance, range_term = out
    else:
        output = empty(query.shape[:-1] + (dv,), device=dev_, dtype=query.dtype)
        if certificate and stats is None:  # lse, V̂ and b̂_c from one allocation, each a contiguous slice on a 128-byte boundary
            n = bsz * hq
            stride = -(-n // 32) * 32
            flat = empty(3 * stride, device=dev_, dtype=torch.float32)
            lse, variance, range_term = (flat.narrow(0, i * stride, n).view(stat_shape) for i in range(3))
        else:
            lse, variance, range_term = empty(stat_shape, device=dev_, dtype=torch.float32), None, None
    if stats is not None:
        variance, range_term = stats.get("variance"), stats.get("range_term")
    o3 = output[:, :, 0] if output.ndim == 4 else output
    for t in (lse, variance, range_term):
        if t is not None and stats is None and not t.is_contiguous():
            raise ValueError("out: lse, variance and range_term must be contiguous")
    if centre is None:
        centre_t = _constant(dev_, "centre", (bsz, hkv, dv), torch.float32)
    else:
        centre_t = centre if centre.dtype == torch.float32 else centre.to(torch.float32)
    lp = log_pi if log_pi is not None else _constant(dev_, "log_pi", (1, 1, 1), torch.float32)
    if lp.dtype != torch.float32:
        lp = lp.to(torch.float32)
    len_t = lengths if lengths is not None else _constant(dev_, "lengths", (1, 1), torch.int32)
    if len_t.dtype not in (torch.int32, torch.int64):
        len_t = len_t.to(torch.int32)
    if step is None:
        step_t, stride_step = _constant(dev_, "step", (1,), torch.int32), 0
    else:
        step_t, stride_step = step, _step_stride(stats)

    if split:
        rows = bsz * hkv * num_splits * group
        p_m, p_l, p_acc, p_a, p_b, p_c, p_m0, p_m1, p_e = _workspace(dev_, rows, dv, certificate, entropy, poison)
    else:
        p_m = p_l = p_acc = p_a = p_b = p_c = p_m0 = p_m1 = p_e = lse
    if stats is not None:
        ent = stats.get("entropy") if entropy else None
    else:
        ent = empty(stat_shape, device=dev_, dtype=torch.float32) if entropy else None
    if poison:
        for t in (output, lse, variance, range_term, ent):
            if t is not None:
                t.fill_(float("nan"))
    var_arg = variance if variance is not None else lse
    rng_arg = range_term if range_term is not None else lse
    norm_t = stats.get("output_norm") if stats is not None and certificate else None
    norm_arg = norm_t if norm_t is not None else lse
    use_sketch = sketch is not None and sketch.slots > 0
    if sketch is not None:
        if stats is not None:  # a sketch without a shadow slot writes nothing: the caller's zeros stand
            shadow_v, shadow_r = stats["shadow_sum"], stats["shadow_range"]
        else:
            shadow_v = torch.zeros(stat_shape, device=dev_, dtype=torch.float32)
            shadow_r = torch.zeros(stat_shape, device=dev_, dtype=torch.float32)
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
    mcfg = merge_config(dv, group, query.dtype, certificate=certificate, sketch=use_sketch, entropy=entropy, arch=arch)
    sr_arg = shadow_r if use_sketch else lse
    om_arg, dev_arg = (one_minus, dev) if one_minus is not None else (lp, lp)

    interp = interpreting()  # the interpreter's fp32 → bf16 cast truncates: round explicitly there
    interp_out = interp and output.dtype == torch.bfloat16
    fp32 = key.dtype == torch.float32
    sk_dot16 = use_sketch and query.dtype != torch.float32 and not interp
    dot_prec = "ieee" if fp32 else "tf32"
    cert_prec = "ieee" if fp32 else "tf32"
    # argument 0 is the caller's query itself (q3's strides describe it: the pointer is the same), so a plan run
    # over a new query swaps the tensor and nothing else
    launches = [Launch(_stage1, (bsz * hkv, num_splits), (
        query, key, value, lp, centre_t, len_t,
        o3, lse, var_arg, rng_arg,
        p_m, p_l, p_acc, p_a, p_b, p_c, p_m0, p_m1,
        sk_c, sk_s, sk_e, sk_d, sk_n, sv_arg, sr_arg, ent if entropy else lse, p_e,
        om_arg, dev_arg, norm_arg, step_t,
        float(scaling) * LOG2E, seq_len, chunk, num_splits, n_slots, group, stride_step,
        q3.stride(0), q3.stride(1), q3.stride(2),
        key.stride(0), key.stride(1), key.stride(2), key.stride(3),
        value.stride(0), value.stride(1), value.stride(2), value.stride(3),
        lp.stride(0), lp.stride(1), lp.stride(2),
        centre_t.stride(0), centre_t.stride(1), centre_t.stride(2),
        len_t.stride(0), len_t.stride(1),
        o3.stride(0), o3.stride(1), o3.stride(2),
        *sk_strides,
    ), dict(
        HKV=hkv, G_PAD=g_pad, D=d, DV=dv, BLOCK_D=block_d, BLOCK_DV=block_dv, BLOCK_N=block_n,
        CERT=bool(certificate), HAS_LP=log_pi is not None, HAS_LEN=lengths is not None, SPLIT=split,
        SKETCH=use_sketch and not split, BLOCK_R=SKETCH_BLOCK, SK_DOT16=sk_dot16,
        DOT_PREC=dot_prec, CERT_PREC=cert_prec, SPLIT_R=not fp32,
        INTERP_BF16=interp and key.dtype == torch.bfloat16, INTERP_OUT_BF16=interp_out,
        ENTROPY=bool(entropy), HAS_AUX=one_minus is not None, HAS_NORM=norm_t is not None, PACKED=packed,
        num_warps=num_warps, num_stages=num_stages, **_regs(maxnreg),
    ))]
    if split:
        launches.append(Launch(_merge, (bsz * hq,), (
            query, centre_t, o3, lse, var_arg, rng_arg,
            p_m, p_l, p_acc, p_a, p_b, p_c, p_m0, p_m1,
            sk_c, sk_s, sk_e, sk_d, sk_n, sv_arg, sr_arg, ent if entropy else lse, p_e,
            norm_arg, step_t,
            num_splits, float(scaling) * LOG2E, n_slots, group, stride_step,
            q3.stride(0), q3.stride(1), q3.stride(2),
            centre_t.stride(0), centre_t.stride(1), centre_t.stride(2),
            o3.stride(0), o3.stride(1), o3.stride(2),
            *sk_strides,
        ), dict(
            HKV=hkv, DV=dv, BLOCK_DV=block_dv, BLOCK_S=mcfg.block_n, CERT=bool(certificate),
            INTERP_OUT_BF16=interp_out, SKETCH=use_sketch, D=d, BLOCK_D=block_d, BLOCK_R=SKETCH_BLOCK,
            ENTROPY=bool(entropy), HAS_NORM=norm_t is not None,
            num_warps=mcfg.num_warps, num_stages=mcfg.num_stages, **_regs(mcfg.maxnreg),
        )))
    res = (output, lse, variance, range_term) + ((shadow_v, shadow_r) if sketch is not None else ())
    return launches, (res + (ent,) if entropy else res)


def _step_stride(stats: dict) -> int:
    return next(iter(stats.values())).stride(0)


def _check_stats(stats: dict, step: torch.Tensor, bsz: int, hq: int, certificate: bool, sketch: bool,
                 entropy: bool) -> None:
    """``plan_decode``'s ``stats`` and ``step`` as its docstring says, or one line saying what differs."""
    unknown = set(stats) - set(STAT_NAMES)
    if unknown:
        raise ValueError(f"stats: unknown statistics {sorted(unknown)}; the names are {', '.join(STAT_NAMES)}")
    needed = (["variance", "range_term"] if certificate else []) + (["shadow_sum", "shadow_range"] if sketch else []) \
        + (["entropy"] if entropy else [])
    missing = [n for n in needed if n not in stats]
    if missing:
        raise ValueError(f"stats: {', '.join(missing)} missing (needed by what this decode computes)")
    strides = {t.stride(0) for t in stats.values()}
    for name, t in stats.items():
        if t.dtype != torch.float32 or t.ndim != 3 or tuple(t.shape[1:]) != (bsz, hq) or t.stride()[1:] != (hq, 1):
            raise ValueError(f"stats: {name} must be fp32 [T, {bsz}, {hq}] with contiguous rows, got {t.dtype} "
                             f"{tuple(t.shape)} strides {t.stride()}")
    if len(strides) != 1:
        raise ValueError(f"stats: the buffers' step strides differ ({sorted(strides)}); give views of one tensor")
    if step.dtype != torch.int32 or step.numel() < 1 or step.device != next(iter(stats.values())).device:
        raise ValueError("step: an int32 tensor on the statistics' device, its first element the step index")


def decode_bytes(key: torch.Tensor, value: torch.Tensor, log_pi: torch.Tensor | None, lengths=None) -> int:
    """Bytes of cache one decode step reads (keys, values, log π of the valid slots)."""
    b, h, seq_len = key.shape[:3]
    tokens = b * h * seq_len if lengths is None else int(lengths.clamp(max=seq_len).sum())
    per = key.shape[-1] * key.element_size() + value.shape[-1] * value.element_size()
    per += 4 if log_pi is not None else 0
    return tokens * per


__all__ = [
    "STAT_NAMES", "DecodePlan", "Launch", "LaunchConfig", "QueryMismatch", "certified_decode", "chunking", "decode_bytes",
    "decode_plan", "default_num_splits", "device_arch", "interpreting", "launch_config", "max_splits", "merge_config",
    "packs", "plan_decode", "split_policy", "tile_rows", "wave_efficiency",
]
