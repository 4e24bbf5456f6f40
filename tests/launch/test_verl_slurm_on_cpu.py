"""``engine=verl`` as a real SLURM job on CPU (``.ci/slurm-up`` starts a one-node cluster).

Both jobs go through the CLI as a user submits them (``slca-exp train -m experiment=verl_smoke
launcher=slurm_cpu``) and run verl's trainer on the job's own Ray node (our bootstrap,
``RAY_ADDRESS``), not on a Ray that verl starts by itself:

- the time limit: SLURM's time-limit signal during RL stops verl's trainer after a checkpoint,
  the job requeues, and the requeued job resumes from verl's checkpoint into the same MLflow run:
  every RL step is logged once;
- ``scancel``: the run ends KILLED, and nothing of the job is left running.

The two jobs run side by side (the one node has a CPU for each): each costs verl's start-up,
which is most of the time.
"""

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.launch.test_slurm import job_ids, logs, mlflow_runs, submit

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.verl,
    pytest.mark.slow,
    pytest.mark.usefixtures("slurm"),
]
pytest.importorskip("verl", reason="needs the verl extra")

from slca_exp.engines.verl.stopping import STEP_METRIC  # noqa: E402

STEPS = 4
"""RL steps of the requeued run: the signal comes once step 1 is logged, the trainer stops
after the step it is in (2, or 3 on a slow poll), the requeued job does the rest."""
VERL = [
    "experiment=verl_smoke",
    "launcher.mem_gb=4",
    # submitit calls a signal a time limit (not a preemption) when the job is this short
    "launcher.timeout_min=10",
    "launcher.signal_delay_s=30",
    "engine.verl.test_freq=-1",
    "engine.verl.overrides=['trainer.val_before_train=false']",  # CI time: no validation
]
PER_STEP = (  # verl's metrics and ours, each logged once at every RL step
    STEP_METRIC,
    "timing_s/step",
    "timing_s/gen",
    "timing_s/update_actor",
    "actor/pg_loss",
    "response_length/mean",
    "adv/tool/mean",
    "segment/summary/present_frac",
    "reward/total/mean",
)
DEADLINE_S = 1200
SCANCEL_RETURN_S = 120
"""SLURM kills what is left of a cancelled job after ``KillWait`` (30 s here); the job's driver
reports the cancellation to submitit before, so that the command returns."""


@dataclass
class Job:
    """One submitted ``slca-exp train -m`` command, its folder and what the test saw of it."""

    folder: Path
    proc: subprocess.Popen
    events: dict[str, float] = field(default_factory=dict)
    output: str = ""

    @property
    def client(self) -> MlflowClient:
        return MlflowClient(f"sqlite:///{self.folder / 'out' / 'mlflow.db'}")

    def job_id(self) -> str | None:
        ids = job_ids(self.folder)
        return ids[0] if ids else None

    def runs(self):
        """(the recipe's run, its SFT child runs), once the run exists."""
        if not (self.folder / "out" / "mlflow.db").exists():
            return None, []
        _, _, children = mlflow_runs(self.folder)
        sft = [r for r in children if r.data.tags.get("slca.stage") == "sft"]
        rl = [r for r in children if r.data.tags.get("slca.stage") != "sft"]
        return (rl[0] if rl else None), sft

    def steps_logged(self) -> list[int]:
        run, _ = self.runs()
        if run is None:
            return []
        return [m.step for m in self.client.get_metric_history(run.info.run_id, STEP_METRIC)]

    def logs(self) -> str:
        return logs(self.folder) if (self.folder / "multirun" / ".submitit").is_dir() else ""


def _start(tmp_path: Path, *overrides: str) -> Job:
    job = Job(tmp_path, submit(tmp_path, *VERL, *overrides, wait=False))
    job.events["submitted"] = time.monotonic()
    return job


def _squeue(job_id: str) -> list[str]:
    res = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], capture_output=True,
                         text=True, check=False)  # fmt: skip
    return res.stdout.split()


def _job_processes(job_id: str) -> list[int]:
    """Processes whose environment says they belong to SLURM job ``job_id``."""
    marker = f"SLURM_JOB_ID={job_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _drive(requeued: Job, killed: Job) -> None:
    """Signal ``requeued`` after its first RL step (and release it), scancel ``killed``."""
    released: set[str] = set()
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if requeued.proc.poll() is not None and killed.proc.poll() is not None:
            return
        job = requeued.job_id()
        if job and "signal" not in requeued.events and requeued.steps_logged():
            # what SLURM sends at the time limit (--signal=USR2@delay): USR2 to the job's steps
            subprocess.run(["scancel", "--signal=USR2", job], check=True)
            requeued.events["signal"] = time.monotonic()
        held = job and "signal" in requeued.events and job not in released
        if held and _squeue(job) == ["PENDING", "BeginTime"]:
            # SLURM holds a requeued job for two minutes: start it now
            subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=True)
            released.add(job)
            requeued.events["released"] = time.monotonic()
        job = killed.job_id()
        if job and "scancel" not in killed.events and killed.steps_logged():
            subprocess.run(["scancel", job], check=True)
            killed.events["scancel"] = time.monotonic()
        since = time.monotonic() - killed.events.get("scancel", time.monotonic())
        if killed.proc.poll() is None and since > SCANCEL_RETURN_S:
            pytest.fail(
                f"`slca-exp train -m` did not return {SCANCEL_RETURN_S} s after scancel: the job "
                f"left no result for submitit; its log:\n{killed.logs()[-5000:]}"
            )
        time.sleep(0.5)
    pytest.fail(f"the verl jobs did not end within {DEADLINE_S} s")


