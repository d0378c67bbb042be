"""Statistics of the claims: AUC and Spearman against direct computation, the unit
bootstrap against explicit resampling, weighted quantiles, and the verdict rules."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats
from sklearn.metrics import roc_auc_score

from kvcert.config.analysis_plan import BootstrapPart
from kvcert.analysis.stats import (
    AUCIndex, SpearmanIndex, WeightedMedian, WeightedQuantile, auc, bootstrap, claim_verdict, encode_units,
    percentile_interval, test_outcome as outcome_of, weight_chunks, weighted_mean, weighted_quantile,
)


@pytest.fixture
def data():
    rng = np.random.default_rng(3)
    n = 120
    units = rng.integers(0, 30, n)
    y = (rng.random(n) < 0.4).astype(float)
    score = np.round(y * 0.8 + rng.normal(size=n), 1)  # rounded: ties happen
    return units, y, score


def test_auc_equals_sklearn_on_unit_and_integer_weights(data):
    _, y, score = data
    ones = np.ones((1, y.size))
    value, ok = AUCIndex(score, y)(ones)
    assert ok[0] and value[0] == pytest.approx(roc_auc_score(y, score), abs=1e-12)
    assert auc(score, y) == pytest.approx(roc_auc_score(y, score), abs=1e-12)
    w = np.random.default_rng(0).integers(0, 4, (3, y.size)).astype(float)
    got, _ = AUCIndex(score, y)(w)
    for row, g in zip(w, got):
        rep = row.astype(int)
        assert g == pytest.approx(roc_auc_score(np.repeat(y, rep), np.repeat(score, rep)), abs=1e-12)


def test_the_rank_auc_equals_sklearn_on_small_samples_with_ties():
    rng = np.random.default_rng(11)
    for _ in range(100):
        n = int(rng.integers(2, 40))
        y = rng.integers(0, 2, n).astype(float)
        if y.min() == y.max():
            continue
        score = np.round(rng.normal(size=n), int(rng.integers(0, 3)))  # 0 decimals: many ties
        assert auc(score, y) == pytest.approx(roc_auc_score(y, score), abs=1e-12)
        assert auc(score, y * 2 - 1) == pytest.approx(roc_auc_score(y, score), abs=1e-12)  # labels -1 / 1


def test_auc_one_class_is_undefined():
    value, ok = AUCIndex(np.array([0.1, 0.2]), np.array([1.0, 1.0]))(np.ones((1, 2)))
    assert not ok[0] and np.isnan(value[0])
    assert np.isnan(auc([0.1, 0.2], [1, 1]))


def test_weighted_spearman_equals_scipy_on_replicated_data(data):
    _, y, score = data
    x = score + np.random.default_rng(1).normal(size=score.size) * 0.5
    w = np.vstack([np.ones(score.size), np.random.default_rng(2).integers(0, 3, score.size)]).astype(float)
    got, ok = SpearmanIndex(x, score)(w)
    assert ok.all()
    assert got[0] == pytest.approx(scipy_stats.spearmanr(x, score).statistic, abs=1e-12)
    rep = w[1].astype(int)
    assert got[1] == pytest.approx(scipy_stats.spearmanr(np.repeat(x, rep), np.repeat(score, rep)).statistic, abs=1e-12)


def test_bootstrap_equals_explicit_unit_resampling(data):
    units, y, score = data
    codes, n_units = encode_units(units)
    plan = BootstrapPart(resamples=40, seed=11, level=0.9)
    index = AUCIndex(score, y)
    est = bootstrap(lambda w: {"auc": index(w)}, codes, n_units, plan, max_chunk=16)["auc"]
    # the same resamples, built explicitly: draw units, stack all their records
    rng = np.random.default_rng(11)
    explicit = []
    for done in range(0, 40, 16):
        picks = rng.integers(0, n_units, size=(min(16, 40 - done), n_units))
        for row in picks:
            idx = np.concatenate([np.flatnonzero(codes == u) for u in row])
            if np.unique(y[idx]).size == 2:
                explicit.append(roc_auc_score(y[idx], score[idx]))
    assert est.resamples == 40 and est.skipped == 40 - len(explicit)
    np.testing.assert_allclose(np.sort(est.samples), np.sort(explicit), atol=1e-12)
    lo, hi = percentile_interval(np.array(explicit), 0.9)
    assert (est.ci_low, est.ci_high) == pytest.approx((lo, hi))
    assert est.estimate == pytest.approx(roc_auc_score(y, score))


def test_bootstrap_weights_are_unit_multiplicities():
    codes = np.array([0, 0, 1, 2, 2, 2])
    for w in weight_chunks(codes, 3, BootstrapPart(resamples=10, seed=0)):
        assert np.all(w[:, 0] == w[:, 1]) and np.all(w[:, 3] == w[:, 5])
        per_unit = w[:, [0, 2, 3]]
        assert np.all(per_unit.sum(axis=1) == 3)  # U units drawn per resample


def test_bootstrap_is_deterministic_and_counts_skips():
    codes = np.arange(6)
    y = np.array([1, 0, 0, 0, 0, 0], dtype=float)  # one positive: often absent from a resample
    score = np.arange(6, dtype=float)
    index = AUCIndex(score, y)
    a = bootstrap(lambda w: {"auc": index(w)}, codes, 6, BootstrapPart(200, 5))["auc"]
    b = bootstrap(lambda w: {"auc": index(w)}, codes, 6, BootstrapPart(200, 5))["auc"]
    assert a.skipped == b.skipped and a.skipped > 0.2 * 200  # P(no positive) = (5/6)^6 ≈ 0.33
    np.testing.assert_array_equal(a.samples, b.samples)
    assert a.skipped_fraction > 0.10
    assert outcome_of(0.0, 0.0, ">=", 0.5, a.skipped_fraction) == "unclear"


def test_weighted_mean_and_quantile():
    x = np.array([3.0, 1.0, 2.0, 5.0])
    w = np.array([[1, 1, 1, 1], [0, 2, 1, 1], [0, 0, 0, 0]], dtype=float)
    m, ok = weighted_mean(x, w)
    assert m[:2] == pytest.approx([2.75, 9 / 4]) and list(ok) == [True, True, False]
    q = weighted_quantile(x, 0.5, w[:2])
    assert q[0] == np.quantile(x, 0.5, method="inverted_cdf")
    assert q[1] == np.quantile(np.repeat(x, [0, 2, 1, 1]), 0.5, method="inverted_cdf")
    for level in (0.1, 0.3, 0.75, 0.9):
        assert weighted_quantile(x, level, w[:1])[0] == np.quantile(x, level, method="inverted_cdf")


def test_the_weighted_median_is_the_resampled_datas_median():
    """Per resample, the median of the values replicated by their unit's multiplicity (numpy's, the mean of the
    two middle values of an even count), ties and empty units included; at unit weights numpy's own."""
    rng = np.random.default_rng(5)
    values = np.round(rng.normal(size=57), 1)  # rounded: ties
    units = rng.integers(0, 9, size=57)
    median = WeightedMedian(values, units)
    w = np.vstack([np.ones(9), rng.integers(0, 3, size=(40, 9)).astype(float)])
    got, ok = median(w)
    for row, value, valid in zip(w, got, ok):
        replicated = np.repeat(values, row[units].astype(int))
        assert valid == (replicated.size > 0)
        if valid:
            assert value == np.median(replicated)
    assert got[0] == np.median(values)


