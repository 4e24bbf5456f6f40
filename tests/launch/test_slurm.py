"""Real jobs on a real SLURM (``.ci/slurm-up`` starts a one-node cluster on this host).

Every job goes through the CLI as a user submits it: ``slca-exp train -m launcher=slurm_cpu``,
hydra-submitit-launcher, sbatch, the job's own Python process on the node, MLflow.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.engines.test_engine_runs_on_cpu import TINY

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.usefixtures("slurm")]

REPO = Path(__file__).resolve().parents[2]
EXE = str(Path(sys.executable).parent / "slca-exp")
SMALL = [  # one CPU each (the profile asks for 2): more of the suite's jobs share the one node
    "launcher=slurm_cpu",
    "launcher.cpus_per_task=1",
    "launcher.mem_gb=2",
]
TINY_LOCAL = [  # the local engine at a size that runs a step in a fraction of a second
    *(o for o in TINY if not o.startswith("engine.checkpoint_every=")),
    "engine.checkpoint_every=5",
]


def _env(**extra):
    env = {**os.environ, "PYTHONPATH": str(REPO), **extra}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def submit(tmp_path, *overrides, env=None, wait=True, timeout=300):
    """``slca-exp train -m`` with the small SLURM profile; the sweep folder is ``multirun``."""
    args = [
        EXE,
        "train",
        "-m",
        *SMALL,
        *overrides,
        f"tracking.root={tmp_path / 'out'}",
        f"hydra.sweep.dir={tmp_path / 'multirun'}",
    ]
    kwargs = {"cwd": tmp_path, "env": env or _env(), "text": True}
    if not wait:
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)
    return subprocess.run(args, capture_output=True, timeout=timeout, **kwargs)


def mlflow_runs(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    parents = [r for r in runs if r.data.tags.get("slca.role") == "parent"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    return client, parents, children


def job_ids(tmp_path):
    """SLURM job ids (array elements as ``<array>_<i>``) in the sweep's submitit folder."""
    folder = tmp_path / "multirun" / ".submitit"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def logs(tmp_path):
    return "\n".join(
        p.read_text(errors="replace")
        for p in sorted((tmp_path / "multirun" / ".submitit").rglob("*_log.*"))
    )


