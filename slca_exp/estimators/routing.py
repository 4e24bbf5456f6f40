"""Turn per-rollout segment advantages into token advantages."""

from __future__ import annotations

import torch

from slca_exp.estimators.group import segment_stats
from slca_exp.estimators.segments import SegmentSplit
from slca_exp.estimators.types import SegmentAdvantages


def route(
    split: SegmentSplit,
    tool_adv: torch.Tensor,
    summary_adv: torch.Tensor,
    *,
    tool_present: torch.Tensor,
    summary_present: torch.Tensor,
    index: torch.Tensor,
    num_groups: int,
) -> SegmentAdvantages:
    """Give tool tokens ``tool_adv`` and summary tokens ``summary_adv``; every other token 0.

    Args:
        split: the batch's segments.
        tool_adv: (B,) float64 advantage of each rollout's tool segment.
        summary_adv: (B,) float64 advantage of each rollout's summary segment.
        tool_present: (B,) bool, rollouts whose tool segment took part (for the stats).
        summary_present: (B,) bool, same for the summary.
        index: (B,) int64 dense group ids.
        num_groups: G.

    Returns:
        The :class:`SegmentAdvantages` with its stats.

    """
    # Advantages of rollouts without the segment are 0 by construction; zero them again so that
    # the per-rollout vectors mean "what this rollout's segment tokens receive".
    tool32 = _to_float32(torch.where(split.has_tool, tool_adv, 0.0))
    summary32 = _to_float32(torch.where(split.has_summary, summary_adv, 0.0))
    # One pass picks each token's segment value by position, one in-place pass zeroes the tokens
    # outside the response mask: two streaming passes over (B, T).
    advantages = torch.where(split.in_summary_span, summary32.unsqueeze(1), tool32.unsqueeze(1))
    # Multiplying by the mask's uint8 view stays on the vectorised path (a bool operand would be
    # converted to float first).
    advantages.mul_(split.mask.view(torch.uint8))
    stats = segment_stats(
        torch.stack([tool32, summary32]),
        torch.stack([tool_present, summary_present]),
        torch.stack([split.has_tool, split.has_summary]),
        torch.stack([split.tool_tokens, split.summary_tokens]),
        index,
        num_groups,
    )
    return SegmentAdvantages(
        advantages=advantages,
        tool_adv=tool32,
        summary_adv=summary32,
        split=split,
        stats=stats,
    )


_F32_MAX = float(torch.finfo(torch.float32).max)


def _to_float32(values: torch.Tensor) -> torch.Tensor:
    """Cast (B,) float64 advantages to float32, saturating instead of overflowing to inf."""
    return torch.nan_to_num(values, nan=0.0).clamp(-_F32_MAX, _F32_MAX).to(torch.float32)
