"""``kvcert bench kernel``: the fused certified decode kernel on a GPU (:mod:`kvcert.bench.kernel_timing`).

Times, with ``triton.testing.do_bench`` (median): the Triton kernel with the certificate,
the same kernel without it, and PyTorch SDPA over the same retained cache (plain, and with
the −log π bias as a float mask), for batch 1 and 8, 32 query / 8 KV heads, head dim 128,
bf16, retained lengths 4k–128k; prints the achieved memory bandwidth as a fraction of a
measured device-to-device copy. Without a CUDA GPU it says so in one line and exits 0.
"""

from __future__ import annotations

DEFAULT_RETAINED = [4096, 8192, 16384, 32768, 65536, 131072]


def add_arguments(p) -> None:
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--retained", type=int, nargs="+", default=DEFAULT_RETAINED)
    p.add_argument("--query-heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--tune", action="store_true", help="also sweep block size / warps / stages / splits")
    p.add_argument("--output", default=None, help="write the measurements as JSON to this file")


def run(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print("kvcert bench kernel: no CUDA GPU on this machine; nothing measured (run it where a GPU is)")
        return 0
    from .kernel_timing import run_benchmark

    return run_benchmark(args)


def register(subparsers) -> None:
    p = subparsers.add_parser("kernel", help="fused certified decode kernel vs no certificate vs SDPA (GPU)")
    add_arguments(p)
    p.set_defaults(func=run)
