"""Benchmarks (not tests): speed and memory ratios measured side by side in one process."""

from __future__ import annotations


def check_counts(args, **minimums: int) -> None:
    """Refuse, in one line naming the option, a count below its minimum (``--steps 0`` would measure
    nothing, or divide by zero); a list option is checked element by element; None is left alone."""
    for name, minimum in minimums.items():
        value = getattr(args, name)
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is not None and item < minimum:
                option = "--" + name.replace("_", "-")
                raise ValueError(f"{option} {item}: must be at least {minimum} (nothing would be measured); "
                                 f"give {option} {max(minimum, 1)} or more")
