"""Forking one prefill into many compressed caches, and decoding them as one batch.

Eviction happens right after each layer's attention (:class:`~kvcert.method.cache.CertifiedCache`),
so the hidden states of a prefill do not depend on the budget or the method: every
eviction variant of one prompt can be *forked* from a single prefill. A
:class:`ForkingCache` prefills the prompt over the full cache and, after each layer's
attention, its schedule (:class:`ForkSchedule`) hands that layer's observation to every :class:`Branch`: the branch copies
the layer's first ``end`` slots (the context, for the streaming condition; every
prefilled slot, for question-aware eviction) and compacts the copy with its own press,
exactly as a single run's armed press compacts its layer (same observation, sliced to
the branch's prefix; same generator seed and round).

The forks are decoded as the rows of one batch: :class:`~kvcert.method.batched.BatchedLayer` holds
them (stacked, viewed by groups of rows, repacked as rows finish), and the cache-level helpers
here (:func:`stacked_cache`, :func:`row_view_cache`, :func:`join_view_caches`,
:func:`take_cache_rows`) apply its methods to every layer; :func:`width_buckets` splits rows of
very different widths (the full cache among compressed ones) into batches where padding the
short rows would cost more than one more forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field


from .batched import BatchedLayer
from .cache import CertifiedCache, CompactLayer
from .scorers.base import LayerObservation


@dataclass
class Branch:
    """One eviction variant forked from a shared prefill.

    press: its :class:`~kvcert.method.press.EvictionPress`; end: how many prefilled slots it
    decides on (the context length for streaming, all prefilled slots for aware).
    After the forward, ``layers`` holds its compacted layers (batch 1) and ``peak_nbytes``
    the peak cache bytes a single run's prefill of the same prefix would have reached.
    """

    press: object
    end: int
    layers: list[CompactLayer] = field(default_factory=list)
    peak_nbytes: int = 0

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)


def _slice_obs(obs: LayerObservation, end: int) -> LayerObservation:
    """The observation a single run prefilling only the first ``end`` tokens would have made."""
    if obs.key.shape[2] == end:
        return obs
    return LayerObservation(query=obs.query[:, :, :end], key=obs.key[:, :, :end], value=obs.value[:, :, :end],
                            log_pi=None if obs.log_pi is None else obs.log_pi[:, :, :end], scaling=obs.scaling,
                            layer_idx=obs.layer_idx, num_layers=obs.num_layers, module=obs.module,
                            hidden_states=None if obs.hidden_states is None else obs.hidden_states[:, :end],
                            position_embeddings=None if obs.position_embeddings is None
                            else tuple(t[:, :end] for t in obs.position_embeddings))


class ForkSchedule:
    """The schedule of a prefill forked into ``branches``: after each layer's attention in the next
    multi-token forward, every branch's press compresses its own copy of the layer (the
    counterpart of :class:`kvcert.method.schedule.PressSchedule`, which compresses the layer itself)."""

    def __init__(self, branches: list[Branch]):
        self.branches = list(branches)

    @property
    def armed(self) -> bool:
        return bool(self.branches)

    def arm(self, press, keep_recent: int | None = None) -> None:
        raise ValueError("arm: a forking cache forks its branches; it arms no press of its own")

    def fires(self, num_queries: int) -> bool:
        return bool(self.branches) and num_queries > 1

    def after_attention(self, layer: CompactLayer, obs: LayerObservation) -> None:
        per_slot = layer.keys.shape[1] * layer.slot_nbytes()  # all KV heads
        shared: dict = {}  # scores and sketch potentials, once per (scorer, prefix)
        for branch in self.branches:
            press, view = branch.press, _slice_obs(obs, branch.end)
            # a scorer told the budget (a kvpress press's compression ratio) is shared per budget only
            key = (repr(press.scorer), branch.end, press.budget if hasattr(press.scorer, "compression_ratio") else None)
            if key not in shared:
                shared[key] = press.score(view)
            if press.randomized and ("potential", branch.end) not in shared:
                shared["potential", branch.end] = press.potential(view, 0, branch.end)
            # a single run's peak: its earlier layers compacted, this one still full (later ones empty)
            branch.peak_nbytes = max(branch.peak_nbytes, branch.nbytes() + layer.keys.shape[0] * per_slot * branch.end)
            fork = layer.fork(branch.end)
            press.compress_layer(fork, view, round_index=0, scores=shared[key],
                                 potential=shared.get(("potential", branch.end)) if press.randomized else None)
            branch.layers.append(fork)
            branch.peak_nbytes = max(branch.peak_nbytes, branch.nbytes())
        if obs.layer_idx == obs.num_layers - 1:
            self.branches = []  # fired once, like an armed press

    def end_forward(self) -> None:
        pass


class ForkingCache(CertifiedCache):
    """A full cache whose next multi-token forward forks ``branches`` after each layer's attention."""

    def __init__(self, branches: list[Branch], reserve: int = 64):
        super().__init__(record_certificates=False, reserve=reserve, schedule=ForkSchedule(branches))


