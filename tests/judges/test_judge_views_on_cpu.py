"""What the reward asks of a judge with each request: the view, and a template of its own."""

import pytest

from slca_exp.config.services import JudgeConfig
from slca_exp.judges import JudgeRequest, JudgeView, build_judge
from slca_exp.judges.base import VIEW_FIELDS
from slca_exp.rewards.judging import JUDGE_VIEWS
from tests.judges.rows import FAITHFUL, QUESTION, rollout
from tests.judges.test_llm_judge_on_cpu import config

V82 = "hierr_judge_v82.txt"


def request(view="responses", prompt=None, reply=FAITHFUL):
    return JudgeRequest(QUESTION, rollout(reply), True, view, prompt)


def test_every_view_fills_the_question_and_the_reply():
    assert tuple(VIEW_FIELDS) == JUDGE_VIEWS
    assert all({"question", "reply"} <= set(fields) for fields in VIEW_FIELDS.values())


def test_the_interaction_view_lists_the_calls_then_the_responses():
    view = JudgeView.of(request("interaction"))
    assert view.kind == "interaction" and view.reply == FAITHFUL
    calls, responses = view.tool_interactions.split("\n\n")
    assert calls == '[Tool Call 1]\n{"name": "weather", "arguments": {"city": "Paris"}}'
    assert responses.startswith('[Tool Response 1]\n{"city": "Paris"')
    assert JudgeView.of(request()).tool_interactions == ""


def test_the_openai_judge_renders_the_requests_view_into_its_template(server, tmp_path):
    with build_judge(config(server, tmp_path)) as judge:
        results = judge.score([request(), request("interaction", V82)])
    assert [r.rating for r in results] == [4, 4]
    own, v82 = (r.json()["messages"][0]["content"] for r in server.completions)
    assert "<tool_call>" not in own and "[Tool Call" not in own
    assert v82.startswith("## Task\n") and "## Tool Interactions\n```\n[Tool Call 1]\n" in v82
    assert f"## Model's Final Response\n```\n{FAITHFUL}\n```\n" in v82


def test_a_requests_template_has_answers_cached_under_its_own_hash(server, tmp_path):
    cfg = config(server, tmp_path)
    with build_judge(cfg) as judge:
        first = judge.score([request("interaction", V82)])
    with build_judge(cfg) as fresh:
        again = fresh.score([request("interaction", V82), request()])
    assert [r.cached for r in first + again] == [False, True, False]
    assert len(server.completions) == 2


@pytest.mark.parametrize("view", JUDGE_VIEWS)
def test_the_rubric_judge_rates_under_either_view(view):
    judge = build_judge(JudgeConfig())
    (result,) = judge.score([request(view, V82)])
    assert result.status == "ok" and result.rating is not None
