"""Wiring Hájek-corrected attention into ``transformers`` models.

:func:`enable_certified_attention` registers the attention function ``"kvcert"`` with
``transformers.AttentionInterface`` (the library's supported extension point — no model
class is patched), switches the model to it, and adds a forward pre-hook and hook on the
model's decoder so the attention function can find the cache of the current call
(through a context variable); each attention module's ``forward`` is wrapped so the scorers can read
its hidden states and RoPE while it runs. Works for every architecture whose attention module calls
the attention interface with ``module.layer_idx`` set — Llama, Qwen2 and Mistral
included, with grouped-query attention — in prefill and in decoding, through
``model(...)`` and ``model.generate(...)``.

With a plain ``DynamicCache`` (or no cache) the function is ordinary causal attention.
With a :class:`~kvcert.method.cache.CertifiedCache` it adds the bias −log π of compacted
layers, writes to the cache's recorder (:class:`~kvcert.method.recorder.StepRecorder`) the
certificate of layers with a sampled tail (the plug-in's V̂ and b̂_c, and the robust
certificate's shadow terms from the layer's eviction sketch), and lets the armed press
(the cache's :class:`~kvcert.method.schedule.PressSchedule`) compact each layer right after its
attention.
"""

from __future__ import annotations

import contextvars
import inspect
import weakref
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface

from .attention import causal_sdpa, hajek_attention, plain_sdpa, use_decode_kernel
from .cache import CertifiedCache
from .decode_plans import kernel_decode
from .scorers.base import LayerObservation

ATTENTION_NAME = "kvcert"

_ACTIVE_CACHE: contextvars.ContextVar = contextvars.ContextVar("kvcert_active_cache", default=None)


def kvcert_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
):
    """Attention function registered as ``"kvcert"``; returns (output [B, Q, Hq, D], None). Its
    arguments are in the order of transformers' ``sdpa_attention_forward`` (kvpress's attention
    patch passes ``dropout`` by position)."""
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
    n_q, length = query.shape[2], key.shape[2]
    if isinstance(cache, CertifiedCache) and getattr(module, "layer_idx", None) is not None:
        layer = cache.layers[module.layer_idx]
        if getattr(module, "masked_key_indices", None) is not None:
            raise ValueError("press: a kvpress press that masks keys (AdaKVPress) cannot compress a kvcert "
                             "CertifiedCache; use kvcert's adakv allocation (docs/kvpress.md) or a DynamicCache")
        log_pi = layer.log_pi
    else:
        log_pi = plain_log_pi(module, n_q, length, key.device)
    biased = (layer.needs_bias if layer is not None else log_pi is not None)
    recorder = cache.recorder if layer is not None else None
    certify = biased and layer is not None and layer.has_tail and recorder.certificates
    # the attention entropy over the retained tokens (a comparison signal): every forward over a compressed layer
    entropy = layer is not None and recorder.entropy and layer.compactions > 0
    extra = attention_mask if isinstance(attention_mask, torch.Tensor) else None
    if (layer is not None and n_q == 1 and (biased or entropy or cache.static_decode)
            and use_decode_kernel(query, key, value, extra)):  # the fused kernel, through the layer's plan
        output = kernel_decode(layer, module.layer_idx, _num_layers(module, cache), query, scaling, certify, entropy,
                               recorder)
    elif not biased and not entropy and extra is None and n_q in (1, length):
        output = causal_sdpa(query, key, value, scaling) if n_q > 1 else plain_sdpa(query, key, value, scaling)
    else:
        res = hajek_attention(
            query, key, value,
            log_pi if biased else None,
            scaling,
            causal=True,
            certificate=certify,
            one_minus=layer.one_minus if certify else None,
            dev=layer.dev if certify else None,
            centre=layer.centre if certify else None,
            extra_mask=extra,
            sketch=layer.sketch if certify else None,
            entropy=entropy,
            defer=certify,
        )
        output = res.output
        if entropy and res.entropy is not None:
            recorder.entropy_of(module.layer_idx, _num_layers(module, cache), res.entropy)
        if certify and res.pending is not None:  # combined with the other layers' when the forward ends
            recorder.defer(module.layer_idx, _num_layers(module, cache), res.pending)
        elif certify:
            norm = torch.linalg.vector_norm(output.float(), dim=-1)
            recorder.certificate(module.layer_idx, _num_layers(module, cache), res.variance, res.range_term, norm,
                                 res.shadow_sum, res.shadow_range)
    if layer is not None:  # the armed press (the cache's schedule) compresses the layer now
        cache.after_attention(module, query, scaling)
    elif cache is not None and n_q > 1 and n_q == length and getattr(module, "kvcert_compress", None) is not None:
        module.kvcert_compress(module, cache, query, scaling)  # a kvcert press used the kvpress way
    return output.transpose(1, 2).contiguous(), None


def _num_layers(module: torch.nn.Module, cache) -> int:
    """The model's decoder layers (what the recorder's buffer is sized for)."""
    config = module.__dict__.get("config")
    return getattr(config, "num_hidden_layers", None) or len(cache.layers)


