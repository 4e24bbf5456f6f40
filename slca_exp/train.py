"""The Hydra task behind ``slca-exp train``: validate, record, run, close.

    validate -> build_recipe -> build_tracker -> engine.run(config, recipe, tracker) -> finish

Everything that can refuse a run (a bad config, an incomplete recipe, no such engine) happens in
:func:`prepare`, whose checks (:func:`slca_exp.preflight.check_run`) ``slca-exp train`` also runs
for every job before Hydra starts, as ``validate``, ``--dry-run`` and ``--cfg`` do, so that a
refused run creates nothing: no output folder, no MLflow run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from slca_exp.config.schema import RunConfig
from slca_exp.core.preemption import preemption_requeues
from slca_exp.core.problems import EXIT_BAD_CONFIG, ConfigError
from slca_exp.core.process import EXIT_KILLED, RunKilled
from slca_exp.engines import ENGINES, Engine
from slca_exp.preflight import check_run
from slca_exp.preflight.compose import CONFIG_DIR, CONFIG_NAME
from slca_exp.recipe import Recipe
from slca_exp.registry import RegistryError
from slca_exp.services.outage import ServiceOutage, outage_message
from slca_exp.tracking.base import tracked_run
from slca_exp.tracking.build import build_tracker
from slca_exp.tracking.console import mirrored_to_job_log
from slca_exp.tracking.mlflow import TrackingError
from slca_exp.tracking.redact import Redactor, install_log_redaction, redact_hydra_output

EXIT_TRACKING = 1
EXIT_OUTAGE = 1


class JobKilled(RuntimeError):
    """A submitit job's run was stopped by a signal (``scancel``, a node going down)."""


def prepare(cfg: DictConfig) -> tuple[RunConfig, Any, Recipe]:
    """Validate ``cfg``, build its recipe (generating a synthetic split), find its engine.

    Raises:
        ConfigError: the config, its recipe or the engine's own check has problems (all of
            them listed).
        RegistryError: no engine of that name is installed.

    """
    from slca_exp.evaluation.options import after_train

    prepared = check_run(cfg, ENGINES)  # validate's checks, generating what the run needs
    problems = after_train(prepared[0])[2]  # eval.after_train: its benchmark and serving
    if problems:
        raise ConfigError(problems)
    return prepared


def run(cfg: DictConfig) -> object:
    """Run one job: prepare, open the trackers, run the engine, close the trackers.

    The run ends FINISHED, FAILED (the engine raised) or KILLED (SIGTERM, Ctrl-C); never RUNNING.
    In a multi-task submitit job every task prepares the job, then boots a Ray node
    (:mod:`slca_exp.launch.cluster`); rank 0 runs the engine on the cluster, the other ranks
    serve until it is done. A failure on any rank fails the job, naming that rank's log. An
    engine that runs on Ray (``ray_node``) gets the job's own Ray node in a one-task job too.
    """
    from slca_exp.core.task import TaskInfo

    task = TaskInfo.from_env()
    try:
        prepared = prepare(cfg)
    except BaseException as exc:
        # In a multi-task job, tell the others: rank 0 then fails at once naming this task's
        # log, or, when rank 0 is the one failing, the workers stop waiting for it.
        if task is not None:
            from slca_exp.launch.rendezvous import report_failure

            report_failure(task, exc)
        raise
    config, engine, _ = prepared
    resources = engine.ray_node(config)  # what each Ray node of the job declares
    if task is None and resources is not None:
        task = TaskInfo.from_env(one_task=True)  # a one-task submitit job: one Ray node
    if task is None:
        return _run_prepared(cfg, *prepared)
    from slca_exp.launch.cluster import serve

    return serve(task, lambda _cluster: _run_prepared(cfg, *prepared), resources=resources)


