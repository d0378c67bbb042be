"""One call from a context and a question to an answer over an evicted cache — kvcert's
counterpart of kvpress's text-generation pipeline.

    from kvcert import generate_answer
    out = generate_answer(model, tokenizer, context, question, method="snapkv-poisson", budget=0.25)
    out["answer"], out["certificate"], out["kept_fraction"]

The prompt is rendered through the tokenizer's chat template exactly as the pipeline's
records are (:mod:`kvcert.tasks.prompting`); the generation runs through the same engine
(:func:`kvcert.generation.forked.generate`), so the returned dict is a generation record:
the raw answer, its tokens and log-probabilities, the per-step certificates (plug-in and
robust), the kept fraction per layer and the cache's bytes. ``budget`` is the fraction
kept, ``compression_ratio`` kvpress's fraction removed (one of the two).

Which order, ``condition`` (the record's ``condition`` field says which one ran):

* ``"aware"`` (the default, the pre-registered question-aware condition): context and
  question are prefilled together and compressed after the question is seen;
* ``"streaming"`` — kvpress's order: the context alone is prefilled
  and compressed, then the question is fed over the compressed cache, as kvpress's
  text-generation pipeline does. With ``separator=""`` and the question carrying any
  separator (kvpress's pipeline renders ``context + question`` as one user message), the
  prompt is token for token the pipeline's, and a kvcert press answers the same in both
  (docs/kvpress.md). The same press can score very differently in the two orders;
* ``"full"``: no compression.

``method`` is a method name of the one grammar the pipeline's configs and ``kvcert run`` follow
(:mod:`kvcert.config.methods`): ``<policy>-<sampler>`` — ``snapkv-poisson``, ``tova-topk``,
``adakv-poisson``, ``pyramidkv-topk``, ``kvpress:SnapKVPress-poisson`` for a kvpress press as
the scorer — a shipped config's name (``snapkv-kvpress``: kvpress's own protected tokens and
rounding), or ``full``. The retention design is the pre-registered default (sinks, window,
top slice, floor) unless the method's config sets its own.
"""

from __future__ import annotations

from typing import Any


def generate_answer(model: Any, tokenizer: Any, context: str, question: str, *, method: str = "snapkv-poisson",
                    budget: float | None = None, compression_ratio: float | None = None,
                    condition: str = "aware", max_new_tokens: int = 32, separator: str = "\n\n",
                    answer_prefix: str = "", seed: int = 0, delta: float = 0.1) -> dict:
    """Answer ``question`` about ``context`` (see the module docstring). ``condition``:
    ``aware`` (default: compressed after the question), ``streaming`` (kvpress's order:
    compressed before it) or ``full``; ``method``: a method name
    (:mod:`kvcert.config.methods`: ``snapkv-poisson``, ``adakv-topk``, ``snapkv-kvpress``, …) or ``full``."""
    from .engine import Engine
    from .forked import generate
    from .spec import CertificateSpec, GenerationSpec, MethodSpec, generation_budget
    from ..method.integration import enable_certified_attention
    from ..config.methods import method_config
    from ..method.models import ModelSpec
    from ..tasks.records import TaskRecord

    if condition == "full" or method == "full":
        condition, method_spec, kept = "full", MethodSpec(), 1.0
    else:
        method_spec = MethodSpec.from_dict(method_config(method))
        kept = generation_budget(budget, compression_ratio, default=0.25)
    if model.config._attn_implementation != "kvcert":
        enable_certified_attention(model)
    spec = GenerationSpec(model=ModelSpec(name=getattr(model.config, "_name_or_path", "") or "model"),
                          method=method_spec, condition=condition, budget=kept, seed=seed,
                          max_new_tokens=max_new_tokens, certificate=CertificateSpec(delta=delta))
    record = TaskRecord(id="generate_answer", task="unscored", context=context, question=question, answers=["-"],
                        metadata={"target_tokens": 0}, separator=separator, answer_prefix=answer_prefix)
    out = generate([Engine(model, tokenizer, spec)], record)[0]
    for key in ("score", "answers", "metadata", "example_id", "task", "target_tokens"):
        out.pop(key, None)
    return out
