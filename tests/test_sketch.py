"""The eviction sketch and the robust certificate: the bounds it stores hold for any query, the torch path equals
float64, selection and merging, the memory budget, and Monte-Carlo coverage on later queries."""

from __future__ import annotations

import math

import pytest
import torch

from kvcert import certified_attention, hajek_attention
from kvcert.bench.coverage import evaluate_head, later_queries, make_head, run_harness, summary
from kvcert.method.certificate import anytime_radius, bernstein_radius, certificate_reference, robust_radius
from kvcert.method.design import DEFAULT_DESIGN, inclusion_probabilities
from kvcert.method.sketch import (
    SCALAR_BYTES, SKETCH_FRACTION, SUCCESSOR_HORIZON, SUCCESSOR_PENALTY, build_sketch, check_plan, drift_potential,
    merge_sketches, quantize_int8, shadow_count, sketch_potential, sketch_terms, successor_potential,
)

F64 = torch.float64


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_quantised_key_bound_holds_for_any_query():
    g = _gen(0)
    keys = torch.randn(300, 64, generator=g, dtype=F64) * torch.rand(300, 1, generator=g, dtype=F64).mul(20)
    codes, scale, err = quantize_int8(keys)
    assert codes.dtype == torch.int8 and int(codes.abs().max()) <= 127
    deq = codes.to(F64) * scale.to(F64).unsqueeze(-1)
    assert torch.all(err.to(F64) >= torch.linalg.vector_norm(keys - deq, dim=-1))  # stored bound ≥ the float64 error
    assert float((err / torch.linalg.vector_norm(keys, dim=-1)).max()) < 0.02  # and it is small
    q = torch.randn(500, 64, generator=g, dtype=F64) * 3
    bound = q @ deq.T + torch.linalg.vector_norm(q, dim=-1, keepdim=True) * err.to(F64)
    assert torch.all(bound >= q @ keys.T)  # Cauchy–Schwarz: U_j ≥ q·k_j for every query


def _retained_and_evicted(seed, b=2, hq=4, hkv=2, kept=60, evicted=150, d=16):
    g = _gen(seed)
    q = torch.randn(b, hq, 3, d, generator=g, dtype=F64)
    k = torch.randn(b, hkv, kept, d, generator=g, dtype=F64)
    v = torch.randn(b, hkv, kept, d, generator=g, dtype=F64) + 2.0
    lp = torch.where(torch.rand(b, hkv, kept, generator=g) < 0.4, 0.0,
                     torch.log(torch.rand(b, hkv, kept, generator=g, dtype=F64) * 0.9 + 0.05))
    ek = torch.randn(b, hkv, evicted, d, generator=g, dtype=F64) * 1.3
    ev = torch.randn(b, hkv, evicted, d, generator=g, dtype=F64) + 2.0
    return q, k, v, lp, ek, ev, g


def test_shadow_terms_bound_every_evicted_summand_and_match_float64():
    """t_j ≥ e^{s_j}‖v_j − ô‖/Ẑ for every shadow token under any query; the torch path equals float64 sketch_terms."""
    q, k, v, lp, ek, ev, g = _retained_and_evicted(1)
    centre = v.mean(2)
    sketch = build_sketch(ek, ev, torch.ones(ek.shape[:3], dtype=torch.bool), torch.randn(ek.shape[:3], generator=g),
                          centre, ek.shape[2])  # every evicted token in the shadow
    scale = 0.3
    res = hajek_attention(q, k, v, lp, scale, causal=False, certificate=True, centre=centre, sketch=sketch)
    b, hq, nq, d = q.shape
    qq = q.reshape(b, 2, 2, nq, d)
    ref = certificate_reference(qq, k.unsqueeze(2), v.unsqueeze(2), lp.unsqueeze(2), scale, centre.unsqueeze(2))
    logits = (qq @ k.unsqueeze(2).transpose(-1, -2)) * scale - lp.unsqueeze(2).unsqueeze(-2)
    lse = torch.logsumexp(logits, -1).reshape(b, hq, nq)
    out_dev = torch.linalg.vector_norm(ref.output - centre[:, :, None, None], dim=-1).reshape(b, hq, nq)
    sv, sr = sketch_terms(q, sketch, scale, lse, out_dev)
    # float64 sums of e^{s−lse}·‖v−ô‖ terms: their rounding follows the largest of them, so a sum near 0 is compared
    # with an absolute floor at that scale
    floor = 1e-13 * float(max(sv.abs().max(), sr.abs().max()))
    torch.testing.assert_close(res.shadow_sum, sv, rtol=1e-10, atol=floor)
    torch.testing.assert_close(res.shadow_range, sr, rtol=1e-10, atol=floor)
    # the exact evicted summands, from the evicted keys and values themselves
    s_ev = (qq @ ek.unsqueeze(2).transpose(-1, -2)) * scale  # [b, hkv, g, nq, E]
    dist = torch.linalg.vector_norm(ev.unsqueeze(2).unsqueeze(3) - ref.output.unsqueeze(-2), dim=-1)
    exact = (torch.exp(s_ev - lse.reshape(b, 2, 2, nq, 1)) * dist).reshape(b, hq, nq, -1)
    assert torch.all(sr >= exact.amax(-1)) and torch.all(sv >= exact.sum(-1))  # Σ t_j bounds Σ of the summands
    assert float((sr / exact.amax(-1)).max()) < 1e3  # a bound, not a vacuous one (the value deviation via c)


