"""Toucan-shaped rows and Qwen/hermes-shaped rollouts for the reward tests."""

import json

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
    },
}


def row(gold, allowed=("get_weather", "get_time"), subset="tool_call", question="Weather?"):
    """A row's reward_model.ground_truth as the Toucan/SLCA split stores it."""
    return {
        "allowed_tools": list(allowed),
        "gold_tool_calls": gold,
        "question_content": question,
        "subset_name": subset,
        "tool_schemas": json.dumps([WEATHER, TIME]),
    }


def call(name, **arguments):
    return {"name": name, "arguments": arguments}


def tag(*calls, raw=None):
    """One <tool_call> block holding one call, or an array when several are given."""
    body = raw if raw is not None else json.dumps(calls[0] if len(calls) == 1 else list(calls))
    return f"<tool_call>\n{body}\n</tool_call>"


def turn_break(content='{"ok": true}'):
    """The chat glue and tool response the environment injects between assistant turns."""
    return (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
        f"{content}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


PARIS = call("get_weather", city="Paris", unit="celsius")
LONDON = call("get_weather", city="London", unit="celsius")
TIME_CALL = call("get_time", tz="UTC")
REPLY = "It is 18 degrees Celsius in Paris right now."
