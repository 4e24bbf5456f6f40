"""``toolpo_grpo_advantages`` equals the public ToolPO-GRPO estimator on the rewards it is fed.

The public SLCA-GRPO code (github.com/SLCA-GRPO/SLCA-GRPO at commit 68539c5) computes ToolPO in
its patched verl, ``verl/verl/trainer/ppo/core_algos.py::compute_toolpo_grpo_advantage``, from
what ``baselines/toolpo/reward_fn_toolpo.py`` returns. :func:`public_toolpo` is written from
that code's observable behaviour, one group and one rollout at a time, in float32 as it
computes:

- A_global: verl's GRPO of each rollout's summed token rewards (``score`` = R_succ, the binary
  Solved / Unsolved verdict, plus the KL of every token under ``use_kl_in_reward``); a group of
  one has mean 0 and std 1 (its score / (1 + eps));
- A_tool: the group's mean and unbiased std of ``toolpo_correct_ratio`` (R_action), over the
  rollouts with a tool segment (two or more runs of learnable tokens) only; fewer than two such
  members give 0;
- every learnable token gets A_global, the tool tokens (every run but the last) also
  ``TOOLPO_LAMBDA`` * A_tool.

``reward_fn_toolpo_sum_action.py`` exports R_action unnormalised (the count of correct calls,
``toolpo_action_reward``); the patched trainer at that commit still reads
``toolpo_correct_ratio``, so that count never reaches the estimator there.
:func:`test_sum_action_changes_a_tool_only_without_the_std` shows what it would change.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from slca_exp.estimators import toolpo_grpo_advantages
from tests.estimators.reference import runs_of_ones


def _group_stats(values: torch.Tensor, *, norm: bool, eps: float) -> torch.Tensor:
    """(x - mean) / (std + eps) of one group's float32 scores (std unbiased); mean only w/o norm."""
    centred = values - values.mean()
    return centred / (values.std() + eps) if norm else centred


def public_toolpo(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    index: np.ndarray,
    action: torch.Tensor,
    *,
    toolpo_lambda: float = 1.0,
    norm: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """(B, T) float32 advantages of the public ToolPO-GRPO, one group at a time.

    Args:
        rewards: (B, T) token-level rewards (R_succ on one token of each rollout).
        mask: (B, T) response mask.
        index: (B,) the rollouts' uids.
        action: (B,) R_action as the estimator reads it (``toolpo_correct_ratio``).
        toolpo_lambda: ``TOOLPO_LAMBDA``.
        norm: ``algorithm.norm_adv_by_std_in_grpo``.
        eps: verl's epsilon.

    """
    batch = mask.shape[0]
    runs = [runs_of_ones(row) for row in (mask > 0.5).int().tolist()]
    has_tool = [len(r) >= 2 for r in runs]
    total = rewards.float().sum(-1)
    action = action.float()
    a_global = torch.zeros(batch)
    a_tool = torch.zeros(batch)
    for uid in dict.fromkeys(index.tolist()):
        members = [i for i in range(batch) if index[i] == uid]
        if len(members) == 1:  # mean 0, std 1
            (i,) = members
            a_global[i] = total[i] / (1.0 + eps) if norm else total[i]
        else:
            a_global[members] = _group_stats(total[members], norm=norm, eps=eps)
        with_tool = [i for i in members if has_tool[i]]
        if len(with_tool) >= 2:
            a_tool[with_tool] = _group_stats(action[with_tool], norm=norm, eps=eps)
    out = mask.float() * a_global[:, None]
    for i, row_runs in enumerate(runs):
        for start, end in row_runs[:-1]:
            out[i, start:end] += toolpo_lambda * a_tool[i]
    return out * mask.float()


def ours(rewards, mask, index, action, *, norm=True, **kw):
    """Our advantages of the same inputs: the summed rewards as the total, R_action as tool."""
    total = rewards.sum(-1)
    return toolpo_grpo_advantages(mask, index, total, action, norm_by_std=norm, **kw).advantages


# Rollouts of the hand-computed case: uid "p" (four rollouts, two gold calls each), "q" (one).
MASK = torch.tensor(
    [
        [1, 1, 0, 1, 1, 0],  # tool 0-1, summary 3-4
        [1, 0, 1, 0, 1, 1],  # tool 0 and 2, summary 4-5
        [0, 0, 0, 1, 1, 1],  # one run: summary only, no tool segment
        [1, 1, 1, 0, 1, 0],  # tool 0-2, summary 4
        [1, 0, 1, 1, 0, 0],  # uid q: tool 0, summary 2-3
    ]
)
UIDS = np.array(["p", "p", "p", "p", "q"], dtype=object)
R_SUCC = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])
CORRECT = torch.tensor([2.0, 1.0, 0.0, 1.0, 1.0])
"""Strictly correct calls of each rollout; |gold| is 2 for uid p and 1 for uid q."""
GOLD = torch.tensor([2.0, 2.0, 2.0, 2.0, 1.0])


