"""Retention designs: inclusion probabilities and samplers for KV-cache eviction.

Implements the randomized retention design of Xie (arXiv 2607.21475, §3) as spelled
out in the project's docs/design.md §1, per row (one row = one (layer, KV head) of one
sequence):

* a *certainty set* C with inclusion probability π_i = 1: the first ``sinks`` tokens
  (attention sinks, Xiao et al. 2023), the last ``window`` tokens, and a deterministic
  top-score slice holding ``top_fraction`` of the budget left after sinks and window;
* a *tail* T = everything else, each token kept independently (Poisson sampling) with
  π_i = min(1, c · q_i), where q_i = (1 − η)·imp_i / Σ_T imp + η / |T| mixes the
  importance distribution with a uniform floor η, and c is solved so that the expected
  number of kept tokens equals the budget exactly (iterative capping: tokens whose
  c·q_i ≥ 1 are fixed at 1 and c is re-solved on the rest until no new token caps).
  The floor therefore gives every tail token π_i ≥ η·c/|T| — with c ≥ k_T, the tail's
  expected kept count (c > k_T when some tokens cap at 1) — which is not η·budget/N:
  at N = 1,024 and a 25 % budget (36 sinks + window, a 55-token slice, k_T = 165 of
  |T| = 933) it is 0.1·165/933 = 0.0177 before capping and more after, against
  η·budget/N = 0.025.

Samplers (all reproducible from a ``torch.Generator``):

* :func:`poisson_sample` — independent Bernoulli(π_i) retention;
* :func:`priority_sample` — priority sampling (Duffield, Lund & Thorup 2007): keep the
  k largest priorities w_i / U_i, τ = the (k+1)-th priority, π_i = min(1, w_i / τ);
  the kept count is exact and the Horvitz–Thompson weights 1/π_i stay unbiased;
* :func:`topk_sample` — the deterministic baseline (sinks + window + top scores, π = 1).

A :class:`Sample` stores, per row, the kept token positions and log π of each kept
token; rows may keep different counts and are padded (padding carries log π = +inf, so
the attention bias −log π is −inf there and padding never receives weight).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checks import check_nonnegative, resolve_budget
from ..config.design_params import RetentionDesign
from ..config.names import SAMPLERS

DEFAULT_DESIGN = RetentionDesign()


def layer_budget(budget, layer_idx: int, num_layers: int, design: RetentionDesign):
    """One layer's budget under ``design.dense_layers`` = d: 1.0 (every token) in the first d layers; in the
    others the fraction (L·b − d)/(L − d), so that the mean kept fraction over the L layers stays b (never
    below 1e-6: the certainty set still holds). A token count is kept as it is outside the dense layers."""
    d = design.dense_layers
    if d <= 0 or num_layers <= d:
        return budget
    if layer_idx < d:
        return 1.0
    if isinstance(budget, float):
        return max((num_layers * budget - d) / (num_layers - d), 1e-6)
    return budget


@dataclass
class Sample:
    """Kept tokens of each row: positions, log π, and counts.

    indices: LongTensor [..., K], kept positions in ascending order (padding repeats 0).
    log_pi: FloatTensor [..., K] (fp32), log inclusion probability (0 for certain tokens,
        +inf on padding).
    lengths: LongTensor [...], number of kept tokens per row.
    num_tokens: N, the number of tokens the rows were drawn from.
    """

    indices: torch.Tensor
    log_pi: torch.Tensor
    lengths: torch.Tensor
    num_tokens: int

    @property
    def valid(self) -> torch.Tensor:
        """Bool mask [..., K] of real (non-padding) entries."""
        k = self.indices.shape[-1]
        return torch.arange(k, device=self.indices.device) < self.lengths.unsqueeze(-1)

    def kept_mask(self) -> torch.Tensor:
        """Bool mask [..., N] over the original tokens (for analysis; not for storage)."""
        mask = torch.zeros(*self.indices.shape[:-1], self.num_tokens + 1, dtype=torch.bool, device=self.indices.device)
        target = torch.where(self.valid, self.indices, torch.full_like(self.indices, self.num_tokens))
        mask.scatter_(-1, target, True)
        return mask[..., : self.num_tokens]


def _rows(scores: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], int]:
    """Validate scores and view them as rows [R, N] (fp32 at least; fp64 stays fp64)."""
    if not isinstance(scores, torch.Tensor) or scores.ndim < 1 or scores.shape[-1] < 1:
        raise ValueError(f"scores: expected a tensor [..., N] with N >= 1, got {getattr(scores, 'shape', scores)!r}")
    check_nonnegative("scores", scores)
    lead = tuple(scores.shape[:-1])
    n = scores.shape[-1]
    return scores.reshape(-1, n).to(torch.promote_types(scores.dtype, torch.float32)), lead, n


def _row_budgets(budget, n: int, lead: tuple[int, ...], rows: int, device) -> torch.Tensor:
    k = resolve_budget(budget, n)
    if isinstance(k, torch.Tensor):
        try:
            k = torch.broadcast_to(k.to(device), lead)
        except RuntimeError as exc:
            raise ValueError(f"budget: per-row counts of shape {tuple(k.shape)} do not fit rows {lead}") from exc
        return k.reshape(rows).to(torch.long)
    return torch.full((rows,), k, dtype=torch.long, device=device)


def _fixed_span(n: int, design: RetentionDesign) -> tuple[int, int]:
    """[lo, hi): the positions between the sinks and the recent window."""
    lo = min(design.sinks, n)
    hi = max(lo, n - design.window)
    return lo, hi


@dataclass
class _Certainty:
    certain: torch.Tensor | None  # bool [R, N] (None: not built, ``top`` describes it)
    tail_budget: torch.Tensor  # long [R]
    lo: int
    hi: int
    count: torch.Tensor  # long [R], certain tokens per row (sinks + window + slice)
    top: torch.Tensor | None = None  # long [R, S], the slice's positions when every row's slice has S

    def fill(self, x: torch.Tensor, value: float) -> torch.Tensor:
        """x[certain] = value in place (ranges and the slice's positions: no pass over all of x)."""
        if self.top is None:
            return x.masked_fill_(self.certain, value)
        x[:, : self.lo] = value
        x[:, self.hi :] = value
        return x.scatter_(-1, self.top, value)


def _certainty(
    rows: torch.Tensor, k: torch.Tensor, design: RetentionDesign, *, slice_fraction: float, mask: bool = True
) -> _Certainty:
    """Sinks, window and the top-score slice (``slice_fraction`` of the free budget).

    ``mask=False``: skip the bool mask [R, N] where the slice's positions describe it (``top``
    set; ``certain`` is then None)."""
    r, n = rows.shape
    lo, hi = _fixed_span(n, design)
    n_fixed = n - (hi - lo)
    small = k < n_fixed
    if bool(small.any()) and bool((k < n).any()):
        raise ValueError(
            f"budget: {int(k[small].min())} tokens is smaller than the certainty set of "
            f"{design.sinks} sinks + {design.window} recent tokens ({n_fixed} of {n}); raise the budget or shrink sinks/window"
        )
    free = (k - n_fixed).clamp(min=0)
    sizes = torch.round(free.to(torch.float64) * slice_fraction).to(torch.long).clamp(max=hi - lo)
    kmax = int(sizes.max()) if r else 0
    top = same = None
    if kmax > 0:
        same = bool((sizes == kmax).all())  # equal sizes need no sorted order
        top = rows[:, lo:hi].topk(kmax, dim=-1, sorted=not same).indices + lo
    elif r:
        top, same = torch.zeros(r, 0, dtype=torch.long, device=rows.device), True
    certain = None
    if mask or not same:
        certain = torch.zeros(r, n, dtype=torch.bool, device=rows.device)
        certain[:, :lo] = True
        certain[:, hi:] = True
        if kmax > 0:
            certain.scatter_(-1, top, torch.arange(kmax, device=rows.device) < sizes.unsqueeze(-1))
    return _Certainty(certain, (free - sizes).clamp(min=0), lo, hi, sizes + n_fixed, top if same else None)


def _kth_largest(x: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """Per row, the j-th largest entry of x (j ≥ 1); 0 where j exceeds the row length."""
    n = x.shape[-1]
    jmax = int(j.max()) if j.numel() else 0
    if jmax == 0:
        return torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
    width = min(jmax, n)
    if bool((j == jmax).all()):
        kth = x.topk(width, dim=-1, sorted=False).values.amin(-1)
    else:
        kth = x.topk(width, dim=-1).values.gather(-1, (j.clamp(max=width) - 1).unsqueeze(-1)).squeeze(-1)
    return torch.where(j > n, torch.zeros_like(kth), kth)


#: rows at least this long take :func:`_kth_largest_radix` (its two histograms cost more than a
#: top-k of a short row)
RADIX_MIN_TOKENS = 1 << 14


def _kth_largest_radix(x: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """:func:`_kth_largest` of an fp32 x ≥ +0 (no −0, no NaN) by a two-pass radix select.

    The bit patterns of non-negative floats order like the floats, so the j-th largest is the
    m-th smallest pattern, m = N − j + 1: a histogram of the high 16 bits finds its bucket, a
    histogram of the low 15 bits inside that bucket (everything below folded into bin 0,
    above into the last bin) finds the pattern. Two bincounts instead of a top-k's
    selection over (value, index) pairs; the value returned is the same entry of x.
    """
    r, n = x.shape
    bits = x.contiguous().view(torch.int32)
    m = (n - j + 1).clamp(min=1).unsqueeze(-1)
    row = torch.arange(r, device=x.device, dtype=torch.int32).unsqueeze(-1)
    key = torch.bitwise_right_shift(bits, 15).add_(row << 16)
    below = torch.bincount(key.view(-1), minlength=r << 16).view(r, 1 << 16).cumsum_(-1)
    bucket = torch.searchsorted(below, m).to(torch.int32)  # first bucket holding the m-th smallest
    key = torch.sub(bits, bucket << 15, out=key).clamp_(-1, 1 << 15).add_(row * ((1 << 15) + 2) + 1)
    below = torch.bincount(key.view(-1), minlength=r * ((1 << 15) + 2)).view(r, (1 << 15) + 2).cumsum_(-1)
    pattern = (bucket << 15) | (torch.searchsorted(below, m).to(torch.int32) - 1)
    kth = pattern.view(torch.float32).squeeze(-1)
    return torch.where(j > n, torch.zeros_like(kth), kth)


def tempered(rows: torch.Tensor, temper: float) -> torch.Tensor:
    """imp^α (a new tensor; a copy when α = 1)."""
    return rows.clone() if temper == 1.0 else rows.pow(temper)


def tail_weights(rows: torch.Tensor, certain: torch.Tensor, floor: float, temper: float = 1.0) -> torch.Tensor:
    """q_i = (1 − η)·imp_i^α / Σ_T imp^α + η / |T| on the tail T = not certain (0 elsewhere); rows sum to 1."""
    imp = torch.where(certain, 0.0, tempered(rows, temper))
    n_tail = (rows.shape[-1] - certain.sum(-1, keepdim=True, dtype=torch.int32)).clamp(min=1).to(torch.float64)
    total = imp.sum(-1, keepdim=True).to(torch.float64)
    scale = torch.where(total > 0, (1.0 - floor) / total.clamp(min=1e-300), torch.zeros_like(total))
    offset = torch.where(total > 0, floor / n_tail, 1.0 / n_tail)  # all-zero importance: uniform tail
    q = imp.mul_(scale.to(rows.dtype)).add_(offset.to(rows.dtype))
    return q.masked_fill_(certain, 0.0)


def capped_probabilities(weights: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """π_i = min(1, c·w_i) with c solved so that Σ_i π_i = expected (per row).

    Iterative capping: start from c = expected / Σw, fix every token with c·w_i ≥ 1 at 1,
    re-solve c on the remaining mass, repeat until no new token caps. c only grows, so
    the capped set only grows and the loop ends after at most N rounds (a handful in
    practice; one when nothing caps). Per-row constants are solved in float64; with fp32
    weights the expected count is met to ~1e-7 relative (cascade summation). Rows whose
    expected count reaches their number of positive weights get π = 1 on all of them.
    """
    w = weights
    target = expected.to(torch.float64)
    total = w.sum(-1).to(torch.float64)
    c = target / total.clamp(min=1e-300)
    if bool((w.amax(-1).to(torch.float64) * c < 1.0).all()):
        return w * c.to(w.dtype).unsqueeze(-1)  # nothing caps: one pass
    previous = None
    for _ in range(w.shape[-1] + 1):
        capped = (w * c.to(w.dtype).unsqueeze(-1)) >= 1.0
        count = capped.sum(-1, dtype=torch.int32)
        if not bool(count.any()) or (previous is not None and torch.equal(count, previous)):
            break  # nothing caps, or no new token capped: c is final
        previous = count
        capped_mass = torch.where(capped, w, 0.0).sum(-1).to(torch.float64)
        rest = total - capped_mass
        c = torch.where(rest > 0, (target - count.to(torch.float64)) / rest.clamp(min=1e-300), c)
    return (w * c.to(w.dtype).unsqueeze(-1)).clamp_(max=1.0)


def _inclusion_rows(rows: torch.Tensor, k: torch.Tensor, design: RetentionDesign) -> torch.Tensor:
    cert = _certainty(rows, k, design, slice_fraction=design.top_fraction)
    weights = tail_weights(rows, cert.certain, design.floor, design.temper)
    pi = capped_probabilities(weights, cert.tail_budget)
    return pi.masked_fill_(cert.certain, 1.0)


def inclusion_probabilities(
    scores: torch.Tensor, budget: float | int | torch.Tensor, design: RetentionDesign = DEFAULT_DESIGN
) -> torch.Tensor:
    """Inclusion probabilities π [..., N] (float64) from importance scores and a budget.

    scores: non-negative importance per token, [..., N] (one row per (layer, KV head)).
    budget: fraction of N in (0, 1], a token count, or a LongTensor of per-row counts.
    Certain tokens get π = 1; the tail gets π ∝ mixed importance, capped at 1; the
    expected kept count Σ π equals the budget.
    """
    rows, lead, n = _rows(scores)
    k = _row_budgets(budget, n, lead, rows.shape[0], rows.device)
    return _inclusion_rows(rows, k, design).reshape(*lead, n)


def cpu_generator(seed: int) -> torch.Generator:
    """The one generator recipe of every random draw (the press's evictions, the replay's draws):
    a CPU ``torch.Generator`` seeded with ``seed``. The samplers draw their uniforms on it and
    move them to the scores' device (:func:`_uniform`), so a draw is the same on a GPU as on a CPU."""
    return torch.Generator().manual_seed(int(seed))


def _uniform(shape, generator: torch.Generator | None, device, dtype=torch.float64) -> torch.Tensor:
    """U[0, 1) draws from ``generator`` (on its own device), moved to ``device``."""
    gen_device = generator.device if generator is not None else torch.device("cpu")
    return torch.rand(shape, generator=generator, dtype=dtype, device=gen_device).to(device)


def _padded(rows: torch.Tensor, cols: torch.Tensor, lengths: torch.Tensor, r: int, k: int) -> torch.Tensor:
    """A kept mask's row-major nonzero positions (rows, cols) [M] as indices [R, K] (padding 0)."""
    slot = torch.arange(rows.shape[0], device=rows.device) - (torch.cumsum(lengths, 0) - lengths)[rows]
    indices = torch.zeros(r, k, dtype=torch.long, device=rows.device)
    indices[rows, slot] = cols
    return indices


def pack(kept: torch.Tensor, pi_full: torch.Tensor | None, lead: tuple[int, ...]) -> Sample:
    """Compact a kept mask [R, N] into a :class:`Sample` (kept positions in ascending order).

    ``pi_full`` [R, N] holds the inclusion probability of every token (None: all 1); only
    the kept ones are gathered and logged.
    """
    r, n = kept.shape
    nz = kept.nonzero()  # row-major: each row's kept positions in ascending order
    lengths = kept.sum(-1, dtype=torch.int32).to(torch.long)
    k = int(lengths.max()) if r else 0
    indices = _padded(nz[:, 0], nz[:, 1], lengths, r, k)
    valid = torch.arange(k, device=kept.device) < lengths.unsqueeze(-1)
    if pi_full is None:  # every kept token is certain
        log_pi = torch.where(valid, 0.0, float("inf"))
    else:
        kept_pi = pi_full.gather(-1, indices).to(torch.float32)
        log_pi = torch.where(valid, torch.log(kept_pi.clamp_(min=torch.finfo(torch.float32).tiny)), float("inf"))
    return Sample(
        indices=indices.reshape(*lead, k),
        log_pi=log_pi.to(torch.float32).reshape(*lead, k),
        lengths=lengths.reshape(lead),
        num_tokens=n,
    )


def _poisson_rows(rows: torch.Tensor, lead: tuple[int, ...], generator: torch.Generator | None) -> Sample:
    kept = _uniform(rows.shape, generator, rows.device, rows.dtype) < rows  # P(U < π) = π; π = 0 never, 1 always
    return pack(kept, rows, lead)


def _tail_affine(rows: torch.Tensor, cert: _Certainty, floor: float, temper: float = 1.0):
    """The tail importance imp^α (certain tokens zeroed) and the per-row (scale, offset) with which
    q_i = scale · imp_i^α + offset are the tail weights of :func:`tail_weights`."""
    imp = cert.fill(tempered(rows, temper), 0.0)
    n_tail = (rows.shape[-1] - cert.count).clamp(min=1).to(torch.float64)
    total = imp.sum(-1).to(torch.float64)
    scale = torch.where(total > 0, (1.0 - floor) / total.clamp(min=1e-300), torch.zeros_like(total))
    offset = torch.where(total > 0, floor / n_tail, 1.0 / n_tail)  # all-zero importance: uniform tail
    return imp, scale, offset


def _with_certain_log_pi(sample: Sample, certain: torch.Tensor, lead) -> Sample:
    """Set log π = 0 for kept certain tokens (the fast paths leave their π unnormalised)."""
    is_certain = certain.gather(-1, sample.indices) & sample.valid
    log_pi = sample.log_pi.masked_fill(is_certain, 0.0)
    return Sample(sample.indices.reshape(*lead, -1), log_pi.reshape(*lead, -1), sample.lengths.reshape(lead),
                  sample.num_tokens)


def _poisson_design(rows: torch.Tensor, k: torch.Tensor, design: RetentionDesign, lead, generator) -> Sample:
    """:func:`sample_retention`'s Poisson path: the π of :func:`inclusion_probabilities` and the
    draw, in fewer passes over the tokens. The tail weights sum to 1 by construction, so
    c = k_T unless some token caps (then the general capping solve runs)."""
    cert = _certainty(rows, k, design, slice_fraction=design.top_fraction)
    certain = cert.certain
    imp, scale, offset = _tail_affine(rows, cert, design.floor, design.temper)
    c = cert.tail_budget.to(torch.float64)
    peak = (imp.amax(-1).to(torch.float64) * scale + offset) * c
    if bool((peak < 1.0).all()):  # nothing caps: pi = c * q on the tail (certain tokens are fixed below)
        pi = imp.mul_((scale * c).to(rows.dtype).unsqueeze(-1)).add_((offset * c).to(rows.dtype).unsqueeze(-1))
    else:
        q = imp.mul_(scale.to(rows.dtype).unsqueeze(-1)).add_(offset.to(rows.dtype).unsqueeze(-1))
        pi = capped_probabilities(q.masked_fill_(certain, 0.0), cert.tail_budget)
    kept = (_uniform(rows.shape, generator, rows.device, rows.dtype) < pi) | certain
    return _with_certain_log_pi(pack(kept, pi, (rows.shape[0],)), certain, lead)


def poisson_sample(pi: torch.Tensor, generator: torch.Generator | None = None) -> Sample:
    """Keep token i independently with probability π_i (Poisson sampling design)."""
    if not isinstance(pi, torch.Tensor) or pi.ndim < 1:
        raise ValueError(f"pi: expected a tensor [..., N], got {getattr(pi, 'shape', pi)!r}")
    if pi.numel() == 0:
        raise ValueError(f"pi: empty (shape {tuple(pi.shape)}): no token to sample; give at least one inclusion "
                         "probability per row")
    check_nonnegative("pi", pi)
    if float(pi.max()) > 1.0:
        raise ValueError("pi: inclusion probabilities must lie in [0, 1]")
    lead, n = tuple(pi.shape[:-1]), pi.shape[-1]
    return _poisson_rows(pi.reshape(-1, n), lead, generator)


def priority_sample(
    scores: torch.Tensor,
    budget: float | int | torch.Tensor,
    generator: torch.Generator | None = None,
    design: RetentionDesign = DEFAULT_DESIGN,
) -> Sample:
    """Exact-size design: certainty set + priority sampling of the tail (Duffield–Lund–Thorup 2007).

    Tail weights w_i are the same mixed importance as in :func:`inclusion_probabilities`;
    priorities w_i / U_i; the k_T largest are kept, τ = the (k_T + 1)-th largest priority,
    and each kept tail token carries π_i = min(1, w_i / τ). The kept count equals the
    budget exactly.
    """
    rows, lead, n = _rows(scores)
    r = rows.shape[0]
    k = _row_budgets(budget, n, lead, r, rows.device)
    cert = _certainty(rows, k, design, slice_fraction=design.top_fraction, mask=False)
    imp, scale, offset = _tail_affine(rows, cert, design.floor, design.temper)
    # −w and U − 1 ∈ [−1, 0) (exact): (−w) / (U − 1) is w / (1 − U) bit for bit, one pass fewer; 1 − U ∈ (0, 1]
    # never divides by 0. Certain tokens get w, so priority, +inf: they rank above the tail (one
    # compare keeps both) and min(1, w / τ) = 1 (log π = 0) for them.
    neg_w = imp.mul_((-scale).to(rows.dtype).unsqueeze(-1)).add_((-offset).to(rows.dtype).unsqueeze(-1))
    cert.fill(neg_w, float("-inf"))
    u = _uniform(rows.shape, generator, rows.device, rows.dtype).sub_(1.0)
    priority = torch.div(neg_w, u, out=u)
    if not bool((offset.to(rows.dtype) > 0).all()):
        priority.add_(0.0)  # a weight −0 (a −0 score, no floor) gives priority −0: make it +0 for the radix select
    n_positive = n - cert.count
    if design.floor <= 0:
        n_positive = (priority > 0).sum(-1) - cert.count
    take = torch.minimum(cert.tail_budget, n_positive)
    # τ: the (take + 1)-th largest tail priority (0 when the tail runs out)
    radix = rows.dtype == torch.float32 and n >= RADIX_MIN_TOKENS
    tau = (_kth_largest_radix if radix else _kth_largest)(priority, take + 1 + cert.count).unsqueeze(-1)
    kept = priority > tau
    flat = kept.view(-1).nonzero().squeeze(-1)  # row-major: each row's kept positions in ascending order
    longest = cert.count + take  # no row keeps more (ties at τ keep fewer)
    if flat.shape[0] == int(longest.sum()):
        lengths = longest
    else:
        lengths = kept.sum(-1, dtype=torch.int32).to(torch.long)
    width = int(lengths.max()) if r else 0
    full = flat.shape[0] == r * width
    if full:  # every row keeps `width`: the flat positions are the layout
        indices = flat.view(r, width).sub_(torch.arange(0, r * n, n, device=rows.device).unsqueeze(-1))
    else:
        indices = _padded(flat // n, flat % n, lengths, r, width)
    pi = neg_w.gather(-1, indices).div_(tau.clamp(min=torch.finfo(rows.dtype).tiny).neg_())
    if not bool((tau > 0).all()):
        pi = torch.where(tau > 0, pi, 1.0)
    log_pi = pi.clamp_(max=1.0).to(torch.float32).clamp_(min=torch.finfo(torch.float32).tiny).log_()
    if not full:
        log_pi.masked_fill_(torch.arange(width, device=rows.device) >= lengths.unsqueeze(-1), float("inf"))
    return Sample(indices.reshape(*lead, width), log_pi.reshape(*lead, width), lengths.reshape(lead), n)


def topk_sample(
    scores: torch.Tensor, budget: float | int | torch.Tensor, design: RetentionDesign = DEFAULT_DESIGN
) -> Sample:
    """Deterministic baseline: sinks + window + the highest scores, every kept π = 1."""
    rows, lead, n = _rows(scores)
    k = _row_budgets(budget, n, lead, rows.shape[0], rows.device)
    kept = _certainty(rows, k, design, slice_fraction=1.0).certain
    return pack(kept, None, lead)


def sample_retention(
    scores: torch.Tensor,
    budget: float | int | torch.Tensor,
    sampler: str = "poisson",
    generator: torch.Generator | None = None,
    design: RetentionDesign = DEFAULT_DESIGN,
) -> Sample:
    """One call from scores to kept tokens: ``sampler`` is "poisson", "priority" or "topk"."""
    if sampler == "poisson":
        rows, lead, n = _rows(scores)
        k = _row_budgets(budget, n, lead, rows.shape[0], rows.device)
        return _poisson_design(rows, k, design, lead, generator)
    if sampler == "priority":
        return priority_sample(scores, budget, generator, design)
    if sampler == "topk":
        return topk_sample(scores, budget, design)
    raise ValueError(f"sampler: must be one of {SAMPLERS}, got {sampler!r}")
