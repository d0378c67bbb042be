"""Wiring Hájek-corrected attention into ``transformers`` models.

:func:`enable_certified_attention` registers the attention function ``"kvcert"`` with
``transformers.AttentionInterface`` (the library's supported extension point — no model
class is patched), switches the model to it, and adds a forward pre-hook and hook on the
model's decoder so the attention function can find the cache of the current call
(through a context variable). Works for every architecture whose attention module calls
the attention interface with ``module.layer_idx`` set — Llama, Qwen2 and Mistral
included, with grouped-query attention — in prefill and in decoding, through
``model(...)`` and ``model.generate(...)``.

With a plain ``DynamicCache`` (or no cache) the function is ordinary causal attention.
With a :class:`~kvcert.cache.CertifiedCache` it adds the bias −log π of compacted
layers, writes to the cache's recorder (:class:`~kvcert.recorder.StepRecorder`) the
certificate of layers with a sampled tail (the plug-in's V̂ and b̂_c, and the robust
certificate's shadow terms from the layer's eviction sketch), and lets the armed press
(the cache's :class:`~kvcert.schedule.PressSchedule`) compact each layer right after its
attention.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface

from .attention import causal_sdpa, hajek_attention, plain_sdpa
from .cache import CertifiedCache
from .scorers.base import LayerObservation

ATTENTION_NAME = "kvcert"

_ACTIVE_CACHE: contextvars.ContextVar = contextvars.ContextVar("kvcert_active_cache", default=None)


def active_cache():
    """The cache passed to the model call in progress (None outside a call)."""
    return _ACTIVE_CACHE.get()


def kvcert_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
):
    """Attention function registered as ``"kvcert"``; returns (output [B, Q, Hq, D], None)."""
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    window = kwargs.get("sliding_window")
    if window is not None and key.shape[2] > window:
        raise ValueError(
            f"sliding_window: layer {getattr(module, 'layer_idx', '?')} uses a {window}-token sliding window, "
            "which kvcert attention does not implement; disable it in the model config (use_sliding_window=False)"
        )
    cache = _ACTIVE_CACHE.get()
    layer = None
    if isinstance(cache, CertifiedCache) and getattr(module, "layer_idx", None) is not None:
        layer = cache.layers[module.layer_idx]
    n_q, length = query.shape[2], key.shape[2]
    biased = layer is not None and layer.needs_bias
    recorder = cache.recorder if layer is not None else None
    certify = biased and layer.has_tail and recorder.certificates
    # the attention entropy over the retained tokens (issue 18): every forward over a compressed layer
    entropy = layer is not None and recorder.entropy and layer.compactions > 0
    extra = attention_mask if isinstance(attention_mask, torch.Tensor) else None
    if not biased and not entropy and extra is None and n_q in (1, length):
        output = causal_sdpa(query, key, value, scaling) if n_q > 1 else plain_sdpa(query, key, value, scaling)
    else:
        res = hajek_attention(
            query, key, value,
            layer.log_pi if biased else None,
            scaling,
            causal=True,
            certificate=certify,
            one_minus=layer.one_minus if certify else None,
            dev=layer.dev if certify else None,
            centre=layer.centre if certify else None,
            extra_mask=extra,
            sketch=layer.sketch if certify else None,
            entropy=entropy,
        )
        output = res.output
        if entropy and res.entropy is not None:
            recorder.entropy_of(module.layer_idx, res.entropy)
        if certify:
            norm = torch.linalg.vector_norm(output.float(), dim=-1)
            recorder.certificate(module.layer_idx, res.variance, res.range_term, norm, res.shadow_sum,
                                 res.shadow_range)
    if layer is not None:  # the armed press (the cache's schedule) compresses the layer now
        cache.after_attention(module, query, scaling)
    return output.transpose(1, 2).contiguous(), None


def _find_cache(kwargs: dict):
    for name in ("cache", "past_key_values"):
        if kwargs.get(name) is not None:
            return kwargs[name]
    return None


def _pre_hook(module, args, kwargs):
    cache = _find_cache(kwargs)
    if isinstance(cache, CertifiedCache):
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.ndim == 2 and not bool(mask.all()):
            raise ValueError(
                "attention_mask: padded batches are not supported with a CertifiedCache; "
                "run one sequence per call or batch sequences of equal length"
            )
        cache.begin_forward()
    module._kvcert_tokens.append(_ACTIVE_CACHE.set(cache))
    return None


def _post_hook(module, args, kwargs, output):
    token = module._kvcert_tokens.pop() if module._kvcert_tokens else None
    cache = _ACTIVE_CACHE.get()
    if isinstance(cache, CertifiedCache):
        cache.end_forward()
    if token is not None:
        _ACTIVE_CACHE.reset(token)
    return None


def _decoder(model: torch.nn.Module) -> torch.nn.Module:
    for getter in ("get_decoder",):
        fn = getattr(model, getter, None)
        if callable(fn):
            try:
                dec = fn()
            except (AttributeError, NotImplementedError):
                dec = None
            if isinstance(dec, torch.nn.Module):
                return dec
    return getattr(model, "base_model", model)


def enable_certified_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Switch ``model`` to kvcert attention (idempotent); returns the model."""
    AttentionInterface.register(ATTENTION_NAME, kvcert_attention_forward)
    model.set_attn_implementation(ATTENTION_NAME)
    decoder = _decoder(model)
    if not getattr(decoder, "_kvcert_hooked", False):
        decoder._kvcert_tokens = []
        decoder.register_forward_pre_hook(_pre_hook, with_kwargs=True)
        decoder.register_forward_hook(_post_hook, with_kwargs=True, always_call=True)
        decoder._kvcert_hooked = True
    return model


