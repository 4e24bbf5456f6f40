"""The hermes / ChatML template and the rollout helpers built on it."""

import json

import pytest

from slca_exp.backbones.chat import (
    PROBE,
    TEMPLATE,
    check_template,
    render_prompt,
    render_text,
    render_trajectory,
    tokenize_trajectory,
    tool_turn_text,
)
from slca_exp.rewards.toolcalls import final_reply, parse_tool_calls, tool_responses

from .conftest import TOOLS, trajectory

RENDERED = (
    "<|im_start|>system\nYou answer with tools.\n\n# Tools\n"
    "get_weather(city: string, unit?: C|F): Current weather for a city\n"
    "convert(amount: number, to: string|null): Convert an amount between currencies\n"
    'Call: <tool_call>{"name":...,"arguments":{...}}</tool_call><|im_end|>\n'
    "<|im_start|>user\nWeather in Paris and Oslo, and 5 EUR in USD?<|im_end|>\n"
    "<|im_start|>assistant\n"
    '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo","unit":"C"}}\n</tool_call>'
    "<|im_end|>\n"
    '<|im_start|>user\n<tool_response>\n{"temp": 20}\n</tool_response>\n'
    '<tool_response>\n{"temp": 11}\n</tool_response><|im_end|>\n'
    "<|im_start|>assistant\nNow the money.\n"
    '<tool_call>\n{"name":"convert","arguments":{"amount":5,"to":"USD"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\n5.4\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nParis: 20 C, Oslo: 11 C; 5 EUR is 5.4 USD.<|im_end|>\n"
)

# What the policy generates in each assistant turn (content, calls, <|im_end|>), written by hand.
TURNS = [
    '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo","unit":"C"}}\n</tool_call>'
    "<|im_end|>",
    'Now the money.\n<tool_call>\n{"name":"convert","arguments":{"amount":5,"to":"USD"}}\n'
    "</tool_call><|im_end|>",
    "Paris: 20 C, Oslo: 11 C; 5 EUR is 5.4 USD.<|im_end|>",
]


def test_template_renders_the_documented_layout(tokenizer):
    assert tokenizer.chat_template == TEMPLATE
    assert render_text(trajectory(), TOOLS) == RENDERED
    text = tokenizer.apply_chat_template(trajectory(), tools=TOOLS, tokenize=False)
    assert text == RENDERED


def test_rollout_pieces_concatenate_to_the_rendered_trajectory(tokenizer):
    prompt = render_prompt(tokenizer, trajectory()[:2], TOOLS)
    assert prompt == RENDERED[: RENDERED.index("<|im_start|>assistant\n") + 22]
    assert prompt.endswith("<|im_start|>assistant\n")
    rollout = (
        prompt
        + TURNS[0]
        + tool_turn_text(['{"temp": 20}', '{"temp": 11}'])
        + TURNS[1]
        + tool_turn_text(["5.4"])
        + TURNS[2]
    )
    assert rollout + "\n" == RENDERED


def test_tools_may_come_as_the_rows_json_string(tokenizer):
    as_string = render_prompt(tokenizer, trajectory()[:2], json.dumps(TOOLS))
    assert as_string == render_prompt(tokenizer, trajectory()[:2], TOOLS)


def test_assistant_spans_are_exactly_the_generated_turns(tokenizer):
    text, spans = render_trajectory(tokenizer, trajectory(), TOOLS)
    assert text == RENDERED
    assert [text[a:b] for a, b in spans] == TURNS


def test_loss_mask_covers_exactly_the_assistant_tokens(tokenizer):
    ids, mask = tokenize_trajectory(tokenizer, trajectory(), TOOLS)
    assert len(ids) == len(mask) and set(mask) == {0, 1}
    learned = [i for i, m in zip(ids, mask, strict=True) if m]
    assert tokenizer.decode(learned) == "".join(TURNS)
    glue = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if not m])
    assert "<tool_response>" in glue and "5.4" in glue and "Weather in Paris" in glue
    assert glue.count("<tool_call>") == 1  # the system prompt's format line, no call
    assert glue.count("<|im_end|>") == 4  # system, user and the two tool turns
    # Every assistant turn ends on a learnable <|im_end|>; the template's last newline is dropped.
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert ids[-1] == end and mask[-1] == 1
    assert tokenizer.decode(ids) == RENDERED[:-1]


def test_max_len_keeps_the_first_tokens(tokenizer):
    ids, mask = tokenize_trajectory(tokenizer, trajectory(), TOOLS)
    short_ids, short_mask = tokenize_trajectory(tokenizer, trajectory(), TOOLS, max_len=40)
    assert (short_ids, short_mask) == (ids[:40], mask[:40])


def test_a_trajectory_without_assistant_turns_is_all_glue(tokenizer):
    ids, mask = tokenize_trajectory(tokenizer, trajectory()[:2], TOOLS)
    assert ids and set(mask) == {0}


def test_the_reward_parser_reads_a_decoded_rollout(tokenizer):
    prompt = render_prompt(tokenizer, trajectory()[:2], TOOLS)
    ids, mask = tokenize_trajectory(tokenizer, trajectory(), TOOLS)
    response = tokenizer.decode(
        ids[len(tokenizer(prompt)["input_ids"]) :], skip_special_tokens=True
    )
    parsed = parse_tool_calls(response)
    assert [[c.name for c in turn] for turn in parsed.turns] == [
        ["get_weather", "get_weather"],
        ["convert"],
    ]
    assert tool_responses(response) == ['{"temp": 20}', '{"temp": 11}', "5.4"]
    assert final_reply(response) == "Paris: 20 C, Oslo: 11 C; 5 EUR is 5.4 USD."


def test_system_turn_and_tool_list_variants():
    assert render_text([{"role": "user", "content": "hi"}]) == "<|im_start|>user\nhi<|im_end|>\n"
    bare = {"name": "ping", "parameters": {"type": "object", "properties": {}}}
    text = render_text([{"role": "user", "content": "hi"}], [bare], generation_prompt=True)
    assert text.startswith("<|im_start|>system\n# Tools\nping()\nCall: ")
    assert text.endswith("<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_string_arguments_and_non_string_tool_content_render_as_json():
    messages = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1}'}}],
        },
        {"role": "tool", "name": "f", "content": {"ok": True}},
    ]
    text = render_text(messages)
    assert '<tool_call>\n{"name":"f","arguments":{"a": 1}}\n</tool_call><|im_end|>' in text
    assert '<tool_response>\n{"ok": true}\n</tool_response>' in text


def test_unknown_roles_are_refused():
    with pytest.raises(Exception, match="unknown message role: critic"):
        render_text([{"role": "critic", "content": "x"}])


def test_tool_turn_needs_a_response():
    with pytest.raises(ValueError, match="at least one"):
        tool_turn_text([])


def test_check_template_accepts_ours_and_names_what_differs(tokenizer):
    assert check_template(tokenizer) is None
    original = tokenizer.chat_template
    try:
        # A ChatML template with a separate `tool` role turn: not the layout rollouts write.
        tokenizer.chat_template = TEMPLATE.replace(
            "{{- '<|im_start|>user' -}}{%- endif -%}", "{{- '<|im_start|>tool' -}}{%- endif -%}"
        )
        assert "tool responses are rendered as" in check_template(tokenizer)
        tokenizer.chat_template = "{{ raise_exception('no tools here') }}"
        assert "no tools here" in check_template(tokenizer)
    finally:
        tokenizer.chat_template = original
    assert len(PROBE) == 6
