"""``slca_grpo`` and ``toolpo_grpo`` as verl advantage estimators (verl's own registry).

verl (0.9.x) calls a registered estimator as ``fn(token_level_rewards, response_mask, config,
index)`` from ``compute_advantage``, inside its TaskRunner: (B, T) rewards and mask, the
``algorithm`` config, and the rollouts' ``uid`` array as the group ids. The adapter:

    token_level_rewards, response_mask
    -> the segments, read off the response mask once (the last run of learnable tokens is the
       summary, every earlier run the tool segment: ``slca_exp.estimators.segments``)
    -> R_tool, R_sum: each the sum of the rewards over that segment's own tokens
       (``scores.py``); total: the reward side's weighted total, handed over by slca-exp's
       trainer (R_tool + R_sum without it)
    -> our vectorised estimator on the same split (``slca_exp.estimators``), hyper-parameters
       from ``algorithm.slca`` (``EstimatorParams`` fields) and verl's
       ``algorithm.norm_adv_by_std_in_grpo``
    -> (advantages, returns), both (B, T), in the rewards' dtype

The reward side puts R_tool on the last token of the tool segment and R_sum on the last token
of the summary, so the sums give back exactly the two scores (float32 or bfloat16 rewards):
rollouts whose judge gave the same rating get the same summary advantage whatever their tool
scores, and the other way round. With ``use_kl_in_reward`` on, verl has already subtracted the
per-token KL penalty from ``token_level_rewards``; each segment's sum then folds in the KL of its
own tokens, as the paper's implementation does, and the total gets both segments' KL.

The mask alone cannot tell a summary from a tool call that was cut off (out of turns or tokens),
nor does ``token_level_rewards`` carry the total the reward configures (``reward.process_weight``
and ``summary_weight``, the no-call penalty). slca-exp's trainer (``trainer.py``) reads both from
the reward side and hands them to the adapter through :func:`segment_call`: the reported scores,
which rollouts ended on a tool call (under ``algorithm.slca.mask_rule=corrected`` those have no
summary segment: every learnable token is tool) and which summaries the judge could not score.
The same context carries the estimator's per-segment statistics back to the trainer, which logs
them under our metric names; :func:`advantage_stats` gives the same statistics for an estimator
that is not ours (verl's own ``grpo``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from slca_exp.engines.verl.scores import segment_scores
from slca_exp.estimators import (
    EstimatorParams,
    RolloutScores,
    SegmentAdvantages,
    get_estimator,
)
from slca_exp.estimators.group import dense_group_index, segment_stats
from slca_exp.estimators.segments import SegmentSplit, split_segments

NAMES = ("slca_grpo", "toolpo_grpo")
"""Our estimators verl knows by these names (``algorithm.adv_estimator``)."""
PARAMS_KEY = "slca"
"""The mapping under verl's ``algorithm`` config that holds our estimator hyper-parameters."""
MASK_RULES = ("parity", "corrected")
"""``algorithm.slca.mask_rule``: parity (the paper) | corrected (cut-off tool calls are tool)."""


@dataclass
class SegmentCall:
    """One ``compute_advantage`` call as slca-exp's trainer sees it (see :func:`segment_call`).

    Attributes:
        no_summary: (B,) bool in the batch's row order, rollouts without a summary segment
            (the corrected mask rule); ``None``: read every rollout off its mask (parity).
        absent_summary: (B,) bool, rollouts whose summary could not be scored (a judge failure
            under ``reward.judge_failure=absent``): their summary takes no part in the group
            normalisation, as in the local engine; ``None``: none.
        absent_tool: (B,) bool, rollouts whose R_tool could not be scored (the outcome judge
            failed under ``reward.tool_reward=outcome``): likewise for their tool segment.
        reported: the reward side's (tool, summary, total) of each rollout, (B,) each: the
            estimator's total is this weighted total (plus the KL of every response token under
            ``use_kl_in_reward``); ``None``: R_tool + R_sum.
        result: filled by the adapter: what the estimator returned.
        scores: filled by the adapter: the per-rollout scores it used.

    """

    no_summary: Any = None
    absent_summary: Any = None
    reported: RolloutScores | None = None
    absent_tool: Any = None
    result: SegmentAdvantages | None = None
    scores: RolloutScores | None = None

    @property
    def stats(self) -> dict[str, float]:
        """The estimator's per-segment metrics (our names), computed when first read."""
        return {} if self.result is None else dict(self.result.stats)


