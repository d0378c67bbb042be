"""Attention-level replay of the certificate on real prefills (claims C1, C2, C8) and the
impossibility demonstration (Theorem 1) on a real model: the model side of the replay
stage (its table's layout: :mod:`kvcert.generation.replay_table`; its statistics, torch-free:
:mod:`kvcert.analysis.replay_stats`).

Procedure (docs/design.md §1, "Across decode steps"; ``analysis_plan.replay``), per task
record:

1. Prefill the prompt (:func:`kvcert.tasks.prompting.build_prompt_ids`) with kvcert
   attention, capturing every layer's post-RoPE q, K, V; then greedy-decode
   ``later_queries`` tokens over the full cache, capturing each step's query (both with
   the one capture helper, :func:`kvcert.method.integration.capture_decode`). The
   captured state of the last step holds the prompt keys followed by the decode keys.
2. Importance = the SnapKV scorer on the prompt observation (its observation window is
   the end of the prompt: the window's queries, pooled over a KV head's query heads, set
   π; no single query does). The *setting* query is the last prompt query — the last of
   that window. π = :func:`kvcert.method.design.inclusion_probabilities` at each budget.
3. Per (layer, KV head, budget) draw ``draws`` Poisson samples **once** (the press's generator
   recipe, :func:`kvcert.method.design.cpu_generator`, seeded from ``(seed, example, layer, budget)``:
   the same draws on a GPU as on a CPU) and evaluate every query of that
   head group on the same samples. Three query kinds:

   * ``setting`` — the last prompt query (inside the window that set π), over the kept prompt keys;
   * ``later`` — the ``later_queries`` decode-step queries of the *full-cache* run, over
     the kept prompt keys plus the decode keys (certain, π = 1): the stale-π case, with
     queries that do not depend on the sample;
   * ``sample_dependent`` — the decode-step queries of the *compressed* run of the same
     draw: every layer compacted with its draw (the replayed layers with exactly the
     samples evaluated here), the first answer token fed over the compressed cache and
     greedy decoding continued from the compressed logits, so each query (and each
     decode key and value) depends on the sample, as in real decoding. Over the kept
     prompt keys plus that run's own decode keys; the exact output uses every prompt key
     and the same decode keys. A row is ``diverged`` when that run had, by its step, fed a
     token the full-cache run did not (before that, its queries differ from the later
     ones only through the compressed attention of earlier layers).

   Draws are vectorised as the batch dimension (rows padded with log π = +inf).
4. ô and the certificate (V̂, the one-pass range bound b̂_c, ε_δ) are those of
   :func:`kvcert.method.attention.certified_attention` — computed by the same
   :func:`~kvcert.method.attention.hajek_attention` in float64, with a causal mask so each
   decode query sees only the decode keys before it, and the per-head value centre the
   cache uses (the mean of the kept values); o = exact attention over every key the
   query sees, float64; error = ‖ô − o‖. The robust radius ε_R adds the shadow terms of
   the draw's eviction sketch (:mod:`kvcert.method.sketch`: the shadow chosen among the draw's
   evicted tokens by the selection score ψ̃ of the prompt's observation window, int8 keys,
   the memory budget of :data:`kvcert.method.sketch.SKETCH_FRACTION` at the captured dtype), and
   its floor u·‖ô‖ uses the unit roundoff of the captured dtype.
   The anytime radii use δ_t = δ/(t(t+1)) with t = 1 for the setting query and t = 1 + i
   for the i-th decode query of either path.

5. Beside it, vAttention (:mod:`kvcert.method.vattention`) on the setting and later queries of the same rows, at
   matched density (:class:`_VAttentionArm`): its deterministic part as many tokens as kvcert's certain set (the
   same sinks and window, heavy hitters by the query's own logits) plus the decode keys the query sees, its
   uniform with-replacement draws as many as the tail tokens kvcert kept in that draw, one vAttention draw per kvcert
   draw and query (:func:`_vattention_seed`); its output error, the ε its (ε, δ) statement gives on the softmax
   denominator at that budget, the realised denominator error, and the same for the Horvitz–Thompson variant
   (columns :data:`kvcert.generation.replay_table.VATTENTION_COLUMNS`; NaN on the sample-dependent rows).

One output row per (example, layer, query head, budget, query kind, step, draw), ``step``
0 being the setting query and 1..later_queries the decode steps; coverage is decided in
float64 before anything is stored (``covered``, ``covered_anytime``, and the same for the
robust radius). A *replay cell* — the unit of the claims' bootstrap — is (model, example,
layer, query head, budget, query kind). A *path* is one draw's sequence of steps, the
setting query followed by the decode queries of one decoding run (full-cache: ``later``;
compressed: ``sample_dependent``): the anytime radius claims all of a path's steps at
once, so its coverage is the share of paths whose every step is covered
(:func:`simultaneous_anytime`), reported beside the per-step mean.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from ..config.analysis_plan import ReplayPart
from ..method.attention import hajek_attention
from ..method.cache import CertifiedCache
from ..method.certificate import anytime_radius, bernstein_radius, robust_radius, unit_roundoff
from ..method.design import (DEFAULT_DESIGN, RetentionDesign, Sample, cpu_generator, inclusion_probabilities, layer_budget,
                      poisson_sample)
from ..method.impossibility import impossibility_demo
from ..method.integration import capture_decode, check_certified_attention
from ..progress import progress as progress_display
from ..method.scorers import get_scorer
from ..method.scorers.base import LayerObservation
from ..method.sketch import POTENTIAL_WINDOW, build_sketch, shadow_count, sketch_potential
from ..method.vattention import deterministic_set, residual_order, uniform_draws, vattention_attention
from ..tasks.prompting import build_prompt_ids
from .replay_table import COVERED_COLUMNS, FLOAT_COLUMNS, TABLE_COLUMNS, VATTENTION_COLUMNS, empty_replay

#: keys × draws × head-dim elements evaluated at once (bounds replay memory on big models)
MAX_ELEMENTS = 2**25


@dataclass
class Capture:
    """Prefill observation per layer, later-step queries [Hq, D], all keys/values [Hkv, N+J, D],
    and the greedy tokens of the full-cache run (``tokens[0]`` the first answer token)."""

    prompt: dict[int, LayerObservation]
    later: dict[int, list[torch.Tensor]]
    keys: dict[int, torch.Tensor]
    values: dict[int, torch.Tensor]
    prompt_tokens: int
    tokens: list[int]


def _check_model(model) -> None:
    check_certified_attention(model, "replay")


def replay_layers(num_layers: int, max_layers: int | None) -> list[int]:
    """All layers, or ``max_layers`` evenly spaced ones (first and last included)."""
    if max_layers is None or max_layers >= num_layers:
        return list(range(num_layers))
    if max_layers < 1:
        raise ValueError(f"max_layers: must be >= 1, got {max_layers}")
    return sorted({int(round(x)) for x in np.linspace(0, num_layers - 1, max_layers)})


def capture(model, input_ids: list[int], layers: Sequence[int], later_queries: int) -> Capture:
    """Prefill ``input_ids`` and greedy-decode ``later_queries`` tokens, capturing ``layers``."""
    _check_model(model)
    device = next(model.parameters()).device
    run = capture_decode(model, torch.tensor([input_ids], dtype=torch.long, device=device), layers, later_queries)
    return Capture(
        prompt=run.first, later={i: [q[0] for q in run.queries[i][1:]] for i in layers},
        keys={i: run.last[i].key[0] for i in layers}, values={i: run.last[i].value[0] for i in layers},
        prompt_tokens=len(input_ids), tokens=[int(t[0]) for t in run.tokens],
    )


def _seed(seed: int, example_id: str, layer: int, budget: float) -> int:
    digest = hashlib.sha256(f"{seed}:{example_id}:{layer}:{budget!r}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % (2**62)


def _vattention_seed(seed: int, example_id: str, layer: int, budget: float) -> int:
    """The vAttention arm's draws' seed: from the same (seed, example, layer, budget) as :func:`_seed`, salted, so its
    draws are reproducible and independent of kvcert's."""
    digest = hashlib.sha256(f"vattention:{seed}:{example_id}:{layer}:{budget!r}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % (2**62)


def draw_samples(cap: Capture, layer: int, budget: float, draws: int, design: RetentionDesign, seed: int,
                 example_id: str, scorer="snapkv") -> tuple[torch.Tensor, Sample]:
    """π [Hkv, N] (float64) of one layer at one budget (the layer's share under ``design.dense_layers``,
    :func:`kvcert.method.design.layer_budget`) and its ``draws`` Poisson samples [draws, Hkv, K]; ``scorer`` a name
    or a scorer instance."""
    obs = cap.prompt[layer]
    importance = get_scorer(scorer)(obs)[0]  # [Hkv, N]
    n = importance.shape[-1]
    share = layer_budget(float(budget), layer, obs.num_layers, design)
    count = share if share == float(budget) else max(round(share * n), min(n, design.sinks + design.window))
    pi = inclusion_probabilities(importance, count, design)
    gen = cpu_generator(_seed(seed, example_id, layer, float(budget)))  # the same draws on every device
    return pi, poisson_sample(pi.unsqueeze(0).expand(draws, -1, -1).contiguous(), gen)


def _slice(sample: Sample, d0: int, d1: int) -> Sample:
    return Sample(sample.indices[d0:d1], sample.log_pi[d0:d1], sample.lengths[d0:d1], sample.num_tokens)


@dataclass
class Compressed:
    """The compressed run of each draw at one replayed layer: queries [M, Hq, J, D], decode keys/values
    [M, Hkv, J, D], and ``diverged`` [M, J]: whether the tokens fed up to decode step j differ from the
    full-cache run's (only then does the query's own history, not just its hidden states, depend on the draw)."""

    queries: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    diverged: torch.Tensor


@torch.no_grad()
def compressed_decode(model, cap: Capture, samples: dict[int, Sample], steps: int, layers: Sequence[int],
                      max_batch: int | None = None) -> dict[int, Compressed]:
    """Each draw's own decoding: every layer compacted with its draw, ``steps`` greedy tokens from the first answer token.

    ``samples`` holds every layer's draws (same number of draws each); ``layers`` are the
    layers whose queries and decode keys are returned. Draws run as the batch dimension,
    ``max_batch`` at a time (default: all).
    """
    _check_model(model)
    device = next(model.parameters()).device
    n = cap.prompt_tokens
    draws = next(iter(samples.values())).indices.shape[0]
    batch = draws if max_batch is None else max(1, int(max_batch))
    parts: dict[int, list[tuple]] = {i: [] for i in layers}
    reference = torch.tensor(cap.tokens[1:steps], dtype=torch.long, device=device)  # the full run's tokens 2..J
    for d0 in range(0, draws, batch):
        d1 = min(draws, d0 + batch)
        nd = d1 - d0
        cache = CertifiedCache(record_certificates=False)
        for i in sorted(samples):
            k, v = cap.keys[i][:, :n].unsqueeze(0), cap.values[i][:, :n].unsqueeze(0)
            cache.update(k.expand(nd, -1, -1, -1).contiguous(), v.expand(nd, -1, -1, -1).contiguous(), i)
            cache.layers[i].compact(_slice(samples[i], d0, d1))
        x = torch.full((nd, 1), cap.tokens[0], dtype=torch.long, device=device)
        run = capture_decode(model, x, layers, steps - 1, cache=cache)
        own = torch.stack(run.tokens, 1) if run.tokens else torch.empty(nd, 0, dtype=torch.long, device=device)
        differs = (own != reference.unsqueeze(0)).cumsum(1) > 0  # [nd, J-1]: fed token 2..J or an earlier one differs
        diverged = torch.cat([torch.zeros(nd, 1, dtype=torch.bool, device=device), differs], 1)
        for i in layers:
            layer = cache.layers[i]
            parts[i].append((torch.stack(run.queries[i], 2), layer.keys[:, :, -steps:], layer.values[:, :, -steps:],
                             diverged))
    return {i: Compressed(*(torch.cat([p[j] for p in parts[i]], 0) for j in range(4))) for i in layers}


def _exact(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float) -> torch.Tensor:
    """Full attention, float64: q [Hq, D], k/v [Hkv, L, D] → [Hq, D]."""
    hq, hkv = q.shape[0], k.shape[0]
    g = hq // hkv
    logits = torch.einsum("hgd,hld->hgl", q.reshape(hkv, g, -1), k) * scaling
    return torch.einsum("hgl,hld->hgd", torch.softmax(logits, dim=-1), v).reshape(hq, -1)


def _exact_own(q: torch.Tensor, k_prompt: torch.Tensor, v_prompt: torch.Tensor, k_dec: torch.Tensor,
               v_dec: torch.Tensor, scaling: float) -> torch.Tensor:
    """Exact attention of each draw's decode queries q [M, Hq, J, D] over every prompt key and the
    draw's own decode keys [M, Hkv, J, D] (causal among the decode keys) → [M, Hq, J, D]."""
    m, hq, j, d = q.shape
    hkv = k_prompt.shape[0]
    g = hq // hkv
    qg = q.reshape(m, hkv, g * j, d)
    lp = torch.einsum("mhrd,hld->mhrl", qg, k_prompt) * scaling
    ld = torch.einsum("mhrd,mhld->mhrl", qg, k_dec) * scaling  # [m, hkv, g*j, J]
    step = torch.arange(j, device=q.device).repeat(g)  # row r is query step r % j
    ld = ld.masked_fill(torch.arange(j, device=q.device)[None, :] > step[:, None], float("-inf"))
    w = torch.softmax(torch.cat([lp, ld], -1), -1)
    out = torch.einsum("mhrl,hld->mhrd", w[..., : k_prompt.shape[1]], v_prompt)
    out = out + torch.einsum("mhrl,mhld->mhrd", w[..., k_prompt.shape[1]:], v_dec)
    return out.reshape(m, hq, j, -1)


def _potential(cap: Capture, layer: int) -> torch.Tensor:
    """The sketch's selection score ψ̃ [Hkv, N] of the prompt tokens from the prompt's observation window (float64)."""
    obs = cap.prompt[layer]
    q = obs.query[0, :, -POTENTIAL_WINDOW:].to(torch.float64)  # [Hq, W, D]
    hkv = obs.key.shape[1]
    window = q.reshape(hkv, -1, q.shape[-1])  # the window queries of every query head of the group
    return sketch_potential(window, obs.key[0].to(torch.float64), float(obs.scaling))


def _shadow_slots(cap: Capture, layer: int) -> int:
    k, v = cap.keys[layer], cap.values[layer]
    per_token = k.shape[-1] * k.element_size() + v.shape[-1] * v.element_size()
    return shadow_count(cap.prompt_tokens, per_token, k.shape[-1])


def _columns(res, err, steps, delta, kind_steps, d0, nd, hq, group, lengths, out: dict, roundoff: float,
             diverged: torch.Tensor | None = None, vatt: dict[str, torch.Tensor] | None = None) -> None:
    """Append one chunk's rows: res = the hajek_attention result [nd, Hq, Q]; err [nd, Hq, Q]; ``roundoff`` the
    unit roundoff of the captured cache's dtype (the robust radius's floor u·‖ô‖); ``diverged`` [nd, Q] (None:
    the full-cache run's own queries, never diverged); ``vatt`` the vAttention arm's columns [nd, Hq, Q] (a missing
    one: NaN)."""
    var, rng = res.variance, res.range_term
    rad = bernstein_radius(var, rng, delta)
    anyr = anytime_radius(var, rng, delta, steps)
    floor = roundoff * torch.linalg.vector_norm(res.output, dim=-1)
    rob = robust_radius(var, rng, res.shadow_sum, delta, floor=floor)
    anyrob = robust_radius(var, rng, res.shadow_sum, delta, steps, floor=floor)
    n_q = err.shape[-1]
    shape = (nd, hq, n_q)
    out["draw"].append(np.broadcast_to(np.arange(d0, d0 + nd, dtype=np.int32)[:, None, None], shape).reshape(-1))
    out["head"].append(np.broadcast_to(np.arange(hq, dtype=np.int16)[None, :, None], shape).reshape(-1))
    out["step"].append(np.broadcast_to(np.asarray(kind_steps, dtype=np.int16)[None, None, :], shape).reshape(-1))
    out["kept"].append(lengths.repeat_interleave(group, dim=1).unsqueeze(-1).expand(shape).reshape(-1).cpu().numpy()
                       .astype(np.int32))
    div = np.zeros(shape, dtype=bool) if diverged is None else diverged.cpu().numpy()[:, None, :]
    out["diverged"].append(np.broadcast_to(div, shape).reshape(-1))
    for name, t in (("error", err), ("radius", rad), ("anytime_radius", anyr), ("variance", var), ("range_term", rng),
                    ("output_norm", torch.linalg.vector_norm(res.output, dim=-1)), ("radius_robust", rob),
                    ("anytime_radius_robust", anyrob), ("shadow_sum", res.shadow_sum),
                    ("shadow_range", res.shadow_range)):
        out[name].append(t.reshape(-1).cpu().numpy())
    for name, r in (("covered", rad), ("covered_anytime", anyr), ("covered_robust", rob),
                    ("covered_anytime_robust", anyrob)):
        out[name].append((err <= r).reshape(-1).cpu().numpy())
    vatt = vatt or {}
    for name in VATTENTION_COLUMNS:
        out[name].append(vatt[name].reshape(-1).to(torch.float64).cpu().numpy() if name in vatt
                         else np.full(nd * hq * n_q, np.nan))


class _VAttentionArm:
    """vAttention beside kvcert's draws of one (layer, budget) on the setting and later queries
    (:mod:`kvcert.method.vattention`), at matched density: for draw d and query head h of KV head g, vAttention's
    deterministic part is kvcert's certain count of g (π = 1: the design's sinks and window, the same positions,
    and the rest — the top slice and any capped tail token — as top-k heavy hitters by the query's own logits),
    plus the decode keys the query sees (its local window); its draws b are the tail tokens kvcert kept in draw d
    (kept − certain), uniform with replacement over the rest, redrawn for every query. So the tokens it reads for a
    query equal the tokens kvcert keeps for that row (kept + the decode keys the query sees), with the same split."""

    def __init__(self, queries, k_all, v_all, pi, sample: Sample, n: int, scaling: float, design: RetentionDesign,
                 seed: int) -> None:
        hq, n_q = queries.shape[0], queries.shape[1]
        hkv = k_all.shape[0]
        group = hq // hkv
        length = n + n_q - 1  # every prompt key and the decode keys the last query sees
        k, self.values = k_all[:, :length], v_all[:, :length].repeat_interleave(group, 0)  # [Hq, L, D]
        logits = torch.einsum("hgqd,hld->hgql", queries.reshape(hkv, group, n_q, -1), k).reshape(hq, n_q, length)
        pos = torch.arange(length, device=k.device)
        visible = pos[None, :] < (n + torch.arange(n_q, device=k.device))[:, None]  # step s sees n + s keys
        self.logits = (logits * scaling).masked_fill(~visible, float("-inf"))  # [Hq, Q, L]
        self.visible = visible.expand(hq, -1, -1)
        lo = min(design.sinks, n)
        hi = max(lo, n - design.window)
        certain = (pi >= 1).sum(-1)  # [Hkv]
        heavy = (certain - (n - (hi - lo))).clamp(min=0).repeat_interleave(group)  # [Hq]
        self.det = deterministic_set(self.logits, lo, hi, heavy.unsqueeze(-1), visible)
        self.residual = visible & ~self.det
        self.order = residual_order(self.residual)
        b = (sample.lengths - certain.unsqueeze(0)).clamp(min=0).repeat_interleave(group, dim=1)  # [draws, Hq]
        self.b = b.unsqueeze(-1).expand(-1, -1, n_q)  # [draws, Hq, Q]
        width = max(1, int(self.b.max()) if self.b.numel() else 1)
        gen = cpu_generator(seed)  # the same draws on every device
        self.uniforms = torch.rand((b.shape[0], hq, n_q, width), generator=gen, dtype=torch.float64).to(k.device)

    def columns(self, d0: int, d1: int, exact: torch.Tensor, delta: float) -> dict[str, torch.Tensor]:
        """The arm's columns [nd, Hq, Q] of draws d0..d1, exact o [Hq, Q, D]."""
        nd = d1 - d0
        b = self.b[d0:d1]
        counts = uniform_draws(self.residual, b, self.uniforms[d0:d1], self.order)
        est = vattention_attention(self.logits, self.values, self.det, counts, b)
        eps = est.epsilon(delta)
        den_err, den_err_ht = est.denominator_error(), est.denominator_error(ht=True)
        nan = torch.full_like(eps, float("nan"))
        return {
            "exact_norm": torch.linalg.vector_norm(exact, dim=-1).expand(nd, -1, -1),
            "error_vatt": torch.linalg.vector_norm(est.output - exact, dim=-1),
            "error_vatt_ht": torch.linalg.vector_norm(est.output_ht - exact, dim=-1),
            "epsilon_vatt": eps, "denominator_error_vatt": den_err, "denominator_error_vatt_ht": den_err_ht,
            "covered_vatt": torch.where(eps.isnan(), nan, (den_err <= eps).to(eps.dtype)),
            "covered_vatt_ht": torch.where(eps.isnan(), nan, (den_err_ht <= eps).to(eps.dtype)),
            "sampled_vatt": est.draws, "tokens_read_vatt": self.det.sum(-1).to(eps.dtype) + est.draws,
            "resident_vatt": self.visible.sum(-1).to(eps.dtype).expand(nd, -1, -1),
        }


def replay_layer(
    cap: Capture, layer: int, budget: float, pi: torch.Tensor, sample: Sample, delta: float,
    compressed: Compressed | None = None, design: RetentionDesign = DEFAULT_DESIGN, vattention_seed: int | None = None,
) -> dict[str, np.ndarray]:
    """Every (step, draw, query head) of one layer at one budget, for each query kind: columns as numpy arrays.

    The setting and later queries of a head group are evaluated in one call of the Hájek
    attention with its certificate (:func:`kvcert.method.attention.hajek_attention`, the
    computation behind :func:`~kvcert.method.attention.certified_attention`) over the keys
    [kept prompt keys, decode keys]: with ``causal=True`` the setting query sees the kept
    prompt keys only and the i-th later query also the first i decode keys — the state
    of the cache at that decode step. The sample-dependent queries (``compressed``) are
    evaluated the same way over each draw's own decode keys.

    With ``vattention_seed`` (not None), vAttention's estimate at matched density fills the arm's columns of the
    setting and later rows (:class:`_VAttentionArm`; ``design`` gives the sinks and window it shares with kvcert's);
    they are NaN otherwise and on the sample-dependent rows.
    """
    obs = cap.prompt[layer]
    n = cap.prompt_tokens
    scaling = float(obs.scaling)
    f64 = torch.float64
    k_all, v_all = cap.keys[layer].to(f64), cap.values[layer].to(f64)  # [Hkv, N+J, D]
    queries = torch.stack([obs.query[0, :, -1]] + list(cap.later[layer]), dim=1).to(f64)  # [Hq, Q], step 0 = setting
    n_q = queries.shape[1]
    hkv, hq = k_all.shape[0], queries.shape[0]
    group = hq // hkv
    exact = torch.stack(
        [_exact(queries[:, s], k_all[:, : n + s], v_all[:, : n + s], scaling) for s in range(n_q)], dim=1
    )  # [Hq, Q, D]
    steps = torch.arange(1, n_q + 1, dtype=f64, device=k_all.device)  # anytime step t: 1 for the setting query, 1 + i for later query i
    potential = _potential(cap, layer)  # [Hkv, N]
    slots = _shadow_slots(cap, layer)
    roundoff = unit_roundoff(cap.values[layer].dtype)
    tail = pi < 1
    decode_idx = torch.arange(n, n + n_q - 1, device=k_all.device).expand(1, hkv, -1)
    names = ["step", "draw", "head", "kept", "diverged", *FLOAT_COLUMNS, *COVERED_COLUMNS, *VATTENTION_COLUMNS]
    cols: dict[str, dict[str, list[np.ndarray]]] = {k: {c: [] for c in names} for k in ("full", "own")}
    draws = sample.indices.shape[0]
    width = sample.indices.shape[-1]
    kept_mask = sample.kept_mask()
    own = compressed is not None and compressed.queries.shape[2] > 0
    chunk = max(1, min(draws, MAX_ELEMENTS // max(1, hkv * (width + n) * k_all.shape[-1])))
    arm = (None if vattention_seed is None
           else _VAttentionArm(queries, k_all, v_all, pi, sample, n, scaling, design, vattention_seed))
    for d0 in range(0, draws, chunk):
        d1 = min(draws, d0 + chunk)
        nd = d1 - d0
        # kept prompt slots then the decode slots, gathered in one pass (padding: index 0, log π = +inf)
        idx = torch.cat([sample.indices[d0:d1], decode_idx.expand(nd, -1, -1)], 2).unsqueeze(-1)
        ks = k_all.unsqueeze(0).expand(nd, -1, -1, -1).gather(2, idx.expand(-1, -1, -1, k_all.shape[-1]))
        vs = v_all.unsqueeze(0).expand(nd, -1, -1, -1).gather(2, idx.expand(-1, -1, -1, v_all.shape[-1]))
        lp_prompt = sample.log_pi[d0:d1].to(f64)
        lps = torch.cat([lp_prompt, torch.zeros(nd, hkv, n_q - 1, dtype=f64, device=ks.device)], 2)
        mask = kept_mask[d0:d1].to(f64)  # [nd, Hkv, N]
        centre = torch.matmul(mask.transpose(0, 1), v_all[:, :n]).transpose(0, 1)  # the cache's centre: mean kept value
        centre = centre / mask.sum(-1, keepdim=True).clamp(min=1)
        evicted = ~kept_mask[d0:d1] & tail.unsqueeze(0)
        sketch = build_sketch(k_all[:, :n].unsqueeze(0).expand(nd, -1, -1, -1), v_all[:, :n].unsqueeze(0).expand(nd, -1, -1, -1),
                              evicted, potential.unsqueeze(0).expand(nd, -1, -1), centre, slots)
        qq = queries.unsqueeze(0).expand(nd, -1, -1, -1)  # [nd, Hq, Q, D]
        res = hajek_attention(qq, ks, vs, lps, scaling, causal=True, certificate=True, centre=centre, sketch=sketch)
        err = torch.linalg.vector_norm(res.output - exact.unsqueeze(0), dim=-1)  # [nd, Hq, Q]
        vatt = arm.columns(d0, d1, exact, delta) if arm is not None else None
        _columns(res, err, steps, delta, list(range(n_q)), d0, nd, hq, group, sample.lengths[d0:d1], cols["full"],
                 roundoff, vatt=vatt)
        if own:
            j = compressed.queries.shape[2]
            qo = compressed.queries[d0:d1].to(f64)  # [nd, Hq, J, D]
            kd, vd = compressed.keys[d0:d1].to(f64), compressed.values[d0:d1].to(f64)
            ko, vo = torch.cat([ks[:, :, :width], kd], 2), torch.cat([vs[:, :, :width], vd], 2)
            lpo = torch.cat([lp_prompt, torch.zeros(nd, hkv, j, dtype=f64, device=ks.device)], 2)
            res_o = hajek_attention(qo, ko, vo, lpo, scaling, causal=True, certificate=True, centre=centre, sketch=sketch)
            exact_o = _exact_own(qo, k_all[:, :n], v_all[:, :n], kd, vd, scaling)
            err_o = torch.linalg.vector_norm(res_o.output - exact_o, dim=-1)
            steps_o = torch.arange(2, j + 2, dtype=f64, device=k_all.device)
            _columns(res_o, err_o, steps_o, delta, list(range(1, j + 1)), d0, nd, hq, group, sample.lengths[d0:d1],
                     cols["own"], roundoff, compressed.diverged[d0:d1],
                     vatt={"exact_norm": torch.linalg.vector_norm(exact_o, dim=-1)})
    out = {}
    parts = [("full", cols["full"])] + ([("own", cols["own"])] if own else [])
    for c in names:
        out[c] = np.concatenate([np.concatenate(p[c]) for _, p in parts])
    kind_full = np.where(np.concatenate(cols["full"]["step"]) == 0, "setting", "later")
    kinds = [kind_full] + ([np.full(len(np.concatenate(cols["own"]["step"])), "sample_dependent")] if own else [])
    out["query_kind"] = np.concatenate(kinds)
    out["budget"] = np.full(len(out["query_kind"]), float(budget))
    return out


def replay_model(
    model, tokenizer, records, replay: ReplayPart, delta: float, design: RetentionDesign = DEFAULT_DESIGN,
    max_layers: int | None = None, model_name: str | None = None, scorer: str = "snapkv", progress: bool = False,
    vattention: bool = True,
) -> pd.DataFrame:
    """Replay draws of every record (see the module docstring); one row per (example, layer, head, budget, kind, step, draw).

    ``replay`` (``analysis_plan.replay``): its budgets, draws per budget, later queries, sampling seed and query
    kinds ("setting" always; "later" and "sample_dependent" add the decode steps of the full-cache and of the
    compressed run). ``vattention``: the vAttention arm's columns (:class:`_VAttentionArm`, one draw per kvcert draw,
    seeded by :func:`_vattention_seed`); False leaves them NaN.
    """
    _check_model(model)
    budgets, draws, later_queries, seed = replay.budgets, replay.draws, replay.later_queries, replay.seed
    query_kinds = replay.query_kinds
    if draws < 1:
        raise ValueError("replay.draws must be >= 1")
    name = model_name or getattr(model.config, "name_or_path", None) or type(model).__name__
    num_layers = model.config.get_text_config().num_hidden_layers
    layers = replay_layers(num_layers, max_layers)
    own = "sample_dependent" in query_kinds and later_queries > 0
    captured = list(range(num_layers)) if own else layers
    parts = []
    bar = progress_display(len(records) * len(budgets), f"replay {name}", "examples × budgets", progress)
    for record in records:
        ids, _ = build_prompt_ids(tokenizer, record)
        cap = capture(model, ids, captured, later_queries)
        for budget in budgets:
            drawn = {i: draw_samples(cap, i, budget, draws, design, seed, record.id, scorer) for i in captured}
            compressed = (compressed_decode(model, cap, {i: d[1] for i, d in drawn.items()}, later_queries, layers)
                          if own else {})
            for layer in layers:
                pi, sample = drawn[layer]
                cols = replay_layer(cap, layer, budget, pi, sample, delta, compressed.get(layer), design,
                                    _vattention_seed(seed, record.id, layer, float(budget)) if vattention else None)
                part = pd.DataFrame(cols)
                part.insert(0, "layer", np.int16(layer))
                part.insert(0, "target_tokens", int(record.metadata.get("target_tokens", -1)))
                part.insert(0, "example_id", record.id)
                part.insert(0, "model", name)
                parts.append(part)
            bar.update(1)
    bar.close()
    if not parts:
        return empty_replay()
    df = pd.concat(parts, ignore_index=True)
    if "later" not in query_kinds:
        df = df[df["query_kind"] != "later"].reset_index(drop=True)
    group = model.config.get_text_config().num_attention_heads // model.config.get_text_config().num_key_value_heads
    df["kv_head"] = (df["head"] // group).astype(np.int16)
    return df[TABLE_COLUMNS]


# --- impossibility ----------------------------------------------------------------------
@torch.no_grad()
def impossibility_for_model(
    model, tokenizer, record, budget: float = 0.25, modes: Sequence[str] = ("permute", "shift"),
    design: RetentionDesign = DEFAULT_DESIGN, seed: int = 0, layer: int | None = None, model_name: str | None = None,
) -> list[dict]:
    """Theorem 1 on one captured layer (the middle one by default) of ``record``'s prefill."""
    _check_model(model)
    num_layers = model.config.get_text_config().num_hidden_layers
    layer = num_layers // 2 if layer is None else layer
    ids, _ = build_prompt_ids(tokenizer, record)
    obs = capture(model, ids, [layer], 0).prompt[layer]
    obs = LayerObservation(obs.query.double(), obs.key.double(), obs.value.double(), None, obs.scaling, layer, num_layers)
    name = model_name or getattr(model.config, "name_or_path", None) or type(model).__name__
    rows = []
    for mode in modes:
        res = impossibility_demo(obs, budget=budget, mode=mode, design=design, seed=seed)
        rows.append({
            "model": name, "example_id": record.id, "layer": layer, "mode": mode, "budget": float(budget),
            "retained_hash_before": res.retained_hash_before, "retained_hash_after": res.retained_hash_after,
            "identical_retained_state": res.identical_retained_state,
            "error_before": res.error_before, "error_after": res.error_after, "error_ratio": res.error_ratio,
        })
    return rows
