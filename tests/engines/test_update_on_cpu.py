"""The local RL update: exactly the configured minibatches, and no step on a non-finite gradient.

Batches are real rollouts of the tiny built-in backbone (``tiny_world``).
"""

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slca_exp.config.schema import RLConfig
from slca_exp.core import names
from slca_exp.engines.local.update import minibatch_rows, rl_update
from slca_exp.preflight.compose import check_overrides
from tests.engines.tiny_world import build_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory)


@pytest.fixture(scope="module")
def six(world):
    """Six real rollouts (3 prompts x 2) and their advantages."""
    return world.rollouts(3, 2)


def _adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def _steps_taken(optimizer):
    """Optimizer steps AdamW has taken (0 when it never stepped: no state yet)."""
    counts = {int(state["step"]) for state in optimizer.state.values()}
    assert len(counts) <= 1
    return counts.pop() if counts else 0


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.data())
def test_minibatch_rows_are_exactly_m_near_equal_shares_of_all_rows(b, data):
    m = data.draw(st.integers(1, b))
    torch.manual_seed(data.draw(st.integers(0, 2**16)))
    shares = minibatch_rows(b, m)
    sizes = [len(s) for s in shares]
    assert len(shares) == m
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    assert sorted(torch.cat(shares).tolist()) == list(range(b))


def test_six_rollouts_make_four_minibatches_where_chunk_made_three():
    assert len(torch.randperm(6).chunk(4)) == 3  # what the update used to do
    assert [len(s) for s in minibatch_rows(6, 4)] == [2, 2, 1, 1]


@pytest.mark.parametrize("m", [0, 7])
def test_more_minibatches_than_rollouts_is_refused_naming_the_key(m):
    with pytest.raises(ValueError, match=r"engine\.rl\.minibatches"):
        minibatch_rows(6, m)


def test_the_update_takes_epochs_x_minibatches_steps_on_a_real_batch(world, six):
    packed, adv = six
    assert packed.input_ids.shape[0] == 6
    model = copy.deepcopy(world.backbone.model).train()
    optimizer = _adamw(model)
    stats = rl_update(model, None, optimizer, packed, adv, RLConfig(epochs=2, minibatches=4), 1.0)
    assert _steps_taken(optimizer) == 8
    assert stats[names.TRAIN_SKIPPED_STEPS] == 0.0
    assert math.isfinite(stats["train/grad_norm"]) and stats["train/grad_norm"] > 0


def _with_advantages(adv, values):
    scaled = copy.copy(adv)
    scaled.advantages = values
    return scaled


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    ("case", "make"),
    [
        # finite inputs and a finite loss; the backward overflows: the gradient norm is inf
        ("inf", lambda a: a * 1e20),
        # a NaN advantage on every learnable token: NaN loss and gradients
        ("nan", lambda a: torch.where(a != 0, torch.full_like(a, math.nan), a)),
    ],
)
def test_a_non_finite_gradient_norm_skips_the_step_and_is_counted(world, six, case, make):
    packed, adv = six
    bad = _with_advantages(adv, make(adv.advantages))
    model = copy.deepcopy(world.backbone.model).train()
    before = _params(model)
    optimizer = _adamw(model)
    # the gradient norm really is non-finite (the same backward the update runs)
    from slca_exp.engines.local.policy import pg_loss, response_logprobs

    logp, _ = response_logprobs(model, packed)
    pg_loss(
        logp, logp.detach(), bad.advantages, packed.response_mask, clip_ratio=0.2
    ).loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    assert not torch.isfinite(norm), norm
    model.zero_grad(set_to_none=True)

    stats = rl_update(model, None, optimizer, packed, bad, RLConfig(epochs=2, minibatches=3), 1.0)
    assert stats[names.TRAIN_SKIPPED_STEPS] == 6.0
    assert math.isnan(stats["train/grad_norm"])  # no step taken
    assert _steps_taken(optimizer) == 0 and not optimizer.state  # Adam's moments untouched
    for p, q in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.detach(), q)
        assert p.grad is None  # the bad gradients are not left behind


def test_only_the_minibatches_with_a_non_finite_gradient_are_skipped(world, six):
    packed, adv = six
    values = adv.advantages.clone()
    row = int(packed.response_mask.sum(1).argmax())
    values[row] = torch.where(packed.response_mask[row].bool(), math.nan, 0.0)
    model = copy.deepcopy(world.backbone.model).train()
    before = _params(model)
    optimizer = _adamw(model)
    cfg = RLConfig(epochs=3, minibatches=6)  # one rollout per minibatch
    stats = rl_update(model, None, optimizer, packed, _with_advantages(adv, values), cfg, 1.0)
    assert stats[names.TRAIN_SKIPPED_STEPS] == 3.0  # the NaN rollout, once per epoch
    assert _steps_taken(optimizer) == 15
    assert math.isfinite(stats["train/grad_norm"])
    params = list(model.parameters())
    assert all(bool(torch.isfinite(p).all()) for p in params)
    assert any(not torch.equal(p.detach(), q) for p, q in zip(params, before, strict=True))


def _minibatch_problems(*overrides):
    return [p for p in check_overrides(list(overrides))[1] if p.key == "engine.rl.minibatches"]


def test_validation_refuses_more_minibatches_than_rollouts_per_step():
    # 4 prompts x 8 rollouts = 32 rollouts per step
    base = ["engine.rollout.prompts_per_step=4", "algorithm.group_size=8"]
    assert not _minibatch_problems(*base, "engine.rl.minibatches=32")
    (problem,) = _minibatch_problems(*base, "engine.rl.minibatches=33")
    assert "32 rollouts" in problem.what and "prompts_per_step=4" in problem.what
    assert "at most 32" in problem.fix
    # the verl engine does not read engine.rl, nor does a run without the RL stage
    assert not _minibatch_problems(*base, "engine.rl.minibatches=33", "engine=verl")
    assert not _minibatch_problems(*base, "engine.rl.minibatches=33", "engine.rl.enabled=false")
