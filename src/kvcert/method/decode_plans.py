"""A cache layer's decode steps on the fused kernel, through plans made once (FlashInfer's plan / run split).

Every decode step of a layer launches the same kernels over the same storage; only the query and the
number of slots in use change, and the slot count is a device tensor the kernel reads. So the launches are
planned once per (layer storage, centre, sketch, statistics buffer, what is computed) —
:func:`kvcert_kernels.certified_decode.decode_plan` over the layer's whole capacity, its slots in use in
``CompactLayer.lengths_on_device``, its cached 1 − π and ‖v − c‖, and the recorder's statistics buffer at
its device step index — and each step runs the plan over its query (:class:`kvcert_kernels.launch.DecodePlan`:
the compiled kernels' own launchers, nothing allocated, nothing read back). A compaction, a growth of the
storage, a new centre or sketch, or a grown statistics buffer makes a new plan.
"""

from __future__ import annotations

import torch

from .attention import decode_kernel_module


class _Planned:
    """A plan and what it was made over (compared by identity at every step)."""

    __slots__ = ("plan", "deps")

    def __init__(self, plan, deps: tuple):
        self.plan, self.deps = plan, deps

    def holds(self, deps: tuple) -> bool:
        return len(deps) == len(self.deps) and all(a is b for a, b in zip(deps, self.deps))


def kernel_decode(layer, layer_idx: int, num_layers: int, query: torch.Tensor, scaling: float, certify: bool,
                  entropy: bool, recorder) -> torch.Tensor:
    """The output [B, Hq, 1, DV] of one decode step of ``layer`` (a :class:`~kvcert.method.cache.CompactLayer`
    whose new token is appended) on the fused kernel; its certificate (``certify``) and attention entropy
    (``entropy``) go to ``recorder``'s buffer, written by the kernel at the device step index."""
    b, hq = query.shape[:2]
    stats = index = None
    if certify or entropy:
        stats, index = recorder.kernel_stats(layer_idx, num_layers, b, hq, query.device, certify, entropy)
    sketch = layer.sketch if certify else None
    deps = (layer._k, layer._v, layer._lp, layer.centre if certify else None, sketch, scaling,
            None if stats is None else recorder.buffer.data, index)
    plans = layer.__dict__.setdefault("_decode_plans", {})
    key = (certify, entropy)
    planned = plans.get(key)
    if planned is None or not planned.holds(deps):
        planned = plans[key] = _Planned(_plan(layer, query, scaling, certify, entropy, sketch, stats, index), deps)
    try:
        return planned.plan.run(query)[0]
    except decode_kernel_module().QueryMismatch:  # a query of another layout: a plan of its own
        planned = plans[key] = _Planned(_plan(layer, query, scaling, certify, entropy, sketch, stats, index), deps)
        return planned.plan.run(query)[0]


def _plan(layer, query, scaling, certify, entropy, sketch, stats, index):
    kernels = decode_kernel_module()
    b, hkv = layer._k.shape[:2]
    lengths = layer.lengths_on_device().expand(b, hkv)
    aux = dict(one_minus=layer._om, dev=layer._dev) if certify else {}
    return kernels.decode_plan(query, layer._k, layer._v, layer._lp, layer.centre if certify else None, scaling,
                               lengths, certify, sketch=sketch, entropy=entropy, stats=stats, step=index, **aux)
