"""Penalty routing: the (tool, summary, total) triple the estimators consume.

total = w_process * R_tool + w_respq * R_sum, or the no-call penalty. The paper's omission guard:
when the task needed a call and none was made (``should_no_call``), or the total is negative, the
tool score becomes 0 and the summary score becomes the total, so the penalty reaches the policy
through the summary segment only and overrides the judge.

A NaN summary (judge failure, policy ``absent``) makes the total NaN too: GRPO then leaves the
rollout out of its group, and SLCA-GRPO treats only its summary segment as absent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from slca_exp.core import names
from slca_exp.estimators.base import RolloutScores
from slca_exp.rewards.hierr import COMPONENTS, ToolReward
from slca_exp.rewards.summary import SummaryReward


@dataclass(frozen=True)
class RoutedScores:
    """One rollout's scores after penalty routing.

    Attributes:
        tool: what the tool segment is scored with (0 under the guard).
        summary: what the summary segment is scored with (the total under the guard).
        total: the single GRPO score.
        guarded: whether the omission guard applied.

    """

    tool: float
    summary: float
    total: float
    guarded: bool


def route_penalty(
    tool: ToolReward | float,
    summary: SummaryReward | float,
    *,
    should_no_call: int | bool | None = None,
    process_weight: float = 1.0,
    summary_weight: float = 1.0,
) -> RoutedScores:
    """Route one rollout's rewards (see the module docstring).

    Args:
        tool: the tool process reward (its ``score`` is the penalty when ``should_no_call``).
        summary: the summary reward (NaN = not scored).
        should_no_call: overrides ``tool.should_no_call`` (needed when ``tool`` is a float).
        process_weight: w_process.
        summary_weight: w_respq.

    >>> route_penalty(0.8, 0.5)
    RoutedScores(tool=0.8, summary=0.5, total=1.3, guarded=False)
    >>> route_penalty(-0.5, 0.75, should_no_call=True)
    RoutedScores(tool=0.0, summary=-0.5, total=-0.5, guarded=True)

    """
    r_tool = tool.score if isinstance(tool, ToolReward) else float(tool)
    r_sum = summary.score if isinstance(summary, SummaryReward) else float(summary)
    if should_no_call is None:
        should_no_call = tool.should_no_call if isinstance(tool, ToolReward) else False
    if should_no_call:
        return RoutedScores(0.0, r_tool, r_tool, True)
    total = process_weight * r_tool + summary_weight * r_sum
    if total < 0:  # False for NaN: an unscored summary is not a penalty
        return RoutedScores(0.0, total, total, True)
    return RoutedScores(r_tool, r_sum, total, False)


def route_batch(
    tools: Sequence[ToolReward],
    summaries: Sequence[SummaryReward],
    *,
    process_weight: float = 1.0,
    summary_weight: float = 1.0,
) -> RolloutScores:
    """Route a batch; returns (B,) float32 tensors for :func:`slca_exp.estimators.get_estimator`."""
    if len(tools) != len(summaries):
        raise ValueError(f"{len(tools)} tool rewards for {len(summaries)} summary rewards")
    routed = [
        route_penalty(t, s, process_weight=process_weight, summary_weight=summary_weight)
        for t, s in zip(tools, summaries, strict=True)
    ]
    col = lambda attr: torch.tensor([getattr(r, attr) for r in routed], dtype=torch.float32)  # noqa: E731
    return RolloutScores(tool=col("tool"), summary=col("summary"), total=col("total"))


def reward_stats(
    tools: Sequence[ToolReward], summaries: Sequence[SummaryReward], scores: RolloutScores
) -> dict[str, float]:
    """The ``reward/*`` metrics of a batch (names from :mod:`slca_exp.core.names`).

    Tool statistics are over the raw process scores (penalties included), each component's mean
    over the rollouts where it was judged (NaN left out); summary statistics over the rollouts the
    judge scored (NaN left out); the total mean over scored rollouts.
    """
    stats: dict[str, float] = {}
    tool_scores = [t.score for t in tools]
    stats[names.REWARD_TOOL_MEAN], stats[names.REWARD_TOOL_STD] = _mean_std(tool_scores)
    for part in COMPONENTS:
        judged = [t.components[part] for t in tools if not math.isnan(t.components[part])]
        stats[names.tool_component(part)] = _mean_std(judged)[0]
    summary_scores = [s.score for s in summaries if math.isfinite(s.score)]
    stats[names.REWARD_SUMMARY_MEAN], stats[names.REWARD_SUMMARY_STD] = _mean_std(summary_scores)
    totals = [float(x) for x in torch.as_tensor(scores.total).tolist() if math.isfinite(x)]
    stats[names.REWARD_TOTAL_MEAN] = _mean_std(totals)[0]
    stats[names.REWARD_NO_CALL_FRAC] = _mean_std([float(t.should_no_call) for t in tools])[0]
    return stats


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and unbiased std; NaN for no values (nothing was scored) and std 0 for one."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
