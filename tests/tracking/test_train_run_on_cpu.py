"""``slca-exp train`` end to end with the synthetic engine: what lands in MLflow, W&B, Hydra's
folders, and how a failed or killed run is closed."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from slca_exp import train
from slca_exp.preflight.compose import compose_run
from slca_exp.registry import Registry
from slca_exp.tracking import lineage
from slca_exp.tracking.mlflow import mlflow_key
from tests.tracking.synthetic import SyntheticEngine, step_metrics

DRIVER = Path(__file__).with_name("run_train.py")
WANDB = shutil.which("wandb") or str(Path(sys.executable).parent / "wandb")
ENV_SECRET = "env-secret-7c1d9e2b4a"


def launch(tmp_path, *overrides, env=None):
    full = {**os.environ, "SYNTH_STEPS": "4", **(env or {})}
    for var in ("SLCA_EXP_ROOT", "SLCA_EXP_PARENT_RUN_ID", "SLCA_EXP_SWEEP_ID", "RANK"):
        full.pop(var, None)
    return subprocess.Popen(
        [sys.executable, str(DRIVER), "train", *overrides],
        cwd=tmp_path,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def runs_of(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("slca-exp")
    return client, client.search_runs([exp.experiment_id])


def test_a_run_records_the_recipe_and_metrics_and_no_secret(tmp_path):
    proc = launch(
        tmp_path,
        "tracking=mlflow_wandb",
        "judge.api_key_env=JUDGE_API_KEY",
        # (credentials in a URL are refused before the run: tests/test_preflight_on_cpu.py)
        # A config value that resolves to the secret itself.
        "judge.name=${oc.env:JUDGE_API_KEY}",
        env={"JUDGE_API_KEY": ENV_SECRET},
    )
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err

    # MLflow: one finished run with every slca.* tag, recipe.json and every step of every metric.
    client, (run,) = runs_of(tmp_path)
    assert run.info.status == "FINISHED"
    tags = {k: v for k, v in run.data.tags.items() if k.startswith("slca.")}
    assert set(tags) == {
        f"slca.{k}"
        for k in (
            "backbone",
            "reward",
            "judge",
            "simulator",
            "data",
            "estimator",
            "fingerprint",
            "sweep",
        )
    }
    assert tags["slca.judge"].startswith("rubric")
    expected = set(step_metrics(0)[0])
    assert set(run.data.metrics) == {mlflow_key(k) for k in expected}
    for key in run.data.metrics:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert sorted(steps) == [0, 1, 2, 3]
    recipe = json.loads(
        Path(client.download_artifacts(run.info.run_id, "recipe.json", str(tmp_path))).read_text()
    )
    assert recipe["fingerprint"][:12] == tags["slca.fingerprint"]
    assert run.data.params["judge.name"] == recipe["judge"]["name"] == "<redacted>"
    # In MLflow's terms: the splits as dataset inputs, the templates from the prompt registry
    # (version 1 of each in a new store), the experiment in the model-training view.
    files = recipe["data"]["files"]
    assert lineage.run_datasets(client.get_run(run.info.run_id)) == {
        f"synthetic-{split}": entry["sha256"][:12] for split, entry in files.items()
    }
    prompts = recipe["prompts"]
    assert lineage.linked_prompts(run) == [
        {"name": prompts[g]["name"], "version": "1"} for g in ("judge", "simulator")
    ]
    assert prompts["judge"]["sha256"] == recipe["judge"]["prompt_sha256"]
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    (model,) = client.search_logged_models([run.info.experiment_id])
    assert model.source_run_id == run.info.run_id
    assert model.tags["slca.fingerprint"] == tags["slca.fingerprint"]
    assert [f.path for f in client.list_logged_model_artifacts(model.model_id)] == ["config.json"]

    # W&B offline run, read back with wandb's own reader.
    (run_dir,) = (tmp_path / "outputs" / "wandb").glob("offline-run-*")
    inspected = subprocess.run(
        [WANDB, "leet", "inspect", "--json", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    records = [json.loads(line) for line in inspected.splitlines() if line.strip()]
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    assert len(history) == 4
    assert {k for item in history for k in item if not k.startswith("_")} == expected
    config = next(r["run"]["config"]["update"] for r in records if r["type"] == "run")
    assert config["fingerprint"] == recipe["fingerprint"]
    assert config["reward"] == recipe["reward"] and config["data"] == recipe["data"]
    # The same splits and templates as W&B artifacts, with the same sha256.
    artifacts = {r["artifact"]["name"]: r["artifact"] for r in records if r["type"] == "artifact"}
    for split, entry in files.items():
        artifact = artifacts[f"synthetic-{split}"]
        assert artifact["type"] == "dataset"
        assert json.loads(artifact["metadata"])["sha256"] == entry["sha256"]
    for group in ("judge", "simulator"):
        artifact = artifacts[prompts[group]["name"]]
        assert artifact["type"] == "prompt"
        assert json.loads(artifact["metadata"])["sha256"] == recipe[group]["prompt_sha256"]
    assert artifacts["policy"]["type"] == "model"
    assert json.loads(artifacts["policy"]["metadata"])["fingerprint"] == tags["slca.fingerprint"]

    # No secret anywhere: MLflow store and artifacts, W&B files, Hydra folders, output.
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "overrides.yaml" for p in files)  # Hydra's folder is among them
    assert any(p.name == "debug.log" for p in files)  # and W&B's logs
    for secret in (ENV_SECRET,):
        assert secret not in out + err + inspected
        leaks = [p for p in files if secret.encode() in p.read_bytes()]
        assert leaks == [], f"{secret} found in {leaks}"


def test_sigterm_closes_the_run_killed(tmp_path):
    proc = launch(tmp_path, "tracking=mlflow", env={"SYNTH_STEPS": "1000", "SYNTH_SLEEP_S": "0.1"})
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if line.startswith("step 2 logged") or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "KILLED" in err and "Traceback" not in err
    client, (run,) = runs_of(tmp_path)
    assert run.info.status == "KILLED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "adv/tool/mean")]
    assert steps[:3] == [0, 1, 2] and len(steps) == len(set(steps))


def test_an_engine_that_raises_leaves_a_failed_run(tmp_path, monkeypatch):
    engines = Registry("engine")
    engines.register("local", SyntheticEngine())
    monkeypatch.setattr(train, "ENGINES", engines)
    monkeypatch.setenv("SYNTH_FAIL_AT", "2")
    cfg = compose_run([f"tracking.root={tmp_path / 'outputs'}", "tracking.plots=false"])
    with pytest.raises(RuntimeError, match="synthetic failure at step 2"):
        train.run(cfg)
    client, (run,) = runs_of(tmp_path)
    assert run.info.status == "FAILED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "adv/tool/mean")]
    assert steps == [0, 1]


def test_an_unknown_engine_creates_nothing(tmp_path):
    exe = shutil.which("slca-exp") or str(Path(sys.executable).parent / "slca-exp")
    res = subprocess.run(
        [exe, "train", "engine.name=warp"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "engine.name" in res.stderr
    assert "unknown engine 'warp'" in res.stderr and "local" in res.stderr
    assert list(tmp_path.iterdir()) == []
