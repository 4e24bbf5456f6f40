"""Run a real Hydra multirun of ``slca-exp train`` in-process, with a synthetic engine.

No engine is installed yet, so :class:`SeededEngine` (the synthetic engine of
``tests/tracking/synthetic.py``, with batches that also depend on the run's seed) is registered as
``local`` for the duration of the sweep only. Everything else is real: the CLI's pre-checks,
Hydra's basic sweeper and launcher, the sweep callback from ``conf/config.yaml``, the MLflow
tracker writing to the sqlite store under ``tracking.root``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra
from mlflow.tracking import MlflowClient

from slca_exp.commands import main as cli_main
from slca_exp.engines import ENGINES
from slca_exp.tracking.plots import advantage_samples
from tests.tracking.synthetic import step_metrics

SLCA_EXE = str(Path(sys.executable).parent / "slca-exp")
GRID = ["algorithm=grpo,slca_grpo", "reward.tool_weights.parallel=0.1,0.3", "reward.normalize=true"]
"""The 2x2 sweep of the acceptance tests."""


class SeededEngine:
    """Logs a few synthetic steps: real estimator stats on random batches that depend on the
    seed and the parallel tool weight, so that every run of a sweep logs different numbers;
    then a small stand-in policy folder as the run's model, as the real engines do."""

    steps = 4

    def run(self, config, recipe, tracker):
        offset = 1000 * config.seed + int(1000 * config.reward.tool_weights.parallel)
        for step in range(self.steps):
            metrics, result = step_metrics(offset + 10 * step, config.algorithm.name)
            tracker.log_metrics(metrics, step)
            tracker.log_advantages(advantage_samples(result), step)
        with tempfile.TemporaryDirectory(prefix="seeded-policy-") as folder:
            (Path(folder) / "config.json").write_text(json.dumps({"seed": config.seed}))
            tracker.log_model(folder, name="policy", step=self.steps - 1)
        return {"steps": self.steps}


@dataclass
class Sweep:
    """What a multirun left in its store."""

    uri: str
    root: Path
    client: MlflowClient
    parent: object
    children: list

    @property
    def sweep_id(self) -> str:
        return self.parent.data.tags["slca.sweep"]


def run_train(args: list[str], root: Path, cwd: Path, env: dict[str, str] | None = None) -> int:
    """``slca-exp train ARGS`` in this process, logging under ``root``; returns the exit status."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        mp.setenv("SLCA_EXP_ROOT", str(root))
        for key, value in (env or {}).items():
            mp.setenv(key, value)
        mp.setitem(ENGINES._entries, "local", SeededEngine())  # the registry has no unregister
        mp.setattr(sys, "argv", list(sys.argv))  # cli sets sys.argv for Hydra; restore it
        try:
            status = cli_main(["train", *args])
        finally:
            GlobalHydra.instance().clear()
    return status


_SHARED: dict[str, Sweep] = {}


def shared_sweep(tmp_path_factory) -> Sweep:
    """The 2x2 sweep of :data:`GRID`, run once per test session; tests must not change it."""
    if "grid" not in _SHARED:
        _SHARED["grid"] = run_sweep(tmp_path_factory.mktemp("sweep2x2"))
    return _SHARED["grid"]


def run_sweep(tmp: Path, grid: list[str] = GRID, extra: tuple[str, ...] = ()) -> Sweep:
    """``slca-exp train -m GRID EXTRA`` under ``tmp``; returns the parent and its children."""
    root = tmp / "root"
    saved = {k: os.environ.get(k) for k in ("SLCA_EXP_PARENT_RUN_ID", "SLCA_EXP_SWEEP_ID")}
    assert run_train(["-m", *grid, *extra], root, tmp) == 0
    # the callback restores the job's environment after every job
    assert {k: os.environ.get(k) for k in saved} == saved
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("slca-exp")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("slca.role") == "parent"]
    assert len(parents) == 1, [r.data.tags for r in runs]
    parent = client.get_run(parents[0].info.run_id)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    return Sweep(uri, root, client, parent, children)
