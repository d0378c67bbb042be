"""Statistics of the claims: AUC, Spearman, weighted quantiles, the unit bootstrap,
percentile intervals and the verdict rules.

Implements ``analysis_plan.bootstrap`` and ``verdict_rules`` of
``preregistration/claims.yaml``:

* **Bootstrap over units.** A unit is an example ``(model, task, target_tokens,
  example_id)`` with all its records (a replay cell for the replay claims). Drawing U
  units with replacement is the same as giving unit u a multiplicity ``c_u``
  (``c ~ Multinomial(U, 1/U)``) and every record the multiplicity of its unit. Each
  statistic below is written for such integer weights, so ``statistic(weights)`` is
  exactly the statistic of the resampled data set (ties included) — without building
  it. ``resamples`` draws from ``numpy.random.default_rng(seed)``; the interval is the
  two-sided percentile interval at ``level``. A resample where a statistic is undefined
  (an AUC with one class present, a ratio with a zero denominator) is skipped and
  counted; with more than 10 % skipped the test is unclear.
* **AUC.** Point estimates in the Mann–Whitney form, from mid-ranks (:func:`auc`:
  P(score₊ > score₋) + ½ P(tie), the trapezoidal ROC area :func:`sklearn.metrics.roc_auc_score`
  computes, without its per-call overhead — a stratified AUC calls it once per stratum); the
  resamples use :class:`AUCIndex`, the same area on weights, vectorised over resamples — both
  equal to sklearn's to rounding (tests check them against it).
* **Spearman.** Point estimates with :func:`scipy.stats.spearmanr`; resamples with
  weighted mid-ranks (:class:`SpearmanIndex`), again equal to the resampled data's.
* **Stratified AUC.** :class:`StratifiedAUCIndex`: the same area over the pairs that share
  a stratum only (the pair-weighted mean of within-stratum AUCs), so a score that knows
  only a run's stratum scores exactly ½ — the mix of strata cannot pass for a signal.
* **Verdicts** (``verdict_rules``): a test compares a statistic with a threshold through
  its interval — it *passes* when the interval lies entirely on the claim's side,
  *fails* when entirely on the other side, and is *unclear* otherwise. A claim holds
  when every test passes and no placebo's tests all pass (else it is *uninformative*),
  is killed when any test fails, and is inconclusive otherwise or when a cell is below
  the pre-registered minimum size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

import math

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from ..config.analysis_plan import BootstrapPart

#: the largest share of skipped resamples a test tolerates before it is unclear
MAX_SKIPPED_FRACTION = 0.10

OPS = (">=", ">", "<=", "<")


# --- the bootstrap ---------------------------------------------------------------------
#: resamples are evaluated in chunks of about this many weights (chunk × records floats; at least one resample, at
#: most :data:`MAX_CHUNK`): few records, many resamples at once. The chunking does not change the resamples (the
#: generator's stream is drawn in order).
CHUNK_ELEMENTS = 1 << 16
#: the most resamples of one chunk
MAX_CHUNK = 1024


def encode_units(units: Sequence | pd.Series | np.ndarray) -> tuple[np.ndarray, int]:
    """Integer codes 0..U−1 of each record's unit, and U."""
    codes, uniques = pd.factorize(pd.Series(units), sort=True)
    if (codes < 0).any():
        raise ValueError("units: a record has no unit (missing value)")
    return codes.astype(np.int64), len(uniques)


