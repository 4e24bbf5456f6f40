"""``slca-exp ui``: MLflow's server on a run store, its UI page carrying the view-routing script.
What the script does in a browser is checked in tests/tracking/test_mlflow_ui_browser.py."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

from slca_exp.core.tags import EXPERIMENT_KIND
from slca_exp.tracking import lineage
from slca_exp.ui import server_command

SLCA_EXE = str(Path(sys.executable).parent / "slca-exp")


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


def ui(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SLCA_EXE, "ui", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


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


def test_a_missing_store_is_refused_and_not_created(tmp_path):
    db = tmp_path / "none" / "mlflow.db"
    res = ui("--tracking-uri", f"sqlite:///{db}", cwd=tmp_path)
    assert res.returncode == 2
    assert f"slca-exp ui: no MLflow store at {db}" in res.stderr
    assert not db.parent.exists()


def test_a_tracking_server_is_refused_with_where_its_ui_is(tmp_path):
    res = ui("--tracking-uri", "http://127.0.0.1:9", cwd=tmp_path)
    assert res.returncode == 2
    assert "is an MLflow tracking server: open its own UI at http://127.0.0.1:9" in res.stderr


def test_a_port_in_use_is_refused_naming_the_flag(store, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = ui("--tracking-uri", store, "--port", str(port), cwd=tmp_path)
    assert res.returncode == 2
    assert f"slca-exp ui: port {port} on 127.0.0.1 is in use: pass --port" in res.stderr


def test_ui_serves_the_page_with_the_routing_script_and_stops_on_sigterm(store, tmp_path):
    port = free_port()
    log = tmp_path / "ui.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [SLCA_EXE, "ui", "--tracking-uri", store, "--port", str(port)],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                page = urllib.request.urlopen(f"{url}/", timeout=2).read().decode()
                break
            except OSError:
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.3)
        assert page.startswith('<!doctype html><html lang="en"><head><script>')
        assert '"custom_model_development": "machine_learning"' in page
        assert "main." in page  # MLflow's own bundle is still loaded
        experiment = MlflowClient(store).get_experiment_by_name("slca-exp").experiment_id
        printed = log.read_text()
        assert f"slca-exp ui: MLflow UI on {store} at {url}" in printed
        assert f"slca-exp ui:   slca-exp: {url}/#/experiments/{experiment}" in printed
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # The server went with it: nothing listens on the port any more.
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
