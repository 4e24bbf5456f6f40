"""``train engine=verl`` on a CPU host: everything verl needs is prepared and checked, then the
run stops before verl's trainer would wait for GPUs this host does not have.

The backbone is a tiny Qwen2-architecture checkpoint built here, saved as a local folder (what a
cluster user points ``backbone.path`` at); the data is the synthetic split.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.skip_policy import require

require("verl", reason="needs the verl extra")
pytestmark = pytest.mark.verl

from mlflow.tracking import MlflowClient  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from slca_exp.engines.verl.tracker_runs import RUN_IDS_FILE, tracker_env  # noqa: E402

SMALL = [
    "engine=verl",
    "backbone.source=local",
    "backbone.name=tiny-local",
    "engine.sft.enabled=false",
    "engine.verl.n_gpus_per_node=1",
    "engine.verl.tensor_model_parallel_size=1",
    "engine.verl.train_batch_size=4",
    "engine.verl.ppo_mini_batch_size=4",
    "engine.verl.max_response_length=512",
]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A tiny HF checkpoint folder (config, weights, tokenizer with our chat template)."""
    from omegaconf import OmegaConf as OC

    from slca_exp.backbones.tiny import build_tiny
    from slca_exp.config.schema import BackboneConfig, TinyArchConfig

    root = tmp_path_factory.mktemp("tiny")
    cfg = OC.structured(BackboneConfig(name="tiny", source="builtin", arch=TinyArchConfig()))
    texts = ["<tool_call> get_weather city Paris </tool_call> It is sunny in Paris."] * 20
    build_tiny(cfg, corpus=lambda: texts, cache_root=root, seed=0)
    (folder,) = [p for p in (root / "backbones").iterdir() if p.is_dir()]  # not its lock file
    return folder


TASK = "import sys; from slca_exp.train import main; sys.argv[0] = 'slca-exp'; main()"
"""The Hydra task of ``slca-exp train`` alone, as a submitted job runs it: the command line
refuses this recipe here before anything starts (its jobs would run here, without the GPUs),
so the task shows what the job itself prepares before verl's trainer would wait for them."""


