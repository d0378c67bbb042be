"""``kvcert bench decode``: decode time and KV-cache bytes against the budget.

A random-init Llama-architecture model sized so that attention matters (4 layers,
8 query / 8 KV heads, head dim 64) decodes over caches of 8k and 16k tokens: the full
cache and caches compacted to 12.5 / 25 / 50 % by the randomized design (Poisson tail
over key-norm importance, certainty set of sinks + window + top slice). The caches
are filled directly with random keys and values (decode cost does not depend on their
content), so no long prefill is needed. Also measured: the certificate's share of
decode time (the same compacted cache decoded with and without recording it).
Also the comparison signals' cost (next-token entropy and top-2 margin, attention
entropy over the retained tokens): the same 25 % cache of the Poisson and of the top-k
sampler decoded as the engine decodes, with and without them (worst over lengths). Side by side in one process; medians
of interleaved repeats. Last line: ``kv_bytes_ratio_25=<ratio> decode_time_ratio_25=<ratio>
signals_overhead_poisson=<ratio> signals_overhead_topk=<ratio>`` (25 % vs full, 16k).
"""

from __future__ import annotations

from .timing import decode_steps, interleaved_medians

# torch, transformers and the library are imported inside the functions, so that
# `kvcert --help` and the pipeline's light commands stay fast.

BUDGETS = (0.125, 0.25, 0.5)


#: model shapes: the default (small, so that attention matters) and the paper's smallest model's
#: layer shape (Qwen2.5-1.5B: hidden 1536, MLP 8960, 12 query / 2 KV heads of 128, vocabulary
#: 151,936) with 8 of its 28 layers, so that the decode cost splits between attention, MLP and
#: output head as it does there
SHAPES = {
    "bench": dict(vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=8),
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=8,
                         num_attention_heads=12, num_key_value_heads=2, head_dim=128),
}


def bench_model(seed: int = 0, shape: str = "bench"):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..method.integration import enable_certified_attention

    torch.manual_seed(seed)
    config = LlamaConfig(**SHAPES[shape], max_position_embeddings=65536)
    model = LlamaForCausalLM(config).eval()
    return enable_certified_attention(model)


def filled_cache(model, length: int, budget: float | None, seed: int, record: bool = True, sampler: str = "poisson"):
    """A cache holding ``length`` random tokens per layer, compacted to ``budget`` (None = full) by ``sampler``."""
    import torch

    from ..method.cache import CertifiedCache
    from ..method.press import EvictionPress
    from ..method.scorers.base import LayerObservation

    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    heads, dim = cfg.num_key_value_heads, getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    cache = CertifiedCache(record_certificates=record)
    press = None if budget is None else EvictionPress(scorer="knorm", budget=budget, sampler=sampler, seed=seed)
    for layer_idx in range(cfg.num_hidden_layers):
        keys = torch.randn(1, heads, length, dim, generator=gen)
        values = torch.randn(1, heads, length, dim, generator=gen)
        cache.update(keys, values, layer_idx)
        if press is not None:
            layer = cache.layers[layer_idx]
            obs = LayerObservation(query=keys[:, :, -1:], key=layer.keys, value=layer.values, log_pi=None,
                                   scaling=dim**-0.5, layer_idx=layer_idx, num_layers=cfg.num_hidden_layers)
            press.compress_layer(layer, obs)
    return cache


