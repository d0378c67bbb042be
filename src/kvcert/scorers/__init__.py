"""Importance scorers, one per file; ``SCORERS`` maps a name to its class."""

from __future__ import annotations

from .base import LayerObservation, Scorer, attention_probs, window_probs
from .h2o import H2OScorer
from .knorm import KeyNormScorer
from .snapkv import SnapKVScorer
from .streaming_llm import StreamingLLMScorer
from .tova import TOVAScorer
from .value_aware import ValueAwareScorer

SCORERS: dict[str, type[Scorer]] = {
    cls.name: cls
    for cls in (StreamingLLMScorer, H2OScorer, SnapKVScorer, TOVAScorer, KeyNormScorer, ValueAwareScorer)
}


def get_scorer(name: str | Scorer, **options) -> Scorer:
    """A scorer instance from its name (or the instance itself)."""
    if isinstance(name, Scorer):
        return name
    if name not in SCORERS:
        raise ValueError(f"scorer: unknown scorer {name!r}; choose one of {sorted(SCORERS)}")
    return SCORERS[name](**options)


__all__ = [
    "LayerObservation", "Scorer", "SCORERS", "get_scorer", "attention_probs", "window_probs",
    "H2OScorer", "KeyNormScorer", "SnapKVScorer", "StreamingLLMScorer", "TOVAScorer", "ValueAwareScorer",
]
