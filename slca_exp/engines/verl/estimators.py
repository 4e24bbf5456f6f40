"""``slca_grpo`` and ``toolpo_grpo`` as verl advantage estimators (verl's own registry).

verl (0.9.x) calls a registered estimator as ``fn(token_level_rewards, response_mask, config,
index)`` from ``compute_advantage``, inside its TaskRunner: (B, T) rewards and mask, the
``algorithm`` config, and the rollouts' ``uid`` array as the group ids. The adapter:

    token_level_rewards, response_mask
    -> tool / summary masks, read off the response mask (the last run of learnable tokens is the
       summary, every earlier run the tool segment: ``slca_exp.estimators.segments``)
    -> R_tool = sum of the rewards over the tool mask, R_sum = sum over the summary mask,
       total = sum over the whole response
    -> our vectorised estimator (``slca_exp.estimators``), hyper-parameters from
       ``algorithm.slca`` (``EstimatorParams`` fields) and ``algorithm.norm_adv_by_std_in_grpo``
    -> (advantages, returns), both (B, T), in the rewards' dtype

The reward side puts R_tool on the last token of the tool segment and R_sum on the last token
of the summary, so the masked sums give back exactly the two scores; with
``use_kl_in_reward`` on, verl has already subtracted the per-token KL penalty from
``token_level_rewards``, and the sums then fold it into each segment's score over that segment's
own tokens, as the paper's implementation does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from slca_exp.estimators import EstimatorParams, RolloutScores, get_estimator
from slca_exp.estimators.segments import split_segments

NAMES = ("slca_grpo", "toolpo_grpo")
"""Our estimators verl knows by these names (``algorithm.adv_estimator``)."""
PARAMS_KEY = "slca"
"""The mapping under verl's ``algorithm`` config that holds our estimator hyper-parameters."""


def segment_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> RolloutScores:
    """Per-rollout (tool, summary, total) scores: masked sums of the token rewards.

    Args:
        token_level_rewards: (B, T) rewards as verl hands them to an estimator.
        response_mask: (B, T), non-zero on the tokens the policy generated.

    Returns:
        (B,) float32 scores; a rollout without a tool (summary) segment scores 0 on it.

    """
    split = split_segments(response_mask)
    learnable = split.mask.to(token_level_rewards.device)
    # One pass: the running sum of the learnable tokens' rewards, read just before each
    # summary starts (the tool segment is everything learnable before it), and at the end.
    running = torch.where(learnable, token_level_rewards.float(), 0.0).cumsum(-1)
    total = running[:, -1] if running.shape[1] else running.new_zeros(running.shape[0])
    before = (split.summary_start - 1).clamp_min(0).to(running.device)
    tool = running.gather(1, before[:, None]).squeeze(1) if running.shape[1] else total
    tool = torch.where(split.summary_start.to(running.device) > 0, tool, 0.0)
    return RolloutScores(tool=tool, summary=total - tool, total=total)


def params_from(config: Any) -> EstimatorParams:  # noqa: ANN401 - DictConfig, AlgoConfig, dict
    """Our hyper-parameters from verl's ``algorithm`` config (``None``: the defaults).

    ``algorithm.slca`` holds the :class:`EstimatorParams` fields; ``norm_by_std`` falls back to
    verl's ``norm_adv_by_std_in_grpo`` when ``algorithm.slca`` does not set it.
    """
    ours: Mapping[str, Any] = _get(config, PARAMS_KEY) or {}
    values = dict(ours)
    if "norm_by_std" not in values:
        verl_norm = _get(config, "norm_adv_by_std_in_grpo")
        if verl_norm is not None:
            values["norm_by_std"] = bool(verl_norm)
    return EstimatorParams.from_config(values)


def verl_estimator(name: str):  # noqa: ANN201 - verl's estimator signature
    """The verl-signature function that runs our estimator ``name``."""
    estimator = get_estimator(name)

    def compute(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        config: Any = None,  # noqa: ANN401
        index: np.ndarray | None = None,
        **_: Any,  # noqa: ANN401 - verl may pass more (reward_baselines, ...)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if index is None:
            raise ValueError(
                f"advantage estimator {name!r} needs the rollouts' group ids: verl passes "
                "them as `index` when the batch has a `uid` column"
            )
        scores = segment_scores(token_level_rewards, response_mask)
        result = estimator(response_mask, index, scores, params_from(config))
        dtype = token_level_rewards.dtype
        return result.advantages.to(dtype), result.returns.to(dtype)

    compute.__name__ = compute.__qualname__ = f"{name}_for_verl"
    compute.__doc__ = f"verl adapter of slca-exp's {name!r} estimator (see {__name__})."
    return compute


def register() -> list[str]:
    """Register :data:`NAMES` in verl's advantage-estimator registry; idempotent.

    Returns:
        The names registered by this call (empty when they already were).

    """
    from verl.trainer.ppo import core_algos

    added = []
    for name in NAMES:
        current = core_algos.ADV_ESTIMATOR_REGISTRY.get(name)
        if current is not None and getattr(current, "__module__", "") == __name__:
            continue
        if current is not None:
            raise RuntimeError(
                f"verl already has an advantage estimator {name!r} ({current.__module__}."
                f"{current.__qualname__}); slca-exp's cannot take its name"
            )
        core_algos.register_adv_est(name)(verl_estimator(name))
        added.append(name)
    return added


def _get(config: Any, key: str) -> Any:  # noqa: ANN401
    if config is None:
        return None
    getter = getattr(config, "get", None)
    if callable(getter):
        return getter(key, None)
    return getattr(config, key, None)
