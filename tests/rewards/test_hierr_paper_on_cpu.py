"""The paper variant, hand-computed on Toucan-shaped rows: one behaviour of the public reward each.

Its parity with an independent scorer over random inputs is in ``test_hierr_parity_on_cpu.py``.
"""

import json

import pytest

from slca_exp.rewards import HierRWeights, read_gold, tool_process_reward
from slca_exp.rewards.match import loose_equal, public_equal

from .rows import LONDON, PARIS, REPLY, TIME_CALL, call, row, tag, turn_break

W = HierRWeights()


def paper(text, gt, **kw):
    return tool_process_reward(text, gt, W, "paper", **kw)


def score_of(c):
    return (
        0.10 * c["format"]
        + 0.25 * c["name"]
        + 0.15 * c["key"]
        + 0.20 * c["value"]
        + 0.30 * c["parallel"]
    )


def test_a_perfect_single_call_scores_one():
    r = paper(tag(PARIS) + turn_break() + REPLY, row([[PARIS]]))
    assert r.components == dict.fromkeys(r.components, 1.0)
    assert r.score == pytest.approx(1.0) and r.should_no_call == 0
    assert [c.name for c in r.calls] == ["get_weather"]


def test_a_wrong_value_costs_half_the_value_component():
    pred = call("get_weather", city="London", unit="celsius")
    r = paper(tag(pred), row([[PARIS]]))
    assert r.components["key"] == 1.0 and r.components["value"] == 0.5
    assert r.score == pytest.approx(0.1 + 0.25 + 0.15 + 0.2 * 0.5 + 0.3)


def test_an_extra_key_lowers_key_jaccard_only():
    pred = call("get_weather", city="Paris", unit="celsius", days=3)
    r = paper(tag(pred), row([[PARIS]]))
    assert r.components["key"] == pytest.approx(2 / 3) and r.components["value"] == 1.0
    assert r.score == pytest.approx(0.1 + 0.25 + 0.15 * 2 / 3 + 0.2 + 0.3)


def test_no_call_when_one_is_needed_is_the_penalty():
    r = paper("I think it is sunny.", row([[PARIS]]))
    assert r.score == -0.5 and r.should_no_call == 1
    assert r.components == dict.fromkeys(r.components, 0.0)
    assert paper("no call", row([[PARIS]]), no_call_penalty=-1.0).score == -1.0


def test_think_blocks_are_removed_first():
    # A call only inside a think block is no call at all.
    r = paper(f"<think>{tag(PARIS)}</think>It is sunny.", row([[PARIS]]))
    assert r.should_no_call == 1
    r = paper(f"<thinking>plan</thinking>{tag(PARIS)}", row([[PARIS]]))
    assert r.score == pytest.approx(1.0)


def test_format_is_valid_blocks_over_the_larger_tag_count():
    gt = row([[PARIS]])
    assert paper(tag(PARIS) + tag(raw="{not json"), gt).components["format"] == 0.5
    # two opening tags, one closing: denominator 2
    assert paper(tag(PARIS) + "<tool_call>{", gt).components["format"] == 0.5
    # one opening tag, two closing
    assert paper(tag(PARIS) + "</tool_call>", gt).components["format"] == 0.5
    # a name outside allowed_tools invalidates its block and drops its calls
    r = paper(tag(PARIS) + tag(call("get_wether", city="Paris")), gt)
    assert r.components["format"] == 0.5 and r.components["name"] == 1.0


