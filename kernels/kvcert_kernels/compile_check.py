"""Ahead-of-time compilation of the decode kernels for a GPU this machine does not have.

``triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))`` runs Triton's whole
toolchain (TTIR → TTGIR → LLVM IR → PTX → ``ptxas`` → cubin) on the CPU; ``cuobjdump
-res-usage`` (both tools ship in Triton's wheel) reads what the cubin uses per thread
(registers, stack frame = local memory) and per block (shared memory).

The launches compiled are exactly those :func:`kvcert_kernels.certified_decode.plan_decode`
builds — the wrapper's own argument preparation and launch-parameter choice
(``launch_config``, ``merge_config``) for the target's compute capability — from CPU tensors
of the variant's shapes, specialised by the JIT's own binder for the target backend: the
signature, constexprs and attributes (16-byte alignment, divisibility by 16, ints equal
to 1) a launch on that GPU would compile. Launches whose compile keys coincide (e.g.
query-per-KV groups 6 and 7: the group is a runtime argument, padded to the same
``G_PAD``) compile once.

The *kvcert form* of a variant is what kvcert's attention launches (:mod:`kvcert.method.decode_plans`): log π,
per-head lengths read from the device (a one-element tensor broadcast over the heads), and with the certificate
the cache's own 1 − π and ‖v − c‖ (``HAS_AUX``); with the certificate or the entropy the statistics written into
the recorder's buffer ([T, layers, 6, B, Hq], one view per statistic) at a device step index (``HAS_NORM`` with
the certificate). The other forms — a direct call of ``certified_decode`` (no lengths, statistics returned), no
log π, the certificate not packed into the p·V rows (the ablation's) — are compiled at one shape.

Theoretical occupancy (:func:`occupancy`) follows the CUDA occupancy calculator: registers
allocated per warp in units of 256 (per thread rounded up to 8), shared memory per block
in units of 128 bytes plus the 1 KiB the runtime reserves per block, at most 32 resident
blocks and 64 resident warps (2048 threads) per SM, 65536 registers per SM, and 164 KiB
(sm_80) / 228 KiB (sm_90) of shared memory per SM.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
import time
import types
from dataclasses import dataclass, field

import torch

ARCHS = (80, 90)
DTYPES = ("bfloat16", "float16", "float32")

#: per-SM limits of the compute capabilities the tier compiles for
SM_LIMITS = {
    80: dict(regs=65536, threads=2048, blocks=32, shared=164 * 1024),
    90: dict(regs=65536, threads=2048, blocks=32, shared=228 * 1024),
}
REG_UNIT_WARP = 256  # registers are allocated per warp in units of 256
SHARED_UNIT = 128  # shared memory is allocated per block in units of 128 bytes
SHARED_RESERVED = 1024  # bytes the runtime reserves per block (sm_80 and later)

SEQ_LEN = 1000  # not a multiple of 16, as almost every retained length (the JIT specialises multiples)
SPLITS = 4
SKETCH_SLOTS = 20


@dataclass(frozen=True)
class Variant:
    """One launchable configuration of :func:`certified_decode` on one target."""

    arch: int
    dtype: str
    head_dim: int
    group: int
    certificate: bool
    sketch: bool
    entropy: bool
    split: bool
    log_pi: bool = True
    lengths: bool = False
    aux: bool = False  # the cache's 1 − π and ‖v − c‖ (one_minus, dev)
    stats: bool = False  # statistics into a recorder's buffer at a device step index (stats, step)
    packed: bool | None = None  # the certificate in the p·V rows (None: plan_decode's choice)

    @property
    def flags(self) -> str:
        parts = ["cert" if self.certificate else "plain"]
        parts += ["sketch"] * self.sketch + ["entropy"] * self.entropy + ["split"] * self.split
        if not self._kvcert_form:
            parts += [] if self.log_pi else ["no-logpi"]
            parts += ["lengths"] * self.lengths + ["aux"] * self.aux + ["stats"] * self.stats
            parts += ["direct"] * (self.log_pi and not (self.lengths or self.aux or self.stats))
        parts += ["unpacked"] * (self.packed is False and self.certificate)
        return "+".join(parts)

    @property
    def kvcert(self) -> bool:
        """What kvcert's attention launches (the module docstring): log π, lengths from the device, the cache's
        1 − π and ‖v − c‖ with the certificate, statistics at a device step index with the certificate or the
        entropy, and the plan's own choice of packing."""
        return self._kvcert_form and self.packed is None

    @property
    def _kvcert_form(self) -> bool:
        return (self.log_pi and self.lengths and self.aux == self.certificate
                and self.stats == (self.certificate or self.entropy))


