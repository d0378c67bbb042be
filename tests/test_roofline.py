"""The roofline cost model of ``kvcert plan`` (kvcert.pipeline.roofline)."""

from __future__ import annotations

import json
import math
import struct

import pytest

from kvcert.embedded import embedded_model_path
from kvcert.pipeline.plan import Run, Shard
from kvcert.pipeline.roofline import (ARCHITECTURES, GPUS, Architecture, architecture_from_config, generation_cost,
                                      gpu_of_device, model_architecture, shard_roofline_seconds)


def _safetensors_params(path) -> int:
    """Parameters of a safetensors file, from its header (8-byte length, then JSON of shapes)."""
    with open(path, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))
    return sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")


def test_parameter_count_equals_the_shipped_checkpoint():
    folder = embedded_model_path()
    arch = architecture_from_config(json.loads((folder / "config.json").read_text()))
    assert arch.params == _safetensors_params(folder / "model.safetensors")
    assert model_architecture("embedded", "embedded") == arch and arch.dtype_bytes == 4


@pytest.mark.parametrize("name,params,group", [
    ("llama-3.1-8b-instruct", 8.03e9, 4), ("mistral-7b-instruct", 7.25e9, 4),
    ("qwen2.5-7b-instruct", 7.62e9, 7), ("qwen2.5-1.5b-instruct", 1.54e9, 6),
])
def test_paper_models_match_their_published_sizes(name, params, group):
    arch = ARCHITECTURES[name]
    assert abs(arch.params - params) / params < 0.005  # the model cards' rounded totals
    assert arch.group == group and arch.head_dim == 128
    assert model_architecture(name, "/nonexistent/folder", "bfloat16") == arch


def test_generation_cost_terms():
    arch = Architecture(layers=2, heads=4, kv_heads=2, head_dim=8, hidden=32, intermediate=64, vocab=100)
    t, a = 100, 10
    one = generation_cost(arch, t, 0.5, a, 1, sketch_fraction=0.0)
    four = generation_cost(arch, t, 0.5, a, 4, sketch_fraction=0.0)
    assert one.prefill_flops == 2 * arch.params * t + 2 * 2 * 4 * 8 * t * t
    assert four.prefill_flops == one.prefill_flops / 4  # one prefill per example, shared by its forked runs
    cache = 2 * 2 * (0.5 * t + a / 2) * (2 * 8 * 2 + 4)  # layers · kv heads · tokens · (K + V + log π)
    assert one.decode_bytes == pytest.approx(a * (arch.params * 2 + cache))
    assert four.decode_bytes == pytest.approx(a * (arch.params * 2 / 4 + cache))  # weights read once per step
    full = generation_cost(arch, t, 0.5, a, 1, compressed=False, sketch_fraction=0.0)
    assert full.decode_bytes == pytest.approx(a * (arch.params * 2 + 2 * 2 * (t + a / 2) * 32))
    sketched = generation_cost(arch, t, 0.5, a, 1, sketch_fraction=0.01)
    assert sketched.decode_bytes - one.decode_bytes == pytest.approx(a * 0.01 * t * arch.kv_bytes_per_token())
    gpu = GPUS["h100-sxm"]
    assert one.seconds(gpu, 0.5) == pytest.approx(one.prefill_flops / (989e12 / 2) + one.decode_bytes / (3.35e12 / 2))


def test_shard_forks_all_but_chunked_streaming_runs():
    arch = ARCHITECTURES["llama-3.1-8b-instruct"]
    gpu = GPUS["h200"]
    runs = (Run("full", "full", 1.0), Run("aware", "m", 0.25), Run("streaming", "m", 0.25, chunk_tokens=512))
    shard = Shard("main", "llama-3.1-8b-instruct", "t", 6144, 0, 0, 3, runs)
    expect = 3 * (generation_cost(arch, 6144, 1.0, 32, 2, compressed=False).seconds(gpu)
                  + generation_cost(arch, 6144, 0.25, 32, 2).seconds(gpu)
                  + generation_cost(arch, 6144, 0.25, 32, 1).seconds(gpu))
    assert shard_roofline_seconds(shard, arch, 32, gpu) == pytest.approx(expect)


def test_device_names_map_to_the_table():
    assert gpu_of_device("NVIDIA H200") is GPUS["h200"]
    assert gpu_of_device("NVIDIA H100 80GB HBM3") is GPUS["h100-sxm"]
    assert gpu_of_device("NVIDIA A100-SXM4-80GB") is GPUS["a100-80gb"]
    assert gpu_of_device("NVIDIA H100 PCIe") is None and gpu_of_device("NVIDIA L4") is None
