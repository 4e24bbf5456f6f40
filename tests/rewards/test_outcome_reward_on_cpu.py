"""``reward.tool_reward=outcome``: R_tool the outcome verdict, HierR logged, failures absent."""

import json
import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.config.schema import RewardConfig
from slca_exp.config.services import JudgeConfig
from slca_exp.core import names
from slca_exp.core.rows import Row
from slca_exp.data.synthetic import build_rows
from slca_exp.estimators import get_estimator
from slca_exp.estimators.base import EstimatorParams
from slca_exp.estimators.segments import split_segments
from slca_exp.judges import build_judge, build_outcome_judge
from slca_exp.rewards import HierRReward
from slca_exp.rewards.judging import OutcomeResult

ROWS = build_rows(24, "val", 3)
TOOL_ROWS = [r for r in ROWS if Row(r).recorded()]
NO_CALL_ROW = next(r for r in ROWS if not Row(r).recorded())
SUMMARY_JUDGE = build_judge(JudgeConfig())


def gold_text(row, reply=None):
    """The row's gold calls, their recorded answers and a final reply (the gold one by default)."""
    calls = "".join(
        f"<tool_call>{json.dumps({'name': a['name'], 'arguments': a['arguments']})}</tool_call>"
        f"<tool_response>{a['content']}</tool_response>"
        for a in Row(row).recorded()
    )
    return calls + (row["extra_info"]["reply"] if reply is None else reply)


def score(reward, texts, rows, outcome="facts"):
    judge = (
        outcome
        if not isinstance(outcome, str)
        else build_outcome_judge(reward_cfg(), JudgeConfig())
    )
    return reward.score(
        texts,
        [Row(r).truth() for r in rows],
        SUMMARY_JUDGE,
        outcome=judge,
        recorded=[Row(r).recorded() for r in rows],
    )


def reward_cfg(**kw):
    return RewardConfig(tool_reward="outcome", variant="paper", judge_failure="absent", **kw)


class Fixed:
    """An outcome judge answering given results in order (a stand-in for a server)."""

    name = "fixed"

    def __init__(self, results):
        self.results = list(results)
        self.asked = []

    def score(self, batch):
        self.asked += list(batch)
        return [self.results.pop(0) for _ in batch]

    def describe(self):
        return {"backend": "fixed"}

    def close(self):
        pass


def test_r_tool_is_the_verdict_and_hierr_is_logged_beside_it():
    rows = TOOL_ROWS[:4]
    texts = [
        gold_text(rows[0]),
        gold_text(rows[1], "Here is what I found for you."),
        *map(gold_text, rows[2:]),
    ]
    outcome = HierRReward.from_config(reward_cfg())
    hierr = HierRReward.from_config(RewardConfig(variant="paper", judge_failure="absent"))
    got = score(outcome, texts, rows)
    base = hierr.score(texts, [Row(r).truth() for r in rows], SUMMARY_JUDGE)
    assert [t.score for t in got.tool] == [1.0, 0.0, 1.0, 1.0]
    assert [o.verdict for o in got.outcome] == ["Solved", "Unsolved", "Solved", "Solved"]
    # HierR's parts are the HierR reward's own, logged under their names
    assert [t.score for t in got.hierr] == [t.score for t in base.tool]
    assert [t.components for t in got.tool] == [t.components for t in base.tool]
    assert got.stats[names.REWARD_TOOL_HIERR_MEAN] == base.stats[names.REWARD_TOOL_MEAN]
    assert base.stats[names.REWARD_TOOL_HIERR_MEAN] == base.stats[names.REWARD_TOOL_MEAN]
    assert got.stats[names.REWARD_TOOL_MEAN] == 0.75
    assert got.stats[names.REWARD_OUTCOME_SOLVED_FRAC] == 0.75
    for part in names.TOOL_COMPONENTS:
        assert got.stats[names.tool_component(part)] == base.stats[names.tool_component(part)]
    # R_sum is the unchanged summary judge
    assert [s.score for s in got.summary] == [s.score for s in base.summary]
    assert torch.equal(got.scores.summary, base.scores.summary)
    expected = torch.tensor([t.score for t in got.tool]) + got.scores.summary
    assert torch.equal(got.scores.total, expected)


