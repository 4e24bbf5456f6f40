"""``slca-exp ui``: the server command it runs and what it refuses. The server itself, its page
with the view-routing script, what the script does in a browser and stopping the server on
SIGTERM are checked in tests/tracking/test_mlflow_ui_browser.py."""

import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow import MlflowClient

from slca_exp.commands import main
from slca_exp.commands.ui import server_command
from slca_exp.core.tags import EXPERIMENT_KIND
from slca_exp.tracking import lineage


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def store(tmp_path):
    """A sqlite store with one experiment tagged for model training; its URI."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tags = {EXPERIMENT_KIND: lineage.TRAINING_KIND}
    MlflowClient(uri).create_experiment("slca-exp", tags=tags)
    return uri


@dataclass
class Answer:
    returncode: int
    stderr: str


@pytest.fixture
def ui(capsys, tmp_path, monkeypatch):
    """``slca-exp ui ARGS`` (the command line's own entry, in this process), run in tmp_path."""
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> Answer:
        status = main(["ui", *args])
        return Answer(status, capsys.readouterr().err)

    return run


def test_the_server_command_serves_the_slca_exp_app_on_the_store(store, tmp_path):
    assert server_command(store, "127.0.0.1", 5001) == [
        str(Path(sys.executable).with_name("mlflow")),
        "server",
        "--app-name",
        "slca-exp",
        "--backend-store-uri",
        store,
        "--host",
        "127.0.0.1",
        "--port",
        "5001",
        "--workers",
        "1",
        "--artifacts-destination",
        str(tmp_path / "mlartifacts"),
    ]


def test_a_missing_store_is_refused_and_not_created(ui, tmp_path):
    db = tmp_path / "none" / "mlflow.db"
    res = ui("--tracking-uri", f"sqlite:///{db}")
    assert res.returncode == 2
    assert f"slca-exp ui: no MLflow store at {db}" in res.stderr
    assert not db.parent.exists()


def test_a_tracking_server_is_refused_with_where_its_ui_is(ui):
    res = ui("--tracking-uri", "http://127.0.0.1:9")
    assert res.returncode == 2
    assert "is an MLflow tracking server: open its own UI at http://127.0.0.1:9" in res.stderr


def test_a_port_in_use_is_refused_naming_the_flag(ui, store):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = ui("--tracking-uri", store, "--port", str(port))
    assert res.returncode == 2
    assert f"slca-exp ui: port {port} on 127.0.0.1 is in use: pass --port" in res.stderr
