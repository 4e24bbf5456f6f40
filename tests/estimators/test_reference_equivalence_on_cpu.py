"""The vectorised estimators equal a plain per-sample loop, over sizes and seeds."""

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from slca_exp.estimators import grpo_advantages, slca_grpo_advantages, toolpo_grpo_advantages
from tests.estimators.reference import reference_grpo, reference_slca, reference_toolpo


def random_batch(batch, length, group, seed, nan_frac=0.1):
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    # Rollouts as verl builds them: assistant runs, injected tool responses, right padding.
    mask = torch.zeros(batch, length, dtype=torch.int64)
    for b in range(batch):
        pos = 0
        for _ in range(rng.integers(0, 4)):
            n = int(rng.integers(1, max(2, length // 6)))
            mask[b, pos : pos + n] = 1
            pos += n + int(rng.integers(1, max(2, length // 8)))
        mask[b, pos : min(length, pos + int(rng.integers(0, max(1, length // 3))))] = 1
    ids = np.array([f"prompt-{i // group}" for i in rng.permutation(batch)], dtype=object)

    def scores():
        s = torch.rand(batch, generator=gen)
        s[torch.rand(batch, generator=gen) < nan_frac] = float("nan")
        return s

    return mask, ids, scores(), scores(), scores()


SIZES = [(1, 5, 1), (4, 9, 2), (16, 33, 4), (64, 130, 8), (96, 257, 16), (40, 64, 5)]


@pytest.mark.parametrize(("batch", "length", "group"), SIZES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("norm", [True, False])
def test_matches_reference_loop(batch, length, group, seed, norm):
    mask, ids, tool, summary, total = random_batch(batch, length, group, seed)
    kw = {"norm_by_std": norm, "eps": 1e-6}

    out = slca_grpo_advantages(mask, ids, tool, summary, tool_weight=1.5, summary_weight=0.5, **kw)
    ref = reference_slca(mask, ids, tool, summary, tool_weight=1.5, summary_weight=0.5, **kw)
    assert_close(out.advantages, ref[0], atol=1e-5, rtol=1e-5)

    out = grpo_advantages(mask, ids, total, **kw)
    ref = reference_grpo(mask, ids, total, **kw)
    assert_close(out.advantages, ref[0], atol=1e-5, rtol=1e-5)

    out = toolpo_grpo_advantages(mask, ids, total, tool, toolpo_lambda=0.7, **kw)
    ref = reference_toolpo(mask, ids, total, tool, toolpo_lambda=0.7, **kw)
    assert_close(out.advantages, ref[0], atol=1e-5, rtol=1e-5)
