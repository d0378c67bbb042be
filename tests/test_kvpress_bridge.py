"""kvcert's side of living beside kvpress (kvcert.method.kvpress_bridge, docs/kvpress.md), without kvpress.

kvpress itself is exercised in a throwaway environment (tests/test_kvpress_env.py runs
tests/kvpress_checks.py there); here the patterns kvpress's code applies to a cache are
replayed on kvcert's objects: a press applied ``with press(model):`` over a plain
``DynamicCache`` (kvpress's default cache) against the same press arming a
``CertifiedCache``; the crop kvpress's pipeline makes between questions
(``layer.keys = layer.keys[:, :, :n]`` with ``n`` from ``get_seq_length``); a press that
gathers keys into a kvcert cache.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import DynamicCache

from conftest import tiny_model
from kvcert import CertifiedCache, EvictionPress, enable_certified_attention
from kvcert.generation.spec import MethodSpec

CONTEXT, QUESTION = 256, 7


def ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 128, (1, n), generator=torch.Generator().manual_seed(seed))


def remove_answer(cache, lengths: list[int]) -> None:
    """What kvpress 0.5.5's pipeline does after each answer (``_remove_answer_from_cache``)."""
    for i, n in enumerate(lengths):
        cache.layers[i].keys = cache.layers[i].keys[:, :, :n]
        cache.layers[i].values = cache.layers[i].values[:, :, :n]


def poisson_press(**kwargs) -> EvictionPress:
    return EvictionPress(scorer="snapkv", budget=0.3, sampler="poisson", seed=3, **kwargs)


@torch.no_grad()
def test_a_press_the_kvpress_way_over_a_dynamic_cache_equals_the_certified_cache():
    """The Poisson press over kvpress's default cache keeps the same slots and gives the same
    logits (to fp32 rounding) as over kvcert's cache: log π travels on the module."""
    model = tiny_model("llama", layers=2)
    context, question = ids(CONTEXT, 0), ids(QUESTION, 1)
    positions = torch.arange(CONTEXT, CONTEXT + QUESTION)[None]
    plain = DynamicCache()
    with poisson_press()(model):
        model(input_ids=context, cache=plain)
    logits_plain = model(input_ids=question, cache=plain, position_ids=positions).logits
    certified = CertifiedCache()
    with poisson_press()(model):
        model(input_ids=context, cache=certified)
    logits_certified = model(input_ids=question, cache=certified).logits
    from kvcert.method.integration import attention_modules

    for i, module in enumerate(attention_modules(model)):
        layer = certified.layers[i]
        assert plain.layers[i].keys.shape[2] == layer.length < CONTEXT
        assert torch.equal(module.kvcert_log_pi, layer.log_pi[..., : layer.length - QUESTION])
    assert all(layer.has_tail for layer in certified.layers)  # a sampled tail: π < 1 carried both ways
    assert len(certified.step_log) > 0  # the kvcert cache certifies the question's forward
    torch.testing.assert_close(logits_plain, logits_certified, rtol=1e-5, atol=1e-5)
    # outside the context manager nothing compresses
    fresh = DynamicCache()
    model(input_ids=context, cache=fresh)
    assert fresh.layers[0].keys.shape[2] == CONTEXT


