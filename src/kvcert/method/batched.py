"""A batch of forked caches as one layer: :class:`BatchedLayer`, the rows of several compacted layers.

The forks of one prefill (:mod:`kvcert.method.fork`) share their prompt, hence their RoPE positions; they
differ only in which tokens each (layer, KV head) kept. :meth:`BatchedLayer.stack` lays them out
as the rows of one batch — the ragged layout :class:`~kvcert.method.cache.CompactLayer` already has
between KV heads, extended to rows: each row padded to the longest, padding slots with
log π = +inf (attention bias −inf) — :meth:`~BatchedLayer.row_view` gives a group of rows a layer
of its own over the same storage (a forward feeding only them), :meth:`~BatchedLayer.join` takes
them back, and :meth:`~BatchedLayer.take` drops the rows that finished, repacking the survivors so
a finished long row (the full cache) costs nothing more.

Per row, the layer keeps what a single run's layer would report: whether the row has a sampled
tail (``row_tail``: which layers certify that row), its sketch bytes (``row_sketch_bytes``), its
own padded length and tokens seen (``row_length``, ``row_seen``), and :meth:`~BatchedLayer.row_nbytes`,
so records of a batched run carry the same ``kv_bytes_*`` and ``sketch_bytes`` as the batch-1 run.
"""

from __future__ import annotations

import torch

from .cache import GROWTH, CompactLayer
from .design import pack
from .sketch import EvictionSketch


def _row_tail(layer: CompactLayer) -> torch.Tensor:
    if layer.log_pi is None:
        return torch.zeros(layer.keys.shape[0], dtype=torch.bool)
    lp = layer.log_pi
    return ((lp < 0) & torch.isfinite(lp)).flatten(1).any(-1).cpu()


def _row_sketch_bytes(layer: CompactLayer) -> list[int]:
    b = layer.keys.shape[0]
    if isinstance(layer, BatchedLayer):
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
        b, h = layer.keys.shape[:2]
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


