"""Rule rubric-v2: a reply that states nothing earns nothing, measured on a labelled set.

The labelled set (``labelled.py``) is built from the synthetic generator; the properties hold on
every row of it. Rule v1 stays selectable and reproduces, exactly, the ratings the rule gave
before v2 existed (``data/rubric_v1_reference.json``: the logged rollouts of a demo run made
under v1, and a sample of the labelled set, each with the result the v1 code of that time gave).
"""

import json
from collections import defaultdict
from pathlib import Path

import pytest
from scipy.stats import spearmanr

from slca_exp.config.services import JudgeConfig
from slca_exp.judges import JudgeRequest, JudgeView, build_judge, describe_judge, rubric_verdict
from slca_exp.judges.rubric_v2 import rubric_v2_components
from tests.judges.labelled import labelled_set
from tests.test_recipe_on_cpu import recipe_of

HERE = Path(__file__).parent
DOCS = HERE.parents[1] / "docs" / "judges-and-simulators.md"

# A step-40 best rollout of the demo under v1: it called get_time and get_stock_price with the
# wrong arguments, the replay simulator derived both answers, and its "summary" is a tool call.
QUESTION = "What's the weather in Chicago and the stock price of AMZN?"
RESPONSES = (
    '{"result": {"id": "res-d40715", "state": "updated", "value": 662.38}, "status": "success", '
    '"tool": "get_time"}',
    '{"result": {"id": "res-09f875", "state": "confirmed", "value": 392.97}, "status": '
    '"success", "tool": "get_stock_price"}',
)
MARKUP = (
    '{"name":"translate","arguments":{"text":"translate","to_language":"spanish"}}\n</tool_call>'
)
REPORTED = (  # reply, its v1 rating as reported, what v2 must give
    (MARKUP, 4, "== 1"),
    ("I have looked into your request carefully and here is my answer for you.", 4, "== 1"),
    ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.", 4, "== 1"),
    (
        "The stock price is 392.97 and the time value is 662.38; the status was success.",
        5,
        ">= 4",
    ),
    ("The stock price is 100.5 and the time value is 7.25.", 2, "<= 2"),
)


@pytest.mark.parametrize(("reply", "v1", "v2"), REPORTED)
def test_the_reported_replies_rate_as_reported_under_v1_and_as_the_rule_says_under_v2(
    reply, v1, v2
):
    view = JudgeView(QUESTION, RESPONSES, reply)
    assert rubric_verdict(view, "v1")[0] == v1
    rating, reason = rubric_verdict(view, "v2")
    assert eval(f"{rating} {v2}"), (rating, reason)  # noqa: S307 - the table's own comparisons


def test_the_judge_says_why_a_reply_is_not_a_summary():
    text = (
        "<tool_call>{}</tool_call>"
        + "".join(f"<tool_response>{r}</tool_response>" for r in RESPONSES)
        + MARKUP
        + "<|im_end|>"
    )
    with build_judge(JudgeConfig()) as judge:
        (markup,) = judge.score([JudgeRequest(QUESTION, text)])
        (echo,) = judge.score(
            [JudgeRequest(QUESTION, text.replace(MARKUP, f"You asked: {QUESTION}"))]
        )
    assert (markup.status, markup.rating, markup.score) == ("ok", 1, 0.0)
    assert markup.reason == "very poor: not a summary (tool-call markup)"
    assert echo.reason == "very poor: not a summary (an echo of the question)"


@pytest.fixture(scope="module")
def labelled():
    """The labelled set over 200 tool rows, with both rules' ratings."""
    rows = labelled_set(200)
    assert len({x.row for x in rows}) == 200
    return [(x, rubric_verdict(x.view, "v1")[0], rubric_verdict(x.view, "v2")[0]) for x in rows]


def _gold(labelled):
    return {x.row: v2 for x, _, v2 in labelled if x.family == "gold"}


def test_every_reply_that_says_nothing_rates_at_most_2(labelled):
    kinds = {x.kind for x, _, _ in labelled if x.family == "says_nothing"}
    assert {"lorem", "markup", "markup_cut", "echo", "echo_asked", "tool_json"} <= kinds
    high = [
        (x.kind, x.view.reply, v2) for x, _, v2 in labelled if x.family == "says_nothing" and v2 > 2
    ]
    assert high == []


def test_every_gold_summary_rates_at_least_4(labelled):
    assert [(x.view.reply, v2) for x, _, v2 in labelled if x.family == "gold" and v2 < 4] == []


def test_one_wrong_number_rates_below_the_same_reply_with_it_right(labelled):
    gold = _gold(labelled)
    cases = [(x, v2) for x, _, v2 in labelled if x.kind.startswith("one_wrong_")]
    assert len(cases) >= 200
    assert [(x.view.reply, v2, gold[x.row]) for x, v2 in cases if v2 >= gold[x.row]] == []