_CALL: ContextVar[SegmentCall | None] = ContextVar("slca_segment_call", default=None)


@contextmanager
def segment_call(
    no_summary: Any = None,  # noqa: ANN401 - array-likes of (B,) bool
    absent_summary: Any = None,  # noqa: ANN401
    reported: RolloutScores | None = None,
    absent_tool: Any = None,  # noqa: ANN401
) -> Iterator[SegmentCall]:
    """Hand the adapter what the batch cannot tell, and collect what it computed.

    >>> with segment_call() as call:
    ...     pass  # verl's compute_advantage runs here
    >>> call.stats
    {}

    """
    call = SegmentCall(
        no_summary=no_summary,
        absent_summary=absent_summary,
        reported=reported,
        absent_tool=absent_tool,
    )
    token = _CALL.set(call)
    try:
        yield call
    finally:
        _CALL.reset(token)


def params_from(config: Any) -> EstimatorParams:  # noqa: ANN401 - DictConfig, AlgoConfig, dict
    """Our hyper-parameters from verl's ``algorithm`` config (``None``: the defaults).

    ``algorithm.slca`` holds the :class:`EstimatorParams` fields; ``norm_by_std`` falls back to
    verl's ``norm_adv_by_std_in_grpo`` when ``algorithm.slca`` does not set it.
    """
    return _params(config, _get(config, PARAMS_KEY))


def _params(config: Any, ours: Mapping[str, Any] | None) -> EstimatorParams:  # noqa: ANN401
    """:func:`params_from`, ``algorithm.slca`` already read (reading a DictConfig is slow)."""
    values = dict(ours or {})
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
        call = _CALL.get()
        ours = _get(config, PARAMS_KEY)
        split = _split(response_mask, _mask_rule(ours), call, name)
        scores = segment_scores(token_level_rewards, split)
        if call is not None and call.reported is not None:
            kl = bool(_get(config, "use_kl_in_reward"))
            scores = _reported_total(scores, split, call.reported, token_level_rewards.dtype, kl)
        if call is not None and call.absent_summary is not None:
            scores = _absent(scores, call.absent_summary)
        if call is not None and call.absent_tool is not None:
            scores = _absent(scores, call.absent_tool, segment="tool")
        result = estimator(split, index, scores, _params(config, ours))
        if call is not None:
            call.result, call.scores = result, scores
        dtype = token_level_rewards.dtype
        return result.advantages.to(dtype), result.returns.to(dtype)

    compute.__name__ = compute.__qualname__ = f"{name}_for_verl"
    compute.__doc__ = f"verl adapter of slca-exp's {name!r} estimator (see {__name__})."
    return compute


def _reported_total(
    scores: RolloutScores,
    split: SegmentSplit,
    reported: RolloutScores,
    dtype: torch.dtype,
    kl_in_reward: bool,
) -> RolloutScores:
    """``scores`` with the reward side's total (plus the KL terms when they are in the rewards).

    The KL folded into a segment is its sum less what the reward side wrote on it (R_tool on a
    rollout with a tool segment, R_sum on one with a summary, in the rewards' dtype).
    """
    device = scores.tool.device
    total = torch.as_tensor(reported.total, dtype=torch.float32).to(device)
    if total.shape != scores.tool.shape:
        raise ValueError(
            f"the reward side reported {tuple(total.shape)} totals for "
            f"{scores.tool.shape[0]} rollouts"
        )
    if kl_in_reward:
        for segment, present in (("tool", split.has_tool), ("summary", split.has_summary)):
            written = torch.as_tensor(getattr(reported, segment)).to(device, dtype).float()
            total = total + (getattr(scores, segment) - torch.where(present, written, 0.0))
    return RolloutScores(tool=scores.tool, summary=scores.summary, total=total)


