"""``grpo_advantages`` equals verl 0.9.1's GRPO on batches built the way verl builds them."""

import uuid

import numpy as np
import pytest
import torch

from slca_exp.estimators import grpo_advantages
from tests.skip_policy import require

core_algos = require("verl.trainer.ppo.core_algos", reason="needs the verl extra")
pytestmark = pytest.mark.verl


def verl_batch(batch, length, group, seed, discrete):
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    mask = (torch.arange(length) < lengths[:, None]).to(torch.int64)  # right-padded responses
    mask[:, 1::7] = 0  # injected tool-response tokens
    if discrete:
        score = torch.tensor(
            rng.choice([0.0, 0.25, 0.5, 1.0, -0.5], size=batch), dtype=torch.float32
        )
    else:
        score = torch.randn(batch, generator=gen)
    rewards = torch.zeros(batch, length)
    rewards[torch.arange(batch), lengths - 1] = score  # verl puts the score on the last token
    uids = [str(uuid.UUID(int=int(i))) for i in rng.integers(0, 2**62, batch // group + 1)]
    index = np.array([uids[i // group] for i in range(batch)], dtype=object)
    index[-1] = "singleton-group"
    return rewards, mask, index


@pytest.mark.parametrize(("batch", "length", "group"), [(8, 16, 4), (64, 50, 8), (256, 128, 16)])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("discrete", [True, False])
def test_grpo_equals_verl(batch, length, group, seed, norm, discrete):
    rewards, mask, index = verl_batch(batch, length, group, seed, discrete)
    ours = grpo_advantages(mask, index, rewards.sum(-1), norm_by_std=norm, eps=1e-6)
    for fn in (
        core_algos.compute_grpo_outcome_advantage,
        core_algos.compute_grpo_vectorized_outcome_advantage,
    ):
        adv, returns = fn(rewards.clone(), mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=norm)
        torch.testing.assert_close(ours.advantages, adv.float(), atol=1e-6, rtol=0)
        torch.testing.assert_close(ours.returns, returns.float(), atol=1e-6, rtol=0)
