"""A served judge on a real SLURM: ``slca-exp serve up``, runs that resolve it, ``serve down``.

The service is ``service=loopback_judge``: the project's OpenAI-compatible loopback server as the
definition's own command, submitted through the same path as a vLLM service (a SLURM job of its
own, recorded in the registry once ``/v1/models`` lists its model). It requires an API key,
handed over in its environment only. The module serves it once; the tests, in order:

- ``serve up`` / ``status``: recorded with its job, host:port, model and server version;
- a 2-job sweep (``-m judge.service=loopback_judge seed=0,1``, SLURM jobs, the default judge
  otherwise) resolves it at job start and is judged through it, by the model it serves; the
  recipe and the parent run record the service; no key anywhere;
- a run whose judge model is not the service's is refused, naming ``judge.model``;
- the service's job killed mid-run: the run counts judge failures and goes on, ``status`` says
  dead, ``serve up`` starts it again under the same name, and the run follows it;
- ``serve down`` leaves nothing running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from slca_exp.services.served import ServiceRegistry
from tests.launch.test_slurm import SMALL, TINY_LOCAL, mlflow_runs
from tests.launch.test_verl_slurm_on_cpu import _job_processes
from tests.planted import PLANTED, SECRET, SECRET_ENV, leaks, mlflow_texts

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.usefixtures("slurm")]

REPO = Path(__file__).resolve().parents[2]
EXE = str(Path(sys.executable).parent / "slca-exp")
NAME = "loopback_judge"
MODEL = "loopback-judge"
SERVE_SMALL = ["launcher=slurm_cpu", "launcher.partition=null"]
JUDGED = [  # every rollout is judged (no short-circuit), by the served judge, with the key
    f"judge.service={NAME}",  # the default judge: the run takes judge=served, the model it serves
    "judge.max_tokens=1024",  # within the max_model_len the service reports (4096)
    "judge.short_circuit_no_tool_response=false",
    "judge.min_reply_chars=0",
    "judge.cache=false",
    "judge.max_retries=0",
    "judge.timeout_s=5",
    "reward.judge_failure=absent",
    *PLANTED,
]


class Served:
    """The module's registry, and the commands run against it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.registry = ServiceRegistry(folder / "registry")
        self.env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "SLCA_EXP_SERVICES": str(self.registry.folder),
            SECRET_ENV: SECRET,
        }
        self.env.pop("MLFLOW_TRACKING_URI", None)
        self.outputs: list[str] = []

    def cli(self, *args: str, timeout: float = 300, **extra: str) -> subprocess.CompletedProcess:
        res = subprocess.run(
            [EXE, *args],
            cwd=self.folder,
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        self.outputs.append(res.stdout + res.stderr)
        return res

    def up(self) -> subprocess.CompletedProcess:
        return self.cli("serve", "up", f"service={NAME}", *SERVE_SMALL, serve_key())

    def record(self):
        return self.registry.record(NAME)

    def stats(self) -> dict:
        base = self.record().base_url
        with __import__("urllib.request").request.urlopen(f"{base}/loopback/stats") as r:
            return json.loads(r.read())


def serve_key() -> str:
    return f"service.api_key_env={SECRET_ENV}"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    served = Served(tmp_path_factory.mktemp("served"))
    res = served.up()
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        yield served
    finally:
        served.cli("serve", "down", "--all")


def test_serve_up_records_the_service_and_status_shows_it_up(served):
    out = served.outputs[0]
    record = served.record()
    assert f"slca-exp: submitted service {NAME} as SLURM job {record.job_id}, log: " in out
    assert f"slca-exp: service {NAME} answers at {record.base_url}" in out
    assert record.served_model_name == "loopback-judge" and record.max_model_len == 4096
    assert record.server_version == "loopback-1" and record.role == "judge"
    assert record.api_key_env == SECRET_ENV and record.launcher == "slurm_cpu"
    res = served.cli("serve", "status")
    assert res.returncode == 0
    (line,) = [x for x in res.stdout.splitlines() if x.startswith(NAME)]
    assert line.split()[1:4] == ["judge", "up", record.job_id]
    assert record.base_url in line
    # up again while it is up: left alone
    res = served.up()
    assert res.returncode == 0 and f"service {NAME} is up" in res.stdout
    assert served.record().job_id == record.job_id


def test_a_two_job_sweep_resolves_and_shares_the_served_judge(served):
    before = served.stats()["requests"]
    out = served.folder / "sweep"
    res = served.cli(
        "train",
        "-m",
        *SMALL,
        *TINY_LOCAL,
        *JUDGED,
        "engine.rl.steps=2",
        "seed=0,1",
        f"tracking.root={out / 'out'}",
        f"hydra.sweep.dir={out / 'multirun'}",
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    record = served.record()
    client, (parent,), children = mlflow_runs(out)
    assert len(children) == 2 and all(c.info.status == "FINISHED" for c in children)
    assert parent.data.tags["slca.service.judge"] == f"{NAME}@{record.fingerprint[:12]}"
    for child in children:
        recipe = json.loads(
            Path(client.download_artifacts(child.info.run_id, "recipe.json", str(out))).read_text()
        )
        assert recipe["judge"]["service"] == record.identity()
        assert (recipe["judge"]["backend"], recipe["judge"]["model"]) == ("openai", MODEL)
        assert recipe["endpoints"] == {"judge": record.base_url}
        assert child.data.metrics["judge/failures"] == 0
        assert child.data.metrics["judge/requests"] > 0
    assert len({c.data.tags["slca.fingerprint"] for c in children}) == 1
    assert served.stats()["requests"] > before  # judged through the served endpoint
    texts = [t for c in children for t in mlflow_texts(client, c.info.run_id, out / "art")]
    texts += mlflow_texts(client, parent.info.run_id, out / "art-parent")
    assert leaks(SECRET, [served.registry.folder, out], [*texts, *served.outputs]) == []


def test_a_run_whose_judge_is_not_the_services_model_is_refused_naming_the_key(served):
    res = served.cli("validate", *JUDGED, "judge.model=openai/gpt-oss-120b", "--offline")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "judge.model: the service 'loopback_judge' serves 'loopback-judge'" in res.stderr
    res = served.cli("validate", *JUDGED, "judge.service=nobody", "--offline")
    assert res.returncode == 2 and "judge.service: no service 'nobody'" in res.stderr


def test_a_service_killed_mid_run_is_counted_restarted_and_followed(served):
    first = served.record()
    out = served.folder / "killed"
    steps = 60
    proc = subprocess.Popen(
        [
            EXE,
            "train",
            *TINY_LOCAL,
            *JUDGED,
            "engine.name=paced_local",
            f"engine.rl.steps={steps}",
            "tracking.log_model=false",
            f"tracking.root={out / 'out'}",
        ],
        cwd=served.folder,
        env={**served.env, "SLCA_EXP_PLUGINS": "tests.launch.paced_plugin", "PACE_S": "0.5"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        history = _waiting_for(proc, out, lambda h: sum(1 for f in h.values() if f == 0) >= 3)
        subprocess.run(["scancel", first.job_id], check=True)  # the service's job dies
        history = _waiting_for(proc, out, lambda h: any(f > 0 for f in h.values()))
        status = served.cli("serve", "status").stdout
        (line,) = [x for x in status.splitlines() if x.startswith(NAME)]
        assert line.split()[2] == "dead", status
        res = served.up()  # the same name, started again
        assert res.returncode == 0 and "starting it again" in res.stdout, res.stdout + res.stderr
        second = served.record()
        assert second.job_id != first.job_id and second.base_url != first.base_url
        output = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-3000:]
    history = _judge_failures(out)
    assert sorted(history) == list(range(1, steps + 1))
    failed = [s for s, f in history.items() if f > 0]
    assert failed and max(failed) < steps - 3, history  # failures while it was down only
    assert all(history[s] == 0 for s in range(max(failed) + 1, steps + 1))
    assert f"judge: the service now answers at {second.base_url}" in output
    client = _client(out)
    (run,) = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert run.info.status == "FINISHED" and "slca.outage.judge" in run.data.tags


def test_serve_down_leaves_nothing_running(served):
    record = served.record()
    res = served.cli("serve", "down", NAME)
    assert res.returncode == 0 and f"service {NAME} is down (job {record.job_id})" in res.stdout
    assert served.registry.names() == []
    squeue = subprocess.run(
        ["squeue", "-h", "-j", record.job_id, "-o", "%T"], capture_output=True, text=True
    )
    assert squeue.stdout.strip() in ("", "COMPLETED", "CANCELLED")
    assert _job_processes(record.job_id) == []
    res = served.cli("serve", "status")
    assert "no service in the registry" in res.stdout
    res = served.cli("serve", "down", NAME)
    assert res.returncode == 2 and f"no service '{NAME}'" in res.stderr


def _client(out: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{out / 'out' / 'mlflow.db'}")


def _judge_failures(out: Path) -> dict[int, float]:
    """Step -> the step's judge failures, of the folder's one run (empty before it logs).

    The store is read only once the run has finished a step (its ``state.json``): by then the
    run created the store's tables, which a reader must not race it to.
    """
    if not list((out / "out" / "runs").glob("*/state.json")):
        return {}
    client = _client(out)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    if not runs:
        return {}
    return {
        m.step: m.value for m in client.get_metric_history(runs[0].info.run_id, "judge/failures")
    }


def _waiting_for(proc: subprocess.Popen, out: Path, done, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        history = _judge_failures(out)
        if done(history):
            return history
        time.sleep(0.5)
    pytest.fail(f"the run did not get there within {timeout} s: {_judge_failures(out)}")
