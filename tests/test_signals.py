"""The comparison signals every generation record carries, against references.

* attention entropy over the retained tokens (torch path of :func:`hajek_attention`) against
  a float64 softmax over the same keys, with −log π offsets, padding (+inf) and causal queries;
* next-token entropy and top-2 margin against their definitions on known distributions;
* evicted-score mass: top-k's realised share against a direct count, the Poisson design's
  expectation Σ(1 − π)s/Σs against the mean realised share over independent draws (a
  Monte-Carlo check whose tolerance follows from the number of draws);
* the engine's records: one value per decode step, None for the full cache, the same per
  seed, and an attention entropy no larger than log(kept tokens).
"""

from __future__ import annotations

import math

import pytest
import torch

from kvcert.generation.forked import generate
from kvcert.method.attention import hajek_attention
from kvcert.method.cache import CompactLayer
from kvcert.method.design import inclusion_probabilities
from kvcert.generation.signals import evicted_mass, next_token_signals
from kvcert.method.press import EvictionPress
from kvcert.method.scorers.base import LayerObservation

from test_generation import engine, loaded, model_dir, records, tokenizer  # noqa: F401 - fixtures


def reference_entropy(q, k, log_pi, scaling, causal):
    """Float64 entropy of softmax(q·k·scaling − log π) per (batch, query head, query)."""
    b, hq, n_q, d = q.shape
    hkv, length = k.shape[1], k.shape[2]
    group = hq // hkv
    z = torch.einsum("bhgqd,bhld->bhgql", q.double().reshape(b, hkv, group, n_q, d), k.double()) * scaling
    z = z - log_pi.double()[:, :, None, None, :]
    if causal:
        last = length - n_q + torch.arange(n_q)
        z = z.masked_fill(torch.arange(length)[None, :] > last[:, None], float("-inf"))
    p = torch.softmax(z, -1)
    return -torch.where(p > 0, p * torch.log(p), 0.0).sum(-1).reshape(b, hq, n_q)


def reference_output(q, k, v, log_pi, scaling, causal):
    """Float64 Hájek attention softmax(q·k·scaling − log π)·v per (batch, query head, query)."""
    b, hq, n_q, d = q.shape
    hkv, length = k.shape[1], k.shape[2]
    group = hq // hkv
    z = torch.einsum("bhgqd,bhld->bhgql", q.double().reshape(b, hkv, group, n_q, d), k.double()) * scaling
    z = z - log_pi.double()[:, :, None, None, :]
    if causal:
        last = length - n_q + torch.arange(n_q)
        z = z.masked_fill(torch.arange(length)[None, :] > last[:, None], float("-inf"))
    out = torch.einsum("bhgql,bhld->bhgqd", torch.softmax(z, -1), v.double())
    return out.reshape(b, hq, n_q, -1)


