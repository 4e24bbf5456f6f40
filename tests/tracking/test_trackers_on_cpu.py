import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from omegaconf import OmegaConf

from slca_exp.core import names
from slca_exp.core.process import global_rank
from slca_exp.preflight.compose import compose_run
from slca_exp.preflight.validate import validate
from slca_exp.recipe import build_recipe
from slca_exp.tracking.base import MultiTracker, tracked_run
from slca_exp.tracking.build import TRACKERS, build_tracker
from slca_exp.tracking.console import ConsoleTracker
from slca_exp.tracking.mlflow import (
    MAX_PARAM_VALUE,
    MlflowTracker,
    flatten_params,
    get_or_create_experiment,
    mlflow_key,
    store_uri,
)
from slca_exp.tracking.plots import History, plot_curves, render_run_plots
from slca_exp.tracking.redact import REDACTED, Redactor
from slca_exp.tracking.spool import Spool, StepRecord
from tests.tracking.synthetic import step_metrics


def run_config(tmp_path, *overrides):
    cfg = compose_run([f"tracking.root={tmp_path / 'out'}", *overrides])
    config = validate(cfg)
    return cfg, config, build_recipe(config)


def only_run(client):
    exp = client.get_experiment_by_name("slca-exp")
    (run,) = client.search_runs([exp.experiment_id])
    return run


def test_mlflow_run_has_tags_params_artifacts_and_every_step(tmp_path, monkeypatch):
    monkeypatch.setenv("SLCA_EXP_PARENT_RUN_ID", "")
    cfg, config, recipe = run_config(tmp_path)
    params = OmegaConf.to_container(cfg, resolve=True)
    params["extra"] = {f"p{i}": i for i in range(150)}  # more than one batch of 100
    params["long"] = "x" * (MAX_PARAM_VALUE + 500)
    tracker = build_tracker(config, recipe, Redactor(), rank=0)
    with tracked_run(tracker, recipe, params):
        for step in range(3):
            metrics, result = step_metrics(step)
            tracker.log_metrics(metrics, step)
    assert store_uri(config.tracking) == f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}"
    client = MlflowClient(store_uri(config.tracking))
    run = only_run(client)
    assert run.info.status == "FINISHED"
    assert {k: v for k, v in run.data.tags.items() if k.startswith("slca.")} == recipe.tags()
    assert run.data.params["extra.p149"] == "149"
    assert run.data.params["reward.tool_weights.parallel"] == "0.3"
    assert len(run.data.params["long"]) == MAX_PARAM_VALUE
    assert run.data.params["long"].endswith(f"[truncated {MAX_PARAM_VALUE + 500} chars]")
    assert set(run.data.metrics) == {mlflow_key(k) for k in metrics}
    assert "val/success_at_0.9" in run.data.metrics
    for key in run.data.metrics:
        history = client.get_metric_history(run.info.run_id, key)
        assert sorted(m.step for m in history) == [0, 1, 2]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"recipe.json", "config.yaml", "plots"} <= artifacts
    local = Path(client.download_artifacts(run.info.run_id, "recipe.json", str(tmp_path)))
    assert json.loads(local.read_text())["fingerprint"] == recipe.fingerprint
    plots = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert "plots/reward_curves.png" in plots
    # Artifacts live under the output root, not in ./mlruns of the working folder.
    assert run.info.artifact_uri.startswith((tmp_path / "out" / "mlartifacts").as_uri())


def test_a_child_run_names_its_parent(tmp_path, monkeypatch):
    cfg, config, recipe = run_config(tmp_path)
    client = MlflowClient(store_uri(config.tracking))
    experiment = get_or_create_experiment(client, "slca-exp", tmp_path / "out")
    parent = client.create_run(experiment).info.run_id
    monkeypatch.setenv("SLCA_EXP_PARENT_RUN_ID", parent)
    tracker = MlflowTracker(config.tracking, "child", Redactor())
    tracker.start(recipe, {})
    tracker.finish("FINISHED")
    child = client.get_run(tracker.run_id)
    assert child.data.tags["mlflow.parentRunId"] == parent


def test_secret_keys_in_params_never_reach_the_store(tmp_path):
    secret = "planted-secret-4242"
    cfg, config, recipe = run_config(tmp_path)
    params = OmegaConf.to_container(cfg, resolve=True)
    params["judge"]["api_key"] = secret
    tracker = build_tracker(config, recipe, Redactor(), rank=0)
    with tracked_run(tracker, recipe, params):
        tracker.log_metrics(step_metrics(0)[0], 0)
    run = only_run(MlflowClient(store_uri(config.tracking)))
    assert run.data.params["judge.api_key"] == REDACTED
    for path in (tmp_path / "out").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_failed_and_killed_runs_are_closed_with_their_status(tmp_path):
    cfg, config, recipe = run_config(tmp_path)
    tracker = build_tracker(config, recipe, Redactor(), rank=0)
    with pytest.raises(RuntimeError), tracked_run(tracker, recipe, {}):
        tracker.log_metrics(step_metrics(0)[0], 0)
        raise RuntimeError("boom")
    tracker2 = build_tracker(config, recipe, Redactor(), rank=0)
    with pytest.raises(KeyboardInterrupt), tracked_run(tracker2, recipe, {}):
        raise KeyboardInterrupt
    client = MlflowClient(store_uri(config.tracking))
    exp = client.get_experiment_by_name("slca-exp")
    statuses = sorted(r.info.status for r in client.search_runs([exp.experiment_id]))
    assert statuses == ["FAILED", "KILLED"]


