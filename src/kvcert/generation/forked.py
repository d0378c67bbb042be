"""The one generation path: the runs of one example, their prefills (shared where they can be) and one
greedy decode loop over batches of rows.

The runs of one example under several :class:`~kvcert.generation.spec.GenerationSpec`
(the full cache and {aware, streaming} × budgets × methods) share their prefill: eviction
happens after each layer's attention, so the prefill's hidden states do not depend on
the budget or the method (:mod:`kvcert.method.fork`). :func:`generate`

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
   few batches of similar width instead (:func:`kvcert.method.fork.width_buckets`).

A run that shares no prefill — chunked streaming (the multi-turn cell: each chunk is decided as
it leaves the window, :func:`forkable`), or a forkable run alone — is prefilled on its own
cache (:meth:`Engine.prefill <kvcert.generation.engine.Engine.prefill>`) and decoded in the same
loop as a batch of one row: one run alone is the one-row case of this path. Each row's record
is what a batch-1 run of its spec writes (:meth:`Engine.record
<kvcert.generation.engine.Engine.record>`): the same fields and meaning, its certificates folded
from its own batch row and only over the layers where it has a sampled tail, ``kv_bytes_*`` and
``sketch_bytes`` of its own row as a batch-1 cache would hold it. Timings are the row's share
of the shared work: ``prefill_seconds`` = shared prefill / variants + its group's forward /
group size, ``decode_seconds`` = Σ over the decode forwards it took part in of forward time /
rows, so a shard's timings still add up to its wall time. A forked row's greedy tokens agree
with the same run alone up to floating-point ties (batched matmuls may round differently in
the last bit); the test oracle, ``tests/batch1_oracle.py``, runs each spec alone with its own
loop, and the tests compare every path with it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import torch

from ..method.cache import CertifiedCache
from ..method.certificate import unit_roundoff
from ..method.fork import Branch, ForkingCache, join_view_caches, row_view_cache, stacked_cache, take_cache_rows, width_buckets
from ..tasks.prompting import build_prompt_ids
from .decode_step import ENTROPY, FINITE, LOGPROB, MARGIN, TOKEN, DecodeStep, decode_graph
from .engine import Engine, check_logits, greedy, refusing_non_finite, stop_rules, sync_device
from .signals import (CertificateTrace, StepSignals, add_rows, attention_entropy, evicted_mass, fold_recorded,
                      next_token_signals)


def forkable(engine: Engine) -> bool:
    """Whether a run can be forked from a shared prefill (chunked streaming cannot: from its second chunk on,
    each variant's hidden states depend on what it kept)."""
    return engine.spec.chunk_tokens is None


def _limit(record, spec) -> int:
    return int(record.metadata.get("max_new_tokens") or spec.max_new_tokens)


def _fold(traces, signals, cache, steps, positions) -> None:
    """Fold a forward's certificates and attention entropies into the traces and step signals of the
    rows at ``positions`` of a stacked cache (a trace None: no certificate)."""
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


def _fold_alone(trace, signals, steps) -> None:
    """Fold a forward's certificates into the trace of a run decoded on its own cache (every layer that
    recorded one certifies it)."""
    for step in steps:
        if trace is not None:
            trace.add(step)
        signals.add_attention(attention_entropy(step))


def _forward_rows(model, cache, tokens: list[int], rows: int, device) -> torch.Tensor:
    x = torch.tensor([tokens] * rows, dtype=torch.long, device=device)
    return model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]


@dataclass
class _Batch:
    """Rows decoded together: a stacked cache of forked rows, or one run's own cache (``alone``)."""

    cache: CertifiedCache
    rows: list[int]  # batch row -> run index
    logits: torch.Tensor  # [rows, V]: the next token's
    alone: bool = False
    tails: list | None = None  # per row: the layers that certify it (None: every layer that records)
    step: DecodeStep | None = None  # its decode step (None until the first token is taken from the prefill)


