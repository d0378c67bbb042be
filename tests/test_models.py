"""Hájek-corrected attention inside real transformers models (Llama, Qwen2, Mistral; GQA)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from kvcert import CertifiedCache, EvictionPress, enable_certified_attention
from kvcert.method.cache import CompactLayer
from kvcert.method.integration import cache_argument
from kvcert.method.scorers.base import Scorer


def ids(n, seed=0, batch=1):
    return torch.randint(0, 128, (batch, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_full_budget_equals_plain_model(arch):
    """Prefill armed at 100%, then a question chunk and decode steps: logits equal the plain model's."""
    model = tiny_model(arch)
    x = ids(180)
    reference = model(x).logits
    enable_certified_attention(model)
    cache = CertifiedCache(press=EvictionPress(scorer="snapkv", budget=1.0, sampler="poisson"))
    first = model(input_ids=x[:, :120], cache=cache).logits
    assert all(layer.compactions == 1 for layer in cache.layers)
    second = model(input_ids=x[:, 120:150], cache=cache).logits  # a streaming-style question chunk
    steps = [model(input_ids=x[:, t : t + 1], cache=cache).logits for t in range(150, 180)]
    got = torch.cat([first, second, *steps], dim=1)
    assert (got - reference).abs().max() <= 1e-5
    assert cache.get_seq_length() == 180


@torch.no_grad()
def test_hajek_path_with_zero_bias_equals_plain(arch):
    """A compacted 100% cache whose log π is forced through the biased path changes nothing."""
    model = tiny_model(arch)
    x = ids(100, seed=1)
    reference = model(x).logits
    enable_certified_attention(model)
    cache = CertifiedCache(press=EvictionPress(budget=1.0, sampler="topk"))
    model(input_ids=x[:, :90], cache=cache)
    for layer in cache.layers:
        layer.has_padding = True  # forces the bias path (bias is exactly 0)
    out = torch.cat([model(input_ids=x[:, t : t + 1], cache=cache).logits for t in range(90, 100)], dim=1)
    assert (out - reference[:, 90:]).abs().max() <= 1e-5


def capture_attention_outputs(model):
    """Capture each layer's attention output per head (input of o_proj)."""
    captured = {}
    handles = []
    for idx, layer in enumerate(model.model.layers):
        def hook(module, args, idx=idx):
            captured[idx] = args[0].detach().clone()
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(hook))
    return captured, handles


@torch.no_grad()
@pytest.mark.parametrize("sampler", ["poisson", "priority"])
def test_heads_equal_explicit_float64_hajek_ratio(arch, sampler):
    model = tiny_model(arch)
    enable_certified_attention(model)
    x = ids(300, seed=2)
    press = EvictionPress(scorer="snapkv", budget=0.25, sampler=sampler, seed=5)
    cache = CertifiedCache(press=press, capture_layers=[0, 1])
    model(input_ids=x[:, :299], cache=cache)
    assert all(layer.has_tail for layer in cache.layers)
    outputs, handles = capture_attention_outputs(model)
    model(input_ids=x[:, 299:], cache=cache)
    for h in handles:
        h.remove()
    cfg = model.config
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = cfg.hidden_size // hq
    for layer_idx in (0, 1):
        obs = cache.captured[layer_idx]
        layer = cache.layers[layer_idx]
        q = obs.query[0, :, -1].double()  # [Hq, D]
        got = outputs[layer_idx][0, -1].reshape(hq, d).double()
        for h in range(hq):
            kv = h // (hq // hkv)
            valid = torch.isfinite(layer.log_pi[0, kv])
            k = layer.keys[0, kv][valid].double()
            v = layer.values[0, kv][valid].double()
            pi = torch.exp(layer.log_pi[0, kv][valid].double())
            weights = torch.exp(q[h] @ k.T * obs.scaling) / pi
            expected = (weights / weights.sum()) @ v
            assert torch.allclose(got[h], expected, atol=1e-5, rtol=1e-5)


class _InputsSeen(Scorer):
    """A scorer that keeps the hidden states and RoPE each layer's observation carries (scores: key norms)."""

    def __init__(self):
        self.seen = {}

    def score(self, obs):
        self.seen[obs.layer_idx] = (obs.hidden_states, obs.position_embeddings)
        return obs.key.float().norm(dim=-1)


