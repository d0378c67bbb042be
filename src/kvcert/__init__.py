"""kvcert: randomized KV-cache eviction with error certificates (arXiv 2607.21475).

Tensor-level API (no model needed):

* :func:`inclusion_probabilities` — π from importance scores and a budget;
* :func:`poisson_sample`, :func:`priority_sample`, :func:`topk_sample`,
  :func:`sample_retention` — kept indices and log π;
* :func:`certified_attention` — Hájek-corrected attention over a retained set, with V̂
  and the radius ε_δ.

Model-level API: :func:`enable_certified_attention`, :class:`CertifiedCache`,
:class:`EvictionPress`, and :func:`generate_answer` (context + question → answer and
certificates in one call, like kvpress's text-generation pipeline).

Names are imported on first use, so light modules (the pipeline's planning, the
pre-registration check) load without torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "CertifiedAttention": "method.attention", "certified_attention": "method.attention",
    "hajek_attention": "method.attention",
    "CertifiedCache": "method.cache", "CompactLayer": "method.cache",
    "anytime_radius": "method.certificate", "bernstein_radius": "method.certificate",
    "certificate_reference": "method.certificate",
    "RetentionDesign": "method.design", "Sample": "method.design", "inclusion_probabilities": "method.design",
    "poisson_sample": "method.design", "priority_sample": "method.design", "sample_retention": "method.design",
    "topk_sample": "method.design",
    "enable_certified_attention": "method.integration",
    "EvictionPress": "method.press",
    "generate_answer": "generation.textgen",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kvcert' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
