"""The retention design's knobs reach π, and π's expected kept count matches the budget in every layer.

Each knob of :class:`kvcert.method.design.RetentionDesign` (and SnapKV's pooling) is checked against a float64
formula written out here, so a knob that stops reaching π — ignored by the sampler, the press or the
replay — fails."""

from __future__ import annotations

import pytest
import torch

from kvcert.method.design import RetentionDesign, inclusion_probabilities, layer_budget, sample_retention

N = 800


def scores(rows=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(rows, N, generator=g, dtype=torch.float64).pow(5)


def reference_pi(s: torch.Tensor, k: int, design: RetentionDesign) -> torch.Tensor:
    """π of one row by the formula, in float64: sinks, window, top slice certain; the tail
    π_i = min(1, c·q_i) with q_i = (1 − η)·s_i^α / Σ_T s^α + η/|T| and c solved so Σ π = k."""
    n = s.shape[-1]
    certain = torch.zeros(n, dtype=torch.bool)
    certain[: design.sinks] = True
    certain[n - design.window:] = True
    free = k - int(certain.sum())
    top = round(free * design.top_fraction)
    middle = s.clone()
    middle[certain] = -1.0
    certain[middle.topk(top).indices] = True
    tail = ~certain
    imp = torch.where(tail, s.pow(design.temper), 0.0)
    q = (1 - design.floor) * imp / imp.sum() + design.floor / int(tail.sum())
    q = torch.where(tail, q, 0.0)
    k_t = k - int(certain.sum())
    capped = torch.zeros(n, dtype=torch.bool)
    for _ in range(n):
        c = (k_t - int(capped.sum())) / float(q[tail & ~capped].sum())
        now = tail & (c * q >= 1)
        if torch.equal(now, capped):
            break
        capped = now
    pi = torch.where(capped, 1.0, c * q)
    return torch.where(certain, 1.0, pi)


@pytest.mark.parametrize("design", [
    RetentionDesign(), RetentionDesign(top_fraction=0.75), RetentionDesign(floor=0.02), RetentionDesign(floor=0.5),
    RetentionDesign(temper=0.5), RetentionDesign(temper=2.0), RetentionDesign(top_fraction=0.5, temper=2.0, floor=0.3),
])
def test_every_knob_reaches_pi(design):
    s = scores()
    k = round(0.25 * N)
    pi = inclusion_probabilities(s, 0.25, design)
    for row in range(s.shape[0]):
        assert torch.allclose(pi[row], reference_pi(s[row], k, design), rtol=1e-9, atol=1e-12)
    assert torch.allclose(pi.sum(-1), torch.full((3,), float(k), dtype=pi.dtype), rtol=1e-9)


def test_knobs_change_pi_in_the_expected_direction():
    s = scores(rows=1)[0]
    base = inclusion_probabilities(s, 0.25)
    tail = base < 1
    flat = inclusion_probabilities(s, 0.25, RetentionDesign(temper=0.5))
    sharp = inclusion_probabilities(s, 0.25, RetentionDesign(temper=2.0))
    # a lower α flattens the tail (smaller spread of π), a higher one concentrates it
    assert flat[tail].std() < base[tail].std() < sharp[tail].std()
    assert (inclusion_probabilities(s, 0.25, RetentionDesign(top_fraction=0.75)) == 1).sum() > (base == 1).sum()
    assert inclusion_probabilities(s, 0.25, RetentionDesign(floor=0.5))[tail].min() > base[tail].min()


@pytest.mark.parametrize("sampler", ["poisson", "priority"])
def test_the_samplers_follow_the_tempered_design(sampler):
    """The samplers' fast paths use the knobs: the Poisson draw's logged log π equals log of the design's π,
    and priority sampling's inclusion frequencies move with α."""
    s = scores(rows=1)
    design = RetentionDesign(temper=2.0, floor=0.05)
    pi = inclusion_probabilities(s, 0.25, design)[0]
    g = torch.Generator().manual_seed(3)
    sample = sample_retention(s, 0.25, sampler, g, design)
    kept = sample.indices[0, : int(sample.lengths[0])]
    if sampler == "poisson":
        assert torch.allclose(sample.log_pi[0, : len(kept)].double(), pi[kept].log(), atol=1e-6)
    else:
        plain = RetentionDesign(floor=0.05)
        counts = torch.zeros(N, dtype=torch.float64)
        counts_plain = torch.zeros(N, dtype=torch.float64)
        for seed in range(300):
            for d, c in ((design, counts), (plain, counts_plain)):
                smp = sample_retention(s, 0.25, "priority", torch.Generator().manual_seed(seed), d)
                c[smp.indices[0, : int(smp.lengths[0])]] += 1
        tail = pi < 1
        top_tail = tail & (s[0] >= s[0][tail].quantile(0.95))
        # α = 2 keeps the tail's highest scores more often than α = 1 (300 draws: far beyond the noise)
        assert counts[top_tail].mean() > counts_plain[top_tail].mean() + 10


@pytest.mark.parametrize("layers,dense", [(30, 1), (30, 3), (2, 1)])
@pytest.mark.parametrize("budget", [0.125, 0.25, 0.5])
def test_layer_budgets_keep_the_mean_budget(layers, dense, budget):
    design = RetentionDesign(dense_layers=dense)
    shares = [layer_budget(budget, i, layers, design) for i in range(layers)]
    assert shares[:dense] == [1.0] * dense
    if layers * budget > dense:
        assert sum(shares) / layers == pytest.approx(budget, rel=1e-12)
    assert all(x > 0 for x in shares)
    assert layer_budget(budget, 0, layers, RetentionDesign()) == budget


def test_press_keeps_the_budget_in_every_layer():
    """Through the real press on a model: each layer's expected kept count (Σ π over the decided slots) is the
    layer's budget, and the dense layer keeps every token."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvcert import CertifiedCache, EvictionPress, enable_certified_attention

    torch.manual_seed(0)
    model = enable_certified_attention(LlamaForCausalLM(LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=2)).eval())
    for design in (RetentionDesign(), RetentionDesign(dense_layers=1, temper=2.0, top_fraction=0.5)):
        seen = {}
        press = EvictionPress(scorer="snapkv", budget=0.25, sampler="poisson", design=design, seed=1)
        original = press.compress_layer

        def spy(layer, obs, *args, **kwargs):
            scores = press.score(obs)
            n = scores.shape[-1]
            share = layer_budget(0.25, obs.layer_idx, obs.num_layers, design)
            k = n if share == 1.0 else max(round(share * n), design.sinks + design.window)
            seen[obs.layer_idx] = (inclusion_probabilities(scores, k, design).sum(-1), k, n)
            return original(layer, obs, *args, **kwargs)

        press.compress_layer = spy
        cache = CertifiedCache(press=press)
        with torch.no_grad():
            model(torch.randint(0, 128, (1, 400)), cache=cache, use_cache=True)
        assert sorted(seen) == list(range(8))
        kept = []
        for i, (expected, k, n) in seen.items():
            assert torch.allclose(expected, torch.full_like(expected, float(k)), rtol=1e-6)
            kept.append(k / n)
        if design.dense_layers:
            assert kept[0] == 1.0 and cache.layers[0].keys.shape[2] >= 400
        assert sum(kept) / 8 == pytest.approx(0.25, abs=2 / 400)


def test_snapkv_pooling_reaches_the_scores():
    from kvcert.method.scorers import get_scorer
    from kvcert.method.scorers.base import LayerObservation

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 40, 16, generator=g), torch.randn(1, 2, 40, 16, generator=g)
    obs = LayerObservation(q, k, torch.randn(1, 2, 40, 16, generator=g), None, 0.25)
    mean = get_scorer("snapkv", kernel_size=1)(obs)
    peak = get_scorer("snapkv", kernel_size=1, pooling="max")(obs)
    assert (peak >= mean - 1e-7).all() and not torch.allclose(peak, mean)
    with pytest.raises(ValueError, match="pooling"):
        get_scorer("snapkv", pooling="median")
