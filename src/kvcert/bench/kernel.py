"""``kvcert bench kernel``: the fused certified decode kernel on a GPU (:mod:`kvcert.bench.kernel_timing`).

Times, by CUDA-graph replay (device µs per call) and by eager calls (host µs per call, in its
own column): the Triton kernel with the certificate, the same kernel without it, and PyTorch
SDPA over the same retained cache (plain, and with the −log π bias as a float mask), for batch
1 and 8, 32 query / 8 KV heads, head dim 128, bf16, retained lengths 4k–128k; prints the
achieved memory bandwidth as a fraction of a measured device-to-device copy where the device
time dominates the host's. ``--ablation`` times what each change of the kernel costs or saves
(plain; certified; + packed rows; + cached statistics; key tiles 16 / 32 / 64) at batch 1 and
8, 32k retained. Without a CUDA GPU it says so in one line and exits non-zero (nothing
measured).

``--compile-only`` compiles every kernel variant for sm_80 and sm_90 instead, on any
machine with Triton (no GPU needed), and prints what each uses
(:mod:`kvcert.bench.kernel_compile`).
"""

from __future__ import annotations

import os

DEFAULT_RETAINED = [4096, 8192, 16384, 32768, 65536, 131072]


def add_arguments(p) -> None:
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--retained", type=int, nargs="+", default=DEFAULT_RETAINED)
    p.add_argument("--query-heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--tune", action="store_true", help="also sweep block size / warps / stages")
    p.add_argument("--ablation", action="store_true",
                   help="instead of the table: plain; certified; + packed rows; + cached statistics; tiles 16/32/64 "
                        "(batch 1 and 8, 32k retained)")
    p.add_argument("--split-sweep", action="store_true",
                   help="instead of the table: the certified kernel at split counts 8-256 and the policy's own, at "
                        "each --batch × --retained")
    p.add_argument("--output", default=None, help="write the measurements as JSON to this file")
    p.add_argument("--compile-only", action="store_true",
                   help="compile every variant for sm_80 / sm_90 (no GPU needed): registers, stack, shared memory, occupancy")
    p.add_argument("--arch", type=int, nargs="+", default=[80, 90], help="compute capabilities (--compile-only)")
    p.add_argument("--dtypes", nargs="+", choices=["bfloat16", "float16", "float32"],
                   default=["bfloat16", "float16", "float32"], help="cache dtypes (--compile-only)")
    p.add_argument("--cache", default=None, help="Triton's kernel cache folder (--compile-only; default: Triton's own)")
    p.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                   help="compile processes (--compile-only)")


def run(args) -> int:
    if args.compile_only:
        from .kernel_compile import run_compile_only

        return run_compile_only(args)
    from . import check_counts

    check_counts(args, batch=1, retained=1, query_heads=1, kv_heads=1, head_dim=1)
    import torch

    if not torch.cuda.is_available():  # nothing measured is a failure, not a result
        raise RuntimeError("no CUDA GPU on this machine: nothing measured; run `kvcert bench kernel` where a GPU is")
    from .kernel_timing import run_benchmark

    return run_benchmark(args)


def register(subparsers) -> None:
    p = subparsers.add_parser("kernel", help="fused certified decode kernel vs no certificate vs SDPA (GPU)")
    add_arguments(p)
    p.set_defaults(func=run)
