"""The tracker runs verl's loggers write into: ours, so that one recipe is one run.

    tracker.run_ids()                      {"mlflow": id, "wandb": id}: the runs ours opened
      -> write_run_ids(folder, ids)        ``<run folder>/verl/run_ids.json``: a requeued job
                                           continues the same runs (saved_run_ids reads them)
      -> tracker_env(ids, worker env)      ``MLFLOW_RUN_ID``; ``WANDB_RUN_ID`` + ``WANDB_RESUME``
                                           in every verl worker's environment: the RL stage
      -> sft_env(config, env)              a child MLflow run of the recipe's (``<name>-sft``,
                                           tag ``slca.stage=sft``): the SFT stage
      -> end_run(config, id, status)       the child closed FINISHED, FAILED or KILLED

The SFT stage gets a run of its own because verl logs each trainer's whole config as
parameters, and the SFT trainer's ``trainer.*`` and ``data.*`` values differ from the RL
trainer's, which one run cannot hold.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from slca_exp.config.schema import RunConfig
from slca_exp.core.tags import PARENT_RUN, SFT_STAGE, STAGE

RUN_IDS_FILE = "run_ids.json"
"""``<run folder>/verl/run_ids.json``: the tracker runs an unfinished verl run logs to."""
FINISHED_FILE = "finished"
"""``<run folder>/verl/finished``: written when verl's trainer returned."""


def saved_run_ids(folder: Path) -> dict[str, str] | None:
    """The run ids an unfinished earlier run of ``folder`` logged to; ``None`` when finished."""
    path = folder / RUN_IDS_FILE
    if not path.is_file() or (folder / FINISHED_FILE).exists():
        return None
    try:
        ids = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return {str(k): str(v) for k, v in ids.items()} if isinstance(ids, dict) else None


def write_run_ids(folder: Path, run_ids: dict[str, str]) -> None:
    """``run_ids.json``, written atomically (a job may be stopped at any moment)."""
    tmp = folder / (RUN_IDS_FILE + ".tmp")
    tmp.write_text(json.dumps(run_ids, sort_keys=True))
    os.replace(tmp, folder / RUN_IDS_FILE)


def tracker_env(run_ids: dict[str, str], base: dict[str, str] | None = None) -> dict[str, str]:
    """Variables that make verl's loggers write into our tracker runs.

    Args:
        run_ids: backend -> run id (``tracker.run_ids()``).
        base: the workers' variables so far (kept, as text: an override such as
            ``ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS=1`` reads as a number).

    """
    env = {str(name): str(value) for name, value in (base or {}).items()}
    if "mlflow" in run_ids:
        env["MLFLOW_RUN_ID"] = run_ids["mlflow"]
    if "wandb" in run_ids:
        env["WANDB_RUN_ID"] = run_ids["wandb"]
        env["WANDB_RESUME"] = "allow"
    return env


def sft_env(config: RunConfig, env: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """The SFT stage's variables: the RL stage's, with a child MLflow run of the recipe's run.

    Returns:
        ``(variables, the child run's id or None)``; W&B gets a run of its own (no resume).

    """
    child_env = {
        k: v for k, v in env.items() if k not in ("MLFLOW_RUN_ID", "WANDB_RUN_ID", "WANDB_RESUME")
    }
    parent = env.get("MLFLOW_RUN_ID")
    if not parent:
        return child_env, None
    from mlflow.tracking import MlflowClient

    from slca_exp.tracking.mlflow import store_uri

    client = MlflowClient(store_uri(config.tracking))
    recipe_run = client.get_run(parent)
    name = f"{recipe_run.info.run_name or parent}-sft"
    tags = {PARENT_RUN: parent, STAGE: SFT_STAGE}
    child = client.create_run(recipe_run.info.experiment_id, run_name=name, tags=tags)
    child_env["MLFLOW_RUN_ID"] = child.info.run_id
    return child_env, child.info.run_id


def end_run(config: RunConfig, run_id: str | None, status: str) -> None:
    """Close an MLflow run we opened (``FAILED`` when the stage failed)."""
    if run_id is None:
        return
    from mlflow.tracking import MlflowClient

    from slca_exp.tracking.mlflow import store_uri

    MlflowClient(store_uri(config.tracking)).set_terminated(run_id, status)
