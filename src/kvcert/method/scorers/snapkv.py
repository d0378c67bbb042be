"""SnapKV importance (Li et al., "SnapKV: LLM Knows What You are Looking for Before
Generation", 2024): attention of an observation window of the last queries, averaged
over the window and the query heads of each KV head, smoothed by 1-D average pooling.

``pooling="max"`` takes, per KV head, the largest of its query heads' window-mean
attention instead of their mean (a token one query head relies on keeps a high score
even where the group's other heads ignore it: per-head importance under grouped-query
attention, where the cache keeps one row per KV head)."""

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
    pooling: str = "mean"

    def __post_init__(self) -> None:
        if self.pooling not in ("mean", "max"):
            raise ValueError(f"snapkv pooling: must be mean or max, got {self.pooling!r}")

    def score(self, obs: LayerObservation) -> torch.Tensor:
        probs = window_probs(obs, self.window)  # [B, Hkv, G, w, L]
        scores = probs.mean(dim=(2, 3)) if self.pooling == "mean" else probs.mean(dim=3).amax(dim=2)
        if self.kernel_size > 1:
            b, h, length = scores.shape
            pooled = F.avg_pool1d(
                scores.reshape(b * h, 1, length), self.kernel_size, stride=1, padding=self.kernel_size // 2,
                count_include_pad=False,
            )
            scores = pooled.reshape(b, h, length)
        return scores
