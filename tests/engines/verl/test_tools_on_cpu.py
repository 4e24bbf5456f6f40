"""The simulator as verl tools: the generated tool config loads through verl's tool registry and
every call is answered by our simulator, with the row's context."""

import asyncio
import json

import pytest

from tests.skip_policy import require

require("verl", reason="needs the verl extra")
pytestmark = pytest.mark.verl

from verl.tools.tool_registry import initialize_tools_from_config  # noqa: E402

from slca_exp.config.services import SimulatorConfig  # noqa: E402
from slca_exp.data.synthetic import build_rows  # noqa: E402
from slca_exp.engines.verl.rollouts import ANSWERS_KEY  # noqa: E402
from slca_exp.engines.verl.tools import (  # noqa: E402
    SIM_FAILURES_KEY,
    SIM_REQUESTS_KEY,
    SimulatedTool,
    ToolConfigError,
    count_answer,
    schemas_of,
    simulator_metrics,
    tools_kwargs,
    write_tool_config,
)


@pytest.fixture(scope="module")
def rows():
    return build_rows(24, "train", seed=7)


def call(tool, row, arguments, agent_data=None):
    """One call as verl's ToolAgentLoop makes it: create, execute, release."""

    async def go():
        kwargs = tools_kwargs(row)[tool.name]
        instance_id, _ = await tool.create(create_kwargs=kwargs["create_kwargs"])
        try:
            return await tool.execute(instance_id, arguments, agent_data=agent_data)
        finally:
            await tool.release(instance_id)

    return asyncio.run(go())


def test_the_generated_config_loads_through_verls_tool_registry(tmp_path, rows):
    path = write_tool_config(tmp_path / "tools.yaml", rows, SimulatorConfig())
    tools = initialize_tools_from_config(str(path))
    names = [t.name for t in tools]
    assert names == sorted(s["function"]["name"] for s in schemas_of(rows))
    assert len(names) == 6 and all(isinstance(t, SimulatedTool) for t in tools)
    assert len({id(t.simulator) for t in tools}) == 1  # one simulator per worker process
    schema = tools[0].get_openai_tool_schema().model_dump()
    assert schema["function"]["parameters"]["type"] == "object"


def test_a_call_gets_the_rows_recorded_response_through_the_replay_simulator(tmp_path, rows):
    tools = {t.name: t for t in initialize_tools_from_config(
        str(write_tool_config(tmp_path / "tools.yaml", rows, SimulatorConfig()))
    )}  # fmt: skip
    row = next(r for r in rows if r["reward_model"]["ground_truth"]["subset_name"] == "tool_call")
    recorded = json.loads(row["extra_info"]["tool_responses"])[0]
    response, reward, metrics = call(tools[recorded["name"]], row, recorded["arguments"])
    assert response.text == recorded["content"]
    assert reward == 0.0 and metrics["status"] == "ok" and metrics["reason"] == "recorded"
    # arguments that were never recorded: a response derived from the call, the same every time
    other = dict(recorded["arguments"], extra_argument="x")
    first, _, meta = call(tools[recorded["name"]], row, other)
    again, _, _ = call(tools[recorded["name"]], row, other)
    assert meta["reason"] == "derived" and first.text == again.text != recorded["content"]


def test_tools_kwargs_give_every_allowed_tool_the_rows_context(rows):
    row = rows[0]
    kwargs = tools_kwargs(row)
    truth = row["reward_model"]["ground_truth"]
    assert sorted(kwargs) == sorted(truth["allowed_tools"])
    create = next(iter(kwargs.values()))["create_kwargs"]
    assert create["question"] == truth["question_content"]
    assert create["tool_responses"] == row["extra_info"]["tool_responses"]


def test_one_tool_name_with_two_schemas_is_refused_naming_it(rows):
    twisted = json.loads(json.dumps(rows[1]))
    schemas = json.loads(twisted["reward_model"]["ground_truth"]["tool_schemas"])
    schemas[0]["function"]["description"] = "something else entirely"
    twisted["reward_model"]["ground_truth"]["tool_schemas"] = json.dumps(schemas)
    with pytest.raises(ToolConfigError, match=repr(schemas[0]["function"]["name"])):
        schemas_of([rows[0], twisted])


def test_each_answer_is_counted_in_its_rollouts_fields_for_the_simulator_metrics(tmp_path, rows):
    tools = {t.name: t for t in initialize_tools_from_config(
        str(write_tool_config(tmp_path / "tools.yaml", rows, SimulatorConfig()))
    )}  # fmt: skip
    row = next(r for r in rows if r["reward_model"]["ground_truth"]["subset_name"] == "tool_call")
    recorded = json.loads(row["extra_info"]["tool_responses"])[0]
    agent_data = type("AgentData", (), {})()
    agent_data.extra_fields = {}  # what verl's loop hands each call of one rollout
    call(tools[recorded["name"]], row, recorded["arguments"], agent_data)
    answers = agent_data.extra_fields.pop(ANSWERS_KEY)
    assert agent_data.extra_fields == {SIM_REQUESTS_KEY: 1, SIM_FAILURES_KEY: 0}
    # the answer itself is kept too, for the logged rollouts (its call, content, status)
    (answer,) = answers
    assert answer["name"] == recorded["name"] and answer["status"] == "ok"
    assert json.loads(answer["arguments"]) == recorded["arguments"]
    assert answer["content"] and answer["cached"] is False
    other = {}
    for status in ("failed", "schema_error", "ok", "failed"):
        count_answer(other, status)
    assert other == {SIM_REQUESTS_KEY: 3, SIM_FAILURES_KEY: 2}  # schema errors never asked
    fields = [agent_data.extra_fields, other, {"turn_scores": []}]
    assert simulator_metrics(fields) == {"simulator/requests": 4.0, "simulator/failures": 2.0}
    assert simulator_metrics([{"turn_scores": []}]) == {}


def test_recorded_answers_are_paired_with_the_calls_in_the_order_the_response_makes_them():
    from slca_exp.engines.verl.rollouts import ordered_answers

    def call(name, **arguments):
        return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"

    def answer(name, content, **arguments):
        return {
            "name": name,
            "arguments": json.dumps(arguments, sort_keys=True),
            "content": content,
            "status": "ok",
            "reason": "",
            "cached": False,
        }

    text = call("get_time", city="Oslo") + call("get_weather", city="Rome")
    finished = [answer("get_weather", "w", city="Rome"), answer("get_time", "t", city="Oslo")]
    assert [a.content for a in ordered_answers(text, finished)] == ["t", "w"]
    # a call verl answered itself (an unknown function) has no recorded answer: no pairing
    unknown = call("search_weather", city="Rome") + call("get_weather", city="Rome")
    assert ordered_answers(unknown, finished[:1]) is None
