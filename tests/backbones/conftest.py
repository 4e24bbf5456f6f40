"""A sample tool domain, a two-step trajectory with parallel calls, a tokenizer and a checkpoint."""

import json

import pytest

from slca_exp.backbones import load_backbone
from slca_exp.backbones.chat import render_text
from slca_exp.backbones.tiny import train_tokenizer
from slca_exp.config.schema import BackboneConfig, TinyArchConfig

REV = "0123456789abcdef0123456789abcdef01234567"
"""The revision of the fake hub repo ``org/tiny`` tests lay out from :func:`checkpoint`."""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "city name"},
                    "unit": {"type": "string", "enum": ["C", "F"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert",
            "description": "Convert an amount between currencies",
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number"},
                    "to": {"type": ["string", "null"]},
                },
                "required": ["amount", "to"],
            },
        },
    },
]

CITIES = ("Paris", "Oslo", "Lima", "Quito", "Cairo", "Rome")


def call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def trajectory(i=0):
    """System, user, two parallel calls, their two responses, one more call, its answer, reply."""
    a, b = CITIES[i % 6], CITIES[(i + 1) % 6]
    return [
        {"role": "system", "content": "You answer with tools."},
        {"role": "user", "content": f"Weather in {a} and {b}, and 5 EUR in USD?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("get_weather", city=a), call("get_weather", city=b, unit="C")],
        },
        {"role": "tool", "name": "get_weather", "content": json.dumps({"temp": 20 + i % 9})},
        {"role": "tool", "name": "get_weather", "content": json.dumps({"temp": 11})},
        {
            "role": "assistant",
            "content": "Now the money.",
            "tool_calls": [call("convert", amount=5, to="USD")],
        },
        {"role": "tool", "name": "convert", "content": "5.4"},
        {"role": "assistant", "content": f"{a}: {20 + i % 9} C, {b}: 11 C; 5 EUR is 5.4 USD."},
    ]


@pytest.fixture(scope="session")
def corpus():
    return [render_text(trajectory(i), TOOLS) for i in range(60)]


@pytest.fixture(scope="session")
def tokenizer(corpus):
    return train_tokenizer(corpus, vocab_size=400, max_length=1024)


@pytest.fixture(scope="session")
def checkpoint(corpus, tmp_path_factory):
    """A saved tiny HF checkpoint folder (what a pretrained backbone looks like on disk)."""
    arch = TinyArchConfig(
        hidden_size=32, intermediate_size=64, vocab_size=300, max_position_embeddings=256
    )
    root = tmp_path_factory.mktemp("cache")
    cfg = BackboneConfig(arch=arch)
    return load_backbone(cfg, corpus=lambda: corpus, cache_root=root, seed=3).path