def test_block_contents_arrays_parameters_and_missing_arguments():
    gt = row([[PARIS, TIME_CALL]])
    # an array of two objects is one block with two calls
    r = paper(tag(PARIS, TIME_CALL), gt)
    assert r.components["format"] == 1.0 and r.components["parallel"] == 1.0
    assert r.score == pytest.approx(1.0)
    # "parameters" is read like "arguments"
    alt = {"name": "get_weather", "parameters": PARIS["arguments"]}
    assert paper(tag(alt), row([[PARIS]])).score == pytest.approx(1.0)
    # no arguments at all means {}
    r = paper(tag(raw='{"name": "get_time"}'), row([[call("get_time")]]))
    assert r.score == pytest.approx(1.0)
    # arguments given as a JSON string make the block invalid (the strict variant decodes them)
    as_string = {"name": "get_weather", "arguments": json.dumps(PARIS["arguments"])}
    r = paper(tag(as_string), row([[PARIS]]))
    assert r.score == 0.0 and r.components["format"] == 0.0 and r.calls == ()
    assert r.reasons == {"arguments not a JSON object": 1}
    strict = tool_process_reward(tag(as_string), row([[PARIS]]), W, "strict")
    assert strict.score == pytest.approx(1.0)
    # null arguments read as {}; empty arguments fall through to "parameters"
    r = paper(tag(raw='{"name": "get_time", "arguments": null}'), row([[call("get_time")]]))
    assert r.score == pytest.approx(1.0) and r.calls[0].arguments == {}
    both = {"name": "get_weather", "arguments": {}, "parameters": PARIS["arguments"]}
    assert paper(tag(both), row([[PARIS]])).score == pytest.approx(1.0)


@pytest.mark.parametrize(
    "content",
    [
        '"just a string"',
        "[1, 2]",
        '{"arguments": {}}',
        '{"name": 7}',
        '{"name": "get_time", "arguments": [1]}',
        '[{"name": "get_time"}, 3]',
    ],
)
def test_malformed_blocks_are_rejected_whole_with_a_reason(content):
    r = paper(tag(raw=content), row([[TIME_CALL]]))
    assert r.components["format"] == 0.0 and r.calls == ()
    assert sum(r.reasons.values()) == 1


def test_name_is_a_multiset_f1():
    gt = row([[PARIS]])
    r = paper(tag(PARIS) + tag(LONDON), gt)
    assert r.components["name"] == pytest.approx(2 * 1 / 3)
    r = paper(tag(PARIS, TIME_CALL), row([[PARIS, PARIS]]))
    assert r.components["name"] == pytest.approx(2 * 1 / 4)


def test_key_value_only_over_gold_calls_with_arguments():
    # gold has no arguments anywhere: key = value = 1 whatever was predicted
    r = paper(tag(call("get_time", tz="UTC")), row([[call("get_time")]]))
    assert (r.components["key"], r.components["value"]) == (1.0, 1.0)
    # tags present but every block invalid: no predictions, key = value = 0
    r = paper(tag(raw="{oops"), row([[PARIS]]))
    assert r.components == {"format": 0.0, "name": 0.0, "key": 0.0, "value": 0.0, "parallel": 0.0}
    assert r.score == 0.0 and r.should_no_call == 0


def test_greedy_matching_follows_gold_order():
    g1, g2 = call("get_weather", city="Paris"), call("get_weather", city="Paris", unit="c")
    preds = tag(call("get_weather", city="Paris", unit="c")) + tag(call("get_weather", zip="1"))
    # g1 first grabs the full prediction (key 1/2, value 1) and leaves g2 the useless one
    r = paper(preds, row([[g1, g2]]))
    assert r.components["key"] == pytest.approx((0.5 + 0.0) / 2)
    assert r.components["value"] == pytest.approx((1.0 + 0.0) / 2)
    # the same calls with the gold order swapped score differently
    r = paper(preds, row([[g2, g1]]))
    assert r.components["key"] == pytest.approx((1.0 + 0.0) / 2)


def test_parallel_compares_the_first_step_with_the_first_valid_block():
    gt = row([[PARIS, TIME_CALL]])
    # one tag per call (Qwen templates): the first block has 1 call, the step 2 -> 0 (defect (a))
    assert paper(tag(PARIS) + tag(TIME_CALL), gt).components["parallel"] == 0.0
    # only the first step counts
    gt = row([[PARIS], [TIME_CALL, LONDON]])
    text = tag(PARIS) + turn_break() + tag(TIME_CALL)
    assert paper(text, gt).components["parallel"] == 1.0


