"""Segment scores read back exactly: ties stay ties through verl's own advantage step.

Batches are built the way verl builds them: our reward side's ``rm_scores``
(``place_segment_scores``: R_tool on the last tool token, R_sum on the last summary token) in
float32 or bfloat16, verl's own ``apply_kl_penalty`` when ``use_kl_in_reward`` is on, then
``compute_advantage_for_multi_trajectories``, which runs our registered estimator.

What "equal scores" means: without KL, the values the reward side wrote (in the rewards'
dtype); with KL, every segment also carries the KL terms of its own tokens, so two segments tie
when they are the same tokens under the same two policies. The batches are drawn that way:
every rollout joins a tool part and a summary part, each drawn from a small pool (same tokens,
same log-probs, same score), so ties are common and each part's place moves with the other.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.skip_policy import require

require("verl", reason="needs the verl extra")
pytestmark = pytest.mark.verl

from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import FixedKLController  # noqa: E402
from verl.trainer.ppo.ray_trainer import apply_kl_penalty  # noqa: E402
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories  # noqa: E402

from slca_exp.core import names  # noqa: E402
from slca_exp.engines.verl import plugin, scores  # noqa: E402, F401 - registers the estimators
from slca_exp.engines.verl.estimators import (  # noqa: E402
    segment_call,
    segment_scores,
    verl_estimator,
)
from slca_exp.engines.verl.rewards import place_segment_scores  # noqa: E402
from slca_exp.estimators import (  # noqa: E402
    RolloutScores,
    slca_grpo_advantages,
    toolpo_grpo_advantages,
)
from slca_exp.estimators.segments import split_segments  # noqa: E402

JUDGE = [0.0, 0.25, 0.5, 0.75, 1.0, -0.5]  # the 5-label judge, and the no-call penalty
TOOL = [0.0, 0.1, 0.2, 0.25, 0.6, 1.0, 1 / 3]
LOGP = st.floats(-6.0, 0.0, width=32)


@st.composite
def tool_parts(draw):
    """0-5 tool turns (tokens, then an injected response), their log-probs and R_tool."""
    turns = draw(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 3)), max_size=5))
    mask = [v for n, gap in turns for v in [1] * n + [0] * gap]
    logp = draw(st.lists(st.tuples(LOGP, LOGP), min_size=len(mask), max_size=len(mask)))
    return mask, logp, draw(st.sampled_from(TOOL) | st.floats(-1, 1, width=32))


@st.composite
def summary_parts(draw):
    """The final reply (1-5 tokens), its log-probs and R_sum."""
    n = draw(st.integers(1, 5))
    logp = draw(st.lists(st.tuples(LOGP, LOGP), min_size=n, max_size=n))
    return [1] * n, logp, draw(st.sampled_from(JUDGE))


@st.composite
def batches(draw):
    """Groups of 2-32 rollouts; each one a (tool part, summary part) pair, or no token at all."""
    tools = draw(st.lists(tool_parts(), min_size=1, max_size=4))
    summaries = draw(st.lists(summary_parts(), min_size=1, max_size=4))
    sizes = draw(st.lists(st.integers(2, 32), min_size=1, max_size=2))
    rollouts = []
    for group, size in enumerate(sizes):
        for _ in range(size):
            empty = draw(st.integers(0, 9)) == 0  # no learnable token: both segments absent
            absent = draw(st.integers(0, 6)) == 0  # the judge failed (reward.judge_failure)
            picks = (draw(st.integers(0, len(tools) - 1)), draw(st.integers(0, len(summaries) - 1)))
            rollouts.append((group, None if empty else picks, absent))
    return tools, summaries, rollouts


def build(tools, summaries, rollouts, dtype):
    """rm_scores, response mask, old / reference log-probs, uids, and each rollout's parts."""
    rows = []
    for _, picks, _ in rollouts:
        if picks is None:
            rows.append(([], [], 0.0, 0.0))
            continue
        (t_mask, t_logp, r_tool), (s_mask, s_logp, r_sum) = tools[picks[0]], summaries[picks[1]]
        rows.append((t_mask + s_mask, t_logp + s_logp, r_tool, r_sum))
    width = max(1, max(len(r[0]) for r in rows)) + 2  # right padding
    mask = torch.zeros(len(rows), width, dtype=torch.int64)
    rm = torch.zeros(len(rows), width)
    logp = torch.zeros(2, len(rows), width)
    for b, (m, lp, r_tool, r_sum) in enumerate(rows):
        mask[b, : len(m)] = torch.tensor(m, dtype=torch.int64)
        rm[b] = place_segment_scores(mask[b], r_tool, r_sum)
        if lp:
            logp[:, b, : len(lp)] = torch.tensor(lp).T
    logp[:, mask == 0] = torch.rand(2, int((mask == 0).sum()))  # never read: masked by verl
    uids = np.array([f"prompt-{group}" for group, _, _ in rollouts], dtype=object)
    return rm.to(dtype), mask, logp, uids