def test_a_forward_without_a_cache_is_compressed_like_kvpress_and_builds_no_graph():
    """``with press(model): model(ids, use_cache=True)`` with no cache passed: the cache the
    forward makes is compressed (kvpress's KnormPress does so), to the same slots and logits as
    an empty DynamicCache passed in; outside ``torch.no_grad()`` nothing warns; without
    ``use_cache`` there is no cache and nothing to compress."""
    import warnings

    model = tiny_model("llama", layers=2)
    context = ids(CONTEXT, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "Converting a tensor with requires_grad=True to a scalar"
        with poisson_press()(model):
            made = model(context, use_cache=True).past_key_values
    passed = DynamicCache()
    with torch.no_grad(), poisson_press()(model):
        model(context, cache=passed)
    assert made is not None
    for mine, theirs in zip(made.layers, passed.layers):
        assert mine.keys.shape[2] == theirs.keys.shape[2] < CONTEXT
        torch.testing.assert_close(mine.keys, theirs.keys)
    with poisson_press()(model):
        assert model(context, use_cache=False).past_key_values is None


@torch.no_grad()
def test_the_kvpress_crop_between_questions_restores_the_compressed_context():
    """kvpress's pipeline crops to the lengths ``get_seq_length`` gave before the question; the
    compacted layer goes back to what compaction left (not the question and its answer kept)."""
    model = enable_certified_attention(tiny_model("llama", layers=2))
    cache = CertifiedCache(press=poisson_press())
    model(input_ids=ids(CONTEXT, 0), cache=cache)
    stored = [layer.length for layer in cache.layers]
    lengths = [cache.get_seq_length(i) for i in range(len(cache.layers))]
    assert lengths == [CONTEXT, CONTEXT] and stored[0] < CONTEXT

    def ask(question):
        x, out = question, []
        for _ in range(5):  # the question, then greedy tokens
            logits = model(input_ids=x, cache=cache).logits[0, -1]
            out.append(int(logits.argmax()))
            x = torch.tensor([[out[-1]]])
        remove_answer(cache, lengths)
        assert [layer.length for layer in cache.layers] == stored
        assert [cache.get_seq_length(i) for i in range(len(cache.layers))] == lengths
        return out

    first, other, again = ask(ids(QUESTION, 1)), ask(ids(QUESTION, 2)), ask(ids(QUESTION, 1))
    assert first == again


@torch.no_grad()
def test_a_crop_shorter_than_the_stored_slots_is_exact_and_compaction_cannot_be_undone():
    model = enable_certified_attention(tiny_model("llama", layers=2))
    cache = CertifiedCache()
    context = ids(CONTEXT, 0)
    model(input_ids=context, cache=cache)  # no compaction: logical and stored lengths agree
    full = cache.layers[0].keys.clone()
    remove_answer(cache, [60, 60])
    layer = cache.layers[0]
    assert (layer.length, layer.seen, layer.keys.shape[2], layer.values.shape[2]) == (60, 60, 60, 60)
    assert torch.equal(layer.keys, full[:, :, :60])
    cache = CertifiedCache(press=poisson_press())
    model(input_ids=context, cache=cache)
    layer = cache.layers[0]
    compacted = layer.length
    model(input_ids=ids(QUESTION, 1), cache=cache)
    with pytest.raises(ValueError, match=f"^crop: the layer keeps {CONTEXT} decided tokens of the {CONTEXT + QUESTION} "
                                         f"seen; it cannot be cropped to {CONTEXT - 1}$"):
        layer.crop(CONTEXT - 1)
    layer.crop(CONTEXT + 2)
    assert (layer.seen, layer.length) == (CONTEXT + 2, compacted + 2)


@torch.no_grad()
def test_a_snapshot_restores_the_decoded_tokens_away_and_refuses_a_compaction_since():
    """The cache owns its rewind (what the decode benchmarks time, then drop): decoding after a restore gives the
    same logits and certificates as the first time, the recorded steps go with the tokens, and a layer compacted
    after the mark is refused, naming it."""
    model = enable_certified_attention(tiny_model("llama", layers=2))
    cache = CertifiedCache(press=poisson_press())
    model(input_ids=ids(CONTEXT, 0), cache=cache)
    cache.pop_steps()
    mark, stored = cache.snapshot(), [layer.length for layer in cache.layers]

    def decode():
        x, out = ids(1, 5), []
        for _ in range(4):
            out.append(model(input_ids=x, cache=cache).logits[0, -1])
            x = out[-1].argmax().reshape(1, 1)
        return torch.stack(out), [s.variance[0].clone() for s in cache.pop_steps()]

    first, first_v = decode()
    model(input_ids=ids(1, 6), cache=cache)  # a step more, recorded and not popped
    cache.restore(mark)
    assert [layer.length for layer in cache.layers] == stored and not cache.step_log
    again, again_v = decode()
    assert torch.equal(first, again) and all(torch.equal(a, b) for a, b in zip(first_v, again_v))
    cache.restore(mark)
    cache.arm(poisson_press())
    model(input_ids=ids(QUESTION, 1), cache=cache)  # compacts every layer again
    with pytest.raises(ValueError, match="^restore: layer 0 was compacted after the mark"):
        cache.restore(mark)


@torch.no_grad()
def test_a_press_that_gathers_keys_into_a_kvcert_cache_raises():
    """What a kvpress ScorerPress's hook does (``cache_layer.keys = gathered keys``) is refused."""
    model = enable_certified_attention(tiny_model("llama", layers=2))
    cache = CertifiedCache()
    model(input_ids=ids(CONTEXT, 0), cache=cache)
    layer = cache.layers[0]
    gathered = layer.keys.gather(2, torch.arange(0, CONTEXT, 2)[None, None, :, None].expand(1, 2, -1, 16))
    with pytest.raises(ValueError, match=r"^layer keys: a kvcert CompactLayer can only be cropped") as error:
        layer.keys = gathered
    assert "\n" not in str(error.value)
    assert layer.length == CONTEXT  # nothing changed


@pytest.mark.skipif(importlib.util.find_spec("kvpress") is not None, reason="kvpress is installed here")
def test_a_kvpress_scorer_without_kvpress_says_how_to_get_it():
    from kvcert.method.scorers import get_scorer

    with pytest.raises(ValueError, match="^scorer: kvpress scorers need the kvpress package"):
        get_scorer("kvpress:SnapKVPress")
    with pytest.raises(ValueError, match="need the kvpress package"):
        MethodSpec(name="x", scorer="kvpress:SnapKVPress", sampler="poisson", scorer_options={"window_size": 8})


def test_a_scorer_name_is_builtin_or_kvpress():
    assert MethodSpec(name="x", scorer="kvpress:SnapKVPress", sampler="poisson").scorer == "kvpress:SnapKVPress"
    with pytest.raises(ValueError, match=r"method.scorer: 'snapkw' is not one of .* nor kvpress:<a kvpress ScorerPress>"):
        MethodSpec(name="x", scorer="snapkw", sampler="poisson")
