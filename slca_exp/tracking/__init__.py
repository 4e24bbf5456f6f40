"""Experiment tracking: trackers (MLflow, W&B, console), redaction, spool and replay, plots.

``base`` (the Tracker protocol, rank-0 gating, FINISHED/FAILED/KILLED lifecycle), ``build`` (the
:data:`TRACKERS` registry and the trackers of a config), ``mlflow`` / ``wandb`` / ``console``
(backends), ``store`` and ``uris`` (the MLflow store), ``mlflow_app`` (the UI's server),
``spool`` and ``replay`` (metrics kept while a server is away), ``redact`` (secrets), ``plots``,
``sweep_runs`` (the runs of a sweep), ``lineage`` (splits, prompts and the policy as MLflow
datasets, registered prompts and models), ``closing`` (where a run's results are),
``readback`` (a run and its logged rollouts read back from the store), ``rollout_text`` (a
rollout as terminal text).
The backends' modules are imported when a run builds them, so that importing this package stays
cheap.

A plugin (``SLCA_EXP_PLUGINS``) adds a tracker by registering a :class:`TrackerBackend`:
``TRACKERS.register("lab", TrackerBackend(LabTracker, keeps_files=True))``, then
``tracking.backends=[lab]``.
"""

from slca_exp.tracking.build import TRACKERS, TrackerBackend

__all__ = ["TRACKERS", "TrackerBackend"]
