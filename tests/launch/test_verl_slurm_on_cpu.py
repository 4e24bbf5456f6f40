"""``engine=verl`` as a real SLURM job on CPU (``.ci/slurm-up`` starts a one-node cluster).

Both jobs go through the CLI as a user submits them (``slca-exp train -m experiment=verl_smoke
launcher=slurm_cpu``) and run verl's trainer on the job's own Ray node (our bootstrap,
``RAY_ADDRESS``), not on a Ray that verl starts by itself:

- the time limit: SLURM's own time limit fires during RL (its ``--signal=USR2@<delay>``, which
  submitit asks for), verl's trainer stops after a checkpoint, the job requeues, and the
  requeued job resumes from verl's checkpoint into the same MLflow run: every RL step is logged
  once;
- ``scancel``: the run ends KILLED, and nothing of the job is left running.

The two jobs run side by side (the one node has a CPU for each): each costs verl's start-up,
which is most of the time.
"""

import math
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.launch.test_slurm import job_ids, logs, mlflow_runs, submit
from tests.skip_policy import require

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.verl,
    pytest.mark.slow,
    pytest.mark.usefixtures("slurm"),
]
require("verl", reason="needs the verl extra")

from slca_exp.engines.verl.stopping import STEP_METRIC  # noqa: E402

