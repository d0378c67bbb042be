"""``kvcert bench host``: the host's work of a GPU decode step, measured on a CPU (no GPU needed).

On a GPU a decode step of a small model is bound by what the host does around the kernels: Python, argument
building, one dispatch per tensor operation, and every value read back, each read a device synchronisation.
None of that needs the GPU to be measured: the GPU path's Python runs as it is on CPU tensors, with the
fused kernel's launches handed to a recorder (:func:`kvcert_kernels.launch.emulating`, an H100 / H200's 132
multiprocessors; the buffers they would fill stay zero) and the fused kernel's path taken on the CPU
(:func:`kvcert.method.attention.kernel_on_every_device`). Measured:

* ``host_us_per_call_cert`` / ``host_us_per_call_plain``: µs of host work per call of the fused kernel on a
  cache layer's decode step (:func:`kvcert.method.decode_plans.kernel_decode`: its plan found and run over the
  step's query), with and without the certificate, at the paper's shape: batch 1, 32k retained tokens, bf16,
  32 query / 8 KV heads of 128; the fastest of ``--repeats`` means over ``--calls`` calls;
* ``ops_per_step_topk`` / ``ops_per_step_cert`` and ``host_reads_per_step_cert``: tensor operations dispatched
  (counted with a ``TorchDispatchMode``) and values read back (``item``, ``tolist``, truth values: each a
  synchronisation on a GPU) per decode step of the one generation path
  (:func:`kvcert.generation.forked.generate`, a run alone) on SmolLM2-135M's shape at random init (30 layers,
  9 query / 3 KV heads of 64), a 1k-token prompt, SnapKV at 25 %, top-k and Poisson with its certificate: the
  difference between a generation of ``--steps`` + 4 tokens and one of 4, over ``--steps``;
* ``graph_safe``: 1 when two consecutive decode forwards of the certified cache (the model call alone) dispatch
  the same operations and launches with the same arguments — every tensor made before the step at the same
  address, offset, shape and strides, every tensor made within it in the same order (what a CUDA graph
  replays), every number equal — and read nothing back; else 0, and the first difference is printed;
* ``wave_eff_min_paper``: the least wave efficiency (programs / (waves × resident program slots)) of the fused
  kernel's split policy over the paper's models (their KV heads), batch 1, 8 and 13, 4k, 32k and 128k retained
  tokens, with and without the certificate, on 132 multiprocessors — where the grid can fill a wave at all.

Last line: ``host_us_per_call_cert=… host_us_per_call_plain=… ops_per_step_topk=… ops_per_step_cert=…
host_reads_per_step_cert=… graph_safe=… wave_eff_min_paper=…``.
"""

from __future__ import annotations

import time

#: the paper's kernel shape (the GPU check's): batch, retained tokens, query heads, KV heads, head size, dtype
PAPER_SHAPE = dict(batch=1, retained=32768, query_heads=32, kv_heads=8, head_dim=128, dtype="bfloat16")
#: SmolLM2-135M-Instruct's config.json (the real model of results/real), at random init
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, head_dim=64, max_position_embeddings=8192, rope_theta=100000.0,
               tie_word_embeddings=True)
SMS = 132  # an H100 / H200
WAVE_BATCHES = (1, 8, 13)  # 13: the study's fork width (the runs of one example)
WAVE_RETAINED = (4096, 32768, 131072)
BASE_STEPS = 4


# --- µs per call -------------------------------------------------------------------------------------------
def paper_layer(shape: dict = PAPER_SHAPE):
    """A cache layer of the paper's shape holding ``retained`` tokens with a sampled tail (values irrelevant: the
    launches are recorded, not run)."""
    import torch

    from ..method.cache import CompactLayer

    dtype = getattr(torch, shape["dtype"])
    b, hkv, n, d = shape["batch"], shape["kv_heads"], shape["retained"], shape["head_dim"]
    layer = CompactLayer(reserve=64)
    layer.update(torch.zeros(b, hkv, n, d, dtype=dtype), torch.zeros(b, hkv, n, d, dtype=dtype))
    layer._lp.fill_(-0.5)
    layer.centre = torch.zeros(b, hkv, d)
    layer.has_tail = True
    return layer


