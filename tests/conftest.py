"""Shared fixtures: small random-init models of the three architectures (no downloads)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

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


@pytest.fixture(params=sorted(ARCHITECTURES))
def arch(request):
    return request.param


@pytest.fixture(scope="session")
def word_model_dir(tmp_path_factory):
    """A random-init Llama (GQA) saved with the embedded model's word-level tokenizer: a real model directory."""
    from kvcert.training.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    path = tmp_path_factory.mktemp("model")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