def _absent(scores: RolloutScores, rows: Any, segment: str = "summary") -> RolloutScores:  # noqa: ANN401
    """``scores`` with the ``segment`` score (and so the total) of ``rows`` NaN: not scored."""
    absent = torch.as_tensor(np.asarray(rows, dtype=bool)).to(scores.summary.device)
    if absent.shape != scores.summary.shape:
        raise ValueError(
            f"absent_{segment} has {tuple(absent.shape)} flags for {scores.summary.shape[0]} "
            "rollouts"
        )
    nan = torch.tensor(float("nan"), dtype=scores.summary.dtype, device=absent.device)
    tool, summary = scores.tool, scores.summary
    if segment == "tool":
        tool = torch.where(absent, nan, scores.tool)
    else:
        summary = torch.where(absent, nan, scores.summary)
    return RolloutScores(tool=tool, summary=summary, total=torch.where(absent, nan, scores.total))


def advantage_stats(
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,  # noqa: ANN401 - the uid array
    no_summary: Any = None,  # noqa: ANN401 - (B,) bool, the corrected mask rule
) -> dict[str, float]:
    """The per-segment metrics of advantages an estimator that is not ours computed (``grpo``).

    Each rollout's segment advantage is the one on the segment's first token; every rollout
    with a segment counts as present (verl's estimators score every rollout). The same names and
    meanings as the statistics our estimators return.

    Args:
        advantages: (B, T) advantages as verl's advantage step left them.
        response_mask: (B, T), non-zero on learnable tokens.
        index: (B,) group ids (the ``uid`` array).
        no_summary: (B,) bool, rollouts without a summary segment (``None``: parity).

    """
    split = split_segments(response_mask)
    if no_summary is not None:
        rows = torch.as_tensor(np.asarray(no_summary, dtype=bool))
        split = split.without_summary(rows.to(split.mask.device))
    batch, length = split.mask.shape
    values = advantages.to(split.mask.device, torch.float64)
    if length:
        rows = torch.arange(batch, device=values.device)
        first = split.mask.to(torch.uint8).argmax(dim=1)  # where a tool segment starts
        summary_at = split.summary_start.clamp(max=length - 1)
        per_rollout = torch.stack([values[rows, first], values[rows, summary_at]])
    else:
        per_rollout = values.new_zeros(2, batch)
    has = torch.stack([split.has_tool, split.has_summary])
    group, groups = dense_group_index(index, batch, values.device)
    tokens = torch.stack([split.tool_tokens, split.summary_tokens])
    return segment_stats(torch.where(has, per_rollout, 0.0), has, has, tokens, group, groups)


def mask_rule(config: Any) -> str:  # noqa: ANN401
    """``algorithm.slca.mask_rule`` (``parity`` when unset); an unknown rule is an error."""
    return _mask_rule(_get(config, PARAMS_KEY))


def _mask_rule(ours: Any) -> str:  # noqa: ANN401 - algorithm.slca
    """:func:`mask_rule`, ``algorithm.slca`` already read."""
    rule = _get(ours, "mask_rule") or "parity"
    if rule not in MASK_RULES:
        raise ValueError(
            f"algorithm.{PARAMS_KEY}.mask_rule={rule!r} is not a mask rule; use one of "
            f"{', '.join(MASK_RULES)} (engine.verl.mask_rule)"
        )
    return str(rule)


def _split(
    response_mask: torch.Tensor, rule: str, call: SegmentCall | None, name: str
) -> SegmentSplit:
    """The batch's segments under the mask rule ``rule``."""
    split = split_segments(response_mask)
    if rule == "parity":
        return split
    if call is None or call.no_summary is None:
        raise RuntimeError(
            f"{name} with algorithm.{PARAMS_KEY}.mask_rule=corrected needs to know which "
            "rollouts ended on a tool call: run it with slca-exp's trainer "
            "(trainer.v1.trainer_mode=slca_sync, which slca-exp's verl config sets), or use "
            "engine.verl.mask_rule=parity"
        )
    rows = torch.as_tensor(np.asarray(call.no_summary, dtype=bool))
    return split.without_summary(rows.to(split.mask.device))


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
