"""A plugin engine brings its own keys: ``engine.counter.*`` is composed from its option file onto
its schema, checked like every key (unknown key, field check), refused by its own check, shown
by ``--cfg job`` and run end to end by ``slca-exp train``, all from the command line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from slca_exp.core import names
from tests.plugins.lab import COUNTER_OPTION, UNLUCKY

REPO = Path(__file__).resolve().parents[1]
SLCA_EXE = str(Path(sys.executable).parent / "slca-exp")


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory) -> Path:
    """A user's config folder holding the plugin engine's option, ``engine/counter.yaml``."""
    folder = tmp_path_factory.mktemp("myconf")
    (folder / "engine").mkdir()
    (folder / "engine" / "counter.yaml").write_text(COUNTER_OPTION)
    return folder


def slca(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "SLCA_EXP_PLUGINS": "tests.plugins.engine_plugin",
        "PYTHONPATH": str(REPO),
    }
    return subprocess.run(
        [SLCA_EXE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_plugin_engine_s_own_keys_are_checked_like_every_key(config_dir, tmp_path):
    res = slca(
        "validate",
        "--offline",
        "--config-dir",
        str(config_dir),
        "engine=counter",
        "engine.counter.stepz=4",
        "engine.counter.value=nan",
        cwd=tmp_path,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert "engine.counter.stepz: unknown key" in res.stderr
    assert "did you mean engine.counter.steps?" in res.stderr
    assert "engine.counter.value" in res.stderr and "finite" in res.stderr
    assert not (tmp_path / "outputs").exists()  # refused before anything was created


def test_the_plugin_engine_s_own_check_refuses_before_anything_starts(config_dir, tmp_path):
    res = slca(
        "validate",
        "--offline",
        "--config-dir",
        str(config_dir),
        "engine=counter",
        f"engine.counter.value={UNLUCKY}",
        cwd=tmp_path,
    )
    assert res.returncode == 2
    assert "engine.counter.value: 13 is unlucky" in res.stderr


def test_the_plugin_engine_runs_with_its_keys_and_describes_itself(config_dir, tmp_path):
    root = tmp_path / "outputs"
    run = [
        "--config-dir",
        str(config_dir),
        "engine=counter",
        "engine.counter.steps=4",
        "engine.counter.value=0.5",
        "tracking=mlflow",
        f"tracking.root={root}",
        "tracking.plots=false",
    ]
    shown = slca("train", "--cfg", "job", *run, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "counter:\n    steps: 4\n    value: 0.5" in shown.stdout  # the composed config
    assert "# engine=counter: 4 steps" in shown.stdout  # what the engine shows of itself

    res = slca("train", *run, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    (found,) = client.search_runs(client.search_experiments()[0].experiment_id.split())
    assert found.info.status == "FINISHED"
    history = client.get_metric_history(found.info.run_id, names.REWARD_TOOL_MEAN)
    assert [(m.step, m.value) for m in history] == [(0, 0.0), (1, 0.5), (2, 1.0), (3, 1.5)]
    recipe = json.loads(
        Path(client.download_artifacts(found.info.run_id, "recipe.json", str(tmp_path))).read_text()
    )
    assert recipe["engine"]["counter"] == {"steps": 4, "value": 0.5}
