"""Experiment tracking: metric names, trackers (MLflow, W&B, console), redaction, plots, sweeps.

``base`` (the Tracker protocol, rank-0 gating, FINISHED/FAILED/KILLED lifecycle), ``build`` (the
trackers of a config), ``mlflow`` / ``wandb`` / ``console`` (backends), ``spool`` and ``replay``
(metrics kept while a server is away), ``redact`` (secrets), ``plots``, ``names``, ``sweep``,
``lineage`` (splits, prompts and the policy as MLflow datasets, registered prompts and models).
Submodules are imported where used, so that importing the metric names stays cheap.
"""
