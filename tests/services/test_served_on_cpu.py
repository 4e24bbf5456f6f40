"""Service definitions, the `vllm serve` command line, the registry and a run's resolution.

Everything here runs without SLURM: the registry is a temporary folder, the served model a
loopback server in a thread (it lists its models at ``/v1/models`` as vLLM does). The service's
job itself runs in a subprocess (it installs signal handlers, as on a node).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.core.problems import ConfigError
from slca_exp.launch.profiles import LauncherProfile
from slca_exp.launch.service_definitions import launcher_problems, load_service
from slca_exp.preflight.compose import compose_run
from slca_exp.preflight.validate import validate
from slca_exp.recipe import build_recipe
from slca_exp.services.client import ChatClient, ChatRequest
from slca_exp.services.definition import (
    ServiceDefinition,
    definition_fingerprint,
    identity_fields,
    vllm_command,
)
from slca_exp.services.loopback import serve_in_thread
from slca_exp.services.served import (
    ServiceRecord,
    ServiceRegistry,
    ask_server,
    resolve_services,
)
from slca_exp.services.vllm_line import line_problems

REPO = Path(__file__).resolve().parents[2]


def paper_service(name: str) -> ServiceDefinition:
    definition, _, _, problems = load_service(name, launcher_overrides=["launcher.partition=null"])
    assert definition is not None, problems
    return definition


def test_the_paper_services_vllm_command_lines_flag_by_flag():
    """The public code's serve scripts at commit 68539c5, value by value.

    rl/judge/serve_llm_judge_gpt_oss.sh: TENSOR_PARALLEL_SIZE=8, MAX_MODEL_LEN=16384,
    GPU_MEMORY_UTILIZATION=0.85, MAX_NUM_SEQS=6000, --async-scheduling --enable-prefix-caching
    --enable-chunked-prefill --trust-remote-code. rl/sgls/serve_sgls_qwen3_235b.sh: TP_SIZE=8,
    MAX_MODEL_LEN=32768, DTYPE=bfloat16, GPU_MEM_UTIL=0.70, MAX_NUM_SEQS=300,
    --disable-custom-all-reduce --enable-prefix-caching --enable-expert-parallel
    --trust-remote-code. Host, port and served name are the registry's (deployment choices).
    """
    judge = vllm_command(paper_service("gpt_oss_120b_judge"), "0.0.0.0", 8000)
    assert judge == [
        "vllm", "serve", "openai/gpt-oss-120b",
        "--host", "0.0.0.0",
        "--port", "8000",
        "--served-model-name", "openai/gpt-oss-120b",
        "--tensor-parallel-size", "8",
        "--max-model-len", "16384",
        "--gpu-memory-utilization", "0.85",
        "--max-num-seqs", "6000",
        "--async-scheduling",
        "--enable-prefix-caching",
        "--enable-chunked-prefill",
        "--trust-remote-code",
    ]  # fmt: skip
    simulator = vllm_command(paper_service("qwen3_235b_sgls"), "0.0.0.0", 8001)
    assert simulator == [
        "vllm", "serve", "Qwen/Qwen3-235B-A22B-Instruct-2507",
        "--host", "0.0.0.0",
        "--port", "8001",
        "--served-model-name", "Qwen/Qwen3-235B-A22B-Instruct-2507",
        "--tensor-parallel-size", "8",
        "--max-model-len", "32768",
        "--dtype", "bfloat16",
        "--gpu-memory-utilization", "0.7",
        "--max-num-seqs", "300",
        "--disable-custom-all-reduce",
        "--enable-prefix-caching",
        "--enable-expert-parallel",
        "--trust-remote-code",
    ]  # fmt: skip
    for line in (judge, simulator):  # vLLM 0.24.0's parser, as recorded, takes them
        assert line_problems(line) == [], line


def test_every_field_reaches_its_vllm_flag_and_no_key_is_on_the_line():
    full = ServiceDefinition(
        name="j",
        model="org/m",
        revision="abc123",
        served_model_name="judge-v1",
        tensor_parallel_size=4,
        pipeline_parallel_size=2,
        max_model_len=8192,
        dtype="float16",
        quantization="fp8",
        gpu_memory_utilization=0.85,
        extra_args=["--enable-prefix-caching"],
        api_key_env="JUDGE_API_KEY",
    )
    line = vllm_command(full, "10.0.0.1", 9000)
    assert line[:3] == ["vllm", "serve", "org/m"] and line[-1] == "--enable-prefix-caching"
    assert dict(zip(line[3:-1:2], line[4:-1:2], strict=True)) == {
        "--host": "10.0.0.1",
        "--port": "9000",
        "--served-model-name": "judge-v1",
        "--revision": "abc123",
        "--tensor-parallel-size": "4",
        "--pipeline-parallel-size": "2",
        "--max-model-len": "8192",
        "--dtype": "float16",
        "--quantization": "fp8",
        "--gpu-memory-utilization": "0.85",
    }
    assert "--api-key" not in line and "JUDGE_API_KEY" not in line


@settings(max_examples=40, deadline=None)
@given(
    port=st.integers(0, 65535),
    host=st.sampled_from(["0.0.0.0", "127.0.0.1", "node7"]),
    key=st.sampled_from([None, "A", "B"]),
    timeout=st.floats(1, 1e4),
    tp=st.sampled_from([1, 2, 4, 8]),
    length=st.one_of(st.none(), st.integers(1, 1 << 20)),
)
def test_the_fingerprint_is_what_is_served_not_where(port, host, key, timeout, tp, length):
    base = ServiceDefinition(name="j", model="org/m", tensor_parallel_size=tp, max_model_len=length)
    moved = dataclasses.replace(
        base, port=port, host=host, api_key_env=key, health_timeout_s=timeout, name="k"
    )
    assert definition_fingerprint(moved) == definition_fingerprint(base)
    for change in (
        {"max_model_len": (length or 0) + 1},
        {"dtype": "float16"},
        {"revision": "r2"},
        {"served_model_name": "other"},
        {"tensor_parallel_size": tp * 2},
        {"command": ["serve-it"]},
    ):
        other = dataclasses.replace(base, **change)
        assert definition_fingerprint(other) != definition_fingerprint(base), change
    assert set(identity_fields(base)) >= {"model", "revision", "served_model_name", "max_model_len"}


def test_a_definition_and_its_profile_are_checked_together_each_problem_named():
    gpus = LauncherProfile(kind="submitit_slurm", gpu=True, gpus_per_node=8)
    judge = ServiceDefinition(name="j", model="m", tensor_parallel_size=8)
    assert launcher_problems(judge, "gpu8", gpus) == []
    keys = lambda d, p: [x.key for x in launcher_problems(d, "x", p)]  # noqa: E731
    assert keys(dataclasses.replace(judge, tensor_parallel_size=3), gpus) == [
        "service.tensor_parallel_size"
    ]
    assert keys(dataclasses.replace(judge, pipeline_parallel_size=2), gpus) == [
        "service.pipeline_parallel_size"
    ]
    cpu = LauncherProfile(kind="submitit_slurm")
    assert keys(judge, cpu) == ["launcher.gpus_per_node"]  # vLLM needs GPUs
    assert keys(dataclasses.replace(judge, command=["srv", "{port}"]), cpu) == []  # its own: no
    assert keys(judge, dataclasses.replace(gpus, kind="basic")) == ["launcher"]
    assert keys(judge, dataclasses.replace(gpus, nodes=2)) == ["launcher.nodes"]
    # From the command line: every problem at once, before anything is submitted.
    _, _, _, problems = load_service(
        "loopback_judge",
        ["service.name=no spaces", "service.command=['{python}', '{gpus}']", "service.bogus=1"],
        launcher="slurm_cpu",
        launcher_overrides=["launcher.partition=null"],
    )
    assert {p.key for p in problems} == {"service.name", "service.command", "service.bogus"}
    _, _, _, problems = load_service("nope")
    assert problems[0].key == "service" and "loopback_judge" in problems[0].fix


# --- the registry and a run's resolution ---------------------------------------------------------


def record_for(server, name="judge1", model="loopback-judge", length=4096, **fields):
    values = dict(
        name=name,
        role="judge",
        fingerprint="f" * 64,
        served_model_name=model,
        max_model_len=length,
        server_version="loopback-1",
        base_url=server.base_url,
        host="127.0.0.1",
        port=server.port,
        job_id="42",
        launcher="slurm_cpu",
        started_at="2026-12-02T00:00:00+00:00",
    )
    return ServiceRecord(**{**values, **fields})


def served_config(registry: Path, *overrides: str):
    return validate(
        compose_run(
            [
                "judge=openai",
                "judge.model=loopback-judge",
                "judge.service=judge1",
                f"judge.service_registry={registry}",
                "judge.service_wait_s=3",
                "data.rows=8",
                *overrides,
            ]
        )
    )


def test_a_run_resolves_its_judge_through_the_registry_and_records_its_identity(tmp_path):
    with serve_in_thread(models=("loopback-judge",), max_model_len=4096) as server:
        registry = ServiceRegistry(tmp_path)
        registry.publish(record_for(server))
        config = served_config(tmp_path, "judge.base_url=http://127.0.0.1:1/v1")
        resolved = resolve_services(config, wait=True)
        assert config.judge.base_url == server.base_url  # the record's, not the config's
        recipe = build_recipe(config, served=resolved)
    assert recipe.judge["service"] == {
        "name": "judge1",
        "fingerprint": "f" * 64,
        "served_model_name": "loopback-judge",
        "max_model_len": 4096,
        "server_version": "loopback-1",
    }
    assert recipe.endpoints == {"judge": server.base_url}
    plain = build_recipe(served_config(tmp_path))  # the same recipe, not resolved
    assert plain.fingerprint != recipe.fingerprint  # which service judged is recorded
    # Where it answers is not: the same service elsewhere keeps the fingerprint.
    with serve_in_thread(models=("loopback-judge",), max_model_len=4096) as elsewhere:
        registry.publish(record_for(elsewhere))
        config = served_config(tmp_path)
        again = build_recipe(config, served=resolve_services(config, wait=True))
    assert again.endpoints == {"judge": elsewhere.base_url}
    assert again.fingerprint == recipe.fingerprint


def test_what_the_server_serves_must_be_what_the_run_and_the_registry_say(tmp_path):
    registry = ServiceRegistry(tmp_path)

    def problems(*overrides, wait=True, **server_fields):
        with serve_in_thread(**server_fields) as server:
            registry.publish(record_for(server))
            try:
                resolve_services(served_config(tmp_path, *overrides), wait=wait)
            except ConfigError as err:
                return [(p.key, p.what) for p in err.problems]
        return []

    models = {"models": ("loopback-judge",), "max_model_len": 4096}
    assert problems(**models) == []
    # the run's judge model is not the service's
    ((key, what),) = problems("judge.model=openai/gpt-oss-120b", **models)
    assert key == "judge.model" and "serves 'loopback-judge'" in what
    # another server took the recorded endpoint
    ((key, what),) = problems(models=("someone-else",), max_model_len=4096)
    assert key == "judge.service" and "['someone-else']" in what
    # the served context length is not the definition's
    ((key, what),) = problems(models=("loopback-judge",), max_model_len=2048)
    assert key == "judge.service" and "max_model_len 2048" in what
    # before submitting (no wait) the server is not asked
    assert problems(wait=False, models=("someone-else",)) == []
    # a server that wants a key the run does not send: said at once, naming the key's setting
    ((key, what),) = problems(**models, api_key="sk-not-sent")
    assert key == "judge.api_key_env" and "HTTP 401" in what


def test_naming_a_service_with_the_default_judge_judges_with_the_model_it_serves(tmp_path, capsys):
    from slca_exp.commands import main
    from slca_exp.launch.command import plan

    # The default judge (rubric) asks no server: naming a service picks judge=served, for every
    # job of a sweep; a judge chosen on the command line or by an experiment stays as chosen.
    named = ["judge.service=judge1", "seed=0,1"]
    assert plan([*named, "launcher=slurm_cpu"]).overrides[-2:] == [
        "judge=served",
        "hydra/launcher=slca_slurm_cpu",
    ]
    assert plan(["simulator.service=sim1"]).overrides == [
        "simulator.service=sim1",
        "simulator=served",
    ]
    for kept in (
        ["judge=openai"],
        ["judge=rubric"],
        ["experiment=paper_7b"],
        ["judge.service=null"],
    ):
        assert "judge=served" not in plan([*named, *kept]).overrides, kept
    with serve_in_thread(models=("loopback-judge",), max_model_len=4096) as server:
        ServiceRegistry(tmp_path).publish(record_for(server))
        base = [f"judge.service_registry={tmp_path}", "judge.service_wait_s=3", "data.rows=8"]
        config = validate(compose_run(plan(["judge.service=judge1", *base]).overrides))
        assert (config.judge.backend, config.judge.model) == ("openai", None)
        resolved = resolve_services(config, wait=True)
        recipe = build_recipe(config, served=resolved)
    assert config.judge.model == "loopback-judge"  # the model the record says it serves
    assert recipe.judge["model"] == "loopback-judge"
    assert recipe.judge["service"]["served_model_name"] == "loopback-judge"
    assert recipe.tags()["slca.judge"].startswith(
        "openai:loopback-judge@hierr-judge-v1 via judge1@"
    )
    # a judge chosen on the command line that asks no server is refused, with the option to pick
    assert main(["validate", "judge=rubric", "judge.service=judge1", "--offline"]) == 2
    err = capsys.readouterr().err
    assert "judge.service: judge.backend=rubric asks no server" in err and "judge=served" in err
    # judge=served names no model: without a service, the run is refused naming both ways out
    assert main(["validate", "judge=served", "--offline"]) == 2
    err = capsys.readouterr().err
    assert "judge.model: judge.backend=openai talks to a served model" in err
    assert "judge.service=<its name>" in err


def test_an_unknown_or_silent_service_refuses_the_run_naming_the_key(tmp_path):
    registry = ServiceRegistry(tmp_path)
    with pytest.raises(ConfigError) as err:
        resolve_services(served_config(tmp_path), wait=False)
    (problem,) = err.value.problems
    assert problem.key == "judge.service" and "no service 'judge1'" in problem.what
    assert "slca-exp serve up service=judge1" in problem.fix
    # submitted, not answering yet: no problem before submitting; the job start resolves it
    registry.submitted("judge1", {"job_id": "7"})
    config = served_config(tmp_path)
    assert resolve_services(config, wait=False) == {} and config.judge.base_url is None
    # at job start it waits judge.service_wait_s, then refuses
    start = time.monotonic()
    with pytest.raises(ConfigError, match="job 7 has not recorded an answering server"):
        resolve_services(served_config(tmp_path), wait=True)
    assert 2.5 < time.monotonic() - start < 10
    # recorded, but nothing answers there any more
    with serve_in_thread() as gone:
        registry.publish(record_for(gone))
    with pytest.raises(ConfigError, match="does not answer"):
        resolve_services(served_config(tmp_path), wait=True)


def test_a_run_waits_for_a_service_that_is_still_starting(tmp_path):
    registry = ServiceRegistry(tmp_path)
    with serve_in_thread(models=("loopback-judge",), max_model_len=4096) as server:
        later = subprocess.Popen(  # the record lands 1.5 s after the run started waiting
            [
                sys.executable,
                "-c",
                "import sys, time; time.sleep(1.5); open(sys.argv[1], 'w').write(sys.argv[2])",
                str(registry.record_path("judge1")),
                record_for(server).to_json(),
            ]
        )
        config = served_config(tmp_path)
        assert resolve_services(config, wait=True)["judge"].record.base_url == server.base_url
        later.wait(timeout=10)


def test_the_client_follows_a_restarted_service_to_its_new_endpoint(tmp_path):
    registry = ServiceRegistry(tmp_path)
    judge = {"models": ("loopback-judge",)}
    with serve_in_thread(**judge) as first:
        registry.publish(record_for(first))
        config = served_config(tmp_path, "judge.max_retries=1", "judge.backoff_s=0")
        resolve_services(config, wait=True)
        client = ChatClient.from_config(config.judge, "judge")
        ask = [ChatRequest(messages=({"role": "user", "content": "rate"},))]
        assert client.complete_many(ask)[0].ok
    with serve_in_thread(**judge) as second:  # the first is gone; the service restarted elsewhere
        registry.publish(record_for(second))
        (answer,) = client.complete_many(ask)
        client.close()
        assert answer.ok and answer.attempts == 2, answer  # one refused, then the new endpoint
        assert len(second.completions) == 1


def test_the_registry_writes_whole_files_and_forgets_only_its_own_job(tmp_path):
    registry = ServiceRegistry(tmp_path / "r")
    assert registry.names() == [] and registry.record("x") is None
    with serve_in_thread() as server:
        record = record_for(server, name="x")
    registry.submitted("x", {"job_id": "42"})
    registry.publish(record)
    registry.submitted("y", {"job_id": "43"})
    assert registry.names() == ["x", "y"]
    assert registry.record("x") == record
    assert oct(registry.record_path("x").stat().st_mode & 0o777) == "0o644"
    registry.forget("x", job_id="41")  # another job's: left alone
    assert registry.record("x") is not None
    registry.forget("x", job_id="42")
    assert registry.names() == ["y"]
    assert not [p for p in (tmp_path / "r").iterdir() if p.name.startswith(".")]  # no partials


# --- the service's job ---------------------------------------------------------------------------


def test_the_job_serves_with_the_key_in_the_servers_environment_only(tmp_path):
    key_env, key = "SLCA_TEST_SERVICE_KEY", "sk-service-planted-31f9"
    definition = ServiceDefinition(
        name="keyed",
        model="loopback-judge",
        max_model_len=1024,
        host="127.0.0.1",
        port=0,
        api_key_env=key_env,
        command=[
            "{python}",
            "-m",
            "slca_exp.services.loopback",
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--model",
            "{served_model_name}",
            "--max-model-len",
            "{max_model_len}",
            "--api-key-env",
            "VLLM_API_KEY",
            "--until-signal",
        ],  # fmt: skip
        health_timeout_s=60,
    )
    script = (
        "import pickle, sys; from slca_exp.launch.service_job import ServiceJob; "
        "print(ServiceJob(pickle.loads(bytes.fromhex(sys.argv[1])), sys.argv[2], 'here')())"
    )
    import pickle

    env = {**os.environ, key_env: key, "PYTHONPATH": str(REPO)}
    job = subprocess.Popen(
        [sys.executable, "-c", script, pickle.dumps(definition).hex(), str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    registry = ServiceRegistry(tmp_path)
    try:
        deadline = time.monotonic() + 60
        while registry.record("keyed") is None and time.monotonic() < deadline:
            assert job.poll() is None, job.communicate()[0]
            time.sleep(0.2)
        record = registry.record("keyed")
        assert record is not None
        os.environ[key_env] = key
        try:
            served = ask_server(record.base_url, key_env)
        finally:
            del os.environ[key_env]
        assert served.ids == ["loopback-judge"] and served.version == "loopback-1"
        with pytest.raises(Exception, match="HTTP 401"):
            ask_server(record.base_url)  # the server requires the key
        job.send_signal(signal.SIGTERM)
        out = job.communicate(timeout=30)[0]
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0 and "service keyed stopped (SIGTERM)" in out, out
    text = registry.record_path("keyed").read_text()
    assert key not in text and key not in out
    assert json.loads(text)["api_key_env"] == key_env
    assert key not in " ".join(record.command)
    with pytest.raises(Exception):  # noqa: B017, PT011 - the server went with the job
        ask_server(record.base_url, timeout_s=2)


def test_compare_strict_tells_runs_judged_by_different_services_apart(tmp_path):
    from types import SimpleNamespace

    from slca_exp.analysis.comparability import differences
    from slca_exp.core.tags import COMPONENT_TAGS, FINGERPRINT

    registry = ServiceRegistry(tmp_path / "registry")
    config = served_config(registry.folder)
    runs = []
    with serve_in_thread(models=("loopback-judge",), max_model_len=4096) as server:
        for i, fingerprint in enumerate(["a" * 64, "a" * 64, "b" * 64]):
            registry.publish(record_for(server, fingerprint=fingerprint))
            config = served_config(registry.folder)
            recipe = build_recipe(config, served=resolve_services(config, wait=True))
            folder = tmp_path / f"run{i}"
            folder.mkdir()
            (folder / "recipe.json").write_text(recipe.to_json())
            tags = {FINGERPRINT: recipe.short_fingerprint, **recipe.tags()}
            info = SimpleNamespace(run_id=f"run{i}", artifact_uri=folder.as_uri())
            runs.append(SimpleNamespace(info=info, data=SimpleNamespace(tags=tags)))
    assert runs[0].data.tags[COMPONENT_TAGS["judge"]].endswith(" via judge1@aaaaaaaaaaaa")
    assert differences(None, runs[:2], swept=["seed"]) == []  # one service: comparable
    (found,) = differences(None, runs, swept=["seed"])
    assert found.component == "judge" and found.fields == ["judge.service.fingerprint"]
    assert differences(None, runs, swept=["judge.service"]) == []  # swept: that is the point


def test_serve_refuses_before_submitting_anything_naming_every_key(tmp_path, capsys):
    from slca_exp.commands import main

    registry = ["--registry", str(tmp_path / "registry")]
    code = main(
        ["serve", "up", "service=loopback_judge", "launcher=local", "nope=1",
         "service.port=99999", *registry]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("slca-exp: the service is invalid (3 problems):")
    for key in ("nope: is not a key", "service.port: 99999 is not a port", "launcher: the profile"):
        assert f"\n  {key}" in err, err
    assert not (tmp_path / "registry").exists()  # nothing submitted, nothing written
    assert main(["serve", "up", *registry]) == 2
    assert "add service=<one of: gpt_oss_120b_judge, loopback_judge" in capsys.readouterr().err
    assert main(["serve", "status", *registry]) == 0
    assert "no service in the registry" in capsys.readouterr().out
    assert main(["serve", "down", "judge1", *registry]) == 2
    assert "names: no service 'judge1'" in capsys.readouterr().err
    # a run cannot start a service; it names one
    assert main(["validate", "service=loopback_judge", "--offline"]) == 2
    assert "judge.service=<its name>" in capsys.readouterr().err