def test_irrelevant_row_without_a_call_gets_no_format_credit():
    r = paper("I cannot help with that using these tools.", row([], subset="irrelevant"))
    assert r.components == {"format": 0.0, "name": 1.0, "key": 1.0, "value": 1.0, "parallel": 1.0}
    assert r.score == pytest.approx(0.9) and r.should_no_call == 0


@pytest.mark.parametrize(
    "gold",
    [
        [[PARIS]],  # nested steps
        [PARIS],  # flat calls
        json.dumps([[PARIS]]),  # as the parquet files store it
    ],
)
def test_gold_shapes_nested_flat_and_json(gold):
    assert paper(tag(PARIS), row(gold)).score == pytest.approx(1.0)


def test_gold_as_bare_names():
    gt = row(["get_weather", "get_time"])
    assert [c.name for c in read_gold(gt).steps[0]] == ["get_weather", "get_time"]
    r = paper(tag(call("get_weather"), call("get_time")), gt)
    assert r.score == pytest.approx(1.0)


def test_gold_records_what_the_row_states():
    gold = read_gold(
        row(
            [
                [],
                [PARIS, {"name": "get_time", "parameters": {"tz": "UTC"}}],
                [],
                ["get_time", {"name": "get_time", "arguments": None}, call("get_time")],
            ]
        )
    )
    # empty steps dropped, turns counted over the others
    assert [[c.turn for c in step] for step in gold.steps] == [[0, 0], [1, 1, 1]]
    assert gold.stepped and [c.stated for c in gold.calls] == [True, True, False, False, True]
    assert [c.public_arguments for c in gold.calls] == [PARIS["arguments"], {}, {}, {}, {}]
    assert [c.arguments for c in gold.argued_calls] == [PARIS["arguments"]]
    assert not read_gold(row([PARIS])).stepped and not read_gold(row(["get_time"])).stepped
    assert read_gold(row([[], []])).steps == () and not read_gold(row([[]])).needs_call


@pytest.mark.parametrize(
    ("gold", "pred", "public", "strict"),
    [
        (None, None, True, True),
        (None, "", False, False),
        ("  Paris ", "paris", True, True),
        ("Paris", "Pariss", False, False),
        (3, 3.0000000001, True, True),
        (3, 3.001, False, False),
        (0, 1e-9, False, True),  # the public tolerance is strict (< 1e-9)
        (2, "2", True, True),
        (True, "true", True, True),
        (True, 1, True, True),
        (False, "0", True, True),
        (False, "yes", False, False),
        ("1", "true", True, False),
        (0, "false", True, False),
        ("1.0", True, True, False),
        (False, "0.0", True, False),
        ([1, 2], [1, 2], True, True),
        ([1, 2], [2, 1], False, False),
        ([1, 2], "[1, 2]", True, False),  # a list and its Python repr
        ({"a": 1}, "{'a': 1}", True, False),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}, True, True),
        (float("nan"), float("nan"), True, False),
        ("new york", "New-York", False, False),
    ],
)
def test_value_equality_public_and_strict(gold, pred, public, strict):
    assert public_equal(gold, pred) is public and public_equal(pred, gold) is public
    assert loose_equal(gold, pred) is strict


def test_the_paper_variant_compares_values_the_public_way():
    for gold, pred in [("1", "true"), (0, "false"), ([1, 2], "[1, 2]"), (float("nan"),) * 2]:
        r = paper(tag(call("get_time", tz=pred)), row([[call("get_time", tz=gold)]]))
        assert r.components["value"] == 1.0, (gold, pred)


def test_weights_scale_the_components():
    w = HierRWeights(0.2, 0.2, 0.2, 0.2, 0.2)
    r = tool_process_reward(tag(LONDON), row([[PARIS]]), w, "paper")
    assert r.score == pytest.approx(0.2 * (1 + 1 + 1 + 0.5 + 1))
    assert score_of(r.components) == pytest.approx(paper(tag(LONDON), row([[PARIS]])).score)
