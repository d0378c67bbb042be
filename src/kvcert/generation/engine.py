"""Question-aware and streaming generation over a compressed cache, one record at a time.

Conditions (docs/design.md §2):

* ``full`` — no eviction.
* ``aware`` — context and question are prefilled together and compressed (every layer
  right after its attention); the last prompt token is then fed over the compressed
  cache, so the first answer token already depends on what was kept.
* ``streaming`` — the context alone is prefilled and compressed before the question is
  seen; the question (and the template up to the answer) follows at position ids that
  continue from the original context length (RoPE positions preserved). With
  ``chunk_tokens`` the context arrives in chunks and each token is decided once, when
  it leaves the recent window, its π fixed from then on (the multi-turn setting).

Decoding is greedy; decode-time tokens enter the cache with π = 1. The record keeps the
raw decoded answer (special tokens skipped, nothing stripped) and its task score, which
applies the benchmark's own post-processing only (:func:`kvcert.tasks.score_record`). Every
forward's certificates are folded into a :class:`~kvcert.generation.signals.CertificateTrace`:
the record carries the paper's plug-in certificate (``certificate``) and the robust one
(``certificate_robust``, from the layers' eviction sketches; ``sketch_bytes`` their memory,
included in ``kv_bytes_*``).

A model whose forward gives NaN or ±inf — in its logits, or in what the attention and the
eviction scores see — is refused (:class:`ModelOutputError`, one line naming the model
folder) before anything is recorded: broken weights never become empty "answers".
"""

from __future__ import annotations

import hashlib
import time
from contextlib import contextmanager
from datetime import datetime, timezone

import torch

from ..cache import CertifiedCache
from ..certificate import unit_roundoff
from ..checks import NonFiniteError
from ..press import EvictionPress
from ..scorers import get_scorer
from ..tasks import score_record
from ..tasks.prompting import build_prompt_ids
from .record import PROVENANCE_FIELDS, GenerationRecord
from .signals import CertificateTrace, StepSignals, attention_entropy, confidence, evicted_mass, next_token_signals
from .spec import GenerationSpec