def through_verl(rm, mask, logp, uids, kl, absent):
    """verl's own advantage step, with the reward-in-KL step of its trainer when ``kl``."""
    data = DataProto.from_dict(
        tensors={
            "token_level_scores": rm,
            "response_mask": mask,
            "old_log_probs": logp[0],
            "ref_log_prob": logp[1],
        }
    )
    data.non_tensor_batch["uid"] = uids
    if kl:
        data, _ = apply_kl_penalty(data, FixedKLController(0.2), kl_penalty="kl")
        data.batch["token_level_rewards"] = data.batch["token_level_rewards"].to(rm.dtype)
    else:
        data.batch["token_level_rewards"] = rm
    config = OmegaConf.create(
        {"adv_estimator": "slca_grpo", "norm_adv_by_std_in_grpo": True, "use_kl_in_reward": kl}
    )
    keys = [f"{u}_{i}_0" for i, u in enumerate(uids)]  # the v1 trainer's {uid}_{session}_{i}
    with segment_call(absent_summary=absent):
        out = compute_advantage_for_multi_trajectories(
            data, batch_keys=keys, adv_estimator="slca_grpo", config=config
        )
    return out.batch["advantages"], data.batch["token_level_rewards"]


def last_tokens(mask):
    """Per rollout: its last tool token and its last summary token (-1: no such segment)."""
    split = split_segments(mask)
    tool = split.tool_mask.to(torch.uint8)
    width = mask.shape[1]
    last_tool = width - 1 - tool.flip(1).argmax(dim=1)
    last_summary = split.summary_start + split.summary_len - 1
    return (
        torch.where(split.has_tool, last_tool, -1).tolist(),
        torch.where(split.has_summary, last_summary, -1).tolist(),
    )


def check_ties(advantages, rollouts, keys, at):
    """Same key in a group: the same advantage; every present member tied: exactly 0."""
    groups = {}
    for b, (group, _, _) in enumerate(rollouts):
        if keys[b] is not None:
            groups.setdefault(group, []).append((keys[b], float(advantages[b, at[b]])))
    for members in groups.values():
        by_key = {}
        for key, value in members:
            by_key.setdefault(key, set()).add(value)
        assert all(len(values) == 1 for values in by_key.values()), by_key
        if len(by_key) == 1:
            assert next(iter(by_key.values())) == {0.0}, members


