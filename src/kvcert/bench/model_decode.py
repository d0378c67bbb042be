"""``kvcert bench decode --model NAME|PATH``: kvcert on a real model, beside the tools users know.

On one pretrained model (a ``configs/model`` name, e.g. ``smollm2-135m-instruct`` that
``kvcert model fetch`` installs, or a model folder), in one process, at each context length
(default 512, 1k, 2k, 4k and 8k tokens of a seeded random prompt), the same prompt is
prefilled and then decoded under:

* ``hf`` — transformers' own ``DynamicCache`` with its SDPA attention (a second model object, not
  switched to kvcert's attention, holding the same weight tensors as kvcert's);
* ``full`` — kvcert's :class:`~kvcert.method.cache.CertifiedCache`, nothing evicted;
* ``topk`` — SnapKV top-k at 25 % (π = 1 for every kept token: no bias, no certificate);
* ``plugin`` — SnapKV Poisson at 25 % with the plug-in certificate (V̂, b̂_c) of every layer
  and step; its eviction sketch dropped after the prefill;
* ``robust`` — the same with the eviction sketch's shadow terms (the robust certificate);
* ``kvpress`` — kvpress's ``SnapKVPress(compression_ratio=0.75)`` on the ``hf`` copy, where the
  ``kvpress`` package imports (the table says so where it does not).

Measured, interleaved across the variants, the minimum over ``--repeats`` (≥ 2): the prefill
(the press's scoring, sampling and compaction included) and the decode time per token (each repeat
times three blocks of ``--steps`` tokens per variant over the caches its prefill built); the
cache's logical KV bytes (keys and values in use) and its **allocated** bytes (every tensor
the cache holds — keys, values, log π, 1 − π, ‖v − c‖, spare slots — with the sketch apart);
the resident memory the process gains while the variant's cache is built and held. kvcert's caches
reserve spare slots for the ``--steps`` decoded tokens, as the generation path reserves its
``max_new_tokens``; a transformers cache counts them too, after the decode (a cropped tensor keeps its
storage). Then the
forked generation path (:func:`kvcert.generation.forked.generate`: one prefill shared by the
full, top-k and Poisson runs, one batched decode) against transformers' ``generate`` run once
per variant, as tokens per second, on a needle prompt at 4k.

The table goes to stdout (and ``--csv``); the last line carries ``key=value`` pairs, among
them ``cert_over_topk_4k`` (plugin / topk decode per token), ``kvcert_full_over_hf_4k``,
``kv_bytes_ratio_25`` (plugin's KV bytes over full's at the longest length),
``kvcert_topk_over_kvpress_4k`` and ``alloc_bytes_over_kvpress_25`` (``n/a`` without kvpress).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

# torch, transformers and the library are imported inside the functions, so that
# `kvcert --help` and the pipeline's light commands stay fast.

VARIANTS = ("hf", "full", "topk", "plugin", "robust", "kvpress")
LENGTHS = (512, 1024, 2048, 4096, 8192)
#: decoded tokens per timed block (a shorter block moved full / transformers between runs: docs/benchmarks.md)
STEPS = 16
#: timed blocks per variant and repeat, interleaved across the variants
ROUNDS = 3


def model_folder(name_or_path: str, configs: str | None = None) -> tuple[str, str]:
    """(name, local folder) of a ``configs/model`` name or a model folder; a fetchable model not fetched
    yet is refused in one line naming ``kvcert model fetch``."""
    from ..method.models import resolve_model_path
    from ..config.paths import resolve_configs

    try:
        config = resolve_configs(configs) / "model" / f"{name_or_path}.yaml"
    except FileNotFoundError:
        config = None
    if config is not None and config.is_file():
        from ..generation.jobs import config_file

        return name_or_path, resolve_model_path(str(config_file(config.parent.parent, "model", name_or_path)["path"]))
    folder = Path(name_or_path).expanduser()
    if not folder.is_dir():
        raise ValueError(f"--model {name_or_path}: neither a configs/model name nor a model folder")
    return folder.name, str(folder)


def _kvpress():
    try:
        import kvpress
    except ImportError:
        return None
    return kvpress


@dataclass
class Variant:
    """One way of holding the cache: how to prefill it, decode over it, and count its bytes."""

    name: str
    prefill: object  # () -> cache
    decode: object  # (cache, steps) -> None, leaving the cache as it was
    kv_bytes: object  # (cache) -> int
    alloc_bytes: object  # (cache) -> int
    sketch_bytes: object = field(default=lambda cache: 0)


def _tensor_bytes(tensors) -> int:
    """Allocated bytes of distinct storages (a view counts its whole storage, once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def certified_alloc(cache) -> int:
    """Every tensor a CertifiedCache's layers hold (keys, values, log π, 1 − π, ‖v − c‖, their spare slots, the
    kept counts), the sketch apart."""
    return _tensor_bytes(cache.allocated_tensors())


def dynamic_bytes(cache) -> int:
    return _tensor_bytes(t for layer in cache.layers for t in (layer.keys, layer.values))


def cache_kwarg(model) -> str:
    """``cache`` (transformers 5.24) or ``past_key_values`` (5.2, kvpress 0.5.5's)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def dynamic_decode(model, cache, steps: int, token: int = 7) -> None:
    """Decode ``steps`` tokens over a transformers cache, then crop them off again."""
    import torch

    x, name = torch.tensor([[token]]), cache_kwarg(model)
    for _ in range(steps):
        model(input_ids=x, use_cache=True, logits_to_keep=1, **{name: cache})
    cache.crop(-steps)


def variants(kv_model, hf_model, ids, budget: float = 0.25, reserve: int = 64) -> dict[str, Variant]:
    """The variants of the module docstring over prompt ``ids`` [1, L]; kvcert's caches keep ``reserve`` spare
    slots for the decoded tokens, as the generation path keeps its ``max_new_tokens``."""
    from transformers import DynamicCache

    from ..method.cache import CertifiedCache
    from ..method.press import EvictionPress
    from .timing import decode_steps

    def certified(sampler: str | None, record: bool = True, sketch: bool = True):
        def prefill():
            press = None if sampler is None else EvictionPress(scorer="snapkv", budget=budget, sampler=sampler, seed=0)
            cache = CertifiedCache(press=press, record_certificates=record, reserve=reserve)
            kv_model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
            if not sketch:
                for layer in cache.layers:
                    layer.sketch = None
            return cache
        return prefill

    def kv(cache) -> int:
        return cache.kv_nbytes()

    def hf_prefill(press=None):
        def prefill():
            cache = DynamicCache(config=hf_model.config)
            kwargs = {cache_kwarg(hf_model): cache}
            if press is None:
                hf_model(input_ids=ids, use_cache=True, logits_to_keep=1, **kwargs)
            else:
                with press(hf_model):
                    hf_model(input_ids=ids, use_cache=True, logits_to_keep=1, **kwargs)
            return cache
        return prefill

    def kv_decode(cache, steps):
        decode_steps(kv_model, cache, steps)

    def hf_decode(cache, steps):
        dynamic_decode(hf_model, cache, steps)

    out = {
        "hf": Variant("hf", hf_prefill(), hf_decode, dynamic_bytes, dynamic_bytes),
        "full": Variant("full", certified(None), kv_decode, kv, certified_alloc),
        "topk": Variant("topk", certified("topk"), kv_decode, kv, certified_alloc),
        "plugin": Variant("plugin", certified("poisson", sketch=False), kv_decode, kv, certified_alloc),
        "robust": Variant("robust", certified("poisson"), kv_decode, kv, certified_alloc,
                          lambda cache: cache.sketch_nbytes()),
    }
    kvpress = _kvpress()
    if kvpress is not None:
        out["kvpress"] = Variant("kvpress", hf_prefill(kvpress.SnapKVPress(compression_ratio=1 - budget)), hf_decode,
                                 dynamic_bytes, dynamic_bytes)
    return out


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def measure_length(kv_model, hf_model, length: int, steps: int, repeats: int, seed: int = 0,
                   rounds: int = ROUNDS) -> dict[str, dict]:
    """Prefill and decode of every variant at ``length`` tokens: {variant: {prefill_s, decode_s, decode_cpu_s,
    kv_bytes, alloc_bytes, sketch_bytes, rss_bytes}} (seconds the minimum over the repeats, decode_cpu_s the
    process's CPU time per token, which on one thread leaves out the time other processes took the CPU).

    Each repeat prefills every variant anew, then times ``rounds`` blocks of ``steps`` decoded tokens, the
    variants interleaved block by block; a variant's decode time is its fastest block over all repeats. A
    cache's tensors keep their addresses for its life, and on a shared CPU one block can run several per cent
    slower than the next: fresh caches in each repeat and short interleaved blocks let every variant meet the
    same machine."""
    import gc

    import torch

    ids = torch.randint(100, min(kv_model.config.vocab_size, 30000), (1, length),
                        generator=torch.Generator().manual_seed(seed))
    found = variants(kv_model, hf_model, ids, reserve=steps)
    prefill = {name: [] for name in found}
    decode = {name: [] for name in found}
    cpu = {name: [] for name in found}
    caches, held = {}, {}
    for _ in range(repeats):
        for name, variant in found.items():
            caches.pop(name, None)
            gc.collect()
            before = rss()
            t0 = time.perf_counter()
            caches[name] = variant.prefill()
            prefill[name].append(time.perf_counter() - t0)
            held[name] = max(rss() - before, 0)
            variant.decode(caches[name], 1)  # warm-up
        for _ in range(rounds):
            for name, variant in found.items():
                t0, c0 = time.perf_counter(), time.process_time()
                variant.decode(caches[name], steps)
                decode[name].append((time.perf_counter() - t0) / steps)
                cpu[name].append((time.process_time() - c0) / steps)
    return {name: {"prefill_s": min(prefill[name]), "decode_s": min(decode[name]), "decode_cpu_s": min(cpu[name]),
                   "kv_bytes": v.kv_bytes(caches[name]), "alloc_bytes": v.alloc_bytes(caches[name]),
                   "sketch_bytes": v.sketch_bytes(caches[name]), "rss_bytes": held[name]}
            for name, v in found.items()}


def tokens_per_second(kv_model, hf_model, tokenizer, folder: str, name: str, length: int = 4096) -> tuple[float, float]:
    """(forked path, transformers generate once per variant): generated tokens per second over the full cache, SnapKV
    top-k and SnapKV Poisson at 25 % on one needle prompt of ``length`` tokens."""
    import torch

    from ..generation.engine import Engine
    from ..generation.forked import generate
    from ..generation.spec import GenerationSpec
    from ..tasks import generate as generate_task
    from ..tasks.prompting import build_prompt_ids

    record = generate_task("needle", tokenizer, n_examples=1, target_tokens=length, seed=1)[0]

    def spec(method: dict, condition: str, budget: float = 1.0):
        return GenerationSpec.from_dict({"model": {"name": name, "path": folder}, "method": method,
                                         "condition": condition, "budget": budget, "max_new_tokens": 16})

    specs = [spec({"name": "full"}, "full")] + [
        spec({"name": f"snapkv-{s}", "scorer": "snapkv", "sampler": s}, "aware", 0.25) for s in ("topk", "poisson")]
    engines = [Engine(kv_model, tokenizer, s) for s in specs]
    t0 = time.perf_counter()
    records = generate(engines, record)
    forked = sum(len(r["tokens"]) for r in records) / (time.perf_counter() - t0)
    ids = torch.tensor([build_prompt_ids(tokenizer, record)[0]])
    t0, made = time.perf_counter(), 0
    for _ in specs:
        out = hf_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                                do_sample=False, pad_token_id=tokenizer.eos_token_id)
        made += out.shape[1] - ids.shape[1]
    return forked, made / (time.perf_counter() - t0)


def run(args) -> int:
    import resource

    import torch

    from . import check_counts

    check_counts(args, lengths=1, steps=1, repeats=2, threads=1)
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from ..method.models import ModelSpec, load_model

    name, folder = model_folder(args.model, args.configs)
    kv_model, tokenizer = load_model(ModelSpec(name=name, path=folder, dtype="float32", device="cpu"))
    hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()
    # one copy of the weights in memory for both models: the variants then differ in their cache and attention
    # alone, not in where each copy's pages lie (with two copies, transformers against kvcert's full cache moved
    # between runs at short contexts, where the weights are most of a step: docs/benchmarks.md)
    hf_model.load_state_dict(kv_model.state_dict(), assign=True)
    positions = getattr(kv_model.config, "max_position_embeddings", None)
    lengths = [min(n, positions - args.steps - 2) if positions else n for n in args.lengths]
    cfg = kv_model.config
    have_kvpress = _kvpress() is not None
    print(f"decode on {name}: {cfg.num_hidden_layers} layers, {cfg.num_attention_heads} query / "
          f"{cfg.num_key_value_heads} KV heads, fp32, batch 1, {torch.get_num_threads()} thread(s); min of "
          f"{args.repeats} interleaved repeats ({ROUNDS} blocks of {args.steps} decoded tokens each); budget 25 %"
          + ("" if have_kvpress else "; kvpress is not installed here (pip install kvpress): its column is n/a"))
    header = (f"{'context':>8} {'variant':>8} {'prefill s':>10} {'ms/token':>9} {'cpu ms':>7} {'vs hf':>6} {'vs topk':>8} "
              f"{'KV MiB':>8} {'alloc MiB':>10} {'sketch MiB':>11} {'RSS+ MiB':>9}")
    print(header)
    rows, table = [], {}
    for length in lengths:
        result = measure_length(kv_model, hf_model, length, args.steps, args.repeats)
        table[length] = result
        for variant, r in result.items():
            vs_hf = r["decode_s"] / result["hf"]["decode_s"]
            vs_topk = r["decode_s"] / result["topk"]["decode_s"]
            print(f"{length:>8} {variant:>8} {r['prefill_s']:>10.3f} {r['decode_s'] * 1e3:>9.2f} "
                  f"{r['decode_cpu_s'] * 1e3:>7.2f} {vs_hf:>6.2f} "
                  f"{vs_topk:>8.2f} {r['kv_bytes'] / 2**20:>8.2f} {r['alloc_bytes'] / 2**20:>10.2f} "
                  f"{r['sketch_bytes'] / 2**20:>11.2f} {r['rss_bytes'] / 2**20:>9.1f}", flush=True)
            rows.append({"context": length, "variant": variant, **r})
    forked, hf_tps = tokens_per_second(kv_model, hf_model, tokenizer, folder, name, min(4096, max(lengths)))
    print(f"generation at {min(4096, max(lengths))} tokens (full, top-k, Poisson 25 %): forked path {forked:.1f} tokens/s, "
          f"transformers generate once per variant {hf_tps:.1f} tokens/s")
    if args.csv:
        import pandas as pd

        from ..atomic import atomic_path

        with atomic_path(args.csv) as tmp:
            pd.DataFrame(rows).to_csv(tmp, index=False, float_format="%.6g")
    if args.figure:
        figure(rows, args.figure, name)
    print(f"peak resident memory of the process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    print(summary_line(table, lengths, forked, hf_tps))
    return 0


def summary_line(table: dict, lengths: list[int], forked: float, hf_tps: float) -> str:
    """The last line's key=value pairs (4k: the length nearest 4,096; 25: the longest length)."""
    at4k = min(lengths, key=lambda n: abs(n - 4096))
    r4, rl = table[at4k], table[max(lengths)]

    def ratio(a, b, key="decode_s", at=r4):
        return "n/a" if a not in at or b not in at else f"{at[a][key] / at[b][key]:.3f}"

    pairs = {
        "cert_over_topk_4k": ratio("plugin", "topk"),
        "cert_over_topk_4k_cpu": ratio("plugin", "topk", "decode_cpu_s"),
        "robust_over_topk_4k": ratio("robust", "topk"),
        "kvcert_full_over_hf_4k": ratio("full", "hf"),
        "kvcert_full_over_hf_worst": f"{max(table[n]['full']['decode_s'] / table[n]['hf']['decode_s'] for n in lengths):.3f}",
        "kv_bytes_ratio_25": ratio("plugin", "full", "kv_bytes", rl),
        "kvcert_topk_over_kvpress_4k": ratio("topk", "kvpress"),
        "alloc_bytes_over_kvpress_25": ratio("plugin", "kvpress", "alloc_bytes", rl),
        "alloc_bytes_over_kv_bytes_25": f"{rl['plugin']['alloc_bytes'] / rl['plugin']['kv_bytes']:.3f}",
        "prefill_plugin_over_full_4k": ratio("plugin", "full", "prefill_s"),
        "forked_over_generate_tokens_per_s": f"{forked / hf_tps:.2f}",
    }
    return " ".join(f"{k}={v}" for k, v in pairs.items())


#: what each variant is, in the figure's legend
LABELS = {"hf": "transformers DynamicCache (SDPA)", "full": "kvcert, full cache", "topk": "SnapKV top-k 25 %",
          "plugin": "SnapKV Poisson 25 % + plug-in certificate", "robust": "Poisson 25 % + robust certificate",
          "kvpress": "kvpress SnapKVPress 0.75"}


def figure(rows: list[dict], path: str, name: str) -> None:
    """Decode time per token against the context length, one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..atomic import atomic_path

    fig, ax = plt.subplots(figsize=(7.2, 4.4))
    for variant in VARIANTS:
        pts = sorted((r["context"], r["decode_s"] * 1e3) for r in rows if r["variant"] == variant)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=LABELS[variant])
    contexts = sorted({r["context"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts, [f"{round(n / 1024)}k" if n >= 1024 else str(n) for n in contexts])
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("decode, ms per token (1 thread)")
    ax.set_title(f"{name}: decode per token")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
