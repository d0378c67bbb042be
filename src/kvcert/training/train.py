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
the mean cross-entropy over answer tokens, plus ``aux_weight`` times the mean over
auxiliary next-token targets, plus ``retrieval_weight`` times the retrieval loss: the
negative log attention mass that one head (``retrieval_layer``, ``retrieval_head``)
puts on the source positions of the tokens to be retrieved (see
:mod:`kvcert.training.data`), plus ``local_weight`` times the loss of the *local*
heads (``local_heads``: layer, head, offset), each taught to attend ``offset`` tokens
back during the first ``local_steps`` steps, so that every position carries its
preceding tokens: the features both sides of a retrieval match on; plus
``entity_weight`` times the *entity* loss: one head (``entity_head``) taught to attend
from the positions after a fact's key to that key (so that every token of a fact's
sentence, and the end of a question or answer prefix, carries which key it is about);
plus ``question_weight`` times the *question* loss: the retrieval head, at a
question's positions after its key, taught to attend to the sentence stating the fact
(the question-time attention a question-aware eviction scorer reads: every token of
the sentence, so KL from uniform over it; ``question_heads``, the retrieval head by
default); plus
``readout_weight`` times the *readout* loss: the retrieval head's output when it
attends to a source position alone, read through the final norm and ``lm_head``,
must name the token that stands there. Attention alone is not enough: the first
recipes' retrieval head found the right needle piece with weight ≈ 1.0 and the model
still wrote a wrong one (its value/output path could not tell number tokens apart).
The model itself stays a plain ``LlamaForCausalLM``; only its training signal is richer.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from kvcert.atomic import write_text
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


