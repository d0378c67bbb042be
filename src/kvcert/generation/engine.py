"""Question-aware and streaming generation over a compressed cache: one spec's prefill and record.

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

Decoding is greedy (:func:`kvcert.generation.forked.generate`, the one generation path, decodes
every run); decode-time tokens enter the cache with π = 1. The record keeps the
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
from contextlib import contextmanager

import torch

from ..method.cache import CertifiedCache
from ..checks import NonFiniteError
from ..method.press import EvictionPress
from ..method.scorers import get_scorer
from ..tasks import score_record
from .record import PROVENANCE_FIELDS, GenerationRecord
from .signals import CertificateTrace, StepSignals, confidence
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
    """One :class:`GenerationSpec` with a loaded model: its press, its prefill of a prompt under the spec's
    condition, and the record of a finished run. The runs themselves go through the one generation path,
    :func:`kvcert.generation.forked.generate` (one engine alone is its one-row case)."""

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
    def press(self, record_id: str) -> EvictionPress | None:
        """The spec's press for the example ``record_id`` (its budget, its seed for that example); None for the
        full cache."""
        m = self.spec.method
        if m.is_full:
            return None
        return EvictionPress(
            scorer=get_scorer(m.scorer, **m.scorer_options), budget=float(self.spec.budget), sampler=m.sampler,
            allocation=m.allocation, design=m.design, seed=example_seed(self.spec.seed, record_id),
            rounding=m.rounding,
        )

    def forward(self, ids: list[int], cache: CertifiedCache) -> torch.Tensor:
        """One forward of ``ids`` over ``cache``; the logits [V] of the next token (non-finite ones refused)."""
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        with refusing_non_finite(self.model_path):
            out = self.model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[0, -1]
        check_logits(logits, self.model_path)
        return logits

    def prefill(self, ids: list[int], question_start: int, cache: CertifiedCache, press) -> torch.Tensor:
        """Feed the prompt to ``cache`` as the spec's condition does (the module docstring), ``press`` armed where
        it compresses; returns the logits [V] of the first answer token. Used for a run that shares no prefill
        (:func:`kvcert.generation.forked.generate` decodes it with the others)."""
        cond, chunk = self.spec.condition, self.spec.chunk_tokens
        if cond == "full":
            return self.forward(ids, cache)
        if cond == "aware":
            cache.arm(press)
            self.forward(ids[:-1], cache)
            cache.pop_steps()
            return self.forward(ids[-1:], cache)
        context, question = ids[:question_start], ids[question_start:]
        if not question:
            raise ValueError("streaming: the prompt has no question part to feed after compression")
        if chunk is None:
            cache.arm(press)
            self.forward(context, cache)
        else:
            for start in range(0, len(context), chunk):
                cache.schedule.arm_chunk(press)
                self.forward(context[start : start + chunk], cache)
        cache.pop_steps()
        return self.forward(question, cache)

    def record(self, record, ids: list[int], question_start: int, tokens: list[int],
               logprobs: list[float], trace: CertificateTrace, kept_fraction: list[float], signals: StepSignals,
               evicted: dict | None, *, prefill_seconds: float, decode_seconds: float, kv_bytes_peak: int,
               kv_bytes_final: int, sketch_bytes: int, started: str) -> dict:
        """The JSON-ready generation record of one run of the engine's spec (every run of
        :func:`kvcert.generation.forked.generate`)."""
        spec = self.spec
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
