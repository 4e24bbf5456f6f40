"""The sweep callback: called directly (Hydra turns callback exceptions into warnings), then
through a real 2x2 multirun of ``slca-exp train -m`` and a real failing sweep in a subprocess."""

import csv
import io
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from mlflow.tracking import MlflowClient
from omegaconf import open_dict

from slca_exp.launch.sweep import MlflowSweepCallback
from slca_exp.preflight.compose import expand_sweeps, hydra_context
from slca_exp.tracking import sweep_runs
from slca_exp.tracking.sweep_runs import ENV_PARENT_RUN_ID, ENV_SWEEP_ID, split_overrides
from tests.tracking.sweeps import GRID, shared_sweep

REPO = Path(__file__).resolve().parents[2]


def compose(overrides):
    """The config Hydra hands to callbacks in a multirun (with the hydra node)."""
    loader = GlobalHydra.instance().config_loader()
    return loader.load_configuration("config", list(overrides), run_mode=RunMode.MULTIRUN)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLCA_EXP_ROOT", str(tmp_path / "root"))
    for key in (ENV_PARENT_RUN_ID, ENV_SWEEP_ID):
        monkeypatch.delenv(key, raising=False)
    with hydra_context():
        yield tmp_path / "root"


def run_jobs(callback, grid, statuses=None, log_child=True):
    """Play the jobs of ``grid`` through a pickled copy of the callback, as submitit does."""
    job_callback = pickle.loads(pickle.dumps(callback))
    client = MlflowClient(callback.tracking_uri)
    seen = []
    for num, overrides in enumerate(expand_sweeps(grid)):
        config = compose(overrides)
        with open_dict(config):
            config.hydra.job.num = num
        job_callback.on_job_start(config, task_function=None)
        seen.append((os.environ.get(ENV_PARENT_RUN_ID), os.environ.get(ENV_SWEEP_ID)))
        if log_child:  # what the MLflow tracker does with the env var
            run = client.create_run(
                callback.experiment_id,
                tags={"mlflow.parentRunId": os.environ[ENV_PARENT_RUN_ID]},
            )
            client.log_metric(run.info.run_id, "reward/total/mean", 0.5 + num)
            client.set_terminated(run.info.run_id)
        ret = JobReturn()
        ret.status = (statuses or {}).get(num, JobStatus.COMPLETED)
        ret.return_value = {"job": num} if ret.status == JobStatus.COMPLETED else ValueError("x")
        job_callback.on_job_end(config, ret)
        assert ENV_PARENT_RUN_ID not in os.environ and ENV_SWEEP_ID not in os.environ
    return seen


def summary(client, run_id):
    path = client.download_artifacts(run_id, "sweep_summary.csv")
    return list(csv.DictReader(io.StringIO(Path(path).read_text())))


def test_split_overrides_uses_hydra_sweep_syntax():
    swept, fixed = split_overrides(["a=1,2", "b=range(0,3)", "c=choice(x,y)", "d=3", "~e"])
    assert swept == {"a": "1,2", "b": "range(0,3)", "c": "choice(x,y)"}
    assert fixed == {"d": "3"}


def test_parent_run_has_swept_params_and_sweep_tags(store):
    cfg = compose([*GRID, "seed=7"])
    callback = MlflowSweepCallback(sweep_id="study-1")
    callback.on_multirun_start(cfg)
    assert callback.tracking_uri == f"sqlite:///{store / 'mlflow.db'}"
    client = MlflowClient(callback.tracking_uri)
    parent = client.get_run(callback.parent_run_id)
    assert parent.info.status == "RUNNING" and parent.info.run_name == "study-1"
    assert parent.data.params["algorithm"] == "grpo,slca_grpo"
    assert parent.data.params["reward.tool_weights.parallel"] == "0.1,0.3"
    assert parent.data.params["seed"] == "7"
    tags = parent.data.tags
    assert tags["slca.sweep"] == "study-1" and tags["slca.role"] == "parent"
    assert tags["slca.swept"] == '["algorithm", "reward.tool_weights.parallel"]'
    assert tags["slca.expected_jobs"] == "4"
    experiment = client.get_experiment(parent.info.experiment_id)
    assert experiment.name == "slca-exp"
    # artifacts beside the store, where the MLflow tracker puts them (not ./mlruns)
    assert experiment.artifact_location == (store / "mlartifacts").as_uri()
    callback.on_multirun_end(cfg)


