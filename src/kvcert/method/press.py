"""An eviction method: scorer × allocation × sampler, applied to one cache layer.

In the style of NVIDIA kvpress, a "press" compresses each layer right after that layer's
attention in the forward pass it is armed for (its schedule: :class:`kvcert.method.schedule.PressSchedule`).
Here a press is the composition of three independent choices:

* a scorer (``kvcert.method.scorers``): SnapKV, H2O, TOVA, key norm, value-aware, StreamingLLM;
* an allocation policy (``kvcert.method.allocation``): uniform, PyramidKV per layer, Ada-KV per head;
* a sampler (``kvcert.method.design``): ``"topk"`` (the deterministic baseline, π = 1 for every
  kept token), ``"poisson"`` (the randomized design with a certainty set and a Poisson
  tail, Xie arXiv 2607.21475) or ``"priority"`` (exact-size priority sampling).

Random draws come from :func:`kvcert.method.design.cpu_generator` seeded by (seed, layer, round), so a
run is repeatable whatever the device and whatever order layers are processed in. A
randomized press also hands the layer the selection score of the decided tokens, from
which the layer keeps its eviction sketch (:mod:`kvcert.method.sketch`) for the robust
certificate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from numbers import Real

import torch

from .allocation import get_allocation
from .cache import CompactLayer, ScoreMass
from ..budget import ROUNDINGS, kept_budget
from ..checks import resolve_budget
from .design import (DEFAULT_DESIGN, SAMPLERS, RetentionDesign, cpu_generator, inclusion_probabilities, layer_budget,
                     sample_retention)
from .scorers import Scorer, get_scorer
from .scorers.base import LayerObservation
from .sketch import POTENTIAL_WINDOW, sketch_potential


@dataclass
class EvictionPress:
    """Eviction method applied layer by layer.

    scorer: a scorer name (see ``kvcert.method.scorers.SCORERS``) or instance.
    budget: fraction of the layer's tokens kept, in (0, 1], or a token count (default 0.25).
    compression_ratio: kvpress's convention instead, the fraction removed (budget = 1 − it);
    give one of the two.
    sampler: "topk", "poisson" or "priority".
    allocation: "uniform", "pyramid" or "adakv".
    design: certainty set and tail parameters (sinks, window, top_fraction, floor).
    seed: base seed of the sampler's random draws.
    rounding: how a fractional budget becomes tokens, "round" (default) or "floor"
    (kvpress's ``int(N · (1 − compression_ratio))``).
    """

    scorer: str | Scorer = "snapkv"
    budget: float | int | None = None
    sampler: str = "poisson"
    allocation: str = "uniform"
    design: RetentionDesign = field(default_factory=lambda: DEFAULT_DESIGN)
    seed: int = 0
    compression_ratio: float | None = None
    rounding: str = "round"

    def __post_init__(self) -> None:
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding: must be one of {ROUNDINGS}, got {self.rounding!r}")
        self.budget = kept_budget(self.budget, self.compression_ratio, default=0.25)
        self.compression_ratio = None
        self.scorer = get_scorer(self.scorer)
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler: must be one of {SAMPLERS}, got {self.sampler!r}")
        self._allocate = get_allocation(self.allocation)
        budget = self.budget
        if isinstance(budget, bool) or not isinstance(budget, Real):
            raise ValueError(f"budget: must be a fraction in (0, 1] or a token count, got {budget!r}")
        if isinstance(budget, float) and not (0.0 < budget <= 1.0):
            raise ValueError(f"budget: a fraction must lie in (0, 1], got {budget!r}")
        if isinstance(budget, int) and budget < 1:
            raise ValueError(f"budget: a token count must be >= 1, got {budget!r}")

    @property
    def randomized(self) -> bool:
        return self.sampler != "topk"

    def __call__(self, model):
        """``with press(model):`` — kvpress's way of applying a press, and the press of kvpress's
        pipeline (``pipeline(context, question=..., press=press)``): :func:`kvcert.method.kvpress_bridge.pressing`."""
        from .kvpress_bridge import pressing

        return pressing(self, model)

    def generator(self, layer_idx: int, round_index: int = 0) -> torch.Generator:
        """The draws' generator (:func:`kvcert.method.design.cpu_generator`) seeded by (seed, layer, round)."""
        return cpu_generator((self.seed * 1_000_003 + layer_idx * 7919 + round_index * 104_729) % 2**63)

    def compress_layer(
        self, layer: CompactLayer, obs: LayerObservation, start: int = 0, end: int | None = None, round_index: int = 0,
        scores: torch.Tensor | None = None, potential: torch.Tensor | None = None,
        design: RetentionDesign | None = None,
    ) -> None:
        """Score the layer, allocate, sample the slots [start, end) and compact the layer.

        ``design``: what the certainty set protects in this segment (the schedule's
        :func:`~kvcert.method.schedule.segment_design`; default the press's own design, for a
        segment that is the whole layer).

        ``scores`` (``self.scorer(obs)``) and ``potential`` (:meth:`potential`) may be given
        already computed: the variants forked from one prefill (:mod:`kvcert.method.fork`) share them.
        """
        end = layer.length if end is None else end
        n = end - start
        if n <= 0:
            return
        design = self.design if design is None else design
        scores = (self.score(obs) if scores is None else scores)[..., start:end]
        fraction = layer_budget(self.budget, obs.layer_idx, obs.num_layers, design)  # RetentionDesign.dense_layers
        if obs.layer_idx < design.dense_layers < obs.num_layers:
            budget = n  # a dense layer keeps every token
        elif isinstance(self.budget, int):
            budget = min(self.budget, n)
        elif self.rounding == "floor":  # a token count, so that every allocation floors alike
            budget = resolve_budget(fraction, n, "floor")
        else:
            budget = fraction
        counts = self._allocate(scores, budget, obs.layer_idx, obs.num_layers, design)
        counts = counts.clamp(min=min(n, design.sinks + design.window), max=n)  # never below the certainty set
        sample = sample_retention(scores, counts, self.sampler, self.generator(obs.layer_idx, round_index), design)
        if self.randomized and potential is None:
            potential = self.potential(obs, start, end)
        mass = self.score_mass(scores, counts, sample, torch.isfinite(layer.log_pi[..., start:end]), design)
        layer.compact(sample, start, end, potential=potential if self.randomized else None)
        layer.score_mass = mass if layer.score_mass is None else layer.score_mass.add(mass)

    def score(self, obs: LayerObservation) -> torch.Tensor:
        """The scorer's importance of every slot of ``obs``. A scorer with a ``compression_ratio``
        (a kvpress press, :mod:`kvcert.method.scorers.kvpress_scorer`: StreamingLLMPress's scores depend on it)
        is first given this press's, 1 − the kept fraction."""
        if hasattr(self.scorer, "compression_ratio"):
            n = obs.key.shape[2]
            self.scorer.compression_ratio = 1.0 - (min(self.budget, n) / n if isinstance(self.budget, int)
                                                   else float(self.budget))
        return self.scorer(obs)

    def score_mass(self, scores: torch.Tensor, counts: torch.Tensor, sample, valid: torch.Tensor,
                   design: RetentionDesign) -> ScoreMass:
        """The decided slots' importance mass per (row, KV head): in all, evicted by ``sample``, and
        for a randomized sampler the expected evicted mass Σ(1 − π_i) s_i, with π the design's
        inclusion probabilities (:func:`~kvcert.method.design.inclusion_probabilities`; for priority
        sampling, whose inclusion probabilities have no closed form, those of the Poisson design
        at the same budget). Padding slots (``valid`` False) carry no mass."""
        s = torch.where(valid, scores.to(torch.float64), 0.0)
        evicted = torch.where(sample.kept_mask(), 0.0, s).sum(-1)
        expected = None
        if self.randomized:
            pi = inclusion_probabilities(scores, counts, design)
            expected = (s * (1.0 - pi)).sum(-1)
        return ScoreMass(s.sum(-1), evicted, expected)

    @staticmethod
    def potential(obs: LayerObservation, start: int, end: int) -> torch.Tensor:
        """Selection score ψ̃ [B, Hkv, end − start] of the decided slots from the forward's last
        :data:`~kvcert.method.sketch.POTENTIAL_WINDOW` queries (the eviction sketch's selection score),
        their logits normalised over all the keys of the forward."""
        b, hq, n_q, d = obs.query.shape
        hkv = obs.key.shape[1]
        window = obs.query[:, :, -POTENTIAL_WINDOW:].reshape(b, hkv, -1, d)
        return sketch_potential(window, obs.key[:, :, start:end], float(obs.scaling), context=obs.key)
