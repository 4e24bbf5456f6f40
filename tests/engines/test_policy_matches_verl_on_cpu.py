"""The local engine's loss is verl's: value and gradient, against verl 0.9's own functions.

verl's actor loss (``verl.workers.utils.losses.ppo_loss``) at its defaults is
``compute_policy_loss_vanilla`` aggregated ``token-mean``, plus ``kl_loss_coef`` times the
``token-mean`` of ``kl_penalty(..., "low_var_kl")`` when ``use_kl_loss`` is on. The reference below
calls exactly those functions; nothing of verl's arithmetic is re-implemented here.
"""

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.skip_policy import require

require("verl", reason="needs the verl extra")
pytestmark = pytest.mark.verl

from verl.trainer.ppo.core_algos import (  # noqa: E402
    agg_loss,
    compute_policy_loss_vanilla,
    kl_penalty,
)
from verl.workers.config import ActorConfig  # noqa: E402

from slca_exp.config.schema import RLConfig  # noqa: E402
from slca_exp.engines.local.policy import pg_loss, response_logprobs  # noqa: E402
from tests.engines.tiny_world import build_world  # noqa: E402


def _actor(**overrides):
    """verl's actor config at its defaults (the required fields filled in), then ``overrides``."""
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **overrides)


def verl_loss(logp, old, adv, mask, *, ref=None, kl_coef=0.0, clip=0.2, dual=3.0):
    """verl's actor loss on these tensors (``ppo_loss`` less its entropy term, 0 by default)."""
    config = _actor(clip_ratio=clip, clip_ratio_low=clip, clip_ratio_high=clip, clip_ratio_c=dual)
    mask = mask.bool()
    loss, _ = compute_policy_loss_vanilla(old, logp, adv, mask, "token-mean", config)
    if ref is not None:
        kld = kl_penalty(logprob=logp, ref_logprob=ref, kl_penalty=config.kl_loss_type)
        loss = loss + agg_loss(kld, mask, config.loss_agg_mode) * kl_coef
    return loss


def _both(logp, old, adv, mask, **kw):
    """(ours, verl's) loss value and gradient with respect to ``logp``."""
    out = []
    for fn in ("ours", "verl"):
        x = logp.detach().clone().requires_grad_(True)
        if fn == "ours":
            clip, dual = kw.get("clip", 0.2), kw.get("dual", 3.0)
            loss = pg_loss(
                x,
                old,
                adv,
                mask,
                clip_ratio=clip,
                clip_ratio_c=dual,
                ref_logp=kw.get("ref"),
                kl_coef=kw.get("kl_coef", 0.0),
            ).loss
        else:
            loss = verl_loss(x, old, adv, mask, **kw)
        loss.backward()
        out.append((loss.detach(), x.grad))
    return out


def _assert_same(logp, old, adv, mask, **kw):
    (ours, g_ours), (theirs, g_theirs) = _both(logp, old, adv, mask, **kw)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-5, atol=1e-7)
    return float(ours)


def test_our_defaults_are_verls_defaults():
    rl, actor = RLConfig(), _actor()
    assert rl.clip_ratio == actor.clip_ratio == actor.clip_ratio_low == actor.clip_ratio_high
    assert rl.clip_ratio_c == actor.clip_ratio_c
    assert rl.grad_clip == actor.optim.clip_grad
    assert actor.loss_agg_mode == "token-mean" and actor.kl_loss_type == "low_var_kl"
    assert actor.entropy_coeff == 0  # so the entropy term verl adds is 0 too


def test_the_cases_where_the_unguarded_loss_was_wrong():
    one = torch.ones(1, 1)
    # A < 0 and ratio 4.48: the dual clip caps the token's loss at -A * 3
    loss = _assert_same(torch.full((1, 1), math.log(4.48)), torch.zeros(1, 1), -0.05 * one, one)
    assert loss == pytest.approx(0.15, rel=1e-5)
    # a low-variance KL term above 10 (ref - logp = 4): clamped to 10
    logp = torch.zeros(1, 1)
    loss = _assert_same(logp, logp, 0 * one, one, ref=logp + 4.0, kl_coef=0.05)
    assert loss == pytest.approx(0.5, rel=1e-5)
    # log-ratio 25, A > 0: clipped to 1 + c after the log-ratio clamp; A < 0: the dual clip
    assert _assert_same(25.0 * one, 0 * one, one, one) == pytest.approx(-1.2)
    assert _assert_same(25.0 * one, 0 * one, -one, one) == pytest.approx(3.0)


