"""Failed requests are said once per kind and step, not once each (``services/failures.py``)."""

import logging

from slca_exp.services import ChatClient, ChatRequest
from slca_exp.services.failures import FailureDigest, failure_kind, step_lines
from slca_exp.services.outage import ServiceWatch

REFUSAL = "refused by the loopback server"


def ask(text: str) -> ChatRequest:
    return ChatRequest(({"role": "user", "content": text},), 0.0, 8192)


def test_a_step_of_refused_requests_is_one_line_with_its_count(server, capsys, caplog):
    """16 requests refused alike (HTTP 400, as vLLM refuses a budget): one line, after the step."""
    caplog.set_level(logging.WARNING, logger="slca_exp.services")
    watch = ServiceWatch()  # this process's steps are watched (as the local engine's are)
    server.configure(status=400)
    with ChatClient(
        base_url=server.base_url, model="m", timeout_s=5, max_retries=2, config_key="judge"
    ) as client:
        answers = client.complete_many([ask(f"rollout {i}") for i in range(16)])
        assert [a.ok for a in answers] == [False] * 16
        ours = [r for r in caplog.records if r.name.startswith("slca_exp")]
        assert ours == []  # nothing said per request
        watch.observe({"judge/requests": 20.0, "judge/failures": 16.0}, step=3)
        (said,) = capsys.readouterr().err.splitlines()
        assert said.startswith("slca-exp: judge: 16 requests failed in RL step 3: HTTP 400")
        assert REFUSAL in said
        watch.observe({"judge/requests": 0.0}, step=4)  # nothing failed: nothing said
        assert capsys.readouterr().err == ""
        # a step in which every request failed: the outage's warning says how, once
        client.complete_many([ask(f"again {i}") for i in range(4)])
        watch.observe({"judge/requests": 4.0, "judge/failures": 4.0}, step=5)
    (said,) = capsys.readouterr().err.splitlines()
    assert said.startswith("slca-exp: WARNING: every judge request of RL step 5 failed (4 of 4)")
    assert said.endswith(" (4).") and "How they failed: HTTP 400: " in said and REFUSAL in said
    assert said.count("How they failed") == 1


def test_without_a_step_watcher_each_kind_is_said_once_in_the_process(caplog):
    caplog.set_level(logging.WARNING, logger="slca_exp.services")
    digest = FailureDigest()  # a verl worker's: the trainer watches the steps elsewhere
    for _ in range(5):
        digest.note("judge", "HTTP 400: too long")
    digest.note("judge", "HTTP 500 after 4 attempts")
    digest.note("judge", "HTTP 500 after 2 attempts")  # the same kind
    digest.note("simulator", "HTTP 400: too long")
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3
    assert [w.split(" request failed: ")[0] for w in warned] == ["judge", "judge", "simulator"]
    assert digest.drain() == {
        ("judge", "HTTP 400: too long"): 5,
        ("judge", "HTTP 500"): 2,
        ("simulator", "HTTP 400: too long"): 1,
    }
    assert digest.drain() == {}


def test_kinds_and_lines():
    assert failure_kind("HTTP 503: busy after 12 attempts") == "HTTP 503: busy"
    assert len(failure_kind("x" * 1000)) == 200
    assert step_lines({("judge", "timeout"): 1, ("simulator", "HTTP 500"): 3}, 7) == [
        "slca-exp: judge: 1 request failed in RL step 7: timeout",
        "slca-exp: simulator: 3 requests failed in RL step 7: HTTP 500",
    ]
