"""A real vLLM judge on SLURM: ``slca-exp serve up service=tiny_vllm_judge``, a run through it.

The service is vLLM's CPU build (``service.device=cpu``) serving the built-in backbone of
``experiment=verl_smoke``, built on the node, with ``max_model_len`` 1024, as a SLURM job of its
own. It is started once for the module (about 2 minutes on a busy 2-core host, most of it vLLM's
start); the tests, in order:

- ``serve up`` records it: vLLM's own version, the model id, the length the server reports;
- ``validate`` with the shipped ``judge.max_tokens=8192`` is refused before anything runs,
  naming ``judge.max_tokens`` and the server's 1024, whether the run names the service or its
  URL; a ``train`` with it stops before its first step, and fits once the budget does;
- a short ``train`` judges through it: the run records the service's identity; the tiny model's
  replies are not ratings, so they are failed judgments, counted, and the run finishes;
- ``serve down`` leaves nothing running.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.launch import test_serve_slurm as loopback_served
from tests.launch.test_slurm import TINY_LOCAL
from tests.launch.test_verl_slurm_on_cpu import _job_processes
from tests.skip_policy import require

require("vllm", reason="needs vLLM's CPU build (make install)")
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.usefixtures("slurm")]

NAME, MODEL, LENGTH = "tiny_vllm_judge", "tiny-judge", 1024
UP = ["service=tiny_vllm_judge", "launcher.partition=null"]
JUDGED = [  # every rollout goes to the judge; a failed judgment is absent, never a score
    f"judge.service={NAME}",
    "judge.short_circuit_no_tool_response=false",
    "judge.min_reply_chars=0",
    "judge.cache=false",
    "judge.max_retries=0",
    "judge.timeout_s=60",
    "reward.judge_failure=absent",
]


class Served(loopback_served.Served):
    """The loopback module's registry and commands, for the vLLM service."""

    def record(self):
        return self.registry.record(NAME)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    served = Served(tmp_path_factory.mktemp("served-vllm"))
    served.started = served.cli("serve", "up", *UP, timeout=1200)
    try:
        assert served.started.returncode == 0, served.started.stdout + served.started.stderr
        yield served
    finally:
        served.cli("serve", "down", "--all")


def test_serve_up_starts_vllms_cpu_build_and_records_what_it_serves(served):
    import vllm

    record = served.record()
    out = served.started.stdout + served.started.stderr
    assert f"slca-exp: service {NAME} answers at {record.base_url}" in out
    assert record.server_version == vllm.__version__  # what vLLM's GET /version says
    assert (record.served_model_name, record.max_model_len) == (MODEL, LENGTH)
    assert Path(record.command[0]).name == "vllm" and record.command[1] == "serve"
    assert Path(record.command[2], "config.json").is_file()  # the built-in backbone, built
    with urllib.request.urlopen(f"{record.base_url}/models", timeout=10) as answer:
        (card,) = json.loads(answer.read())["data"]
    assert (card["id"], card["max_model_len"]) == (MODEL, LENGTH)


@pytest.mark.parametrize("how", ["service", "url"])
def test_a_judge_budget_the_server_cannot_take_is_refused_naming_the_key_and_its_limit(
    served, how
):
    record = served.record()
    judge = (
        [f"judge.service={NAME}"]
        if how == "service"
        else ["judge=openai", f"judge.base_url={record.base_url}", f"judge.model={MODEL}"]
    )
    res = served.cli("validate", *judge, "judge.max_tokens=8192")
    assert res.returncode == 2, res.stdout + res.stderr
    (line,) = [x for x in res.stderr.splitlines() if x.strip().startswith("judge.max_tokens")]
    assert "8192" in line and f"max_model_len {LENGTH}" in line and record.base_url in line
    # the prompt's floor, counted by the served model's own tokenizer (vLLM's POST /tokenize)
    assert "the judge's prompt is " in line and " tokens before any rollout text" in line
    res = served.cli("validate", *judge, "judge.max_tokens=64")
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_run_with_that_budget_stops_before_its_first_step(served):
    out = served.folder / "refused"
    res = served.cli(
        "train", *TINY_LOCAL, *JUDGED, "judge.max_tokens=8192", f"tracking.root={out}"
    )
    assert res.returncode != 0
    assert "judge.max_tokens" in res.stderr and f"max_model_len {LENGTH}" in res.stderr
    assert not list(out.glob("runs/*/state.json"))  # no step was taken


def test_a_short_run_judges_through_the_real_vllm_and_counts_what_it_cannot_use(served):
    out = served.folder / "judged"
    res = served.cli(
        "train", *TINY_LOCAL, *JUDGED, "judge.max_tokens=32", "engine.rl.steps=2",
        f"tracking.root={out}",
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    record = served.record()
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    (run,) = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert run.info.status == "FINISHED"
    recipe = json.loads(
        Path(client.download_artifacts(run.info.run_id, "recipe.json", str(out))).read_text()
    )
    assert recipe["judge"]["service"] == record.identity()
    assert recipe["endpoints"] == {"judge": record.base_url}
    history = {
        key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        for key in ("judge/requests", "judge/failures")
    }
    asked, failed = history["judge/requests"], history["judge/failures"]
    assert sorted(asked) == sorted(failed) == [1, 2]
    assert sum(asked.values()) > 0  # judged through the served vLLM
    # the tiny model's replies are no ratings: failed judgments, each counted, none a score
    assert all(0 <= failed[s] <= asked[s] for s in asked)
    assert sum(failed.values()) > 0, history


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