@torch.no_grad()
def test_scorers_see_the_attention_modules_inputs_and_nothing_outlives_the_forward(arch):
    """The scorers may read each attention module's hidden states and RoPE (a kvpress press scores from them):
    the observation holds what the module was called with, and the module drops them when it returns."""
    model = tiny_model(arch)
    enable_certified_attention(model)
    enable_certified_attention(model)  # idempotent: one wrapper, not two
    called = {}
    handles = [layer.self_attn.register_forward_pre_hook(
        lambda module, args, kwargs, idx=idx: called.__setitem__(idx, (kwargs["hidden_states"],
                                                                       kwargs["position_embeddings"])),
        with_kwargs=True) for idx, layer in enumerate(model.model.layers)]
    scorer = _InputsSeen()
    model(input_ids=ids(40, seed=4), cache=CertifiedCache(press=EvictionPress(scorer=scorer, budget=0.5, sampler="topk")))
    for h in handles:
        h.remove()
    assert sorted(scorer.seen) == sorted(called) == list(range(len(model.model.layers)))
    for idx, layer in enumerate(model.model.layers):
        hidden, (cos, sin) = called[idx]
        seen_hidden, seen_rope = scorer.seen[idx]
        assert seen_hidden is hidden and seen_rope[0] is cos and seen_rope[1] is sin
        assert layer.self_attn._kvcert_inputs is None
        assert not isinstance(layer.self_attn.forward.forward, type(layer.self_attn.forward))


@torch.no_grad()
def test_memory_falls_with_budget_and_decode_tokens_are_certain():
    model = tiny_model("llama")
    enable_certified_attention(model)
    x = ids(1000, seed=3)
    full = CertifiedCache()
    model(input_ids=x, cache=full)
    cache = CertifiedCache(press=EvictionPress(scorer="h2o", budget=0.25, sampler="topk"))
    model(input_ids=x, cache=cache)
    ratio = cache.kv_nbytes() / full.kv_nbytes()
    assert abs(ratio - 0.25) < 0.01
    assert cache.layers[0].keys.shape[2] == 250  # the tensors really shrank
    model(input_ids=ids(1, seed=4), cache=cache)
    layer = cache.layers[0]
    assert layer.length == 251 and (layer.log_pi[..., -1] == 0).all()
    assert cache.get_seq_length() == 1001


def test_a_long_decode_grows_storage_by_a_sixteenth_and_keeps_every_slot():
    """Appending one slot at a time past the reserve: each growth copies every slot in use (keys, values, log π,
    1 − π, ‖v − c‖ unchanged, bit for bit) and leaves at most capacity/16 plus the reserve unused — never the
    quarter a 1.25 growth left."""
    from kvcert.method.cache import GROWTH

    assert GROWTH == 1.0625
    g = torch.Generator().manual_seed(11)
    layer = CompactLayer(reserve=8)
    k0, v0 = torch.randn(1, 2, 200, 4, generator=g), torch.randn(1, 2, 200, 4, generator=g)
    layer.update(k0, v0)
    layer._lp[..., :200] = -torch.rand(1, 2, 200, generator=g)  # stand-ins for a compaction's per-slot terms
    lp0 = layer._lp[..., :200].clone()
    capacities, keys, values = {layer.capacity}, [k0], [v0]
    for _ in range(300):
        k, v = torch.randn(1, 2, 1, 4, generator=g), torch.randn(1, 2, 1, 4, generator=g)
        layer.update(k, v)
        keys.append(k), values.append(v)
        capacities.add(layer.capacity)
        assert layer.capacity - layer.length <= layer.length // 16 + layer.reserve + 1
    assert len(capacities) >= 4  # it grew several times on the way
    assert torch.equal(layer.keys, torch.cat(keys, 2)) and torch.equal(layer.values, torch.cat(values, 2))
    assert torch.equal(layer.log_pi[..., :200], lp0) and (layer.log_pi[..., 200:] == 0).all()


@torch.no_grad()
def test_ragged_heads_are_padded_with_infinite_log_pi():
    model = tiny_model("qwen2")
    enable_certified_attention(model)
    x = ids(400, seed=6)
    cache = CertifiedCache(press=EvictionPress(scorer="snapkv", budget=0.25, sampler="topk", allocation="adakv"))
    model(input_ids=x, cache=cache)
    layer = cache.layers[0]
    counts = layer.kept[0]
    assert counts.sum() == 2 * 100 and counts.min() < counts.max()
    assert layer.has_padding
    short = int(counts.argmin())
    assert torch.isinf(layer.log_pi[0, short, counts[short]:]).all()
    assert layer.length == int(counts.max())


@torch.no_grad()
def test_certificates_recorded_per_decode_step():
    model = tiny_model("mistral")
    enable_certified_attention(model)
    x = ids(300, seed=7)
    cache = CertifiedCache(press=EvictionPress(scorer="tova", budget=0.25, sampler="poisson"))
    model(input_ids=x, cache=cache)
    assert cache.step_log == []  # the prefill ran over the full cache
    for t in range(3):
        model(input_ids=ids(1, seed=10 + t), cache=cache)
    steps = cache.pop_steps()
    assert len(steps) == 3
    for step in steps:
        assert set(step.variance) == {0, 1}
        assert step.variance[0].shape == (1, 4, 1)
        assert (step.variance[0] > 0).all() and (step.range_term[0] > 0).all()