def weight_chunks(codes: np.ndarray, n_units: int, plan: BootstrapPart,
                  max_chunk: int = MAX_CHUNK) -> Iterator[np.ndarray]:
    """Per resample of ``plan`` (``analysis_plan.bootstrap``: resamples, seed), the weight of every record (its unit's
    multiplicity): chunks [b, n] of at most ``max_chunk`` resamples."""
    rng = np.random.default_rng(plan.seed)
    done = 0
    size = max(1, min(max_chunk, CHUNK_ELEMENTS // max(1, len(codes), n_units)))
    while done < plan.resamples:
        b = min(size, plan.resamples - done)
        picks = rng.integers(0, n_units, size=(b, n_units))
        flat = (picks + (np.arange(b) * n_units)[:, None]).ravel()
        counts = np.bincount(flat, minlength=b * n_units).reshape(b, n_units).astype(np.float64)
        yield counts[:, codes]
        done += b


@dataclass
class Estimate:
    """A statistic: point estimate, percentile interval, resamples used and skipped."""

    name: str
    estimate: float
    ci_low: float
    ci_high: float
    level: float
    resamples: int
    skipped: int
    samples: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False)

    @property
    def skipped_fraction(self) -> float:
        return self.skipped / self.resamples if self.resamples else 1.0

    def to_dict(self) -> dict:
        return {
            "estimate": _num(self.estimate), "ci": [_num(self.ci_low), _num(self.ci_high)], "level": self.level,
            "resamples": self.resamples, "skipped": self.skipped,
        }


def _num(x) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


Statistic = Callable[[np.ndarray], Mapping[str, tuple[np.ndarray, np.ndarray]]]


def percentile_interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    """Two-sided percentile interval of ``samples`` at ``level`` (NaN when empty)."""
    samples = np.asarray(samples, dtype=np.float64)
    if samples.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.percentile(samples, [50.0 * (1.0 - level), 50.0 * (1.0 + level)])
    return float(lo), float(hi)


def bootstrap(
    statistic: Statistic,
    codes: np.ndarray,
    n_units: int,
    plan: BootstrapPart,
    point: Mapping[str, float] | None = None,
    max_chunk: int = MAX_CHUNK,
) -> dict[str, Estimate]:
    """Paired bootstrap of every statistic ``statistic(weights)`` returns (``plan``: ``analysis_plan.bootstrap``, its
    resamples, seed and interval level).

    ``statistic`` maps a weight matrix [b, n] (one row per resample, one column per
    record) to ``{name: (values [b], valid [b])}``; all names share the same resamples
    (paired differences). Point estimates come from ``point`` where given, else from
    the statistic at unit weights.
    """
    n = len(codes)
    at_one = statistic(np.ones((1, n)))
    values: dict[str, list[np.ndarray]] = {name: [] for name in at_one}
    valid: dict[str, list[np.ndarray]] = {name: [] for name in at_one}
    if n_units > 0:
        for w in weight_chunks(codes, n_units, plan, max_chunk):
            for name, (v, ok) in statistic(w).items():
                values[name].append(np.asarray(v, dtype=np.float64))
                valid[name].append(np.asarray(ok, dtype=bool) & np.isfinite(v))
    out = {}
    for name, (v1, ok1) in at_one.items():
        est = float(point[name]) if point and name in point else (float(v1[0]) if bool(ok1[0]) else float("nan"))
        v = np.concatenate(values[name]) if values[name] else np.empty(0)
        ok = np.concatenate(valid[name]) if valid[name] else np.empty(0, dtype=bool)
        kept = v[ok]
        lo, hi = percentile_interval(kept, plan.level)
        out[name] = Estimate(name, est, lo, hi, plan.level, int(v.size), int((~ok).sum()), kept)
    return out


# --- weighted statistics ------------------------------------------------------------------
def weighted_mean(values: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Σ w·x / Σ w per resample row; valid where Σ w > 0."""
    total = w.sum(axis=1)
    num = w @ np.asarray(values, dtype=np.float64)
    ok = total > 0
    return np.where(ok, num / np.where(ok, total, 1.0), np.nan), ok


class RankIndex:
    """Sort order and tie groups of one score vector, shared by every resample."""

    def __init__(self, scores: np.ndarray):
        scores = np.asarray(scores, dtype=np.float64)
        if np.isnan(scores).any():
            raise ValueError("scores: NaN values cannot be ranked; drop them first")
        self.order = np.argsort(scores, kind="mergesort")
        s = scores[self.order]
        self.starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]]) if s.size else np.empty(0, dtype=np.int64)
        self.group_of_sorted = np.cumsum(np.r_[True, s[1:] != s[:-1]]) - 1 if s.size else np.empty(0, dtype=np.int64)
        self.no_ties = self.starts.size == s.size

    def group_sums(self, w: np.ndarray) -> np.ndarray:
        """Per tie group (ascending score), the sum of ``w`` [b, n] → [b, groups]."""
        if self.no_ties:  # every group is one record
            return w[:, self.order]
        return np.add.reduceat(w[:, self.order], self.starts, axis=1)

    def midranks(self, w: np.ndarray) -> np.ndarray:
        """Weighted mid-ranks (up to a constant) of every record, in original order [b, n]."""
        g = self.group_sums(w)
        mid = np.cumsum(g, axis=1)
        mid -= 0.5 * g
        ranks = np.empty_like(w)
        ranks[:, self.order] = mid if self.no_ties else mid[:, self.group_of_sorted]
        return ranks


def _scored_labels(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``scores`` and 0/1 ``labels`` as float arrays, refusing a NaN score and a label other than 0 or 1."""
    scores = np.asarray(scores, dtype=np.float64)
    if np.isnan(scores).any():
        raise ValueError("scores: NaN values cannot be ranked; drop them first")
    labels = np.asarray(labels, dtype=np.float64)
    if not np.isin(labels, (0.0, 1.0)).all():
        raise ValueError("labels: must be 0/1")
    return scores, labels


class AUCIndex:
    """Weighted ROC AUC of ``scores`` for binary ``labels`` (1 = positive), per resample.

    AUC = Σ_{i positive} w_i (N_<(s_i) + ½ N_=(s_i)) / (P·N), N_< and N_= the weight of the
    negatives scored below and equal to s_i: the probability that a positive outranks a
    negative, ties counting one half — the area under the trapezoidal ROC curve, as
    :func:`sklearn.metrics.roc_auc_score` computes it. The negatives are sorted once; per
    resample their cumulative weight is read at each positive's two insertion points
    (every sum is of integer weights, exact in float64).
    """

    def __init__(self, scores: np.ndarray, labels: np.ndarray):
        scores, labels = _scored_labels(scores, labels)
        negatives = np.flatnonzero(labels == 0.0)
        self.neg = negatives[np.argsort(scores[negatives], kind="mergesort")]
        self.pos = np.flatnonzero(labels == 1.0)
        sorted_neg = scores[self.neg]
        self.below = np.searchsorted(sorted_neg, scores[self.pos], side="left")
        self.at_or_below = np.searchsorted(sorted_neg, scores[self.pos], side="right")
        self.ties = not np.array_equal(self.below, self.at_or_below)

    def __call__(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cum = np.zeros((w.shape[0], self.neg.size + 1))
        np.cumsum(w[:, self.neg], axis=1, out=cum[:, 1:])
        under = cum[:, self.below]
        if self.ties:
            under += cum[:, self.at_or_below]
            under *= 0.5
        wp = w[:, self.pos]
        num = np.einsum("ij,ij->i", wp, under)
        p, n = wp.sum(axis=1), cum[:, -1]
        ok = (p > 0) & (n > 0)
        return np.where(ok, num / np.where(ok, p * n, 1.0), np.nan), ok


class StratifiedAUCIndex:
    """Weighted AUC over the (positive, negative) pairs that share a stratum, per resample.

    AUC_strat = Σ_s P_s N_s AUC_s / Σ_s P_s N_s — the pair-weighted mean of the within-stratum
    AUCs, i.e. the Mann–Whitney area of :class:`AUCIndex` restricted to pairs of one stratum
    (ties one half). A stratum lacking either class contributes no pair. Scores are replaced
    by their dense ranks and offset by stratum, so one sort of the negatives serves every
    stratum: a positive's count of negatives below it is read between its stratum's start
    and its own insertion point.
    """

    def __init__(self, scores: np.ndarray, labels: np.ndarray, strata: np.ndarray):
        scores, labels = _scored_labels(scores, labels)
        strata = np.asarray(strata, dtype=np.int64)
        if strata.shape != scores.shape:
            raise ValueError("strata: one stratum code per score")
        rank = np.unique(scores, return_inverse=True)[1].astype(np.int64)
        span = int(rank.max()) + 2 if rank.size else 1
        key = strata * span + rank
        negatives = np.flatnonzero(labels == 0.0)
        self.neg = negatives[np.argsort(key[negatives], kind="mergesort")]
        self.pos = np.flatnonzero(labels == 1.0)
        sorted_neg = key[self.neg]
        kp, sp = key[self.pos], strata[self.pos]
        self.start = np.searchsorted(sorted_neg, sp * span, side="left")
        self.end = np.searchsorted(sorted_neg, (sp + 1) * span, side="left")
        self.below = np.searchsorted(sorted_neg, kp, side="left")
        self.at_or_below = np.searchsorted(sorted_neg, kp, side="right")
        self.ties = not np.array_equal(self.below, self.at_or_below)

    def __call__(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cum = np.zeros((w.shape[0], self.neg.size + 1))
        np.cumsum(w[:, self.neg], axis=1, out=cum[:, 1:])
        base = cum[:, self.start]
        under = cum[:, self.below] - base
        if self.ties:
            under += cum[:, self.at_or_below] - base
            under *= 0.5
        wp = w[:, self.pos]
        num = np.einsum("ij,ij->i", wp, under)
        pairs = np.einsum("ij,ij->i", wp, cum[:, self.end] - base)
        ok = pairs > 0
        return np.where(ok, num / np.where(ok, pairs, 1.0), np.nan), ok


def stratified_auc(scores: np.ndarray, labels: np.ndarray, strata: np.ndarray) -> tuple[float, int, int]:
    """The pair-weighted mean of :func:`auc` within each stratum (scikit-learn per stratum), the number
    of strata that hold both classes, and the number dropped for lacking one (NaN when none holds both)."""
    scores, labels, strata = np.asarray(scores, float), np.asarray(labels, float), np.asarray(strata)
    total = pairs = 0.0
    used = dropped = 0
    for s in np.unique(strata):
        m = strata == s
        p = float(labels[m].sum())
        n = float(m.sum() - p)
        if p == 0 or n == 0:
            dropped += 1
            continue
        used += 1
        total += p * n * auc(scores[m], labels[m])
        pairs += p * n
    return (total / pairs if pairs else float("nan")), used, dropped


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC (the greater of two labels positive) by the Mann–Whitney statistic on mid-ranks: (sum of the
    positives' ranks − p(p+1)/2) / (p·n), ties counted one half; NaN when only one class is present."""
    labels = np.asarray(labels)
    classes = np.unique(labels)
    if labels.size == 0 or classes.size < 2:
        return float("nan")
    if classes.size > 2:
        raise ValueError(f"auc: labels must take two values, got {classes.size}")
    positive = labels == classes[-1]
    p = int(positive.sum())
    n = labels.size - p
    ranks = scipy_stats.rankdata(np.asarray(scores, dtype=np.float64))
    return float((ranks[positive].sum() - p * (p + 1) / 2.0) / (p * n))


class SpearmanIndex:
    """Weighted Spearman correlation of (x, y) per resample: weighted Pearson of weighted mid-ranks."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.rx = RankIndex(x)
        self.ry = RankIndex(y)

    def __call__(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return weighted_pearson(self.rx.midranks(w), self.ry.midranks(w), w)


def weighted_pearson(a: np.ndarray, b: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise weighted Pearson correlation of a and b [r, n] with weights w [r, n]."""
    total = w.sum(axis=1, keepdims=True)
    safe = np.where(total > 0, total, 1.0)
    ma = (w * a).sum(axis=1, keepdims=True) / safe
    mb = (w * b).sum(axis=1, keepdims=True) / safe
    da, db = a - ma, b - mb
    cov = (w * da * db).sum(axis=1)
    va = (w * da * da).sum(axis=1)
    vb = (w * db * db).sum(axis=1)
    ok = (total[:, 0] > 0) & (va > 0) & (vb > 0)
    return np.where(ok, cov / np.sqrt(np.where(ok, va * vb, 1.0)), np.nan), ok


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation with SciPy (NaN when a variable is constant)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.size < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    return float(scipy_stats.spearmanr(x, y).statistic)


def weighted_quantile(values: np.ndarray, q: float, w: np.ndarray) -> np.ndarray:
    """Inverted-CDF quantile per resample row (``numpy.quantile(method="inverted_cdf")`` at unit weights).

    The smallest value whose cumulative weight reaches q · total; [b].
    """
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="mergesort")
    cum = np.cumsum(w[:, order], axis=1)
    target = q * cum[:, -1:]
    idx = (cum < target - 1e-12 * np.maximum(cum[:, -1:], 1.0)).sum(axis=1)
    return values[order][np.minimum(idx, values.size - 1)]


class WeightedQuantile:
    """The ``q`` quantile of ``values`` per resample, each value weighted by its unit's multiplicity: ``values`` [N]
    (no NaN; ±inf allowed) with ``units`` [N] the index of each value's unit among the bootstrap's records, evaluated
    on record weights [b, records]. Exact (no binning): the midpoint of the lower and upper weighted quantiles — the
    values where the cumulative weight first reaches, and first passes, q of the total — which at unit weights is
    :func:`numpy.quantile`'s ``averaged_inverted_cdf`` (at q = 1/2: :func:`numpy.median`); with ``method=
    "inverted_cdf"`` the lower one alone (:func:`weighted_quantile`'s, without re-sorting at every call).

    Where the weights are whole counts that agree across groups of records (a bootstrap over prompts: a prompt's
    every replay cell draws its count) the crossing is found block by block (:meth:`_blocked`): the blocks' weights
    from the groups' counts in each block, then the cumulative sum inside one block — the same integers added,
    so the same answer, at a cost of groups × √N instead of N per resample."""

    def __init__(self, values: np.ndarray, units: np.ndarray, q: float = 0.5, method: str = "averaged_inverted_cdf"):
        values = np.asarray(values, dtype=np.float64)
        if np.isnan(values).any():
            raise ValueError("values: a quantile's values must not be NaN; drop them first")
        if not 0.0 < q < 1.0:
            raise ValueError(f"q: a quantile in (0, 1), got {q}")
        if method not in ("averaged_inverted_cdf", "inverted_cdf"):
            raise ValueError(f"method: averaged_inverted_cdf or inverted_cdf, got {method!r}")
        order = np.argsort(values, kind="mergesort")
        self.q = float(q)
        #: inverted_cdf: the lower quantile alone, with :func:`weighted_quantile`'s rounding allowance on q · total
        self.lower_only = method == "inverted_cdf"
        self.sorted = values[order]
        self.units = np.asarray(units, dtype=np.int64)[order]
        n = self.sorted.size
        self.block = max(1, int(math.isqrt(n)))  # the blocked search's block of sorted values (:meth:`_blocked`)
        self.blocks = -(-n // self.block) if n else 0
        self._partition: tuple[bytes, np.ndarray, np.ndarray] | None = None

    def __call__(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.sorted.size == 0:
            return np.full(w.shape[0], np.nan), np.zeros(w.shape[0], dtype=bool)
        found = self._groups(w)
        if found is not None:
            lower, upper, total = self._blocked(w, *found)
        else:
            lower, upper, total = [], [], []
            rows = max(1, (1 << 22) // max(1, self.sorted.size))  # at most ~32 MB of cumulative sums at once
            for i in range(0, w.shape[0], rows):
                cum = np.cumsum(w[i:i + rows, self.units], axis=1)
                at = self.q * cum[:, -1:]
                lower.append((cum < at - self._allowance(cum[:, -1:])).sum(axis=1))
                upper.append((cum <= at).sum(axis=1))
                total.append(cum[:, -1])
            lower, upper, total = np.concatenate(lower), np.concatenate(upper), np.concatenate(total)
        if self.lower_only:
            upper = lower
        lower = np.minimum(lower, self.sorted.size - 1)
        upper = np.minimum(upper, self.sorted.size - 1)
        ok = total > 0
        lo, hi = self.sorted[lower], self.sorted[upper]
        with np.errstate(invalid="ignore"):
            value = np.where(lo == hi, lo, 0.5 * (lo + hi))
        return np.where(ok, value, np.nan), ok

    def _allowance(self, total: np.ndarray) -> np.ndarray | float:
        """What the lower quantile's comparison subtracts from q · total: :func:`weighted_quantile`'s allowance
        for its rounding (1e-12 of the total) with ``inverted_cdf``; nothing otherwise."""
        return 1e-12 * np.maximum(total, 1.0) if self.lower_only else 0.0

    def _groups(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Where a bootstrap resamples coarser units than the values' (a prompt, whose every replay cell carries the
        same weight), the groups of records whose weights agree in every row of ``w``: (each group's first
        record, each sorted value's group), when few enough groups make the blocked search cheaper than the
        cumulative sum over every value, and the weights are whole counts (so both searches add the same
        integers, exactly); else None."""
        b, n = w.shape[0], self.sorted.size
        if n < 4096 or not np.array_equal(w, np.round(w)):
            return None
        if self._partition is not None:  # the last partition holds wherever its groups' weights agree here too
            first, labels, group_of_value, counts = self._partition
            if np.array_equal(w, w[:, first][:, labels]):
                return first, group_of_value, counts
        probe = np.random.default_rng(0).random(b)  # a column's key: distinct weight columns, distinct keys
        keys, first, labels = np.unique(probe @ w, return_index=True, return_inverse=True)
        if keys.size * self.blocks + 2 * self.block >= n:
            return None
        labels = labels.reshape(-1)
        group_of_value = labels[self.units]
        cell = (np.arange(n) // self.block) * keys.size + group_of_value
        counts = np.bincount(cell, minlength=self.blocks * keys.size).reshape(self.blocks, keys.size).astype(float)
        self._partition = (first, labels, group_of_value, counts)
        return first, group_of_value, counts

    def _blocked(self, w: np.ndarray, first: np.ndarray, group_of_value: np.ndarray, counts: np.ndarray):
        """The positions the cumulative sum would give (first at ≥ q · total, first above it) and the total, found
        block by block: each block's weight from the groups' counts in it, then the cumulative weight inside the
        one block where q · total falls."""
        n, size = self.sorted.size, self.block
        gw = w[:, first]                                   # [b, groups]
        ends = np.cumsum(gw @ counts.T, axis=1)            # [b, blocks]: the cumulative weight at each block's end
        total = ends[:, -1]
        at = self.q * total
        out = []
        for strict in (True, False):
            if strict:
                at_lower = at - self._allowance(total)
            k = ((ends < at_lower[:, None]) if strict else (ends <= at[:, None])).sum(axis=1)  # its block
            k = np.minimum(k, self.blocks - 1)
            start = np.where(k > 0, np.take_along_axis(ends, np.maximum(k - 1, 0)[:, None], axis=1)[:, 0], 0.0)
            idx = k[:, None] * size + np.arange(size)[None, :]
            inside = idx < n
            g = group_of_value[np.minimum(idx, n - 1)]
            cum = start[:, None] + np.cumsum(np.where(inside, np.take_along_axis(gw, g, axis=1), 0.0), axis=1)
            below = (cum < at_lower[:, None]) if strict else (cum <= at[:, None])
            out.append(k * size + (below & inside).sum(axis=1))
        return out[0], out[1], total


class WeightedMedian(WeightedQuantile):
    """The median of ``values`` per resample (:class:`WeightedQuantile` at q = 1/2; finite values only): the
    midpoint of the lower and upper weighted medians, which at unit weights is :func:`numpy.median` (the mean of
    the two middle values of an even count)."""

    def __init__(self, values: np.ndarray, units: np.ndarray, method: str = "averaged_inverted_cdf"):
        values = np.asarray(values, dtype=np.float64)
        if not np.isfinite(values).all():
            raise ValueError("values: the median's values must be finite; drop the others first")
        super().__init__(values, units, 0.5, method)


# --- verdicts -----------------------------------------------------------------------------
def test_outcome(ci_low: float, ci_high: float, op: str, threshold: float, skipped_fraction: float = 0.0) -> str:
    """pass / fail / unclear of one test from its interval (``verdict_rules``)."""
    if op not in OPS:
        raise ValueError(f"op: must be one of {OPS}, got {op!r}")
    if not (np.isfinite(ci_low) and np.isfinite(ci_high)) or skipped_fraction > MAX_SKIPPED_FRACTION:
        return "unclear"
    t = float(threshold)
    if op == ">=":
        return "pass" if ci_low >= t else "fail" if ci_high < t else "unclear"
    if op == ">":
        return "pass" if ci_low > t else "fail" if ci_high <= t else "unclear"
    if op == "<=":
        return "pass" if ci_high <= t else "fail" if ci_low > t else "unclear"
    return "pass" if ci_high < t else "fail" if ci_low >= t else "unclear"


def claim_verdict(outcomes: Sequence[str], cells_ok: bool, placebo_holds: bool = False) -> str:
    """holds / killed / inconclusive / uninformative: too-small cells first, then any fail kills; all
    pass hold — unless a placebo (a score with no draw- or run-level information, scored by the same
    tests) holds too: then the tests cannot tell the claim from the placebo, and it is uninformative.
    An ``unexercised`` test (too few rows of the kind it needs) leaves the claim inconclusive."""
    if not cells_ok or not outcomes:
        return "inconclusive"
    if any(o == "fail" for o in outcomes):
        return "killed"
    if all(o == "pass" for o in outcomes):
        return "uninformative" if placebo_holds else "holds"
    return "inconclusive"
