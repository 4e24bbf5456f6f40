"""The tool-call parser: blocks, turns, tag counts, reasons, and hostile input."""

import json
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.rewards import final_reply, parse_tool_calls, tool_process_reward, tool_responses
from slca_exp.rewards.toolcalls import blocks, strip_think

from .rows import PARIS, REPLY, TIME_CALL, row, tag, turn_break


def test_calls_are_grouped_per_assistant_turn():
    text = tag(PARIS) + tag(TIME_CALL) + turn_break() + turn_break() + tag(PARIS) + turn_break()
    parsed = parse_tool_calls(text + REPLY)
    assert [[c.name for c in turn] for turn in parsed.turns] == [
        ["get_weather", "get_time"],
        ["get_weather"],
    ]
    assert [c.turn for c in parsed.calls] == [0, 0, 1]
    assert (parsed.open_tags, parsed.close_tags) == (3, 3)


def test_tag_counts_and_reasons():
    text = tag(PARIS) + tag(raw="{bad") + tag(raw='{"name": 3}') + "<tool_call> unclosed"
    parsed = parse_tool_calls(text)
    assert (parsed.open_tags, parsed.close_tags) == (4, 3)
    assert parsed.reasons == {"invalid JSON": 1, "name missing, empty or not a string": 1}
    assert [b.error is None for b in parsed.blocks] == [True, False, False]


def test_blocks_match_the_non_greedy_regex():
    text = "<a>1</a><a>2<a>3</a></a><a>4"
    regex = [m.group(1) for m in re.finditer(r"<a>(.*?)</a>", text, re.S)]
    assert [text[s:e] for _, s, e, _ in blocks(text, "<a>", "</a>")] == regex


def test_tool_responses_and_final_reply():
    text = tag(PARIS) + turn_break('{"temp": 18}') + "<think>ok</think>" + REPLY
    assert tool_responses(text) == ['{"temp": 18}']
    assert final_reply(text) == REPLY
    assert final_reply("plain answer ") == "plain answer"
    # special tokens skipped in decoding leave the role line behind
    assert final_reply("</tool_response>\nassistant\nIt is 18.") == "It is 18."
    assert final_reply("</tool_response><|im_end|>\n") == ""


HOSTILE = {
    "invalid json": tag(raw="{'name': 'get_weather'}"),
    "unclosed tags": "<tool_call>" * 1000 + '{"name": "get_weather"}',
    "unclosed think": "<think>" + tag(PARIS),
    "deep json": tag(raw="[" * 10_000 + "]" * 10_000),
    "deep arguments": tag(raw='{"name": "get_weather", "arguments": "' + "[" * 10_000 + '"}'),
    "numeric name": tag(raw='{"name": 12, "arguments": {}}'),
    "null name": tag(raw='{"name": null}'),
    "list name": tag(raw='{"name": ["get_weather"]}'),
    "nan values": tag(raw='{"name": "get_weather", "arguments": {"city": NaN, "unit": Infinity}}'),
    "huge int": tag(raw='{"name": "get_weather", "arguments": {"city": ' + "9" * 4000 + "}}"),
    "unicode": tag(
        call := {"name": "get_weather", "arguments": {"city": "東京 🌧", "unit": "\u0000"}}
    ),
    "surrogates": "<tool_call>\ud800" + json.dumps(PARIS) + "</tool_call>",
    "empty": "",
    "only close tags": "</tool_call>" * 50,
    "nested tags": "<tool_call><tool_call>" + json.dumps(PARIS) + "</tool_call></tool_call>",
    "not text": None,
}


@pytest.mark.parametrize("variant", ["paper", "strict"])
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_responses_score_without_raising(name, variant):
    r = tool_process_reward(HOSTILE[name], row([[PARIS]]), variant=variant)
    assert -0.5 <= r.score <= 1.0
    rejected = sum(r.reasons.values())
    if r.score < 1.0 and r.should_no_call == 0:
        # a reduced score is explained: a counted reason, a tag mismatch, or a real mismatch
        assert rejected or r.calls or r.components["format"] < 1.0


def test_hostile_ground_truth_values_are_compared_safely():
    gt = row([[{"name": "get_weather", "arguments": {"city": float("nan"), "unit": [[[]]]}}]])
    r = tool_process_reward(HOSTILE["nan values"], gt, variant="strict")
    assert r.components["value"] == 0.0


def test_ten_megabytes_of_text():
    text = ("word " * 2_000_000) + tag(PARIS)
    assert len(text) > 10_000_000
    t0 = time.perf_counter()
    r = tool_process_reward(text, row([[PARIS]]), variant="strict")
    assert r.score == pytest.approx(1.0)
    assert time.perf_counter() - t0 < 5.0


THINK_BLOCK = re.compile(r"<think(?:ing)?>.*?</think(?:ing)?>", re.DOTALL)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["<think>", "<thinking>", "</think>", "</thinking>", "x", "<"])))
def test_think_blocks_close_at_the_first_closing_tag_of_either_kind(parts):
    text = "".join(parts)
    assert strip_think(text) == THINK_BLOCK.sub("", text)


def test_a_draft_call_in_a_mismatched_think_block_is_no_call():
    text = "<thinking>draft " + tag(TIME_CALL) + "</think>" + tag(PARIS)
    parsed = parse_tool_calls(text)
    assert [c.name for c in parsed.calls] == ["get_weather"] and parsed.open_tags == 1


@pytest.mark.parametrize(
    "unit",
    [
        "<tool_call>{",  # unclosed opening tags
        "<think>",  # unclosed think blocks
        "<think>a</thinking>",  # many think blocks, mismatched
        "</thinking><thinking>",
        "</tool_call><tool_response>",
        '<tool_call>{"name": "get_weather"}</tool_call>',
    ],
)
def test_parsing_is_linear_in_the_text_length(unit):
    def cost(n):
        # CPU time of this process, best of 5: other processes on the machine do not count
        text = unit * (n // len(unit))
        best = float("inf")
        for _ in range(5):
            t0 = time.process_time()
            tool_process_reward(text, row([[PARIS]]), variant="strict")
            best = min(best, time.process_time() - t0)
        return best

    small, big = cost(125_000), cost(1_000_000)
    assert big < 1.0  # a 1 MB response in well under a second
    assert big / max(small, 1e-4) < 24  # 8x the text: linear is ~8x the time, quadratic 64x


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list('<>/{}[]":,tool_call response think nae')), max_size=300)
)
def test_any_text_scores_in_range(text):
    for variant in ("paper", "strict"):
        r = tool_process_reward(text, row([[PARIS, TIME_CALL]]), variant=variant)
        assert -0.5 <= r.score <= 1.0
        assert all(0.0 <= v <= 1.0 for v in r.components.values())
