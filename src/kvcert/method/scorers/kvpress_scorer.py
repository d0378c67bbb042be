"""A kvpress press used as a kvcert scorer (docs/kvpress.md).

``scorer: kvpress:SnapKVPress`` (a method config, ``kvcert run method.scorer=kvpress:SnapKVPress``,
``generate_answer(method="kvpress:SnapKVPress-poisson")``) names any kvpress ``ScorerPress``;
:class:`KvpressScorer` calls its ``score(module, hidden_states, keys, values, attentions=None, kwargs)``
and kvcert's allocation and sampler decide what is kept (so ``sampler: poisson`` certifies it).
Options are the press's own fields (``scorer_options: {window_size: 64}``); its
``compression_ratio`` is set from kvcert's budget before each scoring (StreamingLLMPress's
scores depend on it). kvpress is imported only here, on first use. The other direction, a kvcert
press used as a kvpress press, is :mod:`kvcert.method.kvpress_bridge`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from ...config.names import KVPRESS_PREFIX as PREFIX
from .base import LayerObservation, Scorer


def _kvpress():
    try:
        import kvpress
    except ImportError as error:
        raise ValueError(f"scorer: kvpress scorers need the kvpress package ({error}); pip install kvpress "
                         "(docs/kvpress.md gives the versions that work with kvcert)") from None
    return kvpress


def press_class(name: str) -> type:
    """The kvpress ``ScorerPress`` class a ``kvpress:<Class>`` scorer name names."""
    kvpress = _kvpress()
    cls_name = name[len(PREFIX):]
    cls = getattr(kvpress, cls_name, None)
    scorer_press = kvpress.ScorerPress
    if not (isinstance(cls, type) and issubclass(cls, scorer_press)):
        known = sorted(n for n in dir(kvpress) if isinstance(getattr(kvpress, n), type)
                       and issubclass(getattr(kvpress, n), scorer_press))
        raise ValueError(f"scorer: {name!r} names no kvpress ScorerPress; choose one of "
                         f"{', '.join(PREFIX + n for n in known)}")
    return cls


def press_options(name: str) -> set[str]:
    """The scorer options of a ``kvpress:<Class>`` scorer: the press's fields but its compression ratio."""
    return {f.name for f in dataclasses.fields(press_class(name)) if f.name != "compression_ratio"}


@dataclass
class KvpressScorer(Scorer):
    """A kvpress ``ScorerPress`` as a kvcert scorer: its ``score`` over the layer's keys and
    values, from the attention module and hidden states of the forward (no attention weights:
    presses that read them, e.g. ObservedAttentionPress, are not supported). Scores below zero
    (KnormPress scores −‖k‖) are shifted per (row, KV head) by their least value, which keeps
    their order (top-k unchanged) and gives π ∝ a non-negative importance."""

    press_name: str = "kvpress:SnapKVPress"
    options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        cls = press_class(self.press_name)
        unknown = set(self.options) - press_options(self.press_name)
        if unknown:
            raise ValueError(f"method.scorer_options: {sorted(unknown)} are no fields of {self.press_name}; "
                             f"allowed: {sorted(press_options(self.press_name))}")
        self.press = cls(**self.options)
        self._prepared: set[int] = set()

    def prepare(self, module: torch.nn.Module) -> None:
        """What kvpress's ``with press(model):`` does before a press scores, once per model: every attention
        module gets the model's rotary embedding (``self_attn.rotary_emb``: ExpectedAttentionPress, CapPress
        read it) and the press its model-dependent fields (``post_init_from_model``: QFilterPress, KVzapPress).
        The model is the one :func:`~kvcert.method.integration.enable_certified_attention` switched ``module`` to."""
        ref = getattr(module, "_kvcert_model", None)
        model = ref() if ref is not None else None
        if model is None or id(model) in self._prepared:
            return
        inner = model.model.language_model if hasattr(model.model, "language_model") else model.model
        if hasattr(inner, "rotary_emb"):
            for layer in inner.layers:
                layer.self_attn.rotary_emb = inner.rotary_emb
        for hook in ("post_init_from_model", "__post_init_from_model__"):
            if callable(getattr(self.press, hook, None)):
                getattr(self.press, hook)(model)
                break
        self._prepared.add(id(model))

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.press_name

    @property
    def compression_ratio(self) -> float:
        """The press's compression ratio (kvcert's press sets it from its budget before scoring)."""
        return self.press.compression_ratio

    @compression_ratio.setter
    def compression_ratio(self, value: float) -> None:
        self.press.compression_ratio = value

    def score(self, obs: LayerObservation) -> torch.Tensor:
        if obs.module is None or obs.hidden_states is None:
            raise ValueError(f"scorer: {self.press_name} reads the attention module and hidden states, which this "
                             "observation lacks (it was not made in a forward of a model with kvcert attention)")
        self.prepare(obs.module)
        kwargs: dict[str, Any] = {"position_embeddings": obs.position_embeddings, "attention_mask": None}
        scores = self.press.score(obs.module, obs.hidden_states, obs.key, obs.value, None, kwargs).to(torch.float32)
        if scores.shape != obs.key.shape[:3]:
            raise ValueError(f"scorer: {self.press_name} returned scores of shape {tuple(scores.shape)}, "
                             f"not [batch, KV heads, tokens] = {tuple(obs.key.shape[:3])}")
        if obs.log_pi is not None:
            scores = scores.masked_fill(torch.isinf(obs.log_pi), float("inf"))  # padding: not the least
        least = scores.amin(-1, keepdim=True)
        return torch.where(least < 0, scores - least, scores)