# Measured on this 2-core host with both jobs of this file side by side (the scancel job's SFT
# and verl start-up overlap the time-limit job's RL), five runs: RL step 1 is logged 104 s
# after the job starts at load average 1 to 2, 188 to 218 s at 3 to 16 (Ray 37 s, verl's
# start-up 140 to 190 s, step 1 17 to 29 s); later steps take 4.9 to 8.4 s on the quiet host,
# 7 to 11 s (19 s at most) on the loaded one; from the signal the trainer stops after the step
# it is in and the job requeues within 5 to 13 s; the requeued job takes 127 to 213 s (95 to
# 166 s of start-up). A limit fixed at submission cannot absorb start-ups 114 s apart and still
# signal, with SLURM's jitter of SLURM_CHECK_S, between RL step 1 and the last step. So the job
# is submitted with a limit far enough away (TIME_LIMIT_MIN), and once step 1 is logged (the
# test sees it 1 to 2 s later) the test shortens it (``scontrol update TimeLimit``) to the
# minute whose signal SLURM's next time-limit check sends (_signal_limit): the limit and its
# signal are SLURM's own; the test only sets the limit when it knows RL runs. SLURM sent the
# signal 14, 15, 16 and 24 s after the limit was shortened (4 s for a probe job).
STEPS = 10
"""RL steps of the run. The signal comes at SLURM's next time-limit check after the limit is
shortened (at most SLURM_CHECK_S later, plus 2 s of the test's poll) and must reach the trainer
before its ``on_step_end`` of step STEPS - 1 (in the last step it would finish instead of
stopping): the STEPS - 2 steps after step 1 take at least 8 x 4.9 s = 39 s, against 32 s. The
trainer stopped after step 4 in each run here, and the requeued job does the rest; every step
more costs 5 to 11 s of the file's time."""
TIME_LIMIT_MIN = 10
"""The limit the job is submitted with, and the requeued job's fresh one. At most 10 minutes,
so that submitit calls the signal a time limit (a signal before the earlier of 80 % of the
submitted limit and 10 minutes before it is a preemption to submitit). Its own signal would
come 450 s after the job starts at the earliest (limit - SIGNAL_DELAY_S - SLURM_CHECK_S), after
step 1 (104 to 218 s), and the requeued job (127 to 213 s) ends long before it."""
SIGNAL_DELAY_S = 120
"""``--signal=USR2@120``: the slurm_cpu profile's own. The shortened limit leaves more than
SIGNAL_DELAY_S - 2 x SLURM_CHECK_S = 60 s from the signal to the limit (_signal_limit), against
5 to 13 s measured from the signal to the requeue (a step of up to 19 s finished first)."""
SLURM_CHECK_S = 30
"""slurmctld checks time limits every 30 s and sends the ``--signal`` at the first check that
is less than 30 s before the signal time (limit - delay)."""
VERL = [
    "experiment=verl_smoke",
    # what is tested is SLURM's side (submission, requeue, cancel): the transformers rollout
    # starts in seconds, where vLLM's start would take most of the 10-minute limit's margin
    "engine.verl.cpu_rollout=hf",
    "launcher.mem_gb=4",
    f"launcher.timeout_min={TIME_LIMIT_MIN}",
    f"launcher.signal_delay_s={SIGNAL_DELAY_S}",
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
    run_id: str | None = None
    """The recipe's MLflow run, once found."""

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
        """The RL steps in the recipe's run. Polled twice a second while verl runs: the run's
        id is looked up once (searching every run took 0.5 to 1.5 s a poll here), so that the
        test learns of step 1 about when it is logged."""
        if self.run_id is None:
            if not (self.folder / "out" / "mlflow.db").exists():
                return []
            _, parents, children = mlflow_runs(self.folder)
            sweep = {r.info.run_id for r in parents}
            recipe = [r for r in children if r.data.tags["mlflow.parentRunId"] in sweep]
            if not recipe:
                return []
            self.run_id = recipe[0].info.run_id
        return [m.step for m in self.client.get_metric_history(self.run_id, STEP_METRIC)]

    def logs(self) -> str:
        return logs(self.folder) if (self.folder / "multirun" / ".submitit").is_dir() else ""

    def stderr(self) -> str:
        """The job's stderr logs (the driver's ``slca-exp:`` lines; short, read at every poll)."""
        found = sorted((self.folder / "multirun" / ".submitit").glob("*/*_log.err"))
        return "\n".join(p.read_text(errors="replace") for p in found)


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


def _elapsed_s(job_id: str) -> float:
    """How long SLURM job ``job_id`` has been running (its limit counts from its start)."""
    res = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%S"], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return time.time() - datetime.fromisoformat(res.stdout.strip()).timestamp()


def _signal_limit(elapsed_s: float) -> int:
    """The time limit, in whole minutes, whose signal SLURM's next time-limit check sends.

    The check sends it once ``now + SLURM_CHECK_S >= limit - SIGNAL_DELAY_S``: the largest such
    limit puts ``limit - SIGNAL_DELAY_S`` within ``SLURM_CHECK_S`` of ``elapsed_s`` (on either
    side), so the next check, at most ``SLURM_CHECK_S`` away, sends it, and the job still has
    more than ``SIGNAL_DELAY_S - 2 * SLURM_CHECK_S`` seconds from the signal to its limit.
    """
    return math.floor((elapsed_s + SLURM_CHECK_S + SIGNAL_DELAY_S) / 60)


SIGNALLED = "time limit or preemption announced; the trainer stops at its next step boundary"
"""What the job's driver says when the signal reaches it."""


def _drive(requeued: Job, killed: Job) -> None:
    """Let ``requeued``'s time limit fire after its first RL step (and release it), scancel
    ``killed``."""
    released: set[str] = set()
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if requeued.proc.poll() is not None and killed.proc.poll() is not None:
            return
        job = requeued.job_id()
        if job and "limit" not in requeued.events and requeued.steps_logged():
            # RL runs and step 1 is logged: bring the time limit close enough that SLURM's
            # next check sends its signal (--signal=USR2@SIGNAL_DELAY_S, from submitit)
            requeued.events["step 1"] = time.monotonic()
            elapsed = _elapsed_s(job)
            limit = _signal_limit(elapsed)
            subprocess.run(["scontrol", "update", f"jobid={job}", f"TimeLimit={limit}"],
                           check=True)  # fmt: skip
            requeued.events["limit"] = time.monotonic()
            print(f"verl on SLURM, time limit: step 1 logged {elapsed:.0f} s into the job, "
                  f"limit set to {limit} min")  # fmt: skip
        if job and "signal" not in requeued.events and SIGNALLED in requeued.stderr():
            requeued.events["signal"] = time.monotonic()
        held = job and "limit" in requeued.events and job not in released
        if held and _squeue(job) == ["PENDING", "BeginTime"]:
            # SLURM holds a requeued job for two minutes: start it now, with a fresh limit
            # (the shortened one would signal it again)
            subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now",
                            f"TimeLimit={TIME_LIMIT_MIN}"], check=True)  # fmt: skip
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
    # SLURM's time limit fired after RL step 1: its signal reached the driver, submitit saw
    # a time-out (not a preemption), the job requeued once and was started again
    assert "limit" in job.events and "signal" in job.events, text[-5000:]
    assert job.events["signal"] > job.events["limit"], (
        f"SLURM signalled before RL step 1 was logged: the limit the job was submitted with "
        f"({TIME_LIMIT_MIN} min) came first; verl's start-up took longer than it allows"
    )
    assert "this job is timed-out" in text
    assert text.count(SIGNALLED) == 1  # the requeued job (a fresh limit) had none
    assert "requeueing the job" in text
    assert "released" in job.events
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
