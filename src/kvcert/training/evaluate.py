"""Greedy full-cache accuracy of a model on the synthetic tasks.

:func:`evaluate` generates ``n_examples`` records per task and length (evaluation seed,
below the training seed range), answers each greedily with the full KV cache, scores
it with the task's scorer, and returns ``{task: {length: accuracy}}`` where accuracy is
the share of records with score >= 1.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from tqdm.auto import tqdm

from kvcert.method.integration import cache_argument
from kvcert.tasks import TASKS, build_prompt_ids, is_correct

EVAL_SEED = 0
#: records of the regime table: a seed in the training range (training draws its records
#: from TRAIN_SEED_OFFSET + the recipe's seed, so none of these is trained on for seeds
#: other than 777); recipes and task difficulty are chosen on these, never on smoke seeds
REGIME_SEED = 1_000_777
MAX_NEW_TOKENS = 16


@torch.no_grad()
def greedy_ids(model: Any, input_ids: list[int], max_new_tokens: int = MAX_NEW_TOKENS,
               eos_token_id: int | None = None) -> list[int]:
    """Greedy continuation of ``input_ids`` with a full KV cache (stops at EOS)."""
    device = next(model.parameters()).device
    ids = torch.tensor([input_ids], device=device)
    cache_arg = cache_argument(model)
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    past = getattr(out, cache_arg)
    generated: list[int] = []
    next_id = int(out.logits[0, -1].argmax())
    position = ids.shape[1]
    while True:
        if next_id == eos_token_id:
            break
        generated.append(next_id)
        if len(generated) >= max_new_tokens:
            break
        step = torch.tensor([[next_id]], device=device)
        out = model(input_ids=step, use_cache=True,
                    position_ids=torch.tensor([[position]], device=device), **{cache_arg: past})
        past = getattr(out, cache_arg)
        position += 1
        next_id = int(out.logits[0, -1].argmax())
    return generated




def record_sets(tokenizer: Any, tasks: list[str], lengths: list[int], n_examples: int, seed: int,
                options: dict[str, dict[str, Any]] | None = None):
    """``(task, length, records)`` for every task and length: the evaluation records (filling
    their length, as the training data: :data:`~kvcert.training.data.FILL_LENGTH`)."""
    from .data import FILL_LENGTH

    for task in tasks:
        for length in lengths:
            yield task, length, TASKS[task].generate(tokenizer, n_examples, length, seed,
                                                     **{**FILL_LENGTH.get(task, {}), **(options or {}).get(task, {})})


def answer(model: Any, tokenizer: Any, record: Any, max_new_tokens: int = MAX_NEW_TOKENS) -> str:
    """The model's greedy answer to ``record`` (special tokens removed)."""
    ids, _ = build_prompt_ids(tokenizer, record)
    out = greedy_ids(model, ids, max_new_tokens, tokenizer.eos_token_id)
    return tokenizer.decode(out, skip_special_tokens=True).strip()


def evaluate(
    model: Any,
    tokenizer: Any,
    tasks: Iterable[str],
    lengths: Iterable[int],
    n_examples: int,
    seed: int = EVAL_SEED,
    options: dict[str, dict[str, Any]] | None = None,
    progress: bool = True,
    details: list[dict[str, Any]] | None = None,
) -> dict[str, dict[str, float]]:
    """Full-cache greedy accuracy per task and length (lengths as string keys, for JSON).

    If ``details`` is a list, one dict per record (id, prediction, answers, correct) is
    appended to it.
    """
    tasks, lengths = list(tasks), list(lengths)
    options = options or {}
    was_training = model.training
    model.eval()
    result: dict[str, dict[str, float]] = {}
    bar = tqdm(total=len(tasks) * len(lengths) * n_examples, desc="evaluate", disable=not progress)
    for task, length, records in record_sets(tokenizer, tasks, lengths, n_examples, seed, options):
        correct = 0
        for record in records:
            prediction = answer(model, tokenizer, record)
            ok = is_correct(task, prediction, record.answers)
            correct += ok
            if details is not None:
                details.append({"id": record.id, "task": task, "length": length,
                                "prediction": prediction, "answers": record.answers,
                                "correct": ok})
            bar.update(1)
        result.setdefault(task, {})[str(length)] = correct / max(1, len(records))
    bar.close()
    model.train(was_training)
    return result


def evaluate_compressed(
    model: Any,
    tokenizer: Any,
    tasks: Iterable[str],
    lengths: Iterable[int],
    n_examples: int,
    *,
    condition: str = "streaming",
    scorer: str = "snapkv",
    sampler: str = "topk",
    budget: float = 0.125,
    seed: int = EVAL_SEED,
    progress: bool = True,
) -> dict[str, dict[str, float]]:
    """Greedy accuracy with an evicted cache, through the generation engine.

    Same records as :func:`evaluate`; ``condition`` ``"streaming"`` compresses the
    context before the question is seen. The model is switched to kvcert attention for
    the measurement and back afterwards.
    """
    from kvcert.generation.engine import Engine
    from kvcert.generation.forked import generate
    from kvcert.generation.spec import GenerationSpec, MethodSpec
    from kvcert.method.integration import enable_certified_attention
    from kvcert.method.models import ModelSpec

    tasks, lengths = list(tasks), list(lengths)
    previous = model.config._attn_implementation
    enable_certified_attention(model)
    spec = GenerationSpec(
        model=ModelSpec(name="embedded"),
        method=MethodSpec(name=f"{scorer}-{sampler}", scorer=scorer, sampler=sampler),
        condition=condition, budget=budget, seed=seed, max_new_tokens=MAX_NEW_TOKENS,
    )
    engine = Engine(model, tokenizer, spec)
    result: dict[str, dict[str, float]] = {}
    bar = tqdm(total=len(tasks) * len(lengths) * n_examples, desc=f"evaluate {condition} {budget:g}",
               disable=not progress)
    try:
        for task, length, records in record_sets(tokenizer, tasks, lengths, n_examples, seed):
            correct = 0
            for record in records:
                out = generate([engine], record)[0]
                correct += is_correct(task, out["answer"], record.answers)
                bar.update(1)
            result.setdefault(task, {})[str(length)] = correct / max(1, len(records))
    finally:
        bar.close()
        model.set_attn_implementation(previous)
    return result


