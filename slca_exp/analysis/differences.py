"""The statistics of ``slca-exp compare``: two-level differences per cell, and dose-response.

- :func:`effects`: for every swept factor with two levels (``algorithm=grpo,slca_grpo``), in every
  cell of the other swept factors (the seed left out), the difference of each metric between the
  two levels (:mod:`~slca_exp.analysis.estimates`: paired t over the seeds both levels have,
  else Welch).
- :func:`dose_response`: for every numeric swept factor (``judge.noise.p=0,0.5,1``), the mean
  observation at each level with its 95% interval, one line per combination of the other swept
  factors; :func:`slca_exp.analysis.plots.plot_dose_response` draws it.

One observation per run (:class:`~slca_exp.analysis.runs.Observations`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slca_exp.analysis.estimates import Estimate, mean_interval, paired, welch
from slca_exp.analysis.intervals import Tost, level_intervals, tost
from slca_exp.analysis.runs import SEED_KEYS, Observations


@dataclass(frozen=True)
class Effect:
    """The difference of one metric between two levels of a factor, in one cell."""

    factor: str
    levels: tuple[str, str]
    """``(a, b)``: the estimate is ``b - a``."""
    cell: tuple[tuple[str, str], ...]
    """The other swept keys' values that define the cell."""
    metric: str
    estimate: Estimate
    unpaired: int = 0
    """Runs left out of a paired comparison for having no partner of the other level."""
    sides: tuple[tuple[tuple[str, float], ...], tuple[tuple[str, float], ...]] = ((), ())
    """Each level's (seed, observation) pairs the estimate was made from."""

    def observations(self) -> tuple[list[float], list[float], bool]:
        """``(a, b, paired)`` as the estimate used them: per shared seed when paired."""
        a, b = self.sides
        if not self.estimate.test.startswith("paired"):
            return [x for _, x in a], [x for _, x in b], False
        da, db = dict(a), dict(b)
        shared = self.paired_seeds()
        return [da[s] for s in shared], [db[s] for s in shared], True

    def paired_seeds(self) -> list[str]:
        """The seeds both levels ran, in order."""
        a, b = self.sides
        return sorted({s for s, _ in a} & {s for s, _ in b}, key=_sort_key)

    @property
    def cell_label(self) -> str:
        """``judge.noise.p=0.5`` (``-`` when there is no other factor)."""
        return " ".join(f"{k}={v}" for k, v in self.cell) or "-"

    @property
    def label(self) -> str:
        """``slca_grpo - grpo``."""
        return f"{self.levels[1]} - {self.levels[0]}"


def levels(runs: Sequence[Any], key: str, value_of: Any) -> list[str]:  # noqa: ANN401
    """The values ``key`` takes over ``runs``, numerically sorted when every one is a number."""
    return sorted({value_of(run, key) for run in runs}, key=_sort_key)


def cells_of(
    runs: Sequence[Any],
    keys: Sequence[str],
    value_of: Any,  # noqa: ANN401 - (run, key) -> str
) -> list[tuple[tuple[tuple[str, str], ...], list[Any]]]:
    """The runs grouped by their values of ``keys``: (cell, runs), cells in sorted order."""
    cells: dict[tuple[tuple[str, str], ...], list[Any]] = {}
    for run in runs:
        cells.setdefault(tuple((k, value_of(run, k)) for k in keys), []).append(run)
    return sorted(cells.items(), key=lambda item: tuple(_sort_key(v) for _, v in item[0]))


def effects(
    runs: Sequence[Any],
    swept: Sequence[str],
    metrics: Sequence[str],
    observe: Observations,
    value_of: Any,  # noqa: ANN401 - (run, key) -> str
    seed_of: Any,  # noqa: ANN401 - run -> str
) -> list[Effect]:
    """Every two-level factor's difference, per cell and metric (see the module)."""
    keys = [k for k in swept if k not in SEED_KEYS]
    found = []
    for factor in keys:
        values = levels(runs, factor, value_of)
        if len(values) != 2:
            continue
        others = [k for k in keys if k != factor]
        for cell, members in cells_of(runs, others, value_of):
            for metric in metrics:
                sides = [
                    [(seed_of(r), observe(r, metric)) for r in members if value_of(r, factor) == v]
                    for v in values
                ]
                sides = [[(s, x) for s, x in side if x is not None] for side in sides]
                if not sides[0] and not sides[1]:
                    continue
                estimate, unpaired = compare_sides(sides[0], sides[1])
                observed = (tuple(sides[0]), tuple(sides[1]))
                found.append(
                    Effect(
                        factor, (values[0], values[1]), cell, metric, estimate, unpaired, observed
                    )
                )
    return found