@torch.inference_mode()
def generate(engines: list[Engine], record) -> list[dict]:
    """The records of ``record`` under every engine's spec (same model), in the engines' order: the runs that
    can share a prefill fork from one, the others are prefilled alone, and all decode in one loop; NaN or
    ±inf in a forward or its logits is refused in one line naming the model folder."""
    if not engines:
        return []
    with refusing_non_finite(engines[0].model_path):
        return _generate(engines, record)


def _generate(engines: list[Engine], record) -> list[dict]:
    e0 = engines[0]
    model = e0.model
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    ids, question_start = build_prompt_ids(e0.tokenizer, record)
    specs = [e.spec for e in engines]
    conds = [s.condition for s in specs]
    if "streaming" in conds and not ids[question_start:]:
        raise ValueError("streaming: the prompt has no question part to feed after compression")
    roundoff = unit_roundoff(next(model.parameters()).dtype)
    traces = [CertificateTrace(s.certificate.delta, s.certificate.aggregations, e.num_layers, roundoff)
              if s.method.randomized else None for e, s in zip(engines, specs)]
    signals = [StepSignals(attention=not s.method.is_full) for s in specs]
    forks = [i for i, e in enumerate(engines) if forkable(e)]
    forks = forks if len(forks) > 1 else []  # one run alone shares nothing
    done = _Prefilled()
    batches = _prefill_forks(engines, forks, record, ids, question_start, traces, signals, done) if forks else []
    for i in range(len(engines)):
        if i not in forks:
            batches.append(_prefill_alone(engines[i], i, record, ids, question_start, traces[i], signals[i], done))
    return _decode(engines, record, ids, question_start, batches, traces, signals, done, roundoff, started)


@dataclass
class _Prefilled:
    """Per run: its share of the prefill's time, its kept fraction per layer, its evicted mass and its peak
    cache bytes during the prefill."""

    seconds: dict = field(default_factory=dict)
    kept_fraction: dict = field(default_factory=dict)
    mass: dict = field(default_factory=dict)
    peak: dict = field(default_factory=dict)


def _prefill_alone(engine: Engine, i: int, record, ids, question_start, trace, signals, done: _Prefilled) -> _Batch:
    """One run prefilled on its own cache, as its condition feeds the prompt (:meth:`Engine.prefill`)."""
    spec = engine.spec
    # spare slots for what is appended after the prompt's compaction: the question a streaming run feeds
    # then, and the generated tokens (no slot left unused at the longest answer, no copy to grow)
    fed_after = len(ids) - question_start if spec.condition == "streaming" else 0
    cache = CertifiedCache(record_certificates=spec.method.randomized, record_entropy=not spec.method.is_full,
                           reserve=fed_after + spec.max_new_tokens)
    sync_device(engine.device)
    t0 = time.perf_counter()
    logits = engine.prefill(ids, question_start, cache, engine.press(record.id))
    sync_device(engine.device)
    done.seconds[i] = time.perf_counter() - t0
    done.kept_fraction[i] = cache.kept_fraction()
    done.mass[i] = evicted_mass(cache.layers, spec.certificate.aggregations)
    _fold_alone(trace, signals, cache.pop_steps())
    return _Batch(cache, [i], logits.unsqueeze(0), alone=True)