@pytest.fixture(scope="module")
def verl_jobs(tmp_path_factory):
    """Both jobs, submitted together and driven to their ends; (requeued, killed)."""
    # The SFT stage (a short one) runs in the job that is not waited for: it ends first anyway.
    requeued = _start(
        tmp_path_factory.mktemp("requeued"),
        "engine.sft.enabled=false",
        f"engine.verl.total_training_steps={STEPS}",
    )
    killed = _start(
        tmp_path_factory.mktemp("killed"),
        "engine.sft.steps=5",
        "engine.verl.total_training_steps=100",
    )
    try:
        _drive(requeued, killed)
        for job in (requeued, killed):
            job.output = job.proc.communicate(timeout=120)[0]
            job.events["ended"] = time.monotonic()
    finally:
        for job in (requeued, killed):
            if job.proc.poll() is None:
                job.proc.kill()
            for job_id in job_ids(job.folder):
                subprocess.run(["scancel", job_id], check=False)
    for name, job in (("time limit + requeue", requeued), ("scancel", killed)):
        start = job.events.pop("submitted")
        seen = ", ".join(f"{k} {v - start:.0f} s" for k, v in job.events.items())
        print(f"verl on SLURM, {name}: {seen}")
    return requeued, killed


def test_a_time_limit_during_rl_checkpoints_through_verl_requeues_and_resumes(verl_jobs):
    job, _ = verl_jobs
    assert job.proc.returncode == 0, job.output[-3000:] + job.logs()[-5000:]
    text = job.logs()
    assert "this job is timed-out" in text  # submitit's word: the time limit, not a preemption
    assert "the trainer stops at its next step boundary" in text
    assert "requeueing the job" in text
    assert "released" in job.events  # requeued once, then started again
    # our Ray bootstrap: a one-node cluster of the job, which verl joined through RAY_ADDRESS
    assert "Ray cluster up: 1/1 nodes" in text
    assert "verl runs on the Ray cluster at" in text
    # the first job stopped after a checkpoint; the requeued one resumed from it
    stopped = [line for line in text.splitlines() if "verl checkpointed at RL step" in line]
    assert len(stopped) == 1, text[-5000:]
    step = int(stopped[0].split("RL step ")[1].split()[0])
    assert 1 <= step < STEPS
    assert f"verl resumed from its checkpoint at RL step {step}" in text
    (checkpoint,) = (job.folder / "out").rglob(f"checkpoints/global_step_{step}")
    assert (checkpoint / "data.pt").is_file()  # verl's dataloader state: the next prompts
    # one MLflow run, continued, every RL step in it once
    run, sft = job.runs()
    assert run.info.status == "FINISHED" and run.data.tags.get("slca.resumed") == "true"
    assert sft == []
    client = job.client
    for name in PER_STEP:
        history = sorted(m.step for m in client.get_metric_history(run.info.run_id, name))
        assert history == list(range(1, STEPS + 1)), name
    for name in run.data.metrics:  # no metric at all has a step twice
        steps = [m.step for m in client.get_metric_history(run.info.run_id, name)]
        assert len(steps) == len(set(steps)), name


def test_scancel_during_rl_leaves_the_run_killed_and_nothing_running(verl_jobs):
    _, job = verl_jobs
    assert "scancel" in job.events
    assert job.proc.returncode != 0, job.output[-3000:]
    run, sft = job.runs()
    assert run.info.status == "KILLED"  # never RUNNING, nor FINISHED by verl's own logger
    assert [r.info.status for r in sft] == ["FINISHED"]  # the SFT stage, before RL
    assert len(job.steps_logged()) >= 1
    text = job.logs()
    assert "verl runs on the Ray cluster at" in text
    assert "run stopped by a signal; recorded as KILLED" in text  # the job closed it itself
    # the job's processes are gone: the driver, its Ray node, verl's actors
    job_id = job.job_id()
    deadline = time.monotonic() + 60
    while (_squeue(job_id) or _job_processes(job_id)) and time.monotonic() < deadline:
        time.sleep(1)
    assert _squeue(job_id) == []
    assert _job_processes(job_id) == []