@settings(max_examples=60, deadline=None)
@given(batch=batches(), kl=st.booleans(), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_tied_segment_scores_get_tied_advantages_through_verl(batch, kl, dtype):
    tools, summaries, rollouts = batch
    rm, mask, logp, uids = build(tools, summaries, rollouts, dtype)
    absent = np.array([a for _, _, a in rollouts], dtype=bool)
    advantages, rewards = through_verl(rm, mask, logp, uids, kl, absent)
    last_tool, last_summary = last_tokens(mask)

    def written(value):  # what the reward side's value is once stored in the rewards' dtype
        return float(torch.tensor(value).to(dtype))

    tool_keys, summary_keys = [], []
    for b, (_, picks, gone) in enumerate(rollouts):
        has_tool, has_summary = last_tool[b] >= 0, last_summary[b] >= 0
        if kl:  # the same tokens under the same policies
            tool_keys.append(picks[0] if has_tool else None)
            summary_keys.append(picks[1] if has_summary and not gone else None)
        else:  # the same value written
            tool_keys.append(written(tools[picks[0]][2]) if has_tool else None)
            summary_keys.append(
                written(summaries[picks[1]][2]) if has_summary and not gone else None
            )
    check_ties(advantages, rollouts, summary_keys, last_summary)
    check_ties(advantages, rollouts, tool_keys, last_tool)
    if not kl:  # the sums give back exactly what the reward side wrote
        got = segment_scores(rewards, mask)
        for b, (_, picks, _) in enumerate(rollouts):
            if last_tool[b] >= 0:
                assert float(got.tool[b]) == written(tools[picks[0]][2])
            if last_summary[b] >= 0:
                assert float(got.summary[b]) == written(summaries[picks[1]][2])


def test_the_issues_case_gives_a_summary_advantage_of_exactly_zero():
    mask = torch.tensor([[1, 0, 1], [1, 0, 1]])
    rm = torch.stack(
        [place_segment_scores(mask[0], 0.1, 0.25), place_segment_scores(mask[1], 0.2, 0.25)]
    )
    uids = np.array(["p", "p"], dtype=object)
    advantages, _ = through_verl(rm, mask, torch.zeros(2, 2, 3), uids, False, None)
    assert advantages[:, 2].tolist() == [0.0, 0.0]  # the summaries tie
    assert advantages[0, 0] < 0 < advantages[1, 0]  # the tool scores do not


@st.composite
def dense_batches(draw):
    """Response masks of 0-6 turns over rows of any width, and dense rewards (KL everywhere)."""
    b = draw(st.integers(1, 24))
    rows = []
    for _ in range(b):
        turns = draw(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 30)), max_size=6))
        rows.append([v for n, gap in turns for v in [1] * n + [0] * gap])
    width = max(1, max(len(r) for r in rows)) + draw(st.integers(0, 9))
    mask = torch.zeros(b, width, dtype=torch.int64)
    for i, r in enumerate(rows):
        mask[i, : len(r)] = torch.tensor(r, dtype=torch.int64)
    seed = draw(st.integers(0, 2**16))
    rewards = torch.randn(b, width, generator=torch.Generator().manual_seed(seed))
    return mask, rewards * 10.0 ** torch.randint(-4, 2, (b, width))


def reference(rewards, split):
    tool = torch.where(split.tool_mask, rewards.double(), 0.0).sum(-1)
    summary = torch.where(split.summary_mask, rewards.double(), 0.0).sum(-1)
    return tool, summary


