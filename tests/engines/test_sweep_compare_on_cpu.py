"""A ready study run for real on the local engine under one parent, then compare.

``sweep=exec_control experiment=smoke``: {grpo, slca_grpo} x {hierr_paper, exec_outcome}, at a
reduced size (one seed, tiny model, two RL steps): the outcome reward's facts rule decides R_tool.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.engines.test_engine_runs_on_cpu import TINY

EXE = str(Path(sys.executable).parent / "slca-exp")


@pytest.mark.slow
def test_the_exec_control_study_gives_four_children_and_compare_shows_them(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    root = tmp_path / "out"
    res = subprocess.run(
        [
            EXE,
            "train",
            "-m",
            "sweep=exec_control",
            "experiment=smoke",
            "seed=0",
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
    assert parent.data.tags["slca.study"] == "exec_control"
    cells = {(r.data.params["algorithm.name"], r.data.params["reward.name"]) for r in children}
    assert cells == {(a, w) for a in ("grpo", "slca_grpo") for w in ("hierr_paper", "exec_outcome")}
    for child in children:
        metrics = child.data.metrics
        assert "val/tool_success_at_0.9" in metrics and "val/reward/tool/hierr/mean" in metrics
        outcome = child.data.params["reward.name"] == "exec_outcome"
        # a tiny policy may make no call at all: then no verdict, yet the judge's counts
        assert ("val/outcome/requests" in metrics) == outcome
        assert ("outcome/requests" in metrics) == outcome

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
    assert "slca_grpo - grpo" in out.stdout  # the paired difference per reward
    for child in children:
        assert child.info.run_id in out.stdout
    assert list((tmp_path / "cmp").glob("*.png"))
