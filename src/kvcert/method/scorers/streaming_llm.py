"""StreamingLLM (Xiao et al., "Efficient Streaming Language Models with Attention
Sinks", 2023): keep the attention sinks and the most recent tokens. As a score this is
recency, (i + 1) / L, so top-k keeps sinks + the latest tokens and the randomized design
favours recent tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import LayerObservation, Scorer


@dataclass
class StreamingLLMScorer(Scorer):
    name = "streaming_llm"

    def score(self, obs: LayerObservation) -> torch.Tensor:
        b, hkv, length = obs.key.shape[:3]
        recency = torch.arange(1, length + 1, dtype=torch.float32, device=obs.key.device) / length
        return recency.expand(b, hkv, length).contiguous()
