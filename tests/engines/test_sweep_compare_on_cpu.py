"""A real 2x2 sweep of the local engine (estimator x seed) under one parent, then compare."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.engines.test_engine_runs_on_cpu import TINY

EXE = str(Path(sys.executable).parent / "slca-exp")


@pytest.mark.slow
def test_estimator_by_seed_sweep_gives_four_children_and_compare_shows_them(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    root = tmp_path / "out"
    res = subprocess.run(
        [
            EXE,
            "train",
            "-m",
            "experiment=smoke",
            "algorithm=grpo,slca_grpo",
            "seed=0,1",
            *TINY,
            "engine.rl.steps=2",
            f"tracking.root={root}",
            f"hydra.sweep.dir={tmp_path / 'multirun'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    (parent,) = [r for r in runs if r.data.tags.get("slca.role") == "parent"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 4 and parent.info.status == "FINISHED"
    assert all(r.info.status == "FINISHED" for r in children)

    out = subprocess.run(
        [
            EXE,
            "compare",
            parent.data.tags["slca.sweep"],
            "--tracking-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--out",
            str(tmp_path / "cmp"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "compare-runs?runs=" in out.stdout
    for child in children:
        assert child.info.run_id in out.stdout
    assert list((tmp_path / "cmp").glob("*.png"))
