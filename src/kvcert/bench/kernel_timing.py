"""GPU benchmark of the fused certified decode kernel (``kvcert bench kernel``; the command's
arguments: :mod:`kvcert.bench.kernel`, which imports this module on a GPU only).

For each batch size and retained length: the kernel with the certificate, the same kernel
without it (``certificate=False``: same code, the certificate accumulators compiled out),
and PyTorch SDPA over the same retained cache — plain (no −log π bias, the fastest thing
PyTorch offers for this read) and with the bias as a float mask (what the Hájek
correction costs through SDPA). Medians from ``triton.testing.do_bench`` (which clears
the L2 cache between repeats). Achieved bandwidth = bytes of cache read (keys, values,
log π) / time, as a fraction of a measured device-to-device copy (2 × bytes / time).

The robust certificate (the same kernel with an eviction sketch of the memory budget of a
25 % cache) is timed beside it; its ratio to the plug-in certificate is printed.

Each row also gives the roofline time of the kernel, bytes read / the GPU's peak HBM bandwidth
(:data:`kvcert.generation.roofline.GPUS`; the measured copy bandwidth for a GPU not in the
table), and the certified kernel's time over it.

Targets: certificate overhead ≤ 1.10× the kernel without it; at ≥ 32k retained
tokens at least 60 % of the copy bandwidth. The last line states both.

Run: ``kvcert bench kernel [--output bench.json] [--tune]`` (or ``python -m kvcert.cli bench kernel``).
"""

from __future__ import annotations

import json
import math

import torch
import torch.nn.functional as F

from kvcert_kernels import certified_decode, decode_bytes, default_num_splits
from kvcert_kernels.certified_decode import device_arch, launch_config

from ..method.kernel_reference import decode_reference
from ..atomic import atomic_path
from ..generation.roofline import gpu_of_device

OVERHEAD_TARGET = 1.10
BANDWIDTH_TARGET = 0.60
BANDWIDTH_FROM = 32768


def _do_bench(fn) -> float:
    """Median milliseconds of ``fn``."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def copy_bandwidth(device, nbytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy (read + write counted)."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = _do_bench(lambda: dst.copy_(src))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3)


def make_inputs(batch, hq, hkv, length, dim, dtype, device, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(batch, hq, 1, dim, device=device, dtype=dtype, generator=gen)
    k = torch.randn(batch, hkv, length, dim, device=device, dtype=dtype, generator=gen)
    v = torch.randn(batch, hkv, length, dim, device=device, dtype=dtype, generator=gen)
    u = torch.rand(batch, hkv, length, device=device, generator=gen)
    lp = torch.where(u < 0.3, 0.0, torch.log(torch.rand(batch, hkv, length, device=device, generator=gen) * 0.9 + 0.1))
    centre = v.float().mean(2)
    return q, k, v, lp, centre


def make_sketch(batch, hkv, length, dim, centre, device, seed=2):
    """An eviction sketch of the memory budget of a 25 % cache of 4 × ``length`` tokens (bf16 keys and values)."""
    from ..method.sketch import build_sketch, shadow_count

    slots = shadow_count(4 * length, 2 * dim * 2, dim)
    gen = torch.Generator(device=device).manual_seed(seed)
    keys = torch.randn(batch, hkv, slots, dim, device=device, generator=gen)
    values = torch.randn(batch, hkv, slots, dim, device=device, generator=gen)
    return build_sketch(keys, values, torch.ones(batch, hkv, slots, dtype=torch.bool, device=device),
                        torch.randn(batch, hkv, slots, device=device, generator=gen), centre, slots)


def spot_check(device, dtype) -> dict:
    """The compiled kernel against the float64 reference at one benchmark shape (4k tokens)."""
    q, k, v, lp, c = make_inputs(1, 32, 8, 4096, 128, dtype, device, seed=1)
    scale = 128**-0.5
    got = certified_decode(q, k, v, lp, c, scale, poison=True)
    ref = decode_reference(q, k, v, lp, c, scale)
    errs = {}
    for name, g, r in zip(("output", "lse", "variance", "range_term"), got, ref):
        g = g.double().reshape(r.shape)
        errs[name] = float(((g - r).abs().max() / r.abs().max()).item())
        errs[name + "_finite"] = bool(torch.isfinite(g).all())
    return errs


def planned_splits(batch, hq, hkv, length, dim, dtype, device) -> int:
    """The split count the wrapper's policy picks for the certified kernel at this shape."""
    cfg = launch_config(dim, dim, hq // hkv, dtype, certificate=True, sketch=False, entropy=False,
                        arch=device_arch(device))
    return default_num_splits(batch, hkv, length, device, cfg.block_n, cfg.ctas_per_sm)


