"""kvcert and NVIDIA kvpress, both ways (docs/kvpress.md).

**A kvcert press used as a kvpress press.** :func:`pressing` (what
``with press(model):`` of an :class:`~kvcert.press.EvictionPress` returns) compresses the
cache of the first forward that fills an empty cache, as kvpress's presses do, so the press
also goes into kvpress's pipeline (``pipeline(context, question=..., press=press)``):

* a kvcert :class:`~kvcert.cache.CertifiedCache` (``cache=`` of the pipeline) is armed with
  the press: the layers are compacted in place, log π is stored per slot and every later
  forward carries the certificates (plug-in and robust) of the sampled tail;
* a plain transformers cache (the pipeline's default ``DynamicCache``) gets the kept keys and
  values (each KV head padded to the longest, padding with log π = +inf), and the press
  leaves log π of the kept slots on the attention module (``module.kvcert_log_pi``), the way
  kvpress's Ada-KV leaves its masked indices; kvcert's attention adds the Hájek bias −log π
  (and −inf on padding) in every later forward. No certificate is recorded there.

The model is switched to kvcert's attention (:func:`~kvcert.integration.enable_certified_attention`);
over an uncompressed cache it is ordinary causal attention.

**A kvpress press used as a kvcert scorer.** ``scorer: kvpress:SnapKVPress`` (a method
config, ``kvcert run method.scorer=kvpress:SnapKVPress``, ``generate_answer(method=
"kvpress:SnapKVPress-poisson")``) names any kvpress ``ScorerPress``; :class:`KvpressScorer`
calls its ``score(module, hidden_states, keys, values, attentions=None, kwargs)`` and
kvcert's allocation and sampler decide what is kept (so ``sampler: poisson`` certifies it).
Options are the press's own fields (``scorer_options: {window_size: 64}``); its
``compression_ratio`` is set from kvcert's budget before each scoring (StreamingLLMPress's
scores depend on it). kvpress is imported only here, on first use.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from .scorers.base import LayerObservation, Scorer

PREFIX = "kvpress:"


# --- kvcert's press, the kvpress way -------------------------------------------------------
def compress_plain_layer(press, module: torch.nn.Module, cache, query: torch.Tensor, scaling: float) -> None:
    """Compress layer ``module.layer_idx`` of a plain transformers cache with a kvcert ``press``
    after the attention of the forward that filled it: the same scoring, allocation and
    sampling as a :class:`~kvcert.cache.CertifiedCache` (through a :class:`~kvcert.cache.CompactLayer`),
    the kept slots written back to the cache layer and their log π left on the module."""
    from .cache import CompactLayer

    plain = cache.layers[module.layer_idx]
    layer = CompactLayer(reserve=0)
    layer.update(plain.keys, plain.values)
    inputs = getattr(module, "_kvcert_inputs", None) or (None, None)
    num_layers = getattr(module.config, "num_hidden_layers", len(cache.layers))
    obs = LayerObservation(query=query, key=layer.keys, value=layer.values, log_pi=None, scaling=scaling,
                           layer_idx=module.layer_idx, num_layers=num_layers, module=module,
                           hidden_states=inputs[0], position_embeddings=inputs[1])
    with torch.no_grad():  # the kvpress way is inference: no graph (kvpress's own presses build none)
        press.compress_layer(layer, obs)
    plain.keys, plain.values = layer.keys.clone(), layer.values.clone()
    module.kvcert_log_pi = layer.log_pi.clone() if layer.needs_bias else None


@contextmanager
def pressing(press, model: torch.nn.Module) -> Iterator[None]:
    """``with press(model):``: compress the cache of each forward that fills an empty cache
    (see the module docstring), including the ``DynamicCache`` a forward without one makes
    (``model(ids, use_cache=True)``, as kvpress's presses do); the hooks are removed on exit."""
    from functools import partial

    from .cache import CertifiedCache
    from .integration import find_cache, decoder_of, attention_modules, enable_certified_attention

    from transformers import DynamicCache

    enable_certified_attention(model)
    decoder = decoder_of(model)

    def arm(module, args, kwargs):
        cache = find_cache(kwargs)
        if cache is None and _uses_cache(decoder, kwargs):
            # kvpress's contract: the cache the forward makes by itself is compressed too (no silent no-op)
            kwargs[decoder._kvcert_cache_name] = DynamicCache(config=decoder.config)
        elif isinstance(cache, CertifiedCache) and cache.get_seq_length() == 0 and not cache.armed:
            cache.arm(press)
        return args, kwargs

    modules = attention_modules(model)
    # before kvcert's own pre-hook (enable_certified_attention), which hands the forward's cache to the attention
    hook = decoder.register_forward_pre_hook(arm, with_kwargs=True, prepend=True)
    try:
        for module in modules:
            module.kvcert_compress = partial(compress_plain_layer, press)
        yield
    finally:
        hook.remove()
        for module in modules:
            module.kvcert_compress = None


def _uses_cache(decoder: torch.nn.Module, kwargs: dict) -> bool:
    """Whether a decoder call without a cache makes one: ``use_cache`` of the call, else of the config."""
    use_cache = kwargs.get("use_cache")
    if use_cache is None:
        use_cache = getattr(decoder.config, "use_cache", False)
    return bool(use_cache)


# --- a kvpress press, the kvcert way -------------------------------------------------------
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
        The model is the one :func:`~kvcert.integration.enable_certified_attention` switched ``module`` to."""
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


def kvpress_scorer(name: str, **options) -> KvpressScorer:
    """The kvcert scorer of a ``kvpress:<Class>`` name (``options``: the press's fields)."""
    return KvpressScorer(press_name=name, options=dict(options))
