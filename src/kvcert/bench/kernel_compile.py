"""``kvcert bench kernel --compile-only``: every decode-kernel variant compiled for sm_80 and sm_90
on this machine, GPU or not (:mod:`kvcert_kernels.compile_check`), with what each uses.

Variants: CERT × SKETCH × ENTROPY × SPLIT, bf16 / fp16 / fp32 caches, at the head sizes and
query-per-KV groups of the paper grid's models (their architectures:
:func:`kvcert.generation.roofline.model_architecture`) and of the embedded model, each in the
form kvcert's attention launches it (log π, lengths from the device, the cache's 1 − π and
‖v − c‖ with the certificate, the statistics at a device step index:
:attr:`kvcert_kernels.compile_check.Variant.kvcert`), plus the forms it does not launch (a direct
call, no log π, the certificate not packed) at one shape. The *paper profile* is what the paper's
runs launch: each paper model's own dtype and shape, in kvcert's form. A row is one compiled
kernel (groups whose tiles pad alike share it); the run fails (exit 1) on a compile error, or on
a spill or fewer resident programs per SM than the launch configuration counts on in the paper
profile. Last line: ``variants=N failed=F spilled=K max_regs=R`` over every row.
"""

from __future__ import annotations

import json
import os
import sys

INSTALL_HINT = ("kvcert bench kernel --compile-only: Triton is not installed; "
                "pip install 'kvcert[gpu]' (or pip install triton) on Linux x86-64 to compile the kernels")


def kernel_shapes(experiment: str = "paper") -> tuple[dict, tuple]:
    """({(dtype, head_dim, group): [models]} of the experiment grid's models, the embedded model's
    (dtype, head_dim, group)). Models whose architecture is unknown are left out."""
    from ..config.paths import configs_dir, prereg_dir
    from ..config.compose import model_setting
    from ..config.experiment import experiment_grid
    from ..generation.roofline import model_architecture

    configs = configs_dir()
    _, grid = experiment_grid(experiment, configs, prereg_dir())
    profile: dict = {}
    for model in grid["models"]:
        setting = model_setting(configs, model)
        arch = model_architecture(model, setting.get("path"), setting.get("dtype"))
        if arch is not None:
            profile.setdefault((setting.get("dtype", "bfloat16"), arch.head_dim, arch.group), []).append(model)
    setting = model_setting(configs, "embedded")
    emb = model_architecture("embedded", "embedded", setting.get("dtype"))
    return profile, (setting.get("dtype", "float32"), emb.head_dim, emb.group)


def in_profile(res, profile: dict) -> bool:
    """Whether a compiled kernel serves a variant of the paper profile."""
    return any((v.dtype, v.head_dim, v.group) in profile and v.kvcert for v in res.variants)


HEAD = (f"{'kernel':<7} {'arch':<5} {'dtype':<9} {'D':>3} {'groups':<7} {'flags':<27} {'BLOCK_N':>7} {'warps':>5} "
        f"{'stages':>6} {'regs':>4} {'stack':>5} {'shared':>8} {'CTAs/SM':>9} {'occupancy':>9} {'in flight':>9}  profile")


def row(res, paper: bool) -> str:
    groups = ",".join(str(g) for g in sorted(res.groups))
    if res.error:
        return f"{res.kernel:<7} sm_{res.arch:<2} {res.dtype:<9} {res.head_dim:>3} {groups:<7} {res.flags:<27} FAILED {res.error}"
    ctas = f"{res.blocks_per_sm}" + (f" (>={res.ctas_claimed})" if res.ctas_claimed else "")
    flight = f"{res.inflight / 1024:.1f} KB" if res.tile_bytes else "-"
    mark = ("paper" if paper else "") + (" SPILL" if res.spilled else "") + ("" if res.fits else " UNDER")
    return (f"{res.kernel:<7} sm_{res.arch:<2} {res.dtype:<9} {res.head_dim:>3} {groups:<7} {res.flags:<27} "
            f"{res.block_n or '-':>7} {res.num_warps:>5} {res.num_stages:>6} {res.regs:>4} {res.stack:>5} "
            f"{res.shared / 1024:>5.1f} KB {ctas:>9} {100 * res.occupancy:>8.1f}% {flight:>9}  {mark.strip()}")


def run_compile_only(args) -> int:
    try:
        import triton  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError:
        print(INSTALL_HINT)
        return 1
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("kvcert bench kernel --compile-only: TRITON_INTERPRET is set; unset it to compile for a GPU")
        return 1
    from kvcert_kernels import compile_check as cc

    profile, embedded = kernel_shapes()
    shapes = sorted({(d, g) for _, d, g in profile} | {embedded[1:]}, key=lambda s: (-s[0], s[1]))
    archs = tuple(args.arch)
    variants = cc.variants(shapes, archs, tuple(args.dtypes))
    print(f"compiling the decode kernels for {', '.join(f'sm_{a}' for a in archs)} "
          f"(paper profile: " + "; ".join(f"{dt} D={d} group {g} ({', '.join(m)})" for (dt, d, g), m in profile.items())
          + f"; embedded {embedded[0]} D={embedded[1]} group {embedded[2]}); in flight = resident programs × "
          f"(stages − 1) key/value tiles", flush=True)
    done = []

    def progress(res):
        done.append(res)
        if len(done) % 25 == 0:
            print(f"  {len(done)} kernels compiled", file=sys.stderr, flush=True)

    results = cc.compile_variants(variants, cache=args.cache, progress=progress, jobs=args.jobs)
    print(HEAD)
    for res in results:
        print(row(res, in_profile(res, profile)))
    paper = [r for r in results if in_profile(r, profile)]
    failed = [r for r in results if r.error]
    spilled = [r for r in results if r.spilled]
    bad = [r for r in paper if r.spilled or not r.fits]
    ok = [r for r in results if not r.error]
    if args.output:
        from ..atomic import write_text

        write_text(args.output, json.dumps([{**{k: v for k, v in r.__dict__.items() if k != "variants"},
                                             "paper": in_profile(r, profile), "spilled": r.spilled, "fits": r.fits,
                                             "inflight": r.inflight} for r in results], indent=1))
    seconds = sum(r.seconds for r in results)
    print(f"paper profile: variants={len(paper)} failed={sum(bool(r.error) for r in paper)} "
          f"spilled={sum(r.spilled for r in paper)} under_occupied={sum(not r.fits for r in paper if not r.error)} "
          f"max_regs={max((r.regs for r in paper if not r.error), default=0)}; compile {seconds:.0f} s "
          f"in {args.jobs} process(es)")
    print(f"variants={len(results)} failed={len(failed)} spilled={len(spilled)} "
          f"max_regs={max((r.regs for r in ok), default=0)}")
    return 1 if failed or bad else 0
