"""The rollout-cost benchmark runs (two short smoke runs) and prints what it promises.

Its figures are a measurement, not a pass mark: no wall-clock time is asserted, only that the
cost and the store size come out as finite positive numbers with their lines printed.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_the_rollout_cost_benchmark_reports_the_cost_and_the_store_size(tmp_path):
    out = tmp_path / "figures.json"
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "rollout_cost.py"),
            "--quick",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert math.isfinite(figures["cost"]) and figures["cost"] > 0
    assert figures["cost_with_export"] >= figures["cost"]  # the export can only add
    assert math.isfinite(figures["cost_with_export_upper"])
    assert "with the background export:" in res.stdout
    assert "step after a logged step:" in res.stdout  # the export, measured within one run
    assert "(upper end of the 95% interval, Welch)" in res.stdout
    assert math.isfinite(figures["mb_per_1000"]) and figures["mb_per_1000"] > 0
    assert "% of the every=0 step (goal <= 3 %)" in res.stdout
    assert "MB per 1000 steps at the defaults" in res.stdout
    print(res.stdout)