def succ_rewards(r_succ: torch.Tensor, length: int) -> torch.Tensor:
    """(B, T) rewards with R_succ on each rollout's last token, where verl puts the score."""
    rewards = torch.zeros(len(r_succ), length)
    rewards[:, -1] = r_succ
    return rewards


def test_the_hand_computed_case_of_the_public_estimator():
    """A_global over p: R_succ (1, 0, 0, 1), mean 1/2, std sqrt(1/3): +-0.8660; q alone: 1/(1+eps).

    A_tool over p's rollouts with a tool segment (0, 1, 3): R_action (1, 1/2, 1/2), mean 2/3,
    std sqrt(1/12): 1.1547, -0.5774, -0.5774; q's single rollout: 0.
    """
    g, t, q = 0.5 / (3**-0.5 + 1e-6), (1 / 3) / (12**-0.5 + 1e-6), 1 / (1 + 1e-6)
    expected = torch.tensor(
        [
            [g + t, g + t, 0, g, g, 0],
            [-g - t / 2, 0, -g - t / 2, 0, -g, -g],
            [0, 0, 0, -g, -g, -g],
            [g - t / 2, g - t / 2, g - t / 2, 0, g, 0],
            [q, 0, q, q, 0, 0],
        ]
    )
    rewards = succ_rewards(R_SUCC, MASK.shape[1])
    ratio = CORRECT / GOLD
    assert_close(public_toolpo(rewards, MASK, UIDS, ratio), expected, atol=1e-6, rtol=1e-6)
    assert_close(ours(rewards, MASK, UIDS, ratio), expected, atol=1e-6, rtol=1e-6)
    assert expected[0, 0].item() == pytest.approx(2.0207, abs=1e-4)


def test_sum_action_changes_a_tool_only_without_the_std():
    """R_action as the count of correct calls is the ratio times |gold|, one |gold| per prompt.

    With the std (the launchers' setting) the group normalisation cancels that factor but for
    eps; without it (Dr.GRPO) A_tool is |gold| times as large: 2/3 where the ratio gives 1/3.
    """
    rewards = succ_rewards(R_SUCC, MASK.shape[1])
    ratio, count = CORRECT / GOLD, CORRECT
    for fn in (public_toolpo, ours):
        assert_close(
            fn(rewards, MASK, UIDS, count), fn(rewards, MASK, UIDS, ratio), atol=1e-5, rtol=0
        )
        plain = fn(rewards, MASK, UIDS, ratio, norm=False)
        summed = fn(rewards, MASK, UIDS, count, norm=False)
        # rollout 0's tool tokens: A_global 1/2, plus A_tool 1/3 (ratio) or 2/3 (count)
        assert plain[0, 0].item() == pytest.approx(0.5 + 1 / 3)
        assert summed[0, 0].item() == pytest.approx(0.5 + 2 / 3)
        assert_close(summed[:, 3:], plain[:, 3:])  # the summary tokens: A_global alone


@st.composite
def public_batches(draw):
    """A batch as the public ToolPO reward scores it: binary R_succ and R_action per prompt.

    R_action is a count of correct calls (sum_action) or that count over |gold| in {1, 2, 4}
    (one |gold| per prompt): values float32 holds exactly, so that the public code's float32
    group statistics and ours (float64, rounded once) differ by rounding only. (A group whose
    members all score a third gets float32 residue from the public code: docs/estimators.md.)
    """
    b = draw(st.integers(1, 16))
    t = draw(st.integers(1, 16))
    bits = draw(st.lists(st.lists(st.booleans(), min_size=t, max_size=t), min_size=b, max_size=b))
    groups = draw(st.lists(st.integers(0, 3), min_size=b, max_size=b))
    gold = {g: draw(st.sampled_from([1, 2, 4])) for g in set(groups)}
    correct = [draw(st.integers(0, gold[g])) for g in groups]
    sum_action = draw(st.booleans())
    action = [c if sum_action else c / gold[g] for c, g in zip(correct, groups, strict=True)]
    r_succ = draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=b, max_size=b))
    uids = np.array([f"uid-{g}" for g in groups], dtype=object)
    mask = torch.tensor(bits, dtype=torch.int64)
    return succ_rewards(torch.tensor(r_succ), t), mask, uids, torch.tensor(action)


@settings(max_examples=150, deadline=None)
@given(
    public_batches(),
    st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    st.booleans(),
)
def test_ours_equals_the_public_estimator_on_random_batches(batch, toolpo_lambda, norm):
    rewards, mask, uids, action = batch
    kw = {"toolpo_lambda": toolpo_lambda, "norm": norm, "eps": 1e-6}
    expected = public_toolpo(rewards, mask, uids, action, **kw)
    assert_close(ours(rewards, mask, uids, action, **kw), expected, atol=1e-6, rtol=1e-6)
