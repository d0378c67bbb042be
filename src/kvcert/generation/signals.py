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

from ..checks import check_delta
from ..method.recorder import StepCertificates
from ..method.certificate import aggregate, bernstein_radius
from .record import certificate_field, evicted_mass_field


def _series(radius: torch.Tensor, any_radius: torch.Tensor, norm: torch.Tensor, aggregations) -> torch.Tensor:
    """[..., 3·A, T] from radii [..., T, layers, Hq]: per aggregation the step radius, the anytime radius and the
    relative radius (ε / ‖ô‖), each aggregated over layers and heads."""
    relative = radius / norm.clamp(min=1e-12)
    return torch.stack([aggregate(x, a, (-2, -1)) for a in aggregations for x in (radius, any_radius, relative)], -2)


class _Block:
    """One certificate's trace: per aggregation, the step radii, anytime radii and relative radii, kept on the
    device as they are folded in (chunks of steps) and read once (:meth:`CertificateTrace.read`)."""

    def __init__(self, aggregations: tuple[str, ...], num_layers: int):
        self.aggregations = aggregations
        self.num_layers = num_layers
        self.chunks: list[torch.Tensor] = []  # [3·A, T] each
        self.first: tuple[torch.Tensor, list[int]] | None = None  # the first step's per-layer radii [A, layers]

    def fold(self, series: torch.Tensor, radius: torch.Tensor, layers: list[int]) -> None:
        """Steps' ``series`` [3·A, T] (:func:`_series`); ``radius`` [T, layers, Hq] for the first step's layers."""
        self.chunks.append(series)
        if self.first is None:
            self.first = (torch.stack([aggregate(radius[0], a, (1,)) for a in self.aggregations]), list(layers))

    def tensors(self) -> list[torch.Tensor]:
        return [torch.cat(self.chunks, -1).flatten(), self.first[0].flatten()]

    def record(self, delta: float, values: list[list[float]], variance_mean: list[float]) -> dict:
        """The record's field from :meth:`tensors`' values, as read."""
        flat, first = values
        a_n, t_n = len(self.aggregations), len(flat) // (3 * len(self.aggregations))
        table = [flat[i * t_n : (i + 1) * t_n] for i in range(3 * a_n)]
        steps = {a: table[3 * i] for i, a in enumerate(self.aggregations)}
        anytime = {a: table[3 * i + 1] for i, a in enumerate(self.aggregations)}
        relative = {a: table[3 * i + 2] for i, a in enumerate(self.aggregations)}
        layers = self.first[1]
        per_layer = {a: [0.0] * self.num_layers for a in self.aggregations}
        for i, a in enumerate(self.aggregations):
            for j, layer_idx in enumerate(layers):
                per_layer[a][layer_idx] = first[i * len(layers) + j]
        return certificate_field(delta, steps, anytime, relative, variance_mean, per_layer)


