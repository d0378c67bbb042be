"""H2O importance (Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative
Inference of Large Language Models", 2023): attention accumulated over every query of
the prefill (column sums of the causal attention matrix), averaged over the query heads
of each KV head. Computed in query blocks so memory stays O(block · L)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import LayerObservation, Scorer, attention_probs


@dataclass
class H2OScorer(Scorer):
    name = "h2o"
    query_block: int = 32

    def score(self, obs: LayerObservation) -> torch.Tensor:
        n_q = obs.query.shape[2]
        total = torch.zeros(obs.key.shape[:3], dtype=torch.float32, device=obs.key.device)
        for start in range(0, n_q, self.query_block):
            probs = attention_probs(obs, start, min(n_q, start + self.query_block))
            total += probs.sum(dim=3).mean(dim=2)
        return total