def test_robust_radius_reduces_to_the_plug_in_without_shadow():
    q, k, v, lp, _, _, _ = _retained_and_evicted(2)
    plain = certified_attention(q, k, v, lp)
    assert plain.robust_radius is None
    empty = build_sketch(k, v, torch.zeros(k.shape[:3], dtype=torch.bool), torch.zeros(k.shape[:3]), v.mean(2), 5)
    res = certified_attention(q, k, v, lp, sketch=empty)
    torch.testing.assert_close(res.robust_radius, res.radius)
    assert torch.all(res.shadow_sum == 0) and torch.all(res.shadow_range == 0)
    v_, b_ = torch.tensor([0.5]), torch.tensor([0.1])
    # ε_R = the plug-in radius + Σ t_j (triangle inequality), its anytime variant the plug-in's at δ_t + Σ t_j
    assert robust_radius(v_, b_, torch.tensor([0.3]), 0.1) == bernstein_radius(v_, b_, 0.1) + 0.3
    assert robust_radius(v_, b_, torch.tensor([0.3]), 0.1, 3) == anytime_radius(v_, b_, 0.1, 3) + 0.3


def test_robust_radius_is_floored_at_the_output_resolution():
    from kvcert.method.certificate import UNIT_ROUNDOFF, unit_roundoff

    assert unit_roundoff(torch.float32) == 2.0**-24 and unit_roundoff(torch.bfloat16) == 2.0**-8
    assert set(UNIT_ROUNDOFF) == {torch.float64, torch.float32, torch.float16, torch.bfloat16}
    q, k, v, lp, _, _, _ = _retained_and_evicted(6)
    lp = torch.zeros_like(lp)  # everything certain: V̂ = b̂ = 0, only the floor is left
    for dtype in (torch.float32, torch.bfloat16):
        empty = build_sketch(k, v, torch.zeros(k.shape[:3], dtype=torch.bool), torch.zeros(k.shape[:3]), v.mean(2), 5)
        res = certified_attention(q.to(dtype), k.to(dtype), v.to(dtype), lp, sketch=empty)
        assert torch.all(res.radius == 0)
        torch.testing.assert_close(res.robust_radius, unit_roundoff(dtype) * torch.linalg.vector_norm(res.output.float(), dim=-1))
    v_, b_ = torch.tensor([1e-4]), torch.tensor([0.0])
    assert robust_radius(v_, b_, v_ * 0, 0.1, floor=torch.tensor([1.0])) == 1.0


