"""Test fixtures: synthetic generation records and replay tables with planted effects.

Used by the known-answer tests (records built so a claim's verdict is known) and by
``kvcert bench report`` (paper-shaped records at paper scale); no pipeline stage imports
it. Nothing here is a result: every number is drawn from the stated generative model.

:func:`make_record` builds one :class:`~kvcert.generation.record.GenerationRecord`
(the type the engine builds, so a fixture has exactly its fields); its certificate trace
is constant over decode steps, so every aggregation of it equals ``signal`` (the robust
certificate's, 1.25 × ``signal``). The comparison signals are constant over
steps too: ``signals`` maps ``output_entropy``, ``top2_margin``, ``attention_entropy``,
``evicted_mass``, ``evicted_mass_expected`` to the value every step / aggregation takes.

The record's ``answer`` and ``answers`` realise its ``score`` under the task's metric
(:func:`scored_answer`): the analysis rescores every record from its answer, so a
fixture's score is what its answer earns, never a number pasted beside it.

:func:`paper_records` simulates the paper's main grid — models × lengths × tasks ×
examples × 13 runs (the full cache, and {aware, streaming} × {12.5, 25, 50} % ×
{top-k, Poisson}) — under a simple latent model: an example is answerable by the full
cache with probability ``p_full``; eviction damage grows as the budget shrinks and
is larger when streaming; a damaged run of an answerable example fails (cache-induced),
an unanswerable one fails anyway (inherent); the Poisson run's certificate grows with
the damage, the answer's log-probability falls with failure of either kind; the
comparison signals follow :func:`comparison_signals` (drawn from a stream of their own).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from .atomic import write_text
from .config.names import AGGREGATIONS
from .generation.record import GenerationRecord, certificate_field, evicted_mass_field

GRID_BUDGETS = (0.125, 0.25, 0.5)
GRID_CONDITIONS = ("aware", "streaming")
GRID_SAMPLERS = ("topk", "poisson")
#: the model digest fixture records carry (one model folder: every fixture record of a model the same)
FIXTURE_MODEL_DIGEST = "f1c7ed16e57d16e5"


def certificate_block(signal: float, steps: int, layers: int, delta: float = 0.1) -> dict:
    """A certificate trace whose every step and aggregation equals ``signal`` (relative and absolute)."""
    per_step = [float(signal)] * steps
    return certificate_field(
        delta, {a: list(per_step) for a in AGGREGATIONS},
        {a: [float(signal) * (1.0 + 0.1 * math.log1p(t)) for t in range(steps)] for a in AGGREGATIONS},
        {a: list(per_step) for a in AGGREGATIONS}, [float(signal) ** 2 / 10.0] * steps,
        {a: [float(signal)] * layers for a in AGGREGATIONS},
    )


#: reference tokens of a fractional score (fixed width: no token is a substring of another)
_WORDS = [f"w{i:03d}" for i in range(100)]


def scored_answer(task: str, score: float | None) -> tuple[str, list[str], dict]:
    """(answer, reference answers, task metadata) whose score under ``task``'s metric
    (:func:`kvcert.tasks.score_record`) is ``score``: 1 and 0 with one reference
    ``x``; a multiple of 0.01 with 100 reference words of which the answer holds that share
    (RULER's string match: 100 references; recall and LongBench's F1: one 100-word
    reference, the answer as long, so precision = recall = F1); None: no references."""
    from .tasks import task_of

    family = task_of(task)  # a family's records carry its data set (LongBench's metric reads it)
    metadata = {"dataset": task.removeprefix(family.prefix), "all_classes": None} if family.prefix else {}
    if score is None:
        return "x", [], metadata
    if float(score) in (0.0, 1.0):
        return ("x" if score else ""), ["x"], metadata
    k = round(100 * float(score))
    if abs(k / 100 - float(score)) > 1e-12:
        raise ValueError(f"make_record: a score of {score} is not a multiple of 0.01; pass answer= and answers=")
    if task in ("needle", "lookalike"):
        return " ".join(_WORDS[:k]), list(_WORDS), metadata
    return " ".join(_WORDS[:k] + [f"z{i:03d}" for i in range(100 - k)]), [" ".join(_WORDS)], metadata


DEFAULT_SIGNALS = {"output_entropy": 0.5, "top2_margin": 0.5, "attention_entropy": 2.0, "evicted_mass": 0.3,
                   "evicted_mass_expected": 0.3}


def make_record(
    example_id: str, *, model: str = "m", task: str = "needle", target_tokens: int = 512, condition: str = "aware",
    sampler: str | None = "poisson", budget: float = 0.25, seed: int = 0, score: float | None = 1.0,
    signal: float | None = None, mean_logprob: float | None = -0.5, prereg_hash: str = "h",
    started_utc: str = "2030-01-01T00:00:00+00:00", turn_distance: int | None = None, decode_steps: int = 4,
    layers: int = 4, signals: dict | None = None, **extra,
) -> dict:
    """One generation record (``condition="full"`` gives the full-cache run); ``extra`` replaces fields."""
    full = condition == "full"
    if full:
        sampler, budget = None, 1.0
    method = "full" if full else f"snapkv-{sampler}"
    randomized = sampler in ("poisson", "priority")
    cert = certificate_block(signal, decode_steps, layers) if randomized and signal is not None else None
    robust = certificate_block(1.25 * signal, decode_steps, layers) if cert is not None else None
    tokens = list(range(5, 5 + decode_steps))
    lp = -0.5 if mean_logprob is None else float(mean_logprob)
    answer, answers, task_metadata = scored_answer(task, score)
    metadata = {"target_tokens": target_tokens, "depth": 50, **task_metadata}
    if turn_distance is not None:
        metadata["turn_distance"] = turn_distance
    sig = {**DEFAULT_SIGNALS, **(signals or {})}
    mass = None if full else evicted_mass_field({a: sig["evicted_mass"] for a in AGGREGATIONS},
                                                 {a: sig["evicted_mass_expected"] for a in AGGREGATIONS}
                                                 if randomized else None)
    record = GenerationRecord(
        example_id=example_id, task=task, target_tokens=target_tokens, prompt_tokens=target_tokens,
        question_tokens=20, model=model, condition=condition, method=method, scorer=None if full else "snapkv",
        sampler=sampler, allocation=None if full else "uniform", budget=float(budget), seed=seed, answer=answer,
        tokens=tokens, token_logprobs=[lp] * decode_steps, mean_logprob=mean_logprob,
        min_logprob=None if mean_logprob is None else lp - 1.0, answers=answers, score=score,
        certificate=cert, certificate_status=("certified" if cert is not None else None) if randomized else None,
        certificate_robust=robust, kept_fraction=[float(budget)] * layers,
        output_entropy_steps=[sig["output_entropy"]] * decode_steps, top2_margin_steps=[sig["top2_margin"]] * decode_steps,
        attention_entropy_steps=None if full else [sig["attention_entropy"]] * decode_steps, evicted_mass=mass,
        prefill_seconds=0.01, decode_seconds=0.01, decode_steps=decode_steps, kv_bytes_peak=1000, kv_bytes_final=500,
        sketch_bytes=10, metadata=metadata, started_utc=started_utc, config_hash="c0ffee", prereg_hash=prereg_hash,
        git_commit="0" * 40, kvcert_version="0.1.0", model_digest=FIXTURE_MODEL_DIGEST,
    ).to_dict()
    record.update(extra)
    return record


def paper_records(
    models: Sequence[str], lengths: Sequence[int], tasks: dict[str, int], prereg_hash: str, started_utc: str,
    seed: int = 0, p_full: float = 0.6, decode_steps: int = 16, layers: int = 28,
) -> Iterator[dict]:
    """Paper-shaped records (see the module docstring); ``tasks`` maps task name → examples."""
    rng = np.random.default_rng(seed)
    side = np.random.default_rng([seed, 18])  # the comparison signals' own stream: the other draws stay as they were
    damage_scale = {"aware": 0.6, "streaming": 1.8}
    for model in models:
        for length in lengths:
            for task, n in tasks.items():
                for i in range(n):
                    eid = f"{task}-{length}-{i}"
                    answerable = rng.random() < p_full
                    base = dict(model=model, task=task, target_tokens=length, decode_steps=decode_steps, layers=layers,
                                prereg_hash=prereg_hash, started_utc=started_utc)
                    yield make_record(eid, condition="full", score=float(answerable),
                                      mean_logprob=float(-0.3 - (0 if answerable else 1.0) + 0.5 * rng.normal()), **base)
                    for cond in GRID_CONDITIONS:
                        for budget in GRID_BUDGETS:
                            damage = damage_scale[cond] * (0.5 - budget) * rng.lognormal(0.0, 0.8)
                            for sampler in GRID_SAMPLERS:
                                broken = rng.random() < 1.0 - math.exp(-damage)
                                ok = answerable and not broken if answerable else rng.random() < 0.05
                                signal = float(0.05 + 0.2 * damage + 0.05 * rng.random()) if sampler == "poisson" else None
                                lp = float(-0.3 - (0.0 if ok else 1.0) + 0.5 * rng.normal())
                                yield make_record(eid, condition=cond, sampler=sampler, budget=budget, score=float(ok),
                                                  signal=signal, mean_logprob=lp,
                                                  signals=comparison_signals(side, damage, ok), **base)


def comparison_signals(rng: np.random.Generator, damage: float, ok: bool) -> dict:
    """A compressed run's comparison signals under :func:`paper_records`' latent model: the output entropy
    and top-2 margin shift weakly with failure of either kind, the attention entropy is noise, the evicted
    mass (and, for a randomized run, its expectation) grows with the eviction damage."""
    mass = float(min(1.0, 0.1 + 0.25 * damage + 0.15 * rng.random()))
    return {"output_entropy": float(1.0 + 0.25 * (not ok) + 0.5 * rng.normal()),
            "top2_margin": float(np.clip(0.5 - 0.08 * (not ok) + 0.25 * rng.normal(), 0.0, 1.0)),
            "attention_entropy": float(3.0 + 0.2 * rng.normal()), "evicted_mass": mass,
            "evicted_mass_expected": float(np.clip(mass * (1.0 + 0.1 * rng.normal()), 0.0, 1.0))}


def multiturn_records(
    model: str, n: int, prereg_hash: str, started_utc: str, seed: int = 0, length: int = 2048, budget: float = 0.1,
    decode_steps: int = 8, layers: int = 4,
) -> Iterator[dict]:
    """The multi-turn cell: full cache, top-k and Poisson runs per example, turn distance 1–30.

    Top-k forgets a fact with probability growing with its distance; the Poisson run
    forgets it as often, and its certificate is high exactly when it forgot.
    """
    rng = np.random.default_rng(seed)
    base = dict(model=model, task="multiturn", target_tokens=length, condition="streaming", budget=budget,
                decode_steps=decode_steps, layers=layers, prereg_hash=prereg_hash, started_utc=started_utc)
    for i in range(n):
        distance = 1 + i % 30
        eid = f"multiturn-{i}"
        full_ok = rng.random() < 0.97
        forget = min(0.98, 0.3 + distance / 30.0)
        extra = dict(turn_distance=distance)
        yield make_record(eid, **{**base, "condition": "full"}, score=float(full_ok), **extra)
        yield make_record(eid, sampler="topk", score=float(full_ok and rng.random() > forget), **base, **extra)
        lost = rng.random() < forget
        yield make_record(eid, sampler="poisson", score=float(full_ok and not lost),
                          signal=float(0.2 + 0.1 * rng.random() if lost else 0.05 * rng.random()), **base, **extra)


def frozen_copy(source: str | Path, dest: str | Path, resamples: int | None = None,
                stability_seeds: int | None = None):
    """Copy a pre-registration (claims.yaml, grids/) to ``dest`` and freeze the copy; returns the freeze.
    ``resamples`` / ``stability_seeds``: the copy's bootstrap resamples and stability seeds instead of the
    registered numbers (a test of known answers does not need the registered precision; everything else
    stays as registered)."""
    import yaml

    from .config.prereg import freeze

    source, dest = Path(source), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "claims.yaml", dest / "claims.yaml")
    if resamples is not None or stability_seeds is not None:
        doc = yaml.safe_load((dest / "claims.yaml").read_text())
        if resamples is not None:
            doc["analysis_plan"]["bootstrap"]["resamples"] = int(resamples)
        if stability_seeds is not None:
            doc["analysis_plan"]["bootstrap"]["stability_seeds"] = int(stability_seeds)
        write_text(dest / "claims.yaml", yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    if (source / "grids").exists():
        shutil.copytree(source / "grids", dest / "grids", dirs_exist_ok=True)
    return freeze(dest)


def write_shard(records, path: str | Path) -> Path:
    """Write records as a finished, sealed JSONL shard (one object per line)."""
    from .generation.shards import write_seal

    path = Path(path)
    records = list(records)
    write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    write_seal(path, path, len(records))
    return path


def replay_frame(
    cells: int, draws: int, later: int, seed: int = 0, overshoot: float = 1.05, informative: bool = True,
    layers: int = 32, heads: int = 8, budgets: Sequence[float] = GRID_BUDGETS, robust_scale: float = 1.25,
    sample_dependent: bool = False, diverged: bool = True, spread: float = 0.2, floor: float = 0.05,
    informative_within: bool = True,
):
    """A replay table (the columns of :func:`kvcert.generation.replay.replay_model`) with a known certificate.

    ``cells`` groups of (example, layer, head, budget), each with ``draws`` draws of the
    setting query and ``later`` later queries. The radius has a per-group scale and a
    per-draw factor lognormal(0, ``spread``); the error is radius × U(``floor``, ``overshoot``),
    so coverage is (1 − floor) / (overshoot − floor); with ``informative=False`` the radius is
    drawn independently of the error; with ``informative_within=False`` it keeps the group's
    scale but its per-draw factor is drawn independently of the error's (it knows the cell,
    not the draw). The robust
    radius is ``robust_scale`` × the radius. With ``sample_dependent`` the later rows are
    repeated as the sample-dependent query kind (their own decode path), marked ``diverged`` from
    the second decode step on when ``diverged`` (the compressed run fed other tokens than the full run).
    """
    import pandas as pd

    from .generation.replay_table import REPLAY_COLUMNS

    rng = np.random.default_rng(seed)
    steps = later + 1
    n = cells * draws * steps
    cell = np.repeat(np.arange(cells), draws * steps)
    scale = rng.lognormal(0.0, 1.0, cells)[cell]
    radius = scale * rng.lognormal(0.0, spread, n)
    error = radius * rng.uniform(floor, overshoot, n)
    if not informative:
        radius = rng.lognormal(0.0, 1.0, n)
    elif not informative_within:
        radius = scale * rng.lognormal(0.0, spread, n)
    budgets = np.asarray(budgets, dtype=float)
    nb = budgets.size
    step = np.tile(np.arange(steps), cells * draws)
    anytime = radius * (1.0 + 0.2 * step)
    df = pd.DataFrame({
        "model": "synthetic", "example_id": (cell // (nb * layers * heads)).astype(str), "target_tokens": 512,
        "layer": ((cell // nb) % layers).astype(np.int16), "head": ((cell // (nb * layers)) % heads).astype(np.int16),
        "kv_head": (((cell // (nb * layers)) % heads) // 2).astype(np.int16), "budget": budgets[cell % nb],
        "query_kind": np.where(step == 0, "setting", "later"), "step": step.astype(np.int16),
        "draw": np.tile(np.repeat(np.arange(draws), steps), cells).astype(np.int32), "kept": 100, "diverged": False,
        "error": error, "radius": radius, "anytime_radius": anytime, "variance": radius**2 / 4.0,
        "range_term": radius / 10.0, "output_norm": 1.0, "radius_robust": robust_scale * radius,
        "anytime_radius_robust": robust_scale * anytime, "shadow_sum": radius**2 / 8.0, "shadow_range": radius / 20.0,
        "covered": error <= radius, "covered_anytime": error <= anytime, "covered_robust": error <= robust_scale * radius,
        "covered_anytime_robust": error <= robust_scale * anytime,
    })
    if sample_dependent:
        own = df[df["step"] > 0].assign(query_kind="sample_dependent")
        own["diverged"] = diverged & (own["step"] >= 2)
        df = pd.concat([df, own], ignore_index=True)
    return df[REPLAY_COLUMNS]
