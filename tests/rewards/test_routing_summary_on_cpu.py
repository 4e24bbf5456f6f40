"""Summary reward failure policy, penalty routing, the batch scorer and its metrics."""

import math

import pytest
import torch

from slca_exp.core import names
from slca_exp.estimators import get_estimator
from slca_exp.estimators.base import EstimatorParams
from slca_exp.judges.base import JudgeResult
from slca_exp.rewards import (
    HierRReward,
    SummaryReward,
    ToolReward,
    route_batch,
    route_penalty,
    summary_reward,
)
from slca_exp.rewards.summary import from_judge

from .rows import PARIS, REPLY, row, tag, turn_break

NAN = float("nan")


class ScriptedJudge:
    """Answers each request with the next scripted result; records what it was asked."""

    name = "scripted"

    def __init__(self, results):
        self.results = list(results)
        self.requests = []

    def score(self, batch):
        self.requests.extend(batch)
        return [self.results.pop(0) for _ in batch]


OK = JudgeResult(rating=4, score=0.75, status="ok")
FAILED = JudgeResult(rating=None, score=NAN, status="failed", reason="timeout after 3 retries")
SHORT = JudgeResult(rating=None, score=0.0, status="short_circuit", reason="no tool response")


def test_failure_policy_absent_keeps_nan_and_zero_gives_zero():
    absent = from_judge(FAILED, "absent")
    assert math.isnan(absent.score) and absent.status == "failed" and absent.rating is None
    zero = from_judge(FAILED, "zero")
    assert zero.score == 0.0 and zero.status == "failed"
    assert "timeout" in zero.reason
    assert from_judge(OK, "zero") == SummaryReward(0.75, 4, "ok", "")
    assert from_judge(SHORT, "absent").score == 0.0  # a short-circuit is a real 0
    with pytest.raises(ValueError, match="expected absent, zero, stop"):
        from_judge(OK, "drop")


def test_summary_reward_passes_the_request_to_the_judge():
    judge = ScriptedJudge([OK])
    r = summary_reward("Weather?", REPLY, judge, require_tool_response=False)
    assert r.score == 0.75 and judge.requests[0].require_tool_response is False
    assert judge.requests[0].question == "Weather?"


@pytest.mark.parametrize(
    ("tool", "summary", "kw", "expected"),
    [
        (0.8, 0.5, {}, (0.8, 0.5, 1.3, False)),
        (0.8, 0.5, {"process_weight": 2.0, "summary_weight": 0.5}, (0.8, 0.5, 1.85, False)),
        # should_no_call: the penalty replaces the summary score, the tool score is 0
        (-0.5, 1.0, {"should_no_call": True}, (0.0, -0.5, -0.5, True)),
        # a negative total (here a negative summary) is routed through the summary only
        (0.2, -1.0, {}, (0.0, -0.8, -0.8, True)),
        # an unscored summary is not a penalty: total NaN, the tool score stays
        (0.6, NAN, {}, (0.6, NAN, NAN, False)),
    ],
)
def test_route_penalty(tool, summary, kw, expected):
    got = route_penalty(tool, summary, **kw)
    for value, want in zip((got.tool, got.summary, got.total, got.guarded), expected, strict=True):
        if isinstance(want, float) and math.isnan(want):
            assert math.isnan(value)
        else:
            assert value == pytest.approx(want)


def test_route_penalty_reads_should_no_call_from_the_tool_reward():
    tool = ToolReward(-0.5, dict.fromkeys(("format", "name", "key", "value", "parallel"), 0.0), 1)
    assert route_penalty(tool, SummaryReward(1.0, 5, "ok")).summary == -0.5


def _batch():
    gt = row([[PARIS]])
    good = tag(PARIS) + turn_break('{"temp": 18}') + REPLY
    return gt, [good, good, "It is sunny, I guess.", good]


def test_scorer_routes_a_judge_failure_to_an_absent_summary():
    gt, responses = _batch()
    judge = ScriptedJudge([OK, FAILED, OK, JudgeResult(rating=2, score=0.25, status="ok")])
    batch = HierRReward(variant="strict").score(responses, [gt] * 4, judge)
    tool, summary, total = (batch.scores.tool, batch.scores.summary, batch.scores.total)
    assert tool.tolist() == pytest.approx([1.0, 1.0, 0.0, 1.0])
    assert summary[0] == 0.75 and math.isnan(summary[1]) and summary[2] == -0.5
    assert math.isnan(total[1]) and total[2] == -0.5
    assert set(batch.stats) <= set(names.METRICS)
    assert batch.stats["reward/no_call/frac"] == 0.25
    # the judge's own scores over the rollouts it scored (before routing)
    assert batch.stats["reward/summary/mean"] == pytest.approx((0.75 + 0.75 + 0.25) / 3)

    # The estimators see the failed summary as absent: no summary advantage for rollout 1,
    # and its NaN does not move the group's statistics.
    mask = torch.tensor([[1, 1, 0, 0, 1, 1]] * 4)
    adv = get_estimator("slca_grpo")(mask, [0] * 4, batch.scores, EstimatorParams())
    assert adv.summary_adv[1] == 0.0
    assert adv.stats[names.present_frac("summary")] == pytest.approx(0.75)
    grpo = get_estimator("grpo")(mask, [0] * 4, batch.scores, EstimatorParams())
    assert torch.all(grpo.advantages[1] == 0)


