"""Key-norm importance (Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for
KV Cache Compression", 2024): keys with a small L2 norm attract attention, so the
importance is 1 / ‖k_i‖ (no queries needed)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import LayerObservation, Scorer


@dataclass
class KeyNormScorer(Scorer):
    name = "knorm"
    eps: float = 1e-6

    def score(self, obs: LayerObservation) -> torch.Tensor:
        norms = torch.linalg.vector_norm(obs.key.to(torch.float32), dim=-1)
        return 1.0 / (norms + self.eps)
