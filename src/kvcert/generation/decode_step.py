"""A greedy decode step in buffers that stay put, run eagerly or replayed from a CUDA graph.

A decode step of a batch of rows is the model's forward over the rows' last tokens, then each row's greedy
token, its log-probability, whether the logits were finite, and the next-token signals (entropy, top-2 margin).
:class:`DecodeStep` keeps its inputs (the last tokens, their positions) and its one output (``out``, [5, rows]
float64) in tensors made once: the step's forward writes the greedy tokens into its own input and advances the
positions on the device, and the host reads ``out`` once per step. Over a cache whose decode steps take the fused
kernel's plans (a :class:`~kvcert.method.cache.CertifiedCache` with ``static_decode``, on a GPU), every step then
launches the same work at the same addresses, which is what a CUDA graph needs.

With ``graph=True`` on a CUDA device (:class:`CudaGraph`) the step is captured once (after ``warmup`` eager steps, which make the
kernels' plans and buffers) with ``torch.cuda.CUDAGraph`` and replayed: the host runs nothing of the model, only
the host's side of the step (:meth:`~kvcert.method.cache.CompactLayer.advance`: the counts of slots in use and
tokens seen; the recorder's mark of which layers recorded). Capturing runs the step's Python without running its
device work, so the host's side of that one pass is undone after the capture. A step the captured graph cannot
serve — a cache or statistics buffer that must grow first — runs eagerly and the next one is captured anew.
The generation path asks for it with ``KVCERT_DECODE_GRAPH=1`` (:func:`decode_graph`: another value than 0 or 1
refused in one line; 1 without a CUDA device ignored, and said once).
"""

from __future__ import annotations

import os
import sys

import torch

#: the rows of :attr:`DecodeStep.out`
TOKEN, LOGPROB, FINITE, ENTROPY, MARGIN = range(5)

#: the environment variable that turns the replayed step on (``1``) or off (``0``, the default)
GRAPH_ENV = "KVCERT_DECODE_GRAPH"
_said_no_cuda = False


def graph_env() -> bool:
    """Whether :data:`GRAPH_ENV` asks for replayed steps: ``1`` yes, ``0`` (or unset, or empty) no; any other value
    (``yes``, ``true``, ``2``) is refused in one line, where it used to be silently off."""
    value = os.environ.get(GRAPH_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{GRAPH_ENV}={value}: must be 1 (decode steps replayed from a CUDA graph on a GPU) or 0 "
                         f"(every step eager, the default); give {GRAPH_ENV}=1 or unset it")
    return value == "1"


def decode_graph(device) -> bool:
    """:func:`graph_env` on ``device``: ``1`` on a device that is not CUDA is ignored, and said once per process on
    stderr (a CUDA graph needs a GPU; the steps run eagerly, the same records)."""
    global _said_no_cuda
    wanted = graph_env()
    if wanted and torch.device(device).type != "cuda":
        if not _said_no_cuda:
            print(f"{GRAPH_ENV}=1 ignored: no CUDA device (the decode steps run eagerly on {device})", file=sys.stderr,
                  flush=True)
            _said_no_cuda = True
        return False
    return wanted