@pytest.fixture(scope="module")
def cpu_run(tiny_folder, tmp_path_factory):
    """``engine=verl ...`` as a job runs it, on this GPU-less host."""
    work = tmp_path_factory.mktemp("verl-run")
    env = {**os.environ, "SLCA_EXP_ROOT": str(work / "out")}
    res = subprocess.run(
        [sys.executable, "-c", TASK, *SMALL, f"backbone.path={tiny_folder}"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    (verl_dir,) = (work / "out" / "runs").glob("*/verl")
    return res, verl_dir, work / "out"


def test_it_stops_before_verl_would_wait_for_gpus_naming_the_key(cpu_run):
    # (the command line refuses it before anything starts: tests/engines/test_bad_configs_on_cpu.py)
    res, _, _ = cpu_run
    assert res.returncode == 2, res.stderr[-3000:]
    assert "engine.verl.n_gpus_per_node" in res.stderr
    assert "this host has 0" in res.stderr and "wait for them forever" in res.stderr


def test_everything_verl_reads_is_written_and_points_at_our_run(cpu_run):
    _, verl_dir, out = cpu_run
    names = {p.relative_to(verl_dir).as_posix() for p in verl_dir.rglob("*") if p.is_file()}
    assert names == {
        "ppo_trainer.yaml",
        "agent_loops.yaml",
        "tools.yaml",
        "data/train.parquet",
        "data/val.parquet",
        RUN_IDS_FILE,
    }
    cfg = OmegaConf.load(verl_dir / "ppo_trainer.yaml")
    ids = json.loads((verl_dir / RUN_IDS_FILE).read_text())
    env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert ids["mlflow"] == env.MLFLOW_RUN_ID
    assert env.VERL_USE_EXTERNAL_MODULES == "slca_exp.engines.verl.plugin"
    assert cfg.trainer.v1.trainer_mode == "slca_sync"
    assert cfg.data.train_files == str(verl_dir / "data" / "train.parquet")
    # one MLflow run: ours, with the recipe, FAILED because the run could not start
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert [r.info.run_id for r in runs] == [ids["mlflow"]]
    assert runs[0].info.status == "FAILED"


def test_verls_dataset_reads_the_data_copy_with_each_rows_tool_context(cpu_run, tiny_folder):
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    _, verl_dir, _ = cpu_run
    cfg = OmegaConf.load(verl_dir / "ppo_trainer.yaml")
    tools = {t.tool_schema.function.name for t in OmegaConf.load(verl_dir / "tools.yaml").tools}
    tokenizer = AutoTokenizer.from_pretrained(tiny_folder)
    data = RLHFDataset(str(verl_dir / "data" / "train.parquet"), tokenizer, cfg.data)
    row = data[3]
    assert set(row["tools_kwargs"]) == tools  # every tool of the split, none missing (no nulls)
    context = row["tools_kwargs"][sorted(tools)[0]]["create_kwargs"]
    assert context["question"] == row["reward_model"]["ground_truth"]["question_content"]
    assert json.loads(context["tool_responses"])  # the recorded responses the replay answers


def test_verls_mlflow_logger_writes_into_the_run_that_holds_the_recipe(cpu_run, monkeypatch):
    from verl.utils.tracking import Tracking

    _, verl_dir, out = cpu_run
    ids = json.loads((verl_dir / RUN_IDS_FILE).read_text())
    uri = f"sqlite:///{out / 'mlflow.db'}"
    for key, value in tracker_env(ids, {"MLFLOW_TRACKING_URI": uri}).items():
        monkeypatch.setenv(key, value)
    tracking = Tracking("slca-exp", "verl-run", default_backend=["mlflow"], config={"a": 1})
    tracking.log({"adv/tool/mean": 0.25, "actor/pg_loss": 0.5}, step=1)
    tracking.finish()
    client = MlflowClient(uri)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert [r.info.run_id for r in runs] == [ids["mlflow"]]  # no second run
    run = runs[0]
    assert run.data.metrics["adv/tool/mean"] == 0.25 and "actor/pg_loss" in run.data.metrics
    assert any(key.startswith("slca.") for key in run.data.tags)  # still the recipe's run


def test_the_sft_stage_logs_into_a_child_of_the_recipes_run(cpu_run, tiny_folder, monkeypatch):
    from verl.utils.tracking import Tracking

    from slca_exp.engines.verl.tracker_runs import sft_env
    from slca_exp.preflight.compose import compose_run
    from slca_exp.preflight.validate import validate

    _, verl_dir, out = cpu_run
    monkeypatch.setenv("SLCA_EXP_ROOT", str(out))
    config = validate(compose_run([*SMALL, f"backbone.path={tiny_folder}"]))
    ids = json.loads((verl_dir / RUN_IDS_FILE).read_text())
    uri = f"sqlite:///{out / 'mlflow.db'}"
    rl_env = tracker_env({**ids, "wandb": "w1"}, {"MLFLOW_TRACKING_URI": uri})
    env, child = sft_env(config, rl_env)
    assert env["MLFLOW_RUN_ID"] == child != ids["mlflow"]
    assert "WANDB_RUN_ID" not in env and "WANDB_RESUME" not in env
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # verl logs its whole config as parameters: the SFT trainer's differ from the RL trainer's
    sft = Tracking("slca-exp", "run-sft", ["mlflow"], config={"trainer": {"total_epochs": 200}})
    sft.log({"train/loss": 1.5}, step=1)
    sft.finish()
    client = MlflowClient(uri)
    run = client.get_run(child)
    assert run.data.tags["mlflow.parentRunId"] == ids["mlflow"]
    assert run.data.tags["slca.stage"] == "sft" and run.info.run_name.endswith("-sft")
    assert run.data.metrics["train/loss"] == 1.5
    assert run.data.params["trainer/total_epochs"] == "200"
    assert "train/loss" not in client.get_run(ids["mlflow"]).data.metrics


def test_ids_noted_as_the_runs_open_are_resumed_until_the_run_finishes(
    tiny_folder, tmp_path, monkeypatch
):
    from slca_exp.engines.verl.engine import VerlEngine
    from slca_exp.engines.verl.tracker_runs import FINISHED_FILE
    from slca_exp.engines.verl.translation import verl_dir
    from slca_exp.preflight.compose import compose_run
    from slca_exp.preflight.validate import validate

    monkeypatch.setenv("SLCA_EXP_ROOT", str(tmp_path / "out"))
    config = validate(compose_run([*SMALL, f"backbone.path={tiny_folder}"]))
    engine = VerlEngine()
    assert engine.resume_ids(config) is None
    engine.remember_run_ids(config, {"mlflow": "run-1"})  # the job stops before verl starts
    assert engine.resume_ids(config) == {"mlflow": "run-1"}  # its requeue continues that run
    (verl_dir(config) / FINISHED_FILE).write_text("")
    assert engine.resume_ids(config) is None  # a finished run is not continued
    engine.remember_run_ids(config, {"mlflow": "run-2"})  # the same recipe run once more
    assert not (verl_dir(config) / FINISHED_FILE).exists()
    assert engine.resume_ids(config) == {"mlflow": "run-2"}
