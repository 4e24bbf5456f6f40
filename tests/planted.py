"""Plant a secret through every config route, then look for it in everything a run leaves.

The routes: the environment variable a service's ``api_key_env`` names (the client sends it as
``Authorization: Bearer``), and a config value resolved from that variable
(``judge.name=${oc.env:...}``, recorded wherever the recipe goes). Credentials inside a URL are
the third route; they are refused before anything starts (``tests/test_preflight_on_cpu.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from mlflow import MlflowClient

SECRET = "sk-planted-4e1d9c7b2a"
SECRET_ENV = "SLCA_TEST_JUDGE_API_KEY"
PLANTED = [f"judge.api_key_env={SECRET_ENV}", f"judge.name=${{oc.env:{SECRET_ENV}}}"]
"""Overrides that carry :data:`SECRET` (from ``$SLCA_TEST_JUDGE_API_KEY``) into a run."""


def leaks(secret: str, folders: Iterable[Path], texts: Iterable[str] = ()) -> list[str]:
    """Every file under ``folders`` (binary ones included) and every text that holds ``secret``.

    Returns:
        The files' paths and ``"<text #i>"`` for each text, empty when there is no leak.

    """
    needle = secret.encode()
    found = [
        str(path)
        for folder in folders
        for path in Path(folder).rglob("*")
        if path.is_file() and needle in path.read_bytes()
    ]
    return found + [f"<text #{i}>" for i, text in enumerate(texts) if secret in text]


def mlflow_texts(client: MlflowClient, run_id: str, into: Path) -> list[str]:
    """A run's params, tags, traces and downloaded artifacts, as text to search (artifacts:
    ``into``)."""
    run = client.get_run(run_id)
    client.download_artifacts(run_id, "", str(into))
    return [repr(run.data.params), repr(run.data.tags), *run_traces(client, run_id)]


def run_traces(client: MlflowClient, run_id: str) -> list[str]:
    """Every trace linked to the run, as JSON text (its rollouts: prompts, calls, answers)."""
    import mlflow

    experiment = client.get_run(run_id).info.experiment_id
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(client.tracking_uri)
    try:
        traces = mlflow.search_traces(run_id=run_id, locations=[experiment], return_type="list")
    finally:
        mlflow.set_tracking_uri(previous)
    return [trace.to_json() for trace in traces]
