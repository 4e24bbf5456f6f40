"""A real ``mlflow server`` on 127.0.0.1, killed mid-run and restarted: every step lands once."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

from slca_exp.preflight.compose import compose_run
from slca_exp.preflight.validate import validate
from slca_exp.recipe import build_recipe
from slca_exp.tracking import lineage
from slca_exp.tracking.mlflow import MlflowTracker, mlflow_key
from slca_exp.tracking.redact import Redactor
from tests.tracking.synthetic import step_metrics

MLFLOW = shutil.which("mlflow") or str(Path(sys.executable).parent / "mlflow")

pytestmark = pytest.mark.slow


class Server:
    """``mlflow server`` in its own process group, so SIGKILL takes its workers too."""

    def __init__(self, root: Path) -> None:
        self.root = root
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, workers: int = 1) -> None:
        log = (self.root / "server.log").open("a")
        self.proc = subprocess.Popen(
            [
                MLFLOW,
                "server",
                "--backend-store-uri",
                f"sqlite:///{self.root / 'mlflow.db'}",
                "--artifacts-destination",
                str(self.root / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                str(workers),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"mlflow server did not start: {(self.root / 'server.log').read_text()}")

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)  # the group this test created
        self.proc.wait(timeout=30)
        self.proc = None


@pytest.fixture
def server(tmp_path):
    srv = Server(tmp_path)
    srv.start()
    yield srv
    if srv.proc is not None:
        srv.kill()


def test_server_killed_mid_run_and_restarted_keeps_every_step_once(server, tmp_path, monkeypatch):
    for var in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("SLCA_EXP_PARENT_RUN_ID", raising=False)
    config = validate(
        compose_run(
            [
                f"tracking.root={tmp_path / 'client'}",
                f"tracking.mlflow_uri={server.url}",
                "tracking.retry_every_s=0.2",
                "tracking.flush_timeout_s=120",
                "tracking.http_retries=0",
            ]
        )
    )
    recipe = build_recipe(config)
    tracker = MlflowTracker(config.tracking, "resilience", Redactor())
    tracker.start(recipe, {"seed": 1})
    metrics = {}

    def log(steps):
        for step in steps:
            metrics, _ = step_metrics(step)
            tracker.log_metrics(metrics, step)
            time.sleep(0.05)
        return metrics

    metrics = log(range(0, 5))
    server.kill()
    log(range(5, 10))  # unreachable: spooled
    assert len(tracker.spool) == 5 and tracker.spool.path.exists()
    server.start()
    time.sleep(0.3)  # past retry_every_s: the next step replays the spool first
    log(range(10, 15))
    assert len(tracker.spool) == 0
    server.kill()
    log(range(15, 20))
    assert len(tracker.spool) == 5
    # The server returns while finish() is retrying: the spool is replayed at finish.
    restart = threading.Timer(1.0, server.start)
    restart.start()
    tracker.finish("FINISHED")
    restart.join()
    assert not tracker.spool.path.exists()

    client = MlflowClient(server.url)
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED"
    assert set(run.data.metrics) == {mlflow_key(k) for k in metrics}
    for key in run.data.metrics:
        steps = [m.step for m in client.get_metric_history(tracker.run_id, key)]
        assert sorted(steps) == list(range(20)), key

    # Through the server too: the splits as datasets, the templates from its prompt registry
    # (registering one again gives the same version), the policy as a logged model.
    files = recipe.data["files"]
    expected = {f"synthetic-{split}": f["sha256"][:12] for split, f in files.items()}
    assert lineage.run_datasets(run) == expected
    linked = {p["name"]: p["version"] for p in lineage.linked_prompts(run)}
    for group, entry in recipe.prompts.items():
        again = lineage.register_prompt(
            client, entry["name"], recipe.prompt_texts[group], entry["sha256"]
        )
        assert linked[entry["name"]] == str(again.version)
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "config.json").write_text("{}")
    model = lineage.log_policy(
        client, tracker.run_id, policy, name="policy", fingerprint="f", step=19, copy=True
    )
    assert {f.path for f in client.list_logged_model_artifacts(model.model_id)} == {"config.json"}


def _start_run(config, recipe, go, out) -> None:
    """One job of a sweep: open its run (datasets, prompts) at the barrier, finish it."""
    try:
        tracker = MlflowTracker(config.tracking, f"racer-{os.getpid()}", Redactor())
        go.wait()
        tracker.start(recipe, {"seed": 0})
        tracker.finish("FINISHED")
        out.put(("ok", tracker.run_id))
    except BaseException as err:  # noqa: BLE001 - reported by the test
        out.put(("failed", f"{type(err).__name__}: {err}"))


def test_eight_runs_racing_to_record_one_dataset_and_prompt_share_the_one_record(tmp_path):
    """Eight jobs start at one barrier against a server with 4 workers: each run's datasets and
    prompts are the one record of each, whoever created it (a uniqueness conflict is "it exists
    now")."""
    import multiprocessing
    import sqlite3

    server = Server(tmp_path)
    server.start(workers=4)
    try:
        config = validate(
            compose_run(
                [f"tracking.root={tmp_path / 'client'}", f"tracking.mlflow_uri={server.url}"]
            )
        )
        recipe = build_recipe(config)
        fork = multiprocessing.get_context("fork")
        go, out = fork.Barrier(8), fork.Queue()
        procs = [fork.Process(target=_start_run, args=(config, recipe, go, out)) for _ in range(8)]
        for proc in procs:
            proc.start()
        results = [out.get(timeout=300) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
        assert all(kind == "ok" for kind, _ in results), results
        client = MlflowClient(server.url)
        runs = [client.get_run(run_id) for _, run_id in results]
        datasets = {frozenset(lineage.run_datasets(run).items()) for run in runs}
        prompts = {json.dumps(lineage.linked_prompts(run), sort_keys=True) for run in runs}
        splits = len(lineage.split_datasets(recipe))
        assert len(datasets) == 1 and len(next(iter(datasets))) == splits, datasets
        assert len(prompts) == 1 and json.loads(prompts.pop()), prompts
        for entry in lineage.linked_prompts(runs[0]):
            versions = lineage.prompt_versions(client, entry["name"])
            assert [str(v.version) for v in versions] == [entry["version"]], versions
        with sqlite3.connect(tmp_path / "mlflow.db") as db:
            rows = db.execute("SELECT name, COUNT(*) FROM datasets GROUP BY name").fetchall()
            links = db.execute(
                "SELECT COUNT(DISTINCT destination_id) FROM inputs WHERE source_type = 'DATASET'"
            ).fetchone()
        assert sorted(n for _, n in rows) == [1] * splits, rows  # one dataset record each
        assert links == (8,)
    finally:
        server.kill()
