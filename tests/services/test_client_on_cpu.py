"""The chat client against a real OpenAI-compatible server on 127.0.0.1."""

import asyncio
import logging
import time

import pytest

from slca_exp.services import ChatClient, ChatRequest, MissingAPIKeyError
from slca_exp.services.loopback import Behaviour, serve_in_subprocess
from tests.services.fixtures import KEY, KEY_ENV


def client(server, **kw):
    opts = dict(base_url=server.base_url, model="m", timeout_s=0.5, max_retries=2, backoff_s=0.01)
    return ChatClient(**(opts | kw))


def ask(text="hello"):
    return ChatRequest(({"role": "user", "content": text},), 0.0, 16)


def test_answers_with_the_servers_content(server):
    server.configure(content="forty-two")
    with client(server) as c:
        (out,) = c.complete_many([ask()])
    assert out.ok and out.content == "forty-two" and out.attempts == 1
    body = server.completions[0].json()
    assert body["model"] == "m" and body["messages"][0]["content"] == "hello"
    assert body["temperature"] == 0.0 and body["max_tokens"] == 16


def test_500_twice_then_answers_is_retried(server):
    server.configure(fail_first=2)
    with client(server) as c:
        (out,) = c.complete_many([ask()])
    assert out.ok and out.attempts == 3 and len(server.completions) == 3


def test_500_beyond_the_retries_fails_with_the_status(server):
    server.configure(fail_first=10)
    with client(server, max_retries=2) as c:
        (out,) = c.complete_many([ask()])
    assert not out.ok and "HTTP 500" in out.error and "after 3 attempts" in out.error
    assert len(server.completions) == 3


def test_429_is_retried_but_other_4xx_are_not(server):
    server.configure(fail_first=1, fail_status=429)
    with client(server) as c:
        assert c.complete_many([ask("a")])[0].ok
        server.reset()
        server.configure(fail_first=0, status=400)
        (out,) = c.complete_many([ask("b")])
    assert not out.ok and out.error.startswith("HTTP 400") and len(server.completions) == 1


def test_hanging_server_times_out_on_every_attempt(server):
    server.configure(hang_s=3.0)
    start = time.perf_counter()
    with client(server, timeout_s=0.2, max_retries=1) as c:
        (out,) = c.complete_many([ask()])
    assert not out.ok and out.error == "timeout after 0.2 s after 2 attempts"
    assert len(server.completions) == 2 and time.perf_counter() - start < 2.0


@pytest.mark.parametrize("garbage", ["not_json", "no_choices"])
def test_garbage_fails_with_a_reason_without_retrying(server, garbage):
    server.configure(garbage=garbage)
    with client(server) as c:
        (out,) = c.complete_many([ask()])
    assert not out.ok and out.error.startswith("garbage response") and out.attempts == 1
    assert len(server.completions) == 1


def test_connection_refused_is_a_retried_transport_error():
    with ChatClient(
        base_url="http://127.0.0.1:9/v1", model="m", max_retries=1, backoff_s=0.01, timeout_s=1
    ) as c:
        (out,) = c.complete_many([ask()])
    assert not out.ok and "transport error" in out.error and out.attempts == 2


def test_concurrency_is_bounded(server):
    server.configure(latency_s=0.03)
    with client(server, concurrency=3) as c:
        outs = c.complete_many([ask(str(i)) for i in range(24)])
    assert all(o.ok for o in outs) and server.max_in_flight == 3


def test_per_request_directives_and_results_in_order(server):
    with client(server, max_retries=0) as c:
        outs = c.complete_many(
            [ask('[loopback:{"content": "A"}]'), ask('[loopback:{"status": 503}]')]
        )
    assert outs[0].content == "A" and "HTTP 503" in outs[1].error


def test_works_inside_a_running_event_loop_and_async(server):
    server.configure(content="x")
    with client(server) as c:

        async def both():
            sync = c.complete_many([ask("s")])  # blocks this loop, must not deadlock
            return sync, await c.acomplete_many([ask("a"), ask("b")])

        sync, outs = asyncio.run(both())
    assert [o.content for o in sync + outs] == ["x", "x", "x"]


def test_api_key_is_sent_but_never_leaks(server, api_key, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    # The server echoes the Authorization header, then fails with the key in its body.
    server.configure(content_fn=lambda r: "echo " + r.headers["authorization"])
    with client(server, api_key_env=KEY_ENV) as c:
        (echo,) = c.complete_many([ask()])
        server.configure(content_fn=None, status=401)
        server.route = lambda r: Behaviour(status=401, content=KEY)
        (fail,) = c.complete_many([ask("b")])
        text = " ".join([repr(c), str(c.__dict__), repr(echo), repr(fail), fail.error])
    assert server.completions[0].headers["authorization"] == f"Bearer {KEY}"
    assert echo.content == "echo Bearer ***"
    out, err = capfd.readouterr()
    assert KEY not in text + caplog.text + out + err


def test_missing_key_variable_is_a_clear_error_and_sends_nothing(server, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    c = client(server, api_key_env=KEY_ENV, config_key="judge")
    with c, pytest.raises(MissingAPIKeyError) as err:
        c.complete_many([ask()])
    assert KEY_ENV in str(err.value) and "judge.api_key_env" in str(err.value)
    assert server.completions == []


def test_exponential_backoff_waits_longer(server):
    lin = ChatClient(base_url="http://x/v1", model="m", backoff="linear", backoff_s=0.5)
    exp = ChatClient(base_url="http://x/v1", model="m", backoff="exponential", backoff_s=0.5)
    assert [lin._delay(k) for k in (1, 2, 3)] == [0.5, 1.0, 1.5]
    assert [exp._delay(k) for k in (1, 2, 3)] == [0.5, 1.0, 2.0]


def test_subprocess_server_serves_many_concurrent_connections():
    with serve_in_subprocess(latency_s=0.02, content="ok") as remote:
        with ChatClient(base_url=remote.base_url, model="m", concurrency=32) as c:
            outs = c.complete_many([ask(str(i)) for i in range(96)])
        stats = remote.stats()
    assert all(o.content == "ok" for o in outs)
    assert stats["requests"] == 96 and stats["max_in_flight"] == 32
    assert remote.process.poll() is not None  # the child exited with the context