@torch.no_grad()
def test_generate_works_and_matches_plain_at_full_budget(arch):
    model = tiny_model(arch)
    x = ids(64, seed=8)
    plain = model.generate(x, max_new_tokens=8, do_sample=False)
    enable_certified_attention(model)
    name = cache_argument(model.model)  # generate's cache keyword: cache (transformers 5.24), past_key_values (5.2)
    full = model.generate(x, max_new_tokens=8, do_sample=False, **{name: CertifiedCache(press=EvictionPress(budget=1.0))})
    assert torch.equal(plain, full)
    cache = CertifiedCache(press=EvictionPress(budget=0.6, sampler="poisson"))
    out = model.generate(x, max_new_tokens=8, do_sample=False, **{name: cache})
    assert out.shape == (1, 72)
    assert len(cache.step_log) == 7  # one per decode step after the prefill
    assert isinstance(cache.layers[0], CompactLayer) and cache.layers[0].compactions == 1


@torch.no_grad()
def test_padded_batch_is_refused():
    model = tiny_model("llama")
    enable_certified_attention(model)
    x = ids(20, batch=2)
    mask = torch.ones_like(x)
    mask[0, :3] = 0
    with pytest.raises(ValueError, match="attention_mask: padded batches"):
        model(input_ids=x, attention_mask=mask, cache=CertifiedCache())


@torch.no_grad()
def test_streaming_rounds_decide_new_tokens_once():
    """keep_recent: only tokens appended since the last round (minus the window) are decided."""
    model = tiny_model("llama")
    enable_certified_attention(model)
    press = EvictionPress(scorer="snapkv", budget=0.5, sampler="poisson")
    cache = CertifiedCache(press=press)
    model(input_ids=ids(200, seed=11), cache=cache)
    layer = cache.layers[0]
    before = layer.log_pi.clone()
    kept_before = layer.length
    model(input_ids=ids(100, seed=12), cache=cache)
    cache.arm(press, keep_recent=32)
    model(input_ids=ids(10, seed=13), cache=cache)
    valid_before = torch.isfinite(before)
    # the old retained tokens keep their log π (they sit at the start of every head)
    for h in range(before.shape[1]):
        n_old = int(valid_before[0, h].sum())
        assert torch.equal(layer.log_pi[0, h, :n_old], before[0, h][valid_before[0, h]])
    assert layer.length < kept_before + 110
    assert cache.get_seq_length() == 310
    for h in range(layer.log_pi.shape[1]):  # the newest 32 tokens of every head are still undecided
        valid = layer.log_pi[0, h][torch.isfinite(layer.log_pi[0, h])]
        n_old = int(valid_before[0, h].sum())
        assert (valid[-32:] == 0).all() and (valid[n_old:-32] < 0).any()


@torch.no_grad()
def test_compaction_keeps_an_eviction_sketch(arch):
    """A randomized press leaves each layer the shadow of its evicted tokens of largest selection score, within the
    memory budget and counted in nbytes; decode steps record the shadow terms; merging across streaming rounds."""
    from kvcert.method.sketch import SCALAR_BYTES, shadow_count

    model = enable_certified_attention(tiny_model(arch))
    x = ids(600, seed=3)
    cache = CertifiedCache(press=EvictionPress(scorer="snapkv", budget=0.25, sampler="poisson", seed=1))
    model(input_ids=x[:, :580], cache=cache)
    for layer in cache.layers:
        sk = layer.sketch
        slots = shadow_count(580, 2 * 16 * 4, 16)
        assert sk is not None and sk.slots == slots and torch.all(sk.count == slots)
        assert layer.sketch_nbytes() == 2 * slots * (16 + SCALAR_BYTES)
        assert layer.sketch_nbytes() <= 0.02 * layer.kv_nbytes()  # ~25 % cache: at most 2 % of its key + value bytes
        assert layer.nbytes() == layer.kv_nbytes() + 12 * 2 * layer.length + layer.sketch_nbytes()
    cache.pop_steps()
    model(input_ids=x[:, 580:581], cache=cache)
    step = cache.pop_steps()[0]
    assert set(step.shadow_sum) == set(step.variance) and all(torch.all(v >= 0) for v in step.shadow_range.values())
    assert any(bool((v > 0).any()) for v in step.shadow_range.values())
    # topk: no certificate, no sketch
    cache = CertifiedCache(press=EvictionPress(scorer="snapkv", budget=0.25, sampler="topk"))
    model(input_ids=x[:, :300], cache=cache)
    assert all(layer.sketch is None for layer in cache.layers)
    # streaming rounds: each round's evicted tokens compete with the previous shadow
    cache = CertifiedCache()
    press = EvictionPress(scorer="snapkv", budget=0.25, sampler="poisson", seed=2)
    for start in range(0, 512, 128):
        cache.arm(press, keep_recent=32)
        model(input_ids=x[:, start:start + 128], cache=cache)
    for layer in cache.layers:
        assert layer.sketch.slots == shadow_count(512, 2 * 16 * 4, 16) and torch.all(layer.sketch.count > 0)
