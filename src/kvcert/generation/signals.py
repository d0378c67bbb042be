"""Per-generation signals: the certificate per decode step, confidence, kept fractions, and
the comparison signals (docs/signals.md: next-token entropy and top-2 margin, attention entropy
over the retained tokens, evicted-score mass).

The certificate of one step is the radius ε_δ = sqrt(2 V̂ L) + (2/3) b̂ L of every
(layer, query head) at the query that predicts the next token, aggregated over layers
and heads with each configured aggregation ("max", "mean", "rms"); the anytime variant
uses δ_t = δ / (t (t+1)) for the t-th certified step. The relative variant divides each
radius by the norm of that head's attention output, ε_δ / ‖ô‖ (scale-free, so one
threshold can serve different models). The first certified step also keeps its
per-layer values (aggregated over heads).

The robust certificate (:func:`kvcert.method.certificate.robust_radius`, from the layers'
eviction sketches) is traced the same way, step by step with the same aggregations, and
written as the record's second certificate field (:meth:`CertificateTrace.robust_record`).
"""

from __future__ import annotations

import math

import torch

from ..method.recorder import StepCertificates
from ..method.certificate import aggregate, anytime_radius, bernstein_radius, robust_radius
from .record import certificate_field, evicted_mass_field


class _Block:
    """One certificate's trace: per aggregation, the step radii, anytime radii and relative radii."""

    def __init__(self, aggregations: tuple[str, ...], num_layers: int):
        self.aggregations = aggregations
        self.num_layers = num_layers
        self.steps: dict[str, list[float]] = {a: [] for a in aggregations}
        self.anytime: dict[str, list[float]] = {a: [] for a in aggregations}
        self.relative: dict[str, list[float]] = {a: [] for a in aggregations}
        self.first_step_layers: dict[str, list[float]] | None = None

    def add(self, radius: torch.Tensor, any_radius: torch.Tensor, norm: torch.Tensor | None, layers: list[int]) -> None:
        relative = radius / norm.clamp(min=1e-12) if norm is not None else torch.full_like(radius, float("nan"))
        for a in self.aggregations:
            self.steps[a].append(float(aggregate(radius, a, (0, 1))))
            self.anytime[a].append(float(aggregate(any_radius, a, (0, 1))))
            self.relative[a].append(float(aggregate(relative, a, (0, 1))))
        if self.first_step_layers is None:
            per_layer = {a: [0.0] * self.num_layers for a in self.aggregations}
            for row, layer_idx in enumerate(layers):
                for a in self.aggregations:
                    per_layer[a][layer_idx] = float(aggregate(radius[row], a, (0,)))
            self.first_step_layers = per_layer

    @staticmethod
    def add_many(blocks: list["_Block"], radius: torch.Tensor, any_radius: torch.Tensor, norm: torch.Tensor | None,
                 layers: list[int]) -> None:
        """:meth:`add` for several blocks at once: radius, any_radius, norm [rows, layers, Hq], a row per block."""
        relative = radius / norm.clamp(min=1e-12) if norm is not None else torch.full_like(radius, float("nan"))
        for a in blocks[0].aggregations:
            for series, values in ((lambda b: b.steps, radius), (lambda b: b.anytime, any_radius),
                                   (lambda b: b.relative, relative)):
                for block, value in zip(blocks, aggregate(values, a, (1, 2)).tolist()):
                    series(block)[a].append(value)
        for row, block in enumerate(blocks):
            if block.first_step_layers is None:
                per_layer = {a: [0.0] * block.num_layers for a in block.aggregations}
                for a in block.aggregations:
                    for layer_idx, value in zip(layers, aggregate(radius[row], a, (1,)).tolist()):
                        per_layer[a][layer_idx] = value
                block.first_step_layers = per_layer

    def record(self, delta: float, variance_mean: list[float]) -> dict:
        return certificate_field(delta, self.steps, self.anytime, self.relative, variance_mean, self.first_step_layers)