@pytest.mark.parametrize("causal,certificate", [(False, False), (True, False), (False, True), (True, True)])
def test_attention_entropy_matches_float64(causal, certificate):
    gen = torch.Generator().manual_seed(3)
    b, hq, hkv, n_q, length, d = 2, 6, 3, 4, 50, 16
    q, k, v = (torch.randn(*shape, generator=gen) for shape in ((b, hq, n_q, d), (b, hkv, length, d), (b, hkv, length, d)))
    log_pi = torch.where(torch.rand(b, hkv, length, generator=gen) < 0.5, 0.0, -2.0 * torch.rand(b, hkv, length, generator=gen))
    log_pi[0, 1, 10:20] = float("inf")  # padding inside a head's row: excluded
    res = hajek_attention(q, k, v, log_pi, 0.3, causal=causal, certificate=certificate, entropy=True, query_block=3)
    ref = reference_entropy(q, k, log_pi, 0.3, causal)
    assert res.entropy.dtype == torch.float32 and res.entropy.shape == (b, hq, n_q)
    # fp32 logits: the entropy's error is a few ulps of its terms (|z| ≤ ~10 here)
    assert torch.allclose(res.entropy.double(), ref, rtol=1e-5, atol=1e-5)
    # Asking for the entropy changes nothing else: the output matches the one computed without
    # it, and both the float64 attention, to fp32 rounding. Bits are not compared: BLAS may pick
    # another kernel for another allocation or block shape, and which one differs between CPUs.
    plain = hajek_attention(q, k, v, log_pi, 0.3, causal=causal, certificate=certificate, query_block=3)
    assert plain.entropy is None
    torch.testing.assert_close(plain.output, res.output, rtol=1e-6, atol=1e-6)
    out_ref = reference_output(q, k, v, log_pi, 0.3, causal)
    torch.testing.assert_close(res.output.double(), out_ref, rtol=1e-5, atol=1e-6)
    if certificate:
        torch.testing.assert_close(plain.variance, res.variance, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(plain.range_term, res.range_term, rtol=1e-5, atol=1e-7)


def test_decode_step_over_certain_keys_matches_float64():
    """The fused path of one query per head over all-certain keys (a top-k cache's decode step)."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(2, 6, 1, 16, generator=gen), torch.randn(2, 3, 70, 16, generator=gen), torch.randn(2, 3, 70, 16, generator=gen)
    res = hajek_attention(q, k, v, None, 0.4, entropy=True)
    zeros = torch.zeros(2, 3, 70)
    ref = reference_entropy(q, k, zeros, 0.4, causal=False)
    assert torch.allclose(res.entropy.double(), ref, rtol=1e-5, atol=1e-5)
    general = hajek_attention(q, k, v, zeros, 0.4, entropy=True)  # the general path (a bias of zeros)
    assert torch.allclose(res.output, general.output, rtol=1e-5, atol=1e-6)
    assert torch.allclose(res.entropy, general.entropy, rtol=1e-5, atol=1e-6)
    assert hajek_attention(q, k, v, None, 0.4).entropy is None


def test_next_token_signals_on_known_distributions():
    v = 1000
    uniform = torch.log_softmax(torch.zeros(v), -1)
    onehot = torch.log_softmax(torch.tensor([0.0] * (v - 1) + [200.0]), -1)
    two = torch.log(torch.tensor([0.7, 0.2, 0.1]))
    ent, margin = next_token_signals(torch.stack([uniform[:3] * 0 + math.log(1 / 3), two])).T.tolist()
    assert ent[0] == pytest.approx(math.log(3), abs=1e-6) and margin[0] == pytest.approx(0.0, abs=1e-7)
    h = -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1))
    assert ent[1] == pytest.approx(h, abs=1e-6) and margin[1] == pytest.approx(0.5, abs=1e-6)
    e_u, m_u = next_token_signals(uniform).tolist()
    e_o, m_o = next_token_signals(onehot).tolist()
    assert e_u == pytest.approx(math.log(v), abs=1e-4) and m_u == pytest.approx(0.0, abs=1e-6)
    assert e_o == pytest.approx(0.0, abs=1e-6) and m_o == pytest.approx(1.0, abs=1e-6)


def layer_and_obs(length=200, hkv=2, d=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    layer = CompactLayer()
    k, v = torch.randn(1, hkv, length, d, generator=gen), torch.randn(1, hkv, length, d, generator=gen)
    layer.update(k, v)
    obs = LayerObservation(query=torch.randn(1, 2 * hkv, 8, d, generator=gen), key=layer.keys, value=layer.values,
                           log_pi=None, scaling=d**-0.5, layer_idx=0, num_layers=1)
    return layer, obs


def test_topk_evicted_mass_is_the_evicted_share_of_the_scores():
    layer, obs = layer_and_obs()
    press = EvictionPress(scorer="snapkv", budget=0.25, sampler="topk")
    scores = press.scorer(obs).double()
    kept_before = layer.keys.clone()
    press.compress_layer(layer, obs)
    mass = evicted_mass([layer], ("max", "mean"))
    # the kept keys are rows of the original keys: their scores' share is what was kept
    shares = []
    for h in range(kept_before.shape[1]):
        kept = (layer.keys[0, h, : int(layer.kept[0, h])].unsqueeze(1) == kept_before[0, h].unsqueeze(0)).all(-1).any(0)
        shares.append(float(scores[0, h][~kept].sum() / scores[0, h].sum()))
    assert mass["realised"]["mean"] == pytest.approx(sum(shares) / len(shares), rel=1e-9)
    assert mass["realised"]["max"] == pytest.approx(max(shares), rel=1e-9)
    assert mass["expected"] is None


def test_poisson_expected_evicted_mass_is_the_mean_realised_share():
    draws = 400
    realised = []
    for seed in range(draws):
        layer, obs = layer_and_obs()
        press = EvictionPress(scorer="snapkv", budget=0.25, sampler="poisson", seed=seed)
        press.compress_layer(layer, obs)
        mass = evicted_mass([layer], ("mean",))
        realised.append(mass["realised"]["mean"])
        expected = mass["expected"]["mean"]
    # the expectation is the same for every draw (π depends on the scores only)
    layer, obs = layer_and_obs()
    press = EvictionPress(scorer="snapkv", budget=0.25, sampler="poisson")
    s = press.scorer(obs).double()
    pi = inclusion_probabilities(press.scorer(obs), torch.full((1, 2), round(0.25 * 200)), press.design)
    direct = float(((s * (1 - pi)).sum(-1) / s.sum(-1)).mean())
    assert expected == pytest.approx(direct, rel=1e-9)
    mean = sum(realised) / draws
    sd = (sum((r - mean) ** 2 for r in realised) / (draws - 1)) ** 0.5
    assert abs(mean - expected) <= 4.0 * sd / draws**0.5 + 1e-12  # 4 standard errors


@pytest.mark.parametrize("condition,sampler", [("aware", "poisson"), ("streaming", "topk"), ("aware", "priority")])
def test_engine_records_one_signal_per_step(loaded, records, condition, sampler):
    out = generate([engine(loaded, condition=condition, sampler=sampler)], records[0])[0]
    again = generate([engine(loaded, condition=condition, sampler=sampler)], records[0])[0]
    n = out["decode_steps"]
    assert len(out["output_entropy_steps"]) == len(out["top2_margin_steps"]) == len(out["attention_entropy_steps"]) == n
    kept = min(out["kept_fraction"]) * out["prompt_tokens"] + out["question_tokens"] + n
    assert all(0.0 <= h <= math.log(kept) + 1e-6 for h in out["attention_entropy_steps"])
    assert all(0.0 <= m <= 1.0 for m in out["top2_margin_steps"])
    mass = out["evicted_mass"]
    assert 0.0 < mass["realised"]["mean"] < 1.0 and set(mass["realised"]) == {"max", "mean", "rms"}
    assert (mass["expected"] is None) == (sampler == "topk")
    for key in ("output_entropy_steps", "top2_margin_steps", "attention_entropy_steps", "evicted_mass"):
        assert out[key] == again[key]  # same seed, same signals
