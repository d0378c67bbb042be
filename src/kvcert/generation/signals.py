"""Per-generation signals: the certificate per decode step, confidence, kept fractions.

The certificate of one step is the radius ε_δ = sqrt(2 V̂ L) + (2/3) b̂ L of every
(layer, query head) at the query that predicts the next token, aggregated over layers
and heads with each configured aggregation ("max", "mean", "rms"); the anytime variant
uses δ_t = δ / (t (t+1)) for the t-th certified step. The relative variant divides each
radius by the norm of that head's attention output, ε_δ / ‖ô‖ (scale-free, so one
threshold can serve different models). The first certified step also keeps its
per-layer values (aggregated over heads).
"""

from __future__ import annotations

import math

import torch

from ..cache import StepCertificates
from ..certificate import aggregate, anytime_radius, bernstein_radius


class CertificateTrace:
    """Accumulates the certificates of one generation, step by step."""

    def __init__(self, delta: float, aggregations: tuple[str, ...], num_layers: int):
        self.delta = delta
        self.aggregations = aggregations
        self.num_layers = num_layers
        self.steps: dict[str, list[float]] = {a: [] for a in aggregations}
        self.anytime: dict[str, list[float]] = {a: [] for a in aggregations}
        self.relative: dict[str, list[float]] = {a: [] for a in aggregations}
        self.variance_mean: list[float] = []
        self.first_step_layers: dict[str, list[float]] | None = None

    def add(self, step: StepCertificates) -> None:
        """Fold in one forward's certificates (the last query of the forward)."""
        if not step.variance:
            return
        t = len(self.variance_mean) + 1
        layers = sorted(step.variance)
        var = torch.stack([step.variance[i][0, :, -1] for i in layers]).double()  # [layers, Hq]
        rng = torch.stack([step.range_term[i][0, :, -1] for i in layers]).double()
        radius = bernstein_radius(var, rng, self.delta)
        any_radius = anytime_radius(var, rng, self.delta, t)
        if step.output_norm:
            norm = torch.stack([step.output_norm[i][0, :, -1] for i in layers]).double()
            relative = radius / norm.clamp(min=1e-12)
        else:
            relative = torch.full_like(radius, float("nan"))
        for a in self.aggregations:
            self.steps[a].append(float(aggregate(radius, a, (0, 1))))
            self.anytime[a].append(float(aggregate(any_radius, a, (0, 1))))
            self.relative[a].append(float(aggregate(relative, a, (0, 1))))
        self.variance_mean.append(float(var.mean()))
        if self.first_step_layers is None:
            per_layer = {a: [0.0] * self.num_layers for a in self.aggregations}
            for row, layer_idx in enumerate(layers):
                for a in self.aggregations:
                    per_layer[a][layer_idx] = float(aggregate(radius[row], a, (0,)))
            self.first_step_layers = per_layer

    def to_record(self) -> dict | None:
        if not self.variance_mean:
            return None
        return {
            "delta": self.delta,
            "steps": self.steps,
            "anytime_steps": self.anytime,
            "relative_steps": self.relative,
            "variance_mean_steps": self.variance_mean,
            "first_step_layers": self.first_step_layers,
        }


def confidence(logprobs: list[float]) -> dict[str, float | None]:
    """Mean and min token log-probability of the answer (None for an empty answer)."""
    if not logprobs:
        return {"mean_logprob": None, "min_logprob": None}
    finite = [lp if math.isfinite(lp) else -1e9 for lp in logprobs]
    return {"mean_logprob": sum(finite) / len(finite), "min_logprob": min(finite)}