@dataclass
class DecodeCapture:
    """The attention inputs of the captured layers over a greedy run (:func:`capture_decode`).

    first: each layer's :class:`~kvcert.scorers.base.LayerObservation` of the first forward
    (the prefill's: queries of every fed token); queries: per layer, each forward's last query
    [B, Hq, D] (the first forward's included); last: each layer's observation of the last
    forward (every key and value the cache then holds); tokens: the greedy tokens fed after
    the first forward, [B] each.
    """

    first: dict[int, LayerObservation]
    queries: dict[int, list[torch.Tensor]]
    last: dict[int, LayerObservation]
    tokens: list[torch.Tensor] = field(default_factory=list)


def check_certified_attention(model: torch.nn.Module, use: str) -> None:
    if getattr(model.config, "_attn_implementation", None) != ATTENTION_NAME:
        raise ValueError(f"model: call kvcert.enable_certified_attention(model) before {use}")


@torch.no_grad()
def capture_decode(model: torch.nn.Module, input_ids: torch.Tensor, layers, steps: int = 0,
                   cache: CertifiedCache | None = None) -> DecodeCapture:
    """Feed ``input_ids`` [B, T], then greedy-decode ``steps`` more tokens, capturing ``layers``'
    post-RoPE q, K, V after every forward.

    ``cache``: the cache to run over (default a fresh full one; e.g. a compacted one, whose
    first feed is then a decode step). The model must have kvcert attention enabled.
    """
    check_certified_attention(model, "capturing attention inputs")
    layers = list(layers)
    if cache is None:
        cache = CertifiedCache(record_certificates=False)
    cache.recorder.capture_layers |= set(layers)
    captured = cache.recorder.captured
    out = DecodeCapture({}, {i: [] for i in layers}, {})
    x = input_ids
    for step in range(steps + 1):
        if step:
            x = logits.float().argmax(-1, keepdim=True)
            out.tokens.append(x[:, 0])
        logits = model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        if step == 0:
            missing = set(layers) - set(captured)
            if missing:
                raise ValueError(f"layers: no attention layer with index {sorted(missing)} in this model")
            out.first = dict(captured)
        for i in layers:
            out.queries[i].append(captured[i].query[:, :, -1])
    out.last = dict(captured)
    return out


def capture_attention_inputs(model: torch.nn.Module, input_ids: torch.Tensor, layers) -> dict:
    """Prefill ``input_ids`` and return each requested layer's post-RoPE q, K, V.

    The model must have kvcert attention enabled; returns {layer index:
    :class:`~kvcert.scorers.base.LayerObservation`} (queries of every prompt token).
    """
    return capture_decode(model, input_ids, layers).first
