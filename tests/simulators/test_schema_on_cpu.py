"""Argument checks against OpenAI-style function schemas."""

import json

import pytest

from slca_exp.rewards.types import ToolCall
from slca_exp.simulators import check_call, find_schema
from slca_exp.simulators.schema import error_content
from tests.simulators.schemas import WEATHER


@pytest.mark.parametrize(
    "args, errors",
    [
        ({"city": "Paris"}, []),
        ({"city": "Paris", "days": 3, "lat": 3, "unit": "c", "tags": ["a"]}, []),
        ({"city": "Paris", "days": 3.0, "lat": 48.85}, []),  # 3.0 is a JSON integer
        ({}, ["missing required parameter 'city'"]),
        ({"city": 7}, ["parameter 'city' must be string (got integer)"]),
        ({"city": "P", "days": 2.5}, ["parameter 'days' must be integer (got number)"]),
        ({"city": "P", "days": True}, ["parameter 'days' must be integer (got boolean)"]),
        ({"city": "P", "lat": "48.8"}, ["parameter 'lat' must be number (got string)"]),
        (
            {"city": "P", "lat": float("nan")},
            ["parameter 'lat' must be number (got non-finite number)"],
        ),
        ({"city": "P", "unit": "k"}, ['parameter \'unit\' must be one of ["c", "f"] (got "k")']),
        ({"city": "P", "tags": ["a", 1]}, ["parameter 'tags[1]' must be string (got integer)"]),
        ({"city": "P", "opts": {}}, ["missing required parameter 'opts.detail'"]),
        (
            {"city": "P", "opts": {"detail": 1}},
            ["parameter 'opts.detail' must be boolean (got integer)"],
        ),
        ({"city": "P", "extra": 1}, ["unknown parameter 'extra'"]),
    ],
)
def test_argument_checks(args, errors):
    assert check_call(ToolCall("weather", args), WEATHER) == errors


def test_unknown_tool_and_switches():
    assert check_call(ToolCall("nope", {}), WEATHER) == ["unknown tool 'nope'"]
    assert check_call(ToolCall("nope", {}), None) == ["unknown tool 'nope'"]
    assert check_call(ToolCall("weather", {"days": "x"}), WEATHER, required=False) == [
        "parameter 'days' must be integer (got string)"
    ]
    assert check_call(ToolCall("weather", {"days": "x"}), WEATHER, types=False) == [
        "missing required parameter 'city'"
    ]


def test_error_content_is_json_the_policy_can_read():
    call = ToolCall("weather", {})
    body = json.loads(error_content(call, check_call(call, WEATHER)))
    assert body == {
        "error": "invalid arguments for tool 'weather'",
        "details": ["missing required parameter 'city'"],
    }
    assert json.loads(error_content(ToolCall("x"), ["unknown tool 'x'"])) == {
        "error": "unknown tool 'x'"
    }


def test_find_schema_in_a_row_json_string():
    schemas = json.dumps([{"type": "function", "function": {"name": "a"}}, WEATHER])
    assert find_schema("weather", schemas) == WEATHER
    assert find_schema("b", schemas) is None and find_schema("a", "not json") is None


def test_adversarial_schemas_and_arguments_never_raise():
    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["x"] = {}
        node = node["x"]
    odd_schemas = [{}, {"function": 3}, {"name": "weather", "parameters": "no"}, WEATHER]
    for schema in odd_schemas:
        for args in (
            {"city": deep},
            {"city": "ü" * 10_000, "tags": list(range(5000))},
            {"\ud800": 1},
        ):
            assert isinstance(check_call(ToolCall("weather", args), schema), list)
