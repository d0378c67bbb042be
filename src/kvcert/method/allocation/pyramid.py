"""PyramidKV allocation (Cai et al., "PyramidKV: Dynamic KV Cache Compression based on
Pyramidal Information Funneling", 2024): lower layers keep more tokens, upper layers
fewer, linearly, with the mean over layers equal to the budget.

With k the uniform budget and β the pyramid steepness, layer ℓ of n keeps
k_ℓ = k_max − (k_max − k_min)·ℓ/(n − 1), where k_min = max(k/β, sinks + window) and
k_max = 2k − k_min (so the mean over layers stays k). Where k_max would exceed the prompt's N, the top is set to N
and the bottom raised to k_min = 2k − N, so the mean still stays k (KVCache-Factory's pyramidkv_utils, which
kvpress's PyramidKVPress follows): at budget 1 every layer keeps the whole prompt. Each k_ℓ is clipped to [floor, N].
"""

from __future__ import annotations

import torch

from ...checks import resolve_budget
from ..design import RetentionDesign


def pyramid_budget(k: int, layer_idx: int, num_layers: int, n: int, design: RetentionDesign, beta: float = 20.0) -> int:
    if num_layers <= 1:
        return k
    floor = min(n, design.sinks + design.window)
    k_min = min(k, max(k / beta, floor))  # never below the certainty set, so the mean stays k
    k_max = 2 * k - k_min
    if k_max > n:  # the top clipped at the prompt, the bottom raised by as much
        k_max, k_min = n, 2 * k - n
    k_layer = k_max - (k_max - k_min) * layer_idx / (num_layers - 1)
    return int(max(floor, min(n, round(k_layer))))


def allocate_pyramid(
    scores: torch.Tensor, budget: float | int, layer_idx: int, num_layers: int, design: RetentionDesign
) -> torch.Tensor:
    n = scores.shape[-1]
    k = pyramid_budget(resolve_budget(budget, n), layer_idx, num_layers, n, design)
    return torch.full(scores.shape[:-1], k, dtype=torch.long, device=scores.device)
