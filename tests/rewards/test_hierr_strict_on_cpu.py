"""The strict variant differs from the paper on defects (a)-(f), one test per defect.

Each test builds a rollout where the two variants disagree on exactly one component (or, for (d),
on the no-call case), and checks that every other component agrees. What strict leaves unjudged
on gold that does not state it (names-only, flat) is in ``test_hierr_toucan_on_cpu.py``.
"""

import pytest

from slca_exp.rewards import HierRWeights, tool_process_reward

from .rows import PARIS, REPLY, TIME_CALL, call, row, tag, turn_break

W = HierRWeights()


def both(text, gt, **kw):
    return (
        tool_process_reward(text, gt, W, "paper", **kw),
        tool_process_reward(text, gt, W, "strict", **kw),
    )


def differ_only_on(paper, strict, *parts):
    for part in paper.components:
        if part in parts:
            assert paper.components[part] != strict.components[part], part
        else:
            assert paper.components[part] == pytest.approx(strict.components[part]), part


def test_a_parallel_is_counted_per_assistant_turn_not_per_tag():
    gt = row([[PARIS, TIME_CALL]])
    paper, strict = both(tag(PARIS) + "\n" + tag(TIME_CALL) + turn_break() + REPLY, gt)
    differ_only_on(paper, strict, "parallel")
    assert (paper.components["parallel"], strict.components["parallel"]) == (0.0, 1.0)


def test_a_parallel_compares_every_step_with_every_turn():
    gt = row([[PARIS], [TIME_CALL]])
    two_turns = tag(PARIS) + turn_break() + tag(TIME_CALL) + turn_break() + REPLY
    assert both(two_turns, gt)[1].components["parallel"] == 1.0
    one_turn = tag(PARIS) + tag(TIME_CALL) + turn_break() + REPLY
    # step 0 wants 1 call (turn has 2), step 1 wants 1 (there is no second turn)
    assert both(one_turn, gt)[1].components["parallel"] == 0.0
    three = tag(PARIS) + turn_break() + tag(TIME_CALL) + turn_break() + tag(PARIS)
    assert both(three, gt)[1].components["parallel"] == pytest.approx(2 / 3)


def test_a_calls_echoed_inside_tool_responses_are_not_calls():
    gt = row([[PARIS]])
    text = tag(PARIS) + turn_break(f"see {tag(TIME_CALL)}") + REPLY
    paper, strict = both(text, gt)
    assert strict.components["format"] == 1.0 and strict.components["name"] == 1.0
    assert paper.components["format"] == 1.0 and paper.components["name"] < 1.0


def test_b_hallucinated_names_count_against_name_precision():
    gt = row([[PARIS, TIME_CALL]])
    text = tag(PARIS) + tag(call("get_tiem", tz="UTC")) + turn_break() + REPLY
    paper, strict = both(text, gt)
    differ_only_on(paper, strict, "name")
    assert paper.components["name"] == pytest.approx(2 * 1 / 3)  # hallucination dropped
    assert strict.components["name"] == pytest.approx(2 * 1 / 4)  # and counted here
    assert paper.components["format"] == strict.components["format"] == 0.5


def test_c_invented_arguments_where_gold_has_none_score_key_zero():
    gt = row([[call("get_time")]])
    paper, strict = both(tag(call("get_time", tz="UTC")), gt)
    differ_only_on(paper, strict, "key", "value")
    assert (paper.components["key"], strict.components["key"]) == (1.0, 0.0)
    assert (paper.components["value"], strict.components["value"]) == (1.0, 0.0)
    # no invention: both variants give full credit
    paper, strict = both(tag(call("get_time")), gt)
    assert paper.score == strict.score == pytest.approx(1.0)


def test_c_a_call_on_a_row_whose_gold_has_none_gets_no_key_value_credit():
    gt = row([], subset="irrelevant")
    paper, strict = both(tag(TIME_CALL), gt)
    differ_only_on(paper, strict, "key", "value")
    assert strict.score == pytest.approx(0.1)


def test_d_a_correct_no_call_on_an_irrelevant_row_earns_full_credit():
    gt = row([], subset="irrelevant")
    paper, strict = both("None of these tools can answer that.", gt)
    assert paper.score == pytest.approx(0.9) and paper.components["format"] == 0.0
    assert strict.score == pytest.approx(1.0)
    assert strict.components == dict.fromkeys(strict.components, 1.0)
    assert paper.should_no_call == strict.should_no_call == 0