def test_default_centre_keeps_bf16_variance_accurate():
    """certified_attention centres on the kept values' mean: bf16 values offset by 10 keep V̂ within 3 % of float64."""
    g = _gen(3)
    q = torch.randn(1, 2, 1, 64, generator=g).to(torch.bfloat16)
    k = torch.randn(1, 1, 2000, 64, generator=g).to(torch.bfloat16)
    v = (torch.randn(1, 1, 2000, 64, generator=g) + 10.0).to(torch.bfloat16)
    lp = torch.where(torch.rand(1, 1, 2000, generator=g) < 0.2, 0.0, math.log(0.2))
    res = certified_attention(q, k, v, lp)
    ref = certificate_reference(q.double().reshape(1, 1, 2, 1, 64), k.double().unsqueeze(2), v.double().unsqueeze(2),
                                lp.double().unsqueeze(2), 64**-0.5)
    rel = (res.variance.double().reshape(ref.variance.shape) - ref.variance).abs() / ref.variance
    assert float(rel.max()) < 0.03


def test_selection_padding_merge_and_recentre():
    g = _gen(4)
    keys = torch.randn(1, 2, 40, 8, generator=g)
    values = torch.randn(1, 2, 40, 8, generator=g)
    evicted = torch.rand(1, 2, 40, generator=g) < 0.5
    evicted[0, 1] = False
    evicted[0, 1, :3] = True  # fewer candidates than slots
    pot = torch.randn(1, 2, 40, generator=g)
    sk = build_sketch(keys, values, evicted, pot, values.mean(2), 6)
    assert sk.count.tolist() == [[6, 3]] and sk.slots == 6
    top = torch.where(evicted[0, 0], pot[0, 0], -math.inf).topk(6).values
    torch.testing.assert_close(sk.potential[0, 0], top)
    assert torch.all(sk.value_dev[0, 1, 3:] == 0) and torch.all(torch.isinf(sk.potential[0, 1, 3:]))
    other = build_sketch(keys, values, ~evicted, pot + 0.5, values.mean(2), 6)
    merged = merge_sketches(sk, other, 6)
    both = torch.cat([sk.potential, other.potential], -1)
    torch.testing.assert_close(merged.potential[0, 0], both[0, 0].topk(6).values)
    moved = sk.recentre(torch.tensor([[0.5, 0.25]]))
    torch.testing.assert_close(moved.value_dev[0, 0], sk.value_dev[0, 0] + 0.5)
    assert torch.all(moved.value_dev[0, 1, 3:] == 0)  # padding stays inert


def test_potentials():
    g = _gen(5)
    keys = torch.randn(2, 50, 16, generator=g)
    window = torch.randn(2, 6, 16, generator=g)
    psi = drift_potential(window, keys, 0.25, drift=0.0)
    torch.testing.assert_close(psi, torch.log_softmax((window * 0.25) @ keys.transpose(-1, -2), -1).amax(-2))
    # the heads of a group on one scale: a query with 12× the logits does not take every slot
    quiet, loud = window[0, :1] * 0.5, window[0, 1:2] * 12
    pair = torch.cat([quiet, loud])
    best = int((quiet @ keys[0].T).argmax())
    rank = lambda p: int((p > p[best]).sum())  # noqa: E731
    assert rank(((pair * 0.25) @ keys[0].T).amax(0)) > 10  # raw logits: the loud query's tokens first
    assert rank(drift_potential(pair, keys[0], 0.25, drift=0.0)) <= 2  # weights: the quiet query's best in the first three
    ctx = torch.cat([keys, torch.randn(2, 20, 16, generator=g)], 1)  # normalised over the keys the query sees
    torch.testing.assert_close(drift_potential(window, keys, 0.25, drift=0.0, context=ctx),
                               (((window * 0.25) @ keys.transpose(-1, -2))
                                - torch.logsumexp((window * 0.25) @ ctx.transpose(-1, -2), -1, keepdim=True)).amax(-2))
    assert torch.all(drift_potential(window, keys, 0.25) >= psi)  # the drift allowance only adds
    succ = successor_potential(psi, 3, 1.0)
    j = int(psi[0].argmax())
    for i in range(1, 4):
        if j + i < 50:
            assert succ[0, j + i] >= psi[0, j] - 1.0 - 1e-6
    assert torch.all(succ >= psi)
    torch.testing.assert_close(sketch_potential(window, keys, 0.25),
                               successor_potential(drift_potential(window, keys, 0.25), SUCCESSOR_HORIZON, SUCCESSOR_PENALTY))


