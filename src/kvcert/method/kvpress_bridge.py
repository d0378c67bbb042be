"""kvcert and NVIDIA kvpress, both ways (docs/kvpress.md).

**A kvcert press used as a kvpress press.** :func:`pressing` (what
``with press(model):`` of an :class:`~kvcert.method.press.EvictionPress` returns) compresses the
cache of the first forward that fills an empty cache, as kvpress's presses do, so the press
also goes into kvpress's pipeline (``pipeline(context, question=..., press=press)``):

* a kvcert :class:`~kvcert.method.cache.CertifiedCache` (``cache=`` of the pipeline) is armed with
  the press: the layers are compacted in place, log π is stored per slot and every later
  forward carries the certificates (plug-in and robust) of the sampled tail;
* a plain transformers cache (the pipeline's default ``DynamicCache``) gets the kept keys and
  values (each KV head padded to the longest, padding with log π = +inf), and the press
  leaves log π of the kept slots on the attention module (``module.kvcert_log_pi``), the way
  kvpress's Ada-KV leaves its masked indices; kvcert's attention adds the Hájek bias −log π
  (and −inf on padding) in every later forward. No certificate is recorded there.

The model is switched to kvcert's attention (:func:`~kvcert.method.integration.enable_certified_attention`);
over an uncompressed cache it is ordinary causal attention.

**A kvpress press used as a kvcert scorer** (``scorer: kvpress:SnapKVPress``) is
:class:`kvcert.method.scorers.kvpress_scorer.KvpressScorer`, with the scorers; its names are re-exported here.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from .scorers.base import LayerObservation
from .scorers.kvpress_scorer import PREFIX, KvpressScorer, press_class, press_options  # noqa: F401  (their old home)


# --- kvcert's press, the kvpress way -------------------------------------------------------
def compress_plain_layer(press, module: torch.nn.Module, cache, query: torch.Tensor, scaling: float) -> None:
    """Compress layer ``module.layer_idx`` of a plain transformers cache with a kvcert ``press``
    after the attention of the forward that filled it: the same scoring, allocation and
    sampling as a :class:`~kvcert.method.cache.CertifiedCache` (through a :class:`~kvcert.method.cache.CompactLayer`),
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