def test_jobs_become_children_and_the_summary_lists_them(store):
    cfg = compose(GRID)
    callback = MlflowSweepCallback()
    callback.on_multirun_start(cfg)
    parent_id, sweep_id = callback.parent_run_id, callback.sweep_id
    assert sweep_id.startswith("slca-exp-")
    seen = run_jobs(callback, GRID)
    assert seen == [(parent_id, sweep_id)] * 4
    assert callback.jobs == {}  # the jobs ran on a pickled copy: records come from MLflow
    callback.on_multirun_end(cfg)
    client = MlflowClient(callback.tracking_uri)
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["slca.jobs.reported"] == "4"
    children = client.search_runs(
        [callback.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'"
    )
    assert len(children) == 4
    by_job = {int(r.data.tags["slca.job"]): r for r in children}
    assert by_job[3].data.tags["slca.swept.algorithm"] == "slca_grpo"
    assert by_job[3].data.tags["slca.swept.reward.tool_weights.parallel"] == "0.3"
    assert by_job[0].data.tags["slca.overrides"] == (
        "algorithm=grpo reward.tool_weights.parallel=0.1 reward.normalize=True"
    )
    assert {r.data.tags["slca.sweep"] for r in children} == {sweep_id}
    rows = summary(client, parent_id)
    assert [r["job"] for r in rows] == ["0", "1", "2", "3"]
    assert [r["run_id"] for r in rows] == [by_job[n].info.run_id for n in range(4)]
    assert {r["status"] for r in rows} == {"COMPLETED"}
    assert [float(r["reward/total/mean"]) for r in rows] == [0.5, 1.5, 2.5, 3.5]
    md = Path(client.download_artifacts(parent_id, "sweep_summary.md")).read_text()
    assert md.count("\n") == 2 + 4 and "| COMPLETED |" in md


def test_a_failed_job_ends_the_parent_failed(store):
    cfg = compose(GRID)
    callback = MlflowSweepCallback()
    callback.on_multirun_start(cfg)
    parent_id = callback.parent_run_id
    run_jobs(callback, GRID, statuses={2: JobStatus.FAILED})
    callback.on_multirun_end(cfg)
    client = MlflowClient(callback.tracking_uri)
    parent = client.get_run(parent_id)
    assert parent.info.status == "FAILED" and parent.data.tags["slca.jobs.failed"] == "1"
    rows = summary(client, parent_id)
    assert [r["status"] for r in rows] == ["COMPLETED", "COMPLETED", "FAILED", "COMPLETED"]


def test_jobs_that_never_report_end_the_parent_failed(store):
    cfg = compose(GRID)
    callback = MlflowSweepCallback()
    callback.on_multirun_start(cfg)
    parent_id = callback.parent_run_id
    run_jobs(callback, GRID[:1] + ["reward.tool_weights.parallel=0.1", "reward.normalize=true"])
    callback._end_if_open()  # the atexit hook: the multirun died before on_multirun_end
    parent = MlflowClient(callback.tracking_uri).get_run(parent_id)
    assert parent.info.status == "FAILED"
    assert parent.data.tags["slca.sweep_error"] == "the multirun stopped before all jobs returned"
    assert parent.data.tags["slca.jobs.reported"] == "2"


def test_a_job_without_an_mlflow_run_is_recorded_with_no_run(store):
    cfg = compose(GRID)
    callback = MlflowSweepCallback()
    callback.on_multirun_start(cfg)
    parent_id = callback.parent_run_id
    run_jobs(callback, GRID, log_child=False)
    callback.on_multirun_end(cfg)
    client = MlflowClient(callback.tracking_uri)
    assert client.get_run(parent_id).info.status == "FINISHED"
    assert {r["run_status"] for r in summary(client, parent_id)} == {"NO RUN"}


def test_parallel_jobs_find_their_own_child_run(store):
    cfg = compose(GRID)
    callback = MlflowSweepCallback()
    callback.on_multirun_start(cfg)
    client = MlflowClient(callback.tracking_uri)
    parent = {"mlflow.parentRunId": callback.parent_run_id}
    jobs = [["algorithm=grpo", "seed=1"], ["algorithm=slca_grpo", "seed=1"]]
    start = int(time.time() * 1000)
    named = {  # both started while both jobs ran: the tracker's run names tell them apart
        key: client.create_run(callback.experiment_id, run_name=name, tags=parent).info.run_id
        for key, name in (("a", "algorithm=grpo,seed=1"), ("b", "algorithm=slca_grpo,seed=1"))
    }
    found = [sweep_runs.find_child(client, None, callback.parent_run_id, start, j) for j in jobs]
    assert [r.info.run_id for r in found] == [named["a"], named["b"]]
    unnamed = {}  # no telling names (run_name set by the user): params decide
    for seed in ("3", "4"):
        run = client.create_run(callback.experiment_id, run_name="mine", tags=parent)
        client.log_param(run.info.run_id, "seed", seed)
        unnamed[seed] = run.info.run_id
    for run_id in named.values():
        client.set_tag(run_id, "slca.job", "0")  # claimed already
    run = sweep_runs.find_child(client, None, callback.parent_run_id, start, ["seed=4"])
    assert run.info.run_id == unnamed["4"]
    assert sweep_runs.find_child(client, None, callback.parent_run_id, start, ["x=1"]) is None
    callback.on_multirun_end(cfg)


def test_only_rank_zero_records_the_job(store, monkeypatch):
    cfg = compose(GRID)
    callback = MlflowSweepCallback()
    callback.on_multirun_start(cfg)
    monkeypatch.setenv("SLURM_PROCID", "1")
    run_jobs(callback, GRID[:1] + ["reward.normalize=true"])
    tags = MlflowClient(callback.tracking_uri).get_run(callback.parent_run_id).data.tags
    assert not [k for k in tags if k.startswith("slca.jobs.")]
    callback.on_multirun_end(cfg)


def test_secrets_in_overrides_never_reach_mlflow(store, monkeypatch):
    secret = "sk-planted-7f3a9c"
    monkeypatch.setenv("SLCA_TEST_API_TOKEN", secret)  # a secret-looking env var
    grid = [f"run_name={secret},plain", "seed=1,2"]
    cfg = compose(grid)
    callback = MlflowSweepCallback()
    callback.on_multirun_start(cfg)
    parent_id = callback.parent_run_id
    run_jobs(callback, grid)
    callback.on_multirun_end(cfg)
    client = MlflowClient(callback.tracking_uri)
    parent = client.get_run(parent_id)
    assert parent.data.params["run_name"] == "<redacted>,plain"
    assert "<redacted>" in parent.data.tags["slca.jobs.0000"]
    assert secret.encode() not in (store / "mlflow.db").read_bytes()
    for path in store.rglob("*"):
        assert not path.is_file() or secret.encode() not in path.read_bytes(), path


def test_nothing_happens_without_the_mlflow_backend_or_outside_a_multirun(store):
    callback = MlflowSweepCallback()
    cfg = compose([*GRID, "tracking=none"])
    callback.on_multirun_start(cfg)
    callback.on_job_start(cfg, task_function=None)
    callback.on_multirun_end(cfg)
    assert callback.parent_run_id is None and ENV_PARENT_RUN_ID not in os.environ
    assert not store.exists()  # no store, no run
    single = MlflowSweepCallback()
    single.on_job_start(compose(["seed=1"]), task_function=None)  # RUN mode: no parent
    assert ENV_PARENT_RUN_ID not in os.environ


def test_two_by_two_multirun_gives_one_parent_and_four_children(tmp_path_factory):
    sweep = shared_sweep(tmp_path_factory)
    assert sweep.parent.info.status == "FINISHED"
    assert len(sweep.children) == 4
    assert {c.info.status for c in sweep.children} == {"FINISHED"}
    combos = {
        (
            c.data.tags["slca.swept.algorithm"],
            c.data.tags["slca.swept.reward.tool_weights.parallel"],
        )
        for c in sweep.children
    }
    assert combos == {(a, w) for a in ("grpo", "slca_grpo") for w in ("0.1", "0.3")}
    for child in sweep.children:  # the tracker's recipe tags and the callback's, on one run
        assert child.data.tags["slca.sweep"] == sweep.sweep_id
        assert child.data.tags["slca.estimator"] == child.data.tags["slca.swept.algorithm"]
        assert "adv/tool/abs_mean" in child.data.metrics
    rows = summary(sweep.client, sweep.parent.info.run_id)
    assert sorted(r["run_id"] for r in rows) == sorted(c.info.run_id for c in sweep.children)


def test_a_failing_sweep_in_a_real_process_ends_its_parent_failed(tmp_path):
    """A job raises, Hydra's sweeper re-raises, ``on_multirun_end`` never runs: ``atexit`` does."""
    env = {**os.environ, "SLCA_EXP_ROOT": str(tmp_path / "root"), "SYNTH_FAIL_AT": "1"}
    res = subprocess.run(
        [sys.executable, str(REPO / "tests/tracking/run_train.py"), "train", "-m", "seed=1,2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode != 0, res.stdout + res.stderr
    client = MlflowClient(f"sqlite:///{tmp_path / 'root' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("slca-exp").experiment_id])
    parents = [r for r in runs if r.data.tags.get("slca.role") == "parent"]
    assert len(parents) == 1 and parents[0].info.status == "FAILED", res.stderr
    children = [r for r in runs if r.data.tags.get("slca.role") == "child"]
    assert len(children) == 2 and {c.info.status for c in children} == {"FAILED"}
    assert {c.data.tags["slca.job_status"] for c in children} == {"FAILED"}
    rows = summary(client, parents[0].info.run_id)
    assert [r["status"] for r in rows] == ["FAILED", "FAILED"]