class CertificateTrace:
    """Accumulates the certificates of one generation, step by step (plug-in and robust)."""

    def __init__(self, delta: float, aggregations: tuple[str, ...], num_layers: int, roundoff: float = 0.0):
        self.delta = delta
        self.aggregations = aggregations
        self.num_layers = num_layers
        self.roundoff = roundoff  # u of the cache dtype: the robust radius's floor u·‖ô‖
        self.plugin = _Block(aggregations, num_layers)
        self.robust = _Block(aggregations, num_layers)
        self.variance_mean: list[float] = []

    @property
    def steps(self) -> dict[str, list[float]]:
        return self.plugin.steps

    def add(self, step: StepCertificates, row: int = 0, layers=None) -> None:
        """Fold in one forward's certificates (the last query of the forward) of batch ``row``.

        ``layers``: the layers that certify this row (those where it has a sampled tail; a
        batch of forks records every layer where *some* row has one); default: all recorded.
        """
        layers = sorted(step.variance) if layers is None else [i for i in sorted(step.variance) if i in layers]
        if not layers:
            return
        t = len(self.variance_mean) + 1
        stack = lambda d: torch.stack([d[i][row, :, -1] for i in layers]).double()  # noqa: E731 - [layers, Hq]
        var, rng = stack(step.variance), stack(step.range_term)
        norm = stack(step.output_norm) if step.output_norm else None
        shadow = all(i in step.shadow_sum for i in layers)
        sv = stack(step.shadow_sum) if shadow else torch.zeros_like(var)
        self.plugin.add(bernstein_radius(var, rng, self.delta), anytime_radius(var, rng, self.delta, t), norm, layers)
        floor = None if norm is None else self.roundoff * norm
        self.robust.add(robust_radius(var, rng, sv, self.delta, floor=floor),
                        robust_radius(var, rng, sv, self.delta, t, floor=floor), norm, layers)
        self.variance_mean.append(float(var.mean()))

    def to_record(self) -> dict | None:
        """The plug-in certificate's field of the generation record (None: no certified step)."""
        return self.plugin.record(self.delta, self.variance_mean) if self.variance_mean else None

    def robust_record(self) -> dict | None:
        """The robust certificate's field (same layout; ``variance_mean_steps`` is the plug-in's V̂, which
        ε_R shares: the shadow adds Σ t_j to the radius, not to the variance)."""
        return self.robust.record(self.delta, self.variance_mean) if self.variance_mean else None


def add_rows(traces: list[CertificateTrace], step: StepCertificates, rows: list[int], layers: list) -> None:
    """Fold one batched forward's certificates into one trace per batch row, as
    ``trace.add(step, row, row_layers)`` does for each, with one tensor pass per group of
    rows that share the trace step, δ, aggregations and certifying layers."""
    groups: dict[tuple, list] = {}
    for trace, row, allowed in zip(traces, rows, layers):
        mine = tuple(i for i in sorted(step.variance) if i in allowed)
        if mine:
            key = (len(trace.variance_mean), trace.delta, trace.aggregations, trace.roundoff, mine)
            groups.setdefault(key, []).append((trace, row))
    for (done, delta, _, roundoff, mine), members in groups.items():
        if len(members) == 1:
            members[0][0].add(step, members[0][1], mine)
            continue
        idx = torch.tensor([row for _, row in members])
        stack = lambda d: torch.stack([d[i][idx, :, -1] for i in mine], 1).double()  # noqa: E731 - [rows, layers, Hq]
        var, rng = stack(step.variance), stack(step.range_term)
        norm = stack(step.output_norm) if step.output_norm else None
        shadow = all(i in step.shadow_sum for i in mine)
        sv = stack(step.shadow_sum) if shadow else torch.zeros_like(var)
        t, layers_ = done + 1, list(mine)
        traces_ = [trace for trace, _ in members]
        _Block.add_many([tr.plugin for tr in traces_], bernstein_radius(var, rng, delta),
                        anytime_radius(var, rng, delta, t), norm, layers_)
        floor = None if norm is None else roundoff * norm
        _Block.add_many([tr.robust for tr in traces_], robust_radius(var, rng, sv, delta, floor=floor),
                        robust_radius(var, rng, sv, delta, t, floor=floor), norm, layers_)
        for tr, vm in zip(traces_, var.mean(dim=(1, 2)).tolist()):
            tr.variance_mean.append(vm)


