"""Plots of a run (logged as artifacts at finish) and of several runs (``slca-exp compare``).

- :func:`plot_curves`: one panel per metric, one line per run, metric value against step;
- :func:`plot_groups`: the same panels for groups of runs (``slca-exp compare``: runs that differ
  only in their seed): one mean curve per group with a band of one std over its runs, an
  optional TensorBoard-style smoothing (:func:`ema`), validation metrics as markers;
- :func:`plot_advantage_histograms`: per-segment distributions of the per-rollout advantages;
- :class:`History` keeps what a tracker saw so that :func:`render_run_plots` can draw it.

Only matplotlib's non-interactive Agg backend is used: no display is needed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from slca_exp.core import names

if TYPE_CHECKING:
    from slca_exp.estimators import SegmentAdvantages

Curve = Sequence[tuple[int, float]]
"""(step, value) points of one metric of one run."""

REWARD_CURVES: tuple[str, ...] = (
    names.REWARD_TOTAL_MEAN,
    names.REWARD_TOOL_MEAN,
    names.REWARD_SUMMARY_MEAN,
    names.REWARD_NO_CALL_FRAC,
)
"""The reward metrics drawn at the end of every run."""

ADVANTAGE_CURVES: tuple[str, ...] = tuple(
    name for seg in names.SEGMENTS for name in (names.adv(seg, "abs_mean"), names.present_frac(seg))
)
"""Per-segment advantage magnitude and presence, drawn beside the rewards."""

_MAX_SAMPLES_PER_SEGMENT = 200_000
"""Histograms keep at most this many advantages per segment (the most recent ones)."""


def advantage_samples(result: SegmentAdvantages) -> dict[str, np.ndarray]:
    """Per-rollout advantages of the rollouts where each segment is present.

    Args:
        result: an estimator's output for one batch.

    Returns:
        ``{"tool": (n_tool,), "summary": (n_summary,)}`` float arrays.

    """
    tool_present = result.tool_mask.any(dim=1)
    summary_present = result.summary_mask.any(dim=1)
    return {
        "tool": result.tool_adv[tool_present].detach().cpu().numpy(),
        "summary": result.summary_adv[summary_present].detach().cpu().numpy(),
    }


class History:
    """Every metric a run logged, and a bounded sample of its segment advantages."""

    def __init__(self) -> None:
        self.metrics: dict[str, list[tuple[int, float]]] = {}
        self.advantages: dict[str, list[np.ndarray]] = {seg: [] for seg in names.SEGMENTS}
        self._kept = dict.fromkeys(names.SEGMENTS, 0)

    def add_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Record one step's metrics."""
        for name, value in metrics.items():
            self.metrics.setdefault(name, []).append((step, float(value)))

    def add_advantages(self, samples: Mapping[str, Sequence[float]], step: int) -> None:
        """Record one step's per-rollout advantages per segment (oldest dropped past a bound)."""
        for seg, values in samples.items():
            arr = np.asarray(values, dtype=np.float64).ravel()
            self.advantages.setdefault(seg, []).append(arr)
            self._kept[seg] = self._kept.get(seg, 0) + arr.size
            while self._kept[seg] > _MAX_SAMPLES_PER_SEGMENT and len(self.advantages[seg]) > 1:
                self._kept[seg] -= self.advantages[seg].pop(0).size


def plot_curves(
    runs: Mapping[str, Mapping[str, Curve]],
    metrics: Sequence[str],
    path: str | Path,
    *,
    title: str | None = None,
) -> Path | None:
    """One panel per metric (those some run has), one line per run; saved as PNG.

    Args:
        runs: run label -> metric name -> (step, value) points.
        metrics: the metrics to draw, in panel order.
        path: the PNG to write.
        title: figure title.

    Returns:
        ``path``, or None when no run has any of ``metrics``.

    """
    return plot_groups({label: [run] for label, run in runs.items()}, metrics, path, title=title)