class BatchedLayer(CompactLayer):
    """The rows of several compacted layers of the same heads and dims as one batch (module docstring)."""

    def __init__(self, reserve: int = 64, growth: float = GROWTH):
        super().__init__(reserve=reserve, growth=growth)
        self.row_length: list[int] = []  # per row: its own stored slots (its longest KV head)
        self.row_seen: list[int] = []  # per row: tokens seen
        self.row_tail = torch.zeros(0, dtype=torch.bool)  # per row: a kept token with π < 1
        self.row_sketch_bytes: list[int] = []  # per row: its eviction sketch's bytes

    @classmethod
    def stack(cls, layers: list[CompactLayer], room: int = 0) -> "BatchedLayer":
        """One layer whose batch rows are the rows of ``layers`` (same heads and dims).

        Each row is padded at the end to the longest row (log π = +inf, 1 − π = 0, ‖v − c‖ = 0),
        with ``room`` more padded slots for the feeds of :meth:`row_view`. Rows that have seen
        different numbers of tokens (streaming forks: the context; aware: the prompt minus
        one) are stacked for row views to catch up; the stack itself needs one seen length.
        """
        first = layers[0]
        width = max(layer.length for layer in layers)
        out = cls(reserve=first.reserve, growth=first.growth)
        out.device = first.device
        rows = sum(layer.keys.shape[0] for layer in layers)
        h, d, dv = first.keys.shape[1], first.keys.shape[-1], first.values.shape[-1]
        out._allocate(rows, h, width + room + first.reserve, d, first.keys.dtype, dv)
        out._lp.fill_(float("inf"))
        r = 0
        for layer in layers:
            b, n = layer.keys.shape[0], layer.length
            out._k[r : r + b, :, :n] = layer.keys
            out._v[r : r + b, :, :n] = layer.values
            out._k[r : r + b, :, n : width + room].zero_()  # padding: finite keys and values (weight e^{-inf} = 0)
            out._v[r : r + b, :, n : width + room].zero_()
            out._lp[r : r + b, :, :n] = layer.log_pi
            out._om[r : r + b, :, :n] = layer.one_minus
            out._dev[r : r + b, :, :n] = layer.dev
            r += b
        out.length = width
        out.row_length = [layer.length for layer in layers for _ in range(layer.keys.shape[0])]
        out.row_seen = [layer.seen for layer in layers for _ in range(layer.keys.shape[0])]
        out.seen = first.seen if len(set(out.row_seen)) == 1 else None
        out.undecided = 0
        out.kept = torch.cat([layer.kept for layer in layers], 0)
        centres = [layer.centre if layer.centre is not None
                   else torch.zeros(layer.keys.shape[0], h, dv, dtype=torch.float32, device=first.device) for layer in layers]
        out.centre = torch.cat([c.to(torch.float32) for c in centres], 0)
        out.sketch = _stack_sketches(layers)
        out.row_tail = torch.cat([layer.row_tail if isinstance(layer, BatchedLayer) else _row_tail(layer)
                                  for layer in layers])
        out.row_sketch_bytes = [n for layer in layers for n in _row_sketch_bytes(layer)]
        out.compactions = max(layer.compactions for layer in layers)
        out.is_initialized = True
        out._refresh_views()
        out.refresh_flags()
        return out

    def row_view(self, start: int, stop: int) -> "BatchedLayer":
        """Rows [start, stop) of a stacked layer as a layer of their own whose storage *is* the stack's:
        what a forward appends to the view lands in the stack (within the stack's room)."""
        seen = set(self.row_seen[start:stop])
        if len(seen) != 1:
            raise ValueError(f"row_view: rows have seen different numbers of tokens {sorted(seen)}")
        view = BatchedLayer(reserve=self.reserve, growth=self.growth)
        view.device = self.device
        for name in ("_k", "_v", "_lp", "_om", "_dev"):
            setattr(view, name, getattr(self, name)[start:stop])
        view.length = max(self.row_length[start:stop])
        view.seen = seen.pop()
        view.kept = self.kept[start:stop].clone()
        view.centre = self.centre[start:stop]
        idx = torch.arange(start, stop, device=self.device)
        view.sketch = None if self.sketch is None else self.sketch.index_select(idx)
        view.row_tail = self.row_tail[start:stop]
        view.row_sketch_bytes = self.row_sketch_bytes[start:stop]
        view.row_length = [view.length] * (stop - start)
        view.row_seen = [view.seen] * (stop - start)
        view.compactions = self.compactions
        view.is_initialized = True
        view._refresh_views()
        view.refresh_flags()
        return view

    def join(self, views: list["BatchedLayer"]) -> None:
        """Take back the rows of ``views`` (in order, covering the stack) after their forwards (in place)."""
        if any(view._k.untyped_storage().data_ptr() != self._k.untyped_storage().data_ptr() for view in views):
            raise ValueError("join: a view outgrew the stack's room (its storage was reallocated)")
        seen = {view.seen for view in views}
        if len(seen) != 1:
            raise ValueError(f"join: the views have seen different numbers of tokens {sorted(seen)}")
        self.seen = seen.pop()
        self.row_seen = [self.seen] * self._k.shape[0]
        self.length = max(view.length for view in views)
        self.row_length = [self.length] * self._k.shape[0]
        self.kept = torch.cat([view.kept for view in views], 0)
        self._refresh_views()
        self.refresh_flags()

    def take(self, rows: list[int], repack: float = 0.75) -> "BatchedLayer":
        """A new layer of batch ``rows`` of a stacked layer; when the longest of them needs under
        ``repack`` of the slots in use, they are repacked to it (a finished long row — the full
        cache — leaves no padding behind)."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        k, v = self.keys.index_select(0, idx), self.values.index_select(0, idx)
        lp, om, dev = (t.index_select(0, idx) for t in (self.log_pi, self.one_minus, self.dev))
        b, h, n = lp.shape
        kept = self.kept.index_select(0, idx)
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
        out = BatchedLayer(reserve=self.reserve, growth=self.growth)
        out.device = self.device
        out._allocate(b, h, width + self.reserve, k.shape[-1], k.dtype, v.shape[-1])
        out._k[:, :, :width], out._v[:, :, :width] = k, v
        out._lp[:, :, :width], out._om[:, :, :width], out._dev[:, :, :width] = lp, om, dev
        out.length, out.seen, out.undecided, out.compactions = width, self.seen, 0, self.compactions
        out.kept = kept
        out.centre = None if self.centre is None else self.centre.index_select(0, idx)
        out.sketch = None if self.sketch is None else self.sketch.index_select(idx)
        out.row_tail = self.row_tail.index_select(0, idx.cpu())
        out.row_length, out.row_seen = [width] * len(rows), [self.seen] * len(rows)
        out.row_sketch_bytes = [self.row_sketch_bytes[i] for i in rows]
        if out.sketch is not None and not bool((out.sketch.count > 0).any()):
            out.sketch = None  # no row of these has a shadow (top-k rows, the full cache)
        out.is_initialized = True
        out._refresh_views()
        out.refresh_flags()
        return out

    def row_nbytes(self, row: int) -> int:
        """The bytes a batch-1 run's layer holding only ``row`` would report (:meth:`CompactLayer.nbytes`):
        its own padded length (its longest KV head) and its own sketch."""
        return self._k.shape[1] * int(self.kept[row].max()) * self.slot_nbytes() + self.row_sketch_bytes[row]

    def refresh_flags(self) -> None:
        """``has_tail`` and ``has_padding`` from the rows (what the attention path reads)."""
        self.has_tail = bool(self.row_tail.any())
        self.has_padding = bool(torch.isinf(self.log_pi).any())
