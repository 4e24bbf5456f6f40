"""Hand-computed cases for SLCA-GRPO (arXiv 2609.29050, Sec. 3.2)."""

import math
import uuid

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from slca_exp.core import names
from slca_exp.estimators import slca_grpo_advantages

TWO_SEGMENTS = [1, 1, 0, 1, 1]  # tool run, tool response, summary run
SUMMARY_ONLY = [0, 0, 0, 1, 1]
R = 1 / math.sqrt(2)  # |(x - mean) / std| for two distinct values


def slca(rows, ids, tool, summary, **kw):
    kw.setdefault("eps", 0.0)
    return slca_grpo_advantages(
        torch.tensor(rows), ids, torch.tensor(tool), torch.tensor(summary), **kw
    )


def test_each_segment_gets_its_own_normalised_advantage():
    out = slca([TWO_SEGMENTS] * 3, [0, 0, 0], [0.0, 0.5, 1.0], [1.0, 0.5, 0.0])
    assert_close(out.tool_adv, torch.tensor([-1.0, 0.0, 1.0]))
    assert_close(out.summary_adv, torch.tensor([1.0, 0.0, -1.0]))
    assert_close(out.advantages[0], torch.tensor([-1.0, -1.0, 0.0, 1.0, 1.0]))
    assert_close(out.advantages[2], torch.tensor([1.0, 1.0, 0.0, -1.0, -1.0]))
    assert out.advantages.dtype == torch.float32


def test_statistics_use_only_members_where_the_segment_is_present():
    out = slca(
        [TWO_SEGMENTS, TWO_SEGMENTS, SUMMARY_ONLY], [7, 7, 7], [0.0, 1.0, 100.0], [0.0, 0.5, 1.0]
    )
    assert_close(out.tool_adv, torch.tensor([-R, R, 0.0]))  # the 100 of row 2 is ignored
    assert_close(out.summary_adv, torch.tensor([-1.0, 0.0, 1.0]))


def test_singleton_group_gets_zero_not_its_raw_score():
    out = slca([TWO_SEGMENTS] * 3, [0, 0, 1], [0.0, 1.0, 5.0], [0.0, 1.0, 5.0])
    assert out.tool_adv[2] == 0 and out.summary_adv[2] == 0
    assert_close(out.tool_adv[:2], torch.tensor([-R, R]))


def test_guard_counts_present_members_not_group_size():
    rows = [TWO_SEGMENTS, SUMMARY_ONLY, SUMMARY_ONLY, SUMMARY_ONLY]
    out = slca(rows, [0] * 4, [0.9, 0.1, 0.2, 0.3], [0.0, 0.0, 1.0, 1.0])
    assert torch.all(out.tool_adv == 0)  # one tool segment in the group: no signal
    assert_close(out.summary_adv, torch.tensor([-0.8660254, -0.8660254, 0.8660254, 0.8660254]))
    assert out.stats[names.zeroed_group_frac("tool")] == 1.0


def test_nothing_present_gives_zeros_and_finite_stats():
    out = slca([[0, 0, 0]] * 2, [0, 0], [1.0, 2.0], [1.0, 2.0])
    assert torch.all(out.advantages == 0)
    assert all(math.isfinite(v) for v in out.stats.values())
    assert out.stats[names.present_frac("summary")] == 0.0


def test_several_groups_and_any_kind_of_group_id():
    rows = [TWO_SEGMENTS] * 4
    tool, summary = [0.0, 1.0, 0.5, 0.5], [1.0, 0.0, 0.2, 0.6]
    by_int = slca(rows, [0, 1, 0, 1], tool, summary)
    u, v = uuid.uuid4(), uuid.uuid4()
    for ids in (
        ["a", "b", "a", "b"],
        np.array([u, v, u, v], dtype=object),
        torch.tensor([3, 9, 3, 9]),
    ):
        other = slca(rows, ids, tool, summary)
        assert torch.equal(other.advantages, by_int.advantages)
    assert_close(by_int.tool_adv, torch.tensor([-R, R, R, -R]))


def test_dr_grpo_only_subtracts_the_mean():
    out = slca([TWO_SEGMENTS] * 3, [0] * 3, [0.0, 0.5, 1.0], [0.2, 0.2, 0.8], norm_by_std=False)
    assert_close(out.tool_adv, torch.tensor([-0.5, 0.0, 0.5]))
    assert_close(out.summary_adv, torch.tensor([-0.2, -0.2, 0.4]))


def test_summary_only_rollouts_have_no_tool_advantage():
    out = slca([SUMMARY_ONLY] * 2, [0, 0], [0.0, 1.0], [0.0, 1.0])
    assert torch.all(out.tool_adv == 0) and not out.tool_mask.any()
    assert_close(out.summary_adv, torch.tensor([-R, R]))