@pytest.mark.parametrize("dim,element_size", [(64, 4), (128, 2), (128, 4)])
def test_memory_budget_is_two_percent_of_a_quarter_cache(dim, element_size):
    for n in (512, 2048, 16384):
        per_token = 2 * dim * element_size
        r = shadow_count(n, per_token, dim)
        assert r * (dim + SCALAR_BYTES) <= 0.02 * 0.25 * n * per_token
        assert r * (dim + SCALAR_BYTES) > 0.9 * SKETCH_FRACTION * n * per_token - (dim + SCALAR_BYTES)


def test_plan_check():
    check_plan({"drift": 2.0, "window": 4, "floor": "unit_roundoff", "score": "log_attention_weight",
                "combination": "plugin_plus_shadow_sum"})
    with pytest.raises(ValueError, match="robust_certificate.window"):
        check_plan({"window": 32})  # the plan before the second amendment of 2026-12-01
    with pytest.raises(ValueError, match="robust_certificate.combination"):
        check_plan({"combination": "bernstein_summands"})
    with pytest.raises(ValueError, match="robust_certificate.floor"):
        check_plan({"floor": "none"})
    with pytest.raises(ValueError, match="robust_certificate.drift"):
        check_plan({"drift": 3.0})
    with pytest.raises(ValueError, match="unknown"):
        check_plan({"bits": 8})


def _binomial_floor(p: float, n: int) -> float:
    return p - 3.0 * math.sqrt(p * (1.0 - p) / n)


def test_monte_carlo_coverage_on_later_queries():
    """The synthetic harness at ρ = 0.9 (one head of each concentration): the plug-in misses its nominal 0.9 by more than
    3 binomial standard errors, the robust certificate does not; on the setting query both cover."""
    gen = _gen(11)
    draws, later, delta = 200, 3, 0.1
    cov = {"plugin": [], "robust": [], "setting_plugin": [], "setting_robust": []}
    ratios = []
    for beta in (0.5, 1.0, 1.5, 2.0):  # the bench's heads, diffuse to concentrated
        keys, values, q0 = make_head(gen, 1024, 64, beta)
        queries = torch.cat([q0.unsqueeze(0), later_queries(gen, q0, 0.9, later)])
        pi = inclusion_probabilities(torch.softmax(keys @ q0, -1), 0.25, DEFAULT_DESIGN)
        res = evaluate_head(keys, values, queries, pi, draws, gen, delta, shadow_count(1024, 512, 64))
        err = res["error"]
        ok_p = (err <= res["radius"]) | (err <= res["floor"])
        ok_r = (err <= res["robust"]) | (err <= res["floor"])
        cov["plugin"].append(ok_p[:, 1:].reshape(-1))
        cov["robust"].append(ok_r[:, 1:].reshape(-1))
        cov["setting_plugin"].append(ok_p[:, 0])
        cov["setting_robust"].append(ok_r[:, 0])
        r = res["robust"][:, 0] / err[:, 0]
        ratios.append(r[err[:, 0] > res["floor"]])
    rates = {k: float(torch.cat(v).double().mean()) for k, v in cov.items()}
    n_later, n_set = len(torch.cat(cov["plugin"])), len(torch.cat(cov["setting_plugin"]))
    assert rates["plugin"] < _binomial_floor(0.9, n_later), rates  # the regime breaks the plug-in
    assert rates["robust"] >= _binomial_floor(0.9, n_later), rates
    assert rates["setting_plugin"] >= _binomial_floor(0.9, n_set) and rates["setting_robust"] >= _binomial_floor(0.9, n_set)
    assert float(torch.cat(ratios).median()) <= 5.0  # not covering by being huge


def test_bench_harness_summary_line(capsys):
    from kvcert.cli import main

    cells = run_harness(sizes=(1024,), betas=(1.0,), instances=1, draws=20, later=2)
    s = summary(cells)
    assert set(s) == {"plugin_later_rho09_min", "robust_later_rho09_min", "robust_setting_min", "robust_tightness_median"}
    assert 0.0 <= s["plugin_later_rho09_min"] <= 1.0 and s["robust_tightness_median"] > 1.0
    assert main(["bench", "coverage", "--sizes", "1024", "--instances", "1", "--draws", "10", "--later", "1"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("plugin_later_rho09_min=") and "robust_tightness_median=" in last
