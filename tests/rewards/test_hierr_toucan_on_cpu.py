"""The strict variant on rows shaped like the public Toucan data (gold = bare tool names).

Names-only gold says which tools are called, not with what arguments nor in which turns: strict
leaves key, value and parallel out there (NaN) and rescales the judged weights, so the exact gold
calls score 1.0 in every layout and any wrong, hallucinated, extra or missing call scores less.
On ``irrelevant`` rows any call attempt earns its format credit only.
"""

import json
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from slca_exp.rewards import HierRWeights, read_gold, tool_process_reward

from .rows import tag, turn_break
from .toucan import (
    CALC,
    CAREER,
    FOLLOW_UP,
    LAYOUTS,
    PLAN,
    THINK,
    UI,
    UPLOAD,
    answer,
    hermes,
    toucan_row,
    truth,
)

W = HierRWeights()


def strict(text, row, weights=W):
    return tool_process_reward(text, truth(row), weights, "strict")


def test_toucan_gold_is_names_only_and_flat():
    gold = read_gold(truth(UPLOAD))
    assert [c.name for c in gold.calls] == [UI[3], UI[3], UI[0], UI[2], UI[2]]
    assert not gold.stepped and not gold.stated_calls and gold.needs_call
    assert not read_gold(truth(CAREER)).needs_call


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("row", [PLAN, UPLOAD], ids=["one call", "five calls"])
def test_the_exact_gold_calls_score_one_in_every_layout(row, layout):
    names = [c.name for c in read_gold(truth(row)).calls]
    r = strict(answer(names, layout), row)
    assert r.score == pytest.approx(1.0)
    assert r.components["format"] == r.components["name"] == 1.0
    for part in ("key", "value", "parallel"):  # cannot be judged against bare names
        assert math.isnan(r.components[part]), part


def test_invented_arguments_are_not_punished_on_names_only_gold():
    # Scored against gold that states no arguments, these would make key = value = 0 (0.65).
    r = strict(tag(hermes(THINK, {"thought": "Break the migration into stages."})), PLAN)
    assert r.score == pytest.approx(1.0)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "names",
    [
        [UI[3], UI[3], UI[0], UI[2], UI[1]],  # a wrong (allowed) tool
        [UI[3], UI[3], UI[0], UI[2], "ui-reference-server-preview"],  # a hallucinated tool
        [UI[3], UI[3], UI[0], UI[2], UI[2], UI[2]],  # an extra call
        [UI[3], UI[0], UI[2], UI[2]],  # a missing call
    ],
    ids=["wrong", "hallucinated", "extra", "missing"],
)
def test_any_mistake_scores_below_the_exact_calls(names, layout):
    assert strict(answer(names, layout), UPLOAD).score < 1.0 - 1e-9


def test_a_wrong_name_on_a_one_call_row():
    assert strict(answer([UI[0]], "tags"), PLAN).score < 1.0  # not even allowed here
    r = strict(answer([CALC[1]], "tags"), toucan_row("Add 2 and 3.", CALC, [CALC[0]]))
    assert r.components["name"] == 0.0 and r.score == pytest.approx(0.10 / 0.35)  # format only


def test_the_paper_variant_reads_flat_names_as_one_step():
    # What the public reward does with these rows: no arguments means key = value = 1, and the
    # five calls must all sit in the first block for parallel.
    text = answer(truth(UPLOAD)["gold_tool_calls"], "turns")
    paper = tool_process_reward(text, truth(UPLOAD), W, "paper")
    assert paper.components == {
        "format": 1.0,
        "name": 1.0,
        "key": 1.0,
        "value": 1.0,
        "parallel": 0.0,
    }
    assert paper.score == pytest.approx(0.7)
    assert strict(text, UPLOAD).score == pytest.approx(1.0)


def test_names_only_gold_given_as_steps_still_judges_parallel():
    gt = {"allowed_tools": ["a", "b", "c"], "gold_tool_calls": [["a"], ["b", "c"]]}
    step_by_step = answer(["a"], "tags") + answer(["b", "c"], "array")
    r = tool_process_reward(step_by_step, gt, W, "strict")
    assert r.score == pytest.approx(1.0) and r.components["parallel"] == 1.0
    assert math.isnan(r.components["key"])
    r = tool_process_reward(answer(["a", "b", "c"], "turns"), gt, W, "strict")
    assert r.components["parallel"] == pytest.approx(1 / 3) and r.score < 1.0  # step 0 agrees


def test_gold_that_says_no_arguments_still_judges_invented_ones():
    gt = {"allowed_tools": [THINK], "gold_tool_calls": [{"name": THINK, "arguments": {}}]}
    r = tool_process_reward(tag(hermes(THINK)), gt, W, "strict")
    assert (r.components["key"], r.components["value"]) == (0.0, 0.0)


