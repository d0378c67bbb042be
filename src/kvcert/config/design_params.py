"""The retention design's parameters, without torch: the certainty set (sinks, window, top
slice) and the tail's distribution (floor η, temper α), and the dense first layers.
:mod:`kvcert.method.design` draws samples with them; a method config's ``design:`` section is
validated here when its spec is built (:class:`kvcert.generation.spec.MethodSpec`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RetentionDesign:
    """Parameters of the certainty set and of the tail distribution.

    sinks: number of leading tokens always kept (attention sinks).
    window: number of most recent tokens always kept.
    top_fraction: share of the free budget (budget − sinks − window) given to the
        deterministic top-score slice; the rest is the expected size of the sampled tail.
    floor: η, the weight of the uniform distribution mixed into the tail importance
        (η > 0 gives every tail token a positive inclusion probability, which the
        Hájek estimator and its certificate need): π_i ≥ η·c/|T| on the tail T, c ≥ k_T
        the solved scale (see the module docstring), not η·budget/N.
    temper: α, the tail importance's exponent: q_i ∝ (1 − η)·imp_i^α / Σ_T imp^α + η / |T|
        (α = 1: π ∝ importance, the paper's design; α < 1 flattens π toward the floor,
        α > 1 concentrates it on the highest scores). The certainty set's top slice is the
        same for every α (a power keeps the order).
    dense_layers: the first ``dense_layers`` layers keep every token and the others a budget
        lowered so that the mean over layers stays the budget (:func:`layer_budget`): a
        per-layer allocation for models whose first layer attends locally (0: uniform).
    """

    sinks: int = 4
    window: int = 32
    top_fraction: float = 0.25
    floor: float = 0.1
    temper: float = 1.0
    dense_layers: int = 0

    def __post_init__(self) -> None:
        if self.dense_layers < 0:
            raise ValueError(f"dense_layers: must be >= 0, got {self.dense_layers}")
        if not (0.0 < self.temper <= 8.0):
            raise ValueError(f"temper: must lie in (0, 8], got {self.temper}")
        if self.sinks < 0:
            raise ValueError(f"sinks: must be >= 0, got {self.sinks}")
        if self.window < 0:
            raise ValueError(f"window: must be >= 0, got {self.window}")
        if not (0.0 <= self.top_fraction <= 1.0):
            raise ValueError(f"top_fraction: must lie in [0, 1], got {self.top_fraction}")
        if not (0.0 <= self.floor <= 1.0):
            raise ValueError(f"floor: must lie in [0, 1], got {self.floor}")
