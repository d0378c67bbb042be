"""``kvcert bench certificate``: the certificate's cost on the torch path, and sampling's.

Measured side by side in one process (DESIGN.md §1; issue "Core library"):
* decode attention over a retained cache with the certificate (V̂, b̂_c) vs the same
  Hájek attention without it — 8k and 32k retained tokens, 32 query / 8 KV heads,
  head dim 128, fp32, batch 1;
* Poisson and priority sampling (inclusion probabilities + draws + packing) vs the
  deterministic top-k selection of the baseline, at 128k tokens × 8 KV heads.
Last line: ``certificate_overhead=<ratio> sampling_overhead=<ratio> priority_overhead=<ratio>``
(certificate: the worst case over sizes; sampling: the Poisson design, the paper's
method, against the top-k baseline; priority: the exact-size variant, reported beside it).
"""

from __future__ import annotations

from .timing import interleaved_medians

# torch and the library are imported inside the functions, so `kvcert --help` stays fast.


def certificate_ratio(retained: int, repeats: int, seed: int = 0) -> tuple[float, float, float]:
    import torch

    from ..attention import hajek_attention, squared_deviation

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
    medians = interleaved_medians(
        {
            "plain": lambda: hajek_attention(q, k, v, log_pi, scale),
            "certified": lambda: hajek_attention(
                q, k, v, log_pi, scale, certificate=True, one_minus=one_minus, dev=dev, centre=centre
            ),
        },
        repeats=repeats,
    )
    return medians["plain"], medians["certified"], medians["certified"] / medians["plain"]


def sampling_ratios(tokens: int, repeats: int, seed: int = 0) -> dict[str, float]:
    import torch

    from ..design import priority_sample, sample_retention, topk_sample

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
    import torch

    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats
    worst_cert = 0.0
    print("decode attention, fp32, batch 1, 32 query / 8 KV heads, head dim 128")
    print(f"{'retained':>9} {'plain ms':>9} {'certified ms':>13} {'ratio':>6}")
    for retained in args.retained:
        plain, cert, ratio = certificate_ratio(retained, repeats)
        worst_cert = max(worst_cert, ratio)
        print(f"{retained:>9} {plain * 1e3:>9.2f} {cert * 1e3:>13.2f} {ratio:>6.2f}")
    med = sampling_ratios(args.sampling_tokens, repeats)
    print(f"\nselection at {args.sampling_tokens} tokens x 8 KV heads, budget 25%")
    for name, t in med.items():
        print(f"{name:>10} {t * 1e3:>9.2f} ms  ratio vs topk baseline {t / med['topk']:.2f}")
    sampling = med["poisson"] / med["topk"]
    priority = med["priority"] / med["topk"]
    print(f"certificate_overhead={worst_cert:.3f} sampling_overhead={sampling:.3f} priority_overhead={priority:.3f}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("certificate", help="certificate and sampling overhead on the torch path (CPU)")
    p.add_argument("--retained", type=int, nargs="+", default=[8192, 32768])
    p.add_argument("--sampling-tokens", type=int, default=131072)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--repeats", type=int, default=7)
    p.set_defaults(func=run)
