"""The block every run and every sweep ends with: where its results are, and what went wrong.

    slca-exp: ---- where to look ----
    slca-exp: run FINISHED: MLflow run 3f2a... (experiment slca-exp) in sqlite:///outputs/mlflow.db
    slca-exp: open it with: slca-exp ui --tracking-uri sqlite:///outputs/mlflow.db
    slca-exp: compare: slca-exp compare slca-exp
    slca-exp: output folder: outputs/2026-12-01/10-00-00
    slca-exp: checkpoint: outputs/runs/<run key>/checkpoint.pt
    slca-exp: SLURM job 1234_0, log: multirun/.../.submitit/1234_0/1234_0_0_log.out
    slca-exp: judge: 16 of 160 requests failed; every request failed in RL step 3

A job of a sweep names its sweep's parent run and compares the sweep; the sweep's own block
(:func:`sweep_block`, printed when the multirun ends) lists every job with its run, status and,
on SLURM, its job id and log. Lines that do not apply are left out. Paths and the sqlite store
under the current folder are shown relative to it (:mod:`slca_exp.core.shown`), so that they
open from where the command ran; others stay absolute.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from slca_exp.core import names
from slca_exp.core.shown import shown_path, shown_uri

PREFIX = "slca-exp: "
HEADER = "---- where to look ----"


def say(lines: Iterable[str], stream: Any = None) -> None:  # noqa: ANN401 - a text stream
    """Print each line with the ``slca-exp:`` prefix (stderr by default)."""
    out = stream or sys.stderr
    for line in lines:
        print(f"{PREFIX}{line}", file=out, flush=True)


def run_lines(
    config: Any,  # noqa: ANN401 - a validated RunConfig
    tracker: object,
    checkpoint: Path | None,
) -> list[str]:
    """The closing lines of the run ``tracker`` recorded (:func:`run_block`), from what it knows.

    The failed requests come from the metrics the tracker saw (the local engine logs through
    it) or, when it saw none (verl logs from its own process), from the MLflow run.
    """
    from slca_exp.tracking.mlflow import store_uri
    from slca_exp.tracking.sweep_runs import ENV_PARENT_RUN_ID, ENV_SWEEP_ID
    from slca_exp.tracking.uris import absolute_uri

    ids_of = getattr(tracker, "run_ids", None)
    run_id = (ids_of() if callable(ids_of) else {}).get("mlflow")
    store = absolute_uri(store_uri(config.tracking))
    parent = os.environ.get(ENV_PARENT_RUN_ID)
    return run_block(
        status=getattr(tracker, "finished", None),
        run_id=run_id,
        experiment=str(config.experiment_name),
        store=store,
        parent_run_id=parent,
        sweep_id=os.environ.get(ENV_SWEEP_ID) if parent else None,
        output_dir=hydra_output_dir(),
        checkpoint=str(checkpoint) if checkpoint else None,
        slurm=slurm_job(),
        failures=_failures(tracker, store, run_id),
    )


def _failures(tracker: object, store: str, run_id: str | None) -> list[str]:
    """:func:`~slca_exp.services.outage.failure_lines` of the run's service metrics."""
    from slca_exp.services.outage import SERVICES, failure_lines, failures_key, requests_key

    keys = [k(s) for s in SERVICES for k in (requests_key, failures_key)]
    keys += [names.val(k) for k in keys]
    history = getattr(getattr(tracker, "history", None), "metrics", None) or {}
    if not any(k in history for k in keys) and run_id:
        from mlflow.tracking import MlflowClient

        from slca_exp.tracking.mlflow import mlflow_key

        client = MlflowClient(store)
        history = {
            k: [(m.step, m.value) for m in client.get_metric_history(run_id, mlflow_key(k))]
            for k in keys
        }
    return failure_lines(history)


