"""The decode step in buffers that stay put (kvcert.generation.decode_step) and what makes it replayable: a layer's
append at its device count, the host's side of a step on its own, and the check that two steps dispatch the same
work (``kvcert bench host``'s graph safety). The replay itself, through an emulated CUDA graph with the kernels in
Triton's interpreter, is tests/test_kernel.py's ``test_a_graph_replayed_decode_step_*``."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import tiny_model
from kvcert import CertifiedCache, EvictionPress, enable_certified_attention
from kvcert.generation.decode_step import DecodeStep, host_state, restore_host_state
from kvcert.method.batched import BatchedLayer


def ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 128, (1, n), generator=torch.Generator().manual_seed(seed))


def compressed(model, seed=0) -> CertifiedCache:
    cache = CertifiedCache(press=EvictionPress(scorer="snapkv", budget=0.3, sampler="poisson", seed=seed), reserve=8)
    model(input_ids=ids(200, seed), cache=cache)
    cache.pop_steps()
    return cache


def same_layer(a, b) -> None:
    n = a.length
    assert (a.length, a.seen, a.undecided) == (b.length, b.seen, b.undecided)
    assert torch.equal(a.kept, b.kept)
    for name in ("_k", "_v", "_lp", "_om", "_dev"):
        assert torch.equal(getattr(a, name)[:, :, :n], getattr(b, name)[:, :, :n]), name
    assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@torch.no_grad()
def test_a_layer_appends_at_its_device_count_as_at_its_host_count():
    """A layer whose slots in use live on the device appends a decode step's token there (and advances the count on
    the device): the same slots, counts, kept tokens and views as the host's append, π = 1 for the new slot
    (log π, 1 − π, ‖v − c‖ = 0) even where the slot held padding (+inf) before — a stack of forks — and the device
    count equal to the host's throughout (growth included)."""
    model = enable_certified_attention(tiny_model("llama"))
    host = compressed(model)
    device = copy.deepcopy(host)
    for layer in device.layers:
        layer.lengths_on_device()
    for t in range(12):  # past the 8 spare slots: the layers grow
        k, v = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 1, 16)
        for a, b in zip(host.layers, device.layers):
            a.update(k, v)
            b.update(k, v)
            same_layer(a, b)
            assert int(b.lengths_on_device()) == b.length
            assert torch.all(b.log_pi[:, :, -1] == 0) and torch.all(b.one_minus[:, :, -1] == 0)
    stack = BatchedLayer.stack([compressed(model).layers[0], compressed(model, seed=1).layers[0]], room=0)
    assert torch.isinf(stack._lp[:, :, stack.length]).all()  # the next slot holds padding
    other = copy.deepcopy(stack)
    other.lengths_on_device()
    k, v = torch.randn(2, 2, 1, 16), torch.randn(2, 2, 1, 16)
    stack.update(k, v)
    other.update(k, v)
    same_layer(stack, other)
    assert torch.all(other.log_pi[:, :, -1] == 0) and torch.all(other.dev[:, :, -1] == 0)


@torch.no_grad()
def test_the_hosts_side_of_a_step_alone_is_what_the_step_does_on_the_host():
    """``advance`` (what a replayed step runs on the host) leaves the counts and marks an eager step leaves, and a
    captured pass's host side is undone exactly (``host_state`` / ``restore_host_state``)."""
    model = enable_certified_attention(tiny_model("llama"))
    cache = compressed(model)
    before = host_state(cache)
    step = DecodeStep(model, cache, [5], cache.get_seq_length(), "cpu")
    step()
    after = host_state(cache)
    mark = cache.recorder.marks[-1]
    assert [seen + 1 for _, seen, _ in before.layers] == [seen for _, seen, _ in after.layers]
    restore_host_state(cache, before)
    assert host_state(cache).layers == before.layers and len(cache.recorder.marks) == before.marks
    for layer in cache.layers:
        layer.advance(1)
    cache.recorder.marks.append(mark)
    assert host_state(cache).layers == after.layers and cache.recorder.marks[-1] == mark
    assert [layer.keys.shape[2] for layer in cache.layers] == [x[0] for x in after.layers]


@torch.no_grad()
def test_the_decode_step_reads_its_tokens_log_probabilities_and_signals_once():
    """A step's one read: each row's greedy token, its log-probability, whether the logits were finite, the
    next-token entropy and top-2 margin — what the model's logits give — and the token becomes the next input."""
    from kvcert.generation.signals import next_token_signals

    model = enable_certified_attention(tiny_model("llama"))
    cache = compressed(model)
    reference = copy.deepcopy(cache)
    position = cache.get_seq_length()
    step = DecodeStep(model, cache, [7], position, "cpu")
    out = step()
    logits = model(input_ids=torch.tensor([[7]]), cache=reference).logits[0, -1]
    lp = torch.log_softmax(logits.float(), -1)
    token = int(lp.argmax())
    entropy, margin = next_token_signals(lp).tolist()
    assert out == [[float(token)], [float(lp[token])], [1.0], [entropy], [margin]]
    assert int(step.input) == token and int(step.position) == position + 1


def test_the_graph_safety_check_finds_a_baked_number_a_moved_buffer_and_a_read():
    """``StepTrace`` (kvcert bench host's graph safety) tells a step a CUDA graph can replay from one it cannot: a host
    number that changes between steps, a buffer at another address, or a value read back."""
    from kvcert.bench.host import StepTrace, first_difference
    from kvcert_kernels.launch import emulating

    static = torch.zeros(4)
    other = torch.zeros(4)

    def trace(fn):
        with emulating(), StepTrace({static.untyped_storage().data_ptr(), other.untyped_storage().data_ptr()}) as t:
            fn()
        return t

    def good(x=static):
        y = torch.ones(4) * 2  # made within the step: compared by the order it is made in
        x.add_(y)

    assert first_difference(trace(good).events, trace(good).events) is None
    assert "1.0" in first_difference(trace(lambda: static.add_(1.0)).events, trace(lambda: static.add_(2.0)).events)
    assert first_difference(trace(good).events, trace(lambda: good(other)).events) is not None
    assert trace(lambda: static.sum().item()).reads == 1


@pytest.mark.slow
def test_bench_host_measures_every_goal_on_a_small_shape(capsys):
    """``kvcert bench host`` runs on the CPU and ends with its one line: µs per call, operations and reads per step,
    graph safety, wave efficiency."""
    from kvcert.cli import main

    assert main(["bench", "host", "--calls", "50", "--repeats", "1", "--steps", "2", "--layers", "2",
                 "--prompt-tokens", "256"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    values = dict(part.split("=") for part in last.split())
    assert set(values) == {"host_us_per_call_cert", "host_us_per_call_plain", "ops_per_step_topk",
                           "ops_per_step_cert", "host_reads_per_step_cert", "graph_safe", "wave_eff_min_paper"}
    assert values["graph_safe"] == "1" and float(values["host_reads_per_step_cert"]) <= 1
