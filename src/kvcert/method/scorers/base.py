"""What a scorer sees of one layer, and the attention helpers the scorers share.

A scorer turns one layer's prefill observation into a non-negative importance per
(batch, KV head, token) [B, Hkv, L]. The same importance drives the deterministic
baseline (top-k) and the randomized design (π ∝ importance), so every scorer is usable
both ways (docs/design.md §1, "Importance scores come from the same scorers the deterministic
baselines use").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch


@dataclass
class LayerObservation:
    """One layer at the end of a forward pass that filled its cache.

    query: [B, Hq, Q, D] the queries of this forward (post-RoPE), the last Q tokens.
    key, value: [B, Hkv, L, D] everything the layer holds (retained + new tokens).
    log_pi: [B, Hkv, L] fp32 log inclusion probabilities (None: all certain, no padding).
    module, hidden_states, position_embeddings: the attention module, its input hidden
    states [B, Q, hidden] and its RoPE (cos, sin) in this forward, for scorers that read
    weights or hidden states (a kvpress press, :mod:`kvcert.method.scorers.kvpress_scorer`); None where the
    observation was built outside a forward.
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    log_pi: torch.Tensor | None
    scaling: float
    layer_idx: int = 0
    num_layers: int = 1
    module: Any = None
    hidden_states: torch.Tensor | None = None
    position_embeddings: Any = None

    @property
    def group(self) -> int:
        return self.query.shape[1] // self.key.shape[1]


class Scorer:
    """Base class: subclasses set ``name`` and implement :meth:`score`."""

    name: ClassVar[str] = ""

    def score(self, obs: LayerObservation) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def __call__(self, obs: LayerObservation) -> torch.Tensor:
        scores = self.score(obs).to(torch.float32)
        if obs.log_pi is not None:  # padding slots are not tokens
            scores = scores.masked_fill(torch.isinf(obs.log_pi), 0.0)
        return scores.clamp(min=0.0)


def attention_probs(obs: LayerObservation, first_query: int, last_query: int) -> torch.Tensor:
    """Softmax attention of queries [first_query, last_query) of this forward over all keys.

    Returns fp32 [B, Hkv, G, n, L], causal (query i of Q sees keys ≤ L − Q + i) and with
    the Hájek bias −log π of already-compressed tokens.
    """
    q = obs.query[:, :, first_query:last_query]
    b, hq, n, d = q.shape
    hkv, length = obs.key.shape[1], obs.key.shape[2]
    g = hq // hkv
    logits = torch.matmul(q.reshape(b, hkv, g * n, d), obs.key.transpose(-1, -2)).to(torch.float32) * obs.scaling
    logits = logits.reshape(b, hkv, g, n, length)
    if obs.log_pi is not None:
        logits = logits - obs.log_pi.to(torch.float32)[:, :, None, None, :]
    n_q = obs.query.shape[2]
    last_key = length - n_q + torch.arange(first_query, last_query, device=q.device)
    allowed = torch.arange(length, device=q.device)[None, :] <= last_key[:, None]
    logits = logits.masked_fill(~allowed, float("-inf"))
    return torch.softmax(logits, dim=-1)


def window_probs(obs: LayerObservation, window: int) -> torch.Tensor:
    """Attention of the last ``window`` queries (the observation window) [B, Hkv, G, w, L]."""
    n_q = obs.query.shape[2]
    w = max(1, min(window, n_q))
    return attention_probs(obs, n_q - w, n_q)