def test_d_any_call_attempt_on_an_irrelevant_row_earns_its_format_credit_only():
    gt = row([], subset="irrelevant")
    for text, fmt in [
        (tag(raw="{not json"), 0.0),  # the paper scores this 0.9
        ("<tool_call>" + '{"name": "get_time"', 0.0),
        (tag(TIME_CALL) + tag(raw="{not json"), 0.5),
    ]:
        paper, strict = both(text, gt)
        assert strict.components == {
            "format": fmt,
            "name": 0.0,
            "key": 0.0,
            "value": 0.0,
            "parallel": 0.0,
        }
        assert strict.score == pytest.approx(0.1 * fmt) and paper.score > strict.score


def test_d_the_no_call_penalty_is_unchanged():
    paper, strict = both("It is sunny.", row([[PARIS]]))
    assert paper.score == strict.score == -0.5
    assert paper.should_no_call == strict.should_no_call == 1


def test_f_matching_is_an_optimal_assignment_independent_of_gold_order():
    g1, g2 = call("get_weather", city="Paris"), call("get_weather", city="Paris", unit="c")
    # one block holding both calls, so that parallel agrees between the variants
    preds = tag(call("get_weather", city="Paris", unit="c"), call("get_weather", zip="1"))
    paper, strict = both(preds, row([[g1, g2]]))
    differ_only_on(paper, strict, "key")
    assert paper.components["key"] == pytest.approx(0.25)
    assert strict.components["key"] == pytest.approx(0.5)
    swapped = both(preds, row([[g2, g1]]))[1]
    assert swapped.components == strict.components


def test_f_large_sets_use_the_assignment_solver():
    golds = [call("get_weather", city=f"c{i}", unit="c") for i in range(9)]
    preds = "".join(tag(call("get_weather", city=f"c{i}", unit="c")) for i in reversed(range(9)))
    strict = both(preds, row([golds]))[1]
    assert strict.components["key"] == strict.components["value"] == 1.0


def test_bfcl_string_normalisation_is_strict_only_and_opt_in():
    gt = row([[call("get_weather", city="New York")]])
    text = tag(call("get_weather", city="new-york"))
    assert both(text, gt)[1].components["value"] == 0.0
    paper, strict = both(text, gt, normalize_strings=True)
    assert strict.components["value"] == 1.0 and paper.components["value"] == 0.0


def test_strict_keeps_paper_scores_on_clean_rollouts():
    gt = row([[PARIS], [TIME_CALL]])
    text = tag(PARIS) + turn_break() + tag(TIME_CALL) + turn_break() + REPLY
    paper, strict = both(text, gt)
    assert paper.components == strict.components and paper.score == pytest.approx(1.0)


from itertools import permutations  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from slca_exp.rewards.hierr import reweighted  # noqa: E402
from slca_exp.rewards.match import greedy_match, optimal_match  # noqa: E402
from slca_exp.rewards.types import ToolCall  # noqa: E402

from .strategies import cases  # noqa: E402

_calls = st.lists(
    st.builds(
        ToolCall,
        st.sampled_from(["f", "g"]),
        st.dictionaries(st.sampled_from("abc"), st.integers(0, 2), max_size=3),
    ),
    max_size=5,
)


def _brute_force_total(golds, preds):
    """Best total key + value over every one-to-one same-name assignment."""
    from slca_exp.rewards.match import key_value

    best = 0.0
    slots = list(range(len(preds))) + [None] * len(golds)
    for perm in set(permutations(slots, len(golds))):
        total = 0.0
        for g, j in zip(golds, perm, strict=True):
            if j is not None and preds[j].name == g.name:
                total += sum(key_value(g, preds[j]))
        best = max(best, total)
    return best


@settings(max_examples=150, deadline=None)
@given(_calls, _calls)
def test_optimal_matching_is_optimal_and_never_worse_than_greedy(golds, preds):
    optimal = sum(k + v for k, v in optimal_match(golds, preds))
    assert optimal >= sum(k + v for k, v in greedy_match(golds, preds)) - 1e-12
    assert abs(optimal - _brute_force_total(golds, preds)) < 1e-9


WEIGHTS = st.builds(
    HierRWeights, *[st.sampled_from([0.0, 0.05, 0.1, 0.25, 0.3, 1.0]) for _ in range(5)]
)


@settings(max_examples=200, deadline=None)
@given(case=cases(), variant=st.sampled_from(["paper", "strict"]), a=WEIGHTS, b=WEIGHTS)
def test_reweighting_a_scored_rollout_is_exactly_scoring_it_under_the_other_weights(
    case, variant, a, b
):
    """``reweighted`` (the logged score under ``reward.logged_weights``) equals a second parse."""
    text, truth = case
    got = reweighted(tool_process_reward(text, truth, a, variant), b)
    again = tool_process_reward(text, truth, b, variant)
    assert got.score == again.score  # the same function on the same components: bit for bit
    assert repr(got.components) == repr(again.components)  # NaN, where not judged, on both
    assert (got.should_no_call, got.calls, got.reasons) == (
        again.should_no_call,
        again.calls,
        again.reasons,
    )
