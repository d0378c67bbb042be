"""vAttention's estimator (kvcert.method.vattention): a float64 per-row reference, exactness when the deterministic
part covers everything, unbiased numerator and denominator (Monte Carlo, tolerances from the number of draws), the
budget rule against its ε statement, the Horvitz–Thompson inclusion probability, and the denominator bound's
coverage on synthetic attention."""

from __future__ import annotations

import math

import pytest
import torch

from kvcert.method.vattention import (
    budget_rule, denominator_bound, deterministic_set, ht_inclusion, normal_quantile, stated_epsilon, uniform_draws,
    vattention_attention,
)

F64 = torch.float64


def _synthetic(rows: int, length: int, dim: int, scale: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, length, generator=g, dtype=F64) * scale
    values = torch.randn(length, dim, generator=g, dtype=F64)
    return logits, values, g


def _reference(logits, values, det, picks):
    """Token by token, one row: (ô, D̂, ô_HT, D̂_HT, σ̂) from the drawn positions ``picks`` (with repeats)."""
    e = torch.exp(logits - logits.max())
    residual = [i for i in range(len(e)) if not det[i]]
    n, b = len(residual), len(picks)
    d_det = sum(float(e[i]) for i in range(len(e)) if det[i])
    n_det = sum((e[i] * values[i] for i in range(len(e)) if det[i]), torch.zeros(values.shape[1], dtype=F64))
    den = d_det + n / b * sum(float(e[i]) for i in picks)
    num = n_det + n / b * sum(e[i] * values[i] for i in picks)
    pi = 1 - (1 - 1 / n) ** b
    den_ht = d_det + sum(float(e[i]) for i in set(picks)) / pi
    num_ht = n_det + sum(e[i] * values[i] for i in set(picks)) / pi
    sigma = float(torch.tensor([float(e[i]) for i in picks], dtype=F64).std())
    return num / den, den, num_ht / den_ht, den_ht, sigma


def test_deterministic_set_holds_sinks_window_and_the_heavy_hitters():
    logits, _, _ = _synthetic(3, 40, 2, 1.0, 0)
    det = deterministic_set(logits, 4, 32, torch.tensor([0, 3, 5]))
    assert det[:, :4].all() and det[:, 32:].all()
    for r, k in enumerate((0, 3, 5)):
        middle = det[r, 4:32]
        assert int(middle.sum()) == k
        if k:
            top = set(logits[r, 4:32].topk(k).indices.add(4).tolist())
            assert set((torch.nonzero(middle).flatten() + 4).tolist()) == top
    visible = torch.arange(40) < 36
    assert not deterministic_set(logits, 4, 32, 2, visible)[:, 36:].any()


def test_uniform_draws_count_b_draws_on_the_residual_only():
    residual = torch.zeros(2, 30, dtype=torch.bool)
    residual[0, 5:20] = True
    residual[1, ::3] = True
    u = torch.rand(2, 7, generator=torch.Generator().manual_seed(1), dtype=F64)
    counts = uniform_draws(residual, torch.tensor([7, 4]), u)
    assert counts.sum(-1).tolist() == [7.0, 4.0] and not counts[~residual].any()
    pos = torch.nonzero(residual[1]).flatten()
    want = torch.zeros(30, dtype=F64)
    for j in range(4):
        want[pos[int(float(u[1, j]) * len(pos))]] += 1
    assert torch.equal(counts[1], want)