def time_row(batch, length, args, device, dtype, copy_bw, peak_bw=None) -> dict:
    hq, hkv, dim = args.query_heads, args.kv_heads, args.head_dim
    q, k, v, lp, c = make_inputs(batch, hq, hkv, length, dim, dtype, device)
    scale = dim**-0.5
    nbytes = decode_bytes(k, v, lp)
    row = {"batch": batch, "retained": length, "bytes": nbytes,
           "num_splits": planned_splits(batch, hq, hkv, length, dim, dtype, device)}
    row["cert_ms"] = _do_bench(lambda: certified_decode(q, k, v, lp, c, scale, certificate=True))
    row["plain_ms"] = _do_bench(lambda: certified_decode(q, k, v, lp, c, scale, certificate=False))
    sketch = make_sketch(batch, hkv, length, dim, c, device)
    row["robust_ms"] = _do_bench(lambda: certified_decode(q, k, v, lp, c, scale, certificate=True, sketch=sketch))
    row["robust_overhead"] = row["robust_ms"] / row["cert_ms"]
    try:
        row["sdpa_ms"] = _do_bench(lambda: F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True))
    except Exception as exc:  # noqa: BLE001 - report, keep measuring
        row["sdpa_ms"], row["sdpa_error"] = math.nan, str(exc)[:200]
    try:
        bias = (-lp).to(dtype).repeat_interleave(hq // hkv, dim=1).unsqueeze(2)  # [B, Hq, 1, L]
        row["sdpa_bias_ms"] = _do_bench(
            lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale, enable_gqa=True)
        )
        del bias
    except Exception as exc:  # noqa: BLE001
        row["sdpa_bias_ms"], row["sdpa_bias_error"] = math.nan, str(exc)[:200]
    row["overhead"] = row["cert_ms"] / row["plain_ms"]
    row["roofline_ms"] = nbytes / (peak_bw or copy_bw) * 1e3
    row["cert_over_roofline"] = row["cert_ms"] / row["roofline_ms"]
    row["cert_bw_frac"] = nbytes / (row["cert_ms"] * 1e-3) / copy_bw
    row["plain_bw_frac"] = nbytes / (row["plain_ms"] * 1e-3) / copy_bw
    kv_bytes = nbytes - lp.numel() * 4
    row["sdpa_bw_frac"] = kv_bytes / (row["sdpa_ms"] * 1e-3) / copy_bw
    del q, k, v, lp, c
    torch.cuda.empty_cache()
    return row


def tune(args, device, dtype, copy_bw) -> list[dict]:
    """A small sweep of launch parameters at the benchmark's shapes (``--batch`` × ``--retained``)."""
    out = []
    hq, hkv, dim = args.query_heads, args.kv_heads, args.head_dim
    for batch, length in [(b, n) for b in args.batch for n in args.retained]:
        q, k, v, lp, c = make_inputs(batch, hq, hkv, length, dim, dtype, device)
        nbytes = decode_bytes(k, v, lp)
        base = planned_splits(batch, hq, hkv, length, dim, dtype, device)
        for block_n in (16, 32, 64):
            for warps in (4, 8):
                for stages in (2, 3):
                    for splits in sorted({base, base * 2}):
                        for cert in (True, False):
                            try:
                                ms = _do_bench(lambda: certified_decode(
                                    q, k, v, lp, c, dim**-0.5, certificate=cert, num_splits=splits,
                                    block_n=block_n, num_warps=warps, num_stages=stages))
                            except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory
                                ms = math.nan
                                print(f"  tune: block_n={block_n} warps={warps} stages={stages}: {str(exc)[:80]}")
                            out.append(dict(batch=batch, retained=length, block_n=block_n, num_warps=warps,
                                            num_stages=stages, num_splits=splits, certificate=cert, ms=ms,
                                            bw_frac=nbytes / (ms * 1e-3) / copy_bw))
        del q, k, v, lp, c
        torch.cuda.empty_cache()
    return out


