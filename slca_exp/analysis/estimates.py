"""Whether two levels of a swept factor differ: paired or Welch t intervals, p-values, power.

``slca-exp compare`` reads one observation per run (a metric's final value, or its mean over the
steps for the per-step diagnostics of :data:`MEAN_OVER_STEPS`). For a factor the sweep varied
over two levels (``algorithm=grpo,slca_grpo``) it compares the levels in every *cell*: every
combination of the other swept values, the seed left out. Runs of the two levels pair up when
they share a seed (each seed at most once per level): the jobs of one seed share the SFT
checkpoint, the prompts of every step and the sampling seed of every step, so a pair's
difference leaves out what the seed alone decides. Paired cells use the paired t test over the
seeds both levels have (:func:`paired`); others Welch's t test (:func:`welch`). Both are
scipy.stats' (``ttest_rel`` and ``ttest_ind(equal_var=False)``, and their confidence intervals).

The verdict is plain: ``differs`` when the 95% interval leaves out 0 (p < 0.05), ``identical``
when every pair is equal, else ``not separated at n=N``; there, :func:`seeds_needed` says how many
seeds the measured variance would need for the measured difference to separate at 80% power.

Example:
    >>> e = paired([0.840, 0.846, 0.823], [0.845, 0.854, 0.829])
    >>> e.test, e.n, round(e.mean, 4), e.verdict
    ('paired t', 3, 0.0063, 'differs')

"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slca_exp.core import names

CONFIDENCE = 0.95
"""The intervals' confidence level; a difference is reported as ``differs`` at p < 1 - this."""
POWER = 0.8
"""The power :func:`seeds_needed` aims for."""
MAX_SEEDS = 100_000
"""Beyond this, :func:`seeds_needed` gives up (``None``)."""
MEAN_OVER_STEPS = (names.TRAIN_GRAD_COS, names.TRAIN_GRAD_NORM_TOOL, names.TRAIN_GRAD_NORM_SUMMARY)
"""Per-step diagnostics whose observation for a run is their mean over the run's steps."""


@dataclass(frozen=True)
class Estimate:
    """The difference ``b - a`` between two sets of observations.

    Attributes:
        test: ``paired t`` or ``Welch t``.
        n: pairs (paired) or the observations of both levels together (Welch).
        n_a: observations of level a.
        n_b: observations of level b.
        mean: the mean difference (paired) or the difference of the means (Welch).
        low: the lower end of its :data:`CONFIDENCE` interval (NaN when there is none).
        high: the upper end.
        p: the two-sided p-value (NaN: too few observations, or every pair equal).
        identical: every pair is equal (paired only): the difference is exactly 0.
        needed: seeds per level the measured variance would need (:func:`seeds_needed`);
            ``None`` when the difference separates already, is 0, or cannot be estimated.

    """

    test: str
    n: int
    n_a: int
    n_b: int
    mean: float
    low: float
    high: float
    p: float
    identical: bool = False
    needed: int | None = None

    @property
    def separated(self) -> bool:
        """The interval leaves out 0."""
        return not math.isnan(self.p) and self.p < 1 - CONFIDENCE

    @property
    def verdict(self) -> str:
        """``differs``, ``identical``, ``not separated at n=N`` or ``too few runs``."""
        if self.identical:
            return "identical"
        if math.isnan(self.p) and math.isnan(self.low):
            return "too few runs"
        if self.separated:
            return "differs"
        return f"not separated at n={self.n}"


def paired(a: Sequence[float], b: Sequence[float]) -> Estimate:
    """The paired t estimate of ``b - a``: ``a[i]`` and ``b[i]`` come from one seed."""
    from scipy import stats

    if len(a) != len(b):
        raise ValueError(f"{len(a)} observations of level a for {len(b)} of level b")
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    n = len(diffs)
    mean = math.fsum(diffs) / n if n else math.nan
    if n and all(d == 0 for d in diffs):
        return Estimate("paired t", n, n, n, 0.0, 0.0, 0.0, math.nan, identical=True)
    if n < 2:
        return Estimate("paired t", n, n, n, mean, math.nan, math.nan, math.nan)
    with warnings.catch_warnings():  # near-identical data: scipy warns, its numbers stand
        warnings.simplefilter("ignore", RuntimeWarning)
        result = stats.ttest_rel(b, a)
        interval = result.confidence_interval(CONFIDENCE)
    estimate = Estimate(
        "paired t", n, n, n, mean, float(interval.low), float(interval.high), float(result.pvalue)
    )
    return _with_needed(estimate, _sd(diffs), paired=True)


