"""Build a run's tracker from its config: the chosen backends behind one object, rank 0 only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from slca_exp.tracking.base import MultiTracker, NullTracker, Tracker, global_rank
from slca_exp.tracking.redact import Redactor

if TYPE_CHECKING:
    from slca_exp.config.schema import RunConfig
    from slca_exp.recipe import Recipe

_MAX_RUN_NAME = 200


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

    """
    rank = global_rank() if rank is None else rank
    if rank != 0:
        return MultiTracker([], plots=False)
    name = run_name(config, recipe, redactor)
    tracking = config.tracking
    backends: list[Tracker] = []
    for backend in tracking.backends:
        if backend == "mlflow":
            from slca_exp.tracking.mlflow import MlflowTracker

            resume_id = (resume or {}).get("mlflow")
            backends.append(MlflowTracker(tracking, name, redactor, resume_run_id=resume_id))
        elif backend == "wandb":
            from slca_exp.tracking.wandb import WandbTracker

            backends.append(WandbTracker(tracking, name, redactor))
        elif backend == "console":
            from slca_exp.tracking.console import ConsoleTracker

            backends.append(ConsoleTracker(tracking.console_every))
    # Plots go to backends that keep files; the console only prints.
    keeps_files = any(b in ("mlflow", "wandb") for b in tracking.backends)
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
