"""Side-by-side timing: interleave the contenders, repeat, report medians and ratios; a cache's decode steps,
dropped again after they are timed (what every decode benchmark times)."""

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


def decode_steps(model, cache, steps: int, token: int = 7, signals: bool | None = None):
    """Decode ``steps`` tokens, then drop them again so every repeat sees the same cache.

    ``signals`` (True / False): decode as the engine does — the next token's log-probabilities
    and argmax every step — with (True) or without (False) the comparison signals:
    the attention entropy recorded by the cache, the next-token entropy and top-2 margin, folded
    as the engine folds them. The same cache serves both (only its ``record_entropy`` switch
    changes), so the two differ by the signals' work alone. None: the forward only."""
    import torch

    from ..generation.signals import StepSignals, attention_entropy, next_token_signals

    x = torch.tensor([[token]])
    mark = cache.snapshot()
    folded = StepSignals(attention=True)
    if signals is not None:
        cache.recorder.entropy = bool(signals)
    for _ in range(steps):
        logits = model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
        if signals is not None:
            lp = torch.log_softmax(logits.float(), dim=-1)
            int(lp.argmax())
            steps_done = cache.pop_steps()
            if signals:
                folded.add_next_token(next_token_signals(lp))
                for step in steps_done:
                    folded.add_attention(attention_entropy(step))
    cache.restore(mark)