def run(args) -> int:
    if args.model:  # a real model, beside transformers' own cache and kvcert's alternatives
        from . import model_decode

        if args.lengths is None:
            args.lengths = list(model_decode.LENGTHS)
        if args.steps is None:
            args.steps = model_decode.STEPS
        return model_decode.run(args)
    if args.lengths is None:
        args.lengths = [8192, 16384]
    if args.steps is None:
        args.steps = 8
    from . import check_counts

    check_counts(args, lengths=1, steps=1, repeats=1, threads=1)
    import torch

    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = bench_model(shape=args.shape)
    steps = args.steps
    results, signal_ratio = {}, {}
    cfg = model.config
    print(f"decode over a compacted cache ({args.shape}): {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
          f"{cfg.num_attention_heads} query / {cfg.num_key_value_heads} KV heads, head dim "
          f"{getattr(cfg, 'head_dim', None) or cfg.hidden_size // cfg.num_attention_heads}, fp32, batch 1")
    print(f"{'context':>8} {'budget':>7} {'ms/token':>9} {'time ratio':>11} {'KV MiB':>8} {'bytes ratio':>12} {'cert share':>11}")
    for length in args.lengths:
        caches = {"full": filled_cache(model, length, None, 0)}
        for b in BUDGETS:
            caches[b] = filled_cache(model, length, b, 0)
        plain25 = filled_cache(model, length, 0.25, 0, record=False)
        contenders = {name: (lambda c=c: decode_steps(model, c, steps)) for name, c in caches.items()}
        contenders["plain25"] = lambda: decode_steps(model, plain25, steps)
        # the comparison signals' cost: the same 25 % caches decoded with and without them
        for sampler in ("poisson", "topk"):
            cache = filled_cache(model, length, 0.25, 0, sampler=sampler)
            contenders[f"bare_{sampler}"] = lambda c=cache: decode_steps(model, c, steps, signals=False)
            contenders[f"signals_{sampler}"] = lambda c=cache: decode_steps(model, c, steps, signals=True)
        med = interleaved_medians(contenders, repeats=args.repeats)
        full_t, full_b = med["full"] / steps, caches["full"].kv_nbytes()
        for name in ("full", *BUDGETS):
            t = med[name] / steps
            nbytes = caches[name].kv_nbytes()
            share = "" if name != 0.25 else f"{1 - med['plain25'] / med[0.25]:>10.1%}"
            label = "100%" if name == "full" else f"{name:.1%}"
            print(f"{length:>8} {label:>7} {t * 1e3:>9.2f} {t / full_t:>11.2f} {nbytes / 2**20:>8.1f} {nbytes / full_b:>12.3f} {share:>11}")
            results[(length, name)] = (t / full_t, nbytes / full_b)
        for sampler in ("poisson", "topk"):
            ratio = med[f"signals_{sampler}"] / med[f"bare_{sampler}"]
            print(f"{length:>8} {'25.0%':>7} comparison signals on {sampler} decode: "
                  f"{med[f'signals_{sampler}'] / steps * 1e3:.2f} vs {med[f'bare_{sampler}'] / steps * 1e3:.2f} ms/token "
                  f"(ratio {ratio:.3f})")
            signal_ratio[sampler] = max(signal_ratio.get(sampler, 0.0), ratio)
    longest = max(args.lengths)
    time_ratio, bytes_ratio = results[(longest, 0.25)]
    print(f"kv_bytes_ratio_25={bytes_ratio:.3f} decode_time_ratio_25={time_ratio:.3f} "
          f"signals_overhead_poisson={signal_ratio['poisson']:.3f} signals_overhead_topk={signal_ratio['topk']:.3f}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("decode", help="decode time and KV bytes vs budget: a random-init model, or (--model) "
                              "a real one beside transformers' DynamicCache and kvpress (CPU)")
    p.add_argument("--model", default=None, metavar="NAME|PATH",
                   help="a configs/model name (e.g. smollm2-135m-instruct, after `kvcert model fetch`) or a model "
                        "folder: prefill, decode, KV and allocated bytes of transformers' cache, kvcert's full cache, "
                        "top-k and Poisson 25 %% with the plug-in and the robust certificate, and kvpress's SnapKV "
                        "(kvcert.bench.model_decode)")
    p.add_argument("--configs", default=None, help="configs folder for --model NAME (default: as every command finds it)")
    p.add_argument("--csv", default=None, help="with --model: write the table here")
    p.add_argument("--figure", default=None, help="with --model: decode time against context length (PNG)")
    p.add_argument("--lengths", type=int, nargs="+", default=None,
                   help="context lengths (default 8192 16384; with --model 512 1024 2048 4096 8192)")
    p.add_argument("--steps", type=int, default=None,
                   help="decoded tokens per timing (default 8; with --model 16 a block, kvcert's caches reserving slots for them)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: the CPUs free now, at most torch's choice; kvcert.threads)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--shape", choices=sorted(SHAPES), default="bench",
                   help="model shape: the small default, or the layer shape of the paper's Qwen2.5-1.5B (8 layers)")
    p.set_defaults(func=run)