def test_penalty_routed_to_the_summary_does_not_touch_tool_tokens():
    # Row 1 made no call (one run): routing gave it tool 0 and the -0.5 penalty as summary.
    out = slca([[1, 0, 1], [1, 1, 1]], [0, 0], [0.8, 0.0], [0.6, -0.5])
    assert torch.all(out.tool_adv == 0)  # a lone tool segment hits the guard
    assert_close(out.advantages, torch.tensor([[0.0, 0.0, R], [-R, -R, -R]]))


def test_masked_tokens_never_receive_advantage():
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(16, 50, generator=gen) < 0.5
    out = slca_grpo_advantages(
        mask, torch.arange(16) // 4, torch.rand(16, generator=gen), torch.rand(16, generator=gen)
    )
    assert torch.all(out.advantages[~mask] == 0)


@pytest.mark.parametrize(("tw", "sw"), [(1.0, 1.0), (2.0, 3.0), (0.0, 1.0), (1.0, 0.0)])
def test_weights_scale_after_normalisation(tw, sw):
    base = slca([TWO_SEGMENTS] * 3, [0] * 3, [0.0, 0.5, 1.0], [1.0, 0.5, 0.0])
    out = slca(
        [TWO_SEGMENTS] * 3,
        [0] * 3,
        [0.0, 0.5, 1.0],
        [1.0, 0.5, 0.0],
        tool_weight=tw,
        summary_weight=sw,
    )
    assert_close(out.tool_adv, base.tool_adv * tw)
    assert_close(out.summary_adv, base.summary_adv * sw)
    if tw == 0:
        assert torch.all(out.advantages[out.tool_mask] == 0)


def test_nan_and_inf_scores_mean_absent():
    out = slca(
        [TWO_SEGMENTS] * 4,
        [0] * 4,
        [0.0, float("nan"), 1.0, float("inf")],
        [0.0, 1.0, float("-inf"), 0.5],
    )
    assert_close(out.tool_adv, torch.tensor([-R, 0.0, R, 0.0]))
    assert_close(out.summary_adv, torch.tensor([-1.0, 1.0, 0.0, 0.0]))
    assert torch.isfinite(out.advantages).all()


def test_extreme_inputs_stay_finite():
    rows = [TWO_SEGMENTS] * 3
    for tool in ([1e30, -1e30, 0.0], [0.3, 0.3, 0.3], [3e38, -3e38, 3e38]):
        for norm in (True, False):
            out = slca(rows, [0] * 3, tool, tool, norm_by_std=norm, eps=0.0)
            assert torch.isfinite(out.advantages).all()
            assert all(math.isfinite(v) for v in out.stats.values())
    out = slca(rows, [0] * 3, [0.3, 0.3, 0.3], [0.7, 0.7, 0.7], eps=0.0)
    assert torch.all(out.advantages == 0)  # identical scores: no signal, not 0/0


def test_stats_by_name():
    out = slca([TWO_SEGMENTS] * 3, [0] * 3, [0.0, 0.5, 1.0], [1.0, 0.5, 0.0])
    s = out.stats
    assert s[names.adv("tool", "mean")] == pytest.approx(0.0, abs=1e-7)
    assert s[names.adv("tool", "std")] == pytest.approx(1.0)
    assert s[names.adv("tool", "abs_mean")] == pytest.approx(2 / 3)
    assert (s[names.adv("tool", "min")], s[names.adv("tool", "max")]) == (-1.0, 1.0)
    assert s[names.present_frac("tool")] == 1.0
    assert s[names.zeroed_group_frac("summary")] == 0.0
    assert s[names.tokens_mean("tool")] == 2.0 and s[names.tokens_mean("summary")] == 2.0
    assert set(s) == set(names.ESTIMATOR_STATS)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"eps": -1.0}, "eps"),
        ({"tool_weight": float("nan")}, "tool_weight"),
        ({"summary_weight": float("inf")}, "summary_weight"),
    ],
)
def test_bad_hyper_parameters_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        slca([TWO_SEGMENTS], [0], [0.0], [0.0], **kwargs)


def test_shape_mismatches_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="one score per rollout"):
        slca([TWO_SEGMENTS] * 2, [0, 0], [0.0], [0.0, 1.0])
    with pytest.raises(ValueError, match="one label per rollout"):
        slca([TWO_SEGMENTS] * 2, [0], [0.0, 1.0], [0.0, 1.0])


def test_stats_are_read_off_what_the_call_returned_whenever_they_are_read():
    args = ([TWO_SEGMENTS] * 3, [0] * 3, [0.0, 0.5, 1.0], [1.0, 0.5, 0.0])
    out = slca(*args)
    out.tool_adv.mul_(10.0)  # the caller owns the vectors it got back
    out.summary_adv.zero_()
    assert out.stats == slca(*args).stats
    assert out.stats is out.stats  # computed once
