import pytest
import torch

from slca_exp.estimators import (
    ESTIMATORS,
    EstimatorParams,
    RolloutScores,
    get_estimator,
    register_estimator,
    slca_grpo_advantages,
)
from slca_exp.registry import DuplicateNameError, UnknownNameError


def test_the_three_estimators_are_registered():
    assert ESTIMATORS.names() == ["grpo", "slca_grpo", "toolpo_grpo"]


def test_registry_call_matches_the_direct_call():
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(8, 12, generator=gen) < 0.6
    ids = torch.arange(8) // 4
    scores = RolloutScores(
        tool=torch.rand(8, generator=gen),
        summary=torch.rand(8, generator=gen),
        total=torch.rand(8, generator=gen),
    )
    params = EstimatorParams(tool_weight=2.0, summary_weight=0.5, eps=1e-4)
    via = get_estimator("slca_grpo")(mask, ids, scores, params)
    direct = slca_grpo_advantages(
        mask, ids, scores.tool, scores.summary, tool_weight=2.0, summary_weight=0.5, eps=1e-4
    )
    assert torch.equal(via.advantages, direct.advantages)
    for name in ESTIMATORS.names():
        out = get_estimator(name)(mask, ids, scores, params)
        assert out.advantages.shape == mask.shape


def test_unknown_estimator_lists_the_known_ones():
    with pytest.raises(UnknownNameError) as err:
        get_estimator("slca")
    assert "grpo, slca_grpo, toolpo_grpo" in str(err.value)
    assert "Did you mean 'slca_grpo'" in str(err.value)


def test_duplicate_estimator_is_refused():
    with pytest.raises(DuplicateNameError, match="already registered"):
        register_estimator("grpo")(lambda *a: None)


def test_params_from_config_mapping_and_object():
    cfg = {"name": "slca_grpo", "eps": 1e-3, "tool_weight": 2.0, "group_size": 8}
    assert EstimatorParams.from_config(cfg) == EstimatorParams(eps=1e-3, tool_weight=2.0)

    class Obj:
        norm_by_std = False

    assert EstimatorParams.from_config(Obj()).norm_by_std is False


@pytest.mark.parametrize(("batch", "length"), [(0, 5), (3, 0), (0, 0)])
def test_empty_batches_and_empty_responses(batch, length):
    mask = torch.zeros(batch, length, dtype=torch.long)
    scores = RolloutScores(torch.zeros(batch), torch.zeros(batch), torch.zeros(batch))
    for name in ESTIMATORS.names():
        out = get_estimator(name)(mask, list(range(batch)), scores, EstimatorParams())
        assert out.advantages.shape == (batch, length) == out.tool_mask.shape
        for key, value in out.stats.items():
            expected = 1.0 if "zeroed_group_frac" in key and batch else 0.0  # no group has signal
            assert value == expected, key