@settings(max_examples=60, deadline=None)
@given(batch=dense_batches(), block=st.integers(1, 4096))
def test_sums_do_not_depend_on_how_the_rows_are_blocked(batch, block):
    mask, rewards = batch
    split = split_segments(mask)
    whole = segment_scores(rewards, split)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scores, "BLOCK", block)  # a few rows per block, of different widths
        blocked = segment_scores(rewards, split)
    assert torch.equal(blocked.tool, whole.tool) and torch.equal(blocked.summary, whole.summary)
    tool, summary = reference(rewards, split)
    torch.testing.assert_close(whole.tool.double(), tool, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(whole.summary.double(), summary, rtol=1e-5, atol=1e-4)


def test_a_segment_copied_elsewhere_sums_to_the_same_float():
    gen = torch.Generator().manual_seed(0)
    tool = [1] * 37 + [0] * 11 + [1] * 5 + [0] * 3  # two tool turns and their responses
    summary = torch.randn(90, generator=gen) * 1e-3
    tools = torch.randn(len(tool), generator=gen) * torch.tensor(tool)
    rows, rewards = [], []
    for shift in range(0, 300, 7):  # other rollouts' tool parts are longer or shorter
        other = [1] * (shift + 1) + [0] * 4
        m = tool + other + [1] * 90
        r = torch.cat([tools, torch.randn(len(other), generator=gen), summary])
        rows.append(m)
        rewards.append(r)
    width = max(map(len, rows)) + 64
    mask = torch.zeros(len(rows), width, dtype=torch.int64)
    values = torch.zeros(len(rows), width)
    for i, (m, r) in enumerate(zip(rows, rewards, strict=True)):
        mask[i, : len(m)] = torch.tensor(m)
        values[i, : len(r)] = r
    got = segment_scores(values, mask)
    assert len(set(got.summary.tolist())) == 1  # one summary, wherever it starts


def test_rewards_outside_a_segment_are_never_read():
    mask = torch.tensor([[1, 1, 0, 0, 1, 0, 1, 1, 0, 0]])
    rewards = torch.tensor(
        [[0.0, 0.3, math.inf, math.nan, 0.2, -math.inf, 0.0, 0.5, math.nan, 1.0]]
    )
    got = segment_scores(rewards, mask)
    assert got.tool.tolist() == pytest.approx([0.5]) and got.summary.tolist() == [0.5]
    rewards[0, 6] = math.nan  # on the summary: the summary cannot be scored
    got = segment_scores(rewards, mask)
    assert math.isnan(got.summary.item()) and got.tool.tolist() == pytest.approx([0.5])


def test_without_a_summary_every_learnable_token_is_summed_as_tool():
    mask = torch.tensor([[1, 1, 0, 1, 1, 0], [1, 0, 1, 1, 0, 0]])
    rewards = torch.tensor([[0.5, 0.0, 9.0, 0.0, 0.25, 9.0], [0.1, 9.0, 0.0, 0.3, 9.0, 9.0]])
    split = split_segments(mask).without_summary(torch.tensor([True, False]))
    got = segment_scores(rewards, split)
    assert got.tool.tolist() == pytest.approx([0.75, 0.1])
    assert got.summary.tolist() == pytest.approx([0.0, 0.3])


def test_rewards_and_mask_of_different_shapes_are_refused():
    with pytest.raises(ValueError, match=r"token_level_rewards has shape \(2, 3\)"):
        segment_scores(torch.zeros(2, 3), torch.ones(2, 4))


@pytest.mark.parametrize("kl", [0.0, 0.05])
def test_the_total_is_the_reward_sides_weighted_total_plus_the_kl_in_the_rewards(kl):
    """toolpo_grpo's global advantage normalises the reported total (process_weight 0.5 here)."""
    gen = torch.Generator().manual_seed(1)
    masks = [[1, 1, 0, 1, 0, 1, 1], [1, 1, 1, 0, 0, 0, 0], [1, 0, 1, 1, 0, 1, 0], [1] * 7]
    mask = torch.tensor(masks * 3)
    r_tool = torch.rand(len(mask), generator=gen)
    r_sum = torch.randint(0, 5, (len(mask),), generator=gen) / 4
    rows = zip(mask, r_tool.tolist(), r_sum.tolist(), strict=True)
    rm = torch.stack([place_segment_scores(m, t, s) for m, t, s in rows])
    terms = kl * torch.rand(mask.shape, generator=gen) * mask  # the KL verl subtracts
    total = 0.5 * r_tool + r_sum  # what the reward side reports (its r_tool is dropped
    # from rm_scores where there is no tool segment, not from its total)
    uids = np.array([f"p{i % 3}" for i in range(len(mask))], dtype=object)
    data = DataProto.from_dict(tensors={"token_level_rewards": rm - terms, "response_mask": mask})
    data.non_tensor_batch["uid"] = uids
    config = OmegaConf.create({"adv_estimator": "toolpo_grpo", "use_kl_in_reward": kl > 0})
    reported = RolloutScores(tool=r_tool, summary=r_sum, total=total)
    with segment_call(reported=reported) as call:
        out = compute_advantage_for_multi_trajectories(
            data, batch_keys=[f"{u}_{i}_0" for i, u in enumerate(uids)],
            adv_estimator="toolpo_grpo", config=config,
        )  # fmt: skip
    split = split_segments(mask)
    tool = torch.where(split.has_tool, r_tool, 0.0) - (terms * split.tool_mask).sum(-1)
    expected = toolpo_grpo_advantages(mask, uids, total - terms.sum(-1), tool)
    if kl:
        torch.testing.assert_close(out.batch["advantages"], expected.advantages, atol=1e-5, rtol=0)
    else:  # no KL: the reported total itself
        assert torch.equal(call.scores.total, total)
        assert torch.equal(out.batch["advantages"], expected.advantages)
    short = RolloutScores(tool=r_tool, summary=r_sum, total=total[:-1])
    with segment_call(reported=short), pytest.raises(ValueError, match="reported"):
        compute_advantage_for_multi_trajectories(
            data, batch_keys=[f"{u}_{i}_0" for i, u in enumerate(uids)],
            adv_estimator="toolpo_grpo", config=config,
        )  # fmt: skip


def test_the_call_carries_the_estimators_metrics_of_the_scores_it_used():
    mask = torch.tensor([[1, 0, 1, 1], [1, 1, 0, 1], [0, 0, 1, 1], [1, 0, 1, 0]])
    rows = zip(mask, [0.1, 0.3, 0.0, 0.7], [1.0, 0.25, 0.5, 0.0], strict=True)
    rm = torch.stack([place_segment_scores(m, t, s) for m, t, s in rows])
    uids = np.array(["p", "p", "q", "q"], dtype=object)
    with segment_call() as call:
        advantages, _ = verl_estimator("slca_grpo")(rm, mask, None, uids)
    expected = slca_grpo_advantages(mask, uids, call.scores.tool, call.scores.summary)
    assert torch.equal(advantages, expected.advantages)
    assert call.stats == expected.stats and set(call.stats) == set(names.ESTIMATOR_STATS)


SPARSE_VALUES = st.sampled_from([0.5, -0.25, 1 / 3, 3e38, -3e38, 1e-30, -0.0, math.nan, math.inf])


@st.composite
def sparse_batches(draw):
    """A response mask, and rewards zero but for a few tokens anywhere (in segments or not)."""
    mask, _ = draw(dense_batches())
    b, width = mask.shape
    rewards = torch.zeros(b, width)
    for _ in range(draw(st.integers(0, 3 * b))):
        row, col = draw(st.integers(0, b - 1)), draw(st.integers(0, width - 1))
        rewards[row, col] = draw(SPARSE_VALUES)
    return mask, rewards, draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float64]))