#: the conditions × budgets of the regime table (the smoke grid's, docs/design.md §6)
REGIME_CELLS: tuple[tuple[str, float], ...] = (
    ("aware", 0.125), ("aware", 0.25), ("aware", 0.5), ("streaming", 0.125), ("streaming", 0.25),
)
REGIME_SAMPLERS: tuple[str, ...] = ("topk", "poisson")


def evaluate_regime(
    model: Any,
    tokenizer: Any,
    tasks: Iterable[str],
    lengths: Iterable[int],
    n_examples: int,
    seed: int,
    *,
    cells: Iterable[tuple[str, float]] = REGIME_CELLS,
    samplers: Iterable[str] = REGIME_SAMPLERS,
    scorer: str = "snapkv",
    progress: bool = True,
) -> dict[str, Any]:
    """Which regime the model puts eviction in: full-cache accuracy and, per condition
    and budget (pooled over ``samplers``), the *induced-failure rate* — among records the
    full cache answers correctly, the share of compressed runs that fail (docs/design.md §2).

    Returns ``{"full": {task: {length: acc}}, "induced": {"aware@0.25": {task: rate,
    "pooled": rate}, ...}, "counts": {...}}``; rates are ``None`` where no record is
    correct with the full cache. ``seed`` picks the records: choose one in the training
    seed range (never a smoke or paper seed) when a recipe or task difficulty is being
    chosen with it.
    """
    from kvcert.generation.engine import Engine
    from kvcert.generation.forked import generate
    from kvcert.generation.spec import GenerationSpec, MethodSpec
    from kvcert.method.integration import enable_certified_attention
    from kvcert.method.models import ModelSpec

    tasks, lengths, cells, samplers = list(tasks), list(lengths), list(cells), list(samplers)
    previous = model.config._attn_implementation
    was_training = model.training
    model.eval()
    enable_certified_attention(model)
    engines = {"full": Engine(model, tokenizer, GenerationSpec(
        model=ModelSpec(name="embedded"), method=MethodSpec(), condition="full", budget=1.0,
        seed=0, max_new_tokens=MAX_NEW_TOKENS))}
    for condition, budget in cells:
        for sampler in samplers:
            engines[(condition, budget, sampler)] = Engine(model, tokenizer, GenerationSpec(
                model=ModelSpec(name="embedded"),
                method=MethodSpec(name=f"{scorer}-{sampler}", scorer=scorer, sampler=sampler),
                condition=condition, budget=budget, seed=0, max_new_tokens=MAX_NEW_TOKENS))
    full: dict[str, dict[str, float]] = {}
    # (cell name, task) -> [failures, runs] over records the full cache gets right
    tally: dict[tuple[str, str], list[int]] = {}
    total = len(tasks) * len(lengths) * n_examples * (1 + len(cells) * len(samplers))
    bar = tqdm(total=total, desc="evaluate regime", disable=not progress)
    try:
        for task, length, records in record_sets(tokenizer, tasks, lengths, n_examples, seed):
            correct = 0
            for record in records:
                ok = is_correct(task, generate([engines["full"]], record)[0]["answer"], record.answers)
                correct += ok
                bar.update(1)
                for condition, budget in cells:
                    name = f"{condition}@{budget:g}"
                    for sampler in samplers:
                        if ok:
                            out = generate([engines[(condition, budget, sampler)]], record)[0]
                            counts = tally.setdefault((name, task), [0, 0])
                            counts[0] += not is_correct(task, out["answer"], record.answers)
                            counts[1] += 1
                        bar.update(1)
            full.setdefault(task, {})[str(length)] = correct / max(1, len(records))
    finally:
        bar.close()
        model.set_attn_implementation(previous)
        model.train(was_training)
    induced: dict[str, dict[str, float | None]] = {}
    for condition, budget in cells:
        name = f"{condition}@{budget:g}"
        row: dict[str, float | None] = {}
        pooled = [0, 0]
        for task in tasks:
            failures, runs = tally.get((name, task), [0, 0])
            row[task] = failures / runs if runs else None
            pooled[0] += failures
            pooled[1] += runs
        row["pooled"] = pooled[0] / pooled[1] if pooled[1] else None
        induced[name] = row
    return {"full": full, "induced": induced, "seed": seed, "examples": n_examples,
            "samplers": samplers, "scorer": scorer}


def format_regime(regime: dict[str, Any]) -> str:
    """The regime table as text: full-cache accuracy, then induced-failure rates."""
    tasks = list(regime["full"])
    lines = [f"regime (seed {regime['seed']}, {regime['examples']} records per task and length, "
             f"{regime['scorer']} × {'/'.join(regime['samplers'])}):"]
    for task in tasks:
        lines.append(f"  full cache {task:>10}: " + "  ".join(
            f"{n} tokens {a:.3f}" for n, a in regime["full"][task].items()))
    for cell, row in regime["induced"].items():
        cells = "  ".join(f"{t} {'-' if row[t] is None else format(row[t], '.3f')}" for t in [*tasks, "pooled"])
        lines.append(f"  induced failures {cell:>15}: {cells}")
    return "\n".join(lines)