def plot_groups(
    groups: Mapping[str, Sequence[Mapping[str, Curve]]],
    metrics: Sequence[str],
    path: str | Path,
    *,
    title: str | None = None,
    smooth: float = 0.0,
) -> Path | None:
    """One panel per metric, one mean curve per group of runs with a band; saved as PNG.

    Each run's curve is smoothed first (:func:`ema`), then the group's runs are averaged step by
    step (:func:`mean_band`); the band is one std over the runs that logged the step. The
    validation value of a panel's metric (``val/<metric>``), when logged, is drawn as markers
    at its steps in the group's colour. Steps are integer ticks; values are written in full
    (no offset such as ``+1e3`` above the axis).

    Args:
        groups: group label -> its runs, each metric name -> (step, value) points.
        metrics: the metrics to draw, in panel order (``val/...`` metrics become markers).
        path: the PNG to write.
        title: figure title.
        smooth: EMA weight in [0, 1); 0 draws the logged values.

    Returns:
        ``path``, or None when no run has any of ``metrics``.

    """
    shown = [m for m in metrics if any(run.get(m) for runs in groups.values() for run in runs)]
    prefix = names.VAL_PREFIX  # a val/<m> whose <m> has its own panel is drawn there, as markers
    shown = [m for m in shown if not m.startswith(prefix) or m[len(prefix) :] not in shown]
    if not shown:
        return None
    plt = _pyplot()
    cols = min(3, len(shown))
    rows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, metric in zip(axes.flat, shown, strict=False):
        draw_panel(ax, metric, groups, smooth=smooth)
    for ax in list(axes.flat)[len(shown) :]:
        ax.set_visible(False)
    handles = axes.flat[0].get_legend_handles_labels()[0]
    if len(groups) > 1 or len(handles) > 1:
        axes.flat[0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def draw_panel(
    ax,  # noqa: ANN001 - a matplotlib Axes
    metric: str,
    groups: Mapping[str, Sequence[Mapping[str, Curve]]],
    *,
    smooth: float = 0.0,
) -> None:
    """One panel of :func:`plot_groups`: ``metric`` of every group, on ``ax``.

    Per group: one line (the mean over its runs), a band of one std when it has several runs,
    and ``val/<metric>`` as markers; integer step ticks, no offset notation on either axis.
    """
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    for index, (label, runs) in enumerate(groups.items()):
        colour = f"C{index % 10}"
        steps, mean, std = mean_band([ema(run.get(metric, ()), smooth) for run in runs])
        if steps.size:
            ax.plot(steps, mean, label=label, linewidth=1.2, color=colour)
            if len(runs) > 1:
                ax.fill_between(steps, mean - std, mean + std, color=colour, alpha=0.2)
        val_steps, val_mean, _ = mean_band([run.get(names.val(metric), ()) for run in runs])
        if val_steps.size:
            ax.plot(val_steps, val_mean, linestyle="none", marker="o", markersize=4,
                    color=colour, label=f"{label} (val)")  # fmt: skip
    ax.set_title(metric, fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for axis in (ax.xaxis, ax.yaxis):
        formatter = ScalarFormatter(useOffset=False)
        formatter.set_scientific(False)
        axis.set_major_formatter(formatter)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


def ema(points: Curve, weight: float) -> list[tuple[int, float]]:
    """TensorBoard's smoothing: an exponential moving average, debiased at the start.

    ``s_k = weight * s_(k-1) + (1 - weight) * x_k`` from ``s_0 = 0``, divided by
    ``1 - weight^k`` so that the first points are not pulled towards 0; non-finite values are
    kept as they are and left out of the average. ``weight = 0`` returns the points unchanged.

    >>> ema([(1, 1.0), (2, 3.0)], 0.5)
    [(1, 1.0), (2, 2.3333333333333335)]

    Raises:
        ValueError: ``weight`` outside [0, 1).

    """
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight {weight} is outside [0, 1)")
    out, last, seen = [], 0.0, 0
    for step, value in sorted(points):
        if not math.isfinite(value) or weight == 0.0:
            out.append((step, float(value)))
            continue
        seen += 1
        last = weight * last + (1.0 - weight) * value
        out.append((step, last / (1.0 - weight**seen)))
    return out


def mean_band(runs: Sequence[Curve]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps, mean and std over runs, step by step (each step over the runs that logged it).

    The std is the sample std (ddof=1) over the finite values at that step, 0 where only one
    run has one; a step where no run has a finite value is left out.

    Returns:
        ``(steps, mean, std)``, each (S,) for the S steps with a value, in increasing order.

    """
    values: dict[int, list[float]] = {}
    for run in runs:
        for step, value in run:
            if math.isfinite(value):
                values.setdefault(int(step), []).append(float(value))
    steps = np.array(sorted(values), dtype=np.int64)
    mean = np.array([np.mean(values[s]) for s in steps], dtype=np.float64)
    std = np.array(
        [np.std(values[s], ddof=1) if len(values[s]) > 1 else 0.0 for s in steps],
        dtype=np.float64,
    )
    return steps, mean, std


def plot_advantage_histograms(
    samples: Mapping[str, Sequence[float] | np.ndarray],
    path: str | Path,
    *,
    bins: int = 50,
    title: str | None = None,
) -> Path | None:
    """One histogram per segment of the per-rollout advantages; saved as PNG.

    Args:
        samples: segment -> advantages of rollouts where it is present (or run label ->
            advantages, to overlay runs in ``slca-exp compare``).
        path: the PNG to write.
        bins: histogram bins.
        title: figure title.

    Returns:
        ``path``, or None when every sample is empty.

    """
    shown = {k: np.asarray(v, dtype=np.float64).ravel() for k, v in samples.items()}
    shown = {k: v[np.isfinite(v)] for k, v in shown.items() if v.size}
    if not shown:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(shown), figsize=(4.2 * len(shown), 3.0), squeeze=False)
    for ax, (label, values) in zip(axes.flat, shown.items(), strict=True):
        ax.hist(values, bins=bins, alpha=0.85)
        ax.set_title(
            f"{label}: n={values.size}, mean={values.mean():.3g}, std={values.std():.3g}",
            fontsize=9,
        )
        ax.set_xlabel("advantage", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def render_run_plots(history: History, folder: Path) -> list[Path]:
    """Draw the end-of-run plots of one run into ``folder``; returns the files written."""
    curves = {"run": history.metrics}
    samples = {seg: np.concatenate(v) for seg, v in history.advantages.items() if v}
    drawn = [
        plot_curves(curves, REWARD_CURVES, folder / "reward_curves.png", title="rewards"),
        plot_curves(
            curves, ADVANTAGE_CURVES, folder / "segment_curves.png", title="segment advantages"
        ),
        plot_advantage_histograms(
            samples, folder / "advantage_histograms.png", title="per-segment advantages"
        ),
    ]
    return [p for p in drawn if p is not None]


def _pyplot():  # noqa: ANN202 - the matplotlib.pyplot module
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> Path:  # noqa: ANN001 - a matplotlib Figure
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    _pyplot().close(fig)
    return out
