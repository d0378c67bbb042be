"""Ada-KV allocation (Feng et al., "Ada-KV: Optimizing KV Cache Eviction by Adaptive
Budget Allocation for Efficient LLM Inference", 2024): the heads of a layer share the
layer's total budget H·k; each head first gets its certainty set plus a safeguard share
α of its uniform free budget, and the rest goes to the heads holding the highest
per-head-normalised scores across the layer.
"""

from __future__ import annotations

import torch

from ...checks import resolve_budget
from ..design import RetentionDesign


def allocate_adakv(
    scores: torch.Tensor,
    budget: float | int,
    layer_idx: int,
    num_layers: int,
    design: RetentionDesign,
    safeguard: float = 0.2,
) -> torch.Tensor:
    """[B, Hkv] per-head token counts summing (per batch row) to Hkv · k."""
    b, h, n = scores.shape
    k = resolve_budget(budget, n)
    fixed = min(n, design.sinks + design.window)
    if k <= fixed or h == 1:
        return torch.full((b, h), k, dtype=torch.long, device=scores.device)
    free = k - fixed
    base = fixed + int(safeguard * free)
    pool = h * (k - base)
    pos = torch.arange(n, device=scores.device)
    fixed_mask = (pos < design.sinks) | (pos >= n - design.window)
    norm = scores / scores.sum(-1, keepdim=True).clamp(min=1e-30)
    # tokens already in each head's safeguard share do not compete again
    ranked = norm.masked_fill(fixed_mask, float("-inf"))
    in_base = torch.zeros_like(ranked, dtype=torch.bool)
    if base > fixed:
        in_base.scatter_(-1, ranked.topk(base - fixed, dim=-1).indices, True)
    ranked = ranked.masked_fill(in_base, float("-inf")).reshape(b, h * n)
    take = ranked.topk(min(pool, h * n), dim=-1).indices // n
    extra = torch.zeros(b, h, dtype=torch.long, device=scores.device)
    extra.scatter_add_(-1, take, torch.ones_like(take))
    return (base + extra).clamp(max=n)
