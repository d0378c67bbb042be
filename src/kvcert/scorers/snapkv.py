"""SnapKV importance (Li et al., "SnapKV: LLM Knows What You are Looking for Before
Generation", 2024): attention of an observation window of the last queries, averaged
over the window and the query heads of each KV head, smoothed by 1-D average pooling."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import LayerObservation, Scorer, window_probs


@dataclass
class SnapKVScorer(Scorer):
    name = "snapkv"
    window: int = 32
    kernel_size: int = 5

    def score(self, obs: LayerObservation) -> torch.Tensor:
        probs = window_probs(obs, self.window)  # [B, Hkv, G, w, L]
        scores = probs.mean(dim=(2, 3))
        if self.kernel_size > 1:
            b, h, length = scores.shape
            pooled = F.avg_pool1d(
                scores.reshape(b * h, 1, length), self.kernel_size, stride=1, padding=self.kernel_size // 2,
                count_include_pad=False,
            )
            scores = pooled.reshape(b, h, length)
        return scores
