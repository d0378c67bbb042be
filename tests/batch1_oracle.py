"""The test oracle of generation: one spec, one example, its own cache and its own greedy loop.

The package has one generation path, :func:`kvcert.generation.forked.generate` (forked rows decoded
in batches; a run alone is its one-row case). This module keeps the plainest possible run of a
single spec — prefill as its condition feeds the prompt (:meth:`Engine.prefill`), then a greedy
loop one token at a time over that one cache — so that every record of the production path can be
compared with what the spec alone gives (``tests/test_forked.py``).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import torch

from kvcert.method.cache import CertifiedCache
from kvcert.method.certificate import unit_roundoff
from kvcert.generation.engine import Engine, greedy, refusing_non_finite, stop_rules
from kvcert.generation.signals import (
    CertificateTrace,
    StepSignals,
    attention_entropy,
    evicted_mass,
    next_token_signals,
)
from kvcert.tasks.prompting import build_prompt_ids


@torch.inference_mode()
def run_alone(engine: Engine, record) -> dict:
    """The generation record of ``record`` under ``engine``'s spec, batch 1 from prefill to the last token."""
    with refusing_non_finite(engine.model_path):
        return _run_alone(engine, record)


def _run_alone(engine: Engine, record) -> dict:
    spec = engine.spec
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    ids, question_start = build_prompt_ids(engine.tokenizer, record)
    limit = int(record.metadata.get("max_new_tokens") or spec.max_new_tokens)
    cache = CertifiedCache(record_certificates=spec.method.randomized, record_entropy=not spec.method.is_full)
    trace = CertificateTrace(spec.certificate.delta, spec.certificate.aggregations, engine.num_layers,
                             unit_roundoff(next(engine.model.parameters()).dtype))
    t0 = time.perf_counter()
    logits = engine.prefill(ids, question_start, cache, engine.press(record.id))
    t1 = time.perf_counter()
    kept_fraction = cache.kept_fraction()
    mass = evicted_mass(cache.layers, spec.certificate.aggregations)
    tokens: list[int] = []
    logprobs: list[float] = []
    signals = StepSignals(attention=not spec.method.is_full)
    stops, first_forbidden = stop_rules(engine.tokenizer, record, engine.eos)
    for step in range(limit):
        for s in cache.pop_steps():
            trace.add(s)
            signals.add_attention(attention_entropy(s))
        lp = torch.log_softmax(logits.float(), dim=-1)
        tok = int(greedy(lp, first_forbidden if step == 0 else set()))
        tokens.append(tok)
        logprobs.append(float(lp[tok]))
        signals.add_next_token(next_token_signals(lp))
        if tok in stops or step == limit - 1:
            break
        logits = engine.forward([tok], cache)
    t2 = time.perf_counter()
    return engine.record(record, ids, question_start, tokens, logprobs, trace, kept_fraction, signals, mass,
                         prefill_seconds=t1 - t0, decode_seconds=t2 - t1, kv_bytes_peak=cache.peak_nbytes,
                         kv_bytes_final=cache.nbytes(), sketch_bytes=cache.sketch_nbytes(), started=started)
