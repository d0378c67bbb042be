"""``kvcert bench certificate``: the certificate's cost on the torch path, and sampling's.

Measured side by side in one process (docs/design.md §1):
* decode attention over a retained cache with the certificate (V̂, b̂_c) vs the same
  Hájek attention without it — 8k and 32k retained tokens, 32 query / 8 KV heads,
  head dim 128, fp32, batch 1;
* the robust certificate (the plug-in plus the shadow terms of an eviction sketch of
  :func:`kvcert.method.sketch.shadow_count` slots — the memory budget of a cache compressed to
  25 %, i.e. from 4 × the retained tokens) vs the plug-in certificate alone, same sizes,
  with the sketch's memory as a share of the retained keys and values;
* Poisson and priority sampling (inclusion probabilities + draws + packing) vs the
  deterministic top-k selection of the baseline, at 128k tokens × 8 KV heads.
Last line: ``certificate_overhead=<ratio> robust_overhead=<ratio> sketch_memory=<fraction>
sampling_overhead=<ratio> priority_overhead=<ratio>`` (certificate: the worst case over sizes;
robust: the robust certificate over the plug-in one, worst case; sketch_memory: sketch bytes
over the retained key + value bytes; sampling: the Poisson design, the paper's method,
against the top-k baseline; priority: the exact-size variant, reported beside it).
"""

from __future__ import annotations

from .timing import interleaved_medians

# torch and the library are imported inside the functions, so `kvcert --help` stays fast.


def certificate_ratio(retained: int, repeats: int, seed: int = 0) -> dict[str, float]:
    """Median seconds of plain, certified and robust (certified + sketch) decode attention; the sketch's memory share."""
    import torch

    from ..method.attention import hajek_attention, squared_deviation
    from ..method.sketch import SCALAR_BYTES, build_sketch, shadow_count

    gen = torch.Generator().manual_seed(seed)
    hq, hkv, d = 32, 8, 128
    q = torch.randn(1, hq, 1, d, generator=gen)
    k = torch.randn(1, hkv, retained, d, generator=gen)
    v = torch.randn(1, hkv, retained, d, generator=gen)
    log_pi = torch.where(torch.rand(1, hkv, retained, generator=gen) < 0.3, 0.0, -3.0 * torch.rand(1, hkv, retained, generator=gen))
    centre = v.mean(2)
    dev = squared_deviation(v, centre).sqrt()
    one_minus = torch.expm1(log_pi).neg().clamp(min=0)
    scale = d**-0.5
    slots = shadow_count(4 * retained, 2 * d * 4, d)  # the budget of a 25 % cache of 4 × the retained tokens
    evicted_k = torch.randn(1, hkv, slots, d, generator=gen)
    sketch = build_sketch(evicted_k, torch.randn(1, hkv, slots, d, generator=gen), torch.ones(1, hkv, slots, dtype=torch.bool),
                          torch.randn(1, hkv, slots, generator=gen), centre, slots)
    certified = dict(certificate=True, one_minus=one_minus, dev=dev, centre=centre)
    medians = interleaved_medians(
        {
            "plain": lambda: hajek_attention(q, k, v, log_pi, scale),
            "certified": lambda: hajek_attention(q, k, v, log_pi, scale, **certified),
            "robust": lambda: hajek_attention(q, k, v, log_pi, scale, sketch=sketch, **certified),
        },
        repeats=repeats,
    )
    medians["sketch_memory"] = hkv * slots * (d + SCALAR_BYTES) / (hkv * retained * 2 * d * 4)
    return medians


def sampling_ratios(tokens: int, repeats: int, seed: int = 0) -> dict[str, float]:
    import torch

    from ..method.design import priority_sample, sample_retention, topk_sample

    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(8, tokens, generator=gen).pow(4)
    budget = 0.25
    medians = interleaved_medians(
        {
            "topk": lambda: topk_sample(scores, budget),
            "bare_topk": lambda: scores.topk(int(budget * tokens), dim=-1),
            "poisson": lambda: sample_retention(scores, budget, "poisson", gen),
            "priority": lambda: priority_sample(scores, budget, gen),
        },
        repeats=repeats,
    )
    return medians


def run(args) -> int:
    from . import check_counts

    check_counts(args, retained=1, sampling_tokens=1, repeats=1, threads=1)
    import torch

    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats
    worst_cert = worst_robust = worst_memory = 0.0
    print("decode attention, fp32, batch 1, 32 query / 8 KV heads, head dim 128")
    print(f"{'retained':>9} {'plain ms':>9} {'certified ms':>13} {'ratio':>6} {'robust ms':>10} {'robust/cert':>12} "
          f"{'sketch mem':>11}")
    for retained in args.retained:
        m = certificate_ratio(retained, repeats)
        ratio, robust = m["certified"] / m["plain"], m["robust"] / m["certified"]
        worst_cert, worst_robust = max(worst_cert, ratio), max(worst_robust, robust)
        worst_memory = max(worst_memory, m["sketch_memory"])
        print(f"{retained:>9} {m['plain'] * 1e3:>9.2f} {m['certified'] * 1e3:>13.2f} {ratio:>6.2f} "
              f"{m['robust'] * 1e3:>10.2f} {robust:>12.3f} {100 * m['sketch_memory']:>10.2f}%")
    med = sampling_ratios(args.sampling_tokens, repeats)
    print(f"\nselection at {args.sampling_tokens} tokens x 8 KV heads, budget 25%")
    for name, t in med.items():
        print(f"{name:>10} {t * 1e3:>9.2f} ms  ratio vs topk baseline {t / med['topk']:.2f}")
    sampling = med["poisson"] / med["topk"]
    priority = med["priority"] / med["topk"]
    print(f"certificate_overhead={worst_cert:.3f} robust_overhead={worst_robust:.3f} sketch_memory={worst_memory:.4f} "
          f"sampling_overhead={sampling:.3f} priority_overhead={priority:.3f}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("certificate", help="certificate and sampling overhead on the torch path (CPU)")
    p.add_argument("--retained", type=int, nargs="+", default=[8192, 32768])
    p.add_argument("--sampling-tokens", type=int, default=131072)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: the CPUs free now, at most torch's choice; kvcert.threads)")
    p.add_argument("--repeats", type=int, default=7)
    p.set_defaults(func=run)
