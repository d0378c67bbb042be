"""What the attention path records per forward: certificates, attention entropy, captured inputs.

The attention function (:func:`kvcert.method.integration.kvcert_attention_forward`) writes to a
:class:`StepRecorder` (a :class:`~kvcert.method.cache.CertifiedCache` carries one): per layer with
a sampled tail the certificate's V̂, b̂_c, ‖ô‖ and the robust certificate's shadow terms;
per compressed layer (with ``entropy``) the entropy of the attention weights; and, for
the layers in ``capture_layers``, the attention inputs of the last forward (for replay).

The statistics live on the device, in one buffer of the forwards recorded so far (:class:`StepBuffer`,
[steps, layers, statistics, batch, query heads], the forward's last query), written where they are
computed: the fused decode kernel writes its row at a device step index (:meth:`StepRecorder.kernel_stats`),
the torch path copies its results in. Nothing is read back per forward: the host keeps, per recorded forward,
which layers certified and which recorded their entropy (:attr:`StepRecorder.marks`), and whoever folds the
statistics (:mod:`kvcert.generation.signals`) reads them when a generation ends. :meth:`StepRecorder.steps`
gives the recorded forwards one :class:`StepCertificates` each (views of the buffer), for callers that fold
forward by forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .scorers.base import LayerObservation

#: the statistics of a recorded forward, in the buffer's order (the fused kernel's names, ``STAT_NAMES``)
STATISTICS = ("variance", "range_term", "output_norm", "shadow_sum", "shadow_range", "entropy")
VARIANCE, RANGE, NORM, SHADOW_SUM, SHADOW_RANGE, ENTROPY = range(len(STATISTICS))


@dataclass
class StepCertificates:
    """Certificates of one forward: per layer with a sampled tail, V̂, b̂_c and ‖ô‖ [B, Hq, 1] (the forward's last
    query), and the robust certificate's shadow terms Σ t_j, max t_j (zero for a layer without a sketch); per
    compressed layer (with ``record_entropy``) the entropy of the attention weights [B, Hq, 1]."""

    variance: dict[int, torch.Tensor] = field(default_factory=dict)
    range_term: dict[int, torch.Tensor] = field(default_factory=dict)
    output_norm: dict[int, torch.Tensor] = field(default_factory=dict)
    shadow_sum: dict[int, torch.Tensor] = field(default_factory=dict)
    shadow_range: dict[int, torch.Tensor] = field(default_factory=dict)
    entropy: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class Mark:
    """What one recorded forward wrote: the layers that certified (all six statistics but the entropy) and
    the layers that recorded their entropy."""

    certified: tuple[int, ...]
    entropy: tuple[int, ...]


class StepBuffer:
    """The statistics of recorded forwards on the device: ``data`` [capacity, layers, 6, B, Hq] fp32 (the
    :data:`STATISTICS` in order), ``index`` the device step index a kernel writes at (int32 [1], made when a
    kernel first asks for it). Rows of layers a forward did not record hold stale values: readers go by the
    marks; the shadow terms start at 0, so a certified layer without a sketch reads 0 there."""

    def __init__(self, capacity: int, layers: int, batch: int, heads: int, device):
        self.data = torch.zeros(capacity, layers, len(STATISTICS), batch, heads, dtype=torch.float32, device=device)
        self.index: torch.Tensor | None = None
        self.views: dict = {}  # (layer, certificate, entropy) → the kernel's views of ``data`` (kernel_stats)

    @property
    def capacity(self) -> int:
        return self.data.shape[0]

    def fits(self, layers: int, batch: int, heads: int, device) -> bool:
        _, n, _, b, h = self.data.shape
        return (n, b, h) == (layers, batch, heads) and self.data.device == torch.device(device)

    def grown(self, needed: int) -> "StepBuffer":
        """A buffer of twice the capacity (at least ``needed``) holding this one's rows."""
        _, n, _, b, h = self.data.shape
        out = StepBuffer(max(needed, 2 * self.capacity), n, b, h, self.data.device)
        out.data[: self.capacity] = self.data
        if self.index is not None:
            out.index = self.index  # the same counter: it is the recorder's
        return out


