"""One prefill per example, every eviction variant forked from it and decoded together.

The runs of one example under several :class:`~kvcert.generation.spec.GenerationSpec`
(the full cache and {aware, streaming} × budgets × methods) share their prefill: eviction
happens after each layer's attention, so the prefill's hidden states do not depend on
the budget or the method (:mod:`kvcert.fork`). :func:`run_forked`

1. prefills the prompt minus its last token once over the full cache (only the context,
   when every run is streaming); after each layer's attention every variant compacts its
   copy of the layer — a streaming variant the context's slots with the context's
   queries, an aware variant every prefilled slot — exactly as its batch-1 run's armed
   press does (same observation, same generator seed and round);
2. feeds the question to the streaming variants (one batch) and the last prompt token to
   the aware variants and the full cache (another batch);
3. decodes every variant greedily as one batch: ragged per-(row, KV head) kept lengths,
   padding slots with log π = +inf; a row that emits EOS or reaches its limit is
   recorded and dropped from the batch (the rest repacked, so it costs nothing more).
   Where padding short rows to a long one would cost more than one more forward (the
   full cache among caches compressed to 12.5 %, at long contexts), the rows decode in a
   few batches of similar width instead (:func:`kvcert.fork.width_buckets`).

Each row's record is what :meth:`Engine.run <kvcert.generation.engine.Engine.run>` would
write: the same fields and meaning, its certificates folded from its own batch row and
only over the layers where it has a sampled tail, ``kv_bytes_*`` and ``sketch_bytes`` of
its own row as a batch-1 cache would hold it. Timings are the row's share of the shared
work: ``prefill_seconds`` = shared prefill / variants + its group's forward / group size,
``decode_seconds`` = Σ over the decode forwards it took part in of forward time / rows, so
a shard's timings still add up to its wall time. Chunked streaming (the multi-turn
cell: each chunk is decided as it leaves the window) keeps the batch-1 path
(:func:`forkable`). The greedy tokens agree with the batch-1 path up to floating-point
ties (batched matmuls may round differently in the last bit).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import torch

from ..certificate import unit_roundoff
from ..fork import (Branch, ForkingCache, join_view_caches, row_nbytes, row_view_cache, stacked_cache,
                    take_cache_rows, width_buckets)
from ..tasks.prompting import build_prompt_ids
from .engine import Engine, sync_device, check_logits, greedy, refusing_non_finite, stop_rules
from .signals import CertificateTrace, StepSignals, add_rows, attention_entropy, evicted_mass, next_token_signals


def forkable(engine: Engine) -> bool:
    """Whether a run can be forked from the shared prefill (chunked streaming cannot)."""
    return engine.spec.chunk_tokens is None


def _limit(record, spec) -> int:
    return int(record.metadata.get("max_new_tokens") or spec.max_new_tokens)


def _fold(traces, signals, cache, steps, positions) -> None:
    """Fold a forward's certificates and attention entropies into the traces and step signals of the
    rows at ``positions`` (a trace None: no certificate)."""
    for step in steps:
        entropy = attention_entropy(step)
        for pos, sig in zip(positions, signals):
            sig.add_attention(entropy, pos)
    rows = [(pos, trace) for pos, trace in zip(positions, traces) if trace is not None]
    if not rows:
        return
    tails = [layer.row_tail.tolist() for layer in cache.layers]
    for step in steps:
        add_rows([trace for _, trace in rows], step, [pos for pos, _ in rows],
                 [{i for i in step.variance if tails[i][pos]} for pos, _ in rows])


def _forward_rows(model, cache, tokens: list[int], rows: int, device) -> torch.Tensor:
    x = torch.tensor([tokens] * rows, dtype=torch.long, device=device)
    return model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]


@torch.inference_mode()
def run_forked(engines: list[Engine], record) -> list[dict]:
    """The records of ``record`` under every engine's spec (same model), in the engines' order; NaN or
    ±inf in a forward or its logits is refused in one line naming the model folder."""
    if not engines:
        return []
    with refusing_non_finite(engines[0].model_path):
        return _run_forked(engines, record)


def _run_forked(engines: list[Engine], record) -> list[dict]:
    if any(not forkable(e) for e in engines):
        raise ValueError("run_forked: chunked streaming runs keep the batch-1 path (Engine.run)")
    e0 = engines[0]
    model, device = e0.model, e0.device
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    ids, question_start = build_prompt_ids(e0.tokenizer, record)
    specs = [e.spec for e in engines]
    conds = [s.condition for s in specs]
    question = ids[question_start:]
    if "streaming" in conds and not question:
        raise ValueError("streaming: the prompt has no question part to feed after compression")
    roundoff = unit_roundoff(next(model.parameters()).dtype)
    traces = [CertificateTrace(s.certificate.delta, s.certificate.aggregations, e.num_layers, roundoff)
              if s.method.randomized else None for e, s in zip(engines, specs)]

    sync_device(device)
    t0 = time.perf_counter()
    branches: dict[int, Branch] = {}
    for i, (e, s) in enumerate(zip(engines, specs)):
        if s.condition != "full":
            end = question_start if s.condition == "streaming" else len(ids) - 1
            branches[i] = Branch(e.press(record.id, s.budget), end)
    prefix = ids[:-1] if any(c != "streaming" for c in conds) else ids[:question_start]
    shared = ForkingCache(list(branches.values()))
    model(input_ids=torch.tensor([prefix], dtype=torch.long, device=device), cache=shared, use_cache=True,
          logits_to_keep=1)
    sync_device(device)
    t_shared = time.perf_counter() - t0

    record_certs = any(t is not None for t in traces)
    sources = {i: branches[i].layers if i in branches else shared.layers for i in range(len(engines))}
    mass = {i: evicted_mass(sources[i], s.certificate.aggregations) for i, s in enumerate(specs)}
    signals = [StepSignals(attention=not s.method.is_full) for s in specs]
    peak = {i: b.peak_nbytes for i, b in branches.items()}
    del shared, branches  # the forks live on in the stacks
    # decode batches: every row in one, unless padding short rows to a long one (the full cache)
    # costs more than a further forward (kvcert.fork.width_buckets)
    widths = [sum(layer.length for layer in sources[i]) for i in range(len(engines))]
    batches, prefill_seconds, kept_fraction = [], {}, {}
    for bucket in width_buckets(widths):
        stream = [i for i in bucket if conds[i] == "streaming"]
        rest = [i for i in bucket if conds[i] != "streaming"]
        order = stream + rest  # batch row -> run index
        # one stack for the bucket, with room for the feeds; each group's forward runs on a view of its rows
        batch = stacked_cache([sources[i] for i in order], record_certs, room=max(len(question), 1),
                              record_entropy=any(not specs[i].method.is_full for i in order))
        views, logits, start = [], [], 0
        for members, feed in ((stream, question), (rest, ids[-1:])):
            if not members:
                continue
            t = time.perf_counter()
            view = row_view_cache(batch, start, start + len(members))
            out = _forward_rows(model, view, feed, len(members), device)
            check_logits(out, e0.model_path)
            sync_device(device)
            dt = time.perf_counter() - t
            _fold([traces[i] for i in members], [signals[i] for i in members], view, view.pop_steps(),
                  range(len(members)))
            for pos, i in enumerate(members):
                prefill_seconds[i] = t_shared / len(engines) + dt / len(members)
                kept_fraction[i] = [float(layer.kept[pos].float().mean()) / layer.seen for layer in view.layers]
            views.append(view)
            logits.append(out)
            start += len(members)
        join_view_caches(batch, views)
        batches.append([batch, order, torch.cat(logits, 0)])
    del sources

    stops, first_forbidden = stop_rules(e0.tokenizer, record, e0.eos)
    limits = [_limit(record, s) for s in specs]
    tokens: list[list[int]] = [[] for _ in engines]
    logprobs: list[list[float]] = [[] for _ in engines]
    decode_seconds = [0.0] * len(engines)
    records: dict[int, dict] = {}
    while batches:
        for entry in list(batches):
            cache, active, step_logits = entry
            t = time.perf_counter()
            lp = torch.log_softmax(step_logits.float(), dim=-1)
            best = greedy(lp, first_forbidden if not tokens[active[0]] else set())  # rows of a batch step together
            picked = lp.gather(-1, best.unsqueeze(-1)).squeeze(-1)
            best, picked = best.tolist(), picked.tolist()
            step_signals = next_token_signals(lp)
            finished = []
            for pos, i in enumerate(active):
                tokens[i].append(best[pos])
                logprobs[i].append(picked[pos])
                signals[i].add_next_token(step_signals, pos)
                if best[pos] in stops or len(tokens[i]) == limits[i]:
                    finished.append(pos)
            for pos in finished:
                i = active[pos]
                final = sum(row_nbytes(layer, pos) for layer in cache.layers)
                sketch = sum(layer.row_sketch_bytes[pos] for layer in cache.layers)
                records[i] = engines[i].record(
                    record, specs[i], ids, question_start, tokens[i], logprobs[i],
                    traces[i] or CertificateTrace(specs[i].certificate.delta, specs[i].certificate.aggregations,
                                                  engines[i].num_layers, roundoff),
                    kept_fraction[i], signals[i], mass[i], prefill_seconds=prefill_seconds[i],
                    decode_seconds=decode_seconds[i],
                    kv_bytes_peak=max(peak.get(i, 0), final), kv_bytes_final=final, sketch_bytes=sketch,
                    started=started,
                )
            if finished:
                keep = [pos for pos in range(len(active)) if pos not in finished]
                if not keep:
                    batches.remove(entry)
                    continue
                cache = entry[0] = take_cache_rows(cache, keep)
                active = entry[1] = [active[pos] for pos in keep]
            x = torch.tensor([tokens[i][-1] for i in active], dtype=torch.long, device=device).unsqueeze(-1)
            entry[2] = model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
            check_logits(entry[2], e0.model_path)
            _fold([traces[i] for i in active], [signals[i] for i in active], cache, cache.pop_steps(),
                  range(len(active)))
            sync_device(device)
            dt = time.perf_counter() - t
            for i in active:
                decode_seconds[i] += dt / len(active)
    return [records[i] for i in range(len(engines))]