def example_seed(seed: int, example_id: str) -> int:
    """A stable per-example seed: independent samples across examples, repeatable runs."""
    digest = hashlib.sha256(f"{seed}:{example_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % (2**62)


def eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    return ids


def stop_rules(tokenizer, record, eos: set[int]) -> tuple[set[int], set[int]]:
    """(the ids that end the answer, the ids its first token may not be) for ``record``.

    By default EOS ends the answer and nothing is forbidden. A record with
    ``metadata["stop_newline"]`` (LongBench's samsum) follows ``pred.py``: its ``generate``
    call stops at ``[tokenizer.eos_token_id, tokenizer.encode("\n")[-1]]`` and sets
    ``min_length`` to the prompt plus one, so a newline ends the answer and the first token
    may be neither of the two."""
    if not record.metadata.get("stop_newline"):
        return eos, set()
    stops = {int(tokenizer.encode("\n", add_special_tokens=False)[-1])}
    if tokenizer.eos_token_id is not None:
        stops.add(int(tokenizer.eos_token_id))
    return stops, stops


def greedy(lp: torch.Tensor, forbidden: set[int]) -> torch.Tensor:
    """The greedy token(s) of log-probabilities ``lp`` [..., V], never one of ``forbidden``."""
    if not forbidden:
        return lp.argmax(-1)
    masked = lp.clone()
    masked[..., sorted(forbidden)] = float("-inf")
    return masked.argmax(-1)


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class ModelOutputError(ValueError):
    """A model whose forward gives NaN or ±inf (broken weights, an overflowing dtype): nothing it
    generates is kept."""


def _broken(model_path: str, what: str) -> ModelOutputError:
    return ModelOutputError(
        f"model {model_path}: {what}; its weights (or dtype) are broken: check or replace the weights in "
        f"that folder (`kvcert check` runs one token per model)")


def check_logits(logits: torch.Tensor, model_path: str) -> None:
    """Refuse non-finite next-token logits in one line naming the model folder."""
    if not bool(torch.isfinite(logits).all()):
        raise _broken(model_path, "non-finite logits (NaN or ±inf)")


@contextmanager
def refusing_non_finite(model_path: str):
    """NaN or ±inf met inside a forward (attention inputs, eviction scores) → one line naming the model."""
    try:
        yield
    except NonFiniteError as exc:
        raise _broken(model_path, f"non-finite values inside its forward ({exc})") from None


def model_folder_label(path: str) -> str:
    """The folder a model config's ``path`` names, for messages ("embedded": the shipped one)."""
    if path == "embedded":
        from ..embedded import embedded_model_path

        return str(embedded_model_path())
    return path


def certificate_status(method, certificate, kept_fraction) -> str | None:
    """What a record's certificate field means: ``certified`` (a randomized tail was
    sampled), ``exact`` (nothing was evicted: the output is the full cache's),
    ``uncertified`` (tokens were evicted but no step had a random tail — e.g. the sinks
    and window alone exceed a short prompt's budget — so nothing certifies the error);
    None for the full cache and deterministic samplers (top-k cannot certify)."""
    if not method.randomized:
        return None
    if certificate is not None:
        return "certified"
    return "exact" if all(f >= 1.0 for f in kept_fraction) else "uncertified"


class Engine:
    """Runs one :class:`GenerationSpec` over task records with a loaded model."""

    def __init__(self, model, tokenizer, spec: GenerationSpec, provenance: dict | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.spec = spec
        self.provenance = {key: None for key in PROVENANCE_FIELDS} | dict(provenance or {})
        self.device = next(model.parameters()).device
        self.eos = eos_ids(model, tokenizer)
        self.num_layers = model.config.get_text_config().num_hidden_layers
        self.model_path = model_folder_label(spec.model.path)

    # --- pieces ----------------------------------------------------------------------
    def press(self, record_id: str, budget: float) -> EvictionPress | None:
        m = self.spec.method
        if m.is_full:
            return None
        return EvictionPress(
            scorer=get_scorer(m.scorer, **m.scorer_options), budget=float(budget), sampler=m.sampler,
            allocation=m.allocation, design=m.design, seed=example_seed(self.spec.seed, record_id),
            rounding=m.rounding,
        )

    def _forward(self, ids: list[int], cache: CertifiedCache) -> torch.Tensor:
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        with refusing_non_finite(self.model_path):
            out = self.model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[0, -1]
        check_logits(logits, self.model_path)
        return logits

    def _prefill(self, spec: GenerationSpec, ids: list[int], question_start: int, cache: CertifiedCache, press):
        """Feed the prompt according to the condition; returns the logits of the first answer token."""
        cond = spec.condition
        if cond == "full":
            return self._forward(ids, cache)
        if cond == "aware":
            cache.arm(press)
            self._forward(ids[:-1], cache)
            cache.pop_steps()
            return self._forward(ids[-1:], cache)
        context, question = ids[:question_start], ids[question_start:]
        if not question:
            raise ValueError("streaming: the prompt has no question part to feed after compression")
        chunk = spec.chunk_tokens
        if chunk is None:
            cache.arm(press)
            self._forward(context, cache)
        else:
            for start in range(0, len(context), chunk):
                cache.schedule.arm_chunk(press)
                self._forward(context[start : start + chunk], cache)
        cache.pop_steps()
        return self._forward(question, cache)

    # --- one record ------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, record) -> dict:
        """Generate an answer for ``record`` and return its JSON-ready generation record."""
        spec = self.spec
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        ids, question_start = build_prompt_ids(self.tokenizer, record)
        limit = int(record.metadata.get("max_new_tokens") or spec.max_new_tokens)
        cache = CertifiedCache(record_certificates=spec.method.randomized, record_entropy=not spec.method.is_full)
        press = self.press(record.id, spec.budget)
        trace = CertificateTrace(spec.certificate.delta, spec.certificate.aggregations, self.num_layers,
                                 unit_roundoff(next(self.model.parameters()).dtype))

        sync_device(self.device)
        t0 = time.perf_counter()
        logits = self._prefill(spec, ids, question_start, cache, press)
        sync_device(self.device)
        t1 = time.perf_counter()
        kept_fraction = cache.kept_fraction()
        mass = evicted_mass(cache.layers, spec.certificate.aggregations)
        tokens: list[int] = []
        logprobs: list[float] = []
        signals = StepSignals(attention=not spec.method.is_full)
        stops, first_forbidden = stop_rules(self.tokenizer, record, self.eos)
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
            logits = self._forward([tok], cache)
        sync_device(self.device)
        t2 = time.perf_counter()

        return self.record(record, spec, ids, question_start, tokens, logprobs, trace, kept_fraction, signals, mass,
                           prefill_seconds=t1 - t0, decode_seconds=t2 - t1, kv_bytes_peak=cache.peak_nbytes,
                           kv_bytes_final=cache.nbytes(), sketch_bytes=cache.sketch_nbytes(), started=started)

    def record(self, record, spec: GenerationSpec, ids: list[int], question_start: int, tokens: list[int],
               logprobs: list[float], trace: CertificateTrace, kept_fraction: list[float], signals: StepSignals,
               evicted: dict | None, *, prefill_seconds: float, decode_seconds: float, kv_bytes_peak: int,
               kv_bytes_final: int, sketch_bytes: int, started: str) -> dict:
        """The JSON-ready generation record of one run (shared by the batch-1 and the forked path)."""
        answer_tokens = [t for t in tokens if t not in self.eos]
        # the raw decoded answer, as LongBench's pred.py writes it: the benchmarks' own
        # post-processing (first line, ...) happens in their scorers, and nothing else
        answer = self.tokenizer.decode(answer_tokens, skip_special_tokens=True)
        value = score_record(record, answer) if record.answers else None
        m = spec.method
        certificate = trace.to_record()
        return GenerationRecord(
            example_id=record.id, task=record.task, target_tokens=record.metadata.get("target_tokens"),
            prompt_tokens=len(ids), question_tokens=len(ids) - question_start, model=spec.model.name,
            condition=spec.condition, method=m.name, scorer=m.scorer, sampler=m.sampler,
            allocation=None if m.is_full else m.allocation, budget=float(spec.budget), seed=spec.seed,
            answer=answer, tokens=tokens, token_logprobs=logprobs, **confidence(logprobs),
            answers=list(record.answers), score=value,
            certificate=certificate, certificate_status=certificate_status(m, certificate, kept_fraction),
            certificate_robust=trace.robust_record(), kept_fraction=kept_fraction,
            output_entropy_steps=signals.output_entropy, top2_margin_steps=signals.top2_margin,
            attention_entropy_steps=signals.attention_entropy, evicted_mass=evicted,
            prefill_seconds=prefill_seconds, decode_seconds=decode_seconds, decode_steps=len(tokens),
            kv_bytes_peak=kv_bytes_peak, kv_bytes_final=kv_bytes_final, sketch_bytes=sketch_bytes,
            metadata=dict(record.metadata), started_utc=started, **self.provenance,
        ).to_dict()
