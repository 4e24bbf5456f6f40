"""One MLflow parent run per Hydra multirun; every job's run becomes its child.

:class:`MlflowSweepCallback` is registered under ``hydra.callbacks`` in ``conf/config.yaml``, so
``slca-exp train -m ...`` gets it whenever ``tracking.backends`` contains ``mlflow``.

- ``on_multirun_start`` (launching process): creates the experiment if needed and the parent run,
  with the swept parameters as params (``reward.tool_weights.parallel`` = ``0.1,0.3``) and the
  tags ``slca.sweep`` (the sweep id), ``slca.role=parent`` and ``slca.swept`` (the swept keys).
- ``on_job_start`` (job process; submitit pickles this object into every job): exports
  ``SLCA_EXP_PARENT_RUN_ID`` and ``SLCA_EXP_SWEEP_ID``; the MLflow tracker reads them and makes the
  job's run a child (tag ``mlflow.parentRunId``) of the sweep (tag ``slca.sweep``, W&B group).
- ``on_job_end`` (job process): finds the job's child run, tags it with its overrides
  (``slca.overrides`` and one ``slca.swept.<key>`` tag per swept key) and records the job's status
  and return value as the parent's tag ``slca.jobs.<num>`` (JSON), where the launching process
  reads it back: state changed inside a submitit job never returns to the launching process.
- ``on_multirun_end`` (launching process): logs ``sweep_summary.csv`` and ``sweep_summary.md``
  (one row per job: run id, overrides, status, final metrics), ends the parent FINISHED, or
  FAILED when a job failed or never reported, and prints where to look: the parent run, the
  ``slca-exp compare`` command, the sweep folder and each job's run (on SLURM, its job id and
  log; ``slca_exp.tracking.closing``). If the launching process exits before that (a job
  raised, so Hydra's sweeper re-raised; a job called ``sys.exit``; Ctrl-C; a submitit job died),
  an ``atexit`` hook ends it FAILED. (Tags, not artifacts, carry the job records because
  artifact downloads need worker threads, which Python refuses once it is exiting.)

A sweep run again (``launch/resume.py``) keeps its parent: ``on_multirun_start`` reopens it and
records the attempt, each job keeps its number, and a job's run is the one its tracker names.

Hydra turns exceptions raised in callbacks into warnings, so the tests call these methods directly.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from slca_exp.core.process import global_rank
from slca_exp.core.shown import compact
from slca_exp.core.tags import (
    CHILD_ROLE,
    EXPECTED_JOBS,
    JOB,
    JOB_STATUS,
    JOBS_FAILED,
    JOBS_REPORTED,
    OVERRIDES,
    PARENT_ROLE,
    PARENT_RUN,
    ROLE,
    RUN_NOTE,
    SERVICE_TAGS,
    STUDY,
    SWEEP,
    SWEEP_DIR,
    SWEEP_ERROR,
    SWEPT,
    is_job_record,
    job_record,
    swept_tag,
)
from slca_exp.launch import resume
from slca_exp.launch.command import STUDY_ENV
from slca_exp.launch.resume import SweepPlan
from slca_exp.tracking import sweep_runs
from slca_exp.tracking.closing import say, slurm_job, sweep_block
from slca_exp.tracking.mlflow import RUN_ID_ENV, get_or_create_experiment
from slca_exp.tracking.redact import Redactor
from slca_exp.tracking.sweep_runs import (
    ENV_PARENT_RUN_ID,
    ENV_SWEEP_ID,
    split_overrides,
)
from slca_exp.tracking.uris import artifact_root, resolve_tracking_uri

log = logging.getLogger(__name__)

SUMMARY_NAME = "sweep_summary"


class MlflowSweepCallback(Callback):
    """Hydra callback: one MLflow parent run per multirun, each job's run a child of it.

    Args:
        tracking_uri: MLflow tracking URI; default: as
            :func:`~slca_exp.tracking.uris.resolve_tracking_uri` resolves it.
        sweep_id: the sweep id; default ``<experiment_name>-<YYYYmmdd-HHMMSS>-<6 hex>``.
        enabled: ``None`` (default) = only when ``tracking.backends`` contains ``mlflow``.

    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        sweep_id: str | None = None,
        enabled: bool | None = None,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.sweep_id = sweep_id
        self.enabled = enabled
        self.parent_run_id: str | None = None
        self.experiment_id: str | None = None
        self.swept: dict[str, str] = {}
        self.expected_jobs: int | None = None
        self.jobs: dict[int, dict[str, Any]] = {}
        self._job: dict[str, Any] | None = None
        self._run_name = ""
        self._raw_overrides: list[str] = []
        self._saved_env: dict[str, str | None] = {}
        self._client_cache: Any = None
        self.sweep_dir: str | None = None
        self._submissions: Any = None
        self.plan: SweepPlan | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Pickled into submitit jobs: an MlflowClient holds a store connection; rebuild it there.
        state = dict(self.__dict__)
        state["_client_cache"] = None
        state["_submissions"] = None  # a thread of the launching process
        return state

    # -- Hydra hooks ----------------------------------------------------------------------------

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Create the experiment (if needed) and the parent run; remember its id.

        Under a submitit launcher it also starts saying each job as it is submitted (its id
        and log) and keeps ``sacct``'s complaints off the console (``launch/submission.py``).
        """
        self._watch_submissions(config)
        if not self._wanted(config):
            return
        self.tracking_uri = resolve_tracking_uri(config, self.tracking_uri)
        name = str(OmegaConf.select(config, "experiment_name", default="slca-exp"))
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.sweep_id = self.sweep_id or f"{name}-{stamp}-{secrets.token_hex(3)}"
        # Secrets never reach MLflow: overrides and values are redacted as the trackers do.
        redactor = Redactor.for_config(config)
        raw = [str(o) for o in OmegaConf.select(config, "hydra.overrides.task") or []]
        swept, fixed = split_overrides(raw)
        self.swept = {k: redactor.value(k, v) for k, v in swept.items()}
        fixed = {k: redactor.value(k, v) for k, v in fixed.items()}
        task_overrides = [redactor.text(o) for o in raw]
        self.expected_jobs = _expected_jobs(config, raw)
        self.sweep_dir = str(Path(str(OmegaConf.select(config, "hydra.sweep.dir"))).resolve())
        client = self._client()
        self.plan = SweepPlan.from_env()
        if self.plan is not None and self.plan.parent_run_id:
            self._reopen(client, self.plan)
            return
        self.experiment_id = get_or_create_experiment(
            client, name, artifact_root(config, self.tracking_uri)
        )
        tags = {
            SWEEP: self.sweep_id,
            ROLE: PARENT_ROLE,
            SWEPT: json.dumps(sorted(self.swept)),
            OVERRIDES: " ".join(task_overrides),
            SWEEP_DIR: self.sweep_dir,
            EXPECTED_JOBS: str(self.expected_jobs or ""),
            RUN_NOTE: (
                f"Sweep {self.sweep_id}: {' '.join(task_overrides)}. Children are the jobs; "
                "sweep_summary.md lists them."
            ),
        }
        tags |= service_tags(config, swept=self.swept)
        if self.plan is not None:
            tags |= resume.first_attempt_tags(self.plan, self.sweep_dir, redactor.text)
        if os.environ.get(STUDY_ENV):
            tags[STUDY] = os.environ[STUDY_ENV]
        run = client.create_run(self.experiment_id, run_name=self.sweep_id, tags=tags)
        self.parent_run_id = run.info.run_id
        params = {**fixed, **self.swept}
        if params:
            from mlflow.entities import Param

            client.log_batch(self.parent_run_id, params=[Param(k, v) for k, v in params.items()])
        atexit.register(self._end_if_open)
        log.info("sweep %s: parent MLflow run %s", self.sweep_id, self.parent_run_id)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Export the parent run id and sweep id to the job (read by the trackers)."""
        if self.parent_run_id is None:
            return
        self._saved_env = {k: os.environ.get(k) for k in (ENV_PARENT_RUN_ID, ENV_SWEEP_ID)}
        os.environ[ENV_PARENT_RUN_ID] = self.parent_run_id
        os.environ[ENV_SWEEP_ID] = str(self.sweep_id)
        os.environ.pop(RUN_ID_ENV, None)  # the tracker sets it to the run this job writes to
        overrides = [str(o) for o in OmegaConf.select(config, "hydra.overrides.task") or []]
        redactor = Redactor.for_config(config)
        # The tracker's default run name (tracking/build.py), to tell parallel jobs' runs apart.
        plain = sorted(o for o in overrides if not o.lstrip("+~").startswith("hydra"))
        # A resumed sweep launches some of its jobs: each carries its number in the sweep.
        planned = OmegaConf.select(config, f"hydra.job.env_set.{resume.JOB_NUM_ENV}")
        num = planned if planned is not None else OmegaConf.select(config, "hydra.job.num")
        self._job = {
            "num": int(num or 0),
            "overrides": [redactor.text(o) for o in overrides],
            "start_ms": int(time.time() * 1000),
        }
        slurm = slurm_job()  # on SLURM: the job id and its log, for the sweep's closing lines
        if slurm:
            self._job.update(slurm_job=slurm["job"], log=slurm.get("log"))
        self._run_name = redactor.text(",".join(plain))[:200]
        self._raw_overrides = overrides  # in this process only; never written

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        """Tag the job's child run with its overrides; record the job's status on the parent."""
        if self.parent_run_id is None or self._job is None:
            return
        job, self._job = self._job, None
        try:
            if global_rank() != 0:  # every task of a multi-task submitit job runs the Hydra job
                return
            status = getattr(getattr(job_return, "status", None), "name", "UNKNOWN")
            job["status"] = status
            job["return"] = _describe_return(job_return)
            client = self._client()
            child = self._job_run(client, job)
            job["run_id"] = child.info.run_id if child else None
            if child is None:
                log.warning(
                    "sweep %s: job %d made no MLflow child run (is tracking.backends "
                    "missing mlflow?)",
                    self.sweep_id,
                    job["num"],
                )
            elif child.data.tags.get(PARENT_RUN) != self.parent_run_id:
                log.warning(
                    "sweep %s: job %d wrote to MLflow run %s, a child of run %s, not of this "
                    "sweep's parent run %s",
                    self.sweep_id,
                    job["num"],
                    child.info.run_id,
                    child.data.tags.get(PARENT_RUN),
                    self.parent_run_id,
                )
            else:
                self._tag_child(client, child, job, Redactor.for_config(config))
                resume.supersede(
                    client, self.experiment_id, self.parent_run_id, job["num"], child.info.run_id
                )
            client.set_tag(self.parent_run_id, job_record(job["num"]), _record(job))
            self.jobs[job["num"]] = job
        finally:
            for key, value in self._saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Log the summary table and end the parent FINISHED, or FAILED if a job failed."""
        self._stop_watching()
        if self.parent_run_id is None:
            return
        self._finish(error=None)

    # -- internals ------------------------------------------------------------------------------

    def _reopen(self, client: Any, plan: SweepPlan) -> None:
        """Continue the sweep ``plan`` resumes: its parent run, its id, a new attempt."""
        assert plan.parent_run_id is not None
        self.sweep_id = plan.sweep_id
        self.expected_jobs = len(plan.jobs)
        self.experiment_id = client.get_run(plan.parent_run_id).info.experiment_id
        resume.reopen(client, plan, self.sweep_dir)
        self.parent_run_id = plan.parent_run_id
        atexit.register(self._end_if_open)
        say(
            [
                f"resuming sweep {self.sweep_id} (parent run {plan.parent_run_id}), attempt "
                f"{plan.attempt}: {len(plan.run)} of {len(plan.jobs)} jobs to run "
                f"({compact(plan.run, 'jobs')}); "
                f"{len(plan.skipped)} finished before and kept"
            ]
        )

    def _job_run(self, client: Any, job: dict[str, Any]) -> Any:
        """The run the job wrote to: the one its tracker named, else the child it created."""
        run_id = os.environ.get(RUN_ID_ENV)
        if run_id:
            return client.get_run(run_id)
        return sweep_runs.find_child(
            client,
            self.experiment_id,
            self.parent_run_id,
            job["start_ms"],
            self._raw_overrides,
            run_name=self._run_name,
        )

    def _watch_submissions(self, config: DictConfig) -> None:
        target = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
        if "submitit" not in target:
            return
        from slca_exp.launch.submission import SubmissionWatch, quiet_sacct

        quiet_sacct()
        folder = OmegaConf.select(config, "hydra.launcher.submitit_folder", default=None)
        if folder:  # ``<sweep dir>/.submitit/%j``: each job's folder is named after its id
            kind = "SLURM job" if target.endswith("SlurmLauncher") else "local job"
            self._submissions = SubmissionWatch(Path(str(folder)).parent, kind).start()

    def _stop_watching(self) -> None:
        if self._submissions is not None:
            self._submissions.stop()
            self._submissions = None

    def _wanted(self, config: DictConfig) -> bool:
        if self.enabled is not None:
            return bool(self.enabled)
        backends = OmegaConf.select(config, "tracking.backends", default=None) or []
        return "mlflow" in [str(b) for b in backends]

    def _client(self) -> Any:
        if self._client_cache is None:
            from slca_exp.tracking.store import open_client

            self._client_cache = open_client(self.tracking_uri)
        return self._client_cache

    def _tag_child(self, client: Any, child: Any, job: dict[str, Any], redactor: Redactor) -> None:
        _, values = split_overrides(self._raw_overrides)  # a job's overrides are single values
        tags = {
            OVERRIDES: " ".join(job["overrides"]),
            JOB: str(job["num"]),
            JOB_STATUS: job["status"],
            SWEEP: str(self.sweep_id),
            ROLE: CHILD_ROLE,
            **{swept_tag(k): redactor.value(k, v) for k, v in values.items() if k in self.swept},
        }
        from mlflow.entities import RunTag

        client.log_batch(child.info.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        if child.info.status == "RUNNING":  # the tracker did not close it: never leave it RUNNING
            final = "FINISHED" if job["status"] == "COMPLETED" else "FAILED"
            client.set_terminated(child.info.run_id, status=final)

    def _collect_jobs(self, client: Any) -> dict[int, dict[str, Any]]:
        """Job records: this process's (basic launcher) merged with those the jobs tagged."""
        jobs = dict(self.jobs)
        for key, value in client.get_run(self.parent_run_id).data.tags.items():
            if is_job_record(key):
                record = json.loads(value)
                jobs.setdefault(int(record["num"]), record)
        return jobs

    def _finish(self, error: str | None) -> None:
        self._stop_watching()
        client = self._client()
        jobs: dict[int, dict[str, Any]] = {}  # what the jobs reported, for the closing lines
        try:
            jobs = self._collect_jobs(client)
            children = sweep_runs.children(client, self.experiment_id, self.parent_run_id)
            table = sweep_runs.summary_rows(jobs, children)
            failed = sweep_runs.failed_jobs(jobs, children)
            missing = (self.expected_jobs or 0) - len(jobs)
            with tempfile.TemporaryDirectory() as tmp:
                for path in sweep_runs.write_summary(table, Path(tmp), SUMMARY_NAME):
                    client.log_artifact(self.parent_run_id, str(path))
            tags = {JOBS_FAILED: str(len(failed)), JOBS_REPORTED: str(len(jobs))}
            if missing > 0:
                error = error or f"{missing} of {self.expected_jobs} jobs never reported"
            if error:
                tags[SWEEP_ERROR] = error
            for key, value in tags.items():
                client.set_tag(self.parent_run_id, key, value)
            status = "FAILED" if failed or error or missing > 0 else "FINISHED"
        except Exception as err:  # the parent must not stay RUNNING because a summary failed
            log.warning("sweep %s: could not write the summary: %s", self.sweep_id, err)
            status = "FAILED"
        client.set_terminated(self.parent_run_id, status=status)
        log.info("sweep %s: parent run %s ended %s", self.sweep_id, self.parent_run_id, status)
        say(
            sweep_block(
                sweep_id=str(self.sweep_id),
                parent_run_id=self.parent_run_id,
                status=status,
                store=str(self.tracking_uri),
                sweep_dir=self.sweep_dir,
                jobs=jobs,
            )
        )
        self.parent_run_id = None
        atexit.unregister(self._end_if_open)

    def _end_if_open(self) -> None:
        """``atexit``: the multirun stopped before ``on_multirun_end``; end the parent FAILED."""
        if self.parent_run_id is not None:
            self._finish(error="the multirun stopped before all jobs returned")


