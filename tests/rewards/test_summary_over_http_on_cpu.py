"""The summary reward end to end: HierRReward -> the openai judge -> a real loopback server."""

import math

import pytest

from slca_exp.judges import build_judge
from slca_exp.rewards import HierRReward
from tests.judges.test_llm_judge_on_cpu import config  # the judge tests' loopback settings
from tests.services.fixtures import loopback, server  # noqa: F401

from .rows import PARIS, row, tag, turn_break

ROLLOUT = tag(PARIS) + turn_break('{"temp": 18}') + "It is 18 degrees Celsius in Paris."
GOOD = "<response_quality><reasoning>ok</reasoning><rating>excellent</rating></response_quality>"


def judge(server, tmp_path, **kw):  # noqa: F811
    return build_judge(config(server, tmp_path, **kw))


def test_two_500s_then_an_answer_is_a_real_summary_score(server, tmp_path):  # noqa: F811
    server.configure(fail_first=2, content=GOOD)
    with judge(server, tmp_path) as j:
        batch = HierRReward().score([ROLLOUT], [row([[PARIS]])], j)
    assert batch.summary[0].status == "ok" and batch.scores.summary[0] == 1.0
    assert batch.scores.total[0] == pytest.approx(2.0) and len(server.completions) == 3


@pytest.mark.parametrize(("policy", "expected"), [("absent", math.nan), ("zero", 0.0)])
def test_a_hanging_judge_gives_nan_or_zero_by_policy(server, tmp_path, policy, expected):  # noqa: F811
    server.configure(hang_s=2.0)
    with judge(server, tmp_path, max_retries=1) as j:
        batch = HierRReward(judge_failure=policy).score([ROLLOUT], [row([[PARIS]])], j)
    assert batch.summary[0].status == "failed" and "timeout" in batch.summary[0].reason
    got = float(batch.scores.summary[0])
    assert math.isnan(got) if math.isnan(expected) else got == expected
    assert batch.scores.tool[0] == 1.0  # the tool segment is scored whatever the judge does
