"""Interval estimates over runs, and an equivalence test, per cell of a two-level factor.

What RL results are now held to (Agarwal et al., "Deep RL at the Edge of the Statistical
Precipice", NeurIPS 2021): per level, the interquartile mean (IQM: the mean of the middle 50% of
the runs, ``scipy.stats.trim_mean(x, 0.25)``) and the mean, each with a 95% bootstrap interval;
the probability of improvement ``P(b > a)`` (each run of ``b`` against each run of ``a``, ties
counting one half: the Mann-Whitney U over ``n_a * n_b``) with its interval. The bootstrap is
scipy's (``scipy.stats.bootstrap``, percentile intervals, :data:`RESAMPLES` resamples from a fixed
seed, so a report reads the same every time), stratified by level: each level's runs are
resampled on their own. Runs of one seed stay paired: where the levels pair up by seed the pairs
are resampled together, and the differences are those of each seed. (rliable, the paper's
library, was the first choice; its last release, 1.2.0, needs ``arch``, and no ``arch`` release
works beside this project's pandas 3: 7.2 fails on import, 8.0 refuses rliable's arguments.)

An equivalence verdict needs a margin ``M`` the user states (``compare --margin``, or the study's
``margin``): two one-sided t tests (TOST) of ``b - a`` against ``-M`` and ``+M``, each at 5%; the
difference is equivalent within ``±M`` when both reject, that is when the 90% t interval lies
inside ``(-M, M)``. :func:`seeds_to_show_equivalence` sizes a study for it from the measured
difference and spread, as :func:`~slca_exp.analysis.estimates.seeds_needed` does for separation.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from slca_exp.analysis.estimates import CONFIDENCE, POWER, smallest_n

RESAMPLES = 10_000
"""Bootstrap resamples per interval."""
SEED = 0
"""The bootstrap's random seed: the same data give the same intervals."""
TOST_ALPHA = 0.05
"""Each one-sided test's level (the 90% interval inside the margin)."""


@dataclass(frozen=True)
class Interval:
    """A point estimate and its :data:`CONFIDENCE` bootstrap interval (NaN ends: too few)."""

    point: float
    low: float
    high: float

    def text(self) -> str:
        """``0.4629 [0.41, 0.51]``."""
        if math.isnan(self.low):
            return f"{self.point:.4g}"
        return f"{self.point:.4g} [{self.low:.4g}, {self.high:.4g}]"


def iqm(values: Sequence[float]) -> float:
    """The interquartile mean: the mean of the middle half (a quarter cut from each end).

    >>> iqm([0.0, 1.0, 2.0, 3.0, 100.0])  # 5 runs: the lowest and the highest are cut
    2.0
    """
    from scipy import stats

    return float(stats.trim_mean(np.asarray(values, dtype=float), 0.25))


def probability_of_improvement(a: Sequence[float], b: Sequence[float]) -> float:
    """``P(b > a)`` over every pair of a run of ``b`` and a run of ``a``; ties count 1/2.

    >>> probability_of_improvement([1.0, 2.0], [1.5, 2.0])
    0.625
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    wins = (y[:, None] > x[None, :]).sum() + 0.5 * (y[:, None] == x[None, :]).sum()
    return float(wins / (len(x) * len(y)))


def bootstrap(
    statistic: Callable[..., np.ndarray], samples: Sequence[Sequence[float]], *, paired: bool
) -> Interval:
    """``statistic(*samples)`` and its percentile bootstrap interval.

    ``statistic`` takes the samples as arrays whose last axis holds the runs (and reduces it).
    ``paired``: the samples are resampled together, index by index (runs of one seed); else each
    on its own (stratified by sample).
    """
    from scipy import stats

    data = [np.asarray(s, dtype=float) for s in samples]
    point = float(statistic(*data))
    if any(len(s) < 2 for s in data):
        return Interval(point, math.nan, math.nan)
    with warnings.catch_warnings():  # a degenerate resample distribution: its ends stand
        warnings.simplefilter("ignore")
        result = stats.bootstrap(
            data,
            lambda *xs, axis=-1: statistic(*(np.moveaxis(x, axis, -1) for x in xs)),
            paired=paired,
            vectorized=True,
            n_resamples=RESAMPLES,
            confidence_level=CONFIDENCE,
            method="percentile",
            rng=np.random.default_rng(SEED),
        )
    interval = result.confidence_interval
    low, high = float(interval.low), float(interval.high)
    if math.isnan(low) and all(np.all(s == s[0]) for s in data):
        low = high = point  # every resample the same
    return Interval(point, low, high)


def _mean(x: np.ndarray) -> np.ndarray:
    return np.mean(x, axis=-1)


def _iqm(x: np.ndarray) -> np.ndarray:
    from scipy import stats

    return stats.trim_mean(x, 0.25, axis=-1)


def _poi(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    wins = (b[..., :, None] > a[..., None, :]).sum(axis=(-1, -2))
    ties = (b[..., :, None] == a[..., None, :]).sum(axis=(-1, -2))
    return (wins + 0.5 * ties) / (a.shape[-1] * b.shape[-1])


@dataclass(frozen=True)
class LevelIntervals:
    """A cell's interval estimates for ``b - a`` (see the module)."""

    paired: bool
    iqm_a: Interval
    iqm_b: Interval
    mean_a: Interval
    mean_b: Interval
    iqm_diff: Interval
    """Paired: the IQM of the per-seed differences; else IQM(b) - IQM(a)."""
    mean_diff: Interval
    poi: Interval
    """``P(b > a)``."""