def test_the_gold_summary_rates_above_every_degraded_version_of_it(labelled):
    gold = _gold(labelled)
    degraded = [(x, v2) for x, _, v2 in labelled if x.family in ("degraded", "wrong_number")]
    kinds = {x.kind for x, _ in degraded}
    assert {"first_half", "first_sentence", "said_twice", "invented_extra", "all_wrong"} <= kinds
    assert [(x.kind, x.view.reply, v2) for x, v2 in degraded if v2 >= gold[x.row]] == []


def agreement_table(labelled):
    """The markdown rows docs/judges-and-simulators.md reports (mean rating per family, rho)."""
    families = ("gold", "says_nothing", "wrong_number", "other_row", "degraded")
    by = defaultdict(lambda: ([], []))
    for x, v1, v2 in labelled:
        by[x.family][0].append(v1)
        by[x.family][1].append(v2)
    facts = [x.facts_right for x, _, _ in labelled]
    lines = []
    for i, rule in enumerate(("rubric-v1", "rubric-v2")):
        rho = spearmanr([r[1 + i] for r in labelled], facts)[0]
        means = " | ".join(f"{sum(by[f][i]) / len(by[f][i]):.2f}" for f in families)
        lines.append(f"| `{rule}` | {means} | {rho:.2f} |")
    return lines


def test_the_documented_agreement_with_the_facts_stated_is_measured(labelled):
    # Spearman rho of the rating with the facts a reply states, over the labelled set. Measured
    # on seeds 0-3 (600 rows each): v1 0.18-0.20, v2 0.913-0.915.
    lines = agreement_table(labelled)
    rho = [float(line.rsplit("|", 2)[1]) for line in lines]
    assert rho[0] < 0.3 and rho[1] > 0.85, lines
    text = DOCS.read_text()
    missing = [line for line in lines if line not in text]
    assert missing == [], "docs/judges-and-simulators.md should show:\n" + "\n".join(lines)


def test_v2_components_add_up_to_the_rating():
    view = JudgeView(QUESTION, RESPONSES, REPORTED[3][0])
    c = rubric_v2_components(view)
    # new facts: updated, 662.38, success | confirmed, 392.97, success (ids and tool names are
    # identifiers): 5 distinct; two of three stated per response: C = 2/3, q = C, tier 4, nothing
    # invented.
    assert (c["facts"], c["stated"], c["invented"], c["rating"]) == (5, 3, 0, 4)
    assert c["coverage"] == pytest.approx(2 / 3) and c["q"] == pytest.approx(2 / 3)


def test_v1_reproduces_the_ratings_it_gave_before_v2_exactly():
    reference = json.loads((HERE / "data" / "rubric_v1_reference.json").read_text())
    cfg = JudgeConfig(rubric_version="v1")
    assert describe_judge(cfg) == reference["judge"]  # the recipe's judge component, unchanged
    items = reference["items"]
    assert sum(i["source"].startswith("run:") for i in items) == 36
    with build_judge(cfg) as judge:
        got = judge.score(
            [JudgeRequest(i["question"], i["response"], i["require_tool_response"]) for i in items]
        )
    mismatched = [
        (i["source"], i["v1"], r)
        for i, r in zip(items, got, strict=True)
        if (r.status, r.rating, r.score, r.reason)
        != tuple(i["v1"][k] for k in ("status", "rating", "score", "reason"))
    ]
    assert mismatched == []


def test_the_recipe_fingerprint_and_tags_tell_the_rules_apart():
    v1, v2 = recipe_of("judge.rubric_version=v1"), recipe_of()
    assert v1.fingerprint != v2.fingerprint
    assert v1.tags()["slca.judge"] == "rubric@rubric-v1"
    assert v2.tags()["slca.judge"] == "rubric@rubric-v2"
    assert recipe_of("judge.rubric_version=v2").fingerprint == v2.fingerprint


def test_a_rubric_version_for_another_judge_or_an_unknown_one_is_refused():
    from slca_exp.preflight.compose import compose_run
    from slca_exp.preflight.validate import ConfigError, validate

    with pytest.raises(ConfigError) as err:
        validate(compose_run(["judge=openai", "judge.rubric_version=v1"]))
    assert "judge.rubric_version" in str(err.value) and "judge=rubric" in str(err.value)
    with pytest.raises(ConfigError) as err:
        validate(compose_run(["judge.rubric_version=v3"]))
    assert "judge.rubric_version" in str(err.value) and "v1, v2" in str(err.value)