def welch(a: Sequence[float], b: Sequence[float]) -> Estimate:
    """Welch's t estimate of ``mean(b) - mean(a)`` (runs that do not pair up)."""
    from scipy import stats

    n_a, n_b = len(a), len(b)
    mean = (math.fsum(b) / n_b if n_b else math.nan) - (math.fsum(a) / n_a if n_a else math.nan)
    if n_a < 2 or n_b < 2:
        return Estimate("Welch t", n_a + n_b, n_a, n_b, mean, math.nan, math.nan, math.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = stats.ttest_ind(b, a, equal_var=False)
        interval = result.confidence_interval(CONFIDENCE)
    estimate = Estimate(
        "Welch t",
        n_a + n_b,
        n_a,
        n_b,
        mean,
        float(interval.low),
        float(interval.high),
        float(result.pvalue),
    )
    pooled = math.sqrt((_sd(a) ** 2 + _sd(b) ** 2) / 2)
    return _with_needed(estimate, pooled, paired=False)


def seeds_needed(difference: float, sd: float, *, paired: bool, power: float = POWER) -> int | None:
    """Seeds per level for a two-sided t test at :data:`CONFIDENCE` to reach ``power``.

    ``difference`` and ``sd`` are the effect and its spread as measured: the sd of the paired
    differences, or the two levels' pooled sd for Welch. Exact for the t test (noncentral t),
    not the normal approximation. ``None`` when the difference is 0, the sd is not positive,
    or more than :data:`MAX_SEEDS` would be needed.

    >>> seeds_needed(1.0, 1.0, paired=True)  # an effect of one sd: 10 pairs
    10
    >>> seeds_needed(1.0, 1.0, paired=False)  # two independent groups: 17 each
    17

    """
    if not (math.isfinite(difference) and math.isfinite(sd)) or difference == 0 or sd <= 0:
        return None
    effect = abs(difference) / sd

    return smallest_n(lambda n: _power(effect, n, paired=paired) >= power)


def smallest_n(reaches: Callable[[int], bool]) -> int | None:
    """The smallest n >= 2 with ``reaches(n)``; ``None`` beyond :data:`MAX_SEEDS`.

    ``reaches`` rises in n (a test's power reaching its goal): doubles until it does, bisects.

    >>> smallest_n(lambda n: n * n >= 50)
    8
    """
    low, high = 2, 2
    while not reaches(high):
        if high >= MAX_SEEDS:
            return None
        low, high = high, min(2 * high, MAX_SEEDS)
    while low < high:
        mid = (low + high) // 2
        if reaches(mid):
            high = mid
        else:
            low = mid + 1
    return high


def _power(effect: float, n: int, *, paired: bool) -> float:
    from scipy import stats

    df = n - 1 if paired else 2 * n - 2
    noncentrality = effect * math.sqrt(n if paired else n / 2)
    critical = stats.t.ppf(1 - (1 - CONFIDENCE) / 2, df)
    return float(
        stats.nct.sf(critical, df, noncentrality) + stats.nct.cdf(-critical, df, noncentrality)
    )


def _with_needed(estimate: Estimate, sd: float, *, paired: bool) -> Estimate:
    if estimate.separated:
        return estimate
    needed = seeds_needed(estimate.mean, sd, paired=paired)
    return Estimate(**{**estimate.__dict__, "needed": needed})


def _sd(values: Sequence[float]) -> float:
    n = len(values)
    if n < 2:
        return math.nan
    mean = math.fsum(values) / n
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """The mean of ``values`` and its :data:`CONFIDENCE` t interval (NaN ends below 2 values).

    >>> mean_interval([1.0, 1.0])
    (1.0, 1.0, 1.0)

    """
    from scipy import stats

    n = len(values)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = math.fsum(values) / n
    if n < 2:
        return mean, math.nan, math.nan
    sem = _sd(values) / math.sqrt(n)
    if sem == 0:
        return mean, mean, mean
    low, high = stats.t.interval(CONFIDENCE, n - 1, loc=mean, scale=sem)
    return mean, float(low), float(high)
