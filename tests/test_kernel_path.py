"""The fused kernel's path through a whole model, on a CPU: the kernels in Triton's interpreter, planned as for a
GPU (``kvcert_kernels.launch.emulating``, whose recorder runs each launch) and taken on the CPU
(``kvcert.method.attention.kernel_on_every_device``).

* The generation path on the kernel's plans (their statistics written by the kernels into the recorder's buffer
  at the device step index, folded on the device) gives the records the torch path gives: the same greedy
  tokens, certificates within the kernel's fp32 tolerance.
* A decode step replayed from a graph (tests/graph_emulator.py: a CUDA graph's semantics on a CPU) gives, step for
  step, what the eager step gives: the same tokens, log-probabilities, signals, statistics and host counts.

Kernel tier: it needs ``TRITON_INTERPRET=1`` before triton is imported, which tests/tiers.sh sets for the tier on a
machine without a GPU; a run without it skips these, saying how to run them.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from conftest import tiny_model  # noqa: E402
from graph_emulator import EmulatedGraph, launcher  # noqa: E402
from kvcert import CertifiedCache, EvictionPress, enable_certified_attention  # noqa: E402
from kvcert.bench.host import static_tensors  # noqa: E402
from kvcert.generation.decode_step import DecodeStep  # noqa: E402
from kvcert.method.attention import kernel_on_every_device  # noqa: E402
from kvcert_kernels.launch import emulating  # noqa: E402

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(not isinstance(tl.zeros, InterpretedFunction),
                       reason="these run the kernels in Triton's interpreter on CPU tensors: run with TRITON_INTERPRET=1 "
                              "(tests/tiers.sh kernel sets it without a GPU; on a GPU kernels/gpu_check.sh step 4 "
                              "compares eager and replayed decoding)"),
]


def ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 128, (1, n), generator=torch.Generator().manual_seed(seed))


@torch.inference_mode()
def test_a_graph_replayed_decode_step_gives_what_the_eager_step_gives():
    def run(graph: bool):
        model = enable_certified_attention(tiny_model("llama"))
        cache = CertifiedCache(press=EvictionPress(scorer="snapkv", budget=0.3, sampler="poisson", seed=3),
                               reserve=12, static_decode=True)
        with emulating(sms=2, record=launcher), kernel_on_every_device():
            model(input_ids=ids(150, 0), cache=cache)
            cache.pop_steps()
            step = DecodeStep(model, cache, [5], cache.get_seq_length(), "cpu", warmup=1,
                              graph=(lambda: EmulatedGraph(lambda: static_tensors(model, cache, step))) if graph else None)
            reads = [step() for _ in range(6)]
            replayed = step._graph is not None
        marks = list(cache.recorder.marks)
        stats = cache.recorder.buffer.data[: len(marks)].clone()
        counts = [(layer.length, layer.seen, layer.undecided, layer.kept.tolist()) for layer in cache.layers]
        return reads, marks, stats, counts, replayed

    eager, graphed = run(False), run(True)
    assert graphed[4] and not eager[4]  # the graph run replayed (after one eager step and the capture)
    assert graphed[0] == eager[0]  # tokens, log-probabilities, finiteness, entropy, margin of every step
    assert graphed[1] == eager[1] and len(eager[1]) == 6
    assert torch.equal(graphed[2], eager[2])  # V̂, b̂_c, ‖ô‖, shadow terms, entropy of every step and layer
    assert graphed[3] == eager[3]


@torch.inference_mode()
def test_the_generation_path_on_the_kernels_plans_gives_the_torch_paths_records(word_model_dir):
    """Forked rows (question-aware and streaming, Poisson and top-k) decoded on the kernels' plans: the records the
    torch path writes, certificates and attention entropies within the forked path's own tolerance."""
    from test_forked import mismatches, strip

    from kvcert.generation.engine import Engine
    from kvcert.generation.forked import generate
    from kvcert.generation.spec import GenerationSpec
    from kvcert.method.models import ModelSpec, load_model
    from kvcert.tasks import generate as generate_task

    model, tok = load_model(ModelSpec(name="tiny", path=str(word_model_dir)))
    record = generate_task("needle", tok, n_examples=1, target_tokens=300, seed=5)[0]
    specs = [GenerationSpec.from_dict({"model": {"name": "tiny", "path": "unused"}, "condition": c, "budget": 0.25,
                                       "seed": 7, "max_new_tokens": 5, "method": {
                                           "name": f"snapkv-{s}", "scorer": "snapkv", "sampler": s,
                                           "allocation": "uniform"}})
             for c in ("aware", "streaming") for s in ("poisson", "topk")]
    engines = [Engine(model, tok, spec, {"config_hash": "x"}) for spec in specs]
    torch_path = generate(engines, record)
    with emulating(sms=2, record=launcher), kernel_on_every_device():
        kernel_path = generate(engines, record)
    certified = 0
    for a, b in zip(torch_path, kernel_path):
        assert a["tokens"] == b["tokens"], (a["condition"], a["method"])
        problems = mismatches(strip(a), strip(b), f"{a['condition']}/{a['method']}")
        assert not problems, problems[:5]
        certified += b["certificate"] is not None
    assert certified >= 1  # a Poisson row certifies, on the kernel's statistics
