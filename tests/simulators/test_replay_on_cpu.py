"""The replay simulator: recorded matches, schema checks, deterministic derived responses."""

import json
import subprocess
import sys

import pytest

from slca_exp.config.services import SimulatorConfig
from slca_exp.rewards.types import ToolCall
from slca_exp.simulators import (
    SimContext,
    SimRequest,
    batch_stats,
    build_simulator,
    derived_response,
    describe_simulator,
    loose_equal,
)
from tests.simulators.schemas import WEATHER

RECORDED = (
    {"name": "weather", "arguments": {"city": "Paris", "days": 2}, "content": "21 C, rain"},
    {"name": "weather", "arguments": {"city": "Rome", "detail": True}, "content": {"t": 30}},
)


@pytest.fixture
def sim():
    with build_simulator(SimulatorConfig()) as s:
        yield s


@pytest.mark.parametrize(
    "args, content",
    [
        ({"city": " PARIS ", "days": 2.0000000001}, "21 C, rain"),
        ({"city": "rome", "detail": "true"}, '{"t":30}'),
        ({"city": "Rome", "detail": 1}, '{"t":30}'),
    ],
)
def test_recorded_match_is_returned(sim, args, content):
    r = sim.respond(ToolCall("weather", args), None, SimContext("q", RECORDED))
    assert (r.content, r.status, r.reason) == (content, "ok", "recorded")


@pytest.mark.parametrize(
    "call",
    [
        ToolCall("weather", {"city": "Paris", "days": 3}),  # other value
        ToolCall("weather", {"city": "Paris"}),  # missing key
        ToolCall("forecast", {"city": "Paris", "days": 2}),  # other tool
    ],
)
def test_no_match_gives_a_derived_response(sim, call):
    r = sim.respond(call, None, SimContext("q", RECORDED))
    assert r.status == "ok" and r.reason == "derived"
    body = json.loads(r.content)
    assert body["tool"] == call.name and body["status"] == "success"
    assert set(body["result"]) == {"id", "value", "state"}


def test_loose_equality_rules():
    assert loose_equal(None, None) and not loose_equal(None, 0)
    assert loose_equal([1, {"b": 2, "a": 1}], [1, {"a": 1, "b": 2}])
    assert not loose_equal(1, 1.001) and loose_equal("1", 1) and not loose_equal("yes", True)
    assert not loose_equal(10**400, 1.0) and loose_equal(float("nan"), float("nan")) is False


def test_schema_checked_when_given_and_no_request_needed(sim):
    bad = sim.respond(ToolCall("weather", {"days": "2"}), WEATHER, SimContext())
    assert bad.status == "schema_error" and json.loads(bad.content)["details"] == [
        "missing required parameter 'city'",
        "parameter 'days' must be integer (got string)",
    ]
    unknown = sim.respond(ToolCall("radar", {}), WEATHER, SimContext())
    assert unknown.status == "schema_error" and unknown.reason == "unknown tool 'radar'"
    # A recorded call is replayed even without checking (it happened).
    assert (
        sim.respond(
            ToolCall("weather", {"city": "Rome", "detail": True}), WEATHER, SimContext("", RECORDED)
        ).reason
        == "recorded"
    )


def test_derived_is_deterministic_and_differs_per_call():
    a = derived_response(ToolCall("weather", {"city": "Paris", "days": 2}))
    assert a == derived_response(ToolCall("weather", {"days": 2, "city": "Paris"}))
    assert a != derived_response(ToolCall("weather", {"city": "Paris", "days": 3}))
    assert len(a) < 200  # short enough for a small policy's response budget


def test_derived_is_identical_in_another_process():
    call = ToolCall("weather", {"city": "Zürich", "days": 2, "opts": {"detail": True}})
    code = (
        "from slca_exp.rewards.types import ToolCall\n"
        "from slca_exp.simulators import derived_response\n"
        "import sys\n"
        "sys.stdout.write(derived_response(ToolCall('weather', "
        "{'city': 'Zürich', 'days': 2, 'opts': {'detail': True}})))\n"
    )
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"},
        encoding="utf-8",
    )
    assert other.stdout == derived_response(call)


def test_adversarial_calls_never_raise(sim):
    deep: list = []
    node = deep
    for _ in range(10_000):
        node.append([])
        node = node[0]
    calls = [
        ToolCall("weather", {"lat": float("nan"), "x": float("inf")}),
        ToolCall("wëather 💥", {"\ud800": "\udfff", "k": "v" * 1_000_000}),
        ToolCall("weather", {"deep": deep}),
        ToolCall("", {}),
    ]
    requests = [SimRequest(c, s, SimContext("q", RECORDED)) for c in calls for s in (None, WEATHER)]
    responses = sim.respond_batch(requests)
    assert all(r.status in ("ok", "schema_error") for r in responses)
    json.loads(responses[0].content)  # non-finite numbers are written as strict JSON
    assert batch_stats(responses)["simulator/failures"] == 0.0
    assert sim.stats()["requests"] == len(requests)


def test_describe():
    d = describe_simulator(SimulatorConfig())
    assert d["backend"] == "replay" and d["model"] is None and d["check_required_args"] is True


def test_without_schema_guidance_only_unknown_tools_are_refused():
    """simulator.schema_guidance=false: arguments are not checked, a tool must still exist."""
    sim = build_simulator(SimulatorConfig(schema_guidance=False))
    assert sim.respond(ToolCall("weather", {}), WEATHER).status == "ok"
    assert sim.respond(ToolCall("weather", {"city": 3}), WEATHER).status == "ok"
    assert sim.respond(ToolCall("radar", {}), WEATHER).status == "schema_error"
    guided = build_simulator(SimulatorConfig())
    assert guided.respond(ToolCall("weather", {}), WEATHER).status == "schema_error"