def level_intervals(a: Sequence[float], b: Sequence[float], *, paired: bool) -> LevelIntervals:
    """The interval estimates of one cell; ``paired``: ``a[i]`` and ``b[i]`` share a seed."""
    if paired and len(a) != len(b):
        raise ValueError(f"{len(a)} observations of level a for {len(b)} of level b")
    per_level = [bootstrap(f, [x], paired=False) for f in (_iqm, _mean) for x in (a, b)]
    if paired:
        diffs = [y - x for x, y in zip(a, b, strict=True)]
        iqm_diff = bootstrap(_iqm, [diffs], paired=False)
        mean_diff = bootstrap(_mean, [diffs], paired=False)
    else:
        iqm_diff = bootstrap(lambda x, y: _iqm(y) - _iqm(x), [a, b], paired=False)
        mean_diff = bootstrap(lambda x, y: _mean(y) - _mean(x), [a, b], paired=False)
    poi = bootstrap(_poi, [a, b], paired=paired)
    return LevelIntervals(paired, *per_level, iqm_diff, mean_diff, poi)


@dataclass(frozen=True)
class Tost:
    """Two one-sided t tests of ``b - a`` against ``-margin`` and ``+margin``."""

    margin: float
    p: float
    """The larger of the two one-sided p-values (NaN: too few runs)."""
    low: float
    high: float
    """The 90% t interval of the difference (inside ``(-margin, margin)`` iff equivalent)."""
    needed: int | None = None
    """Seeds per level to show equivalence at 80% power, when not shown yet (None: cannot)."""

    @property
    def equivalent(self) -> bool:
        """Both one-sided tests reject at :data:`TOST_ALPHA`."""
        return not math.isnan(self.p) and self.p < TOST_ALPHA


def tost(a: Sequence[float], b: Sequence[float], margin: float, *, paired: bool) -> Tost:
    """TOST of ``b - a`` within ``±margin``: paired t over seeds, else Welch's t.

    >>> t = tost([0.50, 0.52, 0.49, 0.51], [0.51, 0.52, 0.50, 0.51], 0.05, paired=True)
    >>> t.equivalent, round(t.p, 6), (round(t.low, 4), round(t.high, 4))
    (True, 0.000287, (-0.0018, 0.0118))
    """
    from scipy import stats

    if margin <= 0:
        raise ValueError(f"the equivalence margin must be positive, not {margin}")
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if paired:
        d = y - x
        n = len(d)
        if n < 2:
            return Tost(margin, math.nan, math.nan, math.nan)
        mean, sd = float(np.mean(d)), float(np.std(d, ddof=1))
        se, df = sd / math.sqrt(n), n - 1
    else:
        if len(x) < 2 or len(y) < 2:
            return Tost(margin, math.nan, math.nan, math.nan)
        mean = float(np.mean(y) - np.mean(x))
        va, vb = float(np.var(x, ddof=1)) / len(x), float(np.var(y, ddof=1)) / len(y)
        se = math.sqrt(va + vb)
        df = (va + vb) ** 2 / (va**2 / (len(x) - 1) + vb**2 / (len(y) - 1)) if se else 1.0
        sd = math.sqrt((float(np.var(x, ddof=1)) + float(np.var(y, ddof=1))) / 2)
    if se == 0:  # every difference the same
        inside = abs(mean) < margin
        return Tost(margin, 0.0 if inside else 1.0, mean, mean)
    p_low = float(stats.t.sf((mean + margin) / se, df))  # H0: difference <= -margin
    p_high = float(stats.t.cdf((mean - margin) / se, df))  # H0: difference >= +margin
    half = float(stats.t.ppf(1 - TOST_ALPHA, df)) * se
    found = Tost(margin, max(p_low, p_high), mean - half, mean + half)
    if found.equivalent:
        return found
    needed = seeds_to_show_equivalence(mean, sd, margin, paired=paired)
    return Tost(found.margin, found.p, found.low, found.high, needed)


def seeds_to_show_equivalence(
    difference: float, sd: float, margin: float, *, paired: bool, power: float = POWER
) -> int | None:
    """Seeds per level for TOST within ``±margin`` to reach ``power`` (noncentral t).

    The power of both one-sided tests rejecting, ``P(T1 > t) + P(T2 < -t) - 1`` (a lower
    bound, tight once the power is useful). ``None`` when the difference is not inside the
    margin (no number of seeds shows it inside), the spread is not positive, or more than
    :data:`~slca_exp.analysis.estimates.MAX_SEEDS` would be needed.

    >>> seeds_to_show_equivalence(0.0, 1.0, 1.0, paired=True)  # true difference 0, margin 1 sd
    11
    """
    from scipy import stats

    if not (math.isfinite(difference) and math.isfinite(sd)) or sd <= 0:
        return None
    if abs(difference) >= margin:
        return None

    def reaches(n: int) -> bool:
        df = n - 1 if paired else 2 * n - 2
        se = sd * math.sqrt(1 / n if paired else 2 / n)
        t = stats.t.ppf(1 - TOST_ALPHA, df)
        upper = stats.nct.sf(t, df, (difference + margin) / se)
        lower = stats.nct.cdf(-t, df, (difference - margin) / se)
        return float(upper + lower - 1) >= power

    return smallest_n(reaches)
