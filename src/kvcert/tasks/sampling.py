"""Deterministic randomness for the task generators.

Each example draws from its own ``random.Random`` seeded by (seed, task, index), so an
example does not depend on how many examples were generated before it, and records
are stable given the seed. Grid options (needle depth, turn distance) are covered in
balanced, shuffled blocks; the items placed in a context take their depths from
:func:`placement_depths`, and a task's ``generate`` is its examples 0 … n − 1 (:func:`generator`).
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence, TypeVar

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


def placement_depths(rng: random.Random, count: int, depth: float | None, depths: Sequence[float], seed: int,
                     task: str, index: int) -> list[float]:
    """The depths (percent) of example ``index``'s ``count`` placed items: the queried one's first, ``depth`` if
    given, else the balanced pick of ``depths`` (:func:`balanced_pick`); the others uniform on [0, 100], from ``rng``."""
    query = float(depth) if depth is not None else float(balanced_pick(depths, seed, task, index))
    return [query] + [rng.uniform(0.0, 100.0) for _ in range(count - 1)]


def generator(make_record: Callable[..., T]) -> Callable[..., list[T]]:
    """A task's ``generate(tokenizer, n_examples, target_tokens, seed, **options)``: examples 0 … n_examples − 1 of
    ``make_record(tokenizer, target_tokens, seed, index, **options)``."""

    def generate(tokenizer: Any, n_examples: int, target_tokens: int, seed: int, **options: Any) -> list[T]:
        return [make_record(tokenizer, target_tokens, seed, i, **options) for i in range(n_examples)]

    return generate