@dataclass
class Resources:
    """What one compiled kernel uses (per thread, per block) and the occupancy that allows."""

    kernel: str
    arch: int
    dtype: str
    head_dim: int
    g_pad: int
    flags: str
    groups: list = field(default_factory=list)
    num_warps: int = 0
    num_stages: int = 0
    block_n: int = 0
    regs: int = 0
    stack: int = 0
    local: int = 0
    shared: int = 0
    occupancy: float = 0.0
    blocks_per_sm: int = 0
    ctas_claimed: int = 0
    tile_bytes: int = 0
    seconds: float = 0.0
    error: str | None = None
    variants: list = field(default_factory=list)

    @property
    def spilled(self) -> bool:
        """A stack frame or local memory: registers spilled (or arrays placed) in local memory."""
        return self.error is None and (self.stack > 0 or self.local > 0)

    @property
    def fits(self) -> bool:
        """At least the resident programs per SM the launch configuration (and the split policy) counts on."""
        return self.error is None and self.blocks_per_sm >= self.ctas_claimed

    @property
    def inflight(self) -> int:
        """Key/value/log π bytes the resident programs of one SM keep in flight (stage 1: num_stages − 1 tiles each)."""
        return self.blocks_per_sm * max(0, self.num_stages - 1) * self.tile_bytes


def kvcert_variant(arch, dtype, head_dim, group, certificate, sketch, entropy, split, **kw) -> Variant:
    """The variant in the form kvcert's attention launches it (:attr:`Variant.kvcert`)."""
    return Variant(arch, dtype, head_dim, group, certificate, sketch, entropy, split, log_pi=True, lengths=True,
                   aux=certificate, stats=certificate or entropy, **kw)


def variants(shapes, archs=ARCHS, dtypes=DTYPES, extras: bool = True) -> list[Variant]:
    """Every CERT × SKETCH × ENTROPY × SPLIT combination the wrapper can launch (a sketch only with
    the certificate) in the form kvcert's attention launches it (:func:`kvcert_variant`), for each
    (head_dim, group) of ``shapes``, dtype and arch; with ``extras`` also, at the first shape, the
    forms it does not launch: a direct call (no lengths, the statistics returned; with and without the
    certificate, one split and several), no log π, and the certificate not packed (the ablation's)."""
    out = []
    for arch in archs:
        for dtype in dtypes:
            for head_dim, group in shapes:
                for cert in (True, False):
                    for sketch in ((True, False) if cert else (False,)):
                        for entropy in (False, True):
                            for split in (False, True):
                                out.append(kvcert_variant(arch, dtype, head_dim, group, cert, sketch, entropy, split))
            if extras and shapes:
                head_dim, group = shapes[0]
                for cert in (True, False):
                    for split in (False, True):
                        out.append(Variant(arch, dtype, head_dim, group, cert, False, False, split))
                out.append(Variant(arch, dtype, head_dim, group, True, False, False, False, log_pi=False))
                for split in (False, True):
                    out.append(kvcert_variant(arch, dtype, head_dim, group, True, False, False, split, packed=False))
    return out