def test_a_2x2_study_is_one_array_job_with_a_parent_and_four_children(tmp_path):
    # sweep=exec_control at a reduced size: {grpo, slca_grpo} x {hierr_paper, exec_outcome},
    # one seed, the local engine at toy size (the outcome judge's facts rule decides on CPU)
    res = submit(
        tmp_path,
        "sweep=exec_control",
        "experiment=smoke",
        "seed=0",
        *TINY_LOCAL,
        "engine.rl.steps=1",
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ids = job_ids(tmp_path)  # submitit's folders: the array job, then one per element
    (array,) = {i.split("_")[0] for i in ids}
    assert ids == [array, *(f"{array}_{k}" for k in range(4))]
    (script,) = (tmp_path / "multirun" / ".submitit").rglob("*_submission.sh")
    assert "#SBATCH --array=0-3%" in script.read_text()  # one array job of 4
    _, parents, children = mlflow_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 4 and all(r.info.status == "FINISHED" for r in children)
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    swept = {(r.data.params["algorithm.name"], r.data.params["reward.name"]) for r in children}
    assert swept == {(a, w) for a in ("grpo", "slca_grpo") for w in ("hierr_paper", "exec_outcome")}
    assert parents[0].data.tags["slca.study"] == "exec_control"
    outcome = [r for r in children if r.data.params["reward.name"] == "exec_outcome"]
    assert all("outcome/requests" in r.data.metrics for r in outcome)
    assert all("adv/tool/mean" in r.data.metrics for r in children)
    # The job ids and logs are named at submission and again in the closing block, each job's
    # train.log holds its slca-exp: lines, and sacct's own complaints stay off the console
    out = res.stdout + res.stderr
    for k in range(4):
        submitted = f"slca-exp: submitted SLURM job {array}_{k}, log: "
        (line,) = [x for x in out.splitlines() if x.startswith(submitted)]
        shown = line.split(", log: ")[1]  # named from the folder the command ran in
        log = tmp_path / shown
        assert shown == f"multirun/.submitit/{array}_{k}/{array}_{k}_0_log.out" and log.is_file()
        assert f"SLURM job {array}_{k}, log: {shown}" in out[out.rindex("---- where to look") :]
        logged = (tmp_path / "multirun" / str(k) / "train.log").read_text()
        assert f"slca-exp: SLURM job {array}_{k}, log: {shown}" in logged
    assert f"slca-exp: compare: slca-exp compare {parents[0].data.tags['slca.sweep']}" in out
    about = [x for x in out.splitlines() if "sacct" in x or "accounting" in x]
    assert len(about) <= 1 and all(x.startswith("slca-exp: ") for x in about), about


def test_a_time_limit_checkpoints_requeues_and_continues_the_same_run(tmp_path):
    # slurmctld checks time limits every 30 s and sends the --signal at the first check that
    # is less than 30 s before the signal time: with a 2-minute limit and the signal 30 s
    # before it, the signal arrives 60 to 90 s in, well after the run's start-up (up to 40 s
    # on a loaded machine). Each RL step of the first run is paced (at least 4 s), so that run
    # is in the middle of its 30 steps then, however fast this machine is; the requeued run
    # (released with a longer limit) does the rest at 0.5 s a step.
    steps = 30
    proc = submit(
        tmp_path,
        *TINY_LOCAL,
        "engine.name=paced_local",
        f"engine.rl.steps={steps}",
        "launcher.timeout_min=2",
        "launcher.signal_delay_s=30",
        env=_env(SLCA_EXP_PLUGINS="tests.launch.paced_plugin", PACE_S="4.0", PACE_RESUMED_S="0.5"),
        wait=False,
    )
    released, deadline = set(), time.time() + 480
    try:
        while proc.poll() is None and time.time() < deadline:
            time.sleep(1)
            for job in job_ids(tmp_path):
                res = subprocess.run(
                    ["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True
                )
                if res.stdout.split() == ["PENDING", "BeginTime"] and job not in released:
                    # SLURM holds a requeued job for two minutes: start it now, and give it the
                    # time to finish (a second signal would only requeue it once more).
                    subprocess.run(
                        ["scontrol", "update", f"jobid={job}", "StartTime=now", "TimeLimit=15"],
                        check=True,
                    )
                    released.add(job)
        out = proc.communicate(timeout=30)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            for job in job_ids(tmp_path):
                subprocess.run(["scancel", job])
    assert proc.returncode == 0, out[-3000:]
    text = logs(tmp_path)
    assert "this job is timed-out" in text, text[-3000:]
    assert "requeueing the job" in text
    assert "checkpointed at RL step" in text
    assert len(released) == 1
    client, parents, children = mlflow_runs(tmp_path)
    (run,) = children
    assert run.info.status == "FINISHED" and run.data.tags.get("slca.resumed") == "true"
    assert parents[0].info.status == "FINISHED"
    history = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
    assert sorted(history) == list(range(1, steps + 1))  # every step once, none repeated


def test_scancel_leaves_the_run_killed_not_running(tmp_path):
    proc = submit(
        tmp_path,
        "engine.name=synthetic",
        env=_env(
            SLCA_EXP_PLUGINS="tests.tracking.synthetic_plugin",
            SYNTH_STEPS="300",
            SYNTH_SLEEP_S="0.5",
        ),
        wait=False,
    )
    try:
        deadline = time.time() + 120
        while "step 2 logged" not in logs_or_empty(tmp_path) and time.time() < deadline:
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(1)
        (job,) = job_ids(tmp_path)[:1]
        subprocess.run(["scancel", job], check=True)
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, out[-2000:]
    _, parents, children = mlflow_runs(tmp_path)
    (run,) = children
    assert run.info.status == "KILLED"  # never left RUNNING
    assert parents[0].info.status == "FAILED"


def logs_or_empty(tmp_path):
    folder = tmp_path / "multirun" / ".submitit"
    return logs(tmp_path) if folder.is_dir() else ""


def test_a_two_task_job_boots_one_ray_cluster_that_rank_0_sees_whole(tmp_path):
    res = submit(
        tmp_path,
        "launcher.tasks_per_node=2",  # two tasks on the one host: two Ray nodes side by side
        "launcher.mem_gb=4",
        "engine.name=synthetic",
        env=_env(SLCA_EXP_PLUGINS="tests.tracking.synthetic_plugin", SYNTH_STEPS="3"),
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (job,) = job_ids(tmp_path)
    folder = tmp_path / "multirun" / ".submitit" / job
    rank0 = (folder / f"{job}_0_log.err").read_text()
    assert "Ray cluster up: 2/2 nodes" in rank0, rank0[-3000:]
    assert (folder / f"{job}_1_log.err").is_file()
    rendezvous = folder / f"ray-{job}"
    assert {p.name for p in rendezvous.iterdir()} >= {"head.json", "head.done", "rank1.joined"}
    _, parents, children = mlflow_runs(tmp_path)
    (run,) = children  # only rank 0 records
    assert run.info.status == "FINISHED" and parents[0].info.status == "FINISHED"


def test_a_failure_on_rank_1_fails_the_job_with_rank_1s_log_path(tmp_path):
    res = submit(
        tmp_path,
        "launcher.tasks_per_node=2",
        "launcher.mem_gb=4",
        "engine.name=synthetic",
        env=_env(
            SLCA_EXP_PLUGINS="tests.tracking.synthetic_plugin,tests.launch.fail_on_rank1",
            SYNTH_STEPS="3",
        ),
    )
    assert res.returncode != 0
    (job,) = job_ids(tmp_path)
    rank1_log = tmp_path / "multirun" / ".submitit" / job / f"{job}_1_log.err"
    out = res.stdout + res.stderr
    assert "rank 1" in out and str(rank1_log) in out, out[-3000:]
    assert "deliberate failure on rank 1" in rank1_log.read_text()
    _, parents, children = mlflow_runs(tmp_path)
    assert parents[0].info.status == "FAILED"
    assert all(r.info.status != "RUNNING" for r in children)


def _arrays(tmp_path):
    """The array jobs submitted into the sweep's folder so far, oldest first."""
    return sorted({i.split("_")[0] for i in job_ids(tmp_path)}, key=int)


def _array_spec(tmp_path, array):
    """The ``--array=...`` value of a job's submission script; ``None`` for a single job."""
    script = (tmp_path / "multirun" / ".submitit" / array / f"{array}_submission.sh").read_text()
    lines = [x for x in script.splitlines() if x.startswith("#SBATCH --array=")]
    return lines[0].removeprefix("#SBATCH --array=") if lines else None


def _queue_empty(arrays, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        res = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True)
        if not {x.split("_")[0] for x in res.stdout.split()} & set(arrays):
            return
        time.sleep(1)
    raise AssertionError(f"jobs of {arrays} still queued after {timeout} s")


def _finished(tmp_path):
    """Whether a job's run has FINISHED (the store opened under its lock: jobs create it)."""
    from slca_exp.tracking.store import open_client

    if not (tmp_path / "out" / "mlflow.db").exists():
        return False
    client = open_client(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    return any(r.info.status == "FINISHED" and r.data.tags.get("slca.job") for r in runs)


def _wait_for(condition, what, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_cancelled_array_then_a_failed_job_resume_as_smaller_arrays_of_one_sweep(tmp_path):
    # 4 jobs, one at a time: (grpo, 0), (grpo, 1), (slca_grpo, 0), (slca_grpo, 1)
    args = [
        "algorithm=grpo,slca_grpo",
        "seed=0,1",
        *TINY_LOCAL,
        "engine.rl.steps=2",
        "launcher.array_parallelism=1",
    ]
    outputs = []
    # 1. the whole array is cancelled (scancel) once its first job finished
    proc = submit(tmp_path, *args, wait=False)
    try:
        _wait_for(lambda: _finished(tmp_path), "the first job's run to finish")
        (first,) = _arrays(tmp_path)
        subprocess.run(["scancel", first], check=True)
        outputs.append(proc.communicate(timeout=180)[0])
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, outputs[-1][-3000:]
    assert _array_spec(tmp_path, first).startswith("0-3%")
    _queue_empty([first])
    # 2. the same command: jobs 1-3 as one array of 3; one of them is made to fail (its
    # element cancelled while it waits)
    proc = submit(tmp_path, *args, wait=False)
    try:
        _wait_for(lambda: len(_arrays(tmp_path)) == 2, "the second array")
        second = _arrays(tmp_path)[1]
        subprocess.run(["scancel", f"{second}_1"], check=True)  # element 1: job 2
        outputs.append(proc.communicate(timeout=300)[0])
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "attempt 2: 3 of 4 jobs to run (1, 2, 3)" in outputs[-1], outputs[-1][-3000:]
    assert _array_spec(tmp_path, second).startswith("0-2%")
    assert proc.returncode != 0
    _queue_empty([second])  # the element after the cancelled one still runs to the end
    # 3. the same command: the one job left, submitted alone (submitit gives a single job no
    # --array)
    before = set(job_ids(tmp_path))
    res = submit(tmp_path, *args)
    outputs.append(res.stdout + res.stderr)
    assert res.returncode == 0, outputs[-1][-3000:]
    assert "attempt 3: 1 of 4 jobs to run (2)" in outputs[-1], outputs[-1][-3000:]
    (third,) = set(job_ids(tmp_path)) - before
    assert _array_spec(tmp_path, third) is None
    client, parents, children = mlflow_runs(tmp_path)
    (parent,) = parents
    assert parent.info.status == "FINISHED" and parent.data.tags["slca.attempts"] == "3"
    current = [r for r in children if "slca.superseded_by" not in r.data.tags]
    assert sorted(r.data.tags["slca.job"] for r in current) == ["0", "1", "2", "3"]
    assert all(r.info.status == "FINISHED" for r in current)
    assert all("made no MLflow child run" not in out for out in outputs)
    logged = (tmp_path / "multirun" / "2" / "train.log").read_text()
    assert f"SLURM job {third}," in logged  # job 2 ran in its own folder, in the last job
    compare = subprocess.run(
        [EXE, "compare", parent.data.tags["slca.sweep"], "--tracking-uri",
         f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert compare.returncode == 0, compare.stderr[-3000:]
    rows = [x.split() for x in compare.stdout.splitlines() if x.split()[:2] == ["2", "0,1"]]
    assert sorted(r[2] for r in rows) == ["grpo", "slca_grpo"], compare.stdout
