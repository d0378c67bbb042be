"""The embedded model's architecture: a small Llama with grouped-query attention.

Plain ``transformers`` classes (``LlamaConfig`` / ``LlamaForCausalLM``), no custom model
code. The rotary base is large (1e6, as in Qwen2.5) so that most rotary frequencies
barely turn over a few thousand tokens and content matching survives long contexts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM


@dataclass(frozen=True)
class ArchitectureSpec:
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    head_dim: int | None = None  # None: hidden_size // num_heads
    rope_theta: float = 1e6
    max_position_embeddings: int = 4096

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_config(spec: ArchitectureSpec, tokenizer: Any) -> LlamaConfig:
    if spec.num_kv_heads >= spec.num_heads or spec.num_heads % spec.num_kv_heads:
        raise ValueError("the embedded model uses grouped-query attention: num_kv_heads must "
                         "divide num_heads and be smaller")
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim or spec.hidden_size // spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
    )


def build_model(spec: ArchitectureSpec, tokenizer: Any, seed: int) -> LlamaForCausalLM:
    """A freshly initialised model (the initialisation depends only on ``seed``)."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(model_config(spec, tokenizer))
    model.generation_config = generation_config(tokenizer)
    return model


def generation_config(tokenizer: Any, max_new_tokens: int = 16) -> GenerationConfig:
    """Greedy decoding that stops at ``<|end|>``."""
    return GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