def _inputs(v: Variant, kv_heads: int = 4, batch: int = 1):
    """CPU tensors of the variant's shapes (contents irrelevant: nothing runs). 4 KV heads: B·Hq a multiple of 4, as
    at every paper model and batch, so a statistic's view of the recorder's buffer is 16-byte aligned as there."""
    dt = getattr(torch, v.dtype)
    d = v.head_dim
    q = torch.zeros(batch, kv_heads * v.group, 1, d, dtype=dt)
    k = torch.zeros(batch, kv_heads, SEQ_LEN, d, dtype=dt)
    val = torch.zeros(batch, kv_heads, SEQ_LEN, d, dtype=dt)
    lp = torch.zeros(batch, kv_heads, SEQ_LEN) if v.log_pi else None
    centre = torch.zeros(batch, kv_heads, d)
    # kvcert's lengths: the layer's slot count, one int64 on the device, broadcast over (batch, KV head)
    lengths = torch.full((1,), SEQ_LEN, dtype=torch.int64).expand(batch, kv_heads) if v.lengths else None
    aux = dict(one_minus=torch.zeros(batch, kv_heads, SEQ_LEN), dev=torch.zeros(batch, kv_heads, SEQ_LEN)) if v.aux else {}
    if v.stats:  # a recorder's buffer [T, layers, 6, B, Hq] and its views of one layer, as kvcert's recorder keeps them
        from .certified_decode import STAT_NAMES

        hq = kv_heads * v.group
        data = torch.zeros(8, 2, len(STAT_NAMES), batch, hq)
        names = (STAT_NAMES[:5] if v.certificate else ()) + (("entropy",) if v.entropy else ())
        aux.update(stats={n: data[:, 1, STAT_NAMES.index(n)] for n in names}, step=torch.zeros(1, dtype=torch.int32))
    sketch = None
    if v.sketch:
        r = SKETCH_SLOTS
        sketch = types.SimpleNamespace(
            codes=torch.zeros(batch, kv_heads, r, d, dtype=torch.int8), scale=torch.zeros(batch, kv_heads, r),
            key_error=torch.zeros(batch, kv_heads, r), value_dev=torch.zeros(batch, kv_heads, r),
            count=torch.zeros(batch, kv_heads, dtype=torch.int64), slots=r,
        )
    return q, k, val, lp, centre, lengths, sketch, aux


def variant_config(v: Variant):
    """The stage-1 :class:`LaunchConfig` the wrapper chooses for the variant on its target."""
    from .certified_decode import launch_config

    return launch_config(v.head_dim, v.head_dim, v.group, getattr(torch, v.dtype), certificate=v.certificate,
                         sketch=v.sketch, entropy=v.entropy, arch=v.arch, packed=v.packed)


def variant_launches(v: Variant):
    """The launches :func:`plan_decode` makes for the variant on its target (stage 1, and the merge with splits)."""
    from .certified_decode import plan_decode

    q, k, val, lp, centre, lengths, sketch, aux = _inputs(v)
    launches, _ = plan_decode(q, k, val, lp, centre, v.head_dim**-0.5, lengths, v.certificate,
                              SPLITS if v.split else 1, sketch=sketch, entropy=v.entropy, arch=v.arch,
                              packed=v.packed, **aux)
    return launches


