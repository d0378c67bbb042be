"""Theorem 1 of Xie (arXiv 2607.21475), made concrete: deterministic eviction cannot know
what it destroyed.

Under deterministic top-k, the serving system keeps the kept positions, their keys,
values and scores. Altering the *evicted* values leaves every one of those bit-identical
(scores depend on keys, not values), so any estimator computed from the retained state
returns the same number — while the true attention-output error ‖o − ô‖ moves by as
much as the alteration likes. :func:`impossibility_demo` performs the alteration on one
layer's real q/K/V and reports the retained-state hash and the true error, before and
after.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from .design import DEFAULT_DESIGN, RetentionDesign, topk_sample
from .scorers import get_scorer
from .scorers.base import LayerObservation

MODES = ("shift", "permute")


@dataclass
class ImpossibilityResult:
    retained_hash_before: str
    retained_hash_after: str
    error_before: float
    error_after: float
    budget: float
    mode: str

    @property
    def identical_retained_state(self) -> bool:
        return self.retained_hash_before == self.retained_hash_after

    @property
    def error_ratio(self) -> float:
        return self.error_after / max(self.error_before, 1e-300)


def retained_state_hash(obs: LayerObservation, indices: torch.Tensor, scores: torch.Tensor) -> str:
    """SHA-256 of everything a deterministic scheme retains: positions, keys, values, scores."""
    idx = indices.unsqueeze(-1)
    kept_k = obs.key.gather(2, idx.expand(-1, -1, -1, obs.key.shape[-1]))
    kept_v = obs.value.gather(2, idx.expand(-1, -1, -1, obs.value.shape[-1]))
    digest = hashlib.sha256()
    for t in (indices, kept_k, kept_v, scores.gather(-1, indices)):
        digest.update(t.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _last_query_error(obs: LayerObservation, value: torch.Tensor, kept: torch.Tensor) -> float:
    """‖o − ô‖ (Frobenius over heads) for the last query, float64: full vs retained attention."""
    q = obs.query[:, :, -1:].to(torch.float64)
    b, hq, _, d = q.shape
    hkv = obs.key.shape[1]
    g = hq // hkv
    k = obs.key.to(torch.float64)
    logits = torch.matmul(q.reshape(b, hkv, g, d), k.transpose(-1, -2)) * obs.scaling  # [B, Hkv, G, L]
    v = value.to(torch.float64)
    full = torch.softmax(logits, -1) @ v
    kept_logits = logits.masked_fill(~kept.unsqueeze(2), float("-inf"))
    retained = torch.softmax(kept_logits, -1) @ v
    return float(torch.linalg.vector_norm(full - retained))


def impossibility_demo(
    obs: LayerObservation,
    budget: float = 0.25,
    scorer: str = "snapkv",
    mode: str = "shift",
    magnitude: float = 100.0,
    design: RetentionDesign = DEFAULT_DESIGN,
    seed: int = 0,
) -> ImpossibilityResult:
    """Evict deterministically, alter the evicted values, and compare.

    mode "shift" adds ``magnitude`` × (value std) along one random direction to every
    evicted value; "permute" shuffles the evicted values among the evicted positions.
    """
    if mode not in MODES:
        raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
    scores = get_scorer(scorer)(obs)
    sample = topk_sample(scores, budget, design)
    kept = sample.kept_mask()
    before_hash = retained_state_hash(obs, sample.indices, scores)
    error_before = _last_query_error(obs, obs.value, kept)
    gen = torch.Generator().manual_seed(seed)
    altered = obs.value.clone()
    evicted = ~kept
    if mode == "shift":
        direction = torch.randn(obs.value.shape[-1], generator=gen).to(altered.dtype)
        direction = direction / direction.norm()
        step = magnitude * float(obs.value.float().std())
        altered = torch.where(evicted.unsqueeze(-1), altered + step * direction, altered)
    else:
        for bi in range(altered.shape[0]):
            for hi in range(altered.shape[1]):
                pos = evicted[bi, hi].nonzero().squeeze(-1)
                perm = pos[torch.randperm(pos.numel(), generator=gen)]
                altered[bi, hi, pos] = obs.value[bi, hi, perm]
    altered_obs = LayerObservation(obs.query, obs.key, altered, obs.log_pi, obs.scaling, obs.layer_idx, obs.num_layers)
    scores_after = get_scorer(scorer)(altered_obs)
    after_sample = topk_sample(scores_after, budget, design)
    after_hash = retained_state_hash(altered_obs, after_sample.indices, scores_after)
    error_after = _last_query_error(obs, altered, after_sample.kept_mask())
    return ImpossibilityResult(before_hash, after_hash, error_before, error_after, float(budget), mode)