class CertificateTrace:
    """Accumulates the certificates of one generation, step by step (plug-in and robust), on the device: the
    radii are computed and aggregated as steps are folded in, and read back once, when the record is written."""

    def __init__(self, delta: float, aggregations: tuple[str, ...], num_layers: int, roundoff: float = 0.0):
        self.delta = delta
        self.aggregations = aggregations
        self.num_layers = num_layers
        self.roundoff = roundoff  # u of the cache dtype: the robust radius's floor u·‖ô‖
        self.plugin = _Block(aggregations, num_layers)
        self.robust = _Block(aggregations, num_layers)
        self.count = 0  # certified steps folded in
        self._variance_mean: list[torch.Tensor] = []
        self._read: dict | None = None

    def add(self, step: StepCertificates, row: int = 0, layers=None) -> None:
        """Fold in one forward's certificates (the last query of the forward) of batch ``row``.

        ``layers``: the layers that certify this row (those where it has a sampled tail; a
        batch of forks records every layer where *some* row has one); default: all recorded.
        """
        layers = sorted(step.variance) if layers is None else [i for i in sorted(step.variance) if i in layers]
        if not layers:
            return
        stack = lambda d: torch.stack([d[i][row, :, -1] for i in layers]).unsqueeze(0)  # noqa: E731 - [1, layers, Hq]
        self.fold(stack(step.variance), stack(step.range_term), stack(step.output_norm), stack(step.shadow_sum), layers)

    def fold(self, variance: torch.Tensor, range_term: torch.Tensor, output_norm: torch.Tensor,
             shadow_sum: torch.Tensor, layers: list[int]) -> None:
        """Fold in T certified steps at once: V̂, b̂_c, ‖ô‖ and Σ t_j [T, layers, Hq] (fp32 or fp64) of the
        ``layers`` that certify them; the radii in float64 on the statistics' device, nothing read back."""
        fold_many([self], variance.unsqueeze(0), range_term.unsqueeze(0), output_norm.unsqueeze(0),
                  shadow_sum.unsqueeze(0), layers)

    @property
    def steps(self) -> dict[str, list[float]]:
        return self.read()["plugin"]["steps"] if self.count else {a: [] for a in self.aggregations}

    @property
    def variance_mean(self) -> list[float]:
        return self.read()["plugin"]["variance_mean_steps"] if self.count else []

    def read(self) -> dict:
        """Both fields' values, read from the device in one transfer (once: folding later starts over)."""
        if self._read is None or self._read.get("count") != self.count:
            blocks = (self.plugin, self.robust)
            parts = [t for block in blocks for t in block.tensors()] + [torch.cat(self._variance_mean)]
            sizes = [t.numel() for t in parts]
            flat = torch.cat([t.to(torch.float64) for t in parts]).tolist()
            values, at = [], 0
            for n in sizes:
                values.append(flat[at : at + n])
                at += n
            vm = values[4]
            self._read = {"count": self.count,
                          "plugin": self.plugin.record(self.delta, values[0:2], vm),
                          "robust": self.robust.record(self.delta, values[2:4], vm)}
        return self._read

    def to_record(self) -> dict | None:
        """The plug-in certificate's field of the generation record (None: no certified step)."""
        return self.read()["plugin"] if self.count else None

    def robust_record(self) -> dict | None:
        """The robust certificate's field (same layout; ``variance_mean_steps`` is the plug-in's V̂, which
        ε_R shares: the shadow adds Σ t_j to the radius, not to the variance)."""
        return self.read()["robust"] if self.count else None


def _log_terms(delta: float, first: int, steps: int, device) -> torch.Tensor:
    """L_t = log(2/δ_t), δ_t = δ / (t (t + 1)), for the certified steps t = first + 1 … first + steps: [T, 1, 1]
    float64, the same arithmetic as :func:`kvcert.method.certificate.anytime_radius` (no host read)."""
    t = torch.arange(first + 1, first + steps + 1, dtype=torch.float64, device=device)
    return torch.log(2.0 / (check_delta(delta) / (t * (t + 1.0)))).reshape(-1, 1, 1)


def fold_many(traces: list[CertificateTrace], variance, range_term, output_norm, shadow_sum, layers) -> None:
    """Fold T certified steps into each of ``traces`` at once: V̂, b̂_c, ‖ô‖, Σ t_j [rows, T, layers, Hq], a row
    per trace; the traces share δ, the aggregations, the rounding floor and the count of steps folded so far."""
    first = traces[0]
    # contiguous, so that every reduction over (layers, heads) sums in the order a single step's does
    var, rng, norm, sv = (x.to(torch.float64).contiguous() for x in (variance, range_term, output_norm, shadow_sum))
    n_steps = var.shape[1]
    big_l = _log_terms(first.delta, first.count, n_steps, var.device)
    plugin = bernstein_radius(var, rng, first.delta)
    anytime = torch.sqrt(2.0 * var.clamp(min=0) * big_l) + (2.0 / 3.0) * rng * big_l
    floor = first.roundoff * norm
    robust = torch.maximum(plugin + sv, floor)
    robust_any = torch.maximum(anytime + sv, floor)
    plugin_series = _series(plugin, anytime, norm, first.aggregations)
    robust_series = _series(robust, robust_any, norm, first.aggregations)
    variance_mean = var.mean(dim=(-2, -1))
    for r, trace in enumerate(traces):
        trace.plugin.fold(plugin_series[r], plugin[r], layers)
        trace.robust.fold(robust_series[r], robust[r], layers)
        trace._variance_mean.append(variance_mean[r])
        trace.count += n_steps


