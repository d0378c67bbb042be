"""Deterministic randomness for the task generators.

Each example draws from its own ``random.Random`` seeded by (seed, task, index), so an
example does not depend on how many examples were generated before it, and records
are stable given the seed. Grid options (needle depth, turn distance) are covered in
balanced, shuffled blocks.
"""

from __future__ import annotations

import random
from typing import Sequence, TypeVar

T = TypeVar("T")


def example_rng(seed: int, task: str, index: int, stream: str = "example") -> random.Random:
    """A generator private to one example (string seeds hash stably across runs)."""
    return random.Random(f"kvcert:{task}:{stream}:{seed}:{index}")


def balanced_pick(grid: Sequence[T], seed: int, task: str, index: int) -> T:
    """The grid value of example ``index``: each block of len(grid) examples covers the
    grid once, in a seeded order."""
    if not grid:
        raise ValueError("empty grid")
    block, position = divmod(index, len(grid))
    order = list(grid)
    example_rng(seed, task, block, stream="grid").shuffle(order)
    return order[position]
