"""OpenAI-style tool schemas for the simulator tests."""

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "lat": {"type": "number"},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "opts": {
                    "type": "object",
                    "properties": {"detail": {"type": "boolean"}},
                    "required": ["detail"],
                },
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