def service_tags(config: DictConfig, swept: Mapping[str, object] = ()) -> dict[str, str]:
    """The parent's tags naming the services (``slca-exp serve``) the sweep's jobs share.

    A service every job names (not a ``swept`` key) is the registry's record now, the one the
    jobs find: ``<name>@<fingerprint>``. A swept one is recorded by each job's run only.
    """
    from slca_exp.services.served import ServiceRegistry, registry_folder

    found = {}
    for group, tag in SERVICE_TAGS.items():
        name = OmegaConf.select(config, f"{group}.service")
        if not name or f"{group}.service" in swept:
            continue
        folder = registry_folder(OmegaConf.select(config, f"{group}.service_registry"))
        record = ServiceRegistry(folder).record(str(name))
        found[tag] = f"{name}@{record.fingerprint[:12]}" if record is not None else str(name)
    return found


def _expected_jobs(config: DictConfig, task_overrides: list[str]) -> int | None:
    """Number of jobs the basic sweeper will launch; ``None`` for other sweepers."""
    target = str(OmegaConf.select(config, "hydra.sweeper._target_", default=""))
    if not target.endswith(("BasicSweeper", "ResumingSweeper")):
        return None
    from slca_exp.preflight.compose import expand_sweeps

    return len(expand_sweeps(task_overrides))


def _record(job: dict[str, Any]) -> str:
    """A job record as JSON that fits in an MLflow tag value (8000 characters)."""
    text = json.dumps(job)
    if len(text) > 7900:
        text = json.dumps({**job, "return": job["return"][:200], "overrides": ["(too long)"]})
    return text


def _describe_return(job_return: Any) -> str:
    """A short text for the job's return value (or its exception)."""
    # ``_return_value``: the public property re-raises a failed job's exception and writes to stderr
    value = getattr(job_return, "_return_value", None)
    text = f"{type(value).__name__}: {value}" if isinstance(value, BaseException) else repr(value)
    return text if len(text) <= 500 else text[:497] + "..."