def interactions(
    runs: Sequence[Any],
    swept: Sequence[str],
    metrics: Sequence[str],
    observe: Observations,
    value_of: Any,  # noqa: ANN401 - (run, key) -> str
    seed_of: Any,  # noqa: ANN401 - run -> str
) -> list[Effect]:
    """Whether a two-level factor's difference changes along a numeric factor.

    For a two-level factor (``algorithm``) and a numeric factor (``judge.noise.p``), per seed:
    the difference ``b - a`` at the numeric factor's highest level minus the one at its lowest,
    compared by the paired t test over the seeds that ran all four; per cell of any further
    swept factors. (Is ``slca_grpo - grpo`` larger at ``p=1`` than at ``p=0``?)
    """
    keys = [k for k in swept if k not in SEED_KEYS]
    found = []
    for factor in keys:
        values = levels(runs, factor, value_of)
        if len(values) != 2:
            continue
        for along in keys:
            steps = levels(runs, along, value_of)
            if along == factor or len(steps) < 2 or any(_number(v) is None for v in steps):
                continue
            low, high = steps[0], steps[-1]
            others = [k for k in keys if k not in (factor, along)]
            for cell, members in cells_of(runs, others, value_of):
                for metric in metrics:
                    seen: dict[tuple[str, str, str], list[float]] = {}
                    for r in members:
                        x = observe(r, metric)
                        if x is not None:
                            key = (seed_of(r), value_of(r, factor), value_of(r, along))
                            seen.setdefault(key, []).append(x)
                    at_low, at_high = [], []
                    for seed in sorted({k[0] for k in seen}, key=_sort_key):
                        got = [seen.get((seed, v, s), []) for s in (low, high) for v in values]
                        if all(len(g) == 1 for g in got):
                            (a_low,), (b_low,), (a_high,), (b_high,) = got
                            at_low.append(b_low - a_low)
                            at_high.append(b_high - a_high)
                    if not at_low:
                        continue
                    diff = f"({values[1]} - {values[0]})"
                    seeds = [str(i) for i in range(len(at_low))]
                    found.append(
                        Effect(
                            factor,
                            (f"{diff} at {along}={low}", f"{diff} at {along}={high}"),
                            cell,
                            metric,
                            paired(at_low, at_high),
                            sides=(
                                tuple(zip(seeds, at_low, strict=True)),
                                tuple(zip(seeds, at_high, strict=True)),
                            ),
                        )
                    )
    return found


def compare_sides(
    a: Sequence[tuple[str, float]], b: Sequence[tuple[str, float]]
) -> tuple[Estimate, int]:
    """``b - a`` from (seed, observation) pairs: paired over shared seeds when they pair up.

    The runs pair up when no seed occurs twice on one side and at least two seeds occur on
    both; the seeds of one side only are then left out (their count is returned). Otherwise
    Welch's test compares every observation.
    """
    seeds_a, seeds_b = [s for s, _ in a], [s for s, _ in b]
    unique = len(set(seeds_a)) == len(seeds_a) and len(set(seeds_b)) == len(seeds_b)
    shared = sorted(set(seeds_a) & set(seeds_b), key=_sort_key)
    if unique and (len(shared) >= 2 or (shared and len(a) == len(b) == 1)):
        da, db = dict(a), dict(b)
        unpaired = len(a) + len(b) - 2 * len(shared)
        return paired([da[s] for s in shared], [db[s] for s in shared]), unpaired
    return welch([x for _, x in a], [x for _, x in b]), 0


@dataclass(frozen=True)
class DosePoint:
    """The observations of one line at one level of a numeric factor."""

    x: float
    mean: float
    low: float
    high: float
    n: int


def dose_response(
    runs: Sequence[Any],
    swept: Sequence[str],
    metric: str,
    observe: Observations,
    value_of: Any,  # noqa: ANN401
) -> dict[str, dict[str, list[DosePoint]]]:
    """Numeric factor -> line label (the other factors' values) -> points, for ``metric``.

    A factor is numeric when it has at least two levels and every one reads as a number.
    """
    keys = [k for k in swept if k not in SEED_KEYS]
    out: dict[str, dict[str, list[DosePoint]]] = {}
    for factor in keys:
        values = levels(runs, factor, value_of)
        if len(values) < 2 or any(_number(v) is None for v in values):
            continue
        others = [k for k in keys if k != factor]
        lines: dict[str, list[DosePoint]] = {}
        for cell, members in cells_of(runs, others, value_of):
            points = lines.setdefault(" ".join(f"{k}={v}" for k, v in cell) or "all runs", [])
            for value in values:
                seen = [observe(r, metric) for r in members if value_of(r, factor) == value]
                present = [x for x in seen if x is not None]
                if present:
                    mean, low, high = mean_interval(present)
                    points.append(DosePoint(float(value), mean, low, high, len(present)))
        out[factor] = lines
    return out


