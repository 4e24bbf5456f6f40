"""The compare plots: TensorBoard's EMA, mean and band over seeds, one curve per group, val markers,
integer step ticks and no offset notation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.tracking.plots import _pyplot, draw_panel, ema, mean_band, plot_groups

VALUES = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)
CURVES = st.lists(st.tuples(st.integers(0, 50), VALUES), max_size=30, unique_by=lambda p: p[0])


def tensorboard_smoothing(values: list[float], weight: float) -> list[float]:
    """TensorBoard's scalar-dashboard smoothing, written from its documented behaviour."""
    out, last = [], 0.0
    for count, value in enumerate(values, start=1):
        last = last * weight + (1 - weight) * value
        out.append(last / (1 - weight**count))
    return out


@settings(max_examples=60, deadline=None)
@given(CURVES, st.floats(0.0, 0.99))
def test_ema_is_tensorboards_smoothing_in_step_order(points, weight):
    smoothed = ema(points, weight)
    ordered = sorted(points)
    assert [s for s, _ in smoothed] == [s for s, _ in ordered]
    expected = tensorboard_smoothing([v for _, v in ordered], weight)
    assert [v for _, v in smoothed] == pytest.approx(expected, rel=1e-9, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=20, unique=True), VALUES, st.floats(0.0, 0.99))
def test_a_constant_curve_stays_constant_and_weight_0_changes_nothing(steps, value, weight):
    points = [(s, value) for s in steps]
    assert [v for _, v in ema(points, weight)] == pytest.approx([value] * len(steps), abs=1e-9)
    assert ema(points, 0.0) == sorted(points)


def test_ema_refuses_a_weight_outside_0_1():
    with pytest.raises(ValueError, match=r"outside \[0, 1\)"):
        ema([(1, 1.0)], 1.0)


def test_mean_band_is_the_mean_and_sample_std_over_the_runs_that_logged_each_step():
    steps, mean, std = mean_band([[(1, 1.0), (2, 2.0)], [(1, 3.0), (3, 5.0)], [(2, math.nan)]])
    assert steps.tolist() == [1, 2, 3]
    assert mean.tolist() == [2.0, 2.0, 5.0]
    assert std.tolist() == pytest.approx([math.sqrt(2.0), 0.0, 0.0])  # ddof=1; one run: 0


@settings(max_examples=40, deadline=None)
@given(st.lists(CURVES, min_size=1, max_size=5))
def test_mean_band_lies_between_the_runs_at_every_step(runs):
    steps, mean, std = mean_band(runs)
    for step, m, s in zip(steps.tolist(), mean, std, strict=True):
        values = [v for run in runs for t, v in run if t == step]
        assert min(values) - 1e-9 <= m <= max(values) + 1e-9
        assert s >= 0
    assert sorted({t for run in runs for t, _ in run}) == steps.tolist()


def test_a_panel_draws_one_mean_curve_and_band_per_group_and_val_markers():
    plt = _pyplot()
    fig, ax = plt.subplots()
    seeds = [
        {"reward/total/mean": [(1, 0.1), (2, 0.2), (3, 0.3)], "val/reward/total/mean": [(3, 0.5)]},
        {"reward/total/mean": [(1, 0.3), (2, 0.4), (3, 0.5)], "val/reward/total/mean": [(3, 0.7)]},
        {"reward/total/mean": [(1, 0.2), (2, 0.3), (3, 0.4)]},
    ]
    alone = [{"reward/total/mean": [(1, 1000.001), (2, 1000.002), (3, 1000.003)]}]
    draw_panel(ax, "reward/total/mean", {"slca_grpo (n=3)": seeds, "grpo": alone})
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"slca_grpo (n=3)", "slca_grpo (n=3) (val)", "grpo"}  # 6 runs, 3 lines
    assert lines["slca_grpo (n=3)"].get_ydata().tolist() == pytest.approx([0.2, 0.3, 0.4])
    assert lines["slca_grpo (n=3) (val)"].get_marker() == "o"
    assert lines["slca_grpo (n=3) (val)"].get_xdata().tolist() == [3]
    assert lines["slca_grpo (n=3) (val)"].get_ydata().tolist() == pytest.approx([0.6])
    assert len(ax.collections) == 1  # one band: the group with several seeds
    fig.canvas.draw()
    ticks = ax.get_xticks()
    assert np.allclose(ticks, np.round(ticks))  # integer step ticks
    assert ax.xaxis.get_major_formatter().get_offset() == ""
    assert ax.yaxis.get_major_formatter().get_offset() == ""  # 1000.001..: no "+1e3" offset
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert all("e" not in label for label in labels), labels
    plt.close(fig)


def test_plot_groups_writes_a_png_and_skips_metrics_no_run_has(tmp_path):
    groups = {"a": [{"reward/tool/mean": [(1, 0.1), (2, 0.3)]}]}
    path = plot_groups(groups, ["reward/tool/mean", "nothing"], tmp_path / "p.png", smooth=0.6)
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_groups(groups, ["nothing"], tmp_path / "none.png") is None
