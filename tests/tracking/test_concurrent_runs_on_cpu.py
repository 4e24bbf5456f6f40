"""Six ``slca-exp train`` started at the same moment on a fresh tracking root.

Each is the command line's own entry point (``slca_exp.commands.main``) in a process of its own,
with the ``steps`` engine, which logs metrics and nothing else, so the processes collide where jobs
started together collide: the new MLflow store (created and migrated once, under its lock), the
experiment (created once), the synthetic split (generated once into one folder) and the W&B
offline folder. The processes are forked from the test's, which has imported torch, MLflow and
Hydra already: six fresh interpreters would spend a minute of CPU importing them.
"""

import contextlib
import os
import sys
from pathlib import Path

# Imported here once, so that the forks share them instead of each importing them again: MLflow's
# sqlite store and what wandb.init imports on first use.
import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
import pytest
import wandb.sdk.launch  # noqa: F401
from mlflow import MlflowClient

import tests.tracking.steps_plugin  # noqa: F401 - registers the steps engine, in every fork
from slca_exp import commands
from slca_exp.data.synthetic import MANIFEST, SPLIT_FILES
from tests.concurrency import memory_folder, run_together
from tests.tracking.steps_plugin import step_values

RUNS, STEPS, METRICS = 6, 5, 20

pytestmark = pytest.mark.slow


def train(folder: Path, root: Path, i: int) -> int:
    """``slca-exp train ...`` in this (forked) process; its exit status. Output: job<i>.log."""
    os.environ.update(
        SLCA_EXP_PLUGINS="tests.tracking.steps_plugin",
        SYNTH_STEPS=str(STEPS),
        STEPS_METRICS=str(METRICS),
    )
    for var in ("SLCA_EXP_PARENT_RUN_ID", "SLCA_EXP_SWEEP_ID", "RANK", "MLFLOW_TRACKING_URI"):
        os.environ.pop(var, None)
    os.chdir(folder)
    with open(folder / f"job{i}.log", "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        args = [
            "train",
            "engine.name=steps",
            "tracking=mlflow_wandb",
            "tracking.plots=false",
            f"tracking.root={root}",
            "data.rows=8",
            f"seed={i}",
            f"run_name=together-{i}",
            f"hydra.run.dir={folder / f'job{i}'}",
        ]
        try:
            status = commands.main(args)
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else 1
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
    return status


def test_six_runs_started_together_on_a_fresh_root_all_finish_with_every_step_once(tmp_path):
    with memory_folder() as root:
        statuses = run_together(train, [(tmp_path, root, i) for i in range(RUNS)], timeout_s=300)
        for i, status in enumerate(statuses):
            out = (tmp_path / f"job{i}.log").read_text()
            assert status == 0, f"run {i}:\n{out}"
            assert "Traceback" not in out, f"run {i}:\n{out}"
            assert "not recorded" not in out, f"run {i}:\n{out}"  # datasets, prompts: all there

        # The store opens afterwards and holds one experiment with six FINISHED runs.
        client = MlflowClient(f"sqlite:///{root}/mlflow.db")
        (experiment,) = [e for e in client.search_experiments() if e.name == "slca-exp"]
        runs = client.search_runs([experiment.experiment_id])
        assert sorted(r.info.run_name for r in runs) == [f"together-{i}" for i in range(RUNS)]
        want = {name: [] for name in step_values(0, METRICS)}
        for step in range(STEPS):
            for name, value in step_values(step, METRICS).items():
                want[name].append((step, value))
        for run in runs:
            assert run.info.status == "FINISHED"
            assert client.get_run(run.info.run_id).inputs.dataset_inputs
            for name, expected in want.items():
                history = client.get_metric_history(run.info.run_id, name)
                assert sorted((m.step, m.value) for m in history) == expected, name
        assert not list(Path(root).glob("spool/*.jsonl"))  # nothing left waiting

        # One synthetic split, complete; six W&B offline runs.
        (folder,) = [p for p in Path(root, "data", "synthetic").iterdir() if p.is_dir()]
        assert {p.name for p in folder.iterdir()} == {MANIFEST, *SPLIT_FILES.values()}
        assert len({r.data.tags["slca.data"] for r in runs}) == 1
        assert len(list(Path(root, "wandb").glob("offline-run-*"))) == RUNS
