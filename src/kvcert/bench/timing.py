"""Side-by-side timing: interleave the contenders, repeat, report medians and ratios."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def interleaved_medians(contenders: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 1) -> dict[str, float]:
    """Median wall time (seconds) of each callable, run in turns so drift hits all alike."""
    for _ in range(warmup):
        for fn in contenders.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}
