"""``slca-exp compare``'s plots: per-segment curves per group of runs, and dose-response.

rewards.png, advantages.png   one mean curve per group, a band of one std over its seeds
dose_<factor>.png             each metric against a numeric factor's levels, 95% intervals
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slca_exp.analysis.differences import DosePoint, dose_response
from slca_exp.analysis.runs import Observations, Selection, group_labels, swept_value
from slca_exp.core.names import SEGMENTS, adv, val
from slca_exp.tracking.mlflow import mlflow_key


def write_plots(client: Any, selection: Selection, out: Path, *, smooth: float = 0.0) -> list[Path]:
    """``rewards.png`` and ``advantages.png``: per-segment curves, one per group of runs.

    The runs are grouped as the table groups them (:func:`group_runs`): each group is drawn as
    its mean curve with a band of one std over its runs (its seeds), each run smoothed first
    with an EMA of weight ``smooth``; the validation values of a panel's metric are markers.
    """
    from slca_exp.tracking.plots import plot_groups

    figures = _figures()
    wanted = curve_metrics()
    groups: dict[str, list[dict[str, list[tuple[int, float]]]]] = {}
    for label, runs in group_labels(selection).items():
        groups[label] = [
            {
                name: [
                    (m.step, m.value)
                    for m in client.get_metric_history(run.info.run_id, mlflow_key(name))
                ]
                for name in wanted
                if mlflow_key(name) in run.data.metrics
            }
            for run in runs
        ]
    written = []
    for figure, names in figures.items():
        path = plot_groups(
            groups, names, out / f"{figure}.png", title=selection.label, smooth=smooth
        )
        if path is not None:
            written.append(path)
    return written


def _figures() -> dict[str, tuple[str, ...]]:
    from slca_exp.tracking.plots import ADVANTAGE_CURVES, REWARD_CURVES

    return {
        "rewards": REWARD_CURVES,
        "advantages": ADVANTAGE_CURVES + tuple(adv(seg, "std") for seg in SEGMENTS),
    }


def curve_metrics() -> list[str]:
    """The metrics :func:`write_plots` draws the histories of (with their validation values)."""
    wanted = [name for names in _figures().values() for name in names]
    return wanted + [val(name) for name in wanted]


def write_dose_plots(
    selection: Selection, metrics: Sequence[str], observe: Observations, out: Path
) -> list[Path]:
    """``dose_<factor>.png`` for every numeric swept factor: each metric against its levels."""
    curves = {
        metric: dose_response(selection.runs, selection.swept, metric, observe, swept_value)
        for metric in metrics
    }
    factors = sorted({f for by_factor in curves.values() for f in by_factor})
    written = []
    for factor in factors:
        path = plot_dose_response(
            {m: c for m, c in curves.items() if factor in c},
            factor,
            out / f"dose_{safe_name(factor)}.png",
            selection.label,
        )
        if path is not None:
            written.append(path)
    return written


def plot_dose_response(
    curves: dict[str, dict[str, dict[str, list[DosePoint]]]], factor: str, path: Path, title: str
) -> Path | None:
    """One panel per metric: each line's mean against the factor, its 95% interval as a band."""
    from slca_exp.tracking.plots import _pyplot, _save

    panels = [(metric, by_factor[factor]) for metric, by_factor in curves.items()]
    panels = [(m, lines) for m, lines in panels if any(lines.values())]
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (metric, lines) in zip(axes[0], panels, strict=True):
        for label, points in lines.items():
            if not points:
                continue
            xs = [p.x for p in points]
            (line,) = ax.plot(xs, [p.mean for p in points], marker="o", label=label)
            low = [p.low if math.isfinite(p.low) else p.mean for p in points]
            high = [p.high if math.isfinite(p.high) else p.mean for p in points]
            ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel(factor)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{title}: mean over seeds, 95% interval", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def safe_name(text: str) -> str:
    """``text`` as one file name: every character but letters, digits and ``-_.`` is ``_``."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def profile(values: Sequence[float], taus: Sequence[float]) -> list[float]:
    """The performance profile: the fraction of ``values`` above each threshold ``tau``.

    >>> profile([0.2, 0.4, 0.6, 0.8], [0.0, 0.5, 0.8])
    [1.0, 0.5, 0.0]
    """
    return [sum(v > tau for v in values) / len(values) for tau in taus]


def write_profiles(
    selection: Selection, metrics: Sequence[str], observe: Observations, out: Path
) -> list[Path]:
    """``profiles.png``: per metric, each group's performance profile over its runs.

    A group's curve is the fraction of its runs whose observation exceeds ``tau``, for ``tau``
    over the range the metric takes; its band the 95% percentile bootstrap interval of that
    fraction, the group's runs resampled (:data:`~slca_exp.analysis.intervals.RESAMPLES` times,
    seed :data:`~slca_exp.analysis.intervals.SEED`). As rliable draws them (Agarwal et al. 2021),
    with one task per panel.
    """
    import numpy as np

    from slca_exp.analysis.intervals import RESAMPLES, SEED
    from slca_exp.tracking.plots import _pyplot, _save

    groups = group_labels(selection)
    panels = []
    for metric in metrics:
        lines = {
            label: [x for r in runs if (x := observe(r, metric)) is not None]
            for label, runs in groups.items()
        }
        lines = {label: xs for label, xs in lines.items() if xs}
        if lines:
            panels.append((metric, lines))
    if not panels:
        return []
    rng = np.random.default_rng(SEED)
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (metric, lines) in zip(axes[0], panels, strict=True):
        seen = [x for xs in lines.values() for x in xs]
        low, high = min(seen), max(seen)
        pad = (high - low) * 0.05 or 0.05
        taus = np.linspace(low - pad, high + pad, 101)
        for label, xs in lines.items():
            data = np.asarray(xs, dtype=float)
            (line,) = ax.plot(taus, profile(xs, taus), label=label)
            resampled = data[rng.integers(0, len(data), size=(RESAMPLES // 10, len(data)))]
            fractions = (resampled[:, :, None] > taus[None, None, :]).mean(axis=1)
            band = np.percentile(fractions, [2.5, 97.5], axis=0)
            ax.fill_between(taus, band[0], band[1], color=line.get_color(), alpha=0.15, lw=0)
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel("tau")
        ax.set_ylabel("fraction of runs > tau")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{selection.label}: performance profiles, 95% bootstrap bands", fontsize=9)
    fig.tight_layout()
    path = _save(fig, out / "profiles.png")
    return [path] if path is not None else []
