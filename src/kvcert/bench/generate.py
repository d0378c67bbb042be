"""``kvcert bench generate``: one prefill per example vs one per run.

Main-grid-shaped work — one example under 13 runs: the full cache and {question-aware,
streaming} × {SnapKV top-k, SnapKV Poisson} × budgets {12.5, 25, 50 %} — generated run by
run (old: :func:`kvcert.generation.forked.generate` of each run alone, its one-row case: 13
prefills and 13 decodes) and all runs together (new: the same function over the 13, one
prefill, forks, one batched decode), side by side in one process, medians of interleaved
repeats per example. Workloads: the shipped embedded model on needle prompts of 512 and
2,048 tokens, and a random-init model of the embedded model's shape (positions up to
32k) with the embedded tokenizer at 8,192 tokens. Both paths' records are compared:
greedy tokens (the share of records whose tokens are identical), the certificate radii
(largest relative difference over every step and aggregation) and each record's
certificate signal (the mean step radius a gate thresholds; largest relative difference).
Last line: ``speedup_2048=<ratio> speedup_8k=<ratio> token_agreement=<fraction>``.
"""

from __future__ import annotations

from .timing import interleaved_medians

# torch, transformers and the library are imported inside the functions, so that
# `kvcert --help` and the pipeline's light commands stay fast.

BUDGETS = (0.125, 0.25, 0.5)


def grid_specs(model_name: str, model_path: str, seed: int = 0) -> list:
    """The 13 runs of one main-grid example (as ``kvcert plan`` enumerates them)."""
    from ..generation.spec import GenerationSpec

    def spec(condition, sampler=None, budget=1.0):
        method = {"name": "full"} if condition == "full" else {
            "name": f"snapkv-{sampler}", "scorer": "snapkv", "sampler": sampler, "allocation": "uniform"}
        return GenerationSpec.from_dict({"model": {"name": model_name, "path": model_path}, "method": method,
                                         "condition": condition, "budget": budget, "seed": seed})

    return [spec("full")] + [spec(c, s, b) for c in ("aware", "streaming") for s in ("topk", "poisson") for b in BUDGETS]


def random_model(tokenizer, seed: int = 0):
    """A random-init Llama of the embedded model's shape, with positions up to 32k."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..method.integration import enable_certified_attention

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=32768,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    return enable_certified_attention(LlamaForCausalLM(config).eval())


def radius_difference(a: dict | None, b: dict | None) -> float:
    """Largest relative difference between two records' certificate radii (0 when both are None)."""
    if a is None or b is None:
        return 0.0 if a is b else float("inf")
    worst = 0.0
    for key in ("steps", "anytime_steps", "relative_steps"):
        for agg, xs in a[key].items():
            ys = b[key][agg]
            if len(xs) != len(ys):
                return float("inf")
            for x, y in zip(xs, ys):
                if x != y:
                    worst = max(worst, abs(x - y) / max(abs(x), abs(y)))
    return worst


def signal_difference(a: dict | None, b: dict | None) -> float:
    """Relative difference of the records' certificate signal: the mean over steps of the step radius
    (mean over layers and heads), what a gate thresholds."""
    if a is None or b is None:
        return 0.0 if a is b else float("inf")
    x, y = (sum(c["steps"]["mean"]) / len(c["steps"]["mean"]) for c in (a, b))
    return 0.0 if x == y else abs(x - y) / max(abs(x), abs(y))


def compare(engines, records, repeats: int) -> dict:
    """Median seconds of both paths per example, token agreement and the largest radius difference."""
    from ..generation.forked import generate

    old_t, new_t, same, total, worst, signal = [], [], 0, 0, 0.0, 0.0
    for record in records:
        out = {}
        med = interleaved_medians({
            "old": lambda: out.__setitem__("old", [generate([e], record)[0] for e in engines]),
            "new": lambda: out.__setitem__("new", generate(engines, record)),
        }, repeats=repeats, warmup=0)
        old_t.append(med["old"])
        new_t.append(med["new"])
        for a, b in zip(out["old"], out["new"]):
            total += 1
            same += a["tokens"] == b["tokens"]
            if a["tokens"] == b["tokens"]:
                worst = max(worst, radius_difference(a["certificate"], b["certificate"]),
                            radius_difference(a["certificate_robust"], b["certificate_robust"]))
                signal = max(signal, signal_difference(a["certificate"], b["certificate"]),
                             signal_difference(a["certificate_robust"], b["certificate_robust"]))
    return {"old": sum(old_t), "new": sum(new_t), "same": same, "total": total, "radius": worst, "signal": signal}


def run(args) -> int:
    from . import check_counts

    check_counts(args, lengths=1, long=0, examples=1, long_examples=1, repeats=1, threads=1)
    import torch

    from ..generation.engine import Engine
    from ..method.models import ModelSpec, load_model
    from ..tasks import generate as generate_task

    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(ModelSpec(name="embedded", path="embedded", device=args.device))
    workloads = [(length, "embedded", model) for length in args.lengths]
    if args.long:
        workloads.append((args.long, "random-init", random_model(tokenizer).to(next(model.parameters()).device)))
    print(f"13 runs per example (full + aware/streaming x snapkv top-k/Poisson x {BUDGETS}), fp32, "
          f"{args.threads} thread(s); old = one prefill and decode per run, new = one prefill, forks, one batched decode")
    print(f"{'model':>12} {'tokens':>7} {'examples':>9} {'old s':>8} {'new s':>8} {'speedup':>8} {'tokens same':>12} "
          f"{'max radius diff':>16} {'signal diff':>12}")
    speedups, same, total = {}, 0, 0
    for length, name, mdl in workloads:
        engines = [Engine(mdl, tokenizer, s) for s in grid_specs(name, "embedded")]
        examples = args.long_examples if name == "random-init" else args.examples
        records = generate_task("needle", tokenizer, n_examples=examples, target_tokens=length, seed=args.seed)
        repeats = 1 if name == "random-init" else args.repeats
        r = compare(engines, records, repeats)
        speedups[length] = r["old"] / r["new"]
        same, total = same + r["same"], total + r["total"]
        print(f"{name:>12} {length:>7} {examples:>9} {r['old']:>8.2f} {r['new']:>8.2f} {speedups[length]:>8.2f} "
              f"{r['same']:>5}/{r['total']:<6} {r['radius']:>16.2e} {r['signal']:>12.2e}")
    s2048 = speedups.get(2048, float("nan"))
    s8k = speedups.get(args.long, float("nan")) if args.long else float("nan")
    print(f"speedup_2048={s2048:.2f} speedup_8k={s8k:.2f} token_agreement={same / max(total, 1):.4f}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="one prefill per example (forked, batched) vs one per run (CPU)")
    p.add_argument("--lengths", type=int, nargs="*", default=[512, 2048], help="embedded-model prompt lengths")
    p.add_argument("--long", type=int, default=8192, help="random-init model prompt length (0: skip)")
    p.add_argument("--examples", type=int, default=4, help="needle examples per embedded length")
    p.add_argument("--long-examples", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=31, help="needle data seed (outside the pre-registered seeds)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the bars' setting)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (kernels/gpu_check.sh runs it on the GPU)")
    p.set_defaults(func=run)
