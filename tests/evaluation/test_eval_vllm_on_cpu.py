"""A short local run, then ``slca-exp eval RUN benchmark=bfcl_v3`` with the real vLLM (CPU build).

The run trains the tiny backbone with heads 32 wide (``backbone.arch.num_heads=2``), a size
vLLM's CPU attention runs. ``eval=cpu`` serves its final policy with ``vllm serve`` and the
hermes tool-call parser; BFCL's own generation and checker score it on two items each of
simple_python, multiple and parallel. A policy this small scores near 0, which is fine: what
is tested is the path (served by vLLM, answered, scored, logged into the run).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.engines.test_engine_runs_on_cpu import TINY
from tests.evaluation.conftest import VERSION, cli, cli_env
from tests.skip_policy import require

require("vllm", reason="needs vLLM's CPU build (make install)")
pytestmark = pytest.mark.slow

EXE = str(Path(sys.executable).parent / "slca-exp")
CATEGORIES = ("simple_python", "multiple", "parallel")


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory, bfcl_env):
    work = tmp_path_factory.mktemp("eval-vllm")
    env = cli_env(bfcl_env["root"])
    root = work / "out"
    trained = cli(
        [
            EXE,
            "train",
            "experiment=smoke",
            *TINY,
            "engine.rl.steps=1",
            "backbone.arch.num_heads=2",
            f"tracking.root={root}",
        ],
        work,
        env,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    store = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(store)
    (run,) = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    res = cli(
        [
            EXE,
            "eval",
            run.info.run_id,
            "--tracking-uri",
            store,
            "benchmark=bfcl_v3",
            f"benchmark.categories=[{','.join(CATEGORIES)}]",
            "benchmark.per_category=2",
            "benchmark.max_tokens=64",
            "eval=cpu",
        ],
        work,
        env,
        timeout=1200,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    return client, client.get_run(run.info.run_id), res


def test_the_checkpoint_served_by_vllm_is_scored_into_its_run(evaluated):
    client, run, res = evaluated
    metrics = run.data.metrics
    for category in (*CATEGORIES, "overall"):
        assert 0.0 <= metrics[f"eval/bfcl/{category}"] <= 1.0
    assert run.data.tags["slca.eval.bfcl.version"] == VERSION
    record = json.loads(
        Path(client.download_artifacts(run.info.run_id, "eval/bfcl/eval.json")).read_text()
    )
    command = record["ran"]["server_command"].split()
    assert command[1:2] == ["serve"] and Path(command[0]).name == "vllm"
    assert "--enable-auto-tool-choice" in command
    assert command[command.index("--tool-call-parser") + 1] == "hermes"
    served = command[command.index("--served-model-name") + 1]
    assert served == run.data.tags["mlflow.runName"]
    assert record["ran"]["server_version"]  # vLLM's own /version
    table = json.loads(
        Path(client.download_artifacts(run.info.run_id, "eval/bfcl/items.json")).read_text()
    )
    assert len(table["data"]) == len(CATEGORIES) * 2
    # every item reached the model and came back with its answer (not a refused request)
    answers = [json.loads(row[table["columns"].index("answer")]) for row in table["data"]]
    assert not [a for a in answers if str(a).startswith("Error during inference")], answers
    assert "served at http://127.0.0.1:" in res.stderr
