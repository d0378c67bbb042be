"""Forking one prefill into many compressed caches, and decoding them as one batch.

Eviction happens right after each layer's attention (:class:`~kvcert.cache.CertifiedCache`),
so the hidden states of a prefill do not depend on the budget or the method: every
eviction variant of one prompt can be *forked* from a single prefill. A
:class:`ForkingCache` prefills the prompt over the full cache and, after each layer's
attention, its schedule (:class:`ForkSchedule`) hands that layer's observation to every :class:`Branch`: the branch copies
the layer's first ``end`` slots (the context, for the streaming condition; every
prefilled slot, for question-aware eviction) and compacts the copy with its own press,
exactly as a single run's armed press compacts its layer (same observation, sliced to
the branch's prefix; same generator seed and round).

The forks share their prompt, hence their RoPE positions; they differ only in which
tokens each (layer, KV head) kept. :func:`stack_layers` lays them out as the rows of one
batch — the ragged layout the cache already has between KV heads, extended to rows: each
row padded to the longest, padding slots with log π = +inf (attention bias −inf) — and
:func:`take_rows` drops the rows that finished, repacking the survivors so a finished
long row (the full cache) costs nothing more; :func:`width_buckets` splits rows of very
different widths (the full cache among compressed ones) into batches where padding the
short rows would cost more than one more forward.

Per row, the layer keeps what a single run's layer would report: whether the row has a
sampled tail (:attr:`CompactLayer.row_tail`, which layers certify that row), its sketch
bytes, and its own padded length (:func:`row_nbytes`), so records of a batched run carry
the same ``kv_bytes_*`` and ``sketch_bytes`` as the batch-1 run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .cache import CertifiedCache, CompactLayer
from .design import pack
from .scorers.base import LayerObservation
from .sketch import EvictionSketch


@dataclass
class Branch:
    """One eviction variant forked from a shared prefill.

    press: its :class:`~kvcert.press.EvictionPress`; end: how many prefilled slots it
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