def us_per_call(certificate: bool, calls: int = 2000, repeats: int = 5, shape: dict = PAPER_SHAPE) -> float:
    """µs of host work per fused-kernel call of one layer's decode step (the module docstring)."""
    import torch

    from kvcert_kernels.launch import emulating

    from ..method.decode_plans import kernel_decode
    from ..method.recorder import StepRecorder

    layer = paper_layer(shape)
    q = torch.zeros(shape["batch"], shape["query_heads"], 1, shape["head_dim"], dtype=getattr(torch, shape["dtype"]))
    recorder = StepRecorder(certificates=certificate)
    scale = shape["head_dim"] ** -0.5
    best = float("inf")
    with emulating(sms=SMS), torch.inference_mode():
        recorder.begin_forward()
        kernel_decode(layer, 0, 1, q, scale, certificate, False, recorder)  # the plan, made once
        for _ in range(repeats):
            queries = [q.clone() for _ in range(8)]  # a new query each step, as a model makes
            t0 = time.perf_counter()
            for i in range(calls):
                kernel_decode(layer, 0, 1, queries[i & 7], scale, certificate, False, recorder)
            best = min(best, (time.perf_counter() - t0) / calls)
            recorder.begin_forward()
    return best * 1e6


# --- operations and reads per step ----------------------------------------------------------------------------
class Counter:
    """Counts the tensor operations dispatched and the values read back while active (a context manager)."""

    def __init__(self):
        self.ops = 0
        self.reads = 0

    def __enter__(self):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counter.ops += 1
                if func is torch.ops.aten._local_scalar_dense.default:
                    counter.reads += 1
                return func(*args, **(kwargs or {}))

        self._tolist = torch.Tensor.tolist

        def tolist(t, *a, **k):  # a CPU tensor's tolist dispatches nothing; on a GPU it is a copy and a sync
            counter.reads += 1
            return counter._tolist(t, *a, **k)

        torch.Tensor.tolist = tolist
        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        import torch

        self._mode.__exit__(*exc)
        torch.Tensor.tolist = self._tolist
        return False


