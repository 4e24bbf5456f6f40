"""SLCA-GRPO: a separately normalised advantage for the tool segment and for the summary segment.

Paper: arXiv 2609.29050, Sec. 3.2. For each segment, statistics use only the group members where
the segment is present (its mask row is non-empty and its score finite). A group with fewer than
two present members gives every member advantage 0 for that segment: the mean 0 / std 1 fallback
would pass the raw score through un-normalised. Segment weights multiply the advantages after
normalisation (before, they would cancel: Norm(l * X) = Norm(X)).

Penalty routing and KL folding happen before this call (``slca_exp.rewards.routing``, the verl
adapter); this function only normalises and routes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from slca_exp.estimators.group import (
    GroupIds,
    as_scores,
    check_hparams,
    dense_group_codes,
    group_normalize,
)
from slca_exp.estimators.host import host
from slca_exp.estimators.routing import route
from slca_exp.estimators.segments import split_segments
from slca_exp.estimators.types import SegmentAdvantages


def slca_grpo_advantages(
    response_mask: torch.Tensor,
    group_ids: GroupIds,
    tool_score: torch.Tensor | Sequence[float],
    summary_score: torch.Tensor | Sequence[float],
    *,
    tool_weight: float = 1.0,
    summary_weight: float = 1.0,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> SegmentAdvantages:
    """Segment-level advantages of SLCA-GRPO.

    Args:
        response_mask: (B, T), non-zero on learnable tokens.
        group_ids: (B,) prompt ids (ints, strings, uuids, numpy object arrays).
        tool_score: (B,) R_tool per rollout (NaN = could not be scored: segment absent).
        summary_score: (B,) R_sum per rollout, or the routed penalty (NaN = absent).
        tool_weight: lambda_tool, multiplies the tool advantage after normalisation.
        summary_weight: lambda_sum, multiplies the summary advantage after normalisation.
        norm_by_std: divide by the unbiased std + eps (False: Dr.GRPO, mean only).
        eps: added to the std.

    Returns:
        :class:`SegmentAdvantages`: tool tokens carry ``tool_adv``, summary tokens
        ``summary_adv``, every other token 0.

    Example:
        >>> mask = torch.tensor([[1, 0, 1], [1, 0, 1]])
        >>> out = slca_grpo_advantages(mask, [0, 0], [1.0, 0.0], [0.0, 1.0])
        >>> [round(a, 4) for a in out.tool_adv.tolist() + out.summary_adv.tolist()]
        [0.7071, -0.7071, -0.7071, 0.7071]

    """
    check_hparams(eps=eps, tool_weight=tool_weight, summary_weight=summary_weight)
    split = split_segments(response_mask)
    batch = split.mask.shape[0]
    scores = np.stack(
        [
            as_scores(tool_score, batch, "tool_score"),
            as_scores(summary_score, batch, "summary_score"),
        ]
    )
    index, groups = dense_group_codes(group_ids, batch)
    has = np.stack([host(split.has_tool), host(split.has_summary)])
    present = has & np.isfinite(scores)
    adv = group_normalize(
        scores, present, index, groups, norm_by_std=norm_by_std, eps=eps, small_group="zero"
    )
    return route(split, adv * np.array([[tool_weight], [summary_weight]]), present, index, groups)