class StepSignals:
    """The per-step comparison signals of one generation, one value per decode step:
    next-token entropy and top-2 margin, and (for a compressed cache) the attention entropy.

    Steps are kept as tensors and read out once, when the record is written: a per-step
    conversion to Python floats would cost more than computing the signals."""

    def __init__(self, attention: bool):
        self._next: list[torch.Tensor] = []
        self._attention: list[torch.Tensor] | None = [] if attention else None

    def add_next_token(self, values: torch.Tensor, row: int | None = None) -> None:
        """``values`` from :func:`next_token_signals` ([2], or [B, 2] with the batch ``row``)."""
        self._next.append(values if row is None else values[row])

    def add_attention(self, values: torch.Tensor | None, row: int = 0) -> None:
        """``values`` from :func:`attention_entropy` ([B]; None: no compressed layer in that forward)."""
        if values is not None and self._attention is not None:
            self._attention.append(values[row])

    def _next_table(self) -> list[list[float]]:
        return torch.stack(self._next).double().tolist() if self._next else []

    @property
    def output_entropy(self) -> list[float]:
        return [h for h, _ in self._next_table()]

    @property
    def top2_margin(self) -> list[float]:
        return [m for _, m in self._next_table()]

    @property
    def attention_entropy(self) -> list[float] | None:
        if self._attention is None:
            return None
        return torch.stack(self._attention).double().tolist() if self._attention else []


def next_token_signals(logprobs: torch.Tensor) -> torch.Tensor:
    """Per row of next-token log-probabilities [..., V]: [..., 2] holding the distribution's entropy
    H = −Σ_v p_v log p_v (nats) and its top-2 margin p_(1) − p_(2) (the output-side comparison signals)."""
    lp = logprobs.float()
    p = lp.exp()
    entropy = -(p * lp).nansum(-1)  # 0 · log 0 (a −inf log-probability) counts 0
    top = p.topk(min(2, p.shape[-1]), dim=-1).values
    margin = top[..., 0] - top[..., 1] if top.shape[-1] > 1 else top[..., 0]
    return torch.stack((entropy, margin), -1)


def attention_entropy(step: StepCertificates) -> torch.Tensor | None:
    """The mean over compressed layers and query heads of the attention entropy at the forward's
    last query (the one predicting the next token), per batch row [B]; None without any."""
    if not step.entropy:
        return None
    return torch.stack([step.entropy[i][:, :, -1] for i in sorted(step.entropy)]).mean(dim=(0, 2))


def evicted_mass(layers, aggregations: tuple[str, ...], row: int = 0) -> dict | None:
    """The record's ``evicted_mass`` field from the layers' :class:`~kvcert.method.cache.ScoreMass` of batch
    ``row``: per (layer, KV head) the evicted share of the scorer's importance mass (0 where the
    mass is 0), aggregated over layers × KV heads with each aggregation; realised, and expected
    (Σ(1 − π) s / Σ s) for the randomized samplers. None when nothing was compressed (the full cache)."""
    masses = [layer.score_mass for layer in layers if getattr(layer, "score_mass", None) is not None]
    if not masses:
        return None
    total = torch.stack([m.total[row] for m in masses])  # [layers, Hkv]
    share = lambda x: torch.where(total > 0, x / total.clamp(min=1e-300), 0.0)  # noqa: E731
    realised = share(torch.stack([m.evicted[row] for m in masses]))
    fold = lambda x: {a: float(aggregate(x, a, (0, 1))) for a in aggregations}  # noqa: E731
    expected = None
    if all(m.expected is not None for m in masses):
        expected = fold(share(torch.stack([m.expected[row] for m in masses])))
    return evicted_mass_field(fold(realised), expected)


def confidence(logprobs: list[float]) -> dict[str, float | None]:
    """Mean and min token log-probability of the answer (None for an empty answer)."""
    if not logprobs:
        return {"mean_logprob": None, "min_logprob": None}
    finite = [lp if math.isfinite(lp) else -1e9 for lp in logprobs]
    return {"mean_logprob": sum(finite) / len(finite), "min_logprob": min(finite)}
