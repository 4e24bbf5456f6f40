"""SGLS against a real OpenAI-compatible server on 127.0.0.1."""

import asyncio
import hashlib
import json
import logging

import pytest

from slca_exp.config.services import SimulatorConfig
from slca_exp.rewards.types import ToolCall
from slca_exp.services.prompts import PROMPT_DIRS
from slca_exp.simulators import (
    SimContext,
    SimRequest,
    batch_stats,
    build_simulator,
    describe_simulator,
)
from tests.services.fixtures import KEY, KEY_ENV
from tests.simulators.schemas import WEATHER

GOOD = ToolCall("weather", {"city": "Paris", "days": 2})
RECORDED = ({"name": "weather", "arguments": {"city": "Rome"}, "content": '{"temp_c": 30}'},)


def config(server, tmp_path, **kw):
    opts = dict(
        backend="sgls",
        model="sim-model",
        base_url=server.base_url,
        timeout_s=0.3,
        max_retries=2,
        backoff_s=0.01,
        cache_path=str(tmp_path / "cache.sqlite"),
    )
    return SimulatorConfig(**(opts | kw))


def test_answers_from_the_model_with_schema_call_question_and_examples(server, tmp_path):
    server.configure(content='```json\n{"temp_c": 21.4}\n```')
    with build_simulator(config(server, tmp_path)) as sim:
        r = sim.respond(GOOD, WEATHER, SimContext("Weather in Paris?", RECORDED))
    assert (r.content, r.status, r.cached) == ('{"temp_c": 21.4}', "ok", False)
    body = server.completions[0].json()
    prompt = body["messages"][0]["content"]
    assert body["temperature"] == 0.6 and body["model"] == "sim-model"
    assert '"name":"weather"' in prompt and '"days":2' in prompt and "Weather in Paris?" in prompt
    assert "Current weather for a city" in prompt and '{"temp_c": 30}' in prompt


def test_schema_errors_are_answered_without_a_request(server, tmp_path):
    calls = [ToolCall("weather", {}), ToolCall("weather", {"city": 3}), ToolCall("radar", {})]
    with build_simulator(config(server, tmp_path)) as sim:
        out = sim.respond_batch([SimRequest(c, WEATHER) for c in calls] + [SimRequest(GOOD, None)])
    assert [r.status for r in out] == ["schema_error"] * 4
    assert json.loads(out[0].content)["details"] == ["missing required parameter 'city'"]
    assert json.loads(out[3].content) == {"error": "unknown tool 'weather'"}
    assert server.completions == []


def test_required_check_can_be_switched_off(server, tmp_path):
    with build_simulator(config(server, tmp_path, check_required_args=False)) as sim:
        assert sim.respond(ToolCall("weather", {}), WEATHER).status == "ok"
    assert len(server.completions) == 1


def test_retries_then_cache(server, tmp_path):
    server.configure(fail_first=2, content='{"ok": 1}')
    with build_simulator(config(server, tmp_path)) as sim:
        first = sim.respond(GOOD, WEATHER)
        again = sim.respond(GOOD, WEATHER)
    assert first.status == "ok" and again.cached and again.content == '{"ok": 1}'
    assert len(server.completions) == 3
    assert batch_stats([first, again]) == {
        "simulator/requests": 2.0,
        "simulator/failures": 0.0,
        "simulator/cache_hit_frac": 0.5,
    }


@pytest.mark.parametrize(
    "behaviour, reason",
    [
        ({"hang_s": 2.0}, "timeout"),
        ({"garbage": "not_json"}, "garbage"),
        ({"content": "  "}, "empty"),
    ],
)
def test_failures_give_a_tool_error_and_are_not_cached(server, tmp_path, behaviour, reason):
    server.configure(**behaviour)
    with build_simulator(config(server, tmp_path, max_retries=1)) as sim:
        bad = sim.respond(GOOD, WEATHER)
        server.configure(hang_s=0.0, garbage="", content='{"ok": 1}')
        good = sim.respond(GOOD, WEATHER)
    assert bad.status == "failed" and reason in bad.reason
    assert json.loads(bad.content) == {"error": "tool unavailable"}
    assert good.status == "ok" and not good.cached
    assert batch_stats([bad, good])["simulator/failures"] == 1.0


def test_cache_key_follows_temperature_and_model(server, tmp_path):
    for kw in ({}, {"temperature": 0.0}, {"model": "other"}, {}):
        with build_simulator(config(server, tmp_path, **kw)) as sim:
            sim.respond(GOOD, WEATHER)
    assert len(server.completions) == 3


