"""``kvcert train-model``: train the embedded model, evaluate it, record provenance.

Trains a recipe (default ``embedded``) into ``--out``, resuming from the last
checkpoint there unless ``--fresh``; then measures greedy full-cache accuracy on the
synthetic tasks at the recipe's evaluation lengths and writes ``provenance.json``. The
output directory is a Hugging Face model directory (``from_pretrained(OUT)`` loads it)
that also holds ``checkpoint.pt``, ``history.json`` and ``loss_curve.png``.
``--install`` copies the model files over the model shipped in the package
(``kvcert/embedded/model``).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

DEFAULT_OUT = "results/embedded_model"
STREAMING_BUDGET = 0.125  # the check that the model needs its context: compressed before the question, it fails
#: the method of that check: context compressed before the question, deterministic SnapKV top-k
STREAMING_TOPK = {"condition": "streaming", "scorer": "snapkv", "sampler": "topk",
                  "budget": STREAMING_BUDGET}
#: what ships in the package (the training state stays behind)
SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "provenance.json", "loss_curve.png")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train-model",
        help="train the small embedded model on the synthetic tasks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--recipe", default="embedded", help="training recipe (default: embedded; 'tiny' for smoke tests)")
    parser.add_argument("--seed", type=int, default=0, help="seed of initialisation and data (default: 0)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output directory (default: {DEFAULT_OUT})")
    parser.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint and start over")
    parser.add_argument("--stop-after", type=int, default=None, metavar="STEPS",
                        help="stop after this many steps, as if interrupted (a checkpoint is written)")
    parser.add_argument("--eval-examples", type=int, default=None,
                        help="records per task and length for the accuracy measurement (default: the recipe's)")
    parser.add_argument("--regime-examples", type=int, default=None,
                        help="records per task and length for the regime table (default: the recipe's)")
    parser.add_argument("--no-eval", action="store_true", help="skip the accuracy measurement")
    parser.add_argument("--install", action="store_true",
                        help="copy the trained model over the one shipped in the package")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)


def command_line(args: argparse.Namespace) -> str:
    """The command as recorded in provenance (no machine-specific paths)."""
    parts = ["kvcert", "train-model", "--recipe", args.recipe, "--seed", str(args.seed)]
    if args.eval_examples is not None:
        parts += ["--eval-examples", str(args.eval_examples)]
    if args.regime_examples is not None:
        parts += ["--regime-examples", str(args.regime_examples)]
    return " ".join(parts)


def run(args: argparse.Namespace) -> int:
    from kvcert.training import provenance
    from kvcert.training.evaluate import (EVAL_SEED, REGIME_SEED, evaluate, evaluate_compressed,
                                          evaluate_regime, format_regime)
    from kvcert.training.recipes import get_recipe
    from kvcert.training.train import train

    recipe = get_recipe(args.recipe)
    out = Path(args.out)
    if args.fresh and out.exists():
        for name in ("checkpoint.pt", "history.json", *SHIPPED_FILES):
            (out / name).unlink(missing_ok=True)
    result = train(recipe, out, seed=args.seed, resume=not args.fresh,
                   stop_after=args.stop_after, progress=not args.quiet)
    if result.steps < recipe.total_steps:
        print(f"stopped after {result.steps}/{recipe.total_steps} steps; "
              f"rerun the same command to resume from {out / 'checkpoint.pt'}")
        return 0

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(result.model_dir, attn_implementation="sdpa")
    tokenizer = AutoTokenizer.from_pretrained(result.model_dir)
    last = result.history[-1] if result.history else {}
    record = provenance.build(
        command=command_line(args), seed=args.seed, recipe=recipe.to_dict(),
        data_sha256=result.data_sha256, wall_time_s=result.wall_time_s, steps=result.steps,
        model=model, model_dir=result.model_dir, model_files=SHIPPED_FILES,
        final_losses={"answer": last.get("answer_loss"), "aux": last.get("aux_loss")},
    )
    if not args.no_eval:
        n_examples = args.eval_examples or recipe.eval_examples
        started = time.monotonic()
        accuracy = evaluate(model, tokenizer, recipe.eval_tasks, recipe.eval_lengths, n_examples,
                            seed=EVAL_SEED, progress=not args.quiet)
        record.update({
            "eval_seed": EVAL_SEED,
            "eval_examples": n_examples,
            "eval_lengths": list(recipe.eval_lengths),
            "accuracy_full_cache": accuracy,
            "eval_wall_time_s": round(time.monotonic() - started, 1),
        })
        for task, by_length in accuracy.items():
            print(f"{task:>10}: " + "  ".join(f"{n} tokens {a:.3f}" for n, a in by_length.items()))
        # the model must depend on its context: the same records with the context
        # compressed to 12.5 % before the question is seen (deterministic SnapKV top-k)
        started = time.monotonic()
        evicted = evaluate_compressed(model, tokenizer, recipe.eval_tasks, recipe.eval_lengths,
                                      n_examples, seed=EVAL_SEED, progress=not args.quiet,
                                      **STREAMING_TOPK)
        record.update({
            "accuracy_streaming_topk_12_5": evicted,
            "streaming_topk_method": dict(STREAMING_TOPK),
            "eval_compressed_wall_time_s": round(time.monotonic() - started, 1),
        })
        for task, by_length in evicted.items():
            print(f"{task:>10}: " + "  ".join(f"{n} tokens {a:.3f}" for n, a in by_length.items())
                  + f"  (streaming, {STREAMING_BUDGET:.1%} budget, SnapKV top-k)")
        # the eviction regime, on records from the training seed range (what a recipe
        # and the tasks' difficulty may be chosen on; never the smoke or paper seeds)
        started = time.monotonic()
        regime = evaluate_regime(model, tokenizer, recipe.regime_tasks, recipe.eval_lengths,
                                 args.regime_examples or recipe.regime_examples, seed=REGIME_SEED,
                                 progress=not args.quiet)
        regime["wall_time_s"] = round(time.monotonic() - started, 1)
        record["regime"] = regime
        print(format_regime(regime))
    provenance.write(result.model_dir, record)
    print(f"model written to {result.model_dir} ({result.steps} steps, "
          f"{result.wall_time_s / 60:.1f} min of training)")
    if args.install:
        from kvcert.embedded import embedded_model_path

        target = embedded_model_path()
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for name in SHIPPED_FILES:
            if (result.model_dir / name).exists():
                shutil.copyfile(result.model_dir / name, target / name)
        print(f"installed into {target}")
    return 0
