"""``engine.rl.grad_cos`` on the local engine: the cosine and both norms of the segment gradients.

The reference takes each segment's policy-gradient loss (``policy.pg_loss`` over that segment's
tokens) and differentiates it with ``torch.autograd.grad``; ``update.grad_conflict`` must report
the cosine and the norms of exactly those gradients, and leave the model as it found it.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from slca_exp.config.schema import RLConfig
from slca_exp.core import names
from slca_exp.engines.local.policy import pg_loss, response_logprobs
from slca_exp.engines.local.rollout import PackedBatch
from slca_exp.engines.local.update import grad_conflict, rl_update
from slca_exp.estimators import EstimatorParams, RolloutScores, get_estimator
from tests.engines.tiny_world import build_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory)


def two_segments(adv, sampled: PackedBatch) -> tuple:
    """The rollouts with tokens 4 and 5 read as a tool response, and their slca_grpo advantages.

    What comes before the two tokens is then a tool call: every rollout has both segments.
    """
    mask = sampled.response_mask.clone()
    mask[:, 4:6] = 0
    packed = PackedBatch(sampled.input_ids, sampled.attention_mask, mask, sampled.prompt_len)
    scores = RolloutScores(*torch.rand(3, 8, generator=torch.Generator().manual_seed(1)))
    adv = get_estimator("slca_grpo")(mask, [0] * 4 + [1] * 4, scores, EstimatorParams())
    assert bool(adv.tool_mask.any()) and bool(adv.summary_mask.any())
    return adv, packed


def reference(model, packed, old, advantages, masks) -> list[torch.Tensor]:
    """Each segment's gradient, flattened, from ``torch.autograd.grad`` of its own loss."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for mask in masks:
        logp, _ = response_logprobs(model, packed)
        loss = pg_loss(logp, old, advantages, mask, clip_ratio=0.2).loss
        out.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]).double())
    return out


def test_the_cosine_and_norms_are_those_of_the_two_segment_gradients(world):
    sampled, adv = world.rollouts(2, 4)
    model = world.backbone.model
    adv, packed = two_segments(adv, sampled)
    with torch.no_grad():
        old, _ = response_logprobs(model, packed)
    before = [p.detach().clone() for p in model.parameters()]
    found = grad_conflict(model, packed, old, adv.advantages, adv, RLConfig(), 1.0)
    tool, summary = reference(model, packed, old, adv.advantages, (adv.tool_mask, adv.summary_mask))
    assert found[names.TRAIN_GRAD_NORM_TOOL] == pytest.approx(float(tool.norm()), rel=1e-6)
    assert found[names.TRAIN_GRAD_NORM_SUMMARY] == pytest.approx(float(summary.norm()), rel=1e-6)
    cos = float(tool @ summary / (tool.norm() * summary.norm()))
    assert found[names.TRAIN_GRAD_COS] == pytest.approx(cos, abs=1e-6)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_a_segment_without_tokens_has_norm_0_and_no_cosine(world):
    packed, adv = world.rollouts(2, 4)  # single-turn rollouts: a summary each, no tool segment
    model = world.backbone.model
    with torch.no_grad():
        old, _ = response_logprobs(model, packed)
    assert not bool(adv.tool_mask.any())
    found = grad_conflict(model, packed, old, adv.advantages, adv, RLConfig(), 1.0)
    assert math.isnan(found[names.TRAIN_GRAD_COS]) and found[names.TRAIN_GRAD_NORM_TOOL] == 0.0
    assert found[names.TRAIN_GRAD_NORM_SUMMARY] > 0


def test_segments_without_an_advantage_have_zero_gradients_and_a_zero_cosine(world):
    """As ``torch.nn.functional.cosine_similarity`` and the public SLCA-GRPO code give it."""
    packed, adv = world.rollouts(2, 4)
    model = world.backbone.model
    with torch.no_grad():
        old, _ = response_logprobs(model, packed)
    adv, packed = two_segments(adv, packed)
    zero = torch.zeros_like(adv.advantages)  # tokens, but nothing to follow
    found = grad_conflict(model, packed, old, zero, adv, RLConfig(), 1.0)
    assert found == {
        names.TRAIN_GRAD_COS: 0.0,
        names.TRAIN_GRAD_NORM_TOOL: 0.0,
        names.TRAIN_GRAD_NORM_SUMMARY: 0.0,
    }


def test_the_update_logs_the_three_values_only_when_asked(world):
    packed, adv = world.rollouts(2, 4)
    logged = {names.TRAIN_GRAD_COS, names.TRAIN_GRAD_NORM_TOOL, names.TRAIN_GRAD_NORM_SUMMARY}
    for on in (False, True):
        model = copy.deepcopy(world.backbone.model).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        stats = rl_update(model, None, optimizer, packed, adv, RLConfig(grad_cos=on), 1.0)
        assert logged & stats.keys() == (logged if on else set())