def effects_rows(
    found: Sequence[Effect], margin: float | None = None
) -> tuple[list[str], list[list[str]]]:
    """The differences as a table: header and rows of text cells.

    With an equivalence ``margin`` the verdict also weighs the TOST within ``±margin``
    (:func:`slca_exp.analysis.intervals.verdict`).
    """
    header = ["factor", "difference", "cell", "metric", "n", "test", "mean diff", "95% CI", "p"]
    header.append("verdict")
    rows = []
    for e in found:
        est = e.estimate
        interval = "-" if math.isnan(est.low) else f"[{est.low:+.4g}, {est.high:+.4g}]"
        n = f"{est.n}" if est.test.startswith("paired") else f"{est.n_a}+{est.n_b}"
        if e.unpaired:
            n += f" ({e.unpaired} unpaired)"
        said = verdict(e, margin)
        rows.append(
            [
                e.factor,
                e.label,
                e.cell_label,
                e.metric,
                n,
                est.test,
                f"{est.mean:+.4g}",
                interval,
                "-" if math.isnan(est.p) else f"{est.p:.3g}",
                said,
            ]
        )
    return header, rows


def effect_tost(effect: Effect, margin: float) -> Tost:
    """The TOST of one cell's difference within ``±margin``."""
    a, b, paired = effect.observations()
    return tost(a, b, margin, paired=paired)


def verdict(effect: Effect, margin: float | None = None) -> str:
    """``differs``, ``equivalent within ±M``, ``not separated at n=N (...)`` or ``too few runs``.

    ``differs`` when the 95% interval leaves out 0 (said ``, and within ±M`` too where the TOST
    shows that); ``equivalent within ±M`` when only the TOST rejects; otherwise how many seeds the
    measured spread would need to separate the measured difference and, with a margin, to show
    it inside the margin (80% power each).
    """
    est = effect.estimate
    found = est.verdict
    if margin is None or found in ("identical", "too few runs"):
        return found + (f" (~{est.needed} seeds to separate)" if est.needed is not None else "")
    weighed = effect_tost(effect, margin)
    if est.separated:
        return found + (f", and within ±{margin:g}" if weighed.equivalent else "")
    if weighed.equivalent:
        return f"equivalent within ±{margin:g}"
    needs = [f"~{est.needed} seeds to separate" if est.needed else "not separable as measured"]
    needs.append(
        f"~{weighed.needed} to show equivalence"
        if weighed.needed
        else f"equivalence within ±{margin:g} not reachable as measured"
    )
    return f"{found} ({', '.join(needs)})"


def interval_rows(
    found: Sequence[Effect], margin: float | None = None
) -> tuple[list[str], list[list[str]]]:
    """Each cell's IQM and mean per level, their differences and P(b > a), with intervals."""
    header = ["factor", "difference", "cell", "metric", "n", "IQM a", "IQM b", "IQM diff"]
    header += ["mean a", "mean b", "mean diff", "P(b > a)"]
    if margin is not None:
        header += [f"TOST ±{margin:g} p", "90% CI"]
    rows = []
    for e in found:
        a, b, paired = e.observations()
        if not a or not b:
            continue
        got = level_intervals(a, b, paired=paired)
        n = f"{len(a)} pairs" if paired else f"{len(a)}+{len(b)}"
        row = [e.factor, e.label, e.cell_label, e.metric, n]
        row += [i.text() for i in (got.iqm_a, got.iqm_b, got.iqm_diff)]
        row += [i.text() for i in (got.mean_a, got.mean_b, got.mean_diff, got.poi)]
        if margin is not None:
            t = tost(a, b, margin, paired=paired)
            ci = "-" if math.isnan(t.low) else f"[{t.low:+.4g}, {t.high:+.4g}]"
            row += ["-" if math.isnan(t.p) else f"{t.p:.3g}", ci]
        rows.append(row)
    return header, rows


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _sort_key(text: str) -> tuple[int, float, str]:
    number = _number(text)
    return (0, number, "") if number is not None else (1, 0.0, str(text))
