"""kvcert: randomized KV-cache eviction with error certificates (arXiv 2607.21475).

Tensor-level API (no model needed):

* :func:`inclusion_probabilities` — π from importance scores and a budget;
* :func:`poisson_sample`, :func:`priority_sample`, :func:`topk_sample`,
  :func:`sample_retention` — kept indices and log π;
* :func:`certified_attention` — Hájek-corrected attention over a retained set, with V̂
  and the radius ε_δ.

Model-level API: :func:`enable_certified_attention`, :class:`CertifiedCache`,
:class:`EvictionPress`.
"""

from .attention import CertifiedAttention, certified_attention, hajek_attention
from .cache import CertifiedCache, CompactLayer
from .certificate import anytime_radius, bernstein_radius, certificate_reference
from .design import (
    RetentionDesign,
    Sample,
    inclusion_probabilities,
    poisson_sample,
    priority_sample,
    sample_retention,
    topk_sample,
)
from .integration import enable_certified_attention
from .press import EvictionPress

__version__ = "0.1.0"

__all__ = [
    "CertifiedAttention", "CertifiedCache", "CompactLayer", "EvictionPress", "RetentionDesign", "Sample",
    "anytime_radius", "bernstein_radius", "certificate_reference", "certified_attention", "enable_certified_attention",
    "hajek_attention", "inclusion_probabilities", "poisson_sample", "priority_sample", "sample_retention", "topk_sample",
]
