"""The local engine's packing, log-probs and clipped policy-gradient loss."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from slca_exp.engines.local.policy import masked_mean, pg_loss, response_logprobs
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