def run_block(
    *,
    status: str | None,
    run_id: str | None,
    experiment: str,
    store: str | None,
    parent_run_id: str | None = None,
    sweep_id: str | None = None,
    output_dir: str | None = None,
    checkpoint: str | None = None,
    slurm: Mapping[str, str] | None = None,
    failures: Sequence[str] = (),
) -> list[str]:
    """The closing lines of one run (without the ``slca-exp:`` prefix).

    Args:
        status: FINISHED, FAILED or KILLED (None: the tracker never opened a run).
        run_id: the MLflow run's id (None: MLflow is not among the backends).
        experiment: the MLflow experiment's name.
        store: the MLflow tracking URI.
        parent_run_id: the sweep's parent run, for a job of a sweep.
        sweep_id: the sweep's id, for a job of a sweep.
        output_dir: the job's Hydra output folder (``.hydra/``, ``train.log``).
        checkpoint: where the run's checkpoint is.
        slurm: ``job`` (the SLURM job id) and ``log`` (its log file), for a job on SLURM.
        failures: failed judge and simulator requests (``services.outage.failure_lines``).

    >>> run_block(status="FINISHED", run_id="ab", experiment="e", store="sqlite:///m.db")[1:3]
    ['run FINISHED: MLflow run ab (experiment e) in sqlite:///m.db', 'open it with: slca-exp ui --tracking-uri sqlite:///m.db']

    """  # noqa: E501 - a doctest line
    state = status or "not started"
    lines = [HEADER]
    shown = shown_uri(store) if store else store
    if run_id:
        lines.append(f"run {state}: MLflow run {run_id} (experiment {experiment}) in {shown}")
        if shown and shown.startswith("sqlite:"):
            lines.append(f"open it with: slca-exp ui --tracking-uri {shown}")
    else:
        lines.append(f"run {state} (not recorded in MLflow: tracking.backends has no mlflow)")
    if parent_run_id:
        lines.append(f"sweep {sweep_id}: parent MLflow run {parent_run_id}")
    if run_id or parent_run_id:
        lines.append(f"compare: {compare_command(sweep_id or experiment, store)}")
    if output_dir:
        lines.append(f"output folder: {shown_path(output_dir)}")
    if checkpoint:
        lines.append(f"checkpoint: {shown_path(checkpoint)}")
    if slurm and slurm.get("job"):
        lines.append(f"SLURM job {slurm['job']}, log: {_shown_log(slurm.get('log'))}")
    lines += list(failures)
    return lines


def sweep_block(
    *,
    sweep_id: str,
    parent_run_id: str,
    status: str,
    store: str,
    sweep_dir: str | None,
    jobs: Mapping[int, Mapping[str, Any]],
) -> list[str]:
    """The closing lines of a sweep (without the ``slca-exp:`` prefix).

    Args:
        sweep_id: the sweep's id (tag ``slca.sweep``).
        parent_run_id: its MLflow parent run.
        status: the parent's final status.
        store: the MLflow tracking URI.
        sweep_dir: Hydra's sweep folder (one sub-folder per job).
        jobs: job number -> its record (``status``, ``run_id``, and on SLURM ``slurm_job`` and
            ``log``), as the jobs reported them.

    """
    shown = shown_uri(store)
    lines = [
        HEADER,
        f"sweep {sweep_id} {status}: parent MLflow run {parent_run_id} in {shown}",
        f"compare: {compare_command(sweep_id, store)}",
    ]
    if shown.startswith("sqlite:"):
        lines.append(f"open it with: slca-exp ui --tracking-uri {shown}")
    if sweep_dir:
        lines.append(f"sweep folder: {shown_path(sweep_dir)}")
    for num in sorted(jobs):
        job = jobs[num]
        text = f"job {num}: {job.get('status', '?')}, MLflow run {job.get('run_id') or '-'}"
        if job.get("slurm_job"):
            text += f", SLURM job {job['slurm_job']}, log: {_shown_log(job.get('log'))}"
        lines.append(text)
    return lines


def _shown_log(log: str | None) -> str:
    """A SLURM job's log file as printed (``(unknown)`` without submitit)."""
    return shown_path(log) if log else "(unknown)"


def compare_command(target: str, store: str | None) -> str:
    """The ``slca-exp compare`` command that finds ``target`` in ``store``.

    The default store needs no ``--tracking-uri``; any other is named, as it opens from the
    current folder (:func:`~slca_exp.core.shown.shown_uri`).
    """
    from slca_exp.tracking.uris import default_tracking_uri

    command = f"slca-exp compare {target}"
    if store and store != default_tracking_uri():
        command += f" --tracking-uri {shown_uri(store)}"
    return command


def slurm_job() -> dict[str, str]:
    """The SLURM job id of the process and its log file; {} outside a SLURM job.

    The id is an array job's ``<array id>_<task>``; the log is submitit's stdout file of this
    task (``<folder>/<id>_<rank>_log.out``); without submitit the log is left out.
    """
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return {}
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    found = {"job": f"{array}_{task}" if array and task else job}
    if os.environ.get("SUBMITIT_FOLDER"):
        import submitit

        found["log"] = str(submitit.JobEnvironment().paths.stdout.resolve())
    return found


def hydra_output_dir() -> str | None:
    """The job's Hydra output folder; None outside a Hydra job."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return str(Path(HydraConfig.get().runtime.output_dir).resolve())
