"""Launching the decode kernels: one launch as planned, a plan that is launched many times, and an emulated GPU.

A decode step of one layer launches the same kernels with the same arguments every step but the query, so
the work of deciding them — the launch configuration, the split count, the buffers, the argument list of
87 and 59 values, Triton's binder that specialises them — belongs to a plan made once
(:class:`DecodePlan`, FlashInfer's ``plan()`` / ``run()`` split), not to every call:

* :class:`Launch` is one launch as :func:`kvcert_kernels.certified_decode.plan_decode` plans it:
  ``kernel[grid](*args, **kwargs)``;
* :class:`DecodePlan` holds a decode's launches and the buffers they fill. Its first :meth:`~DecodePlan.run`
  goes through Triton's JIT (which compiles or finds the kernel and specialises the arguments); every later
  one hands the compiled kernel's own launcher the argument list it built then, with the query swapped in
  (nothing else can change: the cache's storage, lengths and step index are device tensors the plan
  points at). A query whose layout or alignment differs from the planned one is refused (the compiled
  kernel is specialised for it): the caller makes a new plan;
* :func:`emulating` plans and "launches" as on a GPU this machine does not have: launches go to a recorder
  instead of a device, and the split policy sizes the grid for the emulated multiprocessors. It is how
  ``kvcert bench host`` measures the host's work per call and per step on a CPU.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Launch:
    """One kernel launch: ``kernel[grid](*args, **kwargs)`` (kwargs: constexprs, num_warps, num_stages).
    Argument 0 of every decode launch is the query."""

    kernel: object
    grid: tuple
    args: tuple
    kwargs: dict

    def __call__(self):
        if _EMULATION is not None:
            return _EMULATION.record(self)
        return self.kernel[self.grid](*self.args, **self.kwargs)

    def with_query(self, query) -> "Launch":
        """The same launch over another query (argument 0)."""
        return Launch(self.kernel, self.grid, (query,) + self.args[1:], self.kwargs)


@dataclass(frozen=True)
class Emulation:
    """A GPU emulated for planning: its compute capability, its streaming multiprocessors, and where launches
    go instead of a device (a callable taking the :class:`Launch`)."""

    arch: int
    sms: int
    record: Callable[[Launch], object]


_EMULATION: Emulation | None = None


def emulation() -> Emulation | None:
    """The emulated GPU in force (:func:`emulating`), or None."""
    return _EMULATION


@contextlib.contextmanager
def emulating(arch: int = 90, sms: int = 132, record: Callable[[Launch], object] | None = None):
    """Plan and launch, on any device, as on a GPU of compute capability ``arch`` with ``sms`` streaming
    multiprocessors (default: an H100 / H200), every launch handed to ``record`` instead of a device (default:
    dropped). Nothing is computed: the buffers the launches would fill keep what they held."""
    global _EMULATION
    previous = _EMULATION
    _EMULATION = Emulation(int(arch), int(sms), record or (lambda launch: None))
    try:
        yield _EMULATION
    finally:
        _EMULATION = previous


class QueryMismatch(ValueError):
    """A query of another layout (shape, strides, dtype, device) or alignment than the plan's."""


def _layout(t) -> tuple:
    return (tuple(t.shape), t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)


class DecodePlan:
    """The launches of one decode (:func:`~kvcert_kernels.certified_decode.plan_decode`) and the buffers they
    fill (``results``), launched once per :meth:`run` with the query swapped in.

    The plan's tensors (cache storage, lengths, log π, the step index, the statistics buffers) are read by
    the kernels at launch time, so a plan stays valid while they live at the same addresses: a cache makes a
    new plan when it reallocates them. Two runs with the same query launch the same grids with the same
    pointers and shapes, allocate nothing and read nothing back: a run can be captured in a CUDA graph."""

    def __init__(self, launches: list[Launch], results: tuple):
        self.launches = tuple(launches)
        self.results = results
        self.query = self.launches[0].args[0]
        self._layout = _layout(self.query)
        self._fast: list | None = None  # per launch: the compiled kernel's launcher and what it is handed

    def run(self, query=None) -> tuple:
        """Launch the plan over ``query`` (None: the planned one); returns :attr:`results`."""
        if query is not None and query is not self.query:
            if _layout(query) != self._layout:
                raise QueryMismatch("decode plan: the query's layout or alignment differs from the planned one")
        else:
            query = self.query
        fast = self._fast
        if fast is not None and _EMULATION is None:
            stream = _current_stream()
            for launcher, gx, gy, gz, function, packed, rest in fast:
                launcher(gx, gy, gz, stream, function, packed, None, None, None, query, *rest)
            return self.results
        if _EMULATION is not None:
            for launch in self.launches:
                _EMULATION.record(launch if query is self.query else launch.with_query(query))
            return self.results
        compiled = []
        for launch in self.launches:
            launch = launch if query is self.query else launch.with_query(query)
            compiled.append(launch.kernel[launch.grid](*launch.args, **launch.kwargs))
        self._fast = _fast_launches(self.launches, compiled)
        return self.results


def _current_stream():
    from triton.runtime import driver

    active = driver.active
    return active.get_current_stream(active.get_current_device())


def _fast_launches(launches, compiled) -> list | None:
    """Per launch, what the compiled kernel's launcher is handed: the launcher, the 3-d grid, the loaded
    function, the packed metadata and the bound argument values after the query, in the kernel's parameter
    order (constexprs included, as Triton's JIT hands them to it); None where a launch has no compiled kernel
    to call directly (Triton's interpreter), or launch hooks are set (they need Triton's own launch path)."""
    from triton import knobs

    if knobs.runtime.launch_enter_hook is not None or knobs.runtime.launch_exit_hook is not None:
        return None
    out = []
    for launch, kernel in zip(launches, compiled):
        if kernel is None or not hasattr(kernel, "packed_metadata"):
            return None
        names = launch.kernel.arg_names
        values = dict(zip(names, launch.args))
        for name in names[len(launch.args):]:
            if name not in launch.kwargs:
                return None  # a parameter with a default: leave it to the JIT's binder
            values[name] = launch.kwargs[name]
        gx, gy, gz = tuple(launch.grid) + (1,) * (3 - len(launch.grid))
        out.append((kernel.run, gx, gy, gz, kernel.function, kernel.packed_metadata,
                    tuple(values[name] for name in names[1:])))
    return out


__all__ = ["DecodePlan", "Emulation", "Launch", "QueryMismatch", "emulating", "emulation"]