def test_the_weighted_quantile_is_the_resampled_datas_quantile():
    """Per resample, numpy's averaged-inverted-CDF quantile of the values replicated by their unit's multiplicity
    (infinite values included: a radius of 0 under a positive error); at unit weights numpy's own."""
    rng = np.random.default_rng(8)
    values = np.round(rng.exponential(size=61), 1)
    values[[3, 17]] = np.inf
    units = rng.integers(0, 7, size=61)
    w = np.vstack([np.ones(7), rng.integers(0, 3, size=(30, 7)).astype(float)])
    for q in (0.1, 0.25, 0.9):
        got, ok = WeightedQuantile(values, units, q)(w)
        for row, value, valid in zip(w, got, ok):
            replicated = np.repeat(values, row[units].astype(int))
            assert valid == (replicated.size > 0)
            if valid:
                assert value == np.quantile(replicated, q, method="averaged_inverted_cdf")
    with pytest.raises(ValueError, match="NaN"):
        WeightedQuantile(np.array([1.0, np.nan]), np.array([0, 1]), 0.5)


def test_a_median_of_near_equal_values_gets_an_interval_that_holds_it():
    """The tightness' bootstrap is exact: values that all fall within one of the former histogram's bins (0.01 of
    log10) give an interval of positive width that contains the estimate (a binned median collapsed to one bin's
    centre, outside its own estimate)."""
    rng = np.random.default_rng(11)
    units = np.repeat(np.arange(40), 25)
    values = 0.7456 + 0.004 * rng.random(units.size)
    median = WeightedMedian(values, units)
    est = bootstrap(lambda w: {"m": median(w)}, np.arange(40), 40, BootstrapPart(resamples=400, seed=2))["m"]
    assert est.ci_low < est.estimate < est.ci_high and est.estimate == np.median(values)