def test_rescaling_follows_the_weights():
    w = HierRWeights(0.2, 0.2, 0.2, 0.2, 0.2)
    r = strict(answer([UI[3], UI[3], UI[0], UI[2]], "tags"), UPLOAD, w)
    name = 2 * 4 / 9
    assert r.components["name"] == pytest.approx(name)
    assert r.score == pytest.approx((0.2 + 0.2 * name) / 0.4)
    # judged components that weigh nothing: their plain mean, times the total weight
    w = HierRWeights(0.0, 0.0, 0.5, 0.5, 0.0)
    assert strict(answer([UI[3], UI[3], UI[0], UI[2]], "tags"), UPLOAD, w).score == (
        pytest.approx((1.0 + name) / 2)
    )


NAMES_ONLY = st.lists(st.sampled_from(UI), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(NAMES_ONLY, st.sampled_from(LAYOUTS), st.randoms(use_true_random=False), st.data())
def test_exact_calls_score_one_and_every_mistake_less(gold, layout, rng, data):
    row = toucan_row("q", UI, gold)
    shuffled = rng.sample(gold, len(gold))  # flat gold: any order and grouping of its calls
    assert strict(answer(shuffled, layout), row).score == pytest.approx(1.0)
    mistake = data.draw(st.sampled_from(["wrong", "hallucinated", "extra", "missing"]))
    i = data.draw(st.integers(0, len(gold) - 1))
    wrong = list(shuffled)
    if mistake == "wrong":
        wrong[i] = next(n for n in UI if n != wrong[i])
    elif mistake == "hallucinated":
        wrong[i] = "ui-reference-server-nope"
    elif mistake == "extra":
        wrong.insert(i, data.draw(st.sampled_from(UI)))
    else:
        del wrong[i]
    # "wrong" must not swap in a name the gold also holds at that count: that is no mistake
    assume(sorted(wrong) != sorted(gold))
    assert strict(answer(wrong, layout) if wrong else "No call.", row).score < 1.0 - 1e-9


# Irrelevant rows: the answer is not to call.

MALFORMED = [
    "<tool_call>\n{not json}\n</tool_call>",
    '<tool_call>\n{"name": "' + THINK + '", "arguments": {}}',  # unclosed
    "<tool_call>\n\n</tool_call>",
    '<tool_call>\n{"arguments": {}}\n</tool_call>',
    "</tool_call>",
    '<tool_call>\n{"name": "' + THINK + '", "arguments": "oops"}',
]


@pytest.mark.parametrize("row", [FOLLOW_UP, CAREER], ids=["follow-up", "career"])
def test_irrelevant_rows_rank_no_call_first_then_well_formed_then_malformed(row):
    tool = truth(row)["allowed_tools"][0]
    correct = strict("I can answer that directly: here is a checklist.", row)
    assert correct.score == pytest.approx(1.0)
    spurious = strict(tag(hermes(tool)) + turn_break() + "Here it is.", row)
    assert spurious.score == pytest.approx(0.10)
    assert spurious.components == {
        "format": 1.0,
        "name": 0.0,
        "key": 0.0,
        "value": 0.0,
        "parallel": 0.0,
    }
    hallucinated = strict(tag(hermes("web-search")), row)
    assert hallucinated.score == 0.0
    for text in MALFORMED:
        assert strict(text + "\nHere it is.", row).score == 0.0, text


ATTEMPT = st.one_of(
    st.sampled_from(MALFORMED),
    st.text(st.sampled_from('{}[]":, abnqx'), max_size=20).map(
        lambda body: f"<tool_call>{body}</tool_call>"
    ),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(ATTEMPT, min_size=1, max_size=3),
    st.lists(st.sampled_from([THINK, *CALC]), min_size=1, max_size=3),
    st.sampled_from(LAYOUTS),
)
def test_on_irrelevant_rows_malformed_never_beats_well_formed(attempts, names, layout):
    for row in (FOLLOW_UP, CAREER):
        allowed = truth(row)["allowed_tools"]
        well_formed = strict(answer([n for n in names if n in allowed] or allowed[:1], layout), row)
        malformed = strict("\n".join(attempts), row)
        mixed = strict("\n".join(attempts) + answer(names, layout), row)
        assert malformed.score <= well_formed.score <= W.format
        assert max(malformed.score, well_formed.score, mixed.score) < 1.0
        for r in (malformed, well_formed, mixed):
            assert r.score == pytest.approx(W.format * r.components["format"])


def test_irrelevant_rows_round_trip_through_json_gold():
    row = json.loads(json.dumps(CAREER))
    truth(row)["gold_tool_calls"] = "[]"
    assert strict("No tool fits this question.", row).score == pytest.approx(1.0)