def test_paper_policy_scores_a_judge_failure_as_zero():
    gt, responses = _batch()
    judge = ScriptedJudge([OK, FAILED, OK, OK])
    batch = HierRReward(variant="paper", judge_failure="zero").score(responses, [gt] * 4, judge)
    assert batch.scores.summary[1] == 0.0 and batch.summary[1].status == "failed"


def test_strict_judges_a_no_call_reply_on_an_irrelevant_row():
    gt = row([], subset="irrelevant")
    for variant, need in (("strict", False), ("paper", True)):
        judge = ScriptedJudge([OK])
        HierRReward(variant=variant).score(["None of the tools fit."], [gt], judge)
        assert judge.requests[0].require_tool_response is need


def test_paper_scores_a_row_without_allowed_tools_zero_without_asking_the_judge():
    no_tools = row([[PARIS]], allowed=())
    responses = [tag(PARIS) + turn_break('{"temp": 18}') + REPLY] * 2
    judge = ScriptedJudge([OK])
    batch = HierRReward(variant="paper").score(responses, [no_tools, row([[PARIS]])], judge)
    assert len(judge.requests) == 1  # only the row that allows tools was judged
    assert batch.scores.total.tolist() == pytest.approx([0.0, 1.75])
    assert batch.summary[0].status == "short_circuit" and batch.tool[0].should_no_call == 0
    assert (
        HierRReward(variant="paper")
        .score(responses[:1], [no_tools], judge)
        .stats["reward/total/mean"]
        == 0.0
    )
    # strict scores such a row like any other (split loading refuses it when it has gold calls)
    judge = ScriptedJudge([OK])
    strict = HierRReward(variant="strict").score(responses[:1], [no_tools], judge)
    assert len(judge.requests) == 1
    assert strict.tool[0].components["format"] == 0.0  # no call can be valid
    assert strict.scores.total.tolist() == pytest.approx([0.25 * 1.0 + 0.75])  # name + judge


def test_component_means_leave_out_what_was_not_judged():
    names_only = row(["get_weather"])
    good = tag(PARIS) + turn_break('{"temp": 18}') + REPLY
    judge = ScriptedJudge([OK, OK])
    batch = HierRReward(variant="strict").score([good, good], [names_only, row([[PARIS]])], judge)
    assert math.isnan(batch.tool[0].components["key"])
    assert batch.stats["reward/tool/key/mean"] == 1.0  # the second rollout's only
    assert batch.stats["reward/tool/mean"] == pytest.approx(1.0)
    only_names = HierRReward(variant="strict").score([good], [names_only], ScriptedJudge([OK]))
    assert math.isnan(only_names.stats["reward/tool/key/mean"])  # judged nowhere in the batch


def test_route_batch_shapes():
    scores = route_batch(
        [ToolReward(0.5, {}), ToolReward(1.0, {})], [SummaryReward(0.25, 2, "ok")] * 2
    )
    assert scores.total.dtype == torch.float32 and scores.total.tolist() == [0.75, 1.25]
    with pytest.raises(ValueError, match="2 tool rewards for 1"):
        route_batch([ToolReward(0.5, {})] * 2, [SummaryReward(0.25, 2, "ok")])


def test_judge_metrics_of_a_batch():
    from slca_exp.rewards.summary import judge_stats

    batch = [
        from_judge(JudgeResult(4, 0.75, "ok", cached=True, latency_ms=0.0)),
        from_judge(JudgeResult(3, 0.5, "ok", latency_ms=40.0, raw_rating=1)),  # judge.noise
        from_judge(JudgeResult(None, NAN, "failed", latency_ms=20.0)),
        from_judge(SHORT),
    ]
    stats = judge_stats(batch)
    assert stats == {
        "judge/requests": 3.0,
        "judge/failures": 1.0,
        "judge/cache_hit_frac": 1 / 3,
        "judge/latency_ms": 30.0,
        "judge/rating": 3.5,
        "judge/raw_rating": 2.5,
        "judge/perturbed_frac": 0.5,
    }
    assert set(stats) <= set(names.METRICS)
