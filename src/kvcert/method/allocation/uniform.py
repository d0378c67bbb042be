"""Uniform allocation: every (layer, KV head) keeps the same budget."""

from __future__ import annotations

import torch

from ...checks import resolve_budget
from ..design import RetentionDesign


def allocate_uniform(
    scores: torch.Tensor, budget: float | int, layer_idx: int, num_layers: int, design: RetentionDesign
) -> torch.Tensor:
    """[B, Hkv] token counts, all equal to the budget resolved against N = scores.shape[-1]."""
    k = resolve_budget(budget, scores.shape[-1])
    return torch.full(scores.shape[:-1], k, dtype=torch.long, device=scores.device)
