"""Value-aware importance e^{s_i} · ‖v_i − o‖ (docs/design.md §1).

The Poisson variance Σ (1 − π_i)/π_i · w_i² ‖v_i − o‖² is minimised, for a fixed expected
size, by π_i ∝ w_i ‖v_i − o‖ (the classic πps optimum), so this score is attention
(averaged over the observation window and the query heads of each KV head) times the
distance of each value from the full attention output of the same query."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import LayerObservation, Scorer, window_probs


@dataclass
class ValueAwareScorer(Scorer):
    name = "value_aware"
    window: int = 32

    def score(self, obs: LayerObservation) -> torch.Tensor:
        probs = window_probs(obs, self.window)  # [B, Hkv, G, w, L]
        b, hkv, g, w, length = probs.shape
        v = obs.value.to(torch.float32)
        out = torch.matmul(probs.reshape(b, hkv, g * w, length), v)  # [B, Hkv, G·w, D]
        sq_v = v.pow(2).sum(-1)  # [B, Hkv, L]
        cross = torch.matmul(v, out.transpose(-1, -2))  # [B, Hkv, L, G·w]
        dist2 = sq_v.unsqueeze(-1) - 2.0 * cross + out.pow(2).sum(-1).unsqueeze(-2)
        dist = dist2.clamp(min=0).sqrt().transpose(-1, -2).reshape(b, hkv, g, w, length)
        return (probs * dist).mean(dim=(2, 3))
