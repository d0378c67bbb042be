"""TOVA importance (Oren et al., "Transformers are Multi-State RNNs", 2024): the
attention of the last query, averaged over all heads of the layer (one score shared by
every KV head, as in the paper)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import LayerObservation, Scorer, window_probs


@dataclass
class TOVAScorer(Scorer):
    name = "tova"

    def score(self, obs: LayerObservation) -> torch.Tensor:
        probs = window_probs(obs, 1)[:, :, :, 0]  # [B, Hkv, G, L]
        shared = probs.mean(dim=(1, 2), keepdim=False)  # [B, L]
        return shared.unsqueeze(1).expand(-1, obs.key.shape[1], -1).contiguous()