def add_rows(traces: list[CertificateTrace], step: StepCertificates, rows: list[int], layers: list) -> None:
    """Fold one batched forward's certificates into one trace per batch row, as
    ``trace.add(step, row, row_layers)`` does for each, with one tensor pass per group of
    rows that share the trace step, δ, aggregations and certifying layers."""
    groups: dict[tuple, list] = {}
    for trace, row, allowed in zip(traces, rows, layers):
        mine = tuple(i for i in sorted(step.variance) if i in allowed)
        if mine:
            key = (trace.count, trace.delta, trace.aggregations, trace.roundoff, mine)
            groups.setdefault(key, []).append((trace, row))
    for (_, _, _, _, mine), members in groups.items():
        idx = torch.tensor([row for _, row in members])
        stack = lambda d: torch.stack([d[i][idx, :, -1] for i in mine], 1).unsqueeze(1)  # noqa: E731 - [rows, 1, layers, Hq]
        fold_many([trace for trace, _ in members], stack(step.variance), stack(step.range_term),
                  stack(step.output_norm), stack(step.shadow_sum), list(mine))


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

    def add_next_token_values(self, entropy: float, margin: float) -> None:
        """A step's next-token entropy and top-2 margin, already read back (the decode step reads them with its
        tokens)."""
        self._next.append((entropy, margin))

    def add_attention(self, values: torch.Tensor | None, row: int = 0) -> None:
        """``values`` from :func:`attention_entropy` ([B]; None: no compressed layer in that forward)."""
        if values is not None and self._attention is not None:
            self._attention.append(values[row : row + 1])

    def add_attention_steps(self, values: torch.Tensor) -> None:
        """Several steps' attention entropies at once ([T])."""
        if self._attention is not None:
            self._attention.append(values)

    def _next_table(self) -> list[list[float]]:
        if not self._next:
            return []
        if all(isinstance(v, tuple) for v in self._next):
            return [list(v) for v in self._next]
        return [list(v) if isinstance(v, tuple) else v.double().tolist() for v in self._next]

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
        return torch.cat(self._attention).double().tolist() if self._attention else []


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


def fold_recorded(recorder, traces: list, signals: list, row_layers: list | None = None) -> None:
    """Fold every forward a cache's recorder holds (:class:`~kvcert.method.recorder.StepRecorder`) into the traces
    and step signals of its batch rows (``traces[pos]`` None: that row certifies nothing), then clear it. The
    statistics stay on the device: runs of forwards that recorded the same layers are folded at once
    (:func:`fold_many`), and nothing is read back. ``row_layers[pos]``: the layers that certify row ``pos`` (where
    it has a sampled tail; a batch of forks records every layer where some row has one); None: all recorded."""
    from ..method.recorder import ENTROPY, NORM, RANGE, SHADOW_SUM, VARIANCE

    marks = recorder.marks
    if not marks:
        return
    data = recorder.buffer.data
    start = 0
    while start < len(marks):
        stop = start + 1
        while stop < len(marks) and marks[stop] == marks[start]:
            stop += 1
        mark, rows = marks[start], data[start:stop]  # [T, layers, 6, B, Hq]
        if mark.entropy:
            entropy = rows[:, sorted(mark.entropy), ENTROPY].mean(dim=(1, 3))  # [T, B]
            for pos, sig in enumerate(signals):
                sig.add_attention_steps(entropy[:, pos])
        if mark.certified:
            groups: dict[tuple, list] = {}
            for pos, trace in enumerate(traces):
                if trace is None:
                    continue
                allowed = None if row_layers is None else row_layers[pos]
                mine = tuple(i for i in sorted(mark.certified) if allowed is None or i in allowed)
                if mine:
                    key = (trace.count, trace.delta, trace.aggregations, trace.roundoff, mine)
                    groups.setdefault(key, []).append((trace, pos))
            for (_, _, _, _, mine), members in groups.items():
                picked = rows[:, list(mine)]  # [T, layers, 6, B, Hq]
                if len(members) == picked.shape[3]:
                    picked = picked.permute(3, 0, 1, 2, 4)  # [rows, T, layers, 6, Hq]: every row, in order
                    if [pos for _, pos in members] != list(range(len(members))):
                        picked = picked[torch.tensor([pos for _, pos in members], device=picked.device)]
                else:
                    picked = picked[:, :, :, torch.tensor([pos for _, pos in members], device=picked.device)]
                    picked = picked.permute(3, 0, 1, 2, 4)
                fold_many([trace for trace, _ in members], picked[:, :, :, VARIANCE], picked[:, :, :, RANGE],
                          picked[:, :, :, NORM], picked[:, :, :, SHADOW_SUM], list(mine))
        start = stop
    recorder.clear()


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
