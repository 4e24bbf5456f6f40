"""A sweep through hydra-submitit-launcher (local executor): jobs in their own processes.

The callback object is pickled into each job, the engine comes from a plugin module the job
imports itself (``SLCA_EXP_PLUGINS``), and the runs still end up as children of one parent.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[2]
EXE = str(Path(sys.executable).parent / "slca-exp")


@pytest.mark.slow
def test_submitit_local_sweep_gives_one_parent_and_a_child_per_job(tmp_path):
    env = {
        **os.environ,
        "SLCA_EXP_PLUGINS": "tests.tracking.synthetic_plugin",
        "PYTHONPATH": str(REPO),
        "SYNTH_STEPS": "3",
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    res = subprocess.run(
        [
            EXE,
            "train",
            "-m",
            "launcher=submitit_local",  # the profile, translated to hydra-submitit-launcher
            "launcher.timeout_min=5",
            "algorithm=grpo,slca_grpo",
            "engine.name=synthetic",
            f"tracking.root={tmp_path / 'out'}",
            f"hydra.sweep.dir={tmp_path / 'multirun'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    client = MlflowClient(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    parents = [r for r in runs if r.data.tags.get("slca.role") == "parent"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 2
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    assert {r.data.params["algorithm.name"] for r in children} == {"grpo", "slca_grpo"}
    assert all(r.info.status == "FINISHED" and "adv/tool/mean" in r.data.metrics for r in children)
    # the jobs really ran through submitit, each in its own process
    assert len(list((tmp_path / "multirun" / ".submitit").rglob("*_result.pkl"))) == 2
    # each job is named with its log as it is submitted; the sweep ends saying where to look
    submitted = [x for x in res.stderr.splitlines() if x.startswith("slca-exp: submitted ")]
    assert len(submitted) == 2 and all(
        x.startswith("slca-exp: submitted local job ") for x in submitted
    )
    shown = [x.split(", log: ")[1] for x in submitted]  # named from the launch folder
    assert all(x.startswith("multirun/.submitit/") and (tmp_path / x).is_file() for x in shown)
    sweep_id = parents[0].data.tags["slca.sweep"]
    block = res.stderr[res.stderr.rindex("slca-exp: ---- where to look ----") :]
    assert f"slca-exp: sweep {sweep_id} FINISHED: parent MLflow run {parents[0].info.run_id}" in (
        block
    )
    assert f"slca-exp: compare: slca-exp compare {sweep_id} --tracking-uri sqlite:///out/" in block
    assert "slca-exp: sweep folder: multirun\n" in block
    for child in children:
        assert f"COMPLETED, MLflow run {child.info.run_id}" in block
    # each job's train.log holds the job's own slca-exp: lines (its closing block)
    for num in (0, 1):
        logged = (tmp_path / "multirun" / str(num) / "train.log").read_text()
        assert "slca-exp: ---- where to look ----" in logged
        assert f"slca-exp: sweep {sweep_id}: parent MLflow run" in logged


def test_a_plugin_that_fails_to_import_is_a_clear_exit_2(tmp_path):
    env = {**os.environ, "SLCA_EXP_PLUGINS": "no_such_module_anywhere"}
    res = subprocess.run(
        [EXE, "validate"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2
    assert "$SLCA_EXP_PLUGINS" in res.stderr and "no_such_module_anywhere" in res.stderr
    assert "Traceback" not in res.stderr and list(tmp_path.iterdir()) == []
