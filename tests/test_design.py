"""Retention design: inclusion probabilities, samplers, and their Monte-Carlo properties."""

from __future__ import annotations

import math

import pytest
import torch

from kvcert import (
    RetentionDesign,
    inclusion_probabilities,
    poisson_sample,
    priority_sample,
    sample_retention,
    topk_sample,
)


def heavy_scores(n=600, rows=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(rows, n, generator=g, dtype=torch.float64).pow(6)


@pytest.mark.parametrize("budget", [0.125, 0.25, 0.5, 200])
def test_expected_count_equals_budget(budget):
    scores = heavy_scores()
    pi = inclusion_probabilities(scores, budget)
    k = budget if isinstance(budget, int) else round(budget * scores.shape[-1])
    assert torch.allclose(pi.sum(-1), torch.full((3,), float(k), dtype=pi.dtype), rtol=1e-6, atol=0)
    assert (pi <= 1).all() and (pi > 0).all()


def test_expected_count_fp32_rows_and_per_row_budgets():
    scores = heavy_scores(n=5000).float()
    counts = torch.tensor([300, 1000, 2500])
    pi = inclusion_probabilities(scores, counts)
    assert torch.allclose(pi.double().sum(-1), counts.double(), rtol=1e-6, atol=0)


def test_floor_is_eta_c_over_tail_size():
    """The floor's lower bound is η·c/|T| (c the solved scale, ≥ k_T), reached by zero-importance tail tokens."""
    n, budget = 1024, 0.25
    scores = heavy_scores(n=n, rows=1)[0]
    scores[100:200] = 0.0  # tail tokens with no importance sit exactly on the floor
    design = RetentionDesign()
    pi = inclusion_probabilities(scores, budget, design)
    tail = pi < 1
    k_t = 256 - 36 - round(0.25 * 220)
    n_tail = n - 36 - round(0.25 * 220)
    capped = int((pi == 1).sum()) - (36 + round(0.25 * 220))
    floor = pi[100:200]
    assert torch.allclose(floor, floor[0].expand_as(floor)) and bool(tail[100:200].all())
    c = float(floor[0]) * n_tail / design.floor  # π = c·η/|T| where the importance is 0
    assert c >= k_t * (1 - 1e-9) and (capped == 0) == (abs(c - k_t) < 1e-6 * k_t)
    assert float(pi[tail].min()) == pytest.approx(design.floor * c / n_tail, rel=1e-9)
    assert design.floor * k_t / n_tail == pytest.approx(0.0177, abs=5e-5)  # the docstring's example


def test_certainty_set_sinks_window_and_top_slice():
    design = RetentionDesign(sinks=4, window=32, top_fraction=0.25, floor=0.1)
    scores = heavy_scores(n=400, rows=1)[0]
    k = 100
    pi = inclusion_probabilities(scores, k, design)
    assert (pi[:4] == 1).all() and (pi[-32:] == 1).all()
    free = k - 36
    slice_size = round(0.25 * free)
    middle = scores[4:-32]
    top = middle.topk(slice_size).indices + 4
    assert (pi[top] == 1).all()
    certain = (pi == 1).sum().item()
    assert certain >= 36 + slice_size
    # the uniform floor: every tail token gets at least η · k_T / |T|
    tail = pi < 1
    k_t, n_t = free - slice_size, 400 - 36 - slice_size
    assert pi[tail].min() >= 0.1 * k_t / n_t * (1 - 1e-9)


def test_tail_probability_increases_with_importance():
    scores = torch.linspace(0.01, 1.0, 300, dtype=torch.float64)[torch.randperm(300, generator=torch.Generator().manual_seed(1))]
    design = RetentionDesign(sinks=0, window=0, top_fraction=0.0, floor=0.2)
    pi = inclusion_probabilities(scores, 60, design)
    order = scores.argsort()
    assert (pi[order].diff() >= -1e-12).all()


def test_samplers_reproducible_and_log_pi_matches():
    scores = heavy_scores()
    pi = inclusion_probabilities(scores, 0.25)
    a = poisson_sample(pi, torch.Generator().manual_seed(3))
    b = poisson_sample(pi, torch.Generator().manual_seed(3))
    assert torch.equal(a.indices, b.indices) and torch.equal(a.log_pi, b.log_pi)
    c = poisson_sample(pi, torch.Generator().manual_seed(4))
    assert not torch.equal(a.kept_mask(), c.kept_mask())
    valid = a.valid
    expected = torch.log(pi.gather(-1, a.indices)).float()
    assert torch.allclose(a.log_pi[valid], expected[valid])
    assert torch.isinf(a.log_pi[~valid]).all()
    assert (a.indices.diff(dim=-1)[valid[:, 1:]] > 0).all()  # ascending kept positions


def test_poisson_inclusion_frequencies_match_pi():
    """Each token's empirical inclusion frequency over M draws is within 5 binomial SEs of π_i."""
    scores = heavy_scores(n=300, rows=1)
    pi = inclusion_probabilities(scores, 0.25)[0]
    m = 4000
    sample = poisson_sample(pi.expand(m, -1), torch.Generator().manual_seed(5))
    freq = sample.kept_mask().double().mean(0)
    se = torch.sqrt(pi * (1 - pi) / m).clamp(min=1e-12)
    assert ((freq - pi).abs() <= 5 * se + 1e-12).all()


def test_horvitz_thompson_total_is_unbiased():
    """E[Σ_S x_i/π_i] = Σ x_i; tolerance 4·sqrt(Var/M) with Var = Σ x_i² (1 − π_i)/π_i."""
    g = torch.Generator().manual_seed(7)
    scores = heavy_scores(n=500, rows=1, seed=7)
    x = torch.randn(500, generator=g, dtype=torch.float64) + scores[0] * 5
    pi = inclusion_probabilities(scores, 0.2)[0]
    m = 3000
    sample = poisson_sample(pi.expand(m, -1), g)
    mask = sample.kept_mask().double()
    totals = (mask * (x / pi)).sum(-1)
    var = (x.pow(2) * (1 - pi) / pi).sum()
    assert abs(totals.mean() - x.sum()) <= 4 * math.sqrt(var / m)
    # and the sample variance agrees with the design variance (chi-square tolerance)
    assert abs(totals.var() / var - 1) <= 4 * math.sqrt(2 / (m - 1))


def test_priority_sampling_exact_size_and_unbiased():
    g = torch.Generator().manual_seed(11)
    scores = heavy_scores(n=400, rows=1, seed=11)
    x = torch.rand(400, generator=g, dtype=torch.float64) + 1
    m = 3000
    sample = priority_sample(scores.expand(m, -1), 100, g)
    assert (sample.lengths == 100).all()
    kept = sample.valid
    pi = torch.exp(sample.log_pi.double())
    est = torch.where(kept, x[sample.indices] / pi, 0.0).sum(-1)
    sd = est.std()
    assert abs(est.mean() - x.sum()) <= 4 * sd / math.sqrt(m)


def reference_priority(scores, budget, generator, design=RetentionDesign()):
    """priority_sample as first written: full-width τ by sorting, kept = certain | priority > τ, packed."""
    from kvcert.method.design import _certainty, _row_budgets, _rows, _uniform, pack, tail_weights

    rows, lead, n = _rows(scores)
    k = _row_budgets(budget, n, lead, rows.shape[0], rows.device)
    cert = _certainty(rows, k, design, slice_fraction=design.top_fraction)
    weights = tail_weights(rows, cert.certain, design.floor)
    u = 1 - _uniform(rows.shape, generator, rows.device, rows.dtype)
    priority = (weights / u).masked_fill(cert.certain, 0.0)
    take = torch.minimum(cert.tail_budget, (priority > 0).sum(-1))
    ordered = torch.cat([priority.sort(-1, descending=True).values, torch.zeros_like(priority[:, :1])], -1)
    tau = ordered.gather(-1, take.clamp(max=n).unsqueeze(-1))
    kept = cert.certain | (priority > tau)
    pi = torch.where(tau > 0, weights / tau.clamp(min=torch.finfo(rows.dtype).tiny), 1.0).clamp(max=1.0)
    return pack(kept, pi.masked_fill(cert.certain, 1.0), lead)


@pytest.mark.parametrize(
    "n, rows, budget, dtype, floor",
    [(600, 3, 0.25, torch.float64, 0.1), (5000, 4, torch.tensor([300, 1000, 2500, 5000]), torch.float32, 0.1),
     (20000, 3, 0.25, torch.float32, 0.1), (20000, 2, torch.tensor([4000, 19990]), torch.float32, 0.0),
     (17000, 2, 0.3, torch.float32, 1.0)],
)
@pytest.mark.parametrize("coarse", [False, True])
def test_priority_sample_matches_reference_bit_for_bit(n, rows, budget, dtype, floor, coarse, monkeypatch):
    """Same generator draws -> the same kept set, log pi and counts as the reference (fast paths included;
    coarse draws tie priorities at tau, so some rows keep fewer than the budget)."""
    import kvcert.method.design as design_module

    if coarse:
        fine = design_module._uniform
        monkeypatch.setattr(design_module, "_uniform", lambda *a, **kw: (fine(*a, **kw) * 64).floor() / 64)
    scores = heavy_scores(n=n, rows=rows, seed=n).to(dtype)
    scores[0, 100:400] = 0.0  # zero importance
    scores[0, 400:450] = -0.0  # signed zeros (priority -0 without a floor)
    scores[-1, 50:5050:7] = scores[-1, 60]  # ties
    design = RetentionDesign(floor=floor)
    got = priority_sample(scores, budget, torch.Generator().manual_seed(5), design)
    want = reference_priority(scores, budget, torch.Generator().manual_seed(5), design)
    assert torch.equal(got.lengths, want.lengths)
    assert torch.equal(got.indices, want.indices)
    assert torch.equal(got.log_pi, want.log_pi)


def test_radix_kth_largest_equals_topk():
    from kvcert.method.design import _kth_largest, _kth_largest_radix

    g = torch.Generator().manual_seed(3)
    x = torch.rand(5, 3000, generator=g).pow(3) / torch.rand(5, 3000, generator=g)
    x[1] = torch.randint(0, 4, (3000,), generator=g).float()  # heavy ties, zeros
    x[2, :1000] = float("inf")
    x[3] = 0.0
    x[4, ::2] = torch.finfo(torch.float32).tiny
    for j in (torch.tensor([1, 3000, 2999, 1500, 7]), torch.tensor([3001, 1, 1000, 2, 3000]), torch.full((5,), 17)):
        assert torch.equal(_kth_largest_radix(x, j), _kth_largest(x, j))


def test_topk_keeps_sinks_window_and_best_scores():
    scores = heavy_scores(n=300, rows=2)
    sample = topk_sample(scores, 80)
    assert (sample.lengths == 80).all()
    assert (sample.log_pi == 0).all()
    mask = sample.kept_mask()
    assert mask[:, :4].all() and mask[:, -32:].all()
    middle = scores[:, 4:-32]
    best = middle.topk(44).indices + 4
    assert mask.gather(-1, best).all()


def test_sample_retention_dispatch():
    scores = heavy_scores()
    g = torch.Generator().manual_seed(0)
    for sampler in ("poisson", "priority", "topk"):
        s = sample_retention(scores, 0.25, sampler, g)
        assert s.indices.shape[:-1] == (3,)
    with pytest.raises(ValueError, match="sampler"):
        sample_retention(scores, 0.25, "bernoulli")


@pytest.mark.parametrize(
    "budget, match",
    [(0.0, "budget"), (1.5, "budget"), (601, "budget"), (-3, "budget"), ("half", "budget"), (True, "budget")],
)
def test_bad_budget_names_the_argument(budget, match):
    with pytest.raises(ValueError, match=match):
        inclusion_probabilities(heavy_scores(), budget)


def test_bad_scores_name_the_argument():
    s = heavy_scores()
    s[0, 3] = float("nan")
    with pytest.raises(ValueError, match="scores: contains NaN"):
        inclusion_probabilities(s, 0.25)
    with pytest.raises(ValueError, match="scores"):
        inclusion_probabilities(-heavy_scores() - 1, 0.25)
    with pytest.raises(ValueError, match="budget"):
        inclusion_probabilities(heavy_scores(n=30), 10)  # smaller than sinks + window
    with pytest.raises(ValueError, match="pi"):
        poisson_sample(torch.tensor([0.5, 1.5]))


def test_replay_draws_with_the_cpu_recipe_whatever_the_device(monkeypatch):
    """The replay's draws come from :func:`kvcert.method.design.cpu_generator` seeded from (seed, example,
    layer, budget), whatever device π lives on (here ``meta``: a generator on π's device cannot
    even be made there), and equal the CPU draw of the same π."""
    from types import SimpleNamespace

    from kvcert.method.design import DEFAULT_DESIGN, cpu_generator, poisson_sample
    from kvcert.generation import replay

    pi = torch.rand(2, 60, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 0.9 + 0.05
    seen = {}
    monkeypatch.setattr(replay, "get_scorer", lambda name: (lambda obs: torch.zeros(1, 2, 60)))
    monkeypatch.setattr(replay, "inclusion_probabilities", lambda importance, budget, design: pi.to("meta"))
    monkeypatch.setattr(replay, "poisson_sample", lambda p, gen: seen.update(pi=p, gen=gen) or "drawn")
    _, drawn = replay.draw_samples(SimpleNamespace(prompt={4: SimpleNamespace(num_layers=8)}), 4, 0.25, 3, DEFAULT_DESIGN, 11, "ex-1")
    assert drawn == "drawn" and seen["pi"].device.type == "meta" and seen["gen"].device.type == "cpu"
    recipe = cpu_generator(replay._seed(11, "ex-1", 4, 0.25))
    assert torch.equal(seen["gen"].get_state(), recipe.get_state())
    rows = pi.unsqueeze(0).expand(3, -1, -1).contiguous()
    got, want = poisson_sample(rows, seen["gen"]), poisson_sample(rows, recipe)
    assert torch.equal(got.indices, want.indices) and torch.equal(got.lengths, want.lengths)
    assert int(got.lengths.sum()) > 0


def test_press_draws_with_the_same_recipe():
    from kvcert.method.design import cpu_generator
    from kvcert.method.press import EvictionPress

    press = EvictionPress(budget=0.25, sampler="poisson", seed=5)
    gen = press.generator(3, 1)
    assert gen.device.type == "cpu"
    assert torch.equal(gen.get_state(), cpu_generator((5 * 1_000_003 + 3 * 7919 + 104_729) % 2**63).get_state())