def test_an_empty_mask_gives_0_where_verl_divides_0_by_0():
    zeros = torch.zeros(1, 2)
    (ours, _), (theirs, _) = _both(zeros, zeros, torch.ones(1, 2), zeros)
    assert ours.item() == 0.0 and math.isnan(theirs.item())


LOGP = st.one_of(st.floats(-40, 5, width=32), st.sampled_from([0.0, -1e-3, -25.0, 3.0]))
ADV = st.one_of(st.floats(-50, 50, width=32), st.sampled_from([0.0, -1.0, 1.0]))


@st.composite
def batches(draw):
    """(logp, old, ref, advantages, mask) (B, T); extreme ratios and KLs; a non-empty mask."""
    b, t = draw(st.integers(1, 4)), draw(st.integers(1, 6))

    def tensor(elements, dtype=torch.float32):
        rows = st.lists(st.lists(elements, min_size=t, max_size=t), min_size=b, max_size=b)
        return torch.tensor(draw(rows), dtype=dtype)

    mask = tensor(st.booleans(), torch.bool)
    mask[draw(st.integers(0, b - 1)), draw(st.integers(0, t - 1))] = True
    return tensor(LOGP), tensor(LOGP), tensor(LOGP), tensor(ADV), mask


@settings(max_examples=300, deadline=None)
@given(
    batches(),
    st.sampled_from([0.2, 0.1, 0.28]),
    st.sampled_from([3.0, 1.5, 10.0]),
    st.sampled_from([0.0, 0.001, 0.5]),
)
def test_value_and_gradient_equal_verls_on_random_batches(batch, clip, dual, kl_coef):
    logp, old, ref, adv, mask = batch
    _assert_same(logp, old, adv, mask, ref=ref, kl_coef=kl_coef, clip=clip, dual=dual)


@pytest.fixture(scope="module")
def moved(tmp_path_factory):
    """A real batch and a policy several large steps away from the one that sampled it.

    The steps push the sampled tokens the wrong way (the advantages negated), so the batch holds
    what several epochs or minibatches produce: ratios far outside the clip range, negative
    advantages with ratios above 3, and tokens whose KL term to the reference exceeds 10.
    """
    world = build_world(tmp_path_factory)
    packed, adv = world.rollouts(3, 2)
    reference = world.backbone.model
    with torch.no_grad():
        old, _ = response_logprobs(reference, packed)
    model = copy.deepcopy(reference).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    for _ in range(6):
        logp, _ = response_logprobs(model, packed)
        away = pg_loss(logp, old, -adv.advantages, packed.response_mask, clip_ratio=1e9)
        optimizer.zero_grad()
        away.loss.backward()
        optimizer.step()
    return model, packed, adv.advantages, old


def test_on_a_real_batch_the_loss_and_every_weight_gradient_equal_verls(moved):
    model, packed, adv, old = moved
    mask = packed.response_mask.bool()
    with torch.no_grad():
        logp, _ = response_logprobs(model, packed)
    ratio = (logp - old).exp()
    assert bool(((ratio < 0.8) & mask).any()) and bool(((ratio > 1.2) & mask).any())
    assert bool(((adv < 0) & (ratio > 3.0) & mask).any())  # the dual clip is in play
    assert bool(((old - logp > 2.7) & mask).any())  # k3 = e^d - d - 1 > 10 there
    losses, grads = [], []
    for fn in ("ours", "verl"):
        model.zero_grad(set_to_none=True)
        logp, _ = response_logprobs(model, packed)
        if fn == "ours":
            loss = pg_loss(logp, old, adv, mask, clip_ratio=0.2, ref_logp=old, kl_coef=0.1).loss
        else:
            loss = verl_loss(logp, old, adv, mask, ref=old, kl_coef=0.1)
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-6, atol=1e-7)
    for ours, theirs in zip(*grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-8)