def _prefill_forks(engines, forks, record, ids, question_start, traces, signals, done: _Prefilled) -> list[_Batch]:
    """The runs ``forks`` forked from one shared prefill (:mod:`kvcert.method.fork`), fed their question or last
    prompt token in stacked caches of similar width: the batches their decoding starts from."""
    e0 = engines[forks[0]]
    model, device = e0.model, e0.device
    specs = {i: engines[i].spec for i in forks}
    conds = {i: specs[i].condition for i in forks}
    question = ids[question_start:]
    sync_device(device)
    t0 = time.perf_counter()
    branches: dict[int, Branch] = {}
    for i in forks:
        if conds[i] != "full":
            end = question_start if conds[i] == "streaming" else len(ids) - 1
            branches[i] = Branch(engines[i].press(record.id), end)
    prefix = ids[:-1] if any(conds[i] != "streaming" for i in forks) else ids[:question_start]
    # the stacks' room takes the question; their spare slots, the longest answer
    shared = ForkingCache(list(branches.values()), reserve=max(specs[i].max_new_tokens for i in forks))
    model(input_ids=torch.tensor([prefix], dtype=torch.long, device=device), cache=shared, use_cache=True,
          logits_to_keep=1)
    sync_device(device)
    t_shared = time.perf_counter() - t0

    record_certs = any(traces[i] is not None for i in forks)
    sources = {i: branches[i].layers if i in branches else shared.layers for i in forks}
    for i in forks:
        done.mass[i] = evicted_mass(sources[i], specs[i].certificate.aggregations)
        done.peak[i] = branches[i].peak_nbytes if i in branches else 0
    del shared, branches  # the forks live on in the stacks
    # decode batches: every row in one, unless padding short rows to a long one (the full cache)
    # costs more than a further forward (kvcert.method.fork.width_buckets)
    widths = [sum(layer.length for layer in sources[i]) for i in forks]
    batches = []
    for bucket in width_buckets(widths):
        members = [forks[b] for b in bucket]
        stream = [i for i in members if conds[i] == "streaming"]
        rest = [i for i in members if conds[i] != "streaming"]
        order = stream + rest  # batch row -> run index
        # one stack for the bucket, with room for the feeds; each group's forward runs on a view of its rows
        batch = stacked_cache([sources[i] for i in order], record_certs, room=max(len(question), 1),
                              record_entropy=any(not specs[i].method.is_full for i in order))
        views, logits, start = [], [], 0
        for group, feed in ((stream, question), (rest, ids[-1:])):
            if not group:
                continue
            t = time.perf_counter()
            view = row_view_cache(batch, start, start + len(group))
            out = _forward_rows(model, view, feed, len(group), device)
            check_logits(out, e0.model_path)
            sync_device(device)
            dt = time.perf_counter() - t
            _fold([traces[i] for i in group], [signals[i] for i in group], view, view.pop_steps(), range(len(group)))
            for pos, i in enumerate(group):
                done.seconds[i] = t_shared / len(forks) + dt / len(group)
                done.kept_fraction[i] = [float(layer.kept[pos].float().mean()) / layer.seen for layer in view.layers]
            views.append(view)
            logits.append(out)
            start += len(group)
        join_view_caches(batch, views)
        batches.append(_Batch(batch, order, torch.cat(logits, 0)))
    return batches


