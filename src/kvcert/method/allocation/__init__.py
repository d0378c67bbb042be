"""Budget allocation policies over any scorer: uniform, PyramidKV (per layer), Ada-KV
(per head). Each maps (scores [B, Hkv, N], budget, layer index, number of layers, design)
to per-head token counts [B, Hkv]."""

from __future__ import annotations

from typing import Callable

from ...config.names import ALLOCATIONS as NAMES, check_implemented
from .adakv import allocate_adakv
from .pyramid import allocate_pyramid
from .uniform import allocate_uniform

ALLOCATIONS: dict[str, Callable] = {
    "uniform": allocate_uniform,
    "pyramid": allocate_pyramid,
    "adakv": allocate_adakv,
}
check_implemented("allocation policies", NAMES, ALLOCATIONS)


def get_allocation(name: str) -> Callable:
    if name not in ALLOCATIONS:
        raise ValueError(f"allocation: unknown policy {name!r}; choose one of {sorted(ALLOCATIONS)}")
    return ALLOCATIONS[name]


__all__ = ["ALLOCATIONS", "get_allocation", "allocate_adakv", "allocate_pyramid", "allocate_uniform"]
