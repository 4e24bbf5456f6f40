"""Which MLflow store a run logs to, resolved the same way by every command that opens it.

The tracker (``tracking.mlflow_uri``, else ``sqlite:///<tracking.root>/mlflow.db``), the sweep
callback, ``slca-exp compare`` and ``slca-exp ui`` all resolve the store here, with local paths
made absolute so that jobs on other nodes or in other folders open the same store.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from omegaconf import DictConfig, OmegaConf

from slca_exp.config.paths import output_root
from slca_exp.tracking.mlflow import store_uri


def resolve_tracking_uri(config: DictConfig | None, explicit: str | None = None) -> str:
    """The tracking URI, resolved the way the MLflow tracker resolves it.

    Order: ``explicit`` (the callback's ``tracking_uri`` parameter, ``--tracking-uri``), then with
    a config the tracker's own choice (``tracking.mlflow_uri``, else
    ``sqlite:///<tracking.root>/mlflow.db``); without one ``$MLFLOW_TRACKING_URI``, else the
    default store ``sqlite:///<$SLCA_EXP_ROOT or outputs>/mlflow.db``. Relative paths are made
    absolute, so that jobs on other nodes or in other folders open the same store.
    """
    tracking = OmegaConf.select(config, "tracking", default=None) if config is not None else None
    if explicit:
        uri = explicit
    elif tracking is not None:
        uri = store_uri(tracking)
    else:
        root = os.environ.get("SLCA_EXP_ROOT") or "outputs"
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(root) / 'mlflow.db'}"
    return absolute_uri(str(uri))


def default_tracking_uri() -> str:
    """The store ``slca-exp train`` logs to with the default config (``slca-exp compare``)."""
    return resolve_tracking_uri(None)


def artifact_root(config: DictConfig | None, uri: str) -> Path | None:
    """The folder whose ``mlartifacts/`` holds a new experiment's artifacts.

    As the tracker picks it: ``tracking.root`` for the default sqlite store; beside the database
    for another sqlite store; None (the server's or MLflow's default) otherwise.
    """
    tracking = OmegaConf.select(config, "tracking", default=None) if config is not None else None
    if tracking is not None and uri == resolve_tracking_uri(config) and not tracking.mlflow_uri:
        return output_root(tracking)
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///") :]).parent
    return None


def local_store_path(uri: str) -> Path | None:
    """The database file or folder of a local (sqlite or file) store; None for a server."""
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///") :])
    if uri.startswith("file:"):
        return Path(urlparse(uri).path)
    return None


def absolute_uri(uri: str) -> str:
    """Make the path of a ``sqlite:///`` or ``file:`` URI (or a bare path) absolute."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///") :]).resolve())
    if uri.startswith("file:") and not uri.startswith("file:/"):
        return Path(uri[len("file:") :]).resolve().as_uri()
    if "://" not in uri and not uri.startswith("file:"):
        return Path(uri).resolve().as_uri()
    return uri