def _specialise(launch, arch: int):
    """The compile inputs a launch on ``arch`` would produce: (target, source args, options)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = launch.kernel
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, opts = binder(*launch.args, **launch.kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, launch.kwargs, bound, spec, opts)
    return target, (fn, signature, constexprs, attrs), options


def _compile_key(src, options, arch) -> str:
    fn, signature, constexprs, attrs = src
    return repr((fn.__name__, arch, sorted(signature.items()), sorted((k, repr(x)) for k, x in constexprs.items()),
                 sorted((k, repr(x)) for k, x in attrs.items()), sorted(options.__dict__.items())))


_RES = re.compile(r"(REG|STACK|SHARED|LOCAL):(\d+)")


def cubin_resources(cubin: bytes) -> dict:
    """``cuobjdump -res-usage`` of one cubin: {"REG", "STACK", "SHARED", "LOCAL"} of its kernel."""
    import triton

    tool = triton.knobs.nvidia.cuobjdump.path
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        text = subprocess.run([tool, "-res-usage", fh.name], capture_output=True, text=True, check=True).stdout
    lines = [ln for ln in text.splitlines() if "REG:" in ln]
    if not lines:
        raise RuntimeError(f"cuobjdump -res-usage printed no kernel resources: {text.strip()[:200]}")
    return {k: int(x) for k, x in _RES.findall(lines[-1])}


def occupancy(regs: int, shared: int, num_warps: int, arch: int) -> tuple[float, int]:
    """Theoretical occupancy (resident warps / the SM's maximum) and resident blocks per SM of a
    kernel using ``regs`` registers per thread and ``shared`` bytes of shared memory per block."""
    lim = SM_LIMITS[arch]
    max_warps = lim["threads"] // 32
    regs_warp = -(-(-(-max(regs, 1) // 8) * 8 * 32) // REG_UNIT_WARP) * REG_UNIT_WARP
    by_regs = (lim["regs"] // regs_warp) // num_warps
    smem = -(-shared // SHARED_UNIT) * SHARED_UNIT + SHARED_RESERVED
    by_smem = lim["shared"] // smem
    blocks = max(0, min(by_regs, by_smem, lim["blocks"], max_warps // num_warps))
    return blocks * num_warps / max_warps, blocks


@contextlib.contextmanager
def cache_dir(path):
    """Triton's on-disk kernel cache in ``path`` for the duration (None: leave it where it is)."""
    import triton

    if path is None:
        yield
        return
    os.makedirs(path, exist_ok=True)
    old = triton.knobs.cache.dir
    triton.knobs.cache.dir = str(path)
    try:
        yield
    finally:
        triton.knobs.cache.dir = old


def _check_compiling() -> None:
    from .certified_decode import interpreting

    if interpreting():
        raise RuntimeError("compile_check: TRITON_INTERPRET=1 is set; compiling for a GPU needs it unset "
                           "before triton is imported")


def compile_one(v: Variant, index: int, cache=None) -> Resources:
    """Compile launch ``index`` of the variant's launches for its target and read its resources
    (a compile error is recorded in ``error``, not raised)."""
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    _check_compiling()
    launch = variant_launches(v)[index]
    target, src, options = _specialise(launch, v.arch)
    kw = launch.kwargs
    stage1 = "BLOCK_N" in kw
    elem = torch.empty((), dtype=getattr(torch, v.dtype)).element_size()
    res = Resources(src[0].__name__.lstrip("_"), v.arch, v.dtype, v.head_dim, kw.get("G_PAD", 0), v.flags,
                    num_warps=options.num_warps, num_stages=options.num_stages, block_n=kw.get("BLOCK_N", 0),
                    ctas_claimed=variant_config(v).ctas_per_sm if stage1 else 0,
                    tile_bytes=kw["BLOCK_N"] * (2 * v.head_dim * elem + 4 * v.log_pi + 8 * (v.aux and v.certificate))
                    if stage1 else 0)
    t0 = time.perf_counter()
    with cache_dir(cache):
        try:
            compiled = triton_compile(ASTSource(*src), target=target, options=options.__dict__)
            use = cubin_resources(compiled.asm["cubin"])
        except Exception as exc:  # noqa: BLE001 - a compile error is a result here
            text = str(exc).strip()
            res.error = f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"
        else:
            res.regs, res.stack, res.local = use.get("REG", 0), use.get("STACK", 0), use.get("LOCAL", 0)
            res.shared = int(compiled.metadata.shared)
            res.occupancy, res.blocks_per_sm = occupancy(res.regs, res.shared, res.num_warps, v.arch)
    res.seconds = time.perf_counter() - t0
    return res


def compile_variants(vs, cache=None, progress=None, jobs: int = 1) -> list[Resources]:
    """Compile every launch of ``vs`` (once per distinct compile key) and read its resources.

    Returns one :class:`Resources` per distinct compiled kernel, its ``variants`` the
    variants that launch it. A compile error is recorded in ``error`` (not raised).
    ``cache``: a folder for Triton's kernel cache (a second call with the same folder
    reads the cubins back instead of compiling). ``jobs`` > 1: the distinct kernels are
    compiled in that many processes. ``progress(res)`` is called as each one is done."""
    _check_compiling()
    unique: dict[str, tuple[Variant, int, list]] = {}
    for v in vs:
        for index, launch in enumerate(variant_launches(v)):
            _, src, options = _specialise(launch, v.arch)
            unique.setdefault(_compile_key(src, options, v.arch), (v, index, []))[2].append(v)
    items = list(unique.values())
    if jobs > 1 and len(items) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(compile_one, v, index, cache) for v, index, _ in items]
            results = []
            for future in futures:
                results.append(future.result())
                if progress is not None:
                    progress(results[-1])
    else:
        results = []
        for v, index, _ in items:
            results.append(compile_one(v, index, cache))
            if progress is not None:
                progress(results[-1])
    for res, (_, _, users) in zip(results, items):
        res.variants = users
        res.groups = sorted({u.group for u in users})
    return results


__all__ = ["ARCHS", "DTYPES", "Resources", "SM_LIMITS", "Variant", "compile_one", "compile_variants", "cubin_resources",
           "kvcert_variant", "occupancy", "variant_config", "variant_launches", "variants"]
