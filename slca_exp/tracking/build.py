"""Build a run's tracker from its config: the chosen backends behind one object, rank 0 only.

    tracking.backends --TRACKERS--> TrackerBackend.build(tracking, run name, redactor, resume id)
                                    --> MultiTracker (plots when a backend keeps files)

Every backend is an entry of :data:`TRACKERS`. The built-in ones import their module when a run
builds them, so that validating a recipe never pays for importing MLflow or W&B; plugins
(``SLCA_EXP_PLUGINS``) register theirs the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slca_exp.core.process import global_rank
from slca_exp.registry import Registry
from slca_exp.tracking.base import MultiTracker, NullTracker, Tracker
from slca_exp.tracking.redact import Redactor

if TYPE_CHECKING:
    from slca_exp.config.schema import RunConfig, TrackingConfig
    from slca_exp.recipe import Recipe

_MAX_RUN_NAME = 200


@dataclass(frozen=True)
class TrackerBackend:
    """A tracker backend as registered in :data:`TRACKERS`.

    Attributes:
        build: ``build(tracking, run_name, redactor, resume_run_id)``: the backend's tracker for
            one run, from the ``tracking`` config, the run's name, the redactor every value it
            writes goes through, and the id of the run an interrupted job of this config logged
            to (``None``: a new run; a backend that cannot continue a run ignores it).
        keeps_files: the backend stores files, so the end-of-run plots are made for it.

    """

    build: Callable[[TrackingConfig, str, Redactor, str | None], Tracker]
    keeps_files: bool


TRACKERS: Registry[TrackerBackend] = Registry("tracker")
"""Tracker backends, keyed by the names ``tracking.backends`` lists."""


def _mlflow(tracking: TrackingConfig, name: str, redactor: Redactor, resume: str | None) -> Tracker:
    from slca_exp.tracking.mlflow import MlflowTracker

    return MlflowTracker(tracking, name, redactor, resume_run_id=resume)


def _wandb(tracking: TrackingConfig, name: str, redactor: Redactor, resume: str | None) -> Tracker:
    from slca_exp.tracking.wandb import WandbTracker

    return WandbTracker(tracking, name, redactor)


def _console(
    tracking: TrackingConfig, name: str, redactor: Redactor, resume: str | None
) -> Tracker:
    from slca_exp.tracking.console import ConsoleTracker

    return ConsoleTracker(tracking.console_every)


TRACKERS.register("mlflow", TrackerBackend(_mlflow, keeps_files=True))
TRACKERS.register("wandb", TrackerBackend(_wandb, keeps_files=True))
TRACKERS.register("console", TrackerBackend(_console, keeps_files=False))  # it only prints


def build_tracker(
    config: RunConfig,
    recipe: Recipe,
    redactor: Redactor,
    *,
    rank: int | None = None,
    resume: dict[str, str] | None = None,
) -> MultiTracker:
    """The tracker of a run: every backend of ``tracking.backends``, or none off rank 0.

    Args:
        config: the validated run config.
        recipe: its recipe (names the run when ``run_name`` is not set).
        redactor: applied by every backend to what it writes.
        rank: the global rank (default: read from the launcher's environment).
        resume: backend -> run id of an interrupted run of this job, to continue it.

    Raises:
        UnknownNameError: a backend is not registered in :data:`TRACKERS`.

    """
    rank = global_rank() if rank is None else rank
    if rank != 0:
        return MultiTracker([], plots=False)
    name = run_name(config, recipe, redactor)
    tracking = config.tracking
    chosen = {backend: TRACKERS.get(backend) for backend in tracking.backends}
    backends = [
        entry.build(tracking, name, redactor, (resume or {}).get(backend))
        for backend, entry in chosen.items()
    ]
    keeps_files = any(entry.keeps_files for entry in chosen.values())
    return MultiTracker(backends or [NullTracker()], plots=tracking.plots and keeps_files)


def run_name(config: RunConfig, recipe: Recipe, redactor: Redactor) -> str:
    """``run_name`` if set, else the job's Hydra overrides, else ``<estimator>-<fingerprint>``."""
    if config.run_name:
        return redactor.text(config.run_name)
    overrides = [o for o in _task_overrides() if not o.lstrip("+~").startswith("hydra")]
    if overrides:
        return redactor.text(",".join(sorted(overrides)))[:_MAX_RUN_NAME]
    return f"{recipe.algorithm['name']}-{recipe.short_fingerprint}"


def _task_overrides() -> list[str]:
    """The current Hydra job's overrides ([] outside a Hydra job)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return list(HydraConfig.get().overrides.task)
