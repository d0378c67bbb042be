"""Importance scorers, one per file; ``SCORERS`` maps a name to its class."""

from __future__ import annotations

from ...config.names import KVPRESS_PREFIX, SCORER_OPTIONS, check_implemented
from .base import LayerObservation, Scorer, attention_probs, window_probs
from .h2o import H2OScorer
from .kvpress_scorer import KvpressScorer, press_options
from .knorm import KeyNormScorer
from .snapkv import SnapKVScorer
from .streaming_llm import StreamingLLMScorer
from .tova import TOVAScorer
from .value_aware import ValueAwareScorer

SCORERS: dict[str, type[Scorer]] = {
    cls.name: cls
    for cls in (StreamingLLMScorer, H2OScorer, SnapKVScorer, TOVAScorer, KeyNormScorer, ValueAwareScorer)
}

check_implemented("scorers", SCORER_OPTIONS, SCORERS)
for _name, _cls in SCORERS.items():
    check_implemented(f"scorer {_name}'s options", SCORER_OPTIONS[_name], _cls.__dataclass_fields__)


def scorer_options(name: str) -> set[str]:
    """The option names a scorer takes (its dataclass fields; a kvpress press's own fields)."""
    if name.startswith(KVPRESS_PREFIX):
        return press_options(name)
    if name not in SCORERS:
        raise ValueError(f"scorer: unknown scorer {name!r}; choose one of {sorted(SCORERS)} or kvpress:<ScorerPress>")
    return set(SCORERS[name].__dataclass_fields__)


def get_scorer(name: str | Scorer, **options) -> Scorer:
    """A scorer instance from its name (or the instance itself); ``kvpress:<Class>`` names a
    kvpress ``ScorerPress`` (:mod:`kvcert.method.scorers.kvpress_scorer`)."""
    if isinstance(name, Scorer):
        return name
    if isinstance(name, str) and name.startswith(KVPRESS_PREFIX):
        return KvpressScorer(press_name=name, options=dict(options))
    if name not in SCORERS:
        raise ValueError(f"scorer: unknown scorer {name!r}; choose one of {sorted(SCORERS)} or kvpress:<ScorerPress>")
    return SCORERS[name](**options)


__all__ = [
    "KVPRESS_PREFIX", "LayerObservation", "Scorer", "SCORERS", "get_scorer", "scorer_options", "attention_probs", "window_probs",
    "H2OScorer", "KeyNormScorer", "KvpressScorer", "SnapKVScorer", "StreamingLLMScorer", "TOVAScorer", "ValueAwareScorer",
]