def test_async_batch_is_concurrent_and_bounded(server, tmp_path):
    server.configure(latency_s=0.02, content='{"ok": 1}')
    calls = [SimRequest(ToolCall("weather", {"city": f"c{i}"}), WEATHER) for i in range(20)]
    with build_simulator(config(server, tmp_path, concurrency=4, cache=False)) as sim:
        out = asyncio.run(sim.arespond_batch(calls))
    assert [r.status for r in out] == ["ok"] * 20 and server.max_in_flight == 4


def test_api_key_never_leaks(server, tmp_path, api_key, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    server.configure(content_fn=lambda r: json.dumps({"auth": r.headers["authorization"]}))
    with build_simulator(config(server, tmp_path, api_key_env=KEY_ENV)) as sim:
        echoed = sim.respond(GOOD, WEATHER)
        server.configure(content_fn=None, status=403, content=KEY)
        server.route = lambda r: None
        failed = sim.respond(ToolCall("weather", {"city": "Oslo"}), WEATHER)
        text = repr(sim) + repr([echoed, failed]) + failed.reason
    assert server.completions[0].headers["authorization"] == f"Bearer {KEY}"
    assert echoed.content == '{"auth": "Bearer ***"}' and failed.status == "failed"
    out, err = capfd.readouterr()
    assert KEY not in text + caplog.text + out + err
    data = b"".join(p.read_bytes() for p in tmp_path.glob("cache.sqlite*"))
    assert KEY.encode() not in data


def test_describe(server, tmp_path):
    d = describe_simulator(config(server, tmp_path))
    digest = hashlib.sha256((PROMPT_DIRS["simulator"] / "sgls_v1.txt").read_bytes()).hexdigest()
    assert (d["backend"], d["model"], d["temperature"], d["prompt_sha256"]) == (
        "sgls",
        "sim-model",
        0.6,
        digest,
    )


def test_adversarial_calls_never_raise(server, tmp_path):
    calls = [
        ToolCall("weather", {"city": "\ud800 💥", "lat": float("nan")}),
        ToolCall("weather", {"city": "x" * 1_000_000}),
        ToolCall("weather", {"city": "Paris", "opts": {"detail": float("inf")}}),
    ]
    with build_simulator(config(server, tmp_path, check_types=False)) as sim:
        out = sim.respond_batch([SimRequest(c, WEATHER) for c in calls])
    assert all(r.status in ("ok", "failed", "schema_error") for r in out)


def test_without_schema_guidance_the_model_sees_no_schema_and_no_argument_is_refused(
    server, tmp_path
):
    """simulator.schema_guidance=false, the w/o-SGLS ablation: only the name and the arguments.

    The calls the guided simulator refuses for their arguments reach the model; a tool the row
    does not offer is still refused, as the engines offer a rollout only its row's tools.
    """
    server.configure(content='{"temp_c": 21.4}')
    bad = [ToolCall("weather", {}), ToolCall("weather", {"city": 3}), GOOD]
    unguided = config(server, tmp_path, schema_guidance=False, prompt="sgls_no_schema_v1.txt")
    with build_simulator(unguided) as sim:
        out = sim.respond_batch([SimRequest(c, WEATHER) for c in bad])
        unknown = sim.respond(ToolCall("radar", {}), WEATHER)
    assert [r.status for r in out] == ["ok"] * 3
    assert unknown.status == "schema_error" and len(server.completions) == 3
    for request in server.completions:
        prompt = request.json()["messages"][0]["content"]
        assert "Current weather for a city" not in prompt and '"name":"weather"' in prompt
        assert "schema" not in prompt
    described = describe_simulator(unguided)
    assert described["schema_guidance"] is False
    assert (
        described["prompt_sha256"] != describe_simulator(config(server, tmp_path))["prompt_sha256"]
    )
    with build_simulator(config(server, tmp_path)) as guided:  # the same calls, guided
        assert [r.status for r in guided.respond_batch([SimRequest(c, WEATHER) for c in bad])] == [
            "schema_error",
            "schema_error",
            "ok",
        ]


def test_the_no_schema_template_is_the_guided_one_without_its_schema():
    guided = (PROMPT_DIRS["simulator"] / "sgls_v1.txt").read_text()
    unguided = (PROMPT_DIRS["simulator"] / "sgls_no_schema_v1.txt").read_text()
    assert "{{schema}}" not in unguided
    dropped = "\nThe tool's schema:\n{{schema}}\n"
    assert (
        guided.replace(dropped, "")
        .replace("described", "named")
        .replace("tool's purpose", "tool's name")
        == unguided
    )
