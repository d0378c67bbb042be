"""A CUDA graph's semantics on a CPU, for the tests of the graph-replayed decode step (tests/test_decode_step.py).

:class:`EmulatedGraph` has the two methods :class:`kvcert.generation.decode_step.DecodeStep` asks of a graph:

* ``capture(fn)`` runs ``fn`` recording every tensor operation it dispatches (with the very argument objects,
  and the tensors each made) and every fused-kernel launch (through ``kvcert_kernels.launch.emulating``, whose
  recorder :func:`launcher` runs each launch in Triton's interpreter and logs it), then puts back every tensor
  that outlives the step (weights, cache, plans, the step's buffers): like a CUDA capture, it leaves the device
  as it found it;
* ``replay()`` re-runs the record in order over the same objects: an operation that made a tensor writes its new
  result into that tensor (what later operations read, as a graph's own allocations), an in-place one mutates
  its arguments again, a view is not re-run (it aliases the same storage), a launch is launched again.

Numbers fixed at capture stay fixed — a host value baked into an operation replays as it was, which is exactly
what breaks a step that is not graph-safe.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

_ACTIVE: list = []  # the records being captured into (the launcher logs launches there)
#: operations that only allocate (their contents undefined): a graph keeps the captured allocation
_ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


def launcher(launch) -> None:
    """``emulating``'s recorder: run the launch (Triton's interpreter) and log it into the capture in progress."""
    launch.kernel[launch.grid](*launch.args, **launch.kwargs)
    if _ACTIVE:
        _ACTIVE[-1].append(("launch", launch))


class _Record(TorchDispatchMode):
    def __init__(self, record: list):
        super().__init__()
        self.record = record

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {a.untyped_storage().data_ptr() for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        made = [t.untyped_storage().data_ptr() not in inputs for t in outs]
        if func.is_view and not any(made):
            return out
        # the containers rebuilt (a size list the caller reuses must not change the record), tensors by reference
        args, kwargs = tree_map(lambda x: x, (args, kwargs))
        self.record.append(("op", (func, args, kwargs, outs, made)))
        return out


class EmulatedGraph:
    """See the module docstring. ``static``: a function giving the tensors that outlive a step (put back after
    the capture)."""

    def __init__(self, static):
        self.static = static
        self.record: list = []

    def capture(self, fn) -> None:
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in self.static()}
        saved = [(storage, storage.clone()) for storage in storages.values()]
        _ACTIVE.append(self.record)
        try:
            with _Record(self.record):
                fn()
        finally:
            _ACTIVE.pop()
        for storage, copy in saved:
            storage.copy_(copy)

    def replay(self) -> None:
        for kind, payload in self.record:
            if kind == "launch":
                payload.kernel[payload.grid](*payload.args, **payload.kwargs)
                continue
            func, args, kwargs, outs, made = payload
            if func.overloadpacket.__name__ in _ALLOCATIONS:  # uninitialised memory: the captured tensor serves
                continue
            result = func(*args, **kwargs)
            for target, value, new in zip(outs, [t for t in tree_leaves(result) if isinstance(t, torch.Tensor)], made):
                if new and value is not target:
                    if value.shape != target.shape:
                        raise RuntimeError(f"replay: {func} made {tuple(value.shape)} where the capture made "
                                           f"{tuple(target.shape)}: a shape that depends on the data is no graph's")
                    target.copy_(value)
