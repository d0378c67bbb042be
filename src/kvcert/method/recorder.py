"""What the attention path records per forward: certificates, attention entropy, captured inputs.

The attention function (:func:`kvcert.method.integration.kvcert_attention_forward`) writes to a
:class:`StepRecorder` (a :class:`~kvcert.method.cache.CertifiedCache` carries one): per layer with
a sampled tail the certificate's V̂, b̂_c, ‖ô‖ and the robust certificate's shadow terms;
per compressed layer (with ``entropy``) the entropy of the attention weights; and, for
the layers in ``capture_layers``, the attention inputs of the last forward (for replay).
A forward's records form one :class:`StepCertificates` in ``step_log``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .scorers.base import LayerObservation


@dataclass
class StepCertificates:
    """Certificates of one forward: per layer with a sampled tail, V̂, b̂_c and ‖ô‖ [B, Hq, Q], and the
    robust certificate's shadow terms Σ t_j, max t_j (zero for a layer without a sketch); per
    compressed layer (with ``record_entropy``) the entropy of the attention weights [B, Hq, Q]."""

    variance: dict[int, torch.Tensor] = field(default_factory=dict)
    range_term: dict[int, torch.Tensor] = field(default_factory=dict)
    output_norm: dict[int, torch.Tensor] = field(default_factory=dict)
    shadow_sum: dict[int, torch.Tensor] = field(default_factory=dict)
    shadow_range: dict[int, torch.Tensor] = field(default_factory=dict)
    entropy: dict[int, torch.Tensor] = field(default_factory=dict)
    num_queries: int = 0


class StepRecorder:
    """Per-forward records of the attention path.

    certificates: record V̂ and b̂_c of every forward over a layer with a sampled tail.
    entropy: record the entropy of the attention weights of every forward over a
        compressed layer (a comparison signal).
    capture_layers: layer indices whose attention inputs are kept after each forward
        (``captured[layer]``, a :class:`~kvcert.method.scorers.base.LayerObservation`).
    """

    def __init__(self, certificates: bool = True, entropy: bool = False, capture_layers=()):
        self.certificates = certificates
        self.entropy = entropy
        self.capture_layers = set(capture_layers)
        self.captured: dict[int, LayerObservation] = {}
        self.step_log: list[StepCertificates] = []
        self._current: StepCertificates | None = None
        self._pending: list = []  # (layer, PendingCertificate) of this forward, combined at its end

    def begin_forward(self) -> None:
        self._current = StepCertificates()
        self._pending = []

    def end_forward(self) -> None:
        self.flush()
        if self._current is not None and (self._current.variance or self._current.entropy):
            self.step_log.append(self._current)
        self._current = None

    def _step(self) -> StepCertificates:
        if self._current is None:
            self._current = StepCertificates()
        return self._current

    def certificate(self, layer_idx: int, variance: torch.Tensor, range_term: torch.Tensor, output_norm=None,
                    shadow_sum=None, shadow_range=None) -> None:
        step = self._step()
        step.variance[layer_idx] = variance.detach()
        step.range_term[layer_idx] = range_term.detach()
        if output_norm is not None:
            step.output_norm[layer_idx] = output_norm.detach()
        zero = torch.zeros_like(variance) if shadow_sum is None or shadow_range is None else None
        step.shadow_sum[layer_idx] = zero if shadow_sum is None else shadow_sum.detach()
        step.shadow_range[layer_idx] = zero if shadow_range is None else shadow_range.detach()
        step.num_queries = variance.shape[-1]

    def defer(self, layer_idx: int, pending) -> None:
        """Record a layer's certificate from its decode step's sums (:class:`kvcert.method.attention.PendingCertificate`),
        combined with the other layers' of this forward when it ends (:meth:`flush`)."""
        self._pending.append((layer_idx, pending))

    def flush(self) -> None:
        """Combine the deferred certificates of this forward (:func:`kvcert.method.attention.combine_pending`, all
        layers at once) and record them as :meth:`certificate` does."""
        if not self._pending:
            return
        from .attention import combine_pending

        pending, self._pending = self._pending, []
        results = combine_pending([p for _, p in pending])
        shapes = {(tuple(r[0].shape), r[0].dtype) for r in results}
        if len(shapes) == 1:  # one zero tensor for every layer's shadow terms (no sketch: Σ t_j = max t_j = 0)
            zeros = results[0][0].new_zeros((len(results), *results[0][0].shape)).unbind(0)
        else:
            zeros = [torch.zeros_like(r[0]) for r in results]
        step = self._step()
        for (layer_idx, _), (variance, range_term, norm), z in zip(pending, results, zeros):
            step.variance[layer_idx], step.range_term[layer_idx], step.output_norm[layer_idx] = variance, range_term, norm
            step.shadow_sum[layer_idx] = step.shadow_range[layer_idx] = z
        step.num_queries = 1

    def entropy_of(self, layer_idx: int, entropy: torch.Tensor) -> None:
        self._step().entropy[layer_idx] = entropy.detach()

    def captures(self, layer_idx: int) -> bool:
        return layer_idx in self.capture_layers

    def capture(self, obs: LayerObservation) -> None:
        """Keep a copy of ``obs`` if its layer is captured."""
        if obs.layer_idx in self.capture_layers:
            self.captured[obs.layer_idx] = LayerObservation(
                query=obs.query.detach().clone(), key=obs.key.detach().clone(), value=obs.value.detach().clone(),
                log_pi=None if obs.log_pi is None else obs.log_pi.clone(), scaling=obs.scaling,
                layer_idx=obs.layer_idx, num_layers=obs.num_layers,
            )

    def pop_steps(self) -> list[StepCertificates]:
        steps, self.step_log = self.step_log, []
        return steps
