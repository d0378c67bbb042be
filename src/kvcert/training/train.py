"""The training loop: deterministic given its seed, checkpointed, resumable.

:func:`train` runs a :class:`~kvcert.training.recipes.Recipe` into an output directory:

- ``checkpoint.pt`` every ``checkpoint_every`` steps (model, optimiser, schedule, step,
  loss history, training-data hash chain, elapsed time, RNG state), written atomically;
  a rerun resumes from it and produces the same weights as an uninterrupted run;
- at the end, the model in Hugging Face format (``model.safetensors``, ``config.json``,
  ``generation_config.json``) with its tokenizer, in the output directory itself, so
  that ``from_pretrained(out_dir)`` loads it;
- ``loss_curve.png`` and ``history.json``.

Batches are a function of (seed, step) (see :mod:`kvcert.training.data`); the loss is
the mean cross-entropy over answer tokens plus ``aux_weight`` times the mean over
auxiliary next-token targets.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from kvcert.training.data import ANSWER, AUX, Batch, SequenceBuilder, chain_digest, phase_at
from kvcert.training.loss_curve import plot_loss_curve
from kvcert.training.model import build_model
from kvcert.training.recipes import Recipe
from kvcert.training.tokenizer import build_tokenizer

CHECKPOINT = "checkpoint.pt"
LOSS_CURVE = "loss_curve.png"
HISTORY = "history.json"
_EMPTY_HASH = "0" * 64


@dataclass
class TrainResult:
    out_dir: Path
    model_dir: Path  # the same directory; written only when training is complete
    steps: int
    wall_time_s: float
    data_sha256: str
    history: list[dict[str, Any]]
    resumed_from: int | None


def lr_lambda(recipe: Recipe):
    """Linear warm-up, then cosine decay to ``min_lr_ratio`` of the peak."""
    import math

    total, warmup, floor = recipe.total_steps, recipe.warmup_steps, recipe.min_lr_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def batch_loss(model: Any, batch: Batch, aux_weight: float) -> tuple[torch.Tensor, float | None, float | None]:
    """Total loss, answer loss, auxiliary loss; logits only where a target exists."""
    hidden = model.model(input_ids=batch.input_ids).last_hidden_state[:, :-1]
    roles = batch.roles[:, 1:]
    targets = batch.input_ids[:, 1:]
    total = hidden.new_zeros(())
    parts: list[float | None] = []
    for role, weight in ((ANSWER, 1.0), (AUX, aux_weight)):
        mask = roles == role
        if not bool(mask.any()):
            parts.append(None)
            continue
        logits = model.lm_head(hidden[mask])
        loss = F.cross_entropy(logits, targets[mask])
        total = total + weight * loss
        parts.append(float(loss.detach()))
    return total, parts[0], parts[1]


def _save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def train(
    recipe: Recipe,
    out_dir: str | Path,
    seed: int = 0,
    resume: bool = True,
    stop_after: int | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train (or resume training) into ``out_dir``; see the module docstring.

    ``stop_after``: stop once this many steps are done (as if interrupted), after
    writing a checkpoint; used to test resumption.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # CPU kernels are deterministic for a fixed thread count; torch's deterministic mode
    # would only add slow fallbacks (5-7x slower steps measured here).
    tokenizer = build_tokenizer()
    model = build_model(recipe.model, tokenizer, seed)
    model.train()
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if param.ndim < 2 else decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=recipe.lr, betas=(0.9, 0.98),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(recipe))
    builder = SequenceBuilder(tokenizer, lm_fraction=recipe.lm_fraction,
                              max_questions=recipe.max_questions, copy_vocab=recipe.copy_vocab)

    step, data_hash, history, elapsed = 0, _EMPTY_HASH, [], 0.0
    resumed_from = None
    checkpoint_path = out_dir / CHECKPOINT
    if resume and checkpoint_path.exists():
        state = torch.load(checkpoint_path, weights_only=False)
        if state["recipe"] != recipe.to_dict() or state["seed"] != seed:
            raise ValueError(
                f"{checkpoint_path} was written by a different recipe or seed; "
                "remove it or train with --fresh"
            )
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        step, data_hash = state["step"], state["data_hash"]
        history, elapsed = state["history"], state["elapsed_s"]
        resumed_from = step

    def checkpoint() -> None:
        _save_checkpoint(checkpoint_path, {
            "recipe": recipe.to_dict(), "seed": seed, "step": step,
            "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "torch_rng": torch.get_rng_state(),
            "data_hash": data_hash, "history": history, "elapsed_s": elapsed,
        })

    total = recipe.total_steps
    bar = tqdm(total=total, initial=step, desc=f"train {recipe.name}", disable=not progress,
               dynamic_ncols=True)
    started = time.monotonic()
    base_elapsed = elapsed
    while step < total:
        if stop_after is not None and step >= stop_after:
            break
        phase = phase_at(recipe.phases, step)
        batch = builder.batch(phase, seed, step)
        data_hash = chain_digest(data_hash, batch.digest())
        loss, answer_loss, aux_loss = batch_loss(model, batch, recipe.aux_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        optimizer.step()
        scheduler.step()
        step += 1
        elapsed = base_elapsed + time.monotonic() - started
        history.append({"step": step, "loss": float(loss.detach()), "answer_loss": answer_loss,
                        "aux_loss": aux_loss, "length": int(batch.input_ids.shape[1]),
                        "lr": scheduler.get_last_lr()[0]})
        bar.set_postfix(ans=f"{answer_loss:.3f}" if answer_loss is not None else "-",
                        aux=f"{aux_loss:.3f}" if aux_loss is not None else "-",
                        len=batch.input_ids.shape[1])
        bar.update(1)
        if step % recipe.checkpoint_every == 0 or step == total:
            checkpoint()
    bar.close()
    if stop_after is not None and step < total:
        checkpoint()

    phase_ends, acc = [], 0
    for phase in recipe.phases:
        acc += phase.steps
        phase_ends.append(acc)
    plot_loss_curve(history, phase_ends, out_dir / LOSS_CURVE,
                    title=f"kvcert embedded model: recipe {recipe.name!r}, seed {seed}")
    (out_dir / HISTORY).write_text(json.dumps(history))
    model_dir = out_dir
    if step == total:
        model.save_pretrained(model_dir, safe_serialization=True)
        tokenizer.save_pretrained(model_dir, save_jinja_files=False)
    return TrainResult(out_dir, model_dir, step, elapsed, data_hash, history, resumed_from)
