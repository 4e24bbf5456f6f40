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
from slca_exp.rewards.judging import OutcomeResult
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
    tools: Sequence[ToolReward],
    summaries: Sequence[SummaryReward],
    scores: RolloutScores,
    *,
    hierr: Sequence[ToolReward] | None = None,
) -> dict[str, float]:
    """The ``reward/*`` metrics of a batch (names from :mod:`slca_exp.core.names`).

    Tool statistics are over R_tool as the objective got it (penalties included; an absent one,
    NaN, left out), each component's mean over the rollouts where it was judged (NaN left out);
    summary statistics over the rollouts the judge scored (NaN left out); the total mean over
    scored rollouts. ``hierr``: the tool process rewards when R_tool is something else (the
    outcome reward); their mean is ``reward/tool/hierr/mean`` (``tools``' own otherwise).
    """
    stats: dict[str, float] = {}
    tool_scores = [t.score for t in tools if math.isfinite(t.score)]
    stats[names.REWARD_TOOL_MEAN], stats[names.REWARD_TOOL_STD] = _mean_std(tool_scores)
    matched = tools if hierr is None else hierr
    stats[names.REWARD_TOOL_HIERR_MEAN] = _mean_std([t.score for t in matched])[0]
    for part in COMPONENTS:
        judged = [t.components[part] for t in matched if not math.isnan(t.components[part])]
        stats[names.tool_component(part)] = _mean_std(judged)[0]
    summary_scores = [s.score for s in summaries if math.isfinite(s.score)]
    stats[names.REWARD_SUMMARY_MEAN], stats[names.REWARD_SUMMARY_STD] = _mean_std(summary_scores)
    totals = [float(x) for x in torch.as_tensor(scores.total).tolist() if math.isfinite(x)]
    stats[names.REWARD_TOTAL_MEAN] = _mean_std(totals)[0]
    stats[names.REWARD_NO_CALL_FRAC] = _mean_std([float(t.should_no_call) for t in tools])[0]
    return stats


def outcome_stats(results: Sequence[OutcomeResult | None]) -> dict[str, float]:
    """The outcome judge's metrics of a batch (``reward.tool_reward=outcome``).

    ``reward/outcome/solved_frac`` over the rollouts it decided (a rule's Unsolved included,
    failures and rollouts it was not asked about left out; absent when there are none);
    ``outcome/requests``, ``outcome/failures`` (counts), and ``outcome/fallback_frac`` and
    ``outcome/cache_hit_frac`` over the requests (the rollouts a rule did not decide).
    """
    asked = [r for r in results if r is not None]
    decided = [r for r in asked if r.status != "failed"]
    requests = [r for r in asked if r.status != "short_circuit"]
    stats = {
        names.OUTCOME_REQUESTS: float(len(requests)),
        names.OUTCOME_FAILURES: float(sum(r.status == "failed" for r in asked)),
        names.OUTCOME_FALLBACK_FRAC: _mean_std([float(r.fallback) for r in requests])[0],
        names.OUTCOME_CACHE_HIT_FRAC: _mean_std([float(r.cached) for r in requests])[0],
    }
    if decided:
        stats[names.REWARD_OUTCOME_SOLVED_FRAC] = _mean_std([r.score for r in decided])[0]
    return {k: (0.0 if math.isnan(v) else v) for k, v in stats.items()}


def success_stats(
    totals: Sequence[float],
    hierr: Sequence[float],
    *,
    process_weight: float = 1.0,
    summary_weight: float = 1.0,
) -> dict[str, float]:
    """The paper's success@k of a validation batch, for k in ``names.SUCCESS_THRESHOLDS``.

    ``val/success@k``: the fraction of rows whose normalised total, total / (w_process +
    w_summary), is at least k; ``val/tool_success@k``: the fraction whose HierR tool process
    score is at least k. A score within 1e-9 below k counts (float rounding of sums that are
    exactly k, as 0.1 + 0.25 + ...); an unscored row (NaN) never does.

    >>> success_stats([2.0, 1.0, float("nan")], [1.0, 0.75, 0.9])["val/success@0.9"]
    0.3333333333333333
    >>> success_stats([2.0, 1.0, float("nan")], [1.0, 0.75, 0.9])["val/tool_success@0.9"]
    0.6666666666666666

    """
    norm = (process_weight + summary_weight) or 1.0
    n = max(len(totals), 1)
    scored = [t / norm for t in totals if math.isfinite(t)]
    matched = [h for h in hierr if math.isfinite(h)]
    stats = {}
    for k in names.SUCCESS_THRESHOLDS:
        stats[names.val_success(k)] = sum(t >= k - 1e-9 for t in scored) / n
    for k in names.SUCCESS_THRESHOLDS:
        stats[names.val_tool_success(k)] = sum(h >= k - 1e-9 for h in matched) / max(len(hierr), 1)
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
