"""Shared fixtures: small random-init models of the three architectures (no downloads)."""

from __future__ import annotations

import os

if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest-xdist (tests/tiers.sh): the CPUs shared out among the workers,
    # for torch and for numpy's BLAS alike (read when each loads, so before either is imported; the commands a test
    # starts inherit it, and Snakemake sets a job's own): two BLAS threads on a core another worker keeps busy make a
    # small matrix product several times slower than one
    _THREADS = str(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, _THREADS)

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,  # noqa: E402
                          Qwen2ForCausalLM)

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(int(_THREADS))

ARCHITECTURES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
}


def tiny_model(arch: str, seed: int = 0, layers: int = 2, dtype=torch.float32):
    """A random-init model with grouped-query attention (4 query heads, 2 KV heads)."""
    config_cls, model_cls = ARCHITECTURES[arch]
    kwargs = dict(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
    )
    if arch == "mistral":
        kwargs["sliding_window"] = None
    if arch == "qwen2":
        kwargs["use_sliding_window"] = False
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).to(dtype).eval()
    return model


def config_for(tokenizer, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
               positions: int = 4096) -> LlamaConfig:
    """A small Llama config (grouped-query attention) sized to ``tokenizer``: its vocabulary and special tokens."""
    return LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       max_position_embeddings=positions, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)


def model_for(tokenizer, seed: int = 0, **config) -> LlamaForCausalLM:
    """A random-init Llama sized to ``tokenizer`` (:func:`config_for`), in eval mode."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(config_for(tokenizer, **config)).eval()


@pytest.fixture(params=sorted(ARCHITECTURES))
def arch(request):
    return request.param


@pytest.fixture(scope="session")
def word_model_dir(tmp_path_factory):
    """A random-init Llama (GQA) saved with the embedded model's word-level tokenizer: a real model directory."""
    from kvcert.training.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    path = tmp_path_factory.mktemp("model")
    model_for(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def _grad_mode_is_each_tests_own():
    """A test that switches autograd off process-wide (a command's ``torch.set_grad_enabled(False)``) must not
    decide the tests after it: the mode is checked and put back after each test."""
    before = torch.is_grad_enabled()
    yield
    leaked = torch.is_grad_enabled() != before
    torch.set_grad_enabled(before)
    assert not leaked, "this test left autograd switched " + ("off" if before else "on") + " for the tests after it"