def _run_prepared(
    cfg: DictConfig,
    config: RunConfig,
    engine: Engine,
    recipe: Recipe,
) -> object:
    """Open the trackers, run the engine, close the trackers (the run's status is final)."""
    redactor = Redactor.for_config(config)
    install_log_redaction(redactor)
    redact_hydra_output(redactor, *_hydra_output_dirs())
    # An engine that checkpoints knows whether this exact job was interrupted before; its
    # tracker runs then continue (same MLflow run, next step).
    resume = engine.resume_ids(config)
    tracker = build_tracker(config, recipe, redactor, resume=resume)
    params = OmegaConf.to_container(cfg, resolve=True)
    # On SLURM, a time limit or a preemption checkpoints the engine, then requeues the job.
    try:
        with (
            preemption_requeues(checkpointable=engine.checkpointable),
            tracked_run(tracker, recipe, params, started=_remembering(engine, config)),
        ):
            result = engine.run(config, recipe, tracker)
    finally:  # every run ends saying where its results are, a failed or killed one too
        _where_to_look(config, tracker, engine)
    if config.eval.after_train:  # _run_prepared runs on rank 0 only
        from slca_exp.evaluation.jobs import after_train
        from slca_exp.tracking.uris import resolve_tracking_uri

        run_id = tracker.run_ids().get("mlflow")
        print(f"slca-exp: {after_train(config, resolve_tracking_uri(cfg), run_id)}", flush=True)
    return result


def _remembering(
    engine: Engine,
    config: RunConfig,
) -> Callable[[object], None] | None:
    """Hand the engine the new runs' ids as soon as they are open (``remember_run_ids``).

    ``tracked_run`` calls it before any signal can stop the job, so a job requeued even before
    its engine started continues the same runs instead of opening new ones.
    """
    if not engine.checkpointable:
        return None

    def started(tracker: object) -> None:
        ids_of = getattr(tracker, "run_ids", None)
        engine.remember_run_ids(config, dict(ids_of()) if callable(ids_of) else {})

    return started


def _where_to_look(
    config: RunConfig,
    tracker: object,
    engine: Engine,
) -> None:
    """Say where the run was recorded, how to open and compare it, and what failed on the way.

    Only rank 0 of a multi-task job says it (the other ranks record nothing).
    """
    from slca_exp.core.process import global_rank
    from slca_exp.tracking.closing import run_lines, say

    if global_rank() != 0:
        return
    try:
        say(run_lines(config, tracker, engine.checkpoint(config)))
    except Exception as err:  # the run's status is final already; say what could not be said
        print(f"slca-exp: could not list where the run's results are: {err}", file=sys.stderr)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name=CONFIG_NAME)
def main(cfg: DictConfig) -> object:
    """Hydra entry point; a refused run exits 2, a killed one 143, without a traceback.

    Inside a submitit job (every task of it) the error is raised instead of exiting: submitit
    records an exception as the task's result, so the launching process learns at once that the
    job is over, even on a cluster whose accounting (``sacct``) says nothing.
    """
    with mirrored_to_job_log():  # the job's train.log keeps its slca-exp: lines
        in_submitit = bool(os.environ.get("SUBMITIT_EXECUTOR"))
        try:
            return run(cfg)
        except (ConfigError, RegistryError) as err:
            _report(err)
            if in_submitit:
                raise
            sys.exit(EXIT_BAD_CONFIG)
        except TrackingError as err:
            print(f"slca-exp: {err}", file=sys.stderr)
            if in_submitit:
                raise
            sys.exit(EXIT_TRACKING)
        except ServiceOutage as err:  # also verl's (its trainer raised it in a Ray actor)
            print(f"slca-exp: {outage_message(err)}", file=sys.stderr)
            if in_submitit:
                raise
            sys.exit(EXIT_OUTAGE)
        except (RunKilled, KeyboardInterrupt) as err:
            print("slca-exp: run stopped by a signal; recorded as KILLED", file=sys.stderr)
            if in_submitit:
                raise JobKilled(
                    f"run stopped by a signal ({err or 'scancel'}); recorded as KILLED"
                ) from None
            sys.exit(EXIT_KILLED)


def _report(err: ConfigError | RegistryError) -> None:
    print(f"slca-exp: {err}", file=sys.stderr)


def _hydra_output_dirs() -> tuple[str | None, ...]:
    """The job's output folder and, in a multirun, the sweep folder (its multirun.yaml)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return (None,)
    hc = HydraConfig.get()
    sweep = hc.sweep.dir if hc.mode == RunMode.MULTIRUN else None
    return hc.runtime.output_dir, sweep
