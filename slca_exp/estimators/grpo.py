"""GRPO ("w/o SLCA" baseline): one group-normalised scalar per rollout on every response token.

Matches verl's ``compute_grpo_outcome_advantage`` (singleton groups keep their raw score: mean 0,
std 1), computed without a loop over samples or groups. A NaN score means the rollout could not be
scored: it is left out of its group's statistics and gets advantage 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from slca_exp.estimators.group import (
    GroupIds,
    as_scores,
    check_hparams,
    dense_group_index,
    group_normalize,
)
from slca_exp.estimators.routing import route
from slca_exp.estimators.segments import split_segments
from slca_exp.estimators.types import SegmentAdvantages


def grpo_advantages(
    response_mask: torch.Tensor,
    group_ids: GroupIds,
    score: torch.Tensor | Sequence[float],
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> SegmentAdvantages:
    """GRPO outcome advantages.

    Args:
        response_mask: (B, T), non-zero on learnable tokens.
        group_ids: (B,) prompt ids (ints, strings, uuids, numpy object arrays).
        score: (B,) total score of each rollout (NaN = could not be scored).
        norm_by_std: divide by the group's unbiased std + eps (False: Dr.GRPO, mean only).
        eps: added to the std.

    Returns:
        :class:`SegmentAdvantages`; ``advantages`` (B, T) is the rollout's advantage on every
        learnable token; ``tool_adv``/``summary_adv`` repeat it for rollouts that have the segment.

    """
    check_hparams(eps=eps)
    split = split_segments(response_mask)
    batch = split.mask.shape[0]
    values = as_scores(score, batch, "score").to(split.mask.device)
    index, groups = dense_group_index(group_ids, batch, split.mask.device)
    present = torch.isfinite(values)
    kw = {"norm_by_std": norm_by_std, "eps": eps, "small_group": "passthrough"}
    adv = group_normalize(values.unsqueeze(0), present.unsqueeze(0), index, groups, **kw)
    both = torch.stack([split.has_tool, split.has_summary]) & present
    return route(split, adv.expand(2, -1), both, index, groups)
