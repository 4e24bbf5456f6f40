"""Hand-computed cases for GRPO (verl's rule) and ToolPO-GRPO."""

import pytest
import torch
from torch.testing import assert_close

from slca_exp.estimators import grpo_advantages, toolpo_grpo_advantages

ROW = [1, 1, 0, 1, 1, 0]


def test_grpo_broadcasts_one_advantage_to_every_learnable_token():
    out = grpo_advantages(torch.tensor([ROW] * 3), [0] * 3, torch.tensor([0.0, 0.5, 1.0]), eps=0.0)
    assert_close(out.advantages[0], torch.tensor([-1.0, -1.0, 0.0, -1.0, -1.0, 0.0]))
    assert_close(out.tool_adv, out.summary_adv)


def test_grpo_singleton_group_passes_its_score_through_like_verl():
    out = grpo_advantages(torch.tensor([ROW] * 3), [0, 0, 1], torch.tensor([0.0, 1.0, 0.3]))
    assert out.summary_adv[2].item() == pytest.approx(0.3 / (1 + 1e-6))
    out = grpo_advantages(
        torch.tensor([ROW] * 3), [0, 0, 1], torch.tensor([0.0, 1.0, 0.3]), norm_by_std=False
    )
    assert out.summary_adv[2].item() == pytest.approx(0.3)


def test_grpo_nan_score_is_left_out():
    out = grpo_advantages(
        torch.tensor([ROW] * 3), [0] * 3, torch.tensor([0.0, float("nan"), 1.0]), eps=0.0
    )
    assert_close(out.summary_adv, torch.tensor([-0.70710678, 0.0, 0.70710678]))


def test_toolpo_adds_a_weighted_tool_advantage_on_tool_tokens_only():
    out = toolpo_grpo_advantages(
        torch.tensor([ROW] * 3),
        [0] * 3,
        torch.tensor([0.0, 0.5, 1.0]),
        torch.tensor([1.0, 0.0, 0.5]),
        toolpo_lambda=0.5,
        eps=0.0,
    )
    # A_global = [-1, 0, 1]; A_tool = [1, -1, 0]
    assert_close(out.tool_adv, torch.tensor([-0.5, -0.5, 1.0]))
    assert_close(out.summary_adv, torch.tensor([-1.0, 0.0, 1.0]))
    assert_close(out.advantages[0], torch.tensor([-0.5, -0.5, 0.0, -1.0, -1.0, 0.0]))


def test_toolpo_lambda_zero_is_grpo():
    mask = torch.tensor([ROW, [0, 0, 0, 1, 1, 0], ROW])
    total, tool = torch.tensor([0.1, 0.7, 0.4]), torch.tensor([0.9, 0.2, 0.3])
    a = toolpo_grpo_advantages(mask, [0] * 3, total, tool, toolpo_lambda=0.0)
    b = grpo_advantages(mask, [0] * 3, total)
    assert torch.equal(a.advantages, b.advantages)