def blocked(rewards, split):
    return scores.tool_sums(rewards, split), scores.run_sums(
        rewards, split.summary_start, split.summary_len
    )


def same_floats(a, b):
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))


@settings(max_examples=150, deadline=None)
@given(batch=sparse_batches(), chunk=st.sampled_from([1, 4, 64]))
def test_sparse_rewards_sum_to_the_blocked_sums_floats(batch, chunk):
    mask, rewards, dtype = batch
    rewards = rewards.to(dtype)
    split = split_segments(mask)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scores, "CHUNK", chunk)  # chunks of one token, or straddling rows
        found = scores.sparse_sums(rewards, split)
        got = scores.segment_sums(rewards, split)
    expected = blocked(rewards, split)
    assert same_floats(got[0], expected[0]) and same_floats(got[1], expected[1])
    if found is not None:  # the scan's own sums, where it did not hand a segment on
        tool, summary, tool_rest, summary_rest = found
        assert same_floats(tool[~torch.from_numpy(tool_rest)], expected[0][~tool_rest])
        assert same_floats(summary[~torch.from_numpy(summary_rest)], expected[1][~summary_rest])


def test_the_reward_sides_layout_is_read_as_sparse_and_kl_as_dense():
    mask = torch.tensor([[1, 1, 0, 1, 1, 1, 0], [1, 0, 0, 0, 1, 1, 1]])
    rm = torch.stack([place_segment_scores(m, 0.3, 0.75) for m in mask])
    split = split_segments(mask)
    found = scores.sparse_sums(rm, split)
    assert found is not None and not found[2].any() and not found[3].any()
    assert found[0].tolist() == pytest.approx([0.3, 0.3]) and found[1].tolist() == [0.75, 0.75]
    assert scores.sparse_sums(rm - 0.01 * mask, split) is None  # KL on every token