def test_estimator_equals_a_per_row_float64_reference():
    logits, values, g = _synthetic(4, 60, 3, 1.5, 2)
    det = deterministic_set(logits, 3, 50, torch.tensor([2, 4, 0, 6]))
    b = torch.tensor([5, 9, 2, 30])
    u = torch.rand(4, 30, generator=g, dtype=F64)
    counts = uniform_draws(~det, b, u)
    est = vattention_attention(logits, values, det, counts, b)
    for r in range(4):
        pos = torch.nonzero(~det[r]).flatten()
        picks = [int(pos[int(float(u[r, j]) * len(pos))]) for j in range(int(b[r]))]
        out, den, out_ht, den_ht, sigma = _reference(logits[r], values, det[r], picks)
        torch.testing.assert_close(est.output[r], out, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(est.output_ht[r], out_ht, rtol=1e-12, atol=1e-14)
        assert float(est.denominator[r]) == pytest.approx(den, rel=1e-12)
        assert float(est.denominator_ht[r]) == pytest.approx(den_ht, rel=1e-12)
        assert float(est.sigma[r]) == pytest.approx(sigma, rel=1e-10)
        assert float(est.residual[r]) == len(pos)


def test_exact_when_the_deterministic_part_covers_everything():
    logits, values, _ = _synthetic(3, 25, 4, 2.0, 3)
    logits[2, 20:] = float("-inf")  # a row that sees 20 keys
    det = deterministic_set(logits, 2, 20, 18, torch.isfinite(logits))  # sinks + window + every middle key
    counts = torch.zeros_like(logits)
    est = vattention_attention(logits, values, det, counts, torch.tensor([3, 0, 5]))
    exact = torch.softmax(logits, -1) @ values
    torch.testing.assert_close(est.output, exact, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(est.output_ht, exact, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(est.denominator, est.true_denominator, rtol=1e-14, atol=0.0)
    assert (est.residual == 0).all() and (est.draws == 0).all() and (est.epsilon(0.1) == 0).all()
    assert (est.denominator_error() == 0).all()


@pytest.mark.parametrize("b", [3, 40])
def test_numerator_and_denominator_are_unbiased(b):
    """Mean over M draws within 5 standard errors (estimated from the same draws) of the exact N and D, for the
    Hansen–Hurwitz estimator and the HT variant; their ratio ô is not unbiased, so it is not tested."""
    logits, values, g = _synthetic(1, 80, 3, 1.2, 4)
    det = deterministic_set(logits, 2, 74, 4)
    m = 20000
    u = torch.rand(m, 1, b, generator=g, dtype=F64)
    counts = uniform_draws(~det, torch.full((m, 1), b), u)
    est = vattention_attention(logits.expand(m, -1, -1), values, det.expand(m, -1, -1), counts, torch.full((m, 1), b))
    true_d = est.true_denominator[0, 0]
    exact_n = (torch.exp(logits - logits.max()) @ values)[0]
    for den, out in ((est.denominator, est.output), (est.denominator_ht, est.output_ht)):
        num = out * den.unsqueeze(-1)  # N̂ = ô · D̂
        samples = torch.cat([den[:, :1], num[:, 0]], -1)  # [M, 1 + D]
        se = samples.std(0) / math.sqrt(m)
        err = (samples.mean(0) - torch.cat([true_d.reshape(1), exact_n])).abs()
        assert (err <= 5 * se).all(), (err, se)


def test_horvitz_thompson_inclusion_is_the_chance_of_being_drawn():
    n, b, m = 12, 5, 40000
    u = torch.rand(m, b, generator=torch.Generator().manual_seed(5), dtype=F64)
    counts = uniform_draws(torch.ones(m, n, dtype=torch.bool), torch.full((m,), b), u)
    freq = (counts > 0).to(F64).mean(0)
    pi = float(ht_inclusion(n, b))
    assert pi == pytest.approx(1 - (1 - 1 / n) ** b, rel=1e-14)
    assert (freq - pi).abs().max() <= 5 * math.sqrt(pi * (1 - pi) / m)
    assert float(ht_inclusion(0, 3)) == 0.0 and float(ht_inclusion(7, 0)) == 0.0


def test_budget_rule_round_trips_with_the_epsilon_statement():
    sigma = torch.tensor([0.3, 0.05, 1.2], dtype=F64)
    den = torch.tensor([10.0, 2.0, 40.0], dtype=F64)
    n = torch.tensor([900.0, 300.0, 5000.0], dtype=F64)
    for two_sided in (False, True):
        for b in (2, 17, 400):
            eps = stated_epsilon(sigma, den, n, torch.full((3,), float(b), dtype=F64), 0.1, two_sided)
            back = torch.stack([budget_rule(sigma[i], den[i], n[i], float(eps[i]), 0.1, two_sided) for i in range(3)])
            torch.testing.assert_close(back, torch.full((3,), float(b), dtype=F64), rtol=1e-12, atol=0.0)
    assert normal_quantile(0.1) == pytest.approx(1.2815515655446004, rel=1e-12)
    assert normal_quantile(0.1, two_sided=True) == pytest.approx(1.6448536269514722, rel=1e-12)
    assert math.isnan(float(stated_epsilon(sigma[:1], den[:1], n[:1], torch.tensor([1.0]), 0.1)))
    with pytest.raises(ValueError, match="delta"):
        normal_quantile(1.0)


@pytest.mark.parametrize("delta", [0.1, 0.2])
def test_denominator_bound_covers_about_one_minus_delta(delta):
    """Synthetic attention in the CLT's regime (mild logits, many draws): |D̂ − D| ≤ ε·D̂ holds in ≈ 1 − δ of the
    draws with the two-sided quantile and ≈ 1 − 2δ with the authors' one-sided Φ⁻¹(1 − δ); tolerance 5 binomial
    standard errors of M draws plus 0.01 for the CLT's finite-b error."""
    logits, values, g = _synthetic(1, 3000, 2, 0.5, 6)
    det = deterministic_set(logits, 4, 2968, 30)
    m, b = 4000, 300
    u = torch.rand(m, 1, b, generator=g, dtype=F64)
    bb = torch.full((m, 1), b)
    est = vattention_attention(logits.expand(m, -1, -1), values, det.expand(m, -1, -1), uniform_draws(~det, bb, u), bb)
    miss = (est.denominator - est.true_denominator).abs()
    for two_sided, target in ((True, 1 - delta), (False, 1 - 2 * delta)):
        cover = float((miss <= denominator_bound(est, delta, two_sided)).to(F64).mean())
        tol = 5 * math.sqrt(target * (1 - target) / m) + 0.01
        assert abs(cover - target) <= tol, (two_sided, cover, target)