class StepRecorder:
    """Per-forward records of the attention path.

    certificates: record V̂ and b̂_c of every forward over a layer with a sampled tail.
    entropy: record the entropy of the attention weights of every forward over a
        compressed layer (a comparison signal).
    capture_layers: layer indices whose attention inputs are kept after each forward
        (``captured[layer]``, a :class:`~kvcert.method.scorers.base.LayerObservation`).
    steps_hint: how many forwards the buffer is first sized for (it doubles when full).
    """

    def __init__(self, certificates: bool = True, entropy: bool = False, capture_layers=(), steps_hint: int = 16):
        self.certificates = certificates
        self.entropy = entropy
        self.capture_layers = set(capture_layers)
        self.captured: dict[int, LayerObservation] = {}
        self.steps_hint = max(1, int(steps_hint))
        self.buffer: StepBuffer | None = None
        self.marks: list[Mark] = []  # one per recorded forward, in order: its row in the buffer
        self._certified: list[int] = []  # this forward's layers
        self._entropy: list[int] = []
        self._pending: list = []  # (layer, PendingCertificate) of this forward, combined at its end
        self._rows: list = []  # (layer, layers, [B, Hq, 5] or [B, Hq, 1], first statistic) written at its end

    # --- the forward ------------------------------------------------------------------
    def begin_forward(self) -> None:
        self._certified, self._entropy, self._pending, self._rows = [], [], [], []

    def end_forward(self) -> None:
        self.flush()
        if self._certified or self._entropy:
            self.marks.append(Mark(tuple(self._certified), tuple(self._entropy)))
            if self.buffer is not None and self.buffer.index is not None:
                self.buffer.index.add_(1)  # the next forward's row, where the kernels write
        self._certified, self._entropy = [], []

    @property
    def step(self) -> int:
        """The buffer row of the forward being recorded (= the forwards recorded so far)."""
        return len(self.marks)

    def rows(self, num_layers: int, batch: int, heads: int, device) -> torch.Tensor:
        """The buffer's data, made to hold this forward's row (allocated, or grown, as needed)."""
        buf, step = self.buffer, self.step
        if buf is None or not buf.fits(num_layers, batch, heads, device):
            if buf is not None and self.marks:
                raise ValueError("recorder: a forward of another batch or layer count than the recorded ones; "
                                 "pop the recorded steps first")
            buf = self.buffer = StepBuffer(max(self.steps_hint, step + 1), num_layers, batch, heads, device)
        elif step >= buf.capacity:
            buf = self.buffer = buf.grown(step + 1)
        return buf.data

    # --- what the attention path writes ---------------------------------------------------
    def certificate(self, layer_idx: int, num_layers: int, variance: torch.Tensor, range_term: torch.Tensor,
                    output_norm: torch.Tensor, shadow_sum=None, shadow_range=None) -> None:
        """A layer's certificate of this forward ([B, Hq, Q] each; the last query is kept), written with the other
        layers' when the forward ends (:meth:`flush`: one copy for a run of layers)."""
        if shadow_sum is None or shadow_range is None:
            shadow_sum = shadow_range = torch.zeros_like(variance[..., -1:])
        parts = (variance, range_term, output_norm, shadow_sum, shadow_range)
        self._rows.append((layer_idx, num_layers, torch.cat([t if t.shape[-1] == 1 else t[..., -1:] for t in parts], -1),
                           VARIANCE))
        self._certified.append(layer_idx)

    def defer(self, layer_idx: int, num_layers: int, pending) -> None:
        """Record a layer's certificate from its decode step's sums (:class:`kvcert.method.attention.PendingCertificate`),
        combined with the other layers' of this forward when it ends (:meth:`flush`)."""
        self._pending.append((layer_idx, num_layers, pending))

    def flush(self) -> None:
        """Combine the deferred certificates of this forward (:func:`kvcert.method.attention.combine_pending`, all
        layers at once) and write them as :meth:`certificate` does (the shadow terms 0: no sketch)."""
        if self._rows:
            self._write_rows()
        if not self._pending:
            return
        from .attention import combine_pending_stacked

        pending, self._pending = self._pending, []
        layers = [layer for layer, _, _ in pending]
        for idx, variance, range_term, norm in combine_pending_stacked([p for _, _, p in pending]):
            b, hq = variance.shape[1:3]
            data = self.rows(pending[idx[0]][1], b, hq, variance.device)[self.step]
            mine = [layers[i] for i in idx]
            if mine == list(range(mine[0], mine[0] + len(mine))):  # consecutive layers: one copy per statistic
                block = data[mine[0] : mine[0] + len(mine)]
                block[:, VARIANCE].copy_(variance[..., 0])
                block[:, RANGE].copy_(range_term[..., 0])
                block[:, NORM].copy_(norm[..., 0])
                block[:, SHADOW_SUM : SHADOW_RANGE + 1].zero_()
            else:
                for j, layer in enumerate(mine):
                    row = data[layer]
                    row[VARIANCE].copy_(variance[j, ..., 0])
                    row[RANGE].copy_(range_term[j, ..., 0])
                    row[NORM].copy_(norm[j, ..., 0])
                    row[SHADOW_SUM : SHADOW_RANGE + 1].zero_()
        self._certified.extend(layers)

    def entropy_of(self, layer_idx: int, num_layers: int, entropy: torch.Tensor) -> None:
        """A layer's attention entropy of this forward ([B, Hq, Q]; the last query is kept), written with the other
        layers' when the forward ends."""
        self._rows.append((layer_idx, num_layers, entropy if entropy.shape[-1] == 1 else entropy[..., -1:], ENTROPY))
        self._entropy.append(layer_idx)

    def _write_rows(self) -> None:
        """This forward's statistics from the torch path, into the buffer's row: one stacked copy per run of
        consecutive layers that wrote the same statistics."""
        rows, self._rows = self._rows, []
        groups: dict[tuple, list] = {}
        for layer, num_layers, values, first in rows:
            groups.setdefault((first, values.shape[-1], values.dtype, num_layers), []).append((layer, values))
        for (first, width, _, num_layers), members in groups.items():
            b, hq = members[0][1].shape[:2]
            data = self.rows(num_layers, b, hq, members[0][1].device)[self.step]
            start = 0
            while start < len(members):
                stop = start + 1
                while stop < len(members) and members[stop][0] == members[stop - 1][0] + 1:
                    stop += 1
                run = members[start:stop]
                block = data[run[0][0] : run[-1][0] + 1, first : first + width]  # [layers, width, B, Hq]
                block.copy_(torch.stack([v for _, v in run]).movedim(-1, 1))
                start = stop

    def kernel_stats(self, layer_idx: int, num_layers: int, batch: int, heads: int, device, certificate: bool,
                     entropy: bool) -> tuple[dict, torch.Tensor]:
        """Where the fused decode kernel writes a layer's statistics of every forward: per statistic a view
        [capacity, B, Hq] of the buffer (the layer's column), and the device step index (the current forward's
        row). The layer is marked as recorded in this forward."""
        data = self.rows(num_layers, batch, heads, device)
        buf = self.buffer
        if buf.index is None:
            buf.index = torch.full((1,), self.step, dtype=torch.int32, device=device)
        key = (layer_idx, certificate, entropy)
        stats = buf.views.get(key)
        if stats is None:  # made once per buffer: a step only looks them up
            names = (STATISTICS[:ENTROPY] if certificate else ()) + (("entropy",) if entropy else ())
            stats = buf.views[key] = {name: data[:, layer_idx, STATISTICS.index(name)] for name in names}
        if certificate:
            self._certified.append(layer_idx)
        if entropy:
            self._entropy.append(layer_idx)
        return stats, buf.index

    # --- reading ---------------------------------------------------------------------------
    def steps(self, start: int = 0, stop: int | None = None, data: torch.Tensor | None = None) -> list[StepCertificates]:
        """The recorded forwards [start, stop) as :class:`StepCertificates`: views of the buffer (or of ``data``,
        a copy of its rows [start, stop))."""
        marks = self.marks[start:stop]
        if not marks:
            return []
        if data is None:
            data, first = self.buffer.data, start
        else:
            first = 0
        out = []
        for t, mark in enumerate(marks, first):
            step = StepCertificates()
            for layer in mark.certified:
                values = data[t, layer].unsqueeze(-1)  # [6, B, Hq, 1]
                step.variance[layer], step.range_term[layer], step.output_norm[layer] = values[0], values[1], values[2]
                step.shadow_sum[layer], step.shadow_range[layer] = values[3], values[4]
            for layer in mark.entropy:
                step.entropy[layer] = data[t, layer, ENTROPY].unsqueeze(-1)
            out.append(step)
        return out

    @property
    def step_log(self) -> list[StepCertificates]:
        """Every forward recorded since the last :meth:`pop_steps` (views of the buffer)."""
        return self.steps()

    def pop_steps(self) -> list[StepCertificates]:
        """The recorded forwards (over one copy of their rows), and the recorder starts over."""
        if not self.marks:
            return []
        steps = self.steps(data=self.buffer.data[: len(self.marks)].clone())
        self.clear()
        return steps

    def clear(self) -> None:
        """Forget the recorded forwards: the next one writes row 0 (the shadow terms start at 0 again)."""
        if self.marks and self.buffer is not None:
            self.buffer.data[: len(self.marks), :, SHADOW_SUM : SHADOW_RANGE + 1].zero_()
            if self.buffer.index is not None:
                self.buffer.index.zero_()
        self.marks = []

    # --- captured inputs ----------------------------------------------------------------------
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
