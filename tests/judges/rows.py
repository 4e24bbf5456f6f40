"""Toucan-shaped rollouts for the judge tests."""

import json

QUESTION = "What's the weather in Paris today?"
CALL = '<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>'
WEATHER = {"city": "Paris", "temp_c": 21.4, "condition": "light rain", "humidity": 81}


def rollout(reply, responses=(WEATHER,), think="<think>call the weather tool</think>"):
    parts = [think, CALL]
    for r in responses:
        text = r if isinstance(r, str) else json.dumps(r)
        parts.append(f"<tool_response>{text}</tool_response>")
    parts.append(reply)
    return "".join(parts)


FAITHFUL = "It is 21.4 °C in Paris with light rain and 81% humidity."
INVENTED = "It is 35.2 °C in Paris with 12 km/h winds and 64% humidity."