class DecodeStep:
    """One greedy decode step of ``cache``'s rows (module docstring). ``tokens``: each row's last token (the next
    step's input); ``position``: the position of that token (the tokens the rows have seen before it)."""

    def __init__(self, model, cache, tokens: list[int], position: int, device, graph=False, warmup: int = 2):
        self.model, self.cache = model, cache
        self.input = torch.tensor(tokens, dtype=torch.long, device=device).unsqueeze(-1)
        self.position = torch.full((len(tokens), 1), position, dtype=torch.long, device=device)
        self.out = torch.zeros(5, len(tokens), dtype=torch.float64, device=device)
        self.logits: torch.Tensor | None = None
        # what captures and replays: a CUDA graph on a CUDA device (graph=True), or a factory of objects with
        # capture(fn) and replay() (the tests' emulated graph on a CPU); None: every step eager
        if graph is True:
            graph = CudaGraph if torch.device(device).type == "cuda" else None
        if graph and not getattr(cache, "static_decode", False):
            raise ValueError("decode step: a replayed step needs a cache whose decode steps all take the kernel's plans "
                             "(CertifiedCache(static_decode=True)); SDPA over the slots in use changes shape every step")
        self.graph_factory = graph or None
        self.warmup = warmup
        self.steps = 0
        self._graph = None
        self._mark = None

    def reset(self, tokens: list[int], position: int) -> None:
        """Start again from these last tokens at this position (in place: a captured graph keeps serving)."""
        self.input.copy_(torch.tensor(tokens, dtype=torch.long).unsqueeze(-1))
        self.position.fill_(position)

    @property
    def replaying(self) -> bool:
        """Whether the steps now replay a captured graph."""
        return self._graph is not None

    def forward(self) -> None:
        """The step's device work (module docstring): nothing is read back."""
        from .signals import next_token_signals

        logits = self.model(input_ids=self.input, position_ids=self.position, cache=self.cache, use_cache=True,
                            logits_to_keep=1).logits[:, -1]
        self.logits = logits
        self.position.add_(1)
        lp = torch.log_softmax(logits.float(), dim=-1)
        best = lp.argmax(-1)
        picked = lp.gather(-1, best.unsqueeze(-1)).squeeze(-1)
        signals = next_token_signals(lp).to(torch.float64)
        self.input.copy_(best.unsqueeze(-1))
        torch.stack((best.to(torch.float64), picked.to(torch.float64), torch.isfinite(logits).all(-1).to(torch.float64),
                     signals[:, 0], signals[:, 1]), out=self.out)

    def __call__(self) -> list[list[float]]:
        """Run the step (eagerly, or replayed from its graph) and read its output: the step's one read."""
        if self.graph_factory is not None and self._replayable():
            if self._graph is None and self.steps >= self.warmup:
                self._capture()
            if self._graph is not None:
                self._graph.replay()
                self._advance_host()
                self.steps += 1
                return self.out.tolist()
        self._graph = None  # a step the graph cannot serve: eager, and a new capture later
        self.forward()
        self.steps += 1
        return self.out.tolist()

    # --- the graph ------------------------------------------------------------------------------
    def _replayable(self) -> bool:
        """Whether the next step fits what is allocated: a slot in every layer and a row in the statistics buffer
        (a replay cannot grow them: it would write past them)."""
        cache = self.cache
        if any(layer.length + 1 > layer.capacity for layer in cache.layers):
            return False
        buffer = cache.recorder.buffer
        return buffer is None or cache.recorder.step < buffer.capacity

    def _capture(self) -> None:
        """Capture the step: its Python runs, its device work is recorded, not done; the host's side of that pass
        is undone (the replays do it)."""
        cache = self.cache
        state = host_state(cache)
        graph = self.graph_factory()
        graph.capture(self.forward)
        marks = cache.recorder.marks
        self._mark = marks[-1] if len(marks) > state.marks else None
        restore_host_state(cache, state)
        self._graph = graph

    def _advance_host(self) -> None:
        """The host's side of a replayed step (what an eager one does on the host)."""
        cache = self.cache
        for layer in cache.layers:
            layer.advance(1)
        if self._mark is not None:
            cache.recorder.marks.append(self._mark)
        cache.peak_nbytes = max(cache.peak_nbytes, cache.nbytes())


class CudaGraph:
    """``torch.cuda.CUDAGraph`` as :class:`DecodeStep` captures and replays: captured on a side stream (the
    allocations of the captured work in the graph's own pool), replayed on the current stream."""

    def __init__(self):
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, fn) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph, stream=side):
            fn()
        torch.cuda.current_stream().wait_stream(side)

    def replay(self) -> None:
        self.graph.replay()


class HostState:
    """What a decode forward changes on the host: each layer's counts (slots in use, tokens seen, undecided), the
    recorder's marks, the cache's peak bytes."""

    def __init__(self, cache):
        self.layers = [(layer.length, layer.seen, layer.undecided) for layer in cache.layers]
        self.marks = len(cache.recorder.marks)
        self.peak = cache.peak_nbytes


def host_state(cache) -> HostState:
    return HostState(cache)


def restore_host_state(cache, state: HostState) -> None:
    """Put the host's side back as ``state`` found it (the device's is left as it is)."""
    for layer, counts in zip(cache.layers, state.layers):
        layer.set_counts(*counts)
    del cache.recorder.marks[state.marks:]
    cache.peak_nbytes = state.peak