class RetrievalProbe:
    """Captures the input of one attention layer during the forward pass, so that the
    attention of one of its heads can be recomputed at a few query positions."""

    def __init__(self, model: Any, layer: int, head: int):
        self.attention = model.model.layers[layer].self_attn
        config = model.config
        self.head = head
        self.kv_head = head // (config.num_attention_heads // config.num_key_value_heads)
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.captured: dict[str, Any] = {}
        self.handle = self.attention.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module: Any, args: tuple, kwargs: dict) -> None:
        self.captured["hidden"] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        self.captured["rope"] = kwargs["position_embeddings"]

    def log_attention(self, rows: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        """Log attention weights (N, T) of the head at (row, query) pairs (causal)."""
        from transformers.models.llama.modeling_llama import rotate_half

        hidden = self.captured["hidden"]  # (B, T, hidden)
        cos, sin = self.captured["rope"]  # (1 or B, T, head_dim)
        q = self._project(hidden[rows, queries], self.attention.q_proj, self.head)
        k = self._project(hidden, self.attention.k_proj, self.kv_head)
        q_rows = rows if cos.shape[0] > 1 else torch.zeros_like(rows)
        q = q * cos[q_rows, queries] + rotate_half(q) * sin[q_rows, queries]
        k = k * cos + rotate_half(k) * sin  # (B, T, d)
        scores = q.new_empty((len(rows), hidden.shape[1]))
        for row in torch.unique(rows).tolist():  # one key matrix per sequence
            members = (rows == row).nonzero().squeeze(-1)
            scores[members] = q[members] @ k[row].T
        scores = scores * self.attention.scaling
        positions = torch.arange(scores.shape[1], device=scores.device)
        scores = scores.masked_fill(positions[None, :] > queries[:, None], float("-inf"))
        return torch.log_softmax(scores, dim=-1)

    def head_output(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """What the head adds to the residual stream (N, hidden) when it attends only to
        ``(row, position)``: its slice of ``o_proj`` applied to its KV head's value there."""
        d = self.head_dim
        value = self._project(self.captured["hidden"][rows, positions], self.attention.v_proj, self.kv_head)
        return F.linear(value, self.attention.o_proj.weight[:, self.head * d:(self.head + 1) * d])

    def _project(self, x: torch.Tensor, proj: Any, index: int) -> torch.Tensor:
        """``x`` through the rows of the linear map ``proj`` that belong to head ``index``."""
        rows = slice(index * self.head_dim, (index + 1) * self.head_dim)
        return F.linear(x, proj.weight[rows], None if proj.bias is None else proj.bias[rows])

    def close(self) -> None:
        self.handle.remove()


def attention_mass_loss(probe: RetrievalProbe, targets: Sequence[tuple[int, int, list[int]]],
                        limit: int | None = None, spread: bool = False) -> torch.Tensor:
    """Mean over ``(row, query, positions)`` of -log(attention mass of the probe's head
    on ``positions``); at most ``limit`` targets, evenly spaced (cost).

    ``spread``: instead, KL(uniform over ``positions`` ‖ attention) — the head must
    attend to *every* target position, not just put its mass somewhere among them."""
    if limit is not None and len(targets) > limit:
        stride = len(targets) / limit
        targets = [targets[int(i * stride)] for i in range(limit)]
    rows = torch.tensor([r for r, _, _ in targets])
    queries = torch.tensor([q for _, q, _ in targets])
    log_attention = probe.log_attention(rows, queries)
    valid = torch.zeros_like(log_attention, dtype=torch.bool)
    for n, (_, _, positions) in enumerate(targets):
        valid[n, positions] = True
    if spread:
        count = valid.sum(-1)
        mean_log = log_attention.masked_fill(~valid, 0.0).sum(-1) / count
        return -(mean_log + torch.log(count.to(mean_log.dtype))).mean()
    return -torch.logsumexp(log_attention.masked_fill(~valid, float("-inf")), dim=-1).mean()


def batch_loss(
    model: Any,
    batch: Batch,
    aux_weight: float,
    probe: RetrievalProbe | None = None,
    retrieval_weight: float = 0.0,
    local_probes: Sequence[tuple[RetrievalProbe, int]] = (),
    local_weight: float = 0.0,
    local_queries: int = 64,
    readout_weight: float = 0.0,
    entity_probe: RetrievalProbe | None = None,
    entity_weight: float = 0.0,
    question_probes: Sequence[RetrievalProbe] = (),
    question_weight: float = 0.0,
    target_limit: int = 512,
) -> tuple[torch.Tensor, dict[str, float | None]]:
    """Total loss and its parts; logits only where a target exists.

    ``answer_loss`` and ``aux_loss``: next-token cross-entropy on response tokens and on
    auxiliary targets; ``retrieval_loss``: -log attention mass of the retrieval head on
    the source positions; ``local_loss``: -log attention of each local head on the token
    ``offset`` positions back (at ``local_queries`` evenly spaced positions per row);
    ``entity_loss``: -log attention mass of the entity head on the key; ``question_loss``:
    KL(uniform over the fact's sentence ‖ attention) of each question head, averaged (at
    most ``target_limit`` targets each).
    """
    hidden = model.model(input_ids=batch.input_ids).last_hidden_state[:, :-1]
    roles = batch.roles[:, 1:]
    targets = batch.input_ids[:, 1:]
    total = hidden.new_zeros(())
    parts: dict[str, float | None] = {}
    for name, role, weight in (("answer_loss", ANSWER, 1.0), ("aux_loss", AUX, aux_weight)):
        mask = roles == role
        if not bool(mask.any()):
            parts[name] = None
            continue
        logits = model.lm_head(hidden[mask])
        loss = F.cross_entropy(logits, targets[mask])
        total = total + weight * loss
        parts[name] = float(loss.detach())
    parts["retrieval_loss"] = parts["readout_loss"] = None
    supervised = probe is not None and bool(batch.retrieval)
    if supervised:
        rows = torch.tensor([r for r, _, _ in batch.retrieval])
    if supervised and retrieval_weight > 0:
        loss = attention_mass_loss(probe, batch.retrieval)
        total = total + retrieval_weight * loss
        parts["retrieval_loss"] = float(loss.detach())
    if supervised and readout_weight > 0:
        sources = torch.tensor([positions[0] for _, _, positions in batch.retrieval])
        logits = model.lm_head(model.model.norm(probe.head_output(rows, sources)))
        loss = F.cross_entropy(logits, batch.input_ids[rows, sources])
        total = total + readout_weight * loss
        parts["readout_loss"] = float(loss.detach())
    parts["entity_loss"] = parts["question_loss"] = None
    if entity_probe is not None and entity_weight > 0 and batch.entity:
        loss = attention_mass_loss(entity_probe, batch.entity, target_limit)
        total = total + entity_weight * loss
        parts["entity_loss"] = float(loss.detach())
    if question_probes and question_weight > 0 and batch.question:
        loss = torch.stack([attention_mass_loss(q, batch.question, target_limit, spread=True)
                            for q in question_probes]).mean()
        total = total + question_weight * loss
        parts["question_loss"] = float(loss.detach())
    parts["local_loss"] = None
    if local_probes and local_weight > 0:
        size, width = batch.input_ids.shape
        losses = []
        for local, offset in local_probes:
            positions = torch.arange(offset, width, max(1, (width - offset) // local_queries))
            rows = torch.arange(size).repeat_interleave(len(positions))
            queries = positions.repeat(size)
            log_attention = local.log_attention(rows, queries)
            losses.append(-log_attention[torch.arange(len(rows)), queries - offset].mean())
        loss = torch.stack(losses).mean()
        total = total + local_weight * loss
        parts["local_loss"] = float(loss.detach())
    return total, parts


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
    probe = RetrievalProbe(model, recipe.retrieval_layer, recipe.retrieval_head)
    local_probes = [(RetrievalProbe(model, layer, head), offset)
                    for layer, head, offset in recipe.local_heads]
    entity_probe = None if recipe.entity_head is None else RetrievalProbe(model, *recipe.entity_head)
    question_heads = recipe.question_heads or ((recipe.retrieval_layer, recipe.retrieval_head),)
    question_probes = [probe if (layer, head) == (recipe.retrieval_layer, recipe.retrieval_head)
                       else RetrievalProbe(model, layer, head) for layer, head in question_heads]

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
        loss, parts = batch_loss(model, batch, recipe.aux_weight, probe, recipe.retrieval_weight,
                                 local_probes if step < recipe.local_steps else (), recipe.local_weight,
                                 readout_weight=recipe.readout_weight, entity_probe=entity_probe,
                                 entity_weight=recipe.entity_weight, question_probes=question_probes,
                                 question_weight=recipe.question_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        optimizer.step()
        scheduler.step()
        step += 1
        elapsed = base_elapsed + time.monotonic() - started
        history.append({"step": step, "loss": float(loss.detach()), **parts,
                        "length": int(batch.input_ids.shape[1]), "lr": scheduler.get_last_lr()[0]})
        bar.set_postfix({short: "-" if parts[key] is None else f"{parts[key]:.3f}"
                         for short, key in (("ans", "answer_loss"), ("aux", "aux_loss"),
                                            ("ret", "retrieval_loss"), ("ent", "entity_loss"),
                                            ("qst", "question_loss"))} | {"len": batch.input_ids.shape[1]})
        bar.update(1)
        if step % recipe.checkpoint_every == 0 or step == total:
            checkpoint()
    bar.close()
    probe.close()
    for local, _ in local_probes:
        local.close()
    for extra in {id(p): p for p in [entity_probe, *question_probes] if p is not None and p is not probe}.values():
        extra.close()
    if stop_after is not None and step < total:
        checkpoint()

    phase_ends, acc = [], 0
    for phase in recipe.phases:
        acc += phase.steps
        phase_ends.append(acc)
    plot_loss_curve(history, phase_ends, out_dir / LOSS_CURVE,
                    title=f"kvcert embedded model: recipe {recipe.name!r}, seed {seed}")
    write_text(out_dir / HISTORY, json.dumps(history))
    model_dir = out_dir
    if step == total:
        model.save_pretrained(model_dir, safe_serialization=True)
        tokenizer.save_pretrained(model_dir, save_jinja_files=False)
    return TrainResult(out_dir, model_dir, step, elapsed, data_hash, history, resumed_from)
