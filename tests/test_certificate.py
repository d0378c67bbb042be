"""Certificate: one-pass vs float64 two-pass, split-K merge, radius, and Monte-Carlo checks."""

from __future__ import annotations

import math

import pytest
import torch

from kvcert import (
    RetentionDesign,
    anytime_radius,
    bernstein_radius,
    certificate_reference,
    certified_attention,
    hajek_attention,
    inclusion_probabilities,
    poisson_sample,
)
from kvcert.method.certificate import aggregate, anytime_delta
from online_certificate import OnlineCertificate


def random_retained(seed=0, b=2, hq=4, hkv=2, q=3, length=257, d=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(b, hq, q, d, generator=g).to(dtype)
    key = torch.randn(b, hkv, length, d, generator=g).to(dtype)
    value = (torch.randn(b, hkv, length, d, generator=g) + 3.0).to(dtype)  # a shared offset tests the centring
    log_pi = torch.log(torch.rand(b, hkv, length, generator=g).clamp(min=0.05))
    log_pi[..., :20] = 0.0
    log_pi[0, 1, -7:] = float("inf")  # ragged head: padding
    return query, key, value, log_pi


def grouped_reference(query, key, value, log_pi, scale, centre=None):
    b, hq, q, d = query.shape
    hkv = key.shape[1]
    qq = query.reshape(b, hkv, hq // hkv, q, d)
    c = None if centre is None else centre.unsqueeze(2)
    ref = certificate_reference(qq, key.unsqueeze(2), value.unsqueeze(2), log_pi.unsqueeze(2), scale, centre=c)
    return ref, (b, hkv, hq // hkv, q)


@pytest.mark.parametrize("seed", [0, 1])
def test_one_pass_matches_two_pass_float64(seed):
    query, key, value, log_pi = random_retained(seed)
    centre = value.mean(2)
    res = hajek_attention(query, key, value, log_pi, 0.25, causal=False, certificate=True, centre=centre)
    ref, shape = grouped_reference(query, key, value, log_pi, 0.25, centre)
    torch.testing.assert_close(res.output.reshape(*shape, -1).double(), ref.output, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(res.variance.reshape(shape).double(), ref.variance, rtol=1e-4, atol=1e-9)
    torch.testing.assert_close(res.range_term.reshape(shape).double(), ref.range_bound, rtol=1e-4, atol=1e-9)
    # the served range term bounds the exact one
    assert (ref.range_bound >= ref.range_exact - 1e-12).all()


def test_variance_near_zero_is_relatively_accurate():
    """One tail token holding nearly all the attention, its value far from the centre: the
    one-pass terms are ~1e4 x V̂ (fp32 one-pass: ~5e-3 off); the rows where they cancel are
    recomputed directly, so V̂ stays within 1e-4 of float64 relative to itself."""
    query, key, value, log_pi = random_retained(3, q=1)
    key[0, 0, 40] = query[0, 0, 0] * 5.5  # query head 0 attends to slot 40 (a tail token) almost alone
    value[0, 0, 40] += 30.0
    log_pi[0, 0, 40] = -0.5
    centre = value.mean(2)
    res = hajek_attention(query, key, value, log_pi, 0.25, causal=False, certificate=True, centre=centre)
    ref, shape = grouped_reference(query, key, value, log_pi, 0.25, centre)
    var = res.variance.reshape(shape).double()
    size = ref.range_bound[0, 0, 0, 0] ** 2  # the scale of the cancelling terms
    assert float(ref.variance[0, 0, 0, 0]) < 1e-3 * float(size)  # the ill-conditioned case is there
    torch.testing.assert_close(var, ref.variance, rtol=1e-4, atol=0)


def test_float64_inputs_stay_float64():
    query, key, value, log_pi = random_retained(2, dtype=torch.float64)
    res = hajek_attention(query, key, value, log_pi, 0.25, causal=False, certificate=True)
    ref, shape = grouped_reference(query, key, value, log_pi, 0.25)
    assert res.variance.dtype == torch.float64
    # float64 rounding of V̂ follows the size of its summands (range_bound²), not V̂'s own: an absolute floor at
    # that scale, so a V̂ near 0 is compared by what its rounding can be
    floor = 1e-12 * float(ref.range_bound.max()) ** 2
    torch.testing.assert_close(res.variance.reshape(shape), ref.variance, rtol=1e-10, atol=floor)


def test_online_accumulators_split_k_merge():
    query, key, value, log_pi = random_retained(3, b=1, hq=2, hkv=2, q=1)
    centre = value.mean(2)
    lead = (1, 2, 1, 1)
    logits = (query.double().reshape(1, 2, 1, 1, 16) @ key.double().unsqueeze(2).transpose(-1, -2)) * 0.25
    parts = []
    for lo, hi in [(0, 64), (64, 200), (200, 257)]:
        acc = OnlineCertificate(lead, 16, centre=centre.double().reshape(1, 2, 1, 1, 16))
        n = hi - lo
        acc.update(
            logits[..., lo:hi],
            log_pi.double()[:, :, None, None, lo:hi].expand(*lead, n),
            value.double()[:, :, None, None, lo:hi].expand(*lead, n, 16),
        )
        parts.append(acc)
    parts[0].merge(parts[1])
    parts[0].merge(parts[2])
    out, var, rng, lse = parts[0].finalize()
    ref, _ = grouped_reference(query.double(), key.double(), value.double(), log_pi.double(), 0.25, centre.double())
    torch.testing.assert_close(out, ref.output, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(var, ref.variance, rtol=1e-8, atol=1e-14)
    torch.testing.assert_close(rng, ref.range_bound, rtol=1e-8, atol=1e-14)
    full_lse = torch.logsumexp(logits - log_pi.double()[:, :, None, None, :], -1)
    torch.testing.assert_close(lse, full_lse, rtol=1e-10, atol=1e-10)


def test_certain_tokens_contribute_nothing():
    query, key, value, _ = random_retained(4)
    res = certified_attention(query, key, value, torch.zeros(key.shape[:3]))
    assert (res.variance == 0).all() and (res.range_term == 0).all() and (res.radius == 0).all()


def test_radius_golden_values():
    v = torch.tensor([1.0, 0.0, 0.04])
    b = torch.tensor([0.0, 0.3, 0.1])
    big_l = math.log(20.0)
    expected = torch.tensor(
        [math.sqrt(2 * big_l), (2 / 3) * 0.3 * big_l, math.sqrt(2 * 0.04 * big_l) + (2 / 3) * 0.1 * big_l]
    )
    torch.testing.assert_close(bernstein_radius(v, b, 0.1), expected)


def test_anytime_union_bound():
    steps = torch.arange(1, 100001)
    assert abs(float(anytime_delta(0.1, steps).sum()) - 0.1 * (1 - 1 / 100001)) < 1e-12
    v, b = torch.tensor([0.5]), torch.tensor([0.1])
    r1 = anytime_radius(v, b, 0.1, 1)
    r10 = anytime_radius(v, b, 0.1, 10)
    assert r10 > r1 > bernstein_radius(v, b, 0.1)
    torch.testing.assert_close(r1, bernstein_radius(v, b, 0.05))  # δ_1 = δ/2


def test_aggregations():
    x = torch.tensor([[1.0, 3.0], [2.0, 2.0]])
    assert aggregate(x, "max", (0, 1)) == 3.0
    assert aggregate(x, "mean", (0, 1)) == 2.0
    assert abs(float(aggregate(x, "rms", (0, 1))) - math.sqrt(4.5)) < 1e-6
    with pytest.raises(ValueError, match="aggregation"):
        aggregate(x, "median", (0,))


# --- Monte-Carlo properties on synthetic heavy-tailed attention -------------------------


def student_t_attention(seed, n=2000, d=16, nu=3, scale=0.5, noise=0.0):
    """Logits s_i ~ scale · t_ν (integer ν, built from normals), values ~ N(0, I).

    The importance that sets π is e^{s_i + noise·ε_i}: with noise > 0 it comes from a
    perturbed query, as when the query that set π is not the one being answered.
    """
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, generator=g, dtype=torch.float64)
    chi2 = torch.randn(n, nu, generator=g, dtype=torch.float64).pow(2).sum(-1)
    logits = z / torch.sqrt(chi2 / nu) * scale
    importance_logits = logits + noise * torch.randn(n, generator=g, dtype=torch.float64)
    values = torch.randn(n, d, generator=g, dtype=torch.float64)
    return logits, importance_logits, values, g


def draw_certificates(attention, budget, top_fraction, draws):
    """M Poisson samples of one head: realised error ‖ô − o‖, V̂ and the radius at δ = 0.1."""
    logits, importance_logits, values, g = attention
    full = torch.softmax(logits, 0) @ values
    importance = torch.exp(importance_logits - importance_logits.max())
    pi = inclusion_probabilities(importance, budget, RetentionDesign(top_fraction=top_fraction))
    sample = poisson_sample(pi.expand(draws, -1), g)
    key = logits[sample.indices].reshape(draws, 1, -1, 1)
    val = values[sample.indices].reshape(draws, 1, -1, values.shape[-1])
    query = torch.ones(draws, 1, 1, 1, dtype=torch.float64)
    res = certified_attention(query, key, val, sample.log_pi.unsqueeze(1), delta=0.1, scaling=1.0)
    err = torch.linalg.vector_norm(res.output[:, 0, 0] - full, dim=-1)
    return err, res.variance[:, 0, 0], res.radius[:, 0, 0]


def test_expected_variance_estimate_matches_realised_mse():
    """E[V̂] = E‖ô − o‖² to first order: the paired difference is within 4 standard errors."""
    m = 400
    err, var, _ = draw_certificates(student_t_attention(seed=21), 0.125, 0.25, m)
    diff = var - err.pow(2)
    se = diff.std() / math.sqrt(m)
    assert abs(diff.mean()) <= 4 * se
    assert err.pow(2).mean() > 1e-3  # the regime has real sampling error


HEAVY = dict(seed=0, nu=3, scale=1.5, noise=1.0)


def test_coverage_with_top_slice_at_delta_0_1():
    m = 400
    err, _, radius = draw_certificates(student_t_attention(**HEAVY), 0.25, 0.25, m)
    coverage = (err <= radius).double().mean().item()
    assert coverage >= 0.9 - 2 * math.sqrt(0.09 / m)
    assert err.median() > 1e-8  # errors well above float64 rounding


def test_coverage_drops_without_top_slice():
    """Without the certainty slice a heavy token is sometimes missed and V̂ cannot see it."""
    m = 400
    err, _, radius = draw_certificates(student_t_attention(**HEAVY), 0.25, 0.0, m)
    err_s, _, radius_s = draw_certificates(student_t_attention(**HEAVY), 0.25, 0.25, m)
    without = (err <= radius).double().mean().item()
    with_slice = (err_s <= radius_s).double().mean().item()
    assert without <= 0.8
    assert with_slice - without >= 0.15


def test_certified_attention_errors_name_arguments():
    q, k, v, lp = random_retained(5)
    with pytest.raises(ValueError, match="delta"):
        certified_attention(q, k, v, lp, delta=1.0)
    with pytest.raises(ValueError, match="delta"):
        certified_attention(q, k, v, lp, delta=0.0)
    with pytest.raises(ValueError, match="query"):
        certified_attention(q[0], k, v, lp)
    with pytest.raises(ValueError, match="log_pi"):
        certified_attention(q, k, v, lp[..., :-1])
    with pytest.raises(ValueError, match="log_pi"):
        certified_attention(q, k, v, lp.abs() + 0.5)
    bad = lp.clone()
    bad[0, 0, 30] = float("nan")
    with pytest.raises(ValueError, match="log_pi"):
        certified_attention(q, k, v, bad)
    with pytest.raises(ValueError, match="query"):
        certified_attention(torch.randn(2, 3, 1, 16), k, v, lp)


def test_certified_attention_edge_cases_are_named_not_nan():
    """Inputs that used to give a NaN output silently (π = 0, an all-padding row, a NaN
    query or scaling) or a bare IndexError/RuntimeError (an empty cache, mixed dtypes)
    are refused in one line naming the argument."""
    q, k, v, lp = random_retained(5)
    zero = lp.clone()
    zero[0, 0, 3] = float("-inf")
    padded = lp.clone()
    padded[0, 1] = float("inf")
    nan_q = q.clone()
    nan_q[0, 0, 0, 0] = float("nan")
    cases = [
        ((q, k, v, zero), {}, "log_pi: -inf"),
        ((q, k, v, padded), {}, "log_pi: a .* row holds only padding"),
        ((nan_q, k, v, lp), {}, "query: contains NaN"),
        ((q, k, v, lp), {"scaling": float("nan")}, "scaling: must be a finite number"),
        ((q, k[:, :, :0], v[:, :, :0], lp[:, :, :0]), {}, "key: the cache holds no token"),
        ((q, k.to(torch.bfloat16), v, lp), {}, "dtypes differ"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            certified_attention(*args, **kwargs)
        assert "\n" not in str(info.value)
    out = certified_attention(q, k, v, lp)  # the valid call still works and is finite
    assert torch.isfinite(out.output).all() and torch.isfinite(out.radius).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("with_sketch", [False, True])
def test_the_decode_fast_path_equals_the_general_path_and_the_float64_reference(monkeypatch, dtype, with_sketch):
    """A decode step with the certificate takes :func:`kvcert.method.attention._certified_decode` (fewer operations, an
    fp32 combination of V̂): the same output, V̂, b̂_c and shadow terms as the general path, and V̂, b̂_c equal to
    the float64 two-pass reference within the tolerances above, ragged padding included."""
    import kvcert.method.attention as attention
    from kvcert.method.attention import squared_deviation
    from kvcert.method.sketch import build_sketch

    query, key, value, log_pi = random_retained(seed=5, q=1, dtype=dtype)
    centre = value.mean(2)
    one_minus = torch.expm1(log_pi).neg().clamp(min=0).to(dtype)
    dev = squared_deviation(value, centre).sqrt()
    g = torch.Generator().manual_seed(1)
    sketch = build_sketch(torch.randn(2, 2, 32, 16, generator=g).to(dtype), torch.randn(2, 2, 32, 16, generator=g).to(dtype),
                          torch.ones(2, 2, 32, dtype=torch.bool), torch.randn(2, 2, 32, generator=g), centre, 16) if with_sketch else None
    kwargs = dict(certificate=True, one_minus=one_minus, dev=dev, centre=centre, sketch=sketch, entropy=True)
    monkeypatch.setattr(attention, "_FAST_DECODE", True)
    fast = hajek_attention(query, key, value, log_pi, 0.25, **kwargs)
    monkeypatch.setattr(attention, "_FAST_DECODE", False)
    general = hajek_attention(query, key, value, log_pi, 0.25, **kwargs)
    assert fast.entropy is not None and torch.isfinite(fast.entropy).all()
    for name in ("output", "variance", "range_term", "shadow_sum", "shadow_range", "entropy"):
        a, b = getattr(fast, name), getattr(general, name)
        assert (a is None) == (b is None) == (name.startswith("shadow") and not with_sketch), name
        if a is not None:
            torch.testing.assert_close(a, b, rtol=2e-5 if dtype == torch.float32 else 1e-12, atol=1e-9)
    ref, shape = grouped_reference(query.double(), key.double(), value.double(), log_pi.double(), 0.25, centre.double())
    torch.testing.assert_close(fast.variance.reshape(shape).double(), ref.variance, rtol=1e-4, atol=1e-9)
    torch.testing.assert_close(fast.range_term.reshape(shape).double(), ref.range_bound, rtol=1e-4, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_deferred_certificates_combined_per_forward_equal_each_layers_own(dtype):
    """``defer``: a decode step returns its certificate's sums and :func:`kvcert.method.attention.combine_pending` combines
    the steps of a forward's layers stacked — the same bits as each step's own combination, for steps of different
    lengths and shapes (combined apart), and for a step with a shaky row (one tail token holding the attention:
    :func:`kvcert.method.attention._variance` recomputes it)."""
    from kvcert.method.attention import combine_pending, squared_deviation

    steps = [random_retained(seed=s, q=1, length=n, dtype=dtype) for s, n in ((5, 257), (6, 120), (7, 257))]
    steps.append(random_retained(seed=8, b=1, hq=6, hkv=2, q=1, length=64, dtype=dtype))
    query, key, value, log_pi = steps[1]
    key[0, 0, 30] = query[0, 0, 0] * 40.0  # one sampled token takes the attention of query head 0
    log_pi[0, 0, 30] = math.log(0.5)
    eager, pending = [], []
    for query, key, value, log_pi in steps:
        centre = value.mean(2)
        kwargs = dict(certificate=True, one_minus=torch.expm1(log_pi).neg().clamp(min=0).to(dtype),
                      dev=squared_deviation(value, centre).sqrt(), centre=centre)
        eager.append(hajek_attention(query, key, value, log_pi, 0.25, **kwargs))
        res = hajek_attention(query, key, value, log_pi, 0.25, defer=True, **kwargs)
        assert res.variance is None and res.pending is not None
        assert torch.equal(res.output, eager[-1].output)
        pending.append(res.pending)
    for res, (var, rng, norm) in zip(eager, combine_pending(pending)):
        assert torch.equal(var, res.variance) and torch.equal(rng, res.range_term)
        assert torch.equal(norm, torch.linalg.vector_norm(res.output, dim=-1))
