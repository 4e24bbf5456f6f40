"""``slca-exp serve down`` without a name: the services it could stop and how, never a stop.

SLURM is asked nothing (``slurm_state`` is replaced by the states each test gives); a service
that is up is a loopback OpenAI-compatible server that serves the recorded model.
"""

from __future__ import annotations

import pytest

from slca_exp.commands import main
from slca_exp.launch import service_job
from slca_exp.services.loopback import serve_in_thread
from slca_exp.services.served import ServiceRecord, ServiceRegistry

MODEL = "loopback-judge"


@pytest.fixture
def slurm(monkeypatch):
    """SLURM's job states, as the test sets them (unknown jobs: ``None``, as without SLURM)."""
    states: dict[str, str] = {}
    monkeypatch.setattr(service_job, "slurm_state", lambda job_id: states.get(job_id))
    return states


def record(name: str, base_url: str, port: int, job_id: str) -> ServiceRecord:
    return ServiceRecord(
        name=name,
        role="judge",
        fingerprint="f" * 64,
        served_model_name=MODEL,
        max_model_len=4096,
        server_version="loopback-1",
        base_url=base_url,
        host="127.0.0.1",
        port=port,
        job_id=job_id,
        launcher="slurm_cpu",
        started_at="2026-12-02T00:00:00+00:00",
    )


def down(registry, *args):
    return main(["serve", "down", "--registry", str(registry), *args])


def test_without_a_name_and_an_empty_registry_it_says_none_is_up(tmp_path, slurm, capsys):
    assert down(tmp_path) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"slca-exp: serve down: no service is up (the registry {tmp_path} holds none), so there "
        "is nothing to stop\n"
    )


def test_without_a_name_it_lists_each_service_with_its_state_and_how_to_stop_it(
    tmp_path, slurm, capsys
):
    registry = ServiceRegistry(tmp_path)
    slurm.update({"42": "RUNNING", "43": "PENDING"})
    with serve_in_thread(models=(MODEL,)) as server:
        registry.submitted("judge1", {"job_id": "42"})
        registry.publish(record("judge1", server.base_url, server.port, "42"))
        registry.submitted("simulator1", {"job_id": "43"})  # queued: no server yet
        assert down(tmp_path) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    head = f"slca-exp: serve down: name the service to stop. In the registry {tmp_path}:"
    assert lines[0] == head
    assert lines[1:3] == [
        f"  judge1      up at {server.base_url} (job 42)",
        "  simulator1  starting (job 43)",
    ]
    assert lines[3] == (
        "stop one with: slca-exp serve down NAME (slca-exp serve down judge1); "
        "every one: slca-exp serve down --all"
    )
    assert "none of them is up" not in err
    assert registry.names() == ["judge1", "simulator1"]  # nothing was stopped or forgotten


def test_without_a_name_it_says_when_none_of_the_registered_services_is_up(tmp_path, slurm, capsys):
    ServiceRegistry(tmp_path).submitted("judge1", {"job_id": "42"})  # its job ended, unanswered
    assert down(tmp_path) == 2
    err = capsys.readouterr().err
    assert "  judge1  ended (job 42)\n" in err
    assert "none of them is up (their server does not answer)\n" in err
    assert "slca-exp serve down judge1" in err


def test_an_unknown_name_is_refused_with_the_names_there_are(tmp_path, slurm, capsys):
    ServiceRegistry(tmp_path).submitted("judge1", {"job_id": "42"})
    assert down(tmp_path, "judge2") == 2
    err = capsys.readouterr().err
    assert f"names: no service 'judge2' in the registry {tmp_path}" in err
    assert "fix: name one of: judge1" in err
    assert down(tmp_path / "empty", "judge2") == 2
    assert "fix: it holds none: nothing to stop" in capsys.readouterr().err


def test_all_with_an_empty_registry_stops_nothing_and_says_so(tmp_path, slurm, capsys):
    assert down(tmp_path, "--all") == 0
    out = capsys.readouterr().out
    said = f"slca-exp: no service is up: the registry {tmp_path} holds none; nothing to stop\n"
    assert out == said