def fork_layer(layer: CompactLayer, end: int) -> CompactLayer:
    """A batch-1 layer holding the first ``end`` slots of an uncompressed ``layer``.

    Its storage views the shared layer's (capacity exactly ``end``): compaction gathers
    into new storage and any append reallocates, so the shared layer is never written.
    """
    if layer.compactions or layer.length < end:
        raise ValueError("fork_layer: forks start from an uncompressed layer holding the prefix")
    out = CompactLayer(reserve=layer.reserve, growth=layer.growth)
    out.device = layer.device
    out._k, out._v = layer._k[:, :, :end], layer._v[:, :, :end]
    out._lp, out._om, out._dev = layer._lp[:, :, :end], layer._om[:, :, :end], layer._dev[:, :, :end]
    out.length = out.seen = out.undecided = end
    out.kept = torch.full_like(layer.kept, end)
    out.is_initialized = True
    out._refresh_views()
    return out


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
    counterpart of :class:`kvcert.schedule.PressSchedule`, which compresses the layer itself)."""

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
        per_slot = layer._k.shape[1] * layer.slot_nbytes()  # all KV heads
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
            branch.peak_nbytes = max(branch.peak_nbytes, branch.nbytes() + layer._k.shape[0] * per_slot * branch.end)
            fork = fork_layer(layer, branch.end)
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


def _row_tail(layer: CompactLayer) -> torch.Tensor:
    if layer.log_pi is None:
        return torch.zeros(layer._k.shape[0], dtype=torch.bool)
    lp = layer.log_pi
    return ((lp < 0) & torch.isfinite(lp)).flatten(1).any(-1).cpu()


def _row_sketch_bytes(layer: CompactLayer) -> list[int]:
    b = layer._k.shape[0]
    if getattr(layer, "row_sketch_bytes", None) is not None:
        return list(layer.row_sketch_bytes)
    per_row = layer.sketch_nbytes() // b if layer.sketch is not None else 0
    return [per_row] * b


def _stack_sketches(layers: list[CompactLayer]) -> EvictionSketch | None:
    if all(layer.sketch is None for layer in layers):
        return None
    first = next(layer for layer in layers if layer.sketch is not None).sketch
    slots = max(layer.sketch.slots for layer in layers if layer.sketch is not None)
    parts = []
    for layer in layers:
        b, h = layer._k.shape[:2]
        s = layer.sketch
        d = first.codes.shape[-1]
        dev = first.codes.device
        if s is None:
            z = torch.zeros(b, h, slots, device=dev)
            s = EvictionSketch(torch.zeros(b, h, slots, d, dtype=torch.int8, device=dev), z, z.clone(), z.clone(),
                               torch.full_like(z, float("-inf")), torch.zeros(b, h, dtype=torch.long, device=dev))
        elif s.slots < slots:
            pad = slots - s.slots
            grow = lambda t, value=0.0: torch.nn.functional.pad(t, (0, pad), value=value)  # noqa: E731
            s = EvictionSketch(torch.nn.functional.pad(s.codes, (0, 0, 0, pad)), grow(s.scale), grow(s.key_error),
                               grow(s.value_dev), grow(s.potential, float("-inf")), s.count)
        parts.append(s)
    return EvictionSketch(*(torch.cat([getattr(p, name) for p in parts], 0)
                            for name in ("codes", "scale", "key_error", "value_dev", "potential", "count")))


def stack_layers(layers: list[CompactLayer], room: int = 0) -> CompactLayer:
    """One layer whose batch rows are the rows of ``layers`` (same heads and dims).

    Each row is padded at the end to the longest row (log π = +inf, 1 − π = 0, ‖v − c‖ = 0),
    with ``room`` more padded slots for the feeds of :func:`row_view`. Rows that have seen
    different numbers of tokens (streaming forks: the context; aware: the prompt minus
    one) are stacked for row views to catch up; the stack itself needs one seen length.
    """
    first = layers[0]
    width = max(layer.length for layer in layers)
    out = CompactLayer(reserve=first.reserve, growth=first.growth)
    out.device = first.device
    rows = sum(layer._k.shape[0] for layer in layers)
    h, d, dv = first._k.shape[1], first._k.shape[-1], first._v.shape[-1]
    out._allocate(rows, h, width + room + first.reserve, d, first._k.dtype, dv)
    out._lp.fill_(float("inf"))
    r = 0
    for layer in layers:
        b, n = layer._k.shape[0], layer.length
        out._k[r : r + b, :, :n] = layer.keys
        out._v[r : r + b, :, :n] = layer.values
        out._k[r : r + b, :, n : width + room].zero_()  # padding: finite keys and values (weight e^{-inf} = 0)
        out._v[r : r + b, :, n : width + room].zero_()
        out._lp[r : r + b, :, :n] = layer.log_pi
        out._om[r : r + b, :, :n] = layer.one_minus
        out._dev[r : r + b, :, :n] = layer.dev
        r += b
    out.length = width
    out.row_length = [layer.length for layer in layers for _ in range(layer._k.shape[0])]
    out.row_seen = [layer.seen for layer in layers for _ in range(layer._k.shape[0])]
    out.seen = first.seen if len(set(out.row_seen)) == 1 else None
    out.undecided = 0
    out.kept = torch.cat([layer.kept for layer in layers], 0)
    centres = [layer.centre if layer.centre is not None
               else torch.zeros(layer._k.shape[0], h, dv, dtype=torch.float32, device=first.device) for layer in layers]
    out.centre = torch.cat([c.to(torch.float32) for c in centres], 0)
    out.sketch = _stack_sketches(layers)
    out.row_tail = torch.cat([getattr(layer, "row_tail", None) if getattr(layer, "row_tail", None) is not None
                              else _row_tail(layer) for layer in layers])
    out.row_sketch_bytes = [n for layer in layers for n in _row_sketch_bytes(layer)]
    out.compactions = max(layer.compactions for layer in layers)
    out.is_initialized = True
    out._refresh_views()
    _flags(out)
    return out


def row_view(layer: CompactLayer, start: int, stop: int) -> CompactLayer:
    """Rows [start, stop) of a stacked layer as a layer of their own whose storage *is* the stack's:
    what a forward appends to the view lands in the stack (within the stack's room)."""
    seen = set(layer.row_seen[start:stop])
    if len(seen) != 1:
        raise ValueError(f"row_view: rows have seen different numbers of tokens {sorted(seen)}")
    view = CompactLayer(reserve=layer.reserve, growth=layer.growth)
    view.device = layer.device
    for name in ("_k", "_v", "_lp", "_om", "_dev"):
        setattr(view, name, getattr(layer, name)[start:stop])
    view.length = max(layer.row_length[start:stop])
    view.seen = seen.pop()
    view.kept = layer.kept[start:stop].clone()
    view.centre = layer.centre[start:stop]
    idx = torch.arange(start, stop, device=layer.device)
    view.sketch = None if layer.sketch is None else layer.sketch.index_select(idx)
    view.row_tail = layer.row_tail[start:stop]
    view.row_sketch_bytes = layer.row_sketch_bytes[start:stop]
    view.compactions = layer.compactions
    view.is_initialized = True
    view._refresh_views()
    _flags(view)
    return view


def join_views(layer: CompactLayer, views: list[CompactLayer]) -> None:
    """Take back the rows of ``views`` (in order, covering the stack) after their forwards (in place)."""
    if any(view._k.untyped_storage().data_ptr() != layer._k.untyped_storage().data_ptr() for view in views):
        raise ValueError("join_views: a view outgrew the stack's room (its storage was reallocated)")
    seen = {view.seen for view in views}
    if len(seen) != 1:
        raise ValueError(f"join_views: the views have seen different numbers of tokens {sorted(seen)}")
    layer.seen = seen.pop()
    layer.row_seen = [layer.seen] * layer._k.shape[0]
    layer.length = max(view.length for view in views)
    layer.row_length = [layer.length] * layer._k.shape[0]
    layer.kept = torch.cat([view.kept for view in views], 0)
    layer._refresh_views()
    _flags(layer)


def _flags(layer: CompactLayer) -> None:
    layer.has_tail = bool(layer.row_tail.any())
    layer.has_padding = bool(torch.isinf(layer.log_pi).any())


def take_rows(layer: CompactLayer, rows: list[int], repack: float = 0.75) -> CompactLayer:
    """A new layer of batch ``rows`` of a stacked layer; when the longest of them needs under
    ``repack`` of the slots in use, they are repacked to it (a finished long row — the full
    cache — leaves no padding behind)."""
    idx = torch.tensor(rows, dtype=torch.long, device=layer.device)
    k, v = layer.keys.index_select(0, idx), layer.values.index_select(0, idx)
    lp, om, dev = (t.index_select(0, idx) for t in (layer.log_pi, layer.one_minus, layer.dev))
    b, h, n = lp.shape
    kept = layer.kept.index_select(0, idx)
    if int(kept.max()) < repack * n:
        keep = torch.isfinite(lp).reshape(b * h, n)
        packed = pack(keep, None, (b, h))
        valid = packed.valid
        gather = lambda t: t.gather(2, packed.indices)  # noqa: E731
        gather_d = lambda t: t.gather(2, packed.indices.unsqueeze(-1).expand(-1, -1, -1, t.shape[-1]))  # noqa: E731
        k, v = gather_d(k), gather_d(v)
        lp = torch.where(valid, gather(lp), float("inf"))
        om, dev = torch.where(valid, gather(om), 0.0), torch.where(valid, gather(dev), 0.0)
    width = lp.shape[-1]
    out = CompactLayer(reserve=layer.reserve, growth=layer.growth)
    out.device = layer.device
    out._allocate(b, h, width + layer.reserve, k.shape[-1], k.dtype, v.shape[-1])
    out._k[:, :, :width], out._v[:, :, :width] = k, v
    out._lp[:, :, :width], out._om[:, :, :width], out._dev[:, :, :width] = lp, om, dev
    out.length, out.seen, out.undecided, out.compactions = width, layer.seen, 0, layer.compactions
    out.kept = kept
    out.centre = None if layer.centre is None else layer.centre.index_select(0, idx)
    out.sketch = None if layer.sketch is None else layer.sketch.index_select(idx)
    out.row_tail = layer.row_tail.index_select(0, idx.cpu())
    out.row_length, out.row_seen = [width] * len(rows), [layer.seen] * len(rows)
    out.row_sketch_bytes = [layer.row_sketch_bytes[i] for i in rows]
    if out.sketch is not None and not bool((out.sketch.count > 0).any()):
        out.sketch = None  # no row of these has a shadow (top-k rows, the full cache)
    out.is_initialized = True
    out._refresh_views()
    _flags(out)
    return out


def row_nbytes(layer: CompactLayer, row: int) -> int:
    """The bytes a batch-1 run's layer holding only ``row`` would report (:meth:`CompactLayer.nbytes`):
    its own padded length (its longest KV head) and its own sketch."""
    return layer._k.shape[1] * int(layer.kept[row].max()) * layer.slot_nbytes() + layer.row_sketch_bytes[row]


def _cache(layers: list[CompactLayer], record_certificates: bool, record_entropy: bool = False) -> CertifiedCache:
    cache = CertifiedCache(record_certificates=record_certificates, record_entropy=record_entropy)
    cache.layers.extend(layers)
    cache.layer_class_to_replicate = None
    return cache


def stacked_cache(layer_lists: list[list[CompactLayer]], record_certificates: bool, room: int = 0,
                  record_entropy: bool = False) -> CertifiedCache:
    """A :class:`CertifiedCache` whose rows are the given caches' layers (one list per cache), stacked."""
    return _cache([stack_layers(list(per_layer), room) for per_layer in zip(*layer_lists)], record_certificates,
                  record_entropy)


def row_view_cache(cache: CertifiedCache, start: int, stop: int) -> CertifiedCache:
    """Rows [start, stop) of a stacked cache as a cache of their own (:func:`row_view`)."""
    return _cache([row_view(layer, start, stop) for layer in cache.layers], cache.recorder.certificates,
                  cache.recorder.entropy)


def join_view_caches(cache: CertifiedCache, views: list[CertifiedCache]) -> None:
    for i, layer in enumerate(cache.layers):
        join_views(layer, [view.layers[i] for view in views])


def take_cache_rows(cache: CertifiedCache, rows: list[int]) -> CertifiedCache:
    """A new cache of batch ``rows`` of a stacked cache (:func:`take_rows`)."""
    return _cache([take_rows(layer, rows) for layer in cache.layers], cache.recorder.certificates,
                  cache.recorder.entropy)


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
