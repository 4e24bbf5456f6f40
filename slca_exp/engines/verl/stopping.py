"""Stopping verl's trainer for a requeue, and resuming it without logging any step twice.

verl's trainer runs in a Ray actor (verl's TaskRunner), not in the process SLURM's time-limit
signal reaches first; the two meet through files in ``<run folder>/verl``:

    driver (engine.py)                         trainer (trainer.py, in verl's TaskRunner)
    the time-limit signal -> stop_request  ->  on_step_end: a verl checkpoint of this step
                                               (verl's own _save_checkpoint, where save_freq
                                               saves); the step's metrics are logged
                                               on_step_begin: every logged step is covered
                                               by a checkpoint -> StopForRequeue -> fit returns
    Stopped.read <- stopped.json           <-  Stopped(step, checkpoint).write
    -> RunPreempted -> the job requeues; verl resumes from its latest checkpoint
       (trainer.resume_mode=auto) at the next step, in the same MLflow run

A job stopped hard (SIGTERM or SIGKILL, a node lost) may have logged steps that its latest
checkpoint does not cover; the requeued job trains them again. :class:`SkipLogged` keeps the
run's history as it is: a step the MLflow run already holds is not logged again
(:func:`logged_through`), so no step is logged twice; each is logged by the job that first
finished it. verl saves a step before it logs it: a job killed in that moment leaves a step
that no job logs (the resumed trainer says so), never one logged twice.

verl's MLflow logger attaches to the run that holds our recipe, and ends it FINISHED whatever
happened (and so does MLflow when the process exits); :func:`end_recipe_run` ends it first with
the status the driver gives it too, so that whichever process writes last, the run is never
left RUNNING nor marked FINISHED by a job that was killed.

The driver answers signals while verl runs (:func:`answering_signals`): SIGTERM closes the runs
KILLED before ``srun`` kills the job's task, and the time-limit signal writes the stop request
at once; ``ray.init`` does not get to replace its SIGTERM handler (:func:`keeping_sigterm_handler`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slca_exp.engines.verl.keys import OUR_KEY

STOP_KEY = f"{OUR_KEY}.stop_request"
"""verl config key: the file whose existence asks the trainer to stop for a requeue."""
STOP_REQUEST_FILE = "stop_request"
"""``<run folder>/verl/stop_request``: written by the driver when the time limit is announced."""
STOPPED_FILE = "stopped.json"
"""``<run folder>/verl/stopped.json``: written by the trainer when it stopped for a requeue."""
STEP_METRIC = "training/global_step"
"""verl's own metric logged at every RL step (its value is the step)."""


class StopForRequeue(Exception):  # noqa: N818 - a stop, not an error
    """Raised at a step boundary: a stop was asked for and a checkpoint covers every step."""


@dataclass(frozen=True)
class Stopped:
    """Where the trainer stopped for a requeue."""

    step: int
    """The last RL step it finished and logged (0: it stopped before its first)."""
    checkpoint: str | None
    """verl's checkpoint folder the requeued job resumes from (``None``: none yet)."""

    def write(self, folder: str | Path) -> Path:
        """Write ``stopped.json`` into ``folder`` whole or not at all."""
        path = Path(folder) / STOPPED_FILE
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, folder: str | Path) -> Stopped | None:
        """The stop the trainer reported in ``folder``, or ``None`` (it did not stop early)."""
        try:
            data = json.loads((Path(folder) / STOPPED_FILE).read_text())
        except (OSError, ValueError):
            return None
        return cls(step=int(data["step"]), checkpoint=data.get("checkpoint"))


def clear(folder: str | Path) -> None:
    """Remove an earlier job's request and report: a new trainer starts in ``folder``."""
    for name in (STOP_REQUEST_FILE, STOPPED_FILE):
        (Path(folder) / name).unlink(missing_ok=True)


def logged_through(run_id: str, tracking_uri: str | None = None) -> int:
    """The last RL step the MLflow run ``run_id`` holds (0: none).

    Args:
        run_id: the run verl's logger writes to.
        tracking_uri: its store (MLflow's current one when ``None``).

    """
    from mlflow.tracking import MlflowClient

    history = MlflowClient(tracking_uri).get_metric_history(run_id, STEP_METRIC)
    return max((int(m.step) for m in history), default=0)


class SkipLogged:
    """verl's ``Tracking``, minus the steps the run already holds (a resumed, re-done step).

    Args:
        tracking: verl's ``Tracking`` object (``log(data, step, backend)``, ``finish``).
        through: steps ``1..through`` are in the run already; ``0`` logs everything.

    """

    def __init__(self, tracking: Any, through: int) -> None:  # noqa: ANN401 - verl's Tracking
        self.tracking = tracking
        self.through = through
        self.skipped: list[int] = []

    def log(self, data: Mapping[str, Any], step: int, backend: Any = None) -> None:  # noqa: ANN401
        """Log like verl's ``Tracking.log``, unless the run holds ``step`` already."""
        if 0 < step <= self.through:
            if step not in self.skipped:
                self.skipped.append(step)
                print(
                    f"slca-exp: the MLflow run holds RL step {step} already (an earlier job "
                    "logged it); not logging it again",
                    flush=True,
                )
            return
        self.tracking.log(data=data, step=step, backend=backend)

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401 - finish and the rest: verl's
        return getattr(self.tracking, name)


def end_recipe_run(status: str) -> None:
    """End the MLflow run verl's logger attached to in this process, with ``status``.

    verl's logger would end it FINISHED when the trainer returns or fails, and MLflow would at
    exit; ended here first, neither does (verl's logger ends only an active run).
    """
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None and mlflow.active_run() is not None:
        mlflow.end_run(status)


# -- the driver: signals while verl runs ----------------------------------------------------


@contextlib.contextmanager
def keeping_sigterm_handler() -> Iterator[None]:
    """Keep this process's SIGTERM handler across ``ray.init``, which installs Ray's own.

    Ray's handler exits at once; ours (``tracked_run``, the job's Ray bootstrap) raises
    ``RunKilled``, so that ``scancel`` closes the runs KILLED and stops the job's Ray nodes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)


def answering_signals(fn: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
    """``fn(*args, **kwargs)`` in a thread, while this (main) thread answers signals at once.

    verl's driver waits for its trainer in ``ray.get``, where Python runs signal handlers about
    once a second, and when SLURM cancels a job, ``srun`` kills its task about a second after
    the SIGTERM: waiting here instead, SIGTERM raises ``RunKilled`` at once and the runs are
    closed KILLED in time, and the time-limit signal asks the trainer to stop at once. (A
    ``ray.init`` in ``fn`` then leaves this process's SIGTERM handler alone, too.)

    Raises:
        Whatever ``fn`` raised, or what a signal's handler raised meanwhile.

    """
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            outcome["error"] = exc

    worker = threading.Thread(target=call, name="verl-driver", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(timeout=0.2)  # interrupted by a signal: its handler runs here
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")
