"""Scorers and allocation policies against direct computations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvcert.method.allocation import allocate_adakv, allocate_pyramid, allocate_uniform
from kvcert.method.design import RetentionDesign
from kvcert.method.scorers import SCORERS, LayerObservation, get_scorer


def observation(seed=0, b=1, hq=4, hkv=2, q=40, length=120, d=8, log_pi=None):
    g = torch.Generator().manual_seed(seed)
    return LayerObservation(
        query=torch.randn(b, hq, q, d, generator=g),
        key=torch.randn(b, hkv, length, d, generator=g),
        value=torch.randn(b, hkv, length, d, generator=g),
        log_pi=log_pi,
        scaling=d**-0.5,
    )


def dense_attention(obs):
    """[B, Hq, Q, L] causal attention of every query, via repeat of KV heads (float64)."""
    b, hq, n_q, d = obs.query.shape
    length = obs.key.shape[2]
    g = hq // obs.key.shape[1]
    k = obs.key.repeat_interleave(g, dim=1).double()
    logits = obs.query.double() @ k.transpose(-1, -2) * obs.scaling
    if obs.log_pi is not None:
        logits = logits - obs.log_pi.repeat_interleave(g, dim=1).double().unsqueeze(-2)
    pos_q = length - n_q + torch.arange(n_q)
    logits = logits.masked_fill(torch.arange(length)[None, :] > pos_q[:, None], float("-inf"))
    return torch.softmax(logits, -1)


def per_kv_head_mean(x, hkv):
    b, hq = x.shape[:2]
    return x.reshape(b, hkv, hq // hkv, *x.shape[2:]).mean(2)


def test_h2o_is_accumulated_attention():
    obs = observation()
    att = dense_attention(obs)
    expected = per_kv_head_mean(att.sum(2), 2)
    torch.testing.assert_close(get_scorer("h2o", query_block=7)(obs).double(), expected, rtol=1e-5, atol=1e-6)


def test_snapkv_is_pooled_window_attention():
    obs = observation(1)
    att = dense_attention(obs)[:, :, -16:]
    raw = per_kv_head_mean(att.mean(2), 2)
    expected = F.avg_pool1d(raw.reshape(2, 1, -1), 5, stride=1, padding=2, count_include_pad=False).reshape(1, 2, -1)
    torch.testing.assert_close(get_scorer("snapkv", window=16)(obs).double(), expected, rtol=1e-5, atol=1e-6)


def test_tova_is_last_query_attention_shared_by_heads():
    obs = observation(2)
    last = dense_attention(obs)[:, :, -1].mean(1)  # [B, L]
    got = get_scorer("tova")(obs).double()
    torch.testing.assert_close(got[:, 0], last, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got[:, 1], last, rtol=1e-5, atol=1e-7)


def test_key_norm_and_value_aware_and_streaming():
    obs = observation(3)
    kn = get_scorer("knorm")(obs)
    torch.testing.assert_close(kn, 1.0 / (obs.key.norm(dim=-1) + 1e-6))
    att = dense_attention(obs)[:, :, -8:]  # [B, Hq, w, L]
    v = obs.value.repeat_interleave(2, dim=1).double()
    out = att @ v  # [B, Hq, w, D]
    dist = (v.unsqueeze(2) - out.unsqueeze(3)).norm(dim=-1)  # [B, Hq, w, L]
    expected = per_kv_head_mean((att * dist).mean(2), 2)
    torch.testing.assert_close(get_scorer("value_aware", window=8)(obs).double(), expected, rtol=1e-4, atol=1e-6)
    rec = get_scorer("streaming_llm")(obs)
    assert (rec.diff(dim=-1) > 0).all()


def test_padding_scores_zero_and_bias_used():
    log_pi = torch.zeros(1, 2, 120)
    log_pi[0, 0, 100:110] = float("inf")
    log_pi[0, 1, :50] = -1.0
    obs = observation(4, log_pi=log_pi)
    for name in SCORERS:
        s = get_scorer(name)(obs)
        assert s.shape == (1, 2, 120) and (s >= 0).all()
        if name != "streaming_llm":
            assert (s[0, 0, 100:110] == 0).all(), name
    expected = per_kv_head_mean(dense_attention(obs).sum(2), 2)
    torch.testing.assert_close(get_scorer("h2o")(obs).double(), expected, rtol=1e-5, atol=1e-6)


def test_unknown_scorer():
    with pytest.raises(ValueError, match="scorer"):
        get_scorer("random")


def test_allocations():
    design = RetentionDesign()
    scores = torch.rand(2, 4, 1000, generator=torch.Generator().manual_seed(0)).pow(4)
    uni = allocate_uniform(scores, 0.25, 0, 8, design)
    assert (uni == 250).all()
    layers = [int(allocate_pyramid(scores, 0.25, i, 8, design)[0, 0]) for i in range(8)]
    assert layers == sorted(layers, reverse=True) and abs(sum(layers) / 8 - 250) <= 1
    ada = allocate_adakv(scores * torch.tensor([1.0, 10.0, 1.0, 1.0]).view(1, 4, 1), 0.25, 0, 8, design)
    assert (ada.sum(-1) == 4 * 250).all()
    assert (ada >= 36 + int(0.2 * (250 - 36))).all()
    skewed = scores.clone()
    skewed[:, 0, 100:200] = 50.0  # head 0 concentrates its mass: a flatter head 1 needs more tokens
    skewed_alloc = allocate_adakv(skewed, 0.25, 0, 8, design)
    assert (skewed_alloc.sum(-1) == 1000).all()


@pytest.mark.parametrize("budget", [0.05, 0.25, 0.5, 0.6, 0.75, 0.9, 1.0])
def test_the_pyramid_keeps_the_budget_on_average_and_the_whole_prompt_at_budget_one(budget):
    """PyramidKV's per-layer budgets average the uniform one (each layer rounds: within half a token), decrease
    with depth, stay within [sinks + window, N]; where the top would pass the prompt it is clipped and the bottom
    raised by as much (KVCache-Factory), so budget 1 keeps every token of every layer."""
    from kvcert.method.allocation.pyramid import pyramid_budget
    from kvcert.method.design import RetentionDesign

    design, n, layers = RetentionDesign(), 1000, 30
    k = round(budget * n)
    ks = [pyramid_budget(k, layer, layers, n, design) for layer in range(layers)]
    assert abs(sum(ks) / layers - max(k, design.sinks + design.window)) <= 0.5
    assert ks == sorted(ks, reverse=True) and min(ks) >= design.sinks + design.window and max(ks) <= n
    if budget == 1.0:
        assert ks == [n] * layers