def run_benchmark(args) -> int:
    torch.set_grad_enabled(False)
    device = torch.device("cuda")
    dtype = getattr(torch, args.dtype)
    props = torch.cuda.get_device_properties(device)
    copy_bw = copy_bandwidth(device)
    gpu = gpu_of_device(props.name)
    peak_bw = gpu.bandwidth if gpu else None
    print(f"device: {props.name}, {props.multi_processor_count} SMs; measured copy bandwidth {copy_bw / 1e9:.0f} GB/s; "
          f"roofline at {(peak_bw or copy_bw) / 1e9:.0f} GB/s ({gpu.name + ' peak' if gpu else 'the measured copy'})")
    check = spot_check(device, dtype)
    print("spot check vs float64 (4k tokens, batch 1): " + " ".join(f"{k}={v:.2e}" for k, v in check.items()
                                                                      if not k.endswith("_finite")))
    print(f"{args.dtype}, {args.query_heads} query / {args.kv_heads} KV heads, head dim {args.head_dim}; "
          "times are do_bench medians (ms); bw = fraction of copy bandwidth")
    head = (f"{'batch':>5} {'retained':>9} {'splits':>6} {'cert ms':>8} {'plain ms':>9} {'ratio':>6} "
            f"{'sdpa ms':>8} {'sdpa+bias':>9} {'cert bw':>8} {'plain bw':>8} {'sdpa bw':>8} {'robust ms':>9} "
            f"{'rob/cert':>7} {'roof ms':>8} {'cert/roof':>9}")
    print(head)
    rows = []
    for batch in args.batch:
        for length in args.retained:
            try:
                r = time_row(batch, length, args, device, dtype, copy_bw, peak_bw)
            except torch.cuda.OutOfMemoryError:
                print(f"{batch:>5} {length:>9}  out of memory")
                torch.cuda.empty_cache()
                continue
            rows.append(r)
            print(f"{batch:>5} {length:>9} {r['num_splits']:>6} {r['cert_ms']:>8.4f} {r['plain_ms']:>9.4f} "
                  f"{r['overhead']:>6.3f} {r['sdpa_ms']:>8.4f} {r['sdpa_bias_ms']:>9.4f} {r['cert_bw_frac']:>8.2f} "
                  f"{r['plain_bw_frac']:>8.2f} {r['sdpa_bw_frac']:>8.2f} {r['robust_ms']:>9.4f} "
                  f"{r['robust_overhead']:>7.3f} {r['roofline_ms']:>8.4f} {r['cert_over_roofline']:>9.2f}", flush=True)
    tuned = tune(args, device, dtype, copy_bw) if args.tune else []
    if tuned:
        print("tuning sweep (best per shape and certificate flag):")
        best: dict = {}
        for t in tuned:
            key = (t["batch"], t["retained"], t["certificate"])
            if not math.isnan(t["ms"]) and (key not in best or t["ms"] < best[key]["ms"]):
                best[key] = t
        for t in best.values():
            print("  " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in t.items()))
    worst_overhead = max((r["overhead"] for r in rows), default=math.nan)
    worst_robust = max((r["robust_overhead"] for r in rows), default=math.nan)
    long_rows = [r["cert_bw_frac"] for r in rows if r["retained"] >= BANDWIDTH_FROM]
    worst_bw = min(long_rows, default=math.nan)
    ok_o = worst_overhead <= OVERHEAD_TARGET
    ok_b = worst_bw >= BANDWIDTH_TARGET
    if args.output:
        with atomic_path(args.output) as tmp, open(tmp, "w") as fh:
            json.dump({"device": props.name, "copy_bandwidth": copy_bw, "spot_check": check, "rows": rows,
                       "tune": tuned, "certificate_overhead_max": worst_overhead, "robust_overhead_max": worst_robust,
                       "bandwidth_fraction_min_32k": worst_bw, "roofline_bandwidth": peak_bw or copy_bw}, fh, indent=1)
    verdict = lambda ok, x: "not measured" if math.isnan(x) else ("met" if ok else "MISSED")  # noqa: E731
    over_roof = [r["cert_over_roofline"] for r in rows]
    print(f"robust_overhead_max={worst_robust:.3f} (robust certificate, sketch of a 25 % cache, over the plug-in)")
    print(f"cert_over_roofline_min={min(over_roof, default=math.nan):.2f} cert_over_roofline_max="
          f"{max(over_roof, default=math.nan):.2f} (certified kernel time / bytes at peak bandwidth)")
    print(f"certificate_overhead_max={worst_overhead:.3f} (target <= {OVERHEAD_TARGET}: {verdict(ok_o, worst_overhead)}) "
          f"bandwidth_fraction_min_32k={worst_bw:.3f} (target >= {BANDWIDTH_TARGET}: {verdict(ok_b, worst_bw)})")
    return 0

