"""Invariants of the estimators, checked on random batches (hypothesis)."""

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from slca_exp.estimators import (
    grpo_advantages,
    segment_masks,
    slca_grpo_advantages,
    toolpo_grpo_advantages,
)
from tests.estimators.strategies import batches

settings.register_profile("slca", max_examples=150, deadline=None)
settings.load_profile("slca")


@given(batches())
def test_masks_partition_the_response_mask(batch):
    mask = batch[0]
    tool, summary = segment_masks(mask)
    assert not (tool & summary).any()
    assert torch.equal(tool | summary, mask.bool())


@given(batches())
def test_summary_is_one_contiguous_run_after_every_tool_token(batch):
    tool, summary = segment_masks(batch[0])
    for t_row, s_row in zip(tool, summary, strict=True):
        idx = torch.nonzero(s_row).flatten()
        if len(idx):
            assert idx[-1] - idx[0] + 1 == len(idx)
            assert not t_row[idx[0] :].any()


@given(batches())
def test_zero_outside_the_response_mask_and_always_finite(batch):
    mask, ids, tool, summary, total = batch
    for out in (
        slca_grpo_advantages(mask, ids, tool, summary),
        grpo_advantages(mask, ids, total),
        toolpo_grpo_advantages(mask, ids, total, tool),
    ):
        assert torch.all(out.advantages[mask == 0] == 0)
        assert torch.isfinite(out.advantages).all()
        assert all(math.isfinite(v) for v in out.stats.values())


@given(batches(), st.booleans())
def test_present_advantages_of_a_group_sum_to_zero_with_unit_std(batch, norm):
    mask, ids, tool, summary, _ = batch
    out = slca_grpo_advantages(mask, ids, tool, summary, norm_by_std=norm)
    for adv, seg_mask, score in (
        (out.tool_adv, out.tool_mask, tool),
        (out.summary_adv, out.summary_mask, summary),
    ):
        present = seg_mask.any(dim=1) & torch.isfinite(score)
        for g in ids.unique():
            members = present & (ids == g)
            values = adv[members].double()
            if members.sum() >= 2:
                scale = max(1.0, float(score[members].abs().max()))
                assert abs(float(values.sum())) < 1e-4 * scale * len(values)
                spread = float(score[members].double().std())
                if norm and members.sum() >= 3 and spread > 1e-3:
                    assert math.isclose(float(values.std()), 1.0, rel_tol=1e-3)
            assert torch.all(adv[(ids == g) & ~present] == 0)


@given(batches(), st.floats(0, 5), st.floats(0, 5))
def test_weights_scale_linearly(batch, tw, sw):
    mask, ids, tool, summary, _ = batch
    base = slca_grpo_advantages(mask, ids, tool, summary)
    out = slca_grpo_advantages(mask, ids, tool, summary, tool_weight=tw, summary_weight=sw)
    assert_close(out.tool_adv, base.tool_adv * tw, atol=1e-5, rtol=1e-5)
    assert_close(out.summary_adv, base.summary_adv * sw, atol=1e-5, rtol=1e-5)


@given(batches(), st.data())
def test_nan_score_is_the_same_as_an_absent_segment(batch, data):
    mask, ids, tool, summary, _ = batch
    row = data.draw(st.integers(0, mask.shape[0] - 1))
    nan_tool = tool.clone()
    nan_tool[row] = float("nan")
    out = slca_grpo_advantages(mask, ids, nan_tool, summary)
    # Absent by mask instead: keep only the row's last run (its summary), so its tool is gone.
    _, summ = segment_masks(mask)
    no_tool = mask.clone()
    no_tool[row] = summ[row].long()
    ref = slca_grpo_advantages(no_tool, ids, tool, summary)
    assert out.tool_adv[row] == 0
    assert_close(out.tool_adv, ref.tool_adv)


@given(batches(), st.randoms(use_true_random=False))
def test_permuting_the_batch_permutes_the_output(batch, rnd):
    mask, ids, tool, summary, total = batch
    perm = list(range(mask.shape[0]))
    rnd.shuffle(perm)
    p = torch.tensor(perm)
    out = slca_grpo_advantages(mask, ids, tool, summary)
    shuffled = slca_grpo_advantages(mask[p], ids[p], tool[p], summary[p])
    assert_close(shuffled.advantages, out.advantages[p], atol=1e-5, rtol=1e-5)
    g = grpo_advantages(mask, ids, total)
    assert_close(
        grpo_advantages(mask[p], ids[p], total[p]).advantages, g.advantages[p], atol=1e-5, rtol=1e-5
    )


@given(batches())
def test_string_ids_give_the_same_result_as_integer_ids(batch):
    mask, ids, tool, summary, total = batch
    as_str = np.array([f"uid-{int(i)}" for i in ids], dtype=object)
    for fn, args in ((slca_grpo_advantages, (tool, summary)), (grpo_advantages, (total,))):
        assert torch.equal(fn(mask, as_str, *args).advantages, fn(mask, ids, *args).advantages)
        assert torch.equal(
            fn(mask, [str(i) for i in ids.tolist()], *args).advantages,
            fn(mask, ids, *args).advantages,
        )
