"""The local engine's packing, log-probs and clipped policy-gradient loss.

That the loss equals verl's own functions is pinned in ``test_policy_matches_verl_on_cpu.py``.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import Qwen2Config, Qwen2ForCausalLM

from slca_exp.engines.local.policy import low_var_kl, masked_mean, pg_loss, response_logprobs
from slca_exp.engines.local.rollout import pack


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(cfg).eval()


def test_pack_aligns_every_response_at_column_p():
    b = pack([[1, 2, 3], [4]], [[5, 6], [7, 8, 9]], [[1, 0], [1, 1, 0]], pad_id=0)
    assert b.prompt_len == 3
    assert b.input_ids.tolist() == [[1, 2, 3, 5, 6, 0], [0, 0, 4, 7, 8, 9]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert b.response_mask.tolist() == [[1, 0, 0], [1, 1, 0]]
    assert b.response_ids.tolist() == [[5, 6, 0], [7, 8, 9]]


def test_logprobs_do_not_depend_on_padding(model):
    alone = pack([[3, 4, 5, 6]], [[7, 8, 9]], [[1, 1, 1]], pad_id=0)
    padded = pack([[3, 4, 5, 6], [1]], [[7, 8, 9], [2, 3, 4, 5, 6]], [[1, 1, 1], [1] * 5], 0)
    with torch.no_grad():
        a, _ = response_logprobs(model, alone)
        b, _ = response_logprobs(model, padded)
        # the same, by hand: log-softmax of the next-token logits of the unpadded sequence
        ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9]])
        logits = model(input_ids=ids).logits[0, 3:6]
        manual = torch.log_softmax(logits, -1).gather(-1, ids[0, 4:7, None]).squeeze(-1)
    torch.testing.assert_close(a[0], manual, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b[0, :3], manual, atol=1e-5, rtol=1e-5)


def test_temperature_scales_the_logits(model):
    batch = pack([[3, 4]], [[5, 6]], [[1, 1]], pad_id=0)
    with torch.no_grad():
        cold, ent = response_logprobs(model, batch, temperature=0.5, entropy=True)
        ids = torch.tensor([[3, 4, 5, 6]])
        logits = model(input_ids=ids).logits[0, 1:3] / 0.5
    manual = torch.log_softmax(logits, -1).gather(-1, ids[0, 2:4, None]).squeeze(-1)
    torch.testing.assert_close(cold[0], manual, atol=1e-5, rtol=1e-5)
    assert ent is not None and bool((ent > 0).all())


def test_on_policy_loss_is_minus_the_token_mean_advantage():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, -2.0]])
    mask = torch.tensor([[1, 1, 0]])
    parts = pg_loss(logp, logp.detach(), adv, mask, clip_ratio=0.2)
    assert parts.loss.item() == pytest.approx(-1.0)
    parts.loss.backward()
    # d/dlogp of -A * exp(logp - old) at ratio 1 is -A / (number of masked tokens)
    assert logp.grad.tolist() == [[-0.5, -0.5, 0.0]]
    assert parts.clip_frac == 0.0


def test_clipping_stops_the_gradient_outside_the_trust_region():
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.5, 0.5]])).requires_grad_(True)  # ratios 1.5 and 0.5
    adv = torch.tensor([[1.0, -1.0]])  # both pushed further out: clipped
    parts = pg_loss(logp, old, adv, torch.ones(1, 2), clip_ratio=0.2)
    parts.loss.backward()
    assert logp.grad.abs().sum().item() == 0.0 and parts.clip_frac == 1.0
    # the other direction is not clipped (pessimistic bound)
    logp2 = torch.log(torch.tensor([[1.5]])).requires_grad_(True)
    pg_loss(
        logp2, torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1), clip_ratio=0.2
    ).loss.backward()
    assert logp2.grad.item() == pytest.approx(1.5)


def test_kl_term_is_zero_at_the_reference_and_positive_away_from_it():
    logp = torch.tensor([[-1.0, -2.0]])
    zero = pg_loss(
        logp, logp, torch.zeros(1, 2), torch.ones(1, 2), clip_ratio=0.2, ref_logp=logp, kl_coef=0.1
    )
    assert zero.kl == 0.0
    away = pg_loss(
        logp,
        logp,
        torch.zeros(1, 2),
        torch.ones(1, 2),
        clip_ratio=0.2,
        ref_logp=logp - 0.5,
        kl_coef=0.1,
    )
    assert away.kl > 0 and away.loss.item() == pytest.approx(0.1 * away.kl)


def test_masked_mean_of_an_empty_mask_is_zero():
    assert masked_mean(torch.ones(2, 2), torch.zeros(2, 2)).item() == 0.0


def test_masked_mean_ignores_nan_and_inf_off_the_mask():
    values = torch.tensor([[1.0, math.nan], [math.inf, 3.0]])
    assert masked_mean(values, torch.tensor([[1, 0], [0, 1]])).item() == 2.0


def _one_token(logp, old, adv, **kw):
    logp = torch.tensor([[logp]], requires_grad=True)
    parts = pg_loss(logp, torch.tensor([[old]]), torch.tensor([[adv]]), torch.ones(1, 1), **kw)
    parts.loss.backward()
    return parts, float(logp.grad)


def test_dual_clip_bounds_the_loss_of_a_negative_advantage_token():
    # ratio e^2 = 7.4 with A = -1: the clipped surrogate says 7.4, the dual clip caps it at 3
    parts, grad = _one_token(2.0, 0.0, -1.0, clip_ratio=0.2)
    assert parts.loss.item() == pytest.approx(3.0) and grad == 0.0
    parts, grad = _one_token(2.0, 0.0, -1.0, clip_ratio=0.2, clip_ratio_c=10.0)
    assert parts.loss.item() == pytest.approx(math.exp(2.0)) and grad == pytest.approx(math.exp(2))
    # below the bound the dual clip changes nothing: ratio 2, A = -1 -> 2
    parts, _ = _one_token(math.log(2.0), 0.0, -1.0, clip_ratio=0.2)
    assert parts.loss.item() == pytest.approx(2.0)
    with pytest.raises(ValueError, match=r"engine\.rl\.clip_ratio_c"):
        _one_token(0.0, 0.0, 1.0, clip_ratio=0.2, clip_ratio_c=1.0)


def test_the_log_ratio_is_clamped_to_20_before_exp():
    # log-ratio 25, A = +1: clipped to 1.2 (the pessimistic bound) either way, but finite
    parts, grad = _one_token(25.0, 0.0, 1.0, clip_ratio=0.2)
    assert parts.loss.item() == pytest.approx(-1.2) and grad == 0.0
    # log-ratio -25 with A = -1: ratio e^-20, clipped at 0.8
    parts, grad = _one_token(-25.0, 0.0, -1.0, clip_ratio=0.2)
    assert parts.loss.item() == pytest.approx(0.8) and grad == 0.0
    # log-ratio 25 with A = -1 and no effective dual clip: e^20, not e^25, and no gradient
    parts, grad = _one_token(25.0, 0.0, -1.0, clip_ratio=0.2, clip_ratio_c=1e12)
    assert parts.loss.item() == pytest.approx(math.exp(20.0), rel=1e-5) and grad == 0.0


def test_the_kl_term_is_clamped_to_10_per_token():
    logp = torch.tensor([[-1.0, -1.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, 4.0, 30.0]])  # k3 = 0.1487, 142.4 -> 10, e^20 - 21 -> 10
    kw = {"clip_ratio": 0.2, "ref_logp": ref, "kl_coef": 1.0}
    parts = pg_loss(logp, logp.detach(), torch.zeros(1, 3), torch.ones(1, 3), **kw)
    k3 = math.exp(-0.5) + 0.5 - 1
    assert parts.kl == pytest.approx((k3 + 10 + 10) / 3, rel=1e-6)
    parts.loss.backward()
    # only the unclamped token has a gradient: d/dlogp k3 = 1 - exp(ref - logp), over 3 tokens
    torch.testing.assert_close(logp.grad, torch.tensor([[(1 - math.exp(-0.5)) / 3, 0.0, 0.0]]))
    assert low_var_kl(torch.tensor(0.0), torch.tensor(-25.0)).item() == pytest.approx(10.0)


LOGP = st.one_of(st.floats(-40, 5, width=32), st.sampled_from([0.0, -1e-3, -25.0, 3.0]))


@st.composite
def loss_inputs(draw):
    """(logp, old, ref, advantages, mask) over a (B, T) batch with extreme ratios and KLs."""
    b, t = draw(st.integers(1, 4)), draw(st.integers(1, 6))

    def tensor(elements):
        rows = st.lists(st.lists(elements, min_size=t, max_size=t), min_size=b, max_size=b)
        return torch.tensor(draw(rows), dtype=torch.float32)

    adv = st.one_of(st.floats(-50, 50, width=32), st.sampled_from([0.0, -1.0, 1.0]))
    mask = tensor(st.booleans())
    return tensor(LOGP), tensor(LOGP), tensor(LOGP), tensor(adv), mask


@settings(max_examples=300, deadline=None)
@given(loss_inputs(), st.floats(0.05, 0.5), st.floats(1.01, 10.0), st.floats(0.0, 1.0))
def test_every_token_loss_is_bounded_whatever_the_ratio(inputs, clip, dual, kl_coef):
    """Per token the surrogate lies in [-(1 + c) A+, c_dual A-] and the KL in [0, 10].

    So the loss and its gradient stay finite for any finite log-probs, ratios included.
    """
    logp, old, ref, adv, mask = inputs
    logp.requires_grad_(True)
    kw = {"clip_ratio": clip, "clip_ratio_c": dual}
    parts = pg_loss(logp, old, adv, mask, **kw, ref_logp=ref, kl_coef=kl_coef)
    parts.loss.backward()
    assert torch.isfinite(parts.loss) and bool(torch.isfinite(logp.grad).all())
    n = mask.sum().clamp(min=1)
    upper = float((adv.clamp(max=0).abs() * dual * mask).sum() / n)
    lower = float(-(adv.clamp(min=0) * (1 + clip) * mask).sum() / n)
    assert lower - 1e-3 * (1 + abs(lower)) <= parts.pg <= upper + 1e-3 * (1 + upper)
    assert -1e-6 <= parts.kl <= 10.0 + 1e-5
    assert bool((logp.grad[~mask.bool()] == 0).all())  # nothing leaks onto masked tokens
