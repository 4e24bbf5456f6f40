"""The local engine's batch as a ``BatchView``: what its logged rollouts are built from.

Rollouts (tokens, masks, rows, simulator answers) + RewardBatch (reward parts, routed
scores) + SegmentSplit (the mask rule's segments) + SegmentAdvantages (the update's
advantages) + the update's old log-probs  ->  slca_exp.rollouts.batch.BatchView
"""

from __future__ import annotations

from typing import Any

import torch

from slca_exp.rollouts.batch import BatchView, rewards_of, samples_within_groups
from slca_exp.rollouts.record import Answer, prompt_id


def batch_view(
    rolls: Any,  # noqa: ANN401 - engines.local.rollout.Rollouts
    scored: Any,  # noqa: ANN401 - rewards.scorer.RewardBatch
    split: Any,  # noqa: ANN401 - estimators.segments.SegmentSplit
    response_mask: torch.Tensor,
    *,
    data_split: str,
    adv: Any = None,  # noqa: ANN401 - estimators.SegmentAdvantages; None for validation
    logprobs: torch.Tensor | None = None,
) -> BatchView:
    """The batch's view (advantages and log-probs only where an update uses them)."""
    groups = [prompt_id(row, data_split) for row in rolls.rows]
    keys = list(zip(rolls.group, groups, strict=True))  # a prompt drawn twice: two groups
    scores = scored.scores
    outcome = list(scored.outcome)
    rewards = [
        rewards_of(
            scored.tool[i],
            scored.summary[i],
            (float(scores.tool[i]), float(scores.summary[i]), float(scores.total[i])),
            hierr=float(scored.hierr[i].score) if scored.hierr[i] is not scored.tool[i] else None,
            outcome=outcome[i].verdict if outcome and outcome[i] is not None else None,
        )
        for i in range(len(rolls))
    ]
    answers = [
        [Answer(r.content, r.status, r.reason, r.cached) for r in per_sample]
        for per_sample in rolls.answers
    ]
    return BatchView(
        response_ids=rolls.response_ids,
        response_mask=response_mask.cpu(),
        tool_mask=split.tool_mask.cpu(),
        summary_mask=split.summary_mask.cpu(),
        advantages=None if adv is None else adv.advantages.detach().cpu(),
        logprobs=None if logprobs is None else logprobs.detach().float().cpu(),
        tool_adv=None if adv is None else adv.tool_adv.cpu(),
        summary_adv=None if adv is None else adv.summary_adv.cpu(),
        rows=rolls.rows,
        groups=groups,
        samples=samples_within_groups(keys),
        rewards=rewards,
        answers=answers,
        ends_on_tool_call=rolls.ends_on_tool_call(),
    )