def _decode(engines, record, ids, question_start, batches: list[_Batch], traces, signals, done: _Prefilled,
            roundoff: float, started: str) -> list[dict]:
    """Greedy decoding of every batch, a step of each at a time: a row that emits a stop token or reaches its
    limit is recorded and leaves its batch (a stacked one is repacked without it).

    A step (:class:`~kvcert.generation.decode_step.DecodeStep`: the forward, the greedy tokens, their
    log-probabilities, whether the logits were finite, the next-token signals) reads one tensor back from the
    device. The certificates and attention entropies stay in the batch's recorder until a row finishes or the
    batch ends (:func:`~kvcert.generation.signals.fold_recorded`), and the traces stay on the device until a record
    is written. ``KVCERT_DECODE_GRAPH=1`` replays the steps from a CUDA graph on a GPU."""
    e0 = engines[0]
    model, device = e0.model, e0.device
    specs = [e.spec for e in engines]
    stops, first_forbidden = stop_rules(e0.tokenizer, record, e0.eos)
    limits = [_limit(record, s) for s in specs]
    tokens: list[list[int]] = [[] for _ in engines]
    logprobs: list[list[float]] = [[] for _ in engines]
    decode_seconds = [0.0] * len(engines)
    records: dict[int, dict] = {}
    graph = decode_graph(device)  # KVCERT_DECODE_GRAPH: 0 or 1, else refused; 1 on a CPU said once and ignored
    for batch in batches:
        batch.tails = _row_layers(batch)
    while batches:
        for batch in list(batches):
            t = time.perf_counter()
            if batch.step is None:  # the first token: from the prefill's logits (the first-token rules apply)
                lp = torch.log_softmax(batch.logits.float(), dim=-1)
                best = greedy(lp, first_forbidden)
                picked = lp.gather(-1, best.unsqueeze(-1)).squeeze(-1)
                nts = next_token_signals(lp).to(torch.float64)
                read = torch.stack((best.to(torch.float64), picked.to(torch.float64),
                                    torch.isfinite(batch.logits).all(-1).to(torch.float64), nts[:, 0], nts[:, 1])).tolist()
                logits = batch.logits
            else:
                read = batch.step()
                logits = batch.step.logits
            if not all(read[FINITE]):
                check_logits(logits, e0.model_path)  # names the model in one line
            finished = []
            for pos, i in enumerate(batch.rows):
                token = int(read[TOKEN][pos])
                tokens[i].append(token)
                logprobs[i].append(read[LOGPROB][pos])
                signals[i].add_next_token_values(read[ENTROPY][pos], read[MARGIN][pos])
                if token in stops or len(tokens[i]) == limits[i]:
                    finished.append(pos)
            if finished:
                _fold_batch(batch, traces, signals)
            for pos in finished:
                i = batch.rows[pos]
                if batch.alone:  # its own cache: what a batch-1 run's cache reports
                    peak, final, sketch = batch.cache.peak_nbytes, batch.cache.nbytes(), batch.cache.sketch_nbytes()
                else:
                    final = sum(layer.row_nbytes(pos) for layer in batch.cache.layers)
                    sketch = sum(layer.row_sketch_bytes[pos] for layer in batch.cache.layers)
                    peak = max(done.peak.get(i, 0), final)
                records[i] = engines[i].record(
                    record, ids, question_start, tokens[i], logprobs[i],
                    traces[i] or CertificateTrace(specs[i].certificate.delta, specs[i].certificate.aggregations,
                                                  engines[i].num_layers, roundoff),
                    done.kept_fraction[i], signals[i], done.mass[i], prefill_seconds=done.seconds[i],
                    decode_seconds=decode_seconds[i], kv_bytes_peak=peak, kv_bytes_final=final, sketch_bytes=sketch,
                    started=started,
                )
            if finished:
                keep = [pos for pos in range(len(batch.rows)) if pos not in finished]
                if not keep:
                    batches.remove(batch)
                    continue
                batch.cache = take_cache_rows(batch.cache, keep)
                batch.rows = [batch.rows[pos] for pos in keep]
                batch.tails = None if batch.tails is None else [batch.tails[pos] for pos in keep]
                batch.step = None
            if batch.step is None:  # a new step for these rows: their last tokens, at the position they reached
                batch.cache.static_decode = batch.cache.static_decode or graph  # a replayed step: the kernels' plans
                batch.step = DecodeStep(model, batch.cache, [tokens[i][-1] for i in batch.rows],
                                        batch.cache.get_seq_length(), device, graph=graph)
            sync_device(device)
            dt = time.perf_counter() - t
            for i in batch.rows:
                decode_seconds[i] += dt / len(batch.rows)
    return [records[i] for i in range(len(engines))]


def _row_layers(batch: _Batch) -> list[set] | None:
    """Per batch row, the layers that certify it (where it has a sampled tail), read once per batch; None for a run
    on its own cache (every layer that records certifies it)."""
    if batch.alone:
        return None
    tails = [layer.row_tail.tolist() for layer in batch.cache.layers]
    return [{i for i, rows in enumerate(tails) if rows[pos]} for pos in range(len(batch.rows))]


def _fold_batch(batch: _Batch, traces, signals) -> None:
    """Fold what the batch's recorder holds into its rows' traces and step signals."""
    fold_recorded(batch.cache.recorder, [traces[i] for i in batch.rows], [signals[i] for i in batch.rows], batch.tails)