def test_a_no_call_on_a_tool_row_gets_the_penalty_and_the_judge_is_not_asked():
    row = TOOL_ROWS[0]
    fixed = Fixed([])
    got = score(HierRReward.from_config(reward_cfg()), ["I think it is sunny there."], [row], fixed)
    assert fixed.asked == [] and got.outcome == [None]
    assert (float(got.scores.tool[0]), float(got.scores.total[0])) == (0.0, -0.5)
    assert float(got.scores.summary[0]) == -0.5  # the penalty goes through the summary segment
    assert got.stats[names.OUTCOME_REQUESTS] == 0.0
    assert names.REWARD_OUTCOME_SOLVED_FRAC not in got.stats  # nothing was decided


def test_a_row_that_needs_no_call_is_judged_on_its_outcome():
    decline = NO_CALL_ROW["extra_info"]["reply"]
    got = score(HierRReward.from_config(reward_cfg()), [decline], [NO_CALL_ROW])
    assert got.outcome[0].verdict == "Solved" and float(got.scores.tool[0]) == 1.0


def test_a_failed_outcome_judge_leaves_r_tool_and_the_total_absent():
    rows = TOOL_ROWS[:2]
    failed = OutcomeResult.failed("HTTP 503")
    got = score(
        HierRReward.from_config(reward_cfg()),
        [gold_text(r) for r in rows],
        rows,
        Fixed([failed, OutcomeResult.decided("Solved")]),
    )
    assert math.isnan(got.tool[0].score) and math.isnan(float(got.scores.tool[0]))
    assert math.isnan(float(got.scores.total[0])) and math.isfinite(float(got.scores.summary[0]))
    assert got.stats[names.OUTCOME_FAILURES] == 1.0
    assert got.stats[names.REWARD_TOOL_MEAN] == 1.0  # over the scored rollout only
    assert got.stats[names.REWARD_OUTCOME_SOLVED_FRAC] == 1.0


def test_without_an_outcome_judge_the_reward_refuses():
    try:
        score(HierRReward.from_config(reward_cfg()), [gold_text(TOOL_ROWS[0])], TOOL_ROWS[:1], None)
    except ValueError as err:
        assert "build_outcome_judge" in str(err)
    else:
        raise AssertionError("scored without an outcome judge")


VERDICT = st.sampled_from(["Solved", "Unsolved", "Unsure", None])


@settings(max_examples=40, deadline=None)
@given(
    first=st.lists(VERDICT, min_size=8, max_size=8),
    second=st.lists(VERDICT, min_size=8, max_size=8),
)
def test_the_outcome_verdicts_never_move_the_summary_advantages_exactly(first, second):
    """SLCA-GRPO: whatever the outcome judge says (failures included), A_sum is bit-equal."""
    rows = [TOOL_ROWS[i // 4] for i in range(8)]  # two groups of four rollouts
    texts = [
        gold_text(r, reply=f"{r['extra_info']['reply']} {'Also, ' * (i % 3)}that is all.")
        for i, r in enumerate(rows)
    ]
    reward = HierRReward.from_config(reward_cfg())
    results = []
    for verdicts in (first, second):
        fixed = Fixed(
            OutcomeResult.failed("down") if v is None else OutcomeResult.decided(v)
            for v in verdicts
        )
        scored = score(reward, texts, rows, fixed)
        mask = torch.tensor([[1, 1, 0, 0, 1, 1]] * 8)  # a tool segment, then a summary segment
        adv = get_estimator("slca_grpo")(
            split_segments(mask), torch.tensor([0] * 4 + [1] * 4), scored.scores, EstimatorParams()
        )
        results.append(adv)
    assert torch.equal(results[0].summary_adv, results[1].summary_adv)
    absent = torch.tensor([v is None for v in first])
    assert torch.all(results[0].tool_adv[absent] == 0)
