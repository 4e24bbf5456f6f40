"""The paper variant equals the public HierR reward: random inputs against an independent scorer.

``reference_hierr.py`` is written from the public reward's behaviour alone; the pinned examples are
the inputs on which an earlier paper variant differed from it (each with the public numbers).
"""

import json

import pytest
from hypothesis import example, given, settings

from slca_exp.rewards import HierRWeights, tool_process_reward
from slca_exp.rewards.match import public_equal

from . import reference_hierr as reference
from .rows import call, tag
from .strategies import cases, matching_cases, value_pairs

W = HierRWeights()
SEATTLE = call("get_weather", city="Seattle")
WEATHER_ROW = {"allowed_tools": ["get_weather"], "gold_tool_calls": [[SEATTLE]]}
KV_ROW = {"allowed_tools": ["kv"], "gold_tool_calls": [[call("kv", a=1), call("kv", b=2)]]}


def assert_parity(text, gt):
    ours = tool_process_reward(text, gt, W, "paper")
    score, components, should_no_call = reference.score(text, gt)
    assert ours.components == components
    assert ours.should_no_call == should_no_call
    assert ours.score == pytest.approx(score, abs=1e-12)
    return ours


# Arguments: a JSON string makes the block invalid, null reads as {}, an empty `arguments` falls
# through to `parameters`.
PINNED = [
    (tag({"name": "get_weather", "arguments": json.dumps({"city": "Seattle"})}), WEATHER_ROW, 0.0),
    (tag({"name": "get_weather", "arguments": None}), WEATHER_ROW, 0.65),
    (
        tag({"name": "get_weather", "arguments": {}, "parameters": {"city": "Seattle"}}),
        WEATHER_ROW,
        1.0,
    ),
    # A gold call takes only a prediction it agrees with at all (key + value above 0).
    (tag(call("kv", b=2)), KV_ROW, 0.1 + 0.25 * 2 / 3 + 0.15 * 0.5 + 0.20 * 0.5),
    # Empty gold steps are dropped: the first step is the one with the call.
    (tag(SEATTLE), {"allowed_tools": ["get_weather"], "gold_tool_calls": [[], [SEATTLE]]}, 1.0),
    # Mismatched think tags still close the block: the draft call inside is no call.
    (f"<think>draft {tag(SEATTLE)} </thinking>{tag(SEATTLE)}", WEATHER_ROW, 1.0),
    # A row that allows no tools scores 0 before the no-call penalty is considered.
    ("It is sunny.", {"allowed_tools": [], "gold_tool_calls": [[SEATTLE]]}, 0.0),
    ("No tools needed.", {"allowed_tools": [], "gold_tool_calls": []}, 0.0),
]


@pytest.mark.parametrize(("text", "gt", "expected"), PINNED)
def test_inputs_where_the_paper_variant_used_to_differ(text, gt, expected):
    ours = assert_parity(text, gt)
    assert ours.score == pytest.approx(expected)
    assert ours.should_no_call == 0


def test_the_greedy_match_leaves_a_disagreeing_prediction_for_a_later_gold_call():
    ours = assert_parity(tag(call("kv", b=2)), KV_ROW)
    assert (ours.components["key"], ours.components["value"]) == (0.5, 0.5)


@pytest.mark.parametrize(
    ("gold", "pred"),
    [("1", "true"), (0, "false"), ("1.0", True), (False, "0.0"), ([1, 2], "[1, 2]")]
    + [({"a": 1}, "{'a': 1}"), (float("nan"), float("nan"))],
)
def test_values_the_public_reward_calls_equal(gold, pred):
    gt = {"allowed_tools": ["f"], "gold_tool_calls": [[call("f", x=gold)]]}
    ours = assert_parity(tag(call("f", x=pred)), gt)
    assert ours.components["value"] == 1.0 and ours.score == pytest.approx(1.0)


@settings(max_examples=250, deadline=None)
@given(cases())
@example(("<thinking>a</think><tool_call>{}</tool_call></thinking>", WEATHER_ROW))
@example(("<tool_call>\xa0" + json.dumps(SEATTLE) + "\n</tool_call>", WEATHER_ROW))
@example(('<tool_call>{"name": "", "arguments": {}}</tool_call>', WEATHER_ROW))
@example(("<tool_call>[]</tool_call>" + tag(SEATTLE), WEATHER_ROW))
def test_the_paper_variant_equals_an_independent_public_scorer(case):
    assert_parity(*case)


@settings(max_examples=150, deadline=None)
@given(matching_cases())
def test_the_paper_matching_equals_the_public_one(case):
    assert_parity(*case)


@settings(max_examples=300, deadline=None)
@given(value_pairs())
@example((0, 1e-9))
@example(({"a": 1, "b": 2}, {"b": 2, "a": 1}))
@example(({1: "x", "1": "y"}, {"1": "y", 1: "x"}))  # unsortable keys: not equal, no error
def test_value_equality_equals_the_public_one(pair):
    gold, pred = pair
    assert public_equal(gold, pred) is reference.same_value(pred, gold)
    assert public_equal(pred, gold) is public_equal(gold, pred)