def smollm2_model(seed: int = 0, layers: int | None = None):
    """A random-init model of SmolLM2-135M-Instruct's shape (``layers`` of its 30, default all), fp32, with kvcert
    attention."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..method.integration import enable_certified_attention

    torch.manual_seed(seed)
    config = dict(SMOLLM2, num_hidden_layers=layers or SMOLLM2["num_hidden_layers"])
    return enable_certified_attention(LlamaForCausalLM(LlamaConfig(**config)).eval())


def _engine(model, tokenizer, sampler: str, new_tokens: int):
    from ..generation.engine import Engine
    from ..generation.spec import GenerationSpec

    spec = GenerationSpec.from_dict({
        "model": {"name": "smollm2-shape", "path": "unused"}, "condition": "aware", "budget": 0.25, "seed": 0,
        "method": {"name": f"snapkv-{sampler}", "scorer": "snapkv", "sampler": sampler, "allocation": "uniform"},
        "max_new_tokens": new_tokens,
    })
    engine = Engine(model, tokenizer, spec)
    engine.eos = set()  # a random model's tokens: no end of sequence, every run decodes all its steps
    return engine


def per_step(model, tokenizer, record, sampler: str, steps: int) -> tuple[float, float]:
    """(operations, reads) per decode step of the generation path (the module docstring)."""
    import dataclasses

    from ..generation.forked import generate

    counts = []
    for n in (BASE_STEPS, BASE_STEPS + steps):
        rec = dataclasses.replace(record, metadata={**record.metadata, "max_new_tokens": n})
        engine = _engine(model, tokenizer, sampler, n)
        generate([engine], rec)  # warm: the plans and buffers of a first run
        with Counter() as c:
            out = generate([engine], rec)[0]
        assert len(out["tokens"]) == n, (sampler, len(out["tokens"]), n)
        counts.append((c.ops, c.reads))
    return (counts[1][0] - counts[0][0]) / steps, (counts[1][1] - counts[0][1]) / steps


def prompt_record(tokenizer, tokens: int = 1024):
    from ..tasks import generate as generate_task

    return generate_task("needle", tokenizer, n_examples=1, target_tokens=tokens, seed=0, answer_tokens=0)[0]


# --- graph safety -------------------------------------------------------------------------------------------
class StepTrace:
    """What a step dispatches, as a CUDA graph would replay it: each operation and launch with its arguments —
    the tensors that outlive the step (``static``: the storages of the weights, the cache, the plans' buffers,
    the step's own buffers) by address, offset, shape, strides and dtype; any other tensor by the order it first
    appears in (a graph's own allocations: the same from one replay to the next whatever their addresses) — and
    the values read back (a context manager). View operations do no device work and are left out: what they
    alias shows in the arguments of the work that reads it."""

    def __init__(self, static: set[int]):
        self.static = static
        self.events: list = []
        self.reads = 0

    def _sig(self, value):
        import torch

        if isinstance(value, torch.Tensor):
            ptr = value.untyped_storage().data_ptr()
            if ptr in self.static:
                where = ("static", ptr)
            elif ptr in self._made:  # the operation that last made this storage, and which of its outputs
                where = ("made", self._made[ptr])
            else:  # made where no operation shows (a factory inside a fused one): by first appearance
                where = ("unseen", self._unseen.setdefault(ptr, len(self._unseen)))
            return (where, value.storage_offset(), tuple(value.shape), value.stride(), value.dtype)
        if isinstance(value, (list, tuple)):
            return tuple(self._sig(v) for v in value)
        if isinstance(value, dict):
            return tuple(sorted((k, self._sig(v)) for k, v in value.items()))
        if isinstance(value, (int, float, bool, str, type(None))) or type(value).__name__ in ("dtype", "device", "layout"):
            return value
        return type(value).__name__

    def __enter__(self):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        from kvcert_kernels.launch import emulation

        trace = self
        self._made, self._unseen = {}, {}

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func is torch.ops.aten._local_scalar_dense.default:
                    trace.reads += 1
                signature = (str(func), trace._sig(args), trace._sig(kwargs))
                out = func(*args, **kwargs)
                inputs = {a.untyped_storage().data_ptr() for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
                made = [(j, t.untyped_storage().data_ptr()) for j, t in enumerate(tree_leaves(out))
                        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs]
                if func.is_view and not made:  # an alias: no device work (what it aliases shows where it is read)
                    return out
                for j, ptr in made:  # a new storage (not one written in place)
                    if ptr not in trace.static:
                        trace._made[ptr] = (len(trace.events), j)
                trace.events.append(signature)
                return out

        emulated = emulation()
        self._record, self._emulation = emulated.record, emulated
        object.__setattr__(emulated, "record", lambda launch: self.events.append(
            ("launch", getattr(launch.kernel, "__name__", str(launch.kernel)), launch.grid,
             ("query", self._sig(launch.args[0])[2:]), self._sig(launch.args[1:]), self._sig(launch.kwargs))))
        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        object.__setattr__(self._emulation, "record", self._record)
        return False


def static_storages(model, cache, step) -> set[int]:
    """The storages of :func:`static_tensors`."""
    return {t.untyped_storage().data_ptr() for t in static_tensors(model, cache, step)}


def static_tensors(model, cache, step) -> list:
    """The tensors that outlive a decode step: the model's weights and buffers, every tensor the cache's layers
    and recorder hold, every tensor argument of the layers' kernel plans, and the step's own buffers."""
    import torch

    tensors = list(model.parameters()) + list(model.buffers()) + [step.input, step.position, step.out]
    for layer in cache.layers:
        tensors += [t for t in vars(layer).values() if isinstance(t, torch.Tensor)]
        if layer.sketch is not None:
            tensors += [t for t in vars(layer.sketch).values() if isinstance(t, torch.Tensor)]
        for planned in vars(layer).get("_decode_plans", {}).values():
            tensors += [a for launch in planned.plan.launches for a in launch.args[1:] if isinstance(a, torch.Tensor)]
    buffer = cache.recorder.buffer
    if buffer is not None:
        tensors += [buffer.data] + ([buffer.index] if buffer.index is not None else [])
    return tensors


def first_difference(a: list, b: list) -> str | None:
    """Where two traces' events first differ (None: they are the same)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"event {i}: {str(x)[:300]} != {str(y)[:300]}"
    if len(a) != len(b):
        return f"{len(a)} events against {len(b)}"
    return None


def graph_safety(model, tokenizer, record) -> tuple[int, str]:
    """(1 or 0, what differed) for two consecutive decode steps of the certified cache (module docstring): the
    step of the generation path (:class:`~kvcert.generation.decode_step.DecodeStep`) over a cache whose decode
    steps take the kernel's plans (``static_decode``)."""
    from ..generation.decode_step import DecodeStep
    from ..method.cache import CertifiedCache
    from ..tasks.prompting import build_prompt_ids

    engine = _engine(model, tokenizer, "poisson", 8)
    ids, _ = build_prompt_ids(tokenizer, record)
    cache = CertifiedCache(reserve=16, static_decode=True)
    engine.prefill(ids, len(ids), cache, engine.press(record.id))
    cache.pop_steps()
    step = DecodeStep(model, cache, [ids[-1]], cache.get_seq_length(), engine.device)
    step.forward()  # the first step makes the plans and buffers
    static = static_storages(model, cache, step)
    traces = []
    for _ in range(2):
        with StepTrace(static) as trace:
            step.forward()
        traces.append(trace)
    difference = first_difference(traces[0].events, traces[1].events)
    reads = traces[1].reads
    if difference is None and reads:
        difference = f"{reads} value(s) read back within the step"
    return (1 if difference is None else 0), difference or "the same launches and operations, nothing read back"


# --- wave efficiency ------------------------------------------------------------------------------------------
def wave_efficiency_min(sms: int = SMS) -> tuple[float, str]:
    """The least wave efficiency of the split policy over the paper's shapes (the module docstring), and where:
    :func:`kvcert_kernels.certified_decode.wave_efficiency` of each shape's launch configuration."""
    import importlib

    import torch

    kernels = importlib.import_module("kvcert_kernels.certified_decode")

    from ..generation.roofline import ARCHITECTURES

    worst, where = 1.0, ""
    for name, arch in ARCHITECTURES.items():
        if name.startswith("smollm2"):
            continue
        for certificate in (True, False):
            cfg = kernels.launch_config(arch.head_dim, arch.head_dim, arch.group, torch.bfloat16,
                                        certificate=certificate, sketch=False, entropy=False, arch=90)
            slots = sms * cfg.ctas_per_sm
            for batch in WAVE_BATCHES:
                for retained in WAVE_RETAINED:
                    if batch * arch.kv_heads * kernels.max_splits(retained, cfg.block_n) < slots:
                        continue  # the grid cannot fill one wave: a wave's efficiency says nothing there
                    eff = kernels.wave_efficiency(batch, arch.kv_heads, retained, cfg, sms)
                    if eff < worst:
                        worst = eff
                        where = (f"{name} batch {batch} retained {retained} {'cert' if certificate else 'plain'}: "
                                 f"efficiency {eff:.3f} on {slots} slots")
    return worst, where


def run(args) -> int:
    import torch

    from kvcert_kernels.launch import emulating

    from ..method.attention import kernel_on_every_device
    from ..training.tokenizer import build_tokenizer
    from . import check_counts

    check_counts(args, calls=1, repeats=1, steps=1, layers=1, prompt_tokens=64)
    torch.set_num_threads(args.threads)
    out = {}
    cert_us = us_per_call(True, args.calls, args.repeats)
    plain_us = us_per_call(False, args.calls, args.repeats)
    print(f"host µs per fused-kernel call (batch 1, 32k retained, bf16, 32/8 heads of 128): "
          f"certified {cert_us:.1f}, plain {plain_us:.1f}", flush=True)
    out["host_us_per_call_cert"], out["host_us_per_call_plain"] = cert_us, plain_us
    tokenizer = build_tokenizer()
    model = smollm2_model(layers=args.layers)
    record = prompt_record(tokenizer, args.prompt_tokens)
    with emulating(sms=SMS), kernel_on_every_device(), torch.inference_mode():
        ops_topk, reads_topk = per_step(model, tokenizer, record, "topk", args.steps)
        ops_cert, reads_cert = per_step(model, tokenizer, record, "poisson", args.steps)
        safe, why = graph_safety(model, tokenizer, record)
    print(f"per decode step (SmolLM2-135M shape, {args.layers} layers, {args.prompt_tokens}-token prompt, SnapKV 25 %): "
          f"top-k {ops_topk:.0f} operations, {reads_topk:.2f} reads; Poisson + certificate {ops_cert:.0f} "
          f"operations, {reads_cert:.2f} reads (+{ops_cert - ops_topk:.0f} operations)", flush=True)
    print(f"graph-safe decode step: {'yes' if safe else 'no'} ({why})", flush=True)
    wave, where = wave_efficiency_min()
    print(f"least wave efficiency of the split policy over the paper's shapes: {wave:.3f} ({where})", flush=True)
    out.update(ops_per_step_topk=ops_topk, ops_per_step_cert=ops_cert, host_reads_per_step_cert=reads_cert,
               graph_safe=safe, wave_eff_min_paper=wave)
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) and not k.startswith("ops") else f"{k}={v:.0f}"
                   if isinstance(v, float) else f"{k}={v}" for k, v in out.items()))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("host", help="the host's work of a GPU decode step, measured on a CPU (no GPU): "
                              "µs per kernel call, operations and reads per step, graph safety, wave efficiency")
    p.add_argument("--calls", type=int, default=2000, help="kernel calls per timing (default 2000)")
    p.add_argument("--repeats", type=int, default=5, help="timings per variant; the fastest counts (default 5)")
    p.add_argument("--steps", type=int, default=8, help="decode steps counted (default 8)")
    p.add_argument("--prompt-tokens", type=int, default=1024, help="prompt length of the per-step count (default 1024)")
    p.add_argument("--layers", type=int, default=30, help="layers of the SmolLM2-135M shape (default 30: all)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.set_defaults(func=run)
