"""A sweep run again finishes what it left, under the same parent run (the local launcher).

Its study file restores it into another store, where the same command line resumes it.

The kill is real: SIGTERM to the sweep's process group while its third job trains, as a
time limit or Ctrl-C would stop it.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from mlflow.tracking import MlflowClient

from slca_exp.core.tags import (
    ATTEMPTS,
    COPY_OF,
    JOB,
    PARENT_ROLE,
    PARENT_RUN,
    RESUMED,
    ROLE,
    SUPERSEDED_BY,
    SWEEP,
    attempt_tag,
    moved_tag,
)
from slca_exp.tracking.adopt import adopt
from tests.engines.test_engine_runs_on_cpu import TINY

pytestmark = pytest.mark.slow

EXE = str(Path(sys.executable).parent / "slca-exp")
SWEEP_ARGS = [  # 4 jobs, in Hydra's order: (grpo, 0), (grpo, 1), (slca_grpo, 0), (slca_grpo, 1)
    "-m",
    "algorithm=grpo,slca_grpo",
    "seed=0,1",
    *(o for o in TINY if not o.startswith("engine.checkpoint_every=")),
    "engine.checkpoint_every=1",
    "engine.rl.steps=12",
    "tracking.root=out",
    "hydra.sweep.dir=multirun",
]


def _env():
    return {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}


def _store(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    parents = [r for r in runs if r.data.tags.get(ROLE) == PARENT_ROLE]
    children = [r for r in runs if r.data.tags.get(PARENT_RUN)]
    return client, parents, children


def _slca_exp(tmp_path, *args):
    """``slca-exp ARGS`` in ``tmp_path``, as a user types it there."""
    return subprocess.run(
        [EXE, *args], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600
    )


def _kill_during_third_job(tmp_path):
    """Start the sweep; SIGTERM its process group once the third job has logged a step."""
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen(
        [EXE, "train", *SWEEP_ARGS],
        cwd=tmp_path,
        env=_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a shell gives a command
    )
    deadline = time.time() + 300
    try:
        while time.time() < deadline:
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            if "SLCA_EXP_JOB_NUM=2" in (tmp_path / "first.log").read_text():
                _, _, children = _store(tmp_path)
                third = [r for r in children if JOB not in r.data.tags]
                if third and "train/loss" in third[0].data.metrics:
                    break
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    return proc.returncode, (tmp_path / "first.log").read_text()


def test_a_killed_sweep_run_again_runs_only_its_unfinished_jobs_under_the_same_parent(tmp_path):
    code, first = _kill_during_third_job(tmp_path)
    assert code != 0, first[-3000:]
    client, (parent,), children = _store(tmp_path)
    assert parent.info.status == "FAILED"
    by_status = sorted((r.info.status, r.data.tags.get(JOB)) for r in children)
    assert by_status == [("FINISHED", "0"), ("FINISHED", "1"), ("KILLED", None)], by_status
    killed = next(r for r in children if r.info.status == "KILLED").info.run_id
    finished = {r.data.tags[JOB]: r for r in children if r.info.status == "FINISHED"}

    # --dry-run says what running the same command line again does
    planned = _slca_exp(tmp_path, "train", "--dry-run", *SWEEP_ARGS)
    assert planned.returncode == 0, planned.stderr[-3000:]
    said = f"this resumes sweep {parent.data.tags[SWEEP]} (attempt 2): jobs to run 2, 3; 2 FINISHED"
    assert said in planned.stdout, planned.stdout[-3000:]
    _restored_elsewhere_plans_the_same_jobs(tmp_path, parent.data.tags[SWEEP], said)
    again = _slca_exp(tmp_path, "train", *SWEEP_ARGS)  # the same command line
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    assert "attempt 2: 2 of 4 jobs to run (2, 3); 2 finished before and kept" in out, out[-3000:]
    launched = [x for x in out.splitlines() if "[HYDRA] \t#" in x]
    assert [x.rsplit("SLCA_EXP_JOB_NUM=", 1)[1] for x in launched] == ["2", "3"], launched
    assert "made no MLflow child run" not in out and "not of this sweep" not in out
    client, parents, children = _store(tmp_path)
    assert [p.info.run_id for p in parents] == [parent.info.run_id]  # the same sweep
    parent = client.get_run(parent.info.run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags[ATTEMPTS] == "2"
    record = json.loads(parent.data.tags[attempt_tag(2)])
    assert record["run"] == [2, 3] and sorted(record["skipped"]) == ["0", "1"]
    assert len(children) == 4 and all(r.info.status == "FINISHED" for r in children)
    jobs = {r.data.tags[JOB]: r for r in children}
    assert sorted(jobs) == ["0", "1", "2", "3"]
    assert jobs["2"].info.run_id == killed and jobs["2"].data.tags[RESUMED] == "true"
    for num in ("0", "1"):  # not trained again
        assert jobs[num].info.end_time == finished[num].info.end_time
    history = [m.step for m in client.get_metric_history(killed, "train/loss")]
    assert sorted(history) == list(range(1, 13))  # the resumed job: every step once
    for num, run in sorted(jobs.items()):
        assert f"job {num}: COMPLETED, MLflow run {run.info.run_id}" in out
    assert (tmp_path / "multirun" / "3").is_dir()  # each job in its own numbered folder

    sweep = parent.data.tags[SWEEP]
    compare = _slca_exp(tmp_path, "compare", sweep, "--tracking-uri", "sqlite:///out/mlflow.db")
    assert compare.returncode == 0, compare.stderr[-3000:]
    rows = [x.split() for x in compare.stdout.splitlines() if x.split()[:2] == ["2", "0,1"]]
    assert sorted(r[2] for r in rows) == ["grpo", "slca_grpo"], compare.stdout  # 2 seeds each
    assert "paired t" in compare.stdout

    resumed = _slca_exp(
        tmp_path, "train", "--resume", sweep, "--tracking-uri", "sqlite:///out/mlflow.db"
    )
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert f"sweep {sweep}: all 4 jobs FINISHED before" in out and "nothing to run" in out
    assert len(_store(tmp_path)[2]) == 4


def _restored_elsewhere_plans_the_same_jobs(tmp_path, sweep, said):
    """The killed sweep's study file, restored into a store in another folder: the same command
    line there plans the same attempt; with a data file changed there, every job runs again and
    the plan says which recorded field differs."""
    saved = _slca_exp(
        tmp_path,
        "compare",
        sweep,
        "--tracking-uri",
        "sqlite:///out/mlflow.db",
        "--save-study",
        "killed.json.gz",
    )
    assert saved.returncode == 0, saved.stderr[-3000:]
    there = tmp_path / "elsewhere"
    there.mkdir()
    args = (
        "restore",
        str(tmp_path / "killed.json.gz"),
        "--tracking-uri",
        "sqlite:///out/mlflow.db",
    )
    restored = _slca_exp(there, *args)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert f"restored sweep {sweep} into sqlite:///{there / 'out' / 'mlflow.db'}" in restored.stdout
    assert "2 runs (2 FINISHED)" in restored.stdout, restored.stdout  # the killed one had no job
    assert "slca-exp train -m algorithm=grpo,slca_grpo seed=0,1" in restored.stdout
    twice = _slca_exp(there, *args)
    assert twice.returncode == 2 and f"already holds sweep {sweep}" in twice.stderr, twice.stderr

    planned = _slca_exp(there, "train", "--dry-run", *SWEEP_ARGS)
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert said in planned.stdout, planned.stdout[-3000:]
    assert "run again" not in planned.stderr, planned.stderr[-3000:]
    client, (copy,), children = _store(there)
    assert copy.data.tags[COPY_OF] != copy.info.run_id and copy.data.tags[SWEEP] == sweep
    assert sorted(r.data.tags[JOB] for r in children) == ["0", "1"]

    # the same rows written with other bytes: the recorded sha256 no longer matches
    (val,) = (there / "out" / "data").rglob("val.parquet")
    pq.write_table(pq.read_table(val), val, row_group_size=1, compression="none")
    planned = _slca_exp(there, "train", "--dry-run", *SWEEP_ARGS)
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert "(attempt 2): jobs to run 0, 1, ..., 3 (4 jobs); 0 FINISHED" in planned.stdout
    note = next(x for x in planned.stderr.splitlines() if "run again" in x)
    assert f"2 FINISHED jobs of sweep {sweep} run again (0, 1)" in note, note
    assert "job 0 (run " in note and "differs in data.files.val.sha256. " in note, note


def test_a_run_resumed_by_another_sweep_moves_to_it_and_the_old_parent_says_where(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    old = client.create_run(experiment, tags={ROLE: PARENT_ROLE, SWEEP: "a"}).info.run_id
    new = client.create_run(experiment, tags={ROLE: PARENT_ROLE, SWEEP: "b"}).info.run_id
    run = client.create_run(experiment, tags={PARENT_RUN: old, SWEEP: "a"}).info.run_id
    assert adopt(client, run, old, "a") is None  # its own sweep resumed it: nothing moves
    assert adopt(client, run, new, "b") == old
    tags = client.get_run(run).data.tags
    assert (tags[PARENT_RUN], tags[SWEEP]) == (new, "b")
    moved = json.loads(client.get_run(old).data.tags[moved_tag(run)])
    assert moved == {"parent_run_id": new, "sweep": "b"}
    assert adopt(client, run, None, None) is None  # no sweep now: it stays where it is
    assert SUPERSEDED_BY not in tags


def test_a_job_run_again_in_a_new_run_supersedes_its_earlier_one(tmp_path):
    from slca_exp.launch.resume import latest_runs, supersede
    from slca_exp.tracking.sweep_runs import children

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    parent = client.create_run(experiment, tags={ROLE: PARENT_ROLE, SWEEP: "a"}).info.run_id
    runs = {}
    for label, job in (("first", "1"), ("other", "0"), ("second", "1")):
        tags = {PARENT_RUN: parent, JOB: job}
        runs[label] = client.create_run(experiment, tags=tags).info.run_id
    supersede(client, experiment, parent, 1, runs["second"])
    assert client.get_run(runs["first"]).data.tags[SUPERSEDED_BY] == runs["second"]
    assert SUPERSEDED_BY not in client.get_run(runs["other"]).data.tags
    kept = [r.info.run_id for r in children(client, experiment, parent)]
    assert kept == [runs["other"], runs["second"]]
    assert len(children(client, experiment, parent, superseded=True)) == 3
    latest = latest_runs(client, client.get_run(parent))
    latest_ids = {num: r.info.run_id for num, r in latest.items()}
    assert latest_ids == {0: runs["other"], 1: runs["second"]}