def plain_log_pi(module: torch.nn.Module, n_q: int, length: int, device) -> torch.Tensor | None:
    """log π [B, Hkv, length] of a layer held in a plain transformers cache that a kvcert press
    compressed the kvpress way (:mod:`kvcert.method.kvpress_bridge`): the press leaves log π of the
    slots it kept on the attention module (``module.kvcert_log_pi``, as kvpress's Ada-KV leaves
    its masked indices); tokens appended since enter with log π = 0. A forward that fills an
    empty cache (a new prefill) forgets it."""
    stored = getattr(module, "kvcert_log_pi", None)
    if stored is None:
        return None
    if n_q == length:
        module.kvcert_log_pi = None
        return None
    b, h, m = stored.shape
    if m > length:
        raise ValueError(f"cache: layer {module.layer_idx} holds {length} slots, fewer than the {m} its press "
                         "kept; crop a compressed cache only back to its compressed length")
    return torch.cat([stored, stored.new_zeros(b, h, length - m)], -1).to(device)


def find_cache(kwargs: dict):
    """The cache a decoder call was given (``cache=``, transformers 5.24; ``past_key_values=``, 5.2), or None."""
    for name in ("cache", "past_key_values"):
        if kwargs.get(name) is not None:
            return kwargs[name]
    return None


def _pre_hook(module, args, kwargs):
    cache = find_cache(kwargs)
    if module._kvcert_cache_name != "cache" and kwargs.get("cache") is not None:
        # a transformers release whose decoders take the cache as ``past_key_values``
        kwargs[module._kvcert_cache_name] = kwargs.pop("cache")
    if isinstance(cache, CertifiedCache):
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.ndim == 2 and not bool(mask.all()):
            raise ValueError(
                "attention_mask: padded batches are not supported with a CertifiedCache; "
                "run one sequence per call or batch sequences of equal length"
            )
        cache.begin_forward()
    module._kvcert_tokens.append(_ACTIVE_CACHE.set(cache))
    return args, kwargs


def _post_hook(module, args, kwargs, output):
    token = module._kvcert_tokens.pop() if module._kvcert_tokens else None
    cache = _ACTIVE_CACHE.get()
    if isinstance(cache, CertifiedCache):
        cache.end_forward()
    if token is not None:
        _ACTIVE_CACHE.reset(token)
    return None


class _KeepInputs:
    """An attention module's forward that keeps the module's hidden states and RoPE of the call for the
    scorers (:class:`~kvcert.method.scorers.base.LayerObservation`) while it runs, dropped when it returns.

    A wrapper of ``forward``, not a pair of forward hooks: a module with hooks takes torch's slower call
    path, and two hooks on each of a 30-layer model's attention modules cost about 1 % of a decode step."""

    def __init__(self, module: torch.nn.Module, forward):
        self.module, self.forward = module, forward

    def __call__(self, *args, **kwargs):
        state = self.module.__dict__  # a plain attribute: no parameter, buffer or submodule of that name
        state["_kvcert_inputs"] = (kwargs.get("hidden_states", args[0] if args else None),
                                   kwargs.get("position_embeddings"))
        try:
            return self.forward(*args, **kwargs)
        finally:
            state["_kvcert_inputs"] = None


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The attention modules of ``model``: those with a ``layer_idx`` that project queries."""
    return [m for m in model.modules() if getattr(m, "layer_idx", None) is not None
            and any(hasattr(m, name) for name in ("q_proj", "qkv_proj"))]


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack of a causal LM: its ``get_decoder()``, else its ``base_model``, else the model itself."""
    fn = getattr(model, "get_decoder", None)
    if callable(fn):
        try:
            dec = fn()
        except (AttributeError, NotImplementedError):
            dec = None
        if isinstance(dec, torch.nn.Module):
            return dec
    return getattr(model, "base_model", model)


def cache_argument(decoder: torch.nn.Module) -> str:
    """The name under which ``decoder.forward`` takes its cache: ``cache`` (transformers 5.24)
    or ``past_key_values`` (5.2, the release kvpress 0.5.5 supports)."""
    parameters = inspect.signature(decoder.forward).parameters
    return "cache" if "cache" in parameters or "past_key_values" not in parameters else "past_key_values"


def enable_certified_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Switch ``model`` to kvcert attention (idempotent); returns the model."""
    AttentionInterface.register(ATTENTION_NAME, kvcert_attention_forward)
    model.set_attn_implementation(ATTENTION_NAME)
    decoder = decoder_of(model)
    if not getattr(decoder, "_kvcert_hooked", False):
        decoder._kvcert_tokens = []
        decoder._kvcert_cache_name = cache_argument(decoder)
        decoder.register_forward_pre_hook(_pre_hook, with_kwargs=True)
        decoder.register_forward_hook(_post_hook, with_kwargs=True, always_call=True)
        decoder._kvcert_hooked = True
        for attention in attention_modules(model):
            object.__setattr__(attention, "forward", _KeepInputs(attention, attention.forward))
            # the model a scorer may need (a kvpress press's model setup); a plain attribute, not a submodule
            object.__setattr__(attention, "_kvcert_model", weakref.ref(model))
    return model


@dataclass
class DecodeCapture:
    """The attention inputs of the captured layers over a greedy run (:func:`capture_decode`).

    first: each layer's :class:`~kvcert.method.scorers.base.LayerObservation` of the first forward
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
    :class:`~kvcert.method.scorers.base.LayerObservation`} (queries of every prompt token).
    """
    return capture_decode(model, input_ids, layers).first
