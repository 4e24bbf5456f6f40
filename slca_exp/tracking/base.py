"""The Tracker protocol, a combinator, rank-0 gating and the run lifecycle (FINISHED/FAILED/KILLED).

A tracker receives the recipe and the resolved config once (``start``), metrics once per step
(``log_metrics``, names from ``slca_exp.core.names``), files (``log_artifact``) and the final
status (``finish``). ``tracked_run`` wraps an engine call so that a run is never left RUNNING:
an exception finishes it FAILED, SIGTERM or Ctrl-C finishes it KILLED.
"""

from __future__ import annotations

import json
import signal
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from slca_exp.core.process import RunKilled, in_main_thread, raise_killed, signals_deferred

if TYPE_CHECKING:
    from slca_exp.recipe import Recipe

Status = Literal["FINISHED", "FAILED", "KILLED"]
STATUSES: tuple[Status, ...] = ("FINISHED", "FAILED", "KILLED")


@runtime_checkable
class Tracker(Protocol):
    """What every experiment tracker implements."""

    def start(self, recipe: Recipe, params: Mapping[str, Any]) -> None:
        """Open the run and record the recipe and the resolved (redacted) config."""
        ...

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Record one step's metrics (names from ``slca_exp.core.names``)."""
        ...

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Attach a file to the run, under the folder ``artifact_path`` when given."""
        ...

    def finish(self, status: Status) -> None:
        """Close the run with its final status; idempotent."""
        ...


class NullTracker:
    """Records nothing: for ``tracking.backends=[]`` and for every rank but 0."""

    def start(self, recipe: Recipe, params: Mapping[str, Any]) -> None:
        """Do nothing."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Do nothing."""

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Do nothing."""

    def finish(self, status: Status) -> None:
        """Do nothing."""


class MultiTracker:
    """Several trackers fed as one, plus the end-of-run plots and a few conveniences.

    Args:
        trackers: the backends; each receives every call, in order.
        plots: render reward curves and advantage histograms at finish and log them.

    """

    def __init__(self, trackers: Sequence[Tracker], *, plots: bool = True) -> None:
        from slca_exp.tracking.plots import History

        self.trackers = list(trackers)
        self.history = History()
        self.plots = plots and bool(self.trackers)
        self.finished: Status | None = None

    def start(self, recipe: Recipe, params: Mapping[str, Any]) -> None:
        """Start every backend; if one fails, the ones already started are closed FAILED."""
        for i, tracker in enumerate(self.trackers):
            try:
                tracker.start(recipe, params)
            except BaseException:
                for started in self.trackers[:i]:
                    started.finish("FAILED")
                self.finished = "FAILED"
                raise

    def run_ids(self) -> dict[str, str]:
        """Backend name -> id of the run it logs to, for backends that have one (to resume)."""
        ids = {}
        for tracker in self.trackers:
            run_id = getattr(tracker, "run_id", None)
            if run_id:
                ids[getattr(tracker, "backend", type(tracker).__name__)] = run_id
        return ids

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Send one step to every backend (and keep it for the end-of-run plots)."""
        values = {k: float(v) for k, v in metrics.items()}
        self.history.add_metrics(values, step)
        for tracker in self.trackers:
            tracker.log_metrics(values, step)

    def log_advantages(self, samples: Mapping[str, Sequence[float]], step: int) -> None:
        """Keep one step's per-rollout segment advantages for the end-of-run histograms.

        Args:
            samples: segment (``tool`` / ``summary``) -> (n,) advantages of the rollouts where
                the segment is present (``slca_exp.tracking.plots.advantage_samples``).
            step: the training step.

        """
        self.history.add_advantages(samples, step)

    def log_rollouts(self, records: Sequence[Any], step: int, split: str) -> None:
        """Hand one logged step's rollout records to every backend that shows rollouts.

        MLflow: traces linked to the run, a table, a credit view and the records; W&B: a table;
        the console: nothing. A backend that fails reports it once; the run goes on.

        Args:
            records: ``slca_exp.rollouts.RolloutRecord`` of the step (``rollouts.select``).
            step: the RL step (validation: the step it ran at).
            split: ``train`` | ``val``.

        """
        for tracker in self.trackers:
            log = getattr(tracker, "log_rollouts", None)
            if callable(log):
                log(records, step, split)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Attach a file to every backend."""
        for tracker in self.trackers:
            tracker.log_artifact(path, artifact_path)

    def log_model(self, path: str | Path, *, name: str = "policy", step: int = 0) -> None:
        """Record the trained policy (a folder or a file) with every backend that keeps models.

        MLflow: a logged model of the run; W&B: a ``model`` artifact. Both copy the files, or
        with ``tracking.log_model=false`` only refer to them.

        Args:
            path: the weights, e.g. an HF checkpoint folder.
            name: the model's name.
            step: the training step the weights are from.

        """
        for tracker in self.trackers:
            log = getattr(tracker, "log_model", None)  # the console keeps no files
            if callable(log):
                log(path, name=name, step=step)

    def log_dict(
        self, data: Mapping[str, Any], name: str, artifact_path: str | None = None
    ) -> None:
        """Attach ``data`` as a JSON file called ``name``."""
        with tempfile.TemporaryDirectory(prefix="slca-exp-") as tmp:
            path = Path(tmp) / name
            path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
            self.log_artifact(path, artifact_path)

    def log_text(self, text: str, name: str, artifact_path: str | None = None) -> None:
        """Attach ``text`` as a file called ``name``."""
        with tempfile.TemporaryDirectory(prefix="slca-exp-") as tmp:
            path = Path(tmp) / name
            path.write_text(text)
            self.log_artifact(path, artifact_path)

    def finish(self, status: Status) -> None:
        """Log the plots (best effort), then finish every backend once."""
        if self.finished is not None:
            return
        self.finished = status
        if self.plots:
            from slca_exp.tracking.plots import render_run_plots

            with tempfile.TemporaryDirectory(prefix="slca-exp-plots-") as tmp:
                # A plot that cannot be drawn must not turn a finished run into a failed one.
                try:
                    files = render_run_plots(self.history, Path(tmp))
                except Exception as err:  # noqa: BLE001
                    print(f"slca-exp: end-of-run plots skipped: {err}")
                    files = []
                for path in files:
                    self.log_artifact(path, "plots")
        for tracker in self.trackers:
            tracker.finish(status)


@contextmanager
def tracked_run(
    tracker: Tracker,
    recipe: Recipe,
    params: Mapping[str, Any],
    started: Callable[[Any], None] | None = None,
) -> Iterator[Tracker]:
    """Start ``tracker``, yield it, and always finish it with the right status.

    FINISHED when the block ends, FAILED when it raises, KILLED on SIGTERM (the handler raises
    :class:`RunKilled`, which is re-raised after the tracker is closed) or Ctrl-C.

    Args:
        tracker: the run's trackers.
        recipe: recorded when the tracker starts.
        params: the composed config, logged as parameters.
        started: called with the started tracker before any signal can stop the run, e.g. to
            note its run ids where a requeued job finds them: a signal that arrives while the
            runs are being opened is delivered only after it returns.

    """
    previous = None
    if in_main_thread():
        previous = signal.signal(signal.SIGTERM, raise_killed)
    try:
        try:
            # A signal held back here is raised as the block ends: the run then closes KILLED.
            with signals_deferred():
                tracker.start(recipe, params)
                if started is not None:
                    started(tracker)
            yield tracker
        except (RunKilled, KeyboardInterrupt):
            tracker.finish("KILLED")
            raise
        except BaseException:
            tracker.finish("FAILED")
            raise
        tracker.finish("FINISHED")
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