def test_only_rank_zero_logs(tmp_path, monkeypatch):
    # The synthetic split goes elsewhere: every rank builds the recipe, which generates it.
    cfg, config, recipe = run_config(tmp_path, f"data.dir={tmp_path / 'data'}")
    assert global_rank({"SLURM_PROCID": "3"}) == 3
    assert global_rank({"RANK": "0", "SLURM_PROCID": "2"}) == 0
    assert global_rank({}) == 0
    monkeypatch.setenv("RANK", "1")
    tracker = build_tracker(config, recipe, Redactor())
    with tracked_run(tracker, recipe, {}):
        tracker.log_metrics(step_metrics(0)[0], 0)
    assert tracker.trackers == [] and not (tmp_path / "out").exists()


def test_trackers_are_registry_entries_imported_when_built_and_plots_go_where_files_are_kept(
    tmp_path,
):
    assert {n: TRACKERS.get(n).keeps_files for n in TRACKERS} == {
        "console": False,
        "mlflow": True,
        "wandb": True,
    }
    _, config, recipe = run_config(tmp_path, "tracking.backends=[console]")
    tracker = build_tracker(config, recipe, Redactor(), rank=0)
    assert [type(t) for t in tracker.trackers] == [ConsoleTracker] and not tracker.plots
    # The registry imports no backend: validating a recipe never pays for MLflow or W&B.
    code = "import sys, slca_exp.tracking; print(sorted({'mlflow', 'wandb'} & set(sys.modules)))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"


def test_console_prints_a_compact_table():
    out = io.StringIO()
    console = ConsoleTracker(every=2, stream=out)
    cfg = compose_run([])
    console.start(build_recipe(validate(cfg)), {})
    for step in range(5):
        console.log_metrics(step_metrics(step)[0], step)
    console.finish("FINISHED")
    lines = out.getvalue().splitlines()
    assert "estimator=slca_grpo" in lines[0]
    assert lines[1].split()[:3] == ["step", "R_total", "R_tool"]
    assert [line.split()[0] for line in lines[2:-1]] == ["0", "2", "4"]
    assert lines[-1] == "slca-exp: run FINISHED"


def test_flatten_params_handles_lists_none_and_empty_mappings():
    flat = flatten_params({"a": {"b": [1, "x"], "c": None}, "d": {}, "e": 1.5})
    assert flat == {"a.b": '[1, "x"]', "a.c": "null", "d": "{}", "e": "1.5"}


def test_spool_replays_in_order_and_resumes_after_a_failure(tmp_path):
    spool = Spool(tmp_path / "run.jsonl")
    for step in range(4):
        spool.append(StepRecord(step, 1000 + step, {"a": float(step)}))
    sent = []

    def flaky(record):
        if record.step == 2 and not sent.count("failed"):
            sent.append("failed")
            raise ConnectionError("down")
        sent.append(record.step)

    with pytest.raises(ConnectionError):
        spool.replay(flaky)
    assert len(spool) == 2 and len(Spool(spool.path)) == 2
    assert spool.replay(flaky) == 2
    assert sent == [0, 1, "failed", 2, 3]
    assert len(spool) == 0 and not spool.path.exists()


def test_end_of_run_plots(tmp_path):
    history = History()
    for step in range(4):
        metrics, result = step_metrics(step)
        history.add_metrics(metrics, step)
        from slca_exp.tracking.plots import advantage_samples

        history.add_advantages(advantage_samples(result), step)
    files = render_run_plots(history, tmp_path)
    assert {f.name for f in files} == {
        "reward_curves.png",
        "segment_curves.png",
        "advantage_histograms.png",
    }
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in files)
    runs = {"a": history.metrics, "b": {}}
    assert plot_curves(runs, [names.adv("tool", "mean")], tmp_path / "c.png") is not None
    assert plot_curves(runs, ["not/a/metric"], tmp_path / "none.png") is None


def test_a_backend_that_cannot_start_closes_the_others(tmp_path):
    closed = []

    class Ok:
        def start(self, recipe, params):
            pass

        def finish(self, status):
            closed.append(status)

    class Broken(Ok):
        def start(self, recipe, params):
            raise OSError("no disk")

    multi = MultiTracker([Ok(), Broken()], plots=False)
    with pytest.raises(OSError):
        multi.start(None, {})
    assert closed == ["FAILED"]


def test_a_spool_left_at_finish_is_replayed_by_the_replay_command(tmp_path, capsys):
    from slca_exp.tracking.replay import main as replay_main

    cfg, config, recipe = run_config(tmp_path, "tracking.flush_timeout_s=0")
    tracker = MlflowTracker(config.tracking, "offline", Redactor())
    tracker.start(recipe, {})
    tracker.log_metrics(step_metrics(0)[0], 0)
    real_client = tracker.client

    class Down:
        def __getattr__(self, name):
            raise ConnectionError("server away")

    tracker.client = Down()  # the server goes away: later steps and the close are kept
    for step in (1, 2):
        tracker.log_metrics(step_metrics(step)[0], step)
    tracker.finish("FAILED")
    assert "replay them with" in capsys.readouterr().out
    assert tracker.spool.path.with_suffix(".status").read_text() == "FAILED"
    assert real_client.get_run(tracker.run_id).info.status == "RUNNING"

    assert replay_main([str(tracker.spool.path), "--uri", tracker.uri]) == 0
    run = real_client.get_run(tracker.run_id)
    assert run.info.status == "FAILED"
    steps = [m.step for m in real_client.get_metric_history(tracker.run_id, "adv/tool/mean")]
    assert sorted(steps) == [0, 1, 2]
    assert not tracker.spool.path.exists()