def _cache(layers: list[CompactLayer], record_certificates: bool, record_entropy: bool = False,
           static_decode: bool = False) -> CertifiedCache:
    cache = CertifiedCache(record_certificates=record_certificates, record_entropy=record_entropy,
                           static_decode=static_decode)
    cache.layers.extend(layers)
    cache.layer_class_to_replicate = None
    return cache


def stacked_cache(layer_lists: list[list[CompactLayer]], record_certificates: bool, room: int = 0,
                  record_entropy: bool = False, static_decode: bool = False) -> CertifiedCache:
    """A :class:`CertifiedCache` whose rows are the given caches' layers (one list per cache), stacked
    (:meth:`BatchedLayer.stack`)."""
    return _cache([BatchedLayer.stack(list(per_layer), room) for per_layer in zip(*layer_lists)], record_certificates,
                  record_entropy, static_decode)


def row_view_cache(cache: CertifiedCache, start: int, stop: int) -> CertifiedCache:
    """Rows [start, stop) of a stacked cache as a cache of their own (:meth:`BatchedLayer.row_view`)."""
    return _cache([layer.row_view(start, stop) for layer in cache.layers], cache.recorder.certificates,
                  cache.recorder.entropy, cache.static_decode)


def join_view_caches(cache: CertifiedCache, views: list[CertifiedCache]) -> None:
    for i, layer in enumerate(cache.layers):
        layer.join([view.layers[i] for view in views])


def take_cache_rows(cache: CertifiedCache, rows: list[int]) -> CertifiedCache:
    """A new cache of batch ``rows`` of a stacked cache (:meth:`BatchedLayer.take`)."""
    return _cache([layer.take(rows) for layer in cache.layers], cache.recorder.certificates,
                  cache.recorder.entropy, cache.static_decode)


#: what one more batched forward costs, in row × slot products of attention it saves (CPU-measured
#: order of magnitude: a forward's fixed cost against attention's cost per row and slot)
FORWARD_SLOTS = 16384


def width_buckets(widths: list[int], forward_slots: int = FORWARD_SLOTS) -> list[list[int]]:
    """Rows grouped into batches of similar width, so that padding a short row to a long one costs
    less than another forward: rows sorted by width, cut where Σ_batches (forward_slots + rows ×
    widest) is least (dynamic programming over the sorted rows). Returns row indices per batch."""
    order = sorted(range(len(widths)), key=lambda r: (widths[r], r))
    n = len(order)
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for j in range(1, n + 1):  # batch order[i:j]: its widest row is order[j - 1]
        for i in range(j):
            cost = best[i] + forward_slots + (j - i) * widths[order[j - 1]]
            if cost < best[j]:
                best[j], cut[j] = cost, i
    batches, j = [], n
    while j > 0:
        batches.append(sorted(order[cut[j]:j]))
        j = cut[j]
    return batches[::-1]
