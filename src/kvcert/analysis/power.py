"""What a paired comparison of a gate with random gating can detect: the power statement of the multi-turn cell.

The comparison (:func:`kvcert.analysis.multiturn_recall.gate_versus_random`): per conversation i, the paired
difference d_i = gated recall − random gating's recall at the same rate, and the gate *beats random* when the
lower end of the two-sided bootstrap interval of mean(d) at the plan's ``bootstrap.level`` lies above 0. An
interval at level L (0.90) whose lower end must clear 0 is a one-sided test at

    α = (1 − L) / 2            (L = 0.90: two-sided 0.10, one-sided 0.05).

In the normal approximation (mean(d) ~ N(Δ, σ² / n), σ the per-conversation sd of d) that test rejects with
probability Φ(Δ √n / σ − z_{1−α}), so the smallest true difference it detects with probability ``power`` is

    Δ* = (z_{1−α} + z_{power}) · σ / √n.

σ is the sd of the difference's influence per conversation, e_i = (f_i − r)(b_i − b̄) (f_i ∈ {0, 1} the gate's
firing, r its rate, b_i = full_i − correct_i ∈ {−1, 0, 1}, b̄ its mean: the standard error of the difference with r
and b̄ measured, as the bootstrap measures them; :func:`kvcert.analysis.multiturn_recall.gate_versus_random` reports
it). It must come from data the comparison does not decide on (training-range seeds), else the bound σ ≤ 1 for a
difference of two binary recalls: |f_i − r| ≤ 1 and E(b − b̄)² = Var(b) ≤ 1 (b ∈ [−1, 1]), so E e² ≤ 1.
Statistics only: no torch, no scipy.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Sequence

_NORMAL = NormalDist()

#: the conservative per-conversation sd of a difference of two binary recalls (|d_i| ≤ 1)
SD_BOUND = 1.0


def one_sided_alpha(level: float) -> float:
    """α of the one-sided test "the lower end of the two-sided ``level`` interval is above 0": (1 − level) / 2."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: a two-sided interval level in (0, 1) (the plan's bootstrap.level), got {level}")
    return (1.0 - level) / 2.0


def _checked(n: int, power: float, sd: float) -> None:
    if n < 1:
        raise ValueError(f"n: the number of conversations must be >= 1, got {n}")
    if not 0.0 < power < 1.0:
        raise ValueError(f"power: must lie in (0, 1), got {power}")
    if not sd > 0 or not math.isfinite(sd):
        raise ValueError(f"sd: the per-conversation sd of the paired difference must be > 0 and finite, got {sd}")


def detectable_difference(n: int, level: float, power: float, sd: float) -> float:
    """Δ* = (z_{1−α} + z_{power}) · sd / √n, α = (1 − level) / 2: the gate-minus-random difference a paired test on
    ``n`` conversations detects with probability ``power`` (``level``: the interval's two-sided level, 0.90)."""
    _checked(n, power, sd)
    z = _NORMAL.inv_cdf(1.0 - one_sided_alpha(level)) + _NORMAL.inv_cdf(power)
    return z * sd / math.sqrt(n)


def power_at(n: int, level: float, difference: float, sd: float) -> float:
    """Φ(Δ √n / sd − z_{1−α}): the probability that the paired test on ``n`` conversations finds a true difference
    ``difference`` (the inverse of :func:`detectable_difference` in ``power``)."""
    _checked(n, 0.5, sd)
    return _NORMAL.cdf(difference * math.sqrt(n) / sd - _NORMAL.inv_cdf(1.0 - one_sided_alpha(level)))


def paired_sd(differences: Sequence[float]) -> float:
    """The sample sd (n − 1 in the denominator) of per-conversation paired differences; at least two needed."""
    d = [float(x) for x in differences]
    if len(d) < 2:
        raise ValueError(f"differences: need at least two conversations for an sd, got {len(d)}")
    mean = sum(d) / len(d)
    return math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