@pytest.mark.parametrize("lo,hi,op,thr,expected", [
    (0.7, 0.9, ">=", 0.6, "pass"), (0.6, 0.9, ">=", 0.6, "pass"), (0.4, 0.59, ">=", 0.6, "fail"),
    (0.5, 0.7, ">=", 0.6, "unclear"), (0.01, 0.2, ">", 0.0, "pass"), (-0.2, 0.0, ">", 0.0, "fail"),
    (0.0, 0.2, ">", 0.0, "unclear"), (0.1, 0.2, "<=", 0.3, "pass"), (0.4, 0.5, "<", 0.3, "fail"),
    (float("nan"), 0.2, ">=", 0.1, "unclear"),
])
def test_outcomes(lo, hi, op, thr, expected):
    assert outcome_of(lo, hi, op, thr) == expected


def test_verdict_rules():
    assert claim_verdict(["pass", "pass"], True) == "holds"
    assert claim_verdict(["pass", "fail"], True) == "killed"
    assert claim_verdict(["unclear", "fail"], True) == "killed"
    assert claim_verdict(["pass", "unclear"], True) == "inconclusive"
    assert claim_verdict(["pass", "pass"], False) == "inconclusive"
    assert claim_verdict(["fail"], False) == "inconclusive"
    with pytest.raises(ValueError, match="op"):
        outcome_of(0.1, 0.2, "=>", 0.0)


def test_the_weighted_quantile_searches_coarse_units_block_by_block_and_gives_the_same_values():
    """Where the bootstrap resamples units coarser than the values' records (prompts over replay cells), the
    quantile is found block by block; it gives exactly what the cumulative sum over every value gives (ties,
    infinities, a block boundary at the quantile, a resample with zero weight on everything)."""
    from kvcert.analysis.stats import WeightedQuantile

    rng = np.random.default_rng(7)
    n_cells, n = 600, 20_000
    cells = rng.integers(0, n_cells, n)
    values = np.round(rng.normal(size=n), 2)  # many ties
    values[:50] = np.inf
    prompt_of_cell = rng.integers(0, 12, n_cells)
    counts = rng.multinomial(12, np.full(12, 1 / 12), size=40).astype(float)  # 40 resamples of 12 prompts
    counts[0] = 0.0  # nothing drawn: no quantile
    w = counts[:, prompt_of_cell]  # each cell weighs its prompt's count
    for q in (0.1, 0.5, 0.9):
        blocked = WeightedQuantile(values, cells, q)
        plain = WeightedQuantile(values, cells, q)
        plain._groups = lambda w: None  # the cumulative sum over every value
        assert blocked._groups(w) is not None  # the blocked search is the one taken
        a, ok_a = blocked(w)
        b, ok_b = plain(w)
        assert np.array_equal(ok_a, ok_b) and not ok_a[0]
        assert np.array_equal(a[ok_a], b[ok_b])
    # at the values' own units (every cell its own weight) the plain sum is kept
    per_cell = rng.integers(0, 3, size=(5, n_cells)).astype(float)
    assert WeightedQuantile(values, cells, 0.5)._groups(per_cell) is None


def test_the_inverted_cdf_quantile_is_weighted_quantiles_in_both_searches():
    """``method="inverted_cdf"``: the lower quantile with weighted_quantile's allowance on q · total, the same value
    whether the crossing is searched over every value or block by block (C2's median of step-cell Spearmans)."""
    from kvcert.analysis.stats import WeightedQuantile, weighted_quantile

    rng = np.random.default_rng(11)
    n, prompts = 12_000, 9
    values = np.round(rng.uniform(-1, 1, n), 3)
    prompt = rng.integers(0, prompts, n)
    counts = rng.multinomial(prompts, np.full(prompts, 1 / prompts), size=30).astype(float)
    w = counts[:, prompt]  # every value its own record, weighted by its prompt's count
    for q in (0.1, 0.5, 0.7):
        blocked = WeightedQuantile(values, np.arange(n), q, method="inverted_cdf")
        assert blocked._groups(w) is not None
        got, ok = blocked(w)
        assert np.array_equal(got[ok], weighted_quantile(values, q, w)[ok])
    small = np.array([3.0, 1.0, 2.0, 5.0])
    one = WeightedQuantile(small, np.arange(4), 0.5, method="inverted_cdf")(np.ones((1, 4)))[0][0]
    assert one == np.quantile(small, 0.5, method="inverted_cdf") == 2.0
    with pytest.raises(ValueError, match="method: averaged_inverted_cdf or inverted_cdf"):
        WeightedQuantile(small, np.arange(4), 0.5, method="linear")
