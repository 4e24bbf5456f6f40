"""The statistics of ``slca-exp compare`` against scipy.stats, on random and on known data."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from slca_exp.analysis.differences import compare_sides
from slca_exp.analysis.estimates import mean_interval, paired, seeds_needed, welch

pytestmark = pytest.mark.filterwarnings("ignore:Precision loss occurred:RuntimeWarning")
values = st.floats(-10, 10, allow_nan=False, allow_subnormal=False)


def scipy_paired(a, b):
    result = stats.ttest_rel(b, a)
    return result, result.confidence_interval(0.95)


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 12).flatmap(lambda n: st.tuples(*[st.tuples(values, values)] * n)))
def test_paired_shows_what_scipy_computes(pairs):
    a, b = [x for x, _ in pairs], [y for _, y in pairs]
    diffs = [y - x for x, y in pairs]
    est = paired(a, b)
    assert est.test == "paired t" and est.n == len(pairs)
    # the mean is summed exactly (math.fsum); numpy's pairwise sum may differ in the last bits
    assert est.mean == pytest.approx(float(np.mean(diffs)), rel=1e-12, abs=1e-12)
    if all(d == 0 for d in diffs):
        assert est.identical and (est.low, est.high) == (0.0, 0.0) and est.verdict == "identical"
        return
    result, interval = scipy_paired(a, b)
    assert (est.low, est.high) == (float(interval.low), float(interval.high))
    assert est.p == float(result.pvalue) or (math.isnan(est.p) and math.isnan(result.pvalue))
    assert est.verdict == ("differs" if est.p < 0.05 else f"not separated at n={len(pairs)}")


@settings(max_examples=150, deadline=None)
@given(st.lists(values, min_size=2, max_size=10), st.lists(values, min_size=2, max_size=10))
def test_welch_shows_what_scipy_computes(a, b):
    est = welch(a, b)
    result = stats.ttest_ind(b, a, equal_var=False)
    interval = result.confidence_interval(0.95)
    assert (est.test, est.n_a, est.n_b) == ("Welch t", len(a), len(b))
    assert est.mean == pytest.approx(float(np.mean(b) - np.mean(a)), rel=1e-12, abs=1e-12)
    same = lambda x, y: x == y or (math.isnan(x) and math.isnan(y))  # noqa: E731
    assert same(est.low, float(interval.low)) and same(est.high, float(interval.high))
    assert same(est.p, float(result.pvalue))


def test_two_pairs_give_the_textbook_interval():
    # differences 1 and 2: mean 1.5, sd 0.7071, se 0.5, t = 3 on 1 df, t_0.975(1) = 12.706
    est = paired([1.0, 2.0], [2.0, 4.0])
    assert est.mean == 1.5 and est.n == 2
    assert est.low == pytest.approx(1.5 - 12.7062047 * 0.5, rel=1e-7)  # t quantile to 8 digits
    assert est.high == pytest.approx(1.5 + 12.7062047 * 0.5, rel=1e-7)
    assert est.p == pytest.approx(0.2048327646991335, rel=1e-12)
    assert est.verdict == "not separated at n=2"


def test_tied_differences_have_a_zero_width_interval():
    est = paired([0.1, 0.2, 0.3], [0.35, 0.45, 0.55])  # every difference 0.25 (to rounding)
    result, interval = scipy_paired([0.1, 0.2, 0.3], [0.35, 0.45, 0.55])
    assert (est.low, est.high, est.p) == (interval.low, interval.high, result.pvalue)
    exact = paired([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])  # exactly 0.5 each: no spread at all
    assert (exact.low, exact.high, exact.p, exact.verdict) == (0.5, 0.5, 0.0, "differs")
    ties = welch([1.0, 1.0, 2.0], [2.0, 2.0, 2.0])
    result = stats.ttest_ind([2.0, 2.0, 2.0], [1.0, 1.0, 2.0], equal_var=False)
    assert (ties.p, ties.low) == (result.pvalue, result.confidence_interval(0.95).low)


def test_equal_runs_are_identical_and_one_pair_has_no_interval():
    est = paired([0.8, 0.7, 0.9], [0.8, 0.7, 0.9])
    assert (est.mean, est.low, est.high, est.identical) == (0.0, 0.0, 0.0, True)
    one = paired([0.8], [0.9])
    assert math.isnan(one.low) and one.verdict == "too few runs"
    assert welch([0.1], [0.2, 0.3]).verdict == "too few runs"


def test_seeds_needed_matches_the_published_power_tables():
    # Cohen's tables (alpha 0.05 two-sided, power 0.8): paired d=0.5 -> 34, d=1 -> 10;
    # two independent groups d=0.5 -> 64 per group, d=0.8 -> 26
    assert seeds_needed(0.5, 1.0, paired=True) == 34
    assert seeds_needed(1.0, 1.0, paired=True) == 10
    assert seeds_needed(0.5, 1.0, paired=False) == 64
    assert seeds_needed(0.8, 1.0, paired=False) == 26
    assert seeds_needed(0.0, 1.0, paired=True) is None
    assert seeds_needed(1.0, 0.0, paired=True) is None
    assert seeds_needed(1e-9, 1.0, paired=True) is None  # beyond MAX_SEEDS


def test_a_difference_that_does_not_separate_says_how_many_seeds_it_needs():
    est = paired([0.80, 0.82, 0.81], [0.81, 0.81, 0.83])
    assert not est.separated
    diffs = [0.01, -0.01, 0.02]
    sd = float(np.std(diffs, ddof=1))
    assert est.needed == seeds_needed(float(np.mean(diffs)), sd, paired=True)
    assert est.needed > 3


def test_mean_interval_is_scipys_t_interval():
    data = [0.81, 0.84, 0.79, 0.83]
    mean, low, high = mean_interval(data)
    ref = stats.t.interval(0.95, 3, loc=np.mean(data), scale=stats.sem(data))
    assert (low, high) == pytest.approx(ref, rel=1e-12)  # same formula; sem summed differently
    assert mean_interval([0.5])[0] == 0.5 and math.isnan(mean_interval([0.5])[1])


def test_runs_pair_up_on_shared_seeds_and_otherwise_fall_back_to_welch():
    a = [("0", 0.1), ("1", 0.2), ("2", 0.4)]
    b = [("2", 0.5), ("0", 0.3), ("1", 0.3), ("3", 0.9)]
    est, unpaired = compare_sides(a, b)
    assert est.test == "paired t" and est.n == 3 and unpaired == 1  # seed 3 has no partner
    assert est.mean == pytest.approx((0.2 + 0.1 + 0.1) / 3)
    twice = [("0", 0.1), ("0", 0.2), ("1", 0.4)]  # a seed twice on one side: no pairing
    est, unpaired = compare_sides(twice, b)
    assert est.test == "Welch t" and (est.n_a, est.n_b, unpaired) == (3, 4, 0)
