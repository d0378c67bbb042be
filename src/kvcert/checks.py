"""Argument checks shared by the public tensor-level API.

Every check raises ``ValueError`` whose message starts with the argument's name, so
that a wrong call is explained in one line.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import torch

from .budget import ROUNDINGS


class NonFiniteError(ValueError):
    """A tensor holds NaN or ±inf where finite numbers belong (a model's broken weights surface so)."""


def check_finite(name: str, tensor: torch.Tensor) -> None:
    """Reject NaN (and infinite) entries."""
    if bool(torch.isfinite(tensor).all()):
        return
    if torch.isnan(tensor).any():
        raise NonFiniteError(f"{name}: contains NaN")
    if torch.isinf(tensor).any():
        raise NonFiniteError(f"{name}: contains an infinite value (±inf)")


def check_nonnegative(name: str, tensor: torch.Tensor) -> None:
    """Reject NaN, infinite and negative entries (one pass over the data)."""
    if tensor.numel() == 0:
        return
    low, high = torch.aminmax(tensor)
    low, high = float(low), float(high)
    if low != low or high != high:
        raise NonFiniteError(f"{name}: contains NaN")
    if high == float("inf") or low == float("-inf"):
        raise NonFiniteError(f"{name}: contains an infinite value (±inf)")
    if low < 0:
        raise ValueError(f"{name}: must be >= 0 (min is {low:.4g})")


def check_delta(delta: float) -> float:
    """A confidence level δ must lie strictly inside (0, 1)."""
    if isinstance(delta, bool) or not isinstance(delta, Real) or not (0.0 < float(delta) < 1.0):
        raise ValueError(f"delta: must lie in (0, 1), got {delta!r}")
    return float(delta)


def check_ndim(name: str, tensor: torch.Tensor, ndim: int, layout: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name}: expected a tensor {layout}, got {type(tensor).__name__}")
    if tensor.ndim != ndim:
        raise ValueError(f"{name}: expected shape {layout}, got {tuple(tensor.shape)}")


def resolve_budget(budget: float | int | torch.Tensor, num_tokens: int, rounding: str = "round") -> torch.Tensor | int:
    """Turn a budget into a number of kept tokens.

    A float in (0, 1] is a fraction of ``num_tokens`` (rounded to the nearest integer, or
    down with ``rounding="floor"``; at least 1); an int is a
    token count in [1, num_tokens]; a tensor holds one integer count per row (per head,
    as produced by the allocation policies) and must satisfy the same bounds.
    """
    if isinstance(budget, torch.Tensor):
        if budget.is_floating_point():
            raise ValueError("budget: a tensor budget holds integer token counts per row")
        if (budget < 1).any() or (budget > num_tokens).any():
            raise ValueError(
                f"budget: per-row token counts must lie in [1, {num_tokens}], got "
                f"[{int(budget.min())}, {int(budget.max())}]"
            )
        return budget.to(torch.long)
    if isinstance(budget, bool):
        raise ValueError(f"budget: must be a fraction in (0, 1] or a token count, got {budget!r}")
    if isinstance(budget, Integral):
        if not (1 <= int(budget) <= num_tokens):
            raise ValueError(f"budget: a token count must lie in [1, {num_tokens}] (the token count), got {budget}")
        return int(budget)
    if isinstance(budget, Real):
        value = float(budget)
        if math.isnan(value) or not (0.0 < value <= 1.0):
            raise ValueError(f"budget: a fraction must lie in (0, 1], got {budget!r}")
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding: must be one of {ROUNDINGS}, got {rounding!r}")
        tokens = int(value * num_tokens) if rounding == "floor" else int(round(value * num_tokens))
        return max(1, min(num_tokens, tokens))
    raise ValueError(f"budget: must be a fraction in (0, 1] or a token count, got {type(budget).__name__}")

